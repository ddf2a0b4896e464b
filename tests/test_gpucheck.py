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
                             "reference-speed", "divergence-bf16"]
    assert {n: r["status"] for n, r in results.items()} == {
        "gpu-tests": "SKIP", "lossless-fp32": "PASS", "memory-energy": "SKIP", "timers": "PASS",
        "host-syncs": "PASS", "compiled-fp32": "SKIP", "reference-speed": "SKIP", "divergence-bf16": "PASS"}
    assert results["lossless-fp32"]["data"]["eagle2"]["lossless_share"] == 1.0
    assert "gpu-check: PASS" in proc.stdout


def test_gpu_check_refuses_cuda_without_a_gpu():
    """On a machine without CUDA, asking for cuda is one clear line and exit status 2 (not a traceback)."""
    import torch

    from harness.gpucheck import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["--device", "cuda", "--skip-tests"]) == 2


class _Sample:
    def __init__(self, stamp: int, value: int):
        self.timeStamp = stamp
        self.sampleValue = type("V", (), {"uiVal": value})()


class _SamplingNvml:
    """The two pynvml calls gpu_utilisation makes, with literal samples."""
    NVML_GPU_UTILIZATION_SAMPLES = 1

    def __init__(self, samples, fail=False):
        self.samples, self.fail, self.asked = samples, fail, []

    def nvmlDeviceGetSamples(self, handle, kind, since):
        self.asked.append((handle, kind, since))
        if self.fail:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 0, self.samples


def test_gpu_utilisation_averages_the_drivers_samples_since_the_start():
    """The utilisation of a measurement is the mean of NVML's samples taken at or after its start (a sample from
    before it, e.g. 100% from the compile, must not count), asked once for the board read; no samples, no NVML or
    an NVML error give None, never 0 % (which would claim an idle GPU)."""
    from harness.gpucheck import gpu_utilisation

    fake = _SamplingNvml([_Sample(90, 100), _Sample(100, 20), _Sample(150, 40), _Sample(200, 90)])
    nvml = type("N", (), {"handle": "board0", "pynvml": fake})()
    assert gpu_utilisation(nvml, 100) == 50.0
    assert fake.asked == [("board0", 1, 100)]
    assert gpu_utilisation(type("N", (), {"handle": "board0", "pynvml": _SamplingNvml([])})(), 100) is None
    assert gpu_utilisation(type("N", (), {"handle": "b", "pynvml": _SamplingNvml([], fail=True)})(), 0) is None
    assert gpu_utilisation(type("N", (), {"handle": None, "pynvml": fake})(), 0) is None
    assert gpu_utilisation(None, 0) is None


@pytest.mark.slow
def test_reference_speed_holds_vanilla_against_generate_on_the_same_tokens():
    """The reference-speed check on a tiny target (CPU): four decoders (generate and vanilla, eager and compiled)
    each decode the budget REFERENCE_REPEATS times after a warm-up, vanilla's tokens equal generate's in both
    runtimes (else the comparison is of two different outputs), the ratios are the tokens/s quotients, and the
    status follows the rule: FAIL exactly when vanilla is more than REFERENCE_SLACK x slower than generate."""
    from harness.gpucheck import REFERENCE_REPEATS, REFERENCE_SLACK, check_reference_speed
    from tests.support.helpers import tiny_target

    target = tiny_target()
    result = check_reference_speed(target, "hello there", 12)
    rows, ratios = result.data["decoders"], result.data["ratios"]
    assert list(rows) == ["generate", "vanilla", "generate@compiled", "vanilla@compiled"]
    assert {n: r["tokens"] for n, r in rows.items()} == dict.fromkeys(rows, 12 * REFERENCE_REPEATS)
    assert result.data["tokens_equal"] is True
    speed = {n: r["tokens_per_s"] for n, r in rows.items()}
    assert ratios["vanilla/generate"] == pytest.approx(speed["vanilla"] / speed["generate"])
    slow = [k for k in ("vanilla/generate", "vanilla/generate@compiled") if ratios[k] * REFERENCE_SLACK < 1]
    assert result.status == ("FAIL" if slow else "PASS"), result.detail
    assert target.eos_ids == frozenset({4})  # EOS is restored after the check turned it off


def test_a_divergence_says_why_it_is_a_disagreement():
    """The detail of the divergence checks: a disagreement carries its reason (a FAIL line with only the kind left
    the reader of the H200 run guessing which condition failed), a tie stays short, and a turn without margins or
    tolerance is printed rather than crashing the check on the tolerance's format."""
    from harness.gpucheck import divergence_text
    from harness.measure.metrics import divergences

    def rec(ids, margins, runner_ups):
        return {"suite": "gpu-check", "question_id": "0", "turn": 0, "temperature": 0.0, "seed": 0,
                "dtype": "bfloat16", "output_ids": ids, "logit_margins": margins, "logit_tops": [20, 23.875],
                "logit_runner_ups": runner_ups}

    base = rec([5, 9], [1.0, 0.5], [0, 4])
    (d,) = divergences([rec([5, 6], [1.0, 0.125], [0, 9])], [base])
    assert divergence_text(d) == ("q0@1 disagreement (margins 0.125 / 0.5, tol 0.746): method's token 6 is not the "
                                  "baseline's runner-up 4")
    (d,) = divergences([rec([5, 6], [1.0, 0.125], [0, 9])], [rec([5, 9], [1.0, 0.0], [0, 4])])
    assert divergence_text(d) == "q0@1 tie (margins 0.125 / 0.0, tol 0.746)"
    (d,) = divergences([{**rec([5, 6], None, None), "logit_tops": None}], [{**base, "logit_tops": None}])
    assert divergence_text(d) == ("q0@1 unknown (margins None / 0.5, tol n/a): no logit margins in the method "
                                  "record")
