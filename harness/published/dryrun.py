"""``draftbench reproduce TABLE --dry-run``: what a reproduction would load and run, without loading anything.

An engine table (``engine:``, e.g. EAGLE-3's SGLang tables, arXiv:2503.01840v3 Tables 3-4) is not run by draftbench's
loop but in the engine it names, launched (:mod:`harness.published.reproduce`): its dry run (:func:`engine_dry_run`)
names, per row, the engine and version, the GPU, the batch sizes, the model and head ids and the engine options, the
entry it runs as (or why it is reported only), and the load levels with their prompts.

Sizes come from local copies (safetensors headers, else ``config.json``) or from the table's known sizes; the GPU
memory estimate is weights + heads + the KV cache at the model's full context (activations and the verification
tree's logits come on top); generations are counted from the suites' questions and turns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.measure.metrics import kv_cache_bytes
from harness.models import EMBEDDED_TARGETS, kv_shape, materialize_embedded
from harness.published.reproduce import Part, ReproduceError, level_prompts
from harness.published.tables import LAUNCHED_ENGINES, Table, TargetSpec
from harness.run.config import RunConfig
from harness.run.suites import DataError, load_suite

DTYPE_BYTES = {"float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float32": 4, "fp32": 4}


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
        return kv_shape(json.loads((folder / "config.json").read_text()))
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
        known = None not in (layers, kv, hd, positions)
        kv_bytes = kv_cache_bytes(layers, kv, hd, positions, nbytes) if known else None
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
            data_dir = cfg.data_dir or os.environ.get("DRAFTBENCH_DATA")
            suites = [load_suite(s, data_dir).select(cfg.limit, per_category=cfg.stratify) for s in cfg.suites]
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


def engine_dry_run(table: Table, rows: list[str] | None = None, limit: int | None = None,
                   data_dir: str | None = None) -> str:
    """What each row of an engine table would need to be measured: the engine and version, the GPU, the batch sizes
    of the columns (batch > 1: a load sweep of that many concurrent requests through the served engine), the model,
    the head and the engine options; the entry a runnable row runs as, the reason of a reported-only one; the load
    levels and the prompts each sends (every question once). Nothing is loaded or launched."""
    e = table.engine
    chosen = [table.row(r) for r in rows] if rows else table.rows
    batches = ", ".join(map(str, table.batch_sizes()))
    launched = e["name"] in LAUNCHED_ENGINES
    how = (f"reproduce launches it (engine: openai, launch: {e['name']}) with the same engine without speculation "
           "as the baseline" if launched else
           f"draftbench launches {' or '.join(LAUNCHED_ENGINES)}, not {e['name']}: reproduce does not run it")
    out = [f"table {table.id}: {table.title}", f"source: {table.cite()}",
           f"engine table: measured in {e['name']} {e['version']} on {table.hardware} ({table.dtype}); {how}", ""]
    for r in chosen:
        target = table.targets[r.target]
        opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in r.engine_options.items()) or "none"
        out.append(f"row {r.id} ({r.label}):")
        out.append(f"  engine: {e['name']} {e['version']}, GPU: {table.hardware}, batch size(s): "
                   f"{', '.join(str(table.columns[c].batch_size) for c in r.cells)}")
        out.append(f"  model: {target.id}; head: {r.head or 'none'}; engine options: {opts}")
        if any(table.columns[c].batch_size > 1 for c in r.cells):
            out.append("  batch > 1: a load sweep of that many concurrent requests through the served engine "
                       "(engine: openai against the launched server)")
        if launched and r.runnable:
            out.append(f"  runs: entry {r.id}, method {r.method}, engine openai, launch {e['name']}")
        else:
            out.append(f"  needs: {r.reason}")
    if launched:
        try:
            prompts = f"{level_prompts(table, limit, data_dir)} prompts a level (every question once)"
        except ReproduceError as err:
            prompts = f"cannot run: {err}"
        out += ["", f"load levels: concurrency {batches}; {prompts}"]
    out += ["", f"columns' batch sizes: {batches}; nothing was loaded or launched"]
    return "\n".join(out) + "\n"
