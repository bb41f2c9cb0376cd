"""Tied NanoGPT / NanoGPT-MoE of seed 004 (AF-Muon): muonlab.families.tied (model.py, moe.py).

Shapes from seed 004 App. J.1 / J.6; conventions (RMSNorm eps 1e-6,
interleaved RoPE, ScaledReLU^2 = sqrt(2) ReLU^2, N(0, 0.02) init, top-1 gate p/p,
Switch-style balance loss) from the released code (not in seed 004; App. J.6 gives only top-1 and coefficient 0.01).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.errors import UsageError
from muonlab.families.tied.model import TIED_SHAPES, TiedGPT, TiedGPTConfig, build_tied_model, expected_num_parameters, scaled_relu_sq
from muonlab.families.tied.moe import TopKMoE, load_balancing_loss
from muonlab.families.tied.model import MLP, RMSNorm, apply_rotary, rotary_tables

TINY = ("tied-tiny", "tied-tiny-moe")


def _model(name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> TiedGPT:
    torch.manual_seed(seed)
    return build_tied_model(name).to(dtype)


def _batch(model: TiedGPT, B: int = 2, T: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


# --- the tie -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_tie_is_one_parameter_counted_once(name):
    model = _model(name)
    table = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is table
    assert isinstance(table, nn.Parameter) and table.shape == (256, 64)
    assert list(model.get_output_embeddings().parameters()) == []  # the head owns nothing
    names = [n for n, p in model.named_parameters() if p is table]
    assert names == ["wte.weight"]
    assert [k for k in model.state_dict() if k.endswith(("wte.weight", "lm_head.weight"))] == ["wte.weight"]
    unique = {id(p): p.numel() for m in model.modules() for p in m.parameters(recurse=False)}
    assert model.num_parameters() == sum(unique.values()) == expected_num_parameters(model.config)


def test_tie_survives_conversion_copy_meta_and_load():
    model = _model("tied-tiny")
    for other in (copy.deepcopy(model), copy.deepcopy(model).to(torch.float64)):
        assert other.get_output_embeddings().weight is other.get_input_embeddings().weight
    with torch.device("meta"):
        meta = build_tied_model("tied-tiny")
    meta.to_empty(device="cpu")
    meta.init_weights()
    assert meta.get_output_embeddings().weight is meta.get_input_embeddings().weight
    assert torch.equal(meta.rope_cos, model.rope_cos)
    meta.load_state_dict(model.state_dict())
    assert meta.get_output_embeddings().weight is meta.get_input_embeddings().weight
    idx, _ = _batch(model)
    assert torch.equal(meta(idx), model(idx))


@pytest.mark.parametrize("name", TINY)
def test_tied_gradient_is_lookup_plus_softmax_path(name):
    """Seed 004 App. D.1, Prop. 2: G_E = G_in + G_out, each found by detaching the
    other path; G_in lives on the input-token rows only; 1^T G_out = 0; 1^T G_in != 0."""
    model = _model(name, dtype=torch.float64).train()
    idx, targets = _batch(model)
    W = model.wte.weight

    def loss_with(w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
        h, aux = model.backbone(F.embedding(idx, w_in))
        loss = F.cross_entropy(F.linear(h, w_out).view(-1, W.size(0)), targets.reshape(-1))
        return loss if aux is None else loss + aux

    g_in = torch.autograd.grad(loss_with(W, W.detach()), W)[0]
    g_out = torch.autograd.grad(loss_with(W.detach(), W), W)[0]
    model.zero_grad()
    model(idx, targets).backward()
    torch.testing.assert_close(W.grad, g_in + g_out, rtol=1e-10, atol=1e-14)
    touched = torch.zeros(W.size(0), dtype=torch.bool)
    touched[idx.unique()] = True
    assert g_in[~touched].abs().max() == 0 and (g_in[touched].abs().sum(1) > 0).all()
    assert (g_out.abs().sum(1) > 0).all()  # dense softmax path reaches every row
    assert g_out.sum(0).abs().max() < 1e-12 * g_out.abs().max() * W.size(0)
    assert g_in.sum(0).abs().max() > 1e-3 * g_in.abs().max()


# --- forward ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_forward_shapes_and_losses(name):
    model = _model(name).eval()
    idx, targets = _batch(model, B=3, T=20)
    assert model(idx).shape == (3, 20, 256)
    assert model.lm_loss is None
    mean = model(idx, targets)
    assert mean.shape == () and torch.isfinite(mean)
    per_token = model(idx, targets, reduction="none")
    assert per_token.shape == (3, 20)
    torch.testing.assert_close(per_token.mean(), mean)
    torch.testing.assert_close(model(idx, targets, reduction="sum"), per_token.sum())
    masked = targets.clone()
    masked[:, :10] = -1  # ignore_index -1, as muonlab's data pipeline
    torch.testing.assert_close(model(idx, masked), per_token[:, 10:].mean())
    with pytest.raises(ValueError, match="sequence_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="reduction"):
        model(idx, targets, reduction="max")


@pytest.mark.parametrize("name", TINY)
def test_causal(name):
    model = _model(name).eval()
    idx, _ = _batch(model, B=2, T=24)
    base = model(idx)
    for t in (0, 11, 23):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 256
        out = model(changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-5)
        assert (out[:, t] - base[:, t]).abs().max() > 1e-4


def test_rotary_is_interleaved_pair_rotation():
    """Pair (x_2i, x_2i+1) is the complex number x_2i + i x_2i+1 times exp(i t base^(-2i/D))."""
    T, D, base = 12, 8, 10000.0
    x = torch.randn(2, 3, T, D, dtype=torch.float64)
    cos, sin = rotary_tables(T, D, base)
    out = apply_rotary(x, cos.double(), sin.double())
    theta = torch.arange(T)[:, None] * base ** (-torch.arange(0, D, 2) / D)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(theta.double()), theta.double())
    torch.testing.assert_close(out, torch.stack((z.real, z.imag), -1).flatten(-2), rtol=1e-6, atol=1e-6)
    # relative position: <R_m q, R_n k> depends on m - n only
    q, k = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    rq = apply_rotary(q.expand(T, D), cos.double(), sin.double())
    rk = apply_rotary(k.expand(T, D), cos.double(), sin.double())
    torch.testing.assert_close(rq[5] @ rk[2], rq[9] @ rk[6], rtol=1e-5, atol=1e-5)


def test_scaled_relu_sq_and_mlp_formula():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    expected = torch.tensor([math.sqrt(2.0) * max(v, 0.0) ** 2 for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(scaled_relu_sq(x), expected)
    mlp = MLP(8, 32, math.sqrt(2.0)).double()
    h = torch.randn(5, 8, dtype=torch.float64)
    direct = mlp.proj.weight @ (math.sqrt(2.0) * torch.clamp(mlp.fc.weight @ h.T, min=0) ** 2)
    torch.testing.assert_close(mlp(h), direct.T)


def test_rmsnorm_formula():
    norm = RMSNorm(6, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 7.0))
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * torch.arange(1.0, 7.0)
    torch.testing.assert_close(norm(x), expected, rtol=1e-12, atol=1e-12)  # float64 stays float64


# --- MoE ----------------------------------------------------------------------------------

def test_moe_top1_sends_each_token_to_exactly_one_expert():
    torch.manual_seed(0)
    moe = TopKMoE(16, 4, 1, 0.01, lambda: MLP(16, 64, math.sqrt(2.0))).double()
    x = torch.randn(3, 40, 16, dtype=torch.float64)
    y, _ = moe(x)
    flat = x.reshape(-1, 16)
    probs, top_idx, gates = moe.route(flat)
    assert top_idx.shape == (120, 1) and torch.equal(gates, torch.ones(120, 1, dtype=gates.dtype))
    assert torch.equal(top_idx[:, 0], probs.argmax(-1))
    direct = torch.stack([moe.experts[int(e)](flat[t : t + 1])[0] for t, e in enumerate(top_idx[:, 0])])
    torch.testing.assert_close(y.reshape(-1, 16), direct)
    assert int(moe.last_counts.sum()) == 120
    assert torch.equal(moe.last_counts, torch.bincount(top_idx[:, 0], minlength=4))


def _aux_by_transcription(probs: list[list[float]], n_experts: int, coef: float) -> float:
    N = len(probs)
    top1 = [max(range(n_experts), key=lambda e: row[e]) for row in probs]
    importance = [sum(row[e] for row in probs) / N for e in range(n_experts)]
    load = [sum(1 for c in top1 if c == e) / N for e in range(n_experts)]
    return coef * n_experts * sum(i * f for i, f in zip(importance, load))


def test_aux_loss_matches_direct_transcription_per_layer_and_in_model():
    model = _model("tied-tiny-moe", dtype=torch.float64).train()
    idx, targets = _batch(model, B=2, T=32)
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [b.mlp.register_forward_hook(lambda m, inp, out: captured.append((inp[0], out[1])))
             for b in model.blocks]
    loss = model(idx, targets)
    for h in hooks:
        h.remove()
    assert len(captured) == model.config.n_layer
    total = 0.0
    for block, (x_in, aux) in zip(model.blocks, captured):
        probs = torch.softmax(block.mlp.router(x_in.reshape(-1, 64)), -1).tolist()
        expected = _aux_by_transcription(probs, 4, 0.01)
        assert aux.item() == pytest.approx(expected, rel=1e-12)
        total += expected
    assert model.aux_loss.item() == pytest.approx(total, rel=1e-12)
    assert loss.item() == pytest.approx(model.lm_loss.item() + total, rel=1e-12)
    # uniform routing gives exactly coef
    uniform = torch.full((8, 4), 0.25)
    assert load_balancing_loss(uniform, torch.arange(8) % 4, 4, 0.01).item() == pytest.approx(0.01)


def test_aux_in_training_loss_only():
    model = _model("tied-tiny-moe")
    idx, targets = _batch(model)
    model.eval()
    assert model(idx, targets).item() == pytest.approx(model.lm_loss.item())
    assert model.aux_loss is not None and model.aux_loss.item() > 0
    model.train()
    assert model(idx, targets).item() == pytest.approx(model.lm_loss.item() + model.aux_loss.item())
    assert model(idx, targets, include_aux=False).item() == pytest.approx(model.lm_loss.item())
    with pytest.raises(ValueError, match="aux"):
        model(idx, targets, reduction="sum")
    dense = _model("tied-tiny").train()
    dense(idx, targets)
    assert dense.aux_loss is None and dense.router_stats() == {}
    assert set(model.router_stats()) == {"router_entropy", "router_max_frac", "router_cv",
                                          "router_unused_experts"}


def test_router_is_a_2d_linear_learning_only_from_the_balance_loss():
    """Released code (unstated in seed 004 App. J.6): with top-1 the gate is p/p = 1, so the LM loss gives the router no
    gradient; it learns through the 0.01 load-balancing loss."""
    model = _model("tied-tiny-moe").train()
    idx, targets = _batch(model)
    for block in model.blocks:
        router = block.mlp.router
        assert isinstance(router, nn.Linear) and router.bias is None
        assert router.weight.ndim == 2 and router.weight.shape == (4, 64)
        assert all(isinstance(e.fc, nn.Linear) and isinstance(e.proj, nn.Linear) for e in block.mlp.experts)
    model(idx, targets, include_aux=False).backward()
    for block in model.blocks:
        g = block.mlp.router.weight.grad
        assert g is None or g.abs().max() == 0
    model.zero_grad(set_to_none=True)
    model(idx, targets).backward()
    assert all(b.mlp.router.weight.grad.abs().max() > 0 for b in model.blocks)


@pytest.mark.parametrize("name", TINY)
def test_every_parameter_has_an_af_muon_role(name):
    """The V2 partition (seed 004 §2.2, Algorithm 1): the tied table once, nn.Linear weights as
    matrices, ndim <= 1 as vectors, nothing else."""
    model = _model(name)
    tied = model.get_input_embeddings().weight
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    roles = {"tied": 0, "matrix": 0, "vector": 0}
    for _, p in model.named_parameters():
        if p is tied:
            roles["tied"] += 1
        elif id(p) in linear:
            assert p.ndim == 2
            roles["matrix"] += 1
        else:
            assert p.ndim == 1
            roles["vector"] += 1
    per_layer_mlp = 4 * 2 + 1 if model.config.moe else 2
    assert roles == {"tied": 1, "matrix": 2 * (2 + per_layer_mlp), "vector": 2 * 2 + 1}


# --- sizes, presets, init -------------------------------------------------------------------

@pytest.mark.parametrize(("name", "count"), [("nanogpt-124m", 123_587_328), ("nanogpt-124m-moe", 293_493_504)])
def test_nanogpt_parameter_count_on_meta(name, count):
    """Counts of seed 004 App. J.1 and J.6 models (the released code's check-config), with the
    formula V d + d + L (4 d^2 + 2 d + MLP), MLP = 2 d h or E 2 d h + d E."""
    with torch.device("meta"):
        model = build_tied_model(name)
    assert model.wte.weight.is_meta
    assert model.num_parameters() == count == expected_num_parameters(model.config)


@pytest.mark.parametrize(("vocab", "width", "millions"), [
    (50_000, 768, 123.4), (100_000, 768, 161.8), (150_000, 768, 200.2),  # seed 004 Table 29
    (50_000, 1024, 202.2), (50_000, 1536, 416.6),  # seed 004 Table 31 (12 layers, MLP 4d)
])
def test_paper_stated_sizes(vocab, width, millions):
    cfg = TiedGPTConfig(vocab_size=vocab, n_embd=width, n_head=width // 128)
    assert round(expected_num_parameters(cfg) / 1e6, 1) == millions


def test_presets():
    assert {"tied-tiny", "tied-cpu", "nanogpt-124m", "nanogpt-124m-moe"} <= set(TIED_SHAPES)
    g = TIED_SHAPES["nanogpt-124m"]
    assert (g.vocab_size, g.n_layer, g.n_head, g.head_dim, g.n_embd, g.mlp_hidden, g.sequence_len) == (
        50304, 12, 6, 128, 768, 3072, 1024)
    assert not g.moe and g.act_scale == math.sqrt(2.0) and g.rope_base == 10000.0 and g.norm_eps == 1e-6
    m = TIED_SHAPES["nanogpt-124m-moe"]
    assert (m.moe, m.n_experts, m.top_k, m.aux_loss_coef) == (True, 4, 1, 0.01)
    assert TIED_SHAPES["tied-tiny"].vocab_size == 256
    assert build_tied_model("tied-tiny", n_layer=1).config.n_layer == 1
    assert build_tied_model(TIED_SHAPES["tied-tiny"]).config == TIED_SHAPES["tied-tiny"]
    with pytest.raises(UsageError, match="unknown tied preset"):
        build_tied_model("nanogpt-125m")
    for bad in (dict(n_head=5), dict(top_k=5, moe=True), dict(n_embd=6, n_head=2), dict(norm_eps=0.0)):
        with pytest.raises(ValueError):
            TiedGPTConfig(**{**dict(vocab_size=8, n_layer=1, n_head=2, n_embd=8, sequence_len=8), **bad})


@pytest.mark.parametrize("meta", [False, True])
def test_init_scheme(meta):
    """Released-code init (not in seed 004): N(0, 0.02) for the table and every Linear
    (router and experts included), RMSNorm gains 1."""
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            model = build_tied_model("tied-cpu-moe")
        model.to_empty(device="cpu")
        model.init_weights()
    else:
        model = build_tied_model("tied-cpu-moe")
    table = model.wte.weight
    assert table.std().item() == pytest.approx(0.02, rel=0.01) and abs(table.mean().item()) < 1e-3
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            assert mod.weight.std().item() == pytest.approx(0.02, rel=0.15)
            assert abs(mod.weight.mean().item()) < 0.005
        elif isinstance(mod, RMSNorm):
            assert torch.equal(mod.weight, torch.ones_like(mod.weight))
    assert torch.isfinite(model(torch.randint(0, 2048, (1, 8)))).all()


# --- training smoke ---------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_adamw_steps_reduce_loss_on_repeated_batch(name):
    model = _model(name).train()
    idx, targets = _batch(model, B=4, T=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(5):
        loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(model.lm_loss.item())
    final = model(idx, targets, include_aux=False).item()
    assert all(math.isfinite(v) for v in losses)
    assert final < losses[0] - 0.05
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
