"""Record an `autoresearch-reference/1` bundle with muonlab's own model and optimizer.

The shared bundles were recorded with upstream code; this recorder writes the same format
for any shape (depth, heads, KV heads, window pattern, precision), so the checker can be
exercised on shapes the shared bundles do not cover and users can record bundles on their
own hardware. Schedules follow upstream's loop with a fixed-step progress.
"""

from __future__ import annotations

import torch

from muonlab.device import autocast_context
from muonlab.model import GPT, GPTConfig
from muonlab.optim.schedules import Schedule, step_progress
from muonlab.reference.verify import BUNDLE_FORMAT

DEFAULT_OPTIMIZER = dict(unembedding_lr=0.004, embedding_lr=0.6, matrix_lr=0.04, weight_decay=0.2,
                         adam_betas=[0.8, 0.95], scalar_lr=0.5)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def record_steps(model, opt, tokens: torch.Tensor, autocast, apply_schedule) -> dict:
    """Train on `tokens` [steps + 1, accum, B, T + 1] as the bundle format records it: per step the
    state before it, every micro-batch loss, the accumulated gradient, and the schedule that
    `apply_schedule(opt, step)` set on the groups (and returned) before `opt.step()`; then the
    final state and the per-token loss of one extra batch. Returns those bundle entries."""
    steps, accum = tokens.shape[0] - 1, tokens.shape[1]
    bx, by = tokens[:steps, ..., :-1].contiguous(), tokens[:steps, ..., 1:].contiguous()
    losses = torch.zeros(steps, accum, dtype=torch.float64)
    records, schedules = [], []
    for s in range(steps):
        params = snapshot(model)
        for k in range(accum):
            with autocast():
                loss = model(bx[s, k], by[s, k])
            losses[s, k] = loss.item()
            (loss / accum).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        schedules.append(apply_schedule(opt, s))
        opt.step()
        model.zero_grad(set_to_none=True)
        records.append({"params": params, "grads": grads})
    ex, ey = tokens[steps, 0, :, :-1].contiguous(), tokens[steps, 0, :, 1:].contiguous()
    with torch.no_grad(), autocast():
        eval_loss = model(ex, ey, reduction="none").double()
    return {"batches_x": bx, "batches_y": by, "schedule": schedules, "losses": losses, "steps": records,
            "final_state_dict": snapshot(model), "eval_x": ex, "eval_y": ey, "eval_loss": eval_loss}


def record_bundle(model_config: dict, precision: str = "fp32", steps: int = 4, accum: int = 2,
                  batch_size: int = 2, seed: int = 0, optimizer: dict | None = None) -> dict:
    """Train `steps` steps on random tokens on CPU and return the bundle dict."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    optimizer_args = dict(DEFAULT_OPTIMIZER if optimizer is None else optimizer)
    torch.manual_seed(seed)
    cfg = GPTConfig(**model_config, attn_backend="sdpa")
    model = GPT(cfg)
    model.init_weights()
    if precision == "fp32":
        model.float()
    opt = model.setup_optimizer(**{**optimizer_args, "adam_betas": tuple(optimizer_args["adam_betas"])},
                                compile=False)
    T, V = cfg.sequence_len, cfg.vocab_size
    tokens = torch.randint(0, V, (steps + 1, accum, batch_size, T + 1))
    schedule = Schedule(momentum_warmup_steps=300)
    init_state = snapshot(model)
    autocast = lambda: autocast_context(torch.device("cpu"), precision)  # noqa: E731
    recorded = record_steps(model, opt, tokens, autocast,
                            lambda o, s: schedule.apply(o, s, step_progress(s, steps, untimed_steps=0)))
    return {"format": BUNDLE_FORMAT, "model_config": dict(model_config), "optimizer": optimizer_args,
            "precision": precision, "init_state_dict": init_state, **recorded}
