"""Token Recycling against its authors' code (Luowaterbi/TokenRecycling at 1b4c05c: ``evaluation/
inference_recycling.py``'s ``recycling_forward`` with ``model/recycling/``'s KV-cache Llama and tree template "2.2.2",
written for transformers 4.37.1): the same prompts, model, tree and k (8), greedy, 64 new tokens.

    python tests/support/reference_recycling.py harness OUT.json                  # the harness's venv
    python tests/support/reference_recycling.py reference REPO MODEL OUT.json [plain] [warmup]  # the reference's venv
    python tests/support/reference_recycling.py report OUT.json                   # print the comparison again
    python tests/support/reference_recycling.py fixture REPO                      # the reference's venv

The harness side renders MT-bench's first 5 questions, both turns (turn 2's prompt holds vanilla's turn-1 answer), and
writes the prompt ids with vanilla's and ``token_recycling``'s outputs, forwards and accept lengths, and the adjacency
matrix's written rows after each turn (one method object for all turns, so the matrix persists, as published). The
reference side reads that file (all its turns: cut it to fewer questions first for a shorter run) and runs
``recycling_forward`` over the same turns in the same order with one matrix (the reference's global ``adj_matrix``,
made once, never reset), without the reference's warm-up (``evaluation/eval.py`` runs the first question 3 times first,
into the same matrix; flag ``warmup`` adds that pass; flag ``plain`` adds transformers' plain greedy ``generate``), and
prints the comparison. ``REPO``: a work tree of the reference repository; ``MODEL``: the default model's folder with
``rope_theta`` written at the top of ``config.json`` (transformers 4.37 does not read ``rope_parameters``).

``fixture`` runs ``recycling_forward`` on a table instead of a model (a slot's logits: a row per token plus a row per
depth in the tree, vocabulary 12) and writes each verification forward's slots and the matrix it was drafted from to
``tests/data/recycling_reference.json``, which ``tests/test_token_recycling.py`` replays against the harness's BFS
fill and update.

The reference's loop is written for CUDA (``.cuda()``, ``torch.device('cuda:0')``); here it runs on the CPU: its
module's ``torch`` is seen through :class:`_OnCpu` and ``Tensor.cuda`` returns the tensor. Its evaluation imports
(FastChat's, for ``run_eval``) are not used by ``recycling_forward`` and are given empty modules.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "recycling_reference.json"


def written_rows(adjacency: torch.Tensor) -> dict[str, list[int]]:
    """The rows of ``adjacency [V, k]`` holding anything but token 0, by token id."""
    rows = adjacency.ne(0).any(dim=1).nonzero().flatten().tolist()
    return {str(r): adjacency[r].tolist() for r in rows}


def harness_side(out: str) -> None:
    from harness.engine.sampling import SamplingParams
    from harness.models import load_target
    from harness.registry import get_method
    from tests.support.mt_bench_turns import vanilla_turns

    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    recycling = get_method("token_recycling").create(target, {})  # the 80-node tree, top_k 8, persist
    rows = []
    for qid, turn, ids, answer in vanilla_turns(target, 5, 64):
        tr = recycling.generate(ids, 64, SamplingParams())
        rows.append({"qid": qid, "turn": turn, "prompt": ids[0].tolist(), "vanilla": answer,
                     "recycling": tr.token_ids, "accept_lengths": tr.accept_lengths,
                     "matrix": written_rows(recycling.adjacency)})
    with open(out, "w") as f:
        json.dump(rows, f)


class _OnCpu(types.ModuleType):
    """``torch`` as the reference's module sees it: every device it names is the CPU."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def device(*args, **kwargs):
        return torch.device("cpu")


def reference_module(repo: str):
    """``evaluation.inference_recycling`` of the reference work tree ``repo``, running on the CPU."""
    sys.path[:0] = [repo, str(Path(__file__).resolve().parents[2])]  # the reference, then this repository
    fastchat = types.ModuleType("fastchat")
    fastchat.utils = types.ModuleType("fastchat.utils")
    fastchat.utils.str_to_torch_dtype = None
    evaluation_eval = types.ModuleType("evaluation.eval")
    evaluation_eval.run_eval = evaluation_eval.reorg_answer_file = None
    sys.modules.update({"fastchat": fastchat, "fastchat.utils": fastchat.utils, "evaluation.eval": evaluation_eval})
    import evaluation.inference_recycling as module

    module.torch = _OnCpu()
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    return module


