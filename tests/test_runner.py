"""The runner: multi-turn assembly, durable records, resume without loss or duplicates, error records."""

import json
from dataclasses import dataclass

import pytest
import torch

from harness.engine.method import Generation, Method
from harness.measure.records import RecordStore, question_key, read_records
from harness.registry import register_method
from harness.run.config import ConfigError, MethodSpec, RunConfig
from harness.run.runner import run
from tests.support.helpers import jsonl_file, tiny_target

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Say hi.", "Now say bye."]},
    {"question_id": 2, "category": "math", "turns": ["2+2?"]},
    {"question_id": 3, "category": "math", "turns": ["3+3?", "and 4+4?"]},
    {"question_id": 4, "category": "boom", "turns": ["explode", "never asked"]},
]


@dataclass
class ScriptOptions:
    fail_on: str = ""          # raise when a prompt contains this text
    oom_on: str = ""           # raise torch.OutOfMemoryError when a prompt contains this text


@register_method("scripted_test")
class Scripted(Method):
    """Test method: answers with the prompt length (as tokens), records every prompt it was given."""

    Options = ScriptOptions
    prompts: list = []

    def generate(self, prompt_ids, max_new_tokens, sampling, generator=None):
        text = self.target.tokenizer.decode(prompt_ids[0].tolist())
        Scripted.prompts.append(text)
        if self.options.fail_on and self.options.fail_on in text:
            raise RuntimeError("scripted failure")
        if self.options.oom_on and self.options.oom_on in text:
            raise torch.OutOfMemoryError("CUDA out of memory (scripted)")
        ids = self.target.tokenizer("ok!", add_special_tokens=False)["input_ids"][:max_new_tokens]
        return Generation(token_ids=ids, accept_lengths=[1] * len(ids), stop_reason="max_new_tokens")

    def forget(self):
        Scripted.prompts.append("<forget>")


@pytest.fixture()
def suite_file(tmp_path):
    return jsonl_file(tmp_path / "q.jsonl", QUESTIONS)


@pytest.fixture()
def target():
    return tiny_target(eos=False)


def _config(tmp_path, suite_file, **kw):
    base = dict(methods=[MethodSpec("vanilla"), MethodSpec("scripted_test", options={"fail_on": "explode"})],
                suites=[str(suite_file)], max_new_tokens=8, warmup=1, output_dir=str(tmp_path / "results"))
    base.update(kw)
    return RunConfig(**base)


def test_records_manifest_and_second_turn_sees_first_answer(tmp_path, suite_file, target):
    Scripted.prompts.clear()
    run_dir = run(_config(tmp_path, suite_file), target=target, progress=False)
    recs = read_records(run_dir)
    # 2 methods x (2 + 1 + 2 + 2) turns
    assert len(recs) == 14
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["max_new_tokens"] == 8 and "git_hash" in manifest and manifest["versions"]["torch"]
    assert set(manifest["methods"]) == {"vanilla", "scripted_test"}
    # MT-bench assembly: the second user turn comes after the model's own first answer ("ok!")
    second = [p for p in Scripted.prompts if "Now say bye." in p][-1]
    assert second.index("Say hi.") < second.index("ok!") < second.index("Now say bye.")
    van = [r for r in recs if r["label"] == "vanilla" and r["status"] == "ok"]
    assert all(r["new_tokens"] == len(r["output_ids"]) == sum(r["accept_lengths"]) for r in van)
    assert all(r["wall_time_s"] > 0 and r["rss_bytes"] for r in van)


