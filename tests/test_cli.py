"""``draftbench run`` in-process: bad input and Ctrl-C end in one clear line on stderr (exit 2 / 130), before any
model is loaded where the input can be checked first, and lose nothing.

The target loader is replaced: by one that fails the test where the model must not be loaded, by a tiny in-process
model where a run must happen.
"""

import hashlib
import json
import os
import signal
import time

import pytest

from harness.cli import main
from harness.engine.method import Generation, Method
from harness.registry import METHODS, register_method
from harness.run import runner
from tests.support.helpers import jsonl_file, tiny_target

QUESTIONS = [{"question_id": 1, "turns": ["Say hi.", "Now say bye."]}, {"question_id": 2, "turns": ["stop here"]},
             {"question_id": 3, "turns": ["3+3?"]}]


if "ctrl_c_test" not in METHODS:
    @register_method("ctrl_c_test")
    class CtrlC(Method):
        """Test method: answers "ok!", and on a prompt saying "stop here" while ``armed`` raises KeyboardInterrupt
        (as Ctrl-C would), or with ``sigterm`` sends its own process SIGTERM (as ``kill`` or ``timeout`` would)."""

        armed = True
        sigterm = False

        def generate(self, prompt_ids, max_new_tokens, sampling, generator=None):
            if CtrlC.armed and "stop here" in self.target.tokenizer.decode(prompt_ids[0].tolist()):
                if CtrlC.sigterm:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)  # the handler interrupts this at once
                raise KeyboardInterrupt
            ids = self.target.tokenizer("ok!", add_special_tokens=False)["input_ids"][:max_new_tokens]
            return Generation(token_ids=ids, accept_lengths=[1] * len(ids), stop_reason="max_new_tokens")


if "always_fails_test" not in METHODS:
    @register_method("always_fails_test")
    class AlwaysFails(Method):
        """Test method: every turn raises, as every turn did at a temperature the sampler could not use."""

        def generate(self, prompt_ids, max_new_tokens, sampling, generator=None):
            raise RuntimeError("probabilities are nan")


@pytest.fixture()
def suite_file(tmp_path):
    return jsonl_file(tmp_path / "q.jsonl", QUESTIONS)


@pytest.fixture()
def no_model(monkeypatch):
    """Loading the target fails the test: the error must come before the model is loaded."""

    def fail(*args, **kwargs):
        raise AssertionError("the target was loaded before the bad input was noticed")

    monkeypatch.setattr(runner, "load_target", fail)


@pytest.fixture()
def tiny_model(monkeypatch):
    monkeypatch.setattr(runner, "load_target", lambda *a, **k: tiny_target(eos=False))


def run_cli(argv, capsys) -> tuple[int, str]:
    """Exit code and stderr of ``draftbench`` + argv (a KeyboardInterrupt escaping main fails the test instead of
    stopping pytest)."""
    try:
        code = main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped draftbench's main()")
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    return lines[0]


def base_args(tmp_path, suite_file, *extra):
    return ["run", "--suites", str(suite_file), "--methods", "vanilla", "--output-dir", str(tmp_path / "results"),
            "--max-new-tokens", "4", "--warmup", "0", "--no-progress", "--no-report", *extra]


def test_output_dir_that_is_a_file_fails_before_the_model_loads(tmp_path, suite_file, capsys, no_model):
    """--output-dir naming a file was only found after the model had loaded, with a traceback."""
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    code, err = run_cli(base_args(tmp_path, suite_file), capsys)
    assert code == 2
    assert one_line(err).startswith(f"draftbench: error: output directory {blocker} (--output-dir): ")
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_dir_fails_before_the_model_loads(tmp_path, suite_file, capsys, no_model):
    """An output directory without write permission: one line naming it, no model loaded."""
    locked = tmp_path / "results"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, err = run_cli(base_args(tmp_path, suite_file), capsys)
    finally:
        locked.chmod(0o700)
    assert code == 2 and f"output directory {locked} (--output-dir)" in one_line(err)


