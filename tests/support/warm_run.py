"""`muonlab ARGV` in a process of its own that a test can signal, forked from muonlab's warm server
(muonlab.lab.warm_start: the process a sweep's CPU runs start from) instead of a new interpreter: the same
`python -m muonlab` code path (tests/lab/test_warm_start.py), without the ~2.5 s of a core a new interpreter
pays to import torch. Its stdout and stderr go to one log, written line by line (PYTHONUNBUFFERED)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from support.slurm import wait_for

from muonlab.lab import warm_start


class WarmMuonlab:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.process = warm_start.WarmRun(list(argv), {**env, "PYTHONUNBUFFERED": "1"}, str(log))

    def output(self) -> str:
        return self.log.read_text() if self.log.is_file() else ""

    def signal_state(self) -> str:
        """The run's signals as its kernel entry holds them (pending, blocked, ignored, caught), for a failure's
        message: whether a signal sent was held, ignored or taken by a handler."""
        try:
            lines = Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
        except OSError:
            return "(no /proc entry)"
        return " ".join(line.replace("\t", "") for line in lines if line.startswith(("SigPnd", "ShdPnd", "SigBlk",
                                                                                       "SigIgn", "SigCgt")))

    def wait_until(self, what: str, predicate: Callable[[], object], timeout_s: float = 300,
                   every_s: float = 0.01) -> None:
        """Until `predicate()` holds; fails if the run ends first (or after `timeout_s`)."""
        wait_for(what, lambda: predicate() or self.process.poll() is not None, timeout_s, every_s)
        assert predicate(), f"the run ended (exit {self.process.poll()}) before {what}"

    def wait_for_line(self, marker: str) -> None:
        """Until a line of the output holds `marker`."""
        self.wait_until(f"a line holding {marker!r}", lambda: marker in self.output())

    def __enter__(self) -> "WarmMuonlab":
        return self

    def __exit__(self, *exc) -> None:
        self.process.kill()  # nothing left running if the test failed
        self.process.wait(timeout=60)
