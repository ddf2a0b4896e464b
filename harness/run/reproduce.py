"""``draftbench reproduce TABLE``: run exactly a published table's protocol and print measured next to reported.

A reproduction is an ordinary run (:func:`harness.run.runner.run`) built from the table
(:mod:`harness.run.published`): the table's rows as method labels plus the vanilla baseline, its suites, token
budget, temperature, warm-ups, repeats, chat template and system prompt, the target and heads loaded by id. Rows
of different targets (or token budgets) become separate runs ("parts"). Each run's manifest records
``reproduce: {table, table_sha256, part, target, rows: {label: row id}}``, so ``draftbench report RUN --against
TABLE`` finds the rows again; the comparison itself is :mod:`harness.run.against`.

Targets and heads are loaded by Hugging Face id (downloaded when online), or from local copies with
``--model-dir ID=FOLDER`` (repeatable) or ``--model-dir mapping.yaml`` (``ID: FOLDER`` lines, folders relative to
the file), e.g. on an offline cluster; a target may also map to an embedded alias (``smollm2-135m``).
``--dry-run`` loads nothing: it lists what would load, its size and estimated GPU memory, and the number of
generations.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.models import EMBEDDED_TARGETS, materialize_embedded
from harness.run.config import MethodSpec, RunConfig
from harness.run.published import HeadSpec, Row, Table, TableError, TargetSpec, load_table, table_names
from harness.run.suites import DataError, load_suite

DTYPE_BYTES = {"float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float32": 4, "fp32": 4}


class ReproduceError(ValueError):
    """A reproduction that cannot start (a row, a mapping, a head that cannot be found); one clear line."""


def parse_model_dir(items: list[str] | None) -> dict[str, str]:
    """``--model-dir`` values -> {id: folder or embedded alias}. Each item is ``ID=FOLDER`` or a YAML/JSON file
    mapping ids to folders (relative folders are read from the file's folder). Folders must exist.

    Example: ["lmsys/vicuna-7b-v1.3=smollm2-135m", "yuhuili/EAGLE-Vicuna-7B-v1.3=methods/heads/smollm2-135m/eagle"]
    -> {"lmsys/vicuna-7b-v1.3": "smollm2-135m", "yuhuili/EAGLE-Vicuna-7B-v1.3": "methods/heads/smollm2-135m/eagle"}.
    """
    out: dict[str, str] = {}
    for item in items or []:
        path = Path(item).expanduser()
        if "=" not in item and path.suffix in (".yaml", ".yml", ".json"):
            if not path.is_file():
                raise ReproduceError(f"--model-dir {item}: mapping file does not exist")
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8"))
            except yaml.YAMLError as e:
                raise ReproduceError(f"--model-dir {item}: invalid YAML/JSON: {e}") from e
            if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in data.items()):
                raise ReproduceError(f"--model-dir {item}: expected a mapping of ids to folders")
            pairs = [(k, v if v in EMBEDDED_TARGETS or Path(v).is_absolute() else str(path.parent / v))
                     for k, v in data.items()]
        elif "=" in item:
            key, value = item.split("=", 1)
            pairs = [(key.strip(), value.strip())]
        else:
            raise ReproduceError(f"--model-dir {item!r}: expected ID=FOLDER or a .yaml/.json mapping file")
        for key, value in pairs:
            if not key or not value:
                raise ReproduceError(f"--model-dir {item!r}: empty id or folder")
            if value not in EMBEDDED_TARGETS and not Path(value).expanduser().is_dir():
                raise ReproduceError(f"--model-dir: folder {value} for {key!r} does not exist")
            out[key] = value
    return out


@dataclass
class Part:
    """One run of a reproduction: the rows of one target and token budget, plus the vanilla baseline."""

    index: int
    target: TargetSpec
    target_ref: str                     # what load_target gets: a mapped folder / alias, or the Hugging Face id
    rows: list[Row]
    max_new_tokens: int
    heads: dict[str, str | None] = field(default_factory=dict)  # row id -> head folder (None: no head / pending)
    baseline: str = "vanilla"

    @property
    def labels(self) -> dict[str, str]:
        """run label -> table row id (the baseline is not a row unless the table has a vanilla row)."""
        return {r.id: r.id for r in self.rows}


def select_rows(table: Table, rows: list[str] | None) -> list[Row]:
    """The rows asked for (default: every runnable row); an unknown or reported-only row is a clear error."""
    if not rows:
        chosen = table.runnable_rows()
        if not chosen:
            raise ReproduceError(f"table {table.id!r} has no runnable row")
        return chosen
    known = {r.id: r for r in table.rows}
    out = []
    for rid in rows:
        if rid not in known:
            raise ReproduceError(f"--rows: table {table.id!r} has no row {rid!r}; rows: {', '.join(known)}")
        if not known[rid].runnable:
            raise ReproduceError(f"--rows: row {rid!r} of {table.id!r} is reported only: {known[rid].reason}")
        out.append(known[rid])
    return out


def plan(table: Table, rows: list[str] | None = None, model_dir: dict[str, str] | None = None) -> list[Part]:
    """Group the selected rows into parts by (target, max_new_tokens); resolve targets through ``model_dir``."""
    model_dir = model_dir or {}
    groups: dict[tuple[str, int], list[Row]] = {}
    for row in select_rows(table, rows):
        groups.setdefault((row.target, row.max_new_tokens or table.max_new_tokens), []).append(row)
    parts = []
    for i, ((tkey, budget), group) in enumerate(groups.items()):
        spec = table.targets[tkey]
        vanilla = [r for r in group if r.method == "vanilla"]
        part = Part(index=i, target=spec, target_ref=model_dir.get(spec.id, spec.id), rows=group,
                    max_new_tokens=budget, baseline=vanilla[0].id if vanilla else "vanilla")
        for r in group:
            part.heads[r.id] = model_dir.get(r.head) if r.head else None
        parts.append(part)
    return parts


def resolve_head(head: HeadSpec, model_dir: dict[str, str]) -> str:
    """A head's local folder: the ``--model-dir`` mapping, else a Hugging Face download (when online)."""
    if head.id in model_dir:
        return model_dir[head.id]
    if not head.hub:
        raise ReproduceError(f"head {head.id!r} is published at {head.url}, not on the Hugging Face hub: download "
                             f"it and pass --model-dir {head.id}=FOLDER")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(head.id)
    except Exception as e:  # offline, gated, missing: one line that says what to do
        raise ReproduceError(f"head {head.id!r}: not in --model-dir and the Hugging Face download failed "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); on an offline "
                             f"machine copy it and pass --model-dir {head.id}=FOLDER") from e


