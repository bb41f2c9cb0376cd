"""Seed 002 §4.5 item 2 step-0 audits on the real model (muonlab.papers.seed002.diagnostics.step0_audit, step0_trajectory).

The real model is cpu-tiny's 12do arm (routing sepden + out_lambdas) with a small OE modulus; the
reference for "as training" is `muonlab train` itself, observed through a spy on its loop.
"""

import json
import math
from pathlib import Path

import pytest
import torch

import muonlab.model.gpt as gpt_module
from muonlab.cli import main
from muonlab.papers.seed002.diagnostics import step0_audit as A
from muonlab.papers.seed002.diagnostics import step0_trajectory as T
from muonlab.errors import UsageError

ARM, SEED = "12do_oe_decoupled_x0_out", 41
SMALL = {"oe_m": "1009"}  # the paper's 150,855-row tables cost seconds to build; the step-0 algebra is the same
ROUTING = ("x0_lambdas", "wte_lambdas", "out_lambdas")
EPS_F32 = 2.0**-23


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MUONLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def audit(cache):
    """bf16 on CPU: the paper's precision, so the rounding noise is bf16's."""
    return A.run_step0_audit(arm=ARM, seed=SEED, settings=SMALL, precision="bf16")


@pytest.fixture(scope="module")
def traj(cache):
    return T.run_trajectory_audit(arm=ARM, seed=SEED, settings=SMALL, steps=3)


# ------------------------------------------------------------------------------ as `muonlab train` does

class _Spy:
    """Wraps muonlab.train.run's loop: the model's state when the loop starts and its first batches."""

    def __init__(self, real, keep):
        self.real, self.keep, self.init, self.batches = real, keep, None, []

    def __call__(self, cfg, model, optimizer, loader, *args, **kwargs):
        self.init = {k: v.detach().clone() for k, v in model.state_dict().items()}
        spy = self

        def tap():
            while True:
                x, y, epoch = next(loader)
                if len(spy.batches) < spy.keep:
                    spy.batches.append((x.clone(), y.clone()))
                yield x, y, epoch

        return self.real(cfg, model, optimizer, tap(), *args, **kwargs)


def test_init_batches_and_steps_are_those_of_muonlab_train(monkeypatch, capsys):
    """The harness's init weights and step-0 micro-batches are bitwise a real run's, and with a
    step-0 mode set by the audit its losses and final scalars are the run's with that mode."""
    import muonlab.train.run as run_mod

    spy = _Spy(run_mod.train_loop, keep=2)  # cpu-tiny: 512 tokens = 2 micro-batches of 4 x 64
    monkeypatch.setattr(run_mod, "train_loop", spy)
    argv = ["train", "--preset", "cpu-tiny", "--arm", "12do_disp_stepcount_nomom", "--seed", str(SEED),
            "--oe-m", "1009", "--num-steps", "3", "--json"]
    assert main(argv) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = torch.load(run_dir / "model.pt", weights_only=True)

    s = T.setup(arm=ARM, seed=SEED, settings={**SMALL, "num_steps": "3"})
    st = T.first_steps(s, 3, step0_mode="disp_stepcount_nomom", keep_init=True)
    init = st.init.state_dict()
    assert init.keys() == spy.init.keys() and any(k.startswith("oe.") for k in init)
    for k, v in spy.init.items():
        assert v.dtype == init[k].dtype and torch.equal(v, init[k]), k
    assert len(st.batches) == len(spy.batches) == 2
    for (x, y), (sx, sy) in zip(st.batches, spy.batches):
        assert torch.equal(x, sx) and torch.equal(y, sy)
    assert [r["loss"] for r in st.records] == losses
    for name in ("resid_lambdas", *ROUTING):
        assert st.records[-1]["families"][name]["value"] == final[name].double().tolist(), name
    from_run = T.setup(run=run_dir)  # --run: the run's own config.json
    assert (from_run.cfg.arm, from_run.cfg.seed, from_run.cfg.optim.step0_mode) == (
        "12do_disp_stepcount_nomom", SEED, "disp_stepcount_nomom")
    assert [r["loss"] for r in T.first_steps(from_run, 3).records] == losses


