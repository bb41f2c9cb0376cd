"""Seed 004's shared-vocabulary encoder-decoders (Table 1 rows 5 and 6, App. J.5), each with one
vocabulary table that is the encoder lookup, the decoder lookup and the output head (a 3-way tie),
trained on the prefix-to-continuation objective:
- the small T5 (`t5-tiny`, `t5-small`) with AF-Muon at rho_out / rho_hid = 1 (Table 14), and the
  untied control of Table 15 (`--t5-tied false`: three tables, all on Hybrid's AdamW);
- T5Gemma2 (`t5gemma2-tiny`, `t5gemma2-270m`): the Hugging Face google/t5gemma-2-270m-270m
  configuration at random init, tie forced, rho ratio 60 (App. J.5, Table 16; muonlab.families.tied.t5.t5gemma2).

The loop hands a model (x, y): here x = [source | decoder input] (S + T tokens) and y = the T
target tokens, so `PackedT5` (model.py) and `PackedT5Gemma2` (t5gemma2.py) split x at S; the loader (`PackedPrefixLoader`) packs the
windows of `muonlab.data.loaders.prefix_continuation` that way. train.sequence_len is the target
length T (the paper's 256), so a step's tokens are target tokens, as the paper counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch

from muonlab.errors import UsageError
from muonlab.families import Family, register_family
from muonlab.families.tied.afmuon import AFMuonConfig, LRSchedule, build_optimizer, cpu_matrix_lr, table_stats
from muonlab.families.tied.t5.model import T5_SHAPES, PackedT5
from muonlab.families.tied.t5.t5gemma2 import T5GEMMA2_MODELS, PackedT5Gemma2
from muonlab.families.tied.token_family import TEXT_TOKEN_SOURCES, eval_examples, evaluate_token_splits, token_data
from muonlab.settings import MethodInfo, Section, setting

T5_SHAPE_NAMES = ("t5-tiny", "t5-small", *T5GEMMA2_MODELS)


@dataclass
class T5ModelConfig(Section):
    """The small T5's shape (vocabulary from the data, target length from train.sequence_len)."""

    FIELD_METHODS: ClassVar[dict[str, MethodInfo]] = {
        "tied": MethodInfo("t5_untied_control", "seed 004 Table 15", "muonlab.families.tied.t5.model",
                           ("tests/families/test_seed004_families.py",), "tied", True)}

    preset: Literal[T5_SHAPE_NAMES] = setting("t5-tiny", "the encoder-decoder: t5-tiny (CPU), t5-small (seed 004 App. "
                                         "J.5), t5gemma2-tiny (CPU) or t5gemma2-270m (App. J.5, Table 16)",
                                         flag="t5-preset")
    tied: bool = setting(True, "one table for encoder, decoder and head (false: seed 004 Table 15's untied "
                         "control, trained with --optimizer hybrid)", flag="t5-tied")
    source_len: int | None = setting(None, "encoder tokens per example (none: the target length, "
                                     "train.sequence_len; the paper's 256 / 256)", flag="t5-source-len")

    def validate(self) -> None:
        if self.source_len is not None and self.source_len < 1:
            raise UsageError(f"t5 source_len must be >= 1, got {self.source_len}")


def _is_t5gemma2(cfg) -> bool:
    return cfg.model.preset in T5GEMMA2_MODELS


def _shape(cfg, vocab_size: int):
    base = T5_SHAPES[cfg.model.preset]
    T = cfg.train.sequence_len
    return replace(base, vocab_size=vocab_size, target_len=T, source_len=cfg.model.source_len or T,
                   tied=cfg.model.tied)


def build_model(cfg, vocab_size: int, runtime):
    if _is_t5gemma2(cfg):
        from muonlab.families.tied.t5.t5gemma2 import build_t5gemma2  # noqa: PLC0415

        T = cfg.train.sequence_len
        model = build_t5gemma2(cfg.model.preset, vocab_size, runtime.device)
        return PackedT5Gemma2(model, cfg.model.source_len or T, T).to(torch.float32)
    with torch.device("meta"):
        model = PackedT5(_shape(cfg, vocab_size))
    model.to_empty(device=runtime.device)
    model.init_weights()
    return model


