"""SpS: classic speculative sampling with a separate, smaller draft model (Leviathan et al., arXiv:2211.17192;
Chen et al., arXiv:2302.01318), as in Spec-Bench's SpS rows (arXiv:2401.07851).

The draft is any causal LM that shares the target's tokenizer (option ``draft``: an embedded alias, a Hugging Face id
or a local folder, loaded like a target with the target's dtype and device). Every step it continues the committed
text autoregressively by a chain of ``k`` tokens; the engine verifies the chain with one target forward:

- T = 0: the chain is the draft's greedy continuation ("deterministic" proposal); verification keeps the longest
  prefix equal to the target's argmax, so the output is the target's greedy output;
- T > 0: each token is drawn from the draft's distribution shaped like the target's (same temperature, top-p, top-k;
  :func:`harness.engine.sampling.logits_to_probs`), and the chain carries those rows as ``draft_probs``
  ("sampled" proposal), so the engine's rejection rule (accept with min(1, p/q), else resample from
  norm(max(0, p - q))) emits exactly the target's distribution at every temperature.

The draft keeps its own transformers ``DynamicCache``: after every verification it is cropped back to the committed
tokens it has already run (:meth:`Sps.accept`); the tokens it has not run (the last accepted draft when the whole
chain was accepted) wait for the next step, together with the next root.

Chain length: ``k`` (default 5) with ``schedule`` "heuristic" (+2 after a fully accepted chain, else -1, at least 1,
kept across turns) is what Spec-Bench ran: its SpS script calls transformers' assisted generation (pinned
transformers 4.37.1), whose defaults are ``num_assistant_tokens=5`` with that schedule. "heuristic_transient"
restarts from ``k`` every turn; "constant" keeps ``k``.

No small draft of the default target's family is available offline (SmolLM2-135M is the smallest SmolLM2), so ``sps``
has no preset draft: pass one, e.g. ``--opt sps.draft=HF_ID`` for a target whose family has a smaller member
(Llama-3.1-8B-Instruct with meta-llama/Llama-3.2-1B-Instruct). :meth:`Sps.example` builds a random draft for tests;
its numbers are not a result.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

from harness.engine.hostio import upload
from harness.engine.method import OptionsError, build_options, seeded
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, chain_tree
from harness.measure.metrics import draft_kv_bytes
from harness.models import Target, kv_shape, load_target, target_from_model
from harness.registry import register_method

SCHEDULES = ("heuristic", "heuristic_transient", "constant")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass
class SpsOptions:
    """``draft``: the draft model (alias, Hugging Face id or folder; required unless a draft is passed in-process).
    ``k``: the chain length (the first one with a heuristic ``schedule``); ``schedule``: heuristic,
    heuristic_transient or constant (see the module docstring)."""

    draft: str | None = None
    k: int = 5
    schedule: str = "heuristic"

    def __post_init__(self):
        if self.draft is not None and not isinstance(self.draft, str):
            raise ValueError(f"draft must be a model alias, Hugging Face id or folder (string), got {self.draft!r}")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")


def vocab_rows(model) -> int:
    """Rows of a causal LM's output layer (the size of its logits)."""
    return int(model.get_output_embeddings().weight.shape[0])


