"""Bits per byte of a text run's val and holdout splits (the autoresearch metric; the tied GPT's
on text too): packed rows of the prepared corpus, scored by `muonlab.eval.bpb`."""

from __future__ import annotations

import itertools

from muonlab.eval.bpb import EvalResult, evaluate_bpb


def evaluate_text_splits(model, data, cfg, runtime, ctx, splits: tuple[str, ...] = ("val", "holdout"),
                         tokens: int | None = None) -> dict[str, EvalResult]:
    """val_bpb and holdout_bpb, each over at most `tokens` (default cfg.train.eval_tokens)
    tokens of its split: always the first ones, so periodic evaluations score the same text.

    With several processes, rank r scores batches r, r+W, ... and the sums are reduced, so
    the same tokens are scored whatever the world size.
    """
    token_bytes = data.tokenizer.token_bytes(device=runtime.device)
    batch = cfg.train.eval_batch_size or cfg.train.device_batch_size
    tokens = tokens or cfg.train.eval_tokens
    model.eval()
    results = {}
    for split in splits:
        rows = data.eval_rows(split, batch, cfg.train.sequence_len, tokens, device=runtime.device,
                              world_size=ctx.world_size)
        shard = itertools.islice(rows, ctx.rank, None, ctx.world_size) if ctx.active else rows
        results[split] = evaluate_bpb(model, shard, token_bytes, runtime.autocast, runtime.device,
                                      reduce=ctx.all_reduce_ if ctx.active else None)
    model.train()
    return results
