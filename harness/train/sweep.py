"""Training sweeps: ``draftbench train <objective> --sweep OPTION=v1,v2 ... --out DIR`` trains one head per combination
of objective-option values, one after the other, on the same data with the same budget (every training setting but
the swept options is shared), into ``DIR/<option>=<value>[,...]/``.

Each member is an ordinary training run (:func:`harness.train.loop.train`): resumable, with its own ``recipe.json``
whose ``command`` is the equivalent single ``draftbench train`` command. Re-running the sweep command skips finished
members and continues an interrupted one. ``DIR/sweep.json`` (:data:`harness.run.sweep.TRAIN_SWEEP_FILE`) lists the
members in order with their options, head folder, status, held-out accuracy and wall time; a run's
``--sweep jakiro.head=DIR`` expands it into one method entry per head, labelled by its value.

The Jakiro expert-count ablation (Jakiro, arXiv:2502.06282, Table 4) is
``draftbench train jakiro --sweep num_experts=2,3,4,5 ...`` (K = ``experts_per_tok`` = min(2, N) unless given); the
multi-step objectives compare the same way: ``draftbench train eagle --sweep hass_steps=1,3`` (plain EAGLE against
HASS, arXiv:2408.15766) or ``--option hass_steps=3 --sweep griffin_topk=0,3`` (GRIFFIN's mask, arXiv:2502.11018).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.engine.method import build_options
from harness.models import Target
from harness.run.sweep import TRAIN_SWEEP_FILE, parse_assignment, show_value
from harness.train.loop import TrainConfig, train
from harness.train.objectives import get_objective


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["num_experts=1,2", "contrast_weight=[0.5, 0]"]`` -> ``{"num_experts": [1, 2], "contrast_weight": [0.5, 0]}``;
    the same option twice is an error."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        _, option, values = parse_assignment(item, False, "--sweep")
        if option in grid:
            raise ValueError(f"--sweep {item!r}: option {option!r} is swept twice")
        grid[option] = values
    return grid


def member_name(assignment: dict[str, Any]) -> str:
    """The folder (and label) of one combination. Example: {"num_experts": 2} -> "num_experts=2"."""
    return ",".join(f"{k}={show_value(v)}" for k, v in assignment.items())


def members(objective_name: str, base_options: dict[str, Any], grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination (cartesian product, options in order, values as listed) with its resolved objective options;
    each single value and each combination is validated first, so a bad value fails before any training and the
    error names the option."""
    cls = get_objective(objective_name)
    for option, values in grid.items():
        for v in values:
            build_options(cls.Options, {**base_options, option: v}, f"train --sweep {option}={show_value(v)}")
    out = []
    for combo in itertools.product(*[[(o, v) for v in vs] for o, vs in grid.items()]):
        assignment = dict(combo)
        opts = build_options(cls.Options, {**base_options, **assignment},
                             f"train --sweep {member_name(assignment)}")
        name = member_name(assignment)
        out.append({"name": name, "folder": name, "head": f"{name}/head", "assignment": assignment,
                    "options": dataclasses.asdict(opts)})
    names = [m["name"] for m in out]
    if len(set(names)) != len(names):
        raise ValueError(f"train --sweep: two combinations share a folder name ({names}); make the values distinct")
    return out


def single_command(argv: Sequence[str], out: Path, extra: Sequence[str], drop: Sequence[str] = ("--sweep",),
                   drop_switches: Sequence[str] = ()) -> str:
    """The single ``draftbench train`` command for one head of a sweep or scaling run: ``argv`` (the arguments after
    ``train``) without ``--out`` and the ``drop`` flags (with their values) and ``drop_switches`` (flags without a
    value), then ``extra``, then ``--out out``.
    Example: ["eagle", "--sweep", "x=1,2", "--cpu"], "o", ["--option", "x=1"] -> "draftbench train eagle --cpu
    --option x=1 --out o"."""
    args, skip, valued = [], False, ("--out", *drop)
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in valued:
            skip = i + 1 < len(argv)
            continue
        if a in drop_switches or a.startswith(tuple(f"{f}=" for f in valued)):
            continue
        args.append(a)
    return shlex.join(["draftbench", "train", *args, *extra, "--out", str(out)])


def member_command(argv: Sequence[str], out: Path, assignment: dict[str, Any]) -> str:
    """The single ``draftbench train`` command that trains one member: ``argv`` (the sweep's arguments after
    ``train``) without its ``--sweep`` flags, ``--out`` set to the member's folder, one ``--option`` per swept value."""
    return single_command(argv, out, [x for k, v in assignment.items() for x in ("--option", f"{k}={json.dumps(v)}")])


def finished_training(folder: Path) -> dict[str, Any] | None:
    """The recipe of a training that ran to its last step in ``folder`` (its head written), else None."""
    recipe = folder / "recipe.json"
    if not recipe.is_file():
        return None
    data = json.loads(recipe.read_text())
    return data if data.get("steps") == data.get("total_steps") and (folder / "head").is_dir() else None


def _write_index(out: Path, objective_name: str, grid: dict[str, list[Any]], config: TrainConfig,
                 rows: list[dict[str, Any]]) -> None:
    index = {"objective": objective_name, "grid": grid,
             "shared": {k: v for k, v in dataclasses.asdict(config).items() if k != "options"},
             "base_options": config.options, "members": rows}
    (out / TRAIN_SWEEP_FILE).write_text(json.dumps(index, indent=1, default=str) + "\n")


def train_sweep(objective_name: str, target: Target, data_dir: str | Path, out_dir: str | Path, config: TrainConfig,
                grid: dict[str, list[Any]], argv: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Train every member of ``grid`` in turn (see the module docstring); returns the rows of ``sweep.json``."""
    out = Path(out_dir)
    rows = members(objective_name, config.options, grid)
    out.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row["status"] = "done" if finished_training(out / row["folder"]) else "pending"
    _write_index(out, objective_name, grid, config, rows)
    for row in rows:
        folder = out / row["folder"]
        recipe = finished_training(folder)
        if recipe is None:
            cfg = dataclasses.replace(config, options={**config.options, **row["assignment"]})
            recipe = train(objective_name, target, data_dir, folder, cfg,
                           command=member_command(argv, folder, row["assignment"]))
        row.update(status="done", final_eval=recipe.get("final_eval"), wall_time_s=recipe.get("wall_time_s"),
                   steps=recipe.get("steps"))
        _write_index(out, objective_name, grid, config, rows)
    return rows