def run_config(table: Table, part: Part, limit: int | None = None, dtype: str | None = None,
               device: str = "auto", output_dir: str = "results", data_dir: str | None = None) -> RunConfig:
    """The run of one part: exactly the table's protocol (``limit`` only for a quick look)."""
    methods = [] if any(r.method == "vanilla" for r in part.rows) else [MethodSpec("vanilla")]
    for r in part.rows:
        opts = dict(r.options)
        if part.heads.get(r.id):
            opts["head"] = part.heads[r.id]
        methods.append(MethodSpec(r.method, r.id, opts))
    used = [s for s in table.suites]
    return RunConfig(
        target=part.target_ref, dtype=dtype or table.dtype, device=device, methods=methods, suites=used,
        limit=limit, max_new_tokens=part.max_new_tokens, temperatures=[table.temperature], repeats=table.repeats,
        warmup=table.warmup, baseline=part.baseline, chat_template=part.target.chat_template,
        system_prompt=part.target.system_prompt, output_dir=output_dir, data_dir=data_dir,
    )


# ----------------------------------------------------------------------------------------------- dry run


def count_parameters(folder: str | Path) -> int | None:
    """Parameters stored in a checkpoint folder, from the safetensors headers (exact, nothing loaded), else from
    ``config.json`` for a LLaMA-style decoder (embeddings, attention with GQA, SwiGLU MLP, norms); None if neither.

    Example (config only): V=100, H=8, 1 layer, 2 heads, 1 kv head, I=16, untied: 2*100*8 + (8*8*2 + 2*8*4)
    + 3*8*16 + 2*8 + 8 = 1600 + 192 + 384 + 24 = 2200.
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        total = 0
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    n = 1
                    for d in st.get_slice(k).get_shape():
                        n *= d
                    total += n
        return total
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    try:
        v, h, n_layers = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
        heads = cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads", heads)
        hd = cfg.get("head_dim") or h // heads
        inter = cfg["intermediate_size"]
    except KeyError:
        return None
    per_layer = h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * inter + 2 * h
    emb = v * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return emb + n_layers * per_layer + h


def _kv_shape(folder: Path | None, spec: TargetSpec) -> tuple[int | None, int | None, int | None, int | None]:
    """(layers, kv_heads, head_dim, max positions) from a local config.json, else from the table."""
    if folder is not None and (folder / "config.json").is_file():
        cfg = json.loads((folder / "config.json").read_text())
        heads = cfg.get("num_attention_heads")
        hd = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and "hidden_size" in cfg else None)
        return (cfg.get("num_hidden_layers"), cfg.get("num_key_value_heads", heads), hd,
                cfg.get("max_position_embeddings"))
    return spec.layers, spec.kv_heads, spec.head_dim, spec.max_position_embeddings


def _local_folder(ref: str) -> Path | None:
    if ref in EMBEDDED_TARGETS:
        return materialize_embedded(ref)
    p = Path(ref).expanduser()
    return p if p.is_dir() else None


def _gb(n_bytes: float | None) -> str:
    return "?" if n_bytes is None else f"{n_bytes / 1e9:.2f} GB"


def _params(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.1f} M" if n >= 1e5 else f"{int(n):,}"


def dry_run(table: Table, parts: list[Part], config_of, model_dir: dict[str, str]) -> str:
    """What a reproduction would load and run, without loading anything: per part the target and heads (local
    folder or Hugging Face download), their parameters and weight bytes in the run dtype, the KV cache at the
    model's full context, an estimated GPU memory (weights + heads + KV cache; activations and the verification
    tree's logits come on top) and the number of generations:

        generations = Σ_labels Σ_suites Σ_questions turns × repeats,   warm-ups = labels × Σ_{first W questions} turns

    (labels = the rows plus the vanilla baseline; W = protocol warm-ups)."""
    out = [f"table {table.id}: {table.title}", f"source: {table.cite()}",
           f"reported on: {table.hardware} ({table.dtype}, {table.framework})", ""]
    total_gen: int | None = 0
    for part in parts:
        cfg: RunConfig = config_of(part)
        nbytes = DTYPE_BYTES.get(cfg.dtype, 2)
        folder = _local_folder(part.target_ref)
        where = f"local {folder}" if folder else "Hugging Face id (downloaded when the run starts)"
        n_target = count_parameters(folder) if folder else None
        source = "local copy" if n_target is not None else "table"
        if n_target is None and part.target.parameters_b:
            n_target = int(part.target.parameters_b * 1e9)
        layers, kv, hd, positions = _kv_shape(folder, part.target)
        kv_bytes = 2 * layers * kv * hd * positions * nbytes if None not in (layers, kv, hd, positions) else None
        out.append(f"part {part.index + 1}/{len(parts)}: target {part.target.id} -> {where}")
        out.append(f"  weights: {_params(n_target)} parameters ({source}), {_gb(n_target and n_target * nbytes)} "
                   f"in {cfg.dtype}")
        head_bytes = 0.0
        for r in part.rows:
            if not r.head:
                out.append(f"  row {r.id}: {r.method} {r.options or ''} (no head)")
                continue
            h = table.heads[r.head]
            hfolder = Path(model_dir[h.id]) if h.id in model_dir else None
            n = count_parameters(hfolder) if hfolder else None
            n = n if n is not None else (int(h.parameters_b * 1e9) if h.parameters_b else None)
            head_bytes += (n or 0) * nbytes
            src = (f"local {hfolder}" if hfolder else "Hugging Face id (downloaded when the run starts)" if h.hub
                   else f"not on the hub ({h.url}): needs --model-dir {h.id}=FOLDER")
            out.append(f"  row {r.id}: {r.method} {r.options or ''}; head {h.id} -> {src}, {_params(n)} parameters")
        if kv_bytes is not None:
            out.append(f"  KV cache at full context: 2 x {layers} layers x {kv} kv heads x {hd} x {positions} "
                       f"positions x {nbytes} B = {_gb(kv_bytes)}")
        weights = n_target * nbytes if n_target else None
        est = weights + head_bytes + (kv_bytes or 0) if weights else None
        out.append(f"  estimated GPU memory: {_gb(est)} (weights + heads + KV cache; activations and tree logits on "
                   "top)")
        labels = len(cfg.methods)
        try:
            suites = [load_suite(s, cfg.data_dir or os.environ.get("DRAFTBENCH_DATA")).select(cfg.limit)
                      for s in cfg.suites]
        except DataError as e:
            out.append(f"  generations: unknown, suite data missing ({e})")
            total_gen = None
            continue
        turns = sum(len(q.turns) for s in suites for q in s.questions)
        gens = labels * turns * cfg.repeats
        warm = labels * sum(len(q.turns) for q in suites[0].questions[: cfg.warmup])
        total_gen = None if total_gen is None else total_gen + gens + warm
        per_suite = ", ".join(f"{s.name} {len(s.questions)} q / {sum(len(q.turns) for q in s.questions)} turns"
                              for s in suites)
        out.append(f"  generations: {labels} labels ({', '.join(m.label for m in cfg.methods)}) x ({per_suite}) x "
                   f"{cfg.repeats} repeat(s) = {gens}, + {warm} warm-up turns; max_new_tokens {cfg.max_new_tokens}, "
                   f"T = {table.temperature:g}")
    out += ["", f"total generations (all parts, warm-ups included): "
                f"{'unknown (suite data missing)' if total_gen is None else total_gen}"]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------- running


def record_reproduction(run_dir: Path, table: Table, part: Part, model_dir: dict[str, str]) -> None:
    """Add ``reproduce`` to the run's manifest (which table, which part, label -> row id, the id mapping)."""
    path = Path(run_dir) / "manifest.json"
    if not path.is_file():
        return
    manifest = json.loads(path.read_text())
    manifest["reproduce"] = {"table": table.id, "table_path": table.path, "table_sha256": table.sha256,
                             "part": part.index, "target": part.target.id, "target_loaded": part.target_ref,
                             "rows": part.labels, "model_dir": model_dir}
    path.write_text(json.dumps(manifest, indent=1, default=str))


