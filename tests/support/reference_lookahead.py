"""Lookahead decoding against its authors' package, ``lade`` 0.0.2 (hao-ai-lab/LookaheadDecoding, which patches
transformers 4.34's Llama): the same prompts, model, W / N / G, greedy, 64 new tokens.

    python tests/support/reference_lookahead.py harness W N G OUT.json          # the harness's venv: vanilla, lookahead
    python tests/support/reference_lookahead.py lade W N G MODEL OUT.json       # lade's venv (torch, transformers 4.34)

The harness side renders MT-bench's first 5 questions, both turns (turn 2's prompt holds vanilla's turn-1 answer),
and writes the prompt ids with vanilla's and lookahead's outputs and forwards; the lade side reads that file and
adds lade's outputs and steps (its ``DEBUG`` summary; both count the prefill as a forward). ``MODEL``: the default
model's folder with ``rope_theta`` written at the top of ``config.json`` (transformers 4.34 does not read
``rope_parameters`` and would run RoPE at 10,000 instead of 100,000).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys

import torch


def harness_side(w: int, n: int, g: int, out: str) -> None:
    from harness.engine.sampling import SamplingParams
    from harness.models import load_target
    from harness.registry import get_method
    from harness.run.suites import load_suite

    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    vanilla = get_method("vanilla").create(target, {})
    look = get_method("lookahead").create(target, {"window": w, "ngram": n, "guess": g})
    questions = load_suite("mt_bench", os.environ.get("DRAFTBENCH_DATA")).questions[:5]
    rows = []
    for q in questions:
        messages = []
        for turn, text in enumerate(q.turns):
            messages.append({"role": "user", "content": text})
            ids = target.render_chat(messages)
            v = vanilla.generate(ids, 64, SamplingParams())
            la = look.generate(ids, 64, SamplingParams())
            rows.append({"qid": q.question_id, "turn": turn, "prompt": ids[0].tolist(), "vanilla": v.token_ids,
                         "lookahead": la.token_ids, "forwards": len(la.accept_lengths)})
            messages.append({"role": "assistant", "content": target.decode(v.token_ids)})
    with open(out, "w") as f:
        json.dump(rows, f)


def lade_side(w: int, n: int, g: int, model_path: str, out: str) -> None:
    os.environ["USE_LADE"] = "1"
    import lade
    from transformers import AutoModelForCausalLM

    lade.augment_all()
    lade.config_lade(LEVEL=n, WINDOW_SIZE=w, GUESS_SET_SIZE=g, DEBUG=1)
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    with open(out) as f:
        rows = json.load(f)
    for r in rows:
        ids = torch.tensor([r["prompt"]])
        log = io.StringIO()
        with contextlib.redirect_stdout(log), torch.inference_mode():
            seq = model.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=model.config.eos_token_id)
        r["lade"] = seq[0, ids.shape[1]:].tolist()
        r["lade_forwards"] = int(re.search(r"Total steps:\s+(\d+)", log.getvalue()).group(1))
    with open(out, "w") as f:
        json.dump(rows, f)
    tokens = sum(len(r["lade"]) for r in rows)
    print(f"lade: tau {tokens / sum(r['lade_forwards'] for r in rows):.3f}, equal to vanilla "
          f"{sum(r['lade'] == r['vanilla'] for r in rows)}/{len(rows)}; harness: tau "
          f"{sum(len(r['lookahead']) for r in rows) / sum(r['forwards'] for r in rows):.3f}, equal to vanilla "
          f"{sum(r['lookahead'] == r['vanilla'] for r in rows)}/{len(rows)}; forwards per turn (lade, harness): "
          f"{[(r['lade_forwards'], r['forwards']) for r in rows]}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    side, args = sys.argv[1], sys.argv[2:]
    if side == "harness":
        harness_side(*(int(a) for a in args[:3]), args[3])
    else:
        lade_side(*(int(a) for a in args[:3]), args[3], args[4])
