"""Issue 42: every paper table as the paper ran it. Each table's run set is the paper's (seeds per arm as printed);
every arm evaluates at the table's comparison point, under the paper's preset and in the miniature; each table is
judged by its paper's own rule, and the papers' own per-seed numbers reproduce every decision they print."""

from __future__ import annotations

import json

import pytest

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.config import all_presets, build_config
from muonlab.errors import UsageError
from muonlab.lab.paper import load_tables, scorecard
from muonlab.lab.paper.runs import STAND_INS, comparison_evaluated, data_kind, evaluation_tokens, table_plan
from muonlab.lab.paper.scorecard import expected_protocol

TABLES = load_tables()
WITH_POINT = [t.id for t in TABLES.values() if t.at_tokens]


@pytest.mark.parametrize("table_id", WITH_POINT)
def test_every_arm_evaluates_at_its_tables_comparison_point(table_id):
    """Under the table's preset and settings each arm's run evaluates at the point the paper compares at (a
    periodic evaluation, or the final one where the run ends there)."""
    t = TABLES[table_id]
    for a in t.arms:
        cfg = resolve_config(a.arm, t.preset, t.settings)
        assert t.at_tokens % cfg.train.total_batch_size == 0, (t.id, a.arm)
        assert comparison_evaluated(cfg, t.at_tokens), (t.id, a.arm, cfg.train.eval_every, cfg.train.num_steps)


def test_evaluation_tokens_are_the_periodic_and_final_evaluations():
    cfg = resolve_config("t1_afmuon", "tied-cpu", {"num_steps": 10, "eval_every": 4})
    b = cfg.train.total_batch_size
    assert evaluation_tokens(cfg) == {4 * b, 8 * b, 10 * b}
    assert not comparison_evaluated(cfg, 5 * b) and comparison_evaluated(cfg, 10 * b) and comparison_evaluated(cfg, None)
    off = resolve_config("t1_afmuon", "tied-cpu", {"num_steps": 10})
    assert evaluation_tokens(off) == {10 * b}


@pytest.mark.parametrize("table_id", list(TABLES))
def test_each_miniature_keeps_the_tables_structure(table_id):
    """The miniature runs the same family and data kind on a CPU preset; each arm evaluates at its comparison
    point, which sits at the paper's fraction of the run (to the rounding of the run's length); arms that differ
    in batch keep their ratio."""
    t = TABLES[table_id]
    plan = table_plan(t, miniature=True)
    assert plan.miniature and plan.differs and plan.preset == STAND_INS[t.preset][0]
    presets = all_presets()
    paper, small = (build_config([("preset", presets[p])]) for p in (t.preset, plan.preset))
    assert small.family == paper.family and data_kind(small.data.source) == data_kind(paper.data.source)
    assert small.runtime.device == "cpu"
    batches = {}
    for a in plan.arms:
        cfg = resolve_config(a.arm, plan.preset, a.overrides)
        full = resolve_config(a.arm, t.preset, t.settings)
        assert cfg.runtime.device == "cpu" and cfg.train.num_steps <= 120
        assert comparison_evaluated(cfg, a.at_tokens), (a.arm, a.at_tokens)
        if t.at_tokens:
            mini_step, full_step = a.at_tokens // cfg.train.total_batch_size, t.at_tokens // full.train.total_batch_size
            assert mini_step * plan.scale == full_step  # the same point, exactly, in steps / D
            assert abs(mini_step / cfg.train.num_steps - full_step / full.train.num_steps) <= 1 / cfg.train.num_steps
            assert full.train.eval_every == 0 or cfg.train.eval_every * plan.scale == full.train.eval_every
        batches[a.arm] = (cfg.train.total_batch_size, full.train.total_batch_size)
        oe, full_oe = getattr(cfg.model, "oe", None), getattr(full.model, "oe", None)
        if full_oe is not None and full_oe.m:  # seed 002's tables keep their rows per vocabulary token
            rows, full_rows = oe.m / cfg.data.vocab_size, full_oe.m / full.data.vocab_size
            assert oe.m < full_oe.m and abs(rows - full_rows) <= 0.5 / cfg.data.vocab_size, (a.arm, oe.m)
    least_mini, least_full = min(b for b, _ in batches.values()), min(f for _, f in batches.values())
    for mini, full in batches.values():
        assert mini * least_full == pytest.approx(full * least_mini, rel=0.05)


