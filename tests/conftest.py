import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


# One intra-op thread: the tests are dominated by tiny matmuls, where a second thread only adds synchronisation
# (and, on a loaded 2-core machine, oversubscription makes them orders of magnitude slower).
torch.set_num_threads(1)


@pytest.fixture()
def one_torch_thread():
    """One intra-op thread for the test, whatever an earlier test set (a run's ``--threads``), restored afterwards:
    tiny models gain nothing from intra-op threads, and on a loaded machine the thread pool's spinning makes each
    small matmul ~50x slower. Modules of tiny-model tests use it with ``pytestmark``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The evaluation data directory ($DRAFTBENCH_DATA, else ../shared/data next to the repo)."""
    d = Path(os.environ.get("DRAFTBENCH_DATA") or REPO.parent / "shared" / "data")
    if not (d / "eagle").exists():
        pytest.skip(f"evaluation data not found at {d} (set DRAFTBENCH_DATA)")
    return d


@pytest.fixture(scope="session")
def real_target():
    """The embedded default model, SmolLM2-135M-Instruct, fp32 on CPU (converted once into the cache)."""
    from harness.models import load_target

    return load_target("smollm2-135m", dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def vanilla_reference(real_target):
    """``reference(prompt, max_new_tokens, runtime="eager")``: vanilla's greedy tokens on the default model, computed
    once per (prompt, max_new_tokens, runtime) in the session. Every lossless check on the default model compares
    with it (tests/test_default_model.py, test_runtime.py, test_draftwindow.py, test_speculation_stop.py,
    test_layer_skip.py) instead of running the same vanilla turn again; each call returns a fresh list."""
    from harness.engine.sampling import SamplingParams
    from harness.registry import get_method

    tokens: dict[tuple[tuple[int, ...], int, str], list[int]] = {}

    def reference(prompt: torch.Tensor, max_new_tokens: int, runtime: str = "eager") -> list[int]:
        key = (tuple(prompt[0].tolist()), max_new_tokens, runtime)
        if key not in tokens:
            vanilla = get_method("vanilla").create(real_target)
            vanilla.runtime = runtime
            tokens[key] = vanilla.generate(prompt, max_new_tokens, SamplingParams()).token_ids
        return list(tokens[key])

    return reference
