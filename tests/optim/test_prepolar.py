"""Pre-polar conditioners and post-polar precision (muonlab.optim.addons), against their equations.

Each conditioner is checked against a plain float64 transcription of the paper's formula
(seed 000 §3.3), inside the optimizer too (the input Polar Express receives is captured), with
zero rows and columns; the options off leave the upstream step bitwise; state round-trips.
"""

import copy
import io

import pytest
import torch

import muonlab.optim.steps as steps_module
import muonlab.optim.muon_variant as variant_module
from muonlab.optim import MuonAdamW
from muonlab.optim.addons.hbieq import hbieq
from muonlab.optim.addons.muon2f import muon2f_precondition
from muonlab.optim.addons.turbo_aol import aol_scale
from muonlab.optim.addons.zeta import zeta_update, zeta_whiten
from muonlab.optim.distributed import DistMuonAdamW
from muonlab.optim.homotopy import homotopy_alpha
from muonlab.optim.polar import polar_express

from support.ranks import assert_state_equal, averaged_replay, dyadic_steps, flat, run_ranks, unflat

SHAPES = [(3, 12, 8), (2, 8, 16), (2, 6, 6)]


def _rand(shape, seed, zero_row=True, zero_col=True):
    g = torch.Generator().manual_seed(seed)
    # row and column scales over 2 decades, so equilibration has something to do
    G = torch.randn(*shape, generator=g) * 10 ** (2 * torch.rand(*shape[:-1], 1, generator=g) - 1)
    G = G * 10 ** (2 * torch.rand(*shape[:-2], 1, shape[-1], generator=g) - 1)
    if zero_row:
        G[..., 1, :] = 0
    if zero_col:
        G[..., :, 2] = 0
    return G


# ---------------------------------------------------------------- float64 transcriptions

def hbieq_ref(G, a, passes=2, sides="both", eps=1e-10):
    """seed 000 §3.3, written out per matrix with loops-free float64 tensor ops."""
    G = G.double().clone()
    m, n = G.shape[-2:]
    for _ in range(passes):
        r = torch.sqrt((G ** 2).sum(-1, keepdim=True) / n + eps)
        rbar = r.sum(-2, keepdim=True) / m
        G = G / ((1 - a) * rbar + a * r + eps)
        if sides == "both":
            c = torch.sqrt((G ** 2).sum(-2, keepdim=True) / m + eps)
            cbar = c.sum(-1, keepdim=True) / n
            G = G / ((1 - a) * cbar + a * c + eps)
    return G


def aol_ref(X, safety=1.02):
    X = X.double()
    m, n = X.shape[-2:]
    if m > n:
        A0 = X.transpose(-1, -2) @ X
        s = A0.abs().sum(-1).clamp_min(1e-300) ** -0.5 / safety
        return X * s[..., None, :]
    A0 = X @ X.transpose(-1, -2)
    s = A0.abs().sum(-1).clamp_min(1e-300) ** -0.5 / safety
    return X * s[..., :, None]


def close(a, b, rtol=1e-5, atol=1e-12):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all()
    assert torch.allclose(a, b, rtol=rtol, atol=atol * b.abs().max().item() + 1e-30), (a - b).abs().max().item()


# ---------------------------------------------------------------- the pure functions

def test_homotopy_alpha():
    assert homotopy_alpha(0, 80) == 0.0
    assert homotopy_alpha(40, 80) == 0.25
    assert homotopy_alpha(80, 80) == 1.0 and homotopy_alpha(500, 25) == 1.0
    assert homotopy_alpha(0, 0) == 1.0  # tau = 0: undamped


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("a,passes,sides", [(0.0, 2, "both"), (0.3, 2, "both"), (1.0, 2, "both"),
                                            (1.0, 1, "row"), (0.7, 3, "both")])
def test_hbieq_matches_equation(shape, a, passes, sides):
    G = _rand(shape, seed=1)
    out = hbieq(G.clone(), torch.tensor(a), passes=passes, sides=sides)
    close(out, hbieq_ref(G, a, passes, sides))
    assert (out[..., 1, :] == 0).all() and (out[..., :, 2] == 0).all()  # zero rows/cols stay zero


