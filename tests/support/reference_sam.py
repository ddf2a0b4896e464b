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

from methods.sam import SamDecoding
from tests.support.reference_suffix import requests

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "sam_reference.json"
COMMIT = "18c41f055b424fa3fa0bac41a8953d34cea1ed77"
N_PREDICTS, LEN_THRESHOLD = 40, 5  # samd/samd_config.py, scripts/inference_samd.sh


def dyn_sam_class(checkout: str):
    """``DynSAM`` from ``samd/sam/dyn_sam.py`` of a checkout of hyx1999/SAM-Decoding (its package ``__init__``
    imports ``datasets`` and the transformers patches, which the automaton does not need)."""
    spec = importlib.util.spec_from_file_location("dyn_sam", Path(checkout) / "samd" / "sam" / "dyn_sam.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DynSAM


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


def checkout_folder() -> str:
    folder = os.environ.get("SAM_DECODING", "")
    if not (Path(folder) / "samd" / "sam" / "dyn_sam.py").is_file():
        raise SystemExit(f"reference_sam: set SAM_DECODING to a checkout of hyx1999/SAM-Decoding ({COMMIT[:7]})")
    return folder


def main() -> None:
    checkout = checkout_folder()
    if sys.argv[1:2] == ["fixture"]:
        reqs = requests(6, 64)
        for req, rows in zip(reqs, replay(reqs, checkout)):
            req["lengths"] = [row["length"] for row in rows]
            req["drafts"] = [row["draft"] for row in rows]
        FIXTURE.write_text(json.dumps({"source": f"hyx1999/SAM-Decoding {COMMIT[:7]} samd/sam/dyn_sam.py DynSAM, "
                                       "called as samd/draft.py's DraftModel.lookup and update call it",
                                       "n_predicts": N_PREDICTS, "len_threshold": LEN_THRESHOLD, "requests": reqs},
                                      separators=(",", ":")))
        return
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
