"""Ctrl-C to a sweep: its run is recorded `interrupted`, and the same sweep again resumes it from
its checkpoint to the bitwise weights of an uninterrupted run. Also the pieces on their own: the
sweep, whose runs have sessions of their own, forwards each Ctrl-C it gets once to every live run,
picks interrupted runs up again, and a Ctrl-C while a run writes its outcome waits for the ledger
line."""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from muonlab.cli import main
from muonlab.lab.report import build_report
from muonlab.record.ledger import read_records

STEPS = "24"  # the signal lands after the first checkpoint (step 2), well before the end
SWEEP = ["sweep", "--preset", "cpu-tiny", "--device", "cpu", "--arms", "baseline", "--seeds", "1",
         "--num-steps", STEPS, "--checkpoint-every", "2"]


def state_hash(weights: Path) -> str:
    state = torch.load(weights, weights_only=True)
    sha = hashlib.sha256()
    for name in sorted(state):
        sha.update(name.encode())
        sha.update(state[name].contiguous().numpy().tobytes())
    return sha.hexdigest()


@pytest.fixture
def terminal_ctrl_c(monkeypatch):
    """SIGINT as a terminal's process has it (Python's KeyboardInterrupt), whatever disposition the
    test worker inherited: a worker that ignores SIGINT would pass SIG_IGN on to every child, and
    these tests are about muonlab's handling of a Ctrl-C, not the worker's."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _default_sigint() -> None:  # in the child, before exec: SIGINT back to the default disposition
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_first_checkpoint(runs: Path, proc: subprocess.Popen, timeout: float = 180) -> Path:
    """Poll the runs directory until a checkpoint's sidecar (written last) exists."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        found = sorted(runs.glob("baseline-s1-*/checkpoints/step-*.json"))
        if found:
            return found[0]
        time.sleep(0.02)
    out = proc.communicate(timeout=30)[0] if proc.poll() is not None else ""
    raise AssertionError(f"no checkpoint appeared (sweep exit {proc.poll()}): {out}")


def test_interrupted_sweep_is_recorded_interrupted_and_resumes_bitwise(tmp_path, one_thread, capsys):
    runs = tmp_path / "cache" / "runs"  # MUONLAB_CACHE (conftest), inherited by the processes
    # its own process group, as a terminal's foreground job: the terminal's Ctrl-C goes to the whole
    # group, which holds the sweep only (its runs have sessions of their own); the sweep forwards it
    proc = subprocess.Popen([sys.executable, "-m", "muonlab", *SWEEP], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=_default_sigint)
    try:
        first = wait_for_first_checkpoint(runs, proc)
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:  # the test failed: the sweep stops its run, then nothing is left running
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=90)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out

    (rec,) = read_records(runs / "ledger.jsonl")  # one whole line
    assert rec["status"] == "interrupted" and rec["resumable"], rec
    run_dir = Path(rec["run_dir"])
    assert first.parent.parent == run_dir
    interrupted_at = int(Path(rec["checkpoint"]).stem.split("-")[1])
    assert 0 < interrupted_at < int(STEPS)
    # stopped after a finished step and checkpointed there (one signal), not cut short by a second
    assert rec["error"] == f"interrupted after step {interrupted_at} (SIGINT)"  # forwarded by the sweep

    capsys.readouterr()
    assert main(SWEEP) == 0  # the same sweep again (its runs are still child processes)
    assert f"resume baseline-s1: interrupted run {run_dir.name}" in capsys.readouterr().out
    interrupted, resumed = read_records(runs / "ledger.jsonl")
    assert resumed["status"] == "ok" and resumed["run_dir"] == str(run_dir)  # continued, not rerun
    assert resumed["resumed_from_step"] == interrupted_at > 0
    report = build_report(runs / "ledger.jsonl")
    assert report["counts"]["interrupted"] == 1 and report["failed_runs"] == []  # it was continued

    # the same config, uninterrupted, in a runs directory of its own
    reference_runs = tmp_path / "reference"
    assert main(["train", "--preset", "cpu-tiny", "--device", "cpu", "--seed", "1", "--num-steps", STEPS,
                 "--quiet", "--runs-dir", str(reference_runs), "--run-name", "reference"]) == 0
    (reference,) = read_records(reference_runs / "ledger.jsonl")
    assert reference["config_hash"] == resumed["config_hash"]
    assert state_hash(run_dir / "model.pt") == state_hash(reference_runs / "reference" / "model.pt")
    assert resumed["metrics"]["val_bpb"] == reference["metrics"]["val_bpb"]


