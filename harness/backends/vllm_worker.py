"""The vLLM worker: run by the vLLM virtualenv's python (``DRAFTBENCH_VLLM_PYTHON``); the harness imports only its
constants (:data:`CPU_DEFAULTS`), which need nothing but the standard library.

vLLM pins its own torch and transformers, so it cannot live in the harness's environment; this script uses only the
standard library and vLLM, and talks to :class:`harness.backends.worker.Worker` in JSON lines over stdin/stdout.
Every request gets exactly one reply line, ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``:

    {"op": "load", "model": DIR, "tokenizer": DIR, "dtype": "float32", "speculative_config": {...} | null,
     "llm": {...}}                    -> {"ok": true, "version": "0.32.0", "load_s": 41.2, "config": {...},
                                          "parallel": {"tensor_parallel_size": 1, ...} | null}
    {"op": "generate", "prompt_ids": [...], "max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
     "seed": 7}                       -> {"ok": true, "token_ids": [...], "wall_time_s": ..., "ttft_s": ...,
                                          "finish_reason": "length", "counters": {...}, "steps": {...} | null,
                                          "forwards": 14 | null}
    {"op": "generate_batch", "prompts": [[...], ...], "max_tokens": [64, ...], "stop_token_ids": [2]}
                                      -> {"ok": true, "token_ids": [[...], ...], "wall_time_s": ...}  (greedy)
    {"op": "close"}                   -> {"ok": true}, then the worker exits

One prompt per ``generate`` call, timed here around ``LLM.generate`` (the pipe is not inside the time). The
speculative counters are vLLM's Prometheus counters (``vllm:spec_decode_num_drafts`` and friends, read with
``LLM.get_metrics()``) diffed around the turn; a counter vLLM does not expose is null, never 0. ``steps`` are the
request's own per-step counts (vLLM's ``per_request_spec_decode_metrics="detailed"``): accepted and drafted tokens of
each verification step. ``forwards`` are the turn's target forwards, the prefill counted once: vLLM's engine
iterations (``vllm:iteration_tokens_total``'s count, diffed; one prompt at a time; :data:`ITERATIONS`); null where
vLLM does not count them. One ``LLM.get_metrics()`` before and one after each turn feed both
(:func:`read_metrics`). ``config`` is what ``LLM(...)`` got
(:func:`llm_kwargs`); ``parallel`` is the layout vLLM resolved from it (:data:`PARALLEL`: tensor / pipeline / data
parallel sizes, executor backend, world size, nodes). vLLM and its engine process print logs on stdout; fd 1 is
pointed at stderr before vLLM is imported, so the protocol stream carries nothing but replies.

The worker does not outlive the harness: when its parent is gone (killed, crashed) or closes the pipe without a
``close``, it leaves at once (:func:`exit_with_parent`), since a worker blocked in vLLM or in vLLM's shutdown would
otherwise hold its memory and cores.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

COUNTERS = {  # what draftbench calls it -> vLLM's Prometheus counter (Vector: one value per draft position)
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}
# a histogram observed once per engine step that gave some request a token (vLLM 0.32: vllm/v1/engine/llm_engine.py
# makes the step's IterationStats only when it has outputs, and vllm/v1/core/sched/scheduler.py emits none for a
# chunked prefill's partial chunks): one prompt at a time, its count's difference is the turn's forwards with the
# prefill counted once, chunked or not (measured: a 168-token prompt in chunks of 64 tokens, 9 drafting steps: 10)
ITERATIONS = "vllm:iteration_tokens_total"


def read_metrics(llm) -> tuple[dict, int | None]:
    """One ``llm.get_metrics()`` reading: the speculative counters summed over engines (ints, a list for the
    per-position vector; absent ones None) and vLLM's engine iterations so far (the count of :data:`ITERATIONS`,
    summed over engines; None when absent)."""
    out: dict = dict.fromkeys(COUNTERS)
    names = {v: k for k, v in COUNTERS.items()}
    iterations = None
    for metric in llm.get_metrics():
        if metric.name == ITERATIONS and hasattr(metric, "count"):
            iterations = (iterations or 0) + int(metric.count)
        key = names.get(metric.name)
        if key is None:
            continue
        if hasattr(metric, "values"):
            old = out[key] or [0] * len(metric.values)
            out[key] = [a + int(b) for a, b in zip(old, metric.values, strict=True)]
        else:
            out[key] = (out[key] or 0) + int(metric.value)
    return out, iterations


def diff_counters(before: dict, after: dict) -> dict:
    def minus(a, b):
        if a is None or b is None:
            return None
        return [x - y for x, y in zip(a, b, strict=True)] if isinstance(a, list) else a - b

    return {k: minus(after[k], before[k]) for k in COUNTERS}


PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "distributed_executor_backend",
            "world_size", "nnodes", "node_rank")  # of vLLM's ParallelConfig, as resolved, for the manifest


CPU_DEFAULTS = {"enforce_eager": True, "max_model_len": 2048}  # how vLLM is loaded unless the run says otherwise


def llm_kwargs(req: dict) -> dict:
    """The ``LLM(...)`` arguments of a load request: the target, the worker's defaults (eager, 2048-token context,
    statistics on), then the request's ``llm`` options over them (``tensor_parallel_size``, ...), and the
    speculative configuration with per-request step metrics.

    Example: {"model": "m", "dtype": "float32", "speculative_config": None, "llm": {"tensor_parallel_size": 2}} ->
    {"model": "m", "tokenizer": "m", "dtype": "float32", "enforce_eager": True, "max_model_len": 2048,
    "disable_log_stats": False, "tensor_parallel_size": 2}.
    """
    options = {"model": req["model"], "tokenizer": req.get("tokenizer") or req["model"], "dtype": req["dtype"],
               **CPU_DEFAULTS, "disable_log_stats": False, **(req.get("llm") or {})}
    spec = req.get("speculative_config")
    if spec:
        options["speculative_config"] = spec
        options.setdefault("per_request_spec_decode_metrics", "detailed")
    return options


def load(req: dict):
    from vllm import LLM

    options = llm_kwargs(req)
    start = time.perf_counter()
    llm = LLM(**options)
    load_s = round(time.perf_counter() - start, 3)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    parallel = getattr(config, "parallel_config", None)
    resolved = None if parallel is None else {k: getattr(parallel, k, None) for k in PARALLEL}
    return llm, {"load_s": load_s, "config": options, "parallel": resolved}


def generate(llm, req: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=req["max_tokens"], temperature=req["temperature"], top_p=req["top_p"],
                            top_k=req["top_k"] or -1, seed=req.get("seed"))
    before, iterations = read_metrics(llm)
    start = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=req["prompt_ids"])], params, use_tqdm=False)[0]
    wall = time.perf_counter() - start
    after, done = read_metrics(llm)
    forwards = None if iterations is None or done is None else done - iterations
    completion = out.outputs[0]
    stats = getattr(out, "metrics", None)
    ttft = getattr(stats, "first_token_latency", None) or None
    spec = getattr(completion, "spec_decode_metrics", None)
    steps = None if spec is None else {"accepted": list(spec.per_step_accepted), "drafted": list(spec.per_step_drafted)}
    return {"token_ids": list(completion.token_ids), "wall_time_s": wall, "ttft_s": ttft,
            "finish_reason": completion.finish_reason, "counters": diff_counters(before, after), "steps": steps,
            "forwards": forwards}


def generate_batch(llm, req: dict) -> dict:
    """Greedy answers to many prompts in one ``LLM.generate`` (vLLM batches them; self-distillation's generator)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(max_tokens=n, temperature=0.0, stop_token_ids=req.get("stop_token_ids") or None,
                             detokenize=False) for n in req["max_tokens"]]  # ids are all the caller reads
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    return {"token_ids": [list(o.outputs[0].token_ids) for o in outs], "wall_time_s": time.perf_counter() - start}