@pytest.mark.parametrize("target, message", [
    ("/nonexistent/model-folder", "target '/nonexistent/model-folder': no such folder"),
    ("nonexistent-org/nonexistent-model", "target 'nonexistent-org/nonexistent-model': not a local folder and not "
                                          "in the Hugging Face cache"),
])
def test_missing_target_is_one_line_naming_it(tmp_path, suite_file, capsys, monkeypatch, target, message):
    """A target path or hub id that does not exist gave a 45-55 line OSError traceback; offline (HF_HUB_OFFLINE) the
    line must say so, and no run directory may be left behind."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = run_cli(base_args(tmp_path, suite_file, "--target", target), capsys)
    line = one_line(err)
    assert code == 2 and line.startswith(f"draftbench: error: {message}")
    if "/" in target and not target.startswith("/"):
        assert "offline (HF_HUB_OFFLINE)" in line
    assert list((tmp_path / "results").iterdir()) == []


def test_hub_id_without_network_says_the_hub_cannot_be_reached(tmp_path, suite_file, capsys, monkeypatch):
    """Not offline by setting, but no network: the download retried for ~25 s and ended in a long OSError. One line
    must say that the hub cannot be reached (the probe is replaced by one that cannot connect)."""
    import huggingface_hub

    def no_network(self, repo_id, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_network)
    code, err = run_cli(base_args(tmp_path, suite_file, "--target", "nonexistent-org/nonexistent-model"), capsys)
    line = one_line(err)
    assert code == 2 and line.startswith("draftbench: error: target 'nonexistent-org/nonexistent-model': not a local "
                                         "folder and not in the Hugging Face cache")
    assert line.endswith("the hub cannot be reached (this machine looks offline: ConnectionError: [Errno -2] Name or "
                         "service not known)")


def test_report_names_a_corrupt_line_in_one_warning_line(tmp_path, capsys):
    """`draftbench report` over a records file with a corrupt middle line: one line on stderr naming file:line (not
    a Python warning with its source line), and the report still built from the other records."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = {"run_id": "run", "status": "ok", "error": None, "method": "vanilla", "label": "vanilla", "lossless": True,
           "suite": "s", "question_id": "1", "turn": 0, "question_turns": 1, "temperature": 0.0, "seed": 0,
           "repeat": 0, "new_tokens": 2, "steps": 2, "accept_lengths": [1, 1], "accepted_drafts": [],
           "draft_depths": [], "wall_time_s": 1.0}
    (run_dir / "records.jsonl").write_text("not json\n" + json.dumps(rec) + "\n")
    code, err = run_cli(["report", str(run_dir)], capsys)
    assert code == 0
    assert one_line(err) == (f"draftbench: warning: {run_dir / 'records.jsonl'}:1: not valid JSON (Expecting value "
                             "at column 1); line skipped, the lines after it are read")
    assert (run_dir / "tables" / "summary.csv").exists()


