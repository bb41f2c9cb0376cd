"""Seed 002's printed cells beside muonlab's own: Table 6's oe_tables stable rank and Table 8b's terminal
scalars in `diagnose audit` over several runs, and Table 1b's (and Table 6's) wall-clock and peak VRAM as
descriptive paper tables scored from a ledger."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from muonlab.arms import ARMS
from muonlab.papers.seed002.diagnostics import audit_tables
from muonlab.papers.seed002 import printed
from muonlab.papers.seed002.diagnostics.accounting import PAPER_TABLE_1B
from muonlab.diagnostics.run_selection import Selection, SelectedRun
from muonlab.lab.paper import format_scorecard, load_tables, scorecard
from muonlab.lab.paper.runs import table_plan
from muonlab.lab.paper.scorecard import expected_protocol

TABLES = load_tables()
NEW_TABLES = ("002-d6-time", "002-d8-time", "002-d6-vram", "002-d8-vram")


# ---------------------------------------------------------------- the audit over synthetic runs


def _audit(arm: str, seed: int, depth: int) -> dict:
    """A run's audit with values of its own (not the paper's): distinct per arm and seed."""
    k = sum(map(ord, arm)) % 7 + seed / 100
    scalars = {"x0_lambdas": [k + i for i in range(depth)], "resid_lambdas": [1.0 + k / 10] * depth}
    scalars["resid_lambdas[0:2]"] = scalars["resid_lambdas"][:2]
    if "12d" in arm:
        scalars["wte_lambdas"] = [-k - i for i in range(depth)]
    if "12do" in arm:
        scalars["out_lambdas"] = [k / 2, -k / 3]
    families = {"wte": {"srank": 10 + k, "srank_bound": 64, "mean_row_energy": 0.05}}
    if "oe" in arm or arm.startswith(("3", "4")):
        families["oe_tables"] = {"srank": 40 + k, "srank_bound": 16 * depth, "mean_row_energy": 0.004}
    return {"families": families, "qtau": None, "scalars": scalars}


def _audited(monkeypatch, runs: list[tuple[str, int]], depth: int) -> dict:
    audits = {f"{arm}-{seed}": _audit(arm, seed, depth) for arm, seed in runs}
    monkeypatch.setattr(audit_tables, "run_audit", lambda run_dir: audits[Path(run_dir).name])
    selection = Selection([SelectedRun(Path("runs") / f"{arm}-{seed}", arm, seed, f"p-d{depth}", depth)
                           for arm, seed in runs])
    result = audit_tables.audit_runs(selection)
    (protocol,) = result["protocols"]
    return {"result": result, "protocol": protocol, "audits": audits}


def test_table8b_printed_beside_each_run_and_the_arms_means(monkeypatch):
    arm = "12do_oe_decoupled_x0_out"
    got = _audited(monkeypatch, [(arm, 41), (arm, 47), ("12_oe_joint", 42), ("02_dense_joint", 41)], 6)
    p, audits = got["protocol"], got["audits"]
    rows = {(r["arm"], r["seed"]): r for r in p["table8b"]}
    assert len(p["table8b"]) == 4  # one row per run, as before
    assert rows[(arm, 41)]["scalars"] == audits[f"{arm}-41"]["scalars"]
    assert rows[(arm, 41)]["paper"] == printed.TABLE8B[(6, arm, 41)]
    assert rows[(arm, 41)]["paper"]["out_lambdas"] == [-3.61, 0.97]  # seed 002 Table 8b, d6 12do, s41
    assert rows[("12_oe_joint", 42)]["paper"]["wte_lambdas"] is None  # fused x0: the paper prints "—"
    assert rows[("02_dense_joint", 41)]["paper"] is None  # not a Table 8b arm

    means = {r["arm"]: r for r in p["table8b_means"]}
    m = means[arm]
    assert m["seeds"] == [41, 47] and m["paper_seeds"] == [41, 47]  # the paper's mean over the measured seeds only
    for field in ("x0_lambdas", "wte_lambdas", "resid_lambdas[0:2]", "out_lambdas"):
        a, b = audits[f"{arm}-41"]["scalars"][field], audits[f"{arm}-47"]["scalars"][field]
        assert m["scalars"][field] == pytest.approx([(x + y) / 2 for x, y in zip(a, b)])
    assert m["paper"]["x0_lambdas"][0] == pytest.approx((-5.50 + -5.99) / 2)  # seeds 41 and 47, not 42's +4.38
    assert m["paper"]["resid_lambdas[0:2]"] == pytest.approx([(0.994 + 0.996) / 2, (0.475 + 0.512) / 2])
    assert means["12_oe_joint"]["paper"]["wte_lambdas"] is None and means["02_dense_joint"]["paper"] is None

    text = audit_tables.format_audit_runs(got["result"]).splitlines()
    i = next(j for j, line in enumerate(text) if line.strip().startswith(arm) and " 41 " in line)
    assert "x0 [" + ", ".join(f"{v:+.2f}" for v in audits[f"{arm}-41"]["scalars"]["x0_lambdas"]) + "]" in text[i]
    assert text[i + 1].strip().startswith("paper")  # the printed row right below the measured one, as printed:
    assert "x0 [-5.50, +1.85, -0.23, -0.01, -2.19, -0.10]" in text[i + 1]
    assert "wte [-1.71, -1.54, -1.30, +0.01, -2.77, -0.92]" in text[i + 1]
    assert "resid[0:2] [0.994, 0.475]" in text[i + 1] and "out [-3.61, +0.97]" in text[i + 1]
    j = next(j for j, line in enumerate(text) if line.strip().startswith(arm) and "mean 41,47" in line)
    assert text[j + 1].strip().startswith("paper") and "mean 41,47" in text[j + 1]
    assert f"x0 [{(-5.50 - 5.99) / 2:+.2f}," in text[j + 1]
    joint = next(line for line in text if line.strip().startswith("paper") and "[+5.28, -2.53" in line)
    assert "wte —" in joint and "out —" in joint


def test_table8b_keeps_the_papers_signs_and_shapes():
    wte = printed.TABLE8B[(6, "12do_disp_stepcount_nomom", 41)]["wte_lambdas"]
    assert wte[3] == 0 and math.copysign(1, wte[3]) == -1  # printed "-0.00"
    assert {s for (_, _, s) in printed.TABLE8B} == {41, 42, 47}
    assert len({(d, a) for (d, a, _) in printed.TABLE8B}) == 13  # 12 three-seed arms and the d6 12_oe_joint reference
    for (depth, arm, seed), v in printed.TABLE8B.items():
        assert arm in ARMS and seed in ARMS[arm].seeds
        assert len(v["x0_lambdas"]) == depth and len(v["resid_lambdas[0:2]"]) == 2
        assert v["wte_lambdas"] is None or len(v["wte_lambdas"]) == depth
        assert v["out_lambdas"] is None or len(v["out_lambdas"]) == 2
        assert (v["out_lambdas"] is not None) == ("12do" in arm)  # only the out-skip arms print out_lambdas
    # §4.5: standard OE learns x0_lambdas[1] = -2.39 to -3.43 and resid_lambdas[1] = 0.399-0.548
    joint = [printed.TABLE8B[(6, "12_oe_joint", s)] for s in (41, 42, 47)]
    assert all(-3.43 <= v["x0_lambdas"][1] <= -2.39 for v in joint)
    assert {v["resid_lambdas[0:2]"][1] for v in joint} >= {0.399, 0.548}


def test_table6_stable_rank_beside_the_measured_one(monkeypatch):
    runs = [("3b_oe_table_neumann_joint", 42), ("12_oe_joint", 41), ("12_oe_joint", 42), ("10_oe_native", 41),
            ("10_oe_native", 47), ("02_dense_joint", 42)]
    got = _audited(monkeypatch, runs, 6)
    audits = got["audits"]
    rows = {(r["arm"], str(r["paper"]["seeds"])): r for r in got["protocol"]["table6"]}
    assert set(rows) == {("3b_oe_table_neumann_joint", "[42]"), ("12_oe_joint", "[42]"), ("10_oe_native", "3 seeds")}
    three_b = rows[("3b_oe_table_neumann_joint", "[42]")]
    assert three_b["srank"] == audits["3b_oe_table_neumann_joint-42"]["families"]["oe_tables"]["srank"]
    assert three_b["paper"] == {"srank": 50.41, "srank_bound": 96, "seeds": [42]}
    ref = rows[("12_oe_joint", "[42]")]  # #3b's reference is the seed-42 run only, not the arm's mean
    assert ref["seeds"] == [42] and ref["srank"] == audits["12_oe_joint-42"]["families"]["oe_tables"]["srank"]
    native = rows[("10_oe_native", "3 seeds")]
    want = sum(audits[f"10_oe_native-{s}"]["families"]["oe_tables"]["srank"] for s in (41, 47)) / 2
    assert native["seeds"] == [41, 47] and native["srank"] == pytest.approx(want)
    assert native["paper"]["srank"] == printed.SEED002_TABLE4[6]["10_oe_native"]["oe_tables"][0]
    text = audit_tables.format_audit_runs(got["result"])
    assert "Table 6: oe_tables stable rank / bound" in text
    table6 = text.split("Table 6: oe_tables stable rank / bound")[1].splitlines()
    line = next(x for x in table6 if x.strip().startswith("3b_oe_table_neumann_joint"))
    assert f"{three_b['srank']:.2f} / 96" in line and "paper (seed 42) 50.41 / 96" in line

    d8 = _audited(monkeypatch, [("10_oe_native", 42), ("4a_12_oe_joint_bf16state", 41)], 8)["protocol"]["table6"]
    assert {(r["arm"], r["paper"]["srank"]) for r in d8} == {("10_oe_native", 55.88), ("10_oe_native", 55.84),
                                                            ("4a_12_oe_joint_bf16state", 56.25)}


def test_table6_repeats_table4_where_it_prints_the_same_cell():
    t6, t4 = printed.SEED002_TABLE6_SRANK, printed.SEED002_TABLE4
    for (depth, arm, seed), (srank, bound) in t6.items():
        assert bound == {6: 384, 8: 512}[depth] // 4  # d/4, the table width
        if seed is None and arm in t4[depth]:
            assert t4[depth][arm]["oe_tables"][0] == srank, (depth, arm)


# ---------------------------------------------------------------- Table 1b as paper tables


def test_the_new_tables_name_registered_arms_and_run_summary_metrics():
    for tid in NEW_TABLES:
        t = TABLES[tid]
        assert t.paper == "seed 002" and t.rule == "descriptive" and not t.contrasts and "RTX 4090" in t.source
        assert t.metric == ("training_seconds" if "time" in tid else "peak_memory_mb")
        assert t.preset == ("gpu-d6" if "-d6-" in tid else "gpu-d8")
        for a in t.arms:
            assert a.arm in ARMS and expected_protocol(a.arm, t.preset) is not None, (tid, a.arm)
            assert (a.values and a.mean is None and set(a.seeds) == {42}) or (a.n == 3 and a.mean > 0), (tid, a)
    assert TABLES["002-d6-vram"].arm("3b_oe_table_neumann_joint").values == {42: 14056.7}
    assert TABLES["002-d8-vram"].arm("3c_oe_table_neumann_native_d8").values == {42: 23105.4}


def test_vram_agrees_with_the_delta_accounting_stores():
    """Two transcriptions of Table 1b: each stored peak minus the dense arm's is the Δ `diagnose accounting`
    prints (to the printed 0.1 MiB), where the paper prints one value, not a range."""
    checked = 0
    for tid, preset in (("002-d6-vram", "gpu-d6"), ("002-d8-vram", "gpu-d8")):
        t = TABLES[tid]
        dense = t.arm("00_dense_native").mean
        for a in t.arms:
            row = PAPER_TABLE_1B.get((preset, a.arm))
            if a.mean is None or row is None or "-" in row["peak_mib"]:
                continue
            assert round(a.mean - dense, 1) == pytest.approx(float(row["peak_mib"]), abs=1e-9), (tid, a.arm)
            checked += 1
    assert checked == 30


def _ledger(tables, shift: dict[str, float], metric_key=None) -> list[dict]:
    """Ledger lines of every arm's runs at the paper's seeds (or the arm's registered seeds where the paper
    prints a mean), each the paper's value plus the arm's shift."""
    lines = []
    for t in tables:
        for a in t.arms:
            protocol = expected_protocol(a.arm, t.preset)
            for seed in a.run_seeds:
                value = (a.values[seed] if a.values else a.mean) + shift.get(a.arm, 0.0)
                lines.append({"arm": a.arm, "seed": seed, "status": "ok", "protocol": protocol,
                              "metrics": {metric_key or t.metric: value}})
    return lines


@pytest.mark.parametrize("table_id", NEW_TABLES)
def test_the_new_tables_score_a_ledger(table_id):
    t = TABLES[table_id]
    shift = {t.arms[0].arm: 12.5, t.arms[-1].arm: -3.0}
    card = scorecard([table_plan(t, None)], _ledger([t], shift))
    (scored,) = card["tables"]
    assert not scored["missing"] and not scored["protocol_differs"]
    for row in scored["rows"]:
        paper = t.arm(row["arm"])
        assert row["measured"]["n"] == len(paper.run_seeds)
        assert row["paper"]["mean"] == (paper.mean if paper.values == {} else next(iter(paper.values.values())))
        assert row["difference"] == pytest.approx(shift.get(row["arm"], 0.0), abs=1e-9)
    text = format_scorecard(card)
    assert table_id in text and t.arms[0].arm in text

    # a run that recorded another quantity (the full loop's total_seconds) is not read as the table's metric
    other = scorecard([table_plan(t, None)], _ledger([t], {}, metric_key="total_seconds"))["tables"][0]
    assert all(r["measured"]["n"] == 0 for r in other["rows"]) and other["missing"]
