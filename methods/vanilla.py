"""Vanilla autoregressive decoding with a KV cache: the baseline every speedup is measured against.

It must be at least as fast as ``model.generate`` (benchmarked in ``tests/test_bench_vanilla.py``) and, greedy,
produce exactly ``generate(do_sample=False)``'s tokens. The target runs through the method's runner
(:mod:`harness.engine.runtime`): with ``runtime: eager`` that is the model itself.
"""

from __future__ import annotations

import time

import torch

from harness.engine.hostio import fetch, pack_dtype
from harness.engine.method import Generation, Method
from harness.engine.sampling import SamplingParams, logit_margins, next_token
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
        margins: list[float] = []
        tops: list[float] = []
        runner_ups: list[int] = []
        stop = "max_new_tokens"
        # greedy: the token and its logit margin come back in one transfer per step
        packed = pack_dtype(model.config.vocab_size)
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = runner.forward(prompt_ids, cache, prefill=True, logits_to_keep=1).logits[:, -1]
            tok = next_token(logits, sampling, generator)
            device_sync(prompt_ids.device)
            prefill = time.perf_counter() - t0
            while len(out) < max_new_tokens:
                if sampling.greedy:
                    margin, top, second = logit_margins(logits[0])
                    t, m, best, runner_up = fetch(torch.stack([tok[0].to(packed), margin.to(packed), top.to(packed),
                                                               second.to(packed)]))
                    t = int(t)
                    margins.append(float(f"{m:.6g}"))
                    tops.append(float(f"{best:.6g}"))
                    runner_ups.append(int(runner_up))
                else:
                    t = int(tok)
                out.append(t)
                if t in eos:
                    stop = "eos"
                    break
                if len(out) >= max_new_tokens:
                    break
                logits = runner.forward(tok.view(1, 1), cache, logits_to_keep=1).logits[:, -1]
                tok = next_token(logits, sampling, generator)
        return Generation(token_ids=out, accept_lengths=[1] * len(out), stop_reason=stop, prefill_time_s=prefill,
                          logit_margins=margins, logit_tops=tops, logit_runner_ups=runner_ups)
