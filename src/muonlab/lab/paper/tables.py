"""The seed papers' result tables, shipped as data in each paper's pack (`muonlab/papers/<seed>/tables.json`),
typed from the papers.

A table: an id, where it is printed (`source`), the ledger metric it reports, the preset that is the
paper's protocol, where it compares when not at the end (`at_tokens`, with `at_source`), its arms (each either per-seed values {"43": v, ...} or a printed mean over n seeds,
{"mean": v, "n": 3}, where the paper gives no per-seed numbers), the contrasts the paper printed
(gain = baseline - arm, as the papers state gains, the paired t-test's p, the 95% t-interval, k/n and the
paper's conclusion where printed), its decision rule (`rules.py`), and the
numbers it derives from two contrasts (differences of differences, retention ratios, effect shares).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from muonlab.errors import UsageError
from muonlab.lab.paper.rules import check_rule


@dataclass(frozen=True)
class PaperArm:
    arm: str
    values: dict[int, float]  # per seed; empty when the paper prints only a mean
    mean: float | None = None
    n: int | None = None
    sd: float | None = None  # the SD printed beside a mean

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self.values)

    @property
    def run_seeds(self) -> tuple[int, ...]:
        """The seeds to run and score: the paper's, or (a printed mean only) the arm's registered seeds."""
        from muonlab.arms import get_arm

        return self.seeds or get_arm(self.arm).seeds


@dataclass(frozen=True)
class PrintedContrast:
    arm: str
    baseline: str
    gain: float | None = None  # baseline - arm, as printed
    p: float | None = None
    ci: tuple[float, float] | None = None  # the printed 95% t-interval of Δ = arm - baseline
    k: tuple[int, int] | None = None  # the printed "k/n" seeds improved
    # what the paper concludes: "excludes_zero" / "spans_zero" (its interval), "not_significant" (in words)
    decision: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class DerivedRow:
    """A printed number derived from two paired contrasts A - B and C - D over seeds: a difference of
    differences (the mean of (A - B) - (C - D) per seed: seed 002 Table 3 rows 9-11, 5b E, 7 row 6) or a
    ratio of mean effects (mean(A - B) / mean(C - D): seed 002's retention ratios, seed 000 Table 2's
    effect shares)."""

    kind: str  # "dod" | "ratio"
    name: str
    first: tuple[str, str]  # (A, B)
    second: tuple[str, str]  # (C, D)
    printed: float
    source: str = ""


@dataclass(frozen=True)
class PaperTable:
    id: str
    paper: str
    source: str
    metric: str
    preset: str
    arms: tuple[PaperArm, ...]
    contrasts: tuple[PrintedContrast, ...] = field(default=())
    # where the paper compares, when not at the end of training (seed 004: the last scheduled
    # evaluation before its budget), in training tokens, and where the paper says so
    at_tokens: int | None = None
    at_source: str | None = None
    # the paper's decision rule for its contrasts (muonlab.lab.paper.rules), with where the paper states it
    rule: str = "descriptive"
    rule_source: str | None = None
    derived: tuple[DerivedRow, ...] = field(default=())
    # settings on top of the preset that make the table's protocol (seed 004's long-horizon continuations:
    # the Table-1 arms trained to 12,207 or 19,042 steps); the command line's settings win over them
    settings: dict = field(default_factory=dict)
    # what muonlab chose where the paper is silent, printed beside the table (the paper's, then the table's own)
    choices: tuple[str, ...] = field(default=())

    def arm(self, name: str) -> PaperArm:
        return next(a for a in self.arms if a.arm == name)


def _table(paper: str, raw: dict, choices: tuple[str, ...] = ()) -> PaperTable:
    arms = []
    for name, entry in raw["arms"].items():
        if "mean" in entry:
            arms.append(PaperArm(name, {}, float(entry["mean"]), int(entry["n"]),
                                 float(entry["sd"]) if "sd" in entry else None))
        else:
            arms.append(PaperArm(name, {int(s): float(v) for s, v in entry.items()}))
    contrasts = tuple(PrintedContrast(c["arm"], c["baseline"], c.get("printed_gain"), c.get("printed_p"),
                                      tuple(c["printed_ci"]) if "printed_ci" in c else None,
                                      tuple(c["printed_k"]) if "printed_k" in c else None,
                                      c.get("printed_decision"), c.get("printed_source"))
                      for c in raw.get("contrasts", ()))
    check_rule(raw["rule"], f"table {raw['id']}")
    derived = []
    for d in raw.get("derived", ()):
        (a, b), (c, e) = (tuple(term.split(":")) for term in d["terms"])
        if d["kind"] not in ("dod", "ratio"):
            raise ValueError(f"{raw['id']}: derived row kind {d['kind']!r}")
        derived.append(DerivedRow(d["kind"], d["name"], (a, b), (c, e), float(d["printed"]), d.get("source", "")))
    return PaperTable(raw["id"], paper, raw["source"], raw["metric"], raw["preset"], tuple(arms), contrasts,
                      raw.get("at_tokens"), raw.get("at_source"), raw["rule"], raw.get("rule_source"),
                      tuple(derived), dict(raw.get("settings", {})), choices + tuple(raw.get("choices", ())))


def load_tables() -> dict[str, PaperTable]:
    """Every table of every registered paper pack (muonlab.papers), by id."""
    from muonlab.arms import all_packs  # noqa: PLC0415

    out: dict[str, PaperTable] = {}
    for pack in sorted(all_packs().values(), key=lambda p: p.name):
        if pack.tables is not None:
            raw = json.loads(pack.tables.read_text())
            for t in raw["tables"]:
                out[t["id"]] = _table(raw["paper"], t, tuple(raw.get("choices", ())))
    return out


def select_tables(ids: list[str] | None = None) -> list[PaperTable]:
    tables = load_tables()
    if not ids:
        return list(tables.values())
    unknown = [i for i in ids if i not in tables]
    if unknown:
        raise UsageError(f"unknown paper table {unknown[0]!r}; `muonlab paper tables` lists them")
    return [tables[i] for i in ids]
