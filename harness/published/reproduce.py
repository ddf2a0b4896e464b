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

An engine table (``engine: {name: vllm | sglang}``, EAGLE-3's SGLang and vLLM tables) runs in the engine it names,
through the served engine (:mod:`harness.backends.served`) and load levels (:mod:`harness.run.load`): per part one
run whose entries are the rows, each ``engine: openai`` with ``launch`` set to the table's engine and the row's
``engine_options`` passed through (vLLM's ``speculative_config`` parsed from its JSON string, its ``model`` the
head's local folder where it names the row's head; SGLang gets the head as ``--speculative-draft-model-path``), plus
the same engine without speculation as the baseline (launched with the engine options every speculative row shares
that do not set speculation, e.g. ``tensor_parallel_size``), and ``load: {concurrency: the table's batch sizes,
num_prompts: every question}``: each level sends each question of the table's suite once (its first turn; prompts
are never repeated inside a level, so the suite needs at least the largest batch size of questions). The report is
the load report, and the comparison puts each ``throughput_ratio`` cell next to the level's ratio of output
tokens/s at the column's batch size (:func:`harness.published.against.compare_load`). ``--server-url LABEL=URL``
(one per row id and one for the baseline, ``vanilla``) measures servers already running instead, as they were
started (``--dry-run`` lists the engine options each needs); ``--engine-option KEY=VALUE`` adds an engine option to
every launched entry (``gpu_memory_utilization=0.45``: vLLM's servers run side by side on one GPU). An engine
draftbench does not launch is refused in one line naming those it does (:data:`LAUNCHED_ENGINES`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.models import EMBEDDED_TARGETS
from harness.published.tables import (
    LAUNCHED_ENGINES,
    HeadSpec,
    Row,
    Table,
    TableError,
    TargetSpec,
    load_table,
    table_names,
)
from harness.run.config import MethodSpec, RunConfig
from harness.run.suites import DataError, load_suite
from harness.yamlsafe import safe_load


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
                data = safe_load(path.read_text(encoding="utf-8"))
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


def check_engine(table: Table) -> None:
    """Refuse an engine table whose engine draftbench does not launch, in one line naming those it does."""
    e = table.engine
    if e is not None and e["name"] not in LAUNCHED_ENGINES:
        raise ReproduceError(f"table {table.id!r} was measured in {e['name']} {e['version']} at batch size(s) "
                             f"{', '.join(map(str, table.batch_sizes()))}: draftbench launches "
                             f"{' or '.join(LAUNCHED_ENGINES)} for an engine table, not {e['name']}; `draftbench "
                             f"reproduce {table.id} --dry-run` names the engine configuration each row needs")


def select_rows(table: Table, rows: list[str] | None) -> list[Row]:
    """The rows asked for (default: every runnable row); an unknown or reported-only row is a clear error, and so
    is an engine table whose engine draftbench does not launch (:func:`check_engine`)."""
    check_engine(table)
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
               device: str = "auto", output_dir: str = "results", data_dir: str | None = None,
               server_urls: dict[str, str] | None = None, engine_options: dict[str, Any] | None = None) -> RunConfig:
    """The run of one part: exactly the table's protocol (``limit`` only for a quick look); an engine table's is
    :func:`engine_run_config` (``server_urls``, ``engine_options``: its ``--server-url``, ``--engine-option``)."""
    if table.engine is not None:
        return engine_run_config(table, part, limit, dtype, device, output_dir, data_dir, server_urls,
                                 engine_options)
    if server_urls or engine_options:
        raise ReproduceError(f"--server-url and --engine-option are for an engine table; {table.id!r} runs in "
                             "draftbench's own loop")
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


# ----------------------------------------------------------------------------------------------- engine tables


def speculative_option(engine: str, key: str) -> bool:
    """Whether an engine option sets the engine's speculation (so the baseline, without speculation, leaves it out):
    vLLM's ``speculative_config``, SGLang's ``speculative_*`` flags. Example: ("sglang", "speculative_num_steps") ->
    True; ("vllm", "tensor_parallel_size") -> False."""
    return key == "speculative_config" if engine == "vllm" else key.startswith("speculative_")


def row_engine_options(engine: str, row: Row, head: str | None) -> dict[str, Any]:
    """A row's entry's ``engine_options``: ``launch`` = the table's engine and the row's own engine options; vLLM's
    ``speculative_config`` (a JSON string in the table) as a mapping, its ``model`` replaced by ``head`` (the row's
    head's local folder) where it names the row's head. Example: ("vllm", row with head "org/h" and
    speculative_config '{"method": "eagle3", "model": "org/h", "num_speculative_tokens": 2}', "/heads/h") ->
    {"launch": "vllm", "speculative_config": {"method": "eagle3", "model": "/heads/h", "num_speculative_tokens": 2}}."""
    out: dict[str, Any] = {"launch": engine, **row.engine_options}
    if engine == "vllm" and "speculative_config" in out:
        spec = json.loads(out["speculative_config"])  # a JSON object: checked when the table loaded
        if head and row.head and spec.get("model") == row.head:
            spec["model"] = head
        out["speculative_config"] = spec
    return out


def baseline_engine_options(engine: str, rows: list[Row]) -> dict[str, Any]:
    """The baseline's ``engine_options``: the same engine without speculation, with every engine option that all the
    speculative rows share (same value) and that does not set speculation (:func:`speculative_option`).
    Example: ("sglang", rows with {speculative_num_steps: 3, tp_size: 2} and {speculative_num_steps: 5, tp_size: 2})
    -> {"launch": "sglang", "tp_size": 2}."""
    spec = [r.engine_options for r in rows if r.method != "vanilla"]
    shared = {k: v for k, v in (spec[0] if spec else {}).items()
              if not speculative_option(engine, k) and all(k in o and o[k] == v for o in spec[1:])}
    return {"launch": engine, **shared}


def level_prompts(table: Table, limit: int | None = None, data_dir: str | None = None) -> int:
    """Requests per load level of an engine table's run: every question of its suites (the first ``limit`` of each),
    sent once per level, so that no level repeats a prompt and every level has the same ones; a
    :class:`ReproduceError` when they are fewer than the largest batch size (that level could never have as many
    requests in flight)."""
    try:
        n = sum(len(load_suite(s, data_dir or os.environ.get("DRAFTBENCH_DATA")).select(limit).questions)
                for s in table.suites)
    except DataError as e:
        raise ReproduceError(f"table {table.id!r}: {e}") from None
    top = max(table.batch_sizes())
    if n < top:
        raise ReproduceError(f"table {table.id!r}: batch size {top} needs {top} distinct prompts in flight and "
                             f"{', '.join(table.suites)} has {n} question(s)"
                             + (f" with --limit {limit}" if limit else "") + "; prompts are not repeated in a level")
    return n


def engine_entries(table: Table, part: Part, server_urls: dict[str, str] | None = None,
                   engine_options: dict[str, Any] | None = None) -> list[MethodSpec]:
    """The entries of an engine table's part: the baseline (unless the table has a vanilla row), then each row, all
    ``engine: openai``. Launched: ``launch`` = the table's engine, :func:`row_engine_options` /
    :func:`baseline_engine_options` with ``engine_options`` over them, each row's options and its head's folder as
    method options. With ``server_urls`` (label -> URL, one for every label): only ``server_url``, no method options
    (a server started elsewhere runs as it was started)."""
    engine = table.engine["name"]
    labels = [part.baseline, *(r.id for r in part.rows if r.id != part.baseline)]
    if server_urls:
        missing, unknown = [x for x in labels if x not in server_urls], [x for x in server_urls if x not in labels]
        if missing or unknown:
            raise ReproduceError(f"--server-url: give LABEL=URL for each of {', '.join(labels)} (the baseline and "
                                 f"the rows); " + (f"missing {', '.join(missing)}" if missing else
                                                   f"{', '.join(unknown)} is none of them"))
        if engine_options:
            raise ReproduceError("--engine-option configures a server reproduce launches; servers at --server-url "
                                 "run as they were started")
    extra = dict(engine_options or {})
    out = []
    if not any(r.method == "vanilla" for r in part.rows):
        base = {"server_url": server_urls["vanilla"]} if server_urls else {
            **baseline_engine_options(engine, part.rows), **extra}
        out.append(MethodSpec("vanilla", engine="openai", engine_options=base))
    for r in part.rows:
        if server_urls:
            url = server_urls[r.id]
            out.append(MethodSpec(r.method, r.id, {}, engine="openai", engine_options={"server_url": url}))
            continue
        opts = dict(r.options)
        if part.heads.get(r.id):
            opts["head"] = part.heads[r.id]
        out.append(MethodSpec(r.method, r.id, opts, engine="openai",
                              engine_options={**row_engine_options(engine, r, part.heads.get(r.id)), **extra}))
    return out


def engine_run_config(table: Table, part: Part, limit: int | None = None, dtype: str | None = None,
                      device: str = "auto", output_dir: str = "results", data_dir: str | None = None,
                      server_urls: dict[str, str] | None = None,
                      engine_options: dict[str, Any] | None = None) -> RunConfig:
    """The run of one part of an engine table: :func:`engine_entries` measured as load levels at the table's batch
    sizes, each level every question once (:func:`level_prompts`), with the table's suites, budget, temperature,
    warm-ups and repeats."""
    check_engine(table)
    return RunConfig(
        target=part.target_ref, dtype=dtype or table.dtype, device=device,
        methods=engine_entries(table, part, server_urls, engine_options), suites=list(table.suites), limit=limit,
        max_new_tokens=part.max_new_tokens, temperatures=[table.temperature], repeats=table.repeats,
        warmup=table.warmup, baseline=part.baseline, chat_template=part.target.chat_template,
        system_prompt=part.target.system_prompt, output_dir=output_dir, data_dir=data_dir, engine="openai",
        load={"concurrency": table.batch_sizes(), "num_prompts": level_prompts(table, limit, data_dir)},
    )


def parse_server_urls(items: list[str] | None) -> dict[str, str]:
    """``--server-url`` values -> {label: URL}; each item ``LABEL=URL`` (a row id, or ``vanilla`` for the baseline).
    Example: ["vanilla=http://h:8000", "e3=http://h:8001"] -> {"vanilla": "http://h:8000", "e3": "http://h:8001"}."""
    out: dict[str, str] = {}
    for item in items or []:
        label, _, url = item.partition("=")
        if not url or not label.strip() or "://" in label:
            raise ReproduceError(f"--server-url {item!r}: expected LABEL=URL (a row id, or vanilla for the baseline)")
        out[label.strip()] = url.strip()
    return out


# ----------------------------------------------------------------------------------------------- running


def reproduction_block(table: Table, part: Part, model_dir: dict[str, str]) -> dict[str, Any]:
    """The manifest's ``reproduce`` block of one part (which table, which part, label -> row id, the id mapping);
    :func:`harness.run.runner.run` writes it with the manifest (``manifest_extra``)."""
    block = {"table": table.id, "table_path": table.path, "table_sha256": table.sha256, "part": part.index,
             "target": part.target.id, "target_loaded": part.target_ref, "rows": part.labels, "model_dir": model_dir}
    return {**block, "engine": table.engine["name"]} if table.engine is not None else block


def reproduce(table: Table, rows: list[str] | None = None, limit: int | None = None,
              model_dir: dict[str, str] | None = None, dtype: str | None = None, device: str = "auto",
              output_dir: str = "results", data_dir: str | None = None, progress: bool = True,
              target=None, n_boot: int = 2000, server_urls: dict[str, str] | None = None,
              engine_options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run every part of a reproduction, write each run's report and comparison; return, per part,
    ``{"run_dir", "frame", "markdown", "paths"}``. ``target`` (an in-process Target) is for tests only;
    ``server_urls`` and ``engine_options``: an engine table's ``--server-url`` and ``--engine-option``."""
    from harness.published.against import compare_run
    from harness.report.report import write_report
    from harness.run.runner import run

    model_dir = model_dir or {}
    parts = plan(table, rows, model_dir)
    if server_urls and len(parts) > 1:
        raise ReproduceError(f"--server-url: the rows asked for run as {len(parts)} runs (targets or token budgets); "
                             "give --rows of one")
    results = []
    for part in parts:
        for r in part.rows:
            if r.head and not server_urls:  # a server started elsewhere has its head already
                part.heads[r.id] = resolve_head(table.heads[r.head], model_dir)
        config = run_config(table, part, limit, dtype, device, output_dir, data_dir, server_urls, engine_options)
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


__all__ = ["ReproduceError", "TableError", "engine_run_config", "list_tables", "parse_model_dir",
           "parse_server_urls", "plan", "reproduce", "reproduction_block", "run_config"]
