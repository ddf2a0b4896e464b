"""The run's progress lines (harness/run/progress.py): every phase prints its line, with a fake clock, on a stream
that is not a terminal (a log file). Nothing here is timed."""

import io
import json

from harness.engine.runtime import CompileEvent
from harness.run.config import MethodSpec, RunConfig
from harness.run.progress import Progress, QuestionLines, read_compile_timings, write_compile_timing
from harness.run.runner import run
from tests.support.helpers import tiny_target


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeRunner:
    """What Progress.warm_up reads of a compiled runner: its graph count, compile seconds and cache folder."""

    runtime = "compiled"

    def __init__(self, cache_dir):
        self.graphs, self.compile_s, self.cache_dir = 0, 0.0, cache_dir


def test_every_phase_prints_its_line_with_seconds_and_last_runs_compile_time(tmp_path):
    """Loading, each entry's compile start / heartbeat / end with the cache outcome and its place in the list,
    the warm-up's end with the graphs and seconds, and the questions: a missing line is a silent phase; a missing
    'last time' means the second run cannot say what to expect."""
    clock, out = FakeClock(), io.StringIO()
    say = Progress(stream=out, clock=clock, heartbeat_s=None)
    with say.phase("loading the target smollm2-135m"):
        clock.now += 4.0
    runner = FakeRunner(tmp_path / "cache")
    for _ in range(2):  # the second run says how long the first compiled
        with say.warm_up("vanilla@compiled", "1/3", runner):
            clock.now += 1.0
            say.on_compile(CompileEvent("start", runner.graphs, 0.5))
            clock.now += 30.0
            say.beat()
            clock.now += 40.0
            runner.graphs, runner.compile_s = runner.graphs + 1, runner.compile_s + 70.5
            say.on_compile(CompileEvent("end", runner.graphs, 70.5, "miss"))
            clock.now += 2.0
            say.beat()  # the warm-up question after the compile: a heartbeat too
    bar = QuestionLines(["q1", "q2"], "interleaved mt_bench T=0", say)
    for _ in bar:
        clock.now += 10.0
        bar.set_postfix(tok_s="25.0", tau="1.00")
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["[    0s] loading the target smollm2-135m ...",
                         "[    4s] loading the target smollm2-135m: done in 4.0 s"]
    assert lines[2:8] == [
        "[    4s] vanilla@compiled (1/3): compiling and warm-up ...",
        "[    5s]   vanilla@compiled (1/3): compiling graph 1 of its runtime ...",
        "[   35s]   vanilla@compiled (1/3): still compiling graph 1 (30 s so far)",
        "[   75s]   vanilla@compiled (1/3): graph 1 compiled in 70.5 s, inductor cache miss",
        "[   77s]   vanilla@compiled (1/3): still warming up (73 s so far)",
        "[   77s] vanilla@compiled (1/3): warm-up done in 73.0 s, 1 new graph(s) compiled in 70.5 s"]
    assert lines[8] == "[   77s] vanilla@compiled (1/3): compiling and warm-up; last time it compiled for 70 s ..."
    assert lines[-3:] == ["[  150s] interleaved mt_bench T=0: 2 question(s) ...",
                          "[  160s] interleaved mt_bench T=0: 1/2 tok_s=25.0 tau=1.00",
                          "[  170s] interleaved mt_bench T=0: 2/2 tok_s=25.0 tau=1.00"]
    assert json.loads((tmp_path / "cache" / "timings.json").read_text()) == {
        "entries": {"vanilla@compiled": {"seconds": 70.5, "graphs": 1, "loaded": 0}}}


def test_a_graph_loaded_from_the_cache_and_a_removed_folder_say_so(tmp_path):
    """A second run's graph that came whole from the compile cache must say "loaded from cache" (not "compiled"),
    the warm-up's end how many of its graphs were loaded and compiled, and a cache folder removed as foreign its
    one line; the entry's record keeps the loaded count for `draftbench cache`."""
    clock, out = FakeClock(), io.StringIO()
    say = Progress(stream=out, clock=clock, heartbeat_s=None)
    runner = FakeRunner(tmp_path / "cache")
    runner.loaded = 0
    with say.warm_up("pld@compiled", "2/3", runner):
        say.on_compile(CompileEvent("reset", 0, 0.0, note="compile cache k: made for cpu X, this is Y: removed, "
                                                              "compiling again"))
        say.on_compile(CompileEvent("start", 0, 0.1))
        clock.now += 0.4
        runner.graphs, runner.loaded, runner.compile_s = 1, 1, 0.4
        say.on_compile(CompileEvent("end", 1, 0.4, "hit", loaded=True))
        say.on_compile(CompileEvent("start", 1, 0.1))
        clock.now += 50.0
        runner.graphs, runner.compile_s = 2, 50.4
        say.on_compile(CompileEvent("end", 2, 50.0, "miss"))
    lines = out.getvalue().splitlines()
    assert lines[1] == ("[    0s]   pld@compiled (2/3): compile cache k: made for cpu X, this is Y: removed, "
                        "compiling again")
    assert lines[3] == "[    0s]   pld@compiled (2/3): graph 1 loaded from cache in 0.4 s"
    assert lines[5] == "[   50s]   pld@compiled (2/3): graph 2 compiled in 50.0 s, inductor cache miss"
    assert lines[6] == ("[   50s] pld@compiled (2/3): warm-up done in 50.4 s, 2 new graph(s) (1 loaded from cache, "
                        "1 compiled) in 50.4 s")
    assert read_compile_timings(tmp_path / "cache") == {"pld@compiled": 50.4}


def test_no_progress_prints_nothing():
    out = io.StringIO()
    say = Progress(enabled=False, stream=out, heartbeat_s=None)
    with say.phase("loading"):
        say.on_compile(CompileEvent("start", 0, 0.0))
    assert out.getvalue() == ""


def test_compile_timings_keep_other_entries_and_survive_a_bad_file(tmp_path):
    """A second entry's seconds must not erase the first's; a corrupt file is a first run, not a crash."""
    write_compile_timing(tmp_path, "vanilla@compiled", 60.04)
    write_compile_timing(tmp_path, "pld@compiled", 30.0)
    assert read_compile_timings(tmp_path) == {"vanilla@compiled": 60.0, "pld@compiled": 30.0}
    (tmp_path / "timings.json").write_text("{not json")
    assert read_compile_timings(tmp_path) == {}


def test_a_run_prints_the_warm_up_and_question_lines_to_a_log(tmp_path, capsys):
    """run(progress=True) with stderr captured (not a terminal): each entry's warm-up and every question must have
    a plain line, not only a tqdm bar that a log shows as one line rewritten."""
    suite = tmp_path / "q.jsonl"
    suite.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [f"q{i}"]}) + "\n"
                             for i in (1, 2)))
    cfg = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("pld")], suites=[str(suite)], max_new_tokens=4,
                    warmup=1, interleave=True, output_dir=str(tmp_path / "results"))
    run(cfg, target=tiny_target(eos=False), progress=True)
    err = capsys.readouterr().err
    for text in ("vanilla (1/2): warm-up ...", "vanilla (1/2): warm-up done in", "pld (2/2): warm-up ...",
                 "interleaved q T=0.0: 2 question(s) ...", "interleaved q T=0.0: 1/2", "interleaved q T=0.0: 2/2"):
        assert text in err, text
