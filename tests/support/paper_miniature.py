"""Run a paper table in miniature through the command line, score it, and check that every row is scored."""

from __future__ import annotations

import json
import math

from muonlab.cli import main
from muonlab.lab.paper import load_tables


# the longest run of a table about this many steps (the product's default is 40; none shorter than its MIN_STEPS, 4):
# the suite checks that every row is produced and scored at its comparison point, which the structure keeps at any
# length (seed 002's 34 runs: 30 CPU s at 6 steps, 22 at 4)
SUITE_MINIATURE_STEPS = 4


def run_table_in_miniature(table_id, tmp_path, capsys):
    steps = ["--miniature-steps", str(SUITE_MINIATURE_STEPS)]
    where = ["--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache")]
    assert main(["paper", "run", table_id, "--miniature", *steps, "--parallel", "2", "--json", *where]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert main(["paper", "score", table_id, "--miniature", *steps, "--json", *where]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["tables"] == ran["tables"]  # the run's scorecard is the score's
    (t,) = card["tables"]
    table = load_tables()[table_id]
    assert t["miniature"] and not t["missing"]
    assert t["rule"] == table.rule
    for row in t["rows"]:
        paper_arm = table.arm(row["arm"])
        assert row["measured"]["seeds"] == sorted(paper_arm.run_seeds), row["arm"]
        assert all(math.isfinite(v) for v in [row["measured"]["mean"]]) and not row["left_out"], row
    if table.at_tokens:  # read at the point, before the end of the run where the paper's is before its end
        assert t["compared_at"].startswith("compared at ")
    for c in t["contrasts"]:
        assert c["measured"]["mean_delta"] is not None and c["measured"]["decision"], c
    ledger = (tmp_path / "runs" / "ledger.jsonl").read_text().splitlines()
    assert len(ledger) == sum(len(a.run_seeds) for a in table.arms)  # the paper's runs, no more
