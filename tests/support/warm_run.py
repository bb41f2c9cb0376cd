"""`muonlab ARGV` in a process of its own that a test can signal, forked from muonlab's warm server
(muonlab.lab.warm_start: the process a sweep's CPU runs start from) instead of a new interpreter: the same
`python -m muonlab` code path (tests/lab/test_warm_start.py), without the ~2.5 s of a core a new interpreter
pays to import torch. Its stdout and stderr go to one log, written line by line (PYTHONUNBUFFERED)."""

from __future__ import annotations

import time
from pathlib import Path

from muonlab.lab import warm_start


class WarmMuonlab:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.process = warm_start.WarmRun(list(argv), {**env, "PYTHONUNBUFFERED": "1"}, str(log))

    def output(self) -> str:
        return self.log.read_text() if self.log.is_file() else ""

    def wait_for_line(self, marker: str) -> None:
        """Until a line of the output holds `marker`; fails if the run ends without one."""
        while marker not in self.output():
            assert self.process.poll() is None, f"the run ended (exit {self.process.poll()}) without {marker!r}"
            time.sleep(0.01)

    def __enter__(self) -> "WarmMuonlab":
        return self

    def __exit__(self, *exc) -> None:
        self.process.kill()  # nothing left running if the test failed
        self.process.wait(timeout=60)