def test_hbieq_alpha_zero_is_a_scalar_and_polar_express_removes_it():
    G = _rand((4, 16, 16), seed=2, zero_row=False, zero_col=False)
    out = hbieq(G.clone(), 0.0)
    ratio = out.double() / G.double()
    assert torch.allclose(ratio, ratio[:, :1, :1].expand_as(ratio), rtol=1e-6)  # one scalar per matrix
    a = polar_express(out, 5, dtype=torch.float32)
    b = polar_express(G, 5, dtype=torch.float32)
    assert (a - b).abs().max() < 1e-4 * b.abs().max()
    # and a = 1 really equilibrates: every row RMS of the result is ~1 after the row step
    full = hbieq(G.clone(), 1.0, passes=8)
    assert torch.allclose(full.square().mean(-1), torch.ones(4, 16), rtol=2e-2)


def test_zeta_matches_equation():
    V = torch.zeros(2, 8, 6)
    Vref = torch.zeros(2, 8, 6, dtype=torch.float64)
    for t in range(1, 4):
        g = _rand((2, 8, 6), seed=10 + t)
        zeta_update(V, g, 0.99)
        Vref = 0.99 * Vref + 0.01 * g.double() ** 2
        close(V, Vref)
        G = _rand((2, 8, 6), seed=20 + t)
        out = zeta_whiten(G.clone(), V, 1 - 0.99 ** t, 1e-8)
        ref = G.double() / (torch.sqrt(Vref / (1 - 0.99 ** t)) + 1e-8)
        close(out, ref)
    assert torch.isfinite(out).all() and (out[..., 1, :] == 0).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_aol_matches_equation(shape):
    X = _rand(shape, seed=3)
    close(aol_scale(X.clone()), aol_ref(X), rtol=1e-4)
    out = polar_express(X, 5, dtype=torch.float32, normalize="aol")
    assert torch.isfinite(out).all() and (out[..., 1, :] == 0).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_aol_gram_reuse_is_the_same_iteration(shape):
    """The first iteration's Gram of the scaled X equals diag(s) A0 diag(s) (float64: to rounding)."""
    X = _rand(shape, seed=5).double()
    reused = polar_express(X, 5, dtype=torch.float64, normalize="aol", reuse_gram=True)
    formed = polar_express(X, 5, dtype=torch.float64, normalize="aol", reuse_gram=False)
    close(reused, formed, rtol=1e-10, atol=1e-12)
    # and it is an orthogonalisation: the same polar factor as the Frobenius-normalised run, roughly
    frob = polar_express(X, 5, dtype=torch.float64)
    assert torch.nn.functional.cosine_similarity(reused.flatten(), frob.flatten(), dim=0) > 0.9


def test_aol_gram_reuse_option_reaches_polar_express(monkeypatch):
    seen = []
    real = variant_module.polar_express
    monkeypatch.setattr(variant_module, "polar_express", lambda g, n, **kw: seen.append(kw) or real(g, n, **kw))
    for reuse in (True, False):
        p = torch.nn.Parameter(_rand((8, 6), seed=6))
        p.grad = _rand((8, 6), seed=7)
        MuonAdamW([{"kind": "muon", "params": [p], "lr": 0.02, "momentum": 0.95, "weight_decay": 0.0,
                    "prepolar.kind": "turbo_aol", "prepolar.reuse_gram": reuse}], compile=False).step()
        assert seen[-1]["reuse_gram"] is reuse


def test_muon2f_matches_equation():
    G = _rand((3, 12, 8), seed=4)
    v = torch.full((3, 12, 1), 0.5)
    out = muon2f_precondition(G.clone(), v, 0.95, -1)
    vref = 0.95 * 0.5 + 0.05 * (G.double() ** 2).mean(-1, keepdim=True)
    close(v, vref)
    close(out, G.double() / torch.sqrt(vref.clamp_min(1e-10)))


# ---------------------------------------------------------------- inside the optimizer

def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s[1:], generator=g) * 0.1) for s in SHAPES for _ in range(s[0])]


def _groups(ps, opts=None):
    """One muon group per shape; opts (group keys: a dict per group index, or one dict for all) on top."""
    opts = opts or {}
    out, k = [], 0
    for gi, (n, _, _) in enumerate(SHAPES):
        extra = opts.get(gi, {}) if all(isinstance(x, int) for x in opts) else opts
        out.append(dict(kind="muon", params=ps[k:k + n], lr=0.04, momentum=0.9, weight_decay=0.2, **extra))
        k += n
    return out


def _grads(ps, step, zeros=True):
    for i, p in enumerate(ps):
        g = torch.Generator().manual_seed(1000 * step + i)
        p.grad = torch.randn(p.shape, generator=g) * 10 ** (2 * torch.rand(p.shape[0], 1, generator=g) - 1)
        if zeros:
            p.grad[1] = 0
            p.grad[:, 2] = 0


