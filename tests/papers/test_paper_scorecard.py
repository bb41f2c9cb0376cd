"""`muonlab paper` (issue 16 item 1): the seed papers' tables as data, and the scorecard of a ledger against
them. The papers' own per-seed numbers, fed back as a ledger, score zero deviation; a shifted ledger gives
the shift back; the tables reproduce the papers' printed paired tests."""

from __future__ import annotations

import json
import math

import pytest

from muonlab.arms import ARMS
from muonlab.cli import main
from muonlab.config import all_presets
from muonlab.lab.paper import format_scorecard, load_tables, scorecard
from muonlab.lab.paper.runs import table_plan
from muonlab.lab.paper.scorecard import expected_protocol
from muonlab.lab.stats import paired_contrast, single_seed_decision

TABLES = load_tables()


def _card(tables, lines, preset=None, **kwargs):
    """The scorecard of the tables' plans (the paper's run sets, under `preset` or each table's own)."""
    return scorecard([table_plan(t, preset) for t in tables], lines, **kwargs)


def test_every_table_names_registered_arms_presets_and_the_papers_seeds():
    assert {t.paper for t in TABLES.values()} >= {"seed 004"}
    for t in TABLES.values():
        assert t.preset in all_presets(), t.id
        for a in t.arms:
            assert a.arm in ARMS, (t.id, a.arm)
            assert set(a.seeds) <= set(ARMS[a.arm].seeds), (t.id, a.arm)  # the paper's seeds are the arm's
            assert (a.mean is None) == bool(a.values), (t.id, a.arm)  # per-seed values or a printed mean
        for c in t.contrasts:
            assert t.arm(c.arm).values and t.arm(c.baseline).values, (t.id, c)


@pytest.mark.parametrize("table_id", [t.id for t in TABLES.values() if t.contrasts])
def test_the_per_seed_numbers_give_the_printed_tests(table_id):
    """Each printed gain (baseline - arm) and p follows from the typed per-seed values: within one unit of
    the printed gain's last decimal (seed 004 prints 4 places, seeds 000-003 six), as both are rounded."""
    t = TABLES[table_id]
    for c in t.contrasts:
        if t.rule == "single_seed":  # one seed: the printed Δ is the difference itself, to the printed digits
            r = single_seed_decision(t.arm(c.arm).values, t.arm(c.baseline).values)
            assert abs(-r.delta - c.gain) <= 1e-9, c
            continue
        r = paired_contrast(t.arm(c.arm).values, t.arm(c.baseline).values)
        places = len(repr(abs(c.gain)).partition(".")[2]) if "e" not in repr(c.gain) else 6
        if t.rule == "descriptive":  # a difference without a test, of one seed or the mean of a few
            deltas = [t.arm(c.arm).values[s] - t.arm(c.baseline).values[s] for s in t.arm(c.arm).values]
            digits = places if t.metric == "val_ppl" else max(places, 4)  # perplexities print 2 decimals
            assert abs(-sum(deltas) / len(deltas) - c.gain) <= 1.01 * 10.0 ** -digits, c
            continue
        digits = places if t.metric == "val_ppl" else max(places, 4)  # perplexities print 2 decimals
        assert abs(-r.mean_delta - c.gain) <= 1.01 * 10.0 ** -digits, c
        if c.p is not None:
            assert r.p_value == pytest.approx(c.p, rel=0.05), c