def test_manifest_extra_is_in_the_manifest_from_the_first_question_and_written_once(tmp_path, suite_file, target,
                                                                                    monkeypatch):
    """``draftbench reproduce`` stores its block with ``manifest_extra``: it must be there while the run is going
    (an interrupted reproduction is still compared by ``report --against``) and at the end, and the manifest must be
    written once (a second writer could race a reader or lose a key)."""
    import harness.run.runner as runner_module

    writes = []
    write = runner_module.write_manifest
    monkeypatch.setattr(runner_module, "write_manifest", lambda d, m: writes.append(d) or write(d, m))
    seen = []

    def on_question(recs):
        if not seen:
            run_dir = tmp_path / "results" / recs[0]["run_id"]
            seen.append(json.loads((run_dir / "manifest.json").read_text())["reproduce"])

    block = {"table": "t", "part": 0, "rows": {"scripted_test": "row1"}}
    run_dir = run(_config(tmp_path, suite_file), target=target, progress=False, on_question=on_question,
                  manifest_extra={"reproduce": block})
    assert seen == [block]
    assert json.loads((run_dir / "manifest.json").read_text())["reproduce"] == block
    assert writes == [run_dir]


def test_failing_turn_becomes_error_record_and_run_goes_on(tmp_path, suite_file, target):
    run_dir = run(_config(tmp_path, suite_file), target=target, progress=False)
    recs = [r for r in read_records(run_dir) if r["label"] == "scripted_test"]
    boom = [r for r in recs if r["question_id"] == "4"]
    assert boom[0]["status"] == "error" and "RuntimeError: scripted failure" in boom[0]["error"]
    assert boom[1]["status"] == "error" and boom[1]["error"].startswith("skipped: an earlier turn failed")
    assert sum(r["status"] == "ok" for r in recs) == 5  # every other turn still ran


def test_out_of_memory_is_an_error_record(tmp_path, suite_file, target):
    cfg = _config(tmp_path, suite_file, methods=[MethodSpec("scripted_test", options={"oom_on": "2+2"})])
    recs = read_records(run(cfg, target=target, progress=False))
    oom = [r for r in recs if r["question_id"] == "2"]
    assert oom[0]["status"] == "error" and "OutOfMemoryError" in oom[0]["error"]
    assert sum(r["status"] == "ok" for r in recs) == 6  # the 6 other turns still ran


class Killed(Exception):
    pass


def kill_after(n: int):
    """An ``on_question`` callback that raises :class:`Killed` once ``n`` questions are stored (a kill mid-run)."""
    stored = []

    def on_question(recs):
        stored.append(recs)
        if len(stored) == n:
            raise Killed

    return on_question


def test_resume_after_kill_has_no_loss_and_no_duplicates(tmp_path, suite_file, target):
    cfg = _config(tmp_path, suite_file)
    with pytest.raises(Killed):
        run(cfg, target=target, progress=False, on_question=kill_after(3))
    run_dir = next((tmp_path / "results").iterdir())
    first = read_records(run_dir)
    assert len(first) == 5  # three questions of vanilla (2 + 1 + 2 turns) were durable before the kill
    # a torn, half-written line (kill during a write) must not break the resume
    with open(run_dir / "records.jsonl", "a") as f:
        f.write('{"label": "vanilla", "suite"')
    run(None, resume=run_dir, target=target, progress=False)
    recs = read_records(run_dir)
    keys = [(question_key(r), r["turn"]) for r in recs]
    assert len(keys) == len(set(keys)) == 14
    assert recs[:5] == first  # what was stored before the kill is untouched


def test_interleaved_run_answers_each_question_under_every_entry_in_turn_and_resumes(tmp_path, suite_file, target):
    # question-major order: records go q1 vanilla, q1 scripted, q2 vanilla, ... (entry-major would put all of
    # vanilla first); the tokens are the same as entry-major's, and a kill mid-question resumes without duplicates
    cfg = _config(tmp_path, suite_file, interleave=True)
    with pytest.raises(Killed):
        run(cfg, target=target, progress=False, on_question=kill_after(3))
    run_dir = next((tmp_path / "results").iterdir())
    assert [(r["question_id"], r["label"]) for r in read_records(run_dir)][::2] == [
        ("1", "vanilla"), ("1", "scripted_test"), ("2", "vanilla")]
    run(None, resume=run_dir, target=target, progress=False)
    recs = read_records(run_dir)
    keys = [(question_key(r), r["turn"]) for r in recs]
    assert len(keys) == len(set(keys)) == 14
    order = [(r["question_id"], r["label"]) for r in recs if r["turn"] == 0]
    assert order == [(str(q), label) for q in (1, 2, 3, 4) for label in ("vanilla", "scripted_test")]
    entry_major = read_records(run(_config(tmp_path / "em", suite_file), target=target, progress=False))
    by_key = {(r["label"], r["question_id"], r["turn"]): r.get("output_ids") for r in entry_major}
    assert {(r["label"], r["question_id"], r["turn"]): r.get("output_ids") for r in recs} == by_key


