"""Moving small values between the host and the device without stalling the device queue.

A pageable host-to-device copy made with ``torch.tensor(values, device=cuda)`` synchronises the stream: the host
waits for every queued kernel before the copy starts. :func:`upload` stages the values on the host and copies them
with ``non_blocking=True`` (CUDA copies pageable memory to a staging buffer before the call returns, so the
temporary host tensor may be freed at once), which queues the copy behind the kernels instead of waiting for them.
:func:`fetch` is the one way the engine reads device values: one call = one round trip, so the step loop batches
what it needs into one tensor first: :func:`pack_step` on the device, :func:`unpack_step` on the host (the layout
is named there once). What the host needs only after a turn (the logit margins) stays on the device until then
(:class:`harness.engine.sampling.LogitTrace`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def upload(values, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """``values`` (a list of numbers) as a tensor on ``device``, copied without synchronising the stream."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def fetch(tensor: torch.Tensor) -> list:
    """The values of ``tensor`` as (nested) Python numbers: one device-to-host round trip."""
    return tensor.tolist()


def pack_dtype(vocab_size: int) -> torch.dtype:
    """The dtype that carries token ids and float values in one transfer: float32 holds every integer below 2^24
    exactly (and runs on every device), float64 beyond that."""
    return torch.float32 if vocab_size <= 2**24 else torch.float64


@dataclass(frozen=True)
class StepReadback:
    """What the host reads after a greedy verification over a tree of ``n`` drafts, in one transfer (the logit
    margins are not in it: they stay on the device until the turn's end, :class:`harness.engine.sampling.LogitTrace`).
    """

    flags: list[float]       # [2] harness.engine.tree.tree_flags: nonzero = the tree failed a device-side check
    depth: int               # the tree's depth
    bonus: int               # the target's token after the accepted path
    accepted: list[float]    # [n] per draft slot: its token when on the accepted path, else -1

    @property
    def path(self) -> list[int]:
        """The accepted draft slots (0-based, tree order)."""
        return [i for i, t in enumerate(self.accepted) if t >= 0]

    @property
    def path_tokens(self) -> list[int]:
        """The tokens of the accepted draft slots."""
        return [int(t) for t in self.accepted if t >= 0]


def step_size(n: int) -> int:
    """Length of the packed readback of a tree of ``n`` drafts: 2 flags + depth + bonus + n = n + 4."""
    return n + 4


def pack_step(flags: torch.Tensor, depth: torch.Tensor, bonus: torch.Tensor, accepted: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
    """One tensor ``[n + 4]`` on ``bonus``'s device: ``[flags(2) | depth(1) | bonus(1) | accepted(n)]`` in ``dtype``
    (:func:`pack_dtype`), read back by :func:`unpack_step`.

    Shapes: flags [2], depth [] or [1], bonus [1], accepted [n].
    """
    here = bonus.device  # with a device map the logits (and the bonus) live on the last shard
    parts = (flags, depth, bonus, accepted)
    return torch.cat([p.reshape(-1).to(here, dtype) for p in parts])


def unpack_step(values: list, n: int) -> StepReadback:
    """The fields of a fetched :func:`pack_step` tensor of a tree of ``n`` drafts.

    Example (n = 2): [0, 0, 2, 9, 5, -1] -> flags [0, 0], depth 2, bonus 9, accepted [5, -1] (path [0], path
    tokens [5]).
    """
    if len(values) != step_size(n):
        raise ValueError(f"a step readback of {n} drafts has {step_size(n)} values, got {len(values)}")
    return StepReadback(flags=values[:2], depth=int(values[2]), bonus=int(values[3]), accepted=values[4:])
