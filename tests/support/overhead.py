"""What the host-overhead benchmarks share (tests/test_bench_vanilla.py group ``host-overhead-token``,
tests/test_bench_engine.py group ``host-overhead-step``): a tiny random Llama whose forwards cost about what the
decoding loop's own Python does, the floor a decoding loop can reach, drafts that are always rejected, and a clock
of the time spent inside forwards.

On a GPU a 135M model's eager loop is host-bound (the device waits for Python between kernels); on a CPU a model
with 4 layers of width 64 is, in the same way, overhead-bound, so the host work of the harness's loop shows as a
ratio against ``model.generate`` and against a hand-written loop, on any machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import DynamicCache

from harness.engine.tree import DraftTree
from harness.models import Target
from tests.support.helpers import tiny_target

LAYERS, HIDDEN, VOCAB = 4, 64, 128
# every token id once: prompt lookup finds a 1-gram match for any root, so PLD drafts at every step
PROMPT = torch.arange(VOCAB)[None]  # [1, 128]


def overhead_target() -> Target:
    """The tiny random Llama of the host-overhead benchmarks: 4 layers, hidden 64, vocabulary 128, no EOS (every
    turn runs to its budget; ``generate`` too: its generation config's EOS is cleared, since with one and
    ``min_new_tokens`` it would mask that token's logit and decode something else), draftbench's ``sdpa_gqa``
    attention (what ``auto`` loads)."""
    target = tiny_target(seed=0, vocab=VOCAB, hidden=HIDDEN, layers=LAYERS, init=0.3, tokenizer=False)
    target.model.generation_config.eos_token_id = None
    return target


def floor_decode(model: torch.nn.Module, prompt: torch.Tensor, n: int) -> list[int]:
    """The least a greedy KV-cache loop can do: ``model(...)`` on a ``DynamicCache``, argmax, one host read per token
    (the stop check every loop needs); ``n`` new tokens."""
    cache, out = DynamicCache(config=model.config), []
    with torch.inference_mode():
        tok = model(prompt, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
        out.append(int(tok))
        while len(out) < n:
            tok = model(tok, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(tok))
    return out


def always_rejected(method, continuation: list[int], vocab: int = VOCAB):
    """Make ``method`` (an instance) propose its own trees, run its own ``begin`` / ``accept``, and have every tree's
    first-level tokens that equal the target's next greedy token (``continuation``: vanilla's greedy tokens for the
    prompt, at least as long as the turn) moved to the next id: no draft is ever accepted, so every step emits
    exactly one token, as vanilla's does, while the method still drafts, verifies and compacts a whole tree. The
    rewrite is two tensor ops on the tree's device. Returns ``method``."""
    begin, propose, accept = method.begin, method.propose, method.accept
    where = {"root": 0}

    def rejected_begin(prompt_ids, hidden):
        where["root"] = 0
        begin(prompt_ids, hidden)

    def rejected_propose(root, sampling, generator):
        tree = propose(root, sampling, generator)
        want = continuation[where["root"] + 1]
        hit = (tree.parents < 0) & (tree.tokens == want)
        return DraftTree(torch.where(hit, (want + 1) % vocab, tree.tokens), tree.parents, tree.draft_probs)

    def rejected_accept(tokens, hidden, next_root):
        accept(tokens, hidden, next_root)
        where["root"] += len(tokens)

    method.begin, method.propose, method.accept = rejected_begin, rejected_propose, rejected_accept
    return method


class ForwardClock:
    """Seconds spent inside forwards of ``modules`` and their direct children (a method's draft head, its lm_head,
    the target model), while active; a call nested in another timed call is not counted twice.

    ``calls`` lists each outermost call's duration (seconds of ``timer``) in call order. Hooks run only around those
    modules' calls (two per call), so the clock adds microseconds per forward, charged to the forwards, never to the
    host work.
    """

    def __init__(self, modules: list[torch.nn.Module], timer: Callable[[], float] = time.perf_counter):
        seen: dict[int, torch.nn.Module] = {}
        for m in modules:
            for x in (m, *m.children()):
                seen.setdefault(id(x), x)
        self.modules = list(seen.values())
        self.timer = timer
        self.calls: list[float] = []
        self._depth, self._start, self._handles = 0, 0.0, []

    def _pre(self, *_):
        if self._depth == 0:
            self._start = self.timer()
        self._depth += 1

    def _post(self, *_):
        self._depth -= 1
        if self._depth == 0:
            self.calls.append(self.timer() - self._start)

    def __enter__(self) -> ForwardClock:
        self.calls = []
        for m in self.modules:
            self._handles += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def method_modules(method) -> list[torch.nn.Module]:
    """The modules whose forwards a method's turn runs: the target model and the method's own modules (a draft
    head, a draft lm_head)."""
    own = [v for v in vars(method).values() if isinstance(v, torch.nn.Module)]
    return [method.target.model, *own]