def test_interleave_must_be_a_boolean(tmp_path, suite_file):
    with pytest.raises(ConfigError, match="run.interleave: must be true or false"):
        _config(tmp_path, suite_file, interleave="yes")


def test_resume_with_a_different_config_is_refused(tmp_path, suite_file, target):
    run_dir = run(_config(tmp_path, suite_file), target=target, progress=False)
    with pytest.raises(ConfigError, match="differs from the run's"):
        run(_config(tmp_path, suite_file, max_new_tokens=9), resume=run_dir, target=target, progress=False)


def test_runs_are_never_overwritten(tmp_path, suite_file, target):
    cfg = _config(tmp_path, suite_file, methods=[MethodSpec("vanilla")], warmup=0)
    a = run(cfg, target=target, progress=False)
    b = run(cfg, target=target, progress=False)
    assert a != b and read_records(a) and read_records(b)


def test_record_store_repairs_torn_tail(tmp_path):
    """A kill mid-write leaves a torn last line: reopening the store must cut it, keeping the whole records."""
    whole = [{"label": "v", "suite": "s", "question_id": str(q), "temperature": 0.0, "seed": 0, "repeat": 0,
              "turn": 0, "question_turns": 1, "status": "error"} for q in (1, 2)]
    store = RecordStore(tmp_path)
    store.append(whole)
    with open(store.path, "a") as f:
        f.write('{"label": "v", "suite"')
    assert RecordStore(tmp_path).read() == whole
    assert store.path.read_text().endswith("}\n")


@pytest.mark.slow
def test_data_parallel_run_splits_questions_across_processes(tmp_path):
    """Two processes under `accelerate launch`: every question done once, each process wrote its own file.

    accelerate's `--cpu` launcher starts one process unless mpirun is set up, so the two processes come from its
    torchrun launcher (`--multi_gpu`); the runner keeps them on the CPU when no GPU is visible.
    """
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"question_id": i, "turns": [f"q{i}"]}) + "\n"
                                              for i in range(6)))
    script = Path(__file__).parent / "support" / "dp_run.py"
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dirs = list((tmp_path / "results").iterdir())
    assert len(run_dirs) == 1  # both processes wrote into the one run directory rank 0 chose
    files = sorted(p.name for p in run_dirs[0].glob("records*.jsonl"))
    assert files == ["records.rank0.jsonl", "records.rank1.jsonl"]
    recs = read_records(run_dirs[0])
    assert sorted(int(r["question_id"]) for r in recs) == list(range(6))
    assert json.loads((run_dirs[0] / "manifest.json").read_text())["processes"] == 2


# hardening (issue #10): resume finishes partial questions, checks the suites, survives corrupt lines and Ctrl-C;
# run directories are unique; scorer failures are recorded. Names new in that change are looked up when a test runs
# (runner.X), so each test fails on its own without them.

def _lines(run_dir):
    return (run_dir / "records.jsonl").read_text().splitlines(keepends=True)


