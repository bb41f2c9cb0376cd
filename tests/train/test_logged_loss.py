"""What a step logs (issue 31 item 6): the training loss of the last micro-batch (upstream) or the mean
over the step's micro-batches (seed 004's logs, its families' default), and with a gradient clip the
gradient norm before it (seed 004 Table 13). Logging never changes what is trained."""

from __future__ import annotations

import json

import pytest
import torch

from muonlab.cli import main


def run(tmp_path, name, *flags):
    argv = ["train", "--preset", "cpu-tiny", "--num-steps", "4", "--runs-dir", str(tmp_path), "--run-name", name,
            "--json", *flags]
    assert main(argv) == 0
    lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return lines, torch.load(tmp_path / name / "model.pt", weights_only=True)


def same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_mean_or_the_last_micro_batch_is_logged_and_training_is_the_same(tmp_path, capsys):
    four = ("--total-batch-size", "1024")  # 4 micro-batches a step (cpu-tiny's synthetic loader repeats pairs)
    last, w_last = run(tmp_path, "last", *four)
    mean, w_mean = run(tmp_path, "mean", "--loss-logged", "mean", *four)
    assert same_weights(w_last, w_mean)
    assert any(a["loss"] != b["loss"] for a, b in zip(last, mean))
    one, _ = run(tmp_path, "one", "--loss-logged", "mean", "--total-batch-size", "256")  # one micro-batch a step
    one_last, _ = run(tmp_path, "one-last", "--total-batch-size", "256")
    assert [r["loss"] for r in one] == [r["loss"] for r in one_last]  # the mean of one is that one
    assert all(r["grad_norm"] > 0 for r in last)  # logged at every step, clip or none


def test_the_logged_gradient_norm_is_the_norm_of_the_steps_mean_gradient():
    """Step 0's logged norm against the norm written out here in float64: the step's micro-batches' losses,
    each divided by their count, backpropagated into a fresh model of the same seed."""
    import itertools

    from muonlab.arms import resolve_config
    from muonlab.device import Runtime
    from muonlab.train.build import build_model, build_optimizer
    from muonlab.train.loop import train_loop
    from support.compile_check import fixed_batches

    cfg = resolve_config("baseline", "cpu-tiny", {"num_steps": 1, "total_batch_size": 1024, "quiet": True})
    runtime, vocab = Runtime(torch.device("cpu"), "fp32"), cfg.data.vocab_size
    batches = fixed_batches(cfg, vocab)
    accum = cfg.train.accum_steps_per_rank(1)
    assert accum == 4
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, vocab, runtime)
    records = []
    train_loop(cfg, model, build_optimizer(model, cfg, compile_step=False),
               ((x, y, 1) for x, y in itertools.cycle(batches)), runtime, model.estimate_flops(),
               on_step=records.append)
    torch.manual_seed(cfg.seed)
    fresh = build_model(cfg, vocab, runtime)
    for x, y in batches[:accum]:
        (fresh(x, y) / accum).backward()
    want = sum(p.grad.double().square().sum() for p in fresh.parameters() if p.grad is not None).sqrt().item()
    assert records[0]["grad_norm"] == pytest.approx(want, rel=1e-6)


def test_a_clipped_step_logs_the_gradient_norm_and_a_clip_that_does_not_bite_changes_nothing(tmp_path, capsys):
    plain, w_plain = run(tmp_path, "plain")
    clipped, w_clipped = run(tmp_path, "clipped", "--grad-clip", "1e9")
    assert same_weights(w_plain, w_clipped)  # the clip scales by exactly 1
    assert all(r["grad_norm"] > 0 for r in clipped)
    tight, _ = run(tmp_path, "tight", "--grad-clip", "1e-3")
    assert tight[0]["grad_norm"] == clipped[0]["grad_norm"]  # the norm before the clip, the same first step
