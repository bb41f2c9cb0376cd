"""Paired multi-seed statistics of the seed papers: per-arm mean ± SD, paired deltas with
95% t-intervals and two-sided p-values, difference-of-differences, retention ratios, a
preregistered decision, and seed 003's single-seed threshold decision.

Protocol (seed 002 §4.1, §5 item 1, seed 000 §4.4 item 4, seed 003 "Experimental protocol"):
- per arm: mean ± *sample* SD (ddof = 1) over seeds;
- per seed, paired Δ = arm − reference (negative = lower BPB = better), then mean ± SD of the
  Δs and the descriptive 95% t-interval mean ± t_{0.975, n−1}·SD/√n (t_{0.975,2} = 4.302653);
  no multiplicity adjustment;
- "k/n improved" = number of seeds with Δ < 0;
- two-sided p-value of the paired t-test beside each interval: t = mean/(SD/√n) on n − 1 df
  (the same test as scipy.stats.ttest_rel / ttest_1samp); descriptive, like the interval;
- difference-of-differences per seed (a − b) − (c − d), summarised the same way;
- descriptive retention ratio = mean conditional Δ / mean reference Δ (e.g. 48.6 %), both
  over the seeds all four arms share;
- a contrast with fewer than 2 paired seeds has no SD and no interval: it is *not estimable*;
- seed 003's preregistered gate rule judges a *single* seed's Δ against the threshold θ alone
  ("a decision threshold, not a confidence interval"): `single_seed_decision`.

Functions are pure: values come in as `{seed: value}` mappings, results go out as frozen
dataclasses whose `to_dict()` is JSON-ready (None where a number does not exist, never NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from muonlab.errors import UsageError
from muonlab.optional import require

CI_LEVEL = 0.95

# Decision outcomes.
IMPROVES, WORSE, INCONCLUSIVE, NOT_ESTIMABLE = "improves", "worse", "inconclusive", "not estimable"

RULE_KINDS = {
    # Default: both papers' conditions at once. Seed 002 calls a contrast "significant" only if
    # its 2-df CI excludes 0 (seed 002 §4.1, §5 item 1); seed 003 preregisters a practical separation of
    # 0.0005 BPB that the mean effect must reach ("a decision threshold, not a confidence
    # interval"; its state gate at -0.000453 "misses the 0.0005 rule").
    "ci+threshold": "improves if the CI upper bound < 0 and mean Δ ≤ −θ; worse if the CI lower "
                    "bound > 0 and mean Δ ≥ +θ; otherwise inconclusive",
    # Seed 002 alone: the CI must exclude zero.
    "ci": "improves if the CI upper bound < 0; worse if the CI lower bound > 0; otherwise inconclusive",
    # Seed 003 alone: the practical threshold on the mean, without a CI.
    "threshold": "improves if mean Δ ≤ −θ; worse if mean Δ ≥ +θ; otherwise inconclusive",
}


def _t_distribution():
    """scipy's Student t (optional: only the intervals and p-values of a report need it)."""
    return require("scipy.stats", "t-intervals and p-values").t


def t_quantile(n: int, level: float = CI_LEVEL) -> float:
    """Two-sided Student-t quantile t_{(1+level)/2, n−1}; 4.302653 for n = 3 at 95%."""
    if n < 2:
        raise ValueError(f"a t-interval needs n >= 2, got {n}")
    return float(_t_distribution().ppf(0.5 + level / 2, n - 1))


