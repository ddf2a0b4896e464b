"""Run summaries that `draftbench compare` reads: a run directory, or a small committed baseline made from one.

``draftbench baseline save RUN`` writes ``results/baselines/<device slug>/<preset>/baseline.json`` (plus the run's
``summary.md`` for people): the run's provenance and, per (label, suite, temperature) cell, question and turn, the
figures the gate needs, never the generated texts:

=============== ==================================================================================================
cells           label, method, lossless flag, suite, temperature, n_questions, n_errors, tau, tokens_per_s, speedup
                (ratio of means), lossless_share, quality, peak_memory_bytes, energy_per_token_j (as in the report)
questions       per question of a cell: accepted tokens (Σ accept_lengths) and steps (so τ pools exactly over any
                subset), new tokens, wall time, tokens/s, speed-up (its tokens/s ÷ the baseline label's on the same
                question in the same run), score, n_errors; accepted drafts, drafted tokens and drafting steps
                (:func:`harness.report.tables.draft_totals`, so the draft acceptance rate pools over any subset);
                ``accepted_at`` / ``drafted_at``: the per-position acceptance counts
                (:func:`harness.measure.acceptance.acceptance_counts`; absent in baselines saved before them, then
                per-position acceptance is not gated against it)
turns           per (question, turn, seed, repeat): new_tokens, stop_reason and ``sha256`` of the output token ids
                (:func:`ids_sha256`)
repeats         only for a run of 2 or more repeats (``repeats:`` / ``--repeats``): per cell and repeat, the cell's
                figures measured in that repeat alone (:func:`repeat_table`): τ, acc@i, draft acceptance rate,
                speed-up, tokens/s. Their spread is the run-to-run noise that ``compare`` fits its tolerances on
                (:func:`harness.measure.noise.prediction_band`); a baseline without it keeps the fixed defaults
provenance      run id, creation time, command, git hash and dirty flag, library versions, device (and its slug),
                target (without its local path), full run configuration and its digest, suites; ``validity``: the
                run's failed checks (:func:`harness.measure.validity.run_checks`; absent in older baselines)
=============== ==================================================================================================

:class:`Side` is the in-memory form of either source: a run directory is reduced by the report's own table
builders (:mod:`harness.report.tables`, so every number comes from :mod:`harness.measure.metrics`), a baseline
is read back as the same three tables plus provenance, an export (:mod:`harness.report.exports`) is read back
into records and reduced like a run. Only a run directory keeps ``output_ids`` and ``output_text`` (used to show
where an output changed).

The device slug names the folder of a device's baselines: ``cpu`` for any CPU (the CPU gate compares outputs and
τ, which pinned CPU kernels make the same on every x86 machine, never speed), the lower-cased GPU name with runs
of other characters turned into ``-`` for a GPU (``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure.records import RecordsRead, baseline_labels, load_records, record_files
from harness.measure.rundir import MANIFEST_FILE, SUMMARY_MD, read_manifest, read_run_file, run_subdir
from harness.measure.validity import failed, run_checks
from harness.report import tables as T
from harness.report.exports import ids_sha256, read_export, write_export

BASELINE_FILE = "baseline.json"
BASELINE_FORMAT = "draftbench-baseline"
BASELINE_VERSION = 1
BASELINES_ROOT = Path("results") / "baselines"
CELL = ["label", "suite", "temperature"]
TURN = ["question_id", "turn", "seed", "repeat"]
CELL_COLUMNS = ["label", "method", "lossless", "suite", "temperature", "n_questions", "n_errors", "tau",
                "tokens_per_s", "speedup", "lossless_share", "quality", "peak_memory_bytes", "energy_per_token_j"]
QUESTION_COLUMNS = [*CELL, "question_id", "accepted_tokens", "steps", "new_tokens", "wall_time_s", "tokens_per_s",
                    "speedup", "score", "n_errors"]
# written since the draft acceptance rate; a baseline saved before has none (compare shows n/a)
DRAFT_COLUMNS = ["accepted_drafts_total", "drafted_tokens", "draft_steps"]
TURN_COLUMNS = [*CELL, *TURN, "new_tokens", "stop_reason", "sha256"]
POSITION_COLUMNS = ["accepted_at", "drafted_at"]  # per question; optional when a baseline is read
SPREAD_FIGURES = ["tau", "draft_acceptance_rate", "speedup", "tokens_per_s"]
REPEAT_COLUMNS = [*CELL, "repeat", *SPREAD_FIGURES, "acc_at"]  # acc_at: acc@1, acc@2, ... of that repeat


def repeat_table(turns: pd.DataFrame, label: str) -> pd.DataFrame:
    """Per (label, suite, temperature) cell and repeat, the cell's figures measured in that repeat alone, with the
    report's own summary (:func:`harness.report.tables.summary_table` on the repeat's turns; speed-ups against
    ``label`` in the same repeat): :data:`SPREAD_FIGURES` and ``acc_at`` (acc@1..depth, [] when the label never
    drafts). Each repeat measures every question once, so the rows of a cell are replicates of the same commit.
    Example: a run of 5 repeats of vanilla and eagle2 on one suite at T = 0 -> 10 rows."""
    if turns.empty or "repeat" not in turns:
        return pd.DataFrame(columns=REPEAT_COLUMNS)
    rows = []
    for repeat, part in turns.groupby("repeat", sort=True):
        summary = T.summary_table(part, baseline_label=label, n_boot=1, seed=0)
        acc_cols = sorted((c for c in summary.columns if re.fullmatch(r"acc@\d+", c)), key=lambda c: int(c[4:]))
        for r in summary.to_dict("records"):
            acc = [float(r[c]) for c in acc_cols if not pd.isna(r[c])]
            rows.append({**{c: r[c] for c in CELL}, "repeat": int(repeat),
                         **{f: _float(r.get(f)) for f in SPREAD_FIGURES}, "acc_at": acc})
    return pd.DataFrame(rows, columns=REPEAT_COLUMNS)


def slugify(text: str) -> str:
    """Lower case, every run of characters other than a-z and 0-9 replaced by one ``-``, none at the ends.
    Example: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def device_slug(device: Mapping[str, Any] | None) -> str:
    """The baseline folder name of a manifest's ``device`` entry (:func:`harness.measure.env.device_info`):
    ``cpu`` on a CPU, the slug of the GPU name on a GPU. Example: {"device_type": "cuda", "device_name":
    "NVIDIA A100-SXM4-80GB"} -> "nvidia-a100-sxm4-80gb"."""
    device = device or {}
    kind = str(device.get("device_type") or str(device.get("device", "")).split(":")[0] or "unknown")
    if kind == "cuda":
        name = device.get("device_name")
        if not name:
            raise ValueError("device entry of type cuda has no device_name; cannot name its baseline folder")
        return slugify(name)
    return slugify(kind)