def forwards_to(accept_lengths: list[int], tokens: int) -> int:
    """The reference's forwards (its prefill included) until it knows ``tokens`` new tokens: after its j-th tree
    forward it holds ``sum(accept_lengths[:j])`` (the prompt's last token, which its first forward re-runs as the
    root, counted out and the pending bonus token counted in)."""
    total = 0
    for j, a in enumerate(accept_lengths, 1):
        total += a
        if total >= tokens:
            return 1 + j
    return 1 + len(accept_lengths)


class _Checked:
    """The reference's model, seen by ``recycling_forward``, checking each tree forward against the harness's pure
    parts (``methods.token_recycling.adjacency``, torch only, so importable here): the 80 drafted tokens against
    ``tree_tokens_from_adjacency`` from the matrix the reference drafted them from, and that matrix against
    ``recycle_candidates`` applied to the previous forward's matrix with its slots and top-8 (within a turn: the
    reference does not recycle a turn's last forward). Counts in ``checked``: forwards, trees equal, updates
    compared, updates equal."""

    def __init__(self, model, module):
        from harness.engine.tree import TOKEN_RECYCLING_80, tree_from_choices
        from methods.token_recycling.adjacency import tree_levels

        self.model, self.module, self.previous = model, module, None
        self.parents, self.ranks = tree_from_choices(TOKEN_RECYCLING_80)
        self.levels = [torch.tensor(nodes) for nodes in tree_levels(self.parents.tolist())]
        self.checked = [0, 0, 0, 0]

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, input_ids, past_key_values, attention_mask=None, position_ids=None):
        from methods.token_recycling.adjacency import recycle_candidates, tree_tokens_from_adjacency

        out = self.model(input_ids=input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                         position_ids=position_ids)
        if attention_mask is None:  # a turn's prefill
            self.previous = None
            return out
        matrix, slots = self.module.adj_matrix, input_ids[0]
        if self.previous is not None:
            expected, ids, top = self.previous
            recycle_candidates(expected, ids, top)
            self.checked[2] += 1
            self.checked[3] += torch.equal(expected, matrix)
        tokens = tree_tokens_from_adjacency(matrix, slots[:1], self.parents, self.ranks, self.levels)
        self.checked[0] += 1
        self.checked[1] += torch.equal(tokens, slots[1:])
        self.previous = (matrix.clone(), slots.clone(), torch.topk(out.logits[0], 8, dim=-1).indices)
        return out


def reference_side(repo: str, model_path: str, out: str, *flags: str) -> None:
    """``flags``: ``plain``: also transformers' plain greedy ``generate`` (the RoPE check); ``warmup``: also a second
    pass as ``evaluation/eval.py`` runs it, the first question's turns decoded 3 times into the matrix before the
    measured ones (keys ``warm_*``)."""
    from transformers import AutoModelForCausalLM

    module = reference_module(repo)
    from model.recycling.modeling_llama_kv import LlamaForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    model = _Checked(LlamaForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval(), module)
    tokenizer = types.SimpleNamespace(eos_token_id=model.config.eos_token_id)
    with open(out) as f:
        rows = json.load(f)

    def decode(ids):
        seq, _, _, accepts = module.recycling_forward(types.SimpleNamespace(input_ids=torch.tensor([ids])), model,
                                                      tokenizer, 64, tree_version="2.2.2")
        return seq[0, len(ids):].tolist(), accepts

    for r in rows if "plain" in flags else []:
        ids = torch.tensor([r["prompt"]])
        with torch.inference_mode():
            seq = plain.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=model.config.eos_token_id)
        r["ref_vanilla"] = seq[0, ids.shape[1]:].tolist()
    for prefix in ["ref"] + (["warm"] if "warmup" in flags else []):
        module.adj_matrix = torch.zeros(model.vocab_size, 8, dtype=torch.long)  # as its __main__ makes it, once
        if prefix == "warm":
            for _ in range(3):
                for r in rows[:2]:
                    decode(r["prompt"])
        for r in rows:
            r[prefix], r[f"{prefix}_accept_lengths"] = decode(r["prompt"])
            r[f"{prefix}_matrix"] = written_rows(module.adj_matrix)
    with open(out, "w") as f:
        json.dump(rows, f)
    report(rows)
    print(f"the harness's BFS on the reference's matrix drafted the reference's tree at {model.checked[1]} of "
          f"{model.checked[0]} tree forwards; its update of the previous forward's matrix gave the reference's at "
          f"{model.checked[3]} of {model.checked[2]}")


