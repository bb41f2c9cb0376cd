"""Seed 002's checkpoint audits (§4.2.1–4.2.2, §4.5): stable rank, mean-row energy, q_tau, scalars."""

import contextlib
import io
import math

import pytest
import torch

from muonlab.papers.seed002.diagnostics import audit002 as A
from muonlab.model import GPT
from muonlab.model.variants.over_encoding import OverEncoding
from support.models import small


def model_of(**kw):
    torch.manual_seed(0)
    model = GPT(small(**kw))
    model.init_weights()
    return model


# ---------------------------------------------------------------- stable rank

def test_stable_rank_exact_cases():
    assert A.stable_rank(torch.eye(7)) == pytest.approx(7.0, rel=1e-12)
    u, v = torch.randn(9, generator=torch.Generator().manual_seed(0)), torch.arange(1.0, 6.0)
    assert A.stable_rank(torch.outer(u, v)) == pytest.approx(1.0, rel=1e-10)
    assert A.stable_rank(torch.diag(torch.tensor([3.0, 4.0]))) == pytest.approx((9 + 16) / 16, rel=1e-12)
    assert math.isnan(A.stable_rank(torch.zeros(3, 4)))


def test_stable_rank_matches_svd_scale_invariant_and_orientation_free():
    g = torch.Generator().manual_seed(1)
    for shape in ((50, 8), (8, 50), (12, 12)):
        w = torch.randn(*shape, generator=g)
        s = torch.linalg.svdvals(w.double())
        ref = float((s ** 2).sum() / s[0] ** 2)
        assert A.stable_rank(w) == pytest.approx(ref, rel=1e-9)
        assert A.stable_rank(32.0 * w) == pytest.approx(ref, rel=1e-9)  # exact rescaling in fp32
        assert A.stable_rank(37.3 * w) == pytest.approx(ref, rel=1e-6)  # fp32 product rounding
        assert A.stable_rank(w.T) == pytest.approx(ref, rel=1e-9)
        assert 1.0 <= A.stable_rank(w) <= min(shape) + 1e-9
    w = torch.randn(40, 6, generator=g).bfloat16()  # bf16 input read exactly in float64
    s = torch.linalg.svdvals(w.double())
    assert A.stable_rank(w) == pytest.approx(float((s ** 2).sum() / s[0] ** 2), rel=1e-9)


# ---------------------------------------------------------------- mean-row energy share

def test_mean_row_energy_share_limits_and_formula():
    row = torch.tensor([1.0, -2.0, 0.5])
    assert A.mean_row_energy_share(row.repeat(5, 1)) == pytest.approx(1.0, rel=1e-12)
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    assert A.mean_row_energy_share(w - w.mean(0)) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(A.mean_row_energy_share(torch.zeros(3, 2)))
    # independent evaluation of M ||w_bar||^2 / ||W||_F^2 with explicit sums
    w = torch.randn(11, 5, generator=torch.Generator().manual_seed(3)) + 0.3
    rows = w.double().tolist()
    wbar = [sum(r[j] for r in rows) / len(rows) for j in range(5)]
    ref = len(rows) * sum(x * x for x in wbar) / sum(x * x for r in rows for x in r)
    assert A.mean_row_energy_share(w) == pytest.approx(ref, rel=1e-12)
    assert A.mean_row_energy_share(-4 * w) == pytest.approx(ref, rel=1e-12)
    assert 0 < ref < 1


# ---------------------------------------------------------------- q_tau profile

def test_qtau_profile_none_without_log_scale():
    assert A.qtau_profile(model_of()) is None
    assert A.qtau_profile(model_of(qk_scale="head_temp")) is None


def test_qtau_bands_scale_with_head_dim():
    assert {k: (r.start, r.stop) for k, r in A.qtau_bands(64).items()} == {
        "high": (0, 16), "mid": (16, 48), "low": (48, 64)}
    assert {k: (r.start, r.stop) for k, r in A.qtau_bands(16).items()} == {
        "high": (0, 4), "mid": (4, 12), "low": (12, 16)}


