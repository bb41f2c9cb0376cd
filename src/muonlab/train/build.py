"""Build a run's model and optimizer: the run's model family decides how (muonlab.families)."""

from __future__ import annotations

from muonlab.config import RunConfig, build_config
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


def gpt_config_with(settings: dict | None = None, **upstream):
    """A GPTConfig of upstream fields (`n_layer=4`, ...) and the variants that run-config settings named
    by their flags turn on (`qk_scale="pair_tied_stopexp"`, `oe_m=101`), resolved as a run resolves
    them (a setting that does not act, or a bad value, is a UsageError): a convenience for
    diagnostics, tests and scripts."""
    from muonlab.model import GPTConfig  # noqa: PLC0415
    from muonlab.model.extensions import in_registry_order  # noqa: PLC0415

    cfg = build_config([("override", {"family": "autoresearch", **(settings or {})})])
    variants = model_config(cfg, cfg.data.vocab_size).variants + tuple(upstream.pop("variants", ()))
    return GPTConfig(**upstream, variants=in_registry_order(variants))
