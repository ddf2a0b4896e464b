"""The referee: an entry another engine ran (``engine: vllm``, :mod:`harness.backends`) held against the harness's
own implementation of the same method and head on the same prompts.

The harness's engine is lossless by construction and its acceptance is counted step by step, so it is the reference
an engine's numbers are read against (speculative decoding's guarantee: greedy output equal to the target's own,
Leviathan et al. 2023, arXiv 2211.17192, §2.3). Three questions per turn:

* does the engine's greedy output equal the harness's vanilla (the target's own greedy decoding)? Where not, the
  first differing token is classified as in the losslessness audit (:func:`harness.measure.metrics.divergence`,
  one-sided: an engine exposes no logits, so the harness's margin decides between a near tie and a disagreement);
* τ and the acceptance per draft position of the engine next to the harness entry's
  (:func:`harness.measure.acceptance.tau`, :func:`harness.measure.acceptance.acceptance_per_position`);
* at T = 0, the first drafting step whose accepted count differs (:func:`step_difference`): from there on the
  two no longer draft from the same context. Only where the engine gives its steps in order: a server that
  reports how many steps accepted how many drafts but not their order (llama.cpp's and SGLang's counters; the
  turn's ``engine_notes`` carry :data:`harness.measure.records.UNORDERED_STEPS`) is not compared step by step
  (``steps_ordered`` False), since the order the client rebuilds is a guess.

Pairing (:func:`pair_entries`): an engine entry is held against the harness entry (eager) of the same method, the
same ``head`` option and the same deepest draft (a chain of k drafts k deep); an entry's ``referee:`` key names
the harness entry instead (when the automatic pairing finds none or several). Outputs are held against the harness
entry of the run's baseline label (else the first harness ``vanilla``). Every number comes from
:mod:`harness.measure.metrics`; this module selects and pairs rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure.records import steps_ordered
from harness.measure.rundir import atomic_file
from harness.report.formatting import markdown_table, missing, number
from harness.report.plots import plot_referee
from harness.report.tables import lists, max_depth, measured_rows

HARNESS = "harness"
COLUMNS = ["engine_label", "harness_label", "vanilla_label", "engine", "suite", "question_id", "turn", "temperature",
           "seed", "equal_to_vanilla", "divergence_position", "divergence_kind", "tau_engine", "tau_harness",
           "acc_engine", "acc_harness", "steps_engine", "steps_harness", "steps_ordered", "first_step",
           "accepted_engine", "accepted_harness", "token_position"]


@dataclass(frozen=True)
class Entry:
    """What pairing needs of one label of a run: its method, the engine that ran it (``harness`` for the harness's
    own), the ``head`` option (None: the shipped head), its deepest draft, its runtime and its ``referee:`` key."""

    label: str
    method: str
    engine: str = HARNESS
    head: str | None = None
    depth: int = 0
    runtime: str = "eager"
    referee: str | None = None


@dataclass(frozen=True)
class Pair:
    """An engine entry and the harness entries it is held against (None: none found, ``why`` says so)."""

    engine_label: str
    harness_label: str | None
    vanilla_label: str | None
    why: str


def _text(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def run_entries(turns: pd.DataFrame, config: Mapping[str, Any] | None = None) -> dict[str, Entry]:
    """label -> :class:`Entry` from a turns table (measured rows) and the run configuration's ``referee:`` keys.
    A label none of whose records names an engine is the harness's."""
    referees = {str(m.get("label") or m.get("name")): m["referee"] for m in (config or {}).get("methods") or []
                if isinstance(m, Mapping) and m.get("referee")}
    ok = turns[measured_rows(turns)]
    out = {}
    for label, g in ok.groupby("label", sort=False):
        engines = [e for e in g.get("engine", []) if _text(e)]
        head = next((str(h) for h in g.get("opt.head", []) if _text(h)), None)  # method_options.head, flattened
        runtime = next((r for r in g["runtime"] if _text(r)), "eager")
        out[label] = Entry(label, str(g["method"].iloc[0]), engines[0] if engines else HARNESS,
                           head, max_depth(g), runtime, referees.get(label))
    return out


def has_engines(entries: Mapping[str, Entry]) -> bool:
    """True when some entry ran on another engine than the harness's (then the report has a referee section)."""
    return any(e.engine != HARNESS for e in entries.values())


