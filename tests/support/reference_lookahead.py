"""Lookahead decoding against its authors' package, ``lade`` 0.0.2 (hao-ai-lab/LookaheadDecoding, which patches
transformers 4.34's Llama): the same prompts, model, W / N / G, greedy, 64 new tokens.

    python tests/support/reference_lookahead.py harness W N G OUT.json          # the harness's venv: vanilla, lookahead
    python tests/support/reference_lookahead.py lade W N G MODEL OUT.json       # lade's venv (torch, transformers 4.34)

The harness side renders MT-bench's first 5 questions, both turns (turn 2's prompt holds vanilla's turn-1 answer),
and writes the prompt ids with vanilla's and lookahead's outputs and forwards, and those of lookahead started as
lade's greedy path starts (:class:`LadeStart`); the lade side reads that file and adds lade's outputs and steps (its
``DEBUG`` summary; both count the prefill as a forward). ``MODEL``: the default model's folder with ``rope_theta``
written at the top of ``config.json`` (transformers 4.34 does not read ``rope_parameters`` and would run RoPE at
10,000 instead of 100,000).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys

import torch


def lade_start():
    """The harness's ``lookahead`` started as ``lade``'s greedy path (``jacobi_greedy_search_multilevel``) starts:
    its prefill forward also runs the window's first level (the same draws, the first one at the root's position), so
    its window enters the first step one level up and one draw on; and it keeps end-of-sequence tokens in the window
    (its ``filter_window`` runs only when sampling). The prefill's window is an extra forward here, not counted (lade
    runs it in the prefill, which both count once)."""
    from methods.lookahead import Lookahead

    class LadeStart(Lookahead):
        def __init__(self, target, options=None):
            super().__init__(target, options)
            self.eos = frozenset()

        def begin(self, prompt_ids, hidden):
            super().begin(prompt_ids, hidden)
            draws = self.levels[0][1:]  # [W + N - 3]
            logits = self.target.model(torch.tensor([self.prompt + draws], device=self.device)).logits[0]
            self.levels = [[0] + draws[1:], logits[-len(draws):].argmax(-1).tolist()]

    return LadeStart


def harness_side(w: int, n: int, g: int, out: str) -> None:
    from harness.engine.sampling import SamplingParams
    from harness.models import load_target
    from harness.registry import get_method
    from tests.support.mt_bench_turns import vanilla_turns

    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    look = get_method("lookahead").create(target, {"window": w, "ngram": n, "guess": g})
    started = lade_start().create(target, {"window": w, "ngram": n, "guess": g})
    rows = []
    for qid, turn, ids, answer in vanilla_turns(target, 5, 64):
        la = look.generate(ids, 64, SamplingParams())
        ls = started.generate(ids, 64, SamplingParams())
        rows.append({"qid": qid, "turn": turn, "prompt": ids[0].tolist(), "vanilla": answer,
                     "lookahead": la.token_ids, "forwards": len(la.accept_lengths),
                     "lade_start": ls.token_ids, "lade_start_forwards": len(ls.accept_lengths)})
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
          f"{[(r['lade_forwards'], r['forwards']) for r in rows]}; harness started as lade: tau "
          f"{sum(len(r['lade_start']) for r in rows) / sum(r['lade_start_forwards'] for r in rows):.3f}, forwards "
          f"equal to lade's in {sum(r['lade_start_forwards'] == r['lade_forwards'] for r in rows)}/{len(rows)} turns")


if __name__ == "__main__":
    torch.set_num_threads(1)
    side, args = sys.argv[1], sys.argv[2:]
    if side == "harness":
        harness_side(*(int(a) for a in args[:3]), args[3])
    else:
        lade_side(*(int(a) for a in args[:3]), args[3], args[4])
