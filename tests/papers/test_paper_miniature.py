"""Issue 42 item 1: a table of each paper produced end to end by muonlab's own runs. `paper run TABLE --miniature`
runs the paper's run set at CPU scale (real runs, as subprocesses of a sweep); `paper score --miniature` then scores
every row: each arm at each of the paper's seeds, read at the table's comparison point, none left out."""

from __future__ import annotations

import pytest
from support.paper_miniature import run_table_in_miniature

pytestmark = pytest.mark.spread  # each test a unit of work of its own (support.budget.work_unit)


# one table a paper: seed 000's depth-6 transfer (two seeds, one arm at one), seed 002's depth-8 factorial (34 runs;
# #3c at one seed), seed 003's single-seed gates, seed 004's K.8 (a comparison point before nothing: the run's end)
# and NanoGPT Table 1 (compared at step 5,000 of 5,100: a periodic evaluation inside the run); the file is spread,
# so the workers take the tables side by side
@pytest.mark.parametrize("table_id", ["002-d8", "000-t1", "003-t2", "004-k8", "004-t1-nanogpt"])
def test_a_table_runs_end_to_end_in_miniature_and_scores_every_row(table_id, tmp_path, capsys):
    run_table_in_miniature(table_id, tmp_path, capsys)
