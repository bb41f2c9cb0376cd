"""Seed 004's printed tied-table diagnostics (Tables 3, 5, 7, 9, 11, 13, 19, 22, 36, 37): the columns a run
records are paper tables that `muonlab paper score` scores against a ledger; the rest are printed by the
diagnose tool that measures them (`diagnose tied`: Table 13's gradient norm; `diagnose afmuon`: Tables 22 and
37) beside its measurement, when the run's model is the table's."""

from __future__ import annotations

import json
import math

import pytest
import torch

from muonlab.cli import main
from muonlab.papers.seed004 import printed as printed004
from muonlab.lab.paper import load_tables
from muonlab.lab.paper.scorecard import expected_protocol

TABLES = load_tables()
T1 = ("t1_hybrid", "t1_sign", "t1_afmuon")
K7 = tuple(f"k7_c{c}_s{s}" for s in ("0p5", "1p0") for c in ("1", "2", "3", "4", "6", "10", "inf"))
# id -> (metric, preset, settings, arms, seeds of each arm)
NEW = {
    **{f"004-t{n}-{col}": (metric, preset, {}, T1, seeds)
       for n, preset, seeds in ((3, "nanogpt-124m", (43, 44, 45)), (5, "smollm2-135m", (43, 44, 45)),
                                (7, "qwen2.5-0.5b", (44, 45)), (11, "llama-3.2-1b", (44, 45)))
       for col, metric in (("tied-rms", "tied_rms"), ("tied-max", "tied_max"), ("matrix-rms", "matrix_rms"))},
    **{f"004-t9-{col}": (metric, "qwen2.5-0.5b", {"train.num_steps": 12207}, T1, (43,))
       for col, metric in (("tied-rms", "tied_rms"), ("tied-max", "tied_max"), ("matrix-rms", "matrix_rms"))},
    **{f"004-t13-{col}": (metric, "llama-3.2-1b", {"train.num_steps": 19042}, T1, (43,))
       for col, metric in (("tied-rms", "tied_rms"), ("tied-max", "tied_max"))},
    **{f"004-t19-{col}": (metric, "nanogpt-124m-moe", {}, T1, ())
       for col, metric in (("tied-rms", "tied_rms"), ("tied-max", "tied_max"), ("router-entropy", "val_router_entropy"),
                           ("router-max-frac", "val_router_max_frac"), ("router-cv", "val_router_cv"),
                           ("router-unused", "val_router_unused_experts"))},
    "004-t22-tied-rms": ("tied_rms", "imagegpt", {}, T1, ()),
    "004-t22-tied-max": ("tied_max", "imagegpt", {}, T1, ()),
    "004-t36-tied-rms": ("tied_rms", "nanogpt-124m", {}, K7, ()),
    "004-t36-tied-max": ("tied_max", "nanogpt-124m", {}, K7, ()),
    "004-t37-matrix-rms": ("matrix_rms", "nanogpt-124m", {}, K7, ()),
}


def test_the_tied_diagnostic_tables_load_with_their_columns_protocols_and_values():
    for tid, (metric, preset, settings, arms, seeds) in NEW.items():
        t = TABLES[tid]
        assert (t.paper, t.metric, t.preset, t.settings, t.rule) == ("seed 004", metric, preset, settings,
                                                                    "descriptive"), tid
        assert t.at_tokens is None, tid  # these are final-checkpoint statistics: read at the run's end
        assert tuple(a.arm for a in t.arms) == arms, tid
        for a in t.arms:
            if seeds:
                assert a.seeds == seeds and a.mean is None, (tid, a.arm)
            else:  # the paper prints mean ± SD over three seeds
                assert not a.values and a.n == 3 and a.sd is not None, (tid, a.arm)
    # a few numbers as the paper prints them
    assert TABLES["004-t3-tied-max"].arm("t1_afmuon").values == {43: 5.8463, 44: 9.2696, 45: 9.4472}
    assert TABLES["004-t5-tied-max"].arm("t1_sign").values == {43: 10.0026, 44: 10.0348, 45: 10.0104}
    assert TABLES["004-t7-matrix-rms"].arm("t1_sign").values == {44: 0.0440, 45: 0.0439}
    assert TABLES["004-t9-tied-rms"].arm("t1_hybrid").values == {43: 0.0553}
    assert TABLES["004-t11-tied-max"].arm("t1_afmuon").values == {44: 2.2891, 45: 1.3577}
    assert TABLES["004-t13-tied-max"].arm("t1_sign").values == {43: 6.1341}
    cv = TABLES["004-t19-router-cv"].arm("t1_sign")
    assert (cv.mean, cv.sd) == (0.0604, 0.0096)
    unused = TABLES["004-t19-router-unused"].arm("t1_afmuon")
    assert (unused.mean, unused.sd) == (0.0, 0.0)
    top = TABLES["004-t22-tied-max"].arm("t1_afmuon")
    assert (top.mean, top.sd) == (2.2829, 0.3463)
    inf = TABLES["004-t36-tied-max"].arm("k7_cinf_s1p0")
    assert (inf.mean, inf.sd) == (7.6845, 0.1437)
    m = TABLES["004-t37-matrix-rms"].arm("k7_c3_s1p0")
    assert (m.mean, m.sd) == (0.0594, 0.0007)


