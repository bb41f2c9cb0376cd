"""Bookkeeping settings of a run: where its records go and how much is printed.

None of these can change a number, so the section is never hashed (HASHED = False): two runs that
differ only here are the same arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from muonlab.settings import COUNT, NON_NEGATIVE, POSITIVE_COUNT, Section, comma_items, setting


@dataclass
class RecordConfig(Section):
    HASHED: ClassVar[bool] = False

    run_name: str | None = setting(None, "run directory name (default: arm-seed-time-hash)")
    runs_dir: str | None = setting(None, "where run directories go (default: <cache>/runs)")
    ledger: str | None = setting(None, "the ledger file (default: <runs_dir>/ledger.jsonl)")
    log_every: int = setting(1, "print a progress line every N steps", range=POSITIVE_COUNT)
    quiet: bool = setting(False, "print nothing while training")
    checkpoint_every: int = setting(0, "full checkpoint every N steps (0: only at the end and on SIGINT/SIGTERM)",
                                    range=COUNT)
    checkpoint_minutes: float = setting(0.0, "also a full checkpoint after the first step ending N minutes of wall "
                                        "time after the last (0: off); a preempted run loses at most that much",
                                        range=NON_NEGATIVE)
    checkpoint_keep: int = setting(2, "newest checkpoints kept (the previous one survives a failed write)",
                                   range=POSITIVE_COUNT)
    sinks: str = setting("", "optional metric sinks, comma-separated: wandb, tensorboard")
    sink_project: str = setting("muonlab", "project name for the metric sinks")
    trajectory_steps: str = setting("0,10,20,40,80", "steps whose metrics also hold the residual scalars "
                                    "(seed 000 Table 4B), comma-separated")
    plugins: str = setting("", "comma-separated plug-in modules or .py paths imported before the run "
                           "(they register methods; the methods' names are in the hashed settings)", flag="plugin")

    def trajectory_step_set(self) -> set[int]:
        return set(comma_items(self.trajectory_steps, "trajectory_steps", int))

    def validate(self) -> None:
        self.trajectory_step_set()
        comma_items(self.plugins, "plugins (--plugin)")
        from muonlab.record.sinks import parse_sinks  # noqa: PLC0415

        parse_sinks(self.sinks)
