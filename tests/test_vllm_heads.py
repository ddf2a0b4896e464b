"""The shipped heads in vLLM, for real (harness/backends/vllm.py): each head shipped for the default model loads in
the vLLM engine and its drafts are accepted on an MT-bench question, with outputs equal to the harness's vanilla
(greedy, lossless). The shipped EAGLE-1 head is bias-free (vLLM's EAGLE-1 draft has no fc bias; a head with one is
refused in one line: tests/test_backends.py) and runs there as shipped. Needs vLLM's venv (`make vllm-setup`);
skipped without it. One vLLM entry per run (each holds about 4 GB on CPU), loading takes about a minute on 2 CPU
cores. The shipped EAGLE-3 head's run in vLLM is tests/test_vllm_engine.py's (not repeated here: a minute of CI)."""

from pathlib import Path

import pytest

from harness.backends import vllm as V
from harness.measure.records import read_records
from harness.run.config import MethodSpec, RunConfig
from harness.run.runner import run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),  # one vLLM engine at a time under `make test`'s workers (Makefile, test)
    pytest.mark.skipif(not Path(V.python()).is_file(),
                       reason=f"vLLM's venv is absent ({V.python()}): `make vllm-setup` creates it"),
]


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


@pytest.mark.parametrize("method, engine_options", [
    ("medusa", None),  # eagle3's shipped head: tests/test_vllm_engine.py
    ("eagle1", {"speculative_config": {"num_speculative_tokens": 3}}),
])
def test_shipped_head_drafts_are_accepted_in_vllm(tmp_path, data_dir, real_target, monkeypatch, method,
                                                  engine_options):
    # before the Medusa head was written for vLLM (medusa_fc_bias, the target's lm_head), vLLM loaded it and
    # accepted 0 drafted tokens: its ResBlock biases were dropped and its lm_heads never loaded; the EAGLE-1 head
    # shipped until 2026-12 had an fc bias vLLM drops, and accepted 0 of 378 drafted tokens there
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    entry = MethodSpec(method, f"vllm-{method}", {}, engine="vllm", engine_options=engine_options)
    recs = vllm_run(tmp_path, data_dir, real_target, entry)
    assert sum(r["engine_counters"]["accepted_tokens"] for r in recs) > 0