def reproduce(table: Table, rows: list[str] | None = None, limit: int | None = None,
              model_dir: dict[str, str] | None = None, dtype: str | None = None, device: str = "auto",
              output_dir: str = "results", data_dir: str | None = None, progress: bool = True,
              target=None, n_boot: int = 2000) -> list[dict[str, Any]]:
    """Run every part of a reproduction, write each run's report and comparison; return, per part,
    ``{"run_dir", "frame", "markdown", "paths"}``. ``target`` (an in-process Target) is for tests only."""
    from harness.measure.report import write_report
    from harness.run.against import compare_run
    from harness.run.runner import run

    model_dir = model_dir or {}
    parts = plan(table, rows, model_dir)
    results = []
    for part in parts:
        for r in part.rows:
            if r.head:
                part.heads[r.id] = resolve_head(table.heads[r.head], model_dir)
        config = run_config(table, part, limit, dtype, device, output_dir, data_dir)
        state: dict[str, bool] = {}

        def mark(recs, part=part, state=state, config=config):
            if "done" not in state and recs:  # the first stored question: the manifest exists now
                state["done"] = True
                record_reproduction(Path(config.output_dir) / recs[0]["run_id"], table, part, model_dir)

        run_dir = run(config, progress=progress, target=target, on_question=mark)
        record_reproduction(run_dir, table, part, model_dir)
        paths = write_report(run_dir)
        result = compare_run(run_dir, table, n_boot=n_boot)
        result["paths"] = {**paths, **result["paths"]}
        results.append({"run_dir": run_dir, **result})
    return results


