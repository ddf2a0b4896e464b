"""SAM-Decoding against its authors' code: the dynamic suffix automaton of hyx1999/SAM-Decoding (commit 18c41f0,
``samd/sam/dyn_sam.py``'s ``DynSAM``, pure Python), driven as its generation loop drives it, beside the harness's
``sam`` with ``fallback: none``.

The reference's loop (``samd/samd_model.py``, ``samd/draft.py``): the prefill adds the prompt
(``DraftModel.update`` -> ``DynSAM.add_tokens``); each step looks the pending token up (``DynSAM.lookup``: the
match length, the pending token included) and, when that length reaches ``len_threshold`` (the static automaton
absent: ``NullStaticSAM`` matches 0, less ``len_bias``), drafts ``DynSAM.gen_draft`` (the pending token, then the
text after the first occurrence of the match or of the ancestor ``to_anc`` climbs to, padded with token 0 to
``n_predicts``); below it the tree model drafts (here: no draft); then adds the pending token and the accepted
draft. Defaults as in ``samd/samd_config.py`` and ``scripts/inference_samd.sh``: ``n_predicts`` 40 (39 drafted
tokens), ``len_threshold`` 5. The harness runs with ``draft_tokens`` 39, ``threshold`` 5.

Greedy decoding is replayed over known text as ``reference_suffix.py`` does (MT-bench prompts in SmolLM2's chat
template, GPT-4's reference answers as the generated text; each step emits the reference's draft prefix that
agrees with the text plus one token), so no model runs. ``DynSAM`` is loaded from the file of a checkout of the
reference (only torch, tqdm and the standard library are imported there), the folder named by ``$SAM_DECODING``.

    SAM_DECODING=CHECKOUT python tests/support/reference_sam.py compare [QUESTIONS] [TOKENS]  # agreement
    SAM_DECODING=CHECKOUT python tests/support/reference_sam.py fixture    # tests/data/sam_reference.json
    SAM_DECODING=CHECKOUT python tests/support/reference_sam.py e2e QUESTIONS TOKENS [OUT.json]  # default model
    SAM_DECODING=CHECKOUT REFVENV/bin/python tests/support/reference_sam.py samd MODEL OUT.json  # reference's loop
    python tests/support/reference_sam.py static-e2e STATIC_DIR QUESTIONS TOKENS  # sam with/without the static SAM
    SAM_DECODING=CHECKOUT python tests/support/reference_sam.py static DATASTORE [QUESTIONS TOKENS CORPUS BIAS]
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import torch

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "sam_reference.json"
COMMIT = "18c41f055b424fa3fa0bac41a8953d34cea1ed77"
N_PREDICTS, LEN_THRESHOLD = 40, 5  # samd/samd_config.py, scripts/inference_samd.sh


def dyn_sam_class(checkout: str, module_name: str = "dyn_sam", class_name: str = "DynSAM"):
    """``DynSAM`` from ``samd/sam/dyn_sam.py`` of a checkout of hyx1999/SAM-Decoding (its package ``__init__``
    imports ``datasets`` and the transformers patches, which the automaton does not need), or another class of
    that folder (``static_sam``, ``StaticSAM``)."""
    spec = importlib.util.spec_from_file_location(module_name, Path(checkout) / "samd" / "sam" / f"{module_name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, class_name)


def reference_step(sam, root: int) -> tuple[int, list[int]]:
    """``(match length, draft)`` as ``DraftModel.lookup`` (``samd/draft.py``) decides without a static automaton:
    ``gen_draft``'s sequence less the pending token and the padding when the match reaches the threshold, else []."""
    index, length = sam.lookup(root)
    if length < LEN_THRESHOLD:
        return length, []
    seq = sam.gen_draft(index, root)[1:]
    real = len(sam.input_ids[sam.states[sam.to_anc(index)].min_endpos + 1:])
    return length, seq[:real]


def accepted(draft: list[int], out: list[int], n: int) -> int:
    """How many tokens of ``draft`` agree with the text ``out`` from its position ``n`` (greedy verification)."""
    acc = 0
    while acc < len(draft) and n + acc < len(out) and draft[acc] == out[n + acc]:
        acc += 1
    return acc


