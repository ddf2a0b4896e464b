"""Measurement around a timed turn: device synchronisation, wall time, memory and energy.

``Tracker.track()`` is a context manager that synchronises the device before and after, and fills a
:class:`Measurement` (GPU memory from torch and NVML, energy from NVML's total-energy counter, process RSS on CPU).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from dataclasses import dataclass

import torch


def device_sync(device: torch.device | str | None) -> None:
    """Block until queued work on ``device`` is done (no-op on CPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)


@dataclass
class Measurement:
    wall_time_s: float = 0.0
    rss_bytes: int | None = None            # process resident set size after the turn
    peak_rss_bytes: int | None = None       # process lifetime peak RSS (getrusage)
    cuda_peak_allocated_bytes: int | None = None
    cuda_peak_reserved_bytes: int | None = None
    nvml_used_bytes: int | None = None      # device memory in use (all processes), NVML, after the turn
    energy_j: float | None = None           # NVML total-energy counter difference over the turn
    mean_power_w: float | None = None       # energy_j / wall_time_s


class Nvml:
    """Lazy NVML handle for one CUDA device; every query returns None when NVML is unavailable."""

    def __init__(self, index: int):
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no driver, no GPU, or no pynvml
            self.handle = None

    def energy_mj(self) -> int | None:
        if self.handle is None:
            return None
        try:
            return int(self.pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:
            return None

    def used_bytes(self) -> int | None:
        if self.handle is None:
            return None
        try:
            return int(self.pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except Exception:
            return None

    def info(self) -> dict:
        if self.handle is None:
            return {}
        p = self.pynvml
        out = {}
        for key, fn in (("gpu_name", lambda: p.nvmlDeviceGetName(self.handle)),
                        ("driver", p.nvmlSystemGetDriverVersion),
                        ("power_limit_w", lambda: p.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000)):
            with contextlib.suppress(Exception):
                v = fn()
                out[key] = v.decode() if isinstance(v, bytes) else v
        return out


class Tracker:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.nvml = Nvml(self.device.index or 0) if self.device.type == "cuda" else None

    @contextlib.contextmanager
    def track(self):
        m = Measurement()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        device_sync(self.device)
        e0 = self.nvml.energy_mj() if self.nvml else None
        t0 = time.perf_counter()
        try:
            yield m
        finally:
            device_sync(self.device)
            m.wall_time_s = time.perf_counter() - t0
            e1 = self.nvml.energy_mj() if self.nvml else None
            if e0 is not None and e1 is not None:
                m.energy_j = (e1 - e0) / 1000.0
                m.mean_power_w = m.energy_j / m.wall_time_s if m.wall_time_s > 0 else None
            if cuda:
                m.cuda_peak_allocated_bytes = int(torch.cuda.max_memory_allocated(self.device))
                m.cuda_peak_reserved_bytes = int(torch.cuda.max_memory_reserved(self.device))
                m.nvml_used_bytes = self.nvml.used_bytes() if self.nvml else None
            m.rss_bytes = _rss_bytes()
            m.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:
        return None
