"""Start a sweep's CPU runs from a warm process instead of a new interpreter each.

`python -m muonlab train` pays for an interpreter and the import of torch and muonlab before its first
step: about three seconds of a laptop core, longer than a whole miniature run. A fork server (the standard
library's `forkserver` start method) imports them once per sweep process; each run is then a fork of it
that sets its own environment, output and session and runs `muonlab` as `python -m muonlab` does.
The server never touches a GPU (forking after CUDA initialised is unsafe), so only runs without a GPU
start warm; GPU and torchrun runs keep their own interpreter. The runs are the same runs: same code path,
same thread count (set in the child, as OMP_NUM_THREADS would at import), same records
(tests/lab/test_warm_start.py compares a warm run with a fresh one bit for bit).
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys

# what the server imports once: torch, torch._dynamo, which every run imports even with nothing compiled (the
# model's construction on the meta device: nn.init's normal_ on meta goes through a torch._refs decomposition; and
# torch's Optimizer, whose add_param_group torch wraps in _disable_dynamo), and muonlab.cli.warm_server: the modules
# a `muonlab train` imports (not the plug-ins: each run loads its own), then the server's objects frozen out of the
# garbage collector (a miniature run forked from it: 2.0 -> 1.7 s; from a new interpreter, ~3 s more)
PRELOAD = ["torch", "torch._dynamo", "muonlab.cli.warm_server"]


def available() -> bool:
    """Whether this platform can fork from a server (not Windows)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _train(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """The child: the run's process as `python -m muonlab train` would be, then the command line's entry point."""
    enter_run(env, log_path)
    sys.argv = ["muonlab", *argv]
    try:  # exactly what `python -m muonlab` runs (its SystemExit is the child's exit status)
        runpy.run_module("muonlab", run_name="__main__", alter_sys=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def enter_run(env: dict[str, str], log_path: str) -> None:
    """In the forked child: a session of its own (the terminal's Ctrl-C reaches the sweep only), the run's
    environment (PYTHONUNBUFFERED included), its log as stdout and stderr (stdin empty), and its share of the
    cores."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    # the output's buffering as a new interpreter writing to a file has it (the server's came from its own start):
    # stdout in blocks, or each write as printed under PYTHONUNBUFFERED (`tail -f` of a run's log); stderr by line
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=unbuffered, write_through=unbuffered)
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
    import torch

    if env.get("OMP_NUM_THREADS", "").isdigit():  # read by torch at import, which the server did already
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    if "torch._inductor.config" in sys.modules and env.get("TORCHINDUCTOR_COMPILE_THREADS", "").isdigit():
        sys.modules["torch._inductor.config"].compile_threads = int(env["TORCHINDUCTOR_COMPILE_THREADS"])


class WarmRun:
    """A run forked from the server, with the calls the sweep makes of a `subprocess.Popen`."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: str, target=_train):
        self._process = _context().Process(target=target, args=(list(argv), dict(env), str(log_path)),
                                           name="muonlab-run")
        self._process.start()
        self.pid = self._process.pid
        self.sentinel = self._process.sentinel  # readable once the run has ended (lab/run_exits.py)
        self.args = argv

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
