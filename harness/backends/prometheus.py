"""A served engine's speculative counters, read from its ``/metrics``: the Prometheus text exposition format, or
``trtllm-serve``'s JSON iteration statistics.

:func:`parse_exposition` reads the format (one sample a line: ``name{label="value",...} number [timestamp]``;
``#`` lines are comments, ``# HELP`` / ``# TYPE``); :func:`read_counters` picks the acceptance counters out of it,
summed over every label set (engines, model names) except a draft position's ``position`` label; :func:`diff` takes
two readings, before and after one request at concurrency 1. A counter the server does not expose is None (n/a),
never 0, in a reading and in a difference.

The counters, by engine (the names the engines' own documentation and source give):

* vLLM (``vllm serve``, v1 engine; ``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``):
  ``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total``
  (one sample per ``position`` label, 0-based: drafts whose token at that position was accepted);
* llama.cpp's ``llama-server --metrics`` (read live from a build of ggml-org/llama.cpp commit 0c1e570, the copy
  vendored in llama-cpp-python 0.3.36; ``tools/server/server-task.cpp``): the same four names under the
  ``llamacpp:`` prefix, ``llamacpp:spec_decode_num_drafts_total`` (verification steps),
  ``llamacpp:spec_decode_num_draft_tokens_total``, ``llamacpp:spec_decode_num_accepted_tokens_total`` and
  ``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}``, each request's counts added when it
  ends; the per-position counter appears only after the server's first drafting step (before it, with no drafts,
  it is read as no positions, ``[]``); without speculation only throughput counters such as
  ``llamacpp:tokens_predicted_total``. Values are printed with 6 significant digits, so a counter past 999,999
  (``1.23457e+06``) no longer diffs exactly;
* SGLang (``sglang.launch_server --enable-metrics``; read in the source of its 0.5.23 wheel,
  ``srt/observability/metrics_collector.py``): ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` are
  gauges (running means), which cannot be diffed around one request, and ``sglang:spec_verify_calls_total``
  counts verification forwards with no accepted tokens beside it: n/a here; the served client reads each request's
  own ``spec_tokens_details`` instead (:func:`harness.backends.replies.sglang_steps`);
* ``trtllm-serve`` (NVIDIA/TensorRT-LLM; read in its source and tested against a fake server only
  (tests/support/fake_openai_server.py), not run here: it needs an NVIDIA GPU): its
  ``/metrics`` is not the exposition format but a JSON array of engine iterations (:func:`read_trtllm`), those
  queued since the previous read, which the read removes (``docs/source/commands/trtllm-serve/trtllm-serve.rst``
  at commit 0434755; ``get_iteration_stats`` in ``tensorrt_llm/serve/openai_server.py`` at 0005772 drains
  ``get_stats_async``), and only with ``enable_iter_perf_stats: true`` in its ``--config`` (else ``[]``). Each
  iteration of a speculating server has a ``specDecodingStats`` object (``null`` without speculation; keys from
  ``_iteration_report`` in ``tensorrt_llm/executor/iteration_stats.py`` at b117901, the C++ ``SpecDecodingStats``
  of ``cpp/include/tensorrt_llm/executor/types.h``), summed over the iteration's generation requests
  (``_update_iter_stats`` in ``tensorrt_llm/_torch/pyexecutor/py_executor.py``): ``numRequestsWithDraftTokens``
  (requests that drafted: draftbench's drafts), ``numDraftTokens`` (their drafted tokens), ``numAcceptedTokens``
  (their accepted ones) and ``acceptanceLength`` ((accepted + requests) / requests, not read). No per-position
  counter: ``accepted_per_pos`` is n/a. Since every read drains, a reading is not a total to diff: the client
  keeps the iterations it read and sums those between two readings (:func:`trtllm_counters`). Its Prometheus
  endpoint (``/prometheus/metrics``, with ``return_perf_metrics``; ``tensorrt_llm/metrics/collector.py`` at
  050f80d) has ``trtllm_spec_decode_num_draft_tokens_total`` and ``trtllm_spec_decode_num_accepted_tokens_total``,
  but fed only the latest iteration of each drain of that same queue (``_iteration_stats_collector_loop``), so
  they undercount, and that collector takes iterations from ``/metrics`` too; not read.

Besides the acceptance counters, :func:`read_server_stats` reads what a load level's validity checks need
(:mod:`harness.measure.validity`) from vLLM (``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``): the prefix
cache's ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (prompt tokens looked up and found
in the cache) and the histogram ``vllm:request_queue_time_seconds`` (``_sum``, ``_count``: seconds requests waited
in the scheduler's queue before their first step). Other servers: None (n/a). And :func:`read_iterations` reads
vLLM's engine iterations: the histogram
``vllm:iteration_tokens_total`` (vLLM 0.32's ``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``, labels
``model_name`` and ``engine``), whose ``vllm:iteration_tokens_total_count`` sample counts the engine steps that gave
some request a token: ``record`` observes it only with the step's ``IterationStats``, which the server's output
loop (``vllm/v1/engine/async_llm.py``) makes only for a step with outputs, and the scheduler emits no output for a
chunked prefill's partial chunks (``should_emit_output`` in ``vllm/v1/core/sched/scheduler.py``). At concurrency 1
its difference around a request is the request's target forwards with the prefill counted once, chunked or not.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

# draftbench's counter -> the metric names that carry it, first found wins
COUNTERS: dict[str, tuple[str, ...]] = {
    "drafts": ("vllm:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_drafts_total"),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total"),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total"),
    "accepted_per_pos": ("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                         "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"),
}
ITERATIONS = "vllm:iteration_tokens_total_count"  # vLLM's engine steps that gave a token so far (a histogram's count)
SERVERS = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llama.cpp"}  # metric prefix -> the server it names
TRTLLM = "trtllm-serve"  # the server whose /metrics is a JSON array of iterations
# draftbench's counter -> the key of trtllm-serve's per-iteration ``specDecodingStats`` that carries it
TRTLLM_FIELDS = {"drafts": "numRequestsWithDraftTokens", "draft_tokens": "numDraftTokens",
                 "accepted_tokens": "numAcceptedTokens"}

# the deepest draft position kept (a ``position`` label past it is refused: a list that long is built from it)
MAX_DRAFT_POSITIONS = 1024


class CounterError(ValueError):
    """A reading in the format whose counter cannot be one (negative, not a whole number, NaN, a position past
    :data:`MAX_DRAFT_POSITIONS`) or that went backwards: the message names the metric and the value."""


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition, in order: (metric name, labels, value).

    Example: '# TYPE a counter\\na_total{engine="0",position="1"} 3.0\\nb 2' ->
    [("a_total", {"engine": "0", "position": "1"}, 3.0), ("b", {}, 2.0)]. A line that is not a sample (not the
    format) is a ValueError naming it.
    """
    return list(_samples(text))


