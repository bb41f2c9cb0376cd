"""Settings of the autoresearch family: the GPT's shape, its variants, MuonAdamW and its add-ons.

Each method of the seed papers has its own small section; a section's settings act only when its
method is switched on (`inactive()`), so setting one that does not act is a usage error and is
never hashed. Flags keep the names the command line has always had (`--prepolar-tau`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from muonlab.errors import UsageError
from muonlab.settings import MethodInfo, Section, setting

OFF = "the method is off"


# ----------------------------------------------------------------------------- model variants
@dataclass
class PresubGainsConfig(Section):
    """Seed 000 §3.1: per-layer channel gains on the inputs of W_Q, W_K, W_V and W_fc."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('presub_gains', 'seed 000 §3.1', 'muonlab.model.scalings', ('tests/test_model_variants.py', 'tests/test_diagnostics_storage.py'), 'impl', 'none')

    impl: Literal["none", "unfused_slice", "unfused_contig", "weight_fused", "gate_scaled"] = setting(
        "none", "implementation (gate_scaled: the non-equivalent control)", flag="presub-gains")
    param: Literal["linear", "stopexp"] = setting("linear", "gain parametrisation", flag="presub-param")
    lr_mult: float = setting(0.04, "gains' AdamW lr as a multiple of scalar_lr (seed 000's 0.04)", flag="presub-lr-mult")

    def inactive(self) -> dict[str, str]:
        return {"param": OFF, "lr_mult": OFF} if self.impl == "none" else {}


@dataclass
class QKScaleConfig(Section):
    """Seed 000 §3.2, seed 002 §1.5-1.6: post-QK-norm scaling, plane c = channels c and c + 64."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('qk_scale', 'seed 000 §3.2; seed 002 §1.5-1.6 (q_tau, QMASK)', 'muonlab.model.scalings', ('tests/test_model_variants.py',), 'kind', 'none')

    kind: Literal["none", "pair_tied_linear", "pair_tied_stopexp", "pair_tied_exp", "untied_stopexp", "head_temp"] = \
        setting("none", "scaling rule", flag="qk-scale")
    freeze_layers: str = setting("", "comma-separated layers whose scales stay 1 (seed 002 QMASK: 0)",
                                 flag="qk-freeze-layers")
    freeze_planes: int = setting(0, "RoPE planes c < this stay 1 in every layer (QMASK: 16)", flag="qk-freeze-planes")
    lr_mult: float = setting(0.04, "scales' AdamW lr as a multiple of scalar_lr", flag="qk-lr-mult")

    def layers(self) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in self.freeze_layers.split(",") if v.strip())
        except ValueError:
            raise UsageError(f"qk_freeze_layers must be comma-separated integers, got {self.freeze_layers!r}") from None

    def inactive(self) -> dict[str, str]:
        return {"freeze_layers": OFF, "freeze_planes": OFF, "lr_mult": OFF} if self.kind == "none" else {}

    def validate(self) -> None:
        self.layers()


@dataclass
class RopeConfig(Section):
    """Seed 000 Table 2: learnable RoPE log-frequencies (LeRoPE)."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('lerope', 'seed 000 Table 2', 'muonlab.model.lerope', ('tests/test_lerope.py',), 'kind', 'standard')

    kind: Literal["standard", "lerope_shared", "lerope_adapted"] = setting(
        "standard", "standard RoPE, LeRoPE shared (64, fp32 trig) or adapted (per layer and head, bf16 trig)", flag="rope")
    lr_mult: float = setting(0.04, "LeRoPE's AdamW lr as a multiple of scalar_lr", flag="rope-lr-mult")

    def inactive(self) -> dict[str, str]:
        return {"lr_mult": OFF} if self.kind == "standard" else {}