class PackedPrefixLoader:
    """Prefix-to-continuation batches as (x = [src | tgt_in], y = tgt, epoch), resumable."""

    def __init__(self, mm, B: int, T: int, S: int, seed: int, device, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, drop_last: bool = True, num_examples: int | None = None):
        from muonlab.data.loaders.prefix_continuation import PrefixContinuationLoader  # noqa: PLC0415

        self.inner = PrefixContinuationLoader(mm, batch_size=B, seed=seed, src_len=S, tgt_len=T, bos=0,
                                              shuffle=shuffle, drop_last=drop_last, num_examples=num_examples,
                                              rank=rank, world_size=world_size, device=device)
        self.batches_per_epoch = self.inner.batches_per_epoch

    def __iter__(self):
        return self

    def __next__(self):
        src, tgt_in, tgt = next(self.inner)
        return torch.cat((src, tgt_in), dim=1), tgt, self.inner.epoch

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


def prepare_data(cfg, log=print):
    S = cfg.model.source_len or cfg.train.sequence_len
    return token_data(cfg, log).with_batcher(
        lambda mm, B, T, seed, device, rank, world_size: PackedPrefixLoader(mm, B, T, S, seed, device, rank, world_size))


def evaluate(model, data, cfg, runtime, ctx, splits=("val", "holdout"), tokens=None):
    from muonlab.data.memmap_format import count_blocks  # noqa: PLC0415

    S = cfg.model.source_len or cfg.train.sequence_len

    def eval_loader(mm, B, T, n_tokens, device):
        n = eval_examples(mm, n_tokens, T, count_blocks(mm, S + T, with_target=False))
        return PackedPrefixLoader(mm, B, T, S, 0, device, shuffle=False, drop_last=False, num_examples=n)

    return evaluate_token_splits(model, data, cfg, runtime, ctx, splits, tokens, eval_loader=eval_loader)


def validate(cfg) -> None:
    if _is_t5gemma2(cfg) and not cfg.model.tied:
        raise UsageError("T5Gemma2 is trained tied only (seed 004 Table 16); --t5-tied false is the small "
                         "T5's control (--t5-preset t5-tiny or t5-small)")
    if not cfg.model.tied and cfg.optim.kind not in ("hybrid", "adamw"):
        raise UsageError(f"the untied T5 control (--t5-tied false) has no tied table for {cfg.optim.kind}: "
                         "seed 004 Table 15 trains it with --optimizer hybrid")


_T5_COMMON = {"family": "t5", "optim.kind": "afmuon", "optim.rho": 1.0, "schedule.warmup_ratio": 0.0,
              "schedule.warmdown_ratio": 0.0, "train.grad_clip": 1.0, "train.loss_logged": "mean"}
