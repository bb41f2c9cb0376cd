"""Issue 42 item 1 for seed 002: its depth-8 factorial (34 runs; #3c at one seed) produced end to end in miniature
and scored with no row left out (a file of its own: the suite's workers take it beside the other papers')."""

from __future__ import annotations

import pytest

from support.paper_miniature import run_table_in_miniature

pytestmark = pytest.mark.slow


def test_seed_002s_depth_8_table_runs_end_to_end_in_miniature(tmp_path, capsys):
    run_table_in_miniature("002-d8", tmp_path, capsys)
