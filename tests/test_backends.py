"""Backends (harness/backends): the contract's derived counts, the method -> vLLM mapping, the engine fields of a run
configuration, and the worker protocol's failure modes against a fake worker (tests/support/fake_engine_worker.py); the
runner hands an entry's turns to its backend, records an engine failure as an error and re-runs it on resume."""

import json
import sys
from pathlib import Path

import pytest

from harness.backends import check_engine, vllm_worker
from harness.backends import vllm as V
from harness.backends.contract import BackendError, EngineError, TurnRequest, accept_lengths
from harness.backends.worker import Worker
from harness.cli import build_parser
from harness.cli.run import config_from_args
from harness.engine.method import build_options
from harness.measure.records import read_records
from harness.registry import get_method
from harness.run.config import ConfigError, MethodSpec, RunConfig, config_from_dict
from harness.run.runner import Distributed, run
from tests.support.helpers import jsonl_file, tiny_target

FAKE = str(Path(__file__).resolve().parent / "support" / "fake_engine_worker.py")
EAGLE3_HEAD = Path(__file__).resolve().parents[1] / "methods" / "heads" / "smollm2-135m" / "eagle3"


def mapped(method, target="smollm2-135m", engine_options=None, **options):
    opts = build_options(get_method(method).Options, options, method)
    return V.speculative_config(method, opts, set(options), target, engine_options)


def test_accept_lengths_from_engine_steps():
    # prefill token, accepted + 1 per drafting step, 1 per forward that drafted nothing, cut at the turn's length;
    # if this failed, tau and steps of engine turns would not match what the harness counts for its own turns
    assert accept_lengths([2, 0, 1], 7, True) == [1, 3, 1, 2]
    assert accept_lengths([2, 0, 1], 9, True) == [1, 3, 1, 2, 1, 1]
    assert accept_lengths([2, 0, 1], 5, True) == [1, 3, 1]
    assert accept_lengths([2], 2, True) == [1, 1]
    assert accept_lengths(None, 3, False) == [1, 1, 1]
    assert accept_lengths(None, 3, True) is None  # speculation without step counts: not derivable, never guessed


def test_accept_lengths_with_the_engines_forward_count():
    # vLLM counts a last step's accepted tokens past the budget: from the steps alone, ([4, 2], 8) reads as 3
    # forwards (tau 2.67); with the engine's 4 forwards, one drafted nothing and the last step kept one token
    # (tau 2.0). If this failed, an engine entry's tau would be overstated whenever a method sometimes drafts nothing.
    assert accept_lengths([4, 2], 8, True) == [1, 5, 2]
    assert accept_lengths([4, 2], 8, True, forwards=4) == [1, 5, 1, 1]
    assert accept_lengths([2, 0, 1], 9, True, forwards=6) == [1, 3, 1, 2, 1, 1]  # agrees where nothing ran past
    assert accept_lengths([2, 0, 1], 9, True, forwards=3) == [1, 3, 1, 2, 1, 1]  # does not fit: from the steps
    assert accept_lengths([], 3, True, forwards=3) == [1, 1, 1]


def test_the_vllm_worker_reads_counters_and_iterations_from_one_get_metrics():
    # vLLM's metric objects (vllm/v1/metrics/reader.py: Counter .value, Vector .values, Histogram .count), two
    # engines; one get_metrics() a reading (the worker used to call it twice before and twice after each turn).
    # The iterations' difference is the turn's forwards as it is: vLLM observes only steps that gave a token, so a
    # chunked prefill's partial chunks are not in it (were they subtracted, a long prompt's turn would lose forwards)
    from types import SimpleNamespace as M

    class LLM:
        calls = 0

        def get_metrics(self):
            LLM.calls += 1
            return [M(name="vllm:spec_decode_num_drafts", value=4), M(name="vllm:spec_decode_num_drafts", value=1),
                    M(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[3, 1]),
                    M(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[1, 0]),
                    M(name="vllm:iteration_tokens_total", count=40, sum=97, buckets={}),
                    M(name="vllm:iteration_tokens_total", count=2, sum=5, buckets={}),
                    M(name="vllm:num_requests_running", value=0)]

    counters, iterations = vllm_worker.read_metrics(LLM())
    assert counters == {"drafts": 5, "draft_tokens": None, "accepted_tokens": None, "accepted_per_pos": [4, 1]}
    assert (iterations, LLM.calls) == (42, 1)  # absent counters None (n/a), never 0