@pytest.mark.parametrize("sigterm", [False, True], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_is_one_line_with_the_resume_command_and_the_records_stay(tmp_path, suite_file, capsys, tiny_model,
                                                                         sigterm):
    """Ctrl-C printed a 91-line KeyboardInterrupt. It must print one line with the exact resume command, exit 130,
    keep question 1's records, and that command must finish the run. SIGTERM (``kill``, ``timeout``) takes the same
    way out; before, it killed the process where it stood and left the servers a run had launched running."""
    CtrlC.armed, CtrlC.sigterm = True, sigterm
    handler = signal.getsignal(signal.SIGTERM)
    args = base_args(tmp_path, suite_file)
    args[args.index("vanilla")] = "ctrl_c_test"
    code, err = run_cli(args, capsys)
    run_dir = next((tmp_path / "results").iterdir())
    assert code == 130
    assert one_line(err) == (f"draftbench: interrupted; the records so far are kept in {run_dir}; resume with: "
                             f"draftbench run --resume {run_dir}")
    assert signal.getsignal(signal.SIGTERM) is handler  # the command's handler is gone once it returns
    assert [json.loads(x)["question_id"] for x in (run_dir / "records.jsonl").read_text().splitlines()] == ["1", "1"]
    CtrlC.armed = CtrlC.sigterm = False
    code, err = run_cli(["run", "--resume", str(run_dir), "--no-progress", "--no-report"], capsys)
    assert code == 0 and err == ""
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    assert [json.loads(x)["question_id"] for x in lines] == ["1", "1", "2", "3"]


def test_corrupt_manifest_names_the_file(tmp_path, capsys, no_model):
    """A corrupt manifest gave json's bare "Expecting value: line 1 column 1 (char 0)": which file?"""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text("{truncated")
    code, err = run_cli(["run", "--resume", str(run_dir), "--no-progress"], capsys)
    assert code == 2
    assert one_line(err).startswith(f"draftbench: error: {run_dir / 'manifest.json'}: corrupt manifest")


def test_flags_given_with_resume_are_refused_by_name(tmp_path, capsys, no_model):
    """`run --resume R --limit 3` silently ran the stored configuration; flags that would change a resumed run must
    be refused, by name, before anything is read."""
    code, err = run_cli(["run", "--resume", str(tmp_path), "--limit", "3", "--opt", "pld.max_ngram=2",
                         "--no-report"], capsys)
    assert code == 2
    line = one_line(err)
    assert "--limit, --opt cannot be given with it (only --no-progress, --no-report, --paths)" in line


def test_method_option_of_the_wrong_type_names_option_and_type(tmp_path, suite_file, capsys, no_model):
    """`--opt eagle2.top_k=abc` failed inside the method with "'<' not supported between 'str' and 'int'", and
    only after the model had loaded."""
    args = base_args(tmp_path, suite_file, "--opt", "eagle2.top_k=abc")
    args[args.index("vanilla")] = "eagle2"
    code, err = run_cli(args, capsys)
    assert code == 2
    assert one_line(err) == "draftbench: error: method 'eagle2': option top_k: expected an integer, got 'abc'"


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "inf"], "run.temperatures[0]: must be 0 (greedy) or a finite number >= 1e-05, got inf"),
    (["--temperature", "0,nan"], "run.temperatures[1]: must be 0 (greedy) or a finite number >= 1e-05, got nan"),
    (["--temperature", "1e-40"], "run.temperatures[0]: must be 0 (greedy) or a finite number >= 1e-05, got 1e-40"),
    (["--top-p", "nan"], "run.top_p: must be in (0, 1], got nan"),
    (["--threads", "100000"], f"run.threads: must be between 1 and this machine's {os.cpu_count()} CPU cores, got "
                              "100000"),
    (["--device", "tpu"], "run.device: unknown device 'tpu'; use auto, cpu, cuda, cuda:N or mps"),
])
def test_sampling_and_machine_settings_the_run_cannot_use_are_refused(tmp_path, suite_file, capsys, no_model, flags,
                                                                       message):
    """`--temperature inf` was accepted and written to the manifest as `Infinity`, which is not JSON; 1e-40 made
    every turn an error record (logits / T overflow float32) and the run exited 0; `--device tpu` failed with a
    traceback after the model had loaded; `--threads` had no upper bound. Each is refused before anything loads."""
    code, err = run_cli(base_args(tmp_path, suite_file, *flags), capsys)
    assert code == 2 and one_line(err) == f"draftbench: error: {message}"


@pytest.mark.parametrize("flags, message", [
    (["--sweep", "vanilla.total_tokens=[8,16"], "[8,16: not valid YAML (expected ',' or ']', but got '<stream end>')"),
    (["--set", "limit=[1"], "limit=[1: not valid YAML (expected ',' or ']', but got '<stream end>')"),
    (["--opt", "vanilla.head={a: b"], "vanilla.head={a: b: not valid YAML (expected ',' or '}', but got "
                                      "'<stream end>')"),
    (["--opt", "vanilla.head=!!python/name:os.system"], "vanilla.head=!!python/name:os.system: not valid YAML "
                                                        "(could not determine a constructor for the tag "
                                                        "'tag:yaml.org,2002:python/name:os.system')"),
])
def test_malformed_or_tagged_yaml_in_a_flag_is_one_line(tmp_path, suite_file, capsys, no_model, flags, message):
    """Flag values are YAML: a malformed one, or a tag (safe_load runs nothing, but refused it with a traceback),
    must be one line quoting the value, before anything loads."""
    code, err = run_cli(base_args(tmp_path, suite_file, *flags), capsys)
    assert code == 2 and one_line(err).startswith("draftbench: error: ") and one_line(err).endswith(message)


