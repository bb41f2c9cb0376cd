import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# shared/ sits beside the checkout (../shared), as laid out for sessions and CI
SHARED_REFERENCE = REPO.parent / "shared" / "reference"

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Never touch the user's real cache from tests."""
    monkeypatch.setenv("MUONLAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def one_thread(monkeypatch):
    """Train on one thread, here and in child processes (OMP_NUM_THREADS): tiny models run
    fastest so on a shared machine, and runs in and out of process compare bit for bit."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_bundle(precision: str) -> Path:
    path = SHARED_REFERENCE / f"autoresearch_d2_{precision}.pt"
    if not path.exists():
        pytest.skip(f"shared reference bundle not found at {path}")
    return path


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
