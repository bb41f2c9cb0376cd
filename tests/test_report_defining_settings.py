"""An arm that changes a setting defining the protocol (seed 000's depth-6 arms under gpu-d8) shares the
preset's protocol id but is never contrasted with a baseline of other values: the report says why, in
one line, and computes no contrast."""

from __future__ import annotations

from muonlab.arms import resolve_config
from muonlab.lab.report import build_report
from muonlab.record.ledger import append_record


def line(arm: str, seed: int, val: float) -> dict:
    cfg = resolve_config(arm, "gpu-d8", {"seed": seed})
    return {"run_id": f"{arm}-{seed}", "arm": arm, "seed": seed, "status": "ok", "config_hash": cfg.config_hash(),
            "protocol": cfg.protocol_id(), "config": cfg.to_dict(), "metrics": {"val_bpb": val}}


def test_a_depth_6_arm_is_not_contrasted_with_the_depth_8_baseline(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    for seed in (42, 47):
        append_record(ledger, line("exp00_baseline", seed, 1.00 + seed / 1e4))
        append_record(ledger, line("exp11_weight_fused_d6", seed, 1.01 + seed / 1e4))  # sets depth 6
        append_record(ledger, line("exp17_pair_tied_stopexp", seed, 0.99 + seed / 1e4))  # same depth: contrasted
    report = build_report(ledger, baseline="exp00_baseline")
    (study,) = report["studies"]  # one protocol id: the arm's overrides are left out of it
    refused = study["contrasts"]["exp11_weight_fused_d6"]
    assert refused["decision"] == "not estimable" and refused["mean_delta"] is None
    assert "model.depth=6 vs 8" in refused["reason"] and "settings that define a protocol" in refused["reason"]
    assert sum("PROTOCOL MISMATCH" in w and "exp11_weight_fused_d6" in w for w in study["warnings"]) == 1
    kept = study["contrasts"]["exp17_pair_tied_stopexp"]
    assert kept["estimable"] and abs(kept["mean_delta"] + 0.01) < 1e-12
