"""Layer-skip self-speculation against SWIFT's own code (hemingkx/SWIFT at 88caed7, ``model/swift`` and
``evaluation_llama/inference_swift.py``; its ``requirements.txt`` pins transformers 4.37.1): the same model, prompts
and skipped set, no search, greedy.

    python tests/support/reference_layer_skip.py harness QUESTIONS TOKENS OUT.json [SKIP | ATTN:MLP]   # harness venv
    SWIFT=CHECKOUT REFVENV/bin/python tests/support/reference_layer_skip.py swift MODEL OUT.json   # SWIFT's venv
    python tests/support/reference_layer_skip.py compare OUT.json
    SWIFT=CHECKOUT REFVENV/bin/python tests/support/reference_layer_skip.py fixture OUT.json   # the test's data
    python tests/support/reference_layer_skip.py fixture-sub OUT.json   # adds a compared ATTN:MLP run's first turn

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

``SKIP`` (``1,3,5``) replaces the initial set; ``ATTN:MLP`` (``1,3,5:2,3``) skips the attention of the first layers
and the MLP of the second (the harness's ``skip_attn`` / ``skip_mlp``, SWIFT's ``set_skip_layers(attn, mlp)``).
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


def harness_side(questions: int, tokens: int, out: str, skip: list[int] | None = None,
                 sub_layers: tuple[list[int], list[int]] | None = None) -> None:
    from harness.engine.sampling import SamplingParams
    from harness.models import load_target
    from harness.registry import get_method
    from tests.support.mt_bench_turns import vanilla_turns

    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    skip = skip if skip is not None else swift_initial_set(len(target.model.get_decoder().layers))
    attn, mlp = sub_layers or (skip, skip)
    sets = {"skip_attn": attn, "skip_mlp": mlp} if sub_layers else {"skip_layers": skip}
    options = {**sets, "k": MAX_STEP_DRAFT, "stop_threshold": STOP_THRESHOLD}
    methods = {shape: get_method("layer_skip").create(target, {**options, "tree": shape})
               for shape in ("chain", "confidence")}
    chains: list[list[int]] = []
    for method in methods.values():
        method.propose = recording(method.propose, chains)
    rows = []
    with torch.inference_mode():
        for qid, turn, ids, answer in vanilla_turns(target, questions, tokens):
            row = {"qid": qid, "turn": turn, "prompt": ids[0].tolist(), "vanilla": answer}
            for shape, key in (("chain", "harness"), ("confidence", "harness_tree")):
                chains.clear()
                gen = methods[shape].generate(ids, tokens, SamplingParams())
                steps = len(gen.accept_lengths) - 1  # forward 0 is the prefill
                row.update({key: gen.token_ids, f"{key}_forwards": len(gen.accept_lengths),
                            f"{key}_chains": chains[:steps],
                            f"{key}_accepted": [a - 1 for a in gen.accept_lengths[1:]]})
            rows.append(row)
    with open(out, "w") as f:
        json.dump({"skip_layers": skip, "skip_attn": attn, "skip_mlp": mlp, "tokens": tokens, "rows": rows}, f)


def recording(propose, chains: list[list[int]]):
    """``propose`` that also appends each tree's chain (its nodes whose parent is the node before them in the chain:
    the root's first child, that node's first child, ...) to ``chains``."""

    def wrapped(root, sampling, generator):
        tree = propose(root, sampling, generator)
        parents, chain, last = tree.parents.tolist(), [], -1
        for i, p in enumerate(parents):
            if p == last:
                chain.append(i)
                last = i
        chains.append(tree.tokens[chain].tolist())
        return tree

    return wrapped


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
    skip = res["skip_layers"]  # fixtures before sub-layers name one set for both
    model.set_skip_layers(np.array(res.get("skip_attn", skip)), np.array(res.get("skip_mlp", skip)))
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


def comparable_steps(mine: list[list[int]], theirs: list[list[int]], accepted: list[int], budget: int) -> int:
    """How many first steps both sides draft unshortened: SWIFT ends a chain early near the budget
    (``swift_draft``: ``new_token_num + step_draft + 2 >= max_new_tokens``), the harness's engine cuts the emitted
    tokens instead; ``accepted``: SWIFT's accepted draft tokens per step."""
    done = 0
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if done + max(len(a), len(b)) + 1 >= budget:
            return i
        done += accepted[i] + 1
    return min(len(mine), len(theirs))


