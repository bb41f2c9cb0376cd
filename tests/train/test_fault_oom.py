"""A CUDA out-of-memory in the backward pass or in the optimizer step (simulated on CPU): one line
naming the micro-batch shape and what to lower, the run recorded as failed, exit 1. (The forward
pass: tests/train/test_checkpoint.py.)"""

import json

import pytest
import torch

from muonlab.cli import main
from muonlab.optim.muon_adamw import MuonAdamW
from muonlab.record.ledger import read_records

RUN = ["train", "--preset", "cpu-tiny", "--device", "cpu", "--num-steps", "4", "--quiet", "--run-name", "oom"]
OOM_STEP = 1  # the second optimizer step: the message must name the step it happened in


def raise_oom_at_step(monkeypatch, owner, name: str, calls_per_step: int) -> None:
    real = getattr(owner, name)
    calls = {"n": 0}

    def method(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > OOM_STEP * calls_per_step:
            # torch.cuda.OutOfMemoryError is torch.OutOfMemoryError: one class, as CUDA raises it
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, method)


@pytest.mark.parametrize("where", ["backward", "optimizer step"])
def test_out_of_memory_names_the_micro_batch_and_is_recorded(tmp_path, monkeypatch, capsys, one_thread, where):
    if where == "backward":  # cpu-tiny: 2 micro-steps per optimizer step
        raise_oom_at_step(monkeypatch, torch.Tensor, "backward", calls_per_step=2)
    else:
        raise_oom_at_step(monkeypatch, MuonAdamW, "step", calls_per_step=1)
    assert main(RUN) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: out of memory at step {OOM_STEP} on cpu with micro-batch 4 x 64 tokens")
    assert "lower --device-batch-size" in err[0]
    run_dir = tmp_path / "cache" / "runs" / "oom"
    (rec,) = read_records(run_dir.parent / "ledger.jsonl")
    assert rec["status"] == "failed" and rec["error_kind"] == "oom"
    assert rec["error"] == err[0].removeprefix("error: ")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
