"""The optimizer's extension registry (muonlab.optim.extensions) as a plug-in outside muonlab uses it.

A conditioner defined in this file is registered and selected with a group option, without
editing any muonlab file; its step is checked against an independent float64 transcription.
Also: the built-in add-ons' metadata, the stages being static for torch.compile(fullgraph=True),
and that a group with no add-on runs upstream's `muon_step` itself.
"""

from __future__ import annotations

import importlib
import io
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import muonlab.optim.muon_adamw as muon_module
import muonlab.optim.muon_variant as variant_module
from muonlab.errors import UsageError
from muonlab.optim import MuonAdamW, PrePolar, extensions, polar_express, register_prepolar
from muonlab.optim.extensions import option
from muonlab.settings import MethodInfo, Range

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- plug-ins defined here

@dataclass(frozen=True)
class SignConditioner(PrePolar):
    """sign(G) before Polar Express: a signSGD-like direction, orthogonalised."""

    def condition(self, G, inputs, ctx):
        return G.sign()


@dataclass(frozen=True)
class AbsMaxConditioner(PrePolar):
    """G / (max_t |g_t| + eps): a running max of the raw gradient, with per-matrix state."""

    STACKED_STATE = ("absmax_buffer",)
    eps: float = option(1e-3, "added to the running max")

    def __post_init__(self):
        if self.eps <= 0:
            raise ValueError(f"prepolar.eps must be > 0, got {self.eps}")

    def step_inputs(self, state, t, stack_shape, device):
        if "absmax_buffer" not in state:
            state["absmax_buffer"] = torch.zeros(stack_shape, device=device)
        return {"absmax_buffer": state["absmax_buffer"]}

    def before_momentum(self, raw_grads, inputs):
        torch.maximum(inputs["absmax_buffer"], raw_grads.abs(), out=inputs["absmax_buffer"])

    def condition(self, G, inputs, ctx):
        return G / (inputs["absmax_buffer"] + self.eps)


@pytest.fixture
def plugins():
    register_prepolar("test_sign", SignConditioner, paper="none (test plug-in)", tests=("tests/model/test_extensions.py",))
    register_prepolar("test_absmax", AbsMaxConditioner, paper="none (test plug-in)", tests=("tests/model/test_extensions.py",))
    yield
    extensions.unregister_prepolar("test_sign")
    extensions.unregister_prepolar("test_absmax")


def _params(shape, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g) * 0.1) for _ in range(n)]


def _set_grads(params, step):
    for i, p in enumerate(params):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(100 * step + i))


def _reference_step(p, g, m, v, lr, mom, wd, beta2, condition):
    """Nesterov -> condition -> Polar Express (the shared bf16 polynomial) -> NorMuon -> cautious
    WD, written out in float64 per matrix."""
    rows, cols = p.shape
    m = m + (1 - mom) * (g - m)
    u = condition(g + mom * (m - g))
    o = polar_express(u.float(), 5).double()
    red = -1 if rows >= cols else -2
    v = v + (1 - beta2) * (o.square().mean(dim=red, keepdim=True) - v)
    scaled = o * v.clamp_min(1e-10).rsqrt()
    scaled = scaled * (o.norm() / scaled.norm())
    lr_eff = lr * max(1.0, rows / cols) ** 0.5
    return p - lr_eff * scaled - lr_eff * wd * p * ((scaled * p) >= 0), m, v


# ---------------------------------------------------------------- a plug-in conditioner

@pytest.mark.parametrize("shape", [(24, 12), (12, 24)])
def test_plugin_conditioner_steps_as_its_equation(plugins, shape, monkeypatch):
    seen = []
    real = variant_module.polar_express
    monkeypatch.setattr(variant_module, "polar_express", lambda g, n, **kw: seen.append(g.clone()) or real(g, n, **kw))
    params = _params(shape)
    opt = MuonAdamW([{"kind": "muon", "params": params, "lr": 0.04, "momentum": 0.9, "beta2": 0.95, "weight_decay": 0.2,
                      "prepolar.kind": "test_sign"}])
    vshape = (3, shape[0], 1) if shape[0] >= shape[1] else (3, 1, shape[1])
    m_all, v_all = torch.zeros(3, *shape), torch.zeros(vshape)
    for step in range(3):
        _set_grads(params, step)
        grads = [p.grad.clone() for p in params]
        before = [p.detach().double().clone() for p in params]
        if step > 0:
            state = opt.state[params[0]]
            m_all, v_all = state["momentum_buffer"].clone(), state["second_momentum_buffer"].clone()
        opt.step()
        got = seen[-1]
        assert set(got.unique().tolist()) <= {-1.0, 0.0, 1.0}  # Polar Express received sign(u)
        for i, g in enumerate(grads):
            ref, _, _ = _reference_step(before[i], g.double(), m_all[i].double(), v_all[i].double(),
                                        0.04, 0.9, 0.2, 0.95, torch.sign)
            err = (params[i].detach().double() - ref).norm() / (ref - before[i]).norm()
            assert err < 0.02, (step, i, err.item())
    assert opt.state[params[0]]["prepolar_step"] == 3  # the point's own step counter


