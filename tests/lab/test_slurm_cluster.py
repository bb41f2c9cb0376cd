"""Sweeps on a real SLURM: a one-node cluster on this machine (tests/slurm/local_slurm.sh, which
`.ci/run` and these tests start; skipped with the reason where it cannot run).

Each scenario goes through the command line as a user would: a detached sweep and its --status; a
task requeued mid-run, one cancelled, and one warned of its time limit (SIGUSR2), each continuing
from its checkpoint to the weights of the same run uninterrupted; a 2-task gloo run started from
SLURM's environment, against the same run in one process. The commands run in the test's process
(`muonlab.cli.main`, the command line's entry point), one at a time, each with its own output; the three
interruptions play at once on threads (they wait on SLURM far more than they compute) and share one
uninterrupted reference run."""

import contextlib
import io
import json
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from support.slurm import go_on_once_pending, hold_past, release, squeue, start_local_slurm, steps_done, wait_for
from support.torchrun import ABORT

from muonlab.cli import main
from muonlab.record.ledger import read_records


# one command at a time in this process: its output is its own (a thread's print goes to the process's stdout)
ONE_COMMAND = threading.Lock()

STEPS = 30  # each interrupted run is held (SIGSTOP) from its 8th step until its signal is on its way
HELD_AT = 8


@pytest.fixture(scope="module")
def slurm_cluster():
    env = start_local_slurm()
    version = env.pop("_version")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():  # for the squeue and scontrol calls made here
            patch.setenv(name, value)
        patch.setenv("OMP_NUM_THREADS", "1")  # what the tasks inherit from the commands run here (sbatch exports it)
        yield version


class References:
    """The uninterrupted runs the scenarios compare against, each trained once for the module (the three
    interruption scenarios resume the same baseline-s1 config), each in one process: keyed by the config's
    protocol id, seed and arm, made by the first scenario that asks while the others wait for it."""

    def __init__(self):
        self.weights: dict[tuple, dict] = {}
        self.lock = threading.Lock()

    def get(self, config: Path, where: Path) -> dict:
        job = json.loads(config.read_text())["config"]
        key = (job["protocol"], job["seed"], job["arm"])
        with self.lock:
            if key not in self.weights:
                muonlab("train", "--config", str(config), "--runs-dir", str(where), "--ledger",
                        str(where / "ledger.jsonl"), "--run-name", "ref", "--quiet")
                self.weights[key] = torch.load(where / "ref" / "model.pt", weights_only=True)
            return self.weights[key]


@pytest.fixture(scope="module")
def references():
    return References()


def muonlab(*args, check=True) -> subprocess.CompletedProcess:
    """`muonlab ARGS` in this process, as the command line runs it; its tasks inherit this process's environment
    (sbatch exports it: OMP_NUM_THREADS=1, set by the slurm_cluster fixture)."""
    with ONE_COMMAND, contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(list(args))
    done = subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
    assert not check or code == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


class Lab:
    """`lab.sweep(*flags)`: `muonlab sweep` on the local SLURM, runs under `root`/runs."""

    def __init__(self, root: Path, references: References):
        self.root, self.references = root, references
        self.runs = root / "runs"
        self.ledger = self.runs / "ledger.jsonl"
        self.submitted = self.runs / "ledger.submitted.jsonl"

    def sweep(self, *flags, arms="baseline", seeds="1", steps=STEPS, check=True) -> subprocess.CompletedProcess:
        return muonlab("sweep", "--arms", arms, "--seeds", seeds, "--preset", "cpu-tiny", "--num-steps", str(steps),
                       "--runs-dir", str(self.runs), "--executor", "slurm", "--slurm", "cpus_per_task=1", *flags,
                       check=check)

    def status(self, *flags) -> dict:
        return {(r["arm"], r["seed"]): r for r in
                json.loads(muonlab("sweep", "--status", "--ledger", str(self.ledger), "--json", *flags)
                           .stdout)["runs"]}

    def records(self) -> list[dict]:
        return list(read_records(self.ledger)) if self.ledger.is_file() else []

    def submissions(self) -> list[dict]:
        return list(read_records(self.submitted)) if self.submitted.is_file() else []

    def reference_weights(self, name: str) -> dict:
        """The weights of the sweep's own job file run here in one process, uninterrupted (into a ledger of its
        own)."""
        config = sorted((self.runs / "sweeps").glob(f"*/{name}.json"))[0]  # the first sweep's (a re-run's is the same)
        return self.references.get(config, self.root / "reference")