def _run(opts, steps=3, capture=None, monkeypatch=None):
    ps = _params()
    opt = MuonAdamW(_groups(ps, opts))
    for step in range(steps):
        _grads(ps, step)
        opt.step()
    return ps, opt


def _capture_polar_inputs(monkeypatch):
    """Every Polar Express call, of the upstream step (steps.muon_step) and of the variant step."""
    seen = []
    real = steps_module.polar_express

    def spy(g, steps, **kw):
        seen.append((g.detach().clone(), kw))
        return real(g, steps, **kw)

    monkeypatch.setattr(steps_module, "polar_express", spy)
    monkeypatch.setattr(variant_module, "polar_express", spy)
    return seen


@pytest.mark.parametrize("name", ["hbieq", "zeta", "muon2f", "turbo_aol"])
def test_polar_express_receives_the_conditioned_nesterov_tensor(name, monkeypatch):
    """3 steps; the input of Polar Express against a float64 transcription of Nesterov + rule."""
    seen = _capture_polar_inputs(monkeypatch)
    opts = {"prepolar.kind": name, **({"prepolar.tau": 2.0} if name == "hbieq" else {})}
    ps, _ = _run(opts, steps=3)
    mom, vzeta = {}, {}
    vmu2 = {}
    for step in range(3):
        _grads(ps, step)
        for gi, (n, m, k) in enumerate(SHAPES):
            idx = sum(s[0] for s in SHAPES[:gi])
            g = torch.stack([ps[idx + j].grad for j in range(n)]).double()
            buf = mom.get(gi, torch.zeros_like(g))
            if name == "zeta":
                vzeta[gi] = 0.99 * vzeta.get(gi, torch.zeros_like(g)) + 0.01 * g ** 2
            buf = buf + 0.1 * (g - buf)  # lerp(buf, g, 1 - 0.9)
            mom[gi] = buf
            G = g + 0.9 * (buf - g)  # lerp(g, buf, 0.9)
            if name == "hbieq":
                G = hbieq_ref(G, homotopy_alpha(step + 1, 2.0))  # t = 1 at the first update (homotopy.py)
            elif name == "zeta":
                G = G / (torch.sqrt(vzeta[gi] / (1 - 0.99 ** (step + 1))) + 1e-8)
            elif name == "muon2f":
                red = -1 if m >= k else -2
                vmu2[gi] = 0.95 * vmu2.get(gi, torch.zeros_like(G.mean(red, keepdim=True))) \
                    + 0.05 * (G ** 2).mean(red, keepdim=True)
                G = G / torch.sqrt(vmu2[gi].clamp_min(1e-10))
            got, kw = seen[3 * step + gi]
            close(got, G, rtol=2e-4, atol=1e-6)
            assert kw == ({"dtype": torch.bfloat16, "normalize": "aol", "reuse_gram": True}
                          if name == "turbo_aol" else {})
            assert torch.isfinite(got).all()


def test_options_off_are_the_upstream_step_bitwise(monkeypatch):
    seen = _capture_polar_inputs(monkeypatch)
    a, opt_a = _run({})
    b, opt_b = _run({"prepolar.kind": None, "prepolar.scope": "all", "polar.dtype": "bf16", "polar.post_dtype": None})
    assert torch.equal(flat(a), flat(b))
    assert_state_equal(opt_a.state_dict() | {"param_groups": []}, opt_b.state_dict() | {"param_groups": []})
    assert seen and all(kw == {} for _, kw in seen)  # the upstream call: polar_express(g, ns_steps)


@pytest.mark.parametrize("first_t", [0, 1])
def test_first_homotopy_step_equals_baseline_up_to_rounding(first_t):
    ps_a, ps_b = _params(), _params()
    opt_a = MuonAdamW(_groups(ps_a, {"polar.dtype": "fp32", "polar.post_dtype": "fp32"}))
    opt_b = MuonAdamW(_groups(ps_b, {"prepolar.kind": "hbieq", "prepolar.tau": 80.0, "prepolar.first_t": first_t,
                                     "polar.dtype": "fp32", "polar.post_dtype": "fp32"}))
    before = flat(ps_a)
    for ps, opt in ((ps_a, opt_a), (ps_b, opt_b)):
        _grads(ps, 0, zeros=False)
        opt.step()
    da, db = flat(ps_a) - before, flat(ps_b) - before
    if first_t == 0:  # a_0 = 0: a scalar the Frobenius normalisation removes
        assert (da - db).norm() < 1e-4 * da.norm()
    else:  # a_1 = 1/80^2: the equilibration acts, but barely
        assert 1e-6 * da.norm() < (da - db).norm() < 1e-2 * da.norm()


