"""muonlab.lab.stats against the seed papers' printed numbers, and its invariants.

Paper inputs are typed in exactly as printed (6 decimals for seeds 000/002, 9 for seed 003).
Means, SDs and per-seed Δs must match the printed values to ±1 in the last printed digit.
A 95% CI bound is mean ± t·SD/√n with t_{0.975,2}/√3 = 2.484, so the ±0.5e-6 rounding of the
printed inputs moves a bound by up to about 2e-6 (the papers computed from unrounded values);
CI bounds are therefore checked to ±2.5e-6 from the inputs, and to the rounding bound
0.5e-6·(1 + t/√n) + 0.5e-6 when rebuilt from the printed mean and SD.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

scipy_stats = pytest.importorskip("scipy.stats", reason="an independent t-test needs scipy (pip install 'muonlab[stats]')")

from muonlab.errors import UsageError
from muonlab.lab.stats import (IMPROVES, INCONCLUSIVE, NOT_ESTIMABLE, WORSE, DecisionRule,
                               contrast_from_deltas, difference_of_differences, paired_contrast, retention,
                               retention_ratio, single_seed_decision, summarize_arm, t_interval, t_quantile)

NUMBER = re.compile(r"[+-]?\d+\.\d+")
CI_TOL = 2.5e-6


def printed(value: float, text: str, units: int = 1) -> None:
    """`value` equals the printed decimal `text` to ±`units` in its last printed digit."""
    step = 10.0 ** -len(text.split(".")[1])
    assert abs(value - float(text)) <= units * step * (1 + 1e-9), f"{value!r} vs printed {text}"


def numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


# ------------------------------------------------------------------ seed 002, Table 2
# (paper 002 §4.1 Table 2; seeds 41, 42, 47; "val / held-out" per seed, then 3-seed mean ± SD)
SEEDS_002 = (41, 42, 47)
TABLE2 = """
d6 00 | 1.049084 / 1.048465 | 1.046407 / 1.045764 | 1.050544 / 1.049959 | 1.048678 ± 0.002098 | 1.048063 ± 0.002126
d6 01 | 1.048075 / 1.047426 | 1.045677 / 1.045099 | 1.048099 / 1.047451 | 1.047284 ± 0.001391 | 1.046659 ± 0.001351
d6 02 | 1.045844 / 1.045212 | 1.043498 / 1.042884 | 1.046285 / 1.045674 | 1.045209 ± 0.001498 | 1.044590 ± 0.001496
d6 10 | 1.025919 / 1.025273 | 1.023081 / 1.022420 | 1.026285 / 1.025654 | 1.025095 ± 0.001754 | 1.024449 ± 0.001767
d6 11 | 1.024662 / 1.023987 | 1.022574 / 1.021989 | 1.026044 / 1.025326 | 1.024427 ± 0.001747 | 1.023767 ± 0.001680
d6 12 | 1.023401 / 1.022766 | 1.021995 / 1.021248 | 1.024607 / 1.023927 | 1.023334 ± 0.001307 | 1.022647 ± 0.001344
d8 00 | 0.994025 / 0.993231 | 0.994049 / 0.993317 | 0.995700 / 0.994896 | 0.994591 ± 0.000960 | 0.993815 ± 0.000937
d8 01 | 0.992932 / 0.992043 | 0.992201 / 0.991479 | 0.993238 / 0.992586 | 0.992790 ± 0.000533 | 0.992036 ± 0.000554
d8 02 | 0.991716 / 0.990961 | 0.990920 / 0.990360 | 0.991845 / 0.991154 | 0.991494 ± 0.000501 | 0.990825 ± 0.000414
d8 10 | 0.980451 / 0.979589 | 0.979305 / 0.978486 | 0.978752 / 0.977971 | 0.979503 ± 0.000866 | 0.978682 ± 0.000827
d8 11 | 0.978568 / 0.977915 | 0.977664 / 0.976973 | 0.976309 / 0.975506 | 0.977513 ± 0.001137 | 0.976798 ± 0.001214
d8 12 | 0.977241 / 0.976404 | 0.976478 / 0.975719 | 0.976593 / 0.976048 | 0.976771 ± 0.000411 | 0.976057 ± 0.000343
d6 02m | 1.046457 / 1.045868 | 1.045106 / 1.044576 | 1.046833 / 1.046176 | 1.046132 ± 0.000908 | 1.045540 ± 0.000849
d6 12m | 1.023583 / 1.022850 | 1.022143 / 1.021478 | 1.024309 / 1.023721 | 1.023345 ± 0.001102 | 1.022683 ± 0.001131
"""  # the last two rows are Table 5b's masked cells


def _table2():
    arms, printed_summaries = {}, {}
    for line in TABLE2.strip().splitlines():
        cells = [c.strip() for c in line.split("|")]
        depth, code = cells[0].split()
        pairs = [c.split(" / ") for c in cells[1:4]]
        for i, split in enumerate(("val", "ho")):
            arms[depth, code, split] = {s: float(p[i]) for s, p in zip(SEEDS_002, pairs)}
            printed_summaries[depth, code, split] = numbers(cells[4 + i])
    return arms, printed_summaries


ARMS_002, SUMMARIES_002 = _table2()


def arm(depth: str, code: str, split: str) -> dict[int, float]:
    return ARMS_002[depth, code, split]


@pytest.mark.parametrize("key", sorted(SUMMARIES_002))
def test_seed002_table2_arm_means_and_sample_sds(key):
    summary = summarize_arm(key[1], ARMS_002[key])
    mean, sd = SUMMARIES_002[key]
    assert summary.n == 3 and summary.seeds == SEEDS_002
    printed(summary.mean, mean)
    printed(summary.sd, sd)


# ------------------------------------------------------------------ seed 002, Table 3
# Paired contrasts (rows 1-8: arm − ref) and difference-of-differences (rows 9-11:
# (a − b) − (c − d)), each cell "mean ± SD ([CI], [s41, s42, s47] on val, k/3)" as printed.
TABLE3 = {
    1: (("01", "00"), "-0.001395 ± 0.000920 ([-0.003680, +0.000891], [-0.001009, -0.000730, -0.002445])",
        "-0.001404 ± 0.000974 ([-0.003824, +0.001016])",
        "-0.001801 ± 0.000686 ([-0.003505, -0.000097], [-0.001093, -0.001848, -0.002462])",
        "-0.001779 ± 0.000563 ([-0.003176, -0.000381])"),
    2: (("02", "01"), "-0.002075 ± 0.000227 ([-0.002639, -0.001510], [-0.002231, -0.002180, -0.001814])",
        "-0.002068 ± 0.000253 ([-0.002696, -0.001441])",
        "-0.001297 ± 0.000089 ([-0.001519, -0.001074], [-0.001216, -0.001280, -0.001393])",
        "-0.001211 ± 0.000193 ([-0.001689, -0.000733])"),
    3: (("02", "00"), "-0.003469 ± 0.000703 ([-0.005216, -0.001723], [-0.003240, -0.002910, -0.004259])",
        "-0.003473 ± 0.000728 ([-0.005280, -0.001665])",
        "-0.003098 ± 0.000774 ([-0.005019, -0.001176], [-0.002309, -0.003128, -0.003855])",
        "-0.002990 ± 0.000736 ([-0.004818, -0.001161])"),
    4: (("10", "00"), "-0.023583 ± 0.000591 ([-0.025050, -0.022117], [-0.023165, -0.023327, -0.024259])",
        "-0.023613 ± 0.000603 ([-0.025112, -0.022115])",
        "-0.015089 ± 0.001713 ([-0.019344, -0.010833], [-0.013574, -0.014743, -0.016948])",
        "-0.015133 ± 0.001662 ([-0.019260, -0.011005])"),
    5: (("11", "10"), "-0.000668 ± 0.000527 ([-0.001978, +0.000641], [-0.001258, -0.000507, -0.000241], 3/3)",
        "-0.000682 ± 0.000526 ([-0.001988, +0.000624])",
        "-0.001989 ± 0.000411 ([-0.003011, -0.000967], [-0.001883, -0.001642, -0.002444], 3/3)",
        "-0.001884 ± 0.000510 ([-0.003151, -0.000617])"),
    6: (("12", "11"), "-0.001092 ± 0.000453 ([-0.002218, +0.000034], [-0.001261, -0.000579, -0.001437], 3/3)",
        "-0.001121 ± 0.000341 ([-0.001967, -0.000275])",
        "-0.000743 ± 0.000892 ([-0.002960, +0.001474], [-0.001327, -0.001186, +0.000284], 2/3)",
        "-0.000741 ± 0.001119 ([-0.003520, +0.002038])"),
    7: (("12", "10"), "-0.001761 ± 0.000720 ([-0.003549, +0.000028], [-0.002518, -0.001085, -0.001678], 3/3)",
        "-0.001803 ± 0.000670 ([-0.003467, -0.000138])",
        "-0.002732 ± 0.000532 ([-0.004053, -0.001411], [-0.003210, -0.002827, -0.002159], 3/3)",
        "-0.002625 ± 0.000643 ([-0.004222, -0.001029])"),
    8: (("12", "00"), "-0.025344 ± 0.000817 ([-0.027374, -0.023315], [-0.025683, -0.024412, -0.025937])",
        "-0.025416 ± 0.000797 ([-0.027395, -0.023437], 3/3)",
        "-0.017821 ± 0.001181 ([-0.020755, -0.014886], [-0.016785, -0.017571, -0.019107])",
        "-0.017758 ± 0.001020 ([-0.020290, -0.015225], 3/3)"),
    9: (("11", "10", "01", "00"),
        "+0.000726 ± 0.001301 ([-0.002506, +0.003958], [-0.000248, +0.000223, +0.002204])",
        "+0.000722 ± 0.001285 ([-0.002471, +0.003915])",
        "-0.000188 ± 0.000529 ([-0.001503, +0.001127], [-0.000790, +0.000206, +0.000019])",
        "-0.000105 ± 0.000408 ([-0.001118, +0.000907])"),
    10: (("12", "11", "02", "01"),
         "+0.000983 ± 0.000612 ([-0.000538, +0.002503], [+0.000970, +0.001601, +0.000377])",
         "+0.000948 ± 0.000550 ([-0.000418, +0.002313])",
         "+0.000554 ± 0.000979 ([-0.001877, +0.002985], [-0.000111, +0.000095, +0.001677])",
         "+0.000470 ± 0.001311 ([-0.002788, +0.003727])"),
    11: (("12", "10", "02", "00"),
         "+0.001709 ± 0.000935 ([-0.000613, +0.004031], [+0.000722, +0.001824, +0.002581])",
         "+0.001670 ± 0.000906 ([-0.000581, +0.003921])",
         "+0.000365 ± 0.001300 ([-0.002863, +0.003594], [-0.000901, +0.000301, +0.001696])",
         "+0.000365 ± 0.001375 ([-0.003050, +0.003780])"),
}
COLUMNS = (("d6", "val"), ("d6", "ho"), ("d8", "val"), ("d8", "ho"))
TABLE3_CELLS = [(row, col) for row in TABLE3 for col in range(4)]


def contrast_002(codes, depth, split):
    values = [arm(depth, code, split) for code in codes]
    if len(codes) == 2:
        return paired_contrast(*values)
    return difference_of_differences(*values)


def check_cell(contrast, cell: str, ci_tol: float = CI_TOL) -> None:
    nums = numbers(cell)
    printed(contrast.mean_delta, nums[0])
    printed(contrast.sd_delta, nums[1])
    assert abs(contrast.ci95[0] - float(nums[2])) <= ci_tol
    assert abs(contrast.ci95[1] - float(nums[3])) <= ci_tol
    for delta, text in zip(contrast.deltas, nums[4:7]):
        printed(delta, text)
    k = re.search(r"(\d)/3", cell)
    if k:
        assert contrast.seeds_improved == int(k.group(1))


@pytest.mark.parametrize("row,col", TABLE3_CELLS)
def test_seed002_table3_paired_contrasts_and_dods(row, col):
    codes, *cells = TABLE3[row]
    depth, split = COLUMNS[col]
    contrast = contrast_002(codes, depth, split)
    assert contrast.n == 3 and contrast.estimable
    check_cell(contrast, cells[col])


@pytest.mark.parametrize("row,col", TABLE3_CELLS)
def test_seed002_printed_cis_are_the_t_interval_of_the_printed_mean_and_sd(row, col):
    # The paper's CI is mean ± t_{0.975,2}·SD/√3 (seed 002 §4.1); rebuilding it from the
    # printed (rounded) mean and SD lands within that rounding's propagated bound.
    mean, sd, lo, hi = (float(x) for x in numbers(TABLE3[row][1 + col])[:4])
    bound = 0.5e-6 * (1 + t_quantile(3) / math.sqrt(3)) + 0.5e-6
    got = t_interval(mean, sd, 3)
    assert abs(got[0] - lo) <= bound and abs(got[1] - hi) <= bound


def test_t_quantile_is_the_papers_constant():
    assert abs(t_quantile(3) - 4.302653) < 5e-7  # seed 002 §4.1 (df = 2): t_{0.975,2} = 4.302653
    assert abs(t_quantile(2) - 12.706205) < 5e-7


# Descriptive retention ratios (Table 3 ratio column; abstract): conditional / dense mean Δ.
@pytest.mark.parametrize("depth,split,cond,dense,percent", [
    ("d6", "ho", ("11", "10"), ("01", "00"), "48.6"),   # 0.000682 / 0.001404
    ("d6", "val", ("11", "10"), ("01", "00"), "47.9"),
    ("d6", "ho", ("12", "11"), ("02", "01"), "54.2"),
    ("d6", "ho", ("12", "10"), ("02", "00"), "51.9"),
    ("d6", "val", ("12", "10"), ("02", "00"), "50.8"),
    ("d8", "ho", ("11", "10"), ("01", "00"), "105.9"),
    ("d8", "val", ("11", "10"), ("01", "00"), "110.4"),
    ("d8", "ho", ("12", "11"), ("02", "01"), "61.2"),
    ("d8", "ho", ("12", "10"), ("02", "00"), "87.8"),
    ("d8", "val", ("12", "10"), ("02", "00"), "88.2"),
])
def test_seed002_retention_ratios(depth, split, cond, dense, percent):
    ratio = retention_ratio(contrast_002(cond, depth, split), contrast_002(dense, depth, split))
    printed(100 * ratio, percent)


def test_retention_ratio_of_the_printed_means():
    printed(100 * retention_ratio(-0.000682, -0.001404), "48.6")  # seed 002 Table 3's 48.6 %
    assert retention_ratio(-0.001, 0.0) is None
    assert retention_ratio(None, -0.001) is None


# ------------------------------------------------------------------ seed 002, Table 5b
TABLE5B = {  # contrast: (codes, val cell, held-out cell, per-seed val, per-seed held-out)
    "A 02m-02": (("02m", "02"), "+0.000923 ± 0.000594 ([-0.000553, +0.002399])",
                 "+0.000950 ± 0.000648 ([-0.000659, +0.002558])",
                 "+0.000613 +0.001608 +0.000548", "+0.000656 +0.001692 +0.000502"),
    "B 12m-12": (("12m", "12"), "+0.000011 ± 0.000268 ([-0.000655, +0.000676])",
                 "+0.000036 ± 0.000222 ([-0.000515, +0.000588])",
                 "+0.000182 +0.000148 -0.000298", "+0.000084 +0.000230 -0.000206"),
    "C 02m-01": (("02m", "01"), "-0.001152 ± 0.000532 ([-0.002474, +0.000170])",
                 "-0.001119 ± 0.000535 ([-0.002449, +0.000211])",
                 "-0.001618 -0.000572 -0.001266", "-0.001558 -0.000522 -0.001275"),
    "D 12m-11": (("12m", "11"), "-0.001082 ± 0.000652 ([-0.002702, +0.000538])",
                 "-0.001084 ± 0.000549 ([-0.002449, +0.000280])",
                 "-0.001079 -0.000431 -0.001735", "-0.001137 -0.000511 -0.001606"),
    "E DoD": (("02m", "02", "12m", "12"), "+0.000912 ± 0.000518 ([-0.000374, +0.002198])",
              "+0.000914 ± 0.000480 ([-0.000278, +0.002105])",
              "+0.000431 +0.001460 +0.000846", "+0.000571 +0.001462 +0.000707"),
}


@pytest.mark.parametrize("name", sorted(TABLE5B))
@pytest.mark.parametrize("split", ["val", "ho"])
def test_seed002_table5b_masking_contrasts(name, split):
    codes, val, ho, seeds_val, seeds_ho = TABLE5B[name]
    contrast = contrast_002(codes, "d6", split)
    cell, seeds = (val, seeds_val) if split == "val" else (ho, seeds_ho)
    check_cell(contrast, cell)
    for delta, text in zip(contrast.deltas, seeds.split()):
        printed(delta, text)
    # all of Table 5b's intervals span zero: descriptive, no claim (paper 002 §5 item 1)
    assert contrast.ci95[0] < 0 < contrast.ci95[1]
    assert contrast.decision == INCONCLUSIVE


def test_seed002_contrast_a_from_its_printed_per_seed_deltas():
    # The paper's own per-seed held-out Δs (+0.000656, +0.001692, +0.000502) give the same row.
    contrast = contrast_from_deltas({41: 0.000656, 42: 0.001692, 47: 0.000502})
    check_cell(contrast, TABLE5B["A 02m-02"][2])
    assert contrast.seeds_improved == 0


def test_seed002_decisions_under_the_default_rule():
    rule = DecisionRule(threshold=0.0005)
    # Opt|OE at d6 spans zero; at d8 its held-out CI excludes zero and |Δ| ≥ θ.
    assert contrast_002(("11", "10"), "d6", "ho").decision == INCONCLUSIVE
    d8 = paired_contrast(arm("d8", "11", "ho"), arm("d8", "10", "ho"), rule=rule)
    assert d8.decision == IMPROVES and d8.seeds_improved == 3
    # Reversed, the same contrast is a reliable harm.
    assert paired_contrast(arm("d8", "10", "ho"), arm("d8", "11", "ho"), rule=rule).decision == WORSE


# ------------------------------------------------------------------ seed 000, Table 3
# Depth-8 3-seed arms (seeds 42, 47, 137): dev BPB and held-out BPB as printed.
SEEDS_000 = (42, 47, 137)
P000 = {
    "baseline": ("0.994008 0.995675 0.995631", "0.995105 ± 0.000950"),
    "zeta": ("0.994523 0.993007 0.996768", "0.994766 ± 0.001892"),
    "undamped": ("0.993396 0.991905 0.996222", "0.993841 ± 0.002193"),
    "untied": ("0.992951 0.993819 0.993067", "0.993279 ± 0.000471"),
    "fp32post": ("0.992853 0.993767 0.993200", "0.993273 ± 0.000461"),
    "pairtied": ("0.992671 0.993561 0.993167", "0.993133 ± 0.000446"),
    "turbo": ("0.992446 0.993139 0.993685", "0.993090 ± 0.000621"),
    "hbieq_bf16": ("0.992208 0.992664 0.992943", "0.992605 ± 0.000371"),
    "hbieq_fp32": ("0.992190 0.992883 0.992679", "0.992584 ± 0.000356"),
}
P000_HOLDOUT = {
    "untied": ("0.992361 0.993044 0.992308", "0.992571 ± 0.000411"),
    "turbo": ("0.991782 0.992356 0.993041", "0.992393 ± 0.000631"),
    "hbieq_bf16": ("0.991495 0.991898 0.992138", "0.991843 ± 0.000325"),
}


def p000(name: str, table=P000) -> dict[int, float]:
    return dict(zip(SEEDS_000, (float(x) for x in table[name][0].split())))


@pytest.mark.parametrize("name", sorted(P000))
def test_seed000_table3_arm_summaries(name):
    summary = summarize_arm(name, p000(name))
    mean, sd = numbers(P000[name][1])
    printed(summary.mean, mean)
    printed(summary.sd, sd)


def test_seed000_pair_tied_vs_untied():
    # "-0.000146 ± 0.000213 dev BPB; 95% t-interval [-0.000675, +0.000384]" (paper 000 §1, §5)
    contrast = paired_contrast(p000("pairtied"), p000("untied"))
    printed(contrast.mean_delta, "-0.000146")
    printed(contrast.sd_delta, "0.000213")
    assert abs(contrast.ci95[0] - -0.000675) <= CI_TOL and abs(contrast.ci95[1] - 0.000384) <= CI_TOL
    assert contrast.decision == INCONCLUSIVE  # "statistically unresolved"
    assert contrast.seeds_improved == 2


def test_seed000_hbieq_vs_turbo_dev_and_holdout():
    # "improves over Turbo-Muon on every seed by -0.000238, -0.000475, -0.000743 dev BPB
    # (-0.000485 ± 0.000253 dev / -0.000550 ± 0.000319 holdout)"
    dev = paired_contrast(p000("hbieq_bf16"), p000("turbo"))
    for delta, text in zip(dev.deltas, ("-0.000238", "-0.000475", "-0.000743")):
        printed(delta, text)
    printed(dev.mean_delta, "-0.000485")
    printed(dev.sd_delta, "0.000253")
    assert dev.seeds_improved == 3
    holdout = paired_contrast(p000("hbieq_bf16", P000_HOLDOUT), p000("turbo", P000_HOLDOUT))
    printed(holdout.mean_delta, "-0.000550")
    # 0.0003180 from the rounded inputs: each Δ carries up to 1e-6 of input rounding, which can
    # move a 3-seed SD by up to √3·1e-6/√2 = 1.2e-6, so this one is checked to ±1.5 digits.
    printed(holdout.sd_delta, "0.000319", units=1.5)
    for name in P000_HOLDOUT:
        summary = summarize_arm(name, p000(name, P000_HOLDOUT))
        mean, sd = numbers(P000_HOLDOUT[name][1])
        printed(summary.mean, mean)
        printed(summary.sd, sd)


def test_seed000_gains_over_baseline_and_the_sd_erratum():
    pair = paired_contrast(p000("pairtied"), p000("baseline"))
    printed(pair.mean_delta, "-0.001972")
    printed(pair.sd_delta, "0.000577")
    # Paper 000 prints "untied − baseline = −0.001826 ± 0.000496": the mean reproduces, the SD
    # does not. Its per-seed Δs (−0.001057, −0.001856, −0.002564) have sample SD 0.000754
    # (seed 000 §4.4 item 4 vs Table 3); we compute the SD the papers define and get 0.000754.
    untied = paired_contrast(p000("untied"), p000("baseline"))
    printed(untied.mean_delta, "-0.001826")
    printed(untied.sd_delta, "0.000754")


def test_seed000_two_seed_depth6_summaries():
    # "baseline 1.049088±0.003168 → weight-fused 1.046050±0.000599 (paired −0.003037±0.002569)
    #  → +HBiEq 1.045277±0.000451 (paired −0.000774±0.000148)" over seeds 42, 47
    base = {42: 1.046847, 47: 1.051328}
    fused = {42: 1.045627, 47: 1.046474}
    hbieq = {42: 1.044958, 47: 1.045596}
    for values, text in ((base, "1.049088 0.003168"), (fused, "1.046050 0.000599"),
                         (hbieq, "1.045277 0.000451")):
        summary = summarize_arm("d6", values)
        printed(summary.mean, text.split()[0])
        printed(summary.sd, text.split()[1])
    first, second = paired_contrast(fused, base), paired_contrast(hbieq, fused)
    printed(first.mean_delta, "-0.003037")
    printed(first.sd_delta, "0.002569")
    printed(second.mean_delta, "-0.000774")
    printed(second.sd_delta, "0.000148")
    assert first.estimable and first.n == 2  # df = 1: estimable, just very wide
    assert first.ci95[0] < 0 < first.ci95[1]


def test_seed000_attribution_ratio():
    printed(100 * retention_ratio(-0.002300, -0.002460), "93.5")  # exp03 / exp05 on seed 47


# ------------------------------------------------------------------ seed 003
def test_seed003_branch_tangent_three_seeds():
    # Table 1: ordinary vs branch tangent at seeds 46, 146, 246 (9 printed decimals);
    # "Branch-tangent mean difference over 3 seeds: +0.001660 (SD 0.001860)".
    ordinary = {46: 0.999626863, 146: 0.996706673, 246: 0.993173922}
    branch = {46: 0.999236148, 146: 0.999946279, 246: 0.995304070}
    contrast = paired_contrast(branch, ordinary)
    for delta, text in zip(contrast.deltas, ("-0.000390715", "+0.003239606", "+0.002130148")):
        printed(delta, text)
    printed(contrast.mean_delta, "0.001660")
    printed(contrast.sd_delta, "0.001860")
    assert contrast.seeds_improved == 1
    assert contrast.decision == INCONCLUSIVE  # "reject a reproducible improvement claim"


def test_seed003_preregistered_threshold_rule():
    # "The state gate misses the 0.0005 rule by 0.000047077 BPB and beats the branch control
    # by only 0.000198503": a single-seed Δ judged by the threshold alone.
    state, branch, ordinary = 0.992720999, 0.992919502, 0.993173922
    delta = state - ordinary
    printed(delta, "-0.000452923")
    printed(0.0005 + delta, "0.000047077")
    printed(state - branch, "-0.000198503")
    rule = DecisionRule(threshold=0.0005, kind="threshold")
    assert rule.decide(delta, None) == INCONCLUSIVE
    assert rule.decide(-0.0005, None) == IMPROVES
    # As a contrast, one seed is not estimable: no SD, no interval, no decision.
    single = contrast_from_deltas({246: delta})
    assert not single.estimable and single.decision == NOT_ESTIMABLE
    assert single.mean_delta is None and single.ci95 is None and single.seeds_improved is None
    assert "not estimable" in single.reason


# ------------------------------------------------------------------ decision rule
def test_decision_rule_kinds():
    ci_excludes = (-0.0009, -0.0001)
    rule = DecisionRule(0.0005)
    assert rule.decide(-0.0005, ci_excludes) == IMPROVES
    assert rule.decide(-0.0004, (-0.0006, -0.0002)) == INCONCLUSIVE  # reliable but below θ
    assert rule.decide(-0.0008, (-0.002, 0.0004)) == INCONCLUSIVE  # big but CI spans 0
    assert rule.decide(0.0008, (0.0002, 0.0014)) == WORSE
    assert DecisionRule(0.0005, "ci").decide(-0.0004, (-0.0006, -0.0002)) == IMPROVES
    assert DecisionRule(0.0005, "threshold").decide(-0.0008, (-0.002, 0.0004)) == IMPROVES
    higher = DecisionRule(1.0, higher_is_better=True)
    assert higher.decide(5.0, (2.0, 8.0)) == IMPROVES and higher.improved(0.1)
    with pytest.raises(UsageError):
        DecisionRule(kind="vibes")
    with pytest.raises(UsageError):
        DecisionRule(threshold=-1)
    assert "θ = 0.0005" in rule.describe()


def test_non_finite_values_are_rejected():
    with pytest.raises(UsageError, match="non-finite"):
        summarize_arm("a", {1: float("nan")})


# ------------------------------------------------------------------ properties
finite = st.floats(min_value=-10, max_value=10, allow_nan=False, allow_infinity=False)
seed_values = st.dictionaries(st.integers(0, 10_000), finite, min_size=2, max_size=12)


@settings(deadline=None)
@given(seed_values)
def test_ci_contains_the_mean_and_is_symmetric(deltas):
    c = contrast_from_deltas(deltas)
    lo, hi = c.ci95
    assert lo <= c.mean_delta <= hi
    assert math.isclose(c.mean_delta - lo, hi - c.mean_delta, rel_tol=1e-9, abs_tol=1e-12)
    assert c.n == len(deltas) and 0 <= c.seeds_improved <= c.n


@settings(max_examples=50, deadline=None)
@given(st.lists(finite, min_size=2, max_size=6).filter(lambda v: max(v) - min(v) > 1e-3))
def test_ci_shrinks_as_the_same_values_repeat(values):
    widths = []
    for copies in (1, 2, 3, 5):
        repeated = {i: v for i, v in enumerate(values * copies)}
        lo, hi = contrast_from_deltas(repeated).ci95
        widths.append(hi - lo)
    assert all(a > b for a, b in zip(widths, widths[1:]))


@settings(deadline=None)
@given(st.floats(0.001, 1.0), st.integers(2, 50))
def test_t_interval_width_shrinks_with_n_at_fixed_sd(sd, n):
    w1 = t_interval(0.0, sd, n)
    w2 = t_interval(0.0, sd, n + 1)
    assert w2[1] - w2[0] < w1[1] - w1[0]


@settings(deadline=None)
@given(seed_values)
def test_arm_against_itself_is_zero(values):
    c = paired_contrast(values, values)
    assert c.mean_delta == 0 and c.sd_delta == 0 and c.seeds_improved == 0
    assert c.ci95 == (0.0, 0.0) and c.decision == INCONCLUSIVE


@settings(deadline=None)
@given(seed_values, st.floats(0.001, 1.0))
def test_sign_conventions(reference, gain):
    lower = {s: v - gain for s, v in reference.items()}  # the arm is better on every seed
    c = paired_contrast(lower, reference)
    assert c.mean_delta < 0 and c.seeds_improved == c.n
    swapped = paired_contrast(reference, lower)
    assert swapped.seeds_improved == 0
    assert math.isclose(swapped.mean_delta, -c.mean_delta, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(swapped.ci95[0], -c.ci95[1], rel_tol=1e-9, abs_tol=1e-12)


@settings(deadline=None)
@given(seed_values, seed_values, st.dictionaries(st.integers(0, 10_000), finite))
def test_paired_contrast_ignores_shared_seed_effects(arm_values, ref_values, shift):
    # The paired design removes anything a seed does to both arms alike (seed 002 §2.2).
    common = set(arm_values) & set(ref_values)
    shifted = [{s: v + shift.get(s, 0.0) for s, v in x.items()} for x in (arm_values, ref_values)]
    a, b = paired_contrast(arm_values, ref_values), paired_contrast(*shifted)
    assert a.seeds == b.seeds == tuple(sorted(common))
    for x, y in zip(a.deltas, b.deltas):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)


def test_unpaired_seeds_leave_a_contrast_not_estimable():
    c = paired_contrast({1: 1.0, 2: 1.1}, {2: 1.0, 3: 1.2})
    assert c.n == 1 and not c.estimable and c.decision == NOT_ESTIMABLE
    d = c.to_dict()
    assert set(d) == {"n", "mean_delta", "sd_delta", "ci95", "t_stat", "df", "p_value", "seeds_improved",
                      "decision", "seeds", "deltas", "estimable", "reason"}
    assert d["ci95"] is None and d["mean_delta"] is None and d["p_value"] is None and d["df"] is None


# ------------------------------------------------------------------ against scipy
def _paired_sample(n: int, seed: int) -> tuple[dict[int, float], dict[int, float]]:
    rng = np.random.default_rng(1000 + seed)
    reference = rng.normal(1.0, 0.002, n)
    arm = reference + rng.normal(-0.0006, 0.0009, n)  # a small, noisy gain, as in the papers
    seeds = rng.choice(10_000, size=n, replace=False).tolist()
    return dict(zip(seeds, arm.tolist())), dict(zip(seeds, reference.tolist()))


@pytest.mark.parametrize("n", range(2, 11))
@pytest.mark.parametrize("draw", range(3))
def test_paired_contrast_is_scipys_paired_t_test(n, draw):
    arm, reference = _paired_sample(n, 17 * n + draw)
    seeds = sorted(arm)
    a = np.array([arm[s] for s in seeds])
    b = np.array([reference[s] for s in seeds])
    c = paired_contrast(arm, reference)
    ref = scipy_stats.ttest_rel(a, b)  # two-sided by default
    assert c.n == n and c.df == ref.df == n - 1
    assert c.t_stat == pytest.approx(float(ref.statistic), rel=1e-9)
    assert c.p_value == pytest.approx(float(ref.pvalue), rel=1e-9, abs=1e-300)
    lo, hi = ref.confidence_interval(0.95)
    assert c.ci95 == pytest.approx((float(lo), float(hi)), rel=1e-9, abs=1e-15)
    assert c.mean_delta == pytest.approx(float(np.mean(a - b)), rel=1e-12, abs=1e-18)
    assert c.sd_delta == pytest.approx(float(np.std(a - b, ddof=1)), rel=1e-9)
    assert t_quantile(n) == pytest.approx(float(scipy_stats.t.ppf(0.975, n - 1)), rel=1e-12)
    assert c.to_dict()["p_value"] == c.p_value and c.to_dict()["df"] == n - 1


@pytest.mark.parametrize("n", range(2, 11))
def test_difference_of_differences_is_scipys_one_sample_t_test(n):
    rng = np.random.default_rng(n)
    seeds = list(range(40, 40 + n))
    arms = [dict(zip(seeds, (1.0 + rng.normal(0, 0.002, n)).tolist())) for _ in range(4)]
    c = difference_of_differences(*arms)
    per_seed = np.array([(arms[0][s] - arms[1][s]) - (arms[2][s] - arms[3][s]) for s in seeds])
    one = scipy_stats.ttest_1samp(per_seed, 0.0)
    # and the same as a paired test of the two contrasts against each other
    rel = scipy_stats.ttest_rel(np.array([arms[0][s] - arms[1][s] for s in seeds]),
                                np.array([arms[2][s] - arms[3][s] for s in seeds]))
    for ref in (one, rel):
        assert c.t_stat == pytest.approx(float(ref.statistic), rel=1e-8)
        assert c.p_value == pytest.approx(float(ref.pvalue), rel=1e-8, abs=1e-300)
    lo, hi = one.confidence_interval(0.95)
    assert c.ci95 == pytest.approx((float(lo), float(hi)), rel=1e-9, abs=1e-15)
    assert list(c.deltas) == pytest.approx(per_seed.tolist(), abs=1e-15)


def test_seed002_dod_oe_joint_p_value_matches_scipy():
    # Table 3 row 11, d6 held-out: +0.001670 ± 0.000906 [−0.000581, +0.003921]
    codes = ("12", "10", "02", "00")
    c = difference_of_differences(*(arm("d6", code, "ho") for code in codes))
    check_cell(c, TABLE3[11][2])
    per_seed = [(arm("d6", "12", "ho")[s] - arm("d6", "10", "ho")[s])
                - (arm("d6", "02", "ho")[s] - arm("d6", "00", "ho")[s]) for s in SEEDS_002]
    assert c.p_value == pytest.approx(float(scipy_stats.ttest_1samp(per_seed, 0.0).pvalue), rel=1e-9)
    assert 0.05 < c.p_value < 1  # its CI spans 0, so p > 0.05


def test_p_value_when_the_deltas_have_no_spread():
    constant = contrast_from_deltas({1: 0.001, 2: 0.001, 3: 0.001})
    assert constant.p_value == 0.0 and constant.t_stat is None  # t is infinite; scipy says p = 0
    zero = contrast_from_deltas({1: 0.0, 2: 0.0})
    assert zero.p_value is None and zero.t_stat is None  # scipy: nan


# ------------------------------------------------------------------ retention, single seed
def test_retention_of_four_arms_is_the_papers_ratio_over_shared_seeds():
    # Table 3: Opt|OE (11 − 10) retains 48.6 % of Opt|Dense (01 − 00), d6 held-out
    r = retention(*(arm("d6", code, "ho") for code in ("11", "10", "01", "00")))
    printed(100 * r.ratio, "48.6")
    assert r.conditional.n == r.reference.n == 3 and r.to_dict()["percent"] == pytest.approx(100 * r.ratio)
    # a seed missing from one arm leaves both contrasts on the seeds all four share
    partial = dict(arm("d6", "11", "ho"))
    del partial[47]
    r2 = retention(partial, *(arm("d6", code, "ho") for code in ("10", "01", "00")))
    expected = (np.mean([partial[s] - arm("d6", "10", "ho")[s] for s in (41, 42)])
                / np.mean([arm("d6", "01", "ho")[s] - arm("d6", "00", "ho")[s] for s in (41, 42)]))
    assert r2.conditional.seeds == r2.reference.seeds == (41, 42)
    assert r2.ratio == pytest.approx(float(expected), rel=1e-12)
    none = retention({1: 1.0}, {1: 1.0}, {1: 1.0}, {1: 1.0})
    assert none.ratio is None and "mean Δ is 0" in none.reason
    assert retention({1: 1.0}, {1: 1.0}, {2: 1.0}, {2: 1.0}).reason == "no seed has all four arms"


def test_seed003_single_seed_gate_decisions():
    # Seed 003, seed 246: "The state gate misses the 0.0005 rule by 0.000047077 BPB and beats
    # the branch control by only 0.000198503"; the branch gate is −0.000254420 vs ordinary.
    ordinary, state, branch = {246: 0.993173922}, {246: 0.992720999}, {246: 0.992919502}
    rule = DecisionRule(0.0005)  # whatever the multi-seed kind, one seed is judged by θ alone
    d = single_seed_decision(state, ordinary, rule=rule)
    assert d.seed == 246 and d.decision == INCONCLUSIVE
    printed(d.delta, "-0.000452923")
    printed(-d.margin, "0.000047077")
    assert d.describe() == "misses θ = 0.0005 by 0.000047077"
    printed(single_seed_decision(branch, ordinary).delta, "-0.000254420")
    printed(single_seed_decision(state, branch).delta, "-0.000198503")
    assert single_seed_decision(branch, ordinary).decision == INCONCLUSIVE
    clears = single_seed_decision({246: 0.9924}, ordinary, rule=rule)  # Δ = −0.000773922
    assert clears.decision == IMPROVES and clears.describe().startswith("clears θ = 0.0005 by 0.000273922")
    worse = single_seed_decision({246: 0.9940}, ordinary, rule=rule)  # Δ = +0.000826078
    assert worse.decision == WORSE and worse.describe() == "worse than θ = 0.0005 by 0.000326078"
    assert "seed 003" in d.to_dict()["rule"] and d.to_dict()["text"] == d.describe()


def test_single_seed_decision_needs_one_named_or_shared_seed():
    a, b = {1: 1.0, 2: 1.1, 3: 1.2}, {1: 1.0, 2: 1.0}
    several = single_seed_decision(a, b)
    assert several.decision == NOT_ESTIMABLE and "2 paired seeds (1, 2)" in several.reason
    assert single_seed_decision(a, b, seed=2).delta == pytest.approx(0.1)
    missing = single_seed_decision(a, b, seed=3)
    assert missing.decision == NOT_ESTIMABLE and "seed 3 does not have both arms" in missing.reason
    assert single_seed_decision({1: 1.0}, {2: 1.0}).reason == "no seed has both arms"