def test_plugin_conditioner_changes_the_update(plugins):
    runs = []
    for opts in ({}, {"prepolar.kind": "test_sign"}):
        params = _params((16, 8))
        opt = MuonAdamW([{"kind": "muon", "params": params, "lr": 0.04, **opts}])
        _set_grads(params, 0)
        opt.step()
        runs.append(torch.stack([p.detach() for p in params]))
    assert not torch.equal(*runs)


def test_stateful_plugin_on_a_name_scope(plugins):
    """A stateful plug-in on a strict subset of a stack: the rest stays bitwise upstream, its
    per-matrix state keeps the stack's layout and round-trips through state_dict."""
    names = [f"h.{i}.w" for i in range(4)]

    def build(params, opts=None):
        return MuonAdamW([{"kind": "muon", "params": params, "lr": 0.04, "param_names": names, **(opts or {})}])

    absmax_opts = {"prepolar.kind": "test_absmax", "prepolar.scope": r"h\.(1|2)\.", "prepolar.eps": 0.01}
    a, b = _params((10, 6), n=4), _params((10, 6), n=4)
    opt_a, opt_b = build(a), build(b, absmax_opts)
    absmax = torch.zeros(4, 10, 6)
    for step in range(3):
        for ps, opt in ((a, opt_a), (b, opt_b)):
            _set_grads(ps, step)
            opt.step()
        absmax = torch.maximum(absmax, torch.stack([p.grad.abs() for p in b]))
    for i in range(4):
        assert torch.equal(a[i], b[i]) == (i in (0, 3)), i
    state = opt_b.state[b[0]]
    # the buffer of the selected matrices follows its equation; the others stay zero
    assert torch.equal(state["absmax_buffer"][1:3], absmax[1:3]) and not state["absmax_buffer"][[0, 3]].any()
    assert "absmax_buffer" in extensions.stacked_state_keys()  # DistMuonAdamW shards it with the matrices
    buf = io.BytesIO()
    torch.save(opt_b.state_dict(), buf)
    buf.seek(0)
    c = [torch.nn.Parameter(p.detach().clone()) for p in b]
    opt_c = build(c, absmax_opts)
    opt_c.load_state_dict(torch.load(buf, weights_only=True))
    for ps, opt in ((b, opt_b), (c, opt_c)):
        _set_grads(ps, 3)
        opt.step()
    assert all(torch.equal(x, y) for x, y in zip(b, c))


def test_plugin_options_are_validated(plugins):
    def group(opts):
        return {"kind": "muon", "params": _params((8, 4)), "lr": 0.1, **opts}

    with pytest.raises(ValueError, match=r"prepolar\.eps must be > 0"):
        MuonAdamW([group({"prepolar.kind": "test_absmax", "prepolar.eps": 0.0})])
    with pytest.raises(ValueError, match=r"prepolar\.kind must be"):
        MuonAdamW([group({"prepolar.kind": "test_unknown"})])
    # an option the chosen conditioner does not read is refused, never ignored
    with pytest.raises(ValueError, match=r"prepolar\.tau is not an option of prepolar\.kind='test_absmax'"):
        MuonAdamW([group({"prepolar.kind": "test_absmax", "prepolar.tau": 2.0})])
    with pytest.raises(ValueError, match=r"prepolar\.eps is not an option of prepolar\.kind=None"):
        MuonAdamW([group({"prepolar.eps": 0.5})])
    with pytest.raises(ValueError, match=r"aol_reuse_gram is now prepolar\.reuse_gram"):
        MuonAdamW([group({"prepolar.kind": "turbo_aol", "aol_reuse_gram": False})])


