"""Load levels: many requests in flight on a served engine (``engine: openai``), one level per concurrency.

A run with a ``load:`` block measures load levels instead of one question at a time::

    load: {concurrency: [1, 4, 16, 64], request_rate: inf, burstiness: 1.0, num_prompts: 32}

For every method entry (each must run on ``engine: openai``; pair a speculative entry with a ``vanilla`` one on
the same kind of server for the speed-up) and every concurrency c, one level: ``num_prompts`` requests (default
2 c), each the first turn of a distinct question, issued as vLLM's ``benchmark_serving`` (``vllm bench serve``)
issues them: at most c in flight (``--max-concurrency``), sent at ``request_rate`` requests per second
(``--request-rate``; ``inf``, the default, sends them all at once) with inter-arrival gaps drawn from a gamma
distribution of shape ``burstiness`` and scale 1 / (rate x burstiness) (``--burstiness``; 1.0 is a Poisson
process, lower is burstier, higher more regular; :func:`arrival_offsets`). A thread pool of c workers runs the
requests through the served client (:meth:`harness.backends.served.ServedBackend.stream`); nothing else is
scheduled here.

Prompts are not repeated inside a level (a server's prefix cache would serve the repeat from cache and inflate the
level): a level that needs more requests than the run's suites have questions is refused before anything loads.
Across levels the prompts move on: level i takes the questions after those of level i - 1, wrapping round to the
first question when the suites run out (:func:`level_questions`), so consecutive levels do not repeat prompts while
the suites last; every entry gets the same prompts at the same level (the speed-up is paired by prompt).

Acceptance at concurrency > 1 cannot be split by request from the server's counters: the Prometheus counters are
read before the level's first request and after its last (:meth:`ServedBackend.settled_counters`) and what
they moved by (:meth:`ServedBackend.counters_between`; from trtllm-serve, the sums of its iterations read between
the two) is stored with every row of the level (``level_counters``); per-request steps are kept where the server
sends them (vLLM's ``--per-request-spec-decode-metrics detailed``), and so are a request's own drafted and
accepted totals (llama.cpp's per-request ``timings``, :func:`harness.backends.replies.request_totals`) as the row's
``engine_counters`` (None where the server sends none).

A llama.cpp server decodes at most its slots' requests at once (``llama-server --parallel N``, ``total_slots`` in
its ``/props``; the build tried here makes 4 when not told) and queues the rest, which would measure a level below
its concurrency: an entry whose ``engine_options`` give ``parallel`` below the highest concurrency is refused with
the run's configuration, and one whose server reports fewer slots is refused once the servers run, before any level
(:func:`harness.run.config.check_slots`). llama.cpp's counters sum over its slots, and its per-request ``timings``
partition them: the rows' ``engine_counters`` of a level add up to its ``level_counters``.

Entries run one after another, every level of one before the next, or, with the run's ``interleave: true``, level
by level with the entries' order reversed on every other level (:func:`load_order`): on a shared machine whose load
drifts, the entry measured last is otherwise the one the drift hits (a llama.cpp sweep measured 0.98-1.05x with the
speculative entry first and 0.48-0.64x with it second, at the same acceptance).

Every level's rows also keep what its validity checks read (:mod:`harness.measure.validity`): the server's
prefix-cache and queue-time statistics diffed around the level (``level_server``, :func:`server_stats`,
:func:`stats_between`; None where the server has none), the machine's 1-minute load average before and after it
(``load_avg_1m``) and the run's ``warmup``.

Rows go to ``load.jsonl`` (:data:`harness.measure.rundir.LOAD_FILE`), one per request, a level's rows written
together once it ends; a level whose rows are not all successful (a failed request, or a run stopped mid-level) is
measured again on ``--resume`` as a new attempt, and the report reads each level's latest attempt
(:func:`harness.report.load.latest_levels`).
"""

from __future__ import annotations