def test_a_run_in_which_every_turn_of_an_entry_failed_exits_non_zero(tmp_path, suite_file, capsys, tiny_model):
    """Every turn an error record and exit 0 passed for a success in scripts and CI: the run must keep its records
    (the error rows), say which entry measured nothing and why, and exit 1."""
    args = base_args(tmp_path, suite_file)
    args[args.index("vanilla")] = "vanilla,always_fails_test"
    code, err = run_cli(args, capsys)
    run_dir = next((tmp_path / "results").iterdir())
    assert code == 1
    line = one_line(err)  # the error text names the raising line (test_cli.py:N)
    assert line.startswith("draftbench: error: every turn of 'always_fails_test' failed (first: RuntimeError: "
                           "probabilities are nan at test_cli.py:") and line.endswith(f"); see {run_dir}")
    statuses = [json.loads(x)["status"] for x in (run_dir / "records.jsonl").read_text().splitlines()]
    assert statuses.count("ok") == 4 and statuses.count("error") == 4


def test_ctrl_c_while_the_report_is_written_says_the_records_are_complete(tmp_path, suite_file, capsys, tiny_model,
                                                                           monkeypatch):
    """Ctrl-C after the last question, while the report was written, printed a bare "interrupted": it must say the
    records are complete and give the command that finishes the report (every report file is replaced whole)."""
    import harness.report.report as report_module

    def interrupted(run_dir, baseline_label=None, cost_per_hour=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "write_report", interrupted)
    args = [a for a in base_args(tmp_path, suite_file) if a != "--no-report"]
    code, err = run_cli(args, capsys)
    run_dir = next((tmp_path / "results").iterdir())
    assert code == 130
    assert one_line(err) == (f"draftbench: interrupted while writing the report; the run's records are complete; "
                             f"finish the report with: draftbench report {run_dir}")


def test_report_ends_with_the_table_what_it_means_and_the_page_to_open(tmp_path, capsys):
    """`draftbench report RUN` printed summary.md whole and then every path (34 in the demo): it must end with the
    paper table, the speed-ups' CIs, one line on what the numbers mean, report.html with the command that opens it,
    the run directory and the resume command, and list the other files only under --paths."""
    from tests.support.ablation_run import RECORDS, write_run

    run = write_run(tmp_path)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("**Temperature 0** — cells: speed-up vs `vanilla`")
    assert "95% CI of the speed-up (paired bootstrap over questions):\n  A  mt 2.17 [" in out
    assert "speed-up = tokens/s ÷ vanilla's on the same questions; τ = tokens per target forward" in out
    assert "losslessness: 1 greedy turn(s) differ from the baseline; see report.html" in out  # D's q3
    assert lines[-5] == f"report:  {run / 'report.html'}"
    assert lines[-4] == f"open it: xdg-open {run / 'report.html'}   (or: python -m webbrowser {run / 'report.html'})"
    assert lines[-3] == f"run:     {run}"
    assert lines[-2].startswith(f"resume:  draftbench run --resume {run}")
    assert lines[-1].startswith(f"files:   draftbench report {run} --paths")
    assert ".png" not in out and "summary_csv" not in out
    assert main(["report", str(run), "--paths"]) == 0
    listed = capsys.readouterr().out
    assert f"summary_csv:          {run / 'tables' / 'summary.csv'}" in listed and "plot_speedup" in listed
    alone = write_run(tmp_path / "alone", [r for r in RECORDS if r["label"] == "A"])  # no vanilla measured
    assert main(["report", str(alone)]) == 0
    assert "losslessness" not in capsys.readouterr().out  # nothing to compare with: no claim either way


