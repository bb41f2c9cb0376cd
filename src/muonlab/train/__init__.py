"""Training: model construction, the training loop, checkpoints. It writes the run record
(`muonlab.record`) and never reads the lab above it."""

from muonlab.train.run import RunResult, run_training

__all__ = ["RunResult", "run_training"]