def pair_entries(entries: Mapping[str, Entry], baseline_label: str = "vanilla") -> list[Pair]:
    """One :class:`Pair` per engine entry, in the run's order (see the module docstring).

    Example: harness eagle3 (depth 2), harness eagle3-k3 (depth 3), vllm-eagle3 (engine vllm, depth 3) ->
    [Pair("vllm-eagle3", "eagle3-k3", "vanilla", "same method, head and deepest draft: 3")]; with a second harness
    entry of depth 3 the pair is None and ``why`` names both and asks for a ``referee:`` key.
    """
    harness = {k: e for k, e in entries.items() if e.engine == HARNESS}
    base = entries.get(baseline_label)
    if base is not None and base.engine == HARNESS:
        vanilla: str | None = baseline_label
    else:
        vanilla = next((k for k, e in harness.items() if e.method == "vanilla" and e.runtime == "eager"), None)
    out = []
    for label, e in entries.items():
        if e.engine == HARNESS:
            continue
        if e.referee is not None:
            found = e.referee if e.referee in harness else None
            why = f"referee key ({e.referee})" if found else f"referee {e.referee!r} measured nothing in this run"
            out.append(Pair(label, found, vanilla, why))
            continue
        same = [k for k, h in harness.items() if h.method == e.method and h.head == e.head and h.depth == e.depth
                and h.runtime == "eager"]
        if len(same) == 1:
            out.append(Pair(label, same[0], vanilla, f"same method, head and deepest draft: {e.depth}"))
        elif same:
            out.append(Pair(label, None, vanilla, f"ambiguous: {', '.join(same)} all run {e.method} with the same "
                                                  f"head and deepest draft {e.depth}; set `referee:` on the entry"))
        else:
            out.append(Pair(label, None, vanilla, f"no harness entry of {e.method} with the same head and deepest "
                                                  f"draft {e.depth}; set `referee:` on the entry"))
    return out


def step_difference(engine_accepted: Sequence[int], harness_accepted: Sequence[int], engine_depths: Sequence[int],
                    harness_depths: Sequence[int]) -> dict[str, Any] | None:
    """The first drafting step whose accepted draft count differs between two turns of the same prompt, or None
    when every one agrees: ``{"step", "accepted_engine", "accepted_harness", "token_position"}``.

    Steps are the verification steps that drafted something (depth > 0), counted on both sides alike: an engine
    reports only the forwards that drafted (:func:`harness.backends.contract.accept_lengths`), the harness also
    those where, for example, prompt lookup found nothing. ``step``: 0-based among them
    (:func:`harness.measure.metrics.first_difference` of the two accepted lists); an accepted count is None on the
    side whose turn ended before that step. ``token_position``: the index in ``output_ids`` of the first token that
    step emits on the harness's side, 1 (the prefill's token) + Σ (accepted + 1) over all its steps before it.
    Examples: accepted [2, 0, 1, 3] vs [2, 0, 2], depths 3 everywhere -> step 2, accepted 1 vs 2, token 1 + 3 + 1
    = 5; engine [1, 1] (depths [2, 2]) vs harness [0, 1, 0, 2] (depths [0, 2, 0, 2]) -> drafting steps [1, 1] vs
    [1, 2] differ at step 1, the harness's fourth step: token 1 + 1 + 2 + 1 = 5.
    """
    engine = [int(a) for a, d in zip(engine_accepted, engine_depths) if d > 0]
    drafting = [j for j, d in enumerate(harness_depths) if d > 0]              # the harness's drafting steps
    harness = [int(harness_accepted[j]) for j in drafting]
    step = M.first_difference(engine, harness)
    if step is None:
        return None
    before = drafting[step] if step < len(drafting) else len(harness_accepted)
    return {"step": step, "accepted_engine": engine[step] if step < len(engine) else None,
            "accepted_harness": harness[step] if step < len(harness) else None,
            "token_position": 1 + sum(int(a) + 1 for a in list(harness_accepted)[:before])}


def _key(rec: Mapping[str, Any]) -> tuple:
    return tuple(str(rec[f]) for f in M.LOSSLESS_KEY)


def _per_turn(rec: Mapping[str, Any], depth: int) -> tuple[float, list[float]]:
    """τ and acceptance per position 1..depth of one turn."""
    accepted, depths = [list(rec.get("accepted_drafts") or [])], [list(rec.get("draft_depths") or [])]
    return ACC.tau([rec["accept_lengths"]]), ACC.acceptance_per_position(accepted, depths, max_pos=depth)


