"""Throughput of the vanilla baseline against `model.generate` on the default model, side by side, per runtime.

Measure with:  pytest tests/test_bench_vanilla.py --benchmark-enable --benchmark-group-by=group
The ratio (vanilla tokens/s over generate tokens/s) is printed in the comparison table; a slow baseline would
inflate every speedup in the tables. Group ``vanilla-vs-generate`` compares the eager runtime with transformers'
eager ``generate``; group ``vanilla-vs-generate-compiled`` the compiled runtime (harness/engine/runtime.py) with
transformers' own compiled generation (``cache_implementation="static"``: the decoding step compiled with static
shapes over a static cache, the prefill eager). That one runs with inductor's defaults: frozen weights (which the
compiled runtime's packed linears need) would also freeze the static cache's buffers, and transformers makes a new
cache per call, so a second call would read the first one's (index out of bounds, torch 2.13 / transformers 5.24).
Compilation happens in the untimed warm-up round. In the normal test run (benchmarks disabled) each body runs once
as a test.
"""

import pytest

from harness.engine.runtime import RUNTIMES
from harness.engine.sampling import SamplingParams
from harness.registry import get_method

N_NEW = 64
PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


@pytest.fixture(scope="module")
def prompt(real_target):
    return real_target.render_chat(PROMPT)


@pytest.fixture(scope="module")
def generate_tokens(real_target, prompt):
    """transformers' eager greedy tokens (N_NEW) for the prompt: the reference of both runtimes' vanilla, once."""
    return _generate(real_target.model, prompt, False)[0, prompt.shape[1]:].tolist()


def _generate(model, prompt, compiled: bool):
    if not compiled:
        return model.generate(prompt, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, pad_token_id=2)
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
    config._compile_all_devices = True  # transformers compiles generation on accelerators only unless told
    return model.generate(prompt, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, pad_token_id=2,
                          cache_implementation="static", compile_config=config)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bench_generate(benchmark, real_target, prompt, runtime):
    """transformers' generate, eager or with its own compiled decoding step: N_NEW tokens (fewer would mean the
    token count behind the tokens/s is wrong)."""
    benchmark.group = "vanilla-vs-generate" + ("" if runtime == "eager" else f"-{runtime}")
    model = real_target.model

    def run():
        out = _generate(model, prompt, runtime != "eager")
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
