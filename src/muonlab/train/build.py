"""Build a run's model and optimizer: the run's model family decides how (muonlab.families)."""

from __future__ import annotations

from muonlab.config import RunConfig
from muonlab.device import Runtime
from muonlab.families import get_family


def build_model(cfg: RunConfig, vocab_size: int, runtime: Runtime):
    """The family's model, materialised on the runtime's device and initialised."""
    return get_family(cfg.family).build_model(cfg, vocab_size, runtime)


def build_optimizer(model, cfg: RunConfig, compile_step: bool, distributed: bool = False):
    """The family's optimizer; every group carries `initial_lr` for the schedule."""
    return get_family(cfg.family).build_optimizer(model, cfg, compile_step, distributed)


def model_config(cfg: RunConfig, vocab_size: int):
    """The autoresearch GPT's GPTConfig of a run (the model the upstream check is about)."""
    from muonlab.families.autoresearch import gpt_config  # noqa: PLC0415

    return gpt_config(cfg, vocab_size)
