"""The training loop: one head, one objective (:mod:`harness.train.objectives`), a feature dataset
(:mod:`harness.train.dataset`).

The loop (:func:`train`) runs on ``accelerate``: one process, ``accelerate launch --num_processes N`` (DDP) or
DeepSpeed through an accelerate config. AdamW, gradient value clipping, linear warm-up then cosine decay, epochs or
``max_steps``, gradient accumulation, periodic held-out evaluation, resumable checkpoints
(``accelerator.save_state`` for the weights, optimizer and RNG states, which accelerate reads with
``weights_only=True``, plus ``train_state.json`` for the step counters and the learning-rate schedule, so that a
resume unpickles nothing that could run code: a resumed run continues the schedule and the data order), a JSONL log,
a loss-curve PNG, and at the end the head in its published format plus ``recipe.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.engine.draftvocab import save_counts
from harness.models import Target
from harness.train.dataset import FeatureDataset, collate
from harness.train.features import dataset_token_counts, read_manifest
from harness.train.objectives import Objective, get_objective

CHECKPOINTS = "checkpoints"
LOG_FILE = "train_log.jsonl"


# ---------------------------------------------------------------------------------------------------------------
# Configuration, schedule, state
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """Training settings; ``None`` fields take the objective's published default (``Objective.defaults``)."""

    lr: float | None = None
    weight_decay: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip_value: float | None = 0.5
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    min_lr_ratio: float = 0.0
    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int = 4
    grad_accum: int = 1
    noise: str | float | None = None
    max_len: int = 2048
    eval_fraction: float = 0.05
    max_shards: int | None = None     # train on the first N shards only (a build may still be running)
    train_conversations: int | None = None  # train on the first N training conversations only (same held-out
    #                                   split, draft vocabulary counted on them: harness.train.scaling)
    eval_every: int = 500
    eval_positions: int = 4
    save_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    mixed_precision: str = "auto"     # "auto": bf16 on a CUDA device that supports it, else fp32 ("no")
    cpu: bool = False
    num_workers: int = 0
    resume: bool = True
    progress: bool = True
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError(f"batch_size and grad_accum must be >= 1, got {self.batch_size}, {self.grad_accum}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be auto, no, bf16 or fp16, got {self.mixed_precision!r}")
        for name in ("eval_every", "save_every", "log_every", "eval_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def resolved(self, defaults: dict[str, Any]) -> TrainConfig:
        """A copy with the objective's defaults filled in (warm-up ratio only when no step count is given)."""
        values = dataclasses.asdict(self)
        for key, value in defaults.items():
            if values.get(key) is None:
                values[key] = value
        if self.warmup_steps is not None or self.warmup_ratio is not None:
            values["warmup_steps"], values["warmup_ratio"] = self.warmup_steps, self.warmup_ratio
        values["betas"] = tuple(values["betas"])
        return TrainConfig(**values)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup`` steps, then cosine from 1 to ``min_ratio``.

    Example: warmup=10, total=110: step 0 -> 0.1 (the first update already moves), 9 -> 1.0, 60 -> 0.5, 110 -> 0.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class TrainState:
    """Counters saved with every checkpoint, as JSON (:func:`save_train_state`)."""

    def __init__(self):
        self.step = 0           # optimizer steps done
        self.batches_seen = 0   # micro-batches consumed (data position)
        self.accum_step = 0     # accelerate's micro-step counter (keeps accumulation aligned on resume)
        self.wall_s = 0.0

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("step", "batches_seen", "accum_step", "wall_s"):
            setattr(self, key, state[key])


TRAIN_STATE_FILE = "train_state.json"


def save_train_state(folder: Path, state: TrainState, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Write the counters and the schedule's state as JSON beside accelerate's files. (accelerate would pickle objects
    registered with ``register_for_checkpointing`` and read them back with ``weights_only=False``, i.e. run whatever
    a checkpoint folder holds; LambdaLR's state is plain numbers, its lambda is rebuilt by the resumed run.)"""
    doc = {"state": state.state_dict(), "scheduler": scheduler.state_dict()}
    (folder / TRAIN_STATE_FILE).write_text(json.dumps(doc, indent=1) + "\n")


def load_train_state(folder: Path, state: TrainState, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Read :func:`save_train_state`'s file; a checkpoint without it (made before it existed, with pickled
    counters) is refused in one line rather than unpickled."""
    path = folder / TRAIN_STATE_FILE
    if not path.is_file():
        raise ValueError(f"{folder}: no {TRAIN_STATE_FILE}; this checkpoint keeps its counters in a pickle, which "
                         "draftbench no longer loads (it could run code); start the training in a new directory")
    try:
        doc = json.loads(path.read_text())
        state.load_state_dict(doc["state"])
        scheduler.load_state_dict(doc["scheduler"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a training state ({type(e).__name__}: {e})") from None


def latest_checkpoint(out_dir: Path) -> Path | None:
    ckpts = sorted((out_dir / CHECKPOINTS).glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    done = [c for c in ckpts if (c / "done").exists()]
    return done[-1] if done else None


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------------


def held_out_split(data_dir: Path, cfg: TrainConfig, lm_head: nn.Module | None = None) -> FeatureDataset:
    """The conversations the trainer evaluates on: the last ``cfg.eval_fraction`` of ``data_dir``'s (first
    ``cfg.max_shards`` shards') conversations in build order, cut at ``cfg.max_len``, without input noise; with the
    target's ``lm_head``, its items carry the target's greedy tokens, computed once for every evaluation
    (:meth:`FeatureDataset.attach_greedy`)."""
    split = FeatureDataset(data_dir, "eval", cfg.eval_fraction, "none", cfg.max_len, cfg.max_shards)
    if lm_head is not None:
        split.attach_greedy(lm_head)
    return split


def evaluate(objective: Objective, head: nn.Module, dataset, cfg: TrainConfig, accelerator,
             per_conversation: bool = False) -> dict[str, Any]:
    """Mean loss and top-1 accuracy per draft position on this process's share of ``dataset``, summed over
    processes (each evaluates items rank, rank + world, ...; no duplicates).

    ``per_conversation`` (one process only): the hits and positions are counted one conversation at a time (the
    batch's rows, padded as in the batch) and also returned per conversation in dataset order,
    ``conversation_hits`` / ``conversation_positions`` ``[n_conversations][eval_positions]``; the totals are their
    sums. The loss is the batched one either way."""
    if per_conversation and accelerator.num_processes > 1:
        raise ValueError("per-conversation counts are collected on one process only")
    idx = list(range(accelerator.process_index, len(dataset), accelerator.num_processes))
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, idx), batch_size=cfg.batch_size,
                                         collate_fn=collate)
    k = cfg.eval_positions
    sums = torch.zeros(2 + 2 * k, device=accelerator.device)  # [loss_sum, n_batches, correct[k], total[k]]
    rows: list[torch.Tensor] = []                              # per conversation: [correct[k], total[k]]
    was_training = head.training
    head.eval()
    with torch.no_grad():
        for batch in loader:
            batch = {key: v.to(accelerator.device) for key, v in batch.items()}
            loss, _ = objective.loss(head, batch)
            if per_conversation:
                counts = [torch.cat(objective.accuracy(head, {key: v[i:i + 1] for key, v in batch.items()}, k))
                          for i in range(batch["input_ids"].shape[0])]
                rows += [c.cpu() for c in counts]
                counts = torch.stack(counts).sum(dim=0)
            else:
                counts = torch.cat(objective.accuracy(head, batch, k))
            sums += torch.cat([torch.tensor([loss.item(), 1.0], device=counts.device), counts]).to(sums.device)
    head.train(was_training)
    sums = accelerator.reduce(sums, reduction="sum")
    correct, total = sums[2:2 + k], sums[2 + k:]
    acc = [round(float(c / t), 6) if t > 0 else None for c, t in zip(correct, total)]
    out = {"loss": float(sums[0] / max(sums[1], 1)), "acc": acc, "positions": [int(t) for t in total]}
    if per_conversation:
        out["conversation_hits"] = [[int(c) for c in r[:k]] for r in rows]
        out["conversation_positions"] = [[int(t) for t in r[k:]] for r in rows]
    return out


def check_data(objective: Objective, target: Target, manifest: dict[str, Any], data_dir: Path) -> None:
    """Refuse, in one line, a feature dataset the objective cannot read or that another target's hidden size made."""
    objective.check_data(manifest, str(data_dir))
    hidden = target.model.get_output_embeddings().weight.shape[1]
    if manifest["hidden_size"] != hidden:
        raise ValueError(f"{data_dir}: features have hidden size {manifest['hidden_size']}, the target {target.name!r} "
                         f"has {hidden}; build the data with this target")


def _mixed_precision(choice: str, cpu: bool) -> str:
    if choice != "auto":
        return choice
    if not cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def _append_log(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def plot_log(log_path: Path, png_path: Path) -> None:
    """Training loss per step and held-out loss and accuracy per evaluation, from the JSONL log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()] if log_path.exists() else []
    tr = [r for r in rows if r["kind"] == "train"]
    ev = [r for r in rows if r["kind"] == "eval"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([r["step"] for r in tr], [r["loss"] for r in tr], label="train")
    a.plot([r["step"] for r in ev], [r["loss"] for r in ev], "o-", label="held-out")
    a.set_xlabel("step")
    a.set_ylabel("loss")
    a.legend()
    for j in range(len(ev[0]["acc"]) if ev else 0):
        b.plot([r["step"] for r in ev], [r["acc"][j] for r in ev], "o-", label=f"position {j + 1}")
    b.set_xlabel("step")
    b.set_ylabel("top-1 draft accuracy (held-out)")
    if ev:
        b.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def _check_run(out_dir: Path, identity: dict[str, Any], resume: bool) -> None:
    """Refuse to mix two different trainings in one ``out_dir`` (or to restart over one without ``resume``)."""
    path = out_dir / "run.json"
    if path.exists():
        old = json.loads(path.read_text())
        if not resume:
            raise ValueError(f"{out_dir} already holds a training run; resume it or choose another output directory")
        diff = sorted(k for k in identity if old.get(k) != identity[k])
        if diff:
            raise ValueError(f"{out_dir} holds a run with different settings ({', '.join(diff)}); "
                             "use another output directory")


def train(objective_name: str, target: Target, data_dir: str | Path, out_dir: str | Path,
          config: TrainConfig | None = None, command: str | None = None) -> dict[str, Any]:
    """Train a head with objective ``objective_name`` on the features in ``data_dir``; write everything to
    ``out_dir`` (``head/`` in the published format, ``recipe.json``, ``train_log.jsonl``, ``loss.png``,
    ``checkpoints/``). Continues the latest checkpoint when ``config.resume``. Returns the recipe dict."""
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
    from tqdm import tqdm

    t_start = time.perf_counter()
    cls = get_objective(objective_name)
    objective = cls.create(target, (config or TrainConfig()).options)
    cfg = (config or TrainConfig()).resolved(cls.defaults)
    out_dir, data_dir = Path(out_dir), Path(data_dir)
    manifest = read_manifest(data_dir, cfg.max_shards)
    check_data(objective, target, manifest, data_dir)
    accelerator = Accelerator(cpu=cfg.cpu, mixed_precision=_mixed_precision(cfg.mixed_precision, cfg.cpu),
                              gradient_accumulation_steps=cfg.grad_accum, project_dir=str(out_dir),
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(cfg.seed)
    train_ds = FeatureDataset(data_dir, "train", cfg.eval_fraction, cfg.noise, cfg.max_len, cfg.max_shards,
                              cfg.train_conversations)
    if objective.greedy_in_loss and cfg.num_workers == 0:
        train_ds.attach_greedy(objective.lm_head)
    eval_ds = held_out_split(data_dir, cfg, objective.lm_head)
    if len(train_ds) == 0:
        raise ValueError(f"{data_dir}: no training conversations after holding out {len(eval_ds)} for evaluation")
    vocab = objective.lm_head.weight.shape[0]
    counts = (dataset_token_counts(data_dir, vocab, cfg.max_shards) if cfg.train_conversations is None
              else train_ds.token_counts(vocab))
    objective.set_token_counts(counts)

    head = objective.build_head()
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=cfg.batch_size, shuffle=True, collate_fn=collate,
                                         num_workers=cfg.num_workers)
    head, optimizer, loader = accelerator.prepare(head, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / cfg.grad_accum)
    total = cfg.max_steps or cfg.epochs * steps_per_epoch
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round((cfg.warmup_ratio or 0.0) * total)
    if warmup >= total:
        warnings.warn(f"warm-up ({warmup} steps) is not shorter than the run ({total} steps): the learning rate never "
                      "reaches its peak; pass warmup_steps/--warmup-steps for short runs", stacklevel=2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer,
                                                  lambda s: lr_factor(s, warmup, total, cfg.min_lr_ratio))
    state = TrainState()

    manifest_sha = _sha256_file(data_dir / "manifest.json")
    identity = {"objective": objective_name, "options": dataclasses.asdict(objective.options),
                "data_manifest_sha256": manifest_sha, "total_steps": total, "batch_size": cfg.batch_size,
                "grad_accum": cfg.grad_accum, "num_processes": accelerator.num_processes, "lr": cfg.lr,
                "train_conversations": cfg.train_conversations}
    if accelerator.is_main_process:
        _check_run(out_dir, identity, cfg.resume)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "run.json").write_text(json.dumps(identity, indent=1) + "\n")
    accelerator.wait_for_everyone()
    ckpt = latest_checkpoint(out_dir) if cfg.resume else None
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        load_train_state(ckpt, state, scheduler)
        accelerator.step = state.accum_step
    log_path = out_dir / LOG_FILE

    def save_checkpoint() -> None:
        folder = out_dir / CHECKPOINTS / f"step-{state.step:07d}"
        state.accum_step = accelerator.step
        state.wall_s += time.perf_counter() - t_mark[0]
        t_mark[0] = time.perf_counter()
        accelerator.save_state(str(folder))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            save_train_state(folder, state, scheduler)
            (folder / "done").write_text(str(state.step))
            old = sorted((out_dir / CHECKPOINTS).glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
            for stale in old[: -cfg.keep_checkpoints]:
                shutil.rmtree(stale, ignore_errors=True)

    t_mark = [time.perf_counter()]
    bar = tqdm(total=total, initial=state.step, desc=f"train {objective_name}", unit="step",
               disable=not (cfg.progress and accelerator.is_main_process))
    running, n_running = 0.0, 0
    last_eval: dict[str, Any] | None = None
    head.train()
    while state.step < total:
        epoch, skip = divmod(state.batches_seen, len(loader))
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        for batch in batches:
            with accelerator.accumulate(head):
                with accelerator.autocast():
                    loss, parts = objective.loss(head, batch)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.grad_clip_value:
                    accelerator.clip_grad_value_(params, cfg.grad_clip_value)
                optimizer.step()
                optimizer.zero_grad()
            state.batches_seen += 1
            running, n_running = running + loss.item(), n_running + 1
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            state.step += 1
            bar.update(1)
            if state.step % cfg.log_every == 0 or state.step == total:
                mean = accelerator.reduce(torch.tensor([running / n_running], device=accelerator.device), "mean").item()
                running, n_running = 0.0, 0
                if accelerator.is_main_process:
                    _append_log(log_path, {"kind": "train", "step": state.step, "epoch": epoch, "loss": mean,
                                           "lr": scheduler.get_last_lr()[0], **parts,
                                           "elapsed_s": round(time.perf_counter() - t_start, 3)})
                bar.set_postfix(loss=f"{mean:.4f}")
            if (state.step % cfg.eval_every == 0 or state.step == total) and len(eval_ds):
                last_eval = evaluate(objective, accelerator.unwrap_model(head), eval_ds, cfg, accelerator)
                if accelerator.is_main_process:
                    _append_log(log_path, {"kind": "eval", "step": state.step, **last_eval})
            if state.step % cfg.save_every == 0 or state.step == total:
                save_checkpoint()
            if state.step >= total:
                break
    bar.close()
    if last_eval is None and len(eval_ds):
        last_eval = evaluate(objective, accelerator.unwrap_model(head), eval_ds, cfg, accelerator)
    state.wall_s += time.perf_counter() - t_mark[0]
    recipe = {
        "objective": objective_name, "options": dataclasses.asdict(objective.options), "target": target.name,
        "data_dir": str(data_dir), "data_manifest_sha256": manifest_sha, "data_conversations": manifest["count"],
        "train_conversations": len(train_ds), "eval_conversations": len(eval_ds), "steps": state.step,
        "total_steps": total, "warmup_steps": warmup, "steps_per_epoch": steps_per_epoch,
        "config": {**dataclasses.asdict(cfg), "betas": list(cfg.betas)}, "final_eval": last_eval,
        "wall_time_s": round(state.wall_s, 3), "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision, "distributed_type": str(accelerator.distributed_type),
        "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    if accelerator.is_main_process:
        objective.save(accelerator.unwrap_model(head), out_dir / "head")
        save_counts(counts, out_dir / "head")
        (out_dir / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
        plot_log(log_path, out_dir / "loss.png")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return recipe
