"""A few training steps of one resolved config through the real training loop
(muonlab.train.loop.train_loop, with its family's schedule and step hooks), compiled as a CUDA
run compiles (torch.compile of the model, the optimizer's compiled step) or eager, on fixed token
batches: the compiled-against-eager check of tests/doctor/test_gpu_acceptance.py."""

from __future__ import annotations

import itertools

import torch

from muonlab.device import Runtime
from muonlab.train.build import build_model, build_optimizer
from muonlab.train.loop import train_loop


# Steps of a compiled-against-eager case: enough for its losses to move by more than 0.1 nats, so
# that a wrong compiled gradient shows (tests/doctor/test_doctor_gpu.py checks each case on the CPU). Seed
# 004's CPU presets scale the Muon lr to their batch (cpu_matrix_lr), so their cases take more steps:
# in 8 steps tied-cpu's K.8 arm moves 0.17 nats, hf-cpu 0.16, imagegpt-cpu 0.06 (0.38 in 20); the
# t5-cpu untied Hybrid 0.07 in 20, 0.14 in 30.
STEPS, FAMILY_STEPS = 4, {"t5": 30, "tied": 8, "hf": 8, "imagegpt": 16}


def case_steps(model_family: str) -> int:
    return FAMILY_STEPS.get(model_family, STEPS)


def input_width(cfg) -> int:
    """Tokens of a micro-batch row x as the family's loader hands it to the model: the target
    length T, and for the encoder-decoders (the t5 family's PackedPrefixLoader) the S source
    tokens before the T decoder inputs, x = [source | decoder input]."""
    T = cfg.train.sequence_len
    return T + (cfg.model.source_len or T) if cfg.family == "t5" else T


def fixed_batches(cfg, vocab_size: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Enough (x, y) micro-batches for cfg.train.num_steps steps and the loop's one look-ahead:
    x of input_width(cfg) tokens, y the T tokens that follow x's last T.

    Each row follows a fixed random permutation of the vocabulary from a random first token, a
    bigram map a model learns within a few steps, so the losses move (on uniform random tokens
    they stay at log V whatever the gradients are, and a wrong gradient would go unseen)."""
    count = cfg.train.num_steps * cfg.train.accum_steps_per_rank(1) + 1
    g = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab_size, generator=g)
    rows = torch.empty(count, cfg.train.device_batch_size, input_width(cfg) + 1, dtype=torch.long)
    rows[..., 0] = torch.randint(0, vocab_size, rows.shape[:-1], generator=g)
    for t in range(1, rows.shape[-1]):
        rows[..., t] = successor[rows[..., t - 1]]
    T = cfg.train.sequence_len
    return [(r[:, :-1].contiguous(), r[:, -T:].contiguous()) for r in rows]


def train_losses(cfg, compiled: bool, vocab_size: int | None = None) -> tuple[list[float], int]:
    """(the loss of every step, graphs dynamo compiled) for cfg trained from its seed on
    fixed_batches; cfg.runtime.device and cfg.runtime.precision decide where and how."""
    from torch._dynamo.utils import counters

    vocab_size = vocab_size or cfg.data.vocab_size
    device = torch.device(cfg.runtime.device)
    precision = cfg.runtime.precision if cfg.runtime.precision != "auto" else "fp32"
    runtime = Runtime(device, precision)
    batches = fixed_batches(cfg, vocab_size)
    loader = ((x.to(device), y.to(device), 1) for x, y in itertools.cycle(batches))
    torch._dynamo.reset()  # a fresh compile per run: no graph cached from another arm, no recompile limit
    counters.clear()
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, vocab_size, runtime)
    optimizer = build_optimizer(model, cfg, compile_step=compiled)
    train_model = torch.compile(model, dynamic=False) if compiled else model
    losses: list[float] = []
    train_loop(cfg, train_model, optimizer, loader, runtime, model.estimate_flops(),
               on_step=lambda record: losses.append(record["loss"]))
    return losses, int(counters["stats"]["unique_graphs"])
