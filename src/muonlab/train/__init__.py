"""Training: the loop, schedules, checkpoints, one run end to end. It writes the run record
(`muonlab.record`) and never reads the lab above it.

`run_training` and `RunResult` are imported on first use: importing the package loads no loop
(the command line's --help imports no torch).
"""

__all__ = ["RunResult", "run_training"]


def __getattr__(name):
    if name in __all__:
        from muonlab.train import run  # noqa: PLC0415

        return getattr(run, name)
    raise AttributeError(f"module 'muonlab.train' has no attribute {name!r}")
