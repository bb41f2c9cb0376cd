"""`diagnose accounting` (seed 002 §3, Table 1b): derived from the model and the arm.

Every derived number is checked against a hand transcription of its formula on the small cpu-tiny
model (width 64, 2 layers, 2 heads, vocabulary 300, 4 x 64 tokens a micro-step, 2 micro-steps a
step), the shape read from the config, never against the paper's printed number; then that the
printed numbers appear beside the derived ones with the difference named.
"""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.papers.seed002.diagnostics import accounting as A
from muonlab.errors import UsageError

TINY = "cpu-tiny"
OE = {"model.oe.m": 150_855}  # seed 002's modulus; n = 3, k = 2: four tables of width d / 4
DELTA_KEYS = ("fwd_bwd", "optimizer", "persistent_bytes", "activation_bytes")


@pytest.fixture(scope="module")
def s():
    """cpu-tiny's shape from its config: N tokens a micro-step, `accum` micro-steps a step."""
    cfg = resolve_config("00_dense_native", TINY)
    m, t = cfg.model, cfg.train
    L, d = m.depth, m.model_dim
    N = t.device_batch_size * t.sequence_len
    return SimpleNamespace(L=L, d=d, H=m.n_head, D=d // m.n_head, V=cfg.data.vocab_size, T=t.sequence_len, N=N,
                           accum=t.total_batch_size // N, tokens=t.total_batch_size, pattern=m.window_pattern,
                           n_ve=sum(i % 2 == (L - 1) % 2 for i in range(L)))


def delta(overrides, base=None, visited_rows=None):
    """What `overrides` add to a step over `base` (the plain model by default)."""
    a = A.measure_step(TINY, overrides, visited_rows)
    b = A.measure_step(TINY, base or {}, visited_rows)
    return {k: a[k] - b[k] for k in DELTA_KEYS}


# --- the counter's rules, on single ops ------------------------------------------------------------

def test_op_rules_by_hand():
    a, b = torch.empty(3, 5, device="meta"), torch.empty(5, 7, device="meta")
    x = torch.empty(4, 6, device="meta", requires_grad=True)
    table = torch.empty(10, 6, device="meta", requires_grad=True)
    ids = torch.zeros(8, dtype=torch.long, device="meta")
    cases = [
        (lambda: a @ b, 2 * 3 * 5 * 7),
        (lambda: torch.addmm(torch.empty(3, 7, device="meta"), a, b), 2 * 3 * 5 * 7 + 3 * 7),
        (lambda: x + x, 24), (lambda: x.sum(), 24), (lambda: x.mean(dim=1), 24 + 4),
        (lambda: torch.lerp(x, x, 0.5), 3 * 24), (lambda: torch.softmax(x, -1), 5 * 24),
        (lambda: torch.linalg.vector_norm(x), 2 * 24 + 1),
        (lambda: x.to(torch.bfloat16).view(24).clone(), 0),
        (lambda: F.embedding(ids, table).sum().backward(), 8 * 6 + 8 * 6),  # the sum, then the scatter-add
    ]
    for fn, expected in cases:
        counter = A.FlopCounter()
        with counter:
            fn()
        assert counter.flops["total"] == expected and not counter.uncounted


def test_meta_nonzero_takes_the_visited_rows_and_unknown_ops_are_listed():
    mask = torch.empty(100, dtype=torch.bool, device="meta")
    for visited, rows in ((None, 100), (30, 30), (500, 100)):
        with A.FlopCounter(visited):
            assert mask.nonzero().shape == (rows, 1)
    counter = A.FlopCounter()
    with counter:
        torch.empty(5, device="meta").cumsum(0)
    assert counter.uncounted == {"cumsum": 1} and counter.flops["total"] == 0


# --- derived on the small model, beside hand transcriptions ----------------------------------------