def report(rows: list[dict]) -> None:
    n = len(rows)
    tokens = sum(len(r["vanilla"]) for r in rows)
    harness_f = [len(r["accept_lengths"]) for r in rows]
    plain = [r["ref_vanilla"] == r["vanilla"] for r in rows if "ref_vanilla" in r]
    print(f"plain greedy (transformers 4.37) equal to the harness's vanilla: {sum(plain)}/{len(plain)}; "
          f"harness token_recycling equal: "
          f"{sum(r['recycling'] == r['vanilla'] for r in rows)}/{n}, forwards {harness_f} ({sum(harness_f)}), "
          f"tau {tokens / sum(harness_f):.3f}")
    for prefix in [p for p in ("ref", "warm") if p in rows[0]]:
        ref_f = [forwards_to(r[f"{prefix}_accept_lengths"], len(r["vanilla"])) for r in rows]
        own = [1 + len(r[f"{prefix}_accept_lengths"]) for r in rows]
        accepts = [a for r in rows for a in r[f"{prefix}_accept_lengths"]]
        equal = sum(r[prefix][:len(r["vanilla"])] == r["vanilla"] for r in rows)
        print(f"{prefix}: first tokens equal to vanilla {equal}/{n}; forwards to vanilla's tokens (prefill included) "
              f"{ref_f} ({sum(ref_f)}), tau {tokens / sum(ref_f):.3f}; to its own stop {own} ({sum(own)}), new tokens "
              f"{[len(r[prefix]) for r in rows]}, mean accept length {sum(accepts) / len(accepts):.3f}")
        for r in rows:
            ref, har = r[f"{prefix}_matrix"], r["matrix"]
            both = set(ref) & set(har)
            print(f"  q{r['qid']} t{r['turn']}: rows written: {len(ref)} ({prefix}), {len(har)} (harness), "
                  f"{len(both)} in both, {sum(ref[k] == har[k] for k in both)} of them equal")


class _Toy:
    """A stand-in target for ``recycling_forward``: the logits at a slot are ``table[token] + by_depth[depth]`` (depth
    in the tree, 0 for the root; the prefill's are never read), so a token on slots of different depths gets
    different candidates; each tree forward's slots and the matrix it was drafted from are kept in ``steps``."""

    def __init__(self, table: torch.Tensor, by_depth: torch.Tensor, module):
        self.table, self.by_depth, self.module, self.steps = table, by_depth, module, []
        self.config = types.SimpleNamespace(num_hidden_layers=1, num_key_value_heads=1, max_position_embeddings=64,
                                            hidden_size=1, num_attention_heads=1)
        self.device, self.dtype, self.vocab_size = torch.device("cpu"), torch.float32, table.shape[0]

    def __call__(self, input_ids, past_key_values, attention_mask=None, position_ids=None):
        if attention_mask is None:  # the prefill (its logits are not read)
            return types.SimpleNamespace(logits=self.table[input_ids])
        self.steps.append({"matrix": self.module.adj_matrix.tolist(), "slots": input_ids[0].tolist()})
        return types.SimpleNamespace(logits=self.table[input_ids] + self.by_depth[position_ids - position_ids[:, :1]])


def fixture_side(repo: str) -> None:
    module = reference_module(repo)
    from model.recycling.tree_template_ import choose_tree_template

    generator = torch.Generator().manual_seed(0)
    table = torch.randn(12, 12, generator=generator).mul(4).round().div(4)  # [V, V] quarter steps
    table += torch.arange(12).flip(0) / 64  # no ties: the lower token id ahead (exact in binary, so in json)
    by_depth = torch.randn(7, 12, generator=generator).round().div(2)  # [depth, V] half steps
    prompt = [3, 7, 1, 5]
    model = _Toy(table, by_depth, module)
    module.adj_matrix = torch.zeros(12, 8, dtype=torch.long)
    seq, _, _, accepts = module.recycling_forward(types.SimpleNamespace(input_ids=torch.tensor([prompt])), model,
                                                  types.SimpleNamespace(eos_token_id=-1), 32, tree_version="2.2.2")
    fixture = {"source": "Luowaterbi/TokenRecycling@1b4c05cc642d111f12c61d4a99950d737121d9fe "
                         "evaluation/inference_recycling.py recycling_forward, tree 2.2.2, k 8",
               "tree": choose_tree_template("2.2.2"), "table": table.tolist(), "by_depth": by_depth.tolist(),
               "prompt": prompt,
               "output": seq[0].tolist(), "accept_lengths": accepts, "steps": model.steps,
               "final_matrix": module.adj_matrix.tolist()}
    FIXTURE.write_text(json.dumps(fixture) + "\n")
    print(f"{len(model.steps)} forwards, accept lengths {accepts}, written {FIXTURE}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    side, args = sys.argv[1], sys.argv[2:]
    if side == "harness":
        harness_side(args[0])
    elif side == "reference":
        reference_side(*args)
    elif side == "report":
        with open(args[0]) as f:
            report(json.load(f))
    else:
        fixture_side(args[0])
