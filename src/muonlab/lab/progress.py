"""What a local sweep says as its runs go: each run's start and end as "k of N", the sweep's elapsed
time and an ETA from the finished runs' mean duration, and a one-line live status of the runs in
flight (their step, loss and ETA, read from their metrics.jsonl) every `every_s` seconds: rewritten
in place on a terminal, a plain line otherwise."""

from __future__ import annotations

import sys
import time
from typing import Callable

from muonlab.lab.sweep_status import eta_text, running_detail


class SweepProgress:
    def __init__(self, total: int, slots: int, log: Callable[[str], None], every_s: float = 30.0,
                 interactive: bool | None = None, clock: Callable[[], float] = time.monotonic):
        self.total, self.slots, self.log, self.every_s, self.clock = total, max(1, slots), log, every_s, clock
        self.interactive = sys.stdout.isatty() if interactive is None else interactive
        self.began = clock()
        self.started: dict[str, tuple[int, float]] = {}  # run name -> (k, start time)
        self.durations: list[float] = []
        self.finished: set[str] = set()
        self.last_live = clock()
        self._live_shown = False

    def start(self, name: str, where: str) -> None:
        self.started[name] = (len(self.started) + 1, self.clock())
        self._say(f"start {self._k(name)} {name} on {where}")

    def done(self, name: str, returncode: int) -> None:
        k, began = self.started[name]
        took = self.clock() - began
        self.durations.append(took)
        self.finished.add(name)
        finished = len(self.durations)
        outcome = "ok" if returncode == 0 else f"exit {returncode}"
        eta = "" if finished == self.total else f", ETA {eta_text(self.eta_s())}"
        self._say(f"done  {self._k(name)} {name}: {outcome} in {eta_text(took)}; {finished} of {self.total} "
                  f"finished, elapsed {eta_text(self.clock() - self.began)}{eta}")

    def eta_s(self) -> float:
        """The runs not finished, at the finished runs' mean duration, `slots` at a time."""
        mean = sum(self.durations) / len(self.durations)
        left = self.total - len(self.durations)
        underway = sum(min(self.clock() - t, mean) for n, (_, t) in self.started.items() if n not in self.finished)
        return max(0.0, (left * mean - underway) / self.slots)

    def live(self, running: list[tuple[str, str, int | None]]) -> None:
        """(run name, run directory, steps) of the runs in flight, shown at most every `every_s`."""
        now = self.clock()
        if not running or now - self.last_live < self.every_s:
            return
        self.last_live = now
        parts = [f"{name} {running_detail(run_dir, steps)}" for name, run_dir, steps in running]
        line = f"running {len(running)}: " + " | ".join(parts)
        if self.interactive:
            print("\r" + line[:160].ljust(160), end="", flush=True)
            self._live_shown = True
        else:
            self.log(line)

    def _k(self, name: str) -> str:
        return f"[{self.started[name][0]} of {self.total}]"

    def _say(self, line: str) -> None:
        if self._live_shown:  # end the live line before a line of its own
            print(flush=True)
            self._live_shown = False
        self.log(line)
