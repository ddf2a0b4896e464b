"""What only a CUDA device shows (run by ``make gpu-check``; skipped without CUDA): losslessness on the GPU's
kernels, host syncs seen by CUDA's own sync debug mode, memory and NVML readings, synchronised timings."""

from __future__ import annotations

import pytest
import torch

from harness.engine.sampling import SamplingParams
from harness.measure.syncs import cuda_syncs_per_forward
from harness.measure.trackers import Nvml, Tracker, pci_bus_id
from methods.vanilla import Vanilla
from tests.support.anymodel import TREE_METHODS, tiny_causal_lm, tree_method

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GREEDY = SamplingParams()
PROMPT = [[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]]
CASES = [("llama", None), ("mistral", 6), ("gemma2", 5), ("gemma3", 5)]


@pytest.mark.parametrize("arch, window", CASES, ids=[f"{a}-w{w}" for a, w in CASES])
@pytest.mark.parametrize("name", TREE_METHODS)
def test_every_method_greedy_equals_vanilla_on_cuda(arch, window, name):
    """fp32 on CUDA: a tree forward and one-token decoding use other kernels than on CPU; greedy outputs must
    still be equal (a wrong mask, window or compaction shows here as on CPU; a near tie would too, so a failure
    here needs the divergence report's margins before it is called a bug)."""
    target = tiny_causal_lm(arch, window, device="cuda")
    prompt = torch.tensor(PROMPT, device="cuda")
    want = Vanilla(target).generate(prompt, 30, GREEDY).token_ids
    assert tree_method(name, target).generate(prompt, 30, GREEDY).token_ids == want


def test_step_loop_syncs_counted_by_cuda():
    """CUDA's sync debug mode sees every synchronising call, including inside torch and transformers: an EAGLE-2
    step on a 2-layer model makes at most 3 (the loop itself makes 1; tests/test_syncs.py pins that on CPU)."""
    target = tiny_causal_lm("llama", device="cuda")
    method = tree_method("eagle2", target)
    prompt = torch.tensor(PROMPT, device="cuda")
    method.generate(prompt, 8, GREEDY)  # warm-up: lazy inits
    per_forward, messages = cuda_syncs_per_forward(target.model, lambda: method.generate(prompt, 24, GREEDY))
    per_step = per_forward[1:]
    assert per_step and max(per_step) <= 3, (per_step, messages)


def test_memory_and_nvml_readings_on_cuda():
    """Peak allocated memory covers at least the weights, reserved is at least allocated, and NVML reads the
    board torch uses (matched by PCI bus id: the board's name is torch's device name)."""
    target = tiny_causal_lm("llama", device="cuda")
    weights = sum(p.numel() * p.element_size() for p in target.model.parameters())
    tracker = Tracker("cuda:0")
    with tracker.track() as m:
        Vanilla(target).generate(torch.tensor(PROMPT, device="cuda"), 16, GREEDY)
    assert m.cuda_peak_allocated_bytes >= weights
    assert m.cuda_peak_reserved_bytes >= m.cuda_peak_allocated_bytes
    nvml = Nvml([0])
    if nvml.error and "pynvml" in nvml.error:
        pytest.skip(f"NVML unavailable: {nvml.error}")
    assert nvml.devices == [pci_bus_id(torch.cuda.get_device_properties(0))], nvml.error
    name = nvml.info().get("gpu_name", "")
    assert (name and name in torch.cuda.get_device_name(0)) or torch.cuda.get_device_name(0) in name
    assert m.nvml_used_bytes and m.nvml_devices == nvml.devices
    assert m.energy_j is not None and m.energy_j >= 0


def test_timings_are_synchronised_when_profiling_on_cuda():
    """profile on: draft + verify + overhead sum to the turn's wall time minus the prefill (each part was
    synchronised); profile off: the record says the split is not synchronised."""
    target = tiny_causal_lm("llama", device="cuda")
    method = tree_method("eagle2", target)
    prompt = torch.tensor(PROMPT, device="cuda")
    tracker = Tracker("cuda:0")
    method.profile = True
    with tracker.track() as m:
        gen = method.generate(prompt, 24, GREEDY)
    assert gen.timings_synchronised is True
    assert sum(gen.timings.values()) == pytest.approx(m.wall_time_s - gen.prefill_time_s, rel=0.1)
    method.profile = False
    assert method.generate(prompt, 8, GREEDY).timings_synchronised is False


def test_compiled_runtime_across_turns_methods_and_inference_mode_on_cuda():
    """The compiled runtime as a run drives it on CUDA (static cache, tree buckets, CUDA graphs): vanilla, then a
    tree method, sharing one runner and its one StaticCache, two prompts each, called outside and inside
    ``torch.inference_mode``, every turn equal to eager vanilla. On 78ed5b3 the second turn raised "Inplace update
    to inference tensor outside InferenceMode" (the cache's reset), so every compiled turn after the first failed."""
    from harness.engine.runtime import CompiledRunner

    target = tiny_causal_lm("llama", device="cuda")
    runner = CompiledRunner(target)
    assert runner.static and runner.cudagraphs
    target.runners["compiled"] = runner
    prompts = [torch.tensor(PROMPT, device="cuda"), torch.tensor([PROMPT[0][:9]], device="cuda")]
    want = [Vanilla(target).generate(p, 20, GREEDY).token_ids for p in prompts]
    for method in (Vanilla(target), tree_method("eagle2", target)):
        method.runtime = "compiled"
        for inside in (False, True):
            for prompt, expected in zip(prompts, want):
                if inside:
                    with torch.inference_mode():
                        got = method.generate(prompt, 20, GREEDY).token_ids
                else:
                    got = method.generate(prompt, 20, GREEDY).token_ids
                assert got == expected, (type(method).__name__, inside)
    assert runner.graphs >= 2 and runner._static_cache is not None


def test_a_second_process_loads_the_compiled_cuda_graphs(tmp_path):
    """The compile cache on CUDA (static flavour, CUDA graphs): a second process with the same cache folder must
    load every graph the first compiled (FX-graph cache hits: the Triton kernels are reused, nothing is lowered),
    capture its CUDA graphs again and give the first process's tokens; a graph compiled again, or a wrong token
    (a CUDA graph replayed over stale addresses), would be wrong."""
    from tests.support.compiled_run import run_in_process

    first = run_in_process(tmp_path, "static", "cuda")
    assert first["cudagraphs"] and first["graphs"] >= 2 and first["loaded"] == 0
    second = run_in_process(tmp_path, "static", "cuda")
    assert second["tokens"] == first["tokens"]
    assert second["graphs"] == second["loaded"] == first["graphs"], second["events"]
