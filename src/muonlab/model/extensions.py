"""Model variants as plug-ins: the extension points of the GPT and the registry of variants.

A variant is a `ModelVariant` subclass with its own frozen config dataclass, registered by
name with `register_variant`. `GPTConfig.variants` holds the chosen configs; `GPT(config)`
builds one variant object per config, lets each create its parameters (on the GPT itself,
outside `transformer.h`, so none lands in a Muon group) and wires the hook methods it
defines into one `ExtensionPoints` table shared by every block. The table is fixed at build
time: a point no variant uses is None and costs the baseline one `is None` test, which
torch.compile folds away.

Extension points (hook methods a variant may define; each at most one variant):
  token embedding  embed(idx) -> e                     added to wte(idx) before the first norm
                   stream(w, e) -> s                   once per forward (e None without embed)
                   block_input(i, x, s) -> x           before block i, after the x0 mix
                   head_input(x, x0, s) -> x           before the final norm
  sublayer input   attn_input(i, attn, x) -> (q, k, v, ve_gate_input)   x = norm(x)
                   mlp_input(i, mlp, x) -> c_fc output
  rotary           rotary(i, q, k, cos_sin) -> (q, k)
  post-QK-norm     qk(i, q, k) -> (q, k)
  residual         branch(i, slot, u, f) -> f          slot 0 attention, 1 MLP
                   residual_add(u, f) -> u + f          (same forward; the backward may differ)
  loss             loss(x, targets, reduction) -> loss  x = the final normed stream
  block execution  run_block(block, x, ve, cos_sin, window) -> x
Besides hooks, a variant contributes: `create()` (parameters, buffers), `init_weights()`
(neutral: the baseline forward at init), `param_counts()`, `flop_excluded()` (parameters
that are not matmul weights), `param_groups(lrs)` and `attach(optimizer)`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar

import torch

from muonlab.errors import UsageError
from muonlab.plugins import is_builtin_module
from muonlab.settings import (METHOD_OFF, MethodInfo, MethodOptions, MethodSection, OpenSection, check_ranges,
                              coerce, opened_values, option_settings, setting, type_hints)

HOOKS = ("embed", "stream", "block_input", "head_input", "attn_input", "mlp_input", "rotary", "qk",
         "branch", "residual_add", "loss", "run_block")
STREAM_HOOKS = ("stream", "block_input", "head_input")  # one variant provides all three or none


@dataclass
class ExtensionPoints:
    """The hooks wired at build time (None: the upstream computation)."""
    embed: Callable | None = None
    stream: Callable | None = None
    block_input: Callable | None = None
    head_input: Callable | None = None
    attn_input: Callable | None = None
    mlp_input: Callable | None = None
    rotary: Callable | None = None
    qk: Callable | None = None
    branch: Callable | None = None
    residual_add: Callable | None = None
    loss: Callable | None = None
    run_block: Callable | None = None


@dataclass(frozen=True)
class LRs:
    """The learning rates `setup_optimizer` was given, handed to each variant's group rule."""
    unembedding_lr: float
    embedding_lr: float
    matrix_lr: float
    scalar_lr: float
    adam_betas: tuple[float, float]
    dim_scale: float  # (d / 768) ** -0.5, upstream's AdamW LR scaling

    def adamw(self, params: list, lr: float, **extra: Any) -> dict:
        """An AdamW group with upstream's scalar settings (eps 1e-10, no weight decay)."""
        group = dict(kind="adamw", params=params, betas=tuple(self.adam_betas), eps=1e-10, weight_decay=0.0, lr=lr)
        group.update(extra)  # e.g. x0_lambdas' betas (0.96, 0.95)
        return group