def replay(reqs: list[dict], checkout: str) -> list[list[dict]]:
    """Per request, per step: the reference's and the harness's match lengths, drafts and accepted lengths; the text
    advances by the reference's draft."""
    from methods.sam.sam import SamDecoding

    sam = dyn_sam_class(checkout)(N_PREDICTS)
    options = SamDecoding.Options(threshold=LEN_THRESHOLD, draft_tokens=N_PREDICTS - 1, fallback="none")
    har = SamDecoding(SimpleNamespace(output_device=torch.device("cpu")), options)
    steps = []
    for req in reqs:
        prompt, out = req["prompt"], req["output"]
        sam.reset()  # DraftModel.reset at the start of every generate
        sam.add_tokens(prompt)
        har.begin(torch.tensor([prompt]), None)
        n, rows = 1, []
        while n < len(out):
            root = out[n - 1]
            length, draft = reference_step(sam, root)
            _, har_length = har.automaton.match(root)
            mine = har.propose(root, None, None).tokens.tolist()
            acc, har_acc = accepted(draft, out, n), accepted(mine, out, n)
            rows.append({"length": length, "draft": draft, "accepted": acc,
                         "harness_length": har_length, "harness": mine, "harness_accepted": har_acc})
            sam.add_tokens(out[n - 1:n + acc])
            har.accept(out[n - 1:n + acc], None, out[n + acc] if n + acc < len(out) else -1)
            n += acc + 1
        steps.append(rows)
    return steps


def reference_drafted(checkout: str):
    """The harness's ``sam`` (fallback none) drafting, at every step, the chain the reference's ``DynSAM`` drafts
    (:func:`reference_step`), the automaton fed the prompt and each step's root and accepted tokens as
    ``DraftModel.update`` feeds it: the reference's drafting verified by the harness's engine."""
    from harness.engine.tree import chain_tree
    from methods.sam.sam import SamDecoding

    dyn_sam = dyn_sam_class(checkout)

    class ReferenceDrafted(SamDecoding):
        def begin(self, prompt_ids, hidden):
            super().begin(prompt_ids, hidden)
            self.reference = dyn_sam(N_PREDICTS)
            self.reference.add_tokens(prompt_ids[0].tolist())

        def propose(self, root, sampling, generator):
            self.counters["sam_steps"] = self.counters.get("sam_steps", 0) + 1
            return chain_tree(reference_step(self.reference, root)[1])

        def accept(self, tokens, hidden, next_root):
            super().accept(tokens, hidden, next_root)
            self.reference.add_tokens(list(tokens))

    return ReferenceDrafted


def end_to_end(checkout: str, questions: int, tokens: int, out: str | None) -> None:
    """Vanilla, the harness's ``sam`` without fallback, the reference-drafted ``sam`` (:func:`reference_drafted`) and
    the harness's ``sam`` with its EAGLE-2 fallback at the reference's settings (62 tree nodes, depth 5, top-k 8: its
    ``Eagle2Model`` defaults) on the default model (fp32, CPU, greedy), the first ``questions`` MT-bench questions,
    both turns (turn 2's prompt holds vanilla's answer): outputs against vanilla's, forwards (prefill included) and
    tau; with ``out``, the prompts and results are written there for :func:`samd_side`."""
    from harness.models import load_target
    from methods.sam.sam import SamDecoding

    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    options = {"threshold": LEN_THRESHOLD, "draft_tokens": N_PREDICTS - 1}
    entries = {"sam": SamDecoding.create(target, {**options, "fallback": "none"}),
               "reference": reference_drafted(checkout).create(target, {**options, "fallback": "none"}),
               "sam-eagle2": SamDecoding.create(target, {**options, "total_tokens": 63, "depth": 5, "top_k": 8})}
    prompts, rows, _ = harness_turns(target, entries, questions, tokens)
    report(rows)
    if out:
        Path(out).write_text(json.dumps({"tokens": tokens, "prompts": prompts, "entries": rows}))