def t_interval(mean: float, sd: float, n: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """mean ± t_{(1+level)/2, n−1}·sd/√n (seed 002 §4.1)."""
    half = t_quantile(n, level) * sd / math.sqrt(n)
    return (mean - half, mean + half)


def paired_t_test(mean: float, sd: float, n: int) -> tuple[float | None, float | None]:
    """(t, two-sided p) of H0: mean Δ = 0 from n paired Δs, t = mean/(sd/√n) on n − 1 df.

    With sd = 0 the t statistic is infinite: t is None (JSON has no inf) and p = 0 when the
    mean is not zero; both are None when every Δ is 0 (scipy returns nan there).
    """
    if n < 2:
        raise ValueError(f"a t-test needs n >= 2, got {n}")
    if sd == 0:
        return None, (None if mean == 0 else 0.0)
    t = mean / (sd / math.sqrt(n))
    return float(t), float(2.0 * _t_distribution().sf(abs(t), n - 1))


def _sample_sd(values: np.ndarray) -> float | None:
    return float(np.std(values, ddof=1)) if values.size >= 2 else None


def _check_values(values: Mapping[int, float], what: str) -> dict[int, float]:
    out = {}
    for seed, value in values.items():
        value = float(value)
        if not math.isfinite(value):
            raise UsageError(f"{what}: seed {seed} has a non-finite value {value!r}")
        out[int(seed)] = value
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class DecisionRule:
    """How a contrast's mean Δ and 95% CI turn into improves / worse / inconclusive.

    `threshold` θ is in the metric's units (0.0005 BPB is seed 003's preregistered rule).
    `higher_is_better` flips the direction for metrics such as tokens_per_second; for BPB,
    CE and loss, lower is better and Δ < 0 is an improvement.
    """

    threshold: float = 0.0005
    kind: str = "ci+threshold"
    higher_is_better: bool = False

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise UsageError(f"decision rule must be one of {', '.join(RULE_KINDS)}, got {self.kind!r}")
        if not (self.threshold >= 0 and math.isfinite(self.threshold)):
            raise UsageError(f"threshold must be a finite number >= 0, got {self.threshold!r}")

    def describe(self) -> str:
        text = RULE_KINDS[self.kind]
        if self.kind != "ci":
            text += f" (θ = {self.threshold:g})"
        if self.higher_is_better:
            text += " (signs reversed: higher is better for this metric)"
        return text

    def decide(self, mean: float, ci: tuple[float, float] | None) -> str:
        # Work in "gain" units where negative is always good, so one rule serves both signs.
        s = -1.0 if self.higher_is_better else 1.0
        m = s * mean
        lo, hi = (None, None) if ci is None else sorted((s * ci[0], s * ci[1]))
        if self.kind != "threshold" and ci is None:
            raise ValueError(f"rule {self.kind!r} needs a confidence interval")
        ci_below = hi is not None and hi < 0
        ci_above = lo is not None and lo > 0
        if self.kind == "ci":
            return IMPROVES if ci_below else WORSE if ci_above else INCONCLUSIVE
        if self.kind == "threshold":
            return IMPROVES if m <= -self.threshold else WORSE if m >= self.threshold else INCONCLUSIVE
        if ci_below and m <= -self.threshold:
            return IMPROVES
        if ci_above and m >= self.threshold:
            return WORSE
        return INCONCLUSIVE

    def improved(self, delta: float) -> bool:
        """Does this seed's Δ point the good way ('k/n improved' counts Δ < 0 for BPB)?"""
        return delta > 0 if self.higher_is_better else delta < 0


# ---------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class ArmSummary:
    """One arm's metric over its seeds: n, mean, sample SD (None for n < 2), per-seed values."""

    arm: str
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    n: int
    mean: float | None
    sd: float | None

    def value_of(self, seed: int) -> float:
        return self.values[self.seeds.index(seed)]

    def as_mapping(self) -> dict[int, float]:
        return dict(zip(self.seeds, self.values))

    def to_dict(self) -> dict:
        return {"arm": self.arm, "n": self.n, "mean": self.mean, "sd": self.sd,
                "seeds": list(self.seeds), "values": list(self.values)}


def summarize_arm(arm: str, values: Mapping[int, float]) -> ArmSummary:
    """Mean ± sample SD (n−1) of one arm's per-seed values (seed 002 Table 2)."""
    checked = _check_values(values, f"arm {arm!r}")
    array = np.array(list(checked.values()), dtype=np.float64)
    mean = float(array.mean()) if array.size else None
    return ArmSummary(arm, tuple(checked), tuple(checked.values()), int(array.size), mean,
                      _sample_sd(array))


# ---------------------------------------------------------------------------- contrasts
@dataclass(frozen=True)
class Contrast:
    """A paired contrast over seeds: per-seed Δ, mean ± SD, 95% t-CI, k/n improved, decision.

    With fewer than 2 paired seeds it is not estimable: every number is None and `reason`
    says why (a single Δ has no spread, so no interval and no decision).
    """

    name: str
    seeds: tuple[int, ...]
    deltas: tuple[float, ...]
    n: int
    mean_delta: float | None
    sd_delta: float | None
    ci95: tuple[float, float] | None
    seeds_improved: int | None
    decision: str
    estimable: bool
    reason: str | None = None
    rule: DecisionRule = field(default_factory=DecisionRule)
    t_stat: float | None = None
    p_value: float | None = None  # two-sided paired t-test of mean Δ = 0

    @property
    def df(self) -> int | None:
        return self.n - 1 if self.estimable else None

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "mean_delta": self.mean_delta,
            "sd_delta": self.sd_delta,
            "ci95": list(self.ci95) if self.ci95 is not None else None,
            "t_stat": self.t_stat,
            "df": self.df,
            "p_value": self.p_value,
            "seeds_improved": self.seeds_improved,
            "decision": self.decision,
            "seeds": list(self.seeds),
            "deltas": list(self.deltas),
            "estimable": self.estimable,
            "reason": self.reason,
        }


