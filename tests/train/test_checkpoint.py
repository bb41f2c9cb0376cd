"""Checkpoint and resume: exact continuation, refusal of damaged checkpoints, faults."""

import errno
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from support.models import assert_trained
from support.warm_run import WarmMuonlab

import muonlab.record.ledger as ledger_module
import muonlab.train.checkpoint as ckpt_module
from muonlab.cli import main
from muonlab.errors import MuonlabError
from muonlab.model import GPT
from muonlab.record.ledger import append_record, read_records
from muonlab.train.checkpoint import list_checkpoints, verify_checkpoint

pytestmark = pytest.mark.spread  # each test a unit of work of its own (support.budget.work_unit)

TINY = ["train", "--preset", "cpu-tiny", "--num-steps", "40", "--checkpoint-every", "4", "--log-every", "1",
        "--eval-every", "5", "--eval-every-tokens", "128"]  # periodic evaluations are redone with their steps


def runs(tmp_path) -> Path:
    return Path(tmp_path) / "cache" / "runs"


def ledger(tmp_path) -> list[dict]:
    return list(read_records(runs(tmp_path) / "ledger.jsonl"))


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def val_curve(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["val_bpb"]) for r in rows if "val_bpb" in r]


@pytest.fixture
def reference_run(tmp_path, capsys):
    assert main(TINY + ["--run-name", "reference", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return Path(out["run_dir"]), out["summary"]


def _start(tmp_path, name) -> WarmMuonlab:
    """The run in a process of its own (support.warm_run), to be killed or signalled."""
    return WarmMuonlab(TINY + ["--run-name", name], dict(os.environ, MUONLAB_CACHE=str(tmp_path / "cache")),
                       tmp_path / f"{name}.log")


def _steps_logged(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.exists() else 0


def test_killed_run_resumes_bitwise(tmp_path, reference_run, capsys):
    ref_dir, ref_summary = reference_run
    run_dir = runs(tmp_path) / "killed"
    with _start(tmp_path, "killed") as run:
        run.wait_until("14 steps", lambda: _steps_logged(run_dir) >= 14, timeout_s=120, every_s=0.02)
        run.process.kill()  # SIGKILL: no chance to clean up, as in a node failure
        run.process.wait(timeout=30)
    assert list_checkpoints(run_dir), "a periodic checkpoint was written before the kill"
    assert main(["train", "--resume", str(run_dir), "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)["summary"]
    assert_same_weights(ref_dir, run_dir)
    assert_trained(run_dir)  # the same weights as a run that trained, not merely the same
    assert resumed["val_bpb"] == ref_summary["val_bpb"]
    assert resumed["holdout_bpb"] == ref_summary["holdout_bpb"]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(40))  # redone steps replaced, none duplicated
    assert val_curve(run_dir) == val_curve(ref_dir) and len(val_curve(ref_dir)) == 8  # after steps 5, 10, .., 40
    rec = [r for r in ledger(tmp_path) if r["run_id"] == "killed"]
    assert [r["status"] for r in rec] == ["ok"] and rec[0]["resumed_from_step"] % 4 == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])  # a preemption; SLURM's notice before one
def test_sigterm_checkpoints_and_resumes(tmp_path, reference_run, capsys, monkeypatch, sig):
    ref_dir, _ = reference_run
    run_dir = runs(tmp_path) / "preempted"
    with _start(tmp_path, "preempted") as run:
        run.wait_until("6 steps", lambda: _steps_logged(run_dir) >= 6, timeout_s=120, every_s=0.02)
        run.process.send_signal(sig)
        assert run.process.wait(timeout=60) == 130, run.output()
    (rec,) = [r for r in ledger(tmp_path) if r["run_id"] == "preempted"]
    assert rec["status"] == "interrupted" and rec["resumable"] and sig.name in rec["error"]
    assert verify_checkpoint(Path(rec["checkpoint"])) is None
    if sig == signal.SIGUSR2:  # resumed from inside its folder: `--resume .` names the run by that folder
        monkeypatch.chdir(run_dir)
    assert main(["train", "--resume", "." if sig == signal.SIGUSR2 else str(run_dir)]) == 0
    assert_same_weights(ref_dir, run_dir)
    assert [r["status"] for r in ledger(tmp_path) if r["run_id"] == "preempted"] == ["interrupted", "ok"]


def test_a_checkpoint_interval_in_minutes_checkpoints_by_wall_time(tmp_path, monkeypatch, capsys):
    """checkpoint_minutes: a checkpoint after the first step that ends that much wall time after the
    last; the clock is the loop's own (time.monotonic), stepped 40 s per read here."""
    import muonlab.train.loop as loop

    clock = iter(range(0, 10**6, 40))
    monkeypatch.setattr(loop.time, "monotonic", lambda: next(clock))
    args = ["train", "--preset", "cpu-tiny", "--device", "cpu", "--num-steps", "12", "--checkpoint-keep", "100",
            "--quiet", "--json"]
    assert main(args + ["--run-name", "by-minutes", "--checkpoint-minutes", "1.5"]) == 0
    steps = [int(p.stem.split("-")[1]) for p in list_checkpoints(runs(tmp_path) / "by-minutes")]
    # the loop reads the clock once before step 0 and once per step: 40 s a step, so 90 s end after 3 steps
    assert sorted(steps) == [3, 6, 9, 12]
    assert main(args + ["--run-name", "by-end"]) == 0
    assert [int(p.stem.split("-")[1]) for p in list_checkpoints(runs(tmp_path) / "by-end")] == [12]
    assert_same_weights(runs(tmp_path) / "by-minutes", runs(tmp_path) / "by-end")  # checkpoints move no number


def test_damaged_checkpoint_is_refused_and_fallback_works(tmp_path, reference_run, capsys):
    ref_dir, _ = reference_run
    newest = list_checkpoints(ref_dir)[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # truncated
    assert "truncated" in verify_checkpoint(newest)
    capsys.readouterr()
    assert main(["train", "--resume", str(ref_dir)]) == 1
    assert "refused" in capsys.readouterr().err
    expected = weights(ref_dir)
    assert main(["train", "--resume", str(ref_dir), "--fallback"]) == 0
    assert all(torch.equal(expected[k], v) for k, v in weights(ref_dir).items())
    flipped = list_checkpoints(ref_dir)[-1]
    raw = bytearray(flipped.read_bytes())
    raw[len(raw) // 3] ^= 0xFF  # same size, one corrupted byte
    flipped.write_bytes(bytes(raw))
    assert verify_checkpoint(flipped) == "checksum mismatch (corrupted)"


def test_divergence_keeps_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    real_forward = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, reduction="mean"):
        calls["n"] += 1
        out = real_forward(self, idx, targets, reduction)
        return out * float("nan") if calls["n"] > 2 * 5 else out  # NaN from step 5 (2 micro-steps)

    monkeypatch.setattr(GPT, "forward", forward)
    assert main(TINY + ["--run-name", "nan"]) == 1
    assert "diverged at step 5" in capsys.readouterr().err
    (rec,) = ledger(tmp_path)
    assert rec["status"] == "diverged" and rec["metrics"]["diverged_step"] == 5
    kept = list_checkpoints(runs(tmp_path) / "nan")
    assert kept and kept[-1].name == "step-000004.pt" and verify_checkpoint(kept[-1]) is None


def test_out_of_memory_is_reported_with_the_batch_shape(tmp_path, monkeypatch, capsys):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(GPT, "forward", oom)
    assert main(TINY) == 1
    err = capsys.readouterr().err
    assert "out of memory at step 0" in err and "micro-batch 4 x 64" in err
    (rec,) = ledger(tmp_path)
    assert rec["status"] == "failed" and rec["error_kind"] == "oom"


def test_disk_full_during_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, capsys):
    real_save = torch.save
    saves = {"n": 0}

    def flaky_save(obj, f, *args, **kwargs):
        saves["n"] += 1
        if saves["n"] == 3:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt_module.torch, "save", flaky_save)
    assert main(TINY + ["--run-name", "full"]) == 1
    run_dir = runs(tmp_path) / "full"
    kept = list_checkpoints(run_dir)
    assert [p.name for p in kept] == ["step-000004.pt", "step-000008.pt"]
    assert all(verify_checkpoint(p) is None for p in kept)
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))  # no half-written file
    (rec,) = ledger(tmp_path)
    assert rec["status"] == "failed" and "No space left" in rec["error"]


def test_ledger_short_writes_are_continued_and_a_failed_one_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "ledger.jsonl"
    append_record(path, {"run_id": "a", "status": "ok"})
    real_write = os.write
    monkeypatch.setattr(ledger_module.os, "write", lambda fd, data: real_write(fd, data[:10]))  # short writes
    append_record(path, {"run_id": "b", "status": "ok"})
    assert [r["run_id"] for r in read_records(path)] == ["a", "b"]
    before = path.read_bytes()
    calls = {"n": 0}

    def full_disk(fd, data):  # accepts part of the line, then nothing more
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data[:10])

    monkeypatch.setattr(ledger_module.os, "write", full_disk)
    with pytest.raises(MuonlabError, match="No space left"):
        append_record(path, {"run_id": "c", "status": "ok"})
    assert path.read_bytes() == before


def test_resume_refuses_foreign_or_missing(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert main(["train", "--resume", str(tmp_path), "--depth", "3"]) == 2
    assert "give no other settings" in capsys.readouterr().err
