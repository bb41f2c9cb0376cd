"""A run's final weights in safetensors (model.safetensors, read without unpickling) with what a reader
needs to rebuild the model, and muonlab.load_run(RUN) that returns the model."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import muonlab
from muonlab.cli import main
from muonlab.record.weights import load_safetensors, save_safetensors


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "3", "--checkpoint-every", "2",
                 "--runs-dir", str(runs), "--json"]) == 0
    (path,) = [p for p in runs.iterdir() if p.is_dir()]
    return path


def test_the_final_weights_are_also_safetensors_with_what_rebuilds_the_model(run_dir):
    state, metadata = load_safetensors(run_dir / "model.safetensors")
    pickled = torch.load(run_dir / "model.pt", weights_only=True)
    assert state.keys() == pickled.keys() and all(torch.equal(state[k], pickled[k]) for k in state)
    config = json.loads((run_dir / "config.json").read_text())
    assert metadata["muonlab"] == "muonlab-weights/1" and metadata["family"] == "autoresearch"
    assert metadata["config_hash"] == config["config_hash"] and int(metadata["vocab_size"]) == 300


def test_load_run_returns_the_trained_model(run_dir):
    model = muonlab.load_run(run_dir)
    pickled = torch.load(run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(v, pickled[k]) for k, v in model.state_dict().items()) and not model.training
    x = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        assert model(x).shape == (2, 16, 300)
    early = muonlab.load_run(run_dir, step=2)
    assert not torch.equal(early.state_dict()["lm_head.weight"], model.state_dict()["lm_head.weight"])


def test_a_tensor_two_names_share_is_stored_once_and_restored_under_both(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    save_safetensors(model.state_dict(), tmp_path / "w.safetensors", {"family": "test"})
    state, metadata = load_safetensors(tmp_path / "w.safetensors")
    assert json.loads(metadata["aliases"]) == {"head.weight": "embed.weight"}
    assert torch.equal(state["head.weight"], model.head.weight.detach())
    other = Tied()
    other.load_state_dict(state)
    assert torch.equal(other.embed.weight, model.embed.weight) and other.head.weight is other.embed.weight