def contrast_from_deltas(deltas: Mapping[int, float], name: str = "contrast",
                         rule: DecisionRule | None = None, level: float = CI_LEVEL) -> Contrast:
    """Summarise per-seed paired differences (seed 002 §4.1, Table 3): mean, SD, t-CI, p, k/n, decision."""
    rule = rule or DecisionRule()
    checked = _check_values(deltas, name)
    seeds, values = tuple(checked), tuple(checked.values())
    n = len(values)
    if n < 2:
        reason = (f"not estimable: {n} paired seed{'s' if n != 1 else ''}; a mean ± SD and "
                  f"a t-interval need at least 2")
        return Contrast(name, seeds, values, n, None, None, None, None, NOT_ESTIMABLE, False,
                        reason, rule)
    array = np.array(values, dtype=np.float64)
    mean, sd = float(array.mean()), float(np.std(array, ddof=1))
    ci = t_interval(mean, sd, n, level)
    improved = sum(rule.improved(v) for v in values)
    t, p = paired_t_test(mean, sd, n)
    return Contrast(name, seeds, values, n, mean, sd, ci, improved, rule.decide(mean, ci), True,
                    None, rule, t, p)


def paired_deltas(arm: Mapping[int, float], reference: Mapping[int, float]) -> dict[int, float]:
    """Δ = arm − reference for every seed both have (the paired design of seed 002 §2.2)."""
    common = sorted(set(arm) & set(reference))
    return {seed: float(arm[seed]) - float(reference[seed]) for seed in common}


def paired_contrast(arm: Mapping[int, float], reference: Mapping[int, float],
                    name: str = "arm - reference", rule: DecisionRule | None = None) -> Contrast:
    """Paired contrast of an arm against a reference arm over the seeds both have."""
    return contrast_from_deltas(paired_deltas(arm, reference), name, rule)


def difference_of_differences(a: Mapping[int, float], b: Mapping[int, float],
                              c: Mapping[int, float], d: Mapping[int, float],
                              name: str = "(a - b) - (c - d)",
                              rule: DecisionRule | None = None) -> Contrast:
    """Per seed (a − b) − (c − d) over seeds present in all four arms (seed 002 §4.1, Table 3 rows 9–11).

    E.g. DoD(OE×Opt) = (11 − 10) − (01 − 00): a = 11, b = 10, c = 01, d = 00.
    """
    common = sorted(set(a) & set(b) & set(c) & set(d))
    deltas = {s: (float(a[s]) - float(b[s])) - (float(c[s]) - float(d[s])) for s in common}
    return contrast_from_deltas(deltas, name, rule)


def retention_ratio(conditional: Contrast | float | None, reference: Contrast | float | None) -> float | None:
    """Descriptive ratio of mean effects, e.g. mean Δ(Opt|OE) / mean Δ(Opt|Dense) = 48.6 %.

    Both inputs carry sampling error, so this is descriptive only (seed 002 §4.1 item 2).
    None where either mean does not exist or the reference mean is zero.
    """
    num = conditional.mean_delta if isinstance(conditional, Contrast) else conditional
    den = reference.mean_delta if isinstance(reference, Contrast) else reference
    if num is None or den is None or den == 0 or not (math.isfinite(num) and math.isfinite(den)):
        return None
    return float(num) / float(den)


@dataclass(frozen=True)
class Retention:
    """Descriptive retention ratio mean(a − b) / mean(c − d) over the seeds all four arms share,
    e.g. Opt|OE (11 − 10) keeps 48.6 % of Opt|Dense (01 − 00) (seed 002 Table 3, §4.1 item 2).

    Both means carry sampling error, so there is no interval. The ratio exists from one shared
    seed on (seed 002 quotes single-seed ones: "s47 recovers 70.5 % of its QK regression").
    """

    name: str
    conditional: Contrast
    reference: Contrast
    ratio: float | None
    reason: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "ratio": self.ratio,
                "percent": None if self.ratio is None else 100.0 * self.ratio,
                "n": self.conditional.n, "seeds": list(self.conditional.seeds),
                "conditional": {"name": self.conditional.name, **self.conditional.to_dict()},
                "reference": {"name": self.reference.name, **self.reference.to_dict()},
                "conditional_mean": _mean(self.conditional.deltas),
                "reference_mean": _mean(self.reference.deltas), "reason": self.reason}


