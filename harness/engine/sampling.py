"""Turning logits into the distribution a method samples from: one implementation for vanilla and every method.

All functions are pure tensor functions. ``logits`` is ``[..., V]``; the result keeps the leading shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# The smallest temperature > 0 the sampler takes. Logits are divided by it in float32: at 1e-40 a logit of 10 becomes
# inf and softmax gives NaN. vLLM treats temperatures below 1e-5 as greedy; draftbench refuses them instead, so that
# a record's temperature is the one that was sampled at.
MIN_TEMPERATURE = 1e-5
TEMPERATURE_RULE = f"must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}"


def check_temperature(t: object) -> bool:
    """Whether the sampler can use temperature ``t`` (:data:`TEMPERATURE_RULE`). Examples: 0 -> True, 0.7 -> True,
    1e-40 -> False (logits / t overflow float32), -1, NaN, inf, "1" -> False."""
    return (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
            and (t == 0 or t >= MIN_TEMPERATURE))


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next-token distribution is shaped.

    temperature == 0 means greedy (argmax); otherwise logits are divided by ``temperature`` and, if
    ``top_p < 1``, restricted to the smallest set of tokens whose probability reaches ``top_p`` (nucleus), and
    if ``top_k > 0`` to the ``top_k`` most likely tokens. The speculative engine preserves exactly this
    distribution (see :mod:`harness.engine.verify`).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if not check_temperature(self.temperature):
            raise ValueError(f"temperature {TEMPERATURE_RULE}, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities ``[..., V]`` (fp32) of the shaped target distribution. Greedy gives a one-hot at the argmax.

    Example: logits [2, 1, 0], T=1, top_p=0.7 -> softmax = [.665, .245, .090]; the nucleus keeps tokens until the
    mass reaches 0.7, i.e. tokens 0 and 1, renormalised to [.731, .269, 0].
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # mass strictly before each token; a token is kept while the mass before it is < top_p (the top one always)
        before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = before >= params.top_p
        drop_sorted[..., 0] = False  # a top_p below float32's smallest number must still keep the top token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of ``probs [..., V]`` -> ``[...]`` (long)."""
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Greedy argmax or a sample from :func:`logits_to_probs`; ``logits [..., V]`` -> ids ``[...]``."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(logits_to_probs(logits, params), generator)


def logit_margins(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(top-1 minus top-2, top-1, the top-2 token)`` of ``logits [..., V]``, each ``[...]`` (values in float32):
    how close the greedy choice was to a tie, and with which token. Example: [1.0, 3.0, 2.5] -> (0.5, 3.0, 2)."""
    top = torch.topk(logits, 2, dim=-1)  # [..., 2]
    values = top.values.float()
    return values[..., 0] - values[..., 1], values[..., 0], top.indices[..., 1]


class LogitTrace:
    """The greedy diagnostics of a turn (:func:`logit_margins` of every emitted token) kept on the device while the
    turn runs and read back ONCE at its end: a step only stores its logits' top two (``torch.topk``, one kernel);
    :meth:`read` computes the margins over all steps at once and brings them to the host in one transfer.

    ``packed``: the dtype that carries the runner-up ids exactly with the float values
    (:func:`harness.engine.hostio.pack_dtype`). Example: ``add`` of logits [[1.0, 3.0, 2.5], [0.0, 1.0, 4.0]] with
    rows [1], then ``read()`` -> ([3.0], [4.0], [1]) (margin 4 - 1 = 3, top 4, runner-up token 1).
    """

    def __init__(self, packed: torch.dtype):
        self.packed = packed
        self.values: list[torch.Tensor] = []   # per add: [S, 2] the top two logits of each row
        self.indices: list[torch.Tensor] = []  # per add: [S, 2] their token ids
        self.rows: list[int] = []              # the emitted rows, as indices into the concatenated adds
        self.size = 0

    def add(self, logits: torch.Tensor, rows: list[int]) -> None:
        """A forward's ``logits [S, V]`` (on the device); ``rows`` (0-based, into S) are the ones whose token was
        emitted, in emission order."""
        top = torch.topk(logits, 2, dim=-1)
        self.values.append(top.values)
        self.indices.append(top.indices)
        self.rows.extend(self.size + r for r in rows)
        self.size += logits.shape[0]

    def read(self) -> tuple[list[float], list[float], list[int]]:
        """``(margins, tops, runner_ups)`` of the emitted rows, margins and tops to 6 significant digits (enough to
        tell a tie from a disagreement): one device-to-host transfer (none when nothing was added)."""
        if not self.rows:
            return [], [], []
        values = torch.cat([v.to(self.values[-1].device) for v in self.values]).float()  # [R, 2]
        indices = torch.cat([i.to(values.device) for i in self.indices])[:, 1]
        columns = (values[:, 0] - values[:, 1], values[:, 0], indices)  # margin and top in float32, as logit_margins
        host = torch.stack([c.to(self.packed) for c in columns], dim=1).tolist()  # [R, 3]: one read
        picked = [host[r] for r in self.rows]
        return ([float(f"{m:.6g}") for m, _, _ in picked], [float(f"{t:.6g}") for _, t, _ in picked],
                [int(u) for _, _, u in picked])