@dataclass
class ResidualRuleConfig(Section):
    """Seed 003: backward rules at every residual addition (the forward stays bit-identical)."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('residual_rule', 'seed 003 (backward rules)', 'muonlab.model.residual', ('tests/test_residual.py', 'tests/test_diagnostics_replay.py'), 'rule', 'ordinary')

    rule: Literal["ordinary", "branch_tangent", "whole_state_tangent", "grad_mag_control"] = setting(
        "ordinary", "backward rule", flag="residual-rule")


@dataclass
class RadiusGateConfig(Section):
    """Seed 003: y = u + exp(a + b z_t) f with z_t the causal prefix-standardised log RMS."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('radius_gate', 'seed 003 (radius gates)', 'muonlab.model.residual', ('tests/test_residual.py',), 'kind', 'none')

    kind: Literal["none", "state", "branch", "neutral"] = setting("none", "what the gate reads (neutral: frozen at 0)",
                                                                 flag="radius-gate")
    lr_mult: float = setting(0.04, "gates' AdamW lr as a multiple of scalar_lr (unstated in seed 003)",
                             flag="gate-lr-mult")

    def inactive(self) -> dict[str, str]:
        return {"lr_mult": OFF if self.kind == "none" else "the neutral gate is frozen"} \
            if self.kind in ("none", "neutral") else {}


@dataclass
class MemoryConfig(Section):
    """Seed 003's memory-safe path (usable by any run)."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('memory_safe_path', 'seed 003 (block checkpointing, 4096-token loss chunks)', 'muonlab.model.gpt', ('tests/test_model_variants.py',), None, None)

    checkpoint_blocks: bool = setting(False, "non-reentrant activation checkpointing per block")
    loss_chunk_tokens: int = setting(0, "> 0: the loss in recomputed chunks of this many tokens (seed 003: 4096)")

    def validate(self) -> None:
        if self.loss_chunk_tokens < 0:
            raise UsageError(f"loss_chunk_tokens must be >= 0, got {self.loss_chunk_tokens}")


@dataclass
class OverEncodingConfig(Section):
    """Seed 002 §1.1-1.3: hashed n-gram Over-Encoding tables with their moment-free update."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('over_encoding', 'seed 002 §1.1-1.3', 'muonlab.model.over_encoding; muonlab.optim.addons.moment_free', ('tests/test_over_encoding.py', 'tests/test_over_encoding_model.py', 'tests/test_table_update.py'), 'm', 0)

    m: int = setting(0, "table size (0: off; the paper 150855)", flag="oe-m")
    n: int = setting(3, "largest n-gram order", flag="oe-n")
    k: int = setting(2, "tables per order", flag="oe-k")

    def inactive(self) -> dict[str, str]:
        return {"n": OFF, "k": OFF} if self.m == 0 else {}

    def validate(self) -> None:
        if self.m < 0:
            raise UsageError(f"oe_m must be >= 0 (0: no Over-Encoding), got {self.m}")


