"""Shared test support: small GPTs whose branches are live, for the model-variant tests."""

import dataclasses

import torch

from muonlab.model import GPT, GPTConfig
from muonlab.train.build import gpt_config_with


def small(**kw):
    """A 4-layer, 64-wide GPT config on SDPA (window pattern SSSL), with `kw` on top: GPTConfig fields,
    and run-config settings by flag name (`qk_scale="pair_tied_exp"`) for the variants."""
    upstream = {f.name for f in dataclasses.fields(GPTConfig)}
    base = dict(sequence_len=32, vocab_size=64, n_layer=4, n_head=2, n_kv_head=2, n_embd=64,
                window_pattern="SSSL", attn_backend="sdpa")
    base.update((k, v) for k, v in kw.items() if k in upstream)
    return gpt_config_with({k: v for k, v in kw.items() if k not in upstream}, **base)


def live_baseline(seed=0, **kw):
    """An fp32 baseline whose branch outputs are not zero (init zeroes every c_proj)."""
    torch.manual_seed(seed)
    model = GPT(small(**kw))
    model.init_weights()
    model.float()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_proj.weight.normal_(0, 0.05)
            block.mlp.c_proj.weight.normal_(0, 0.05)
            if block.attn.ve_gate is not None:
                block.attn.ve_gate.weight.normal_(0, 0.5)
    return model


def assert_trained(run_dir, drop: float = 0.5) -> None:
    """The run's logged training loss fell by at least `drop` nats from its first step to its
    last: an absolute check that runs compared with each other trained at all."""
    import json
    from pathlib import Path

    losses = [json.loads(line)["loss"] for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] - drop, f"loss {losses[0]:.4f} -> {losses[-1]:.4f}: the run did not train"