def test_resume_reads_past_a_corrupt_line_and_reruns_only_what_it_lost(tmp_path, suite_file, target):
    """A corrupt middle line (vanilla q1's turn 1) made resume re-run every question after it (12 turns, each time);
    only q1, which lost a turn, may be re-run, and the reader must then see each turn exactly once."""
    run_dir = run(_config(tmp_path, suite_file), target=target, progress=False)
    lines = _lines(run_dir)
    assert json.loads(lines[1])["question_id"] == "1" and json.loads(lines[1])["turn"] == 1
    lines[1] = '{"label": "vanilla", "suite": "q", "question_id": "1", "tu\x00\x00\x00\n'
    (run_dir / "records.jsonl").write_text("".join(lines))
    with pytest.warns(UserWarning, match=r"records\.jsonl:2"):
        run(None, resume=run_dir, target=target, progress=False)
    added = [json.loads(x) for x in _lines(run_dir)[14:]]
    assert [(r["label"], r["question_id"], r["turn"]) for r in added] == [("vanilla", "1", 0), ("vanilla", "1", 1)]
    with pytest.warns(UserWarning):
        recs = read_records(run_dir)
    keys = [(question_key(r), r["turn"]) for r in recs]
    assert len(keys) == len(set(keys)) == 14


def test_resume_reruns_a_question_with_a_missing_turn(tmp_path, suite_file, target):
    """A kill in the middle of a question's write leaves some of its turns: the resume key had no turn, so the
    question was never finished and the report measured half of it. Resume must re-run it, and the reader must keep
    the new attempt only."""
    run_dir = run(_config(tmp_path, suite_file), target=target, progress=False)
    lines = _lines(run_dir)
    dropped = json.loads(lines[4])
    assert (dropped["label"], dropped["question_id"], dropped["turn"]) == ("vanilla", "3", 1)
    (run_dir / "records.jsonl").write_text("".join(lines[:4] + lines[5:]))
    run(None, resume=run_dir, target=target, progress=False)
    recs = read_records(run_dir)
    keys = [(question_key(r), r["turn"]) for r in recs]
    assert len(keys) == len(set(keys)) == 14
    q3 = [r for r in recs if r["label"] == "vanilla" and r["question_id"] == "3"]
    assert [r["turn"] for r in q3] == [0, 1] and q3[0]["attempt"] == q3[1]["attempt"] != dropped["attempt"]
    assert len(_lines(run_dir)) == 13 + 2  # the old lone turn 0 stays in the file (superseded), q3 written anew


def test_resume_refuses_a_changed_suite_file(tmp_path, suite_file, target):
    """Resuming after the questions file changed would put answers to new prompts next to the old ones; refuse,
    naming the suite and both checksums."""
    import hashlib

    cfg = _config(tmp_path, suite_file, methods=[MethodSpec("vanilla")], warmup=0)
    stored = []

    def kill_after_one(recs):
        stored.append(recs)
        raise Killed

    with pytest.raises(Killed):
        run(cfg, target=target, progress=False, on_question=kill_after_one)
    run_dir = next((tmp_path / "results").iterdir())
    old = hashlib.sha256(suite_file.read_bytes()).hexdigest()
    suite_file.write_text(suite_file.read_text().replace("2+2?", "5+5?"))
    new = hashlib.sha256(suite_file.read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match=rf"suite 'q' changed since the run started: .*{new}.*{old}"):
        run(None, resume=run_dir, target=target, progress=False)
    assert len(read_records(run_dir)) == 2  # nothing was run


def test_new_run_dir_is_created_at_once_with_a_unique_name(tmp_path, monkeypatch):
    """Two runs started in the same second chose the same name before either created it (both exited 0, one
    manifest overwritten). Choosing must create the directory exclusively, the second one getting "-2"."""
    from harness.measure import env
    from harness.run.manifest import new_run_dir

    monkeypatch.setattr(env, "now_iso", lambda: "2025-01-01T00:00:00+00:00")
    cfg = RunConfig(output_dir=str(tmp_path / "results"))
    a, b = new_run_dir(cfg), new_run_dir(cfg)
    assert a.name == f"20250101T000000Z-{cfg.digest()}" and b.name == f"{a.name}-2"
    assert a.is_dir() and b.is_dir()