# ----------------------------------------------------------------------------------------------- command line


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_reproduce_cli(sub) -> None:
    """``draftbench reproduce`` and ``draftbench report RUN --against TABLE`` (added to the existing report parser)."""
    p = sub.add_parser("reproduce", help="run a published table's protocol and print measured next to reported")
    p.add_argument("table", nargs="?", help=f"a shipped table ({', '.join(table_names())}) or a table YAML file")
    p.add_argument("--list", action="store_true", help="list the shipped tables with their rows and cells")
    p.add_argument("--rows", type=_csv, help="comma-separated row ids (default: every runnable row)")
    p.add_argument("--limit", type=int, help="first N questions of each suite (a quick look, not the protocol)")
    p.add_argument("--model-dir", action="append", default=[], metavar="ID=FOLDER|FILE",
                   help="local copy of a target or head id (repeatable), or a YAML/JSON file mapping ids to folders")
    p.add_argument("--dry-run", action="store_true", help="list what would load, its size and memory, generations")
    p.add_argument("--dtype", help="override the table's dtype (e.g. float32 on a CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--output-dir", default="results")
    p.add_argument("--data-dir", help="default: $DRAFTBENCH_DATA")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples for the speed-up CI")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_reproduce)
    if "report" in sub.choices:
        rep = sub.choices["report"]
        rep.add_argument("--against", metavar="TABLE", help="compare the run with a published table")
        rep.add_argument("--model-dir", action="append", default=[], metavar="ID=FOLDER|FILE",
                         help="with --against: which table target a local model folder stands for")