def test_square_only_leaves_rectangular_groups_bitwise(monkeypatch):
    a, opt_a = _run({})
    b, opt_b = _run({"prepolar.kind": "hbieq", "prepolar.scope": "square_only", "prepolar.tau": 0.0})
    n_rect = 3 + 2
    assert torch.equal(flat(a[:n_rect]), flat(b[:n_rect]))
    assert not torch.equal(flat(a[n_rect:]), flat(b[n_rect:]))
    sd = opt_b.state_dict()["state"]
    assert "prepolar_step" not in sd[0] and sd[5]["prepolar_step"] == 3


def test_name_filter_selects_matrices_of_a_stack():
    names = [f"h.{i}.w" for i in range(7)]
    ps_a, ps_b = _params(), _params()
    groups = [dict(g, param_names=names[k:k + len(g["params"])]) for g, k in zip(_groups(ps_b), (0, 3, 5))]
    for g in groups:
        g.update({"prepolar.kind": "zeta", "prepolar.scope": r"h\.(0|4)\."})
    opt_a = MuonAdamW(_groups(ps_a))
    opt_b = MuonAdamW(groups + [dict(kind="adamw", params=[], lr=0.1, param_names=[])])
    for step in range(2):
        for ps, opt in ((ps_a, opt_a), (ps_b, opt_b)):
            _grads(ps, step)
            opt.step()
    for i in range(7):
        assert torch.equal(ps_a[i], ps_b[i]) == (i not in (0, 4)), i
    assert opt_b.state[ps_b[0]]["zeta_buffer"].shape == (3, 12, 8)  # [N, ...] for the whole stack
    assert "zeta_buffer" not in opt_b.state[ps_b[5]]  # no matrix of the square group selected


def test_bad_options_raise():
    ps = _params()
    with pytest.raises(ValueError, match=r"prepolar\.kind must be"):
        MuonAdamW(_groups(ps, {"prepolar.kind": "bieq"}))
    with pytest.raises(ValueError, match="param_names"):
        MuonAdamW(_groups(ps, {"prepolar.kind": "hbieq", "prepolar.scope": "attn"}))
    with pytest.raises(ValueError, match=r"polar\.dtype"):
        MuonAdamW(_groups(ps, {"polar.dtype": "fp16"}))
    names = [f"m{i}" for i in range(7)]
    groups = [{**g, "param_names": names[k:k + len(g["params"])], "prepolar.kind": "turbo_aol", "prepolar.scope": "m0"}
              for g, k in zip(_groups(ps), (0, 3, 5))]
    with pytest.raises(ValueError, match="whole groups"):
        MuonAdamW(groups)


def test_post_polar_fp32_vs_bf16_differ_as_expected():
    """fp32 post-polar: NorMuon's beta2 is 0.95 (bf16 rounds it to 0.94921875) and the update
    is the fp32 X; bf16 post-polar: the upstream numbers."""
    runs = {}
    for post in (None, "fp32"):
        ps = _params()
        opt = MuonAdamW(_groups(ps, {"polar.post_dtype": post}))
        before = flat(ps)
        _grads(ps, 0, zeros=False)
        opt.step()
        v = opt.state[ps[0]]["second_momentum_buffer"]
        runs[post] = (flat(ps) - before, v)
    d_bf, v_bf = runs[None]
    d_fp, v_fp = runs["fp32"]
    assert not torch.equal(d_bf, d_fp)
    assert (d_bf - d_fp).norm() < 2e-2 * d_fp.norm()  # the same update up to bf16 rounding
    # step 1 from a zero buffer: v = (1 - beta2) * v_mean, so the two buffers differ by that ratio
    assert torch.allclose(v_bf / v_fp, torch.full_like(v_bf, (1 - 0.94921875) / (1 - 0.95)), rtol=2e-2)
    # bf16-rounded updates: lr * g with g on the bf16 grid vs not
    g_bf = d_bf / 0.04
    assert (g_bf.bfloat16().float() - g_bf).abs().max() < (g_bf.abs().max() * 2e-2)


