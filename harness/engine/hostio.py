"""Moving small values between the host and the device without stalling the device queue.

A pageable host-to-device copy made with ``torch.tensor(values, device=cuda)`` synchronises the stream: the host
waits for every queued kernel before the copy starts. :func:`upload` stages the values on the host and copies them
with ``non_blocking=True`` (CUDA copies pageable memory to a staging buffer before the call returns, so the
temporary host tensor may be freed at once), which queues the copy behind the kernels instead of waiting for them.
:func:`fetch` is the one way the engine reads device values: one call = one round trip, so the step loop batches
what it needs into one tensor first.
"""

from __future__ import annotations

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
