"""Load levels (harness/run/load.py, harness/report/load.py, the load metrics of harness/measure/metrics.py): the
metrics on literal per-token timestamps, the fake server's batching model turned into literal levels where a
speculative engine pays at concurrency 1 and stops paying at 16, vLLM's arrival process, the prompts of each level,
the ``load:`` block's checks, and one load run end to end against two fake servers (shape, resume, report)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.backends.contract import EngineTurn
from harness.measure import metrics as M
from harness.report.load import frontier_markdown, latest_levels, load_markdown, load_table, read_load_rows
from harness.report.report import write_report
from harness.run.config import ConfigError, MethodSpec, RunConfig, check_slots, config_from_dict
from harness.run.load import _row, arrival_offsets, level_questions, load_order
from harness.run.runner import run
from tests.support.fake_openai_server import Fake, serve, step_seconds
from tests.support.helpers import tiny_target


def test_per_token_latencies_are_gaps_between_token_arrivals():
    # per token, not per chunk: a chunk of 2 tokens split evenly gives two equal gaps (a per-chunk ITL gives one)
    assert M.per_token_latencies([0.5, 0.6, 0.6, 0.9]) == pytest.approx([0.1, 0.0, 0.3])
    assert M.per_token_latencies([0.5]) == [] and M.per_token_latencies(None) == []


def test_latency_percentiles_interpolate_linearly():
    assert M.latency_percentiles([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx([0.3, 0.48, 0.496])
    assert all(math.isnan(x) for x in M.latency_percentiles([]))


def test_level_throughput_divides_by_the_levels_wall_window():
    # 30 tokens from the first send (0.0) to the last finish (3.0); not the sum of the requests' wall times (4.5)
    assert M.level_throughput([10, 20], [0.0, 0.5], [2.0, 3.0]) == pytest.approx(10.0)
    assert math.isnan(M.level_throughput([], [], []))


def test_stops_paying_is_the_first_level_below_one():
    assert M.stops_paying([(16, 0.9, 0.85, 0.95), (1, 2.0, 1.8, 2.2), (4, 1.3, 1.1, 1.5)]) == (16, True)
    assert M.stops_paying([(1, 1.2, math.nan, math.nan), (4, 0.98, 0.9, 1.05)]) == (4, False)  # CI reaches 1
    assert M.stops_paying([(1, 1.5, 1.4, 1.6)]) is None


def test_the_fake_servers_batching_model():
    # K = 3 drafted, A = 1 accepted, F = 0.05: a step verifies 4 tokens a request; (A + 1)(1 + Fc) / (1 + 4Fc)
    assert step_seconds(0.01, 0.05, 16, 4) == pytest.approx(0.042)
    assert step_seconds(0.01, 0.05, 1, 1) == pytest.approx(0.0105)
    speedup = {c: 2 * step_seconds(1, 0.05, c, 1) / step_seconds(1, 0.05, c, 4) for c in (1, 4, 16)}
    assert speedup == pytest.approx({1: 1.75, 4: 4 / 3, 16: 6 / 7})


def request_row(label, method, c, qid, times, counters=None, notes=()):
    """One request's row of a level at concurrency ``c`` with token arrival times ``times`` (sent at 0)."""
    return {"attempt": f"{label}-{c}", "label": label, "method": method, "engine": "openai", "concurrency": c,
            "request_rate": None, "burstiness": 1.0, "status": "ok", "question_id": str(qid),
            "new_tokens": len(times), "wall_time_s": times[-1], "prefill_time_s": times[0], "sent_s": 0.0,
            "finished_s": times[-1], "token_times_s": times, "level_counters": counters, "engine_notes": list(notes)}


# 4 tokens a request, 8 requests a level, steps from step_seconds(0.01, 0.05, c, verified): vanilla one token a
# step (verified 1); speculative 2 tokens a step (verified 4: K = 3 drafted, A = 1 accepted), one chunk of 2 split
VANILLA = {1: [0.0105, 0.021, 0.0315, 0.042], 16: [0.018, 0.036, 0.054, 0.072]}
SPEC = {1: [0.006, 0.012, 0.018, 0.024], 16: [0.021, 0.042, 0.063, 0.084]}
SPLIT = "chunks of several tokens: each chunk's time is split evenly over its tokens"
COUNTERS = {"drafts": 16, "draft_tokens": 48, "accepted_tokens": 16, "accepted_per_pos": [16, 0, 0]}


def literal_levels():
    rows = []
    for c in (1, 16):
        rows += [request_row("vanilla", "vanilla", c, q, VANILLA[c]) for q in range(8)]
        rows += [request_row("eagle3", "eagle3", c, q, SPEC[c], COUNTERS, [SPLIT]) for q in range(8)]
    return rows


