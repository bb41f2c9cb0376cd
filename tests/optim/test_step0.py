"""Step-0 controls (seed 002 §4.5 item 2): what each mode does to state and params at steps 0 and 1."""

import math

import pytest
import torch

from muonlab.optim import MuonAdamW
from muonlab.optim.step0 import ALL_FAMILIES, ROUTING_FAMILIES, STEP0_MODES, Step0Control, family_params

B1, B2, LR, EPS = 0.96, 0.95, 0.5, 1e-10
SIZES = {"resid_lambdas": 3, "x0_lambdas": 3, "wte_lambdas": 4, "out_lambdas": 2}
OTHERS = ("matrix", "table")


def _snap_state(opt, p):
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state.get(p, {}).items()}


def run(mode, families=ALL_FAMILIES, master32=False, control=True):
    """Two steps with fixed gradients; returns init/params/states after steps 0 and 1, and grads.

    control=False: the same run with no Step0Control at all."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if master32 else torch.float32
    params = {n: torch.nn.Parameter(torch.randn(SIZES[n]).to(dtype)) for n in families}
    params["matrix"] = torch.nn.Parameter(torch.randn(8, 4))
    params["table"] = torch.nn.Parameter(torch.randn(16, 4))
    groups = [dict(kind="muon", params=[params["matrix"]], lr=0.02),
              dict(kind="adamw", params=[params["table"]], lr=0.1, betas=(0.8, 0.95), eps=EPS)]
    groups += [dict(kind="adamw", params=[params[n]], lr=LR, betas=(B1, B2), eps=EPS, master32=master32)
               for n in families]
    opt = MuonAdamW(groups, compile=False)
    ctl = Step0Control(mode, {n: params[n] for n in families})
    gen = torch.Generator().manual_seed(1)
    grads = [{n: torch.randn(p.shape, generator=gen).to(p.dtype) for n, p in params.items()} for _ in range(2)]
    out = {"init": {n: p.detach().clone() for n, p in params.items()}, "grads": grads, "opt": opt}
    for step in range(2):
        for n, p in params.items():
            p.grad = grads[step][n].clone()
        if control:
            ctl.before_step(step, opt)
        opt.step()
        if control:
            ctl.after_step(step, opt)
        opt.zero_grad(set_to_none=True)
        out[f"p{step}"] = {n: p.detach().clone() for n, p in params.items()}
        out[f"s{step}"] = {n: _snap_state(opt, p) for n, p in params.items()}
    return out


@pytest.fixture(scope="module")
def none():
    return run("none")


def fresh_update(g):  # AdamW at t=1 from zero state: -lr * g / (|g| + eps)
    g = g.double()
    return -LR * g / (g.abs() + EPS)


def t2_zero_moment_update(g):  # AdamW at t=2 from zero moments
    g = g.double()
    m, v = (1 - B1) * g, (1 - B2) * g.square()
    return -LR * (m / (1 - B1 ** 2)) / ((v / (1 - B2 ** 2)).sqrt() + EPS)


def delta(r, name):
    return (r["p1"][name] - r["p0"][name]).double()


def test_none_is_a_plain_run(none):
    plain = run("none", control=False)
    for n in OTHERS + ALL_FAMILIES:
        assert torch.equal(none["p1"][n], plain["p1"][n])
    for n in ALL_FAMILIES:  # a normal step 0: the ±lr jump and t=1 state
        assert none["s0"][n]["step"] == 1
        jump = (none["p0"][n] - none["init"][n]).double()
        assert torch.allclose(jump, fresh_update(none["grads"][0][n]), atol=1e-6)


@pytest.mark.parametrize("mode", STEP0_MODES)
def test_other_params_untouched(mode, none):
    r = run(mode)
    acted = ALL_FAMILIES if mode == "nostep0_all" else ROUTING_FAMILIES if mode != "none" else ()
    for n in OTHERS + tuple(f for f in ALL_FAMILIES if f not in acted):
        for k in ("p0", "p1"):
            assert torch.equal(r[k][n], none[k][n]), (mode, n, k)
        for k in ("s0", "s1"):
            assert r[k][n].keys() == none[k][n].keys()
            for key, v in r[k][n].items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(none[k][n][key])), (mode, n, k, key)


@pytest.mark.parametrize("mode,families", [("nostep0", ROUTING_FAMILIES), ("nostep0_all", ALL_FAMILIES)])
def test_nostep0(mode, families, none):
    r = run(mode)
    for n in families:
        assert r["s0"][n] == {}  # no state created
        assert torch.equal(r["p0"][n], r["init"][n])  # no displacement
        assert r["s1"][n]["step"] == 1  # first update at step 1, fresh state
        assert torch.allclose(delta(r, n), fresh_update(r["grads"][1][n]), atol=1e-6)
        assert not torch.equal(r["p0"][n], none["p0"][n])
    if mode == "nostep0":
        assert all(r["s0"][n]["step"] == 1 for n in ("resid_lambdas", "x0_lambdas"))


def test_mom_only_nodisp(none):
    r = run("mom_only_nodisp")
    for n in ROUTING_FAMILIES:
        assert torch.equal(r["p0"][n], r["init"][n])
        assert r["s0"][n]["step"] == 1
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(r["s0"][n][key], none["s0"][n][key])
            assert torch.equal(r["s1"][n][key], none["s1"][n][key])
        assert r["s1"][n]["step"] == 2
        assert torch.allclose(delta(r, n), delta(none, n), atol=1e-6)  # same t=2 update, from init


def test_disp_only_nomom(none):
    r = run("disp_only_nomom")
    for n in ROUTING_FAMILIES:
        assert torch.equal(r["p0"][n], none["p0"][n])
        assert r["s0"][n] == {}
        assert r["s1"][n]["step"] == 1
        assert torch.allclose(delta(r, n), fresh_update(r["grads"][1][n]), atol=1e-6)


def test_disp_stepcount_nomom(none):
    r, disp = run("disp_stepcount_nomom"), run("disp_only_nomom")
    multiplier = math.sqrt(1 + B2) / (1 + B1)
    assert round(multiplier, 4) == 0.7125  # the spec's value for betas (0.96, 0.95)
    for n in ROUTING_FAMILIES:
        assert torch.equal(r["p0"][n], none["p0"][n])
        assert r["s0"][n]["step"] == 1
        assert not r["s0"][n]["exp_avg"].any() and not r["s0"][n]["exp_avg_sq"].any()
        assert r["s1"][n]["step"] == 2
        g = r["grads"][1][n]
        assert torch.allclose(delta(r, n), t2_zero_moment_update(g), atol=1e-6)
        assert torch.allclose(delta(r, n) / delta(disp, n), torch.full_like(g.double(), multiplier), atol=1e-5)


def test_optional_family_absent():
    r = run("nostep0", families=("x0_lambdas", "wte_lambdas"))
    assert r["s0"]["wte_lambdas"] == {} and r["s0"]["x0_lambdas"]["step"] == 1
    control = Step0Control("nostep0", {"x0_lambdas": torch.nn.Parameter(torch.zeros(2)),
                                       "wte_lambdas": torch.nn.Parameter(torch.zeros(2))})
    assert control.families == ("wte_lambdas",)


def test_mom_only_master32_restores_master():
    r = run("mom_only_nodisp", master32=True)
    for n in ROUTING_FAMILIES:
        assert r["p0"][n].dtype == torch.bfloat16
        assert torch.equal(r["p0"][n], r["init"][n])
        assert torch.equal(r["s0"][n]["master"], r["init"][n].float())
        assert r["s0"][n]["exp_avg"].any()
    moved = run("none", master32=True)
    assert not torch.equal(moved["s0"]["wte_lambdas"]["master"], r["s0"]["wte_lambdas"]["master"])


def test_errors():
    x = {n: torch.nn.Parameter(torch.zeros(2)) for n in ("resid_lambdas", "x0_lambdas")}
    with pytest.raises(ValueError, match="unknown step-0 mode"):
        Step0Control("nostep1", x)
    with pytest.raises(ValueError, match="wte_lambdas"):
        Step0Control("nostep0", x)
    with pytest.raises(ValueError, match="resid_lambdas"):
        Step0Control("nostep0_all", {})
    with pytest.raises(ValueError, match="not scalar families"):
        Step0Control("nostep0", {"wte_lambda": torch.nn.Parameter(torch.zeros(2))})
    Step0Control("none", {})  # none needs no family


def test_unoptimized_param_raises():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = MuonAdamW([dict(kind="adamw", params=[torch.nn.Parameter(torch.zeros(2))], lr=0.1)], compile=False)
    control = Step0Control("disp_stepcount_nomom", {"wte_lambdas": p})
    control.before_step(0, opt)
    with pytest.raises(RuntimeError, match="no step-0 update"):
        control.after_step(0, opt)


def test_family_params():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.x0_lambdas = torch.nn.Parameter(torch.zeros(2))
            self.wte_lambdas = torch.nn.Parameter(torch.zeros(2))
    assert list(family_params(M())) == ["x0_lambdas", "wte_lambdas"]
