"""A served engine's speculative counters, read from its Prometheus ``/metrics`` (the text exposition format).

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
  own ``spec_tokens_details`` instead (:func:`harness.backends.served.sglang_steps`);
* ``trtllm-serve`` (``docs/source/commands/trtllm-serve.rst`` of NVIDIA/TensorRT-LLM): its ``/metrics`` is JSON
  iteration statistics, not the exposition format: n/a.

Besides the acceptance counters, :func:`read_iterations` reads vLLM's engine iterations: the histogram
``vllm:iteration_tokens_total`` (vLLM 0.32's ``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``, labels
``model_name`` and ``engine``), whose ``vllm:iteration_tokens_total_count`` sample counts the engine steps that gave
some request a token: ``record`` observes it only with the step's ``IterationStats``, which the server's output
loop (``vllm/v1/engine/async_llm.py``) makes only for a step with outputs, and the scheduler emits no output for a
chunked prefill's partial chunks (``should_emit_output`` in ``vllm/v1/core/sched/scheduler.py``). At concurrency 1
its difference around a request is the request's target forwards with the prefill counted once, chunked or not.
"""

from __future__ import annotations

import math
import re

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

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition, in order: (metric name, labels, value).

    Example: '# TYPE a counter\\na_total{engine="0",position="1"} 3.0\\nb 2' ->
    [("a_total", {"engine": "0", "position": "1"}, 3.0), ("b", {}, 2.0)]. A line that is not a sample (not the
    format) is a ValueError naming it.
    """
    samples = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            raise ValueError(f"line {number} is not a Prometheus sample: {line[:80]!r}")
        name, raw_labels, raw_value = m.groups()
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
        samples.append((name, labels, value))
    return samples


def read_counters(text: str) -> dict[str, int | list[int] | None]:
    """The acceptance counters of one ``/metrics`` reading (:data:`COUNTERS`): ints summed over label sets, the
    per-position counter a list by ``position`` (0, 1, ...); None for what the reading lacks, except the
    per-position counter of a reading with 0 drafts, which is ``[]`` (nothing accepted anywhere yet; llama.cpp
    prints that counter only once it has drafted).

    Example: 'vllm:spec_decode_num_drafts_total{engine="0"} 4\\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 1\\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\\n' ->
    {"drafts": 4, "draft_tokens": None, "accepted_tokens": None, "accepted_per_pos": [3, 1]}.
    """
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in parse_exposition(text):
        if math.isfinite(value):
            by_name.setdefault(name, []).append((labels, value))
    out: dict[str, int | list[int] | None] = dict.fromkeys(COUNTERS)
    for key, names in COUNTERS.items():
        name = next((n for n in names if n in by_name), None)
        if name is None:
            continue
        if key == "accepted_per_pos":
            per: dict[int, float] = {}
            for labels, value in by_name[name]:
                pos = int(labels.get("position", 0))
                per[pos] = per.get(pos, 0.0) + value
            out[key] = [int(per.get(i, 0)) for i in range(max(per) + 1)]
        else:
            out[key] = int(sum(value for _, value in by_name[name]))
    if out["drafts"] == 0 and out["accepted_per_pos"] is None:
        out["accepted_per_pos"] = []
    return out


def diff(before: dict, after: dict) -> dict[str, int | list[int] | None]:
    """``after - before`` per counter (per position for lists); None where either reading lacks it.
    Example: ({"drafts": 2, "accepted_per_pos": [1, 0]}, {"drafts": 5, "accepted_per_pos": [3, 1]}) ->
    {"drafts": 3, "accepted_per_pos": [2, 1]}."""
    def minus(a, b):
        if a is None or b is None:
            return None
        if isinstance(a, list):
            b = b + [0] * (len(a) - len(b))  # a position first seen in this request
            return [x - y for x, y in zip(a, b, strict=True)]
        return a - b

    return {k: minus(after.get(k), before.get(k)) for k in after}


def server_kind(text: str) -> str | None:
    """Which server a ``/metrics`` reading comes from, by its metric prefixes (``vllm``, ``sglang``,
    ``llama.cpp``); None when none is known."""
    for prefix, server in SERVERS.items():
        if re.search(rf"^{re.escape(prefix)}", text, re.MULTILINE):
            return server
    return None


def read_iterations(text: str) -> int | None:
    """vLLM's engine iterations so far in one ``/metrics`` reading (:data:`ITERATIONS`, summed over engines and
    models); None where the reading lacks it (not a vLLM server).
    Example: 'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 41.0\n'
    'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 97.0\n' -> 41."""
    counts = [value for name, _, value in parse_exposition(text) if name == ITERATIONS and math.isfinite(value)]
    return int(sum(counts)) if counts else None
