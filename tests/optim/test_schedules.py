"""Schedules against upstream's formulas and the fixed-step progress of seed 002 §2.1."""

import pytest

from muonlab.optim.schedules import Schedule, step_progress, time_progress


def test_fixed_step_progress_953():
    assert all(step_progress(s, 953) == 0.0 for s in range(12))
    assert step_progress(12, 953) == pytest.approx(1 / 942)
    assert step_progress(952, 953) == pytest.approx(941 / 942)
    assert step_progress(953, 953) == 1.0


def test_lr_multiplier_953_matches_spec():
    sched = Schedule()
    lrm = [sched.lr_multiplier(step_progress(s, 953)) for s in range(953)]
    assert all(v == 1.0 for v in lrm[:482])  # lrm = 1 for steps <= 481 (from seed 002 §2.1's p_t)
    assert lrm[952] == pytest.approx(2 / 942)
    assert all(a >= b for a, b in zip(lrm, lrm[1:]))


def test_warmup_and_final_fraction():
    sched = Schedule(warmup_ratio=0.1, warmdown_ratio=0.5, final_lr_frac=0.1)
    assert sched.lr_multiplier(0.05) == pytest.approx(0.5)
    assert sched.lr_multiplier(0.3) == 1.0
    assert sched.lr_multiplier(1.0) == pytest.approx(0.1)
    assert sched.lr_multiplier(0.75) == pytest.approx(0.55)


def test_momentum_and_weight_decay():
    sched = Schedule(weight_decay=0.2)
    assert sched.muon_momentum(0) == 0.85
    assert sched.muon_momentum(150) == pytest.approx(0.90)
    assert sched.muon_momentum(300) == sched.muon_momentum(5000) == pytest.approx(0.95)
    assert sched.muon_weight_decay(0.0) == 0.2 and sched.muon_weight_decay(1.0) == 0.0
    assert sched.muon_weight_decay(0.25) == pytest.approx(0.15)


def test_time_progress():
    assert time_progress(150, 300) == 0.5 and time_progress(400, 300) == 1.0


def test_apply_sets_groups():
    class Opt:
        param_groups = [dict(kind="adamw", initial_lr=0.2, lr=0.0), dict(kind="muon", initial_lr=0.04, lr=0.0)]

    values = Schedule().apply(Opt, step=0, progress=0.75)
    assert values["lrm"] == pytest.approx(0.5)
    assert Opt.param_groups[0]["lr"] == pytest.approx(0.1) and "momentum" not in Opt.param_groups[0]
    assert Opt.param_groups[1]["lr"] == pytest.approx(0.02)
    assert Opt.param_groups[1]["momentum"] == 0.85
    assert Opt.param_groups[1]["weight_decay"] == pytest.approx(0.05)


def test_momentum_cooldown_breakpoints():
    """Seed 002 §2.1 (Tier 1): beta = min(ramp, 0.85 + 0.10 lrm); the ramp ends (step 300) before the warmdown (482)."""
    sched = Schedule(momentum_cooldown=True)
    beta = [sched.muon_momentum(s, sched.lr_multiplier(step_progress(s, 953))) for s in range(953)]
    assert beta[0] == 0.85 and beta[300] == pytest.approx(0.95) and beta[481] == pytest.approx(0.95)
    assert beta[952] == pytest.approx(0.85 + 0.10 * 2 / 942)
    assert sched.muon_momentum(1000, 0.5) == pytest.approx(0.90)  # p = 0.75 -> lrm 0.5 -> 0.90
    assert Schedule().muon_momentum(900, 0.0) == pytest.approx(0.95)  # off: the ramp only


def test_cosine_weight_decay_breakpoints():
    sched = Schedule(weight_decay=0.2, wd_schedule="cosine")
    assert sched.muon_weight_decay(0.0) == pytest.approx(0.2)
    assert sched.muon_weight_decay(0.5) == pytest.approx(0.1)
    assert sched.muon_weight_decay(1.0) == pytest.approx(0.0, abs=1e-12)
    assert sched.muon_weight_decay(0.25) == pytest.approx(0.1 * (1 + 2 ** -0.5))


def test_lr_scale_calibration():
    class Opt:
        param_groups = [dict(kind="adamw", initial_lr=0.2, lr=0.0), dict(kind="muon", initial_lr=0.04, lr=0.0)]

    k = 2 ** 0.5
    values = Schedule(lr_scale=k).apply(Opt, step=0, progress=0.0)
    assert Opt.param_groups[1]["lr"] == pytest.approx(0.04 * k)  # 0.05657
    assert Opt.param_groups[0]["lr"] == pytest.approx(0.2 * k)
    assert Opt.param_groups[1]["weight_decay"] == pytest.approx(0.2 / k)  # 0.141421
    assert values["lrm"] == 1.0 and values["muon_momentum"] == 0.85  # momentum from the unscaled lrm