def _hand_set_qtau(model):
    """q_tau[l, h, c] = log(1 + 0.1 l + band(c)), band = 0.0 / 0.5 / 0.2 for high / mid / low (P = 16)."""
    L, H, P = model.qk_scales.shape
    band = torch.tensor([0.0] * 4 + [0.5] * 8 + [0.2] * 4)
    value = 1 + 0.1 * torch.arange(L, dtype=torch.float64)[:, None, None] + band[None, None, :]
    with torch.no_grad():
        model.qk_scales.copy_(value.expand(L, H, P).log())
    return value.expand(L, H, P)


def test_qtau_profile_known_band_and_layer_means():
    model = model_of(qk_scale="pair_tied_exp")
    value = _hand_set_qtau(model)
    p = A.qtau_profile(model)
    lm = 0.15  # mean of 0.1 l over l = 0..3
    assert p["high"] == pytest.approx(1 + lm, rel=1e-6)
    assert p["mid"] == pytest.approx(1.5 + lm, rel=1e-6)
    assert p["low"] == pytest.approx(1.2 + lm, rel=1e-6)
    band_mean = (4 * 0.0 + 8 * 0.5 + 4 * 0.2) / 16
    assert p["per_layer"] == pytest.approx([1 + 0.1 * l + band_mean for l in range(4)], rel=1e-6)
    assert p["layer0"] == pytest.approx(1 + band_mean, rel=1e-6)
    assert p["final"] == pytest.approx(1.3 + band_mean, rel=1e-6)
    assert p["middle_layers"] == [2] and p["middle"] == pytest.approx(1.2 + band_mean, rel=1e-6)
    assert p["mean"] == pytest.approx(float(value.mean()), rel=1e-6)
    assert p["sd"] == pytest.approx(float(value.std(unbiased=False)), rel=1e-5)
    assert p["bands"] == {"high": [0, 3], "mid": [4, 11], "low": [12, 15]}


def test_qtau_profile_applies_freeze_mask():
    model = model_of(qk_scale="pair_tied_exp", qk_freeze_layers="0", qk_freeze_planes=4)
    _hand_set_qtau(model)
    p = A.qtau_profile(model)
    assert p["layer0"] == pytest.approx(1.0)  # layer 0 frozen at scale 1 whatever its raw values
    assert p["high"] == pytest.approx(1.0)  # planes c < 4 frozen in every layer
    assert p["mid"] == pytest.approx((1.0 + sum(1.5 + 0.1 * l for l in (1, 2, 3))) / 4, rel=1e-6)
    assert p["per_layer"][3] == pytest.approx((4 * 1.0 + 8 * 1.8 + 4 * 1.5) / 16, rel=1e-6)


def test_excess_change_reproduces_spec_example():
    assert A.excess_change(1.1084, 1.2920) == pytest.approx(-0.629, abs=5e-4)


# ---------------------------------------------------------------- terminal scalars

def test_terminal_scalars_read_live_values():
    model = model_of()
    with torch.no_grad():
        model.x0_lambdas.copy_(torch.tensor([5.0, -2.5, 0.25, 3.0]))
        model.resid_lambdas.copy_(torch.tensor([1.04, 0.45, 0.9, 1.1]))
    s = A.terminal_scalars(model)
    assert s["x0_lambdas"] == pytest.approx([5.0, -2.5, 0.25, 3.0])
    assert s["resid_lambdas[0:2]"] == pytest.approx([1.04, 0.45])
    assert "wte_lambdas" not in s and "out_lambdas" not in s
    model.wte_lambdas = torch.nn.Parameter(torch.tensor([-1.7, 2.8, 0.0, 0.3]))
    model.out_lambdas = torch.nn.Parameter(torch.tensor([-3.61, 0.97]))
    s = A.terminal_scalars(model)
    assert s["wte_lambdas"] == pytest.approx([-1.7, 2.8, 0.0, 0.3])
    assert s["out_lambdas"] == pytest.approx([-3.61, 0.97])


# ---------------------------------------------------------------- whole-model audit


