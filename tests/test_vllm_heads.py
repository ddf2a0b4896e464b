"""The shipped heads in vLLM, for real (harness/backends/vllm.py): each head shipped for the default model loads in
the vLLM engine and its drafts are accepted on an MT-bench question, with outputs equal to the harness's vanilla
(greedy, lossless); the shipped EAGLE-1 head, which has an fc bias vLLM's EAGLE-1 draft lacks, is refused in one
line, and the same head without that bias runs there. Needs vLLM's venv (`make vllm-setup`); skipped without it.
One vLLM entry per run (each holds about 4 GB on CPU), loading takes about a minute on 2 CPU cores. The shipped
EAGLE-3 head's run in vLLM is tests/test_vllm_engine.py's (not repeated here: a minute of CI)."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from harness.backends import vllm as V
from harness.backends.contract import EngineError
from harness.measure.records import read_records
from harness.run.config import MethodSpec, RunConfig
from harness.run.runner import run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),  # one vLLM engine at a time under `make test`'s workers (Makefile, test)
    pytest.mark.skipif(not Path(V.python()).is_file(),
                       reason=f"vLLM's venv is absent ({V.python()}): `make vllm-setup` creates it"),
]
HEADS = Path(__file__).resolve().parents[1] / "methods" / "heads" / "smollm2-135m"


def vllm_run(tmp_path, data_dir, target, entry: MethodSpec) -> list[dict]:
    cfg = RunConfig(methods=[MethodSpec("vanilla"), entry], suites=["mt_bench"], limit=1, max_new_tokens=32,
                    warmup=0, data_dir=str(data_dir), output_dir=str(tmp_path))
    recs = read_records(run(cfg, target=target, progress=False))
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs), [r["error"] for r in recs if r["error"]]
    reference = {r["turn"]: r["output_ids"] for r in recs if r["label"] == "vanilla"}
    engine = [r for r in recs if r["label"] == entry.label]
    for r in engine:  # greedy: vLLM's speculation must give the harness's vanilla tokens
        assert r["output_ids"] == reference[r["turn"]], r["turn"]
    return engine


@pytest.mark.parametrize("method, options", [("medusa", {})])  # eagle3's shipped head: tests/test_vllm_engine.py
def test_shipped_head_drafts_are_accepted_in_vllm(tmp_path, data_dir, real_target, monkeypatch, method, options):
    # before the Medusa head was written for vLLM (medusa_fc_bias, the target's lm_head), vLLM loaded it and
    # accepted 0 drafted tokens: its ResBlock biases were dropped and its lm_heads never loaded
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    recs = vllm_run(tmp_path, data_dir, real_target, MethodSpec(method, f"vllm-{method}", options, engine="vllm"))
    assert sum(r["engine_counters"]["accepted_tokens"] for r in recs) > 0


def test_shipped_eagle1_head_is_refused_and_runs_without_its_fc_bias(tmp_path, data_dir, real_target, monkeypatch):
    spec = {"speculative_config": {"num_speculative_tokens": 3}}
    with pytest.raises(EngineError, match=r"has an fc bias \(config.json bias: true\)"):
        V.speculative_config("eagle1", None, set(), "smollm2-135m", spec)
    # the same head with fc.bias removed and `bias: false` (another, slightly worse network): vLLM's EAGLE-1 path
    # itself works, so the fc bias is the whole reason the shipped head accepted nothing there
    head = tmp_path / "eagle-no-fc-bias"
    head.mkdir()
    config = json.loads((HEADS / "eagle" / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**config, "bias": False}))
    weights = load_file(str(HEADS / "eagle" / "model.safetensors"))
    weights.pop("fc.bias")
    save_file(weights, str(head / "model.safetensors"))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    recs = vllm_run(tmp_path / "run", data_dir, real_target,
                    MethodSpec("eagle1", "vllm-eagle1", {"head": str(head)}, engine="vllm", engine_options=spec))
    assert sum(r["engine_counters"]["accepted_tokens"] for r in recs) > 0
    shutil.rmtree(head)