def harness_turns(target, entries: dict, questions: int, tokens: int) -> tuple[list, dict, dict]:
    """Vanilla's turns (:func:`tests.support.mt_bench_turns.vanilla_turns`) and each entry's greedy generation of
    them: (the prompts' ids, per name incl. vanilla a row per turn {tokens, forwards (prefill included)}, per entry the
    summed ``*_steps`` counters)."""
    from harness.engine.sampling import SamplingParams
    from tests.support.mt_bench_turns import vanilla_turns

    prompts, rows = [], {name: [] for name in ["vanilla", *entries]}
    steps = {name: Counter() for name in entries}
    for _, _, ids, answer in vanilla_turns(target, questions, tokens):
        prompts.append(ids[0].tolist())
        rows["vanilla"].append({"tokens": answer, "forwards": len(answer)})  # vanilla: one token per forward
        for name, method in entries.items():
            g = method.generate(ids, tokens, SamplingParams())
            rows[name].append({"tokens": g.token_ids, "forwards": len(g.accept_lengths)})
            steps[name].update({k: v for k, v in g.counters.items() if k.endswith("_steps")})
    return prompts, rows, steps


def report(rows: dict[str, list[dict]]) -> None:
    for name, turns in rows.items():
        same = sum(t["tokens"] == v["tokens"] for t, v in zip(turns, rows["vanilla"]))
        forwards = [t["forwards"] for t in turns]
        emitted = sum(len(t["tokens"]) for t in turns)
        print(f"{name}: outputs equal to vanilla {same}/{len(turns)}, forwards {sum(forwards)} {forwards}, "
              f"tau {emitted / sum(forwards):.3f}")


def samd_side(checkout: str, model: str, out: str) -> None:
    """The reference's own generation loop (``samd/samd_model.py``'s ``SamdModel.generate``, transformers 4.46: its
    Llama patch needs ``_prepare_4d_causal_attention_mask_with_cache_position``) with its EAGLE-2 tree model on the
    harness's shipped EAGLE head (the same ``fc``/``layers.0`` keys; ``embed_tokens`` from ``model``, the default
    model's folder with ``rope_theta`` at the top of ``config.json``), ``n_predicts`` 40, ``len_threshold`` 5, no
    static automaton, fp32 on CPU, on the prompts ``end_to_end`` wrote to ``out``; adds the entry ``samd``."""
    import importlib.machinery
    import tempfile
    import types

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    # samd/sam/utils.py imports datasets.Dataset for a type only (building a static automaton); not installed here
    stub = types.ModuleType("datasets")
    stub.Dataset, stub.__spec__ = object, importlib.machinery.ModuleSpec("datasets", None)
    sys.modules.setdefault("datasets", stub)
    sys.path.insert(0, checkout)
    from samd import DraftModel, SamdConfig, SamdGenerationConfig, SamdModel

    data = json.loads(Path(out).read_text())
    shipped = Path(__file__).resolve().parents[2] / "methods" / "heads" / "smollm2-135m" / "eagle"
    lm = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32, attn_implementation="sdpa")
    lm.hf_device_map = {"": "cpu"}  # what device_map="cpu" sets (read by samd/cache.py), without accelerate
    with tempfile.TemporaryDirectory() as head:  # the head as EAGLE's pytorch_model.bin, with the embeddings
        weights = load_file(str(shipped / "model.safetensors"))
        weights["embed_tokens.weight"] = lm.model.embed_tokens.weight.detach().clone()
        torch.save(weights, Path(head) / "pytorch_model.bin")
        (Path(head) / "config.json").write_text((shipped / "config.json").read_text())
        config = SamdConfig(n_predicts=N_PREDICTS, len_threshold=LEN_THRESHOLD, tree_method="eagle2",
                            tree_model_path=head)
        draft = DraftModel(config, lm=lm, dtype=torch.float32, device="cpu")
    # eval() as evaluation/eval_vicuna.py: in training mode Eagle2Model's gradient-checkpointing path drops its KV
    samd = SamdModel(config, lm, draft, lm.config.eos_token_id, torch.float32, "cpu").eval()
    gen = SamdGenerationConfig(max_new_tokens=data["tokens"], greedy=True)
    rows = []
    for prompt in data["prompts"]:
        result = samd.generate(torch.tensor([prompt]), generation_config=gen)
        rows.append({"tokens": result.output_ids[0][len(prompt):], "forwards": result.decode_steps + 1})
    data["entries"]["samd"] = rows
    Path(out).write_text(json.dumps(data))
    report(data["entries"])