def test_device_and_precision_reach_the_tensors(cache):
    s = T.setup(arm=ARM, seed=SEED, settings=SMALL, device="cpu", precision="bf16")
    st = T.first_steps(s, 1, keep_init=True)
    assert (s.runtime.device.type, s.runtime.precision) == ("cpu", "bf16")
    assert st.init.transformer.wte.weight.device.type == "cpu" and st.batches[0][0].device.type == "cpu"
    assert st.init.transformer.wte.weight.dtype == torch.bfloat16  # bf16 keeps upstream's bf16 tables
    s32 = T.setup(arm=ARM, seed=SEED, settings=SMALL, precision="fp32")
    assert T.first_steps(s32, 1, keep_init=True).init.transformer.wte.weight.dtype == torch.float32
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA"):
            T.setup(arm=ARM, settings=SMALL, device="cuda")


def test_options_are_refused_when_they_cannot_act(cache, tmp_path):
    with pytest.raises(UsageError, match="--run"):
        T.setup(run=tmp_path, arm=ARM)
    with pytest.raises(UsageError, match="not a run directory"):
        T.setup(run=tmp_path)
    with pytest.raises(UsageError, match="autoresearch"):
        T.setup(preset="tied-cpu", arm="baseline")
    with pytest.raises(UsageError, match="unknown setting"):
        T.setup(arm=ARM, settings={"no_such_setting": "1"})
    with pytest.raises(UsageError, match="KEY=VALUE"):
        T.parse_settings(["oe-m"])
    with pytest.raises(UsageError, match="num_steps"):
        T.first_steps(T.setup(arm=ARM, settings={**SMALL, "num_steps": "2"}), 3)
    with pytest.raises(UsageError, match="--modes"):
        T.run_trajectory_audit(arm=ARM, settings=SMALL, modes="none,no_such_mode")
    with pytest.raises(UsageError, match="--modes"):
        T.run_trajectory_audit(arm=ARM, settings=SMALL, modes=" , ")


def test_the_papers_protocol_is_compiled_bf16_on_cuda_at_depth_6():
    paper = dict(depth=6, data_source="climbmix", precision="bf16", device="cuda:0", compile=True, seed=41)
    assert T.protocol_matches(paper)
    for key, value in (("compile", False), ("device", "cpu"), ("precision", "fp32"), ("depth", 8), ("seed", 7),
                       ("data_source", "synthetic")):
        assert not T.protocol_matches({**paper, key: value}), key


# ------------------------------------------------------------------------------ the float64 audit

def _f64(result, family, label):
    return torch.tensor(result["families"][family]["float64"][label], dtype=torch.float64)


def test_learning_rates_are_the_optimizer_groups(audit):
    """resid_lambdas step at 0.01 scalar_lr = 0.005, the routing scalars at scalar_lr = 0.5
    (upstream's setup_optimizer, seed 002 §2.1 Tier 3): columns and the optimizer's own step agree."""
    fams = audit["families"]
    assert fams["resid_lambdas"]["lr"] == pytest.approx(0.005) and fams["resid_lambdas"]["betas"] == [0.8, 0.95]
    for name in ROUTING:
        assert fams[name]["lr"] == 0.5 and fams[name]["betas"] == [0.96, 0.95] and fams[name]["eps"] == 1e-10
    for name, fam in fams.items():
        lr = fam["lr"]
        for g, pred, actual in zip(fam["measured"], fam["displacement"]["measured_predicted"],
                                   fam["displacement"]["optimizer"]):
            assert pred == pytest.approx(-lr * g / (abs(g) + 1e-10), rel=1e-12)
            assert abs(actual) == pytest.approx(lr, rel=1e-4), name  # |g| >> eps in bf16: a full +-lr jump
        for g, d in zip(fam["float64"]["2^-23"], fam["displacement"]["float64"]["2^-23"]):
            assert d == pytest.approx(-lr * g / (abs(g) + 1e-10), rel=1e-12)


def test_learning_rates_follow_the_config(cache):
    r = A.run_step0_audit(arm=ARM, seed=SEED, settings={**SMALL, "scalar_lr": "0.3"}, precision="bf16")
    assert r["families"]["resid_lambdas"]["lr"] == pytest.approx(0.003)
    assert r["families"]["x0_lambdas"]["lr"] == pytest.approx(0.3)
    assert abs(r["families"]["x0_lambdas"]["displacement"]["optimizer"][0]) == pytest.approx(0.3, rel=1e-4)