def test_k5s_miniature_keeps_its_batches_one_to_sixteen_at_one_token_count():
    plan = table_plan(TABLES["004-k5"], miniature=True)
    cfgs = {a.arm: resolve_config(a.arm, plan.preset, a.overrides) for a in plan.arms}
    assert cfgs["k5_sign_b512"].train.total_batch_size == 16 * cfgs["k5_sign_b32"].train.total_batch_size
    assert len({a.at_tokens for a in plan.arms}) == 1
    assert {c.train.num_steps * c.train.total_batch_size for c in cfgs.values()} == {plan.arms[0].at_tokens}


@pytest.mark.parametrize("table_id, paper_runs, grid", [("003-t1", 8, 12), ("000-t1", 7, 8), ("002-d6", 64, 66),
                                                         ("002-d8", 34, 36), ("004-k8", 3, 3)])
def test_paper_run_makes_the_runs_the_paper_made(table_id, paper_runs, grid, tmp_path, capsys):
    """Seeds per arm as printed (seed 002's #3b/#3c: one seed); --full-grid asks for every arm at every seed."""
    for extra, want in (([], paper_runs), (["--full-grid"], grid)):
        assert main(["paper", "run", table_id, "--miniature", "--dry-run", "--runs-dir", str(tmp_path), "--json",
                     *extra]) == 0
        priced = json.loads(capsys.readouterr().out)
        assert len(priced["runs"]) == want
        per_arm = {}
        for r in priced["runs"]:
            per_arm.setdefault(r["arm"], set()).add(r["seed"])
        if not extra:
            assert per_arm == {a.arm: set(a.run_seeds) for a in TABLES[table_id].arms}


def test_a_table_refuses_a_preset_of_another_family_or_data_kind():
    with pytest.raises(UsageError, match="protein"):
        table_plan(TABLES["004-t1-protein"], "hf-cpu")  # text, not protein
    with pytest.raises(UsageError, match="family"):
        table_plan(TABLES["004-t1-protein"], "tied-cpu")
    with pytest.raises(UsageError, match="drop --preset"):
        table_plan(TABLES["004-k8"], "tied-cpu", miniature=True)
    assert table_plan(TABLES["004-t1-protein"], "protein-cpu").differs


# ---------------------------------------------------------------------------- each paper's rule
def _paper_ledger(tables):
    """The papers' own per-seed numbers as ledger lines of each table's protocol."""
    lines = []
    for t in tables:
        for a in t.arms:
            protocol = expected_protocol(a.arm, t.preset, t.settings)
            for seed, value in a.values.items():
                line = {"arm": a.arm, "seed": seed, "status": "ok", "protocol": protocol, "metrics": {t.metric: value}}
                if t.at_tokens:
                    line["evals"] = [{"step": 1, "tokens": t.at_tokens, t.metric: value}]
                lines.append(line)
    return lines


RULE_OF = {"seed 000": {"ci", "descriptive"}, "seed 002": {"ci", "descriptive"}, "seed 003": {"descriptive", "single_seed"},
           "seed 004": {"paired_t", "descriptive"}}


def test_each_table_carries_its_papers_rule():
    for t in TABLES.values():
        assert t.rule in RULE_OF[t.paper] and t.rule_source, t.id
        single_seed = all(len(a.values) <= 1 for a in t.arms if a.values)
        if single_seed:  # one seed: nothing to test over seeds (K.3, K.5, K.6, K.8, seed 000's Tables 2 and 4A)
            assert t.rule in ("descriptive", "single_seed"), t.id
    assert TABLES["004-k5"].rule == TABLES["004-k8"].rule == "descriptive"


def _printed_verdicts():
    for t in TABLES.values():
        for c in t.contrasts:
            if c.decision or c.ci:
                yield t, c