def static_end_to_end(static: str, questions: int, tokens: int) -> None:
    """Vanilla and the harness's ``sam`` at its defaults (threshold 4, 10 tokens, ``len_bias`` 4), without a
    fallback and with its EAGLE-2 fallback (the shipped head, 60 nodes), each without and with the static automaton
    in ``static`` (``draftbench data static-sam``), on the default model (fp32, CPU, greedy) over the first
    ``questions`` MT-bench questions, both turns: outputs against vanilla's, forwards, tau and the steps each
    automaton drafted. No reference code runs."""
    from harness.models import load_target
    from methods.sam.sam import SamDecoding

    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    entries = {f"sam{fb}{st}": SamDecoding.create(target, {"fallback": fallback, **options})
               for fb, fallback in [("", "none"), ("-eagle2", "eagle2")]
               for st, options in [("", {}), ("+static", {"static": static})]}
    _, rows, steps = harness_turns(target, entries, questions, tokens)
    report(rows)
    for name, counts in steps.items():
        print(f"{name}: {dict(counts)}")


def static_replay(checkout: str, datastore: str, questions: int, tokens: int, corpus_tokens: int,
                  len_bias: int = 5) -> None:
    """The static automaton against the reference's ``StaticSAM`` (``samd/sam/static_sam.py``) over the same corpus
    (the first whole documents, up to ``corpus_tokens``, of a REST datastore), each beside its dynamic automaton and
    chosen between as ``DraftModel.lookup`` chooses (``len_threshold`` 5, ``n_predicts`` 40, ``len_bias`` 5: the
    reference's defaults; a smaller ``len_bias`` lets the static automaton draft more often), replayed over GPT-4's
    MT-bench answers as :func:`replay` does. The reference's corpus is built as ``tools/gen_sam_alpaca.py`` builds
    it (``StaticSAM.add_batch_tokens``: each document followed by EOS), without its one-token document per
    vocabulary id (they only make every token a match of 1). Prints, over all
    steps: the same choice, the same static match length, the same draft, and the same draft once the reference's is
    cut at its first EOS (the harness's static draft stops at the document's end)."""
    import numpy as np

    from methods.rest.build import load_tokenizer
    from methods.rest.datastore import SEPARATOR, concatenate, load_datastore
    from methods.sam.automaton import StaticAutomaton
    from methods.sam.sam import SamDecoding
    from tests.support.reference_suffix import requests

    eos = load_tokenizer("smollm2-135m").eos_token_id
    stream = np.asarray(load_datastore(datastore).tokens[:corpus_tokens])
    ends = np.flatnonzero(stream == SEPARATOR)
    docs = [d.tolist() for d in np.split(stream[: ends[-1]], ends[:-1] + 1)]
    docs = [d[:-1] if d[-1:] == [SEPARATOR] else d for d in docs]
    reference_static = dyn_sam_class(checkout, "static_sam", "StaticSAM")(N_PREDICTS)
    reference_static.add_batch_tokens(docs, eos, verbose=False)
    dyn = dyn_sam_class(checkout)(N_PREDICTS)
    options = SamDecoding.Options(threshold=LEN_THRESHOLD, draft_tokens=N_PREDICTS - 1, fallback="none",
                                  len_bias=len_bias)
    har = SamDecoding(SimpleNamespace(output_device=torch.device("cpu")), options,
                      static=StaticAutomaton.build(concatenate(docs)))
    kinds = Counter()
    for req in requests(questions, tokens):
        prompt, out = req["prompt"], req["output"]
        dyn.reset()
        reference_static.reset()
        dyn.add_tokens(prompt)
        reference_static.transfer_tokens(prompt)
        har.counters = {}
        har.begin(torch.tensor([prompt]), None)
        n = 1
        while n < len(out):
            root = out[n - 1]
            _, match_dyn = dyn.lookup(root)
            index_static, match_static = reference_static.lookup(root)
            draft, choice = [], None
            if max(match_dyn, match_static - len_bias) >= LEN_THRESHOLD:  # samd/draft.py DraftModel.lookup
                if match_dyn >= match_static - len_bias:
                    choice, draft = "dynamic", reference_step(dyn, root)[1]
                else:
                    choice = "static"
                    end = reference_static.states[index_static].min_endpos
                    draft = reference_static.gen_draft(index_static, root)[1:]
                    draft = draft[: len(reference_static.input_ids[end + 1: end + N_PREDICTS])]  # less the padding
            before = dict(har.counters)
            mine = har.propose(root, None, None).tokens.tolist()
            har_choice = {"sam_steps": "dynamic", "static_steps": "static"}.get(
                next((k for k in har.counters if har.counters[k] != before.get(k, 0)), ""))
            kinds["steps"] += 1
            kinds[f"reference {choice}"] += 1
            kinds["same choice"] += choice == har_choice
            kinds["same static length"] += match_static == har.static.step(*har.cursor, root)[1]
            kinds["same draft"] += draft == mine
            cut = draft[: draft.index(eos)] if choice == "static" and eos in draft else draft
            kinds["same draft up to EOS"] += cut == mine
            acc = accepted(draft, out, n)
            kinds["accepted (reference)"] += acc
            kinds["accepted (harness)"] += accepted(mine, out, n)
            dyn.add_tokens(out[n - 1:n + acc])
            reference_static.transfer_tokens(out[n - 1:n + acc])
            har.accept(out[n - 1:n + acc], None, out[n + acc] if n + acc < len(out) else -1)
            n += acc + 1
    print(f"corpus: {len(docs)} documents, {sum(map(len, docs))} tokens; " + ", ".join(f"{k} {v}"
                                                                                    for k, v in kinds.items()))


