"""The vanilla baseline: greedy output is exactly transformers' `generate(do_sample=False)`; sampling is seeded."""

import pytest
import torch

from harness.engine.sampling import SamplingParams
from harness.registry import get_method
from tests.support.helpers import tiny_target


def _generate_reference(target, prompt, n):
    out = target.model.generate(prompt, max_new_tokens=n, do_sample=False, eos_token_id=sorted(target.eos_ids) or None,
                                 pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


def test_vanilla_greedy_equals_generate_tiny():
    # a mismatch means the baseline is not the target's greedy decoding (cache, positions or argmax are off)
    target = tiny_target(eos=False)
    prompt = target.render_chat([{"role": "user", "content": "Count to ten."}])
    gen = get_method("vanilla").create(target).generate(prompt, 40, SamplingParams())
    assert gen.token_ids == _generate_reference(target, prompt, 40)
    assert gen.accept_lengths == [1] * 40 and gen.stop_reason == "max_new_tokens"


def test_vanilla_stops_at_eos_and_keeps_it():
    target = tiny_target(eos=False)
    prompt = target.render_chat([{"role": "user", "content": "x"}])
    free = get_method("vanilla").create(target).generate(prompt, 30, SamplingParams()).token_ids
    target.eos_ids = frozenset({free[5]})  # the 6th token becomes "EOS": generation must end right after it
    gen = get_method("vanilla").create(target).generate(prompt, 30, SamplingParams())
    first = free.index(free[5])
    assert gen.token_ids == free[: first + 1] and gen.stop_reason == "eos"


def test_vanilla_sampling_is_reproducible_with_a_seed():
    target = tiny_target(eos=False)
    prompt = target.render_chat([{"role": "user", "content": "x"}])
    v = get_method("vanilla").create(target)
    runs = [v.generate(prompt, 20, SamplingParams(1.0), torch.Generator().manual_seed(s)).token_ids for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


@pytest.mark.slow
def test_vanilla_greedy_equals_generate_real_model(real_target):
    # the end-to-end check on SmolLM2-135M-Instruct, fp32 CPU
    prompt = real_target.render_chat([{"role": "user", "content": "Name three primary colours."}])
    gen = get_method("vanilla").create(real_target).generate(prompt, 48, SamplingParams())
    assert gen.token_ids == _generate_reference(real_target, prompt, 48)