import concurrent.futures
import math
import time
import uuid
from typing import Any

import numpy as np

from harness.backends.contract import STOP_REASONS, BackendError, TurnRequest, engine_fields
from harness.backends.exchange import http_get
from harness.backends.prometheus import TRTLLM, read_server_stats
from harness.backends.replies import request_totals
from harness.measure import env
from harness.measure.metrics import level_window
from harness.measure.records import RecordStore
from harness.measure.rundir import LOAD_FILE
from harness.measure.trackers import load_average
from harness.report.load import latest_levels, read_load_rows
from harness.run.config import ConfigError, LoadSpec, check_slots
from harness.run.entries import token_budget


def arrival_offsets(n: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """When each of ``n`` requests is due, in seconds from the level's start, as vLLM's ``benchmark_serving``
    draws them: gaps from a gamma distribution of shape ``burstiness`` and scale 1 / (``request_rate`` x
    ``burstiness``) (mean gap 1 / rate whatever the burstiness; shape 1 is the exponential gap of a Poisson
    process), the first request at 0; every request at 0 when the rate is inf. ``seed`` makes the draw
    reproducible. Example: (3, inf, 1.0, 0) -> [0.0, 0.0, 0.0]; (3, 2.0, 1.0, 0) -> [0.0, g1, g1 + g2] with the
    g exponential of mean 0.5 s.
    """
    if math.isinf(request_rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (request_rate * burstiness), size=max(n - 1, 0))
    return [0.0] + [float(x) for x in np.cumsum(gaps)]


def level_questions(spec: LoadSpec, questions: list) -> list[list]:
    """The questions of each level (in the order of ``spec.concurrency``): level i takes the next
    ``requests_at(c)`` questions after level i - 1's, wrapping round to the first when the list runs out, so no
    level repeats a prompt. A level that needs more requests than there are questions is a :class:`ConfigError`.
    Example: 5 questions a..e, concurrency [1, 2] with 2 x c requests -> [[a, b], [c, d, e, a]]."""
    out, start = [], 0
    for c in spec.concurrency:
        n = spec.requests_at(c)
        if n > len(questions):
            raise ConfigError(f"run.load: the level at concurrency {c} needs {n} distinct prompts and the run's "
                              f"suites have {len(questions)} questions; prompts are not repeated inside a level "
                              "(set load.num_prompts, lower the concurrency or add questions)")
        out.append([questions[(start + i) % len(questions)] for i in range(n)])
        start = (start + n) % len(questions)
    return out


def run_load(config, run_dir, target, suites: list, entries: dict, say, warm_up, seed_of) -> None:
    """Every load level of the run not yet complete in ``run_dir``, in :func:`load_order` (entry by entry, or with
    the run's ``interleave`` level by level; every entry (:class:`harness.run.entries.BackendEntry`) warmed up first
    with ``warm_up(entry)``, through the same client); ``seed_of(question_id)``: a request's sampling seed
    (:func:`harness.run.runner.question_seed`). A request's budget is :func:`harness.run.entries.token_budget`'s."""
    spec = config.load_spec()
    # the slots a llama.cpp server reported (/props), given or not: before any level is measured
    check_slots(max(spec.concurrency), {label: getattr(e.backend, "slots", None) for label, e in entries.items()})
    questions = [(suite, q) for suite in suites for q in suite.questions]
    plan = level_questions(spec, questions)
    store = RecordStore(run_dir, file_name=LOAD_FILE)
    done = {key for key, rows in latest_levels(read_load_rows(run_dir)).items()
            if all(r["status"] == "ok" for r in rows) and len(rows) == spec.requests_at(key[1])}
    temperature, seed = config.temperatures[0], config.seeds[0]
    pending = [label for label in entries if not all((label, c) in done for c in spec.concurrency)]
    for label in pending:
        with say.phase(f"warming up {label}"):
            warm_up(entries[label])
    for label, level, c, picked in load_order(pending, spec.concurrency, plan, config.interleave):
        if (label, c) in done:
            continue
        entry = entries[label]
        requests = []
        for suite, q in picked:
            user = [{"role": "user", "content": q.turns[0]}]
            system = [{"role": "system", "content": suite.system_prompt}] if suite.system_prompt else []
            prompt_ids = target.render_chat(user, suite.system_prompt)[0].tolist()
            budget = token_budget(config.max_new_tokens, suite.max_new_tokens, len(prompt_ids),
                                  getattr(target.config, "max_position_embeddings", None))
            requests.append(TurnRequest(system + user, prompt_ids, budget, temperature, config.top_p, config.top_k,
                                        seed_of(q.question_id)))
        offsets = arrival_offsets(len(requests), spec.request_rate, spec.burstiness, seed + level)
        before, load_before = server_stats(entry.backend), load_average()
        with say.phase(f"{label}: concurrency {c}, {len(requests)} requests"):
            results, window, counters = run_level(entry.backend, requests, c, offsets)
        server = stats_between(before, server_stats(entry.backend))
        common = {
            "run_id": run_dir.name, "attempt": uuid.uuid4().hex[:16], "method": entry.name, "label": label,
            "lossless": entry.lossless, "turn": 0, "method_options": entry.method_options,
            "target": target.name, "temperature": temperature, "top_p": config.top_p, "seed": seed,
            "concurrency": c, "request_rate": None if math.isinf(spec.request_rate) else spec.request_rate,
            "burstiness": spec.burstiness, "level": level, "num_prompts": len(requests),
            "level_wall_s": window, "level_counters": counters, "level_server": server,
            "load_avg_1m": [load_before, load_average()], "warmup": config.warmup,
            **engine_fields(entry.backend, entry.backend.speculative),
        }
        store.append([{**common, **_row(result, suite, q, target)}
                      for result, (suite, q) in zip(results, picked, strict=True)])


def server_stats(backend) -> dict[str, float | None] | None:
    """A served engine's prefix-cache and queue-time statistics now
    (:func:`harness.backends.prometheus.read_server_stats` of its ``/metrics``), for a level's validity checks;
    None (n/a, never a failed level) for a backend without Prometheus counters (trtllm-serve's JSON iterations
    included) or a reading that fails."""
    if not getattr(backend, "has_metrics", False) or getattr(backend, "server_kind", None) == TRTLLM:
        return None
    try:
        status, text = http_get(backend.endpoint + "/metrics", backend.timeout)
        return read_server_stats(text) if status == 200 else None
    except (BackendError, ValueError):
        return None


def stats_between(before: dict | None, after: dict | None) -> dict[str, float | None] | None:
    """What a server's statistics (:func:`server_stats`) moved by around a
    level: ``after - before`` per statistic, None where either reading lacks it or it went backwards (a server
    restarted: no level's figure); None without two readings.
    Example: ({"prefix_cache_hits": 16.0, "queue_time_s": None}, {"prefix_cache_hits": 48.0, "queue_time_s": 0.5})
    -> {"prefix_cache_hits": 32.0, "queue_time_s": None}."""
    if before is None or after is None:
        return None
    return {k: None if before.get(k) is None or v is None or v < before[k] else v - before[k]
            for k, v in after.items()}


def load_order(labels: list[str], concurrency: list[int], plan: list[list], interleave: bool) -> list[tuple]:
    """The order of a run's load levels, as ``(label, level index, concurrency, questions)``: entry by entry (every
    level of the first entry, then the next), or with ``interleave`` level by level, the entries' order reversed on
    every other level (A B, B A, A B, ...), so that a machine's load drifting during the run falls on every entry
    alike instead of on whichever ran last.

    Example: (["v", "s"], [1, 4], [q1, q4], True) -> [("v", 0, 1, q1), ("s", 0, 1, q1), ("s", 1, 4, q4),
    ("v", 1, 4, q4)]; with False -> [("v", 0, 1, q1), ("v", 1, 4, q4), ("s", 0, 1, q1), ("s", 1, 4, q4)].
    """
    levels = list(enumerate(zip(concurrency, plan, strict=True)))
    if not interleave:
        return [(label, i, c, picked) for label in labels for i, (c, picked) in levels]
    return [(label, i, c, picked) for i, (c, picked) in levels
            for label in (labels if i % 2 == 0 else labels[::-1])]


def run_level(backend, requests: list[TurnRequest], concurrency: int, offsets: list[float]):
    """Issue ``requests`` through ``backend`` (a :class:`harness.backends.served.ServedBackend`) with at most
    ``concurrency`` in flight, each sent no earlier than its offset (seconds from the level's start).
    Returns (per request (sent_s, finished_s, turn or None, per-request metrics, error or None), the level's wall
    window in seconds, the server's counters diffed around the level or None without counters). Counters that
    cannot be read around the level (went backwards, NaN, over a cap: :meth:`ServedBackend.counters_between`) make
    every request's row an error naming them, its measured turn kept: the level is not aborted, and ``--resume``
    measures it again. Each request is bounded by the backend's ``timeout_s`` (its whole turn)."""
    counter_error = None  # a level whose counters cannot be read: every row an error (measured again on resume)
    try:
        before = backend.settled_counters() if backend.has_metrics else None
    except BackendError as e:
        before, counter_error = None, str(e)
    start = time.perf_counter()

    def one(request: TurnRequest):
        sent = time.perf_counter() - start
        try:
            turn, per_request = backend.stream(request)
            return sent, time.perf_counter() - start, turn, per_request, None
        except Exception as exc:  # one failed request is one error row; the level goes on
            return sent, time.perf_counter() - start, None, {}, f"{type(exc).__name__}: {exc}"

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="load")
    try:
        futures = []
        for request, due in zip(requests, offsets, strict=True):
            time.sleep(max(0.0, due - (time.perf_counter() - start)))
            futures.append(pool.submit(one, request))
        results = [f.result() for f in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    window = level_window([r[0] for r in results], [r[1] for r in results])
    counters = None
    if before is not None:
        try:
            counters = backend.counters_between(before, backend.settled_counters())
        except BackendError as e:
            counter_error = str(e)
    if counter_error is not None:
        results = [(*r[:4], r[4] or f"BackendError: the level's counters: {counter_error}") for r in results]
    return results, window, counters


def _row(result, suite, q, target) -> dict[str, Any]:
    """The fields of one request's row that are its own."""
    sent, finished, turn, per_request, error = result
    row = {"status": "ok" if error is None else "error", "error": error, "suite": suite.name,
           "suite_version": suite.version, "question_id": str(q.question_id), "category": q.category,
           "sent_s": sent, "finished_s": finished, "timestamp": env.now_iso()}
    if turn is None:
        return row
    accepted, drafted = per_request.get("per_step_accepted"), per_request.get("per_step_drafted")
    steps = isinstance(accepted, list) and isinstance(drafted, list) and len(accepted) == len(drafted)
    totals = request_totals(per_request)
    return {**row, "new_tokens": turn.emitted(),
            "wall_time_s": turn.wall_time_s, "prefill_time_s": turn.ttft_s,
            "stop_reason": STOP_REASONS.get(turn.stop_reason or "", turn.stop_reason),
            "output_ids": turn.token_ids, "output_text": turn.text if turn.token_ids is None
            else target.decode(turn.token_ids), "token_times_s": turn.token_times_s,
            "accepted_drafts": [int(a) for a in accepted] if steps else None,
            "draft_depths": [int(d) for d in drafted] if steps else None, "engine_notes": list(turn.notes),
            "engine_counters": None if totals is None else dict(zip(("draft_tokens", "accepted_tokens"), totals,
                                                                    strict=True))}
