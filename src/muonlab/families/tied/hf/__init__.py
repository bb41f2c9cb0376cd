"""Seed 004's Hugging Face settings (Table 1 rows 2-4 and 9): SmolLM2-135M, Qwen2.5-0.5B and
Llama-3.2-1B shapes and the protein Llama, built at random init from their public configuration
numbers (`muonlab.families.tied.hf.model`; nothing is downloaded) with tied input and output embeddings, and
trained on token blocks with AF-Muon or its baselines (the protein's pure-AdamW baseline too).

The vocabulary is the data's (the model's table has one row per token id the data can hold):
with the paper's tokenizer (`--source memmap` of your FineWeb cache, or `--tokenizer-json`) the
table is the paper's size. `tiny-llama` is the CPU shape of every setting here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from muonlab.families import Family, register_family
from muonlab.families.tied.afmuon import AFMuonConfig, LRSchedule, build_optimizer, cpu_matrix_lr, table_stats
from muonlab.families.tied.hf.model import HF_MODELS, HFCausalLM
from muonlab.families.tied.token_family import PROTEIN_SOURCES, TEXT_TOKEN_SOURCES, block_batcher, evaluate_token_splits, token_data
from muonlab.settings import Section, setting

HF_SHAPE_NAMES = tuple(HF_MODELS)


@dataclass
class HFModelConfig(Section):
    """Which Hugging Face configuration (vocabulary from the data, context from train.sequence_len)."""

    preset: Literal[HF_SHAPE_NAMES] = setting("tiny-llama", "the model's public configuration: smollm2-135m, "
                                         "qwen2.5-0.5b, llama-3.2-1b, protein-llama, or tiny-llama / tiny-qwen2 "
                                         "(CPU)",
                                         flag="hf-preset")


def build_model(cfg, vocab_size: int, runtime):
    from muonlab.families.tied.hf.model import build_hf_model  # noqa: PLC0415

    model = build_hf_model(cfg.model.preset, device=runtime.device, vocab_size=vocab_size,
                           max_positions=cfg.train.sequence_len)
    return HFCausalLM(model).to(torch.float32)


def prepare_data(cfg, log=print):
    return token_data(cfg, log).with_batcher(block_batcher)


def evaluate(model, data, cfg, runtime, ctx, splits=("val", "holdout"), tokens=None):
    return evaluate_token_splits(model, data, cfg, runtime, ctx, splits, tokens)


_COMMON = {"family": "hf", "optim.kind": "afmuon", "schedule.warmup_ratio": 0.0, "schedule.warmdown_ratio": 0.0,
           "train.grad_clip": 1.0, "train.loss_logged": "mean"}
# the CPU stand-ins' Muon lr scaled to their 512-token batch (cpu_matrix_lr: 0.02 / 32)
_CPU = {"train.num_steps": 40, "train.untimed_steps": 1, "runtime.device": "cpu", "runtime.precision": "fp32",
        "runtime.compile": "off", "record.log_every": 10, "optim.matrix_lr": cpu_matrix_lr(8 * 64)}


def _paper(preset, micro, accum, T, steps, eval_every, eval_tokens, source="memmap"):
    return {**_COMMON, "model.preset": preset, "train.sequence_len": T, "train.device_batch_size": micro,
            "train.total_batch_size": micro * accum * T, "train.num_steps": steps, "train.eval_every": eval_every,
            "train.eval_tokens": eval_tokens, "record.checkpoint_every": eval_every, "data.source": source}


PRESETS = {
    # seconds on a CPU: a 2-layer Llama on the synthetic Markov text (BPE 512), 8 x 64 tokens a step
    "hf-cpu": {**_COMMON, **_CPU, "model.preset": "tiny-llama", "train.sequence_len": 64,
               "train.device_batch_size": 8, "train.total_batch_size": 8 * 64, "train.eval_tokens": 64 * 32,
               "data.source": "synthetic", "data.vocab_size": 512, "data.synthetic_bytes": 200_000},
    # Qwen2.5's architecture on CPU (q/k/v biases: vectors for AF-Muon, AdamW for Hybrid), as hf-cpu otherwise
    "qwen2.5-cpu": {**_COMMON, **_CPU, "model.preset": "tiny-qwen2", "train.sequence_len": 64,
                    "train.device_batch_size": 8, "train.total_batch_size": 8 * 64, "train.eval_tokens": 64 * 32,
                    "data.source": "synthetic", "data.vocab_size": 512, "data.synthetic_bytes": 200_000},
    # the protein setting on CPU: the same Llama on a synthetic Markov proteome, one token per residue
    "protein-cpu": {**_COMMON, **_CPU, "model.preset": "tiny-llama", "train.sequence_len": 64,
                    "train.device_batch_size": 8, "train.total_batch_size": 8 * 64, "train.eval_tokens": 64 * 32,
                    "data.source": "synthetic_protein", "data.synthetic_bytes": 300_000},
    # seed 004 App. J.2–J.4, J.8 (the paper's FineWeb caches: --source memmap --path DIR, tokenized with
    # the model's own tokenizer; UniRef50 FASTA with --tokenizer-json of ProtGPT2 for the protein)
    "smollm2-135m": _paper("smollm2-135m", 32, 16, 1024, 4768, 250, 5 * 2**20),
    "qwen2.5-0.5b": _paper("qwen2.5-0.5b", 8, 64, 1024, 1907, 250, 5 * 2**20),
    "llama-3.2-1b": _paper("llama-3.2-1b", 32, 16, 1024, 3814, 250, 2**20),
    "protein-llama": _paper("protein-llama", 32, 32, 512, 953, 125, 5 * 2**20, source="fasta"),
}

register_family(Family(
    name="hf", description="seed 004's Hugging Face LMs (SmolLM2, Qwen2.5, Llama-3.2, protein Llama), tied, random init",
    model_config=HFModelConfig, optim_config=AFMuonConfig, build_model=build_model, build_optimizer=build_optimizer,
    schedule=LRSchedule, describe=lambda cfg: (f"hf {cfg.model.preset}: width "
                                               f"{HF_MODELS[cfg.model.preset][1]['hidden_size']}, depth "
                                               f"{HF_MODELS[cfg.model.preset][1]['num_hidden_layers']}"),
    depth=lambda cfg: HF_MODELS[cfg.model.preset][1]["num_hidden_layers"], embedding_key="model.model.embed_tokens.weight",
    prepare_data=prepare_data, evaluate=evaluate, presets=PRESETS, metric="val_ce",
    summary_metrics=("val_ce", "val_ppl", "holdout_ce", "holdout_ppl"), final_metrics=table_stats,
    data_sources=TEXT_TOKEN_SOURCES + PROTEIN_SOURCES, requires=lambda cfg: ("transformers",),
))