def _ledger() -> list[dict]:
    """One ledger line per (arm, seed, protocol), as a run records it: every metric the new tables read from
    that run in one line. Per-seed arms carry the printed value; a printed mean ± SD over three seeds becomes
    the seeds' values mean - SD, mean, mean + SD (whose mean and sample SD are the printed ones)."""
    lines: dict[tuple, dict] = {}
    for tid in NEW:
        t = TABLES[tid]
        for a in t.arms:
            protocol = expected_protocol(a.arm, t.preset, t.settings)
            assert protocol is not None, (tid, a.arm)
            values = a.values or dict(zip(a.run_seeds, (a.mean - a.sd, a.mean, a.mean + a.sd)))
            for seed, value in values.items():
                line = lines.setdefault((a.arm, seed, protocol), {"arm": a.arm, "seed": seed, "status": "ok",
                                                                  "protocol": protocol, "metrics": {}})
                line["metrics"][t.metric] = value
    return list(lines.values())


def test_paper_score_scores_every_row_of_a_synthetic_ledger(tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(line) + "\n" for line in _ledger()))
    assert main(["paper", "score", *NEW, "--ledger", str(ledger), "--out", str(tmp_path / "out"), "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert [t["id"] for t in card["tables"]] == list(NEW)
    for t in card["tables"]:
        _, preset, settings, arms, seeds = NEW[t["id"]]
        assert not t["protocol_differs"] and t["missing"] == [], t["id"]
        assert [r["arm"] for r in t["rows"]] == list(arms), t["id"]
        for r in t["rows"]:
            # the ledger's runs of the table's protocol are all read (the arm's runs of other tables' protocols
            # are not: t1_hybrid runs under five presets here)
            own = expected_protocol(r["arm"], preset, settings)
            assert [x for x in r["left_out"] if x["protocol"] == own] == [], (t["id"], r["arm"])
            assert r["measured"]["n"] == (len(seeds) or 3), (t["id"], r["arm"])
            assert r["measured"]["mean"] == pytest.approx(r["paper"]["mean"], abs=1e-12), (t["id"], r["arm"])
            assert r["difference"] == pytest.approx(0.0, abs=1e-12)
            if not seeds:  # the printed SD comes back from the three seeds
                assert r["measured"]["sd"] == pytest.approx(r["paper"]["sd"], abs=1e-12), (t["id"], r["arm"])
    text = (tmp_path / "out" / "scorecard.md").read_text()
    assert "004-t19-router-cv" in text and "004-t37-matrix-rms" in text


def test_a_run_under_another_protocol_is_not_scored_as_the_long_horizon_table():
    """Table 9 is the Qwen seed-43 continuation to 12,207 steps: a 1,907-step run's tied RMS is left out."""
    from muonlab.lab.paper import scorecard
    from muonlab.lab.paper.runs import table_plan

    table = TABLES["004-t9-tied-rms"]
    short = expected_protocol("t1_sign", "qwen2.5-0.5b")
    lines = [{"arm": "t1_sign", "seed": 43, "status": "ok", "protocol": short, "metrics": {"tied_rms": 0.5815}}]
    (t,) = scorecard([table_plan(table)], lines)["tables"]
    row = next(r for r in t["rows"] if r["arm"] == "t1_sign")
    assert row["measured"]["n"] == 0 and row["runs_of_other_protocols"] == 1
    assert {"arm": "t1_sign", "seed": 43} in t["missing"]


def test_the_diagnose_only_columns_are_found_by_model_and_optimizer():
    assert printed004.for_tied("llama-3.2-1b", "sign") == (printed004.TABLE13_SOURCE, {"grad_norm": 0.3029})
    assert printed004.for_tied("qwen2.5-0.5b", "sign") is None and printed004.for_tied("llama-3.2-1b", None) is None
    source, sign = printed004.for_afmuon("imagegpt", "sign", 1.0, 1.0)
    assert "Table 22" in source and sign == {"rows_clipped": (1.000, 0.000), "tail_energy": (0.8012, 0.0005)}
    assert printed004.for_afmuon("imagegpt", "afmuon", 3.0, 0.5)[1]["cos_sign"] == (0.799, 0.001)
    assert printed004.for_afmuon("imagegpt", "hybrid", 3.0, 0.5) is None  # Hybrid: "–" throughout
    source, row = printed004.for_afmuon("nanogpt-124m", "afmuon", math.inf, 1.0)
    assert "Table 37" in source and "c = inf, s = 1" in source
    assert row == {"coord_capped": (0.0, 0.0), "rows_clipped": (0.0, 0.0), "tail_energy": (0.0, 0.0),
                   "cos_sign": (0.797, 0.0), "objective_ratio": (1.254, 0.0)}
    assert printed004.for_afmuon("nanogpt-124m", "afmuon", 4.0, 1.0)[1]["rows_clipped"] == (0.2476, 0.0625)
    assert printed004.for_afmuon("nanogpt-124m", "afmuon", 5.0, 0.5) is None  # no such row in the sweep
    assert printed004.for_afmuon("tied-tiny", "afmuon", 3.0, 0.5) is None  # a CPU preset is not the paper's model
    # the not-measured settings columns are kept as printed
    assert printed004.SETTINGS["Table 13"]["hybrid"] == {"matrix_wd": 0.1, "aux_wd": 0.01, "tied_wd": 0.01,
                                                          "precision": "FP32 + BF16"}
    assert printed004.SETTINGS["Table 7"]["afmuon"] == {"aux_wd": 0.0}


def test_table37s_default_row_is_the_afmuon_diagnostics_reference():
    from muonlab.papers.seed004.diagnostics.afmuon import PAPER_C3_S05

    assert {k: mean for k, (mean, _) in printed004.TABLE37[(3.0, 0.5)].items()} == PAPER_C3_S05


@pytest.fixture(scope="module")
def afmuon_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("printed004")
    runs = tmp / "runs"
    assert main(["train", "--preset", "tied-cpu", "--tied-preset", "tied-tiny-moe", "--arm", "t1_afmuon",
                 "--num-steps", "2", "--eval-every", "2", "--cache-dir", str(tmp / "cache"), "--runs-dir",
                 str(runs), "--quiet"]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return run_dir


def test_a_tied_run_records_every_metric_the_new_tables_read(afmuon_run):
    (record,) = [json.loads(line) for line in open(afmuon_run.parent / "ledger.jsonl")]
    read = {TABLES[tid].metric for tid in NEW}
    assert read <= set(record["metrics"]), read - set(record["metrics"])
    assert all(isinstance(record["metrics"][k], float) for k in read)


def _line(text: str, key: str) -> list[str]:
    (line,) = [row for row in text.splitlines() if row.startswith(key + " ")]
    return line.split()


def test_diagnose_tied_prints_table13s_gradient_norm_beside_the_measured_one(afmuon_run, capsys, monkeypatch):
    from muonlab.diagnostics.runs import capture_batches
    from muonlab.diagnostics.runs import load_run

    # the run's mean-gradient norm over its next step, from one backward of the mean loss
    loaded = load_run(afmuon_run)
    batches = capture_batches(loaded)
    params = [p for p in loaded.model.parameters() if p.requires_grad]
    loss = sum(loaded.model(x, y) for x, y in batches) / len(batches)
    grads = [g for g in torch.autograd.grad(loss, params, allow_unused=True) if g is not None]
    want = math.sqrt(sum(float(g.double().square().sum()) for g in grads))

    assert main(["diagnose", "tied", "--run", str(afmuon_run)]) == 0
    plain = capsys.readouterr().out
    assert len(_line(plain, "grad_norm")) == 2  # a CPU preset: no printed gradient norm beside it

    monkeypatch.setattr(printed004, "TABLE13_MODEL", loaded.cfg.model.preset)  # as if the run were Llama-3.2-1B
    assert main(["diagnose", "tied", "--run", str(afmuon_run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["grad_norm"] == pytest.approx(want, rel=1e-5)
    assert res["paper"]["grad_norm"] == 0.3084 and "Table 13" in res["paper_model_source"]
    assert main(["diagnose", "tied", "--run", str(afmuon_run)]) == 0
    text = capsys.readouterr().out
    name, measured, paper = _line(text, "grad_norm")
    assert float(measured) == pytest.approx(want, abs=1e-4) and paper == "0.3084"
    assert "paper grad_norm: Table 13" in text


def test_diagnose_afmuon_prints_the_models_table_row_beside_the_measured_one(afmuon_run, capsys, monkeypatch):
    assert main(["diagnose", "afmuon", "--run", str(afmuon_run)]) == 0
    plain = capsys.readouterr().out
    assert "this model" not in plain and len(_line(plain, "rows_clipped")) == 3

    monkeypatch.setattr(printed004, "TABLE37_MODEL", "tied-tiny-moe")  # as if NanoGPT, at the run's (3, 0.5)
    assert main(["diagnose", "afmuon", "--run", str(afmuon_run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["paper_model"]["values"]["rows_clipped"] == [0.8949, 0.0042]
    assert main(["diagnose", "afmuon", "--run", str(afmuon_run)]) == 0
    text = capsys.readouterr().out
    row = _line(text, "rows_clipped")
    assert float(row[1]) == pytest.approx(res["rows_clipped"], abs=1e-4) and row[3:] == ["0.8949", "±", "0.0042"]
    assert "paper (this model): Table 37" in text and "c = 3, s = 0.5" in text

    monkeypatch.setattr(printed004, "TABLE22_MODEL", "tied-tiny-moe")  # as if the tied ImageGPT: Table 22
    assert main(["diagnose", "afmuon", "--run", str(afmuon_run)]) == 0
    text = capsys.readouterr().out
    assert _line(text, "rows_clipped")[3:] == ["0.7730", "±", "0.0150"]
    assert _line(text, "objective_ratio")[3:] == ["1.2510", "±", "0.0000"]
    assert _line(text, "coord_capped")[3:] == ["–"]  # Table 22 prints no capped-coordinate fraction
    assert "paper (this model): Table 22" in text
