"""A CPU sweep's runs fork from a server that imported torch and muonlab once (muonlab.lab.warm_start):
the runs are those a new interpreter each would make, bit for bit, and each child has its own session,
environment, log, thread share and exit status."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from muonlab.cli import main
from muonlab.lab import warm_start
from muonlab.lab.run_exits import RunExits
from muonlab.record.ledger import read_records

pytestmark = pytest.mark.skipif(not warm_start.available(), reason="no forkserver on this platform")


def test_a_warm_child_has_its_own_session_environment_log_threads_and_exit_status(tmp_path):
    from support.warm_child import report

    env = dict(os.environ, OMP_NUM_THREADS="1", WARM_CHILD_VAR="mine")
    log = tmp_path / "run.log"
    run = warm_start.WarmRun(["3"], env, str(log), target=report)
    exits = RunExits()  # as the sweep watches it: the server's child's sentinel wakes the wait when it ends
    exits.watch(run)
    try:
        assert exits.wait(120) is True
    finally:
        exits.close()
    assert run.wait(timeout=120) == 3 and run.poll() == 3 and run.returncode == 3
    assert log.read_text().strip() == "threads=1 own_session=True var=mine argv=['3']"
    env["OMP_NUM_THREADS"] = "2"
    run = warm_start.WarmRun(["0"], env, str(log), target=report)
    assert run.wait(timeout=120) == 0
    assert log.read_text().splitlines()[-1].startswith("threads=2 ")  # appended: the sweep opened the log


def test_a_warm_childs_output_is_buffered_as_a_new_interpreters(tmp_path):
    """As `python -m muonlab` writing to a file: stdout in blocks, or each line as printed under PYTHONUNBUFFERED
    (support/warm_run.py reads a run's lines as they come), whatever the environment the server started in."""
    from support.warm_child import prints_a_line

    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for name, env, written in (("unbuffered", {**buffered, "PYTHONUNBUFFERED": "1"}, len("ready\n")),
                               ("buffered", buffered, 0)):
        log = tmp_path / f"{name}.log"
        run = warm_start.WarmRun([], env, str(log), target=prints_a_line)
        assert run.wait(timeout=120) == 0
        assert log.read_text() == f"ready\nwritten={written}\n"


COSTS = {"total_seconds", "training_seconds", "tokens_per_second", "mfu_percent", "peak_memory_mb"}


def _sweep(where: Path, capsys, monkeypatch, warm: bool):
    monkeypatch.setenv("MUONLAB_CACHE", str(where))
    started = []

    class Counted(warm_start.WarmRun):
        def __init__(self, *args, **kwargs):
            started.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(warm_start, "WarmRun", Counted)
    monkeypatch.setattr(warm_start, "available", lambda: warm)  # not warm: `python -m muonlab train` each
    assert main(["sweep", "--preset", "cpu-tiny", "--num-steps", "4", "--arms", "baseline",
                 "--seeds", "1", "--json"]) == 0
    assert {r["status"] for r in json.loads(capsys.readouterr().out)["runs"]} == {"ok"}
    records = {r["arm"]: r for r in read_records(where / "runs" / "ledger.jsonl")}
    curves = {arm: [json.loads(line)["loss"] for line in (Path(r["run_dir"]) / "metrics.jsonl").read_text().splitlines()
                    if "loss" in json.loads(line)] for arm, r in records.items()}
    return started, records, curves


def test_a_warm_run_is_the_run_a_new_interpreter_makes(tmp_path, capsys, monkeypatch):
    started, warm, warm_curves = _sweep(tmp_path / "warm", capsys, monkeypatch, warm=True)
    assert len(started) == 1  # the run forked from the server
    started, fresh, fresh_curves = _sweep(tmp_path / "fresh", capsys, monkeypatch, warm=False)
    assert started == []
    assert warm_curves == fresh_curves and all(len(c) == 4 for c in warm_curves.values())
    for arm in ("baseline",):
        w, f = warm[arm]["metrics"], fresh[arm]["metrics"]
        assert set(w) == set(f) and {k for k in w if w[k] != f[k]} <= COSTS, arm  # only what the machine measured
        assert w["val_bpb"] == f["val_bpb"]
        assert warm[arm]["config_hash"] == fresh[arm]["config_hash"]


def test_a_warm_run_imports_nothing_the_server_did_not_and_inherits_its_objects_frozen(tmp_path):
    """In a fresh interpreter (a test process's fork server may have been started with another preload): a CPU run
    forked from the sweep's server imports no module of muonlab and no installed package the server had not
    imported, and the server froze its objects out of the garbage collector (muonlab.cli.warm_server)."""
    log = tmp_path / "run.log"
    argv = ["train", "--preset", "cpu-tiny", "--num-steps", "2", "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    code = ("import os\n"
            "from muonlab.lab import warm_start\n"
            "from support.warm_child import imports_of_a_run\n"
            "if __name__ == '__main__':\n"
            "    from muonlab.cli import main\n"
            "    assert main(['prepare', '--preset', 'cpu-tiny']) == 0  # a sweep's data is made before its runs\n"
            f"    run = warm_start.WarmRun({argv!r}, dict(os.environ), {str(log)!r}, target=imports_of_a_run)\n"
            "    raise SystemExit(run.wait(timeout=300))\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", MUONLAB_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    script = tmp_path / "warm_run.py"  # a file, not -c: the fork server's children re-import the main module
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + (log.read_text()[-2000:] if log.exists() else "")
    lines = log.read_text().splitlines()
    report = dict(line.split("=", 1) for line in lines if line.startswith(("frozen=", "imported=")))
    assert report["imported"] == "", f"a warm run imported what the server had not: {report['imported']}"
    assert int(report["frozen"]) > 100_000, report  # torch's and muonlab's objects: ~290,000