def test_audit_model_covers_every_family():
    model = model_of(qk_scale="pair_tied_exp")
    with torch.no_grad():
        for block in model.transformer.h:
            block.mlp.c_proj.weight.normal_(0, 0.02)  # attn.c_proj stays zero: skipped as nan
    oe = OverEncoding(vocab_size=64, n_embd=64, m=101)
    with torch.no_grad():
        oe.tables[0].weight[:50].normal_()
        oe.tables[1].weight.normal_()
        oe.tables[2].weight.copy_(torch.arange(1.0, 17.0).expand(105, 16))  # identical rows: srank 1, share 1
        oe.tables[3].weight.normal_(generator=torch.Generator().manual_seed(4))
    model.oe = oe
    res = A.audit_model(model)
    fam = res["families"]
    assert set(fam) == {"wte", "lm_head", "value_embeds", "attention", "mlp", "oe_tables"}
    d = 64
    assert fam["wte"]["srank"] == pytest.approx(A.stable_rank(model.transformer.wte.weight))
    assert fam["wte"]["srank_bound"] == d and fam["lm_head"]["srank_bound"] == d
    assert fam["wte"]["srank_frac"] == pytest.approx(fam["wte"]["srank"] / d)
    assert fam["lm_head"]["mean_row_energy"] == pytest.approx(A.mean_row_energy_share(model.lm_head.weight))
    assert fam["value_embeds"]["n"] == len(model.value_embeds) == 2
    ves = [A.stable_rank(e.weight) for e in model.value_embeds.values()]
    assert fam["value_embeds"]["srank"] == pytest.approx(sum(ves) / 2)
    assert fam["attention"]["n"] == 16 and fam["attention"]["n_zero"] == 4
    attn = [A.stable_rank(getattr(b.attn, n).weight) for b in model.transformer.h for n in ("c_q", "c_k", "c_v")]
    assert fam["attention"]["srank"] == pytest.approx(sum(attn) / len(attn))
    assert fam["mlp"]["n"] == 8 and fam["mlp"]["n_zero"] == 0
    assert fam["mlp"]["srank_bound"] == 64
    o = fam["oe_tables"]
    assert o["n"] == 4 and o["srank_bound"] == 16 and o["srank_each"][2] == pytest.approx(1.0)
    srs = [A.stable_rank(t.weight) for t in oe.tables]
    assert o["srank"] == pytest.approx(sum(srs) / 4)
    assert o["srank_frac"] == pytest.approx(sum(srs) / 4 / 16)
    shares = [A.mean_row_energy_share(t.weight) for t in oe.tables]
    assert shares[2] == pytest.approx(1.0)
    assert o["mean_row_energy"] == pytest.approx(sum(shares) / 4)
    assert o["nonzero_rows"] == [50, 103, 105, 107]
    w0 = oe.tables[0].weight
    nz = [A.mean_row_energy_share(w0[:50])] + shares[1:]
    assert o["mean_row_energy_nonzero"] == pytest.approx(sum(nz) / 4)
    assert A.mean_row_energy_share(w0) == pytest.approx(50 / 101 * A.mean_row_energy_share(w0[:50]), rel=1e-6)
    assert res["qtau"]["mean"] == pytest.approx(1.0) and res["scalars"]["x0_lambdas"] == pytest.approx([0.1] * 4)
    text = A.format_audit_table(res)
    for word in ("wte", "lm_head", "oe_tables", "value_embeds", "attention", "mlp", "exp(q_tau)", "x0_lambdas"):
        assert word in text


def test_audit_model_without_oe_or_qtau():
    res = A.audit_model(model_of())
    assert "oe_tables" not in res["families"] and res["qtau"] is None
    assert not math.isnan(res["families"]["attention"]["srank"])
    assert "exp(q_tau): none" in A.format_audit_table(res)
    model = model_of()
    model.oe = OverEncoding(vocab_size=64, n_embd=64, m=101)  # zero init: no stable rank anywhere
    o = A.audit_model(model)["families"]["oe_tables"]
    assert o["n_zero"] == 4 and math.isnan(o["srank"]) and math.isnan(o["mean_row_energy"])
    assert "oe_tables" in A.format_audit_table(A.audit_model(model))


def test_run_audit_on_a_trained_run(tmp_path):
    from muonlab.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", "--preset", "cpu-tiny", "--num-steps", "2", "--cache-dir", str(tmp_path),
                     "--quiet", "true", "--json"]) == 0
    (config,) = (tmp_path / "runs").glob("*/config.json")
    res = A.run_audit(config.parent)
    assert res["step"] >= 1 and res["arm"] is not None
    assert {"wte", "lm_head", "attention", "mlp"} <= set(res["families"])
    assert all(0 < f["srank_frac"] <= 1 for f in res["families"].values() if f["n_zero"] < f["n"])
    assert str(config.parent) in A.format_audit_table(res)
