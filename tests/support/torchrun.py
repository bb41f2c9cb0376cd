"""`muonlab` on CPU in a new interpreter, or on N gloo ranks under torchrun, and the check that a multi-rank run
ended cleanly.

Every two-rank `muonlab train` of the suite goes through `ended_cleanly`: rank 1 of a 2-process gloo run once
aborted at exit ("terminate called without an active exception", -6) in the teardown of the interpreter, so each
such run is one more try at that abort (tests/train/test_distributed_train.py lists them)."""

from __future__ import annotations

import subprocess
import sys

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone")
ABORT = "terminate called"  # what libstdc++ prints when a thread is torn down inside C++ code


def run_muonlab(argv: list[str], env: dict[str, str], nproc: int | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m muonlab ARGV`, or `torchrun --nproc_per_node NPROC -m muonlab ARGV` when nproc is given."""
    launcher = [*TORCHRUN, "--nproc_per_node", str(nproc)] if nproc else [sys.executable]
    return subprocess.run([*launcher, "-m", "muonlab", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout)


def ended_cleanly(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Fails unless every rank ended 0 with no abort at teardown (the ranks' own lines come before torchrun's
    summary of a failure: they say which rank aborted and where)."""
    assert done.returncode == 0 and ABORT not in done.stderr, (done.returncode, done.stderr[-4000:])
    return done
