"""The seed papers' result tables, shipped as data (`data/<seed>.json`), typed from the papers.

A table: an id, where it is printed (`source`), the ledger metric it reports, the preset that is the
paper's protocol, where it compares when not at the end (`at_tokens`, with `at_source`), its arms (each either per-seed values {"43": v, ...} or a printed mean over n seeds,
{"mean": v, "n": 3}, where the paper gives no per-seed numbers), and the contrasts the paper printed
(gain = baseline - arm, as the papers state gains, and the paired t-test's p where printed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

from muonlab.errors import UsageError


@dataclass(frozen=True)
class PaperArm:
    arm: str
    values: dict[int, float]  # per seed; empty when the paper prints only a mean
    mean: float | None = None
    n: int | None = None

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
    # the paper's decision rule for its contrasts: the paired t-test over seeds (the report's rule), or
    # seed 003's preregistered single-seed threshold ("single_seed"), with where the paper states it
    rule: str = "paired"
    rule_source: str | None = None

    def arm(self, name: str) -> PaperArm:
        return next(a for a in self.arms if a.arm == name)


def _table(paper: str, raw: dict) -> PaperTable:
    arms = []
    for name, entry in raw["arms"].items():
        if "mean" in entry:
            arms.append(PaperArm(name, {}, float(entry["mean"]), int(entry["n"])))
        else:
            arms.append(PaperArm(name, {int(s): float(v) for s, v in entry.items()}))
    contrasts = tuple(PrintedContrast(c["arm"], c["baseline"], c.get("printed_gain"), c.get("printed_p"))
                      for c in raw.get("contrasts", ()))
    return PaperTable(raw["id"], paper, raw["source"], raw["metric"], raw["preset"], tuple(arms), contrasts,
                      raw.get("at_tokens"), raw.get("at_source"), raw.get("rule", "paired"), raw.get("rule_source"))


def load_tables() -> dict[str, PaperTable]:
    """Every table of every shipped paper file, by id."""
    out: dict[str, PaperTable] = {}
    for item in sorted(resources.files("muonlab.lab.paper").joinpath("data").iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            raw = json.loads(item.read_text())
            for t in raw["tables"]:
                out[t["id"]] = _table(raw["paper"], t)
    return out


def select_tables(ids: list[str] | None = None) -> list[PaperTable]:
    tables = load_tables()
    if not ids:
        return list(tables.values())
    unknown = [i for i in ids if i not in tables]
    if unknown:
        raise UsageError(f"unknown paper table {unknown[0]!r}; `muonlab paper tables` lists them")
    return [tables[i] for i in ids]
