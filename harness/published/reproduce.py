"""``draftbench reproduce TABLE``: run exactly a published table's protocol and print measured next to reported.

A reproduction is an ordinary run (:func:`harness.run.runner.run`) built from the table
(:mod:`harness.published.tables`): the table's rows as method labels plus the vanilla baseline, its suites, token
budget, temperature, warm-ups, repeats, chat template and system prompt, the target and heads loaded by id. Rows
of different targets (or token budgets) become separate runs ("parts"). Each run's manifest records
``reproduce: {table, table_sha256, part, target, rows: {label: row id}}``, so ``draftbench report RUN --against
TABLE`` finds the rows again; the comparison itself is :mod:`harness.published.against`.

Targets and heads are loaded by Hugging Face id (downloaded when online), or from local copies with
``--model-dir ID=FOLDER`` (repeatable) or ``--model-dir mapping.yaml`` (``ID: FOLDER`` lines, folders relative to
the file), e.g. on an offline cluster; a target may also map to an embedded alias (``smollm2-135m``).
``--dry-run`` loads nothing: it lists what would load, its size and estimated GPU memory, and the number of
generations (:mod:`harness.published.dryrun`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.models import EMBEDDED_TARGETS
from harness.published.tables import HeadSpec, Row, Table, TableError, TargetSpec, load_table, table_names
from harness.run.config import MethodSpec, RunConfig


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
    """The rows asked for (default: every runnable row); an unknown or reported-only row is a clear error, and so
    is an engine table (its rows run in the engine it names: ``--dry-run`` says what each needs)."""
    if table.engine is not None:
        e = table.engine
        raise ReproduceError(f"table {table.id!r} was measured in {e['name']} {e['version']} at batch size(s) "
                             f"{', '.join(map(str, table.batch_sizes()))}: its rows run in that engine, not in "
                             "draftbench's loop; `draftbench reproduce " + table.id + " --dry-run` names the engine "
                             "configuration each row needs")
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


# ----------------------------------------------------------------------------------------------- running


def reproduction_block(table: Table, part: Part, model_dir: dict[str, str]) -> dict[str, Any]:
    """The manifest's ``reproduce`` block of one part (which table, which part, label -> row id, the id mapping);
    :func:`harness.run.runner.run` writes it with the manifest (``manifest_extra``)."""
    return {"table": table.id, "table_path": table.path, "table_sha256": table.sha256, "part": part.index,
            "target": part.target.id, "target_loaded": part.target_ref, "rows": part.labels, "model_dir": model_dir}


def reproduce(table: Table, rows: list[str] | None = None, limit: int | None = None,
              model_dir: dict[str, str] | None = None, dtype: str | None = None, device: str = "auto",
              output_dir: str = "results", data_dir: str | None = None, progress: bool = True,
              target=None, n_boot: int = 2000) -> list[dict[str, Any]]:
    """Run every part of a reproduction, write each run's report and comparison; return, per part,
    ``{"run_dir", "frame", "markdown", "paths"}``. ``target`` (an in-process Target) is for tests only."""
    from harness.measure.report import write_report
    from harness.published.against import compare_run
    from harness.run.runner import run

    model_dir = model_dir or {}
    parts = plan(table, rows, model_dir)
    results = []
    for part in parts:
        for r in part.rows:
            if r.head:
                part.heads[r.id] = resolve_head(table.heads[r.head], model_dir)
        config = run_config(table, part, limit, dtype, device, output_dir, data_dir)
        run_dir = run(config, progress=progress, target=target,
                      manifest_extra={"reproduce": reproduction_block(table, part, model_dir)})
        paths = write_report(run_dir)
        result = compare_run(run_dir, table, n_boot=n_boot)
        result["paths"] = {**paths, **result["paths"]}
        results.append({"run_dir": run_dir, **result})
    return results


def list_tables() -> str:
    lines = []
    for name in table_names():
        t = load_table(name)
        runnable = [r.id for r in t.runnable_rows()]
        other = [r.id for r in t.rows if not r.runnable]
        lines.append(f"{name:<26}{t.n_cells():>4} cells  rows: {', '.join(runnable) or 'none runnable here'}"
                     + (f"; reported only: {', '.join(other)}" if other else ""))
        engine = (f"; engine {t.engine['name']} {t.engine['version']}, batch {', '.join(map(str, t.batch_sizes()))}"
                  if t.engine else "")
        lines.append(f"{'':<26}{t.cite()}; {t.hardware}, T = {t.temperature:g}{engine}")
    return "\n".join(lines) + "\n"


__all__ = ["ReproduceError", "TableError", "list_tables", "parse_model_dir", "plan", "reproduce",
           "reproduction_block", "run_config"]