def test_a_speculative_engine_pays_at_one_and_stops_paying_at_sixteen():
    table = load_table(literal_levels()).set_index(["label", "concurrency"])
    spec, base = table.loc[("eagle3", 1)], table.loc[("vanilla", 1)]
    assert base["output_tok_s"] == pytest.approx(32 / 0.042)        # 8 requests x 4 tokens over the 0.042 s window
    assert spec["output_tok_s"] == pytest.approx(32 / 0.024)
    assert spec["speedup"] == pytest.approx(1.75) and spec["throughput_ratio"] == pytest.approx(1.75)
    assert table.loc[("eagle3", 16), "speedup"] == pytest.approx(6 / 7)
    # 8 paired requests: a CI (every pair alike here, so it is the point)
    assert table.loc[("eagle3", 16), "speedup_hi"] == pytest.approx(6 / 7)
    assert base["token_latency_p50_s"] == pytest.approx(0.0105) and spec["token_latency_p99_s"] == pytest.approx(0.006)
    assert spec["ttft_p50_s"] == pytest.approx(0.006)
    # the counters of the whole level: 16 drafts of 3, 16 accepted -> rate 1/3, vLLM's mean acceptance length 2.0
    assert spec["acceptance_rate"] == pytest.approx(1 / 3) and spec["mean_acceptance_length"] == pytest.approx(2.0)
    assert spec["split_requests"] == 8 and base["split_requests"] == 0
    assert math.isnan(base["speedup"])  # the baseline has no speed-up over itself
    md = load_markdown(load_table(literal_levels()))
    assert "`eagle3`: speculation stops paying at concurrency 16 (speed-up 0.86×; its CI lies below 1)" in md
    assert "16 of 32 requests had chunks of several tokens" in md
    assert "| vanilla | 16 | 8 | 444.4 | 18.0 / 18.0 | 18.0 / 18.0 / 18.0 | n/a | n/a |  |" in md  # the baseline


def test_the_frontier_puts_throughput_beside_tokens_per_user_and_marks_the_crossover():
    """Interactivity is 1 / mean per-token latency: vanilla at 16 waits 18 ms a token (55.6 tokens/s per user) and
    eagle3 21 ms between its 4 tokens' arrivals (47.6); a frontier without it, or with the crossover on the wrong
    level, would misplace where speculation stops paying."""
    table = load_table(literal_levels()).set_index(["label", "concurrency"])
    assert table.loc[("vanilla", 16), "tokens_per_user"] == pytest.approx(1 / 0.018)
    assert table.loc[("eagle3", 1), "tokens_per_user"] == pytest.approx(1 / 0.006)
    md = frontier_markdown(load_table(literal_levels()))
    assert "| 16 | eagle3 | 381.0 | 47.6 | 21.0 / 21.0 | 21.0 / 21.0 | 0.86× | stops paying |" in md, md
    assert "| 1 | eagle3 | 1333.3 | 166.7 | 6.0 / 6.0 | 6.0 / 6.0 | 1.75× |  |" in md, md
    assert "| 16 | vanilla | 444.4 | 55.6 | 18.0 / 18.0 | 18.0 / 18.0 |  |  |" in md, md


def test_too_few_requests_give_no_ci():
    rows = [r for r in literal_levels() if r["question_id"] in ("0", "1", "2")]
    table = load_table(rows).set_index(["label", "concurrency"])
    assert table.loc[("eagle3", 16), "speedup"] == pytest.approx(6 / 7)
    assert math.isnan(table.loc[("eagle3", 16), "speedup_lo"])  # 3 pairs: no CI, so "stops paying" is not sure
    assert "its CI reaches 1 or there are too few requests" in load_markdown(load_table(rows))


def test_the_latest_attempt_of_a_level_is_read():
    old = request_row("eagle3", "eagle3", 4, 0, [1.0])
    new = {**request_row("eagle3", "eagle3", 4, 0, [0.5]), "attempt": "b"}
    assert latest_levels([old, new]) == {("eagle3", 4): [new]}


def test_arrivals_follow_vllms_gamma_process():
    assert arrival_offsets(3, math.inf, 1.0, 0) == [0.0, 0.0, 0.0]  # inf: every request at once
    for burstiness in (1.0, 0.25):
        gaps = np.diff(arrival_offsets(4001, 2.0, burstiness, 0))
        # mean gap 1 / rate whatever the burstiness; coefficient of variation 1 / sqrt(shape) (1 Poisson, 2 bursty)
        assert gaps.mean() == pytest.approx(0.5, rel=0.1)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)
    assert arrival_offsets(5, 2.0, 1.0, 3) == arrival_offsets(5, 2.0, 1.0, 3)  # seeded: reproducible


