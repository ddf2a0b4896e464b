"""Measurement around a timed turn: device synchronisation, wall time, memory and energy.

``Tracker.track()`` is a context manager that synchronises the device(s) before and after, and fills a
:class:`Measurement` (GPU memory from torch and NVML, energy from NVML's total-energy counter, process RSS on CPU;
on a CPU target, energy from the kernel's RAPL counters where they can be read, :class:`Rapl`).
NVML boards are matched to CUDA devices by PCI bus id (:class:`Nvml`); with a device map every quantity is summed
over the GPUs the model uses.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

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
    cuda_peak_allocated_bytes: int | None = None  # sum over the devices used of torch's peak allocated memory
    cuda_peak_reserved_bytes: int | None = None   # the same for reserved memory (allocated + allocator cache)
    nvml_used_bytes: int | None = None      # device memory in use (all processes), NVML, after the turn, summed
    energy_j: float | None = None           # NVML total-energy counter difference over the turn, summed
    mean_power_w: float | None = None       # energy_j / wall_time_s
    nvml_devices: list[str] | None = None   # PCI bus ids of the boards NVML read
    energy_source: str | None = None        # what energy_j was read from ("nvml", "rapl"), or why none: "n/a: <why>"
    load_avg_1m: float | None = None        # the machine's 1-minute load average at the turn's end (None: unreadable)


def pci_bus_id(properties) -> str | None:
    """NVML's bus id ``DDDDDDDD:BB:DD.0`` of a CUDA device from ``torch.cuda.get_device_properties`` (None when
    torch does not report the PCI location). Example: domain 0, bus 0x3b, device 0 -> "00000000:3B:00.0"."""
    try:
        domain, bus, dev = properties.pci_domain_id, properties.pci_bus_id, properties.pci_device_id
    except AttributeError:
        return None
    return f"{int(domain):08X}:{int(bus):02X}:{int(dev):02X}.0"


class Nvml:
    """NVML handles of the CUDA devices ``indices`` (torch's numbering), every query None when NVML is unavailable.

    NVML numbers boards its own way and ignores ``CUDA_VISIBLE_DEVICES``, so torch's ``cuda:0`` in a process
    pinned to the third GPU is NVML's board 2. Boards are therefore matched by PCI bus id (torch's device
    properties -> ``nvmlDeviceGetHandleByPciBusId``); a device whose bus id torch does not report is not read at
    all (no reading is better than another board's). With several devices (a device map), energy and memory are
    sums over them and :attr:`devices` lists the bus ids. ``nvml`` and ``properties`` replace ``pynvml`` and
    ``torch.cuda.get_device_properties`` (tests pass fakes).
    """

    def __init__(self, indices: int | list[int], nvml=None, properties=None):
        self.handles: list = []
        self.devices: list[str] = []
        self.error: str | None = None
        indices = [indices] if isinstance(indices, int) else list(indices)
        try:
            if nvml is None:
                import pynvml as nvml

                nvml.nvmlInit()
            self.pynvml = nvml
            properties = properties or torch.cuda.get_device_properties
            for index in indices:
                bus = pci_bus_id(properties(index))
                if bus is None:
                    raise LookupError(f"torch reports no PCI bus id for cuda:{index}")
                self.handles.append(nvml.nvmlDeviceGetHandleByPciBusId(bus))
                self.devices.append(bus)
        except Exception as e:  # no driver, no GPU, no pynvml, or an unmatched board
            self.handles, self.devices, self.error = [], [], f"{type(e).__name__}: {e}"

    @property
    def handle(self):
        """The first board's handle (None without NVML)."""
        return self.handles[0] if self.handles else None

    def _sum(self, query) -> int | None:
        if not self.handles:
            return None
        try:
            return sum(int(query(h)) for h in self.handles)
        except Exception:
            return None  # a partial sum would be silently wrong

    def energy_mj(self) -> int | None:
        return self._sum(self.pynvml.nvmlDeviceGetTotalEnergyConsumption) if self.handles else None

    def used_bytes(self) -> int | None:
        return self._sum(lambda h: self.pynvml.nvmlDeviceGetMemoryInfo(h).used) if self.handles else None

    def info(self) -> dict:
        if not self.handles:
            return {"nvml_error": self.error} if self.error else {}
        p = self.pynvml
        h = self.handles[0]
        out: dict = {"nvml_devices": list(self.devices)}
        for key, fn in (("gpu_name", lambda: p.nvmlDeviceGetName(h)),
                        ("driver", p.nvmlSystemGetDriverVersion),
                        ("power_limit_w", lambda: p.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)):
            with contextlib.suppress(Exception):
                v = fn()
                out[key] = v.decode() if isinstance(v, bytes) else v
        return out


RAPL_ROOT = "/sys/class/powercap"


class Rapl:
    """The kernel's RAPL package energy counters (``<root>/intel-rapl:<n>/energy_uj``, one per CPU package; the
    sub-zones ``intel-rapl:<n>:<m>`` are parts of a package and are not added again), summed, in joules.

    A counter wraps at its ``max_energy_range_uj``: a reading below the previous one has wrapped once (a turn shorter
    than a wrap period, minutes at the least). RAPL counts the whole package, every process on it: on a shared
    machine a turn's energy includes the other processes' work. :attr:`error` says why nothing is read (no powercap
    zones, or ``energy_uj`` readable by root only, as kernels since 5.10 make it); then :meth:`read` is None.
    """

    def __init__(self, root: str | os.PathLike = RAPL_ROOT):
        self.zones = sorted(p for p in Path(root).glob("intel-rapl:*") if p.name.count(":") == 1)
        self.error: str | None = None
        self.ranges: list[int] = []
        try:
            if not self.zones:
                raise FileNotFoundError(f"no RAPL package zone under {root}")
            self.ranges = [int((z / "max_energy_range_uj").read_text()) for z in self.zones]
            self._raw()
        except (OSError, ValueError) as e:
            self.zones, self.error = [], f"{type(e).__name__}: {e}"

    def _raw(self) -> list[int]:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def read(self) -> list[int] | None:
        """Every package's counter in microjoules, or None when RAPL cannot be read."""
        try:
            return self._raw() if self.zones else None
        except (OSError, ValueError):
            return None

    def joules(self, before: list[int] | None, after: list[int] | None) -> float | None:
        """Energy between two :meth:`read` results, each counter unwrapped once. Example: range 1000 uJ, before
        [900], after [100] -> 200 uJ = 0.0002 J."""
        if before is None or after is None:
            return None
        return sum(a - b if a >= b else a + r - b for a, b, r in zip(after, before, self.ranges)) / 1e6


def model_devices(model: torch.nn.Module, default: torch.device | str) -> list[torch.device]:
    """The distinct devices holding ``model``'s parameters (the GPUs of a device map), ``[default]`` when none."""
    found = {p.device for p in model.parameters() if p.device.type != "meta"}
    return sorted(found, key=lambda d: (d.type, d.index or 0)) or [torch.device(default)]


class Tracker:
    """Synchronised wall time, memory and energy of a turn on ``device`` and any other ``devices`` the model uses."""

    def __init__(self, device: torch.device | str, devices: list[torch.device] | None = None, nvml: Nvml | None = None,
                 rapl: Rapl | None = None):
        self.device = torch.device(device)
        self.devices = [torch.device(d) for d in (devices or [self.device])]
        cuda = [d.index or 0 for d in self.devices if d.type == "cuda"]
        self.cuda = [torch.device("cuda", i) for i in cuda]
        self.nvml = nvml if nvml is not None else (Nvml(cuda) if cuda else None)
        self.rapl = rapl if rapl is not None else (Rapl() if self.device.type == "cpu" else None)

    def sync(self) -> None:
        for d in self.cuda or [self.device]:
            device_sync(d)

    @contextlib.contextmanager
    def track(self):
        m = Measurement()
        for d in self.cuda:
            torch.cuda.reset_peak_memory_stats(d)
        self.sync()
        e0 = self.nvml.energy_mj() if self.nvml else None
        r0 = self.rapl.read() if self.rapl else None
        t0 = time.perf_counter()
        try:
            yield m
        finally:
            self.sync()
            m.wall_time_s = time.perf_counter() - t0
            e1 = self.nvml.energy_mj() if self.nvml else None
            if e0 is not None and e1 is not None:
                m.energy_j, m.energy_source = (e1 - e0) / 1000.0, "nvml"
            elif self.rapl is not None:
                m.energy_j = self.rapl.joules(r0, self.rapl.read())
                m.energy_source = "rapl" if m.energy_j is not None else f"n/a: {self.rapl.error or 'RAPL read failed'}"
            elif self.nvml is not None:
                m.energy_source = f"n/a: {self.nvml.error or 'NVML energy counter unreadable'}"
            if m.energy_j is not None:
                m.mean_power_w = m.energy_j / m.wall_time_s if m.wall_time_s > 0 else None
            if self.cuda:
                m.cuda_peak_allocated_bytes = sum(int(torch.cuda.max_memory_allocated(d)) for d in self.cuda)
                m.cuda_peak_reserved_bytes = sum(int(torch.cuda.max_memory_reserved(d)) for d in self.cuda)
                m.nvml_used_bytes = self.nvml.used_bytes() if self.nvml else None
                m.nvml_devices = list(self.nvml.devices) if self.nvml and self.nvml.devices else None
            m.rss_bytes = _rss_bytes()
            m.load_avg_1m = load_average()
            m.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release_cached_memory(devices: list[torch.device]) -> None:
    """Between methods: return the allocator's cached blocks and reset the peaks, so that a method's peak
    (reserved) memory does not include what the methods before it left in the cache."""
    import gc

    gc.collect()
    for d in devices:
        if d.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(d)


def load_average() -> float | None:
    """The machine's 1-minute load average (``os.getloadavg``: runnable and uninterruptible threads, an
    exponentially decayed mean over about a minute, every process counted), rounded to 0.01; None where the system
    has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _rss_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:
        return None
