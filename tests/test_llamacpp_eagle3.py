"""llama.cpp's ``draft-eagle3`` with the shipped EAGLE-3 head (methods/heads/smollm2-135m/eagle3, EAGLE-3's
published format, arXiv 2503.01840), launched by a run as a served engine (``engine: openai``, ``launch:
llama.cpp``, harness/backends/launch.py): its greedy tokens equal the harness's vanilla, and its acceptance
counters equal the harness's eagle3 drafting a chain of 3 on the same turns. docs/engines.md (llama.cpp's server,
EAGLE-3) has the commands and the measured numbers.

Needs the llama-server binary at ``$DRAFTBENCH_LLAMA_SERVER`` inside its llama.cpp tree (``<tree>/build/bin/``),
whose ``convert_hf_to_gguf.py`` converts the target's folder and the head to F32 GGUFs in the test's tmp dir, run
with this python, which needs the converter's requirements (torch, transformers and sentencepiece, which it
imports for every Llama vocabulary). Skipped without them. About a minute on 2 CPU cores."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.launch import LLAMA_SERVER_ENV
from harness.measure.records import read_records
from harness.run.config import MethodSpec, RunConfig
from harness.run.runner import run
from methods import SHIPPED_HEADS

SERVER = Path(os.environ.get(LLAMA_SERVER_ENV) or "/nonexistent/llama-server")
# the llama.cpp tree the binary was built in (<tree>/build/bin/llama-server): the nearest folder above with the
# converter
CONVERTER = next((c for c in (d / "convert_hf_to_gguf.py" for d in SERVER.resolve().parents) if c.is_file()),
                 None) if SERVER.is_file() else None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVER.is_file(), reason=f"no llama-server binary at ${LLAMA_SERVER_ENV}"),
    pytest.mark.skipif(CONVERTER is None, reason="no convert_hf_to_gguf.py in a folder above the llama-server binary"),
    pytest.mark.skipif(importlib.util.find_spec("sentencepiece") is None,
                       reason="llama.cpp's converter imports sentencepiece, which this python lacks"),
]


def convert(folder: Path | str, out: Path, *extra: str) -> Path:
    """``folder`` (a Hugging Face model folder) as an F32 GGUF at ``out``, by llama.cpp's converter."""
    done = subprocess.run([sys.executable, str(CONVERTER), str(folder), *extra, "--outtype", "f32", "--outfile",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_llamacpp_draft_eagle3_is_lossless_and_accepts_what_the_harness_chain_of_3_accepts(
        tmp_path, data_dir, real_target):
    # the target's own fp32 weights (the folder the harness loads), so that both engines compute in fp32
    target = convert(real_target.path, tmp_path / "target-f32.gguf")
    head = convert(SHIPPED_HEADS / "smollm2-135m" / "eagle3", tmp_path / "eagle3-f32.gguf",
                   "--target-model-dir", real_target.path)
    cfg = RunConfig(methods=[
        MethodSpec("vanilla"),
        MethodSpec("eagle3", "eagle3-k3", {"total_tokens": 4, "depth": 3, "top_k": 1}),  # a chain of 3 (root counted)
        MethodSpec("eagle3", "llamacpp-eagle3", engine="openai", referee="eagle3-k3", engine_options={
            "launch": "llama.cpp", "api": "completions", "gguf": str(target), "threads": 1, "parallel": 1,
            "spec_type": "draft-eagle3", "spec_draft_model": str(head), "spec_draft_n_max": 3}),
    ], suites=["mt_bench"], questions=["83"], max_new_tokens=64, warmup=0, data_dir=str(data_dir),
        output_dir=str(tmp_path / "runs"))
    recs = read_records(run(cfg, target=real_target, progress=False))
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs), [r["error"] for r in recs if r["error"]]
    by = {(r["label"], r["turn"]): r for r in recs}
    for turn in (0, 1):
        served, chain = by[("llamacpp-eagle3", turn)], by[("eagle3-k3", turn)]
        # lossless: llama.cpp verifying the head's drafts emits the harness's vanilla tokens
        assert served["output_ids"] == by[("vanilla", turn)]["output_ids"], turn
        # the same head drafting the same chain: llama.cpp's counters are the harness's steps, position by position
        # (MT-bench 83 at 64 tokens: no step near the budget, where llama.cpp drafts less than the harness)
        accepted = chain["accepted_drafts"]
        assert served["engine_counters"]["drafts"] == len(accepted), turn
        assert served["engine_counters"]["accepted_per_pos"] == [sum(a > i for a in accepted) for i in range(3)]
    # the counts of the measured run (docs/engines.md): 44 and 37 drafts
    assert [by[("llamacpp-eagle3", t)]["engine_counters"]["accepted_per_pos"] for t in (0, 1)] == [[13, 5, 1],
                                                                                                  [19, 4, 3]]