def test_polar_express_in_fp32_is_more_orthogonal():
    G = torch.randn(4, 64, 16, generator=torch.Generator().manual_seed(5))
    exact = polar_express(G, 5, dtype=torch.float64)  # the same polynomial without rounding
    err = {dt: (polar_express(G, 5, dtype=dt).double() - exact).norm() / exact.norm()
           for dt in (torch.bfloat16, torch.float32)}
    assert err[torch.float32] < 1e-5 < 1e-3 < err[torch.bfloat16]
    ps = _params()
    seen = []
    real = variant_module.polar_express
    variant_module.polar_express = lambda g, steps, **kw: seen.append(kw) or real(g, steps, **kw)
    try:
        MuonAdamW(_groups(ps, {"polar.dtype": "fp32"}))
        _grads(ps, 0)
        MuonAdamW(_groups(ps, {"polar.dtype": "fp32"})).step()
    finally:
        variant_module.polar_express = real
    assert seen and all(kw["dtype"] == torch.float32 for kw in seen)


EVERY_OPTION = {0: {"prepolar.kind": "zeta", "polar.post_dtype": "fp32"},
                1: {"prepolar.kind": "hbieq", "prepolar.tau": 3.0, "polar.dtype": "fp32", "polar.post_dtype": "fp32"},
                2: {"prepolar.kind": "muon2f", "polar.dtype": "fp32"}}


@pytest.mark.parametrize("opts", [EVERY_OPTION, {"prepolar.kind": "turbo_aol", "polar.post_dtype": "fp32"},
                                  {0: {"prepolar.kind": "hbieq", "prepolar.sides": "row", "prepolar.passes": 1},
                                   1: {"prepolar.kind": "hbieq", "prepolar.tau": 0.0}, 2: {"prepolar.kind": "zeta"}}])
def test_state_dict_round_trip_continues_bitwise(opts):
    k, extra = 3, 3
    ps = _params()
    opt = MuonAdamW(_groups(ps, opts))
    for step in range(k):
        _grads(ps, step)
        opt.step()
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "params": flat(ps)}, buf)
    cont = []
    for step in range(k, k + extra):
        _grads(ps, step)
        opt.step()
        cont.append(flat(ps))
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    ps2 = _params(seed=9)
    unflat(saved["params"], ps2)
    opt2 = MuonAdamW(_groups(ps2, opts))
    opt2.load_state_dict(saved["opt"])
    for i, step in enumerate(range(k, k + extra)):
        _grads(ps2, step)
        opt2.step()
        assert torch.equal(flat(ps2), cont[i]), step
    assert_state_equal(opt2.state_dict(), opt.state_dict())
    if opts is EVERY_OPTION:
        st = opt.state_dict()["state"]
        assert st[0]["zeta_buffer"].dtype == torch.float32 and st[0]["zeta_buffer"].shape == (3, 12, 8)
        assert st[0]["prepolar_step"] == k + extra


# ---------------------------------------------------------------- distributed

def _dist_groups(ps):
    return _groups(ps, EVERY_OPTION)


def _dist_worker(rank, world, steps):
    ps = _params()
    opt = DistMuonAdamW(_dist_groups(ps))
    history = dyadic_steps(opt, ps, rank, steps)
    full = opt.full_state_dict()
    # a fresh optimizer loading the full dict keeps its shard and continues identically
    opt2 = DistMuonAdamW(_dist_groups(ps))
    opt2.load_state_dict(copy.deepcopy(full))
    return {"history": history, "full": full, "shard": copy.deepcopy(opt.state_dict()),
            "reloaded": opt2.state_dict()}


def test_distributed_with_stateful_conditioners_equals_one_process(tmp_path):
    steps = 3
    results = run_ranks(_dist_worker, 2, tmp_path / "ranks", steps)
    ps = _params()
    opt, ref = averaged_replay(ps, _dist_groups(ps), steps)
    for rank, res in enumerate(results):
        for step in range(steps):
            assert torch.equal(res["history"][step], ref[step]), (rank, step)
        assert_state_equal(res["full"], opt.state_dict())
        shard = res["shard"]["state"]
        assert shard[0]["zeta_buffer"].shape == ((2, 1)[rank], 12, 8) and shard[0]["prepolar_step"] == steps
        assert shard[5]["second_momentum_buffer"].shape == (1, 6, 1) and "zeta_buffer" not in shard[5]
        assert_state_equal(res["reloaded"], res["shard"])