class ModelVariant:
    """Base of every model variant. `self.cfg` is its config, `self.config` the GPTConfig.

    The model is bound once (`self.model`); parameters live on it under the variant's own
    names, so state-dict keys are plain (`qk_scales`, `oe.tables.0.weight`).
    """
    param_names: ClassVar[tuple[str, ...]] = ()  # GPT attributes this variant creates

    def __init__(self, cfg: Any, config: Any):
        self.cfg, self.config, self.model = cfg, config, None

    def bind(self, model: torch.nn.Module) -> None:
        self.model = model
        self.create()

    def create(self) -> None:
        """Register parameters and buffers on `self.model` (called once, in GPT.__init__)."""

    def init_weights(self) -> None:
        """Neutral init under no_grad: the model's forward stays the baseline's."""

    def parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: getattr(self.model, n) for n in self.param_names}

    def param_counts(self) -> dict[str, int]:
        return {n: p.numel() for n, p in self.parameters().items()}

    def flop_excluded(self) -> int:
        """Parameters that are no matmul weight (left out of 6N in estimate_flops)."""
        return sum(p.numel() for p in self.parameters().values())

    def counts_apart(self, total: int) -> dict[str, int]:
        """num_scaling_params entries reported beside `total` (seed 002 kept its tables apart)."""
        return {}

    def summary_counts(self, counts: dict[str, int]) -> dict[str, float]:
        """Figures of num_scaling_params for the run summary, e.g. {"oe_params_M": ...}."""
        return {}

    def param_groups(self, lrs: LRs) -> list[dict]:
        return []

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Wire optimizer-side state after construction (e.g. visit counts)."""

    def hooks(self) -> dict[str, Callable]:
        """The extension-point hooks this variant defines (methods named in HOOKS)."""
        return {h: getattr(self, h) for h in HOOKS if callable(getattr(self, h, None))}


class VariantConfig(MethodSection):
    """Base of a built-in variant's config: one frozen dataclass that is both the run config's section
    for the method (its settings with their flags and help, which act when, its validation) and the
    configuration the variant reads. METHOD names the field that switches it on and its off value:
    while off, the section adds no variant and none of its other settings acts."""

    METHOD: ClassVar[MethodInfo]

    def is_on(self) -> bool:
        return getattr(self, self.METHOD.selector) != self.METHOD.off

    def inactive(self) -> dict[str, str]:
        if self.is_on():
            return {}
        return {f.name: METHOD_OFF for f in dataclasses.fields(self) if f.name != self.METHOD.selector}

    def variant_configs(self, cfg) -> tuple:
        """The model's variant configs for the run config `cfg`: this section itself while on."""
        return (self,) if self.is_on() else ()

    def check_model(self, config) -> None:
        """Raise ValueError when this config cannot build a variant of the model `config` (GPTConfig)."""
        if not self.is_on():
            raise ValueError(f"{self.METHOD.name} is off ({self.METHOD.selector} = {self.METHOD.off!r}): "
                             "it builds no model variant")
        hints = type_hints(type(self))
        try:  # a config built in code, not resolved from settings: its values' types and the section's checks
            for f in dataclasses.fields(self):
                coerce(getattr(self, f.name), hints[f.name], f.name)
            check_ranges(self, lambda f: (f.metadata.get("flag") or f.name).replace("-", "_"))
            self.validate()
        except UsageError as e:
            raise ValueError(str(e)) from None


@dataclass(frozen=True)
class RegisteredVariant:
    """A name's variant class, its config class, and the method's one record."""

    name: str
    config: type
    variant: type
    record: MethodInfo

    def describe(self) -> dict[str, Any]:
        return dict(name=self.name, paper=self.record.paper, config=[f.name for f in fields(self.config)],
                    module=self.record.module, tests=list(self.record.tests))


REGISTRY: dict[str, RegisteredVariant] = {}


def register_variant(name: str, config: type, *, paper: str | None = None, section: str = "",
                     tests: tuple[str, ...] = ()):
    """Class decorator: register a ModelVariant subclass under `name` with its config class (a frozen
    dataclass; `GPTConfig.variants` holds the configs of the variants that are on). A built-in
    variant's config is also its run-config section (a VariantConfig) whose `METHOD` is the variant's one
    record (paper, tests): `paper`, `section` and `tests` are then not given again. A plug-in's config is
    switched on with `--variant NAME`, its fields as flags (every field not declared `fixed`). A config
    may define `check_model(config)`, its checks against the model's shape."""
    record = getattr(config, "METHOD", None)
    if record is not None:
        if paper is not None or section or tests:
            raise TypeError(f"{name}: {config.__name__}.METHOD is its record; paper, section and tests are given there")
    elif paper is None:
        raise TypeError(f"{name}: register_variant needs paper= (or a config with a METHOD record)")

    def deco(cls: type) -> type:
        if name in REGISTRY and REGISTRY[name].variant is not cls:
            raise ValueError(f"model variant {name!r} is already registered ({REGISTRY[name].variant.__module__})")
        if not (dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen):
            raise TypeError(f"{name}: the config must be a frozen dataclass")
        if not issubclass(config, VariantConfig):  # a plug-in's: every field a flag can carry, or fixed
            option_settings(config, name, name)
        cls.name = name
        made = record or MethodInfo(name, f"{paper} {section}".strip(), cls.__module__, tuple(tests))
        REGISTRY[name] = RegisteredVariant(name, config, cls, made)
        return cls
    return deco


