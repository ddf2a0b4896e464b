"""A run that checks its own validity: the conditions under which a run's speed numbers mean what they say.

Each check is a small pure function over what the run recorded (rows of ``load.jsonl``, turn records, the
manifest's configuration) and returns a :class:`Check`: ``pass``, ``fail`` or ``n/a`` (the run or its engine does
not record what the check reads: never a pass by default), with one line saying what was measured against what.

A load run (:mod:`harness.run.load`) is checked, per level, for the ways vllm-project/speculators' load-benchmark
lint names a served benchmark lying (rate not reached, dataset exhausted, window too short, repeats more than 5%
apart, synchronized waves, prefix-cache hits, queueing inside the server), as eight checks:

=================== ==================================================================================================
rate                :func:`rate_reached`: the achieved request rate is within :data:`RATE_SHORTFALL` of the
                    requested one (n/a for ``request_rate: inf``)
concurrency         :func:`concurrency_reached`: the mean number of requests in flight over the level's window is
                    at least 1 - :data:`CONCURRENCY_SHORTFALL` of the concurrency (of the requests, if fewer)
prompts             :func:`prompts_reused`: no entry sends the same prompt twice over its levels (the suites ran out
                    and the levels wrapped round: a prefix cache serves the repeat)
window              :func:`window_vs_warmup`: the ramp (until the level's first ``concurrency`` requests all have
                    their first token) is at most :data:`RAMP_SHARE` of the measurement window
repeats             :func:`repeat_spread`: repeated measurements of the same level are at most :data:`REPEAT_SPREAD`
                    apart (n/a when each level was measured once)
waves               :func:`arrival_waves`: after the level's opening, no :data:`WAVE_SHARE` of the concurrency is
                    sent within :data:`WAVE_GAP_S` of each other (requests that finished on one engine step and were
                    replaced together: a batch benchmark, not arrivals)
prefix cache        :func:`prefix_cache_hits`: the server's prefix cache served at most :data:`PREFIX_HIT_SHARE` of
                    the level's prompt tokens (vLLM's counters diffed around the level; n/a elsewhere)
queue               :func:`server_queue_time`: requests waited in the server's queue at most :data:`QUEUE_SHARE` of
                    their mean latency (vLLM's queue-time histogram around the level; n/a elsewhere)
=================== ==================================================================================================

Every run, harness or load, is checked for its own conditions: :func:`warmup_done` (the run warmed every entry up),
:func:`compile_outside` (no measured turn still compiled), :func:`machine_load` (the machine's 1-minute load
average stayed at or under :data:`LOAD_PER_CPU` per logical CPU) and :func:`interleaving` (several entries measured
one after another only on a machine whose load held steady within :data:`LOAD_DRIFT` per CPU); a harness run with
repeats also :func:`repeat_spread` of each label's tokens/s.

A failed check is a line in the run's summary and report (:func:`validity_markdown`), and ``draftbench compare``
refuses to gate speed on a run that failed one unless given ``--allow-invalid`` (:mod:`harness.gate.compare`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.measure.metrics import level_throughput, level_window

PASS, FAIL, NA = "pass", "fail", "n/a"

# Thresholds. REPEAT_SPREAD is speculators' (repeats more than 5% apart); the others are draftbench's, each chosen
# so that a failure is a visible distortion of the level and said in the constant's comment.
RATE_SHORTFALL = 0.10        # achieved rate below 90% of the requested one: the client or server could not keep up
CONCURRENCY_SHORTFALL = 0.20  # mean in flight below 80% of the concurrency: the level measured a lighter load
RAMP_SHARE = 0.20            # a ramp over a fifth of the window: the level is mostly its own start-up
REPEAT_SPREAD = 0.05         # vllm-project/speculators' lint: repeats more than 5% apart
WAVE_SHARE = 0.5             # half the concurrency sent together after the opening: requests replaced in lockstep
WAVE_GAP_S = 0.01            # sends closer than 10 ms belong to one wave (one engine step is tens of ms on CPU)
PREFIX_HIT_SHARE = 0.25      # a quarter of prompt tokens from cache: more than a shared chat-template prefix
QUEUE_SHARE = 0.10           # queueing over a tenth of a request's latency: the server ran fewer than `concurrency`
LOAD_PER_CPU = 1.0           # load average above the logical CPUs: runnable threads waited for a core (proc(5))
LOAD_DRIFT = 0.5             # per CPU: the load average moved by half the cores during a run measured entry by entry


@dataclass(frozen=True)
class Check:
    """One check's verdict: ``name`` (the table's first column above, or warmup / compile / machine load /
    interleaving), ``status`` (:data:`PASS`, :data:`FAIL`, :data:`NA`), ``detail`` (what was measured against
    what) and ``scope`` (the level, e.g. ``vllm-ngram @ 16``, or "" for the whole run)."""

    name: str
    status: str
    detail: str
    scope: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def line(self) -> str:
        """One line: "FAIL waves (vllm-ngram @ 4): 4 of 4 requests sent within 10 ms ..."."""
        where = f" ({self.scope})" if self.scope else ""
        return f"{self.status.upper()} {self.name}{where}: {self.detail}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _scoped(check: Check, scope: str) -> Check:
    return Check(check.name, check.status, check.detail, scope)


def _ok(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def _window(rows: Sequence[Mapping[str, Any]]) -> float:
    """The rows' level window (:func:`harness.measure.metrics.level_window`)."""
    return level_window([r["sent_s"] for r in rows], [r["finished_s"] for r in rows])


