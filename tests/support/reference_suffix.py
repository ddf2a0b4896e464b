"""SuffixDecoding against its authors' implementation: ArcticInference's ``SuffixDecodingCache`` (PyPI
``arctic-inference`` 0.3.0, what vLLM 0.32's ``suffix`` method calls), driven exactly as vLLM's proposer drives it
(``vllm/v1/spec_decode/suffix_decoding.py``: every sampled token added before it speculates, the last
``max_tree_depth`` tokens as the pattern, a chain), beside the harness's ``suffix`` with ``tree=false``.

Greedy decoding is replayed over known text, so no model runs: the prompts are MT-bench questions in SmolLM2's chat
template (turn 2's holds turn 1's answer), the generated text GPT-4's reference answers; each step emits the
reference's draft prefix that agrees with the text plus one token. Needs ``arctic_inference`` importable (docs/
reference.md says how to build it) and ``$DRAFTBENCH_DATA`` with the ``mt_bench`` suite (read by ``load_suite``,
checksum verified) and GPT-4's reference answers beside its questions (their sha256 pinned below).

    python tests/support/reference_suffix.py compare [QUESTIONS] [TOKENS]   # agreement over the replay
    python tests/support/reference_suffix.py fixture                        # tests/data/suffix_arcticinference.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from harness.models import resolve_target_path
from harness.run.suites import load_suite, sha256_file
from methods.suffix.suffix import SuffixDecoding

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "suffix_arcticinference.json"
# FastChat's GPT-4 answers to MT-bench (30 questions), in the folder of the suite's question.jsonl
ANSWERS = "reference_answer_gpt-4.jsonl"
ANSWERS_SHA256 = "f957a5bc977badb66885ec970e6cd08527845780313f0995764260e5777b9b3f"


def requests(questions: int, tokens: int) -> list[dict]:
    """[{prompt, output}] for the first ``questions`` MT-bench questions with reference answers, both turns."""
    suite = load_suite("mt_bench", os.environ.get("DRAFTBENCH_DATA"))
    path = Path(suite.source).parent / ANSWERS
    if sha256_file(path) != ANSWERS_SHA256:
        raise SystemExit(f"{path}: sha256 {sha256_file(path)}, expected {ANSWERS_SHA256} (another version)")
    tok = AutoTokenizer.from_pretrained(resolve_target_path("smollm2-135m"))
    answers = [json.loads(line) for line in path.read_text().splitlines()]
    turns = {q.question_id: q.turns for q in suite.questions}
    out = []
    for answer in answers[:questions]:
        messages = []
        for question, text in zip(turns[str(answer["question_id"])], answer["choices"][0]["turns"]):
            messages.append({"role": "user", "content": question})
            prompt = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
            output = tok(text, add_special_tokens=False)["input_ids"][:tokens]
            out.append({"prompt": prompt, "output": output})
            messages.append({"role": "assistant", "content": tok.decode(output)})
    return out


def replay(reqs: list[dict], depth: int, spec: int, factor: float, min_prob: float) -> list[list[tuple]]:
    """Per request, per step: (reference draft, harness draft); the text advances by the reference's verdict."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    ref = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=10000)
    har = SuffixDecoding(None, SuffixDecoding.Options(max_depth=depth, max_spec_tokens=spec, tree=False,
                                                      max_spec_factor=factor, min_token_prob=min_prob))
    steps = []
    for r, req in enumerate(reqs):
        prompt, out = req["prompt"], req["output"]
        ref.start_request(r, np.array(prompt, dtype=np.int32))
        har.begin(torch.tensor([prompt]), None)
        n, sampled, pairs = 1, [out[0]], []
        while n < len(out):
            ref.add_active_response(r, sampled)
            context = np.array((prompt + out[:n])[-depth:], dtype=np.int32)
            draft = list(ref.speculate(r, context, max_spec_tokens=spec, max_spec_factor=factor,
                                       min_token_prob=min_prob).token_ids)
            pairs.append((draft, har.propose(out[n - 1], None, None).tokens.tolist()))
            acc = 0
            while acc < len(draft) and n + acc < len(out) and draft[acc] == out[n + acc]:
                acc += 1
            har.accept(out[n - 1:n + acc], None, out[n + acc] if n + acc < len(out) else -1)
            sampled = out[n:n + acc + 1]
            n += acc + 1
        ref.add_active_response(r, sampled)  # vLLM proposes after the final step too
        ref.stop_request(r)
        steps.append(pairs)
    return steps


def main() -> None:
    if sys.argv[1:2] == ["fixture"]:
        reqs = requests(2, 48)
        for req, pairs in zip(reqs, replay(reqs, 16, 8, 1.0, 0.1)):
            req["drafts"] = [ref for ref, _ in pairs]
        FIXTURE.write_text(json.dumps({"source": "arctic-inference 0.3.0 SuffixDecodingCache, called as vLLM 0.32's "
                                       "suffix proposer calls it", "max_tree_depth": 16, "num_speculative_tokens": 8,
                                       "max_spec_factor": 1.0, "min_token_prob": 0.1, "requests": reqs},
                                      separators=(",", ":")))
        return
    questions, tokens = (int(a) for a in (sys.argv[2:4] + ["10", "128"][len(sys.argv[2:4]):]))
    pairs = [p for request in replay(requests(questions, tokens), 64, 32, 1.0, 0.1) for p in request]
    same = sum(a == b for a, b in pairs)
    print(f"{len(pairs)} steps: the same draft at {same} ({same / len(pairs):.3f})")


if __name__ == "__main__":
    main()