def _samples(text: str, names: frozenset[str] | None = None) -> Iterator[tuple[str, dict[str, str], float]]:
    """:func:`parse_exposition` lazily, every line checked, but only the samples of ``names`` (all where None)
    parsed and yielded: a reading's unrelated metrics cost no memory."""
    for number, line in enumerate(io.StringIO(text), 1):
        line = line.rstrip("\r\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            raise ValueError(f"line {number} is not a Prometheus sample: {line[:80]!r}")
        name, raw_labels, raw_value = m.groups()
        if names is not None and name not in names:
            continue
        labels = {}
        if raw_labels:
            pos = 0
            while pos < len(raw_labels):
                lm = _LABEL.match(raw_labels, pos)
                if lm is None:
                    raise ValueError(f"line {number} has malformed labels: {line[:80]!r}")
                labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                pos = lm.end()
        try:
            value = float(raw_value)
        except ValueError:
            raise ValueError(f"line {number} has no number: {line[:80]!r}") from None
        yield name, labels, value


def _counted(name: str, labels: dict[str, str], value: float) -> float:
    """A counter sample's value, a :class:`CounterError` naming it unless it is finite and >= 0."""
    if not math.isfinite(value) or value < 0:
        shown = ",".join(f'{k}="{v[:20]}"' for k, v in labels.items())
        raise CounterError(f"{name}{{{shown}}} is {value!r}, not a count")
    return value


def _whole(name: str, total: float) -> int:
    """A counter's sum over label sets as an int; a :class:`CounterError` unless it is a whole number."""
    if total != int(total):
        raise CounterError(f"{name} is {total!r}, not a whole count")
    return int(total)


def _position(name: str, label: str) -> int:
    """A ``position`` label as an index, 0 to :data:`MAX_DRAFT_POSITIONS` - 1; a :class:`CounterError` otherwise."""
    if not (label.isascii() and label.isdigit() and len(label) <= 6) or int(label) >= MAX_DRAFT_POSITIONS:
        raise CounterError(f'{name}{{position="{label[:20]}"}}: not a draft position (0 to '
                           f"{MAX_DRAFT_POSITIONS - 1})")
    return int(label)


def read_counters(text: str) -> dict[str, int | list[int] | None]:
    """The acceptance counters of one ``/metrics`` reading (:data:`COUNTERS`): ints summed over label sets, the
    per-position counter a list by ``position`` (0, 1, ...); None for what the reading lacks, except the
    per-position counter of a reading with 0 drafts, which is ``[]`` (nothing accepted anywhere yet; llama.cpp
    prints that counter only once it has drafted). A value that cannot be a counter (NaN, infinite, negative, a
    sum that is not whole) or a ``position`` that is no index below :data:`MAX_DRAFT_POSITIONS` is a
    :class:`CounterError` naming the sample; a text that is not the format, a ValueError.

    Example: 'vllm:spec_decode_num_drafts_total{engine="0"} 4\\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 1\\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\\n' ->
    {"drafts": 4, "draft_tokens": None, "accepted_tokens": None, "accepted_per_pos": [3, 1]}.
    """
    wanted = frozenset(n for names in COUNTERS.values() for n in names)
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in _samples(text, wanted):
        by_name.setdefault(name, []).append((labels, _counted(name, labels, value)))
    out: dict[str, int | list[int] | None] = dict.fromkeys(COUNTERS)
    for key, names in COUNTERS.items():
        name = next((n for n in names if n in by_name), None)
        if name is None:
            continue
        if key == "accepted_per_pos":
            per: dict[int, float] = {}
            for labels, value in by_name[name]:
                pos = _position(name, labels.get("position", "0"))
                per[pos] = per.get(pos, 0.0) + value
            out[key] = [_whole(f'{name}{{position="{i}"}}', per.get(i, 0.0)) for i in range(max(per) + 1)]
        else:
            out[key] = _whole(name, sum(value for _, value in by_name[name]))
    if out["drafts"] == 0 and out["accepted_per_pos"] is None:
        out["accepted_per_pos"] = []
    return out


def diff(before: dict, after: dict) -> dict[str, int | list[int] | None]:
    """``after - before`` per counter (per position for lists); None where either reading lacks it. A counter that
    went backwards (a server restarted, or reset its counters) is a :class:`CounterError` naming it: a negative
    difference is no request's count.
    Example: ({"drafts": 2, "accepted_per_pos": [1, 0]}, {"drafts": 5, "accepted_per_pos": [3, 1]}) ->
    {"drafts": 3, "accepted_per_pos": [2, 1]}; ({"drafts": 5}, {"drafts": 2}) -> CounterError."""
    def minus(key, a, b):
        if a is None or b is None:
            return None
        if isinstance(a, list):
            if len(b) > len(a):
                raise CounterError(f"the counter {key} went backwards: positions {len(a)} to {len(b) - 1} vanished")
            b = b + [0] * (len(a) - len(b))  # a position first seen in this request
            return [minus(f"{key}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b, strict=True))]
        if a < b:
            raise CounterError(f"the counter {key} went backwards, from {b} to {a}")
        return a - b

    return {k: minus(k, after.get(k), before.get(k)) for k in after}


def server_kind(text: str) -> str | None:
    """Which server a ``/metrics`` reading comes from, by its metric prefixes (``vllm``, ``sglang``,
    ``llama.cpp``), or ``trtllm-serve`` for a JSON array (:data:`TRTLLM`; ``[]`` too: a server without
    ``enable_iter_perf_stats``, or with nothing queued); None when none is known."""
    if text.lstrip().startswith("["):
        try:
            return TRTLLM if isinstance(json.loads(text), list) else None
        except ValueError:
            return None
    for prefix, server in SERVERS.items():
        if re.search(rf"^{re.escape(prefix)}", text, re.MULTILINE):
            return server
    return None


def read_iterations(text: str) -> int | None:
    """vLLM's engine iterations so far in one ``/metrics`` reading (:data:`ITERATIONS`, summed over engines and
    models); None where the reading lacks it (not a vLLM server); a :class:`CounterError` for a value that cannot
    be a count.
    Example: 'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 41.0\n'
    'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 97.0\n' -> 41."""
    counts = [_counted(name, labels, value) for name, labels, value in _samples(text, frozenset([ITERATIONS]))]
    return _whole(ITERATIONS, sum(counts)) if counts else None


# a load level's server statistic -> the vLLM sample that carries it (summed over engines and models)
SERVER_STATS = {"prefix_cache_queries": "vllm:prefix_cache_queries_total",
                "prefix_cache_hits": "vllm:prefix_cache_hits_total",
                "queue_time_s": "vllm:request_queue_time_seconds_sum",
                "queued_requests": "vllm:request_queue_time_seconds_count"}


def read_server_stats(text: str) -> dict[str, float | None]:
    """The server statistics of one ``/metrics`` reading (:data:`SERVER_STATS`), each summed over its label sets;
    None for one the reading lacks; a :class:`CounterError` for a value that cannot be a count or a sum of seconds.
    Example: 'vllm:prefix_cache_queries_total{engine="0"} 120\nvllm:prefix_cache_hits_total{engine="0"} 16\n' ->
    {"prefix_cache_queries": 120.0, "prefix_cache_hits": 16.0, "queue_time_s": None, "queued_requests": None}."""
    found: dict[str, float] = {}
    for name, labels, value in _samples(text, frozenset(SERVER_STATS.values())):
        found[name] = found.get(name, 0.0) + _counted(name, labels, value)
    return {key: found.get(name) for key, name in SERVER_STATS.items()}


class TrtllmIteration(NamedTuple):
    """What the client keeps of one of trtllm-serve's iterations: its ``iter`` id, its ``specDecodingStats`` as
    draftbench's counters (:data:`TRTLLM_FIELDS`, None for a key it lacks; the whole None for an iteration without
    them) and its generation requests (``inflightBatchingStats.numGenRequests``; None where absent)."""

    iter: int | None
    spec: dict[str, int | None] | None
    gen_requests: int | None


def _count(obj: dict[str, Any], key: str, where: str) -> int | None:
    """A non-negative whole number at ``obj[key]``, None where the key is absent; a ValueError for anything else."""
    value = obj.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            or value != int(value)):
        raise ValueError(f"{where} {key} is {value!r}, not a count")
    return int(value)


def read_trtllm(text: str) -> list[TrtllmIteration]:
    """The iterations of one of trtllm-serve's ``/metrics`` readings (a JSON array of iteration objects, those
    queued since the previous read), in order. Anything else is a ValueError saying what: not JSON, not an array of
    objects, a ``specDecodingStats`` that is not an object, a count that is not a whole number >= 0.

    Example: '[{"iter": 7, "inflightBatchingStats": {"numGenRequests": 1}, "specDecodingStats":
    {"numDraftTokens": 4, "numAcceptedTokens": 3, "numRequestsWithDraftTokens": 1, "acceptanceLength": 4.0}},
    {"iter": 8, "specDecodingStats": null}]' -> [TrtllmIteration(7, {"drafts": 1, "draft_tokens": 4,
    "accepted_tokens": 3}, 1), TrtllmIteration(8, None, None)].
    """
    try:
        rows = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({getattr(e, 'msg', e)} at character {getattr(e, 'pos', '?')}): "
                         f"{text.strip()[:80]!r}") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"not a JSON array of iteration objects: {text.strip()[:80]!r}")
    out = []
    for i, row in enumerate(rows):
        where = f"iteration {row.get('iter', f'#{i}')}:"
        spec = row.get("specDecodingStats")
        if spec is not None and not isinstance(spec, dict):
            raise ValueError(f"{where} specDecodingStats is {spec!r}, not an object")
        batching = row.get("inflightBatchingStats")
        gen = _count(batching, "numGenRequests", where + " inflightBatchingStats") if isinstance(
            batching, dict) else None
        counts = None if spec is None else {
            key: _count(spec, name, where + " specDecodingStats") for key, name in TRTLLM_FIELDS.items()}
        out.append(TrtllmIteration(_count(row, "iter", where), counts, gen))
    return out


def trtllm_counters(iterations: list[TrtllmIteration]) -> dict[str, int | list[int] | None]:
    """draftbench's acceptance counters over trtllm-serve iterations (those read between two readings): each of
    :data:`TRTLLM_FIELDS` summed over the iterations with ``specDecodingStats``, None where none has them (an empty
    list, a server without speculation) or one lacks the key; ``accepted_per_pos`` always None (trtllm-serve counts
    no acceptance per position). Example: [TrtllmIteration(7, {"drafts": 1, "draft_tokens": 4,
    "accepted_tokens": 3}, 1), TrtllmIteration(8, None, 1), TrtllmIteration(9, {"drafts": 0, "draft_tokens": 0,
    "accepted_tokens": 0}, 0)] -> {"drafts": 1, "draft_tokens": 4, "accepted_tokens": 3, "accepted_per_pos": None};
    [] -> all None."""
    specs = [it.spec for it in iterations if it.spec is not None]
    out: dict[str, int | list[int] | None] = dict.fromkeys(COUNTERS)
    for key in TRTLLM_FIELDS:
        values = [spec[key] for spec in specs]
        out[key] = sum(values) if values and None not in values else None
    return out
