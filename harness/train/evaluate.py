"""``draftbench train eval OBJECTIVE --head PATH [--head PATH ...] --data FEATS``: score saved heads on a feature
dataset's held-out split, so that a shipped head and a newly trained one are compared on one set.

**Split.** The trainer's own held-out conversations (:func:`harness.train.loop.held_out_split`: the last
``eval_fraction`` of the first ``max_shards`` shards' conversations in build order, cut at ``max_len``, no noise).
It depends on the data and those three settings only (not on a seed), so the same data and settings give the set a
run evaluated on.

**Score.** The training loop's evaluation, unchanged (:func:`harness.train.loop.evaluate`): top-1 accuracy of the
draft at draft positions 1..``eval_positions`` against the target's greedy token, with the positions counted, and
the objective's loss averaged over batches of ``batch_size`` (the loss, not the accuracy, depends on the batching).
For a run's own head on the run's data and settings this is the run's ``final_eval``: exactly so for the run's
checkpoint of its last step (fp32 weights), and up to the fp16 rounding of the published weights for its ``head/``.

**Heads.** ``PATH`` is a head folder in the objective's published format (a shipped head, a run's ``head/``:
:meth:`harness.train.objectives.Objective.load`) or a training checkpoint (``checkpoints/step-N``, the training
module's fp32 weights: :meth:`~harness.train.objectives.Objective.load_checkpoint`). The objective's options are the
head's training options (``recipe.json`` in the head folder or beside it, ``run.json`` of a checkpoint's run) unless
given; an EAGLE-3 head drafts over its own vocabulary (``d2t``/``t2d``), a reduced ``train_vocab`` is rebuilt from
the head's ``token_counts.json``. A head or dataset that does not fit the target or the objective is refused in one
line before anything is written.

**Comparison.** With several heads, each is scored on the same split and every head after the first gets its
difference to the first per draft position, acc_B - acc_A, with a paired percentile-bootstrap 95% CI
(:func:`harness.measure.noise.paired_rate_difference_ci`): the held-out conversations are resampled, the same
ones for both heads, because the positions of one conversation are correlated (resampling positions would give too
narrow an interval). The hits and positions per conversation come from the same evaluation pass
(``evaluate(..., per_conversation=True)``, which counts a batch's rows one at a time; the totals are their sums).

**Output** (``--out FILE.csv``): tidy rows, one per head and draft position (objective, head, data, position, acc,
positions, loss; diff, ci_low, ci_high for every head after the first), and ``FILE.json`` beside it: the manifest
(per head: its path, the sha256 of its weight files, its options, its scores and per-conversation counts; the data
manifest's sha256, the split settings and the held-out set's sha256, the bootstrap's resamples and seed, git hash,
command).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.engine.draftvocab import COUNTS_FILE, load_counts
from harness.measure.env import git_info
from harness.measure.noise import paired_rate_difference_ci
from harness.models import Target
from harness.train.features import file_sha256, read_manifest
from harness.train.loop import TrainConfig, check_data, evaluate, held_out_split
from harness.train.objectives import Objective, get_objective

CHECKPOINT_WEIGHTS = "model.safetensors"  # accelerate's save_state: the training module's state dict
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
COLUMNS = ("objective", "head", "data", "position", "acc", "positions", "loss", "diff", "ci_low", "ci_high")
BOOTSTRAP_RESAMPLES = 10000  # paired bootstrap of the differences between heads (``--bootstrap``)
BOOTSTRAP_SEED = 0


def is_checkpoint(folder: Path) -> bool:
    """A training checkpoint (``checkpoints/step-N``: accelerate's weights and the loop's ``train_state.json``)."""
    return (folder / CHECKPOINT_WEIGHTS).is_file() and (folder / "train_state.json").is_file()


def training_options(objective_name: str, head: Path) -> tuple[dict[str, Any], Path | None]:
    """The objective options ``head`` was trained with, and the file they come from: ``recipe.json`` in the head
    folder (shipped heads) or beside it (a run's ``head/``), or a checkpoint's ``run.json`` two folders up; ({},
    None) when none is found or it records another objective."""
    candidates = ([head.parent.parent / "run.json"] if is_checkpoint(head)
                  else [head / "recipe.json", head.parent / "recipe.json"])
    for path in candidates:
        if path.is_file():
            doc = json.loads(path.read_text())
            if doc.get("objective") == objective_name and isinstance(doc.get("options"), dict):
                return doc["options"], path
    return {}, None


def weight_hashes(head: Path) -> dict[str, str]:
    """sha256 of each weight file of ``head`` (a checkpoint: its ``model.safetensors`` only)."""
    files = [head / CHECKPOINT_WEIGHTS] if is_checkpoint(head) else \
        sorted(p for p in head.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    return {p.name: file_sha256(p) for p in files}


def _token_counts(objective: Objective, head: Path, vocab: int) -> torch.Tensor | None:
    """The head's draft-vocabulary counts (``token_counts.json`` in the head folder, or in a checkpoint's run's
    ``head/``); None when there are none and the objective needs none (no ``train_vocab``)."""
    folder = head.parent.parent / "head" if is_checkpoint(head) else head
    if (folder / COUNTS_FILE).is_file():
        return load_counts(folder, vocab)
    n = getattr(objective.options, "train_vocab", 0)
    if n:
        raise ValueError(f"{head}: option train_vocab={n} needs the head's token counts ({folder / COUNTS_FILE}), "
                         "which are missing")
    return None


def load_for_eval(objective: Objective, head: Path) -> nn.Module:
    """``head`` (published folder or checkpoint) through ``objective``, with its draft vocabulary set."""
    counts = _token_counts(objective, head, objective.lm_head.weight.shape[0])
    if counts is not None:
        objective.set_token_counts(counts)
    if not is_checkpoint(head):
        return objective.load(head)
    from safetensors.torch import load_file

    try:
        return objective.load_checkpoint(load_file(str(head / CHECKPOINT_WEIGHTS)))
    except (RuntimeError, KeyError) as e:  # load_state_dict: missing, unexpected or mis-shaped keys
        first = (str(e).strip() or type(e).__name__).splitlines()
        raise ValueError(f"{head}: checkpoint does not fit objective {objective.name!r} on this target and data "
                         f"({' '.join(line.strip() for line in first[:3])[:300]})") from None


def check_request(objective_name: str, heads: Sequence[str | Path], out: str | Path | None,
                  n_boot: int = BOOTSTRAP_RESAMPLES) -> type[Objective]:
    """The objective's class, after the checks that need no target: a known objective, one or more existing head
    folders, a .csv output, a positive resample count."""
    cls = get_objective(objective_name)
    if not heads:
        raise ValueError(f"give at least one head (a head folder in the {objective_name} format or a "
                         "checkpoints/step-N folder)")
    for head in heads:
        if not Path(head).is_dir():
            raise ValueError(f"no head at {head} (a head folder in the {objective_name} format or a "
                             "checkpoints/step-N folder)")
    if out is not None and Path(out).suffix != ".csv":
        raise ValueError(f"--out {out}: give a .csv file (the manifest goes beside it as .json)")
    if n_boot < 1:
        raise ValueError(f"--bootstrap {n_boot}: give a number of resamples >= 1")
    return cls


def eval_heads(objective_name: str, target: Target, heads: Sequence[str | Path], data_dir: str | Path,
               cfg: TrainConfig | None = None, options: dict[str, Any] | None = None,
               out: str | Path | None = None, command: str | None = None,
               n_boot: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
    """Score each of ``heads`` with ``objective_name`` on ``data_dir``'s held-out split under ``cfg``
    (eval_fraction, max_shards, max_len, batch_size, eval_positions, cpu); ``options`` override each head's
    training options. With several heads, every head after the first gets its difference to the first per draft
    position with a paired bootstrap 95% CI over the held-out conversations (``n_boot`` resamples, seed
    :data:`BOOTSTRAP_SEED`). Every head is loaded before any is scored. Writes ``out`` (CSV) and its ``.json``
    manifest when given; returns the manifest (with ``rows``)."""
    from accelerate import Accelerator

    cfg = cfg or TrainConfig()
    cls = check_request(objective_name, heads, out, n_boot)
    heads, data_dir = [Path(h) for h in heads], Path(data_dir)
    manifest = read_manifest(data_dir, cfg.max_shards)
    loaded = []
    for head in heads:
        trained, source = training_options(objective_name, head)
        objective = cls.create(target, {**trained, **(options or {})})
        check_data(objective, target, manifest, data_dir)
        loaded.append((head, objective, load_for_eval(objective, head), source))
    split = held_out_split(data_dir, cfg, target.model.get_output_embeddings())
    if len(split) == 0:
        raise ValueError(f"{data_dir}: no held-out conversations at eval_fraction={cfg.eval_fraction}")
    accelerator = Accelerator(cpu=cfg.cpu)
    scored, rows = [], []
    for head, objective, module, source in loaded:
        result = evaluate(objective, module, split, cfg, accelerator, per_conversation=len(heads) > 1)
        entry = {"head": str(head), "head_kind": "checkpoint" if is_checkpoint(head) else "published",
                 "head_weights_sha256": weight_hashes(head), "options": dataclasses.asdict(objective.options),
                 "options_from": str(source) if source else None, **result}
        if scored:
            first = scored[0]
            entry["diff"] = [[None if math.isnan(x) else round(x, 6) for x in d] for d in paired_rate_difference_ci(
                first["conversation_hits"], first["conversation_positions"], result["conversation_hits"],
                result["conversation_positions"], n_boot, BOOTSTRAP_SEED)]  # [position][diff, low, high]
        scored.append(entry)
        rows += [{"objective": objective_name, "head": str(head), "data": str(data_dir), "position": j + 1,
                  "acc": acc, "positions": n, "loss": result["loss"],
                  **(dict(zip(("diff", "ci_low", "ci_high"), entry["diff"][j])) if "diff" in entry else {})}
                 for j, (acc, n) in enumerate(zip(result["acc"], result["positions"]))]
    doc = {
        "objective": objective_name, "target": target.name,
        "heads": scored,
        "data_dir": str(data_dir), "data_manifest_sha256": file_sha256(data_dir / "manifest.json"),
        "split": {"eval_fraction": cfg.eval_fraction, "max_shards": cfg.max_shards, "max_len": cfg.max_len,
                  "eval_conversations": len(split), "eval_sha256": split.index_sha256()},
        "batch_size": cfg.batch_size, "eval_positions": cfg.eval_positions,
        **({"bootstrap": {"resamples": n_boot, "seed": BOOTSTRAP_SEED, "over": "held-out conversations",
                          "diff": "acc of the head minus acc of the first head, per draft position"}}
           if len(heads) > 1 else {}),
        **git_info(), "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "rows": rows,
    }
    if out is not None:
        write_result(doc, Path(out))
    return doc


def write_result(doc: dict[str, Any], out: Path) -> None:
    """``out`` (.csv): the tidy rows (diff and CI empty for the first head); ``out`` with suffix .json: the
    manifest without them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(doc["rows"])
    out.with_suffix(".json").write_text(json.dumps({k: v for k, v in doc.items() if k != "rows"}, indent=1) + "\n")


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def show(doc: dict[str, Any]) -> str:
    """The result as a small table: one line per draft position with each head's top-1 accuracy (and, for every
    head after the first, its difference to the first with the 95% CI), then the heads, the held-out set and the
    losses."""
    heads = doc["heads"]
    names = [chr(ord("A") + i) for i in range(len(heads))] if len(heads) > 1 else [""]
    header = "position" + "".join(f"  {'top-1 ' + n if n else 'top-1':<8}" for n in names)
    header += "".join(f"  {n + '-A [95% CI]':<26}" for n in names[1:]) + "  positions"
    lines = [f"{doc['objective']} head {heads[0]['head']} on {doc['data_dir']}" if len(heads) == 1
             else f"{doc['objective']} heads on {doc['data_dir']}: "
                  + "; ".join(f"{n} = {h['head']}" for n, h in zip(names, heads)), header]
    for j in range(doc["eval_positions"]):
        line = f"{j + 1:>8}" + "".join(f"  {_fmt(h['acc'][j], '.4f'):>8}" for h in heads)
        line += "".join(f"  {_fmt(h['diff'][j][0], '+.4f')} [{_fmt(h['diff'][j][1], '+.4f')}, "
                        f"{_fmt(h['diff'][j][2], '+.4f')}]" for h in heads[1:])
        lines.append(line + f"  {heads[0]['positions'][j]:>9,}")
    s = doc["split"]
    losses = ", ".join(f"{n + ' ' if n else ''}{h['loss']:.4f}" for n, h in zip(names, heads))
    lines.append(f"held-out: {s['eval_conversations']} conversations (eval_fraction {s['eval_fraction']}, "
                 f"max_shards {s['max_shards']}, max_len {s['max_len']}); loss {losses} "
                 f"(objective {doc['objective']}, batch size {doc['batch_size']})")
    if len(heads) > 1:
        boot = doc["bootstrap"]
        lines.append(f"differences: paired bootstrap over the held-out conversations, {boot['resamples']:,} "
                     f"resamples, seed {boot['seed']}; positions are head A's")
    return "\n".join(lines)
