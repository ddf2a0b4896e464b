"""The CPU regression gate of this repository (.ci/run -> `.ci/gate ci_gate cpu --no-speed`).

The committed baseline results/baselines/cpu/ci_gate/ must belong to the current ci_gate preset, and a method that
drafts worse must fail the gate on τ while its (lossless) outputs stay those of the baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.engine.method import build_options
from harness.gate.baseline import Side
from harness.registry import get_method
from harness.run.config import config_from_dict, load_preset_dict

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "results" / "baselines" / "cpu" / "ci_gate"
# the CPU kernels .ci/gate pins, so that the numbers are those of the machine that saved the baseline
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def test_the_committed_baseline_belongs_to_the_preset():
    """A preset changed without refreshing its baseline makes every CI run fail (or compare other things); the
    baseline must also be complete and lossless, or the gate would start from a broken state."""
    side = Side.from_baseline(BASELINE)
    preset = config_from_dict(load_preset_dict("ci_gate")).to_dict()
    stored = side.provenance["config"]
    drop = ("output_dir", "data_dir")
    assert {k: v for k, v in stored.items() if k not in drop} == {k: v for k, v in preset.items() if k not in drop}
    labels = ["vanilla", "pld", "eagle2", "eagle3", "jakiro", "medusa"]
    assert side.cells["label"].tolist() == labels
    assert side.cells["n_errors"].tolist() == [0] * 6 and side.cells["lossless_share"].tolist() == [1.0] * 6
    assert len(side.turns) == 5 * len(labels)  # 4 tiny questions, one with two turns, per label
    assert side.cells.set_index("label")["tau"].gt(1.4).drop("vanilla").all()


@pytest.mark.parametrize("preset, device", [("ci_gate", "cpu"), ("gpu_gate", "cuda"), ("nightly_vicuna", "cuda")])
def test_the_gate_presets_are_valid(preset, device):
    """The GPU presets run only on the GPU runner: a typo in one (an unknown method or option, a bad value) must
    fail here, not on the runner at night."""
    cfg = config_from_dict(load_preset_dict(preset))
    assert cfg.device == device and cfg.temperatures == [0.0]
    for spec in cfg.methods:
        build_options(get_method(spec.name).Options, spec.options, f"{preset}: {spec.label}")


@pytest.mark.slow
def test_a_worse_draft_fails_the_cpu_gate(tmp_path, capsys):
    """eagle2 drafting from only the 8 most frequent tokens (draft_vocab 8 instead of 4096) accepts far less: the
    gate must exit 1 on τ for that cell, and on nothing else (its greedy outputs equal the baseline's)."""
    methods = [{"name": "eagle2", "options": {"total_tokens": 16, "depth": 3, "top_k": 4, "draft_vocab": 8}}]
    cmd = [sys.executable, "-m", "harness.cli", "run", "--preset", "ci_gate", "--device", "cpu", "--output-dir",
           str(tmp_path), "--no-progress", "--no-report", "--set", f"methods={json.dumps(methods)}"]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, **PINNED}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()
    code = main(["compare", str(BASELINE), str(run_dir), "--no-speed", "--labels", "eagle2", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1, report["findings"]
    assert [(f["cell"], f["rule"]) for f in report["findings"] if f["fails"]] == [("eagle2 / tiny / T=0", "tau")]
    (cell,) = report["cells"]
    assert cell["tau_new"] < 0.9 * cell["tau_base"] and cell["turns_changed"] == 0