def _float(v: Any) -> float:
    return math.nan if v is None else float(v)


def _clean(v: Any) -> Any:
    """A JSON-safe scalar: NaN -> None, numpy scalars -> Python ones."""
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _records_of(df: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    return [{c: _clean(row[c]) for c in columns} for row in df[columns].to_dict("records")]


@dataclass
class Side:
    """One side of a comparison: a run directory or a committed baseline, as three tables and provenance.

    ``cells`` has :data:`CELL_COLUMNS`, ``questions`` :data:`QUESTION_COLUMNS`, :data:`DRAFT_COLUMNS` and
    :data:`POSITION_COLUMNS` (measured questions only: a question with an error turn has NaN figures and its
    ``n_errors``; the draft and position counts are n/a in a baseline saved before they existed), ``turns``
    :data:`TURN_COLUMNS` (measured turns; a run directory adds ``output_ids`` and ``output_text``). ``kind`` is
    "run", "baseline" or "export" (:mod:`harness.report.exports`)."""

    path: Path
    kind: str
    provenance: dict[str, Any]
    baseline_label: str
    cells: pd.DataFrame
    questions: pd.DataFrame
    turns: pd.DataFrame
    repeats: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=REPEAT_COLUMNS))

    def spread(self, key: tuple) -> pd.DataFrame:
        """The :data:`REPEAT_COLUMNS` rows of one (label, suite, temperature) cell, one per repeat."""
        label, suite, temp = key
        r = self.repeats
        return r[(r["label"] == label) & (r["suite"] == suite) & (r["temperature"].astype(float) == float(temp))]

    @property
    def n_repeats(self) -> int:
        """The most repeats any cell has in :attr:`repeats` (0 for a baseline saved without them)."""
        return int(self.repeats.groupby(CELL)["repeat"].nunique().max()) if not self.repeats.empty else 0

    @property
    def has_outputs(self) -> bool:
        """True when the turns carry their token ids and texts (a run directory), not only hashes."""
        return "output_ids" in self.turns.columns

    @property
    def device_slug(self) -> str | None:
        return self.provenance.get("device_slug")

    def describe(self) -> str:
        """One line: what this side is. Example: "baseline of run 2026...-e715da1e, git d4aa865, cpu, float32"."""
        p = self.provenance
        what = f"{self.kind} of run {p.get('run_id')}" if self.kind != "run" else f"run {p.get('run_id')}"
        git = (p.get("git_hash") or "?")[:7] + (" (dirty)" if p.get("git_dirty") else "")
        versions = p.get("versions") or {}
        return (f"{what}, git {git}, device {p.get('device_slug')}, dtype {(p.get('target') or {}).get('dtype', '?')}, "
                f"torch {versions.get('torch', '?')}")

    # ---- from a run directory ---------------------------------------------------------------------------------
    @classmethod
    def from_run(cls, run_dir: str | Path, n_boot: int = 2000, seed: int = 0) -> Side:
        """Reduce a run directory with the report's table builders (the same numbers as its ``tables/``)."""
        run_dir = Path(run_dir)
        manifest = read_manifest(run_dir)
        if not manifest:
            raise FileNotFoundError(f"{run_dir}: no {MANIFEST_FILE}; not a draftbench run directory")
        records = load_records(run_dir).complete_records  # a partial question never enters a mean
        if not records:
            raise ValueError(f"{run_dir}: no complete question in its records*.jsonl")
        config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
        return cls.from_records(run_dir, "run", records, manifest, run_provenance(manifest),
                                config.get("baseline") or "vanilla", n_boot, seed)

    @classmethod
    def from_export(cls, path: str | Path, baseline_label: str = "vanilla", n_boot: int = 2000,
                    seed: int = 0) -> Side:
        """Reduce an export file (:func:`harness.report.exports.read_export`, either format) like a run: its
        ``request`` parts are the records; outputs are compared by their ``output_sha256``."""
        records, provenance = read_export(path)
        return cls.from_records(Path(path), "export", records, {}, provenance, baseline_label, n_boot, seed)

    @classmethod
    def from_records(cls, path: Path, kind: str, records: list[dict[str, Any]], manifest: Mapping[str, Any],
                     provenance: dict[str, Any], label: str, n_boot: int = 2000, seed: int = 0) -> Side:
        """Reduce complete records with the report's table builders; ``kind`` "run" keeps output ids and texts. A
        side whose every turn failed has nothing to compare: a ValueError naming it and the first error."""
        if not any(r.get("status") == "ok" for r in records):
            first = next((str(r.get("error")) for r in records if r.get("error")), "unknown error")
            raise ValueError(f"{path}: every turn of its {len(records)} record(s) failed (first: {first}); it measured "
                             "nothing to compare")
        # the run's failed validity checks travel with its provenance (into a saved baseline too)
        provenance = {**provenance, "validity": [c.as_dict() for c in failed(run_checks(records, manifest))]}
        turns = T.turns_table(records, manifest)
        turns["question_id"] = turns["question_id"].astype(str)
        qt = T.questions_table(turns)
        summary = T.summary_table(turns, baseline_label=label, n_boot=n_boot, seed=seed)

        # per question: accepted tokens and steps over its measured turns, speed-up vs the baseline label
        measured_q = qt[qt["n_errors"] == 0][[*CELL, "question_id"]]
        ok = turns[turns["status"] == "ok"].merge(measured_q, on=[*CELL, "question_id"])
        totals = (pd.concat([ok, T.draft_totals(ok)[DRAFT_COLUMNS]], axis=1)
                  .assign(accepted_tokens=ok["accept_lengths"].map(lambda a: int(sum(a))),
                          steps=ok["accept_lengths"].map(len))
                  .groupby([*CELL, "question_id"], sort=False)[["accepted_tokens", "steps", *DRAFT_COLUMNS]]
                  .sum(min_count=1).reset_index())
        positions = [{**dict(zip([*CELL, "question_id"], key)), **dict(zip(POSITION_COLUMNS, ACC.acceptance_counts(
            T.lists(g["accepted_drafts"]), T.lists(g["draft_depths"]))))}
            for key, g in ok.groupby([*CELL, "question_id"], sort=False)]
        totals = totals.merge(pd.DataFrame(positions, columns=[*CELL, "question_id", *POSITION_COLUMNS]),
                              on=[*CELL, "question_id"], how="left")
        questions = qt.merge(totals, on=[*CELL, "question_id"], how="left")
        questions["speedup"] = math.nan
        bases = baseline_labels(turns, label)  # a compiled label against the compiled baseline, as the summary
        for (cell_label, suite, temp), g in questions.groupby(CELL, sort=False):
            base = questions[(questions["label"] == bases.get(cell_label, label)) & (questions["suite"] == suite)
                             & (questions["temperature"] == temp)]
            if base.empty:
                continue
            s = M.per_question_speedups(dict(zip(g["question_id"], g["tokens_per_s"])),
                                        dict(zip(base["question_id"], base["tokens_per_s"])))
            questions.loc[g.index, "speedup"] = g["question_id"].map(s).astype(float).to_numpy()
        questions.loc[questions["n_errors"] > 0, ["tokens_per_s", "speedup", "score"]] = math.nan
        for col in ("accepted_tokens", "steps"):
            questions[col] = questions[col].fillna(0).astype(int)

        if kind == "run":
            turn_rows = ok.assign(sha256=ok["output_ids"].map(lambda ids: ids_sha256(ids or [])))
            turn_rows = turn_rows[[*TURN_COLUMNS, "output_ids", "output_text"]].reset_index(drop=True)
        else:
            turn_rows = ok.assign(sha256=ok["output_sha256"])[TURN_COLUMNS].reset_index(drop=True)
        cells = summary.assign(n_errors=summary["n_errors"].astype(int))[CELL_COLUMNS].reset_index(drop=True)
        return cls(path, kind, provenance, label, cells,
                   questions[[*QUESTION_COLUMNS, *DRAFT_COLUMNS, *POSITION_COLUMNS]].reset_index(drop=True),
                   turn_rows, repeat_table(turns, label))

    # ---- a committed baseline -----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The baseline document (see the module docstring); output ids and texts are left out."""
        return {
            "format": BASELINE_FORMAT, "version": BASELINE_VERSION,
            "provenance": self.provenance, "baseline_label": self.baseline_label,
            "cells": _records_of(self.cells, CELL_COLUMNS),
            "questions": _records_of(self.questions, [*QUESTION_COLUMNS, *DRAFT_COLUMNS, *POSITION_COLUMNS]),
            "turns": _records_of(self.turns, TURN_COLUMNS),
            **({"repeats": _records_of(self.repeats, REPEAT_COLUMNS)} if self.n_repeats >= 2 else {}),
        }

    @classmethod
    def from_baseline(cls, path: str | Path) -> Side:
        """Read ``baseline.json`` (or the folder holding it); a missing table or field is a one-line error."""
        path = Path(path)
        file = path / BASELINE_FILE if path.is_dir() else path
        text = read_run_file(file)  # a FIFO or device as baseline.json would block or never end
        if text is None:
            raise FileNotFoundError(f"{file}: no such baseline file")
        try:
            doc = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{file}: not valid JSON ({e})") from e
        if not isinstance(doc, dict) or doc.get("format") != BASELINE_FORMAT:
            raise ValueError(f"{file}: not a draftbench baseline (expected \"format\": \"{BASELINE_FORMAT}\")")
        if doc.get("version") != BASELINE_VERSION:
            raise ValueError(f"{file}: baseline format version {doc.get('version')!r}; this draftbench reads "
                             f"version {BASELINE_VERSION} (save the baseline again)")
        tables = {}
        for name, columns in (("cells", CELL_COLUMNS), ("questions", QUESTION_COLUMNS), ("turns", TURN_COLUMNS)):
            rows = doc.get(name)
            if not isinstance(rows, list):
                raise ValueError(f"{file}: field {name!r} must be a list of rows")
            df = pd.DataFrame(rows, columns=columns)
            missing = sorted({c for r in rows for c in columns if c not in r})
            if missing:
                raise ValueError(f"{file}: {name} rows lack field(s) {missing}")
            tables[name] = df
        drafts = pd.DataFrame([{c: r.get(c) for c in DRAFT_COLUMNS} for r in doc["questions"]],
                              columns=DRAFT_COLUMNS, dtype=float)
        tables["questions"] = pd.concat([tables["questions"], drafts], axis=1)
        for col in POSITION_COLUMNS:
            tables["questions"][col] = [r.get(col) for r in doc["questions"]]
        for name in ("questions", "turns"):
            tables[name]["question_id"] = tables[name]["question_id"].astype(str)
        for df in tables.values():
            df["temperature"] = df["temperature"].astype(float)
        for col in ("tau", "tokens_per_s", "speedup", "lossless_share", "quality", "peak_memory_bytes",
                    "energy_per_token_j"):
            tables["cells"][col] = tables["cells"][col].map(_float)
        for col in ("tokens_per_s", "speedup", "score", "wall_time_s"):
            tables["questions"][col] = tables["questions"][col].map(_float)
        return cls(file.parent, "baseline", dict(doc.get("provenance") or {}), str(doc.get("baseline_label")),
                   tables["cells"], tables["questions"], tables["turns"], _read_repeats(file, doc.get("repeats")))


