"""Protocols: the id a run records (its config less its arm's overrides and its seed), how it
travels with the config (sweep job files, run directories, resume), and how `muonlab report`
groups ledger lines by it, exactly for today's lines and derived for older ones, never pooling
two protocols into one sample."""

from __future__ import annotations

import json

import pytest

from muonlab.arms import resolve_config
from muonlab.config import RunConfig, all_presets, apply_overrides, build_config, load_config_file, protocol_of
from muonlab.lab.report import build_report
from muonlab.lab.stats import paired_contrast
from muonlab.lab.sweep import plan_sweep
from muonlab.record.ledger import append_record
from muonlab.record.protocol import protocol_hash, recorded_protocol
from muonlab.record.rundir import RunDir

SEEDS = (1, 2, 3)


def expected_protocol(preset: str, **settings) -> str:
    """The id computed from its definition: the preset and the run's own settings resolved with
    no arm at all, less the seed."""
    values = build_config([("preset", all_presets()[preset]), ("command line", settings)]).hashed_values()
    values.pop("seed")
    return protocol_hash(values)


def line(arm: str, seed: int, val: float, preset: str = "cpu-tiny", old: bool = False, status: str = "ok",
         **settings) -> dict:
    """A ledger line as a run writes it (train/run.py); `old`: as muonlab wrote it before protocol ids."""
    cfg = resolve_config(arm, preset, {"seed": seed, **settings})
    config = cfg.to_dict()
    rec = {"run_id": f"{arm}-s{seed}-{cfg.config_hash()[:6]}", "arm": arm, "seed": seed, "status": status,
           "config_hash": cfg.config_hash(), "protocol": cfg.protocol_id(), "config": config,
           "metrics": {"val_bpb": val, "holdout_bpb": val + 0.0004} if status == "ok" else {}}
    if old:
        del rec["protocol"], config["protocol"], config["layers"]  # neither existed then
    return rec


def ledger_of(tmp_path, records: list[dict]):
    path = tmp_path / "ledger.jsonl"
    for rec in records:
        append_record(path, rec)
    return path


# ---------------------------------------------------------------------------- the id
def test_arms_of_one_preset_share_a_protocol_and_the_seed_is_not_part_of_it():
    base = resolve_config("baseline", "cpu-tiny", {"seed": 1})
    assert base.protocol_id() == expected_protocol("cpu-tiny")
    for arm in ("adamw_only", "01_dense_opt"):
        for seed in (1, 7):
            assert resolve_config(arm, "cpu-tiny", {"seed": seed}).protocol_id() == base.protocol_id(), arm
    # an arm that sets a defining setting (exp11: depth 6) has the protocol of its value
    assert resolve_config("exp11_weight_fused_d6", "cpu-tiny").protocol_id() == expected_protocol("cpu-tiny", depth=6)
    deeper = resolve_config("adamw_only", "cpu-tiny", {"depth": "3"})
    assert deeper.protocol_id() == expected_protocol("cpu-tiny", depth=3) != base.protocol_id()
    assert resolve_config("baseline", "gpu-d6").protocol_id() != resolve_config("baseline", "gpu-d8").protocol_id()
    # the tied family's arms set `family` themselves: it stays in their protocol
    assert resolve_config("t1_sign", "tied-cpu").protocol_id() == resolve_config("t1_afmuon", "tied-cpu").protocol_id()


def test_a_setting_that_acts_only_under_the_arm_still_tells_protocols_apart():
    plain = resolve_config("adamw_only", "cpu-tiny")
    tuned = resolve_config("adamw_only", "cpu-tiny", {"adamw_matrix_lr": 0.001})
    assert tuned.protocol_id() != plain.protocol_id() == resolve_config("baseline", "cpu-tiny").protocol_id()


def test_the_protocol_travels_with_the_config_and_is_dropped_when_it_is_no_longer_known(tmp_path):
    cfg = resolve_config("adamw_only", "cpu-tiny", {"seed": 5})
    pid = cfg.protocol_id()
    saved = json.loads(json.dumps(cfg.to_dict()))
    assert saved["protocol"] == pid
    back = RunConfig.from_dict(saved)
    assert back.protocol_id() == pid and back.to_dict() == cfg.to_dict()
    assert apply_overrides(back, {"quiet": True, "seed": 9}).protocol_id() == pid  # bookkeeping, seed
    # the record holds its layers: its protocol is a function of the record alone, and a loaded
    # config follows overrides exactly; one saved with only the id keeps it while no setting changes
    assert protocol_of(saved) == pid and [x["origin"] for x in saved["layers"]][:2] == ["preset", "arm"]
    assert apply_overrides(back, {"depth": 3}).protocol_id() == expected_protocol("cpu-tiny", depth=3)
    id_only = RunConfig.from_dict({k: v for k, v in saved.items() if k != "layers"})
    assert id_only.protocol_id() == pid and apply_overrides(id_only, {"depth": 3}).protocol_id() is None
    # a config still holding its layers follows the overrides exactly
    assert apply_overrides(cfg, {"depth": 3}).protocol_id() == expected_protocol("cpu-tiny", depth=3)
    cfg.train.num_steps = 2  # changed in place: no longer the protocol it was resolved under
    assert cfg.protocol_id() is None and "protocol" not in cfg.to_dict()
    stripped = {k: v for k, v in saved.items() if k not in ("protocol", "layers")}
    assert RunConfig.from_dict(stripped).protocol_id() is None