def test_methods_map_to_vllm_speculative_configs():
    # what vLLM runs for each draftbench method; a wrong key would silently run another configuration
    assert mapped("vanilla") is None
    assert mapped("pld") == {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_min": 1,
                             "prompt_lookup_max": 3}
    assert mapped("pld", num_draft_tokens=4, min_ngram=2) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    assert mapped("eagle3", depth=3) == {"method": "eagle3", "num_speculative_tokens": 3, "model": str(EAGLE3_HEAD)}
    assert mapped("eagle2", head="/heads/mine") == {"method": "eagle", "model": "/heads/mine",
                                                   "num_speculative_tokens": 5}
    assert mapped("medusa") == {"method": "medusa", "model": str(EAGLE3_HEAD.with_name("medusa")),
                                "num_speculative_tokens": 4}  # one token per head of the shipped head's config
    assert mapped("vanilla", engine_options={"speculative_config": {"method": "suffix"}}) == {"method": "suffix"}
    assert V.llm_options({"speculative_config": {"method": "mtp"}, "tensor_parallel_size": 2}) == {
        "tensor_parallel_size": 2}
    # a long-context run: room for its longest prompt and answer past the worker's 2048 positions, where vLLM would
    # refuse a 2048-token prompt; below that the default stays, and the entry's own max_model_len wins
    assert V.llm_options({}, positions=2112) == {"max_model_len": 2112}
    assert V.llm_options({}, positions=576) == {}
    assert V.llm_options({"max_model_len": 4096}, positions=8192) == {"max_model_len": 4096}
    # a speculative entry gets its drafter's room (2k - 2 past the turn's end: vLLM drafts only while the sequence + k
    # fits max_model_len, else it verifies dummy drafts of token 0), within the target's window; without it a
    # 4096-token prompt's last 3 drafting steps (k = 3) were dummies and its τ read low
    k3 = {"method": "eagle3", "num_speculative_tokens": 3}
    assert V.drafter_room(k3) == 4 and V.drafter_room(None) == 0 and V.drafter_room({"num_speculative_tokens": 1}) == 0
    assert V.llm_options({}, positions=4160, speculative=k3, window=8192) == {"max_model_len": 4164}
    assert V.llm_options({}, positions=4160, speculative=k3, window=4162) == {"max_model_len": 4162}
    assert V.llm_options({}, positions=2046, speculative=k3, window=8192) == {"max_model_len": 2050}
    assert V.llm_options({}, positions=4160, speculative=None, window=8192) == {"max_model_len": 4160}
    assert V.llm_options({"max_model_len": 4160}, positions=4160, speculative=k3) == {"max_model_len": 4160}


def test_what_vllm_cannot_run_is_one_clear_error():
    with pytest.raises(EngineError, match=r"cannot run method 'jakiro'; it runs vanilla, pld, eagle1, eagle2, "
                                          r"eagle3, medusa, sps"):
        mapped("jakiro")
    with pytest.raises(EngineError, match=r"option\(s\) top_k have no vLLM equivalent .* it maps head, depth"):
        mapped("eagle3", top_k=1)
    with pytest.raises(EngineError, match="needs the chain length"):
        mapped("eagle1", head="/heads/on-the-hub")
    # vLLM's ngram copies after the earliest occurrence: pld's own rule (the most recent one) would run as another
    # method in vLLM, so it is refused, and the rule vLLM has built in maps to no key (the referee's twin carries it)
    with pytest.raises(EngineError, match=r"'pld': occurrence=recent has no vLLM equivalent; vLLM's ngram has "
                                          r"occurrence=earliest built in"):
        mapped("pld", occurrence="recent")
    assert mapped("pld", num_draft_tokens=4, occurrence="earliest") == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    with pytest.raises(EngineError, match="no eagle3 head is shipped for target 'tiny-llama'"):
        mapped("eagle3", target="tiny-llama")
    with pytest.raises(EngineError, match="option draft .* is required"):
        mapped("sps")
    with pytest.raises(EngineError, match="unknown engine 'sglang'; use harness or vllm"):
        check_engine("sglang", "vanilla", None, set(), "smollm2-135m", None)


