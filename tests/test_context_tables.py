"""Tables, Markdown and plot against input length (issue #23, items 2 and 3), from literal records.

The run: vanilla and pld on suite long_context at buckets 512 and 4096, one prompt each, temperature 0.
  512:  vanilla 9 tokens in 1.0 s (prefill 0.2 s) -> 9 tok/s, decode 8 / 0.8 = 10 tok/s
        pld     9 tokens in 0.5 s (prefill 0.2 s), accept lengths [1, 4, 4] -> 18 tok/s, decode 8 / 0.3 = 26.67;
                speed-up 2.0, decode speed-up 2.667; tau 9 / 3 = 3; draft 10 ms / 2 steps = 5 ms, verify 100 ms
  4096: vanilla 9 tokens in 2.0 s (prefill 1.0 s) -> 4.5 tok/s, decode 8 / 1.0 = 8 tok/s
        pld     9 tokens in 2.5 s (prefill 1.0 s) -> 3.6 tok/s, decode 8 / 1.5 = 5.33; speed-up 0.8, decode 0.667
  so pld's speed-up falls below 1.0 at 4096 (one prompt: the CI is the point, 0.8, wholly below 1.0).
"""

import math

import pytest

from harness.measure import metrics as M
from harness.measure.records import RecordStore
from harness.report import context as CT
from harness.report import report as R
from harness.report import tables as T
from harness.report.markdown import context_markdown


def rec(label, bucket, wall, prefill, lengths, accepted=(), depths=(), timings=None, draft_kv=None):
    new = sum(lengths)
    return {"run_id": "r", "status": "ok", "error": None, "method": label, "label": label, "lossless": True,
            "method_options": {}, "suite": "long_context", "suite_version": "1", "question_id": f"{bucket}-0",
            "category": None, "turn": 0, "question_turns": 1, "target": "tiny", "dtype": "float32", "device": "cpu",
            "temperature": 0.0, "top_p": 1.0, "seed": 0, "repeat": 0, "prompt_tokens": bucket, "new_tokens": new,
            "steps": len(lengths), "accept_lengths": list(lengths), "accepted_drafts": list(accepted),
            "draft_depths": list(depths), "wall_time_s": wall, "prefill_time_s": prefill, "stop_reason": "eos",
            "output_text": "x", "output_ids": list(range(new)), "timings": timings or {}, "counters": {},
            "score": None, "score_name": None, "timestamp": "2025-01-01T00:00:01", "attempt": f"{label}{bucket}",
            "context_bucket": bucket, "context_documents": ["241"], "context_cut_tokens": 7,
            "kv_cache_bytes": 2 * 30 * 3 * 64 * (bucket + new) * 4, "draft_kv_bytes": draft_kv}


RECORDS = [
    rec("vanilla", 512, 1.0, 0.2, [1] * 9),
    rec("pld", 512, 0.5, 0.2, [1, 4, 4], [3, 3], [4, 4], {"draft_s": 0.01, "verify_s": 0.2}, 2 * 3 * 64 * 521 * 4),
    rec("vanilla", 4096, 2.0, 1.0, [1] * 9),
    rec("pld", 4096, 2.5, 1.0, [1, 4, 4], [3, 3], [4, 4], {"draft_s": 0.1, "verify_s": 1.0}, 2 * 3 * 64 * 1024 * 4),
]


def test_decode_tokens_per_second_leaves_the_prefill_out():
    """The prefill forward's token and time both leave the ratio; (33, 2.0, 1.0) and (17, 1.5, 0.5) -> 48 / 2."""
    assert M.decode_tokens_per_second([33, 17], [2.0, 1.5], [1.0, 0.5]) == 24.0
    assert M.decode_tokens_per_second([33, 17], [2.0, 1.5], [None, 0.5]) == 16.0  # a turn without prefill time
    assert math.isnan(M.decode_tokens_per_second([1], [1.0], [1.0]))