def test_a_sweep_job_records_its_protocol_through_the_job_file_and_the_run_directory(tmp_path):
    from muonlab.cli import _resolve_config, build_parser

    jobs = plan_sweep(["baseline", "adamw_only"], [1, 2], "cpu-tiny", {"depth": 3, "record.quiet": True})
    assert {j.config.protocol_id() for j in jobs} == {expected_protocol("cpu-tiny", depth=3)}
    job_file = tmp_path / "adamw_only-s2.json"  # as run_sweep writes it for `muonlab train --config`
    job_file.write_text(json.dumps({"config": jobs[-1].config.to_dict()}))
    argv = ["train", "--config", str(job_file)]
    cfg = _resolve_config(build_parser(argv).parse_args(argv))
    assert cfg.protocol_id() == jobs[-1].config.protocol_id()
    # the run directory's config.json keeps it, so a resumed run records it too
    cfg.record.runs_dir = str(tmp_path / "runs")
    run = RunDir.create(cfg, "run-1")
    assert json.loads((run.path / "config.json").read_text())["config"]["protocol"] == cfg.protocol_id()
    assert load_config_file(run.path / "config.json").protocol_id() == cfg.protocol_id()


def test_recorded_protocol_reads_the_line_or_its_config():
    assert recorded_protocol({"protocol": "abc"}) == "abc"
    assert recorded_protocol({"config": {"protocol": "def"}}) == "def"
    assert recorded_protocol({"protocol": None, "config": {"family": "x"}}) is None


def test_real_runs_record_their_protocol_and_two_depths_are_two_studies(tmp_path):
    from muonlab.train import run_training
    from muonlab.record.ledger import read_records

    runs = tmp_path / "runs"
    configs = [resolve_config("baseline", "cpu-tiny", {"num_steps": 1, "seed": 1, "depth": d, "quiet": True,
                                                       "runs_dir": str(runs)}) for d in (2, 3)]
    for cfg in configs:
        run_training(cfg, log=lambda _: None)
    records = list(read_records(runs / "ledger.jsonl"))
    assert [r["protocol"] for r in records] == [c.protocol_id() for c in configs]
    assert [r["config"]["protocol"] for r in records] == [c.protocol_id() for c in configs]
    assert records[0]["protocol"] != records[1]["protocol"]
    report = build_report(runs / "ledger.jsonl")
    assert [s["arms"]["baseline"]["values"] for s in report["studies"]] == \
        [[r["metrics"]["val_bpb"]] for r in records]  # same arm and seed, both kept: never one sample


# ---------------------------------------------------------------------------- the report
def depth_ledger(tmp_path, old: bool = False, seeds: tuple[int, ...] = SEEDS):
    """baseline and adamw_only at depth 2 and at depth 3, values far apart by depth."""
    values = {}
    records = []
    for depth in (2, 3):
        for seed in seeds:
            for arm, offset in (("baseline", 0.0), ("adamw_only", 0.004 + 0.001 * seed * (depth - 1))):
                val = 1.5 - 0.2 * depth + 0.0007 * seed + offset
                values[depth, arm, seed] = val
                records.append(line(arm, seed, val, old=old, depth=depth))
    return ledger_of(tmp_path, records), values


@pytest.mark.parametrize("old", [False, True], ids=["recorded", "derived"])
def test_two_depths_of_baseline_in_one_ledger_are_never_pooled(tmp_path, old):
    ledger, values = depth_ledger(tmp_path, old=old)
    report = build_report(ledger)
    assert len(report["studies"]) == 2
    for study, depth in zip(report["studies"], (2, 3)):
        assert study["settings"] == {"model.depth": depth}
        assert study["derived"] is old
        if not old:
            assert study["protocol"] == expected_protocol("cpu-tiny", depth=depth)
        for arm in ("baseline", "adamw_only"):
            assert study["arms"][arm]["values"] == [values[depth, arm, s] for s in SEEDS]
        direct = paired_contrast({s: values[depth, "adamw_only", s] for s in SEEDS},
                                 {s: values[depth, "baseline", s] for s in SEEDS})
        assert study["contrasts"]["adamw_only"]["mean_delta"] == pytest.approx(direct.mean_delta, abs=1e-15)
        assert study["contrasts"]["adamw_only"]["p_value"] == pytest.approx(direct.p_value, rel=1e-12)
        assert not any("ok runs" in w and "using the latest" in w for w in study["warnings"])
    derived_notes = [n for n in report["notes"] if "was derived from the recorded configs" in n]
    assert len(derived_notes) == (2 if old else 0)


