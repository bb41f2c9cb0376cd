"""The tied-token family of seed 004: NanoGPT (and NanoGPT-MoE) with one tied embedding/head
table, trained with AF-Muon or its baselines (muonlab.optim.af_muon)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch

from muonlab.errors import UsageError
from muonlab.families import Family, register_family
from muonlab.tied.table_stats import table_stats
from muonlab.settings import MethodInfo, Section, setting
from muonlab.tied import TIED_PRESETS

TIED_SHAPES = tuple(TIED_PRESETS)

AF_OPTIMIZERS = ("afmuon", "hybrid", "sign", "factorial_lmo_rms", "factorial_lmo_adamw", "factorial_adamw_rms",
                 "factorial_adamw_adamw", "adamw")


@dataclass
class TiedModelConfig(Section):
    """The tied GPT's shape (vocabulary from the data, context from train.sequence_len)."""

    FIELD_METHODS: ClassVar[dict[str, MethodInfo]] = {
        "grad_source": MethodInfo("tied_gradient_source", "seed 004 K.8", "muonlab.tied.gpt",
                                  ("tests/test_tied_lab.py",), "grad_source", "both")}

    preset: Literal[TIED_SHAPES] = setting("tied-tiny", "the tied model's shape", flag="tied-preset")
    grad_source: Literal["both", "lookup", "softmax"] = setting(
        "both", "seed 004 K.8: the tied table's gradient source (lookup = input-only, softmax = output-only)",
        flag="tied-grad-source")
    n_embd: int | None = setting(None, "the width d (none: the preset's); heads keep the preset's head dim and "
                                 "the MLP its 4d (seed 004 K.4: d 768, 1024, 1536 at head dim 128)",
                                 flag="tied-n-embd")

    def validate(self) -> None:
        head_dim = TIED_PRESETS[self.preset].n_embd // TIED_PRESETS[self.preset].n_head
        if self.n_embd is not None and (self.n_embd < 1 or self.n_embd % head_dim):
            raise UsageError(f"tied_n_embd must be a positive multiple of {self.preset}'s head dim {head_dim}, "
                             f"got {self.n_embd}")

    def shape(self):
        """The preset's TiedGPTConfig with this section's width (vocabulary and context set at build)."""
        base = TIED_PRESETS[self.preset]
        if self.n_embd is None:
            return base
        return replace(base, n_embd=self.n_embd, n_head=self.n_embd // (base.n_embd // base.n_head))


@dataclass
class AFMuonConfig(Section):
    """Seed 004 §3: AF-Muon (c 3, s 0.5, rho 60, Muon lr 0.02, vector lr 3e-4) and its baselines."""

    METHOD: ClassVar[MethodInfo] = MethodInfo(
        "af_muon", "seed 004 §3 (Table 1; K.1, K.3, K.7)", "muonlab.optim.af_muon; muonlab.optim.lmo",
        ("tests/test_af_muon.py", "tests/test_lmo.py", "tests/test_tied_lab.py"), "kind", None)

    kind: Literal[AF_OPTIMIZERS] = setting("afmuon", "AF-Muon, Hybrid Muon, Sign (c = 1), the K.1 factorial "
                                           "(tied rule x vector rule), or plain AdamW", flag="optimizer")
    cap: float | None = setting(None, "the clipped-row LMO's cap c (none: the optimizer's own, AF-Muon 3; "
                                "Sign fixes 1; inf allowed)", flag="af-cap")
    scale: float | None = setting(None, "the tied table's scale s (none: the optimizer's own, AF-Muon 0.5, "
                                  "Sign 1)", flag="af-scale")
    rho: float = setting(60.0, "the tied table's rho", flag="af-rho")
    matrix_lr: float = setting(0.02, "Muon / tied-table base lr", flag="af-matrix-lr")
    vector_lr: float = setting(3e-4, "vector (and auxiliary AdamW) lr", flag="af-vector-lr")
    adamw_lr: float = setting(6e-4, "the AdamW baseline's lr (seed 004's tuned pilot value)", flag="af-adamw-lr")

    def tied_rule(self) -> str:
        return "lmo" if self.kind in ("afmuon", "sign", "factorial_lmo_rms", "factorial_lmo_adamw") else "adamw"

    def inactive(self) -> dict[str, str]:
        if self.kind == "adamw":
            why = "optimizer adamw trains every tensor with AdamW"
            return {k: why for k in ("cap", "scale", "rho", "matrix_lr", "vector_lr")}
        out = {"adamw_lr": f"only optimizer adamw reads it (optimizer is {self.kind})"}
        if self.tied_rule() == "adamw":
            why = f"optimizer {self.kind} puts the tied table on AdamW"
            out.update(cap=why, scale=why, rho=why)
        return out

    def validate(self) -> None:
        if self.kind == "sign" and self.cap not in (None, 1.0):
            raise UsageError(f"optimizer sign fixes af_cap = 1, got {self.cap}")
        cap = 3.0 if self.cap is None else self.cap
        scale = 0.5 if self.scale is None else self.scale
        if math.isnan(cap) or cap < 1 or min(scale, self.rho, self.matrix_lr, self.vector_lr, self.adamw_lr) <= 0:
            raise UsageError("need af_cap >= 1 and af_scale, af_rho, af_matrix_lr, af_vector_lr, af_adamw_lr > 0")


def build_model(cfg, vocab_size: int, runtime):
    """Fp32 parameters (seed 004 keeps parameters and state in fp32 under bf16 autocast), the
    preset's shape with the data's vocabulary and the run's context."""
    from muonlab.tied import build_tied_model  # noqa: PLC0415

    with torch.device("meta"):
        model = build_tied_model(cfg.model.shape(), vocab_size=vocab_size, sequence_len=cfg.train.sequence_len,
                                 grad_source=cfg.model.grad_source)
    model.to_empty(device=runtime.device)
    model.init_weights()
    return model


def build_optimizer(model, cfg, compile_step: bool, distributed: bool = False):
    from muonlab.optim import af_muon  # noqa: PLC0415

    o = cfg.optim
    if distributed and o.kind == "adamw":
        raise UsageError("optimizer adamw (torch's AdamW) runs in one process; under torchrun use the AF-Muon "
                         "optimizers (afmuon, hybrid, sign, factorial_*)")
    if o.kind == "adamw":  # seed 004's protein baseline: plain AdamW everywhere
        optimizer = af_muon.build_optimizer(model, "adamw", lr=o.adamw_lr)
    elif o.kind == "hybrid" and not af_muon.is_tied(model):  # seed 004 Table 15's untied control
        optimizer = af_muon.build_optimizer(model, "hybrid_untied", lr=o.matrix_lr, aux_lr=o.vector_lr)
    else:
        lmo = {k: v for k, v in (("cap", o.cap), ("scale", o.scale)) if v is not None and o.tied_rule() == "lmo"}
        if o.kind == "sign":
            lmo.pop("cap", None)  # fixed at 1 by the optimizer (validated above)
        optimizer = af_muon.build_optimizer(model, o.kind, lr=o.matrix_lr, vector_lr=o.vector_lr,
                                            aux_lr=o.vector_lr, rho=o.rho, **lmo)
    if distributed:  # the same groups, averaged, clipped and sharded across the ranks by the optimizer
        from muonlab.optim.af_muon_distributed import DistAFMuon  # noqa: PLC0415

        dist_opt = DistAFMuon(optimizer.param_groups, max_grad_norm=cfg.train.grad_clip or None,
                              clip_params=model.parameters())
        dist_opt.roles = optimizer.roles
        optimizer = dist_opt
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]  # the lab's schedule scales every group from here
    return optimizer


