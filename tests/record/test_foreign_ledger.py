"""A ledger of lines holding arm, seed, status and metrics but no protocol or config (results imported
from elsewhere): reported, never mistaken for failed runs; each line its own protocol, or one protocol
when --protocol-free says the user vouches that they ran alike."""

from __future__ import annotations

import json

from muonlab.cli import main
from muonlab.lab.report import build_report


def foreign(tmp_path):
    path = tmp_path / "imported.jsonl"
    with open(path, "w") as f:
        for arm, base in (("baseline", 1.0), ("mine", 0.99)):
            for seed in (1, 2, 3):
                f.write(json.dumps({"arm": arm, "seed": seed, "status": "ok",
                                    "metrics": {"val_bpb": base + seed / 1000 + (arm == "mine") * seed / 10000}}) + "\n")
    return path


def test_each_line_is_its_own_protocol_and_said_why(tmp_path):
    report = build_report(foreign(tmp_path))
    assert len(report["studies"]) == 6 and all(s["unknown"] for s in report["studies"])
    assert all(s["counts"]["ok"] == 1 for s in report["studies"])
    assert any("each is a study of its own; --protocol-free" in w for w in report["warnings"])


def test_protocol_free_pools_them_into_one_study(tmp_path, capsys):
    assert main(["report", "--ledger", str(foreign(tmp_path)), "--protocol-free", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (study,) = report["studies"]
    assert study["counts"]["ok"] == 6 and study["unknown"]
    contrast = study["contrasts"]["mine"]
    assert abs(contrast["mean_delta"] - (-0.01 + 0.0002)) < 1e-12 and contrast["n"] == 3
    assert any("--protocol-free vouches" in w for w in report["warnings"])