def test_where_selects_one_protocol(tmp_path):
    ledger, values = depth_ledger(tmp_path, seeds=(1, 2))
    for where in (["depth=3"], {"model.depth": 3}, ["model.depth=3", "num-steps=12"]):
        report = build_report(ledger, where=where)
        (study,) = report["studies"]
        assert study["arms"]["baseline"]["values"] == [values[3, "baseline", s] for s in (1, 2)]
        assert study["settings"] == {}  # nothing left to tell it from
    assert len(build_report(ledger, where=["num_steps=12"])["studies"]) == 2
    pid = expected_protocol("cpu-tiny", depth=2)
    (study,) = build_report(ledger, protocol=pid[:6])["studies"]
    assert study["protocol"] == pid


def test_older_lines_beside_todays_are_kept_apart_and_the_report_says_they_match(tmp_path):
    records = [line("baseline", s, 1.0 + s / 1000, old=True) for s in SEEDS]
    records += [line("baseline", s, 1.1 + s / 1000) for s in SEEDS]
    report = build_report(ledger_of(tmp_path, records))
    old, new = report["studies"]
    assert old["derived"] and not new["derived"] and new["protocol"] == expected_protocol("cpu-tiny")
    assert old["arms"]["baseline"]["values"] == [1.0 + s / 1000 for s in SEEDS]
    assert any(f"derived protocol {old['protocol']} records the same settings as protocol {new['protocol']}" in n
               for n in report["notes"])


def test_derived_protocols_leave_out_what_arms_override_and_isolate_lines_they_cannot_place(tmp_path):
    # exp11 overrides model.depth; older baseline lines at depths 2 and 3 disagree on it, so an
    # exp11 line could belong to either: it stands alone instead of joining one
    records = [line("baseline", s, 1.0, old=True, depth=d) for d in (2, 3) for s in SEEDS]
    records += [line("adamw_only", s, 1.01, old=True, depth=2) for s in SEEDS]
    records += [line("exp11_weight_fused_d6", s, 0.99, old=True) for s in SEEDS]
    report = build_report(ledger_of(tmp_path, records))
    by_arms = {tuple(a for a, x in s["arms"].items() if x["n"]): s for s in report["studies"]}
    assert set(by_arms) == {("baseline", "adamw_only"), ("baseline",), ("exp11_weight_fused_d6",)}
    assert by_arms["baseline", "adamw_only"]["settings"]["model.depth"] == 2
    assert by_arms["exp11_weight_fused_d6",]["ambiguous"] is True
    assert any(w.startswith("PROTOCOL AMBIGUOUS") for w in report["warnings"])
    assert "model.depth" in by_arms["baseline",]["unchecked_settings"]
    # without knowing adamw_only's override, its matrix_optimizer would split it off
    unknown = build_report(tmp_path / "ledger.jsonl", arm_overrides={})
    assert not any({"baseline", "adamw_only"} <= {a for a, x in s["arms"].items() if x["n"]}
                   for s in unknown["studies"])


def test_a_line_without_a_config_is_a_study_of_its_own_never_pooled_with_known_ones(tmp_path):
    records = [line("baseline", s, 1.0 + s / 1000) for s in SEEDS]
    bare = {"run_id": "bare", "arm": "baseline", "seed": 4, "status": "ok", "metrics": {"val_bpb": 0.5}}
    report = build_report(ledger_of(tmp_path, records + [bare]))
    known, alone = report["studies"]
    assert known["arms"]["baseline"]["seeds"] == list(SEEDS) and not known["unknown"]
    assert alone["arms"]["baseline"]["seeds"] == [4] and alone["unknown"]
    assert any("recorded neither a config nor a protocol id (lines 4)" in w for w in report["warnings"])
    assert report["counts"]["without_protocol"] == 1


def test_periodic_evaluation_is_outside_the_hash_and_the_protocol():
    """It changes no trained number (tests/eval/test_periodic_eval.py), so a run that evaluates every 10
    steps is the same configuration and protocol as one that does not; a run that never evaluated keeps
    the hash it always had (the setting is hashed at 0)."""
    plain = resolve_config("t1_hybrid", "tied-cpu")
    curves = resolve_config("t1_hybrid", "tied-cpu", {"eval_every": 10, "eval_every_tokens": 512})
    assert curves.config_hash() == plain.config_hash() and curves.protocol_id() == plain.protocol_id()
    assert "train.eval_every" in plain.hashed_values() and plain.hashed_values()["train.eval_every"] == 0
    assert curves.hashed_values()["train.eval_every"] == 0 and "train.eval_every_tokens" not in curves.hashed_values()
