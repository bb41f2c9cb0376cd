"""Seed 002 §2.4 step-0 precision/epsilon audit (muonlab.diagnostics.step0_audit)."""

import math

import pytest
import torch

import muonlab.model.gpt as gpt_module
from muonlab.diagnostics.step0_audit import (
    ADAM_EPS, SCALAR_LR, adamw_step0, build_step0, family_grads, float64_model, format_step0_table, norm_eps,
    run_step0_audit)

SMALL = dict(n_layer=4, n_embd=64, head_dim=32, seq_len=32, batch=2, vocab=128, oe_m=31)
INVARIANT = ("x0_lambdas", "wte_lambdas", "out_lambdas")
EPS_F32 = 2**-23


@pytest.fixture(scope="module")
def result():
    return run_step0_audit(**SMALL, seed=0)


def _f64(result, family, label):
    return torch.tensor(result["families"][family]["float64"][label], dtype=torch.float64)


def test_eps0_gradient_vanishes_by_scale_invariance(result):
    ref = result["lm_head_grad_max"]["0"]
    assert ref > 1e-4  # the reference gradient itself is far from zero
    for family in INVARIANT + ("resid_lambdas",):
        assert _f64(result, family, "0").abs().max() < 1e-10 * ref, family
    assert abs(result["dL_dalpha"]["0"]) < 1e-10 * ref


def test_eps_gradient_is_nonzero_linear_and_grows(result):
    ratio = 1e-6 / EPS_F32  # 8.39: dN/dalpha = eps x0 / (alpha^2 q + eps)^(3/2), linear in a small eps
    for family in INVARIANT:
        g0, g23, g6 = (_f64(result, family, lab) for lab in ("0", "2^-23", "1e-06"))
        floor = g0.abs().max() + 2.0**-52 * result["lm_head_grad_max"]["0"]
        assert (g6.abs() > 1e3 * floor).all(), family
        assert (g6.abs() > g23.abs()).all() and (g23.abs() > g0.abs()).all()
        torch.testing.assert_close(g6 / g23, torch.full_like(g6, ratio), rtol=1e-3, atol=0)


def test_model_gradient_matches_reduced_alpha_derivative(result):
    """Sublayers are off at step 0: every x0/wte/out grad is dL/dalpha, resid_lambdas[i] (1 + 0.1 i) dL/dalpha."""
    assert result["alpha0"] == pytest.approx(1 + 0.1 * SMALL["n_layer"])
    for lab in ("2^-23", "1e-06"):
        dl = result["dL_dalpha"][lab]
        for family in INVARIANT:
            torch.testing.assert_close(_f64(result, family, lab), torch.full((len(_f64(result, family, lab)),), dl,
                                       dtype=torch.float64), rtol=1e-6, atol=0)
        coef = torch.tensor([1 + 0.1 * i for i in range(SMALL["n_layer"])], dtype=torch.float64)
        torch.testing.assert_close(_f64(result, "resid_lambdas", lab), coef * dl, rtol=1e-6, atol=0)


def test_lm_head_gradient_matches_finite_difference_at_eps0():
    model, idx, targets = build_step0(**SMALL, seed=3)
    m64 = float64_model(model)
    with norm_eps(0.0):
        _, grads = family_grads(m64, idx, targets)
        g = grads["lm_head"]
        w = m64.lm_head.weight
        picks = [tuple(int(v) for v in divmod(int(i), g.shape[1])) for i in g.abs().flatten().topk(3).indices]
        picks += [(int(targets[0, 0]), 5), (7, 11)]
        h = 1e-5
        for r, c in picks:
            with torch.no_grad():
                w[r, c] += h
                up = float(m64(idx, targets))
                w[r, c] -= 2 * h
                down = float(m64(idx, targets))
                w[r, c] += h
            fd = (up - down) / (2 * h)
            assert fd == pytest.approx(float(g[r, c]), rel=1e-5, abs=1e-9), (r, c)