@dataclass
class RoutingConfig(Section):
    """Seed 002 §1.7: decoupled residual routing of the token embedding."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('routing', 'seed 002 §1.7', 'muonlab.model.gpt', ('tests/test_over_encoding_model.py',), 'kind', 'none')

    kind: Literal["none", "sepden", "shden"] = setting("none", "separate or shared denominator anchor", flag="routing")
    out: bool = setting(False, "also out_lambdas before the final norm", flag="routing-out")
    eps: float = setting(1e-6, "shden: the anchor's epsilon (1e-6, or 2**-23 as F.rms_norm)", flag="routing-eps")

    def inactive(self) -> dict[str, str]:
        if self.kind == "none":
            return {"out": OFF, "eps": OFF}
        return {"eps": "only the shared-denominator anchor has an epsilon"} if self.kind == "sepden" else {}


@dataclass
class AutoresearchModelConfig(Section):
    """The autoresearch GPT: width = depth x aspect_ratio rounded up to head_dim (upstream)."""

    depth: int = setting(8, "number of transformer blocks")
    aspect_ratio: int = setting(64, "width per layer of depth (upstream's model_dim rule)")
    head_dim: int = setting(128, "channels per attention head")
    n_embd: int | None = setting(None, "explicit width; none derives it from depth and aspect_ratio")
    n_kv_head: int | None = setting(None, "key/value heads (GQA); none: as many as query heads")
    window_pattern: str = setting("SSSL", "sliding-window pattern per layer: S = half context, L = full")
    attn_backend: Literal["auto", "fa3", "sdpa"] = setting("auto", "attention kernel (fa3: FlashAttention-3 on Hopper)")
    gains: PresubGainsConfig = setting(factory=PresubGainsConfig)
    qk: QKScaleConfig = setting(factory=QKScaleConfig)
    rope: RopeConfig = setting(factory=RopeConfig)
    residual: ResidualRuleConfig = setting(factory=ResidualRuleConfig)
    gate: RadiusGateConfig = setting(factory=RadiusGateConfig)
    memory: MemoryConfig = setting(factory=MemoryConfig)
    oe: OverEncodingConfig = setting(factory=OverEncodingConfig)
    routing: RoutingConfig = setting(factory=RoutingConfig)
    extra_variants: str = setting("", "comma-separated registered model variants without a section of their own "
                                  "(plug-ins), each with its config's defaults", flag="variant")

    def extra_variant_names(self) -> tuple[str, ...]:
        return tuple(v.strip() for v in self.extra_variants.split(",") if v.strip())

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
        return {"aspect_ratio": "n_embd sets the width"} if self.n_embd is not None else {}

    def validate(self) -> None:
        for name in ("depth", "aspect_ratio", "head_dim"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}")
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

        for name in self.extra_variant_names():
            if name not in REGISTRY or REGISTRY[name].module.startswith("muonlab.model.variants"):
                extra = sorted(n for n, i in REGISTRY.items() if not i.module.startswith("muonlab.model.variants"))
                raise UsageError(f"--variant {name!r} is not a registered plug-in variant (registered: "
                                 f"{', '.join(extra) or 'none'}; built-in variants have their own flags)")


# ----------------------------------------------------------------------------- optimizer add-ons
@dataclass
class PrepolarConfig(Section):
    """Seed 000 §3.3, seed 002 §1.4a: a conditioner of the Nesterov tensor before Polar Express."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('prepolar', 'seed 000 §3.3; seed 002 §1.4a', 'muonlab.optim.prepolar', ('tests/test_prepolar.py', 'tests/test_prepolar_arms.py'), 'kind', None)

    kind: str | None = setting(None, "hbieq | zeta | turbo_aol | muon2f, or a plug-in's name; none: off",
                               flag="prepolar")
    scope: str = setting("all", "all | square_only | rect_only | a regex on block parameter names",
                         flag="prepolar-scope")
    tau: float = setting(80.0, "hbieq homotopy horizon (seed 000: 80, seed 002: 25; 0 = undamped)", flag="prepolar-tau")
    passes: int = setting(2, "hbieq equilibration passes", flag="prepolar-passes")
    sides: Literal["both", "row"] = setting("both", "hbieq sides (row with passes 1: seed 000 exp51's control)",
                                            flag="prepolar-sides")

    def inactive(self) -> dict[str, str]:
        if self.kind is None:
            return {"scope": OFF, "tau": OFF, "passes": OFF, "sides": OFF}
        if self.kind != "hbieq":
            why = f"only hbieq reads it (prepolar is {self.kind})"
            return {"tau": why, "passes": why, "sides": why}
        return {}

    def validate(self) -> None:
        from muonlab.optim.prepolar import PREPOLARS  # noqa: PLC0415 (the optimizer's registry)

        if self.kind is not None and self.kind not in PREPOLARS:
            raise UsageError(f"prepolar must be one of {', '.join(PREPOLARS)}, got {self.kind!r}")
        if self.passes < 1 or self.tau < 0:
            raise UsageError("need prepolar_passes >= 1 and prepolar_tau >= 0")