def checkout_folder() -> str:
    folder = os.environ.get("SAM_DECODING", "")
    if not (Path(folder) / "samd" / "sam" / "dyn_sam.py").is_file():
        raise SystemExit(f"reference_sam: set SAM_DECODING to a checkout of hyx1999/SAM-Decoding ({COMMIT[:7]})")
    return folder


def main() -> None:
    if sys.argv[1:2] == ["static-e2e"]:
        torch.set_num_threads(1)
        static_end_to_end(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    checkout = checkout_folder()
    if sys.argv[1:2] == ["fixture"]:
        from tests.support.reference_suffix import requests

        reqs = requests(6, 64)
        for req, rows in zip(reqs, replay(reqs, checkout)):
            req["lengths"] = [row["length"] for row in rows]
            req["drafts"] = [row["draft"] for row in rows]
        FIXTURE.write_text(json.dumps({"source": f"hyx1999/SAM-Decoding {COMMIT[:7]} samd/sam/dyn_sam.py DynSAM, "
                                       "called as samd/draft.py's DraftModel.lookup and update call it",
                                       "n_predicts": N_PREDICTS, "len_threshold": LEN_THRESHOLD, "requests": reqs},
                                      separators=(",", ":")))
        return
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["static"]:
        numbers = [int(a) for a in sys.argv[3:7]] + [10, 128, 200_000, 5][len(sys.argv[3:7]):]
        static_replay(checkout, sys.argv[2], *numbers)
        return
    if sys.argv[1:2] == ["e2e"]:
        end_to_end(checkout, int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if sys.argv[4:] else None)
        return
    if sys.argv[1:2] == ["samd"]:
        samd_side(checkout, sys.argv[2], sys.argv[3])
        return
    from tests.support.reference_suffix import requests

    questions, tokens = (int(a) for a in (sys.argv[2:4] + ["10", "128"][len(sys.argv[2:4]):]))
    rows = [row for request in replay(requests(questions, tokens), checkout) for row in request]
    kinds = Counter()
    for row in rows:
        kinds["same length"] += row["length"] == row["harness_length"]
        kinds["same draft"] += row["draft"] == row["harness"]
        kinds["reference drafts"] += bool(row["draft"])
        kinds["harness drafts"] += bool(row["harness"])
        kinds["both draft, differently"] += bool(row["draft"] and row["harness"]) and row["draft"] != row["harness"]
    kinds["accepted (reference)"] = sum(row["accepted"] for row in rows)
    kinds["accepted (harness)"] = sum(row["harness_accepted"] for row in rows)
    print(f"{len(rows)} steps: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    for i, row in enumerate(rows):
        if row["draft"] != row["harness"]:
            print(i, row)


if __name__ == "__main__":
    main()
