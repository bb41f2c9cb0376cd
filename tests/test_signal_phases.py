"""SIGTERM at a phase before training (issue 32 item 3): while the corpus is still being built, a run stops
at once (Python takes the signal between operations), exits 130 with one line, and leaves the cache as it
found it: the half-built corpus folder, its lock included, is removed. No ledger line is written: the run
does not exist yet (its directory and record come after its data). Training, checkpoints and evaluation
record an interruption as `interrupted` (tests/test_checkpoint.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def test_sigterm_while_the_corpus_is_built_stops_and_leaves_nothing(tmp_path):
    env = {**os.environ, "MUONLAB_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "muonlab", "train", "--preset", "cpu-tiny", "--synthetic-bytes",
                             "200000000", "--num-steps", "2", "--runs-dir", str(tmp_path / "runs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        for line in proc.stdout:  # wait until the corpus is being built
            if line.startswith("data: building synthetic corpus"):
                break
        time.sleep(0.5)
        assert proc.poll() is None, "the corpus was built before the signal: give it more bytes"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted"
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert not (tmp_path / "runs").exists()
