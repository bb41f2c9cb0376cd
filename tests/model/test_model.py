"""The GPT: shapes, counts, windows, attention against a naive implementation, init invariants."""

import math

import pytest
import torch
import torch.nn.functional as F

from muonlab.config import preset
from muonlab.device import Runtime
from support.attention import naive_attention

from muonlab.model import GPT, GPTConfig
from muonlab.model.attention import causal_attention
from muonlab.model.rotary import apply_rotary, rotary_tables
from muonlab.train.build import build_model, model_config


def small_config(**kw):
    base = dict(sequence_len=32, vocab_size=64, n_layer=4, n_head=2, n_kv_head=2, n_embd=64,
                window_pattern="SSSL", attn_backend="sdpa")
    base.update(kw)
    return GPTConfig(**base)


@pytest.mark.parametrize("name,total", [("gpu-d8", 50_332_176), ("gpu-d6", 26_345_772)])
def test_protocol_parameter_counts(name, total):
    cfg = preset(name)
    with torch.device("meta"):
        model = GPT(model_config(cfg, vocab_size=8192))
    counts = model.num_scaling_params()
    assert counts["total"] == total
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_d8_breakdown_matches_spec():
    with torch.device("meta"):
        model = GPT(model_config(preset("gpu-d8"), vocab_size=8192))
    counts = model.num_scaling_params()
    assert counts == {"wte": 4_194_304, "value_embeds": 16_777_216, "lm_head": 4_194_304,
                      "transformer_matrices": 25_166_336, "scalars": 16, "total": 50_332_176}
    assert sorted(model.value_embeds.keys()) == ["1", "3", "5", "7"]


def test_window_pattern():
    model = GPT(small_config(n_layer=6, sequence_len=40, window_pattern="SSSL"))
    assert model.window_sizes == [(20, 0), (20, 0), (20, 0), (40, 0), (20, 0), (40, 0)]
    model = GPT(small_config(n_layer=3, window_pattern="S"))
    assert model.window_sizes[-1] == (32, 0) and model.window_sizes[0] == (16, 0)


@pytest.mark.parametrize("left,kv_heads", [(5, 4), (5, 2), (31, 4), (0, 1), (100, 2)])
def test_sdpa_window_matches_naive(left, kv_heads):
    torch.manual_seed(0)
    q = torch.randn(2, 17, 4, 8, dtype=torch.float64)
    k = torch.randn(2, 17, kv_heads, 8, dtype=torch.float64)
    v = torch.randn(2, 17, kv_heads, 8, dtype=torch.float64)
    got = causal_attention(q, k, v, (left, 0), "sdpa")
    torch.testing.assert_close(got, naive_attention(q, k, v, left), rtol=1e-10, atol=1e-10)


def test_rotary_is_a_relative_rotation():
    cos, sin = rotary_tables(64, 16)
    assert cos.dtype == torch.bfloat16 and cos.shape == (1, 64, 1, 8)
    cos, sin = cos.double(), sin.double()
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    rot = lambda x, m: apply_rotary(x, cos[:, m:m + 1], sin[:, m:m + 1])  # noqa: E731
    # norms preserved up to the bf16 rounding of the tables (|cos^2 + sin^2 - 1| < 2^-7)
    assert abs(rot(q, 9).norm() / q.norm() - 1) < 1e-2
    # the score depends only on the offset m - n (to bf16 table precision)
    s1 = (rot(q, 10) * rot(k, 3)).sum()
    s2 = (rot(q, 27) * rot(k, 20)).sum()
    assert abs(s1 - s2) < 3e-2 * q.norm() * k.norm()


def test_init_invariants():
    torch.manual_seed(0)
    model = GPT(small_config())
    model.init_weights()
    assert model.transformer.wte.weight.dtype == torch.bfloat16
    assert all(ve.weight.dtype == torch.bfloat16 for ve in model.value_embeds.values())
    assert model.lm_head.weight.dtype == torch.float32
    for block in model.transformer.h:
        assert block.attn.c_proj.weight.abs().sum() == 0 and block.mlp.c_proj.weight.abs().sum() == 0
        if block.attn.ve_gate is not None:
            assert block.attn.ve_gate.weight.abs().sum() == 0
        bound = 3**0.5 * 64**-0.5
        assert block.attn.c_q.weight.abs().max() <= bound
    assert torch.equal(model.resid_lambdas, torch.ones(4))
    assert torch.allclose(model.x0_lambdas, torch.full((4,), 0.1))
    assert abs(model.transformer.wte.weight.float().std().item() - 1.0) < 0.05


def test_forward_semantics_at_init():
    """Blocks' output projections start at zero, so logits = softcap(lm_head(norm(x_L)))."""
    torch.manual_seed(0)
    model = GPT(small_config())
    model.init_weights()
    model.float()
    idx = torch.randint(0, 64, (2, 32))
    x0 = F.rms_norm(model.transformer.wte(idx), (64,))
    x = x0
    for i in range(4):
        x = model.resid_lambdas[i] * x + model.x0_lambdas[i] * x0
    expected = 15 * torch.tanh(model.lm_head(F.rms_norm(x, (64,))) / 15)
    torch.testing.assert_close(model(idx), expected)
    loss = model(idx, idx)
    per_token = model(idx, idx, reduction="none")
    assert per_token.shape == (64,) and torch.isclose(per_token.mean(), loss)


def test_estimate_flops_by_hand():
    model = GPT(small_config())
    matmul_params = sum(p.numel() for p in model.transformer.h.parameters()) + model.lm_head.weight.numel()
    attn = sum(12 * 2 * 32 * min(w, 32) for w, _ in model.window_sizes)
    assert model.estimate_flops() == 6 * matmul_params + attn


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=100, n_head=3)
    with pytest.raises(ValueError, match="window_pattern"):
        GPTConfig(window_pattern="SXL")
    model = GPT(small_config(sequence_len=4))
    with pytest.raises(ValueError, match="RoPE"):
        model(torch.zeros(1, 41, dtype=torch.long))


def test_build_model_precisions():
    cfg = preset("cpu-tiny")
    fp32 = build_model(cfg, 300, Runtime(torch.device("cpu"), "fp32"))
    assert all(p.dtype == torch.float32 for p in fp32.parameters())
    bf16 = build_model(cfg, 300, Runtime(torch.device("cpu"), "bf16"))
    assert bf16.transformer.wte.weight.dtype == torch.bfloat16


def test_gpu_d8_builds_and_steps_on_cuda(cuda):
    cfg = preset("gpu-d8")
    runtime = Runtime(cuda, "bf16")
    model = build_model(cfg, 8192, runtime)
    assert model.num_scaling_params()["total"] == 50_332_176
    opt = model.setup_optimizer(matrix_lr=0.04, embedding_lr=0.6, weight_decay=0.2)
    x = torch.randint(0, 8192, (2, 2048), device=cuda)
    with runtime.autocast():
        loss = model(x, x)
    loss.backward()
    opt.step()
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(8192)) < 1.0