@dataclass
class PolarConfig(Section):
    """Seed 002 §1.4b, seed 000: the precision of Polar Express and of its output."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('polar_precision', 'seed 002 §1.4b; seed 000 (post-polar fp32)', 'muonlab.optim.addons.polar_precision', ('tests/test_prepolar.py', 'tests/test_extensions.py'), None, None)

    dtype: Literal["bf16", "fp32"] = setting("bf16", "Polar Express dtype (fp32: seed 002's NS5 in FP32)",
                                             flag="polar-dtype")
    post_dtype: Literal[None, "bf16", "fp32"] = setting(None, "dtype after Polar Express (fp32: g = X.float()); "
                                                        "none keeps Polar Express's", flag="post-polar-dtype")


@dataclass
class WhitenConfig(Section):
    """Seed 002 §1.4d: right-projected Neumann-Gram whitening of wte, lm_head and value-embedding updates."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('neumann_whitening', 'seed 002 §1.4d', 'muonlab.optim.addons.neumann_whitening', ('tests/test_whitening.py',), 'kind', None)

    kind: Literal[None, "neumann"] = setting(None, "none | neumann", flag="whiten")
    tau: float = setting(80.0, "homotopy horizon of beta_t", flag="whiten-tau")
    terms: int = setting(1, "series terms (1 = the paper's first-order form)", flag="whiten-terms")
    mean_addback: bool = setting(False, "add the mean row back (the paper is silent; off = its formula)",
                                 flag="whiten-mean-addback")

    def inactive(self) -> dict[str, str]:
        return {"tau": OFF, "terms": OFF, "mean_addback": OFF} if self.kind is None else {}

    def validate(self) -> None:
        if self.terms < 1 or self.tau < 0:
            raise UsageError("need whiten_terms >= 1 and whiten_tau >= 0")