def test_crossover_is_where_the_speedup_stays_below_one():
    """A dip that recovers is no crossover; below 1.0 from the start is the shortest bucket."""
    assert M.crossover_context([512, 2048, 4096], [1.4, 0.9, 0.8]) == 2048
    assert M.crossover_context([512, 2048, 4096], [1.4, 0.9, 1.1]) is None
    assert M.crossover_context([512, 2048, 4096], [0.9, 0.8, 0.7]) == 512
    assert M.crossover_context([512, 2048, 4096], [1.2, float("nan"), 0.7]) == 4096


def test_kv_cache_bytes():
    """SmolLM2-135M's cache at 4096 positions in float32: 180 MiB."""
    assert M.kv_cache_bytes(30, 3, 64, 4096, 4) == 188_743_680


def test_draft_kv_bytes():
    """A one-layer head shaped like SmolLM2-135M's layers at 4096 positions in float32: 6 MiB; a 512-position draft
    window keeps 512 of them; a window longer than the context keeps them all."""
    assert M.draft_kv_bytes(1, 3, 64, 4096, 4) == 6_291_456
    assert M.draft_kv_bytes(1, 3, 64, 4096, 4, window=512) == 786_432
    assert M.draft_kv_bytes(1, 3, 64, 300, 2, window=512) == 2 * 3 * 64 * 300 * 2


def test_context_table_per_bucket_numbers():
    """Every number of the module docstring; a prefill left inside decode tok/s would hide the decode loss."""
    ctx = CT.context_table(T.turns_table(RECORDS), n_boot=200)
    pld = ctx[ctx["label"] == "pld"].set_index("context_bucket")
    assert list(pld.index) == [512, 4096]
    assert pld.loc[512, "speedup"] == pytest.approx(2.0) and pld.loc[4096, "speedup"] == pytest.approx(0.8)
    assert pld.loc[4096, "speedup_ci_hi"] == pytest.approx(0.8)
    assert pld.loc[512, "decode_tokens_per_s"] == pytest.approx(8 / 0.3)
    assert pld.loc[512, "decode_speedup"] == pytest.approx((8 / 0.3) / 10)
    assert pld.loc[4096, "decode_speedup"] == pytest.approx((8 / 1.5) / 8)
    assert (pld.loc[512, "tau"], pld.loc[512, "acc@1"], pld.loc[512, "acc@4"]) == (3.0, 1.0, 0.0)
    assert (pld.loc[512, "draft_ms_per_step"], pld.loc[512, "verify_ms_per_step"]) == pytest.approx((5.0, 100.0))
    assert (pld.loc[4096, "prefill_s"], pld.loc[4096, "prompt_tokens"]) == (1.0, 4096.0)
    assert pld.loc[4096, "kv_cache_bytes"] == 2 * 30 * 3 * 64 * 4105 * 4
    assert pld["draft_kv_bytes"].tolist() == [2 * 3 * 64 * 521 * 4, 2 * 3 * 64 * 1024 * 4]
    van = ctx[ctx["label"] == "vanilla"].set_index("context_bucket")
    assert van["draft_kv_bytes"].isna().all()  # a method without a draft KV: NaN, never 0
    assert math.isnan(van.loc[512, "draft_ms_per_step"]) and van.loc[4096, "decode_tokens_per_s"] == 8.0


def test_crossover_table_and_markdown():
    """pld crosses at 4096 with its CI wholly below 1.0, and so does its decode speed-up (2.67, then 0.67);
    vanilla, the baseline, has no row."""
    ctx = CT.context_table(T.turns_table(RECORDS), n_boot=200)
    cross = CT.crossover_table(ctx)
    assert cross[["label", "crossover_bucket", "significant", "decode_crossover_bucket"]].values.tolist() == \
        [["pld", 4096, True, 4096]]
    md = context_markdown(ctx, cross)
    assert "| pld | 2.00 [2.00, 2.00]× / 3.00 | 0.80 [0.80, 0.80]× / 3.00 | 4096 (0.80 [0.80, 0.80]×) | 4096 |" in md
    assert "| pld | 4096 | 4096 | 1.000 | 3.6 | 5.3 | 0.67× | 50.0 | 500.0 | 180 MiB | 2 MiB |" in md


