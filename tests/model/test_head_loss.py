"""The fused, chunked soft-capped cross-entropy (muonlab.model.head_loss) against an independent
float64 transcription of upstream's loss, L = mean_i [logsumexp(z_i) - z_i,y_i] with
z = 15 tanh(x W^T / 15) (train.py @ 228791f), and against the unfused reference path of the GPT."""

from __future__ import annotations

import pytest
import torch

from muonlab.model import GPT, GPTConfig
from muonlab.model.head_loss import default_chunk_rows, softcapped_cross_entropy

CAP = 15.0


def float64_loss(x, w, y, reduction="mean"):
    """Transcription of the equation in float64, rows with y = -1 left out of sum and count."""
    x, w = x.double(), w.double()
    z = CAP * torch.tanh((x @ w.T) / CAP)
    keep = y != -1
    per_row = torch.logsumexp(z, dim=1) - z.gather(1, y.clamp_min(0)[:, None]).squeeze(1)
    per_row = torch.where(keep, per_row, torch.zeros_like(per_row))
    if reduction == "none":
        return per_row
    return per_row.sum() / keep.sum() if reduction == "mean" else per_row.sum()


def _case(n=300, d=48, v=130, seed=0, ignore=(3, 77, 299)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(v, d, generator=g) * 2.0  # large logits: the soft cap is not the identity
    y = torch.randint(0, v, (n,), generator=g)
    y[list(ignore)] = -1
    return x, w, y


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_rows", [1, 64, 97, 300, 1000, None])
def test_loss_and_gradients_equal_the_float64_equation(reduction, chunk_rows):
    x, w, y = _case()
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want = float64_loss(x64, w64, y, reduction)
    want.backward()
    xf, wf = x.clone().requires_grad_(), w.clone().requires_grad_()
    got = softcapped_cross_entropy(xf, wf, y, CAP, reduction, chunk_rows=chunk_rows)
    (2.5 * got).backward()  # the incoming gradient scales both results
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    for got_grad, want_grad in ((xf.grad, x64.grad), (wf.grad, w64.grad)):  # fp32 error: ~1e-7 of the scale
        torch.testing.assert_close(got_grad.double(), 2.5 * want_grad, rtol=1e-5,
                                   atol=2e-6 * want_grad.abs().max().item())
    assert xf.grad[[3, 77, 299]].abs().max() == 0  # ignored rows get no gradient


def test_per_row_losses_without_and_with_gradient():
    x, w, y = _case()
    want = float64_loss(x, w, y, "none")
    with torch.no_grad():
        got = softcapped_cross_entropy(x, w, y, CAP, "none", chunk_rows=64)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    xg = x.clone().requires_grad_()
    per_row = softcapped_cross_entropy(xg, w, y, CAP, "none", chunk_rows=64)
    weights = torch.linspace(0, 1, x.size(0))
    (per_row * weights).sum().backward()  # per-row weights: the unfused path carries them
    x64 = x.double().requires_grad_()
    (float64_loss(x64, w, y, "none") * weights.double()).sum().backward()
    torch.testing.assert_close(xg.grad.double(), x64.grad, rtol=1e-5, atol=2e-6 * x64.grad.abs().max().item())


def test_bf16_autocast_rounds_where_autograd_rounds():
    """Under bf16 autocast the product is bf16; the fused loss equals the unfused one to that
    rounding and both stay near the float64 equation."""
    x, w, y = _case(n=256, d=64, v=200, ignore=(3, 77))
    results = {}
    for name in ("fused", "reference"):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if name == "fused":
                loss = softcapped_cross_entropy(xg, wg, y, CAP, "mean", chunk_rows=64)
            else:
                z = CAP * torch.tanh(torch.nn.functional.linear(xg, wg).float() / CAP)
                loss = torch.nn.functional.cross_entropy(z, y, ignore_index=-1)
        loss.backward()
        results[name] = (loss.detach(), xg.grad, wg.grad)
    (lf, gxf, gwf), (lr, gxr, gwr) = results["fused"], results["reference"]
    assert abs(lf - lr) < 1e-5
    # the exact gradients of what autocast multiplies (bf16-rounded x and W), in float64
    x64, w64 = x.bfloat16().double().requires_grad_(), w.bfloat16().double().requires_grad_()
    float64_loss(x64, w64, y).backward()
    for fused_grad, ref_grad, exact in ((gxf, gxr, x64.grad), (gwf, gwr, w64.grad)):
        scale = exact.abs().max().item()
        fused_err, ref_err = ((g.double() - exact).abs().max().item() / scale for g in (fused_grad, ref_grad))
        assert fused_err < 1e-2 and fused_err <= 2 * ref_err + 1e-4, (fused_err, ref_err)
    assert abs(lf.double() - float64_loss(x, w, y)) < 0.05


def test_float64_inputs_stay_float64():
    x, w, y = (t.double() if t.is_floating_point() else t for t in _case())
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    got = softcapped_cross_entropy(xg, wg, y, CAP, chunk_rows=64)
    got.backward()
    x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()
    float64_loss(x64, w64, y).backward()
    assert got.dtype == torch.float64 and wg.grad.dtype == torch.float64
    torch.testing.assert_close(got, float64_loss(x, w, y), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xg.grad, x64.grad, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(wg.grad, w64.grad, rtol=1e-10, atol=1e-14)


def test_default_chunks_hold_about_as_many_logits_as_inputs():
    assert default_chunk_rows(4096, 2048, 256) == 512  # the demo: 8 chunks
    assert default_chunk_rows(2048, 8192, 512) == 128  # the depth-8 row on CPU: 16 chunks
    assert default_chunk_rows(10, 8192, 512) == 64
    with pytest.raises(ValueError, match="chunk_rows"):
        softcapped_cross_entropy(*_case(), CAP, chunk_rows=0)
    with pytest.raises(ValueError, match="reduction"):
        softcapped_cross_entropy(*_case(), CAP, reduction="avg")


def _gpt(head_loss):
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=32, vocab_size=96, n_layer=2, n_head=2, n_kv_head=2, n_embd=64,
                    window_pattern="SL", attn_backend="sdpa", head_loss=head_loss)
    model = GPT(cfg)
    model.init_weights()
    model.float()
    with torch.no_grad():  # non-zero head and output projections so every gradient is non-trivial
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def test_gpt_fused_head_loss_matches_the_reference_path():
    fused, reference = _gpt("fused"), _gpt("reference")
    idx = torch.randint(0, 96, (3, 32))
    targets = torch.randint(0, 96, (3, 32))
    targets[0, :5] = -1
    losses = []
    for model in (fused, reference):
        loss = model(idx, targets)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-6)
    ref_grads = dict(reference.named_parameters())
    for name, p in fused.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():
        per_token = fused(idx, targets, reduction="none")
        torch.testing.assert_close(per_token, reference(idx, targets, reduction="none"), rtol=1e-6, atol=1e-6)
    assert per_token.shape == (3 * 32,)


def test_unknown_head_loss_is_refused():
    with pytest.raises(ValueError, match="head_loss"):
        GPTConfig(head_loss="liger")
