"""Issue-6 diagnostics: equivalence (fused/unfused, LeRoPE, Proposition 1), trajectory, geometry, CLI."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from muonlab.cli import main
from muonlab.diagnostics import commands
from muonlab.papers.seed000.diagnostics import equivalence, geometry, trajectory
from muonlab.errors import UsageError
from muonlab.model.variants.qk_scale import qk_multiplier

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.func.jvp


@pytest.fixture(scope="module")
def exp17_run(tmp_path_factory):
    """A cpu-tiny run of the exp17 arm (gains + pair-tied QK) recording its trajectory at 0, 5, 11."""
    argv = ["train", "--preset", "cpu-tiny", "--arm", "exp17_pair_tied_stopexp", "--trajectory-steps", "0,5,11",
            "--json", "--quiet", "true"]
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.setenv("MUONLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        assert main(argv) == 0
    return json.loads(buf.getvalue())["run_dir"]


def test_proposition1_holds_and_detects_an_untied_implementation(monkeypatch):
    res = equivalence.proposition1(trials=2)
    assert res["passed"] and res["planes"] == 64
    real = qk_multiplier

    def untied_pair(raw, kind, mask=None):  # a wrong layout: channel c tied with 2c+1's neighbour
        m = real(raw, kind, mask)
        return m.roll(1, dims=-1) * (1 + 1e-3 * torch.arange(m.size(-1))) if kind.startswith("pair") else m
    monkeypatch.setattr(equivalence, "qk_multiplier", untied_pair)  # the function the diagnostic checks
    assert not equivalence.proposition1(trials=1)["checks"]["implementation_ties_c_with_c_plus_half"]


def test_the_equivalence_verdict_checks_every_printed_row_against_its_stated_tolerance():
    gains = {"unfused_contig": {"output_rel_l2": 0.0, "grad_rel_l2_max": 0.0},
             "weight_fused": {"output_rel_l2": 5e-7, "grad_rel_l2_max": 5e-6},
             "gate_scaled": {"output_rel_l2": 2e-3, "grad_rel_l2_max": 0.5}}
    lerope = {v: {"forward_max_abs_diff": 0.0, "tau_grad_cosine": 0.99999} for v in ("shared", "adapted")}
    assert all(equivalence.checks(gains, lerope, {"passed": True}).values())
    for broken in ({**gains, "weight_fused": {"output_rel_l2": 3e-5, "grad_rel_l2_max": 5e-6}},
                   {**gains, "gate_scaled": {"output_rel_l2": 1e-6, "grad_rel_l2_max": 1e-6}}):
        assert not all(equivalence.checks(broken, lerope, {"passed": True}).values())
    assert not all(equivalence.checks(gains, {**lerope, "adapted": {"forward_max_abs_diff": 0.0,
                                                                    "tau_grad_cosine": 0.999}},
                                      {"passed": True}).values())
    assert not equivalence.checks(gains, lerope, {"passed": False})["proposition 1"]


def test_gains_equivalence_rows():
    rows = equivalence.gains_equivalence(n_layer=2, n_embd=64, head_dim=32, seq_len=32)
    assert rows["unfused_contig"]["output_rel_l2"] == 0.0  # same ops, the gate input only copied
    assert rows["weight_fused"]["output_rel_l2"] < 1e-5 and rows["weight_fused"]["grad_rel_l2_max"] < 1e-4
    assert rows["gate_scaled"]["output_rel_l2"] > 1e-4  # the control is not equivalent


def test_trajectory_is_recorded_and_matches_the_checkpoint(exp17_run):
    res = trajectory.read_trajectory(exp17_run)
    assert res["steps"] == [0, 5, 11]
    last = res["rows"][-1]
    geo = geometry.run(exp17_run)  # the checkpoint after the last (12th) step
    assert last["x0_lambdas"] == pytest.approx(geo["x0_lambdas"], rel=0, abs=0)
    assert last["resid_lambdas"] == pytest.approx(geo["resid_lambdas"], rel=0, abs=0)
    assert len(last["x0_lambdas"]) == 2
    with pytest.raises(UsageError):
        trajectory.read_trajectory(exp17_run + "-missing")


def test_geometry_measures():
    assert geometry.effective_rank(torch.eye(16)) == pytest.approx(16.0)
    assert geometry.effective_rank(torch.outer(torch.arange(1.0, 9.0), torch.ones(5))) == pytest.approx(1.0, abs=1e-6)
    assert geometry.row_norm_cv(torch.ones(4, 3)) == pytest.approx(0.0)
    w = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # row norms 5 and 1: std 2, mean 3
    assert geometry.row_norm_cv(w) == pytest.approx(2 / 3)


def test_geometry_reports_variant_scalars(exp17_run):
    geo = geometry.run(exp17_run)
    assert geo["arm"] == "exp17_pair_tied_stopexp" and len(geo["layers"]) == 2
    assert len(geo["presub_gains"]) == 2 and len(geo["qk_multiplier"]) == 2
    assert all(0 < r["wq_effective_rank"] <= 64 for r in geo["layers"])


def _metrics_rows(run_dir) -> dict[int, dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {row["step"]: row for row in map(json.loads, lines)}


def _check_trajectory(res, run_dir):  # the recorded steps, their losses as the run logged them
    assert res["steps"] == [0, 5, 11]
    logged = _metrics_rows(run_dir)
    for row in res["rows"]:
        assert row["loss"] == pytest.approx(logged[row["step"]]["loss"], rel=1e-6)
        assert len(row["x0_lambdas"]) == len(row["resid_lambdas"]) == 2


def _check_geometry(res, run_dir):  # effective ranks of the checkpoint's W_Q, recomputed here
    ckpt = torch.load(sorted((Path(run_dir) / "checkpoints").glob("step-*.pt"))[-1], weights_only=True)
    state = ckpt["model"]
    for row in res["layers"]:
        s = torch.linalg.svdvals(state[f"transformer.h.{row['layer']}.attn.c_q.weight"].double())
        p = s / s.sum()
        assert row["wq_effective_rank"] == pytest.approx(float(torch.exp(-(p * p.log()).sum())), rel=1e-9)
    assert res["step"] == 12 and res["arm"] == "exp17_pair_tied_stopexp"


def _check_replay(res, run_dir):  # replaying the same step twice is exact; the batch is the run's
    assert res["repeat_gradient_rel_change"] == 0.0 and res["repeat_direction_rel_change"] == 0.0
    assert res["tokens"] == 4 * 64 * 2 and res["micro_batches"] == 2  # cpu-tiny's total batch
    assert res["gradient_rel_change"] > 0 and res["reset_both"] > res["reset_variance"] >= 0


def _check_audit(res, run_dir):  # stable ranks within their bounds, at the model's width
    assert res["d"] == 64 and res["n_layer"] == 2 and res["step"] == 12
    for family in res["families"].values():
        assert all(0 < s <= family["srank_bound"] + 1e-9 for s in family["srank_each"])


def _check_equivalence(res, run_dir):  # exact, rounding-close and non-equivalent rows as stated
    gains = res["gains"]
    assert gains["unfused_contig"]["output_rel_l2"] == 0.0
    assert gains["weight_fused"]["output_rel_l2"] < 1e-5 < gains["gate_scaled"]["output_rel_l2"]
    assert res["proposition1"]["passed"] and res["passed"] and all(res["checks"].values())


def _check_gauge(res, run_dir):  # float64 identities hold to rounding
    assert res["checks"] == res["passed"] > 0
    assert max(res["max_identity_error"], res["max_covariance_error"], res["max_invariance_error"]) < 1e-12


def _check_step0(res, run_dir):  # the eps of the step-0 guard moves the float64 loss by rounding only
    losses = list(res["loss"]["float64"].values())
    assert max(losses) - min(losses) < 1e-9
    assert res["loss"]["fp32"] == pytest.approx(losses[0], rel=1e-6)


DIAGNOSE_CHECKS = {"trajectory": _check_trajectory, "geometry": _check_geometry, "replay": _check_replay,
                   "audit": _check_audit, "equivalence": _check_equivalence, "gauge": _check_gauge,
                   "step0": _check_step0}  # storage: through the CLI in test_diagnostics_storage.py


@pytest.mark.parametrize("tool", list(DIAGNOSE_CHECKS))
def test_diagnose_cli(tool, exp17_run, capsys):
    run = ["--run", exp17_run] if tool in ("trajectory", "geometry", "replay", "audit") else []
    assert main(["diagnose", tool, "--json", *run]) == 0
    result = json.loads(capsys.readouterr().out)
    DIAGNOSE_CHECKS[tool](result, exp17_run)
    assert commands()[tool].format(result).strip()  # the text view of the same numbers


def test_diagnose_accounting_cli(capsys):
    assert main(["diagnose", "accounting", "--arms", "10_oe_native,12_oe_joint", "--preset", "gpu-d8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["params"]["total"] for r in rows] == [127_571_472, 127_573_520]
    assert main(["diagnose", "accounting", "--arms", "nope"]) == 2


def test_diagnose_needs_a_run(capsys):
    assert main(["diagnose", "geometry"]) == 2
    assert "--run" in capsys.readouterr().err


@pytest.mark.parametrize("tool, failing, passing", [
    ("equivalence", {"passed": False, "proposition1": {"passed": True}}, {"passed": True}),
    ("gauge", {"passed": 3, "checks": 4}, {"passed": 4, "checks": 4}),
    ("geometry", {"passed": False}, {}),  # the default rule: a result that says it did not pass
])
def test_a_diagnostic_whose_own_check_fails_exits_1(tool, failing, passing, monkeypatch, capsys):
    """Each diagnostic's pass rule (its COMMAND.failed) decides the exit status of `muonlab diagnose`."""
    import dataclasses
    import importlib

    from muonlab.diagnostics import commands

    module = importlib.import_module(commands()[tool].run.__module__)
    argv = ["diagnose", tool] + (["--run", "unused"] if tool == "geometry" else [])
    for result, code in ((failing, 1), (passing, 0)):
        monkeypatch.setattr(module, "COMMAND", dataclasses.replace(module.COMMAND, run=lambda a, r=result: r,
                                                                   format=lambda r: "table"))
        assert main(argv) == code, (tool, result)
        assert capsys.readouterr().out.strip() == "table"
