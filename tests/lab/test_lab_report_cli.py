"""`muonlab report` from the command line on ledgers of seed 002's and seed 003's own per-seed
numbers: --where, differences-of-differences (within a protocol and across two), retention
ratios, single-seed threshold decisions, p-values in every output, and one-line usage errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats", reason="an independent t-test needs scipy (pip install 'muonlab[stats]')")

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.lab.report.render import fmt_p
from muonlab.record.ledger import append_record

SEEDS = (41, 42, 47)
# Seed 002 Table 2 (§4.1), val / held-out per seed 41, 42, 47, as printed.
TABLE2 = {
    6: {"00_dense_native": "1.049084/1.048465 1.046407/1.045764 1.050544/1.049959",
        "01_dense_opt": "1.048075/1.047426 1.045677/1.045099 1.048099/1.047451",
        "02_dense_joint": "1.045844/1.045212 1.043498/1.042884 1.046285/1.045674",
        "02m_dense_masked_qk": "1.046457/1.045868 1.045106/1.044576 1.046833/1.046176",
        "10_oe_native": "1.025919/1.025273 1.023081/1.022420 1.026285/1.025654",
        "11_oe_opt": "1.024662/1.023987 1.022574/1.021989 1.026044/1.025326",
        "12_oe_joint": "1.023401/1.022766 1.021995/1.021248 1.024607/1.023927",
        "12m_oe_masked_qk": "1.023583/1.022850 1.022143/1.021478 1.024309/1.023721",
        "00_dense_native_lr141": "1.048194/1.047536 1.046542/1.046045 1.046682/1.046167",
        "01_dense_opt_lr141": "1.045656/1.044985 1.045178/1.044557 1.046825/1.046399"},
    8: {"00_dense_native": "0.994025/0.993231 0.994049/0.993317 0.995700/0.994896",
        "01_dense_opt": "0.992932/0.992043 0.992201/0.991479 0.993238/0.992586",
        "10_oe_native": "0.980451/0.979589 0.979305/0.978486 0.978752/0.977971",
        "11_oe_opt": "0.978568/0.977915 0.977664/0.976973 0.976309/0.975506"},
}
BASE = ["--baseline", "00_dense_native"]
OPT_OE, OPT_DENSE = "11_oe_opt:10_oe_native", "01_dense_opt:00_dense_native"


def value(depth: int, arm: str, seed: int, split: int = 0) -> float:
    return float(TABLE2[depth][arm].split()[SEEDS.index(seed)].split("/")[split])


def write_line(path, arm: str, seed: int, preset: str, metrics: dict) -> None:
    cfg = resolve_config(arm, preset, {"seed": seed})
    append_record(path, {"run_id": f"{arm}-{preset}-s{seed}", "arm": arm, "seed": seed, "status": "ok",
                         "config_hash": cfg.config_hash(), "protocol": cfg.protocol_id(), "config": cfg.to_dict(),
                         "metrics": metrics})


def seed002(path, depths=(6, 8), arms=("00_dense_native", "01_dense_opt", "10_oe_native", "11_oe_opt")):
    for depth in depths:
        for arm in arms:
            for seed in SEEDS:
                write_line(path, arm, seed, f"gpu-d{depth}",
                           {"val_bpb": value(depth, arm, seed), "holdout_bpb": value(depth, arm, seed, 1)})
    return path


@pytest.fixture(scope="module")
def seed002_ledger(tmp_path_factory):
    """The factorial's dense and OE arms, native and optimised, at depths 6 and 8."""
    return seed002(tmp_path_factory.mktemp("seed002") / "ledger.jsonl")


@pytest.fixture(scope="module")
def d6_ledger(tmp_path_factory):
    """Every depth-6 arm of Table 2, masked and LR141 ones included."""
    return seed002(tmp_path_factory.mktemp("seed002_d6") / "ledger.jsonl", (6,), tuple(TABLE2[6]))