def check_shared_vocabulary(target: Target, draft: Target, where: str) -> None:
    """Refuse a draft that does not share the target's tokenizer, with one line naming the difference.

    When both have tokenizers their vocabularies (token -> id) must be equal; then the output layers may still
    differ in size by padding rows (ids no tokenizer produces), which :meth:`Sps.fit` cuts or pads. Without a
    tokenizer on either side, the output layers must have the same size.
    Example: a target with 49,152 ids and a draft with 32,000 -> "... vocabulary sizes differ (target 49152,
    draft 32000) ..."."""
    vt, vd = vocab_rows(target.model), vocab_rows(draft.model)
    tt, td = target.tokenizer, draft.tokenizer
    if tt is not None and td is not None:
        a, b = tt.get_vocab(), td.get_vocab()
        if a != b:
            token = next((t for t in sorted(set(a) | set(b), key=lambda t: min(a.get(t, 1 << 62), b.get(t, 1 << 62)))
                          if a.get(t) != b.get(t)), None)
            raise OptionsError(f"{where}: draft {draft.name!r} does not share the target's tokenizer (token {token!r} "
                               f"has id {a.get(token)} in the target's and {b.get(token)} in the draft's); SpS needs a "
                               "draft of the same tokenizer")
        if vt != vd and max(len(tt), 1) > min(vt, vd):
            raise OptionsError(f"{where}: the tokenizer has {len(tt)} ids but the output layers have {vt} (target) and "
                               f"{vd} (draft) rows")
    elif vt != vd:
        raise OptionsError(f"{where}: vocabulary sizes differ (target {vt}, draft {vd} output rows); SpS needs a draft "
                           "of the same tokenizer")