@pytest.fixture
def lab(tmp_path, slurm_cluster, references):
    return Lab(tmp_path, references)


def same_weights(run_dir, reference: dict) -> bool:
    weights = torch.load(Path(run_dir) / "model.pt", weights_only=True)
    return weights.keys() == reference.keys() and all(torch.equal(weights[k], reference[k]) for k in reference)


def job_of(lab) -> tuple[str, Path]:
    (sub,) = lab.submissions()
    return sub["job_id"], Path(sub["run_dir"])


def test_a_detached_sweep_returns_at_once_and_its_runs_land_in_the_ledger(lab, slurm_cluster):
    out = lab.sweep("--detach", arms="baseline,adamw_only", seeds="1,2", steps=6)
    assert "submitted 4 task(s) as job array" in out.stdout and "detached" in out.stdout
    subs = lab.submissions()
    assert len(subs) == 4 and len({s["run_dir"] for s in subs}) == 4
    # the node runs two one-core tasks at a time: holding the array at once keeps two or more queued
    array = subs[0]["job_id"].split("_")[0]
    subprocess.run(["scontrol", "hold", array], capture_output=True)  # refused for tasks already started
    # the sweep returned before its runs ended: SLURM holds them, and --status says so
    early = lab.status()
    assert len(early) == 4 and {r["state"] for r in early.values()} <= {"queued", "running", "done"}
    held = sum(r["state"] == "queued" for r in early.values())
    assert held >= 2, early
    # started again while they are queued or running, the sweep submits no duplicate
    again = lab.sweep("--detach", arms="baseline,adamw_only", seeds="1,2", steps=6)
    assert "submitted" not in again.stdout and len(lab.submissions()) == 4
    assert again.stdout.count("skipped-queued") == held, again.stdout
    subprocess.run(["scontrol", "release", array], capture_output=True)  # non-zero too for tasks that ended
    wait_for("the array to leave the queue", lambda: all(squeue(s["job_id"]) is None for s in lab.submissions()))
    records = lab.records()
    assert sorted((r["arm"], r["seed"], r["status"]) for r in records) == sorted(
        (a, s, "ok") for a in ("baseline", "adamw_only") for s in (1, 2))
    assert all(r["state"] == "done" and "val_bpb" in r["detail"] for r in lab.status().values())
    rerun = lab.sweep("--detach", arms="baseline,adamw_only", seeds="1,2", steps=6)
    assert rerun.stdout.count("skipped-ok") == 4 and len(lab.submissions()) == 4
    print(f"SLURM: {slurm_cluster}")


def requeued_mid_run(lab):
    lab.sweep("--detach", "--checkpoint-every", "1000")  # no periodic checkpoint: the requeue's SIGTERM makes it
    job, run_dir = job_of(lab)
    hold_past(job, run_dir, HELD_AT)
    assert steps_done(run_dir) < STEPS
    subprocess.run(["scontrol", "requeue", job], check=True)  # SLURM's SIGCONT, then SIGTERM
    (stopped,) = wait_for("the interrupted record", lab.records)
    assert stopped["status"] == "interrupted" and stopped["resumable"] and "SIGTERM" in stopped["error"]
    assert lab.status()[("baseline", 1)]["state"] in ("queued", "running")  # requeued: not a duplicate to submit
    release(job)
    wait_for("the requeued task to finish", lambda: squeue(job) is None and len(lab.records()) == 2)
    _, resumed = lab.records()
    assert resumed["status"] == "ok" and resumed["run_dir"] == str(run_dir)
    assert HELD_AT <= resumed["resumed_from_step"] < STEPS
    assert same_weights(run_dir, lab.reference_weights("baseline-s1"))