@pytest.mark.parametrize("make, what", [
    (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    (lambda p: p.mkdir(), "is a directory, not a regular file"),
])
def test_a_suite_file_that_is_no_regular_file_says_what_it_is(tmp_path, capsys, no_model, make, what):
    """A FIFO or a folder given as the suite file was reported as "does not exist", which it does: say what it is."""
    path = tmp_path / "q.jsonl"
    make(path)
    code, err = run_cli(base_args(tmp_path, path), capsys)
    assert code == 2 and one_line(err) == f"draftbench: error: questions file {path} {what}"


def test_a_full_disk_names_the_records_file_and_gives_the_resume_command(tmp_path, suite_file, capsys, tiny_model,
                                                                         monkeypatch):
    """ENOSPC while appending question 2's records printed "[Errno 28] No space left on device" and nothing else:
    which file, and is the run lost? One line must name the file, say where the records so far are, and give the
    command that resumes the run; that command must finish it without duplicates."""
    import harness.measure.records as records_module

    real_fsync, calls = records_module.os.fsync, []

    def full_disk(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(records_module.os, "fsync", full_disk)
    code, err = run_cli(base_args(tmp_path, suite_file), capsys)
    run_dir = next((tmp_path / "results").iterdir())
    assert code == 2 and one_line(err) == (
        f"draftbench: error: {run_dir / 'records.jsonl'}: cannot append records: No space left on device; the records "
        f"so far are kept in {run_dir}; resume with: draftbench run --resume {run_dir}")
    monkeypatch.setattr(records_module.os, "fsync", real_fsync)
    code, err = run_cli(["run", "--resume", str(run_dir), "--no-progress", "--no-report"], capsys)
    assert code == 0 and err == ""
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    assert [json.loads(x)["question_id"] for x in lines] == ["1", "1", "2", "3"]


def test_a_full_disk_while_the_report_is_written_names_the_file_and_the_command(tmp_path, suite_file, capsys,
                                                                                tiny_model, monkeypatch):
    """ENOSPC while the report was written named only the temporary file (".summary.x1y2.parquet"): the line must
    name the report file, say the records are complete and give the command that finishes the report."""
    from harness.measure import rundir as rundir_module

    real_replace = rundir_module.os.replace

    def full_disk(src, dst):
        if "tables" in str(dst):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(rundir_module.os, "replace", full_disk)
    code, err = run_cli([a for a in base_args(tmp_path, suite_file) if a != "--no-report"], capsys)
    run_dir = next((tmp_path / "results").iterdir())
    assert code == 2 and one_line(err) == (
        f"draftbench: error: {run_dir / 'tables' / 'turns.parquet'}: cannot write it: No space left on device; the "
        f"run's records are complete; finish the report with: draftbench report {run_dir}")


def test_report_of_a_run_whose_records_file_is_a_fifo_is_one_line(tmp_path, capsys):
    """`draftbench report RUN` with a FIFO as records.jsonl (a shared artefact) waited for a writer for ever: it must
    end at once with one line naming the file and what it is."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "records.jsonl")
    code, err = run_cli(["report", str(run_dir)], capsys)
    assert code == 2
    assert one_line(err) == f"draftbench: error: {run_dir / 'records.jsonl'}: a FIFO (named pipe), not a regular file"


def test_resume_of_a_run_whose_lock_is_a_folder_is_one_line(tmp_path, capsys, no_model):
    """`.lock` as a folder gave "[Errno 21] Is a directory" only after the target had loaded; it must be one line
    naming the file and what it is, before the model loads."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").mkdir()
    config = {"methods": [{"name": "vanilla"}], "suites": [str(tmp_path / "q.jsonl")], "max_new_tokens": 4,
              "warmup": 0}
    text = json.dumps(QUESTIONS[0]) + "\n"
    (tmp_path / "q.jsonl").write_text(text)
    suites = {"q": {"sha256": hashlib.sha256(text.encode()).hexdigest()}}
    (run_dir / "manifest.json").write_text(json.dumps({"run_id": "run", "config": config, "suites": suites}))
    code, err = run_cli(["run", "--resume", str(run_dir), "--no-progress", "--no-report"], capsys)
    assert code == 2 and one_line(err) == f"draftbench: error: {run_dir / '.lock'}: a directory, not a regular file"


def test_a_turn_whose_text_holds_a_lone_surrogate_is_recorded_and_reported(tmp_path, suite_file, capsys,
                                                                          monkeypatch):
    """A turn whose decoded text held a lone surrogate ("\\ud800": a served engine or a byte-level tokenizer can emit
    one) aborted the run with the turn lost, and every resume failed again at it; the next turn of the question,
    whose prompt holds that answer, failed in the tokenizer. The run must record every turn as measured, exit 0 and
    build its report."""
    target = tiny_target(eos=False)
    decode = target.tokenizer.decode
    monkeypatch.setattr(target.tokenizer, "decode", lambda *a, **k: decode(*a, **k) + "\ud800")
    monkeypatch.setattr(runner, "load_target", lambda *a, **k: target)
    args = [a for a in base_args(tmp_path, suite_file) if a != "--no-report"]
    code, err = run_cli(args, capsys)
    run_dir = next((tmp_path / "results").iterdir())
    assert code == 0 and err == ""
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"] * 4  # the second turn's prompt holds the first answer
    assert all(r["output_text"].endswith("\ud800") for r in records)
    assert (run_dir / "report.html").exists()