def referee_table(turns: pd.DataFrame, pairs: Sequence[Pair]) -> pd.DataFrame:
    """One row per measured turn of each paired engine entry (:data:`COLUMNS`): whether its output equals the
    harness vanilla's (T = 0; None without a vanilla turn), the first differing token and its kind, τ and the
    acceptance per position (1..the deeper of the two entries' drafts) of the engine's turn and of the harness
    entry's turn of the same prompt, and at T = 0 the first drafting step that differs (:func:`step_difference`;
    None when every step agrees, or when the engine's steps are not in order: ``steps_ordered`` False)."""
    ok = turns[measured_rows(turns)]
    by_label = {label: {_key(r): r for r in g.to_dict("records")} for label, g in ok.groupby("label", sort=False)}
    rows = []
    for pair in pairs:
        if pair.harness_label is None:
            continue
        engine, harness = by_label.get(pair.engine_label, {}), by_label.get(pair.harness_label, {})
        vanilla = by_label.get(pair.vanilla_label, {}) if pair.vanilla_label else {}
        depth = max(max_depth(ok[ok["label"] == pair.engine_label]), max_depth(ok[ok["label"] == pair.harness_label]))
        for key, rec in engine.items():
            ref = harness.get(key)
            if ref is None:
                continue
            greedy = float(rec["temperature"]) == 0.0
            # a turn without token ids (a server that sent text only) cannot be held against vanilla's: n/a
            van = vanilla.get(key) if greedy and rec.get("output_ids") is not None else None
            div = M.divergence(rec, van, one_sided=True) if van is not None else None
            tau_e, acc_e = _per_turn(rec, depth)
            tau_h, acc_h = _per_turn(ref, depth)
            acc_steps_e, acc_steps_h = rec.get("accepted_drafts"), ref.get("accepted_drafts")
            ordered = steps_ordered(rec)
            step = (step_difference(acc_steps_e, acc_steps_h, rec.get("draft_depths") or [],
                                    ref.get("draft_depths") or [])
                    if greedy and ordered and isinstance(acc_steps_e, list) and isinstance(acc_steps_h, list)
                    else None)
            rows.append({
                "engine_label": pair.engine_label, "harness_label": pair.harness_label,
                "vanilla_label": pair.vanilla_label, "engine": rec.get("engine"), "suite": rec["suite"],
                "question_id": str(rec["question_id"]), "turn": int(rec["turn"]),
                "temperature": float(rec["temperature"]), "seed": rec["seed"],
                "equal_to_vanilla": None if van is None else div is None,
                "divergence_position": div["position"] if div else None,
                "divergence_kind": div["kind"] if div else None,
                "tau_engine": tau_e, "tau_harness": tau_h, "acc_engine": acc_e, "acc_harness": acc_h,
                "steps_engine": len(acc_steps_e or []), "steps_harness": len(acc_steps_h or []),
                "steps_ordered": ordered, "first_step": step["step"] if step else None,
                "accepted_engine": step["accepted_engine"] if step else None,
                "accepted_harness": step["accepted_harness"] if step else None,
                "token_position": step["token_position"] if step else None,
            })
    table = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("divergence_position", "first_step", "accepted_engine", "accepted_harness", "token_position"):
        table[col] = table[col].astype("Int64")  # counts and positions, missing where there is none
    return table


def pair_summary(turns: pd.DataFrame, pair: Pair) -> dict[str, Any]:
    """A pair's pooled numbers over the prompts both entries measured: ``tau_engine`` / ``tau_harness``
    (:func:`harness.measure.acceptance.tau`), ``acc_engine`` / ``acc_harness`` per position 1..the deeper draft
    (:func:`harness.measure.acceptance.acceptance_per_position`) and ``turns`` (how many prompts)."""
    ok = turns[measured_rows(turns)]
    engine, harness = ok[ok["label"] == pair.engine_label], ok[ok["label"] == pair.harness_label]
    shared = set(map(_key, engine.to_dict("records"))) & set(map(_key, harness.to_dict("records")))
    out: dict[str, Any] = {"turns": len(shared)}
    depth = max(max_depth(engine), max_depth(harness))
    for side, g in (("engine", engine), ("harness", harness)):
        g = g[[_key(r) in shared for r in g.to_dict("records")]]
        out[f"tau_{side}"] = ACC.tau(lists(g["accept_lengths"]))
        out[f"acc_{side}"] = ACC.acceptance_per_position(lists(g["accepted_drafts"]), lists(g["draft_depths"]),
                                                       max_pos=depth)
    return out


def _count(v: Any) -> str:
    """A count of the table (nullable integer): "n/a" where the turn had no such step."""
    return "n/a" if pd.isna(v) else str(int(v))


