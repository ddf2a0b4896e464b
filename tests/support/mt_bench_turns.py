"""The turns the reference checks (tests/support/reference_*.py) decode: MT-bench's first questions, both turns, in
the target's chat template, each turn's prompt holding vanilla's earlier answers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch


def vanilla_turns(target, questions: int, tokens: int) -> Iterator[tuple[str, int, torch.Tensor, list[int]]]:
    """``(question id, turn, prompt ids [1, P], vanilla's greedy tokens)`` for the first ``questions`` MT-bench
    questions (``$DRAFTBENCH_DATA``), turn by turn; vanilla's answer of ``tokens`` tokens enters the next turn's
    prompt."""
    from harness.engine.sampling import SamplingParams
    from harness.registry import get_method
    from harness.run.suites import load_suite

    vanilla = get_method("vanilla").create(target, {})
    for q in load_suite("mt_bench", os.environ.get("DRAFTBENCH_DATA")).questions[:questions]:
        messages = []
        for turn, text in enumerate(q.turns):
            messages.append({"role": "user", "content": text})
            ids = target.render_chat(messages)
            answer = vanilla.generate(ids, tokens, SamplingParams()).token_ids
            yield q.question_id, turn, ids, answer
            messages.append({"role": "assistant", "content": target.decode(answer)})