def _ledger(shift: dict[str, float] | None = None, preset_of=lambda t: t.preset) -> list[dict]:
    """The papers' own per-seed numbers as ledger lines (status ok, the protocol of the table's preset).
    Where the paper compares before the end (`at_tokens`), the number is the periodic evaluation at that
    point, and the final value is another (the scorecard must not read it)."""
    lines = []
    for t in TABLES.values():
        for a in t.arms:
            protocol = expected_protocol(a.arm, preset_of(t), t.settings)
            for seed, value in a.values.items():
                value += (shift or {}).get(a.arm, 0.0)
                line = {"arm": a.arm, "seed": seed, "status": "ok", "protocol": protocol,
                        "metrics": {t.metric: value}}
                if t.at_tokens and preset_of(t) == t.preset:
                    line["metrics"] = {t.metric: value - 0.5}  # trained on past the comparison point
                    line["evals"] = [{"step": 1, "tokens": t.at_tokens // 2, t.metric: value + 1.0},
                                     {"step": 2, "tokens": t.at_tokens, t.metric: value},
                                     {"step": 3, "tokens": t.at_tokens + 1, t.metric: value - 0.5}]
                lines.append(line)
    return lines


def test_the_papers_own_numbers_score_zero_deviation():
    card = _card(list(TABLES.values()), _ledger())
    for t in card["tables"]:
        assert not t["protocol_differs"]
        for r in t["rows"]:
            if TABLES[t["id"]].arm(r["arm"]).values and r["paper"]["sd"] is not None:  # per-seed numbers
                assert r["measured"]["n"] == r["paper"]["n"] and abs(r["difference"]) < 1e-12, (t["id"], r)
                if r["paper"]["sd"]:
                    assert abs(r["difference_in_paper_sd"]) < 1e-9
                else:  # seeds that printed one value (the VRAM columns): no SD to count in
                    assert r["difference_in_paper_sd"] is None
        for c in t["contrasts"]:
            assert c["measured"] == c["paper"], (t["id"], c["arm"], c["baseline"])
        per_seed = {r["arm"] for r in t["rows"] if TABLES[t["id"]].arm(r["arm"]).values}
        assert not [m for m in t["missing"] if m["arm"] in per_seed]
        for d in t["derived"]:
            assert d["measured"] == d["from_paper_seeds"] is not None, (t["id"], d["name"])


@pytest.mark.parametrize("table_id", [t.id for t in TABLES.values() if t.derived])
def test_the_derived_numbers_follow_from_the_per_seed_values(table_id):
    """Each printed difference of differences (six decimals) and ratio (a percentage to 0.1) is, to its printed
    digits, the one the per-seed values give, written out here: mean over seeds of (A - B) - (C - D), and
    mean(A - B) / mean(C - D)."""
    t = TABLES[table_id]
    v = {a.arm: a.values for a in t.arms}
    for d in t.derived:
        (a, b), (c, e) = d.first, d.second
        seeds = sorted(set(v[a]) & set(v[b]) & set(v[c]) & set(v[e]))
        first = [v[a][s] - v[b][s] for s in seeds]
        second = [v[c][s] - v[e][s] for s in seeds]
        if d.kind == "dod":
            value, unit = sum(x - y for x, y in zip(first, second)) / len(seeds), 1e-6
        else:
            value, unit = (sum(first) / len(first)) / (sum(second) / len(second)), 1e-3
        assert abs(value - d.printed) <= 1.01 * unit, (d.name, value, d.printed)


def test_derived_rows_score_the_ledgers_runs():
    card = _card([TABLES["000-t2"]], _ledger({"exp03_qk_pair_tied_linear": -0.000160}))
    (t,) = card["tables"]
    share = next(d for d in t["derived"] if d["name"] == "QK share of the linear combination")
    assert share["measured"] == pytest.approx((0.995675 - 0.993375 + 0.000160) / (0.995675 - 0.993215), rel=1e-9)
    assert share["measured"] == pytest.approx(1.0, abs=1e-9)  # the QK arm alone now gives the whole combined gain
    assert t["decision_rule"].startswith("descriptive")
    assert all(c["measured"]["decision"] == "descriptive" and c["measured"]["p_value"] is None for c in t["contrasts"])
    text = format_scorecard(card)
    assert "| QK share of the linear combination" in text and "93.5%" in text and "100.0%" in text


def test_a_table_with_settings_scores_the_runs_trained_under_them():
    """Table 8 is the Qwen Table-1 arms continued to 12,207 steps: runs of the 1,907-step protocol are left out."""
    table = TABLES["004-t8"]
    assert table.settings == {"train.num_steps": 12_207}
    long_run = expected_protocol("t1_afmuon", "qwen2.5-0.5b", table.settings)
    short_run = expected_protocol("t1_afmuon", "qwen2.5-0.5b")
    assert long_run != short_run
    lines = [{"arm": "t1_afmuon", "seed": 43, "status": "ok", "protocol": p, "metrics": {"val_ce": 9.0},
              "evals": [{"step": 11_999, "tokens": table.at_tokens, "val_ce": v}]}
             for p, v in ((short_run, 3.5), (long_run, 3.3957))]
    (t,) = _card([table], lines)["tables"]
    row = next(r for r in t["rows"] if r["arm"] == "t1_afmuon")
    assert row["measured"]["mean"] == 3.3957 and len(row["left_out"]) == 1 and not t["protocol_differs"]


def test_a_shifted_ledger_gives_the_shift_back():
    shift = 0.05  # AF-Muon 0.0258 better than Hybrid in the paper: 0.0242 worse once shifted
    card = _card([TABLES["004-t1-nanogpt"]], _ledger({"t1_afmuon": shift}))
    (t,) = card["tables"]
    rows = {r["arm"]: r for r in t["rows"]}
    assert rows["t1_afmuon"]["difference"] == pytest.approx(shift, abs=1e-12)
    assert rows["t1_afmuon"]["difference_in_paper_sd"] == pytest.approx(shift / rows["t1_afmuon"]["paper"]["sd"])
    assert rows["t1_hybrid"]["difference"] == pytest.approx(0, abs=1e-12)
    (c,) = t["contrasts"]
    assert c["measured"]["mean_delta"] - c["paper"]["mean_delta"] == pytest.approx(shift, abs=1e-12)
    assert c["measured"]["decision"] == "worse" and c["paper"]["decision"] == "improves"


def test_runs_of_another_protocol_are_left_out_and_missing_seeds_listed():
    table = TABLES["004-t1-nanogpt"]
    lines = [r for r in _ledger() if r["arm"] != "t1_sign" and not (r["arm"] == "t1_afmuon" and r["seed"] == 45)]
    lines.append({"arm": "t1_sign", "seed": 43, "status": "ok", "protocol": "another", "metrics": {"val_ce": 1.0}})
    (t,) = _card([table], lines)["tables"]
    rows = {r["arm"]: r for r in t["rows"]}
    assert rows["t1_sign"]["measured"]["n"] == 0 and rows["t1_sign"]["runs_of_other_protocols"] == 1
    assert rows["t1_afmuon"]["measured"]["seeds"] == [43, 44]
    assert {(m["arm"], m["seed"]) for m in t["missing"]} == {("t1_sign", 43), ("t1_sign", 44), ("t1_sign", 45),
                                                             ("t1_afmuon", 45)}


def test_a_cpu_preset_is_said_to_differ(tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in _ledger(preset_of=lambda t: "tied-cpu")))
    assert main(["paper", "004-t1-nanogpt", "--preset", "tied-cpu", "--ledger", str(ledger), "--out",
                 str(tmp_path / "out"), "--json"]) == 0
    (t,) = json.loads(capsys.readouterr().out)["tables"]
    assert t["protocol_differs"] and "protocol differs" in t["note"] and t["rows"][0]["measured"]["n"] == 3
    text = (tmp_path / "out" / "scorecard.md").read_text()
    assert "protocol differs" in text and "t1_afmuon − t1_hybrid" in text
    assert json.loads((tmp_path / "out" / "scorecard.json").read_text())["tables"][0]["id"] == "004-t1-nanogpt"


