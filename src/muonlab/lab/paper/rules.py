"""The decision rules a paper table is judged by: each paper's own (`PaperTable.rule`), or the reader's
(`muonlab paper score --rule`).

- "ci": the paired 95% t-interval over seeds (n − 1 df) excludes zero. Seed 002 §5 item 1 separates "contrasts
  whose 2-df 95% t-intervals exclude zero" from those whose intervals span it, with no θ and no p; seed 000 §4.3
  and §5 item 4 resolve a contrast by the same interval ("includes zero ... statistically unresolved").
- "paired_t": seed 004 Appendix J's "paired two-sided t-test ... between AF-Muon and the strongest non-AF
  baseline". The paper states no level: muonlab decides at p < 0.05, which for a paired t-test is the 95%
  t-interval excluding zero, so the decision is the "ci" one and the p beside it is the paper's number.
- "single_seed": seed 003's preregistered rule for its single-seed gates: one seed's Δ against θ = 0.0005 BPB
  ("a decision threshold, not a confidence interval").
- "descriptive": the paper prints the numbers and tests nothing (one seed, or means and SDs only): the scorecard
  prints Δ, SD, CI, p and k/n where they exist, and decides nothing.
- "ci+threshold", "threshold": muonlab's stricter reading (the interval and θ together) and θ alone, for a
  reader who asks for them.
"""

from __future__ import annotations

from muonlab.errors import UsageError
from muonlab.lab.stats import RULE_KINDS, SINGLE_SEED_RULE, DecisionRule

RULES = {
    "ci": "the paired 95% t-interval over seeds excludes zero (no θ)",
    "paired_t": "two-sided paired t-test over seeds, decided at p < 0.05 (the paper states no level; for a paired "
                "t-test this is the 95% t-interval excluding zero)",
    "single_seed": SINGLE_SEED_RULE,
    "descriptive": "descriptive: the paper tests nothing; Δ, SD, CI, p and k/n are printed, nothing is decided",
    "ci+threshold": RULE_KINDS["ci+threshold"],
    "threshold": RULE_KINDS["threshold"],
}


def check_rule(name: str, where: str) -> str:
    if name not in RULES:
        raise UsageError(f"{where}: decision rule {name!r}; choose from {', '.join(RULES)}")
    return name


def decision_rule(name: str, threshold: float) -> DecisionRule | None:
    """The statistics' rule for a paired multi-seed contrast under `name` (None: nothing is decided)."""
    if name == "descriptive":
        return None
    kind = {"ci": "ci", "paired_t": "ci", "single_seed": "threshold"}.get(name, name)
    return DecisionRule(threshold=threshold, kind=kind)


def describe(name: str, threshold: float, source: str | None = None) -> str:
    text = RULES[name]
    if name in ("single_seed", "ci+threshold", "threshold"):
        text += f", θ = {threshold:g}"
    return text + (f" ({source})" if source else "")
