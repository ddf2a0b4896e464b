"""Throughput of the vanilla baseline against `model.generate` on the default model, side by side, per runtime.

Measure with:  pytest tests/test_bench_vanilla.py --benchmark-enable --benchmark-group-by=group
The ratio (vanilla tokens/s over generate tokens/s) is printed in the comparison table; a slow baseline would
inflate every speedup in the tables. Group ``vanilla-vs-generate`` compares the eager runtime with transformers'
eager ``generate``; group ``vanilla-vs-generate-compiled`` the compiled runtime (harness/engine/runtime.py) with
transformers' own compiled generation (``cache_implementation="static"``: the decoding step compiled with static
shapes over a static cache, the prefill eager), both through :func:`harness.gpucheck.generate_reference`, the
reference gpu-check holds vanilla against on a GPU. On CPU that one runs with inductor's defaults: frozen weights (which
the compiled runtime's packed linears need) would also freeze the static cache's buffers, and transformers makes a new
cache per call, so a second call would read the first one's (index out of bounds, torch 2.13 / transformers 5.24).
Compilation happens in the untimed warm-up round. In the normal test run (benchmarks disabled) each body runs once
as a test.

Group ``host-overhead-token``: the host work per token of the eager loop, on a tiny random Llama (4 layers, hidden 64,
tests/support/overhead.py) whose forwards cost about what the loop's own Python does, one torch thread: the harness's
vanilla against transformers' eager ``generate`` (greedy, ``DynamicCache``, the same number of new tokens) and against
the floor, a hand-written ``model(...)`` KV-cache loop with one host read per token. Target: vanilla within 1.1x of
``generate`` per token (``extra_info["vs_generate"]`` of the vanilla entry: the median over rounds of vanilla's CPU
time over that of a generate turn run just before it; ``vs_floor`` beside it). The default model's decoding step
hides this overhead on a CPU; on a GPU it is what bounds the eager loop (docs/results.md, host overhead).
"""

import time

import pytest
import torch

from harness.engine.runtime import RUNTIMES
from harness.engine.sampling import SamplingParams
from harness.gpucheck import generate_reference
from harness.registry import get_method
from tests.support.overhead import PROMPT as TINY_PROMPT
from tests.support.overhead import floor_decode, overhead_target

N_NEW = 64
PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


@pytest.fixture(scope="module")
def prompt(real_target):
    return real_target.render_chat(PROMPT)


@pytest.fixture(scope="module")
def generate_tokens(real_target, prompt):
    """transformers' eager greedy tokens (N_NEW) for the prompt: the reference of both runtimes' vanilla, once."""
    return generate_reference(real_target.model, prompt, N_NEW, False)[0, prompt.shape[1]:].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bench_generate(benchmark, real_target, prompt, runtime):
    """transformers' generate, eager or with its own compiled decoding step: N_NEW tokens (fewer would mean the
    token count behind the tokens/s is wrong)."""
    benchmark.group = "vanilla-vs-generate" + ("" if runtime == "eager" else f"-{runtime}")
    model = real_target.model

    def run():
        out = generate_reference(model, prompt, N_NEW, runtime != "eager")
        return out.shape[1] - prompt.shape[1]

    n = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert n == N_NEW
    benchmark.extra_info.update(new_tokens=n, runtime=runtime)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bench_vanilla(benchmark, real_target, prompt, generate_tokens, runtime):
    """draftbench's vanilla through the runner of ``runtime``: N_NEW tokens, and the same tokens as generate of the
    same runtime (a baseline that decodes something else is not a baseline)."""
    benchmark.group = "vanilla-vs-generate" + ("" if runtime == "eager" else f"-{runtime}")
    vanilla = get_method("vanilla").create(real_target)
    vanilla.runtime = runtime
    real_target.eos_ids, saved = frozenset(), real_target.eos_ids  # same token count as generate(min_new_tokens)
    try:
        tokens = benchmark.pedantic(lambda: vanilla.generate(prompt, N_NEW, SamplingParams()).token_ids,
                                    rounds=3, iterations=1, warmup_rounds=1)
    finally:
        real_target.eos_ids = saved
    assert len(tokens) == N_NEW
    assert tokens == generate_tokens
    benchmark.extra_info.update(new_tokens=len(tokens), runtime=runtime)


TINY_NEW = 64
TOKEN_LOOPS = ("floor", "generate", "vanilla")
CPU_TIME = time.process_time  # the paired ratios' clock (one torch thread; wall time also counts waits for a core)


@pytest.fixture(scope="module")
def tiny():
    """The host-overhead target and the floor's greedy tokens for the tiny prompt (the reference of all three)."""
    target = overhead_target()
    return target, floor_decode(target.model, TINY_PROMPT, TINY_NEW)


def _tiny_loop(target, loop: str):
    if loop == "floor":
        return lambda: floor_decode(target.model, TINY_PROMPT, TINY_NEW)
    if loop == "generate":
        return lambda: generate_reference(target.model, TINY_PROMPT, TINY_NEW, False)[0, TINY_PROMPT.shape[1]:].tolist()
    vanilla = get_method("vanilla").create(target)
    return lambda: vanilla.generate(TINY_PROMPT, TINY_NEW, SamplingParams()).token_ids


def _cpu_seconds(fn) -> float:
    t0 = CPU_TIME()
    fn()
    return CPU_TIME() - t0


@pytest.mark.benchmark(group="host-overhead-token")
@pytest.mark.parametrize("loop", TOKEN_LOOPS)
def test_bench_host_overhead_per_token(benchmark, tiny, one_torch_thread, loop):
    """64 greedy tokens on the tiny Llama by ``loop`` (floor, generate or vanilla): each must decode the floor's
    tokens (a loop that decodes something else times other work). Vanilla's entry records ``vs_generate`` and
    ``vs_floor``: before each of its rounds (untimed) a generate and a floor turn run, and each ratio is the median
    over rounds of vanilla's CPU time over theirs, side by side (target: ``vs_generate`` <= 1.1)."""
    target, reference = tiny
    run = _tiny_loop(target, loop)
    others = {other: _tiny_loop(target, other) for other in ("generate", "floor")} if loop == "vanilla" else {}
    seconds: dict[str, list[float]] = {name: [] for name in (loop, *others)}

    def setup():
        for other, fn in others.items():
            seconds[other].append(_cpu_seconds(fn))

    def timed():
        t0 = CPU_TIME()
        tokens = run()
        seconds[loop].append(CPU_TIME() - t0)
        return tokens

    with torch.inference_mode():
        tokens = benchmark.pedantic(timed, setup=setup if others else None, rounds=30, iterations=1,
                                    warmup_rounds=2)
    assert tokens == reference
    mine = torch.tensor(seconds[loop])
    info = {"new_tokens": TINY_NEW, "loop": loop, "ms_per_token": round(float(mine.median()) / TINY_NEW * 1e3, 4)}
    for other in others:
        if seconds[other]:
            ratio = mine[-len(seconds[other]):] / torch.tensor(seconds[other])
            info[f"vs_{other}"] = round(float(ratio.median()), 3)
    benchmark.extra_info.update(info)