def report(capsys, ledger, *args: str) -> dict:
    assert main(["report", "--ledger", str(ledger), *BASE, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def within(x: float, printed: str, digits: float = 1.0) -> bool:
    return abs(x - float(printed)) <= digits * 10.0 ** -len(printed.split(".")[1]) * (1 + 1e-9)


# ---------------------------------------------------------------------------- within one protocol
def test_dod_from_the_command_line_is_seed002s_table3_row(capsys, d6_ledger):
    out = report(capsys, d6_ledger, "--where", "depth=6", "--dod", f"{OPT_OE},{OPT_DENSE}",
                 "--dod", "01_dense_opt_lr141:00_dense_native_lr141,01_dense_opt:00_dense_native")
    (study,) = out["studies"]
    oe_opt, lr = study["dods"]
    # Table 3, DoD OE×Opt, d6 val: +0.000726 ± 0.001301 [−0.002506, +0.003958]
    assert oe_opt["name"] == "(11_oe_opt - 10_oe_native) - (01_dense_opt - 00_dense_native)"
    assert within(oe_opt["mean_delta"], "0.000726") and within(oe_opt["sd_delta"], "0.001301")
    assert abs(oe_opt["ci95"][0] - -0.002506) <= 2.5e-6 and abs(oe_opt["ci95"][1] - 0.003958) <= 2.5e-6
    contrasts = [[value(6, a, s) - value(6, b, s) for s in SEEDS] for a, b in
                 (("11_oe_opt", "10_oe_native"), ("01_dense_opt", "00_dense_native"))]
    assert oe_opt["p_value"] == pytest.approx(float(scipy_stats.ttest_rel(*contrasts).pvalue), rel=1e-9)
    held = study["secondary"]["holdout_bpb"]["dods"][0]  # held-out: +0.000722 ± 0.001285
    assert within(held["mean_delta"], "0.000722") and within(held["sd_delta"], "0.001285")
    # Table 7, DoD(LR×Opt) val: +0.000142 ± 0.002165
    assert within(lr["mean_delta"], "0.000142") and within(lr["sd_delta"], "0.002165")
    assert oe_opt["decision"] == lr["decision"] == "inconclusive"


def test_table5b_contrast_e_and_an_extra_contrast(capsys, d6_ledger):
    out = report(capsys, d6_ledger, "--metric", "holdout_bpb",
                 "--dod", "02m_dense_masked_qk:02_dense_joint,12m_oe_masked_qk:12_oe_joint",
                 "--contrast", "12m_oe_masked_qk:11_oe_opt")
    (study,) = out["studies"]
    e = study["dods"][0]  # E DoD held-out: +0.000914 ± 0.000480 [−0.000278, +0.002105]
    assert within(e["mean_delta"], "0.000914") and within(e["sd_delta"], "0.000480")
    assert abs(e["ci95"][0] - -0.000278) <= 2.5e-6 and abs(e["ci95"][1] - 0.002105) <= 2.5e-6
    d = study["extra_contrasts"][0]  # D d6 12m−11 held-out: −0.001084 ± 0.000549
    assert d["name"] == "12m_oe_masked_qk - 11_oe_opt" and d["reference"] == "11_oe_opt"
    assert within(d["mean_delta"], "-0.001084") and within(d["sd_delta"], "0.000549")


def test_retention_ratios_from_the_command_line(capsys, seed002_ledger):
    # Table 3: Opt|OE retains 105.9 % of Opt|Dense at d8 and 48.6 % at d6 (held-out)
    out = report(capsys, seed002_ledger, "--where", "depth=8", "--metric", "holdout_bpb",
                 "--retention", f"{OPT_OE},{OPT_DENSE}")
    (r,) = out["studies"][0]["retentions"]
    assert within(r["percent"], "105.9") and r["n"] == 3 and r["seeds"] == list(SEEDS)
    assert main(["report", "--ledger", str(seed002_ledger), *BASE, "--where", "depth=6", "--metric",
                 "holdout_bpb", "--retention", f"{OPT_OE},{OPT_DENSE}"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith(f"({OPT_OE.replace(':', ' - ')})"))
    assert "48.6 %" in row


# ---------------------------------------------------------------------------- across protocols
def test_the_same_contrast_across_depth_6_and_8(capsys, seed002_ledger):
    out = report(capsys, seed002_ledger, "--dod", OPT_OE, "--retention", OPT_OE, "--across", "depth")
    assert len(out["studies"]) == 2  # both depths reported, each its own study
    dod = next(x for x in out["across"] if x["kind"] == "dod" and x["metric"] == "val_bpb")
    per_seed = [(value(6, "11_oe_opt", s) - value(6, "10_oe_native", s))
                - (value(8, "11_oe_opt", s) - value(8, "10_oe_native", s)) for s in SEEDS]
    assert dod["values"] == [6, 8] and dod["key"] == "model.depth"
    assert dod["deltas"] == pytest.approx(per_seed, abs=1e-12)
    assert dod["mean_delta"] == pytest.approx(float(np.mean(per_seed)), abs=1e-12)
    assert dod["p_value"] == pytest.approx(float(scipy_stats.ttest_1samp(per_seed, 0.0).pvalue), rel=1e-9)
    ret = next(x for x in out["across"] if x["kind"] == "retention" and x["metric"] == "val_bpb")
    # Table 3: Opt|OE val is −0.000668 at d6 and −0.001989 at d8
    assert ret["ratio"] == pytest.approx(np.mean([value(6, "11_oe_opt", s) - value(6, "10_oe_native", s)
                                                  for s in SEEDS]) / np.mean(
        [value(8, "11_oe_opt", s) - value(8, "10_oe_native", s) for s in SEEDS]), rel=1e-12)
    reverse = report(capsys, seed002_ledger, "--dod", OPT_OE, "--across", "depth=8,6")["across"][0]
    assert reverse["values"] == [8, 6] and reverse["mean_delta"] == pytest.approx(-dod["mean_delta"], abs=1e-15)


# ---------------------------------------------------------------------------- one seed
def test_single_seed_decisions_name_seed003s_rule(capsys, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    # Seed 003 Tables 1–2, seed 246 BPB as printed (9 decimals)
    for arm, bpb in (("p003_ordinary", 0.993173922), ("p003_state_gate", 0.992720999),
                     ("p003_branch_gate", 0.992919502)):
        write_line(ledger, arm, 246, "gpu-d8", {"val_bpb": bpb})
    args = ["report", "--ledger", str(ledger), "--baseline", "p003_ordinary",
            "--single-seed", "p003_state_gate:p003_ordinary", "--single-seed", "p003_state_gate:p003_branch_gate@246"]
    assert main(args + ["--json"]) == 0
    (study,) = json.loads(capsys.readouterr().out)["studies"]
    state, versus_branch = study["single_seed"]
    assert within(state["delta"], "-0.000452923") and within(-state["margin"], "0.000047077")
    assert state["decision"] == "inconclusive" and "seed 003" in state["rule"]
    assert within(versus_branch["delta"], "-0.000198503") and versus_branch["seed"] == 246
    assert study["contrasts"]["p003_state_gate"]["decision"] == "not estimable"  # one seed: no interval
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "seed 003's preregistered single-seed rule" in text
    assert "misses θ = 0.0005 by 0.000047077 -> inconclusive" in text


# ---------------------------------------------------------------------------- outputs
def test_p_values_in_text_markdown_and_json_and_one_study_per_protocol(capsys, seed002_ledger, tmp_path):
    out_dir = tmp_path / "out"
    assert main(["report", "--ledger", str(seed002_ledger), *BASE, "--out", str(out_dir)]) == 0
    text = capsys.readouterr().out
    saved = json.loads((out_dir / "report.json").read_text())
    md = (out_dir / "report.md").read_text()
    assert [s["settings"] for s in saved["studies"]] == [{"model.depth": 6}, {"model.depth": 8}]
    assert "== study 1 of 2" in text and "differs in: model.depth = 8" in text and md.count("## Study ") == 2
    for study, depth in zip(saved["studies"], (6, 8)):
        c = study["contrasts"]["01_dense_opt"]
        p = float(scipy_stats.ttest_rel([value(depth, "01_dense_opt", s) for s in SEEDS],
                                        [value(depth, "00_dense_native", s) for s in SEEDS]).pvalue)
        assert c["p_value"] == pytest.approx(p, rel=1e-9)
        assert any(line.startswith("01_dense_opt - 00_dense_native") and f"{p:.4f}" in line
                   for line in text.splitlines())
        assert f"| {fmt_p(p)} |" in md and f"{p:.4f}" == fmt_p(p)
    assert (out_dir / f"forest_{saved['studies'][1]['protocol'][:8]}.png").is_file()


def test_report_help_describes_protocols_and_the_new_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--where KEY=VALUE", "--dod A:B,C:D", "--across KEY[=V1,V2]", "--single-seed A:B[@SEED]",
                   "--retention", "--protocol ID", "never pooled", "--across depth=6,8"):
        assert needle in text, needle


@pytest.mark.parametrize("args,message", [
    (["--where", "dpth=2"], "--where: unknown setting 'dpth'"),
    (["--where", "model.dpth=2"], "--where: unknown setting 'model.dpth'"),
    (["--where", "depth"], "--where expects KEY=VALUE"),
    (["--where", "depth=six"], "expects int, got 'six'"),
    (["--where", "depth=7"], "no run matches --where model.depth=7 (recorded values: model.depth: 6, 8)"),
    (["--where", "depth=6", "--where", "model.depth=8"], "--where names model.depth twice"),
    (["--protocol", "zzz"], "--protocol 'zzz' matches no protocol"),
    (["--dod", OPT_OE], "add --across KEY"),
    (["--across", "depth"], "--across compares one contrast in two protocols"),
    (["--dod", OPT_OE, "--across", "depth=6"], "name two different values"),
    (["--dod", OPT_OE, "--across", "dpth"], "--across: unknown setting 'dpth'"),
    (["--dod", "nope:00_dense_native,01_dense_opt:00_dense_native"], "arm(s) 'nope' named in a contrast"),
    (["--contrast", "01_dense_opt"], "--contrast expects ARM:REFERENCE"),
    (["--single-seed", "01_dense_opt:00_dense_native@x"], "with an integer seed"),
    (["--retention", "a:b,c:d,e:f"], "takes one contrast A:B (with --across) or two"),
])
def test_bad_report_options_are_one_line_usage_errors(capsys, seed002_ledger, args, message):
    assert main(["report", "--ledger", str(seed002_ledger), *BASE, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
