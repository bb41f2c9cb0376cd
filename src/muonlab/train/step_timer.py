"""Where a training step's time goes: forward + backward, the optimizer, the rest (the loss read, the schedule,
the step's bookkeeping), beside the time it waited for data.

On CUDA the marks are CUDA events, read after the step's closing synchronisation, so each phase is the
device's time between two marks, not the host's time to launch it; elsewhere they are host clock readings.
Either way the phases follow each other from the step's start to its end, so they add up to the step.
Nothing here synchronises the device: the events are read after the loop's own synchronisation.
"""

from __future__ import annotations

import time

import torch


class StepTimer:
    """mark(name) at the end of each phase; phases() after the step has synchronised."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [("start", self._now())]

    def mark(self, name: str) -> None:
        self.marks.append((name, self._now()))

    def phases(self) -> dict[str, float]:
        """{phase: seconds} between consecutive marks (the device has synchronised since the last)."""
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) / 1000.0 if self.cuda else b - a
        return out