def eagle_head_folder(folder, **config):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return str(folder)


def test_eagle_heads_with_an_fc_bias_are_refused(tmp_path):
    # vLLM's EAGLE-1 draft has no fc bias and reads `bias` as attention biases: such a head loads there and accepts
    # nothing (the EAGLE-1 head shipped until 2026-12 did: 0 of 378 drafted tokens); if this failed, a run would
    # measure garbage
    spec = {"speculative_config": {"num_speculative_tokens": 3}}
    biased = eagle_head_folder(tmp_path / "biased", bias=True)
    with pytest.raises(EngineError, match=r"cannot run the EAGLE head .*/biased: it has an fc "
                                          r"bias \(config.json bias: true\).*--option bias=false"):
        mapped("eagle1", head=biased, engine_options=spec)
    absent = eagle_head_folder(tmp_path / "absent")  # EAGLE's loader reads an absent `bias` as true
    with pytest.raises(EngineError, match="bias: true"):
        mapped("eagle2", head=absent, engine_options=spec)
    plain = eagle_head_folder(tmp_path / "plain", bias=False)
    assert mapped("eagle2", head=plain, depth=3) == {"method": "eagle", "model": plain, "num_speculative_tokens": 3}
    # the shipped EAGLE-1 head is bias-free (trained with --option bias=false): vLLM gets it as it is
    shipped = str(Path(__file__).resolve().parents[1] / "methods" / "heads" / "smollm2-135m" / "eagle")
    assert mapped("eagle1", engine_options=spec) == {"method": "eagle", "model": shipped, "num_speculative_tokens": 3}


def write_safetensors(path, tensors):
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def test_medusa_heads_are_written_as_vllms_medusa_reads_them(tmp_path):
    import torch
    from safetensors.torch import load_file

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    embed = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # [V=3, H=2]
    write_safetensors(target / "model.safetensors", {"model.embed_tokens.weight": embed})
    head = tmp_path / "medusa"
    head.mkdir()
    config = {"medusa_num_heads": 1, "medusa_num_layers": 1, "medusa_share_lm_head": True}
    (head / "config.json").write_text(json.dumps(config))
    weights = {"0.0.linear.weight": torch.tensor([[0.5, 0.0], [0.0, 0.5]]), "0.0.linear.bias": torch.tensor([1., 2.])}
    write_safetensors(head / "medusa_lm_head.safetensors", weights)
    out = V.medusa_for_vllm(str(head), str(target), tmp_path / "out")
    # vLLM's Medusa: ResBlock biases only with medusa_fc_bias, and a shared lm_head only as original_lm_head, read
    # from head 0's lm_head key; without either it drafts from dropped biases and uninitialised lm_heads
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {
        **config, "medusa_fc_bias": True, "original_lm_head": True}
    got = load_file(str(Path(out) / "medusa_lm_head.safetensors"))
    assert sorted(got) == ["0.0.linear.bias", "0.0.linear.weight", "0.1.weight"]
    assert torch.equal(got["0.1.weight"], embed) and torch.equal(got["0.0.linear.weight"], weights["0.0.linear.weight"])
    # a head with its own lm_heads and the bias flag is vLLM's already: used as it is
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text(json.dumps({**config, "medusa_share_lm_head": False, "medusa_fc_bias": True}))
    assert V.medusa_for_vllm(str(own), str(target), tmp_path / "unused") == str(own)
    assert not (tmp_path / "unused").exists()


