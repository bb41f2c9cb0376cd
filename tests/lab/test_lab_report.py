"""muonlab.lab.report on synthetic ledgers and run directories (no training, CPU, fast).

These ledgers are written as an older muonlab wrote them (no protocol id), so each report
derives its protocols from the recorded configs; test_lab_protocols.py covers today's lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

scipy_stats = pytest.importorskip("scipy.stats", reason="an independent t-test needs scipy (pip install 'muonlab[stats]')")

from muonlab.errors import MuonlabError, UsageError
from muonlab.config import RunConfig
from muonlab.lab.report import build_report, format_text, load_ledger, run_report
from muonlab.lab.report.render import fmt
from muonlab.lab.stats import DecisionRule, paired_contrast, summarize_arm
from muonlab.record.ledger import append_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SEEDS = (41, 42, 47)
# Seed 002 Table 2, depth 8: 00_dense_native and 11_oe_opt (val / held-out per seed).
D8 = {
    "baseline": {41: (0.994025, 0.993231), 42: (0.994049, 0.993317), 47: (0.995700, 0.994896)},
    "oe_opt": {41: (0.978568, 0.977915), 42: (0.977664, 0.976973), 47: (0.976309, 0.975506)},
    "opt": {41: (0.992932, 0.992043), 42: (0.992201, 0.991479), 47: (0.993238, 0.992586)},
}


def config(arm: str, seed: int, **changes) -> dict:
    cfg = {"depth": 8, "num_steps": 953, "time_budget": None, "total_batch_size": 524288,
           "sequence_len": 2048, "eval_tokens": 20971520, "matrix_lr": 0.04, "arm": arm,
           "seed": seed, "run_name": None, "quiet": False,
           "data": {"source": "climbmix", "vocab_size": 8192, "cache_dir": "/somewhere/else"}}
    data = changes.pop("data", {})
    legacy = changes.pop("legacy", False)
    cfg.update(changes)
    cfg["data"].update(data)
    # written with format 1's flat names; recorded as today's runs write it unless `legacy`
    return cfg if legacy else RunConfig.from_dict(cfg).to_dict()


def record(arm: str, seed: int, val: float | None = None, holdout: float | None = None,
           status: str = "ok", run_dir: str | None = None, finished_at: str | None = None,
           run_id: str | None = None, **config_changes) -> dict:
    rid = run_id or f"{arm}-s{seed}"
    rec = {"run_id": rid, "arm": arm, "seed": seed, "status": status, "config_hash": "0" * 16,
           "run_dir": run_dir or f"/elsewhere/runs/{rid}", "config": config(arm, seed, **config_changes),
           "provenance": {"device_name": "NVIDIA H100", "torch": "2.13.0", "cuda": "12.8"}}
    if status == "ok":
        rec["metrics"] = {"val_bpb": val, "holdout_bpb": holdout, "val_ce": 2.7, "steps": 953}
    elif status == "diverged":
        rec["metrics"] = {"diverged_step": 17, "loss": float("nan")}
        rec["error"] = "loss is nan at step 17"
    else:
        rec["metrics"] = {}
        rec["error"] = "CUDA out of memory\nTraceback ..."
    if finished_at:
        rec["finished_at"] = finished_at
    return rec


def write_ledger(path: Path, records: list[dict], raw_lines: dict[int, str] | None = None) -> Path:
    """Append records with the real ledger writer; insert raw (malformed) lines by position."""
    raw_lines = raw_lines or {}
    for i, rec in enumerate(records):
        if i in raw_lines:
            with open(path, "a") as f:
                f.write(raw_lines[i] + "\n")
        append_record(path, rec)
    return path


def paper_ledger(tmp_path: Path, arms=("baseline", "oe_opt", "opt")) -> Path:
    records = [record(arm, seed, *D8[arm][seed]) for arm in arms for seed in SEEDS]
    return write_ledger(tmp_path / "ledger.jsonl", records)


def only_study(report: dict) -> dict:
    """The report's one study (these ledgers hold one protocol unless a test says otherwise)."""
    assert len(report["studies"]) == 1, [s["settings"] for s in report["studies"]]
    return report["studies"][0]


def study_with(report: dict, arm: str) -> dict:
    (study,) = [s for s in report["studies"] if arm in s["arms"] and s["arms"][arm]["n"]]
    return study


