"""The data-scaling curve: ``draftbench train scale OBJECTIVE --data FEATS --tokens 30k,100k,300k,1M --out DIR``
trains the same recipe on nested prefixes of one feature dataset and evaluates every point on the same held-out set
(EAGLE-3, arXiv:2503.01840, Sec. 4 and Figure 1: acceptance against the amount of training data).

**Points.** The held-out set is the trainer's own eval split of the whole dataset (the last ``eval_fraction`` of
its conversations in build order, or of its first ``max_shards``; :class:`harness.train.dataset.FeatureDataset`),
the same for every point; the training pool is every conversation before it. (It moves when the dataset grows: a
curve extended with more data goes into a new folder, or keeps ``max_shards``; a folder refuses points on another
held-out set.) The point of size N tokens trains on the shortest prefix of the pool (whole conversations, in build
order) that holds at least N tokens, counting every stored position of a conversation cut at ``max_len`` (the
positions a training step reads, prompt included; the manifest's ``tokens`` counts the same way before the cut).
So the prefixes are nested, disjoint from the held-out set, and a larger point holds every conversation of a
smaller one. The draft vocabulary (``draft_vocab``/``train_vocab``) is counted on
the point's own prefix, never on data the point does not train on.

**Budget.** Every point gets the same training settings; the step budget follows from them: with ``--epochs E``
(or the objective's default epochs) every point makes E passes over its prefix, so its steps grow with its data
(the papers' recipe: a fixed number of epochs, whatever the data size), and with ``--max-steps S`` every point
makes S optimizer steps (the same compute, so a smaller point repeats its data more often). Use ``--warmup-ratio``
rather than ``--warmup-steps`` with epochs so that warm-up is the same share of every run. The index records which
rule was used.

**Evaluation.** Each point: the trainer's held-out top-1 accuracy per draft position at its last step
(:func:`harness.train.loop.evaluate`), and with ``--tau`` the mean accepted length τ and the acceptance per position
of the trained head through the harness runner on the first ``questions`` questions of a suite (default MT-bench,
whose prompts ``data build`` keeps out of every feature dataset) at temperature 0.

**Layout** (``DIR``)::

    <objective>/<size>/                an ordinary training run (head/, recipe.json, loss.png, checkpoints/)
    <objective>/<size>/tau.json        with --tau: τ and acceptance per position, and the run directory beside it
    scaling.json                       the index: per objective its data, held-out set, budget rule and points
    scaling.csv                        tidy rows, one per (objective, point, draft position)
    scaling.png                        held-out accuracy (and τ) against training tokens, log x

Re-running the command skips finished points and resumes an interrupted one from its last checkpoint (and an
interrupted τ run from its records); several objectives scaled into the same ``DIR`` share the table and the plot.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from harness.engine.method import build_options
from harness.models import Target
from harness.registry import method_names
from harness.train.dataset import FeatureDataset
from harness.train.features import file_sha256, read_manifest
from harness.train.loop import TrainConfig, train
from harness.train.objectives import get_objective, objective_names
from harness.train.sweep import finished_training, single_command

INDEX = "scaling.json"
TABLE = "scaling.csv"
PLOT = "scaling.png"
TAU_FILE = "tau.json"
TAU_RUNS = "tau-run"
SCALE_ONLY_FLAGS = ("--tokens", "--tau-questions", "--tau-max-new-tokens", "--tau-option", "--tau-suite",
                    "--tau-method")
SCALE_ONLY_SWITCHES = ("scale", "--tau")
COLUMNS = ("objective", "point", "tokens_requested", "train_tokens", "train_loss_tokens", "train_conversations",
           "eval_conversations", "eval_tokens", "steps", "epochs", "position", "acc", "eval_loss", "tau", "tau_acc",
           "tau_questions", "wall_time_s", "folder", "command")

_SUFFIX = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9}


def parse_tokens(text: str) -> list[int]:
    """``"30k,100k,1M"`` -> ``[30000, 100000, 1000000]`` (suffixes k, M, G, any case; sorted; duplicates and sizes
    below 1 are errors). Example: "1.5k,300" -> [300, 1500]."""
    sizes = []
    for item in (t.strip() for t in text.split(",")):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", item)
        value = round(float(m.group(1)) * _SUFFIX[m.group(2).lower()]) if m else 0
        if value < 1:
            raise ValueError(f"--tokens: {item!r} is not a token count (e.g. 30k, 1M)")
        sizes.append(value)
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"--tokens {text}: a size is given twice")
    return sorted(sizes)


def show_tokens(n: int) -> str:
    """A point's name: 30000 -> "30k", 1000000 -> "1M", 1500 -> "1.5k", 999 -> "999"."""
    for suffix, unit in (("G", 10 ** 9), ("M", 10 ** 6), ("k", 10 ** 3)):
        if n >= unit:
            return f"{n / unit:.4g}{suffix}"
    return str(n)