def list_tables() -> str:
    lines = []
    for name in table_names():
        t = load_table(name)
        runnable = [r.id for r in t.runnable_rows()]
        other = [r.id for r in t.rows if not r.runnable]
        lines.append(f"{name:<22}{t.n_cells():>4} cells  rows: {', '.join(runnable)}"
                     + (f"; reported only: {', '.join(other)}" if other else ""))
        lines.append(f"{'':<22}{t.cite()}; {t.hardware}, T = {t.temperature:g}")
    return "\n".join(lines) + "\n"


def cmd_reproduce(args) -> int:
    if args.list or not args.table:
        print(list_tables(), end="")
        return 0
    table = load_table(args.table)
    model_dir = parse_model_dir(args.model_dir)
    if args.dry_run:
        parts = plan(table, args.rows, model_dir)
        print(dry_run(table, parts, lambda part: run_config(table, part, args.limit, args.dtype, args.device,
                                                            args.output_dir, args.data_dir), model_dir), end="")
        return 0
    results = reproduce(table, args.rows, args.limit, model_dir, args.dtype, args.device, args.output_dir,
                        args.data_dir, progress=not args.no_progress, n_boot=args.n_boot)
    for res in results:
        print(f"run:  {res['run_dir']}\n")
        print(res["markdown"])
        for name, path in sorted(res["paths"].items()):
            print(f"{name + ':':<22}{path}")
    return 0


def cmd_report_against(args) -> int:
    """The ``--against TABLE`` part of ``draftbench report RUN``: print the comparison and where it was written."""
    from harness.run.against import compare_run

    table = load_table(args.against)
    res = compare_run(Path(args.run_dir), table, model_dir=parse_model_dir(args.model_dir))
    print(res["markdown"])
    for name, path in sorted(res["paths"].items()):
        print(f"{name + ':':<22}{path}")
    return 0


__all__ = ["ReproduceError", "TableError", "add_reproduce_cli", "cmd_report_against", "dry_run", "parse_model_dir",
           "plan", "reproduce", "run_config"]