def test_ctrl_c_keeps_the_records_and_names_the_run_to_resume(tmp_path, suite_file, target):
    """Ctrl-C after two stored questions: the run must raise RunInterrupted with its directory (the CLI prints the
    resume command), keep the three stored turns, and a resume must finish with no duplicates."""
    from harness.run import runner

    cfg = _config(tmp_path, suite_file)
    stored = []

    def ctrl_c_after_two(recs):
        stored.append(recs)
        if len(stored) == 2:
            raise KeyboardInterrupt

    try:
        run(cfg, target=target, progress=False, on_question=ctrl_c_after_two)
        caught = None
    except KeyboardInterrupt as e:  # caught here: a KeyboardInterrupt escaping a test would stop pytest
        caught = e
    assert isinstance(caught, runner.RunInterrupted)
    run_dir = next((tmp_path / "results").iterdir())
    assert caught.run_dir == run_dir and len(read_records(run_dir)) == 3
    run(None, resume=run_dir, target=target, progress=False)
    keys = [(question_key(r), r["turn"]) for r in read_records(run_dir)]
    assert len(keys) == len(set(keys)) == 14


def test_a_failing_scorer_is_recorded_not_ignored(target):
    """A scorer that raises left status ok, score None and no trace, and the quality mean silently skipped the
    question. The record must carry score_error (and keep the measured generation, status ok)."""
    from harness.engine.sampling import SamplingParams
    from harness.measure.trackers import Tracker
    from harness.registry import SCORERS, register_scorer
    from harness.run.entries import HarnessEntry
    from harness.run.runner import TurnContext, run_question
    from harness.run.suites import Question, Suite

    if "exploding_test_scorer" not in SCORERS:
        @register_scorer("exploding_test_scorer")
        def exploding(question, answer_text):
            raise RuntimeError("scorer exploded")

    suite = Suite("s", "1", [Question("1", None, ["2+2?"], ["4"])], scorer="exploding_test_scorer")
    entry = HarnessEntry("scripted_test", Scripted.create(target, {}), target, Tracker(target.device))
    recs = run_question(entry, target, TurnContext("r", "scripted_test", suite, 0.0, 0, 0), suite.questions[0],
                        SamplingParams(0.0, 1.0, 0), 4, score=True)
    assert len(recs) == 1
    assert (recs[0]["status"], recs[0]["error"], recs[0]["score"]) == ("ok", None, None)
    assert recs[0]["score_name"] == "exploding_test_scorer"
    assert recs[0]["score_error"].startswith("RuntimeError: scorer exploded")


def test_a_second_writer_of_a_run_is_refused_naming_the_holder(tmp_path, suite_file, target):
    """Two `--resume` of one run at once both redid every pending question (18 record lines instead of 10). While
    one process holds the run directory, another is refused in one line naming the holder, and writes nothing; the
    lock goes with its holder, so the run resumes afterwards."""
    import os

    from harness.measure.rundir import RunInUseError, RunLock

    run_dir = run(_config(tmp_path, suite_file), target=target, progress=False)
    before = (run_dir / "records.jsonl").read_text()
    holder = RunLock(run_dir).acquire()
    with pytest.raises(RunInUseError, match=rf"is in use by draftbench pid {os.getpid()} on .* since "):
        run(resume=run_dir, target=target, progress=False)
    assert (run_dir / "records.jsonl").read_text() == before
    holder.release()
    assert run(resume=run_dir, target=target, progress=False) == run_dir


def test_a_run_killed_while_its_model_loaded_says_there_is_nothing_to_resume(tmp_path):
    """kill -9 during model load leaves a run directory with no manifest (and the lock file): --resume called it
    "not a run directory", which reads like a typo in the path."""
    from harness.run.manifest import resume_manifest

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text("draftbench pid 1 on host since 2026-12-01T00:00:00+00:00\n")
    with pytest.raises(ConfigError, match=r"run is empty: its run was stopped before it started \(while the model "
                                          r"loaded\), so there is nothing to resume"):
        resume_manifest(tmp_path / "run")