def referee_markdown(turns: pd.DataFrame, pairs: Sequence[Pair], table: pd.DataFrame) -> str:
    """The report's referee section: per engine entry, what it was paired with and why, τ and acceptance per
    position side by side, how many greedy outputs equal the harness vanilla's (ties / disagreements), and how many
    turns' drafting steps differ, with the first such turns. Empty text when the run has no engine entry."""
    if not pairs:
        return ""
    lines = ["**Referee: engine entries held against the harness** (same prompts; τ = tokens per target forward; "
             "acc@i = share of steps that drafted i deep and accepted the i-th draft; `harness/report/referee.py`)",
             ""]
    for pair in pairs:
        if pair.harness_label is None:
            lines += [f"- `{pair.engine_label}`: not refereed ({pair.why})", ""]
            continue
        s = pair_summary(turns, pair)
        rows = table[table["engine_label"] == pair.engine_label]
        head = [f"`{pair.engine_label}` vs `{pair.harness_label}`", "turns", "τ",
                *[f"acc@{i + 1}" for i in range(len(s["acc_engine"]))]]
        body = [[side_label, str(s["turns"]), number(s[f"tau_{side}"]), *[number(v) for v in s[f"acc_{side}"]]]
                for side, side_label in (("engine", f"{rows['engine'].iloc[0] if len(rows) else 'engine'}"),
                                         ("harness", "harness"))]
        lines += [f"`{pair.engine_label}` against `{pair.harness_label}` ({pair.why}):", "",
                  *markdown_table(head, body), ""]
        greedy = rows[rows["equal_to_vanilla"].notna()]
        if pair.vanilla_label and len(greedy):
            kinds = rows["divergence_kind"].value_counts()
            lines.append(f"- greedy output equal to `{pair.vanilla_label}`: {int(greedy['equal_to_vanilla'].sum())}"
                         f"/{len(greedy)} turns ({int(kinds.get('tie', 0))} near ties, "
                         f"{int(kinds.get('disagreement', 0))} disagreements, {int(kinds.get('unknown', 0))} "
                         "without margins)")
        differ = rows[rows["first_step"].notna()]
        greedy_rows = rows[rows["temperature"] == 0.0]
        stepped = greedy_rows[greedy_rows["steps_ordered"].astype(bool)]
        if len(stepped) < len(greedy_rows):
            lines.append(f"- drafting steps not compared in {len(greedy_rows) - len(stepped)}/{len(greedy_rows)} "
                         "greedy turns: the engine reports how many steps accepted how many drafts, not their order")
        if len(stepped):
            lines.append(f"- drafting steps differ in {len(differ)}/{len(stepped)} greedy turns"
                         + (":" if len(differ) else ""))
            for r in differ.head(5).itertuples(index=False):
                lines.append(f"  - {r.suite} / {r.question_id} turn {r.turn}: step {int(r.first_step)} (token "
                             f"{int(r.token_position)}), engine accepted {_count(r.accepted_engine)}, "
                             f"harness {_count(r.accepted_harness)}")
            if len(differ) > 5:
                lines.append(f"  - … and {len(differ) - 5} more (tables/referee.csv)")
        lines.append("")
    return "\n".join(lines)


@dataclass
class RefereeReport:
    """What a run with engine entries adds to its report: the Markdown section, the per-turn table and the files
    written (``tables/referee.csv``, ``plots/referee.png``)."""

    markdown: str
    table: pd.DataFrame
    paths: dict[str, Path] = field(default_factory=dict)


def write_referee(turns: pd.DataFrame, config: Mapping[str, Any] | None, baseline_label: str, tables: Path,
                  plots: Path) -> RefereeReport | None:
    """Pair the run's engine entries (:func:`pair_entries`), write ``tables/referee.csv`` (:func:`referee_table`,
    lists as JSON) and ``plots/referee.png`` (:func:`harness.report.plots.plot_referee`); None, and nothing
    written, when no entry ran on another engine."""
    entries = run_entries(turns, config)
    if not has_engines(entries):
        return None
    pairs = pair_entries(entries, baseline_label)
    table = referee_table(turns, pairs)
    report = RefereeReport(referee_markdown(turns, pairs, table), table)
    with atomic_file(tables / "referee.csv") as tmp:
        table.map(lambda v: json.dumps([None if missing(x) else x for x in v]) if isinstance(v, list) else v
                  ).to_csv(tmp, index=False)  # lists as strict JSON (NaN: null)
    report.paths["referee_csv"] = tables / "referee.csv"
    panels = []
    for pair in pairs:
        if pair.harness_label is not None:
            s = pair_summary(turns, pair)
            panels.append((f"{pair.engine_label} vs {pair.harness_label}", s["acc_engine"], s["acc_harness"]))
    plot = plot_referee(panels, plots / "referee.png")
    if plot is not None:
        report.paths["plot_referee"] = plot
    return report