def test_report_writes_context_outputs_only_for_a_run_with_buckets(tmp_path):
    """A run with buckets gets context.csv, crossover.csv, the plot and the Markdown; one without gets none of them
    (its report must stay as it was)."""
    RecordStore(tmp_path / "ctx").append(RECORDS)
    paths = R.write_report(tmp_path / "ctx")
    assert {"context_csv", "crossover_csv", "plot_context"} <= set(paths)
    assert "against input length" in (tmp_path / "ctx" / "tables" / "summary.md").read_text()
    plain = [{k: v for k, v in r.items() if not k.startswith(("context_", "kv_cache"))} for r in RECORDS]
    RecordStore(tmp_path / "plain").append(plain)
    paths = R.write_report(tmp_path / "plain")
    assert not {"context_csv", "crossover_csv", "plot_context"} & set(paths)
    assert not (tmp_path / "plain" / "tables" / "context.csv").exists()


def windowed(window, bucket, wall, lengths, depths):
    """A turn of eagle3 with option ``draft_window`` = ``window`` (label as a sweep writes it)."""
    accepted = [n - 1 for n in lengths[1:]]
    r = rec(f"eagle3[draft_window={window}]", bucket, wall, 0.2, lengths, accepted, depths,
            {"draft_s": 0.01, "verify_s": 0.1})
    return {**r, "method": "eagle3", "method_options": {"draft_window": window, "depth": 4}}


# A draft_window sweep against the buckets (issue #23 item 4); vanilla as in RECORDS (9 tokens: 1.0 s, then 2.0 s):
#   window 0   512: [1, 4, 4] in 0.5 s      -> τ 3,    speed-up 2.0;   4096: [1, 2, 2, 2, 2] in 2.5 s -> τ 1.8, 0.8
#   window 32  512: [1, 4, 2, 2] in 0.6 s   -> τ 2.25, speed-up 5/3;   4096: [1, 4, 4] in 1.5 s       -> τ 3,   4/3
WINDOW_RECORDS = [
    RECORDS[0], RECORDS[2],
    windowed(0, 512, 0.5, [1, 4, 4], [4, 4]), windowed(32, 512, 0.6, [1, 4, 2, 2], [4, 4, 4]),
    windowed(0, 4096, 2.5, [1, 2, 2, 2, 2], [4, 4, 4, 4]), windowed(32, 4096, 1.5, [1, 4, 4], [4, 4]),
]


def test_ablation_of_a_knob_is_per_bucket():
    """One ablation row per entry and input length, the speed-up against vanilla on that bucket's prompt: pooled over
    the buckets (one row per entry) window 0 would show τ 18 / 8 = 2.25, as window 32's 512 bucket, and hide that
    the window loses at 512 and wins at 4096; a speed-up against both buckets' vanilla would pair the wrong prompts."""
    from harness.report import ablation as A

    t = A.ablation_table(T.turns_table(WINDOW_RECORDS), n_boot=200)
    got = {(r["opt.draft_window"], r["context_bucket"]): [r["tau"], r["speedup"], r["acc@2"]]
           for r in t.to_dict("records")}
    want = {(0, 512): [3.0, 2.0, 1.0], (32, 512): [2.25, 5 / 3, 1 / 3], (0, 4096): [1.8, 0.8, 0.0],
            (32, 4096): [3.0, 4 / 3, 1.0]}
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k]) for k in want)
    assert A.table_knobs(t) == ["opt.draft_window", "context_bucket"]
    assert "| label | draft_window | context_bucket |" in A.ablation_markdown(T.turns_table(WINDOW_RECORDS))
    plain = [{k: v for k, v in r.items() if k != "context_bucket"} for r in WINDOW_RECORDS]
    assert len(A.ablation_table(T.turns_table(plain), n_boot=200)) == 2  # no buckets: one row per entry, as before


def test_window_sweep_plots_against_both_knobs(tmp_path):
    """The report plots the knob with one line per bucket and the buckets with one line per window."""
    from harness.report import ablation as A

    RecordStore(tmp_path / "w").append(WINDOW_RECORDS)
    paths = A.write_ablation(tmp_path / "w", T.turns_table(WINDOW_RECORDS))
    assert {"plot_ablation_eagle3_draft_window", "plot_ablation_eagle3_context_bucket",
            "plot_ablation_eagle3_draft_window_acceptance"} <= set(paths)
