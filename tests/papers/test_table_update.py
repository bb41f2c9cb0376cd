"""Moment-free OE table update (muonlab.optim.addons.moment_free), seed 002 §2.1 (Family A) / §4.3 item 1.

The bf16 result is compared with a float64 transcription of the formula, computed here from a
Counter of the hashed ids and the gradient that loss/K backward of an nn.Embedding lookup
accumulated over K micro-steps. Tolerance: one bf16 ulp of the new value (the function computes
in fp32, the reference in float64, so a value on a rounding boundary may round the other way).
"""

import math
from collections import Counter

import pytest
import torch
from torch import nn

from muonlab.model.variants.over_encoding import DEFAULT_M
from muonlab.optim.addons.moment_free import moment_free_step, oe_learning_rate, state_bytes

OE_TABLE_ROWS = tuple(DEFAULT_M + 2 * j for j in range(4))  # seed 002 §2.1: the tables have m + 2j rows

ROWS, W = 37, 8


def hashed_ids(seed, batch=3, seq=10, rows=ROWS):
    """Bigram-style mixed-radix hashes of random tokens mod rows: many repeats, some rows unvisited."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, 12, (batch, seq + 1), generator=g)
    return (tok[:, 1:] + 8193 * tok[:, :-1]) % rows


def make_table(seed, zero=False):
    emb = nn.Embedding(ROWS, W).to(torch.bfloat16)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        emb.weight.copy_(torch.zeros(ROWS, W) if zero else torch.randn(ROWS, W, generator=g))
    return emb


def loss_fn(emb, ids, seed):
    """A nonlinear batch-mean loss, so that occurrences of one row get different gradients."""
    proj = torch.randn(W, 4, generator=torch.Generator().manual_seed(seed))
    return (emb(ids).float() @ proj).tanh().square().mean()


def accumulate(emb, micro_ids, seed=0):
    """K micro-steps of loss/K backward, with the counts accumulated per micro-step (oe_count)."""
    counts = torch.zeros(ROWS)
    for ids in micro_ids:
        (loss_fn(emb, ids, seed) / len(micro_ids)).backward()
        counts.index_add_(0, ids.flatten(), torch.ones(ids.numel()))
    return emb.weight.grad, counts


def reference(table, grad, micro_ids, lr, floor=1e-30, neumann_beta=None):
    """float64 new table from the formula; visits from a Counter over the ids."""
    visits = Counter(i for ids in micro_ids for i in ids.flatten().tolist())
    rows = sorted(visits)
    gbar = torch.stack([grad[r].double() / visits[r] for r in rows])
    if neumann_beta is not None:  # whitening's formula (seed 002 §2.1 Tier 1), on the visited rows
        U = gbar - gbar.mean(0, keepdim=True)
        C = U.T @ U
        gbar = U - 0.5 * neumann_beta * U @ C / (torch.linalg.matrix_norm(C) + 1e-30)
    rms = max(math.sqrt(gbar.square().sum().item() / gbar.numel()), floor)
    new = table.double().clone()
    new[rows] -= lr * gbar / rms
    return new, rows, rms


def assert_within_ulp(out, ref):
    """|out - ref| <= one bf16 ulp of the new value (8 significant bits)."""
    assert out.dtype == torch.bfloat16
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(1e-30))) - 7)
    err = (out.double() - ref).abs()
    assert (err <= ulp).all(), f"max error {(err / ulp).max().item():.2f} ulp"
    assert (out == ref.to(torch.bfloat16)).float().mean() >= 0.9  # mostly exactly the rounded value


@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("neumann_beta", [None, 0.7])
def test_matches_float64_reference(K, neumann_beta):
    emb = make_table(1)
    micro = [hashed_ids(10 + k) for k in range(K)]
    grad, counts = accumulate(emb, micro)
    old = emb.weight.detach().clone()
    ref, rows, rms = reference(old, grad, micro, lr=0.8, neumann_beta=neumann_beta)
    assert len(rows) < ROWS  # the toy has unvisited rows
    stats = moment_free_step(emb.weight.data, grad, counts, 0.8, neumann_beta=neumann_beta)
    assert stats["visited"] == len(rows) and float(stats["rms"]) == pytest.approx(rms, rel=1e-5)
    assert_within_ulp(emb.weight.data[rows], ref[rows])
    unvisited = [r for r in range(ROWS) if r not in rows]
    assert torch.equal(emb.weight.data[unvisited], old[unvisited])  # bitwise untouched
    assert emb.weight.dtype == torch.bfloat16
    assert not counts.any()


def test_accumulation_equals_one_big_batch():
    micro = [hashed_ids(20 + k, batch=2) for k in range(4)]
    emb_acc, emb_big = make_table(2), make_table(2)
    grad_acc, counts_acc = accumulate(emb_acc, micro)
    grad_big, counts_big = accumulate(emb_big, [torch.cat(micro)])
    assert torch.equal(counts_acc, counts_big)
    moment_free_step(emb_acc.weight.data, grad_acc, counts_acc, 0.5)
    moment_free_step(emb_big.weight.data, grad_big, counts_big, 0.5)
    ref, rows, _ = reference(make_table(2).weight.detach(), grad_big, micro, lr=0.5)
    assert_within_ulp(emb_acc.weight.data[rows], ref[rows])
    assert_within_ulp(emb_big.weight.data[rows], ref[rows])


def test_per_occurrence_mean():
    """Rows visited 1, 2, 3, 5 times with the same per-occurrence gradient g get the same update."""
    ids = torch.tensor([[0, 1, 1, 2, 2, 2, 3, 3], [3, 3, 3, 9, 9, 9, 9, 9]])  # 0:1 1:2 2:3 3:5 9:5
    g = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0, 0.25, 2.0, -0.75])
    K = 2
    emb = make_table(0, zero=True)  # zero-initialised, as the OE tables
    counts = torch.zeros(ROWS)
    for _ in range(K):
        ((emb(ids).float() * g).sum(-1).mean() / K).backward()  # per occurrence: g / (16 K)
        counts.index_add_(0, ids.flatten(), torch.ones(ids.numel()))
    stats = moment_free_step(emb.weight.data, emb.weight.grad, counts, 0.5)
    gbar = g.double() / (ids.numel() * K)
    assert float(stats["rms"]) == pytest.approx(gbar.square().mean().sqrt().item(), rel=1e-6)
    expected = (-0.5 * g.double() / g.double().square().mean().sqrt()).to(torch.bfloat16)
    for r in (0, 1, 2, 3, 9):
        assert torch.equal(emb.weight.data[r], expected)
    assert not emb.weight.data[[4, 5, 6, 7, 8]].any()


def test_rms_over_visited_entries_only():
    table = torch.zeros(400, W, dtype=torch.bfloat16)
    grad = torch.randn(400, W).to(torch.bfloat16)  # gradient on unvisited rows too: must be ignored
    counts = torch.zeros(400)
    counts[::4] = torch.arange(1, 101, dtype=torch.float32)
    moment_free_step(table, grad, counts, 0.25)
    step = table[::4].double() / 0.25
    assert step.square().mean().sqrt().item() == pytest.approx(1.0, rel=1e-2)  # unit RMS on visited
    assert not table[1::4].any() and not table[2::4].any() and not table[3::4].any()


def test_rms_floor():
    table = torch.randn(ROWS, W).to(torch.bfloat16)
    old = table.clone()
    counts = torch.ones(ROWS)
    stats = moment_free_step(table, torch.zeros(ROWS, W, dtype=torch.bfloat16), counts, 0.5)
    assert torch.equal(table, old) and float(stats["rms"]) == pytest.approx(1e-30, rel=1e-6) and not counts.any()
    grad = torch.full((ROWS, W), 2.0 ** -10, dtype=torch.bfloat16)  # tiny: the floor 1.0 wins
    moment_free_step(table, grad, torch.ones(ROWS), 0.5, rms_floor=1.0)
    assert torch.equal(table, (old.double() - 0.5 * 2.0 ** -10).to(torch.bfloat16))


def test_lr_is_linear_and_may_be_a_tensor():
    grad = torch.randn(ROWS, W).to(torch.bfloat16)
    counts = torch.randint(0, 3, (ROWS,)).float()
    outs = []
    for lr in (0.3, 0.6, torch.tensor(0.6)):
        table = torch.zeros(ROWS, W, dtype=torch.bfloat16)
        moment_free_step(table, grad, counts.clone(), lr)
        outs.append(table)
    assert outs[0].any() and torch.equal(outs[1], 2 * outs[0]) and torch.equal(outs[1], outs[2])


def test_neumann_beta_zero_with_mean_addback_is_plain():
    grad = torch.randn(ROWS, W).to(torch.bfloat16)
    counts = torch.randint(0, 4, (ROWS,)).float()
    plain = torch.randn(ROWS, W).to(torch.bfloat16)
    whitened = plain.clone()
    moment_free_step(plain, grad, counts.clone(), 0.5)
    moment_free_step(whitened, grad, counts.clone(), 0.5, neumann_beta=0.0, neumann_mean_addback=True)
    assert_within_ulp(whitened, plain.double())


def test_no_grad_and_empty_visited_set():
    table = torch.randn(ROWS, W).to(torch.bfloat16)
    old, counts = table.clone(), torch.ones(ROWS)
    stats = moment_free_step(table, None, counts, 0.5)  # no gradient: no update, counts still zeroed
    assert stats["visited"] == 0 and torch.equal(table, old) and not counts.any()
    stats = moment_free_step(table, torch.randn(ROWS, W).to(torch.bfloat16), counts, 0.5)  # nothing visited
    assert stats["visited"] == 0 and torch.equal(table, old) and not torch.isnan(stats["rms"])


def test_learning_rate_and_state_bytes():
    assert oe_learning_rate(384) == pytest.approx(0.848528, abs=1e-6)
    assert oe_learning_rate(512) == pytest.approx(0.734847, abs=1e-6)
    assert oe_learning_rate(768, embedding_lr=0.3) == pytest.approx(0.3)
    assert sum(OE_TABLE_ROWS) == 603432
    total = sum(state_bytes(r) for r in OE_TABLE_ROWS)
    assert total == 4 * 603432 and round(total / 2**20, 2) == 2.30


def test_cuda_matches_cpu(cuda):
    grad = torch.randn(ROWS, W).to(torch.bfloat16)
    counts = torch.randint(0, 3, (ROWS,)).float()
    cpu = torch.randn(ROWS, W).to(torch.bfloat16)
    gpu = cpu.to(cuda)
    moment_free_step(cpu, grad, counts.clone(), torch.tensor(0.5), neumann_beta=0.5)
    moment_free_step(gpu, grad.to(cuda), counts.to(cuda), torch.tensor(0.5), neumann_beta=0.5)
    assert_within_ulp(gpu.cpu(), cpu.double())
