"""Model families behind one interface: config, model, optimizer, schedule, presets, metric.

Two folders, as the code is: autoresearch/ (the upstream GPT trained with MuonAdamW) and tied/ (the
tied-token families of seed 004, all trained with AF-Muon or its baselines): the tied GPT itself
(tied/__init__.py, model.py, moe.py: the shared layers lm_loss, RMSNorm, TiedLMHead) and beside it
what every tied-token family shares, tied/afmuon.py (the AF-Muon optimizer section and builder, the
schedule, Table 3's statistics) and tied/token_family.py (token data and evaluation), then one folder
per family built on them: tied/hf, tied/t5, tied/imagegpt, tied/reuse. Each family folder holds its
model(s), its config sections, its definition (registered in its __init__) and its presets.

A family is everything the training loop needs to know about one kind of model: the sections
of the run config it owns (`model` and `optim`), how to build the model and its optimizer, the
schedule its optimizer follows, its data and its evaluation metric, what it reports, and its
presets (its arms are the registered arms that set `family`). The loop, the builder and the
config never branch on a family's name; they ask the family (`get_family(cfg.family)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from muonlab.errors import UsageError


def text_data(cfg, log: Callable[[str], None] = print):
    """The text pipeline (muonlab.data): the corpus of cfg.data, its BPE tokenizer, packed rows."""
    from muonlab.data.prepare import prepare_data  # noqa: PLC0415

    return prepare_data(cfg.data, log=log)


def no_trajectory(model) -> dict:
    """A family without trajectory records: --trajectory-steps does not act on it."""
    return {}


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    model_config: type  # a Section: the run config's `model`
    optim_config: type  # a Section: the run config's `optim`
    build_model: Callable  # (cfg, vocab_size, runtime) -> nn.Module, initialised
    build_optimizer: Callable  # (model, cfg, compile_step, distributed) -> Optimizer, groups with initial_lr
    schedule: Callable  # (cfg) -> an object with .apply(optimizer, step, progress) -> dict of logged values
    describe: Callable  # (cfg) -> "width 64, depth 2" for the run's first log line
    depth: Callable  # (cfg) -> the model's depth (the summary's `depth` key)
    step_hooks: Callable = lambda cfg, model: []  # objects with before_step/after_step(step, optimizer)
    trajectory: Callable = no_trajectory  # extra per-step record at the trajectory steps (seed 000 Table 4B)
    validate: Callable = lambda cfg: None  # checks across the family's sections
    # state-dict key of the token table (its rows: the vocabulary), or (cfg) -> that key
    embedding_key: str | Callable = "transformer.wte.weight"
    attention_backend: Callable = lambda model: "sdpa"  # the attention kernel the built model uses
    prepare_data: Callable = text_data  # (cfg, log) -> the prepared data its loader and evaluation read
    # (model, data, cfg, runtime, dist, splits=("val", "holdout"), tokens=None) -> {split: EvalResult}
    # (periodic evaluation asks for splits=("val",) and train.eval_every_tokens); None: bits per byte
    # on val and holdout (muonlab.eval.text.evaluate_text_splits), the autoresearch family's metric
    evaluate: Callable | None = None
    # (model) -> numbers of the trained model for the ledger and the run summary (after its metrics)
    final_metrics: Callable = lambda model: {}
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    metric: str = "val_bpb"  # the ledger key a report compares by default (lower is better)
    summary_metrics: tuple[str, ...] = ()  # its evaluation's keys the run summary shows after upstream's
    data_sources: tuple[str, ...] | None = None  # the data sources it reads (None: every text source)
    # (cfg) -> the optional packages (muonlab.optional) its model needs: required before a run writes anything
    requires: Callable = lambda cfg: ()


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    _load_builtin()
    if name not in FAMILIES:
        raise UsageError(f"unknown model family {name!r}; choose from {', '.join(FAMILIES)}")
    return FAMILIES[name]


def all_families() -> dict[str, Family]:
    _load_builtin()
    return FAMILIES


def _load_builtin() -> None:
    # the built-in families, one package each, in the order they register (the order all_families
    # lists them and the command line builds their flags in)
    from muonlab.families import autoresearch, tied  # noqa: F401, I001, PLC0415
    from muonlab.families.tied import hf, imagegpt, reuse, t5  # noqa: F401, I001, PLC0415