def prefix_lengths(conversation_tokens: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """For each size, the number of leading conversations whose tokens first reach it.

    Example: tokens [100, 200, 300], sizes [100, 250, 600] -> [1, 2, 3]. A size above the total, or two sizes that
    give the same prefix, raise ``ValueError`` (the second would train the same head twice).
    """
    cum = list(accumulate(conversation_tokens))                     # [C]
    total = cum[-1] if cum else 0
    out = []
    for n in sizes:
        if n > total:
            raise ValueError(f"--tokens {show_tokens(n)}: the training pool holds only {total} tokens "
                             f"({len(cum)} conversations before the held-out set); build more data or drop the size")
        k = bisect_left(cum, n) + 1
        if out and out[-1] == k:
            raise ValueError(f"--tokens: {show_tokens(sizes[len(out) - 1])} and {show_tokens(n)} give the same "
                             f"prefix ({k} conversations); choose sizes further apart")
        out.append(k)
    return out


def data_split(data_dir: str | Path, cfg: TrainConfig) -> dict[str, Any]:
    """The trainer's split of ``data_dir`` under ``cfg`` (eval_fraction, max_len, max_shards): tokens and loss tokens
    per training conversation, and the held-out set (count, tokens, and a sha256 of its conversations' positions,
    which identifies it)."""
    from safetensors import safe_open

    split = {s: FeatureDataset(data_dir, s, cfg.eval_fraction, "none", cfg.max_len, cfg.max_shards)
             for s in ("train", "eval")}
    masks: dict[str, Any] = {}
    tokens, loss_tokens = [], []
    for file, a, b in split["train"].index:
        if file not in masks:
            with safe_open(str(Path(data_dir) / file), framework="pt") as f:
                masks[file] = f.get_tensor("loss_mask")
        b = min(b, a + cfg.max_len)
        tokens.append(b - a)
        loss_tokens.append(int(masks[file][a:b].sum()))
    held_out = split["eval"].index
    return {"tokens": tokens, "loss_tokens": loss_tokens, "eval_conversations": len(held_out),
            "eval_tokens": sum(min(b - a, cfg.max_len) for _, a, b in held_out),
            "eval_sha256": split["eval"].index_sha256()}


@dataclass
class TauSpec:
    """What ``--tau`` measures per point: ``method`` (default: the objective's name) with ``head`` = the point's
    head and ``options``, on the first ``questions`` questions of ``suite``, ``max_new_tokens`` per turn."""

    questions: int = 8
    max_new_tokens: int = 64
    suite: str = "mt_bench"
    method: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.questions < 1 or self.max_new_tokens < 1:
            raise ValueError(f"--tau-questions and --tau-max-new-tokens must be >= 1, got {self.questions}, "
                             f"{self.max_new_tokens}")


def measure_tau(target: Target, head: Path, spec: TauSpec, method: str, folder: Path) -> dict[str, Any]:
    """τ and acceptance per draft position of ``method`` with ``head`` (:class:`TauSpec`), through the harness
    runner into ``folder/tau-run/``; an interrupted measurement resumes its run directory."""
    from harness.measure.records import read_records
    from harness.report.tables import summary_table, turns_table
    from harness.run.config import MethodSpec, RunConfig
    from harness.run.runner import run

    runs = folder / TAU_RUNS
    old = sorted(p for p in runs.glob("*") if (p / "manifest.json").is_file()) if runs.is_dir() else []
    if old:
        run_dir = run(resume=old[-1], target=target, progress=False)
    else:
        config = RunConfig(target=target.name, methods=[MethodSpec(method, options={**spec.options,
                                                                                     "head": str(head)})],
                           suites=[spec.suite], limit=spec.questions, max_new_tokens=spec.max_new_tokens,
                           warmup=0, score=False, baseline=method, output_dir=str(runs))
        run_dir = run(config, target=target, progress=False)
    summary = summary_table(turns_table(read_records(run_dir)))
    row = summary.iloc[0]
    acc = [float(row[c]) for c in summary.columns if c.startswith("acc@")]
    return {"tau": float(row["tau"]), "acc": acc, "questions": int(row["n_questions"]), "suite": spec.suite,
            "method": method, "max_new_tokens": spec.max_new_tokens, "run_dir": str(run_dir)}


def _budget(cfg: TrainConfig) -> str:
    return f"max_steps={cfg.max_steps} per point" if cfg.max_steps else f"epochs={cfg.epochs} per point"


def _point_rows(point: dict[str, Any]) -> list[dict[str, Any]]:
    """The tidy rows of one finished point: one per draft position."""
    ev = point.get("final_eval") or {"acc": [], "loss": math.nan}
    tau = point.get("tau") or {}
    rows = []
    for j, acc in enumerate(ev["acc"]):
        tau_acc = tau.get("acc", [])
        rows.append({**{k: point.get(k) for k in COLUMNS}, "position": j + 1, "acc": acc, "eval_loss": ev["loss"],
                     "tau": tau.get("tau"), "tau_acc": tau_acc[j] if j < len(tau_acc) else None,
                     "tau_questions": tau.get("questions")})
    return rows


def write_outputs(out: Path, objective_name: str, info: dict[str, Any]) -> list[dict[str, Any]]:
    """Merge this objective's entry into ``out/scaling.json`` (other objectives kept) and rewrite the tidy table and
    the plot from every objective's finished points; returns the tidy rows."""
    import pandas as pd

    from harness.report.plots import plot_scaling

    path = out / INDEX
    index = json.loads(path.read_text()) if path.is_file() else {"objectives": {}}
    index["objectives"][objective_name] = info
    path.write_text(json.dumps(index, indent=1, default=str) + "\n")
    rows = [r for entry in index["objectives"].values() for p in entry["points"] if p["status"] == "done"
            for r in _point_rows(p)]
    with open(out / TABLE, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    if rows:
        plot_scaling(pd.DataFrame(rows, columns=COLUMNS), out / PLOT)
    return rows


def plan(objective_name: str, data_dir: str | Path, out_dir: str | Path, config: TrainConfig, sizes: Sequence[int],
         argv: Sequence[str] = (), tau: TauSpec | None = None) -> dict[str, Any]:
    """The index entry of a scaling run (data, held-out set, budget rule, one pending point per size), without the
    target: bad input (unknown objective or option, a size the data cannot fill, two sizes with the same prefix,
    with ``tau`` a method that cannot run the head or a suite whose questions do not load) fails here, before
    anything is loaded or trained."""
    if objective_name not in objective_names():
        raise ValueError(f"train scale: unknown objective {objective_name!r}; known: {', '.join(objective_names())}")
    cls = get_objective(objective_name)
    build_options(cls.Options, config.options, f"train scale {objective_name}")
    if tau is not None:
        if (tau.method or objective_name) not in method_names():
            raise ValueError(f"train scale --tau: no method {tau.method or objective_name!r} runs the head; name one "
                             f"with --tau-method (known: {', '.join(method_names())})")
        from harness.run.suites import load_suite

        load_suite(tau.suite)  # its questions load now (data dir set, file present), not after the training
    cfg = config.resolved(cls.defaults)
    data_dir, out = Path(data_dir), Path(out_dir)
    manifest = read_manifest(data_dir, cfg.max_shards)
    split = data_split(data_dir, cfg)
    sizes = sorted(sizes)
    cum, cum_loss = list(accumulate(split["tokens"])), list(accumulate(split["loss_tokens"]))
    points = []
    for n, k in zip(sizes, prefix_lengths(split["tokens"], sizes)):
        folder = Path(objective_name) / show_tokens(n)
        points.append({"objective": objective_name, "point": show_tokens(n), "tokens_requested": n,
                       "train_tokens": cum[k - 1], "train_loss_tokens": cum_loss[k - 1], "train_conversations": k,
                       "eval_conversations": split["eval_conversations"], "eval_tokens": split["eval_tokens"],
                       "folder": str(folder),
                       "command": single_command(argv, out / folder, ["--train-conversations", str(k)],
                                                 SCALE_ONLY_FLAGS, SCALE_ONLY_SWITCHES),
                       "status": "pending"})
    return {"data_dir": str(data_dir), "data_manifest_sha256": file_sha256(data_dir / "manifest.json"),
            "data_conversations": manifest["count"], "pool_conversations": len(cum), "pool_tokens": cum[-1],
            "eval_set": {"conversations": split["eval_conversations"], "tokens": split["eval_tokens"],
                         "sha256": split["eval_sha256"], "rule": f"last {cfg.eval_fraction} of the conversations"},
            "budget": _budget(cfg), "prefix": "shortest prefix of whole conversations holding the tokens",
            "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("options", "train_conversations")},
            "options": config.options, "tau": dataclasses.asdict(tau) if tau else None,
            "command": single_command(argv, out, [], ()), "points": points}


def train_scale(objective_name: str, target: Target, data_dir: str | Path, out_dir: str | Path, config: TrainConfig,
                sizes: Sequence[int], argv: Sequence[str] = (), tau: TauSpec | None = None) -> list[dict[str, Any]]:
    """Train and evaluate every point of ``sizes`` (tokens) in turn (see the module docstring and :func:`plan`);
    returns the tidy rows of ``out_dir/scaling.csv``."""
    info = plan(objective_name, data_dir, out_dir, config, sizes, argv, tau)
    out = Path(out_dir)
    old = json.loads((out / INDEX).read_text())["objectives"].get(objective_name) if (out / INDEX).is_file() else None
    if old and old["eval_set"]["sha256"] != info["eval_set"]["sha256"]:
        raise ValueError(f"{out}: its {objective_name} points were evaluated on another held-out set (other data or "
                         "--max-shards); points on different held-out sets are not comparable: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    for p in info["points"]:
        _refresh(out, p, tau)
    rows = write_outputs(out, objective_name, info)
    for p in info["points"]:
        folder = out / p["folder"]
        if finished_training(folder) is None:
            train(objective_name, target, data_dir, folder,
                  dataclasses.replace(config, train_conversations=p["train_conversations"]), command=p["command"])
        if tau and not (folder / TAU_FILE).is_file():
            result = measure_tau(target, folder / "head", tau, tau.method or objective_name, folder)
            (folder / TAU_FILE).write_text(json.dumps(result, indent=1) + "\n")
        _refresh(out, p, tau)
        rows = write_outputs(out, objective_name, info)
    return rows


def _refresh(out: Path, point: dict[str, Any], tau: TauSpec | None) -> None:
    """Fill ``point`` from its folder: status, steps, epochs, held-out evaluation, wall time and τ."""
    folder = out / point["folder"]
    recipe = finished_training(folder)
    done = recipe is not None and (tau is None or (folder / TAU_FILE).is_file())
    point["status"] = "done" if done else "pending"
    if recipe is not None:
        point.update(steps=recipe["steps"], epochs=round(recipe["steps"] / recipe["steps_per_epoch"], 3),
                     final_eval=recipe["final_eval"], wall_time_s=recipe["wall_time_s"])
    if (folder / TAU_FILE).is_file():
        point["tau"] = json.loads((folder / TAU_FILE).read_text())
