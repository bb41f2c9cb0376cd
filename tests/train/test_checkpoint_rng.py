"""Checkpointed CUDA RNG: only the run's own device is saved, and it is restored onto the run's
device whatever the number of GPUs visible on resume (a sweep slot sees one). Checkpoints of the
older format (every visible GPU's state, a list) still resume. CUDA is faked: torch.cuda's
functions are monkeypatched, so this runs without a GPU."""

import random

import pytest
import torch

from muonlab.train.checkpoint import list_checkpoints, load_checkpoint, rng_state, save_checkpoint, set_rng_state


class FakeCuda:
    """`visible` GPUs, each with a generator state; the calls checkpointing makes are recorded."""

    def __init__(self, monkeypatch, visible: int, current: int = 0):
        self.states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(visible)}
        self.current, self.restored = current, []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get_rng_state)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set_rng_state)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.states[i] for i in range(visible)])

        def set_all(states):  # torch's own: one device per entry, so more entries than GPUs fail
            for i, s in enumerate(states):
                self.set_rng_state(s, i)

        monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)

    def _index(self, device) -> int:
        index = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        index = self.current if index.index is None else index.index
        if index not in self.states:
            raise IndexError(f"cuda:{index}: only {len(self.states)} GPU(s) visible")
        return index

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        self.restored.append((self._index(device), int(state[0])))


def test_only_the_runs_own_device_is_saved(monkeypatch):
    cuda = FakeCuda(monkeypatch, visible=4, current=0)
    assert torch.equal(rng_state(torch.device("cuda", 2))["cuda"], cuda.states[2])  # a one-process run on cuda:2
    cuda.current = 3  # a torchrun rank pinned to its GPU, run device "cuda"
    assert torch.equal(rng_state(torch.device("cuda"))["cuda"], cuda.states[3])
    assert torch.equal(rng_state()["cuda"], cuda.states[3])
    assert "cuda" not in rng_state(torch.device("cpu"))  # a CPU run on a GPU machine draws from no GPU


def test_resume_with_fewer_visible_gpus_restores_onto_the_runs_device(monkeypatch, tmp_path):
    FakeCuda(monkeypatch, visible=8, current=0)
    saved = rng_state(torch.device("cuda", 5))
    save_checkpoint(tmp_path, 1, {"rng": saved})
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])  # weights_only=True reads it
    slot = FakeCuda(monkeypatch, visible=1, current=0)  # resumed in a sweep slot: one GPU, index 0
    set_rng_state(state["rng"], torch.device("cuda"))
    assert slot.restored == [(0, 5)]  # GPU 5's state, onto the only device this process has


@pytest.mark.parametrize(("visible_at_write", "device", "visible", "entry"), [
    (8, torch.device("cuda"), 1, 0),  # written seeing 8 GPUs, run on cuda:0; resumed in a 1-GPU slot
    (4, torch.device("cuda", 2), 4, 2),  # a run on cuda:2 resumed as it ran: its own entry
    (1, torch.device("cuda", 3), 4, 0),  # written in a slot (1 GPU seen), resumed with more: its only entry
])
def test_older_checkpoints_with_every_gpus_state_still_resume(monkeypatch, visible_at_write, device, visible, entry):
    old = {"torch": torch.get_rng_state(), "python": list(random.getstate()),
           "cuda": [torch.full((16,), i, dtype=torch.uint8) for i in range(visible_at_write)]}
    cuda = FakeCuda(monkeypatch, visible=visible, current=0)
    set_rng_state(old, device)
    assert cuda.restored == [(device.index or 0, entry)]


def test_older_multi_rank_checkpoints_give_every_rank_rank_0s_state(monkeypatch):
    old = {"torch": torch.get_rng_state(), "python": list(random.getstate()),
           "cuda": [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]}
    cuda = FakeCuda(monkeypatch, visible=4, current=3)  # rank 3 of a torchrun resume
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    set_rng_state(old, torch.device("cuda", 3))
    assert cuda.restored == [(3, 0)]  # rank 0 wrote it and drew from its cuda:0


def test_cpu_and_python_states_round_trip():
    saved = rng_state(torch.device("cpu"))
    a, b = torch.rand(3), random.random()
    set_rng_state(saved, torch.device("cpu"))
    assert torch.equal(torch.rand(3), a) and random.random() == b
