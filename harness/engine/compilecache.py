"""Where compiled graphs are kept across runs, and what a second run may load from there.

One folder per target and compiled flavour, ``<cache_root>/compile/<key>`` (:func:`compile_cache_key`: the torch
version, the model, its dtype, the device type and the flavour with its linear-kernel choice), holds inductor's own
on-disk caches: its FX-graph cache (the lowered graph with its generated code) and AOTAutograd's cache (the traced
forward), with the compiled C++/Triton kernels. Those are torch's maintained caches (``TORCHINDUCTOR_CACHE_DIR``),
keyed by torch on the graph, its input shapes and the inductor options, and they hold no weights (weights are graph
inputs, bound at each call), so a second run of the same forward at the same shapes loads the compiled graph instead
of lowering it again.

What torch's keys do not see, this module checks before a runner uses the folder: ``identity.json`` names the torch
build, the CPU's instruction set (``torch.backends.cpu.get_cpu_capability``), the model's architecture digest
(:func:`model_digest`), its dtype, device type and the flavour. A folder whose record differs (a cache copied from
another machine, a torch reinstalled in place) or cannot be read (truncated, not JSON) is never used: it is removed
and compiled again, and :func:`check_folder` returns the one line saying why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# the environment variable naming draftbench's cache folder (default: $XDG_CACHE_HOME/draftbench, ~/.cache/draftbench)
CACHE_ENV = "DRAFTBENCH_CACHE"
IDENTITY_FILE = "identity.json"
# what one compiling call's graphs did, from torch's counters: loaded whole from the cache, or compiled
LOADED, COMPILED = "loaded", "compiled"


def cache_root() -> Path:
    """draftbench's cache folder: ``$DRAFTBENCH_CACHE``, else ``$XDG_CACHE_HOME/draftbench``, else
    ``~/.cache/draftbench``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "draftbench"


def compile_cache_key(model: str, path: str, dtype: torch.dtype, device_type: str, flavour: str) -> str:
    """The folder name of one target's compile cache: readable parts, then a digest of everything that shapes the
    compiled code and is not already in inductor's own keys (the model's folder; ``flavour``: the runner's compiled
    flavour with its linear-kernel choice, e.g. "dynamic+frozen/onednn64", so that two flavours never share, and
    never reset, one folder). Example: ("smollm2-135m", "/m/smollm2", torch.float32, "cpu", "onednn64") ->
    "smollm2-135m-float32-cpu-torch<version>-" followed by 12 hex digits."""
    ident = "\n".join([model, path, str(dtype), device_type, flavour, torch.__version__])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9._+-]+", "_", f"{model}-{str(dtype).removeprefix('torch.')}-{device_type}-"
                                                  f"torch{torch.__version__}")
    return f"{readable}-{digest}"


def clear_compile_cache(root: Path | None = None) -> int:
    """Remove every compiled artefact under ``root`` (default :func:`cache_root`) ``/compile``; returns how many
    target folders were removed (0 when there was no cache)."""
    folder = (cache_root() if root is None else Path(root)) / "compile"
    if not folder.is_dir():
        return 0
    removed = sum(1 for p in folder.iterdir() if p.is_dir())
    shutil.rmtree(folder)
    return removed


def model_digest(model: torch.nn.Module) -> str:
    """12 hex digits naming what a compiled graph of ``model`` depends on besides its inputs: the config (as JSON)
    and every parameter's and buffer's name, shape and dtype. The weights' values are not in it: the graphs take
    them as inputs at each call. Example: two tiny Llamas with one config and different random weights share it."""
    h = hashlib.sha256()
    config = getattr(model, "config", None)
    h.update((config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)).encode())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}\n".encode())
    return h.hexdigest()[:12]


def identity(model: torch.nn.Module, dtype: torch.dtype, device_type: str, flavour: str) -> dict[str, str]:
    """The record a folder's artefacts must match to be loaded (see the module docstring)."""
    return {"torch": torch.__version__, "torch_git": str(getattr(torch.version, "git_version", "")),
            "cpu": torch.backends.cpu.get_cpu_capability(), "model": model_digest(model),
            "dtype": str(dtype).removeprefix("torch."), "device": device_type, "flavour": flavour}


def check_folder(folder: Path, expected: dict[str, str]) -> str | None:
    """Make ``folder`` safe to load from: None when its ``identity.json`` equals ``expected`` or the folder does not
    exist yet (then the record is written); otherwise the folder is removed, a fresh record written, and the one
    line saying why is returned. Example: a record with ``"torch": "2.12.0"`` under torch 2.13.0 -> "compile cache
    <name>: made by torch 2.12.0, this is 2.13.0: removed, compiling again"."""
    folder = Path(folder)
    record = folder / IDENTITY_FILE
    why = None
    if folder.is_dir() and any(folder.iterdir()):
        try:
            found = json.loads(record.read_text())
            if not isinstance(found, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            why = "has no identity record"
        except (OSError, ValueError) as e:
            why = f"has an unreadable identity record ({type(e).__name__})"
        else:
            diffs = [f"{k} {found.get(k)!s}, this is {v}" for k, v in expected.items() if found.get(k) != v]
            why = ("made for " + "; ".join(diffs)) if diffs else None
        if why is None:
            return None
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(f".{IDENTITY_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(expected, indent=1, sort_keys=True))
    os.replace(tmp, record)
    return f"compile cache {folder.name}: {why}: removed, compiling again" if why else None


def read_identity(folder: Path) -> dict[str, Any] | None:
    """A folder's identity record, None when missing or unreadable."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads((Path(folder) / IDENTITY_FILE).read_text())
        return found if isinstance(found, dict) else None
    return None


def cache_counts() -> dict[str, int]:
    """torch's cache outcomes so far in this process: inductor's FX-graph cache (``fx_hit``, ``fx_miss``,
    ``fx_bypass``) and AOTAutograd's (``aot_hit``, ``aot_miss``, ``aot_bypass``)."""
    from torch._dynamo.utils import counters

    fx = {f"fx_{k}": counters["inductor"][f"fxgraph_cache_{k}"] for k in ("hit", "miss", "bypass")}
    aot = {f"aot_{k}": counters["aot_autograd"][f"autograd_cache_{k}"] for k in ("hit", "miss", "bypass")}
    return fx | aot


def outcome(before: dict[str, int], after: dict[str, int]) -> tuple[str, str]:
    """``(kind, detail)`` of the graphs compiled between two :func:`cache_counts`: kind :data:`LOADED` when every
    one was a hit of the FX-graph cache (nothing lowered, no kernel built), else :data:`COMPILED`; detail: the FX
    outcomes that occurred, joined by "+" ("hit", "miss", "bypass"; "" when inductor was not reached). Example:
    fx_hit 0 -> 2, nothing else -> ("loaded", "hit")."""
    grew = [k for k in ("hit", "miss", "bypass") if after[f"fx_{k}"] > before.get(f"fx_{k}", after[f"fx_{k}"])]
    return (LOADED if grew == ["hit"] else COMPILED), "+".join(grew)


@contextlib.contextmanager
def inductor_cache_dir(folder: Path) -> Iterator[None]:
    """Let inductor read and write its on-disk caches (compiled kernels, FX graphs, AOTAutograd entries) under
    ``folder`` while a call runs (inductor reads ``TORCHINDUCTOR_CACHE_DIR`` whenever it needs the folder)."""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