def cancelled(lab):
    lab.sweep("--detach", "--checkpoint-every", "1000")
    job, run_dir = job_of(lab)
    hold_past(job, run_dir, HELD_AT)
    assert steps_done(run_dir) < STEPS
    subprocess.run(["scancel", job], check=True)  # SLURM's SIGCONT, then SIGTERM
    (stopped,) = wait_for("the interrupted record", lab.records)
    assert stopped["status"] == "interrupted" and stopped["resumable"]
    wait_for("the job to leave the queue", lambda: squeue(job) is None)
    assert lab.status()[("baseline", 1)]["state"] == "interrupted"
    out = lab.sweep()  # waits for its array this time
    assert "resume baseline-s1" in out.stdout
    _, resumed = lab.records()
    assert resumed["status"] == "ok" and resumed["run_dir"] == str(run_dir) and resumed["resumed_from_step"] >= HELD_AT
    assert same_weights(run_dir, lab.reference_weights("baseline-s1"))


def warned_of_its_time_limit(lab):
    """SIGUSR2 is what sbatch --signal (submitit's signal_delay_s) sends ahead of a time limit or a
    preemption: the run checkpoints after its step, records itself interrupted, and requeues."""
    lab.sweep("--detach", "--checkpoint-every", "1000")
    job, run_dir = job_of(lab)
    held = hold_past(job, run_dir, HELD_AT)
    assert steps_done(run_dir) < STEPS
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    go_on_once_pending(held, signal.SIGUSR2)
    (stopped,) = wait_for("the interrupted record", lab.records)
    assert stopped["status"] == "interrupted" and stopped["resumable"] and "SIGUSR2" in stopped["error"]
    release(job)  # requeued by the task itself
    wait_for("the requeued task to finish", lambda: squeue(job) is None and len(lab.records()) == 2)
    _, resumed = lab.records()
    assert resumed["status"] == "ok" and resumed["resumed_from_step"] == int(stopped["checkpoint"][-9:-3])
    assert same_weights(run_dir, lab.reference_weights("baseline-s1"))


SCENARIOS = {"requeued": requeued_mid_run, "cancelled": cancelled, "usr2": warned_of_its_time_limit}


@pytest.fixture(scope="module")
def interruptions(slurm_cluster, references, tmp_path_factory) -> dict[str, BaseException | None]:
    """The three interruption scenarios, each in a sweep folder of its own, played at once (each waits on its
    own job's states, so together they take about as long as the longest, not the sum): what each raised."""
    labs = {name: Lab(tmp_path_factory.mktemp(name), references) for name in SCENARIOS}

    def play(name):
        try:
            SCENARIOS[name](labs[name])
        except BaseException as exc:  # noqa: BLE001 - handed to the scenario's own test below
            for sub in labs[name].submissions():  # a run left held (SIGSTOP) would keep the node's core: SLURM's
                subprocess.run(["scancel", sub["job_id"]], capture_output=True)  # cancel sends SIGCONT first
            return exc
        return None

    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        return dict(zip(SCENARIOS, pool.map(play, SCENARIOS)))


def played(outcome: BaseException | None) -> None:
    if outcome is not None:
        raise outcome


def test_a_task_requeued_mid_run_resumes_to_the_uninterrupted_weights(interruptions):
    played(interruptions["requeued"])


def test_a_cancelled_task_is_recorded_interrupted_and_the_next_sweep_resumes_it(interruptions):
    played(interruptions["cancelled"])


def test_the_signal_before_the_time_limit_checkpoints_and_requeues_the_task(interruptions):
    played(interruptions["usr2"])


def test_a_two_task_gloo_run_starts_from_slurms_environment(lab):
    lab.sweep("--gpus-per-run", "2", steps=6)  # CPU runs: 2 tasks, no GPU asked for
    (rec,) = lab.records()
    assert (rec["status"], rec["world_size"], rec["process_group"]) == ("ok", 2, "gloo")
    errors = [p.read_text() for p in (lab.runs / "sweeps").glob("*/submitit/*_log.err")]
    assert len(errors) == 2 and not any(ABORT in e for e in errors)  # each task's stderr: no abort at teardown
    # the one-process run of the job's config: two ranks split the global batch exactly
    # (tests/train/test_distributed_train.py), so the weights are the same bit for bit
    assert same_weights(rec["run_dir"], lab.reference_weights("baseline-s1"))
