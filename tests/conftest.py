import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


# One intra-op thread: the tests are dominated by tiny matmuls, where a second thread only adds synchronisation
# (and, on a loaded 2-core machine, oversubscription makes them orders of magnitude slower).
torch.set_num_threads(1)


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