def test_parameters_and_step_flops_by_hand(s):
    dense = A.measure_step(TINY)
    # upstream train.py (seed 002 §3 item 1 gives the totals): wte + lm_head + value tables (V d each), 12 d^2 per block, ve_gate H x 32 per value layer,
    # resid / x0 lambdas
    backbone = s.V * s.d * (2 + s.n_ve) + 12 * s.d ** 2 * s.L + s.n_ve * s.H * 32 + 2 * s.L
    assert dense["counts"]["total"] == backbone
    windows = [s.T if s.pattern[i % len(s.pattern)] == "L" or i == s.L - 1 else s.T // 2 for i in range(s.L)]
    matmul = backbone - s.V * s.d * (1 + s.n_ve) - 2 * s.L  # estimate_flops leaves out the lookups
    assert dense["per_token"] == 6 * matmul + sum(12 * s.H * s.D * w for w in windows)
    joint = A.measure_step(TINY, {**OE, "model.qk.kind": "pair_tied_exp", "model.routing.kind": "sepden",
                                  "model.routing.out": True})["counts"]
    assert joint["total"] == backbone + s.L * s.H * s.D // 2 + s.L + 2  # + q_tau, wte_lambdas, out_lambdas
    assert joint["oe_tables"] == sum(150_855 + 2 * j for j in range(4)) * (s.d // 4)


def test_over_encoding_by_hand(s):
    rows = [150_855 + 2 * j for j in range(4)]
    w, n_params = s.d // 4, sum(rows) * s.d // 4
    got = delta(OE)
    # per micro-step: x0 add + scatter-add into the tables' gradients (1 each per token-channel); per token the
    # hash twice (visit counts, lookup: a multiply-add per order 2..3 and a remainder per table) and the 4
    # visit counts; every micro-step after the first adds into the dense table gradients
    per_token = 2 * (2 * 2 + 4) + 4
    assert got["fwd_bwd"] == s.accum * (2 * s.N * s.d + per_token * s.N) + (s.accum - 1) * n_params
    # update, per visited entry: divide by the count, square and sum, scale, subtract (+ a few per table)
    assert 0 <= got["optimizer"] - 5 * n_params <= 8 * 4
    assert 0 <= delta(OE, visited_rows=100)["optimizer"] - 5 * 100 * w * 4 <= 8 * 4
    assert got["persistent_bytes"] == 2 * 2 * n_params + 4 * sum(rows)  # bf16 weights and grads, fp32 counts
    assert got["activation_bytes"] == 4 * s.N * 8  # the four int64 row ids a micro-step


def test_q_tau_by_hand(s):
    n_tau = s.L * s.H * s.D // 2
    got = delta({"model.qk.kind": "pair_tied_exp"})
    # per query channel and layer: the scaling, its input gradient, and the scale's product and sum over tokens
    main_term = 4 * s.tokens * s.d * s.L
    assert 0 < got["fwd_bwd"] - main_term <= 8 * s.accum * n_tau  # + per-parameter work (exp, halves' sum)
    assert got["persistent_bytes"] == 16 * n_tau  # fp32 param, grad and two Adam moments


def test_routing_by_hand(s):
    """6 FLOPs per routed term and token-channel: forward multiply-add; backward the anchor's gradient and its
    accumulation, the scalar's product and sum over tokens. One more layer, or out_lambdas' two terms."""
    def routing(depth, out=False):
        base = {"model.depth": depth, "model.n_embd": s.d}
        on = {**base, "model.routing.kind": "sepden", **({"model.routing.out": True} if out else {})}
        return delta(on, base)["fwd_bwd"]
    assert 0 <= routing(3) - routing(2) - 6 * s.tokens * s.d <= 16 * s.accum
    assert 0 <= routing(2, out=True) - routing(2) - 2 * 6 * s.tokens * s.d <= 16 * s.accum


def test_neumann_gram_by_hand(s):
    """Per [V, d] table: mean row and centring (2Vd), Gram and product (4Vd^2), Frobenius norm (2d^2 + 1),
    scaling and subtraction (2Vd); on wte, lm_head and each value table."""
    got = delta({"optim.whiten.kind": "neumann"})
    tables = 2 + s.n_ve
    per_table = 4 * s.V * s.d ** 2 + 4 * s.V * s.d + 2 * s.d ** 2 + s.d
    assert got["fwd_bwd"] == 0 and 0 <= got["optimizer"] - tables * per_table <= 8 * tables


def test_bieq_by_hand(s):
    """HBiEq per m x n matrix: one squared copy (mn), per pass two matrix-vector products on it (4mn), the two
    scalings at the end (2mn): 11 mn, plus O(m + n) per pass on the row and column scales."""
    d = s.d
    shapes = [(d, d)] * 4 * s.L + [(4 * d, d), (d, 4 * d)] * s.L + [(s.H, 32)] * s.n_ve
    elements, sides = sum(m * n for m, n in shapes), sum(m + n for m, n in shapes)
    got = delta({"optim.prepolar.kind": "hbieq"})
    assert got["fwd_bwd"] == 0 and 0 < got["optimizer"] - 11 * elements <= 30 * sides
    square = A.arm_accounting("exp47_hbieq_square_only_bf16", TINY)["flops"]["components"]["bieq"]["optimizer"]
    assert 0 < square * 1e9 - 11 * 4 * s.L * d * d <= 30 * 4 * s.L * 2 * d  # scope: the square matrices only


def test_master32_memory_by_hand(s):
    got = delta({"optim.embedding_state": "master32"})
    # fp32 master (4 B) and fp32 moments (8 B) instead of bf16 moments (4 B): 8 B per wte / value-table entry
    assert got["persistent_bytes"] == 8 * s.V * s.d * (1 + s.n_ve)
    assert got["fwd_bwd"] == got["optimizer"] == 0


def test_components_sum_to_the_arm_and_cpu_presets_print_nothing():
    r = A.arm_accounting("12do_oe_decoupled_x0_out", TINY)
    comps = r["flops"]["components"]
    assert list(comps) == ["other", "routing", "q_tau", "over_encoding", "neumann_gram", "bieq"]
    assert sum(c["total"] for c in comps.values()) == pytest.approx(r["flops"]["extra_gflops"], rel=1e-12)
    assert sum(c["persistent_mib"] for c in comps.values()) == pytest.approx(r["memory"]["persistent_mib"])
    assert comps["routing"]["settings"] == {"model.routing.kind": "sepden", "model.routing.out": True}
    assert r["flops"]["compare"]["extra_gflops"]["printed"] is None and "compare" not in comps["routing"]
    assert r["params"]["compare"]["total"] == {"derived": r["params"]["total"], "printed": None}


# --- printed beside derived --------------------------------------------------------------------------

def test_compare_by_hand():
    assert A.compare(1.23449, "1.2345")["agrees"] and "reason" not in A.compare(1.23449, "1.2345")
    c = A.compare(1.2346, "1.2345", "why")
    assert not c["agrees"] and c["difference"] == pytest.approx(1e-4) and c["reason"] == "why"
    assert c["relative"] == pytest.approx(1e-4 / 1.2345)
    assert A.compare(419.5, "419.3-419.8")["difference"] == 0
    assert A.compare(420.0, "419.3-419.8")["difference"] == pytest.approx(0.2)
    assert A.compare(84_275_244, "84,275,244")["agrees"]
    assert A.compare(1.0, "0")["relative"] is None and A.compare(1.0, "0")["reason"] == "unexplained"
    assert A.compare(0.4, "0")["agrees"]  # within half a unit of an integer
    assert A.compare(5.0, None) == {"derived": 5.0, "printed": None}


def test_printed_values_stand_beside_the_derived_ones():
    r = A.arm_accounting("10_oe_native", "gpu-d8")
    f, m = r["flops"], r["memory"]
    pairs = [r["params"]["compare"]["total"], f["compare"]["step_tflops"], f["compare"]["extra_gflops"],
             m["compare"]["persistent_mib"], *f["components"]["over_encoding"]["compare"].values()]
    assert [p["printed"] for p in pairs] == [A.PAPER_TABLE_1B["gpu-d8", "10_oe_native"]["total"], "125.35",
                                             A.PAPER_TABLE_1B["gpu-d8", "10_oe_native"]["extra_gflops"],
                                             A.PAPER_TABLE_1B["gpu-d8", "10_oe_native"]["memory_mib"],
                                             *A.PAPER_COMPONENTS["gpu-d8"]["over_encoding"]]
    for p in pairs:  # each difference is derived minus printed, and a disagreement carries its reason
        assert p["difference"] == pytest.approx(p["derived"] - float(p["printed"].replace(",", "")), abs=1e-9)
        assert p["agrees"] == (abs(p["difference"]) <= A._printed(p["printed"])[2] * (1 + 1e-9))
        assert p["agrees"] or p["reason"]
    lookup = f["components"]["over_encoding"]["compare"]["fwd_bwd"]
    text = A.format_accounting_table(A.accounting_table(["10_oe_native"], "gpu-d8"))
    assert f"{lookup['derived']:.4f} [paper {lookup['printed']}, {lookup['difference']:+.4g}" in text
    assert f"{f['step_tflops']:.3f} [=]" in text and lookup["reason"] in text


def test_a_printed_value_that_cannot_be_derived_is_shown_with_its_reason():
    step = A.arm_accounting("00_dense_native", "gpu-d6")["flops"]["compare"]["step_tflops"]
    assert step["printed"] == "59.37" and not step["agrees"] and step["reason"] == A.REASONS["step"]
    assert step["difference"] == pytest.approx(step["derived"] - 59.37)


def test_cli_json_and_refusals(capsys):
    assert main(["diagnose", "accounting", "--arms", "10_oe_native", "--preset", TINY, "--visited-rows", "100",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["visited_rows"] == 100 and out["rows"][0]["flops"]["visited_rows"] == 100
    assert out["rows"][0]["flops"]["components"]["over_encoding"]["optimizer"] * 1e9 == pytest.approx(
        A.measure_step(TINY, OE, 100)["optimizer"] - A.measure_step(TINY, {}, 100)["optimizer"])
    assert main(["diagnose", "accounting", "--arms", "10_oe_native", "--preset", TINY, "--visited-rows", "-1"]) == 2
    # a setting that cannot act is refused: visited rows of arms without tables, an empty arm list
    assert main(["diagnose", "accounting", "--arms", "01_dense_opt", "--preset", TINY, "--visited-rows", "9"]) == 2
    assert main(["diagnose", "accounting", "--arms", ",", "--preset", TINY]) == 2
    with pytest.raises(UsageError):
        A.arm_accounting("10_oe_native", "no-such-preset")


def test_a_routing_arms_printed_component_is_implied_by_table_1b():
    # Table 1b, d8: 12d_bf16_shared_denom +71.48, its BF16-state reference #4a +63.42; d6: 12do +38.53, 12 +31.28
    assert A.routing_printed("12d_bf16_shared_denom", "gpu-d8") == (
        "8.06", "Table 1b: 12d_bf16_shared_denom 71.48 minus 4a_12_oe_joint_bf16state 63.42")
    assert A.routing_printed("12do_oe_decoupled_x0_out", "gpu-d6")[0] == "7.25"
    assert A.routing_printed("12do_oe_decoupled_x0_out", "gpu-d8") is None  # no d8 row with FP32 state


def test_printed_pairs_at_a_stand_in_preset_name_their_differences(monkeypatch):
    """cpu-tiny given stand-in 'printed' values: the memory difference is named as the paper's rounding when
    the components' rounded sum makes the printed value, else as differing components; a routing arm's
    printed routing is its total minus the reference's."""
    arm, ref = "12do_oe_decoupled_x0_out", "12_oe_joint"
    comps = A.arm_accounting(arm, TINY)["flops"]["components"]
    parts = {n: round(c["persistent_mib"], 2) for n, c in comps.items() if round(c["persistent_mib"], 2)}
    rounded = f"{sum(parts.values()):.2f}"
    monkeypatch.setattr(A, "PAPER_PRESETS", (TINY,))
    monkeypatch.setitem(A.PAPER_STEP_TFLOPS, TINY, "1.00")
    monkeypatch.setitem(A.PAPER_COMPONENTS, TINY, {})
    monkeypatch.setitem(A.ROUTING_REFERENCE, TINY, ref)
    row = dict(backbone="1", oe="0", total="1", pct_of_step="0.000", peak_mib="0.0")
    monkeypatch.setitem(A.PAPER_TABLE_1B, (TINY, ref), dict(row, extra_gflops="0.01", memory_mib="0.00"))
    for printed, named in ((rounded, "rounded to 0.01 MiB"), ("999.00", "components differ")):
        monkeypatch.setitem(A.PAPER_TABLE_1B, (TINY, arm), dict(row, extra_gflops="0.25", memory_mib=printed))
        r = A.arm_accounting(arm, TINY)
        memory = r["memory"]["compare"]["persistent_mib"]
        # cpu-tiny's exact 39.4265 MiB (OE 39.1325 + master32 0.2930 + q_tau and routing 0.0011) rounds to 39.43;
        # its components rounded first add to 39.42
        assert not memory["agrees"] and named in memory["reason"]
        assert all(f"{n} {v:.2f}" in memory["reason"] for n, v in parts.items())
    routing = r["flops"]["components"]["routing"]["compare"]["total"]
    assert routing["printed"] == "0.24" and routing["printed_from"] == f"Table 1b: {arm} 0.25 minus {ref} 0.01"
    assert routing["difference"] == pytest.approx(routing["derived"] - 0.24)


def test_visited_rows_are_named_and_a_printed_table_neumann_figure_gives_its_row_count(monkeypatch):
    """Stand-in printed figures at cpu-tiny: the table-Neumann cost at 1,234 visited rows per table, printed,
    is found again at 1,234 rows; the OE update priced at 100 rows says so."""
    arm, tn = "3a_oe_table_neumann_native", {**OE, "optim.table_whiten.kind": "neumann"}
    at_1234 = A.measure_step(TINY, tn, 1234)["optimizer"] - A.measure_step(TINY, OE, 1234)["optimizer"]
    monkeypatch.setattr(A, "PAPER_PRESETS", (TINY,))
    monkeypatch.setitem(A.PAPER_STEP_TFLOPS, TINY, "1.00")
    monkeypatch.setitem(A.PAPER_COMPONENTS, TINY, {"over_encoding": (None, "0.0001"),
                                                   "table_neumann": (None, f"{at_1234 / 1e9:.9f}")})
    c = A.arm_accounting(arm, TINY, visited_rows=100)["flops"]["components"]
    assert "priced at 100 rows per table" in c["over_encoding"]["compare"]["optimizer"]["reason"]
    assert "at 1,234 rows per table" in c["table_neumann"]["compare"]["optimizer"]["reason"]
