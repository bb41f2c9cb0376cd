"""Seed 004's CPU stand-ins scale down faithfully: under every CPU preset each Table-1 arm (Hybrid, Sign,
AF-Muon) lowers its validation loss at every periodic evaluation. At the paper's Muon lr (0.02) and a
batch 500 to 4,000 times smaller, Sign and AF-Muon climbed after their first evaluations (tied-cpu:
4.48 -> 4.39 -> 4.71 -> 5.12); the presets' Muon lr follows `cpu_matrix_lr`'s square-root batch rule."""

from __future__ import annotations

import json
import math

import pytest

from muonlab.arms import resolve_config
from muonlab.config import all_presets
from muonlab.families.tied.afmuon import PAPER_MATRIX_LR
from muonlab.train import run_training

pytestmark = pytest.mark.spread  # each test a unit of work of its own (support.budget.work_unit)

CPU_PRESETS = ["tied-cpu", "tied-moe-cpu", "hf-cpu", "qwen2.5-cpu", "protein-cpu", "imagegpt-cpu", "t5-cpu",
               "t5gemma2-cpu"]
TABLE1_ARMS = ["t1_hybrid", "t1_sign", "t1_afmuon"]


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_the_muon_lr_is_the_papers_scaled_by_the_square_root_of_the_batch_ratio(name):
    lr, batch = all_presets()[name]["optim.matrix_lr"], all_presets()[name]["train.total_batch_size"]
    paper_batch = 16 * 256 if name == "t5-cpu" else 512 * 1024  # App. J.5's small T5; every other setting
    assert math.isclose(lr, PAPER_MATRIX_LR * math.sqrt(batch / paper_batch), rel_tol=1e-12)


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_every_table1_arm_lowers_its_validation_loss(tmp_path, name):
    steps = all_presets()[name]["train.num_steps"]
    for arm in TABLE1_ARMS:
        cfg = resolve_config(arm, name, {"quiet": True, "seed": 43, "eval_every": steps // 4,
                                         "runs_dir": str(tmp_path / "runs"), "cache_dir": str(tmp_path / "cache")})
        result = run_training(cfg, log=lambda _: None)
        rows = [json.loads(line) for line in open(result.run_dir / "metrics.jsonl")]
        curve = [r["val_ce"] for r in rows if "val_ce" in r]
        assert len(curve) >= 4, (arm, curve)
        assert all(b < a for a, b in zip(curve, curve[1:])), f"{name} {arm}: {curve}"