def test_engine_in_the_run_configuration(tmp_path):
    cfg = config_from_dict({"engine": "vllm", "engine_options": {"max_model_len": 1024},
                            "methods": ["vanilla", {"name": "pld", "engine": "harness", "label": "pld-h"}]})
    entries = {e.label: (e.engine, e.engine_options) for e in cfg.entries()}
    assert entries == {"vanilla": ("vllm", {"max_model_len": 1024}), "pld-h": ("harness", {"max_model_len": 1024})}
    # the default leaves the configuration (and so its digest) as runs before engines wrote it
    d = RunConfig().to_dict()
    assert "engine" not in d and "engine_options" not in d and "engine" not in d["methods"][0]
    with pytest.raises(ConfigError, match=r"run.engine: unknown engine 'vlm'; use harness or vllm"):
        config_from_dict({"engine": "vlm"})
    with pytest.raises(ConfigError, match=r"run.methods\[0\].engine: unknown engine"):
        config_from_dict({"methods": [{"name": "vanilla", "engine": "trt"}]})
    with pytest.raises(ConfigError, match="runtime compiled is the harness engine's"):
        config_from_dict({"engine": "vllm", "runtime": ["compiled"]})
    args = build_parser().parse_args(["run", "--engine", "vllm", "--methods", "vanilla"])
    assert config_from_args(args).engine == "vllm"


@pytest.fixture()
def fake_vllm(monkeypatch):
    """VLLMBackend starts the fake worker; returns a setter for its behaviour (FAKE_WORKER)."""
    monkeypatch.setenv(V.PYTHON_ENV, sys.executable)
    monkeypatch.setattr(V, "WORKER", Path(FAKE))
    return lambda mode: monkeypatch.setenv("FAKE_WORKER", mode)


REQUEST = TurnRequest([{"role": "user", "content": "hi"}], [1, 2, 3], 4)


def test_fake_worker_turn_and_counters(fake_vllm):
    fake_vllm("ok")
    backend = V.VLLMBackend("/models/t", "float32", {"method": "ngram"})
    try:
        turn = backend.generate(REQUEST)
        assert (turn.token_ids, turn.ttft_s, turn.accepted_per_pos) == ([10, 11, 12, 13], 0.002, [2, 1])
        assert backend.describe()["version"] == "0.0-fake"
    finally:
        backend.close()
    backend.close()  # twice is harmless
    fake_vllm("ok")
    plain = V.VLLMBackend("/models/t", "float32", None)
    try:
        assert plain.generate(REQUEST).drafts is None  # no counter: n/a, never 0
    finally:
        plain.close()


@pytest.mark.parametrize("mode, when, message", [
    ("exit_at_start", "load", r"exited during load \(exit code 3\); its log ends: fake worker: cannot import vllm"),
    ("fail_load", "load", r"failed in load: ValueError: no such model"),
    ("die_at=1", "generate", r"exited during generate \(exit code 9\); its log ends: fake worker: killed mid-turn"),
    ("garbage_at=1", "generate", r"malformed reply to generate: b?'INFO vLLM says hello'"),
])
def test_worker_failures_are_one_clear_line(fake_vllm, mode, when, message):
    fake_vllm(mode)
    if when == "load":
        with pytest.raises(BackendError, match=message):
            V.VLLMBackend("/models/t", "float32", None)
        return
    backend = V.VLLMBackend("/models/t", "float32", None)
    try:
        with pytest.raises(BackendError, match=message):
            backend.generate(REQUEST)
    finally:
        backend.close()


def test_worker_that_cannot_start_or_hangs(fake_vllm, monkeypatch):
    with pytest.raises(BackendError, match="cannot start /nonexistent/python"):
        Worker(["/nonexistent/python"])
    monkeypatch.setenv(V.PYTHON_ENV, "/nonexistent/python")
    with pytest.raises(EngineError, match="no python at /nonexistent/python; create vLLM's venv with `make vllm-s"):
        V.VLLMBackend("/models/t", "float32", None)
    monkeypatch.setenv(V.PYTHON_ENV, sys.executable)
    fake_vllm("hang")
    monkeypatch.setattr(V, "TURN_TIMEOUT_S", 0.5)
    backend = V.VLLMBackend("/models/t", "float32", None)
    with pytest.raises(BackendError, match="did not answer generate within 0.5 s"):
        backend.generate(REQUEST)
    backend.worker.close(timeout=0.5)  # kills what does not exit
    assert backend.worker.proc.returncode is not None


QUESTIONS = [{"question_id": i, "category": "c", "turns": [f"q{i}", "and then?"]} for i in (1, 2, 3)]