# ---- a load level -----------------------------------------------------------------------------------------------
def rate_reached(rows: Sequence[Mapping[str, Any]], request_rate: float | None) -> Check:
    """Achieved rate ((n - 1) requests over the span of their send times) >= (1 - :data:`RATE_SHORTFALL`) x the
    requested ``request_rate``; n/a for all-at-once (None or inf) or fewer than 2 requests.
    Example: sends at 0, 1, 2, 3 s with 1.0 requested -> pass (1.00/s); at 0, 2, 4, 6 s -> fail (0.50/s)."""
    if request_rate is None or math.isinf(request_rate):
        return Check("rate", NA, "requests sent all at once (request_rate inf): no rate to reach")
    sent = sorted(r["sent_s"] for r in rows)
    if len(sent) < 2 or sent[-1] <= sent[0]:
        return Check("rate", NA, f"{len(sent)} request(s) sent at one moment: no rate measured")
    achieved = (len(sent) - 1) / (sent[-1] - sent[0])
    status = PASS if achieved >= (1 - RATE_SHORTFALL) * request_rate else FAIL
    return Check("rate", status, f"achieved {achieved:.3g} requests/s of {request_rate:g} requested "
                                 f"(at least {1 - RATE_SHORTFALL:.0%})")


def concurrency_reached(rows: Sequence[Mapping[str, Any]], concurrency: int, request_rate: float | None) -> Check:
    """Mean requests in flight (the requests' summed durations over the level's window) >= (1 -
    :data:`CONCURRENCY_SHORTFALL`) x min(``concurrency``, requests); n/a at a finite rate, where the concurrency is
    a cap and the rate sets the load. Example: concurrency 2, two requests each in flight 0-10 s -> pass (2.0);
    one 0-10 s and one 0-2 s -> fail (1.2 of 2)."""
    if request_rate is not None and not math.isinf(request_rate):
        return Check("concurrency", NA, f"at {request_rate:g} requests/s the concurrency is a cap, not the load")
    ok = _ok(rows)
    window = _window(ok)
    if not ok or window <= 0:
        return Check("concurrency", NA, "no successful request: nothing in flight to measure")
    target = min(concurrency, len(ok))
    mean = sum(r["finished_s"] - r["sent_s"] for r in ok) / window
    status = PASS if mean >= (1 - CONCURRENCY_SHORTFALL) * target else FAIL
    return Check("concurrency", status, f"{mean:.2f} requests in flight on average of {target} "
                                        f"(at least {1 - CONCURRENCY_SHORTFALL:.0%})")


def prompts_reused(rows: Sequence[Mapping[str, Any]]) -> Check:
    """No prompt (``question_id``) sent twice by one entry (``label``) over its levels (the levels' latest attempts):
    a repeat finds its prompt in the server's prefix cache. Example: vanilla sends q1 at concurrency 1 and q1 again
    at 2 -> fail; q1 then q2 -> pass."""
    seen: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (str(r["label"]), str(r["question_id"]))
        seen[key] = seen.get(key, 0) + 1
    repeated = sorted(k for k, n in seen.items() if n > 1)
    if not seen:
        return Check("prompts", NA, "no request")
    if repeated:
        label, qid = repeated[0]
        return Check("prompts", FAIL, f"{len(repeated)} prompt(s) sent more than once by one entry (e.g. {qid} by "
                                      f"{label}): the suites ran out and the levels wrapped round")
    return Check("prompts", PASS, f"{len(seen)} requests, every prompt once per entry")