def test_group_values_take_the_option_types():
    """A muon group written by hand in Python (passes 2.0, tau 25) gives the conditioner its fields'
    types: range(passes) needs an int, and tau's float arithmetic is the run config's."""
    from muonlab.optim.addons.hbieq import HBiEq

    cond = HBiEq.from_group({"prepolar.kind": "hbieq", "prepolar.passes": 2.0, "prepolar.tau": 25})
    assert cond == HBiEq(tau=25.0, passes=2) and type(cond.passes) is int and type(cond.tau) is float


def test_plugin_options_are_run_config_settings(plugins):
    """A plug-in's `option` fields join optim.prepolar: a flag, a default written once, acting
    only while the plug-in is chosen."""
    from muonlab.arms import resolve_config
    from muonlab.optim import prepolar

    assert "test_sign" in prepolar.names() and "test_absmax" in prepolar.names()
    section = prepolar.PrepolarSettings()
    assert section.eps == 1e-3 and section.owners()["eps"] == ("test_absmax",)
    cfg = resolve_config("baseline", "cpu-tiny", {"optim.prepolar.kind": "test_absmax", "optim.prepolar.eps": 0.01})
    assert cfg.optim.prepolar.conditioner() == AbsMaxConditioner(eps=0.01)
    assert cfg.hashed_values()["optim.prepolar.eps"] == 0.01
    with pytest.raises(UsageError, match="eps"):  # it does not act under another conditioner
        resolve_config("baseline", "cpu-tiny", {"optim.prepolar.kind": "hbieq", "optim.prepolar.eps": 0.01})
    with pytest.raises(UsageError, match=r"prepolar\.eps must be > 0"):
        resolve_config("baseline", "cpu-tiny", {"optim.prepolar.kind": "test_absmax", "optim.prepolar.eps": 0.0})


@dataclass(frozen=True)
class PowerConditioner(PrePolar):
    """sign(G) |G|^power: a plug-in option with a range."""

    power: float = option(0.5, "the power of |G|", range=Range(0, 1, low_open=True))

    def condition(self, G, inputs, ctx):
        return G.sign() * G.abs() ** self.power


def test_a_plugin_options_range_holds_where_it_is_set_and_where_the_conditioner_is_made():
    """option(..., range=...) on a conditioner's field: refused on the command line naming the flag, and in a
    conditioner made in Python or read back from a muon group naming the group key (PrePolar.__post_init__)."""
    from muonlab.arms import resolve_config

    register_prepolar("test_power", PowerConditioner, paper="none (test plug-in)")
    try:
        chosen = {"optim.prepolar.kind": "test_power"}
        with pytest.raises(UsageError, match=r"^--prepolar-power \(optim.prepolar.power\) must be in \(0, 1\], got 2$"):
            resolve_config("baseline", "cpu-tiny", {**chosen, "optim.prepolar.power": 2})
        cfg = resolve_config("baseline", "cpu-tiny", {**chosen, "optim.prepolar.power": 0.25})
        assert cfg.optim.prepolar.conditioner() == PowerConditioner(power=0.25)
        with pytest.raises(ValueError, match=r"^prepolar\.power must be in"):
            PowerConditioner(power=0)
        with pytest.raises(ValueError, match=r"^prepolar\.power must be in"):
            PowerConditioner.from_group({"prepolar.power": 1.5})
        assert PowerConditioner.from_group({"prepolar.power": 1}) == PowerConditioner(power=1.0)
    finally:
        extensions.unregister_prepolar("test_power")


# ---------------------------------------------------------------- the registry

def test_registration_errors():
    with pytest.raises(ValueError, match="already registered"):
        register_prepolar("hbieq", SignConditioner, paper="x")
    with pytest.raises(TypeError, match="PrePolar"):
        register_prepolar("test_not_a_class", lambda G: G, paper="x")


BUILT_IN = {"hbieq", "zeta", "turbo_aol", "muon2f"}


def test_every_built_in_conditioner_has_its_one_record():
    records = {r.name: r for r in extensions.records()}
    assert BUILT_IN <= set(records)
    for name in BUILT_IN:
        record = records[name]
        assert isinstance(record, MethodInfo), record  # the one record type of every method
        assert record.paper.startswith("seed 00") and "§" in record.paper, record
        assert record.summary, record
        assert record.module.startswith("muonlab.optim.addons."), record
        assert extensions.prepolars()[name].__module__ == record.module
        importlib.import_module(record.module)
        assert record.tests and all((ROOT / t).is_file() for t in record.tests), record


def test_the_baseline_file_names_no_method():
    text = (ROOT / "src/muonlab/optim/muon_adamw.py").read_text().lower()
    for word in ("hbieq", "zeta", "turbo", "aol", "muon2f", "whiten", "neumann", "master32", "oe_", "table"):
        assert word not in text, word
    assert len(text.splitlines()) < 400


