"""`diagnose audit` and `diagnose trajectory` over several runs (seed 002 Tables 4, 5a, 8b; seed 000
Table 4B): a ledger selection or repeated --run, grouped by protocol, each arm's mean over its seeds,
Table 5a's % excess per seed, and the printed values beside them; checked against the one-run
diagnostics averaged here by hand."""

from __future__ import annotations

import json
import shutil

import pytest

from muonlab.cli import main
from muonlab.papers.seed002 import printed
from muonlab.papers.seed002.diagnostics.audit002 import run_audit
from muonlab.papers.seed000.diagnostics.trajectory import read_trajectory

ARMS, SEEDS = ("02_dense_joint", "12_oe_joint"), (41, 47)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("across")
    for arm in ARMS:
        for seed in SEEDS:
            assert main(["train", "--preset", "cpu-tiny", "--arm", arm, "--seed", str(seed), "--num-steps", "12",
                         "--trajectory-steps", "0,10", "--quiet", "--runs-dir", str(root / "runs"),
                         "--cache-dir", str(root / "cache")]) == 0
    records = [json.loads(line) for line in (root / "runs" / "ledger.jsonl").read_text().splitlines()]
    return root, {(r["arm"], r["seed"]): r["run_dir"] for r in records}


def _json(capsys, argv):
    assert main(argv + ["--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_audit_tables_are_the_single_run_audits_averaged(runs, capsys):
    root, dirs = runs
    res = _json(capsys, ["diagnose", "audit", "--ledger", str(root / "runs" / "ledger.jsonl"), "--arms", ",".join(ARMS)])
    (p,) = res["protocols"]
    assert p["runs"] == 4 and p["depth"] == 2
    single = {key: run_audit(d) for key, d in dirs.items()}
    for row in p["table4"]:
        for family in ("wte", "attention", "mlp"):
            want = sum(single[(row["arm"], s)]["families"][family]["srank"] for s in SEEDS) / len(SEEDS)
            assert row["families"][family]["srank"] == pytest.approx(want, rel=1e-12)
        assert row["paper"] is None  # the paper prints depths 6 and 8
    assert ("oe_tables" in p["table4"][1]["families"]) and "oe_tables" not in p["table4"][0]["families"]
    for row in p["excess"]:
        oe = single[("12_oe_joint", row["seed"])]["qtau"]["high"]
        dense = single[("02_dense_joint", row["seed"])]["qtau"]["high"]
        assert row["excess_pct"]["high"] == pytest.approx(100 * ((oe - 1) - (dense - 1)) / (dense - 1), rel=1e-12)
    assert sorted(r["seed"] for r in p["excess"]) == list(SEEDS)
    assert len(p["table8b"]) == 4

    by_dirs = _json(capsys, ["diagnose", "audit", *[a for d in dirs.values() for a in ("--run", d)]])
    assert by_dirs["protocols"][0]["table4"] == p["table4"]  # --run repeated selects the same runs
    one_seed = _json(capsys, ["diagnose", "audit", "--ledger", str(root / "runs" / "ledger.jsonl"), "--arms",
                              ",".join(ARMS), "--seeds", "41"])
    assert [r["seeds"] for r in one_seed["protocols"][0]["table4"]] == [[41], [41]]


def test_the_printed_excess_is_the_papers():
    """Seed 002 §4.2.2 verifies one value: d6 seed 41, high band, (0.1084 - 0.2920) / 0.2920 = -62.9 %."""
    oe, dense = printed.TABLE5A[(6, 41, "12_oe_joint")], printed.TABLE5A[(6, 41, "02_dense_joint")]
    from muonlab.papers.seed002.diagnostics.audit002 import excess_change

    assert round(100 * excess_change(oe["high"], dense["high"]), 1) == -62.9


def test_trajectory_table_is_the_runs_rows_averaged(runs, capsys):
    root, dirs = runs
    res = _json(capsys, ["diagnose", "trajectory", "--ledger", str(root / "runs" / "ledger.jsonl"),
                         "--arms", "12_oe_joint"])
    (arm,) = res["protocols"][0]["arms"]
    rows = [next(r for r in read_trajectory(dirs[("12_oe_joint", s)])["rows"] if r["step"] == 10) for s in SEEDS]
    assert arm["loss"][0] == pytest.approx(sum(r["loss"] for r in rows) / 2, rel=1e-12)
    assert arm["x0_1"][0] == pytest.approx(sum(r["x0_lambdas"][1] for r in rows) / 2, rel=1e-12)
    assert arm["loss"][1:] == [None, None] and arm["paper"] is None  # steps 40, 80 not reached; arm not in 4B


def test_selection_refusals_and_left_out_runs(runs, capsys, tmp_path):
    root, dirs = runs
    ledger = str(root / "runs" / "ledger.jsonl")
    assert main(["diagnose", "audit", "--run", dirs[("12_oe_joint", 41)], "--arms", "12_oe_joint"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["diagnose", "trajectory", "--ledger", ledger, "--arms", "12_oe_joint,"]) == 2
    assert "empty element" in capsys.readouterr().err
    assert main(["diagnose", "audit", "--ledger", ledger, "--arms", "exp00_baseline"]) == 2
    assert "no finished run" in capsys.readouterr().err

    copy = tmp_path / "ledger.jsonl"
    shutil.copy(ledger, copy)
    gone = tmp_path / "gone"
    shutil.copytree(dirs[("02_dense_joint", 47)], gone)
    copy.write_text(copy.read_text().replace(dirs[("02_dense_joint", 47)], str(gone)))
    shutil.rmtree(gone)
    res = _json(capsys, ["diagnose", "audit", "--ledger", str(copy), "--arms", "02_dense_joint"])
    assert res["left_out"] == [f"02_dense_joint seed 47: its run directory {gone} is gone"]
    assert res["protocols"][0]["table4"][0]["seeds"] == [41]


def test_audit_refuses_a_run_of_another_family(tmp_path, capsys):
    assert main(["train", "--preset", "tied-cpu", "--num-steps", "2", "--quiet", "--runs-dir", str(tmp_path / "runs"),
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert main(["diagnose", "audit", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "reads the autoresearch GPT's tables" in err and err.count("\n") == 1