def test_the_papers_own_numbers_reproduce_every_printed_decision():
    """Fed back as a ledger, each paper's per-seed numbers give, under the paper's own rule, the conclusion the
    paper prints: an interval that excludes zero decides (seeds 000, 002), one that spans zero does not, seed
    004's 'statistically insignificant' is no decision; and the printed k/n."""
    tables = sorted({t.id for t, _ in _printed_verdicts()})
    assert {"000-t3", "002-d6", "002-d6-holdout", "002-d8", "002-d8-holdout", "004-t1-t5"} <= set(tables)
    card = scorecard([table_plan(TABLES[i]) for i in tables], _paper_ledger(TABLES[i] for i in tables))
    scored = {t["id"]: {(c["arm"], c["baseline"]): c for c in t["contrasts"]} for t in card["tables"]}
    checked = 0
    for t, c in _printed_verdicts():
        measured = scored[t.id][(c.arm, c.baseline)]["measured"]
        printed = c.decision or ("excludes_zero" if c.ci[0] > 0 or c.ci[1] < 0 else "spans_zero")
        decided = measured["decision"] in ("improves", "worse")
        assert decided == (printed == "excludes_zero"), (t.id, c.arm, c.baseline, printed, measured)
        if c.k:
            assert [measured["seeds_improved"], measured["n"]] == list(c.k), (t.id, c.arm, c.baseline)
        checked += 1
    assert checked >= 110


def test_seed_002s_contrast_7d_held_out_excludes_zero_under_its_rule_and_not_under_a_threshold():
    """CI [-0.000728, -0.000007] (12do against its displacement-with-step-count control): listed as excluding zero
    in seed 002's §5; θ = 0.0005 would call it inconclusive (what every table said before each carried its
    paper's rule)."""
    t = TABLES["002-d6-holdout"]
    (c,) = [c for c in t.contrasts if c.ci and c.ci[1] == -0.000007]
    for rule, want in ((None, "improves"), ("ci+threshold", "inconclusive")):
        (scored,) = scorecard([table_plan(t)], _paper_ledger([t]), rule=rule)["tables"]
        got = next(x for x in scored["contrasts"] if (x["arm"], x["baseline"]) == (c.arm, c.baseline))
        assert got["measured"]["decision"] == want and got["measured"]["ci95"][1] < 0


def test_the_scorecard_prints_what_the_papers_print(tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in _paper_ledger([TABLES["002-d8"]])))
    assert main(["paper", "002-d8", "--ledger", str(ledger)]) == 0
    text = capsys.readouterr().out
    assert "95% t-interval over seeds excludes zero" in text and "§5 item 1" in text
    row = next(line for line in text.splitlines() if line.startswith("| 11_oe_opt − 10_oe_native"))
    # printed (gain, CI, k/n, its conclusion), then from the paper's seeds and measured: Δ ± SD [CI] p k/n decision
    assert row.count("[") == 3 and row.count("3/3") == 3 and "p 0.0140" in row and "excludes zero" in row
    assert row.count("-0.001989 ± 0.000411 [-0.003011, -0.000967]") == 2 and row.endswith("improves |")
    assert main(["paper", "002-d8", "--ledger", str(ledger), "--rule", "descriptive"]) == 0
    assert "descriptive" in capsys.readouterr().out
    assert main(["paper", "002-d8", "--rule", "bayes"]) == 2


def test_k4s_widths_have_the_papers_parameter_counts():
    """App. K.4: 123.4M / 202.2M / 416.6M parameters at K.2's 50k vocabulary (50,304 rows gave 202.5M / 417M)."""
    import torch

    from muonlab.device import Runtime
    from muonlab.train.build import build_model

    for width, millions in ((768, 123.4), (1024, 202.2), (1536, 416.6)):
        cfg = resolve_config(f"k4_afmuon_d{width}", "nanogpt-124m")
        model = build_model(cfg, cfg.data.vocab_size, Runtime(torch.device("meta"), "fp32"))
        assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == millions


