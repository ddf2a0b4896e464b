"""Host-device round trips of the step loop, counted on CPU (:mod:`harness.measure.syncs`).

On a GPU each value read by Python (``.item()``, ``.tolist()``, ``int(t)``) or synchronising upload stalls the
device queue; a 32-layer EAGLE-2 step used to make ~45 of them. These tests pin the number per verification step,
so a change that adds one fails here (with the events that were counted).
"""

from __future__ import annotations

import pytest
import torch

from harness.engine.kv import compact_cache
from harness.engine.sampling import SamplingParams
from harness.measure.syncs import HostSyncCounter, StepSyncProbe
from methods.vanilla import Vanilla
from tests.support.anymodel import TREE_METHODS, tiny_causal_lm, tree_method
from tests.test_engine import PROMPT, OracleBranched

GREEDY = SamplingParams()
# host round trips per verification step at temperature 0: the engine's one batched transfer, plus what a method's
# drafting still reads (Jakiro's dynamic tree reads each level's kept candidates: depth + 1 levels, 4 here; Lookahead
# reads its window's next Jacobi iterate, which its host-side n-gram pool is built from)
PER_STEP = {"vanilla": 1, "pld": 1, "eagle1": 1, "eagle2": 1, "medusa": 1, "hydra": 1, "jakiro": 5, "jakiro_star": 1,
            "eagle3": 1, "sps": 1, "token_recycling": 1, "sam": 1, "suffix": 1, "rest": 1, "lookahead": 2,
            "layer_skip": 1, "oracle": 1}
# up to the first verification forward: the prefill's token, plus the first proposal's own reads (PLD, SAM,
# SuffixDecoding, REST and Lookahead read the prompt once; Jakiro's first tree costs what every later one does)
PREFILL = {"pld": 2, "sam": 2, "suffix": 2, "rest": 2, "jakiro": 5, "lookahead": 2}
# after the last forward, once per turn: the greedy logit margins of every emitted token (LogitTrace.read). They used
# to ride in each step's readback (packed with the token, the same one round trip) and now stay on the device until
# the turn ends, so the per-step counts above are unchanged and the last step's bucket holds one more read
TURN_END = 1


def test_counter_counts_reads_and_uploads():
    """The docstring example: two value reads and one upload are counted; creating tensors on the host, empty
    uploads and device-side arithmetic are not."""
    with HostSyncCounter() as c:
        x = torch.arange(3)
        x.tolist()
        int(x[0])
        torch.tensor([1], device="cpu")
        torch.tensor([], device="cpu")
        y = x * 2 + 1
        _ = y[y > 2]  # a boolean index: the result's shape depends on the values
    assert (c.reads, c.uploads) == (3, 1)
    assert c.events == {"tolist": 1, "__int__": 1, "tensor(device=...)": 1, "__getitem__": 1}


