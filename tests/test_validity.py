"""The validity checks (harness.measure.validity): each on literal rows, one passing and one failing case."""

from __future__ import annotations

from harness.measure import validity as V


def req(sent, finished, qid="q", ttft=0.1, label="v", status="ok", attempt="a", c=4, tokens=10, **extra):
    """One load.jsonl row with the fields the checks read."""
    return {"label": label, "question_id": qid, "sent_s": sent, "finished_s": finished, "prefill_time_s": ttft,
            "status": status, "attempt": attempt, "concurrency": c, "new_tokens": tokens, **extra}


def status(check):
    return check.status


def test_rate_reached():
    """A level sent at half the requested rate would be reported at a load it never had."""
    on_time = [req(t, t + 0.5) for t in (0.0, 1.0, 2.0, 3.0)]
    late = [req(t, t + 0.5) for t in (0.0, 2.0, 4.0, 6.0)]
    assert status(V.rate_reached(on_time, 1.0)) == V.PASS, "1 request/s sent at 1/s must pass"
    assert status(V.rate_reached(late, 1.0)) == V.FAIL, "0.5 requests/s of 1 requested must fail"
    assert status(V.rate_reached(late, None)) == V.NA, "all at once has no rate to reach"


def test_concurrency_reached():
    """A level whose requests mostly ran alone measured concurrency 1 under the label 2."""
    full = [req(0, 10), req(0, 10)]
    thin = [req(0, 10), req(0, 2)]
    assert status(V.concurrency_reached(full, 2, None)) == V.PASS, "2 in flight throughout must pass"
    check = V.concurrency_reached(thin, 2, None)
    assert status(check) == V.FAIL and "1.20 requests in flight" in check.detail, check.detail
    assert status(V.concurrency_reached(thin, 2, 3.0)) == V.NA, "at a finite rate the concurrency is only a cap"


def test_prompts_reused():
    """A prompt sent twice by one entry is served from the prefix cache the second time."""
    fresh = [req(0, 1, "q1", c=1), req(0, 1, "q2", c=2), req(0, 1, "q1", label="s", c=1)]
    wrapped = [req(0, 1, "q1", c=1), req(0, 1, "q1", c=2)]
    assert status(V.prompts_reused(fresh)) == V.PASS, "the same prompt under two entries is the pairing, not reuse"
    check = V.prompts_reused(wrapped)
    assert status(check) == V.FAIL and "q1" in check.detail, check.detail


def test_window_vs_warmup():
    """A level that is mostly its own ramp measures start-up, not steady load."""
    long = [req(0, 10, ttft=1.0), req(0, 9, ttft=0.5)]
    short = [req(0, 4, ttft=2.0), req(0, 4, ttft=1.0)]
    assert status(V.window_vs_warmup(long, 2)) == V.PASS, "a 1 s ramp in a 10 s window must pass"
    check = V.window_vs_warmup(short, 2)
    assert status(check) == V.FAIL and "(50%" in check.detail, check.detail


def test_repeat_spread():
    """speculators' rule: repeats more than 5% apart are not one measurement."""
    assert status(V.repeat_spread([100.0, 103.0])) == V.PASS, "3% apart must pass"
    check = V.repeat_spread([100.0, 110.0])
    assert status(check) == V.FAIL and "9.5%" in check.detail, check.detail
    assert status(V.repeat_spread([100.0])) == V.NA, "one measurement has no spread"


def test_arrival_waves():
    """Requests replaced in lockstep (all finished on one engine step) are a batch benchmark, not arrivals."""
    spread = [req(t, t + 1) for t in (0, 0, 0, 0, 5.0, 5.3, 5.9, 6.4)]
    lockstep = [req(t, t + 1) for t in (0, 0, 0, 0, 5.000, 5.001, 5.002, 5.003)]
    assert status(V.arrival_waves(spread, 4)) == V.PASS, "later sends apart from each other must pass"
    check = V.arrival_waves(lockstep, 4)
    assert status(check) == V.FAIL and "at most 4 of 4" in check.detail, check.detail


