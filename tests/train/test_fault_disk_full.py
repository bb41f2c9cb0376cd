"""A full disk while a run writes its metrics, its summary, its final weights or its ledger line:
the run is recorded as failed (in the ledger, or in its summary when the ledger is what cannot be
written), the error is one line, and nothing is left torn or half written.

The fault is injected beneath the project's writers, where a real one happens: os.write for the
appended files (metrics.jsonl, the ledger), the temp file's write for the atomically replaced ones
(summary.json, model.pt; torch.save turns that OSError into a RuntimeError of its own). From the
first write that reaches the target on, the disk is full: that write stores half of its bytes,
every later one fails.
"""

import errno
import json
import os
from pathlib import Path

import pytest

from muonlab.cli import main
from muonlab.record.ledger import read_records

RUN = ["train", "--preset", "cpu-tiny", "--device", "cpu", "--num-steps", "4", "--quiet", "--run-name", "full"]


def no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullDisk:
    """Makes the disk full for one file (appended files) or for the temp files that replace it
    (atomically written files), once `after` writes to it have gone through."""

    def __init__(self, monkeypatch, target: Path, after: int = 0):
        self.target, self.after, self.writes, self.full = target, after, 0, False
        real_write, real_fdopen = os.write, os.fdopen

        def write(fd, data):
            if not self._is_target(fd):
                return real_write(fd, data)
            self.writes += 1
            if self.full:
                raise no_space()
            if self.writes > self.after:
                self.full = True
                return real_write(fd, bytes(data[: len(data) // 2]))
            return real_write(fd, data)

        def fdopen(fd, *args, **kwargs):
            f = real_fdopen(fd, *args, **kwargs)
            temps = target.parent.glob(f".{target.name}.*.tmp")
            return _FullFile(f, self) if any(os.path.samestat(os.fstat(fd), os.stat(t)) for t in temps) else f

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "fdopen", fdopen)

    def _is_target(self, fd) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.target))
        except OSError:
            return False


class _FullFile:
    def __init__(self, f, disk: FullDisk):
        self._f, self._disk = f, disk

    def write(self, data):
        disk = self._disk
        disk.writes += 1
        if disk.full:
            raise no_space()
        if disk.writes <= disk.after:
            return self._f.write(data)
        disk.full = True
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise no_space()

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
        return False


@pytest.mark.parametrize("target", ["metrics.jsonl", "summary.json", "model.pt", "model.safetensors", "ledger.jsonl"])
def test_full_disk_leaves_a_failed_record_and_nothing_torn(tmp_path, monkeypatch, capsys, one_thread, target):
    runs = tmp_path / "cache" / "runs"
    run_dir, ledger = runs / "full", runs / "ledger.jsonl"
    path = ledger if target == "ledger.jsonl" else run_dir / target
    with monkeypatch.context() as patch:
        # metrics: from step 2 on; weights: past torch.save's first writes, where it would pass the
        # OSError through unchanged (later ones it turns into a RuntimeError)
        disk = FullDisk(patch, path, after=2 if target in ("metrics.jsonl", "model.pt") else 0)
        assert main(RUN) == 1
    assert disk.full, "the fault never fired"

    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "No space left on device" in err[0], err
    records = list(read_records(ledger))  # raises on a partial line
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else None
    if target == "ledger.jsonl":  # the run finished: its directory keeps the line for `muonlab ledger recover`
        assert records == [] and ledger.read_bytes() == b""
        assert summary["status"] == "ok" and "could not append to the ledger" in summary["ledger_error"]
        kept = json.loads((run_dir / "ledger_line.json").read_text())
        assert kept["status"] == "ok" and kept["run_id"] == "full" and "muonlab ledger recover" in err[0]
    else:
        (rec,) = records
        assert rec["status"] == "failed" and "No space left on device" in rec["error"]
        assert summary is None if target == "summary.json" else summary["status"] == "failed"
    assert not list(run_dir.rglob(".*.tmp"))  # no half-written temp file left behind
    if target in ("model.pt", "model.safetensors"):  # trained and evaluated: its scores stand, its checkpoint
        assert not (run_dir / target).exists()           # finishes it
        (rec,) = records
        assert rec["resumable"] is True and Path(rec["checkpoint"]).is_file() and "--resume" in rec["error"]
        assert rec["metrics"]["val_bpb"] > 0 and rec["metrics"]["steps"] == 4
        assert main(["train", "--resume", str(run_dir)]) == 0
        done = list(read_records(ledger))
        assert [r["status"] for r in done] == ["failed", "ok"]
        assert done[1]["metrics"]["val_bpb"] == rec["metrics"]["val_bpb"]  # bit for bit
        assert (run_dir / "model.pt").is_file() and (run_dir / "model.safetensors").is_file()
        assert main(["train", "--resume", str(run_dir)]) == 2  # finished now: nothing to resume
        assert "nothing to resume" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == ([0, 1] if target == "metrics.jsonl" else [0, 1, 2, 3])  # whole lines only