def test_eps0_gradient_vanishes_by_scale_invariance(audit):
    ref = audit["lm_head_grad_max"]["0"]
    assert ref > 1e-4  # the reference gradient itself is far from zero
    for family in ("resid_lambdas", *ROUTING):
        assert _f64(audit, family, "0").abs().max() < 1e-10 * ref, family
    assert abs(audit["dL_dalpha"]["0"]) < 1e-10 * ref


def test_eps_gradient_is_nonzero_linear_and_matches_the_reduced_derivative(audit):
    """dN/dalpha = eps x0 / (alpha^2 q + eps)^(3/2): linear in a small eps (x8.39); sublayers are off at
    step 0, so every x0/wte/out gradient is dL/dalpha and resid_lambdas[i]'s is (1 + 0.1 i) dL/dalpha."""
    depth = audit["config"]["depth"]
    assert audit["alpha0"] == pytest.approx(1 + 0.1 * depth)
    for lab in ("2^-23", "1e-06"):
        dl = audit["dL_dalpha"][lab]
        assert abs(dl) > 1e3 * abs(audit["dL_dalpha"]["0"])
        for family in ROUTING:
            torch.testing.assert_close(_f64(audit, family, lab), torch.full((len(_f64(audit, family, lab)),), dl,
                                       dtype=torch.float64), rtol=1e-6, atol=0)
        coef = torch.tensor([1 + 0.1 * i for i in range(depth)], dtype=torch.float64)
        torch.testing.assert_close(_f64(audit, "resid_lambdas", lab), coef * dl, rtol=1e-6, atol=0)
    assert audit["dL_dalpha"]["1e-06"] / audit["dL_dalpha"]["2^-23"] == pytest.approx(1e-6 / EPS_F32, rel=1e-3)
    assert audit["passed"] and len(audit["checks"]) == 5


def test_measured_gradient_is_rounding_noise_that_sets_the_step0_sign(audit):
    for family in ROUTING:
        fam = audit["families"][family]
        meas = torch.tensor(fam["measured"], dtype=torch.float64)
        true = _f64(audit, family, "2^-23")
        assert (meas.abs() > 1e-9).all() and (meas.abs() < 1e-3).all()  # noise, not signal
        assert ((meas - true).abs() > 100 * true.abs()).all()
        disp = torch.tensor(fam["displacement"]["optimizer"])
        assert (torch.sign(disp) == -torch.sign(meas)).all()
        assert max(abs(d) for d in fam["displacement"]["float64"]["0"]) < 1e-6
        assert fam["ratio"]["2^-23"] == pytest.approx((meas / true).tolist())


def test_shared_denominator_and_dense_arms(cache):
    """shden's anchor (fp32 inside the model) is float64 in the copy: eps = 0 still vanishes; a dense
    arm has resid/x0 lambdas only."""
    shden = A.run_step0_audit(arm="12do_shared_denom", seed=SEED, settings=SMALL)
    ref = shden["lm_head_grad_max"]["0"]
    for family in ROUTING:
        assert _f64(shden, family, "0").abs().max() < 1e-10 * ref, family
        floor = _f64(shden, family, "0").abs().max() + 2.0**-52 * ref
        assert (_f64(shden, family, "1e-06").abs() > 1e4 * floor).all()
    assert shden["passed"]
    dense = A.run_step0_audit(arm="00_dense_native", seed=SEED)
    assert set(dense["families"]) == {"resid_lambdas", "x0_lambdas"} and dense["passed"]
    assert _f64(dense, "x0_lambdas", "0").abs().max() < 1e-10 * dense["lm_head_grad_max"]["0"]
    st = T.first_steps(T.setup(arm="00_dense_native", seed=SEED), 1, keep_init=True)
    with torch.no_grad():
        per = [float(st.init(x, y)) for x, y in st.batches]
    assert dense["loss"]["fp32"] == sum(per) / len(per)
    assert dense["loss"]["logged_last_micro_batch"] == per[-1]  # the loop logs the last micro-batch's loss


def test_displacement_check_can_fail(audit):
    broken = json.loads(json.dumps(audit))
    broken["families"]["x0_lambdas"]["displacement"]["optimizer"][0] *= 1.001
    assert [c["passed"] for c in A._checks(broken)][-1] is False
    assert all(c["passed"] for c in A._checks(audit))


