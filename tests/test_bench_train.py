"""Throughput of one training step of the shipped heads' recipe on the default model, so that the trainer's cost is
measured side by side, not guessed.

Measure:  ``make bench``  (with the engine's parts; pytest-benchmark, saved and compared as there).

Groups:
  eagle3-step  one EAGLE-3 training step (loss, backward) of the shipped head's recipe (``draft_vocab`` 4096,
               ``length`` 3, batch 4 x 512 positions, every position a loss position) on the default model: with the
               target's greedy tokens read from the batch (what the loop does, FeatureDataset.attach_greedy: only the
               draft vocabulary's 4,096 rows of the target's lm_head run) and computed in the step (all 49,152 rows).
               The ratio of the two is what caching the tokens saves per step.

In the normal test run (``--benchmark-disable``) each body runs once, as a test of its result; the default model
makes them ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from harness.train.objectives import get_objective

B, S, DRAFT_VOCAB = 4, 512, 4096


@pytest.fixture(scope="module")
def eagle3_step(real_target):
    """(objective, head, batch): a fresh EAGLE-3 head of the shipped recipe and one batch of 4 x 512 positions whose
    features are random (the step's cost does not depend on them) and whose greedy tokens are the target's own."""
    torch.manual_seed(0)
    obj = get_objective("eagle3").create(real_target, {"draft_vocab": DRAFT_VOCAB, "length": 3})
    obj.layer_ids = (1, 15, 28)
    V, H = real_target.model.lm_head.weight.shape
    obj.set_token_counts(torch.randint(0, 1000, (V,)))
    head = obj.build_head()
    target = torch.randn(B, S, H)
    with torch.no_grad():
        greedy = real_target.model.lm_head(target).argmax(-1)
    batch = {"levels": torch.randn(B, S, 3 * H), "input_ids": torch.randint(0, V, (B, S)), "target": target,
             "loss_mask": torch.ones(B, S), "greedy": greedy}
    return obj, head, batch


def step(obj, head, batch) -> float:
    head.zero_grad(set_to_none=True)
    loss, _ = obj.loss(head, batch)
    loss.backward()
    return loss.item()


@pytest.mark.slow
@pytest.mark.benchmark(group="eagle3-step")
@pytest.mark.parametrize("greedy", ["cached", "computed"])
def test_bench_eagle3_training_step(benchmark, eagle3_step, greedy):
    """One step's loss must be finite and the same with the tokens cached or computed (else the cache changes
    training)"""
    obj, head, batch = eagle3_step
    if greedy == "computed":
        batch = {k: v for k, v in batch.items() if k != "greedy"}
    loss = benchmark.pedantic(lambda: step(obj, head, batch), rounds=5, iterations=1, warmup_rounds=1)
    assert torch.isfinite(torch.tensor(loss))
    other = {k: v for k, v in eagle3_step[2].items() if k != "greedy"} if greedy == "cached" else eagle3_step[2]
    assert obj.loss(head, other)[0].item() == pytest.approx(loss, rel=1e-5)
    benchmark.extra_info.update(batch=B, positions=S, draft_vocab=DRAFT_VOCAB, greedy=greedy)
