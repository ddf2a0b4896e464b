"""Counting the host-device round trips of a decoding loop, on any device (CUDA's sync debug mode needs a GPU).

On an accelerator every read of a tensor's value by Python (``.item()``, ``.tolist()``, ``int(t)``, ``if t:``,
``.cpu()``, ``nonzero``, boolean-mask indexing) waits for the queued kernels to finish, and so does every copy of
Python data to the device (``torch.tensor(values, device=...)``: a pageable host-to-device copy synchronises the
stream). A step loop that does 45 of them per target forward spends a large part of a 7B model's step waiting.

:class:`HostSyncCounter` is a ``TorchFunctionMode`` that sees every such call whatever the device, so a CPU test can
count them: it counts

- *reads*: a tensor value brought to the host (the functions in :data:`READS`, and ``__getitem__`` /
  ``__setitem__`` with a boolean tensor index, whose result shape depends on the values);
- *uploads*: ``torch.tensor`` / ``torch.as_tensor`` built from (non-empty) Python data with an explicit
  ``device=`` (the idiom that becomes a synchronising host-to-device copy on CUDA).

What it cannot see on CPU: ``tensor.to(device)`` of a host tensor (a no-op there) and syncs inside C++ kernels;
``make gpu-check`` counts those with ``torch.cuda.set_sync_debug_mode`` on a real GPU.
:class:`StepSyncProbe` splits the counts per target forward (one verification step = one forward).
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

READS = frozenset({
    "item", "tolist", "__int__", "__float__", "__bool__", "__index__", "__complex__", "__array__", "numpy", "cpu",
    "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "equal", "allclose",
})
UPLOADS = frozenset({"tensor", "as_tensor"})


def _empty(data) -> bool:
    """An empty list / tuple: ``torch.tensor([], device=...)`` allocates, there is nothing to copy."""
    return isinstance(data, (list, tuple)) and len(data) == 0


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostSyncCounter(TorchFunctionMode):
    """Counts host reads and uploads (see the module docstring) while active; ``events`` names them.

    Example::

        with HostSyncCounter() as c:
            x = torch.arange(3); x.tolist(); int(x[0]); torch.tensor([1], device="cpu")
        c.reads == 2, c.uploads == 1
    """

    def __init__(self):
        super().__init__()
        self.reads = 0
        self.uploads = 0
        self.events: Counter[str] = Counter()
        self.paused = False  # set by StepSyncProbe.paused(): work that is not part of the measured loop

    @property
    def total(self) -> int:
        return self.reads + self.uploads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.paused:
            pass
        elif name in READS or (name in ("__getitem__", "__setitem__") and len(args) > 1 and _has_bool_index(args[1])):
            self.reads += 1
            self.events[name] += 1
        elif name in UPLOADS and kwargs.get("device") is not None and not _empty(args[0] if args else None):
            self.uploads += 1
            self.events[f"{name}(device=...)"] += 1
        return func(*args, **kwargs)


@contextlib.contextmanager
def forward_marks(model: torch.nn.Module, count: Callable[[], int | None]) -> Iterator[list[int]]:
    """Record ``count()`` at the start of every forward of ``model`` while inside (a ``None`` is not recorded: work
    that is not measured). The list is yielded and filled in place; :func:`per_forward` turns it into counts.
    ``model.forward`` is shadowed by an instance attribute, removed on exit."""
    marks: list[int] = []
    forward = model.forward

    def marked(*args, **kwargs):
        value = count()
        if value is not None:
            marks.append(value)
        return forward(*args, **kwargs)

    model.forward = marked
    try:
        yield marks
    finally:
        del model.forward


def per_forward(marks: list[int], end: int) -> list[int]:
    """Counts between consecutive marks, the last one up to ``end``. Example: marks [0, 2, 3], end 7 -> [2, 1, 4]."""
    return [b - a for a, b in zip(marks, [*marks[1:], end])]


class StepSyncProbe:
    """Host syncs between consecutive forwards of ``model``: ``per_forward[i]`` = reads + uploads from the start of
    forward i to the start of forward i + 1 (the last entry runs to the end of the probe).

    For a speculative turn, forward 0 is the prefill and forward i >= 1 is verification step i, so
    ``per_forward[i]`` covers step i's verification, compaction, the method's ``accept`` and the next ``propose``.
    Usage::

        with StepSyncProbe(target.model) as probe:
            method.generate(...)
        probe.per_forward  # e.g. [2, 1, 1, 1, ...]
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.counter = HostSyncCounter()
        self.marks: list[int] = []
        self.per_forward: list[int] = []
        self._marking: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> StepSyncProbe:
        self._marking = forward_marks(self.model, lambda: None if self.counter.paused else self.counter.total)
        self.marks = self._marking.__enter__()
        self.counter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.counter.__exit__(*exc)
        self._marking.__exit__(*exc)
        self.per_forward = per_forward(self.marks, self.counter.total)

    @property
    def events(self) -> Counter[str]:
        return self.counter.events

    @contextlib.contextmanager
    def paused(self):
        """Neither count nor mark forwards inside (a test oracle's own reference forwards)."""
        self.counter.paused = True
        try:
            yield
        finally:
            self.counter.paused = False


def cuda_syncs_per_forward(model: torch.nn.Module, run) -> tuple[list[int], list[str]]:
    """Synchronisations that CUDA's sync debug mode reports between consecutive forwards of ``model`` while ``run()``
    runs: ``(per_forward, messages)``, where ``per_forward[i]`` counts the warnings from the start of forward i to the
    start of forward i + 1 (the last to the end), as :class:`StepSyncProbe` does for host syncs, and ``messages`` are
    the distinct first lines of the warnings (where they come from). Unlike :class:`HostSyncCounter` it sees syncs
    inside torch's and transformers' own code; it needs a CUDA device."""
    with warnings.catch_warnings(record=True) as caught, forward_marks(model, lambda: len(caught)) as marks:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return per_forward(marks, len(caught)), sorted({str(w.message).splitlines()[0][:120] for w in caught})