def exit_with_parent(parent: int, period_s: float = 0.5) -> None:
    """Watch the harness that started this worker (``parent``: its pid, from ``DRAFTBENCH_WORKER_PARENT``, the
    name :mod:`harness.backends.worker` gives it) and end this process (without vLLM's shutdown, which can hang)
    the moment it is gone, also when it died before this worker started: the worker is then re-parented, so
    ``os.getppid()`` is another pid."""
    while os.getppid() == parent:
        time.sleep(period_s)
    os._exit(1)


def main() -> int:
    parent = int(os.environ.get("DRAFTBENCH_WORKER_PARENT") or os.getppid())
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    reply_stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # vLLM's prints and its engine process's output go to stderr, never into the protocol
    sys.stdout = sys.stderr

    def reply(obj: dict) -> None:
        reply_stream.write(json.dumps(obj) + "\n")
        reply_stream.flush()

    llm = None
    for line in sys.stdin:
        try:
            req = json.loads(line)
            op = req.get("op") if isinstance(req, dict) else None
            if op == "load":
                import vllm

                llm, info = load(req)
                reply({"ok": True, "version": vllm.__version__, **info})
            elif op == "generate":
                if llm is None:
                    raise RuntimeError("generate before load")
                reply({"ok": True, **generate(llm, req)})
            elif op == "generate_batch":
                if llm is None:
                    raise RuntimeError("generate_batch before load")
                reply({"ok": True, **generate_batch(llm, req)})
            elif op == "close":
                reply({"ok": True})
                return 0
            else:
                raise ValueError(f"unknown request {line.strip()[:80]!r}")
        except Exception as exc:  # one reply per request: the harness records the turn as an error
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    os._exit(0)  # the pipe closed without a close: the harness is gone, so no one waits for vLLM's shutdown


if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this file
    sys.exit(main())