def write_run_dir(root: Path, run_id: str, final_loss: float, steps: int = 40) -> Path:
    run = root / run_id
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(steps):
            loss = final_loss + 6.0 * 0.85 ** step
            f.write(json.dumps({"step": step, "loss": loss + 0.01, "smooth_loss": loss, "lrm": 1.0,
                                "dt": 0.1}) + "\n")
        f.write('{"step": 40, "loss": \n')  # a line torn by a killed run: skipped, noted
    return run


# ---------------------------------------------------------------------------- numbers
def test_report_json_equals_stats_computed_directly(tmp_path):
    ledger = paper_ledger(tmp_path)
    report = run_report(ledger)
    saved = only_study(json.loads((tmp_path / "report" / "report.json").read_text()))
    for split, table in ((0, saved["arms"]), (1, saved["secondary"]["holdout_bpb"]["arms"])):
        for arm in D8:
            expected = summarize_arm(arm, {s: v[split] for s, v in D8[arm].items()})
            got = table[arm]
            assert got["n"] == expected.n == 3
            assert got["mean"] == pytest.approx(expected.mean, abs=1e-15)
            assert got["sd"] == pytest.approx(expected.sd, abs=1e-15)
            assert got["seeds"] == list(SEEDS) and got["values"] == list(expected.values)
    rule = DecisionRule(0.0005)
    for arm in ("oe_opt", "opt"):
        expected = paired_contrast({s: v[0] for s, v in D8[arm].items()},
                                   {s: v[0] for s, v in D8["baseline"].items()}, rule=rule).to_dict()
        got = saved["contrasts"][arm]
        for key in ("n", "seeds_improved", "decision", "seeds", "estimable"):
            assert got[key] == expected[key]
        for key in ("mean_delta", "sd_delta"):
            assert got[key] == pytest.approx(expected[key], abs=1e-15)
        assert got["ci95"] == pytest.approx(expected["ci95"], abs=1e-15)
        assert got["deltas"] == pytest.approx(expected["deltas"], abs=1e-15)
        # the p-value beside the interval is scipy's two-sided paired t-test
        paired = scipy_stats.ttest_rel([D8[arm][s][0] for s in SEEDS], [D8["baseline"][s][0] for s in SEEDS])
        assert got["p_value"] == pytest.approx(float(paired.pvalue), rel=1e-9) and got["df"] == 2
    # Seed 002 Table 3 row 1 at d8 (01 − 00, val): −0.001801 ± 0.000686 [−0.003505, −0.000097]
    opt = saved["contrasts"]["opt"]
    assert abs(opt["mean_delta"] - -0.001801) <= 1e-6 and abs(opt["sd_delta"] - 0.000686) <= 1e-6
    assert opt["ci95"] == pytest.approx([-0.003505, -0.000097], abs=2.5e-6)
    assert opt["decision"] == "improves" and opt["seeds_improved"] == 3
    assert only_study(report)["contrasts"]["opt"] == opt
    assert saved["warnings"] == [] and saved["failed_runs"] == [] and report["warnings"] == []
    assert saved["derived"] is True  # no protocol id in these lines: derived, and the notes say so
    assert any(f"protocol {saved['protocol']} was derived" in n for n in report["notes"])


def test_report_md_shows_every_seed_and_the_contrast_table(tmp_path):
    ledger = paper_ledger(tmp_path)
    run_report(ledger)
    md = (tmp_path / "report" / "report.md").read_text()
    for arm, seeds in D8.items():
        assert f"#### {arm}" in md
        for seed, (val, holdout) in seeds.items():
            row = next(line for line in md.splitlines() if line.startswith(f"| {seed} | {arm}-s{seed} |"))
            assert fmt(val) in row and fmt(holdout) in row
    assert "## Contrasts vs `baseline`" in md
    assert "| oe_opt - baseline | 3 |" in md and "3/3" in md and "**improves**" in md
    assert "| p (paired t) |" in md
    assert "s41: " in md  # per-seed Δs
    assert "(t_0.975,2 = 4.302653)" in md