def test_a_stateful_method_forgets_the_warm_up_before_the_first_measured_question(tmp_path, suite_file, target):
    """The warm-up question is also the first measured one: Token Recycling's matrix and SuffixDecoding's global tree
    kept the warm-up's answer and drafted it back on the measured turn (SuffixDecoding's τ 8.0 on that turn). The
    runner must call forget() after the warm-up and before any measured question."""
    Scripted.prompts.clear()
    run(_config(tmp_path, suite_file, methods=[MethodSpec("scripted_test")], warmup=1), target=target,
        progress=False)
    assert Scripted.prompts.count("<forget>") == 1
    warm = Scripted.prompts.index("<forget>")
    assert warm == 2 and "Say hi." in Scripted.prompts[0] and "Now say bye." in Scripted.prompts[1]  # question 1
    assert "Say hi." in Scripted.prompts[warm + 1]  # then the measured questions, from the first


def test_token_recycling_and_suffix_forget_what_they_learned():
    """forget() must leave the state a fresh method starts from: no matrix, an empty global tree."""
    from harness.engine.sampling import SamplingParams
    from harness.registry import get_method

    small = tiny_target(eos=False)
    prompt = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])
    recycling, suffix = get_method("token_recycling").example(small), get_method("suffix").example(small)
    for method in (recycling, suffix):
        method.generate(prompt, 8, SamplingParams())
    assert recycling.adjacency is not None and len(suffix.global_tree) > 1  # nodes, the root included
    recycling.forget()
    suffix.forget()
    assert recycling.adjacency is None and len(suffix.global_tree) == 1  # the root alone


def test_an_entry_on_another_engine_never_builds_the_harness_method(tmp_path, suite_file, target, monkeypatch):
    """One door for a turn (issue #46): an entry another engine runs is planned once (its engine checked once) and
    asked for its turns like the harness's own; the harness method is never built for it (Medusa here has no head
    for the tiny target and would fail to build), and its records and manifest still name the method, its options
    as recorded and whether it is lossless (typical acceptance: not), from the class and the options alone. A
    record built from a method object, or an engine checked twice, fails here."""
    from harness.backends.contract import Backend, EnginePlan, EngineTurn
    from harness.registry import get_method
    from harness.run import entries as entries_module

    medusa = get_method("medusa")

    def never(*args, **kwargs):
        raise AssertionError("the harness built Medusa for an entry vLLM runs")

    class Fixed(Backend):
        name = "vllm"

        def generate(self, request):
            asked.append((request.prompt_ids, request.max_new_tokens))
            return EngineTurn(token_ids=[5, 6], wall_time_s=0.5, stop_reason="length")

        def describe(self):
            return {"engine": "vllm", "version": "0-fixed"}

        def close(self):
            closed.append(True)

    planned, asked, closed = [], [], []

    def plan(engine, method, options, given, target_name, engine_options):
        planned.append((engine, method))
        return EnginePlan(engine, method, options, frozenset(given), target_name, dict(engine_options or {}))

    monkeypatch.setattr(medusa, "create", classmethod(never))
    monkeypatch.setattr(entries_module, "check_engine", plan)
    monkeypatch.setattr(entries_module, "create_backend", lambda plan, *args: Fixed())
    cfg = _config(tmp_path, suite_file, warmup=0, limit=2, max_new_tokens=4, methods=[
        MethodSpec("vanilla"), MethodSpec("medusa", "engine", {"acceptance": "typical"}, engine="vllm")])
    run_dir = run(cfg, target=target, progress=False)
    assert planned == [("harness", "vanilla"), ("vllm", "medusa")]  # each engine checked once
    recs = [r for r in read_records(run_dir) if r["label"] == "engine"]
    assert [r["new_tokens"] for r in recs] == [2, 2, 2] and len(asked) == 3 and closed == [True]
    assert all(budget == 4 for _, budget in asked)  # the same budget rule as the harness's turns
    assert {(r["method"], r["lossless"], r["method_options"]["acceptance"]) for r in recs} == {
        ("medusa", False, "typical")}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["methods"]["engine"] == {"method": "medusa", "lossless": False,
                                             "options": recs[0]["method_options"], "runtime": "eager"}
    assert manifest["engines"] == {"engine": {"engine": "vllm", "version": "0-fixed"}}
