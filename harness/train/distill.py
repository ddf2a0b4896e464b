"""Self-distillation's generation stage: the target's greedy answers to training conversations, batched.

``draftbench data build --self-distill`` replaces every assistant turn by the target's own greedy answer to the
conversation so far (EAGLE's fixed-data variant, arXiv:2401.15077 Sec. 4.3, matches the draft to the target's
distribution; Medusa-2 self-distillation, arXiv:2401.10774 Sec. 2.3.2). :func:`self_distilled` walks the turns of
many conversations in rounds and hands each round's prompts to a generator, one of :data:`GENERATORS`:

- ``hf`` (:class:`HFGenerator`): ``model.generate`` on left-padded batches of ``batch`` prompts of similar length
  (:func:`greedy_batch`), in the harness's own process.
- ``vllm`` (:class:`VLLMGenerator`): the whole round at once to vLLM's engine in its own virtualenv (the worker of
  :mod:`harness.backends.vllm`, op ``generate_batch``), which schedules up to ``batch`` sequences per step with
  its paged KV cache (continuous batching: a finished sequence's slot is refilled at once, where a padded
  ``generate`` batch runs until its longest answer ends).

Both are greedy (T=0); a generator is a callable ``(prompts, rooms) -> answers`` (token ids without the EOS) and
counts the tokens it generated and the seconds it spent (``tokens``, ``seconds``), which the build reports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.models import Target

GENERATORS = ("hf", "vllm")
Generate = Callable[[list[list[int]], list[int]], list[list[int]]]


def self_distilled(target: Target, conversations: list[list[dict[str, str]]], max_len: int, max_new_tokens: int,
                   batch_size: int = 16, generate: Generate | None = None) -> list[list[dict[str, str]]]:
    """Each conversation's ``messages`` with every assistant turn replaced by the target's greedy answer to the
    (regenerated) history.

    Turns whose prompt already reaches ``max_len`` tokens are dropped with everything after them (they would be
    truncated away anyway); each answer is capped so that prompt + answer fit in ``max_len``. Work is batched
    across conversations: round r regenerates the r-th assistant turn of every conversation still going, sorted by
    prompt length and handed to ``generate`` at once (default: :class:`HFGenerator` with ``batch_size``), so a
    shard costs about (its turns / batch) batched generations instead of one generation per turn. On a CPU a batch
    of 16 short prompts costs little more than one (weights are read once per step).
    """
    generate = generate or HFGenerator(target, batch_size)
    outs: list[list[dict[str, str]]] = [[] for _ in conversations]
    cursor = [0] * len(conversations)
    going = list(range(len(conversations)))
    while going:
        pending: list[tuple[int, list[int], int]] = []  # (conversation, prompt ids, room)
        for i in going:
            msgs = conversations[i]
            while cursor[i] < len(msgs) and msgs[cursor[i]]["role"] != "assistant":
                outs[i].append(dict(msgs[cursor[i]]))
                cursor[i] += 1
            if cursor[i] >= len(msgs):
                continue
            prompt = target.render_chat(outs[i])[0].tolist()
            room = min(max_new_tokens, max_len - len(prompt))
            if room <= 0:
                outs[i] = outs[i][:-1]  # drop the unanswered user turn and stop this conversation
                continue
            pending.append((i, prompt, room))
        pending.sort(key=lambda t: len(t[1]))
        if pending:
            answers = generate([p for _, p, _ in pending], [r for _, _, r in pending])
            for (i, _, _), answer in zip(pending, answers, strict=True):
                outs[i].append({"role": "assistant", "content": target.decode(answer)})
                cursor[i] += 1
        going = [i for i, _, _ in pending]
    return outs


def greedy_batch(target: Target, prompts: list[list[int]], rooms: list[int]) -> list[list[int]]:
    """Greedy continuations of several prompts at once: ``model.generate`` on left-padded ids with an attention
    mask (position ids follow the mask, so padding does not shift positions). Prompt i gets at most ``rooms[i]``
    new tokens and stops at its first EOS (excluded). Batched fp32 arithmetic may break a near-tie differently
    from a one-prompt run; for training data that is immaterial (the test checks agreement on a tiny model).
    """
    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else (min(target.eos_ids) if target.eos_ids else 0)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)     # [B, P]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)        # [B, P]
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    eos = sorted(target.eos_ids)
    with torch.inference_mode():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=max(rooms), do_sample=False, num_beams=1, pad_token_id=pad,
                                    eos_token_id=eos or None, temperature=None, top_p=None, top_k=None)
    return [until_eos(out[row, width:width + room].tolist(), target.eos_ids) for row, room in enumerate(rooms)]


def until_eos(tokens: list[int], eos_ids: frozenset[int] | set[int]) -> list[int]:
    """``tokens`` up to their first EOS (excluded). Example: ([5, 7, 2, 9], {2}) -> [5, 7]."""
    cut = next((j for j, t in enumerate(tokens) if t in eos_ids), len(tokens))
    return tokens[:cut]


class HFGenerator:
    """``(prompts, rooms) -> answers`` with :func:`greedy_batch` over consecutive chunks of ``batch`` prompts (the
    caller sorts them by length, so a chunk pads little)."""

    name = "hf"

    def __init__(self, target: Target, batch: int = 16):
        if batch < 1:
            raise ValueError(f"generator hf: batch must be >= 1, got {batch}")
        self.target, self.batch = target, batch
        self.tokens, self.seconds = 0, 0.0

    def __call__(self, prompts: list[list[int]], rooms: list[int]) -> list[list[int]]:
        start = time.perf_counter()
        answers: list[list[int]] = []
        for b in range(0, len(prompts), self.batch):
            answers += greedy_batch(self.target, prompts[b:b + self.batch], rooms[b:b + self.batch])
        self.seconds += time.perf_counter() - start
        self.tokens += sum(map(len, answers))
        return answers

    def describe(self) -> dict[str, Any]:
        return {"generator": self.name, "batch": self.batch, "runtime": "eager",
                "dtype": str(self.target.dtype).removeprefix("torch."), "threads": torch.get_num_threads()}

    def close(self) -> None:
        """Nothing to release (the target stays loaded for the features)."""


class VLLMGenerator:
    """``(prompts, rooms) -> answers`` through vLLM's engine (greedy, ``max_num_seqs`` = ``batch``, context
    ``max_len``): the target's Hugging Face folder loaded in the vLLM worker (:mod:`harness.backends.vllm`). vLLM's
    own fp32 kernels may break a near-tie differently from the harness's forward; the features are the harness's
    forward over the stored text either way."""

    name = "vllm"

    def __init__(self, target: Target, batch: int, max_len: int):
        from harness.backends import vllm
        from harness.backends.worker import Worker

        if batch < 1:
            raise ValueError(f"generator vllm: batch must be >= 1, got {batch}")
        if not os.path.isfile(os.path.join(target.path, "config.json")):
            raise ValueError(f"generator vllm: the target must be a Hugging Face folder; {target.path} is not")
        self.target, self.batch = target, batch
        self.tokens, self.seconds = 0, 0.0
        dtype = str(target.dtype).removeprefix("torch.")
        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
        self.worker = Worker([vllm.check_python(), "-I", str(vllm.WORKER)], env, what="the vLLM worker")
        try:
            info = self.worker.request({"op": "load", "model": target.path, "dtype": dtype, "speculative_config": None,
                                        "llm": {"max_model_len": max_len, "max_num_seqs": batch}},
                                       vllm.LOAD_TIMEOUT_S)
        except BaseException:
            self.worker.close()
            raise
        self.info = {"version": info.get("version"), "load_s": info.get("load_s"), "config": info.get("config")}

    def __call__(self, prompts: list[list[int]], rooms: list[int]) -> list[list[int]]:
        from harness.backends import vllm

        # a round of thousands of answers takes long on a CPU: allow 10 generated tokens/s at the least
        timeout = vllm.TURN_TIMEOUT_S + sum(rooms) / 10
        r = self.worker.request({"op": "generate_batch", "prompts": prompts, "max_tokens": rooms,
                                 "stop_token_ids": sorted(self.target.eos_ids)}, timeout)
        answers = [until_eos(list(t), self.target.eos_ids) for t in r["token_ids"]]
        self.seconds += float(r["wall_time_s"])
        self.tokens += sum(map(len, answers))
        return answers

    def describe(self) -> dict[str, Any]:
        return {"generator": self.name, "batch": self.batch, "engine": "vllm", **self.info}

    def close(self) -> None:
        self.worker.close()


def make_generator(name: str, target: Target, batch: int, max_len: int) -> HFGenerator | VLLMGenerator:
    """The generator ``name`` (:data:`GENERATORS`); vLLM's is refused with one line when its venv is absent."""
    if name == "hf":
        return HFGenerator(target, batch)
    if name == "vllm":
        return VLLMGenerator(target, batch, max_len)
    raise ValueError(f"unknown generator {name!r}; choose one of {', '.join(GENERATORS)}")
