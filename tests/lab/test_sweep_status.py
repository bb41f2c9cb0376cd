"""Where a detached sweep stands, from its ledger, its submission record and SLURM's queue: here
with a stand-in `squeue` on PATH that lists given jobs (the real SLURM runs in
tests/lab/test_slurm_cluster.py); and `report` and `paper` saying which runs are still out."""

import json
import os
import time
from pathlib import Path

import pytest

from muonlab.cli import main
from muonlab.lab.submissions import Submission, record_submissions, submissions_path
from muonlab.lab.sweep import latest_records
from muonlab.lab.sweep_status import format_status, sweep_status, unfinished_runs
from muonlab.record.ledger import append_line

STAMP = "%Y-%m-%dT%H:%M:%S%z"


@pytest.fixture
def queue(tmp_path, monkeypatch):
    """`queue({job_id: state})`: what the stand-in squeue lists from now on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    listing = tmp_path / "squeue.out"
    listing.write_text("")
    script = bin_dir / "squeue"
    script.write_text(f"#!/bin/sh\ncat '{listing}'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def set_queue(jobs: dict[str, str]) -> None:
        listing.write_text("".join(f"{job}|{state}\n" for job, state in jobs.items()))

    return set_queue


def submit(ledger: Path, arm: str, seed: int, job_id: str, run_dir: Path, at: float, steps: int = 10) -> Submission:
    sub = Submission(arm, seed, f"hash-{arm}", job_id, str(run_dir), at, steps)
    record_submissions(ledger, [sub])
    return sub


def record(ledger: Path, arm: str, seed: int, status: str, at: float, **extra) -> None:
    append_line(ledger, dict(arm=arm, seed=seed, config_hash=f"hash-{arm}", status=status,
                             finished_at=time.strftime(STAMP, time.localtime(at)), **extra))


def test_each_run_is_queued_running_done_failed_interrupted_or_missing(tmp_path, queue):
    ledger = tmp_path / "runs" / "ledger.jsonl"
    ledger.parent.mkdir()
    t0 = time.time() - 100
    running_dir = tmp_path / "runs" / "b-s2"
    running_dir.mkdir()
    # three steps of 2 s each done out of 10: 7 x 2 s to go
    (running_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0 - s, "dt": 2.0}) + "\n"
                                                       for s in range(3)))
    for seed, job in ((1, "7_0"), (2, "7_1"), (3, "7_2"), (4, "7_3"), (5, "7_4")):
        submit(ledger, "b", seed, job, tmp_path / "runs" / f"b-s{seed}", t0)
    record(ledger, "b", 1, "ok", t0 + 50, metrics={"val_bpb": 1.234567})
    record(ledger, "b", 4, "failed", t0 + 50, error="diverged at step 3")
    record(ledger, "b", 5, "interrupted", t0 + 50, resumable=True)  # then requeued: in the queue again
    queue({"7_1": "RUNNING", "7_4": "PENDING", "99_0": "RUNNING"})  # 7_2 left the queue without a line
    planned = [("b", seed, "hash-b", 10) for seed in range(1, 7)]
    states = {s.seed: s for s in sweep_status(ledger, latest_records(ledger, print), planned)}
    assert {seed: s.state for seed, s in states.items()} == {
        1: "done", 2: "running", 3: "interrupted", 4: "failed", 5: "queued", 6: "missing"}
    assert states[1].detail == "val_bpb 1.234567" and states[4].detail == "diverged at step 3"
    assert states[2].detail == "step 3/10, loss 3.0000, ETA 0m14s"
    assert "left the queue without a ledger line" in states[3].detail and states[5].detail == "job 7_4 pending"
    text = format_status(list(states.values()))
    assert text.splitlines()[-1] == "6 run(s): 1 missing, 1 queued, 1 running, 1 done, 1 failed, 1 interrupted"


def test_a_line_older_than_the_submission_does_not_answer_it(tmp_path, queue):
    ledger = tmp_path / "ledger.jsonl"
    t0 = time.time()
    record(ledger, "b", 1, "failed", t0 - 3600, error="old")  # then submitted again with --retry-failed
    submit(ledger, "b", 1, "8_0", tmp_path / "b-s1", t0)
    queue({"8_0": "RUNNING"})
    (state,) = sweep_status(ledger, latest_records(ledger, print), [("b", 1, "hash-b", 10)])
    assert state.state == "running" and state.detail == "starting"
    queue({})
    (state,) = sweep_status(ledger, latest_records(ledger, print), [("b", 1, "hash-b", 10)])
    assert state.state == "interrupted"  # gone from the queue, and the failure it shows predates it


def test_without_squeue_a_submitted_run_is_submitted_with_the_reason(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.jsonl"
    submit(ledger, "b", 1, "9_0", tmp_path / "b-s1", time.time())
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (out,) = unfinished_runs(ledger, {})
    assert out["state"] == "submitted" and "squeue is not on PATH" in out["detail"]
    with pytest.raises(Exception, match="squeue is not on PATH"):  # --status refuses to guess
        sweep_status(ledger, {}, None)


def test_report_and_paper_say_what_is_still_out(tmp_path, queue, capsys, one_thread):
    runs = tmp_path / "runs"
    ledger = runs / "ledger.jsonl"
    submit(ledger, "baseline", 2, "5_1", runs / "baseline-s2", time.time() - 5)
    queue({"5_1": "PENDING"})
    # nothing finished yet: the report says what is on its way, and exits 1
    assert main(["report", "--ledger", str(ledger)]) == 1
    assert "no run has finished yet: 1 submitted run(s) are still out" in capsys.readouterr().err
    assert main(["train", "--preset", "cpu-tiny", "--device", "cpu", "--seed", "1", "--num-steps", "2", "--quiet",
                 "--runs-dir", str(runs), "--ledger", str(ledger)]) == 0
    capsys.readouterr()
    assert main(["report", "--ledger", str(ledger), "--out", str(tmp_path / "report")]) == 0
    text = capsys.readouterr().out
    assert "still out (1 submitted run(s) without a final record" in text and "baseline@2 queued (job 5_1 pending)" in text
    assert "## Still out" in (tmp_path / "report" / "report.md").read_text()
    assert json.loads((tmp_path / "report" / "report.json").read_text())["unfinished"][0]["job_id"] == "5_1"
    assert main(["paper", "000-t3", "--preset", "cpu-tiny", "--ledger", str(ledger)]) == 0
    assert "baseline@2 queued" in capsys.readouterr().out
    queue({})  # the job left the queue without a line: still out, as interrupted
    assert main(["report", "--ledger", str(ledger)]) == 0
    assert "baseline@2 interrupted" in capsys.readouterr().out
    submissions_path(ledger).unlink()  # a ledger no detached sweep wrote to says nothing of the kind
    assert main(["report", "--ledger", str(ledger)]) == 0
    assert "still out" not in capsys.readouterr().out


def test_a_ledger_stamp_is_read_with_its_utc_offset():
    """A compute node may write finished_at in another time zone than the login node reads it in."""
    from muonlab.lab.submissions import record_time

    assert record_time({"finished_at": "2026-12-04T10:00:00+0500"}) == 1796360400.0  # 05:00 UTC
    assert record_time({"finished_at": "2026-12-04T05:00:00+0000"}) == 1796360400.0
    assert record_time({}) == 0.0