def compare(path: str) -> dict:
    """Per turn and shape (the bare chain; SWIFT's tree, the harness's ``tree: confidence``), the steps before the
    budget's end (SWIFT shortens its last chains to the budget, the harness's engine cuts the emitted tokens instead):
    equal chains and accepted counts; outputs against vanilla, target forwards (prefill included) and tau."""
    with open(path) as f:
        res = json.load(f)
    rows, n = res["rows"], res["tokens"]
    summary = {}
    for shape, mine, theirs in (("chain", "harness", "swift_chain"), ("tree", "harness_tree", "swift_tree")):
        if mine not in rows[0] or theirs not in rows[0]:
            continue
        steps = same_chain = same_accept = 0
        for r in rows:
            m = comparable_steps(r[f"{mine}_chains"], r[f"{theirs}_chains"], r[f"{theirs}_accepted"], n)
            steps += m
            same_chain += sum(a == b for a, b in zip(r[f"{mine}_chains"][:m], r[f"{theirs}_chains"]))
            same_accept += sum(a == b for a, b in zip(r[f"{mine}_accepted"][:m], r[f"{theirs}_accepted"]))
        tau = {side: round(sum(len(r[side]) for r in rows) / sum(r[f"{side}_forwards"] for r in rows), 3)
               for side in (mine, theirs)}
        summary[shape] = {"turns": len(rows), "steps_compared": steps, "equal_chains": same_chain,
                          "equal_accepted": same_accept,
                          "equal_vanilla": {side: sum(r[side][:n] == r["vanilla"] for r in rows)
                                            for side in (mine, theirs)},
                          "forwards": {side: sum(r[f"{side}_forwards"] for r in rows) for side in (mine, theirs)},
                          "tau": tau}
    print(json.dumps(summary, indent=1))
    return summary


CONFIDENCES = [[0.99, 0.96, 0.951, 0.95, 0.9, 0.81, 0.8, 0.51, 0.5, 0.2], [0.97, 0.3], [0.1]]


def fixture_rows(res: dict, turns: int) -> list[dict]:
    """The first ``turns`` rows of a compared ``OUT.json`` as the fixture keeps them: prompt, vanilla's tokens and
    SWIFT's chains, accepted counts and forwards (bare chain and tree)."""
    keys = ["qid", "turn", "prompt", "vanilla"] + [f"swift_{shape}{part}" for shape in ("chain", "tree")
                                                   for part in ("_chains", "_accepted", "_forwards")]
    return [{k: r[k] for k in keys} for r in res["rows"][:turns]]


def fixture(path: str, turns: int = 2) -> None:
    """In SWIFT's venv: ``tests/data/layer_skip_reference.json`` from a compared ``OUT.json``: the first ``turns``
    turns' prompts, vanilla's tokens and SWIFT's chains and accepted counts (bare chain and tree), and the choices
    SWIFT's ``get_choices_list`` makes of literal confidences (greedy and sampled)."""
    inference = load_swift(os.environ["SWIFT"])
    with open(path) as f:
        res = json.load(f)
    choices = [{"confidences": c, "greedy": inference.get_choices_list(c),
                "sampled": inference.get_choices_list(c, logits_processor=True)} for c in CONFIDENCES]
    FIXTURE.write_text(json.dumps({
        "source": f"hemingkx/SWIFT@{COMMIT[:7]}, tests/support/reference_layer_skip.py",
        "skip_layers": res["skip_layers"], "tokens": res["tokens"], "k": MAX_STEP_DRAFT,
        "stop_threshold": STOP_THRESHOLD, "choices": choices,
        "rows": fixture_rows(res, turns)}) + "\n")


def fixture_sub_layers(path: str, turns: int = 1) -> None:
    """Adds to the fixture, under ``sub_layers``, a compared ``OUT.json`` of an ``ATTN:MLP`` run: its sets and its
    first ``turns`` turns' rows as :func:`fixture` keeps them (the rest of the file is left as it is)."""
    with open(path) as f:
        res = json.load(f)
    data = json.loads(FIXTURE.read_text())
    data["sub_layers"] = {"skip_attn": res["skip_attn"], "skip_mlp": res["skip_mlp"], "tokens": res["tokens"],
                          "rows": fixture_rows(res, turns)}
    FIXTURE.write_text(json.dumps(data) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    side, args = sys.argv[1], sys.argv[2:]
    if side == "harness":
        def layers(text: str) -> list[int]:
            return [int(i) for i in text.split(",") if i]

        chosen = args[3] if len(args) > 3 else None
        if chosen and ":" in chosen:
            attn, mlp = chosen.split(":")
            harness_side(int(args[0]), int(args[1]), args[2], [], (layers(attn), layers(mlp)))
        else:
            harness_side(int(args[0]), int(args[1]), args[2], layers(chosen) if chosen else None)
    elif side == "swift":
        swift_side(args[0], args[1])
    elif side == "compare":
        compare(args[0])
    elif side == "fixture":
        fixture(args[0])
    elif side == "fixture-sub":
        fixture_sub_layers(args[0])
    else:
        raise SystemExit(f"unknown side {side!r}: harness, swift, compare, fixture, fixture-sub")