@register_method("sps")
class Sps(SpeculativeMethod):
    """SpS: a separate draft model proposes a chain of k tokens (lossless at every temperature; Spec-Bench's SpS).

    See the module docstring. ``draft`` may be passed in-process (a :class:`harness.models.Target`, e.g. a tiny model
    in tests); otherwise option ``draft`` is loaded with the target's dtype and device."""

    Options = SpsOptions

    def __init__(self, target: Target, options=None, draft: Target | None = None):
        super().__init__(target, options)
        where = f"method {self.name!r}"
        if draft is None:
            if self.options.draft is None:
                raise OptionsError(f"{where}: option draft is required: a causal LM sharing the target's tokenizer (an "
                                   "alias, Hugging Face id or folder), e.g. --opt sps.draft=HF_ID")
            draft = load_target(self.options.draft, dtype=DTYPE_NAMES.get(target.dtype, "auto"),
                                device=str(target.device))
        check_shared_vocabulary(target, draft, where)
        self.draft = draft
        self.vocab = vocab_rows(target.model)
        self.k = self.options.k
        self._proposal = "deterministic"
        self.cache: DynamicCache | None = None
        self.pending: torch.Tensor | None = None  # committed tokens the draft has not run yet
        self.run_after_root = 0  # draft tokens run after the root by the last proposal (k - 1)

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options: Any) -> Sps:
        """The method with a randomly initialised draft shaped like ``target`` but with one decoder layer (seeded;
        option ``draft`` is ignored). For tests only: a random draft's speed is not a result."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        config = copy.deepcopy(target.model.config)
        text = config.get_text_config(decoder=True)
        text.num_hidden_layers = 1
        if getattr(text, "layer_types", None):
            text.layer_types = text.layer_types[:1]
        with seeded(seed):
            model = type(target.model)(config)
        model = model.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
        draft = target_from_model(model, target.tokenizer, name=f"{target.name}-random-1-layer-draft")
        return cls(target, opts, draft=draft)

    @property
    def proposal(self) -> str:  # type: ignore[override]
        return self._proposal

    def describe(self) -> dict[str, Any]:
        """The options plus the draft actually used (an in-process draft has no ``draft`` option)."""
        return {**super().describe(), "draft_model": self.draft.name}

    # ---- the draft's own cache ---------------------------------------------------------------------------------
    def draft_kv_bytes(self, positions: int) -> int | None:
        """The draft model's own KV cache (its ``DynamicCache``, which follows the committed text) at ``positions``
        context tokens, in its dtype (:func:`harness.measure.metrics.draft_kv_bytes`): each full-attention layer
        over every position, each sliding-window layer over the ``window - 1`` it keeps (transformers'
        ``DynamicSlidingWindowLayer``); a layer that shares another's KV or has none (``dummy``) adds nothing.
        None when the config does not give the shape (kv heads, head_dim) or a layer keeps another kind of state
        (chunked, linear or recurrent attention), whose size this formula does not give.
        Example: a 2-layer draft with 2 kv heads of width 8 in float32, layer 0 sliding with window 8, layer 1
        full, at 100 positions -> 2 * 2 * 8 * 4 * (7 + 100) = 13,696 bytes."""
        text = self.draft.model.config.get_text_config(decoder=True)
        _, kv_heads, head_dim, _ = kv_shape(text.to_dict())
        types, kwargs = get_layer_types_and_kwargs(text)
        if kv_heads is None or head_dim is None or set(types) - {"full_attention", "sliding_attention", "dummy"}:
            return None
        windows = [kw["sliding_window"] - 1 if kind == "sliding_attention" else 0
                   for kind, kw in zip(types, kwargs) if kind != "dummy"]
        return sum(draft_kv_bytes(windows.count(w), kv_heads, head_dim, positions, self.draft.dtype.itemsize,
                                  window=w) for w in sorted(set(windows)))

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.cache = DynamicCache(config=self.draft.model.config)
        self.cache.activate_past_recording()  # sliding-window layers keep what a crop may need to roll back
        self.pending = prompt_ids[0].to(self.draft.device)
        if self.options.schedule == "heuristic_transient":
            self.k = self.options.k

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        """``tokens`` = [root] + the a accepted drafts. The draft cache holds the committed text before the root, the
        root and the first k - 1 drafts; keep the root and the accepted drafts it ran, crop the rest; an accepted
        draft it did not run (the k-th) becomes pending."""
        accepted = len(tokens) - 1
        kept = min(accepted, self.run_after_root)
        extra = self.run_after_root - kept
        if extra:
            self.cache.crop(-extra)
        else:
            self.cache.crop(0)  # sliding-window layers drop what they no longer need
        self.pending = upload(tokens[1 + kept:], self.draft.device)  # queued without a stream synchronisation
        if self.options.schedule != "constant":  # transformers' heuristic: +2 after a full accept, else -1
            self.k = self.k + 2 if accepted == self.k else max(1, self.k - 1)

    # ---- drafting ------------------------------------------------------------------------------------------------
    def fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[V_draft]`` as the target's ``[V]``: padding rows beyond V are cut, missing ones are -inf."""
        rows = logits.shape[-1]
        if rows == self.vocab:
            return logits
        if rows > self.vocab:
            return logits[..., : self.vocab]
        pad = logits.new_full((*logits.shape[:-1], self.vocab - rows), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def draft_forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Run the draft over ``ids [n]`` after its cache; the last position's logits as the target's ``[V]``."""
        out = self.draft.model(ids[None], cache=self.cache, use_cache=True, logits_to_keep=1)
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        return self.fit(out.logits[0, -1])

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        """A chain of ``k`` draft tokens below ``root`` (greedy at T = 0, sampled with ``draft_probs`` at T > 0)."""
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        device = self.draft.device
        root_t = torch.full((1,), root, dtype=torch.long, device=device)
        logits = self.draft_forward(torch.cat([self.pending, root_t]))
        self.pending = self.pending[:0]
        tokens, rows = [], []
        for i in range(self.k):
            if sampling.greedy:
                token = logits.argmax(-1).view(1)
            else:
                q = logits_to_probs(logits, sampling)  # [V] the draft's shaped distribution
                on = generator.device if generator is not None else q.device  # draw where the generator lives
                token = torch.multinomial(q.to(on), 1, generator=generator).to(device)
                rows.append(q)
            tokens.append(token)
            if i < self.k - 1:
                logits = self.draft_forward(token)
        self.run_after_root = self.k - 1
        chain = torch.cat(tokens).to(self.target.output_device)
        probs = None
        if rows:
            rows.append(torch.zeros_like(rows[0]))  # the last node has no children
            probs = torch.stack(rows)  # [k + 1, V]
        return chain_tree(chain, probs)
