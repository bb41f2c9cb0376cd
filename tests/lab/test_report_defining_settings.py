"""An arm that changes a setting defining the protocol (seed 000's depth-6 arms under gpu-d8) runs under
the protocol of its value: it is never contrasted with the depth-8 baseline, and it is contrasted with the
baseline run at depth 6. Lines recorded without their resolution layers (another tool's, or older) fall in
one study with the baseline; there the report refuses the contrast in one line and computes none."""

from __future__ import annotations

from muonlab.arms import resolve_config
from muonlab.lab.report import build_report
from muonlab.record.ledger import append_record


def line(arm: str, seed: int, val: float, layers: bool = True, **settings) -> dict:
    cfg = resolve_config(arm, "gpu-d8", {"seed": seed, **settings})
    config = cfg.to_dict()
    if not layers:
        config.pop("layers"), config.pop("protocol")
    return {"run_id": f"{arm}-{seed}-{settings}", "arm": arm, "seed": seed, "status": "ok",
            "config_hash": cfg.config_hash(), "protocol": cfg.protocol_id() if layers else None, "config": config,
            "metrics": {"val_bpb": val}}


def test_a_depth_6_arm_is_contrasted_with_the_depth_6_baseline_only(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    for seed in (42, 47):
        append_record(ledger, line("exp00_baseline", seed, 1.00 + seed / 1e4))
        append_record(ledger, line("exp00_baseline", seed, 1.02 + seed / 1e4, depth=6))
        append_record(ledger, line("exp11_weight_fused_d6", seed, 1.01 + seed / 1e4))  # sets depth 6
        append_record(ledger, line("exp17_pair_tied_stopexp", seed, 0.99 + seed / 1e4))  # same depth: contrasted
    report = build_report(ledger, baseline="exp00_baseline")
    by_depth = {s["protocol_settings"]["model.depth"]: s for s in report["studies"]}
    assert set(by_depth) == {6, 8}
    assert set(by_depth[8]["contrasts"]) == {"exp17_pair_tied_stopexp"}
    assert abs(by_depth[8]["contrasts"]["exp17_pair_tied_stopexp"]["mean_delta"] + 0.01) < 1e-12
    d6 = by_depth[6]["contrasts"]["exp11_weight_fused_d6"]
    assert d6["estimable"] and abs(d6["mean_delta"] + 0.01) < 1e-12  # 1.01 against the depth-6 baseline's 1.02


def test_lines_without_layers_are_refused_the_contrast_in_one_line(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    for seed in (42, 47):
        append_record(ledger, line("exp00_baseline", seed, 1.00 + seed / 1e4, layers=False))
        append_record(ledger, line("exp11_weight_fused_d6", seed, 1.01 + seed / 1e4, layers=False))
        append_record(ledger, line("exp17_pair_tied_stopexp", seed, 0.99 + seed / 1e4, layers=False))
    report = build_report(ledger, baseline="exp00_baseline")
    (study,) = report["studies"]
    refused = study["contrasts"]["exp11_weight_fused_d6"]
    assert refused["decision"] == "not estimable" and refused["mean_delta"] is None
    assert "model.depth=6 vs 8" in refused["reason"] and "settings that define a protocol" in refused["reason"]
    assert sum("PROTOCOL MISMATCH" in w and "exp11_weight_fused_d6" in w for w in study["warnings"]) == 1
    kept = study["contrasts"]["exp17_pair_tied_stopexp"]
    assert kept["estimable"] and abs(kept["mean_delta"] + 0.01) < 1e-12