# ---------------------------------------------------------------------------- prices
def test_a_price_takes_the_mfu_last_measured_for_the_preset_on_that_gpu():
    from muonlab.lab.paper.cost import ASSUMED_MFU, measured_mfu

    def line(mfu, device, preset="nanogpt-124m", status="ok"):
        cfg = resolve_config("t1_afmuon", preset, {"seed": 43})
        return {"status": status, "run_id": f"{device}-{mfu}", "metrics": {"mfu_percent": mfu},
                "provenance": {"device_name": device}, "config": cfg.to_dict()}

    h100 = "NVIDIA H100 80GB HBM3"
    records = [line(19.0, h100), line(23.5, h100), line(30.0, h100, status="failed"), line(40.0, "NVIDIA A100-SXM4-80GB"),
               line(50.0, h100, preset="tied-cpu")]
    mfu, basis = measured_mfu(records, "nanogpt-124m", "H100")
    assert mfu == pytest.approx(0.235) and h100 in basis  # the latest ok run of the preset on that GPU
    assert measured_mfu(records, "nanogpt-124m", "A100")[0] == pytest.approx(0.40)
    assert measured_mfu(records, "nanogpt-124m", "H200") == (ASSUMED_MFU, "assumed: no run of preset nanogpt-124m "
                                                                          "on a H200 in the ledger")


def test_a_gate_runs_price_counts_its_recomputed_forward():
    from muonlab.lab.paper.cost import run_cost

    gate, ordinary = (resolve_config(a, "gpu-d8") for a in ("p003_state_gate", "p003_ordinary"))
    assert gate.model.memory.checkpoint_blocks and not ordinary.model.memory.checkpoint_blocks
    g, o = run_cost(gate, 1e15, 0.4), run_cost(ordinary, 1e15, 0.4)
    from muonlab.lab.paper.cost import flops_per_token

    evaluated = gate.train.eval_tokens * 2 * flops_per_token(gate) / 3
    assert g["flops"] - evaluated == pytest.approx(4 / 3 * flops_per_token(gate) * g["tokens"], rel=1e-12)
    assert "recompute" in g["basis"] and "recompute" not in o["basis"]


def test_the_choices_muonlab_made_are_printed_beside_each_papers_tables_and_name_real_settings():
    import re

    from muonlab.cli import build_parser

    train = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    flags = {s for action in train._actions for s in action.option_strings}
    for t in TABLES.values():
        assert t.choices, t.id
        for flag in re.findall(r"--[a-z0-9-]+", " ".join(t.choices)):
            assert flag in flags, (t.id, flag)
    (scored,) = scorecard([table_plan(TABLES["003-t2"])], [])["tables"]
    from muonlab.lab.paper import format_scorecard

    assert "where the paper is silent, muonlab chose:" in format_scorecard({"tables": [scored]})
    assert any("--gate-lr-mult" in c for c in scored["choices"])


def test_runs_on_the_papers_own_data_are_the_tables_protocol_wherever_the_cache_is():
    """The settings `prepare --preset P --download` prints (FineWeb and the model's tokenizer under the user's
    cache) are the table's protocol: scored, not flagged; another tokenizer's runs are left out."""
    from pathlib import Path

    from muonlab.data.paper_data import GPT2, PAPER_DATA

    t = TABLES["004-t1-smollm2"]
    route = PAPER_DATA[t.preset]
    assert PAPER_DATA["t5-small"].tokenizer.repo_id == "HuggingFaceTB/SmolLM2-135M"  # App. J.5: V = 49,152
    assert PAPER_DATA["t5gemma2"].tokenizer.repo_id == "google/t5gemma-2-270m-270m"  # its own Gemma tokenizer
    gemma = TABLES["004-t1-t5gemma2"]  # its runs on that route are its protocol too
    gemma_cfg = resolve_config("t1_afmuon", gemma.preset, PAPER_DATA["t5gemma2"].settings(Path("/data")))
    assert gemma_cfg.data.source == "local" and gemma_cfg.data.tokenizer_json.endswith(
        "models--google--t5gemma-2-270m-270m/tokenizer.json")

    def line(seed, settings):
        cfg = resolve_config("t1_afmuon", t.preset, {"seed": seed, **settings})
        return {"arm": "t1_afmuon", "seed": seed, "status": "ok", "protocol": cfg.protocol_id(), "config": cfg.to_dict(),
                "run_id": f"r{seed}", "metrics": {"val_ce": 3.4}, "evals": [{"step": 1, "tokens": t.at_tokens, "val_ce": 3.44}]}

    paper = route.settings(Path("/data/lab cache"))
    other = {**paper, "data.tokenizer_json": str(GPT2.folder(Path("/data/lab cache")) / "tokenizer.json")}
    lines = [line(43, paper), line(44, route.settings(Path("/elsewhere"))), line(45, other)]
    (scored,) = scorecard([table_plan(t)], lines)["tables"]
    row = next(r for r in scored["rows"] if r["arm"] == "t1_afmuon")
    assert row["measured"]["seeds"] == [43, 44] and row["measured"]["mean"] == pytest.approx(3.44)
    assert [x["seed"] for x in row["left_out"]] == [45] and not scored["protocol_differs"]


