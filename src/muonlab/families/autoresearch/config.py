"""Settings of the autoresearch family: the GPT's shape, MuonAdamW, and the sections of the
seed papers' methods, each defined in its method's own module (model/variants/*, optim/addons/*,
optim/prepolar) and composed here. A section's settings act only when its method is switched on
(`inactive()`), so setting one that does not act is a usage error and is never hashed. Flags keep
the names the command line has always had (`--prepolar-tau`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

from muonlab.errors import UsageError
from muonlab.settings import (COUNT, MOMENTUM, NON_NEGATIVE, POSITIVE, POSITIVE_COUNT, MethodInfo, MethodSection,
                              Section, comma_items, setting, setting_fields)
from muonlab.model.variants.presub_gains import PresubGainsConfig
from muonlab.model.variants.qk_scale import QKScaleConfig
from muonlab.model.variants.lerope import LeRoPEConfig
from muonlab.model.variants.residual_rules import ResidualRuleConfig
from muonlab.model.variants.radius_gate import RadiusGateConfig
from muonlab.model.variants.memory import MemorySettings
from muonlab.model.variants.over_encoding import OverEncodingConfig
from muonlab.model.variants.routing import RoutingConfig
from muonlab.model.extensions import PluginVariantSettings
from muonlab.optim.prepolar import PrepolarSettings
from muonlab.optim.homotopy import HOMOTOPY_FIRST_T
from muonlab.optim.addons.polar_precision import PolarPrecision
from muonlab.optim.addons.neumann_whitening import NeumannWhitening
from muonlab.optim.addons.moment_free import TableNeumann



@dataclass
class AutoresearchModelConfig(Section):
    """The autoresearch GPT: width = depth x aspect_ratio rounded up to head_dim (upstream)."""

    depth: int = setting(8, "number of transformer blocks", range=POSITIVE_COUNT)
    aspect_ratio: int = setting(64, "width per layer of depth (upstream's model_dim rule)", range=POSITIVE_COUNT)
    head_dim: int = setting(128, "channels per attention head", range=POSITIVE_COUNT)
    n_embd: int | None = setting(None, "explicit width; none derives it from depth and aspect_ratio",
                                 range=POSITIVE_COUNT)
    n_kv_head: int | None = setting(None, "key/value heads (GQA); none: as many as query heads")
    window_pattern: str = setting("SSSL", "sliding-window pattern per layer: S = half context, L = full")
    attn_backend: Literal["auto", "fa3", "flex", "sdpa"] = setting(
        "auto", "attention kernel: fa3 = FlashAttention-3 on CUDA or an error, flex = FlexAttention with a "
        "sliding-window block mask (CUDA), sdpa = SDPA with a window mask, auto = FA3 when it loads, else flex on "
        "CUDA and sdpa elsewhere")
    head_loss: Literal["fused", "reference"] = setting(
        "fused", "LM-head loss: fused = soft-capped cross-entropy in row chunks, its gradient formed in forward "
        "(never the full [tokens, vocab] fp32 logits); reference = upstream's logits then F.cross_entropy")
    gains: PresubGainsConfig = setting(factory=PresubGainsConfig)
    qk: QKScaleConfig = setting(factory=QKScaleConfig)
    rope: LeRoPEConfig = setting(factory=LeRoPEConfig)
    residual: ResidualRuleConfig = setting(factory=ResidualRuleConfig)
    gate: RadiusGateConfig = setting(factory=RadiusGateConfig)
    memory: MemorySettings = setting(factory=MemorySettings)
    oe: OverEncodingConfig = setting(factory=OverEncodingConfig)
    routing: RoutingConfig = setting(factory=RoutingConfig)
    extra_variants: str = setting("", "comma-separated registered model variants without a section of their own "
                                  "(plug-ins), each with its config's defaults", flag="variant")

    # each plug-in variant's options (muonlab.settings.option in its config): --<variant>-<field>
    plugin_variants: PluginVariantSettings = setting(factory=PluginVariantSettings)

    def extra_variant_names(self) -> tuple[str, ...]:
        return tuple(comma_items(self.extra_variants, "extra_variants (--variant)"))

    @property
    def model_dim(self) -> int:
        if self.n_embd is not None:
            return self.n_embd
        base = self.depth * self.aspect_ratio
        return ((base + self.head_dim - 1) // self.head_dim) * self.head_dim

    @property
    def n_head(self) -> int:
        return self.model_dim // self.head_dim

    def inactive(self) -> dict[str, str]:
        out = {"aspect_ratio": "n_embd sets the width"} if self.n_embd is not None else {}
        if self.memory.loss_chunk_tokens > 0:
            out["head_loss"] = "loss_chunk_tokens > 0 computes the loss (seed 003's chunked path)"
        on = self.extra_variant_names()
        for f in setting_fields(self.plugin_variants):  # a plug-in's options act only while it is on
            if f.name not in on:
                out[f"plugin_variants.{f.name}"] = f"the plug-in variant {f.name} is off (--variant {f.name})"
        return out

    def plugin_config(self, name: str):
        """The plug-in variant's config: its options' settings, the rest its defaults."""
        from muonlab.model import REGISTRY  # noqa: PLC0415

        part = getattr(self.plugin_variants, name, None)
        return REGISTRY[name].config() if part is None else part.made()

    def validate(self) -> None:
        if self.model_dim % self.head_dim != 0:
            raise UsageError(f"width {self.model_dim} is not divisible by head_dim {self.head_dim}")
        if self.head_dim % 2 != 0:
            raise UsageError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.model_dim < 32:
            raise UsageError(f"width must be >= 32 (the value-embedding gate reads 32 channels), got {self.model_dim}")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise UsageError(f"n_head {self.n_head} is not a multiple of n_kv_head {self.n_kv_head}")
        if not self.window_pattern or any(c not in "SLsl" for c in self.window_pattern):
            raise UsageError(f"window_pattern must use only S and L, got {self.window_pattern!r}")
        from muonlab.model import REGISTRY  # noqa: PLC0415 (the model's variant registry)
        from muonlab.model.extensions import is_builtin  # noqa: PLC0415

        for name in self.extra_variant_names():
            if name not in REGISTRY or is_builtin(REGISTRY[name]):
                extra = sorted(n for n, i in REGISTRY.items() if not is_builtin(i))
                raise UsageError(f"--variant {name!r} is not a registered plug-in variant (registered: "
                                 f"{', '.join(extra) or 'none'}; built-in variants have their own flags)")


STEP0_HELP = "seed 002 §4.5 item 2 step-0 controls on the routing scalars (none: off)"


@dataclass
class MuonAdamWConfig(MethodSection):
    """MuonAdamW as upstream sets it up, its schedules, and the seed papers' add-ons."""

    embedding_lr: float = setting(0.6, "AdamW lr of wte and value embeddings (x (d/768)^-1/2)", range=NON_NEGATIVE)
    unembedding_lr: float = setting(0.004, "AdamW lr of lm_head (x (d/768)^-1/2)", range=NON_NEGATIVE)
    matrix_lr: float = setting(0.04, "Muon lr of the block matrices", range=NON_NEGATIVE)
    scalar_lr: float = setting(0.5, "AdamW lr of the residual scalars (and base of the variants' lrs)",
                               range=NON_NEGATIVE)
    weight_decay: float = setting(0.2, "Muon (cautious) weight decay, decayed linearly to 0", range=NON_NEGATIVE)
    adam_beta1: float = setting(0.8, "AdamW beta1", range=MOMENTUM)
    adam_beta2: float = setting(0.95, "AdamW beta2", range=MOMENTUM)
    muon_momentum_start: float = setting(0.85, "Muon momentum at step 0", range=MOMENTUM)
    muon_momentum_end: float = setting(0.95, "Muon momentum after the warm-up", range=MOMENTUM)
    muon_momentum_warmup_steps: int = setting(300, "steps of the Muon momentum warm-up", range=COUNT)
    muon_momentum_cooldown: bool = setting(False, "seed 002 §2.1 (Tier 1): momentum 0.95 -> 0.85 over the warmdown")
    muon_wd_schedule: Literal["linear", "cosine"] = setting("linear", "Muon weight-decay decay (cosine: seed 002 §2.1 (Tier 1))")
    lr_scale: float = setting(1.0, "seed 002 lr141: every LR x k, Muon weight decay x 1/k", range=POSITIVE)
    matrix_optimizer: Literal["muon", "adamw"] = setting("muon", "adamw: the adamw_only control (every block "
                                                         "matrix on AdamW)")
    adamw_matrix_lr: float = setting(0.003, "adamw_only: the block matrices' AdamW lr", range=NON_NEGATIVE)
    adamw_matrix_weight_decay: float = setting(0.0, "adamw_only: the block matrices' decoupled weight decay",
                                               range=NON_NEGATIVE)
    embedding_state: Literal["native", "master32"] = setting(
        "native", "wte/value-embedding state: native (upstream bf16) or master32 (fp32 master + moments, seed 002 §2.1 (Tier 1), §3 item 3)")
    step0_mode: str = setting("none", STEP0_HELP)
    homotopy_first_t: int = setting(HOMOTOPY_FIRST_T, "t of the first update in every homotopy ramp (hbieq alpha_t, whiten and "
                                       "table_whiten beta_t): 1 = seed 000's stated counter, 0 = a_0 = 0")
    prepolar: PrepolarSettings = setting(factory=PrepolarSettings)  # kind, scope and every conditioner's options
    polar: PolarPrecision = setting(factory=PolarPrecision)

    # methods that are one setting of this section: (field, off value) -> what it is
    FIELD_METHODS: ClassVar[dict[str, MethodInfo]] = {
        "embedding_state": MethodInfo("master32", "seed 002 §2.1 (Tier 1), §4.3 item 2", "muonlab.optim.addons.master32",
                                      ("tests/optim/test_embedding_state.py",), "embedding_state", "native"),
        "muon_momentum_cooldown": MethodInfo("momentum_cooldown", "seed 002 §2.1 (Tier 1)", "muonlab.optim.schedules",
                                             ("tests/optim/test_schedules.py",), "muon_momentum_cooldown", False),
        "muon_wd_schedule": MethodInfo("cosine_muon_wd", "seed 002 §2.1 (Tier 1)", "muonlab.optim.schedules",
                                       ("tests/optim/test_schedules.py",), "muon_wd_schedule", "linear"),
        "lr_scale": MethodInfo("lr_scale", "seed 002 §4.4 (lr141)", "muonlab.optim.schedules",
                               ("tests/optim/test_schedules.py",), "lr_scale", 1.0),
        "step0_mode": MethodInfo("step0_controls", "seed 002 §4.5 item 2", "muonlab.optim.step0",
                                 ("tests/optim/test_step0.py",), "step0_mode", "none"),
        "matrix_optimizer": MethodInfo("adamw_only_control", "muonlab control (every block matrix on AdamW)",
                                       "muonlab.model.gpt", ("tests/lab/test_lab_sweep.py",), "matrix_optimizer", "muon"),
    }
    whiten: NeumannWhitening = setting(factory=NeumannWhitening)
    table_whiten: TableNeumann = setting(factory=TableNeumann)

    def step_hooks(self, model) -> list:
        """Seed 002 §4.5 item 2: the step-0 controls on the routing scalars."""
        if self.step0_mode == "none":
            return []
        from muonlab.optim.step0 import Step0Control, family_params  # noqa: PLC0415

        return [Step0Control(self.step0_mode, family_params(model))]

    def check_with(self, cfg) -> None:
        if self.step0_mode not in ("none", "nostep0_all") and cfg.model.routing.kind == "none":
            raise UsageError(f"step0_mode {self.step0_mode} acts on wte_lambdas/out_lambdas: set routing")

    def param_group_keys(self, optim) -> dict[str, dict]:
        """fp32 master weights and moments for wte and value embeddings (seed 002 §2.1 Tier 1, §3 item 3)."""
        return {"wte": {"master32": True}, "value_embeds": {"master32": True}} if self.embedding_state == "master32" else {}

    def inactive(self) -> dict[str, str]:
        ramps = self.prepolar.follows_homotopy() or self.whiten.kind is not None or self.table_whiten.kind is not None
        out = {} if ramps else {"homotopy_first_t": "no homotopy ramp is on (a prepolar ramp, whiten, table_whiten)"}
        if self.matrix_optimizer == "muon":
            why = "matrix_optimizer is muon"
            return {**out, "adamw_matrix_lr": why, "adamw_matrix_weight_decay": why}
        why = "matrix_optimizer is adamw: no matrix is on Muon"
        return {**out, **{k: why for k in ("matrix_lr", "weight_decay", "muon_momentum_start", "muon_momentum_end",
                                 "muon_momentum_warmup_steps", "muon_momentum_cooldown", "muon_wd_schedule",
                                 "prepolar", "polar")}}

    def validate(self) -> None:
        from muonlab.optim.step0 import STEP0_MODES  # noqa: PLC0415

        if self.step0_mode not in STEP0_MODES:
            raise UsageError(f"step0_mode must be one of {', '.join(STEP0_MODES)}, got {self.step0_mode!r}")
        if self.homotopy_first_t not in (0, 1):
            raise UsageError(f"homotopy_first_t must be 0 or 1, got {self.homotopy_first_t}")