@pytest.fixture(scope="module")
def deep_target():
    """A 32-layer Llama (hidden 32): per-layer host work would show as 32 per step."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from harness.models import target_from_model

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=32, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    target = target_from_model(AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False), None)
    target.eos_ids = frozenset()
    return target


@pytest.mark.parametrize("name", ("vanilla",) + TREE_METHODS)
def test_host_syncs_per_step_are_bounded(deep_target, name):
    """Greedy decoding of 24 tokens on a 32-layer model: every verification step makes exactly PER_STEP[name]
    host round trips, whatever the layer count (masks, positions and acceptance are on the device, the host needs
    one transfer, compaction uploads its index once without a stream sync); the turn adds TURN_END after its last
    forward (a per-step diagnostic read would show in every step, a lost one would drop the margins)."""
    method = Vanilla(deep_target) if name == "vanilla" else tree_method(name, deep_target)
    if hasattr(method, "prepare_turn"):  # untimed work the runner does before the turn (the oracle's greedy pass)
        method.prepare_turn(PROMPT, 24)
    with StepSyncProbe(deep_target.model) as probe:
        method.generate(PROMPT, 24, GREEDY)
    steps = probe.per_forward[1:]
    assert len(steps) >= 4
    assert probe.per_forward[0] == PREFILL.get(name, 1), dict(probe.events)
    assert max(steps[:-1]) == PER_STEP[name], (steps, dict(probe.events))
    assert TURN_END <= steps[-1] <= PER_STEP[name] + TURN_END, (steps, dict(probe.events))


def test_accepted_paths_add_no_syncs():
    """An oracle tree accepts deep, non-contiguous paths every step (compaction gathers slots in every layer,
    sliding ones included): still one round trip per step (the oracle's own reference forwards are paused), and
    the turn's one read of its logit margins after the last."""
    target = tiny_causal_lm("mistral", 6)
    probe = StepSyncProbe(target.model)

    class Quiet(OracleBranched):
        def greedy_continuation(self, root, n):
            with probe.paused():
                return super().greedy_continuation(root, n)

    with probe:
        gen = Quiet(target).generate(PROMPT, 24, GREEDY)
    assert sum(gen.accepted_drafts) >= 16
    assert probe.per_forward[1:] == [1] * (len(gen.accept_lengths) - 2) + [1 + TURN_END], dict(probe.events)
    assert len(gen.logit_margins) == len(gen.token_ids)


def test_compaction_reads_nothing_and_uploads_once_per_device():
    """compact_cache on 32 layers with a non-contiguous keep: no host read, no synchronising upload (the index is
    built once and copied with non_blocking); the old code made one upload per layer."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i in range(32):
        cache.update(torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4), i)
    with HostSyncCounter() as c:
        compact_cache(cache, 5, [0, 2, 4])
    assert c.total == 0, dict(c.events)
    assert cache.get_seq_length() == 8


def test_forward_marks_split_counts_per_forward():
    """The one forward-splitting helper both probes use: a count read at each forward's start (None = not
    measured, no mark), differences between marks, the last up to the end; model.forward is restored."""
    from harness.measure.syncs import forward_marks, per_forward

    model = torch.nn.Linear(2, 2)
    values = iter([0, None, 3])
    with forward_marks(model, lambda: next(values)) as marks:
        for _ in range(3):
            model(torch.zeros(1, 2))
    assert marks == [0, 3]
    assert per_forward(marks, 7) == [3, 4]
    assert per_forward([0, 2, 3], 7) == [2, 1, 4]
    assert "forward" not in model.__dict__


def test_step_readback_layout_packs_and_unpacks_literal_values():
    """The greedy step's one transfer: [flags(2) | depth | bonus | accepted(n)]. A field read at the wrong offset
    would hand the loop a flag as a token (or a token as the depth)."""
    from harness.engine.hostio import pack_step, step_size, unpack_step

    packed = pack_step(torch.tensor([0, 0]), torch.tensor(2), torch.tensor([9]), torch.tensor([5, -1]), torch.float32)
    values = packed.tolist()
    assert values == [0, 0, 2, 9, 5, -1] and step_size(2) == 6
    got = unpack_step(values, 2)
    assert (got.flags, got.depth, got.bonus, got.accepted) == ([0, 0], 2, 9, [5, -1])
    assert (got.path, got.path_tokens) == ([0], [5])
    with pytest.raises(ValueError, match="a step readback of 2 drafts has 6 values, got 5"):
        unpack_step(values[:-1], 2)


def test_logit_trace_reads_the_emitted_rows_once():
    """The turn's logit margins, literal: rows 1 of the first forward and 0, 2 of the second, in that order, come
    back as (top-1 minus top-2, top-1, the top-2 token) in one read (a per-add read, or a row taken from the wrong
    forward, would fail here); nothing added reads nothing."""
    from harness.engine.sampling import LogitTrace

    trace = LogitTrace(torch.float32)
    with HostSyncCounter() as c:
        trace.add(torch.tensor([[1.0, 3.0, 2.5], [0.0, 1.0, 4.0]]), [1])
        trace.add(torch.tensor([[2.0, 0.5, 1.0], [9.0, 9.5, 0.0], [0.25, 0.0, 0.125]]), [0, 2])
        assert c.total == 0
        got = trace.read()
    assert got == ([3.0, 1.0, 0.125], [4.0, 2.0, 0.25], [1, 2, 2])
    assert c.reads == 1, dict(c.events)
    with HostSyncCounter() as c:
        assert LogitTrace(torch.float32).read() == ([], [], [])
    assert c.total == 0