def test_each_level_draws_the_next_distinct_prompts():
    spec = config(load={"concurrency": [1, 2]}).load_spec()
    assert level_questions(spec, list("abcde")) == [["a", "b"], ["c", "d", "e", "a"]]
    with pytest.raises(ConfigError, match="concurrency 4 needs 8 distinct prompts and the run's suites have 5"):
        level_questions(config(load={"concurrency": [4]}).load_spec(), list("abcde"))


def config(**kw):
    return RunConfig(**{"methods": [MethodSpec("vanilla")], "engine": "openai",
                        "engine_options": {"server_url": "http://h:1"}, **kw})


@pytest.mark.parametrize("load, message", [
    ({"concurrency": []}, "run.load.concurrency: a list of positive integers"),
    ({"concurrency": [1, 1]}, "a level is listed twice"),
    ({"concurrency": [1], "rate": 2}, "unknown key"),
    ({"concurrency": [1], "request_rate": 0}, "run.load.request_rate"),
    ({"concurrency": [1], "burstiness": -1}, "run.load.burstiness"),
])
def test_bad_load_blocks_name_the_field(load, message):
    with pytest.raises(ConfigError, match=message):
        config(load=load)


def test_load_needs_served_entries_and_one_measurement_per_level():
    with pytest.raises(ConfigError, match=r"vanilla \(harness\) cannot take concurrent requests"):
        RunConfig(load={"concurrency": [1]})
    with pytest.raises(ConfigError, match="one of run.temperatures"):
        config(load={"concurrency": [1]}, temperatures=[0.0, 1.0])
    spec = config_from_dict({"methods": ["vanilla"], "engine": "openai", "engine_options": {"server_url": "http://h:1"},
                             "load": {"concurrency": 4, "request_rate": "inf"}}).load_spec()
    assert (spec.concurrency, spec.request_rate, spec.requests_at(4)) == ((4,), math.inf, 8)
    assert "load" not in config().to_dict()  # a run without load levels: its configuration and digest as before


def test_a_llama_cpp_server_needs_a_slot_per_request_in_flight():
    """llama-server decodes as many requests at once as it has slots (--parallel) and queues the rest: a level above
    them would be measured at a lower concurrency than it says. Refused with the configuration where the entry gives
    its parallel, and once its server reports fewer slots (/props) before any level where it does not."""
    check_slots(4, {"llamacpp-vanilla": 4, "vllm": None, "auto": -1})  # enough, not known, llama.cpp's auto: passes
    with pytest.raises(ConfigError, match=r"concurrency is 4, more than the slots of llama.cpp's server of ngram "
                                          r"\(2\): .*engine_options parallel: 4 \(llama-server --parallel 4\)"):
        check_slots(4, {"ngram": 2, "vanilla": 4})
    entry = MethodSpec("vanilla", engine_options={"launch": "llama.cpp", "parallel": 2})
    with pytest.raises(ConfigError, match=r"slots of llama.cpp's server of vanilla \(2\)"):
        RunConfig(methods=[entry], engine="openai", load={"concurrency": [1, 4]})
    assert RunConfig(methods=[entry], engine="openai", load={"concurrency": [1, 2]}).load_spec().concurrency == (1, 2)


def test_a_load_run_on_a_llama_cpp_server_with_too_few_slots_measures_nothing(tmp_path):
    server, url = serve(Fake("llamacpp,slots=2"))
    try:
        with pytest.raises(ConfigError, match=r"server of vanilla \(2\), pld-served \(2\): requests past"):
            load_run(tmp_path, [url, url])
    finally:
        server.shutdown()
    assert not list((tmp_path / "results").glob("*/load.jsonl"))  # refused before the first level


@pytest.fixture()
def servers():
    """Two fake batching engines in threads: vanilla, and one drafting 3 tokens a step with 1 accepted."""
    made = [serve(Fake("step_ms=2,batch_cost=0.05")), serve(Fake("step_ms=2,batch_cost=0.05,spec=3,accept=1"))]
    yield [url for _, url in made]
    for server, _ in made:
        server.shutdown()