@dataclass
class TableWhitenConfig(Section):
    """Seed 002 §1.11: Neumann-Gram whitening of the Over-Encoding tables' visited rows."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('table_neumann', 'seed 002 §1.11', 'muonlab.optim.addons.moment_free', ('tests/test_table_update.py',), 'kind', None)

    kind: Literal[None, "neumann"] = setting(None, "none | neumann", flag="table-whiten")
    tau: float = setting(80.0, "homotopy horizon", flag="table-whiten-tau")

    def inactive(self) -> dict[str, str]:
        return {"tau": OFF} if self.kind is None else {}

    def validate(self) -> None:
        if self.tau < 0:
            raise UsageError("need table_whiten_tau >= 0")


STEP0_HELP = "seed 002 §1.8 step-0 controls on the routing scalars (none: off)"


@dataclass
class MuonAdamWConfig(Section):
    """MuonAdamW as upstream sets it up, its schedules, and the seed papers' add-ons."""

    embedding_lr: float = setting(0.6, "AdamW lr of wte and value embeddings (x (d/768)^-1/2)")
    unembedding_lr: float = setting(0.004, "AdamW lr of lm_head (x (d/768)^-1/2)")
    matrix_lr: float = setting(0.04, "Muon lr of the block matrices")
    scalar_lr: float = setting(0.5, "AdamW lr of the residual scalars (and base of the variants' lrs)")
    weight_decay: float = setting(0.2, "Muon (cautious) weight decay, decayed linearly to 0")
    adam_beta1: float = setting(0.8, "AdamW beta1")
    adam_beta2: float = setting(0.95, "AdamW beta2")
    muon_momentum_start: float = setting(0.85, "Muon momentum at step 0")
    muon_momentum_end: float = setting(0.95, "Muon momentum after the warm-up")
    muon_momentum_warmup_steps: int = setting(300, "steps of the Muon momentum warm-up")
    muon_momentum_cooldown: bool = setting(False, "seed 002 §1.4c: momentum 0.95 -> 0.85 over the warmdown")
    muon_wd_schedule: Literal["linear", "cosine"] = setting("linear", "Muon weight-decay decay (cosine: seed 002 §1.4f)")
    lr_scale: float = setting(1.0, "seed 002 lr141: every LR x k, Muon weight decay x 1/k")
    matrix_optimizer: Literal["muon", "adamw"] = setting("muon", "adamw: the adamw_only control (every block "
                                                         "matrix on AdamW)")
    adamw_matrix_lr: float = setting(0.003, "adamw_only: the block matrices' AdamW lr")
    adamw_matrix_weight_decay: float = setting(0.0, "adamw_only: the block matrices' decoupled weight decay")
    embedding_state: Literal["native", "master32"] = setting(
        "native", "wte/value-embedding state: native (upstream bf16) or master32 (fp32 master + moments, seed 002 §1.4e)")
    step0_mode: str = setting("none", STEP0_HELP)
    prepolar: PrepolarConfig = setting(factory=PrepolarConfig)
    polar: PolarConfig = setting(factory=PolarConfig)

    # methods that are one setting of this section: (field, off value) -> what it is
    FIELD_METHODS: ClassVar[dict[str, MethodInfo]] = {
        "embedding_state": MethodInfo("master32", "seed 002 §1.4e, §1.9", "muonlab.optim.addons.master32",
                                      ("tests/test_embedding_state.py",), "embedding_state", "native"),
        "muon_momentum_cooldown": MethodInfo("momentum_cooldown", "seed 002 §1.4c", "muonlab.optim.schedules",
                                             ("tests/test_schedules.py",), "muon_momentum_cooldown", False),
        "muon_wd_schedule": MethodInfo("cosine_muon_wd", "seed 002 §1.4f", "muonlab.optim.schedules",
                                       ("tests/test_schedules.py",), "muon_wd_schedule", "linear"),
        "lr_scale": MethodInfo("lr_scale", "seed 002 §1.10 (lr141)", "muonlab.optim.schedules",
                               ("tests/test_schedules.py",), "lr_scale", 1.0),
        "step0_mode": MethodInfo("step0_controls", "seed 002 §1.8", "muonlab.optim.step0",
                                 ("tests/test_step0.py",), "step0_mode", "none"),
        "matrix_optimizer": MethodInfo("adamw_only_control", "muonlab control (every block matrix on AdamW)",
                                       "muonlab.model.gpt", ("tests/test_lab_sweep.py",), "matrix_optimizer", "muon"),
    }
    whiten: WhitenConfig = setting(factory=WhitenConfig)
    table_whiten: TableWhitenConfig = setting(factory=TableWhitenConfig)

    def inactive(self) -> dict[str, str]:
        if self.matrix_optimizer == "muon":
            why = "matrix_optimizer is muon"
            return {"adamw_matrix_lr": why, "adamw_matrix_weight_decay": why}
        why = "matrix_optimizer is adamw: no matrix is on Muon"
        return {k: why for k in ("matrix_lr", "weight_decay", "muon_momentum_start", "muon_momentum_end",
                                 "muon_momentum_warmup_steps", "muon_momentum_cooldown", "muon_wd_schedule",
                                 "prepolar", "polar")}

    def validate(self) -> None:
        for name in ("embedding_lr", "unembedding_lr", "matrix_lr", "scalar_lr", "weight_decay"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise UsageError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.lr_scale <= 0:
            raise UsageError(f"lr_scale must be > 0, got {self.lr_scale}")
        from muonlab.optim.step0 import STEP0_MODES  # noqa: PLC0415

        if self.step0_mode not in STEP0_MODES:
            raise UsageError(f"step0_mode must be one of {', '.join(STEP0_MODES)}, got {self.step0_mode!r}")
        if min(self.adamw_matrix_lr, self.adamw_matrix_weight_decay) < 0:
            raise UsageError("adamw_matrix_lr and adamw_matrix_weight_decay must be >= 0")
