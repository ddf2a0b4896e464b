"""``draftbench compare BASE NEW``: two runs (or committed baselines) cell by cell, and a gate that tells noise
from change.

A *cell* is one (label, suite, temperature) of both runs; inside it questions are paired on their id, turns on
(question, turn, seed, repeat). BASE and NEW are run directories or baselines (:mod:`harness.gate.baseline`).
The gate uses what a speculative-decoding run knows that a generic timing benchmark does not: at temperature 0
on the same device and dtype the outputs and τ are deterministic, so they are gated exactly; the speed-up is a
ratio to vanilla measured in the same run, so a uniformly slower or faster machine cancels out; per-question
pairs give a confidence interval, so timing noise is not read as a regression.

Rules (a cell FAILS when any holds; ``compare`` then exits 1):

=========== =========================================================================================================
outputs     T = 0 only: a turn of NEW whose output token ids (sha256, :func:`harness.gate.baseline.ids_sha256`)
            differ from BASE's turn with the same question, turn, seed and repeat. Reported: how many turns changed,
            and for the first one the first differing token position and the text around it (only when both sides
            are run directories: a baseline keeps hashes, not texts). ``--no-outputs`` turns it off.
tau         τ of NEW < τ of BASE × (1 − ``tau_rtol``), both pooled over the questions the two runs share
            (:func:`harness.measure.acceptance.tau_pooled`). A rise beyond ``tau_rtol`` is reported as "improved" and
            does not fail (refresh the baseline to keep it). Where exact gating does not apply and a tolerance is
            set, the two acceptance rules below replace it.
acceptance  tolerance gating, as the engines' own CI does (vLLM's acceptance-length test: mean within rtol of the
            expected value, each position at least expected × (1 − rtol)), in the cells where exact gating does not
            apply: the sides ran on another device or dtype, T > 0, or the cell's label ran on another engine
            than the harness's (``engine:`` in the run configuration). The tolerance is ``acceptance_rtol``
            (``--acceptance-rtol``); an engine's cell uses :data:`ENGINE_RTOL` when none is given, other cells keep
            the τ rule when none is given. Fails when |τ NEW / τ BASE − 1| > rtol (a rise too: counting or
            drafting changed; refresh the baseline if that is intended).
position    with the acceptance rule: acc@i of NEW < acc@i of BASE × (1 − rtol) at a position i BASE drafted,
            both pooled over the shared questions (:func:`harness.measure.acceptance.acceptance_pooled` of each
            question's counts); not gated against a baseline saved before it kept those counts.
speed       Δ speed-up = :func:`harness.measure.metrics.paired_change` of the per-question speed-ups (each run's own
            tokens/s ÷ its own baseline label's on the same question, :func:`harness.measure.metrics.
            per_question_speedups`): the geometric mean of NEW/BASE with a seeded percentile-bootstrap 95% CI.
            Fails only when the CI's UPPER end is below 1 − ``speed_tol``: the data must exclude every slowdown
            smaller than the tolerance, so a noisy rerun (CI straddling 1) passes while a 10% slowdown measured on
            enough questions fails. Not applied to the baseline label itself (its speed-up is 1 by definition) nor
            with ``--no-speed``.
tps         opt-in (``--tps-tol``): the same rule on per-question absolute tokens/s (only on a dedicated runner,
            where machine drift is not expected).
lossless    NEW's lossless share (T = 0: share of its turns equal to its own vanilla's) is below 1 for a label
            whose method declares itself lossless.
quality     NEW's mean quality score < BASE's − ``quality_tol``, both over the questions scored on both sides.
collapse    NEW's draft acceptance rate is under :data:`harness.measure.acceptance.COLLAPSE_SHARE` (a quarter) of
            BASE's: speculation collapsed (the message names the likely causes: precision, head/target mismatch,
            chat template); a tolerance never absorbs that.
validity    BASE or NEW failed a validity check (:mod:`harness.measure.validity`: no warm-up, compilation inside
            measured turns, the machine's load above its CPUs, entries one after another on a drifting machine,
            repeats more than 5% apart; a baseline keeps its run's in its provenance): speed is then not gated, and
            each failed check is a failure of its own, unless ``--allow-invalid`` (then a warning, and speed is
            gated) or ``--no-speed`` (nothing to refuse).
errors      NEW has error turns in the cell.
missing     a cell or a measured question of BASE that NEW lacks.
=========== =========================================================================================================

Fitted tolerances. A baseline saved from a run of N >= :data:`harness.measure.noise.MIN_FIT_REPEATS` repeats keeps
each cell's figures per repeat (:func:`harness.gate.baseline.repeat_table`). Against it, when both sides ran on
the same device and dtype, each tolerance is derived from that spread instead of a fixed default: for a figure with
mean x̄ and standard deviation s over BASE's n repeats, and NEW's mean over its m repeats (m = 1 for one run),
the band is x̄ ± t_{0.995, n−1} · s · √(1/n + 1/m) (:func:`harness.measure.noise.prediction_band`), the
normal-theory prediction interval that a rerun of the same commit leaves with probability 1% (0.5% below a
floor). Each repeat's figure is a mean over every question and step of the cell, so it is close to normal, and t
rather than a normal quantile pays for s being estimated from a handful of repeats. A bootstrap is not used: from
5 to 10 repeats its 0.5% and 99.5% quantiles of a new observation are the smallest and largest repeat, which
understates the band. Which figures: where exact gating does not apply (T > 0, an engine's cell) τ (a rise fails
too), the draft acceptance rate and each acc@i (falls only) replace the acceptance and position rules; in every
cell the speed-up (falls only) replaces the speed rule's fixed ``speed_tol`` (not with ``--no-speed``), and
tokens/s replaces ``tps_tol`` when ``--tps-tol`` asks for it. At T = 0 on the same device and dtype outputs and τ
stay exact. The fixed defaults (``tau_rtol``, ``speed_tol``, :data:`ENGINE_RTOL`, ``--acceptance-rtol``) gate only
where nothing is fitted: a baseline without repeats (or fewer than 5), sides on another device or dtype (repeats
on one device measure its rerun noise, not the shift to another), or ``--no-fit``. Every cell's ``tolerance``
says which applied and why ("fitted: 6 repeats", "default ±5% acceptance, speed-up 5%: baseline without
repeats"), and a note lists each fitted band.

Not gated, reported: absolute tokens/s and its paired change (CI machines differ), peak memory, energy per token,
each side's speed-up (ratio of means, as in the report), each side's draft acceptance rate and drafted tokens per
drafting step over the shared questions (:func:`harness.measure.acceptance.draft_acceptance_rate`; n/a for a baseline
saved before they were). BASE or NEW may also be an export of a run (:mod:`harness.report.exports`). A cell of
NEW that BASE lacks is listed as "new".
Warnings say when the sides are not comparable for exact gating: another device or dtype, another configuration
(the differing fields are named), other library versions, or the baseline label's own outputs changed (then the
target's numerics changed, and the methods' output changes follow from it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from harness.gate.baseline import CELL, TURN, Side
from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure import noise as NOISE
from harness.report.formatting import missing, number
from harness.report.tables import flatten

CONTEXT_CHARS = 30  # characters of text shown on each side of the first differing position
ENGINE_RTOL = 0.05  # an engine's cells without --acceptance-rtol: vLLM's acceptance-length CI tolerance
# configuration fields that do not make two runs measure different things; ``repeats``: a calibrated baseline has
# several where the run it gates has one, and the fitted bands account for both counts (n and m)
CONFIG_IGNORED = ("output_dir", "data_dir", "repeats")


@dataclass
class Thresholds:
    """The gate's knobs (the ``compare`` flags of the same names; ``fit`` False is ``--no-fit``: the fixed
    tolerances even against a baseline with repeats; ``allow_invalid`` is ``--allow-invalid``: gate speed on a side
    that failed a validity check)."""

    tau_rtol: float = 0.01
    speed_tol: float = 0.05
    gate_speed: bool = True
    tps_tol: float | None = None
    quality_tol: float = 0.0
    gate_outputs: bool = True
    n_boot: int = 2000
    seed: int = 0
    acceptance_rtol: float | None = None
    fit: bool = True
    allow_invalid: bool = False

    def __post_init__(self):
        for name in ("tau_rtol", "speed_tol", "quality_tol", "acceptance_rtol"):
            value = getattr(self, name)
            if name == "acceptance_rtol" and value is None:
                continue
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"compare: --{name.replace('_', '-')} must be in [0, 1), got {value!r}")
        if self.tps_tol is not None and not 0 <= self.tps_tol < 1:
            raise ValueError(f"compare: --tps-tol must be in [0, 1), got {self.tps_tol!r}")
        if self.n_boot < 1:
            raise ValueError(f"compare: --n-boot must be >= 1, got {self.n_boot}")


@dataclass
class Finding:
    """One flagged fact about a cell; ``fails`` findings make the comparison fail."""

    cell: str
    rule: str
    message: str
    fails: bool = True


@dataclass
class Comparison:
    base: Side
    new: Side
    thresholds: Thresholds
    rows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.fails]

    @property
    def exit_code(self) -> int:
        """0 when nothing fails, 1 when a rule fails (errors exit 2 before a Comparison exists)."""
        return 1 if self.failures else 0


def cell_name(label: str, suite: str, temperature: float) -> str:
    """How a cell is named in every message. Example: ("eagle2", "tiny", 0.0) -> "eagle2 / tiny / T=0"."""
    return f"{label} / {suite} / T={float(temperature):g}"


def text_context(base_text: str, new_text: str, width: int = CONTEXT_CHARS) -> tuple[int, str, str]:
    """(first differing character, BASE excerpt, NEW excerpt): ``width`` characters before it and after it on each
    side, the position marked with ``⟨⟩``. Example: ("the cat", "the cow") -> (5, "the c⟨⟩at", "the c⟨⟩ow")."""
    pos = M.first_difference(list(base_text), list(new_text))
    pos = len(base_text) if pos is None else pos
    start = max(0, pos - width)

    def excerpt(text: str) -> str:
        return ("…" if start else "") + text[start:pos] + "⟨⟩" + text[pos:pos + width] + (
            "…" if len(text) > pos + width else "")

    return pos, excerpt(base_text), excerpt(new_text)


def _declared(flag: Any) -> bool:
    """A lossless flag read from a table: True only when the method declared it (None / NaN = not declared)."""
    return not missing(flag) and bool(flag)


def _question_order(qid: str) -> tuple:
    return (0, int(qid), "") if qid.isdigit() else (1, 0, qid)


def _config_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    fa = {k: v for k, v in flatten(a or {}, "").items() if k.split(".")[0] not in CONFIG_IGNORED}
    fb = {k: v for k, v in flatten(b or {}, "").items() if k.split(".")[0] not in CONFIG_IGNORED}
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))


def comparability_warnings(base: Side, new: Side) -> list[str]:
    """Why exact gating may not hold between these two sides (empty when they are comparable)."""
    pb, pn = base.provenance, new.provenance
    out = []
    if pb.get("device_slug") != pn.get("device_slug"):
        out.append(f"devices differ (BASE {pb.get('device_slug')}, NEW {pn.get('device_slug')}): outputs and τ are "
                   "reproducible only on the same device and dtype")
    db, dn = (pb.get("target") or {}).get("dtype"), (pn.get("target") or {}).get("dtype")
    if db != dn:
        out.append(f"dtypes differ (BASE {db}, NEW {dn})")
    tb, tn = (pb.get("target") or {}).get("name"), (pn.get("target") or {}).get("name")
    if tb != tn:
        out.append(f"targets differ (BASE {tb}, NEW {tn})")
    both = pb.get("config") is not None and pn.get("config") is not None  # an export carries no configuration
    diff = _config_differences(pb.get("config") or {}, pn.get("config") or {}) if both else []
    if diff:
        shown = ", ".join(diff[:8]) + (f" and {len(diff) - 8} more" if len(diff) > 8 else "")
        out.append(f"run configurations differ in {shown}")
    vb, vn = pb.get("versions") or {}, pn.get("versions") or {}
    changed = [f"{k} {vb.get(k)} -> {vn.get(k)}" for k in ("torch", "transformers") if vb.get(k) != vn.get(k)]
    if changed:
        out.append("library versions differ: " + ", ".join(changed))
    if base.baseline_label != new.baseline_label:
        out.append(f"baseline labels differ (BASE {base.baseline_label}, NEW {new.baseline_label})")
    return out


def _outputs(name: str, bt: pd.DataFrame, nt: pd.DataFrame, base: Side, new: Side) -> tuple[dict, Finding | None]:
    """Changed turns of one T = 0 cell: counts and, for the first changed turn, where and how it differs."""
    merged = bt.merge(nt, on=TURN, how="left", suffixes=("_b", "_n"))
    compared = merged[merged["sha256_n"].notna() & merged["sha256_b"].notna()]  # an export may carry no hash
    changed = compared[compared["sha256_b"] != compared["sha256_n"]]
    info = {"turns_compared": len(compared), "turns_changed": len(changed)}
    if changed.empty:
        return info, None
    order = changed.assign(_o=changed["question_id"].map(_question_order)).sort_values(["_o", "turn", "seed",
                                                                                        "repeat"])
    first = order.iloc[0]
    where = f"question {first['question_id']} turn {int(first['turn'])}"
    detail = {"question_id": first["question_id"], "turn": int(first["turn"]), "seed": int(first["seed"]),
              "repeat": int(first["repeat"]), "base_tokens": int(first["new_tokens_b"]),
              "new_tokens": int(first["new_tokens_n"])}
    if base.has_outputs and new.has_outputs:
        ids_b, ids_n = list(first["output_ids_b"] or []), list(first["output_ids_n"] or [])
        pos = M.first_difference(ids_b, ids_n)
        char, ex_b, ex_n = text_context(str(first["output_text_b"] or ""), str(first["output_text_n"] or ""))
        detail.update(token=pos, char=char, base_text=ex_b, new_text=ex_n)
        text = (f"first at {where}, token {pos} (character {char}): BASE {ex_b!r} NEW {ex_n!r}")
    else:
        which = [s for s, side in (("BASE", base), ("NEW", new)) if not side.has_outputs]
        what = f"{which[0]} is a baseline, which keeps" if len(which) == 1 else "both are baselines, which keep"
        text = (f"first at {where} ({detail['base_tokens']} -> {detail['new_tokens']} tokens); {what} output "
                "hashes only: compare two run directories to see the text")
    info["first_difference"] = detail
    msg = f"greedy output changed in {len(changed)} of {len(compared)} turns; {text}"
    return info, Finding(name, "outputs", msg)


def _change(new: pd.Series, base: pd.Series, th: Thresholds) -> tuple[float, float, float]:
    return M.paired_change(new.dropna().to_dict(), base.dropna().to_dict(), n_boot=th.n_boot, seed=th.seed)


def mismatch(base: Side, new: Side) -> str | None:
    """What makes two sides measure different things (another target or another dtype: every output and τ differs
    for that reason alone, so a comparison would report noise as regressions), or None."""
    tb, tn = base.provenance.get("target") or {}, new.provenance.get("target") or {}
    diff = [f"{what} (BASE {tb.get(key)}, NEW {tn.get(key)})"
            for what, key in (("targets", "name"), ("dtypes", "dtype")) if tb.get(key) != tn.get(key)]
    return " and ".join(diff) if diff else None


def compare_sides(base: Side, new: Side, thresholds: Thresholds | None = None,
                  labels: list[str] | None = None, allow_mismatch: bool = False) -> Comparison:
    """Apply the module docstring's rules to every cell; raises ValueError when the sides share no cell, or measure
    another target or dtype (:func:`mismatch`) unless ``allow_mismatch`` (then it is a warning)."""
    different = mismatch(base, new)
    if different and not allow_mismatch:
        raise ValueError(f"compare: BASE and NEW differ in {different}; their outputs and τ are not comparable "
                         "(--allow-mismatch compares them anyway)")
    th = thresholds or Thresholds()
    invalid = [f"{who} ({side.path.name}) failed the validity check {c['name']}"
               + (f" ({c['scope']})" if c.get("scope") else "") + f": {c['detail']}"
               for who, side in (("BASE", base), ("NEW", new)) for c in side.provenance.get("validity") or []]
    refused = bool(invalid) and th.gate_speed and not th.allow_invalid
    cmp = Comparison(base, new, dataclasses.replace(th, gate_speed=False) if refused else th,
                     warnings=comparability_warnings(base, new))
    if invalid and th.gate_speed:
        if refused:
            cmp.findings += [Finding("run", "validity", f"{line}; speed is not gated on it (--allow-invalid gates it "
                                                        "anyway, --no-speed leaves speed out)") for line in invalid]
        else:
            cmp.warnings += [f"{line}; speed gated anyway (--allow-invalid)" for line in invalid]
    th = cmp.thresholds
    bc, nc = base.cells, new.cells
    if labels:
        unknown = sorted(set(labels) - set(bc["label"]) - set(nc["label"]))
        if unknown:
            raise ValueError(f"compare: --labels {unknown} are in neither run (labels: "
                             f"{sorted(set(bc['label']) | set(nc['label']))})")
        bc, nc = bc[bc["label"].isin(labels)], nc[nc["label"].isin(labels)]
    keys_b = [tuple(k) for k in bc[CELL].itertuples(index=False)]
    keys_n = [tuple(k) for k in nc[CELL].itertuples(index=False)]
    if not set(keys_b) & set(keys_n):
        raise ValueError(f"compare: {base.path} and {new.path} share no (label, suite, temperature) cell "
                         f"(BASE {sorted(map(cell_name_of, keys_b))[:6]}, NEW {sorted(map(cell_name_of, keys_n))[:6]})")
    changed_baseline_outputs = False
    for key in keys_b + [k for k in keys_n if k not in keys_b]:
        name = cell_name_of(key)
        if key not in keys_n:
            cmp.findings.append(Finding(name, "missing", "cell is in BASE but not in NEW"))
            cmp.rows.append({"cell": name, "label": key[0], "suite": key[1], "temperature": key[2],
                             "status": "missing"})
            continue
        if key not in keys_b:
            cmp.findings.append(Finding(name, "new", "cell is only in NEW (not gated)", fails=False))
            cmp.rows.append({"cell": name, "label": key[0], "suite": key[1], "temperature": key[2], "status": "new"})
            continue
        row, findings = _compare_cell(key, base, new, th)
        if row.get("turns_changed") and key[0] == base.baseline_label:
            changed_baseline_outputs = True
        cmp.rows.append(row)
        cmp.findings.extend(findings)
    if changed_baseline_outputs:
        cmp.warnings.append(f"the baseline label ({base.baseline_label}) produced other outputs too: the target's "
                            "numerics or the prompts changed (device, dtype, kernels, library versions, configuration)"
                            ", and the methods' output changes follow from it")
    return cmp


def cell_name_of(key: tuple) -> str:
    return cell_name(*key)


def _select(df: pd.DataFrame, key: tuple) -> pd.DataFrame:
    label, suite, temp = key
    return df[(df["label"] == label) & (df["suite"] == suite) & (df["temperature"].astype(float) == float(temp))]


def label_engine(provenance: Mapping[str, Any], label: str) -> str:
    """The engine that ran ``label`` according to a side's run configuration: the entry's ``engine``, else the
    run's, else ``harness`` (also for labels the configuration does not list, such as ``eagle2@compiled``).
    Example: {"config": {"engine": "vllm", "methods": [{"name": "pld", "engine": "harness"}]}}, "pld" -> "harness"."""
    config = provenance.get("config") or {}
    for m in config.get("methods") or []:
        if isinstance(m, Mapping) and (m.get("label") or m.get("name")) == label:
            return str(m.get("engine") or config.get("engine") or "harness")
    return "harness"


def inexact_reasons(base: Side, new: Side, label: str, temperature: float) -> list[str]:
    """Why a cell's outputs and τ are not reproducible exactly between the two sides (empty when they are): another
    device or dtype, sampling (T > 0), or an engine other than the harness's on either side (then "engine ..."
    comes last). Example: same CPU and dtype, T = 0, ``vllm-eagle3`` run by vllm -> ["engine vllm"]."""
    pb, pn = base.provenance, new.provenance
    out = []
    if pb.get("device_slug") != pn.get("device_slug"):
        out.append("devices differ")
    if (pb.get("target") or {}).get("dtype") != (pn.get("target") or {}).get("dtype"):
        out.append("dtypes differ")
    if temperature > 0:
        out.append(f"T = {temperature:g}")
    engines = sorted({label_engine(pb, label), label_engine(pn, label)} - {"harness"})
    if engines:
        out.append(f"engine {', '.join(engines)}")
    return out


@dataclass
class Band:
    """One figure gated by a tolerance fitted on BASE's repeats: BASE's mean over its ``n`` repeats, NEW's value (its
    mean over its ``m`` repeats) and the half-width of the prediction band (:func:`harness.measure.metrics.
    prediction_band`). ``floor``: only a fall fails (acc@i, rates, speed); otherwise a rise fails too (τ)."""

    figure: str
    base: float
    new: float
    halfwidth: float
    n: int
    m: int
    floor: bool = True

    @property
    def fails(self) -> bool:
        """Outside the band; a figure NEW lacks (a draft position it never reached) fails too."""
        if missing(self.new):
            return True
        slack = 1e-12 * max(1.0, abs(self.base))  # the same figure recomputed: equal up to rounding
        low = self.new < self.base - self.halfwidth - slack
        return low or (not self.floor and self.new > self.base + self.halfwidth + slack)

    def describe(self) -> str:
        """Example: "τ 2.400 ± 0.031 (n 6), NEW 2.350 (m 1)"."""
        return (f"{self.figure} {self.base:.3f} {'−' if self.floor else '±'} {self.halfwidth:.3f} (n {self.n}), NEW "
                f"{number(self.new, '.3f')} (m {self.m})")


def fit_source(base: Side, new: Side, key: tuple, th: Thresholds) -> tuple[int, str | None]:
    """(BASE's repeats of the cell, why no tolerance is fitted or None when one is). A tolerance is fitted when BASE
    has at least :data:`harness.measure.noise.MIN_FIT_REPEATS` repeats of the cell, both sides ran on the same
    device and dtype (repeats on one device measure its rerun noise, not the shift to another), and ``th.fit``.
    Example: an old baseline -> (0, "baseline without repeats")."""
    n = len(base.spread(key))
    pb, pn = base.provenance, new.provenance
    if not th.fit:
        return n, "--no-fit"
    if n == 0:
        return n, "baseline without repeats"
    if n < NOISE.MIN_FIT_REPEATS:
        return n, f"baseline of {n} repeats, fewer than {NOISE.MIN_FIT_REPEATS}"
    if pb.get("device_slug") != pn.get("device_slug"):
        return n, "devices differ: BASE's repeats measure its own device's noise"
    if (pb.get("target") or {}).get("dtype") != (pn.get("target") or {}).get("dtype"):
        return n, "dtypes differ: BASE's repeats measure its own dtype's noise"
    return n, None


def _mean_positions(lists: list[list[float]]) -> list[float]:
    """Per position, the mean over the lists that reach it. Example: [[0.5, 0.3], [0.7]] -> [0.6, 0.3]."""
    depth = max((len(a) for a in lists), default=0)
    return [sum(a[i] for a in lists if len(a) > i) / sum(1 for a in lists if len(a) > i) for i in range(depth)]


def fitted_bands(base: Side, new: Side, key: tuple, pooled: Mapping[str, Any]) -> list[Band]:
    """Every figure of a cell that BASE's repeats spread over: τ (a rise fails too), acc@i, draft acceptance rate,
    speed-up and tokens/s (falls only). NEW's value is its mean over its own repeats (``m`` of them) when it keeps
    them, else ``pooled`` (figure -> value over the shared questions, m = 1)."""
    sb, sn = base.spread(key), new.spread(key)
    m = len(sn) or 1
    new_values = {f: (sn[f].mean() if len(sn) else pooled.get(f)) for f in ("tau", "draft_acceptance_rate",
                                                                             "speedup", "tokens_per_s")}
    new_acc = _mean_positions(list(sn["acc_at"])) if len(sn) else list(pooled.get("acc_at") or [])
    bands = []
    for figure, name, floor in (("tau", "τ", False), ("draft_acceptance_rate", "draft acc. rate", True),
                                ("speedup", "speed-up", True), ("tokens_per_s", "tokens/s", True)):
        mean, hw, n = NOISE.prediction_band(list(sb[figure]), m)
        if not missing(mean) and not missing(new_values[figure]):
            bands.append(Band(name, mean, float(new_values[figure]), hw, n, m, floor))
    acc_b = [list(a) for a in sb["acc_at"]]
    for i in range(max((len(a) for a in acc_b), default=0)):
        mean, hw, n = NOISE.prediction_band([a[i] for a in acc_b if len(a) > i], m)
        if not missing(mean):
            bands.append(Band(f"acc@{i + 1}", mean, new_acc[i] if i < len(new_acc) else math.nan, hw, n, m))
    return bands


def _acceptance(questions: pd.DataFrame) -> list[float]:
    """Acceptance per position pooled over a cell's shared questions (their ``accepted_at`` / ``drafted_at``
    counts); [] when the side keeps no counts."""
    if "accepted_at" not in questions:
        return []
    return ACC.acceptance_pooled(questions["accepted_at"], questions["drafted_at"])


def acceptance_failures(tau_base: float, tau_new: float, acc_base: list[float], acc_new: list[float],
                        rtol: float) -> list[tuple[str, str]]:
    """The tolerance rules (module docstring: acceptance, position) as (rule, message) failures.

    acceptance: |τ_new / τ_base − 1| > rtol. position: acc_new[i] < acc_base[i] × (1 − rtol) (or NEW did not draft
    there) at every position i where BASE has a rate. Example, rtol 0.05: τ 2.00 -> 1.92 (−4%) passes; acc
    [0.70, 0.50, 0.30] -> [0.70, 0.50, 0.28] fails at position 3 (floor 0.30 × 0.95 = 0.285).
    """
    out = []
    change = M.relative_change(tau_new, tau_base)
    if not missing(change) and abs(change) > rtol:
        out.append(("acceptance", f"τ {tau_base:.3f} -> {tau_new:.3f} ({change:+.1%}) outside ±{rtol:.1%}"
                                  + ("; a rise too fails: refresh the baseline if it is intended" if change > 0
                                     else "")))
    for i, b in enumerate(acc_base):
        n = acc_new[i] if i < len(acc_new) else math.nan
        if not missing(b) and (missing(n) or n < b * (1 - rtol)):
            out.append(("position", f"acc@{i + 1} {b:.3f} -> {number(n, '.3f')} below the floor "
                                    f"{b * (1 - rtol):.4f} ({b:.3f} × (1 − {rtol:g}))"))
    return out


def _compare_cell(key: tuple, base: Side, new: Side, th: Thresholds) -> tuple[dict[str, Any], list[Finding]]:
    label, suite, temp = key
    name = cell_name_of(key)
    cb, cn = _select(base.cells, key).iloc[0], _select(new.cells, key).iloc[0]
    qb, qn = _select(base.questions, key), _select(new.questions, key)
    ok_b = qb[qb["n_errors"] == 0].set_index("question_id")
    ok_n = qn[qn["n_errors"] == 0].set_index("question_id")
    shared = [q for q in ok_b.index if q in ok_n.index]
    sb, sn = ok_b.loc[shared], ok_n.loc[shared]
    findings: list[Finding] = []

    lacking = [q for q in ok_b.index if q not in ok_n.index]
    errored = qn[qn["n_errors"] > 0]["question_id"].tolist()
    if errored:
        findings.append(Finding(name, "errors", f"NEW has error turns in question(s) {errored}"))
    lacking = [q for q in lacking if q not in errored]
    if lacking:
        findings.append(Finding(name, "missing", f"NEW lacks measured question(s) {lacking} of BASE"))

    tau_b = ACC.tau_pooled(sb["accepted_tokens"], sb["steps"])
    tau_n = ACC.tau_pooled(sn["accepted_tokens"], sn["steps"])
    tau_change = M.relative_change(tau_n, tau_b)
    rate_b, rate_n = (ACC.draft_acceptance_rate(q["accepted_drafts_total"], q["drafted_tokens"]) for q in (sb, sn))
    drafted_b, drafted_n = (ACC.drafted_per_step(q["drafted_tokens"], q["draft_steps"]) for q in (sb, sn))
    inexact = inexact_reasons(base, new, label, float(temp))
    on_engine = bool(inexact) and inexact[-1].startswith("engine ")
    rtol = th.acceptance_rtol if th.acceptance_rtol is not None else ENGINE_RTOL if on_engine else None
    is_reference = label in (base.baseline_label, new.baseline_label)
    n_repeats, no_fit = fit_source(base, new, key, th)
    bands: dict[str, Band] = {}
    if no_fit is None:
        pooled = {"tau": tau_n, "draft_acceptance_rate": rate_n, "speedup": cn["speedup"],
                  "tokens_per_s": cn["tokens_per_s"], "acc_at": _acceptance(sn)}
        bands = {b.figure: b for b in fitted_bands(base, new, key, pooled)}
        if not inexact:  # outputs and τ stay exact here; the fit gates speed (and tokens/s when asked)
            bands = {k: b for k, b in bands.items() if k in ("speed-up", "tokens/s")}
        if is_reference or not th.gate_speed:
            bands.pop("speed-up", None)
        if th.tps_tol is None:
            bands.pop("tokens/s", None)
    tolerance: dict[str, Any] = {}
    if bands:
        tolerance = {"gate": "fitted", "fit_repeats": n_repeats,
                     "bands": {k: asdict(b) for k, b in bands.items()}}
        fitted = "; ".join(b.describe() for b in bands.values())
        findings.append(Finding(name, "tolerance", f"fitted: {n_repeats} repeats ({NOISE.PREDICTION_LEVEL:.0%} "
                                                   f"prediction band of one rerun): {fitted}", fails=False))
        rules = {"τ": "acceptance", "draft acc. rate": "acceptance", "speed-up": "speed", "tokens/s": "tps"}
        for b in bands.values():
            if b.fails:
                findings.append(Finding(name, rules.get(b.figure, "position"), f"{b.figure} {b.base:.3f} -> "
                                        f"{number(b.new, '.3f')} outside its fitted tolerance "
                                        f"{'−' if b.floor else '±'}{b.halfwidth:.3f} ({n_repeats} repeats)"))
    fitted_acceptance = any(k not in ("speed-up", "tokens/s") for k in bands)  # only in inexact cells
    if inexact and rtol is not None and not fitted_acceptance:
        acc_b, acc_n = _acceptance(sb), _acceptance(sn)
        tolerance = {"gate": "tolerance", "acceptance_rtol": rtol, "acc_base": acc_b, "acc_new": acc_n}
        findings.append(Finding(name, "acceptance", f"gated with tolerance ±{rtol:.1%} ({', '.join(inexact)}): "
                                                    f"τ{f' and acc@1..{len(acc_b)}' if acc_b else ''} instead of the "
                                                    "exact τ rule",
                                fails=False))
        findings += [Finding(name, rule, msg) for rule, msg in acceptance_failures(tau_b, tau_n, acc_b, acc_n, rtol)]
        if acc_n and not acc_b:
            findings.append(Finding(name, "position", "BASE keeps no per-position acceptance counts (a baseline "
                                                      "saved before them): per-position floors not gated",
                                    fails=False))
    elif not fitted_acceptance and not missing(tau_change) and tau_n < tau_b * (1 - th.tau_rtol):
        findings.append(Finding(name, "tau", f"τ dropped {tau_b:.3f} -> {tau_n:.3f} ({tau_change:+.1%}; "
                                             f"allowed -{th.tau_rtol:.1%})"))
    elif not fitted_acceptance and not missing(tau_change) and tau_n > tau_b * (1 + th.tau_rtol):
        findings.append(Finding(name, "tau", f"τ rose {tau_b:.3f} -> {tau_n:.3f} ({tau_change:+.1%}): improved; "
                                             "refresh the baseline to keep it", fails=False))

    if ACC.rate_collapsed(rate_n, rate_b):
        findings.append(Finding(name, "collapse", collapse_message(label, rate_b, rate_n)))

    sp = (math.nan,) * 3 if is_reference else _change(sn["speedup"], sb["speedup"], th)
    if "speed-up" not in bands and th.gate_speed and not missing(sp[2]) and sp[2] < 1 - th.speed_tol:
        findings.append(Finding(name, "speed", f"speed-up fell to {sp[0]:.3f}× of BASE's (95% CI [{sp[1]:.3f}, "
                                               f"{sp[2]:.3f}], upper end below 1 − {th.speed_tol:g})"))
    tps = _change(sn["tokens_per_s"], sb["tokens_per_s"], th)
    if "tokens/s" not in bands and th.tps_tol is not None and not missing(tps[2]) and tps[2] < 1 - th.tps_tol:
        findings.append(Finding(name, "tps", f"tokens/s fell to {tps[0]:.3f}× of BASE's (95% CI [{tps[1]:.3f}, "
                                             f"{tps[2]:.3f}], upper end below 1 − {th.tps_tol:g})"))

    lossless_n = cn["lossless_share"]
    if _declared(cn["lossless"]) and float(temp) == 0.0 and not missing(lossless_n) and lossless_n < 1:
        findings.append(Finding(name, "lossless", f"lossless share {lossless_n:.3f} < 1 for a lossless method: "
                                                  "its greedy output differs from its own run's "
                                                  f"{new.baseline_label} on {1 - lossless_n:.1%} of turns"))

    scored = [q for q in shared if not missing(sb.at[q, "score"]) and not missing(sn.at[q, "score"])]
    quality_b = M.quality(sb.loc[scored, "score"]) if scored else None
    quality_n = M.quality(sn.loc[scored, "score"]) if scored else None
    if quality_b is not None and quality_n is not None and quality_n < quality_b - th.quality_tol:
        findings.append(Finding(name, "quality", f"quality dropped {quality_b:.3f} -> {quality_n:.3f} over "
                                                 f"{len(scored)} scored question(s)"))

    row: dict[str, Any] = {
        "cell": name, "label": label, "suite": suite, "temperature": float(temp), "method": cn["method"],
        "method_base": cb["method"], "lossless": cn["lossless"], "n_questions": len(shared),
        "tau_base": tau_b, "tau_new": tau_n, "tau_change": tau_change,
        "draft_acceptance_rate_base": rate_b, "draft_acceptance_rate_new": rate_n,
        "drafted_per_step_base": drafted_b, "drafted_per_step_new": drafted_n,
        "speedup_base": cb["speedup"], "speedup_new": cn["speedup"],
        "speedup_change": sp[0], "speedup_change_lo": sp[1], "speedup_change_hi": sp[2],
        "tokens_per_s_base": cb["tokens_per_s"], "tokens_per_s_new": cn["tokens_per_s"],
        "tokens_per_s_change": tps[0], "tokens_per_s_change_lo": tps[1], "tokens_per_s_change_hi": tps[2],
        "lossless_share_base": cb["lossless_share"], "lossless_share_new": lossless_n,
        "quality_base": quality_b, "quality_new": quality_n,
        "peak_memory_bytes_base": cb["peak_memory_bytes"], "peak_memory_bytes_new": cn["peak_memory_bytes"],
        "energy_per_token_j_base": cb["energy_per_token_j"], "energy_per_token_j_new": cn["energy_per_token_j"],
        "turns_compared": None, "turns_changed": None,
    }
    if cb["method"] != cn["method"]:
        findings.append(Finding(name, "method", f"label runs method {cn['method']} in NEW but {cb['method']} in "
                                                "BASE", fails=False))
    if float(temp) == 0.0 and th.gate_outputs:
        info, finding = _outputs(name, _select(base.turns, key), _select(new.turns, key), base, new)
        row.update(info)
        if finding:
            findings.append(finding)
    row.update(tolerance)
    row["tolerance"] = (f"fitted: {n_repeats} repeats" if bands
                        else _fixed_tolerance(th, bool(inexact) and rtol is not None, rtol, is_reference, no_fit))
    row["status"] = ("FAIL" if any(f.fails for f in findings)
                     else "improved" if any(f.rule == "tau" for f in findings) else "ok")
    row["rules_failed"] = sorted({f.rule for f in findings if f.fails})
    return row, findings


def _percent(x: float) -> str:
    """Example: 0.05 -> "5%"; 0.005 -> "0.5%"."""
    return f"{100 * x:g}%"


def _fixed_tolerance(th: Thresholds, acceptance_gated: bool, rtol: float | None, is_reference: bool,
                     reason: str | None) -> str:
    """Which fixed tolerances gate a cell and why no fitted one does (``reason`` None: a fit was possible but no
    fitted figure applies, e.g. the baseline label at T = 0 without speed). Example: an engine's cell against an old
    baseline -> "default ±5% acceptance, speed-up 5%: baseline without repeats"."""
    if reason is None:
        return f"exact outputs, τ −{_percent(th.tau_rtol)}: nothing here to fit"
    parts = [f"±{_percent(rtol)} acceptance" if acceptance_gated and rtol is not None
             else f"τ −{_percent(th.tau_rtol)}"]
    if th.gate_speed and not is_reference:
        parts.append(f"speed-up {_percent(th.speed_tol)}")
    if th.tps_tol is not None:
        parts.append(f"tok/s {_percent(th.tps_tol)}")
    return f"default {', '.join(parts)}: {reason}"


def collapse_message(label: str, rate_base: float, rate_new: float) -> str:
    """The line that names a collapsed label (:func:`harness.measure.acceptance.rate_collapsed`) and the likely
    causes."""
    return (f"acceptance collapse: {label}'s draft acceptance rate fell {rate_base:.3f} -> {rate_new:.3f}, under "
            f"{ACC.COLLAPSE_SHARE:g} of BASE's; likely causes: {'; '.join(ACC.COLLAPSE_CAUSES)}")