def is_builtin(info: RegisteredVariant) -> bool:
    """A variant that ships with muonlab: its config is its own run-config section (a plug-in's is
    model.plugin_variants.<name>)."""
    return is_builtin_module(info.variant.__module__)


@dataclass(eq=True)
class PluginVariantSettings(OpenSection):
    """The run config's `model.plugin_variants`: a MethodOptions section per registered plug-in variant whose
    config has settings (every field not declared `fixed`), each with the flag `--<variant>-<field>` (a
    built-in variant's config is its own section)."""

    values: dict = opened_values()

    def opened(self) -> list[tuple[str, Any, dataclasses.Field]]:
        return list(_plugin_sections(plugin_state()))


def plugin_state() -> tuple:
    """The registered plug-in variants as a hashable key (what `model.plugin_variants` and its flags depend on)."""
    return tuple((name, info.config) for name, info in REGISTRY.items() if not is_builtin(info))


@functools.lru_cache(maxsize=8)
def _plugin_sections(state: tuple) -> tuple[tuple[str, Any, dataclasses.Field], ...]:
    out = []
    for name, config in state:
        if option_settings(config, name, name):
            made = setting(factory=functools.partial(MethodOptions, method=config, label=name, flag_prefix=name))
            made.name = name
            out.append((name, MethodOptions, made))
    return tuple(out)


def info_for(cfg: Any) -> RegisteredVariant:
    for info in REGISTRY.values():
        if type(cfg) is info.config:
            return info
    raise ValueError(f"{type(cfg).__name__} is not the config of a registered model variant")


def check_variants(config: Any) -> None:
    """Each variant config validates itself against the model's shape; none twice."""
    seen = set()
    for cfg in config.variants:
        info = info_for(cfg)
        if info.name in seen:
            raise ValueError(f"model variant {info.name!r} is given twice")
        seen.add(info.name)
        check = getattr(cfg, "check_model", None)  # its values against the model's shape
        if check is not None:
            check(config)


def build_variants(config: Any) -> list[ModelVariant]:
    """One variant object per config in `config.variants` (GPTConfig has checked them)."""
    # registry order, whatever the config's: it fixes the optimizer groups' order
    return [info_for(cfg).variant(cfg, config) for cfg in in_registry_order(config.variants)]


def wire(variants: list[ModelVariant]) -> ExtensionPoints:
    """The extension-point table; two variants on one hook is an error (no silent order)."""
    points, owner = ExtensionPoints(), {}
    for v in variants:
        hooks = v.hooks()
        if any(h in hooks for h in STREAM_HOOKS) and not all(h in hooks for h in STREAM_HOOKS):
            raise TypeError(f"{v.name}: stream, block_input and head_input come together")
        for hook, fn in hooks.items():
            if hook in owner:
                raise ValueError(f"model variants {owner[hook]!r} and {v.name!r} both attach to {hook!r}")
            owner[hook] = v.name
            setattr(points, hook, fn)
    return points


def in_registry_order(configs) -> tuple:
    """Variant configs sorted as the registry lists their variants (the order the model builds them in)."""
    order = list(REGISTRY)
    return tuple(sorted(configs, key=lambda cfg: order.index(info_for(cfg).name)))


def find_variant(model: torch.nn.Module, name: str) -> ModelVariant | None:
    """The model's variant object registered as `name`, or None."""
    return next((v for v in getattr(model, "variants", ()) if v.name == name), None)


def describe() -> list[dict[str, Any]]:
    """Registry rows: name, paper (and where in it), config keys, module, tests."""
    return [info.describe() for info in REGISTRY.values()]