def test_plots_are_valid_pngs(tmp_path):
    from PIL import Image

    ledger = paper_ledger(tmp_path)
    runs = tmp_path / "runs_here"
    final = {"baseline": 3.2, "oe_opt": 3.0, "opt": 3.1}
    records = []
    for arm in D8:
        for seed in SEEDS:
            run_dir = write_run_dir(runs, f"{arm}-s{seed}", final[arm] + 0.01 * seed)
            records.append(record(arm, seed, *D8[arm][seed], run_dir=str(run_dir)))
    ledger = write_ledger(tmp_path / "with_runs.jsonl", records)
    report = run_report(ledger, out_dir=tmp_path / "out")
    plots = report["files"]["plots"]
    assert set(plots) == {"loss_curves", "paired_deltas", "forest"}
    for path in plots.values():
        data = Path(path).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.size[0] > 300 and image.size[1] > 200
    study = only_study(report)
    assert study["curves"]["baseline"]["runs_with_curves"] == 3
    assert any("skipped 1 unreadable line" in n for n in study["notes"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "![loss_curves](loss_curves.png)" in md and "![forest](forest.png)" in md


def test_curves_found_beside_the_ledger_when_run_dir_is_from_another_machine(tmp_path):
    # Default layout: <runs_dir>/ledger.jsonl beside <runs_dir>/<run_id>/; the ledger's recorded
    # run_dir is a path on the machine that trained.
    ledger = paper_ledger(tmp_path)
    write_run_dir(tmp_path, "baseline-s41", 3.2)
    study = only_study(build_report(ledger))
    assert study["curves"]["baseline"] == {"runs_with_curves": 1,
                                           "runs_without": ["baseline-s42", "baseline-s47"]}
    assert any("no run directory" in n and "baseline-s42" in n for n in study["notes"])
    assert not any("curves not drawn" in n for n in study["notes"])


def test_report_works_from_the_ledger_alone(tmp_path):
    ledger = paper_ledger(tmp_path, arms=("baseline", "opt"))
    report = run_report(ledger)
    assert "loss_curves" not in report["files"]["plots"]
    assert any("curves not drawn" in n for n in only_study(report)["notes"])
    assert Path(report["files"]["plots"]["forest"]).read_bytes().startswith(PNG_MAGIC)


# ---------------------------------------------------------------------------- bad input
def test_malformed_line_is_reported_with_its_number(tmp_path):
    records = [record(arm, seed, *D8[arm][seed]) for arm in ("baseline", "opt") for seed in SEEDS]
    ledger = write_ledger(tmp_path / "ledger.jsonl", records,
                          raw_lines={2: '{"run_id": "torn", "arm": "opt", "se', 4: '[1, 2]'})
    loaded, problems = load_ledger(ledger)
    assert len(loaded) == 6
    assert problems[0].startswith("line 3: not valid JSON")
    assert problems[1].startswith("line 6: not a JSON object")
    report = build_report(ledger)
    assert report["counts"]["malformed_lines"] == 2
    assert any(w.startswith("ledger line 3: not valid JSON") for w in report["warnings"])
    run_report(ledger)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "line 3: not valid JSON" in md and "line 6: not a JSON object" in md
    assert only_study(report)["arms"]["opt"]["n"] == 3  # the good lines are all used


def test_record_without_arm_or_with_bad_status_is_a_problem(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps({"seed": 1, "status": "ok"}) + "\n"
                      + json.dumps({"arm": "a", "seed": 1, "status": "running"}) + "\n")
    records, problems = load_ledger(ledger)
    assert records == [] and problems[0].startswith("line 1: missing") and "line 2" in problems[1]


def test_contrast_with_one_paired_seed_is_not_estimable(tmp_path):
    records = [record("baseline", s, *D8["baseline"][s]) for s in SEEDS]
    records += [record("single", 42, 0.990, 0.989), record("stranger", 99, 0.98, 0.97)]
    report = run_report(write_ledger(tmp_path / "ledger.jsonl", records))
    study = only_study(report)
    single = study["contrasts"]["single"]
    assert single["decision"] == "not estimable" and single["estimable"] is False
    assert single["n"] == 1 and single["mean_delta"] is None and single["ci95"] is None
    assert "not estimable" in single["reason"] and single["p_value"] is None
    assert study["contrasts"]["stranger"]["n"] == 0
    assert any("seed(s) [99] have no ok baseline run" in w for w in study["warnings"])
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| single - baseline | 1 | not estimable |" in md
    assert "not estimable" in format_text(report)


def test_runs_of_another_protocol_are_a_study_of_their_own_never_pooled(tmp_path):
    records = [record("baseline", s, *D8["baseline"][s]) for s in SEEDS]
    records += [record("opt", s, *D8["opt"][s], num_steps=500) for s in SEEDS]
    records += [record("oe_opt", s, *D8["oe_opt"][s], **({"sequence_len": 1024} if s == 47 else {}))
                for s in SEEDS]
    # bookkeeping (cache_dir, run_name) never makes another protocol
    records += [record("oe_opt", 99, 0.9, 0.9, data={"cache_dir": "/a/third/place"}, run_name="x")]
    report = run_report(write_ledger(tmp_path / "ledger.jsonl", records))
    assert len(report["studies"]) == 3
    main = study_with(report, "baseline")
    assert main["arms"]["oe_opt"]["seeds"] == [41, 42, 99] and "opt" not in main["arms"]
    assert main["settings"] == {"train.num_steps": 953, "train.sequence_len": 2048}
    steps = study_with(report, "opt")
    assert steps["settings"]["train.num_steps"] == 500 and not steps["has_baseline"] and steps["contrasts"] == {}
    assert any("has no ok run under this protocol" in n for n in steps["notes"])
    short = next(s for s in report["studies"] if s["settings"].get("train.sequence_len") == 1024)
    assert list(short["arms"]) == ["oe_opt"] and short["arms"]["oe_opt"]["seeds"] == [47]
    assert not any(w.startswith("PROTOCOL MISMATCH") for s in report["studies"] for w in s["warnings"])
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.count("## Study ") == 3 and "train.num_steps = 500" in md
    assert "3 protocol(s)" in format_text(report)


def test_declared_arm_overrides_keep_an_arm_in_the_baselines_protocol(tmp_path):
    records = [record("baseline", s, *D8["baseline"][s]) for s in SEEDS]
    records += [record("opt", s, *D8["opt"][s], matrix_lr=0.05) for s in SEEDS]
    ledger = write_ledger(tmp_path / "ledger.jsonl", records)
    # not registered, overrides not given: its matrix_lr could be the protocol's, so it stands apart
    unknown = build_report(ledger)
    assert len(unknown["studies"]) == 2 and study_with(unknown, "opt")["settings"] == {"optim.matrix_lr": 0.05}
    declared = only_study(build_report(ledger, arm_overrides={"baseline": {}, "opt": {"matrix_lr": 0.05}}))
    assert not any(w.startswith("PROTOCOL") for w in declared["warnings"])
    assert declared["arm_settings"]["opt"] == {"optim.matrix_lr": [0.05, 0.04]}
    assert declared["contrasts"]["opt"]["n"] == 3
    undeclared = build_report(ledger, arm_overrides={"baseline": [], "opt": ["embedding_lr"]})
    assert len(undeclared["studies"]) == 2


def test_unknown_baseline_empty_ledger_and_bad_metric_raise(tmp_path):
    ledger = paper_ledger(tmp_path, arms=("baseline", "opt"))
    with pytest.raises(UsageError, match="arm 'nope' has no ok runs.*arms with ok runs: baseline, opt"):
        build_report(ledger, baseline="nope")
    with pytest.raises(UsageError, match="'val_bpc' has no numeric value.*holdout_bpb, steps, val_bpb, val_ce"):
        build_report(ledger, metric="val_bpc")
    with pytest.raises(UsageError, match="ledger not found"):
        build_report(tmp_path / "missing.jsonl")
    with pytest.raises(UsageError, match="threshold"):
        build_report(ledger, threshold=-0.1)
    bad = write_ledger(tmp_path / "failed.jsonl", [record("baseline", 1, status="failed")])
    with pytest.raises(MuonlabError, match="no runs with status 'ok'.*1 failed, diverged or interrupted"):
        build_report(bad)
    assert not (tmp_path / "report").exists()


def test_failed_and_diverged_runs_are_listed_and_duplicates_use_the_latest(tmp_path):
    records = [record("baseline", s, *D8["baseline"][s]) for s in SEEDS]
    records += [record("opt", 41, *D8["opt"][41]), record("opt", 42, *D8["opt"][42]),
                record("opt", 47, status="diverged", run_id="opt-s47-a"),
                record("opt", 42, 0.5, 0.5, run_id="opt-s42-old", finished_at="2026-01-01T00:00:00+0000"),
                record("opt", 41, 0.99, 0.98, run_id="opt-s41-new", finished_at="2026-03-01T00:00:00+0000"),
                record("opt", 41, 0.97, 0.96, run_id="opt-s41-old", finished_at="2026-02-01T00:00:00+0000"),
                record("crashy", 41, status="failed")]
    report = run_report(write_ledger(tmp_path / "ledger.jsonl", records))
    study = only_study(report)
    opt = study["arms"]["opt"]
    # s41: the three ok runs do not all carry finished_at, so ledger order decides (latest line)
    assert opt["run_ids"] == ["opt-s41-old", "opt-s42-old"] and opt["values"] == [0.97, 0.5]
    assert any("arm 'opt' seed 41: 3 ok runs" in w and "using the latest, opt-s41-old" in w
               for w in study["warnings"])
    statuses = {(f["arm"], f["seed"], f["status"]) for f in study["failed_runs"]}
    assert statuses == {("opt", 47, "diverged"), ("crashy", 41, "failed")}
    assert {(f["arm"], f["protocol"]) for f in report["failed_runs"]} == {("opt", study["protocol"]),
                                                                          ("crashy", study["protocol"])}
    assert any("arm 'opt': 1 run(s) failed or diverged (seed(s) [47])" in w for w in study["warnings"])
    assert study["arms"]["crashy"]["n"] == 0 and study["contrasts"]["crashy"]["decision"] == "not estimable"
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| opt-s47-a | opt | 47 | diverged | diverged at step 17 |" in md
    assert "| crashy-s41 | crashy | 41 | failed | CUDA out of memory |" in md
    text = format_text(report)
    assert "failed/diverged runs (2)" in text and "opt seed 47: diverged" in text


def test_latest_by_finished_at_when_every_duplicate_has_it(tmp_path):
    records = [record("baseline", s, *D8["baseline"][s]) for s in SEEDS]
    records += [record("opt", 41, 0.99, 0.98, run_id="new", finished_at="2026-03-01T00:00:00+0000"),
                record("opt", 41, 0.97, 0.96, run_id="old", finished_at="2026-02-01T00:00:00+0000")]
    report = build_report(write_ledger(tmp_path / "ledger.jsonl", records))
    assert only_study(report)["arms"]["opt"]["run_ids"] == ["new"]


def test_other_metrics_and_the_default_out_dir(tmp_path):
    ledger = paper_ledger(tmp_path, arms=("baseline", "opt"))
    report = build_report(ledger, metric="holdout_bpb", threshold=0.001)
    study = only_study(report)
    assert study["metrics"] == ["holdout_bpb", "val_bpb"]
    assert study["contrasts"]["opt"]["mean_delta"] == pytest.approx(-0.001779, abs=1e-6)
    assert report["decision_rule"]["text"].startswith("improves if the CI upper bound < 0 and mean Δ ≤ −θ")
    assert report["decision_rule"]["text"].endswith("(θ = 0.001)")
    assert not (tmp_path / "report").exists()  # build_report without out_dir writes nothing
    text = format_text(report)
    assert "baseline" in text and "opt - baseline" in text and "holdout_bpb mean ± SD" in text


def test_ledgers_of_the_older_config_format_still_report(tmp_path):
    """Format-1 lines (flat configs, old hashes) load, are grouped by their converted settings,
    and the report says so; a real protocol difference still keeps runs apart across formats."""
    lines = [record("baseline", s, val=1.0 + s / 1000, legacy=True) for s in (1, 2)]
    lines += [record("adamw_only", s, val=1.1 + s / 1000, matrix_optimizer="adamw") for s in (1, 2)]
    lines += [record("deeper", s, val=1.2, depth=9, legacy=True) for s in (1, 2)]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in lines))
    report = build_report(ledger, arm_overrides={"baseline": {}, "adamw_only": {"optim.matrix_optimizer": "adamw"},
                                                 "deeper": {}})
    assert any("older muonlab (config format 1" in w for w in report["warnings"])
    assert len(report["studies"]) == 2
    main = study_with(report, "baseline")
    assert main["contrasts"]["adamw_only"]["n"] == 2 and "deeper" not in main["arms"]
    assert study_with(report, "deeper")["settings"] == {"model.depth": 9}
    assert main["settings"] == {"model.depth": 8}


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_method_line_gives_the_t_quantile_of_each_contrasts_own_n(tmp_path, n):
    from scipy import stats as scipy_stats

    seeds = range(1, n + 1)
    records = [record("baseline", s, 1.0 + 0.001 * s, 1.0) for s in seeds]
    records += [record("opt", s, 0.99 + 0.0013 * s, 1.0) for s in seeds]
    report = run_report(write_ledger(tmp_path / "ledger.jsonl", records))
    df = n - 1
    t = float(scipy_stats.t.ppf(0.975, df))  # independent of muonlab's own t_quantile
    assert report["t_975"] == {str(df): pytest.approx(t, rel=1e-9)}
    contrast = only_study(report)["contrasts"]["opt"]
    half = (contrast["ci95"][1] - contrast["ci95"][0]) / 2
    assert half == pytest.approx(t * contrast["sd_delta"] / n ** 0.5, rel=1e-9)  # the quantile the interval used
    md = (tmp_path / "report" / "report.md").read_text()
    method = next(line for line in md.splitlines() if line.startswith("- Statistics:"))
    assert f"t_0.975,{df} = {t:.6f}" in method and method.count("t_0.975,") == 1


