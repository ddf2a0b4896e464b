"""Throughput of the engine's parts, so that a slowdown of one part is caught before it shows in end-to-end numbers.

Measure, save, and compare with the previous save of this machine:  ``make bench``  (pytest-benchmark with
``--benchmark-autosave`` and, once a save exists, ``--benchmark-compare --benchmark-compare-fail=mean:15%``).

Groups:
  verify-forward  one target forward over k = 1, 2, 4, ..., 64 tree slots (root included; k = 1 is a plain decoding
                  step) after a 300-token prefix, with the engine's 4D tree mask and tree positions, the cache cropped
                  back after each: the verify-cost curve that decides how big a draft tree can pay off; once per
                  runtime (``eager``: the model; ``compiled``: its compiled forward through the same runner the engine
                  uses, harness/engine/runtime.py, compiled in the untimed first round)
  attention       one 17-slot chain verification forward (a draft of 16) after 512 and 4096 tokens with
                  transformers' ``sdpa`` (copies the K/V heads under a mask, ``repeat_kv``) and draftbench's
                  ``sdpa_gqa`` (harness/models.py; what ``auto`` loads): the ratio is what the choice is worth
  draft-step      one ``propose`` of each shipped head (eagle2, jakiro, medusa) with the CPU gate's options
                  (harness/run/presets/ci_gate.yaml), right after ``begin`` on a real prompt
  tree            EAGLE-2's dynamic tree selection over 4 levels of top-10 candidates; a 63-node static tree
  mask            the 4D mask of a 64-node tree after a 300-token prefix (``tree_mask_4d``)
  kv-compaction   compacting a SmolLM2-135M-sized cache (30 layers) after a 64-node verification
  host-overhead-step
                  a 64-token greedy turn of vanilla and of pld, eagle2 and eagle3 whose drafts are always rejected
                  (tests/support/overhead.py: every step emits one token, like vanilla's), on a tiny random Llama (4
                  layers, hidden 64), one torch thread. ``extra_info`` of each entry: ``host_ms_per_step``
                  (the loop's CPU time less the CPU time inside the target's and the draft's forwards, per step)
                  and ``host_vs_vanilla_step``, that over vanilla's whole step (forward included) in a vanilla turn
                  run just before each round (the median of the rounds' ratios).
                  Target: ``host_vs_vanilla_step`` < 1, i.e. a speculative step's host work (drafting bookkeeping,
                  masks, the acceptance walk, the readback, compaction) costs less than one vanilla step

In the normal test run (``--benchmark-disable``, the project default) every body runs once, as a test of its
result; the parts on the real default model are ``slow``.
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import DynamicCache

from harness.engine.autotune import bench_tree_parents
from harness.engine.kv import attention_layout, compact_cache
from harness.engine.runtime import RUNTIMES, target_runner
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import tree_mask_4d
from harness.engine.tree import (
    STATIC_TREES,
    ancestor_matrix,
    check_tree,
    select_dynamic_tree,
    slot_depths,
    tree_from_choices,
)
from harness.registry import get_method
from harness.run.config import load_preset_dict
from tests.support.anymodel import tree_method
from tests.support.overhead import PROMPT as TINY_PROMPT
from tests.support.overhead import ForwardClock, always_rejected, method_modules, overhead_target

PREFIX = 300
TREE_SLOTS = [1, 2, 4, 8, 16, 32, 64]
ROUNDS = 10
PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


def _pedantic(benchmark, fn, setup=None, rounds=ROUNDS):
    return benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=1)


@pytest.fixture(scope="module")
def prefix_cache(real_target):
    """The target's cache after 300 fixed tokens (ids i * 7919 mod V)."""
    model = real_target.model
    cache = DynamicCache(config=model.config)
    ids = (torch.arange(PREFIX) * 7919 % model.config.vocab_size)[None]
    with torch.inference_mode():
        model(ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


@pytest.mark.slow
@pytest.mark.benchmark(group="verify-forward")
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("slots", TREE_SLOTS)
def test_bench_verify_forward(benchmark, real_target, prefix_cache, slots, runtime):
    """One verification forward over ``slots`` tree slots (branching 4, breadth first) through the engine's runner
    for ``runtime``; a forward that returned other than one logit row per slot (the compiled runtime may pad the
    tree, never drop a slot), or left the cache longer than the prefix, would not be the engine's step."""
    V = real_target.model.config.vocab_size
    runner = target_runner(real_target, runtime)
    parents = bench_tree_parents(slots, branching=4)  # [slots - 1]
    ancestors = ancestor_matrix(parents)
    layout = attention_layout(prefix_cache)
    ids = (torch.arange(slots) * 104729 % V)[None]  # [1, slots]

    def forward():
        with torch.inference_mode():
            x, pos, mask = runner.verify_inputs(ids, ancestors, slot_depths(ancestors), PREFIX, layout, prefix_cache)
            out = runner.forward(x, prefix_cache, attention_mask=mask, position_ids=pos)
            compact_cache(prefix_cache, PREFIX, [])  # drop the tree (and any pad slots) again
        return tuple(out.logits[:, :slots].shape)

    assert _pedantic(benchmark, forward, rounds=20) == (1, slots, V)
    assert prefix_cache.get_seq_length() == PREFIX
    benchmark.extra_info.update(slots=slots, prefix=PREFIX, runtime=runtime)


@pytest.fixture(scope="module")
def long_caches(real_target):
    """context -> the target's cache after that many fixed tokens (ids i * 7919 mod V), built once."""
    model, caches = real_target.model, {}

    def cache_for(context: int) -> DynamicCache:
        if context not in caches:
            caches[context] = DynamicCache(config=model.config)
            ids = (torch.arange(context) * 7919 % model.config.vocab_size)[None]
            with torch.inference_mode():
                model(ids, cache=caches[context], use_cache=True, logits_to_keep=1)
        return caches[context]
    return cache_for


@pytest.mark.slow
@pytest.mark.benchmark(group="attention")
@pytest.mark.parametrize("attn", ["sdpa", "sdpa_gqa"])
@pytest.mark.parametrize("context", [512, 4096])
def test_bench_verify_attention(benchmark, real_target, long_caches, context, attn):
    """A 17-slot chain verification forward (eager) after ``context`` tokens with attention ``attn``; the model's
    attention is set back afterwards. 17 logit rows and the cache back at ``context`` say it was the engine's step."""
    model, cache = real_target.model, long_caches(context)
    V = model.config.vocab_size
    runner = target_runner(real_target, "eager")
    ancestors = ancestor_matrix(torch.arange(-1, 15))  # a chain: slot i's parent is slot i - 1
    layout = attention_layout(cache)
    ids = (torch.arange(17) * 104729 % V)[None]  # [1, 17]
    loaded = model.config._attn_implementation

    def forward():
        with torch.inference_mode():
            x, pos, mask = runner.verify_inputs(ids, ancestors, slot_depths(ancestors), context, layout, cache)
            out = runner.forward(x, cache, attention_mask=mask, position_ids=pos)
            compact_cache(cache, context, [])
        return tuple(out.logits.shape)

    model.set_attn_implementation(attn)
    try:
        assert _pedantic(benchmark, forward) == (1, 17, V)
    finally:
        model.set_attn_implementation(loaded)
    assert cache.get_seq_length() == context
    benchmark.extra_info.update(context=context, attn=attn, slots=17)


@pytest.mark.slow
@pytest.mark.benchmark(group="draft-step")
@pytest.mark.parametrize("label", ["eagle2", "jakiro", "medusa"])
def test_bench_draft_step(benchmark, real_target, label):
    """One draft step of a shipped head, with the CPU gate's options: a valid, non-empty tree within the budget."""
    spec = next(m for m in load_preset_dict("ci_gate")["methods"] if isinstance(m, dict) and m["name"] == label)
    method = get_method(spec["name"]).create(real_target, spec["options"])
    prompt = real_target.render_chat(PROMPT)
    with torch.inference_mode():
        out = real_target.model(prompt, output_hidden_states=[-1], logits_to_keep=1)
    hidden = out.hidden_states[-1][0] if method.needs_hidden_states else None
    root = int(out.logits[0, -1].argmax())

    def propose():
        with torch.inference_mode():
            return method.propose(root, SamplingParams(), None)

    tree = _pedantic(benchmark, propose, setup=lambda: method.begin(prompt, hidden))
    check_tree(tree, real_target.model.config.vocab_size)
    options = spec["options"]
    budget = options["total_tokens"] - 1 if "total_tokens" in options else len(options["tree"])
    assert 0 < len(tree) <= budget
    benchmark.extra_info.update(tree_nodes=len(tree))


@pytest.mark.benchmark(group="tree")
def test_bench_dynamic_tree_selection(benchmark):
    """EAGLE-2's re-ranking of 310 candidates (10 at level 1, then 10 children of each of the 10 best of a level,
    3 times) down to 59 nodes; the result must stay ancestor-closed (every parent listed before its children)."""
    gen = torch.Generator().manual_seed(0)
    scores = (-torch.rand(10, generator=gen)).tolist()
    parents = [-1] * 10
    level = list(range(10))
    for _ in range(3):
        best = sorted(level, key=lambda i: scores[i], reverse=True)[:10]
        level = []
        for b in best:
            for drop in torch.rand(10, generator=gen).tolist():
                parents.append(b)
                scores.append(scores[b] - drop)
                level.append(len(scores) - 1)
    t, s, p = torch.arange(len(scores)), torch.tensor(scores), torch.tensor(parents)
    tree = _pedantic(benchmark, lambda: select_dynamic_tree(t, s, p, 59), rounds=100)
    assert (len(p), len(tree)) == (310, 59)
    assert all(int(q) < i for i, q in enumerate(tree.parents.tolist()))


@pytest.mark.benchmark(group="tree")
def test_bench_static_tree(benchmark):
    """Medusa's 63-node tree from its rank paths: 63 nodes at levels [10, 28, 23, 2] (medusa_choices.py)."""
    parents, ranks = _pedantic(benchmark, lambda: tree_from_choices(STATIC_TREES["medusa_mc_sim_7b_63"]), rounds=100)
    assert parents.shape == ranks.shape == (63,)
    assert torch.bincount(torch.tensor([len(c) for c in STATIC_TREES["medusa_mc_sim_7b_63"]]))[1:].tolist() == \
        [10, 28, 23, 2]


@pytest.mark.benchmark(group="mask")
def test_bench_tree_mask(benchmark):
    """The additive 4D mask of a 64-slot tree after 300 committed tokens: [1, 1, 64, 364], each slot seeing the
    prefix, its ancestors and itself (slot 0 = the root sees only itself inside the tree)."""
    parents = bench_tree_parents(64, branching=4)
    mask = _pedantic(benchmark, lambda: tree_mask_4d(PREFIX, parents, torch.float32, torch.device("cpu")),
                     rounds=100)
    assert tuple(mask.shape) == (1, 1, 64, PREFIX + 64)
    assert (mask[0, 0, :, :PREFIX] == 0).all()
    assert int((mask[0, 0, 0, PREFIX:] == 0).sum()) == 1


@pytest.mark.benchmark(group="kv-compaction")
def test_bench_kv_compaction(benchmark):
    """Keep the root and a 4-token accepted path (slots 0, 1, 5, 21, 64) of a 64-node verification in a cache shaped
    like SmolLM2-135M's (30 layers, 3 KV heads, head dim 64) after 300 tokens: 305 positions remain, and position
    302 holds what slot 5 held."""
    keep = [0, 1, 5, 21, 64]
    state = {}

    def setup():
        cache = DynamicCache()
        gen = torch.Generator().manual_seed(0)
        for layer in range(30):
            k = torch.randn(1, 3, PREFIX + 65, 64, generator=gen)
            cache.update(k, k + 1, layer)
        state["cache"], state["slot5"] = cache, cache.layers[7].keys[:, :, PREFIX + 5].clone()

    _pedantic(benchmark, lambda: compact_cache(state["cache"], PREFIX, keep), setup=setup, rounds=50)
    cache = state["cache"]
    assert cache.get_seq_length() == PREFIX + len(keep)
    assert torch.equal(cache.layers[7].keys[:, :, PREFIX + 2], state["slot5"])


STEP_TOKENS = 64
STEP_METHODS = ("vanilla", "pld", "eagle2", "eagle3")
# CPU time (one torch thread): on a shared machine wall time also counts the waits for a core
CPU_TIME = time.process_time


@pytest.fixture(scope="module")
def overhead():
    """The host-overhead target, vanilla on it, and vanilla's greedy tokens for the tiny prompt (longer than a
    turn)."""
    target = overhead_target()
    vanilla = get_method("vanilla").create(target)
    return target, vanilla, vanilla.generate(TINY_PROMPT, STEP_TOKENS + 8, SamplingParams()).token_ids


def _loop_seconds(method, clock: ForwardClock):
    """One 64-token greedy turn of ``method``: (its Generation, CPU seconds of the loop after the prefill forward,
    CPU seconds inside forwards after it)."""
    with clock:
        t0 = CPU_TIME()
        gen = method.generate(TINY_PROMPT, STEP_TOKENS, SamplingParams())
        turn_s = CPU_TIME() - t0
    return gen, turn_s - clock.calls[0], sum(clock.calls[1:])  # calls[0]: the prefill's target forward


@pytest.mark.benchmark(group="host-overhead-step")
@pytest.mark.parametrize("name", STEP_METHODS)
def test_bench_host_overhead_per_step(benchmark, overhead, one_torch_thread, name):
    """A 64-token greedy turn of ``name`` on the tiny Llama, drafts always rejected: vanilla's tokens, and for a
    speculative method a non-empty tree at every step and one token per step (a step that accepted a draft, or
    proposed none, would not be the one-token step the ratio compares with vanilla's). Before each round (untimed)
    a vanilla turn runs, so that each round's ratio pairs two turns taken side by side."""
    target, vanilla, reference = overhead
    method = vanilla if name == "vanilla" else always_rejected(tree_method(name, target), reference)
    clock = ForwardClock(method_modules(method), CPU_TIME)
    vanilla_clock = ForwardClock(method_modules(vanilla), CPU_TIME)
    vanilla_steps: list[float] = []  # per round: vanilla's CPU seconds per step, just before it
    host_steps: list[float] = []     # per round: the method's loop less its forwards, per step

    def reference_turn():
        gen, loop_s, _ = _loop_seconds(vanilla, vanilla_clock)
        vanilla_steps.append(loop_s / (len(gen.accept_lengths) - 1))

    def turn():
        gen, loop_s, forward_s = _loop_seconds(method, clock)
        host_steps.append((loop_s - forward_s) / (len(gen.accept_lengths) - 1))
        return gen

    gen = _pedantic(benchmark, turn, setup=reference_turn, rounds=20)
    assert gen.token_ids == reference[:STEP_TOKENS]
    if name != "vanilla":
        assert gen.accept_lengths == [1] * STEP_TOKENS and sum(gen.accepted_drafts) == 0
        assert min(gen.draft_depths[1:]) > 0, gen.draft_depths
    info = {"method": name, "steps": STEP_TOKENS - 1,
            "host_ms_per_step": round(float(torch.tensor(host_steps).median()) * 1e3, 4)}
    if vanilla_steps:  # the reference turns ran (setup runs before every round)
        pairs = torch.tensor(host_steps[-len(vanilla_steps):]) / torch.tensor(vanilla_steps)
        info.update(vanilla_ms_per_step=round(float(torch.tensor(vanilla_steps).median()) * 1e3, 4),
                    host_vs_vanilla_step=round(float(pairs.median()), 3))
    benchmark.extra_info.update(info)