PRESETS = {
    # seconds on a CPU: the tiny T5 on the synthetic Markov text, 16 + 16 tokens per example; the Muon lr scaled
    # from the paper's 4,096 target tokens an update to these 128 (cpu_matrix_lr: 0.02 * sqrt(1/32))
    "t5-cpu": {**_T5_COMMON, "model.preset": "t5-tiny", "optim.matrix_lr": cpu_matrix_lr(8 * 16, 16 * 256),
               "train.sequence_len": 16, "train.device_batch_size": 8,
               "train.total_batch_size": 8 * 16, "train.num_steps": 40, "train.untimed_steps": 1,
               "train.eval_tokens": 16 * 32, "runtime.device": "cpu", "runtime.precision": "fp32",
               "runtime.compile": "off", "record.log_every": 10, "data.source": "synthetic",
               "data.vocab_size": 512, "data.synthetic_bytes": 200_000},
    # seed 004 App. J.5: 16 examples x 256 target tokens per update, 67,139 updates (275M target tokens),
    # eval every 5,000 on 1M target tokens, rho ratio 1. The paper's FineWeb / SmolLM2 tokenizer (49,152)
    # is replaced by ClimbMix with a 49,152-token BPE unless --source memmap / --tokenizer-json say otherwise.
    "t5-small": {**_T5_COMMON, "model.preset": "t5-small", "train.sequence_len": 256, "train.device_batch_size": 16,
                 "train.total_batch_size": 16 * 256, "train.num_steps": 67_139, "train.eval_every": 5000,
                 "train.eval_tokens": 2**20, "record.checkpoint_every": 5000, "data.source": "climbmix",
                 "data.vocab_size": 49152},
    # T5Gemma2 on CPU: its tiny shape on the synthetic text, 16 + 16 tokens per example, rho 60 as the paper's;
    # the Muon lr scaled from 524,288 target tokens an update to 128 (cpu_matrix_lr: 0.02 / 64)
    "t5gemma2-cpu": {**_T5_COMMON, "model.preset": "t5gemma2-tiny", "optim.rho": 60.0,
                     "optim.matrix_lr": cpu_matrix_lr(8 * 16), "train.sequence_len": 16,
                     "train.device_batch_size": 8, "train.total_batch_size": 8 * 16, "train.num_steps": 40,
                     "train.untimed_steps": 1, "train.eval_tokens": 16 * 32, "runtime.device": "cpu",
                     "runtime.precision": "fp32", "runtime.compile": "off", "record.log_every": 10,
                     "data.source": "synthetic", "data.vocab_size": 512, "data.synthetic_bytes": 200_000},
    # seed 004 App. J.5 / Table 16: 256 + 256 tokens, micro 16 x 128 accumulation = 524,288 target tokens per
    # update, 1,431 updates (750M target tokens), eval every 250 on 1M target tokens, rho 60. Data: the user's
    # FineWeb tokenized with the Gemma tokenizer: `prepare --preset t5gemma2 --download` fetches both (gated), or
    # --source memmap --path DIR of your own (262,144 ids give the paper's table)
    "t5gemma2": {**_T5_COMMON, "model.preset": "t5gemma2-270m", "optim.rho": 60.0, "train.sequence_len": 256,
                 "train.device_batch_size": 16, "train.total_batch_size": 16 * 128 * 256, "train.num_steps": 1431,
                 "train.eval_every": 250, "train.eval_tokens": 2**20, "record.checkpoint_every": 250,
                 "data.source": "memmap"},
}

def _layers(cfg) -> tuple[int, int, int]:
    """(width, encoder layers, decoder layers) of the configured model."""
    if _is_t5gemma2(cfg):
        text = T5GEMMA2_MODELS[cfg.model.preset][0]
        return text["hidden_size"], text["num_hidden_layers"], text["num_hidden_layers"]
    shape = T5_SHAPES[cfg.model.preset]
    return shape.n_embd, shape.n_encoder_layers, shape.n_decoder_layers


def _describe(cfg) -> str:
    width, enc, dec = _layers(cfg)
    return f"t5 {cfg.model.preset}{'' if cfg.model.tied else ' (untied)'}: width {width}, {enc} + {dec} layers"


register_family(Family(
    name="t5", description="seed 004's encoder-decoders with a 3-way tied table (small T5 and its untied "
                           "control, T5Gemma2)",
    model_config=T5ModelConfig, optim_config=AFMuonConfig, build_model=build_model, build_optimizer=build_optimizer,
    schedule=LRSchedule, describe=_describe, depth=lambda cfg: sum(_layers(cfg)[1:]), validate=validate,
    embedding_key=lambda cfg: ("model.model.encoder.text_model.embed_tokens.weight" if _is_t5gemma2(cfg)
                               else "wte.weight"), prepare_data=prepare_data, evaluate=evaluate, presets=PRESETS,
    metric="val_ce", summary_metrics=("val_ce", "val_ppl", "holdout_ce", "holdout_ppl"), final_metrics=table_stats,
    data_sources=TEXT_TOKEN_SOURCES, requires=lambda cfg: ("transformers",) if _is_t5gemma2(cfg) else (),
))