def load_run(tmp_path, urls, resume=None, interleave=False):
    suite = tmp_path / "q.jsonl"
    suite.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [f"q{i}"]}) + "\n"
                             for i in range(6)))
    cfg = RunConfig(methods=[MethodSpec("vanilla", engine_options={"server_url": urls[0], "model": "smollm2-135m"}),
                             MethodSpec("pld", "pld-served",
                                        engine_options={"server_url": urls[1], "model": "smollm2-135m"})],
                    suites=[str(suite)], max_new_tokens=6, warmup=1, engine="openai",
                    output_dir=str(tmp_path / "results"), load={"concurrency": [1, 4], "num_prompts": 4},
                    interleave=interleave)
    return run(None if resume else cfg, resume=resume, target=tiny_target(eos=False), progress=False)


def test_a_load_run_end_to_end_resumed_and_reported(tmp_path, servers):
    run_dir = load_run(tmp_path, servers)
    rows = read_load_rows(run_dir)
    assert len(rows) == 16 and all(r["status"] == "ok" and r["new_tokens"] == 6 for r in rows)
    assert not (run_dir / "records.jsonl").exists()  # load rows only: the other tables never see them
    by_level = latest_levels(rows)
    # level 0 takes questions 0-3, level 1 the next four, wrapping round: no prompt twice inside a level
    assert [r["question_id"] for r in by_level[("vanilla", 4)]] == ["4", "5", "0", "1"]
    spec = by_level[("pld-served", 4)]
    # 4 requests x 3 steps of 2 tokens: 12 drafts of 3, 12 accepted, counted around the level
    assert spec[0]["level_counters"] == {"drafts": 12, "draft_tokens": 36, "accepted_tokens": 12,
                                         "accepted_per_pos": [12, 0, 0]}
    assert all(len(r["token_times_s"]) == 6 and "chunks of several tokens" in r["engine_notes"][0] for r in spec)
    # resume: complete levels are not measured again, a level with a failed request is (a new attempt)
    lines = (run_dir / "load.jsonl").read_text().splitlines()
    broken = [json.loads(x) for x in lines[-4:]]
    broken[0].update(status="error", error="BackendError: cut")
    (run_dir / "load.jsonl").write_text("\n".join(lines[:-4] + [json.dumps(r) for r in broken]) + "\n")
    load_run(tmp_path, servers, resume=run_dir)
    again = read_load_rows(run_dir)
    assert len(again) == 20 and len(latest_levels(again)[("pld-served", 4)]) == 4
    assert all(r["status"] == "ok" for level in latest_levels(again).values() for r in level)
    written = write_report(run_dir)
    md = Path(written["summary_md"]).read_text()
    assert md.startswith(f"# draftbench results: {run_dir.name}\n\n## Validity") and "| pld-served | 4 | 4 |" in md
    assert {"plot_load_throughput", "plot_load_latency", "plot_load_speedup", "plot_load_frontier"} <= set(written)
    assert Path(written["load_csv"]).is_file() and "### Frontier" in md
    # 6 questions over levels of 4 and 4 requests: the second level wraps round to questions 0 and 1, which the
    # prompts check must name as a failure in the summary and the page
    assert "- FAIL prompts: 4 prompt(s) sent more than once by one entry" in md, md
    page = Path(written["report_html"]).read_text()
    assert 'alt="load_frontier"' in page and "FAIL prompts" in page and "<h3>Frontier</h3>" in page
    assert 'id="validity-table"' in page and 'id="load-table"' in page


def test_levels_run_entry_by_entry_or_interleaved_with_the_order_alternating():
    # interleaved, the entry that goes first alternates per level; if it did not, a load drifting through the run
    # would always fall on the same entry and bias its speed-up (the llama.cpp sweep in harness/run/load.py)
    assert load_order(["v", "s"], [1, 4, 16], ["q1", "q4", "q16"], True) == [
        ("v", 0, 1, "q1"), ("s", 0, 1, "q1"), ("s", 1, 4, "q4"), ("v", 1, 4, "q4"), ("v", 2, 16, "q16"),
        ("s", 2, 16, "q16")]
    assert load_order(["v", "s"], [1, 4], ["q1", "q4"], False) == [
        ("v", 0, 1, "q1"), ("v", 1, 4, "q4"), ("s", 0, 1, "q1"), ("s", 1, 4, "q4")]


def test_an_interleaved_load_run_writes_its_levels_in_that_order(tmp_path, servers):
    # the file's order is the measuring order: a run that ignored interleave would write vanilla's two levels first
    rows = read_load_rows(load_run(tmp_path, servers, interleave=True))
    firsts = [(r["label"], r["concurrency"]) for r in rows[::4]]
    assert firsts == [("vanilla", 1), ("pld-served", 1), ("pld-served", 4), ("vanilla", 4)]


