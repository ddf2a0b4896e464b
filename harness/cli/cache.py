"""``draftbench cache [show|clear]``: where the compiled artefacts of past runs are kept
(:func:`harness.engine.compilecache.cache_root`), what each entry's last compiling run reused and compiled, or
remove them."""

from __future__ import annotations

import argparse

from harness.engine.compilecache import CACHE_ENV, cache_root, clear_compile_cache, read_identity
from harness.run.progress import read_compile_entries


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="show (default) or clear the compiled artefacts kept across runs")
    p.add_argument("action", nargs="?", choices=["show", "clear"], default="show")
    p.set_defaults(func=cmd_cache)


def cmd_cache(args) -> int:
    folder = cache_root() / "compile"
    if args.action == "clear":
        print(f"removed {clear_compile_cache()} compile cache folder(s) under {folder}")
        return 0
    entries = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    print(f"{folder} ({CACHE_ENV} moves it; `draftbench cache clear` empties it)")
    for entry in entries:
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        ident = read_identity(entry)
        made = f"  ({ident.get('flavour')}, cpu {ident.get('cpu')})" if ident else ""
        print(f"  {entry.name}  {size / 2**20:.1f} MiB{made}")
        for label, e in sorted(read_compile_entries(entry).items()):
            if "graphs" not in e:
                print(f"    {label}: {e['seconds']:.1f} s")
                continue
            graphs, loaded = int(e["graphs"]), int(e.get("loaded", 0))
            print(f"    {label}: last run {graphs} graph(s), {loaded} loaded from cache, {graphs - loaded} compiled, "
                  f"{e['seconds']:.1f} s")
    return 0
