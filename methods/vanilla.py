"""Vanilla autoregressive decoding with a KV cache: the baseline every speedup is measured against.

It must be at least as fast as ``model.generate`` (benchmarked in ``tests/test_bench_vanilla.py``, on the default
model and, group ``host-overhead-token``, per token on a tiny one whose forwards cost what the loop's Python does)
and, greedy, produce exactly ``generate(do_sample=False)``'s tokens. A step reads back only its token; the greedy
logit margins stay on the device until the turn's end (:class:`harness.engine.sampling.LogitTrace`). The target
runs through the method's runner (:mod:`harness.engine.runtime`): with ``runtime: eager`` that is the model itself.
"""

from __future__ import annotations

import time

import torch

from harness.engine.hostio import pack_dtype
from harness.engine.method import Generation, Method
from harness.engine.sampling import LogitTrace, SamplingParams, next_token
from harness.measure.trackers import device_sync
from harness.registry import register_method


@register_method("vanilla")
class Vanilla(Method):
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Generation:
        model, eos = self.target.model, self.target.eos_ids
        runner = self.target_runner  # eager: the model itself; compiled: its compiled forward
        cache = runner.new_cache(prompt_ids.shape[1] + max_new_tokens)
        out: list[int] = []
        stop = "max_new_tokens"
        # greedy: each step's logit margins stay on the device and come back once, after the turn; a step reads
        # only its token (the stop check needs it)
        trace = LogitTrace(pack_dtype(model.config.vocab_size)) if sampling.greedy else None
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = runner.forward(prompt_ids, cache, prefill=True, logits_to_keep=1).logits[:, -1]
            tok = next_token(logits, sampling, generator)
            device_sync(prompt_ids.device)
            prefill = time.perf_counter() - t0
            while len(out) < max_new_tokens:
                if trace is not None:
                    trace.add(logits, [0])
                t = int(tok)
                out.append(t)
                if t in eos:
                    stop = "eos"
                    break
                if len(out) >= max_new_tokens:
                    break
                logits = runner.forward(tok.view(1, 1), cache, logits_to_keep=1).logits[:, -1]
                tok = next_token(logits, sampling, generator)
            margins, tops, runner_ups = trace.read() if trace is not None else ([], [], [])
        return Generation(token_ids=out, accept_lengths=[1] * len(out), stop_reason=stop, prefill_time_s=prefill,
                          logit_margins=margins, logit_tops=tops, logit_runner_ups=runner_ups)