# ---------------------------------------------------------------- stages: upstream call, static for compile

def test_no_add_on_runs_upstream_muon_step(monkeypatch):
    calls = []
    real = muon_module.muon_step
    monkeypatch.setattr(muon_module, "muon_step", lambda *a: calls.append(len(a)) or real(*a))
    params = _params((8, 4))
    opt = MuonAdamW([{"kind": "muon", "params": params, "lr": 0.1, "prepolar.kind": None, "polar.dtype": "bf16"}])
    _set_grads(params, 0)
    opt.step()
    assert calls == [10]  # upstream's 10 arguments, nothing else


STAGE_OPTIONS = [{"prepolar.kind": "hbieq", "prepolar.tau": 2.0},
                 {"prepolar.kind": "zeta", "polar.post_dtype": "fp32"},
                 {"prepolar.kind": "turbo_aol", "polar.dtype": "fp32"}, {"prepolar.kind": "muon2f"},
                 {"prepolar.kind": "zeta", "prepolar.scope": r"\.1$"},
                 {"prepolar.kind": "hbieq", "prepolar.scope": r"\.0$"}]


@pytest.mark.parametrize("opts", STAGE_OPTIONS)
def test_variant_step_traces_as_one_graph(opts):
    """torch.compile(fullgraph=True) of the composed step (dynamo, eager backend: no C compiler
    needed) gives the eager step's bits."""
    torch._dynamo.reset()
    out = []
    for compiled in (False, True):
        params = _params((12, 8), n=2)
        group = {"kind": "muon", "params": params, "lr": 0.04, "momentum": 0.95, "ns_steps": 5, "beta2": 0.95,
                 "weight_decay": 0.1, "param_names": ["m.0", "m.1"], **opts}
        stages = variant_module.resolve(group)
        fn = variant_module.build_step(stages)
        if compiled:
            fn = torch.compile(fn, fullgraph=True, dynamic=False, backend="eager")
        state = {"momentum_buffer": torch.zeros(2, 12, 8), "second_momentum_buffer": torch.zeros(2, 12, 1)}
        for step in range(2):
            _set_grads(params, step)
            stacked = torch.stack([p.detach().clone() for p in params])
            inputs = variant_module.step_inputs(group, stages, state, 0, 2, torch.device("cpu"))
            fn(torch.stack([p.grad for p in params]), stacked, state["momentum_buffer"],
               state["second_momentum_buffer"], torch.tensor(0.95), torch.tensor(0.04), torch.tensor(0.1),
               torch.tensor(0.95), 5, -1, inputs)
        out.append(stacked)
    assert torch.equal(*out)


def test_compiled_optimizer_gives_the_eager_bits(monkeypatch):
    """MuonAdamW(compile=True) wraps each step function in torch.compile(fullgraph=True): every
    stage combination (and the upstream and AdamW steps) traces as one graph; with dynamo's
    eager backend the bits equal the uncompiled optimizer's."""
    real, wrapped = torch.compile, []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: wrapped.append(kw) or real(fn, backend="eager", **kw))
    torch._dynamo.reset()
    options = [{}, {"prepolar.kind": "zeta", "polar.post_dtype": "fp32"}, {"prepolar.kind": "turbo_aol"},
               {"prepolar.kind": "hbieq", "prepolar.scope": r"\.0$", "polar.dtype": "fp32"},
               {"prepolar.kind": "muon2f"}]
    results = []
    for compile_step in (False, True):
        groups, params = [], []
        for i, opts in enumerate(options):
            ps = _params((12, 8) if i % 2 else (8, 12), n=2, seed=i)
            params += ps
            groups.append({"kind": "muon", "params": ps, "lr": 0.04, "param_names": [f"g{i}.0", f"g{i}.1"], **opts})
        table = torch.nn.Parameter(torch.randn(16, 4, generator=torch.Generator().manual_seed(9)))
        params.append(table)
        groups.append({"kind": "adamw", "params": [table], "lr": 0.01, "whiten.kind": "neumann",
                       "param_names": ["t"]})
        opt = MuonAdamW(groups, compile=compile_step)
        for step in range(2):
            _set_grads(params, step)
            opt.step()
        results.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    # one function per stage set, the upstream muon_step and adamw_step: 6, all fullgraph
    assert len(wrapped) == 6 and all(kw["fullgraph"] for kw in wrapped)
