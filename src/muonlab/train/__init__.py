"""Training: model construction, the training loop, run directories."""

from muonlab.train.run import RunResult, run_training

__all__ = ["RunResult", "run_training"]