def test_norm_eps_patches_and_restores():
    original = gpt_module.norm
    x = 1e-3 * torch.randn(3, 16, dtype=torch.float64)
    with norm_eps(1e-6):
        assert gpt_module.norm is not original
        expected = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6)
        torch.testing.assert_close(gpt_module.norm(x), expected, rtol=1e-12, atol=0)
    assert gpt_module.norm is original
    with pytest.raises(RuntimeError, match="boom"):
        with norm_eps(0.0):
            raise RuntimeError("boom")
    assert gpt_module.norm is original
    with pytest.raises(ValueError):
        with norm_eps(-1.0):
            pass
    assert gpt_module.norm is original


def test_audit_restores_norm_even_when_the_forward_fails(monkeypatch, result):
    original = gpt_module.norm
    assert gpt_module.norm is original and original.__module__ == "muonlab.model.gpt"

    def failing_forward(self, idx, targets=None, reduction="mean"):
        assert gpt_module.norm is not original  # inside the eps context
        raise RuntimeError("forward failed")

    monkeypatch.setattr(gpt_module.GPT, "forward", failing_forward)
    with pytest.raises(RuntimeError, match="forward failed"):
        run_step0_audit(**SMALL)
    assert gpt_module.norm is original


def test_low_precision_gradient_differs_and_sets_the_step0_sign(result):
    fams = result["families"]
    for family in INVARIANT:
        lp = torch.tensor(fams[family]["low_precision"], dtype=torch.float64)
        true = _f64(result, family, "2^-23")
        assert (lp.abs() > 1e-9).all() and (lp.abs() < 1e-3).all()  # rounding noise, not signal
        assert ((lp - true).abs() > 100 * true.abs()).all()
        disp = torch.tensor(fams[family]["displacement"]["low_precision"])
        assert (disp.abs() > 0.49).all() and (torch.sign(disp) == -torch.sign(lp)).all()
        assert max(abs(d) for d in fams[family]["displacement"]["float64"]["0"]) < 1e-6
        assert fams[family]["ratio"]["2^-23"] == pytest.approx((lp / true).tolist())
    if torch.amp.is_autocast_available("cpu"):
        assert result["low_precision_mode"] == "bf16_autocast"
        assert fams["x0_lambdas"]["low_precision"] == fams["x0_lambdas"]["bf16_autocast"]


def test_adamw_step0_displacement():
    assert adamw_step0(1e-6) == pytest.approx(-SCALAR_LR * 1e-6 / (1e-6 + ADAM_EPS))
    assert adamw_step0(-3e-7) > 0.49 and adamw_step0(0.0) == 0.0
    assert abs(adamw_step0(1e-20)) < 1e-9


def test_shden_and_dense_variants():
    shden = run_step0_audit(**SMALL, routing="shden")
    ref = shden["lm_head_grad_max"]["0"]
    for family in INVARIANT:
        assert _f64(shden, family, "0").abs().max() < 1e-10 * ref, family
        assert (_f64(shden, family, "1e-06").abs() > 1e-9 * ref).all()
    dense = run_step0_audit(**dict(SMALL, oe_m=0), routing="none", routing_out=False)
    assert set(dense["families"]) == {"resid_lambdas", "x0_lambdas"}
    assert _f64(dense, "x0_lambdas", "0").abs().max() < 1e-10 * dense["lm_head_grad_max"]["0"]


def test_deterministic_and_rng_untouched(result):
    state = torch.get_rng_state()
    again = run_step0_audit(**SMALL, seed=0)
    assert torch.equal(state, torch.get_rng_state())
    for family, fam in result["families"].items():
        assert again["families"][family]["float64"] == fam["float64"]
        assert again["families"][family]["low_precision"] == fam["low_precision"]
    other = run_step0_audit(**SMALL, seed=1)
    assert other["families"]["x0_lambdas"]["float64"]["2^-23"] != result["families"]["x0_lambdas"]["float64"]["2^-23"]


def test_format_table(result):
    text = format_step0_table(result)
    for label in ("f64 eps=0", "f64 eps=2^-23", "f64 eps=1e-06", "dtheta0"):
        assert label in text
    for family, fam in result["families"].items():
        for i in range(len(fam["low_precision"])):
            assert f"{family}[{i}]" in text
    assert f"{result['dL_dalpha']['1e-06']:+.3e}" in text
    assert not math.isnan(result["alpha0"])