class FakeRun:
    """A run process that stops by itself within `stops_after` waits (None: only when signalled)."""

    def __init__(self, stops_after: int | None, finished: bool = False):
        self.stops_after, self.finished, self.waits, self.signals, self.killed = stops_after, finished, 0, [], False

    def poll(self):
        return 0 if self.finished else None

    def wait(self, timeout=None):
        self.waits += 1
        if self.stops_after is not None and self.waits >= self.stops_after:
            self.finished = True
            return 130
        raise subprocess.TimeoutExpired("run", timeout)

    def send_signal(self, sig):
        self.signals.append(sig)
        self.stops_after = self.waits + 1  # asked itself: stops after its step

    def kill(self):
        self.killed, self.stops_after = True, self.waits + 1


def test_stop_runs_forwards_the_ctrl_c_once_to_each_live_run(monkeypatch):
    import muonlab.lab.executors as executors

    monkeypatch.setattr(executors, "STOP_LIMIT_S", 0)
    running, done, stuck = FakeRun(None), FakeRun(None, finished=True), FakeRun(None)
    stuck.send_signal = lambda sig: stuck.signals.append(sig)  # ignores the request
    executors.stop_runs([running, done, stuck], log=lambda _: None)
    # one SIGINT asks for a stop after the step; a second would stop the run at once, unrecorded
    # at the step it finishes. Runs do not share the terminal's group, so this one is their only one.
    assert running.signals == [signal.SIGINT] and not running.killed
    assert done.signals == [] and not done.killed
    assert stuck.signals == [signal.SIGINT] and stuck.killed  # killed after the limit


def test_a_second_ctrl_c_while_the_sweep_waits_is_forwarded_once_too(monkeypatch):
    import muonlab.lab.executors as executors

    monkeypatch.setattr(executors, "STOP_LIMIT_S", 0)
    first, second = FakeRun(None), FakeRun(None)
    interrupted = []
    real_wait = first.wait

    def wait_hit_by_ctrl_c(timeout=None):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt  # the user presses Ctrl-C again while the sweep waits
        return real_wait(timeout)

    first.wait = wait_hit_by_ctrl_c
    try:
        executors.stop_runs([first, second], log=lambda _: None)
    except KeyboardInterrupt:  # (uncaught, it would end the test session)
        pytest.fail("the second Ctrl-C escaped stop_runs: the runs were left running, unsignalled")
    assert first.signals == second.signals == [signal.SIGINT, signal.SIGINT]
    assert not first.killed and not second.killed


def test_select_continues_interrupted_runs_and_leaves_failed_ones(tmp_path):
    from muonlab.lab.sweep import plan_sweep, select

    jobs = plan_sweep(["baseline"], [1, 2, 3, 4], "cpu-tiny")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    statuses = [dict(status="interrupted", resumable=True), dict(status="interrupted", resumable=False),
                dict(status="failed", interrupted=True, resumable=True),  # written before `interrupted`
                dict(status="failed")]
    latest = {job.key: dict(rec, run_dir=str(run_dir)) for job, rec in zip(jobs, statuses)}
    to_run, skipped = select(jobs, latest, retry_failed=False)
    assert [(j.seed, j.resume_dir) for j in to_run] == [(1, str(run_dir)), (2, None), (3, str(run_dir))]
    assert [(o.job.seed, o.action) for o in skipped] == [(4, "skipped-failed")]


def test_ctrl_c_while_the_outcome_is_written_waits_for_the_ledger_line(tmp_path, monkeypatch, capsys, one_thread,
                                                                      terminal_ctrl_c):
    import muonlab.record.ledger as ledger

    real_append = ledger.append_record

    def append_after_ctrl_c(path, record):
        os.kill(os.getpid(), signal.SIGINT)  # arrives as the run writes its record
        return real_append(path, record)

    monkeypatch.setattr(ledger, "append_record", append_after_ctrl_c)
    assert main(["train", "--preset", "cpu-tiny", "--device", "cpu", "--num-steps", "2", "--quiet"]) == 130
    (rec,) = read_records(tmp_path / "cache" / "runs" / "ledger.jsonl")  # written first, then the interrupt
    assert rec["status"] == "ok"
