"""Seed 004 App. K.9's boundary control as a model family: the attention-free shared-MLP LM whose one
up- and one down-projection are reused at four depths, with an untied input table, positional table and
head (`muonlab.families.tied.reuse.model`), trained with Hybrid Muon (Muon 0.02, wd 0.1 on the shared matrices;
AdamW 3e-4, wd 0.01 on the tables and gains), FP32 without autocast. `muonlab diagnose reuse --run RUN`
computes Table 39 from the trained run (`muonlab.papers.seed004.diagnostics.reuse`).

Choices where the paper is silent (K.9 gives the shape, the optimizer, 5.0M predicted tokens, one seed):
batch 32 x 256 tokens (8,192 a step, 610 steps = 4,997,120 tokens), constant lr, clipping 1.0 as the other
seed-004 runs, the positional table as long as the context (256), seed 43 (the ablations' seed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from muonlab.errors import UsageError
from muonlab.families import Family, register_family
from muonlab.families.tied.afmuon import AFMuonConfig, LRSchedule, build_optimizer
from muonlab.families.tied.token_family import TEXT_TOKEN_SOURCES, block_batcher, evaluate_token_splits, token_data
from muonlab.settings import Section, setting
from muonlab.families.tied.reuse.model import SharedMLPConfig, SharedMLPLM

REUSE_SHAPES = {
    "k9": SharedMLPConfig(),  # seed 004 K.9: d 512, FF 2048, 4 depths (vocabulary and context from the run)
    "k9-tiny": SharedMLPConfig(vocab_size=256, n_embd=64, ff_hidden=128, sequence_len=64),  # CPU seconds
}


@dataclass
class ReuseModelConfig(Section):
    """The shared-MLP model's shape (vocabulary from the data, positional table from train.sequence_len)."""

    preset: Literal[tuple(REUSE_SHAPES)] = setting("k9-tiny", "the shape: k9-tiny (CPU) or k9 (seed 004 K.9)",
                                                   flag="reuse-preset")


def _shape(cfg, vocab_size: int) -> SharedMLPConfig:
    return replace(REUSE_SHAPES[cfg.model.preset], vocab_size=vocab_size, sequence_len=cfg.train.sequence_len)


def build_model(cfg, vocab_size: int, runtime):
    with torch.device("meta"):
        model = SharedMLPLM(_shape(cfg, vocab_size))
    model.to_empty(device=runtime.device)
    model.init_weights()
    return model


def validate(cfg) -> None:
    if cfg.optim.kind not in ("hybrid", "adamw"):
        raise UsageError(f"the K.9 shared-MLP model is untied: optimizer {cfg.optim.kind} needs a tied table "
                         "(seed 004 K.9 trains it with --optimizer hybrid)")


def prepare_data(cfg, log=print):
    return token_data(cfg, log).with_batcher(block_batcher)


def evaluate(model, data, cfg, runtime, ctx, splits=("val", "holdout"), tokens=None):
    return evaluate_token_splits(model, data, cfg, runtime, ctx, splits, tokens)


def _describe(cfg) -> str:
    s = REUSE_SHAPES[cfg.model.preset]
    return f"reuse {cfg.model.preset}: width {s.n_embd}, one MLP ({s.ff_hidden}) reused at {s.n_layer} depths"


_COMMON = {"family": "reuse", "optim.kind": "hybrid", "schedule.warmup_ratio": 0.0, "schedule.warmdown_ratio": 0.0,
           "train.grad_clip": 1.0, "train.loss_logged": "mean", "runtime.precision": "fp32"}
PRESETS = {
    "reuse-cpu": {**_COMMON, "model.preset": "k9-tiny", "train.sequence_len": 64, "train.device_batch_size": 8,
                  "train.total_batch_size": 8 * 64, "train.num_steps": 40, "train.untimed_steps": 1,
                  "train.eval_tokens": 64 * 32, "runtime.device": "cpu", "runtime.compile": "off",
                  "record.log_every": 10, "data.source": "synthetic", "data.vocab_size": 512,
                  "data.synthetic_bytes": 200_000},
    # K.9: FineWeb with the SmolLM2 tokenizer (49,152; --source memmap --path DIR), 5.0M predicted tokens
    "reuse-k9": {**_COMMON, "model.preset": "k9", "train.sequence_len": 256, "train.device_batch_size": 32,
                 "train.total_batch_size": 32 * 256, "train.num_steps": 610, "train.eval_tokens": 2**20,
                 "data.source": "memmap"},
}

register_family(Family(
    name="reuse", description="seed 004 K.9's shared-MLP model (one dense MLP reused at four depths, untied)",
    model_config=ReuseModelConfig, optim_config=AFMuonConfig, build_model=build_model, build_optimizer=build_optimizer,
    schedule=LRSchedule, describe=_describe, depth=lambda cfg: REUSE_SHAPES[cfg.model.preset].n_layer,
    validate=validate, embedding_key="wte.weight", prepare_data=prepare_data, evaluate=evaluate, presets=PRESETS,
    metric="val_ce", summary_metrics=("val_ce", "val_ppl", "holdout_ce", "holdout_ppl"),
    data_sources=TEXT_TOKEN_SOURCES,
))
