"""A literal ablation run directory for the ablation and HTML report tests (no model is run).

vanilla and four jakiro entries from the grid mode x total_tokens, on suite "mt" (questions q1, q2, q3; one turn
each), temperature 0. The jakiro labels are deliberately opaque ("A".."D"): every knob must come from the records'
``method_options``, never from a label.

Per question (new tokens, wall seconds) and the draft counters:

    vanilla      q1 (6, 3.0)  q2 (3, 1.5)  q3 (4, 2.0)                       -> 2.0 tok/s on every question
    A hybrid 8   q1 (6, 1.0)  q2 (3, 1.0)  q3 (4, 1.0)   accept [1,3,2] [1,2] [1,3]
    B hybrid 16  q1 (6, 1.5)  q2 (3, 0.5)  q3 (4, 1.0)   accept [1,4,1] [1,2] [1,3]
    C ar 8       q1 (6, 2.0)  q2 (3, 1.5)  q3 (4, 2.0)   accept [1,2,2,1] [1,2] [1,2,1]
    D ar 16      q1 (6, 1.0)  q2 (3, 1.0)  q3 (4, 0.5)   accept [1,5] [1,2] [1,3]

Every verification step drafts depth 4; accepted drafts = accept length - 1. Draft forwards per turn: hybrid 3 per
step, ar 4 per step; timings: draft 0.010 s and verify 0.020 s per step. D's q3 ends differently from vanilla: its
output ids differ at token 2 and its text at character 7.
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST = {
    "run_id": "ablation-1", "created": "2025-01-01T00:00:00+00:00", "git_hash": "abc123", "git_dirty": False,
    "command": "draftbench run --methods vanilla,jakiro --sweep jakiro.mode=hybrid,ar --sweep jakiro.total_tokens=8,16",
    "versions": {"python": "3.12.0", "torch": "2.13.0", "transformers": "5.24.0"},
    "device": {"device": "cpu", "device_type": "cpu", "device_name": "Test CPU"},
    "config": {"baseline": "vanilla", "target": "tiny", "suites": ["mt"],
               "sweep_spec": [{"jakiro": {"mode": ["hybrid", "ar"], "total_tokens": [8, 16]}}]},
    "methods": {"vanilla": {"method": "vanilla", "lossless": True, "options": {}}},
}

TEXT = {"q1": "The capital of France is Paris.", "q2": "Two plus two is four.", "q3": "Once upon a time there was"}
IDS = {"q1": [11, 12, 13, 14, 15, 16], "q2": [21, 22, 23], "q3": [31, 32, 33, 34]}
WALL = {"vanilla": (3.0, 1.5, 2.0), "A": (1.0, 1.0, 1.0), "B": (1.5, 0.5, 1.0), "C": (2.0, 1.5, 2.0),
        "D": (1.0, 1.0, 0.5)}
ACCEPT = {"A": ([1, 3, 2], [1, 2], [1, 3]), "B": ([1, 4, 1], [1, 2], [1, 3]), "C": ([1, 2, 2, 1], [1, 2], [1, 2, 1]),
          "D": ([1, 5], [1, 2], [1, 3])}
OPTIONS = {"A": ("hybrid", 8), "B": ("hybrid", 16), "C": ("ar", 8), "D": ("ar", 16)}


def record(label: str, qid: str, i: int) -> dict:
    method = "vanilla" if label == "vanilla" else "jakiro"
    ids, text = list(IDS[qid]), TEXT[qid]
    if label == "D" and qid == "q3":
        ids, text = [31, 32, 99, 98], "Once upOn a midnight"
    rec = {"run_id": "ablation-1", "status": "ok", "error": None, "method": method, "label": label, "lossless": True,
           "method_options": {}, "suite": "mt", "suite_version": "1", "question_id": qid, "category": "writing",
           "turn": 0, "target": "tiny", "dtype": "float32", "device": "cpu", "temperature": 0.0, "top_p": 1.0,
           "seed": 0, "repeat": 0, "prompt_tokens": 9, "new_tokens": len(IDS[qid]), "wall_time_s": WALL[label][i],
           "prefill_time_s": 0.1, "stop_reason": "eos", "output_text": text, "output_ids": ids, "rss_bytes": 100,
           "peak_rss_bytes": 100, "cuda_peak_allocated_bytes": None, "cuda_peak_reserved_bytes": None,
           "nvml_used_bytes": None, "energy_j": None, "mean_power_w": None, "score": None, "score_name": None,
           "timestamp": "2025-01-01T00:00:01"}
    if method == "vanilla":
        lengths = [1] * len(IDS[qid])
        rec.update(accept_lengths=lengths, accepted_drafts=[], draft_depths=[], steps=len(lengths), timings={},
                   counters={"target_forwards": len(lengths)})
    else:
        mode, total = OPTIONS[label]
        lengths = ACCEPT[label][i]
        steps = len(lengths) - 1
        rec.update(method_options={"head": None, "mode": mode, "total_tokens": total, "depth": 3, "top_k": 4},
                   accept_lengths=lengths, accepted_drafts=[n - 1 for n in lengths[1:]], draft_depths=[4] * steps,
                   steps=len(lengths), timings={"draft_s": 0.010 * steps, "verify_s": 0.020 * steps,
                                                "overhead_s": 0.001 * steps},
                   counters={"draft_forwards": (3 if mode == "hybrid" else 4) * steps, "target_forwards": steps})
    return rec


RECORDS = [record(label, qid, i) for label in ("vanilla", "A", "B", "C", "D") for i, qid in enumerate(IDS)]


def write_run(root: Path, records: list[dict] = RECORDS, manifest: dict = MANIFEST) -> Path:
    run = Path(root) / "ablation-1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run