def test_seed_004s_test_is_against_the_strongest_non_af_baseline():
    """The paper's printed contrast of each Table-1 setting is against its strongest non-AF arm by mean loss; a
    ledger where Sign became the strongest says so."""
    t = TABLES["004-t1-nanogpt"]
    (scored,) = scorecard([table_plan(t)], _paper_ledger([t]))["tables"]
    assert scored["strongest_baseline"] == {"paper": "t1_hybrid", "measured": "t1_hybrid"}
    assert t.contrasts[0].baseline == "t1_hybrid"
    shifted = [dict(line, evals=[{**line["evals"][0], "val_ce": line["evals"][0]["val_ce"] - 1.0}])
               if line["arm"] == "t1_sign" else line for line in _paper_ledger([t])]
    (scored,) = scorecard([table_plan(t)], shifted)["tables"]
    assert scored["strongest_baseline"] == {"paper": "t1_hybrid", "measured": "t1_sign"}
    for tid in ("004-t1-smollm2", "004-t1-llama", "004-t1-imagegpt"):
        (s,) = scorecard([table_plan(TABLES[tid])], [])["tables"]
        assert s["strongest_baseline"]["paper"] == TABLES[tid].contrasts[0].baseline, tid


def test_nanogpts_table_has_the_papers_50304_rows_whatever_the_tokenizer():
    """App. J.1: a 50,304-row tied table; the paper-data routes give GPT-2's 50,257 tokens (SmolLM2's 49,152 in the
    authors' release): the table is padded, the data's ids unchanged. A CPU preset keeps the data's rows."""
    import torch

    from muonlab.device import Runtime
    from muonlab.train.build import build_model

    meta = Runtime(torch.device("meta"), "fp32")
    for preset in ("nanogpt-124m", "nanogpt-124m-moe"):
        cfg = resolve_config("t1_afmuon", preset)
        for tokens in (50_257, 49_152, 50_304):
            assert build_model(cfg, tokens, meta).wte.weight.shape[0] == 50_304
    small = resolve_config("t1_afmuon", "tied-cpu")
    assert build_model(small, 300, meta).wte.weight.shape[0] == 300
    with pytest.raises(UsageError, match=r"--tied-vocab-rows \(model\.vocab_rows\) must be >= 1"):
        resolve_config("t1_afmuon", "tied-cpu", {"tied_vocab_rows": 0})


@pytest.mark.parametrize("table_id", ["002-d8", "004-t1-nanogpt", "000-t1"])
def test_miniature_steps_sizes_the_longest_run_and_keeps_the_comparison_point_a_step(table_id):
    """--miniature-steps N: the longest run about N steps (the factor the nearest that divides the comparison
    step and the evaluation interval), the comparison point still a whole step evaluated inside the run."""
    table = load_tables()[table_id]
    for target in (12, 40):
        plan = table_plan(table, miniature=True, miniature_steps=target)
        lengths = [resolve_config(a.arm, plan.preset, a.overrides).train.num_steps for a in plan.arms]
        default = table_plan(table, miniature=True)
        assert (plan.scale == default.scale) == (target == 40)  # 40 is the default
        assert abs(max(lengths) - target) <= max(lengths) / 2 and min(lengths) >= 4, (target, lengths)
        for arm in plan.arms:
            if arm.at_tokens is not None:
                cfg = resolve_config(arm.arm, plan.preset, arm.overrides)
                assert arm.at_tokens % cfg.train.total_batch_size == 0
                assert arm.at_tokens // cfg.train.total_batch_size <= cfg.train.num_steps
    with pytest.raises(UsageError, match="add --miniature"):
        table_plan(table, miniature_steps=12)