def test_each_arm_shows_its_own_settings_even_those_the_baseline_does_not_have(tmp_path):
    from muonlab.arms import ARMS, define_arm, resolve_config

    arms = {"baseline": {}, "hb10": {"optim.prepolar.kind": "hbieq", "optim.prepolar.tau": 10},
            "hb25": {"optim.prepolar.kind": "hbieq", "optim.prepolar.tau": 25}}
    records = []
    for arm, overrides in arms.items():
        if arm != "baseline":
            define_arm(arm, overrides)
        for seed in (1, 2):
            cfg = resolve_config(arm, "cpu-tiny", {"seed": seed})
            records.append({"run_id": f"{arm}-s{seed}", "arm": arm, "seed": seed, "status": "ok",
                            "config_hash": cfg.config_hash(), "config": cfg.to_dict(),
                            "metrics": {"val_bpb": 1.0 + 0.01 * seed + 0.001 * len(arm), "holdout_bpb": 1.0}})
    ARMS.pop("hb10"), ARMS.pop("hb25")  # the ledger alone knows them, as in another process
    report = run_report(write_ledger(tmp_path / "ledger.jsonl", records))
    own = only_study(report)["arm_settings"]
    assert own["hb10"]["optim.prepolar.tau"] == [10.0, None] and own["hb25"]["optim.prepolar.tau"] == [25.0, None]
    assert own["hb10"]["optim.prepolar.kind"] == ["hbieq", None]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "`optim.prepolar.tau` = 10.0 (baseline off)" in md and "`optim.prepolar.tau` = 25.0 (baseline off)" in md
    text = format_text(report)
    hb10 = next(line for line in text.splitlines() if line.strip().startswith("hb10 ") and "=" in line)
    assert "optim.prepolar.tau = 10.0" in hb10


def test_a_line_of_a_config_this_version_cannot_read_is_a_study_of_its_own(tmp_path):
    records = [record(arm, seed, *D8[arm][seed]) for arm in ("baseline", "opt") for seed in SEEDS]
    newer = [record("opt", seed, D8["opt"][41][0] - 0.01 * (seed - 49), 1.0) for seed in (50, 51)]
    for rec in records + newer:
        rec["protocol"] = "a1b2c3d4e5f60718"
    for rec in newer:  # a newer muonlab's line: a section this one does not know, the same protocol id
        rec["config"]["telemetry"] = {"eval_every": 5}
    report = run_report(write_ledger(tmp_path / "ledger.jsonl", records + newer))
    assert len(report["studies"]) == 2
    main_study, newer_study = report["studies"]
    assert main_study["arms"]["opt"]["n"] == 3 and not main_study["unread"]  # not pooled with the newer lines
    assert newer_study["unread"] and "'telemetry'" in newer_study["unread"]
    assert newer_study["arms"]["opt"]["n"] == 2 and not newer_study["warnings"]
    assert any("cannot read" in n and "never pooled" in n for n in report["notes"])