def test_lm_head_gradient_matches_finite_difference_at_eps0(cache):
    st = T.first_steps(T.setup(arm=ARM, seed=SEED, settings=SMALL), 1, keep_init=True)
    m64 = A.float64_model(st.init)
    with A.norm_eps(0.0):
        _, grads = A.family_grads(m64, st.batches)
        g = grads["lm_head"]
        w = m64.lm_head.weight
        picks = [tuple(int(v) for v in divmod(int(i), g.shape[1])) for i in g.abs().flatten().topk(3).indices]
        picks += [(int(st.batches[0][1][0, 0]), 5), (7, 11)]
        h = 1e-5

        def loss():
            return sum(float(m64(x, y)) for x, y in st.batches) / len(st.batches)

        for r, c in picks:
            with torch.no_grad():
                w[r, c] += h
                up = loss()
                w[r, c] -= 2 * h
                down = loss()
                w[r, c] += h
            assert (up - down) / (2 * h) == pytest.approx(float(g[r, c]), rel=1e-5, abs=1e-9), (r, c)


def test_norm_eps_patches_and_restores():
    original = gpt_module.norm
    x = 1e-3 * torch.randn(3, 16, dtype=torch.float64)
    with A.norm_eps(1e-6):
        assert gpt_module.norm is not original
        expected = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6)
        torch.testing.assert_close(gpt_module.norm(x), expected, rtol=1e-12, atol=0)
    assert gpt_module.norm is original
    with pytest.raises(RuntimeError, match="boom"):
        with A.norm_eps(0.0):
            raise RuntimeError("boom")
    assert gpt_module.norm is original
    with pytest.raises(ValueError):
        with A.norm_eps(-1.0):
            pass
    assert gpt_module.norm is original


def test_rng_untouched_and_the_table(audit):
    state = torch.get_rng_state()
    T.first_steps(T.setup(arm=ARM, seed=SEED, settings=SMALL), 1)
    assert torch.equal(state, torch.get_rng_state())
    text = A.format_step0_table(audit)
    for label in ("f64 eps=0", "f64 eps=2^-23", "f64 eps=1e-06", "dtheta0", "optimizer", "paper", "+3.384e-12"):
        assert label in text
    for family, fam in audit["families"].items():
        for i in range(len(fam["measured"])):
            assert f"{family}[{i}]" in text
    assert "NOT the paper's protocol" in text and not audit["protocol_matches"]


# ------------------------------------------------------------------------------ the trajectory audit

def _fam(traj, mode, step, family):
    return traj["modes"][mode]["steps"][step]["families"][family]


def test_trajectory_every_mode_step0_semantics(traj):
    """Seed 002 §4.5 item 2 read off the raw records (b1 = 0.96, b2 = 0.95: m0 = 0.04 g0, v0 = 0.05 g0^2)."""
    assert list(traj["modes"]) == list(T.STEP0_MODES) and traj["passed"]
    for mode, m in traj["modes"].items():
        assert len(m["steps"]) == 3
        assert set(m["controlled"]) == ({"resid_lambdas", *ROUTING} if mode == "nostep0_all"
                                        else set() if mode == "none" else {"wte_lambdas", "out_lambdas"})
    for name in ("wte_lambdas", "out_lambdas"):
        full = _fam(traj, "none", 0, name)
        g0 = full["grad"]
        assert full["state_step"] == 1 and all(abs(v - b) > 0.1 for v, b in zip(full["value"], full["value_before"]))
        assert full["exp_avg"] == pytest.approx([0.04 * g for g in g0], rel=1e-5)
        assert full["exp_avg_sq"] == pytest.approx([0.05 * g * g for g in g0], rel=1e-5)
        ns0 = _fam(traj, "nostep0", 0, name)
        assert ns0["state_step"] is None and ns0["exp_avg"] is None and ns0["value"] == ns0["value_before"]
        assert _fam(traj, "nostep0", 1, name)["state_step"] == 1  # the first update at t = 1
        mom = _fam(traj, "mom_only_nodisp", 0, name)
        assert mom["value"] == mom["value_before"] and mom["state_step"] == 1
        assert mom["exp_avg"] == full["exp_avg"] and mom["exp_avg_sq"] == full["exp_avg_sq"]
        disp = _fam(traj, "disp_only_nomom", 0, name)
        assert disp["value"] == full["value"] and disp["state_step"] is None and disp["exp_avg"] is None
        assert _fam(traj, "disp_only_nomom", 1, name)["state_step"] == 1
        dcnt = _fam(traj, "disp_stepcount_nomom", 0, name)
        assert dcnt["value"] == full["value"] and dcnt["state_step"] == 1
        assert dcnt["exp_avg"] == [0.0] * len(g0) and dcnt["exp_avg_sq"] == [0.0] * len(g0)
        assert _fam(traj, "disp_stepcount_nomom", 1, name)["state_step"] == 2
    for name in ("resid_lambdas", *ROUTING):
        allm = _fam(traj, "nostep0_all", 0, name)
        assert allm["grad_seen"] is None and allm["state_step"] is None and allm["value"] == allm["value_before"]
    for name in ("resid_lambdas", "x0_lambdas"):  # nostep0 leaves them alone: the full step-0 jump
        assert _fam(traj, "nostep0", 0, name)["value"] == _fam(traj, "none", 0, name)["value"]