class LRSchedule:
    """AF-Muon's groups follow only the LR multiplier (their momentum and decay are fixed)."""

    def __init__(self, cfg):
        from muonlab.optim.schedules import Schedule  # noqa: PLC0415

        s = cfg.schedule
        self._shape = Schedule(warmup_ratio=s.warmup_ratio, warmdown_ratio=s.warmdown_ratio,
                               final_lr_frac=s.final_lr_frac)

    def apply(self, optimizer, step: int, progress: float) -> dict[str, float]:
        lrm = self._shape.lr_multiplier(progress)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        return {"lrm": lrm}


def step_hooks(cfg, model) -> list:
    """The MoE's: experts no token chose keep `.grad` None under torch.compile too (muonlab.tied.moe)."""
    from muonlab.tied.moe import TopKMoE, UnroutedExpertGrads  # noqa: PLC0415

    layers = [m for m in model.modules() if isinstance(m, TopKMoE)]
    return [UnroutedExpertGrads(layers)] if layers else []


def _describe(cfg) -> str:
    shape = cfg.model.shape()
    return f"tied {cfg.model.preset}: width {shape.n_embd}, depth {shape.n_layer}{', MoE' if shape.moe else ''}"


PRESETS = {
    # Seed 004 NanoGPT protocol (spec-004 §3 setting 1): tied NanoGPT-124M, T 1024, 16 x 32
    # accumulation = 524,288 tokens per step, 5,100 steps, constant LR, gradient clip 1.0. The paper's
    # FineWeb/SmolLM2-tokenizer cache is replaced by ClimbMix with a 50,304-token BPE (stated, not matched).
    "nanogpt-124m": {"family": "tied", "model.preset": "nanogpt-124m", "optim.kind": "afmuon",
                     "train.sequence_len": 1024, "train.device_batch_size": 16, "train.total_batch_size": 2**19,
                     "train.num_steps": 5100, "schedule.warmup_ratio": 0.0, "schedule.warmdown_ratio": 0.0,
                     "train.grad_clip": 1.0, "record.checkpoint_every": 250, "train.eval_tokens": 5 * 2**20,
                     "data.source": "climbmix", "data.vocab_size": 50304},
    # a seconds-long tied-GPT configuration (seed 004's arms on CPU; on the CPU on a GPU machine too)
    "tied-cpu": {"family": "tied", "model.preset": "tied-tiny", "optim.kind": "afmuon", "train.sequence_len": 64,
                 "train.device_batch_size": 4, "train.total_batch_size": 4 * 64 * 2, "train.num_steps": 30,
                 "train.untimed_steps": 1, "schedule.warmup_ratio": 0.0, "schedule.warmdown_ratio": 0.0,
                 "train.grad_clip": 1.0, "train.eval_tokens": 4 * 64 * 4, "runtime.device": "cpu",
                 "runtime.precision": "fp32", "runtime.compile": "off", "record.log_every": 1,
                 "data.source": "synthetic", "data.vocab_size": 300, "data.synthetic_bytes": 200_000},
}
# NanoGPT-MoE (App. J.6: top-1 over four ReLU^2 experts, load-balancing 0.01) at the CPU size, and at the paper's
PRESETS["tied-moe-cpu"] = {**PRESETS["tied-cpu"], "model.preset": "tied-tiny-moe"}
PRESETS["nanogpt-124m-moe"] = {**PRESETS["nanogpt-124m"], "model.preset": "nanogpt-124m-moe"}

