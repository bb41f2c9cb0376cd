"""One homotopy step index for BiEq, Neumann-Gram and table-Neumann (muonlab.optim.homotopy):
t = 1 at the first update by default, t = 0 with --homotopy-first-t 0; the flag reaches all three."""

import pytest
import torch

from muonlab.arms import resolve_config
from muonlab.device import Runtime
from muonlab.errors import UsageError
from muonlab.optim.addons.hbieq import HBiEq
from muonlab.optim.addons.moment_free import OE_MFREE_DEFAULTS, table_neumann_beta
from muonlab.optim.homotopy import HOMOTOPY_FIRST_T, homotopy_t
from muonlab.train.build import build_model, build_optimizer


def ramp(t, tau):  # seed 000 §3.3, transcribed
    return min(t / tau, 1.0) ** 2


def test_default_is_the_papers_stated_counter():
    assert HOMOTOPY_FIRST_T == 1 and homotopy_t(0) == 1 and homotopy_t(4) == 5
    assert homotopy_t(0, first_t=0) == 0 and homotopy_t(3, first_t=0) == 3


@pytest.mark.parametrize("first_t", [0, 1])
def test_the_three_ramps_read_the_same_index(first_t):
    tau = 4.0
    bieq = HBiEq(tau=tau, passes=2, sides="both", eps=1e-10, first_t=first_t)
    group = {**OE_MFREE_DEFAULTS, "table_whiten.kind": "neumann", "table_whiten.tau": tau, "table_whiten.first_t": first_t}
    state, p = {}, torch.zeros(1)
    for completed in range(6):  # the update that follows `completed` updates
        want = ramp(completed + first_t, tau)
        assert bieq.step_inputs({}, completed, (1,), "cpu")["alpha_t"].item() == pytest.approx(want, abs=1e-7)
        assert table_neumann_beta(group, {p: state}, p) == pytest.approx(want)
    # Neumann-Gram's index is the AdamW counter after its increment: tested through MuonAdamW in
    # tests/optim/test_whitening.py (test_adamw_receives_the_whitened_gradient, test_t0_and_tau_zero)


def _groups(first_t, **extra):
    cfg = resolve_config("baseline", "cpu-tiny", dict(prepolar="hbieq", whiten="neumann", table_whiten="neumann",
                                                      oe_m=101, homotopy_first_t=first_t, **extra))
    model = build_model(cfg, 300, Runtime(torch.device("cpu"), "fp32"))
    return build_optimizer(model, cfg, compile_step=False).param_groups


@pytest.mark.parametrize("first_t", [0, 1])
def test_the_setting_reaches_every_ramp(first_t):
    groups = _groups(first_t)
    muon = [g for g in groups if g["kind"] == "muon"]
    whitened = [g for g in groups if g.get("whiten.kind") == "neumann"]
    tables = [g for g in groups if g["kind"] == "oe_mfree"]
    assert muon and whitened and tables
    assert all(g.get("prepolar.first_t", HOMOTOPY_FIRST_T) == first_t for g in muon)
    assert all(g["whiten.first_t"] == first_t for g in whitened)
    assert all(g["table_whiten.first_t"] == first_t for g in tables)


def test_the_setting_is_refused_where_no_ramp_acts():
    with pytest.raises(UsageError, match="homotopy_first_t"):
        resolve_config("baseline", "cpu-tiny", dict(homotopy_first_t=0))
    with pytest.raises(UsageError, match="homotopy_first_t"):
        resolve_config("baseline", "cpu-tiny", dict(prepolar="zeta", homotopy_first_t=0))