def _mean(values: tuple[float, ...]) -> float | None:
    return float(np.mean(values)) if values else None


def retention(a: Mapping[int, float], b: Mapping[int, float], c: Mapping[int, float],
              d: Mapping[int, float], name: str = "(a - b) / (c - d)",
              parts: tuple[str, str] = ("a - b", "c - d"), rule: DecisionRule | None = None) -> Retention:
    """Retention of the conditional contrast a − b relative to the reference c − d, both paired
    over the seeds present in all four arms (the seed set of a difference-of-differences)."""
    common = sorted(set(a) & set(b) & set(c) & set(d))
    conditional = paired_contrast({s: a[s] for s in common}, {s: b[s] for s in common}, parts[0], rule)
    reference = paired_contrast({s: c[s] for s in common}, {s: d[s] for s in common}, parts[1], rule)
    if not common:
        return Retention(name, conditional, reference, None, "no seed has all four arms")
    den = _mean(reference.deltas)
    if den == 0:
        return Retention(name, conditional, reference, None, "the reference contrast's mean Δ is 0")
    return Retention(name, conditional, reference, retention_ratio(_mean(conditional.deltas), den))


# ---------------------------------------------------------------------------- one seed
SINGLE_SEED_RULE = ("seed 003's preregistered single-seed rule: one seed's Δ against θ alone, a decision "
                    "threshold, not a confidence interval (improves if Δ ≤ −θ; worse if Δ ≥ +θ; otherwise "
                    "inconclusive)")


@dataclass(frozen=True)
class SingleSeedDecision:
    """One seed's paired Δ judged by the preregistered threshold alone (seed 003: the state gate's
    −0.000452923 "misses the 0.0005 rule by 0.000047077"). `margin` is how far the gain clears
    (> 0) or misses (< 0) θ; None with `reason` when the seed has no pair."""

    name: str
    seed: int | None
    delta: float | None
    threshold: float
    margin: float | None
    decision: str
    reason: str | None = None
    higher_is_better: bool = False

    def describe(self) -> str:
        if self.margin is None:
            return self.reason or NOT_ESTIMABLE
        if self.decision == WORSE:  # the loss beyond θ: gain = −(θ + excess)
            return f"worse than θ = {self.threshold:g} by {-self.margin - 2 * self.threshold:.9f}"
        verb = "clears" if self.margin >= 0 else "misses"
        return f"{verb} θ = {self.threshold:g} by {abs(self.margin):.9f}"

    def to_dict(self) -> dict:
        return {"name": self.name, "seed": self.seed, "delta": self.delta, "threshold": self.threshold,
                "margin": self.margin, "decision": self.decision, "reason": self.reason,
                "rule": SINGLE_SEED_RULE, "text": self.describe()}


def single_seed_decision(arm: Mapping[int, float], reference: Mapping[int, float], seed: int | None = None,
                         name: str = "arm - reference", rule: DecisionRule | None = None) -> SingleSeedDecision:
    """Seed 003's gate rule on Δ = arm − reference at `seed` (default: the one seed both have).

    Only `rule`'s threshold and direction are used: the kind is always "threshold", one seed
    having no spread. Several shared seeds and no `seed` named is not a single-seed decision.
    """
    rule = DecisionRule((rule or DecisionRule()).threshold, "threshold", (rule or DecisionRule()).higher_is_better)
    shared = sorted(set(arm) & set(reference))
    reason = None
    if seed is None and len(shared) != 1:
        reason = (f"{len(shared)} paired seeds ({', '.join(map(str, shared))}): name one with @SEED, or read the "
                  f"multi-seed contrast" if shared else "no seed has both arms")
    elif seed is not None and seed not in shared:
        reason = f"seed {seed} does not have both arms (paired seeds: {', '.join(map(str, shared)) or 'none'})"
    if reason:
        return SingleSeedDecision(name, seed, None, rule.threshold, None, NOT_ESTIMABLE, reason,
                                  rule.higher_is_better)
    seed = shared[0] if seed is None else seed
    delta = float(arm[seed]) - float(reference[seed])
    if not math.isfinite(delta):
        raise UsageError(f"{name}: seed {seed} has a non-finite Δ {delta!r}")
    gain = delta if rule.higher_is_better else -delta
    return SingleSeedDecision(name, seed, delta, rule.threshold, gain - rule.threshold,
                              rule.decide(delta, None), None, rule.higher_is_better)