def _read_repeats(file: Path, rows: Any) -> pd.DataFrame:
    """A baseline's optional ``repeats`` table (absent: saved from one repeat or before repeats were kept)."""
    if rows is None:
        return pd.DataFrame(columns=REPEAT_COLUMNS)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{file}: field 'repeats' must be a list of rows")
    missing = sorted({c for r in rows for c in REPEAT_COLUMNS if c not in r})
    if missing:
        raise ValueError(f"{file}: repeats rows lack field(s) {missing}")
    df = pd.DataFrame(rows, columns=REPEAT_COLUMNS)
    df["temperature"] = df["temperature"].astype(float)
    for col in SPREAD_FIGURES:
        df[col] = df[col].map(_float)
    df["acc_at"] = [[_float(v) for v in (a or [])] for a in df["acc_at"]]
    return df


def _file_name(value: Any) -> Any:
    """An absolute local path reduced to its file name (it says nothing on another machine); anything else as is."""
    return Path(value).name if isinstance(value, str) and Path(value).is_absolute() else value


def run_provenance(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What a baseline keeps of a run's manifest: identity, code, versions, device (+ slug), target and suites
    without local paths (file names only), configuration and its digest."""
    target = {k: v for k, v in (manifest.get("target") or {}).items() if k != "path"}
    if isinstance(target.get("source"), Mapping):
        target["source"] = {k: _file_name(v) for k, v in target["source"].items()}
    suites = {name: {**info, "source": _file_name(info["source"])} if isinstance(info, Mapping) and "source" in info
              else info for name, info in (manifest.get("suites") or {}).items()}
    device = dict(manifest.get("device") or {})
    return {
        "run_id": manifest.get("run_id"), "created": manifest.get("created"), "command": manifest.get("command"),
        "git_hash": manifest.get("git_hash"), "git_dirty": manifest.get("git_dirty"),
        "versions": manifest.get("versions") or {}, "device": device, "device_slug": device_slug(device),
        "target": target, "config": manifest.get("config") or {}, "config_digest": manifest.get("config_digest"),
        "suites": suites,
    }


def load_side(path: str | Path, n_boot: int = 2000, seed: int = 0) -> Side:
    """A run directory (manifest.json + records*.jsonl), a baseline (its folder or its baseline.json) or an export
    (a ``.jsonl`` file of :mod:`harness.report.exports`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run or baseline directory")
    if path.is_file() and path.suffix == ".jsonl":
        return Side.from_export(path, n_boot=n_boot, seed=seed)
    if path.is_file() or (path / BASELINE_FILE).exists():
        return Side.from_baseline(path)
    if (path / MANIFEST_FILE).exists() or record_files(path):
        return Side.from_run(path, n_boot=n_boot, seed=seed)
    raise FileNotFoundError(f"{path}: neither a run directory (manifest.json + records.jsonl) nor a baseline "
                            f"directory ({BASELINE_FILE})")


def preset_of(command: str | None) -> str | None:
    """The preset name in a run's recorded command line, if it names one. Example: "draftbench run --preset
    ci_gate --device cuda" -> "ci_gate"; "--config my/gate.yaml" -> "gate"."""
    if not command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for i, w in enumerate(words):
        for flag in ("--preset", "--config"):
            if w == flag and i + 1 < len(words):
                return Path(words[i + 1]).stem
            if w.startswith(flag + "="):
                return Path(w.split("=", 1)[1]).stem
    return None


def missing_questions(manifest: Mapping[str, Any], found: RecordsRead) -> list[str]:
    """What a run's manifest says it measures and its records lack: "<label> on <suite>: <complete> of <expected>
    questions" per entry and suite short of its count (questions x temperatures x seeds x repeats), in the
    manifest's order. Entries are the manifest's ``methods`` (else the labels of the records); a manifest without
    ``suites`` counts give nothing to check. Example: an interrupted run of 6 questions with 1 complete ->
    ["vanilla on mt_bench: 1 of 6 questions"]."""
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    suites = {name: info["questions"] for name, info in (manifest.get("suites") or {}).items()
              if isinstance(info, Mapping) and isinstance(info.get("questions"), int)}
    cells = len(config.get("temperatures") or [0.0]) * len(config.get("seeds") or [0]) * (config.get("repeats") or 1)
    labels = list(manifest.get("methods") or {}) or list(dict.fromkeys(r["label"] for r in found.records))
    have: dict[tuple[str, str], int] = {}
    for key in found.complete:
        have[(key[0], key[1])] = have.get((key[0], key[1]), 0) + 1
    return [f"{label} on {suite}: {have.get((label, suite), 0)} of {n * cells} questions"
            for label in labels for suite, n in suites.items() if have.get((label, suite), 0) < n * cells]


def save_baseline(run_dir: str | Path, out: str | Path | None = None, preset: str | None = None,
                  root: str | Path = BASELINES_ROOT, force: bool = False, allow_partial: bool = False) -> Path:
    """Write the baseline of a complete run; returns its folder (default ``root/<device slug>/<preset>``).

    Refuses a run with error turns (a baseline must measure every question), a partial run (interrupted: questions
    its manifest names have no complete record, :func:`missing_questions`) unless ``allow_partial``, and an
    existing baseline unless ``force`` (that is how a baseline is refreshed).
    """
    side = Side.from_run(run_dir)
    missing = missing_questions(read_manifest(run_dir) or {}, load_records(run_dir))
    if missing and not allow_partial:
        raise ValueError(f"{run_dir}: a partial run ({'; '.join(missing)} complete); finish it with draftbench run "
                         f"--resume {shlex.quote(str(run_dir))}, or pass --allow-partial to save what it has")
    errors = int(side.cells["n_errors"].sum())
    if errors:
        bad = side.cells[side.cells["n_errors"] > 0]["label"].tolist()
        raise ValueError(f"{run_dir}: {errors} error record(s) (labels {bad}); a baseline must come from a run "
                         "without errors")
    if out is None:
        preset = preset or preset_of(side.provenance.get("command"))
        if not preset:
            raise ValueError(f"{run_dir}: its command names no preset; pass --preset NAME or --out DIR")
        out = Path(root) / side.device_slug / preset
    out = Path(out)
    if (out / BASELINE_FILE).exists() and not force:
        raise FileExistsError(f"{out / BASELINE_FILE} exists; pass --force to replace it (a baseline refresh)")
    out.mkdir(parents=True, exist_ok=True)
    (out / BASELINE_FILE).write_text(json.dumps(side.to_json(), indent=1, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    summary_md = read_run_file(Path(run_dir) / SUMMARY_MD)  # never a link out of the run, a FIFO or a device
    if summary_md is not None:
        (out / "summary.md").write_bytes(summary_md)
    return out


def current_device_slug(device: str = "auto") -> str:
    """The slug of a device of this machine (``auto``: the first CUDA GPU if there is one, else the CPU)."""
    import torch

    from harness.measure.env import device_info

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is visible on this machine")
    return device_slug(device_info(device))


def export_run(run_dir: str | Path, fmt: str, out: str | Path | None = None) -> Path:
    """Write a run's complete measured records as an export of format ``fmt`` (:mod:`harness.report.exports`);
    returns the file (default ``RUN_DIR/exports/<fmt>.jsonl``)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if not manifest:
        raise FileNotFoundError(f"{run_dir}: no {MANIFEST_FILE}; not a draftbench run directory")
    prov = run_provenance(manifest)
    short = {"run_id": prov["run_id"], "created": prov["created"], "git_hash": prov["git_hash"],
             "versions": prov["versions"], "device_slug": prov["device_slug"],
             "target": {k: prov["target"].get(k) for k in ("name", "dtype")}, "config_digest": prov["config_digest"]}
    out = Path(out) if out is not None else run_subdir(run_dir, "exports") / f"{fmt}.jsonl"
    return write_export(load_records(run_dir).complete_records, short, fmt, out)
