"""Throughput of the vanilla baseline against `model.generate` on the default model, side by side.

Measure with:  pytest tests/test_bench_vanilla.py --benchmark-enable --benchmark-group-by=group
The ratio (vanilla tokens/s over generate tokens/s) is printed in the comparison table; a slow baseline would
inflate every speedup in the tables. In the normal test run (benchmarks disabled) each body runs once as a test.
"""

import pytest

from harness.engine.sampling import SamplingParams
from harness.registry import get_method

N_NEW = 64
PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


@pytest.fixture(scope="module")
def prompt(real_target):
    return real_target.render_chat(PROMPT)


@pytest.mark.slow
@pytest.mark.benchmark(group="vanilla-vs-generate", warmup=True, warmup_iterations=1)
def test_bench_generate(benchmark, real_target, prompt):
    model = real_target.model

    def run():
        out = model.generate(prompt, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, pad_token_id=2)
        return out.shape[1] - prompt.shape[1]

    n = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert n == N_NEW
    benchmark.extra_info["new_tokens"] = n


@pytest.mark.slow
@pytest.mark.benchmark(group="vanilla-vs-generate", warmup=True, warmup_iterations=1)
def test_bench_vanilla(benchmark, real_target, prompt):
    vanilla = get_method("vanilla").create(real_target)
    real_target.eos_ids, saved = frozenset(), real_target.eos_ids  # same token count as generate(min_new_tokens)
    try:
        n = benchmark.pedantic(lambda: len(vanilla.generate(prompt, N_NEW, SamplingParams()).token_ids),
                               rounds=3, iterations=1, warmup_rounds=1)
    finally:
        real_target.eos_ids = saved
    assert n == N_NEW
    benchmark.extra_info["new_tokens"] = n