def window_vs_warmup(rows: Sequence[Mapping[str, Any]], concurrency: int) -> Check:
    """The ramp (from the level's first send until its first min(``concurrency``, requests) requests, by send time,
    all have their first token) <= :data:`RAMP_SHARE` of the window (first send to last finish). Example: window
    10 s, ramp 1 s -> pass (10%); window 4 s, ramp 2 s -> fail (50%)."""
    ok = [r for r in _ok(rows) if r.get("prefill_time_s") is not None]
    window = _window(ok)
    if not ok or window <= 0:
        return Check("window", NA, "no successful request with a first-token time")
    first = sorted(ok, key=lambda r: r["sent_s"])[:min(concurrency, len(ok))]
    start = min(r["sent_s"] for r in ok)
    ramp = max(r["sent_s"] + r["prefill_time_s"] for r in first) - start
    status = PASS if ramp <= RAMP_SHARE * window else FAIL
    return Check("window", status, f"ramp {ramp:.2f} s of a {window:.2f} s window ({ramp / window:.0%}; at most "
                                   f"{RAMP_SHARE:.0%})")


def repeat_spread(values: Sequence[float]) -> Check:
    """Repeated measurements of one figure (a level's output tokens/s over its complete attempts, a label's tokens/s
    per repeat) at most :data:`REPEAT_SPREAD` apart: (max - min) / mean; n/a with fewer than two.
    Example: [100, 103] -> pass (3.0%); [100, 110] -> fail (9.5%)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return Check("repeats", NA, "measured once: no spread (repeat the run to measure it)")
    spread = (max(vals) - min(vals)) / statistics.fmean(vals)
    status = PASS if spread <= REPEAT_SPREAD else FAIL
    return Check("repeats", status, f"{len(vals)} repeats {spread:.1%} apart (at most {REPEAT_SPREAD:.0%})")


def arrival_waves(rows: Sequence[Mapping[str, Any]], concurrency: int) -> Check:
    """After the level's opening (its first min(``concurrency``, requests) sends), no group of sends each within
    :data:`WAVE_GAP_S` of the previous holds max(2, :data:`WAVE_SHARE` x ``concurrency``) requests. Example:
    concurrency 4, sends at 0, 0, 0, 0, 5.000, 5.001, 5.002, 5.003 -> fail (4 together at 5.0 s); at 0 x 4, 5.0,
    5.3, 5.9, 6.4 -> pass."""
    sent = sorted(r["sent_s"] for r in rows)
    rest = sent[min(concurrency, len(sent)):]
    if not rest:
        return Check("waves", NA, "every request sent in the level's opening: no later arrivals")
    biggest, run = 1, 1
    for a, b in itertools.pairwise(rest):
        run = run + 1 if b - a < WAVE_GAP_S else 1
        biggest = max(biggest, run)
    limit = max(2, math.ceil(WAVE_SHARE * concurrency))
    status = FAIL if biggest >= limit else PASS
    return Check("waves", status, f"at most {biggest} of {len(rest)} later requests sent within "
                                  f"{WAVE_GAP_S * 1000:g} ms of each other (fails at {limit})")


def prefix_cache_hits(server: Mapping[str, Any] | None) -> Check:
    """The server's prefix-cache hits / queries over the level (``level_server``,
    :func:`harness.run.load.stats_between`) <= :data:`PREFIX_HIT_SHARE`; n/a where the server has no such counters.
    Example: 16 hits of 200 queried tokens -> pass (8%); 150 of 200 -> fail (75%)."""
    hits, queries = (server or {}).get("prefix_cache_hits"), (server or {}).get("prefix_cache_queries")
    if hits is None or not queries:
        return Check("prefix cache", NA, "the server reports no prefix-cache counters")
    share = hits / queries
    status = PASS if share <= PREFIX_HIT_SHARE else FAIL
    return Check("prefix cache", status, f"{share:.0%} of {queries:.0f} prompt tokens served from the prefix cache "
                                         f"(at most {PREFIX_HIT_SHARE:.0%})")


def server_queue_time(server: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> Check:
    """Mean time a request waited in the server's queue (``queue_time_s`` / ``queued_requests`` of
    ``level_server``) <= :data:`QUEUE_SHARE` of the level's mean request latency (send to finish); n/a where the
    server has no queue-time histogram. Example: 0.4 s queued over 4 requests of 5 s each -> pass (2%); 8 s over 4
    -> fail (40%)."""
    total, count = (server or {}).get("queue_time_s"), (server or {}).get("queued_requests")
    ok = _ok(rows)
    if total is None or not count or not ok:
        return Check("queue", NA, "the server reports no queue time")
    queued = total / count
    latency = statistics.fmean(r["finished_s"] - r["sent_s"] for r in ok)
    status = PASS if queued <= QUEUE_SHARE * latency else FAIL
    return Check("queue", status, f"{queued * 1000:.0f} ms queued on average of {latency:.2f} s per request "
                                  f"({queued / latency:.0%}; at most {QUEUE_SHARE:.0%})")


# ---- every run -----------------------------------------------------------------------------------------------------
def warmup_done(warmup: Any) -> Check:
    """The run warmed every entry up (the configuration's ``warmup`` >= 1 question, untimed, through the same code
    path); n/a where the configuration does not say. Example: 1 -> pass; 0 -> fail."""
    if warmup is None:
        return Check("warmup", NA, "the configuration does not say")
    status = PASS if int(warmup) >= 1 else FAIL
    return Check("warmup", status, f"{int(warmup)} untimed warm-up question(s) per entry (at least 1)")


def compile_outside(turn_compile_s: Sequence[float | None]) -> Check:
    """No measured turn still compiled (``turn_compile_s`` > 0: compilation left inside its wall time after the
    runner's retries); n/a when no turn records it. Example: [0, 0] -> pass; [0, 1.5] -> fail."""
    known = [float(x) for x in turn_compile_s if x is not None]
    if not known:
        return Check("compile", NA, "no turn records its compile time")
    inside = [x for x in known if x > 0]
    if inside:
        return Check("compile", FAIL, f"{len(inside)} of {len(known)} measured turns compiled for "
                                      f"{sum(inside):.2f} s inside their wall time")
    return Check("compile", PASS, f"none of {len(known)} measured turns compiled")


def machine_load(load_avg: Sequence[float | None], cpu_count: int | None) -> Check:
    """The machine's 1-minute load average, read at every turn's end or around every level, stayed <=
    :data:`LOAD_PER_CPU` x ``cpu_count`` (a load above the logical CPUs means runnable threads waited for a core,
    the run's own included); n/a without readings. Example: [1.2, 1.9] on 2 CPUs -> pass; [1.2, 3.5] -> fail."""
    vals = [float(x) for x in load_avg if x is not None]
    if not vals or not cpu_count:
        return Check("machine load", NA, "no load average recorded")
    top = max(vals)
    status = PASS if top <= LOAD_PER_CPU * cpu_count else FAIL
    return Check("machine load", status, f"1-min load average {min(vals):.2f} to {top:.2f} on {cpu_count} logical "
                                         f"CPUs (at most {LOAD_PER_CPU * cpu_count:g})")


def interleaving(labels: int, interleaved: bool, load_avg: Sequence[float | None], cpu_count: int | None) -> Check:
    """Several entries measured one after another (not ``interleave``) only while the machine's load held steady:
    the 1-minute load average's range <= :data:`LOAD_DRIFT` x ``cpu_count`` (a drift otherwise falls on whichever
    entry ran last; per CPU, since a few more threads on a many-core host take no core from the run). Pass for one
    entry or an interleaved run; n/a without load readings. Example on 2 CPUs: (2, False, [1.0, 1.4]) -> pass;
    (2, False, [1.0, 2.6]) -> fail; (3, True, []) -> pass."""
    if labels < 2 or interleaved:
        return Check("interleaving", PASS, "interleaved" if labels >= 2 else "one entry")
    vals = [float(x) for x in load_avg if x is not None]
    if not vals or not cpu_count:
        return Check("interleaving", NA, f"{labels} entries one after another, no load average to tell drift")
    drift, limit = max(vals) - min(vals), LOAD_DRIFT * cpu_count
    status = PASS if drift <= limit else FAIL
    return Check("interleaving", status, f"{labels} entries one after another while the load average moved by "
                                         f"{drift:.2f} on {cpu_count} logical CPUs (at most {limit:g}; interleave: "
                                         "true avoids it)")


# ---- a whole run -------------------------------------------------------------------------------------------------
def _config(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    config = manifest.get("config")
    return config if isinstance(config, Mapping) else {}


def _cpus(manifest: Mapping[str, Any]) -> int | None:
    device = manifest.get("device")
    return device.get("cpu_count") if isinstance(device, Mapping) else None


def run_checks(records: Sequence[Mapping[str, Any]], manifest: Mapping[str, Any]) -> list[Check]:
    """A harness run's checks over its turn records (status ok) and manifest: warm-up, compile, machine load,
    interleaving, and each label's tokens/s spread over repeats where it ran several."""
    config, ok = _config(manifest), _ok(records)
    loads = [r.get("load_avg_1m") for r in ok]
    checks = [warmup_done(config.get("warmup")), compile_outside([r.get("turn_compile_s") for r in ok]),
              machine_load(loads, _cpus(manifest)),
              interleaving(len({r["label"] for r in ok}), bool(config.get("interleave")), loads, _cpus(manifest))]
    by_repeat: dict[str, dict[Any, list[tuple[float, float]]]] = {}
    for r in ok:
        by_repeat.setdefault(r["label"], {}).setdefault(r.get("repeat", 0), []).append(
            (r["new_tokens"], r["wall_time_s"]))
    for label, repeats in by_repeat.items():
        if len(repeats) > 1:
            tps = [sum(n for n, _ in v) / sum(t for _, t in v) for v in repeats.values() if sum(t for _, t in v) > 0]
            checks.append(_scoped(repeat_spread(tps), label))
    return checks


def load_checks(rows: Sequence[Mapping[str, Any]], levels: Mapping[tuple[str, int], Sequence[Mapping[str, Any]]],
                manifest: Mapping[str, Any]) -> list[Check]:
    """A load run's checks: per level (``levels``: (label, concurrency) -> its latest attempt's rows) rate,
    concurrency, window, repeats (its complete attempts among ``rows``, every row of ``load.jsonl``), waves, prefix
    cache and queue; over the latest attempts, prompts; over the run, warm-up, machine load (the load averages read
    around the levels) and interleaving."""
    config = _config(manifest)
    latest = [r for level in levels.values() for r in level]
    loads = [x for r in latest for x in (r.get("load_avg_1m") or [])]
    warmup = config.get("warmup", next((r.get("warmup") for r in latest if "warmup" in r), None))
    checks = [warmup_done(warmup), machine_load(loads, _cpus(manifest)),
              interleaving(len({label for label, _ in levels}), bool(config.get("interleave")), loads,
                           _cpus(manifest)),
              prompts_reused(latest)]
    for (label, c), level in levels.items():
        scope = f"{label} @ {c}"
        rate, server = level[0].get("request_rate"), level[0].get("level_server")
        complete = {}
        for r in rows:
            if (r["label"], r["concurrency"]) == (label, c):
                complete.setdefault(r["attempt"], []).append(r)
        attempts = [a for a in complete.values() if len(a) == len(level) and all(r["status"] == "ok" for r in a)]
        tput = [level_throughput([r["new_tokens"] for r in a], [r["sent_s"] for r in a], [r["finished_s"] for r in a])
                for a in attempts]  # a level without a window is NaN, which repeat_spread leaves out
        checks += [_scoped(check, scope) for check in (
            rate_reached(level, rate), concurrency_reached(level, c, rate), window_vs_warmup(level, c),
            repeat_spread(tput), arrival_waves(level, c), prefix_cache_hits(server), server_queue_time(server, level))]
    return checks


def failed(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if c.failed]


def validity_markdown(checks: Sequence[Check], gated: bool = True) -> str:
    """The summary's "Validity" section: how many checks passed, failed, were n/a, then one line per failed check
    and one per check that was n/a (its scopes counted, its first reason), so a reader sees what was not checked.
    ``gated``: the run is one ``draftbench compare`` reads (a harness run), whose refusal the section states."""
    if not checks:
        return ""
    count = {s: sum(c.status == s for c in checks) for s in (PASS, FAIL, NA)}
    refusal = ("; `draftbench compare` refuses to gate speed on a run that failed one unless given --allow-invalid"
               if gated else "")
    lines = ["## Validity", "",
             f"{count[PASS]} checks passed, {count[FAIL]} failed, {count[NA]} n/a (harness.measure.validity{refusal}).",
             ""]
    lines += [f"- {c.line()}" for c in checks if c.failed]
    unchecked: dict[str, list[Check]] = {}
    for c in checks:
        if c.status == NA:
            unchecked.setdefault(c.name, []).append(c)
    for name, group in unchecked.items():
        where = f" ({len(group)} levels)" if len(group) > 1 else (f" ({group[0].scope})" if group[0].scope else "")
        lines.append(f"- N/A {name}{where}: {group[0].detail}")
    return "\n".join(lines) + "\n"
