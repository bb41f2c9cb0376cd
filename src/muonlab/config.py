"""Typed run configuration, protocol presets, validation and the config hash.

A run is fully described by a `TrainConfig` (with its nested `DataConfig`). Presets are
named starting points; arms and CLI flags are overrides on top of them. The resolved config
is saved whole with every run, and its hash (over everything that can change the numbers)
identifies the run in the ledger.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from muonlab.data.config import DataConfig
from muonlab.device import PRECISIONS
from muonlab.errors import UsageError
from muonlab.model.attention import BACKENDS

COMPILE_MODES = ("auto", "on", "off")

# Fields that only say where things go or how much is printed: they never change a result.
BOOKKEEPING_FIELDS = ("run_name", "runs_dir", "ledger", "log_every", "quiet", "arm", "sinks", "sink_project",
                      "checkpoint_every", "checkpoint_keep", "trajectory_steps")


@dataclass
class TrainConfig:
    # model shape (upstream: model_dim = depth * aspect_ratio rounded up to head_dim)
    depth: int = 8
    aspect_ratio: int = 64
    head_dim: int = 128
    n_embd: int | None = None  # explicit width; None derives it from depth and aspect ratio
    n_kv_head: int | None = None  # None: as many as query heads
    window_pattern: str = "SSSL"
    sequence_len: int = 2048
    # batch: total_batch_size tokens per optimizer step, device_batch_size rows per micro-step
    device_batch_size: int = 64
    total_batch_size: int = 2**19
    # duration: fixed steps (seed 002 protocol) or upstream's training-time budget in seconds
    num_steps: int | None = 953
    time_budget: float | None = None
    untimed_steps: int = 11  # compile/warm-up steps excluded from timing and progress
    # optimizer (upstream train.py defaults)
    embedding_lr: float = 0.6
    unembedding_lr: float = 0.004
    matrix_lr: float = 0.04
    scalar_lr: float = 0.5
    weight_decay: float = 0.2
    adam_beta1: float = 0.8
    adam_beta2: float = 0.95
    warmup_ratio: float = 0.0
    warmdown_ratio: float = 0.5
    final_lr_frac: float = 0.0
    muon_momentum_start: float = 0.85
    muon_momentum_end: float = 0.95
    muon_momentum_warmup_steps: int = 300
    muon_momentum_cooldown: bool = False  # seed 002 §1.4c: 0.95 -> 0.85 over the warmdown
    muon_wd_schedule: str = "linear"  # "cosine": seed 002 §1.4f (formula chosen, see Schedule)
    lr_scale: float = 1.0  # seed 002 lr141: every LR x k, Muon weight decay x 1/k
    # pre-polar conditioning and polar precision (muonlab.optim.prepolar; seed 000 §3.3, seed 002 §1.4a-b)
    prepolar: str | None = None  # None | hbieq | zeta | turbo_aol | muon2f
    prepolar_scope: str = "all"  # all | square_only | rect_only | a regex on block parameter names
    prepolar_tau: float = 80.0  # hbieq homotopy horizon (seed 000: 80, seed 002: 25; 0 = undamped)
    prepolar_passes: int = 2
    prepolar_sides: str = "both"  # "row" with passes=1: seed 000 exp51's one-sided row-RMS control
    polar_dtype: str = "bf16"  # "fp32": seed 002's "NS5 in FP32"
    post_polar_dtype: str | None = None  # None keeps Polar Express's dtype; "fp32": g = X.float()
    # right-projected Neumann-Gram whitening of wte, lm_head and value-embedding updates (seed 002 §1.4d)
    whiten: str | None = None  # None | neumann
    whiten_tau: float = 80.0
    whiten_terms: int = 1  # 1 = the paper's first-order form
    whiten_mean_addback: bool = False  # the paper is silent; off = its formula read literally
    # wte/value-embedding optimizer state: "native" (upstream: bf16 params, bf16 moments; seed 002
    # BF16STATE) or "master32" (fp32 master copy + fp32 moments, seed 002 §1.4e)
    embedding_state: str = "native"
    matrix_optimizer: str = "muon"  # "adamw": the adamw_only control (every block matrix on AdamW)
    # forward/backward variants of the model (GPTConfig documents each; all off = upstream)
    presub_gains: str = "none"  # seed 000 §3.1: none | unfused_slice | unfused_contig | weight_fused | gate_scaled
    presub_param: str = "linear"  # linear | stopexp
    qk_scale: str = "none"  # seed 000 §3.2: pair_tied_linear | pair_tied_stopexp | pair_tied_exp | untied_stopexp | head_temp
    qk_freeze_layers: str = ""  # comma-separated layers whose QK scales stay 1 (seed 002 QMASK: "0")
    qk_freeze_planes: int = 0  # RoPE planes c < this stay 1 in every layer (QMASK: 16)
    rope: str = "standard"  # standard | lerope_shared | lerope_adapted (seed 000 Table 2)
    residual_rule: str = "ordinary"  # seed 003: ordinary | branch_tangent | whole_state_tangent | grad_mag_control
    radius_gate: str = "none"  # seed 003: none | state | branch | neutral
    checkpoint_blocks: bool = False  # non-reentrant activation checkpointing per block
    loss_chunk_tokens: int = 0  # > 0: the loss in chunks of this many tokens (seed 003 used 4096)
    # seed 002: Over-Encoding (oe_m = 0: off; the paper 150855) with its moment-free table update,
    # optional table-Neumann, and decoupled routing (sepden | shden, + out_lambdas)
    oe_m: int = 0
    oe_n: int = 3
    oe_k: int = 2
    table_whiten: str | None = None  # None | neumann (seed 002 §1.11)
    table_whiten_tau: float = 80.0
    routing: str = "none"
    routing_out: bool = False
    routing_eps: float = 1e-6
    step0_mode: str = "none"  # seed 002 §1.8 step-0 controls (muonlab.optim.step0.STEP0_MODES)
    # seed 004: the tied-token model family and AF-Muon. model_family "tied" trains muonlab.tied's
    # tied GPT (`tied_preset` gives its shape; vocabulary and sequence length come from the data and
    # `sequence_len`) with `optimizer` one of muonlab.optim.af_muon's presets (afmuon, hybrid, sign,
    # factorial_*, adamw); af_* are its hyperparameters (seed 004 §3: c 3, s 0.5, rho 60, Muon lr 0.02,
    # vector lr 3e-4), grad_clip the global gradient-norm clip (seed 004: 1.0; 0 = off).
    model_family: str = "autoresearch"  # autoresearch | tied
    tied_preset: str = "tied-tiny"
    optimizer: str = "muon_adamw"
    af_cap: float = 3.0
    af_scale: float = 0.5
    af_rho: float = 60.0
    af_matrix_lr: float = 0.02
    af_vector_lr: float = 3e-4
    grad_clip: float = 0.0
    tied_grad_source: str = "both"  # seed 004 K.8: both | lookup (input-only) | softmax (output-only)
    # learning rates of the variant parameters, as multiples of scalar_lr (seed 000: "0.04" = 0.04 x scalar_lr)
    presub_lr_mult: float = 0.04
    qk_lr_mult: float = 0.04
    rope_lr_mult: float = 0.04
    gate_lr_mult: float = 0.04
    adamw_matrix_lr: float = 0.003
    adamw_matrix_weight_decay: float = 0.0
    # evaluation: tokens scored per split (val and holdout), batch rows per eval step
    eval_tokens: int = 40 * 2**19
    eval_batch_size: int | None = None  # None: device_batch_size
    max_loss: float = 100.0  # fast fail above this training loss (upstream)
    # runtime
    seed: int = 42
    device: str = "auto"
    precision: str = "auto"
    compile: str = "auto"
    attn_backend: str = "auto"
    # bookkeeping
    arm: str = "baseline"
    run_name: str | None = None
    runs_dir: str | None = None  # default: <cache>/runs
    ledger: str | None = None  # default: <runs_dir>/ledger.jsonl
    log_every: int = 1
    quiet: bool = False
    checkpoint_every: int = 0  # full checkpoint every K steps (0: only at the end and on SIGINT/SIGTERM)
    checkpoint_keep: int = 2  # newest checkpoints kept (the previous one survives a failed write)
    sinks: str = ""  # optional metric sinks: "wandb", "tensorboard" (comma-separated)
    sink_project: str = "muonlab"
    # steps whose metrics also hold the full x0_lambdas / resid_lambdas (seed 000 Table 4B)
    trajectory_steps: str = "0,10,20,40,80"
    data: DataConfig = field(default_factory=DataConfig)

    # ------------------------------------------------------------------ derived
    @property
    def model_dim(self) -> int:
        if self.n_embd is not None:
            return self.n_embd
        base = self.depth * self.aspect_ratio
        return ((base + self.head_dim - 1) // self.head_dim) * self.head_dim

    @property
    def n_head(self) -> int:
        return self.model_dim // self.head_dim

    @property
    def tokens_per_micro_step(self) -> int:
        return self.device_batch_size * self.sequence_len

    @property
    def grad_accum_steps(self) -> int:
        return self.total_batch_size // self.tokens_per_micro_step

    def accum_steps_per_rank(self, world_size: int) -> int:
        """Micro-steps per rank when `world_size` processes share one global batch."""
        per_step = self.tokens_per_micro_step * world_size
        if self.total_batch_size % per_step != 0:
            raise UsageError(f"total_batch_size {self.total_batch_size} is not divisible by device_batch_size x "
                             f"sequence_len x world_size = {self.device_batch_size} x {self.sequence_len} x "
                             f"{world_size}")
        return self.total_batch_size // per_step

    def model_variants(self) -> dict[str, Any]:
        """The GPTConfig fields of the forward/backward variants."""
        try:
            layers = tuple(int(v) for v in self.qk_freeze_layers.split(",") if v.strip())
        except ValueError:
            raise UsageError(f"qk_freeze_layers must be comma-separated integers, got {self.qk_freeze_layers!r}") from None
        return dict(presub_gains=self.presub_gains, presub_param=self.presub_param, qk_scale=self.qk_scale,
                    qk_freeze_layers=layers, qk_freeze_planes=self.qk_freeze_planes, rope=self.rope,
                    residual_rule=self.residual_rule, radius_gate=self.radius_gate,
                    checkpoint_blocks=self.checkpoint_blocks, loss_chunk_tokens=self.loss_chunk_tokens,
                    oe_m=self.oe_m, oe_n=self.oe_n, oe_k=self.oe_k, routing=self.routing,
                    routing_out=self.routing_out, routing_eps=self.routing_eps)

    def _validate_tied(self) -> None:
        """Seed 004 settings: the AF-Muon optimizers need the tied family and vice versa."""
        if self.model_family not in ("autoresearch", "tied"):
            raise UsageError(f"model_family must be autoresearch or tied, got {self.model_family!r}")
        if self.model_family == "autoresearch":
            if self.optimizer != "muon_adamw":
                raise UsageError(f"optimizer {self.optimizer} needs a tied table: set --model-family tied")
            return
        from muonlab.optim.af_muon import PRESETS as AF_PRESETS
        from muonlab.tied import TIED_PRESETS

        if self.optimizer not in AF_PRESETS:
            raise UsageError(f"model_family tied trains with an AF-Muon preset ({', '.join(AF_PRESETS)}), "
                             f"got optimizer {self.optimizer!r}")
        if self.tied_preset not in TIED_PRESETS:
            raise UsageError(f"tied_preset must be one of {', '.join(TIED_PRESETS)}, got {self.tied_preset!r}")
        if min(self.af_cap, self.af_scale, self.af_rho, self.af_matrix_lr, self.af_vector_lr) <= 0 or self.af_cap < 1:
            raise UsageError("need af_cap >= 1 and af_scale, af_rho, af_matrix_lr, af_vector_lr > 0")
        if self.grad_clip < 0:
            raise UsageError(f"grad_clip must be >= 0, got {self.grad_clip}")
        from muonlab.tied.gpt import GRAD_SOURCES

        if self.tied_grad_source not in GRAD_SOURCES:
            raise UsageError(f"tied_grad_source must be one of {', '.join(GRAD_SOURCES)}, got {self.tied_grad_source!r}")

    def trajectory_step_set(self) -> set[int]:
        try:
            return {int(v) for v in self.trajectory_steps.split(",") if v.strip()}
        except ValueError:
            raise UsageError(f"trajectory_steps must be comma-separated integers, got {self.trajectory_steps!r}") from None

    def variant_lr_mult(self) -> dict[str, float]:
        return {"presub_gains": self.presub_lr_mult, "qk_scales": self.qk_lr_mult,
                "rope_tau": self.rope_lr_mult, "radius_gates": self.gate_lr_mult}

    # ------------------------------------------------------------------ checks
    def validate(self) -> "TrainConfig":
        """Raise UsageError with one line naming the first impossible setting; return self."""
        positive = ("depth", "aspect_ratio", "head_dim", "sequence_len", "device_batch_size",
                    "total_batch_size", "eval_tokens", "log_every")
        for name in positive:
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
        if self.total_batch_size % self.tokens_per_micro_step != 0:
            raise UsageError(
                f"total_batch_size {self.total_batch_size} is not divisible by device_batch_size x "
                f"sequence_len = {self.device_batch_size} x {self.sequence_len} = {self.tokens_per_micro_step}")
        if not self.window_pattern or any(c not in "SLsl" for c in self.window_pattern):
            raise UsageError(f"window_pattern must use only S and L, got {self.window_pattern!r}")
        if (self.num_steps is None) == (self.time_budget is None):
            raise UsageError("give exactly one of num_steps and time_budget")
        if self.num_steps is not None and self.num_steps < 1:
            raise UsageError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.time_budget is not None and self.time_budget <= 0:
            raise UsageError(f"time_budget must be > 0 seconds, got {self.time_budget}")
        if self.untimed_steps < 0:
            raise UsageError(f"untimed_steps must be >= 0, got {self.untimed_steps}")
        if not (0 <= self.warmup_ratio <= 1 and 0 <= self.warmdown_ratio <= 1
                and self.warmup_ratio + self.warmdown_ratio <= 1):
            raise UsageError("need 0 <= warmup_ratio, 0 <= warmdown_ratio, warmup_ratio + warmdown_ratio <= 1")
        for name in ("embedding_lr", "unembedding_lr", "matrix_lr", "scalar_lr", "weight_decay"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise UsageError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.checkpoint_every < 0 or self.checkpoint_keep < 1:
            raise UsageError("checkpoint_every must be >= 0 and checkpoint_keep >= 1")
        from muonlab.optim.prepolar import DTYPES, PREPOLARS

        if self.prepolar is not None and self.prepolar not in PREPOLARS:
            raise UsageError(f"prepolar must be one of {', '.join(PREPOLARS)}, got {self.prepolar!r}")
        if self.polar_dtype not in DTYPES or self.post_polar_dtype not in (None, *DTYPES):
            raise UsageError("polar_dtype must be bf16|fp32 and post_polar_dtype none|bf16|fp32")
        if self.prepolar_sides not in ("both", "row") or self.prepolar_passes < 1 or self.prepolar_tau < 0:
            raise UsageError("need prepolar_sides both|row, prepolar_passes >= 1 and prepolar_tau >= 0")
        from muonlab.optim.schedules import WD_SCHEDULES

        if self.muon_wd_schedule not in WD_SCHEDULES:
            raise UsageError(f"muon_wd_schedule must be one of {', '.join(WD_SCHEDULES)}, got {self.muon_wd_schedule!r}")
        if self.lr_scale <= 0:
            raise UsageError(f"lr_scale must be > 0, got {self.lr_scale}")
        if self.whiten not in (None, "neumann") or self.whiten_terms < 1 or self.whiten_tau < 0:
            raise UsageError("need whiten none|neumann, whiten_terms >= 1 and whiten_tau >= 0")
        if self.embedding_state not in ("native", "master32"):
            raise UsageError(f"embedding_state must be native or master32, got {self.embedding_state!r}")
        if self.matrix_optimizer not in ("muon", "adamw"):
            raise UsageError(f"matrix_optimizer must be muon or adamw, got {self.matrix_optimizer!r}")
        from muonlab.model import GPTConfig, variants_from_keys

        try:  # the model's own checks of the variant settings
            GPTConfig(n_layer=self.depth, n_head=self.n_head, n_kv_head=self.n_kv_head or self.n_head,
                      n_embd=self.model_dim, variants=variants_from_keys(**self.model_variants()))
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.trajectory_step_set()
        self._validate_tied()
        from muonlab.optim.step0 import STEP0_MODES

        if self.step0_mode not in STEP0_MODES:
            raise UsageError(f"step0_mode must be one of {', '.join(STEP0_MODES)}, got {self.step0_mode!r}")
        if self.step0_mode not in ("none", "nostep0_all") and self.routing == "none":
            raise UsageError(f"step0_mode {self.step0_mode} acts on wte_lambdas/out_lambdas: set routing")
        if self.table_whiten not in (None, "neumann") or self.table_whiten_tau < 0:
            raise UsageError("need table_whiten none|neumann and table_whiten_tau >= 0")
        if self.table_whiten is not None and self.oe_m == 0:
            raise UsageError("table_whiten acts on the Over-Encoding tables: set oe_m")
        if min(self.variant_lr_mult().values()) < 0:
            raise UsageError("variant learning-rate multipliers must be >= 0")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise UsageError(f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.compile not in COMPILE_MODES:
            raise UsageError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.attn_backend not in BACKENDS:
            raise UsageError(f"attn_backend must be one of {', '.join(BACKENDS)}, got {self.attn_backend!r}")
        from muonlab.lab.sinks import parse_sinks

        parse_sinks(self.sinks)
        self.data.validate()
        return self

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        values = dict(values)
        data = DataConfig(**values.pop("data", {}))
        return cls(**values, data=data)

    def config_hash(self) -> str:
        """sha256 (first 16 hex digits) of every field that can change a result."""
        values = self.to_dict()
        for name in BOOKKEEPING_FIELDS:
            values.pop(name, None)
        for name in ("cache_dir", "download_workers", "download_retries", "download_backoff_s",
                     "download_timeout_s"):
            values["data"].pop(name, None)
        blob = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


PRESETS: dict[str, dict[str, Any]] = {
    # Seed papers' protocol (spec-002 §3.1): depth 8, T 2048, vocab 8192, 64 x 4 accumulation
    # = 524,288 tokens per step, 953 fixed steps, zero warmup, ClimbMix.
    "gpu-d8": dict(depth=8, checkpoint_every=200, sequence_len=2048, device_batch_size=64, total_batch_size=2**19,
                   num_steps=953, warmup_ratio=0.0, eval_tokens=40 * 2**19,
                   data=dict(source="climbmix", vocab_size=8192)),
    # Same protocol at depth 6 (26,345,772 scaling parameters).
    "gpu-d6": dict(depth=6, checkpoint_every=200, sequence_len=2048, device_batch_size=64, total_batch_size=2**19,
                   num_steps=953, warmup_ratio=0.0, eval_tokens=40 * 2**19,
                   data=dict(source="climbmix", vocab_size=8192)),
    # Upstream autoresearch as published: 5-minute budget, device batch 128.
    "upstream": dict(depth=8, checkpoint_every=200, sequence_len=2048, device_batch_size=128, total_batch_size=2**19,
                     num_steps=None, time_budget=300.0, eval_tokens=40 * 2**19,
                     data=dict(source="climbmix", vocab_size=8192)),
    # The CPU demo: embedded stdlib corpus, 4 layers x 256 wide, T 256, vocab 2048.
    "cpu-demo": dict(depth=4, aspect_ratio=64, head_dim=128, sequence_len=256,
                     device_batch_size=16, total_batch_size=16 * 256, num_steps=200,
                     untimed_steps=2, muon_momentum_warmup_steps=60,
                     eval_tokens=2**17, precision="fp32", compile="off",
                     log_every=10,
                     # stdlib files are ~2,600 tokens long: cut them at line breaks into pieces
                     # that fit a 257-token row, or best-fit packing drops all but each file's head
                     data=dict(source="stdlib", vocab_size=2048, max_doc_chars=768)),
    # A seconds-long configuration for tests and smoke checks.
    # Seed 004 (AF-Muon) NanoGPT protocol (spec-004 §3 setting 1): tied NanoGPT-124M, T 1024, 16 x 32
    # accumulation = 524,288 tokens per step, 5,100 steps, constant LR, gradient clip 1.0. The paper's
    # FineWeb/SmolLM2-tokenizer cache is replaced by ClimbMix with a 50,304-token BPE (stated, not matched).
    "nanogpt-124m": dict(model_family="tied", tied_preset="nanogpt-124m", optimizer="afmuon", sequence_len=1024,
                         device_batch_size=16, total_batch_size=2**19, num_steps=5100, warmup_ratio=0.0,
                         warmdown_ratio=0.0, grad_clip=1.0, checkpoint_every=250, eval_tokens=5 * 2**20,
                         data=dict(source="climbmix", vocab_size=50304)),
    # A seconds-long tied-GPT configuration (seed 004's arms on CPU).
    "tied-cpu": dict(model_family="tied", tied_preset="tied-tiny", optimizer="afmuon", sequence_len=64,
                     device_batch_size=4, total_batch_size=4 * 64 * 2, num_steps=30, untimed_steps=1,
                     warmup_ratio=0.0, warmdown_ratio=0.0, grad_clip=1.0, eval_tokens=4 * 64 * 4,
                     precision="fp32", compile="off", log_every=1,
                     data=dict(source="synthetic", vocab_size=300, synthetic_bytes=200_000)),
    "cpu-tiny": dict(depth=2, aspect_ratio=32, head_dim=32, sequence_len=64,
                     device_batch_size=4, total_batch_size=4 * 64 * 2, num_steps=12,
                     untimed_steps=1, muon_momentum_warmup_steps=10, eval_tokens=4 * 64 * 4,
                     precision="fp32", compile="off", log_every=1,
                     data=dict(source="synthetic", vocab_size=300, synthetic_bytes=200_000)),
}


def load_config_file(path) -> TrainConfig:
    """A TrainConfig from JSON: a run's config.json ({"config": {...}}) or a bare config dict."""
    from pathlib import Path

    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"config file not found: {path}") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is not a JSON config ({exc.__class__.__name__})") from exc
    values = payload.get("config", payload) if isinstance(payload, dict) else None
    if not isinstance(values, dict):
        raise UsageError(f"{path} does not hold a config object")
    try:
        return TrainConfig.from_dict(values)
    except TypeError as exc:
        raise UsageError(f"{path}: {exc}") from exc


def preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return apply_overrides(TrainConfig(), PRESETS[name])


def apply_overrides(cfg: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """Return a copy of cfg with `overrides` applied (a nested `data` dict updates DataConfig)."""
    cfg = copy.deepcopy(cfg)
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    data_fields = {f.name for f in dataclasses.fields(DataConfig)}
    for key, value in overrides.items():
        if key == "data":
            for dkey, dvalue in value.items():
                if dkey not in data_fields:
                    raise UsageError(f"unknown data setting {dkey!r}")
                setattr(cfg.data, dkey, dvalue)
        elif key in train_fields:
            setattr(cfg, key, value)
        elif key in data_fields:
            setattr(cfg.data, key, value)
        else:
            raise UsageError(f"unknown setting {key!r}")
    return cfg