def engine_run(tmp_path, resume=None):
    suite = tmp_path / "q.jsonl"
    jsonl_file(suite, QUESTIONS)
    cfg = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("pld", "pld-vllm", engine="vllm")],
                    suites=[str(suite)], max_new_tokens=4, warmup=0, output_dir=str(tmp_path / "results"))
    return run(None if resume else cfg, resume=resume, target=tiny_target(eos=False), progress=False)


def test_runner_records_engine_turns_and_resume_reruns_engine_failures(tmp_path, fake_vllm):
    fake_vllm("die_at=3")  # the worker dies in question 2's first turn
    run_dir = engine_run(tmp_path)
    recs = {(r["label"], r["question_id"], r["turn"]): r for r in read_records(run_dir)}
    ok = recs[("pld-vllm", "1", 0)]
    assert (ok["engine"], ok["engine_version"], ok["output_ids"]) == ("vllm", "0.0-fake", [10, 11, 12, 13])
    assert ok["accept_lengths"] == [1, 3] and ok["accepted_drafts"] == [2, 1]  # prefill, then 2 + 1 (cut at 4)
    assert ok["engine_counters"] == {"drafts": 2, "draft_tokens": 4, "accepted_tokens": 3, "accepted_per_pos": [2, 1]}
    assert ok["prefill_time_s"] == 0.002 and ok["stop_reason"] == "max_new_tokens"
    died = recs[("pld-vllm", "2", 0)]
    assert died["status"] == "error" and died["retry"] and "exited during generate (exit code 9)" in died["error"]
    assert recs[("pld-vllm", "3", 0)]["status"] == "error"  # no failed turn is a success
    assert "engine" not in recs[("vanilla", "1", 0)]  # the harness's own records are as before
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["engines"]["pld-vllm"]["config"] == {"model": "tiny-llama"}
    fake_vllm("ok")
    engine_run(tmp_path, resume=run_dir)
    again = read_records(run_dir)
    assert len(again) == 12 and all(r["status"] == "ok" for r in again)


def test_an_engine_entry_is_refereed_against_the_harness_entry_its_referee_key_names(tmp_path, fake_vllm):
    """From the run configuration to the report: the `referee:` key travels in the manifest and pairs the engine's
    pld with the harness's (their deepest drafts differ, so only the key can pair them); every measured turn of the
    engine gets a row, held against the harness's vanilla for its output."""
    from harness.report.report import write_report

    fake_vllm("ok")
    suite = tmp_path / "q.jsonl"
    jsonl_file(suite, QUESTIONS)
    cfg = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("pld"),
                             MethodSpec("pld", "pld-vllm", engine="vllm", referee="pld")],
                    suites=[str(suite)], max_new_tokens=4, warmup=0, output_dir=str(tmp_path / "results"))
    run_dir = run(cfg, target=tiny_target(eos=False), progress=False)
    write_report(run_dir)
    text = (run_dir / "tables" / "referee.csv").read_text()
    assert "NaN" not in text  # lists of rates as strict JSON: a position not drafted is null
    rows = [line.split(",")[:3] for line in text.splitlines()[1:]]
    assert rows == [["pld-vllm", "pld", "vanilla"]] * 6  # 3 questions x 2 turns
    assert "`pld-vllm` against `pld` (referee key (pld))" in (run_dir / "tables" / "summary.md").read_text()


