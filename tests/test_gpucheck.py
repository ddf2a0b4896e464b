"""``make gpu-check``'s script, run on CPU (``--device cpu --dry``): the same checks and code paths as on a GPU,
with one short prompt; the GPU-only readings are reported as skipped, never as passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_dry_run_on_cpu(tmp_path):
    """Every check prints PASS/SKIP/FAIL and the run exits 0 when nothing failed; memory/energy (CUDA only) and the
    compiled runtime (CUDA, or --compiled) are SKIPs with the reason; the JSON report has one entry per check. A
    check that crashes would be a FAIL."""
    out = tmp_path / "gpucheck.json"
    cmd = [sys.executable, "-m", "harness.gpucheck", "--device", "cpu", "--dry", "--skip-tests",
           "--methods", "vanilla,pld,eagle2", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["name"]: r for r in json.loads(out.read_text())}
    assert list(results) == ["gpu-tests", "lossless-fp32", "memory-energy", "timers", "host-syncs", "compiled-fp32",
                             "divergence-bf16"]
    assert {n: r["status"] for n, r in results.items()} == {
        "gpu-tests": "SKIP", "lossless-fp32": "PASS", "memory-energy": "SKIP", "timers": "PASS",
        "host-syncs": "PASS", "compiled-fp32": "SKIP", "divergence-bf16": "PASS"}
    assert results["lossless-fp32"]["data"]["eagle2"]["lossless_share"] == 1.0
    assert "gpu-check: PASS" in proc.stdout


def test_gpu_check_refuses_cuda_without_a_gpu():
    """On a machine without CUDA, asking for cuda is one clear line and exit status 2 (not a traceback)."""
    import torch

    from harness.gpucheck import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["--device", "cuda", "--skip-tests"]) == 2