def test_trajectory_step1_multipliers(traj):
    """Step 1 on the controlled scalars: t = 2 on zero moments gives sqrt(1.95)/1.96 = 0.7125 lr
    (the paper's number); a cleared state gives t = 1, multiplier 1."""
    for mode, expected in (("disp_stepcount_nomom", 0.7125), ("disp_only_nomom", 1.0)):
        for name in ("wte_lambdas", "out_lambdas"):
            f = _fam(traj, mode, 1, name)
            for p0, p1 in zip(f["value_before"], f["value_after_update"]):
                assert abs(p1 - p0) / f["lr"] == pytest.approx(expected, abs=1e-4), (mode, name)


def test_trajectory_modes_share_step0(traj):
    ref = traj["modes"]["none"]["steps"][0]
    for m in traj["modes"].values():
        r0 = m["steps"][0]
        assert r0["loss"] == ref["loss"]
        for name, f in r0["families"].items():
            assert f["grad"] == ref["families"][name]["grad"]
            assert f["value_before"] == ref["families"][name]["value_before"]


@pytest.mark.parametrize("mode,step,family,key,value", [
    ("nostep0", 0, "wte_lambdas", "state_step", 1.0),  # a state where nostep0 must leave none
    ("mom_only_nodisp", 0, "out_lambdas", "value", [0.25, 0.0]),  # not restored
    ("disp_stepcount_nomom", 0, "wte_lambdas", "exp_avg", [1e-9, 0.0]),  # moments not zeroed
    ("disp_only_nomom", 1, "wte_lambdas", "state_step", 2.0),  # counter not cleared
    ("none", 2, "x0_lambdas", "exp_avg", [0.5, 0.5]),  # not AdamW's moment
])
def test_trajectory_checks_fail_on_broken_records(traj, mode, step, family, key, value):
    broken = json.loads(json.dumps(traj["modes"]))
    f = broken[mode]["steps"][step]["families"][family]
    f[key] = value[:len(f["value"])] if isinstance(value, list) else value
    if key in ("state_step", "exp_avg"):
        f["after_update"][key] = f[key]  # as if the optimizer had written it
    checks = T.mode_checks(broken)
    assert not all(c["passed"] for c in checks if c["mode"] == mode)
    assert all(c["passed"] for c in T.mode_checks(traj["modes"]))


def test_trajectory_table_and_cli(traj, cache, capsys):
    text = T.format_trajectory_table(traj)
    for mode in T.STEP0_MODES:
        assert mode in text
    assert "checks: " in text and "FAILED" not in text and "step-11 loss" in text
    assert main(["diagnose", "step0-trajectory", "--arm", ARM, "--set", "oe-m=1009", "--steps", "2",
                 "--modes", "none,disp_stepcount_nomom", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["modes"]) == ["none", "disp_stepcount_nomom"] and out["passed"]
    assert out["config"]["device"] == "cpu" and out["config"]["seed"] == SEED
    assert main(["diagnose", "step0", "--run", "x", "--preset", "cpu-tiny"]) == 2
    capsys.readouterr()


def test_step0_cli_json(cache, capsys):
    assert main(["diagnose", "step0", "--set", "oe-m=1009", "--seed", "42", "--precision", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["seed"] == 42 and out["config"]["precision"] == "bf16" and out["passed"]
    assert out["paper"]["x0_wte_lambdas"] == -1.298e-06 and not math.isnan(out["alpha0"])
