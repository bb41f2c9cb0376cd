"""A read-only ledger is refused before a run trains (issue 32 item 4), on the file system's own
permission bits. Root may write any file (CAP_DAC_OVERRIDE): run as root, the command's process
gives that capability up before it starts (prctl PR_CAPBSET_DROP, then exec), so a file mode of
0444 binds it as it binds any user."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1  # <linux/prctl.h>, <linux/capability.h>


def _held_to_permission_bits() -> dict:
    """subprocess.run's keywords under which the child honours file modes (root: without DAC override)."""
    if os.geteuid() != 0:
        return {}
    if not sys.platform.startswith("linux"):
        pytest.skip("running as root off Linux: no way to give up the override of file permissions")
    libc = ctypes.CDLL(None, use_errno=True)

    def drop_override():
        if libc.prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE)")

    try:
        subprocess.run(["true"], preexec_fn=drop_override, check=True)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("running as root without CAP_SETPCAP: cannot give up the override of file permissions")
    return {"preexec_fn": drop_override}


def _train_one_step(tmp_path, runs, *extra: str, program=("-m", "muonlab")) -> subprocess.CompletedProcess:
    """`muonlab train --preset cpu-tiny --num-steps 1 --runs-dir RUNS` (or `program`'s), held to file modes."""
    return subprocess.run([sys.executable, *program, "train", "--preset", "cpu-tiny", "--num-steps", "1", *extra,
                           "--runs-dir", str(runs)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "MUONLAB_CACHE": str(tmp_path / "cache")}, **_held_to_permission_bits())


def test_a_read_only_ledger_is_refused_before_anything_runs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    ledger = runs / "ledger.jsonl"
    ledger.write_text("")
    ledger.chmod(0o444)
    before = sorted(tmp_path.rglob("*"))
    proc = _train_one_step(tmp_path, runs)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"the ledger {ledger} is not writable: nothing was run" in proc.stderr
    assert sorted(tmp_path.rglob("*")) == before  # no run directory, no corpus


def test_a_writable_ledger_in_a_read_only_folder_is_refused_for_its_lock(tmp_path):
    """The ledger's lock file is created beside it: a folder that refuses it would lose the line at the end."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "ledger.jsonl").write_text("")
    runs.chmod(0o555)
    try:
        proc = _train_one_step(tmp_path, runs)
    finally:
        runs.chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"cannot write the ledger's folder {runs}: nothing was run" in proc.stderr
    assert sorted(p.name for p in runs.iterdir()) == ["ledger.jsonl"]


def test_a_ledger_the_process_can_write_runs(tmp_path):
    """The same command on a writable ledger trains and appends (the refusal above is the mode's doing)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "ledger.jsonl").write_text("")
    proc = _train_one_step(tmp_path, runs, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert len((runs / "ledger.jsonl").read_text().splitlines()) == 1


# the check above passed, and the ledger turned read-only while the run trained
_LEDGER_TURNS_READ_ONLY = """
import os, sys
from muonlab.cli import main
from muonlab.record import ledger
ledger.check_writable = lambda path: None
os.chmod(sys.argv[1], 0o444)
sys.exit(main(sys.argv[2:]))
"""


def test_a_ledger_that_turns_read_only_keeps_the_finished_run_for_recover(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    ledger = runs / "ledger.jsonl"
    ledger.write_text("")
    proc = _train_one_step(tmp_path, runs, "--quiet", program=("-c", _LEDGER_TURNS_READ_ONLY, str(ledger)))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Permission denied" in proc.stderr and "muonlab ledger recover" in proc.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert (run_dir / "ledger_line.json").is_file()
    assert ledger.read_text() == ""
    ledger.chmod(0o644)
    recovered = subprocess.run([sys.executable, "-m", "muonlab", "ledger", "recover", str(runs)], capture_output=True,
                               text=True, env={**os.environ, "MUONLAB_CACHE": str(tmp_path / "cache")}, timeout=120)
    assert recovered.returncode == 0, recovered.stderr
    (line,) = ledger.read_text().splitlines()
    assert '"status":"ok"' in line and run_dir.name in line
