"""A kill between a checkpoint and its checksum sidecar: the checkpoint file is in place (renamed
atomically), its sidecar is not. Resuming passes over it to the previous valid checkpoint, or,
with none, says in one line what to do."""

from pathlib import Path

import torch

import muonlab.train.checkpoint as ckpt_module
from muonlab.cli import main
from muonlab.record.ledger import read_records
from muonlab.train.checkpoint import list_checkpoints, save_checkpoint, verify_checkpoint

TINY = ["train", "--preset", "cpu-tiny", "--device", "cpu", "--num-steps", "6", "--checkpoint-every", "2",
        "--quiet"]


def crash_before_sidecar(monkeypatch, step: int) -> None:
    """The process dies (here: an interrupt no one handles in time) once step `step`'s checkpoint
    file is in place, before its sidecar is written."""
    real = ckpt_module.write_json

    def write_json(path, obj, *args, **kwargs):
        if Path(path).name == f"step-{step:06d}.json":
            raise KeyboardInterrupt
        return real(path, obj, *args, **kwargs)

    monkeypatch.setattr(ckpt_module, "write_json", write_json)


def weights(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def test_resume_passes_over_a_checkpoint_without_its_sidecar(tmp_path, monkeypatch, capsys, one_thread):
    runs = tmp_path / "cache" / "runs"
    assert main(TINY + ["--runs-dir", str(tmp_path / "reference"), "--run-name", "reference"]) == 0
    with monkeypatch.context() as patch:
        crash_before_sidecar(patch, 4)
        assert main(TINY + ["--run-name", "crash"]) == 130
    run_dir = runs / "crash"
    newest = run_dir / "checkpoints" / "step-000004.pt"
    assert newest.is_file() and "did not finish" in verify_checkpoint(newest)
    (rec,) = read_records(runs / "ledger.jsonl")
    assert rec["status"] == "interrupted" and rec["resumable"]
    assert rec["checkpoint"] == str(run_dir / "checkpoints" / "step-000002.pt")  # the newest complete one

    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "passed over step-000004.pt: no checksum sidecar" in out and "(step 2)" in out
    _, resumed = read_records(runs / "ledger.jsonl")
    assert resumed["status"] == "ok" and resumed["resumed_from_step"] == 2
    reference = weights(tmp_path / "reference" / "reference" / "model.pt")
    final = weights(run_dir / "model.pt")
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)


def test_no_complete_checkpoint_says_what_to_do(tmp_path, monkeypatch, capsys, one_thread):
    with monkeypatch.context() as patch:
        crash_before_sidecar(patch, 2)  # the first checkpoint
        assert main(TINY + ["--run-name", "crash"]) == 130
    run_dir = tmp_path / "cache" / "runs" / "crash"
    (rec,) = read_records(run_dir.parent / "ledger.jsonl")
    assert rec["status"] == "interrupted" and not rec["resumable"]
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no checksum sidecar" in err[0]
    assert f"muonlab train --config {run_dir / 'config.json'}" in err[0]


def test_unfinished_checkpoint_does_not_count_among_the_kept(tmp_path):
    """keep=1 after a crash left step 8 without its sidecar, and the resumed run checkpoints at
    step 6: the valid step 6 stays, not the unfinished step 8."""
    state = {"model": {"w": torch.zeros(2)}}
    save_checkpoint(tmp_path, 4, state, keep=1)
    unfinished = save_checkpoint(tmp_path, 8, state, keep=1)
    unfinished.with_suffix(".json").unlink()
    (tmp_path / "checkpoints" / ".step-000010.pt.x1y2.tmp").write_bytes(b"half")  # a killed torch.save
    save_checkpoint(tmp_path, 6, state, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000006.pt"]
    assert verify_checkpoint(list_checkpoints(tmp_path)[0]) is None
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))