def test_prefix_cache_hits():
    """A level whose prompts came from the prefix cache skipped their prefill."""
    assert status(V.prefix_cache_hits({"prefix_cache_hits": 16.0, "prefix_cache_queries": 200.0})) == V.PASS
    check = V.prefix_cache_hits({"prefix_cache_hits": 150.0, "prefix_cache_queries": 200.0})
    assert status(check) == V.FAIL and "75%" in check.detail, check.detail
    assert status(V.prefix_cache_hits(None)) == V.NA, "a server without the counters is not checked, not passed"


def test_server_queue_time():
    """Requests waiting in the server's queue mean it ran fewer than the level's concurrency at once."""
    rows = [req(0, 5)] * 4
    assert status(V.server_queue_time({"queue_time_s": 0.4, "queued_requests": 4.0}, rows)) == V.PASS
    check = V.server_queue_time({"queue_time_s": 8.0, "queued_requests": 4.0}, rows)
    assert status(check) == V.FAIL and "(40%" in check.detail, check.detail
    assert status(V.server_queue_time({"queue_time_s": None, "queued_requests": None}, rows)) == V.NA


def test_warmup_done():
    """Without warm-up the first measured turns carry one-time costs (allocation, caches, compilation)."""
    assert status(V.warmup_done(1)) == V.PASS
    assert status(V.warmup_done(0)) == V.FAIL
    assert status(V.warmup_done(None)) == V.NA


def test_compile_outside():
    """A turn that compiled inside its wall time is not a steady-state speed."""
    assert status(V.compile_outside([0.0, 0.0])) == V.PASS
    check = V.compile_outside([0.0, 1.5])
    assert status(check) == V.FAIL and "1 of 2" in check.detail, check.detail
    assert status(V.compile_outside([None])) == V.NA


def test_machine_load():
    """A load average above the CPUs means the run's threads waited for cores other processes held."""
    assert status(V.machine_load([1.2, 1.9], 2)) == V.PASS
    check = V.machine_load([1.2, 3.5], 2)
    assert status(check) == V.FAIL and "3.50 on 2" in check.detail, check.detail
    assert status(V.machine_load([], 2)) == V.NA


def test_interleaving():
    """Entries measured one after another on a drifting machine: the drift falls on whichever ran last."""
    assert status(V.interleaving(2, False, [1.0, 1.4], 2)) == V.PASS, "a steady machine needs no interleaving"
    assert status(V.interleaving(2, False, [1.0, 2.6], 2)) == V.FAIL, "a 1.6 drift on 2 CPUs must fail"
    assert status(V.interleaving(2, False, [1.0, 2.6], 16)) == V.PASS, "1.6 more threads on 16 CPUs take no core"
    assert status(V.interleaving(3, True, [], 2)) == V.PASS, "an interleaved run passes"
    assert status(V.interleaving(2, False, [], 2)) == V.NA, "no load readings: drift unknown"


def test_run_and_load_checks_and_markdown():
    """The run-level lists read the manifest and records; a failed check is a line of the Validity section."""
    manifest = {"config": {"warmup": 0, "interleave": True}, "device": {"cpu_count": 2}}
    records = [{"status": "ok", "label": "v", "repeat": 0, "new_tokens": 10, "wall_time_s": 1.0,
                "turn_compile_s": 0.0, "load_avg_1m": 1.0}]
    checks = V.run_checks(records, manifest)
    assert [c.name for c in V.failed(checks)] == ["warmup"], [c.line() for c in checks]
    level = [req(0.0, 4.0, f"q{i}", c=2, request_rate=None, level_server=None, load_avg_1m=[0.5, 3.0])
             for i in range(2)]
    checks = V.load_checks(level, {("v", 2): level}, {"config": {"warmup": 1}, "device": {"cpu_count": 2}})
    assert {c.name for c in V.failed(checks)} == {"machine load"}, [c.line() for c in checks]
    md = V.validity_markdown(checks)
    assert "- FAIL machine load: 1-min load average 0.50 to 3.00" in md, md
    assert "- N/A prefix cache (v @ 2): the server reports no prefix-cache counters" in md, md