def test_the_load_flags_of_draftbench_run():
    from harness.cli import build_parser
    from harness.cli.run import config_from_args

    args = build_parser().parse_args(["run", "--server-url", "http://h:1", "--methods", "vanilla", "--concurrency",
                                      "1,4,16,64", "--request-rate", "inf", "--burstiness", "0.5"])
    cfg = config_from_args(args)
    assert cfg.load == {"concurrency": [1, 4, 16, 64], "request_rate": "inf", "burstiness": 0.5}
    assert cfg.load_spec().requests_at(64) == 128


def test_a_load_run_whose_entry_failed_every_request_exits_1(tmp_path, capsys):
    from harness.cli.run import failed_entries_exit

    rows = [{**request_row("pld", "pld", 1, q, [0.1]), "status": "error", "error": "BackendError: refused"}
            for q in range(2)]
    (tmp_path / "load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert failed_entries_exit(tmp_path) == 1
    assert "every turn of 'pld' failed (first: BackendError: refused)" in capsys.readouterr().err


def test_without_a_vanilla_entry_the_section_says_there_is_no_speed_up():
    rows = [r for r in literal_levels() if r["label"] == "eagle3"]
    assert "No vanilla entry measured these levels: no speed-up" in load_markdown(load_table(rows))


def test_a_load_rows_acceptance_totals_are_the_requests_own():
    """llama.cpp's per-request timings survive concurrency, where the level's counters cannot be split: each row
    keeps its request's drafted and accepted totals; a request without them has None (n/a), never 0."""
    suite, q = SimpleNamespace(name="s", version="1"), SimpleNamespace(question_id=1, category="c")
    turn = EngineTurn(token_ids=None, wall_time_s=0.5, ttft_s=0.1, stop_reason="length", text="a b",
                      completion_tokens=2)
    result = (0.0, 0.5, turn, {"timings": {"predicted_n": 2, "draft_n": 5, "draft_n_accepted": 3}}, None)
    assert _row(result, suite, q, None)["engine_counters"] == {"draft_tokens": 5, "accepted_tokens": 3}
    result = (0.0, 0.5, turn, {"timings": {"predicted_n": 2}}, None)  # nothing drafted: llama.cpp omits both
    assert _row(result, suite, q, None)["engine_counters"] is None



def test_a_level_whose_counters_go_backwards_is_error_rows_not_an_aborted_run(tmp_path):
    """A server whose counters go backwards during a level (a restart) makes that level's rows errors naming the
    counter, their measured turns kept, and the run goes on (every level of both entries is written). Were the
    counters diffed, the level would store negative drafts; were the error raised, the whole run would stop."""
    made = [serve(Fake("")), serve(Fake("backwards"))]
    try:
        run_dir = load_run(tmp_path, [url for _, url in made])
    finally:
        for server, _ in made:
            server.shutdown()
    rows = read_load_rows(run_dir)
    assert len(rows) == 16 and all(r["status"] == "ok" for r in rows if r["label"] == "vanilla")
    served = [r for r in rows if r["label"] == "pld-served"]
    assert len(served) == 8 and all(r["status"] == "error" and r["level_counters"] is None for r in served)
    assert all(r["new_tokens"] == 6 for r in served)  # the measured turn is kept with its error
    # the warm-up's request moved the counter back by 2 before the first level; each level's 4 requests by 8
    assert served[0]["error"] == (f"BackendError: the level's counters: GET {made[1][1]}/metrics: the counter drafts "
                                  "went backwards, from 98 to 90 between two readings (the server restarted, or "
                                  "reset its counters): no request's count")


def test_a_levels_server_statistics_are_read_and_diffed():
    """The prefix-cache and queue checks read vLLM's counters diffed around a level: summed over engines, None where
    the server lacks one (n/a, never 0), and None where a counter went backwards (a restarted server)."""
    from harness.backends.prometheus import read_server_stats
    from harness.run.load import stats_between

    text = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 120\n'
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 80\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 16\n'
            'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.25\n'
            'vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 5\n')
    assert read_server_stats(text) == {"prefix_cache_queries": 200.0, "prefix_cache_hits": 16.0,
                                       "queue_time_s": 0.25, "queued_requests": 5.0}
    assert read_server_stats("llamacpp:tokens_predicted_total 3\n") == dict.fromkeys(
        ("prefix_cache_queries", "prefix_cache_hits", "queue_time_s", "queued_requests"))
    before = {"prefix_cache_hits": 16.0, "queue_time_s": None, "queued_requests": 9.0}
    after = {"prefix_cache_hits": 48.0, "queue_time_s": 0.5, "queued_requests": 2.0}
    assert stats_between(before, after) == {"prefix_cache_hits": 32.0, "queue_time_s": None, "queued_requests": None}
    assert stats_between(None, after) is None