def test_parallelism_passes_through_to_llm_and_is_checked_first():
    # tensor / pipeline parallelism and the executor are LLM(...) arguments; a wrong one must fail before a target
    # loads, and the worker's defaults must not override what the run asked for
    assert vllm_worker.llm_kwargs({"model": "m", "dtype": "float32", "speculative_config": None, "llm": {
        "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "distributed_executor_backend": "ray",
        "max_model_len": 1024}}) == {
        "model": "m", "tokenizer": "m", "dtype": "float32", "enforce_eager": True, "max_model_len": 1024,
        "disable_log_stats": False, "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray"}
    assert vllm_worker.llm_kwargs({"model": "m", "dtype": "float32", "speculative_config": {"method": "ngram"}})[
        "per_request_spec_decode_metrics"] == "detailed"
    args = build_parser().parse_args(["run", "--engine", "vllm", "--methods", "vanilla", "--set",
                                      "engine_options={tensor_parallel_size: 2, distributed_executor_backend: ray}"])
    assert config_from_args(args).entries()[0].engine_options == {"tensor_parallel_size": 2,
                                                                  "distributed_executor_backend": "ray"}
    with pytest.raises(EngineError, match=r"engine_options.tensor_parallel_size must be an integer >= 1, got '2'"):
        check_engine("vllm", "vanilla", None, set(), "smollm2-135m", {"tensor_parallel_size": "2"})
    with pytest.raises(EngineError, match=r"engine_options.pipeline_parallel_size must be an integer >= 1, got 0"):
        V.llm_options({"pipeline_parallel_size": 0})
    with pytest.raises(EngineError, match=r"distributed_executor_backend must be one of mp, ray, uni, external_launc"):
        V.llm_options({"distributed_executor_backend": "slurm"})


def test_parallelism_reaches_the_worker_the_manifest_and_the_records(tmp_path, fake_vllm):
    fake_vllm("ok")
    suite = tmp_path / "q.jsonl"
    suite.write_text(json.dumps(QUESTIONS[0]) + "\n")
    options = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "distributed_executor_backend": "mp"}
    cfg = RunConfig(methods=[MethodSpec("vanilla", "v-tp", engine="vllm", engine_options=options)],
                    suites=[str(suite)], max_new_tokens=4, warmup=0, output_dir=str(tmp_path / "results"))
    run_dir = run(cfg, target=tiny_target(eos=False), progress=False)
    engine = json.loads((run_dir / "manifest.json").read_text())["engines"]["v-tp"]
    assert engine["config"] == {"model": "tiny-llama", **options}  # what LLM(...) got, as the worker echoed it
    assert engine["parallel"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "world_size": 4}
    assert json.loads((run_dir / "manifest.json").read_text())["config"]["methods"][0]["engine_options"] == options
    assert [r["engine_options"] for r in read_records(run_dir)] == [options, options]


def test_an_engine_entry_refuses_a_data_parallel_harness_run(tmp_path, fake_vllm, monkeypatch):
    # under accelerate launch every process would start its own vLLM on the same GPUs: vLLM parallelises itself
    monkeypatch.setattr(Distributed, "detect", classmethod(lambda cls: cls(0, 2)))
    suite = tmp_path / "q.jsonl"
    suite.write_text(json.dumps(QUESTIONS[0]) + "\n")
    cfg = RunConfig(methods=[MethodSpec("vanilla", "v", engine="vllm")], suites=[str(suite)], output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"entry 'v' runs on engine vllm, which parallelises itself: run it in one "
                                          r"process"):
        run(cfg, target=tiny_target(), progress=False)


def test_the_vllm_worker_does_not_outlive_a_killed_harness(tmp_path):
    """A harness killed mid-run (SIGKILL: no close, no finally) must not leave its vLLM worker behind holding memory
    and cores: the worker leaves on its own once its parent is gone. The worker's stdin stays open here (another
    process holds the pipe), as for a worker busy in vLLM that is not reading it: only the parent's death can tell."""
    import os
    import signal
    import subprocess
    import sys
    import time

    def running(pid: int) -> bool:  # a process that exited but was not reaped yet (a zombie) is not running
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    parent = subprocess.Popen([sys.executable, "-c", (  # the harness: starts the worker as the vLLM backend does
        "import subprocess, sys, time\n"
        "from harness.backends.worker import Worker\n"
        f"w = Worker([sys.executable, {vllm_worker.__file__!r}]).proc\n"
        "h = subprocess.Popen(['sleep', '60'], pass_fds=[w.stdin.fileno()])\n"
        "print(w.pid, h.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    worker, holder = map(int, parent.stdout.readline().split())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and running(worker):
        time.sleep(0.1)
    os.kill(holder, signal.SIGKILL)
    if not running(worker):
        return
    os.kill(worker, signal.SIGKILL)
    pytest.fail("the vLLM worker was still running 10 s after its parent was killed")