def prepare_data(cfg, log=print):
    """Text through the packed loader (bits per byte), or seed 004's token memmaps as NanoGPT blocks."""
    from muonlab.families import text_data  # noqa: PLC0415
    from muonlab.families.token_family import block_batcher, token_data  # noqa: PLC0415

    if cfg.data.source == "memmap":
        return token_data(cfg, log).with_batcher(block_batcher)
    return text_data(cfg, log)


def evaluate(model, data, cfg, runtime, ctx, splits=("val", "holdout"), tokens=None):
    """Loss (and bits per byte on text) per split; an MoE's router statistics of the same pass beside them
    (seed 004 Table 19: router entropy, max expert fraction, load CV, unused experts)."""
    from muonlab.data.token_data import TokenData  # noqa: PLC0415
    from muonlab.families.token_family import evaluate_token_splits  # noqa: PLC0415
    from muonlab.eval.text import evaluate_text_splits  # noqa: PLC0415
    from muonlab.tied.moe import RouterCounts  # noqa: PLC0415

    score = evaluate_token_splits if isinstance(data, TokenData) else evaluate_text_splits
    out = {}
    for split in splits:
        with RouterCounts(model) as router:
            out.update(score(model, data, cfg, runtime, ctx, (split,), tokens))
        if split in out:
            out[split].extra.update(router.stats(ctx.all_reduce_ if ctx.active else None))
    return out


register_family(Family(
    name="tied", description="seed 004's tied-token GPT (NanoGPT, NanoGPT-MoE) with AF-Muon and its baselines",
    model_config=TiedModelConfig, optim_config=AFMuonConfig, build_model=build_model,
    build_optimizer=build_optimizer, schedule=LRSchedule, step_hooks=step_hooks,
    describe=_describe, depth=lambda cfg: cfg.model.shape().n_layer,
    presets=PRESETS, embedding_key="wte.weight", prepare_data=prepare_data, evaluate=evaluate,
    metric="val_ce", summary_metrics=("val_ce", "val_ppl", "holdout_ce", "holdout_ppl"), final_metrics=table_stats,
    data_sources=("climbmix", "local", "stdlib", "synthetic", "memmap"),
))
