"""The optimizer's compiled step as upstream's: one graph per shape group (an AdamW step per distinct parameter
shape, a Muon step per shape group), compiled at the first step and never again while the schedule moves the
learning rates, momentum and weight decay (they are tensors, so a new value is no recompile). Counted with
dynamo's CompileCounter backend: the graphs dynamo makes, without Inductor's code generation."""

from __future__ import annotations

import torch
import torch._dynamo.testing

from muonlab.arms import resolve_config
from muonlab.device import Runtime
from muonlab.train.build import build_model, build_optimizer
from muonlab.train.loop import train_loop
from support.compile_check import fixed_batches



def test_one_graph_per_shape_group_and_no_recompile_as_the_schedule_moves(monkeypatch):
    counter = torch._dynamo.testing.CompileCounter()
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": counter}))
    torch._dynamo.reset()
    steps = 6
    cfg = resolve_config("baseline", "cpu-tiny", {"num_steps": steps, "quiet": True, "muon_momentum_warmup_steps": 4,
                                                  "record.trajectory_steps": ""})
    runtime = Runtime(torch.device("cpu"), "fp32")
    torch.manual_seed(0)
    model = build_model(cfg, cfg.data.vocab_size, runtime)
    optimizer = build_optimizer(model, cfg, compile_step=True)
    counts, momenta = [], []

    def on_step(record):
        counts.append(counter.frame_count)
        momenta.append(record["muon_momentum"])

    batches = fixed_batches(cfg, cfg.data.vocab_size)
    train_loop(cfg, model, optimizer, ((x, y, 1) for x, y in batches), runtime, model.estimate_flops(),
               on_step=on_step)
    torch._dynamo.reset()
    adamw_shapes = {tuple(p.shape) for g in optimizer.param_groups if g["kind"] == "adamw" for p in g["params"]}
    muon_groups = [g for g in optimizer.param_groups if g["kind"] == "muon"]
    assert len(set(momenta)) > 1  # the schedule moved while the graphs stayed
    assert counts == [len(adamw_shapes) + len(muon_groups)] * steps, counts