def test_usage_errors_are_one_line(capsys):
    assert main(["paper", "no-such-table"]) == 2
    assert "unknown paper table" in capsys.readouterr().err
    assert main(["paper", "run"]) == 2
    assert "--all" in capsys.readouterr().err
    assert main(["paper", "tables"]) == 0 and "004-t1-t5gemma2" in capsys.readouterr().out


def test_paper_run_launches_the_missing_runs_then_scores(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MUONLAB_CACHE", str(tmp_path))
    argv = ["paper", "run", "004-k8", "--preset", "tied-cpu", "--num-steps", "4", "--json"]  # a short CPU check
    assert main(argv) == 0
    (t,) = json.loads(capsys.readouterr().out)["tables"]
    assert not t["missing"] and all(r["measured"]["n"] == 1 and math.isfinite(r["measured"]["mean"])
                                    for r in t["rows"])
    assert t["protocol_differs"] and "--num-steps 4" in t["note"]
    assert main(argv) == 0  # resumable: the second call runs nothing and scores the same
    again = json.loads(capsys.readouterr().out)["tables"][0]
    assert again["rows"] == t["rows"]


def test_the_difference_is_counted_in_the_papers_seed_sd():
    """One seed moved: the mean moves by a third of it, in units of the paper's SD (not the measured one)."""
    lines = _ledger()
    for r in lines:
        if (r["arm"] == "t1_afmuon" and r["seed"] == 45 and "val_ce" in r["metrics"]
                and r["protocol"] == expected_protocol("t1_afmuon", "nanogpt-124m")):
            at = TABLES["004-t1-nanogpt"].at_tokens  # the paper compares at 2.62B tokens: that evaluation moves
            next(e for e in r["evals"] if e["tokens"] == at)["val_ce"] += 0.03
    (t,) = _card([TABLES["004-t1-nanogpt"]], lines)["tables"]
    row = next(r for r in t["rows"] if r["arm"] == "t1_afmuon")
    assert row["difference"] == pytest.approx(0.01, abs=1e-12)
    assert row["measured"]["sd"] > 5 * row["paper"]["sd"]
    assert row["difference_in_paper_sd"] == pytest.approx(0.01 / row["paper"]["sd"], rel=1e-9)


def test_a_table_with_a_comparison_point_reads_the_evaluation_there_and_says_so():
    t = TABLES["004-t1-protein"]
    assert t.at_tokens == 875 * 524288 and "458.8M" in t.at_source
    card = _card([t], _ledger())
    (scored,) = card["tables"]
    assert scored["compared_at"].startswith("compared at 458,752,000 tokens")
    assert all(abs(r["difference"]) < 1e-12 for r in scored["rows"] if r["paper"]["mean"] is not None)
    # a run that evaluated only after the point has no value there
    late = [dict(line, evals=[e for e in line["evals"] if e["tokens"] > t.at_tokens]) for line in _ledger()
            if "evals" in line and line["arm"] in {a.arm for a in t.arms}]
    assert all(r["measured"]["n"] == 0 for r in _card([t], late)["tables"][0]["rows"])
    # another preset's runs are read at their end, and the card says where the paper compares
    other = _card([t], _ledger(preset_of=lambda _: "protein-cpu"), preset="protein-cpu")["tables"][0]
    assert other["compared_at"].startswith("final values: the paper compares at 458,752,000 tokens")


def test_runs_of_the_tables_arms_left_out_are_listed_with_what_sets_them_apart():
    from muonlab.arms import resolve_config

    t = TABLES["004-t1-nanogpt"]
    other = resolve_config("t1_afmuon", "nanogpt-124m", {"seed": 43, "num_steps": 100})
    line = {"run_id": "short-43", "arm": "t1_afmuon", "seed": 43, "status": "ok", "protocol": other.protocol_id(),
            "config": other.to_dict(), "metrics": {"val_ce": 3.9}}
    def afmuon_row(lines):
        return next(r for r in _card([t], lines)["tables"][0]["rows"] if r["arm"] == "t1_afmuon")

    row, before = afmuon_row(_ledger() + [line]), afmuon_row(_ledger())
    (left,) = [x for x in row["left_out"] if x["run_id"] == "short-43"]
    assert "train.num_steps=100 (table: 5100)" in left["why"]
    assert row["runs_of_other_protocols"] == before["runs_of_other_protocols"] + 1
    assert row["measured"] == before["measured"]  # left out, not scored
    card = _card([t], [line])
    assert "short-43" in format_scorecard(card) and "train.num_steps=100" in format_scorecard(card)


def test_seed_003s_gates_are_decided_by_its_preregistered_single_seed_rule():
    t = TABLES["003-t2"]
    assert t.rule == "single_seed" and "0.0005" in t.rule_source
    (scored,) = _card([t], _ledger())["tables"]
    assert "single-seed rule" in scored["decision_rule"]
    by_pair = {(c["arm"], c["baseline"]): c for c in scored["contrasts"]}
    state = by_pair[("p003_state_gate", "p003_ordinary")]
    assert state["paper"]["decision"] == "inconclusive" and state["paper"]["n"] == 1  # misses 0.0005 by 0.000047077
    assert abs(state["paper"]["mean_delta"] + 0.000452923) < 1e-12 and state["measured"] == state["paper"]
    assert "single-seed rule" in format_scorecard({"rule_text": "x", "tables": [scored]})
