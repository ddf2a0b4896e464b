"""vLLM as a run's engine, for real (harness/backends/vllm.py): the default model's greedy outputs under vLLM vanilla,
ngram (draftbench's pld) and eagle3 with the shipped head (every prefill chunked) equal the harness's vanilla
on two MT-bench questions, and the speculative entries report vLLM's own acceptance counters and forwards. Needs
vLLM's venv (`make vllm-setup`); skipped without it. Loading takes about a minute per entry on 2 CPU cores, each
entry holds about 4 GB."""

import json
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


def test_vllm_outputs_equal_harness_vanilla_and_counters_are_vllms(tmp_path, data_dir, real_target, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    cfg = RunConfig(methods=[
        MethodSpec("vanilla"),
        MethodSpec("vanilla", "vllm-vanilla", engine="vllm"),
        MethodSpec("pld", "vllm-ngram", {"num_draft_tokens": 4, "min_ngram": 2, "max_ngram": 3}, engine="vllm"),
        # every prefill in chunks of at most 32 tokens: vLLM counts a turn's prefill once all the same (one entry
        # both ways: each entry loads an engine, about a minute of CI)
        MethodSpec("eagle3", "vllm-eagle3", {"depth": 3}, engine="vllm",
                   engine_options={"max_num_batched_tokens": 32, "max_num_seqs": 4}),
    ], suites=["mt_bench"], limit=2, max_new_tokens=32, warmup=0, data_dir=str(data_dir),
        output_dir=str(tmp_path))
    run_dir = run(cfg, target=real_target, progress=False)
    recs = read_records(run_dir)
    assert len(recs) == 16 and all(r["status"] == "ok" for r in recs), [r["error"] for r in recs if r["error"]]
    reference = {(r["question_id"], r["turn"]): r["output_ids"] for r in recs if r["label"] == "vanilla"}
    for r in recs:  # greedy and lossless: every engine and method must give the harness's vanilla tokens
        assert r["output_ids"] == reference[(r["question_id"], r["turn"])], (r["label"], r["question_id"], r["turn"])
    for r in recs:
        if r["label"] == "vllm-vanilla":
            assert set(r["engine_counters"].values()) == {None}  # no speculation: n/a, never 0
        elif r["label"] in ("vllm-ngram", "vllm-eagle3"):
            c = r["engine_counters"]
            assert c["accepted_tokens"] == sum(c["accepted_per_pos"]) == sum(r["accepted_drafts"])
            assert sum(r["accept_lengths"]) == r["new_tokens"]
    for r in recs:  # vLLM's own count of forwards (its engine iterations) fits its steps on every turn
        assert not [n for n in r.get("engine_notes") or [] if "do not fit" in n], (r["label"], r.get("engine_notes"))
    assert max(r["prompt_tokens"] for r in recs) > 64  # the chunked entry's prefills took 3 chunks and more
    eagle3 = [r["engine_counters"] for r in recs if r["label"] == "vllm-eagle3"]
    assert sum(c["accepted_tokens"] for c in eagle3) > 0  # the shipped head loads and its drafts are accepted
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["engines"]["vllm-eagle3"]["config"]["speculative_config"]["method"] == "eagle3"
    assert manifest["engines"]["vllm-eagle3"]["version"]
