"""What `muonlab paper run TABLE` runs, and what `paper score` reads: the table's run set under its protocol.

The run set is the paper's: each arm at the seeds the paper printed for it, no more (`full_grid` asks for every
arm at every seed of the table). The protocol is the table's preset and settings, or another preset the user
names, or the table's **miniature**: the same runs at a CPU scale that keeps the protocol's structure, so a
table can be produced end to end on a laptop before it costs GPU-hours:

- the family's CPU preset of the same data kind stands in for the paper's model and data (`STAND_INS`);
- every duration in steps (the run's length, its periodic evaluation, the momentum warmup) is divided by one
  factor D per table, so the comparison point stays at the same fraction of each run and a periodic evaluation
  falls on it (D divides every arm's comparison step and evaluation interval);
- the stand-in's batch is the table's smallest, and each arm's batch keeps its ratio to it (seed 004 K.5's batches
  of 32..512 sequences stay 1 : 16), as do the ratios of what an arm sizes against the paper's preset (K.2's
  vocabularies, K.4's widths) or against its vocabulary (seed 002's Over-Encoding tables: 150,855 rows for
  8,192 tokens, ~18.4 rows a token, are ~5,500 rows for the stand-in's 300).

muonlab's choices where nothing fixes them: D makes the longest run of a table about `MINI_STEPS` steps and no
run shorter than `MIN_STEPS`; text tables run on the synthetic text with a BPE trained on it, whatever the
paper's tokenizer (a stand-in's data is the CPU preset's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from muonlab.errors import UsageError
from muonlab.lab.paper.tables import PaperTable

# the paper preset -> (the CPU preset of its family and data kind, settings that keep apart what the paper's
# presets keep apart: seed 002's depth-6 and depth-8 protocols stay two depths)
STAND_INS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpu-d6": ("cpu-tiny", {"model.depth": 3}),
    "gpu-d8": ("cpu-tiny", {"model.depth": 4}),
    "nanogpt-124m": ("tied-cpu", {}),
    "nanogpt-124m-moe": ("tied-moe-cpu", {}),
    "smollm2-135m": ("hf-cpu", {}),
    "llama-3.2-1b": ("hf-cpu", {}),
    "qwen2.5-0.5b": ("qwen2.5-cpu", {}),
    "protein-llama": ("protein-cpu", {}),
    "t5-small": ("t5-cpu", {}),
    "t5gemma2": ("t5gemma2-cpu", {}),
    "imagegpt": ("imagegpt-cpu", {}),
    "reuse-k9": ("reuse-cpu", {}),
}
MINI_STEPS = 40  # about the longest run of a miniature table (paper --miniature-steps)
MIN_STEPS = 4  # no miniature run shorter
# durations in optimizer steps, divided by the table's factor (the run's own length comes first)
STEP_KEYS = ("train.num_steps", "train.eval_every", "optim.muon_momentum_warmup_steps")
SHAPE_KEYS = ("train.sequence_len", "train.device_batch_size", "train.total_batch_size", "train.eval_tokens")


@dataclass(frozen=True)
class ArmRuns:
    """One arm's runs of a table: its seeds, the settings on top of the preset, where it is compared."""

    arm: str
    seeds: tuple[int, ...]
    overrides: dict[str, Any]
    at_tokens: int | None  # the comparison point in training tokens (None: the end of the run)


@dataclass(frozen=True)
class TablePlan:
    table: PaperTable
    preset: str
    arms: tuple[ArmRuns, ...]
    given: dict[str, Any] = field(default_factory=dict)  # the command line's settings
    miniature: bool = False
    scale: int | None = None  # the miniature's step factor D
    differs: bool = False  # the runs' protocol is not the paper's (another preset, settings, or the miniature)

    def seeds(self) -> dict[str, tuple[int, ...]]:
        return {a.arm: a.seeds for a in self.arms}

    def arm(self, name: str) -> ArmRuns:
        return next(a for a in self.arms if a.arm == name)

    def runs(self) -> int:
        return sum(len(a.seeds) for a in self.arms)

    def describe(self) -> str:
        if self.miniature:
            rows = sorted({a.overrides["model.oe.m"] for a in self.arms if "model.oe.m" in a.overrides})
            tables = f"Over-Encoding tables of {', '.join(f'{m:,}' for m in rows)} rows, " if rows else ""
            return (f"miniature of {self.table.preset}: preset {self.preset}, every duration in steps / {self.scale}, "
                    f"{tables}{self.runs()} run(s)")
        return f"preset {self.preset}, {self.runs()} run(s)"


def run_seeds(table: PaperTable, full_grid: bool = False) -> dict[str, tuple[int, ...]]:
    """The seeds each arm runs: the paper's (its printed per-seed values, or the arm's registered seeds where it
    prints only a mean over them); with `full_grid`, every seed of the table for every arm."""
    seeds = {a.arm: tuple(a.run_seeds) for a in table.arms}
    if full_grid:
        every = tuple(sorted({s for run in seeds.values() for s in run}))
        seeds = {arm: every for arm in seeds}
    return seeds


def table_plan(table: PaperTable, preset: str | None = None, given: dict[str, Any] | None = None,
               full_grid: bool = False, miniature: bool = False, miniature_steps: int | None = None) -> TablePlan:
    """The table's runs under its own protocol (or `preset`), or its miniature (its longest run about
    `miniature_steps` steps, default MINI_STEPS)."""
    given = dict(given or {})
    seeds = run_seeds(table, full_grid)
    if miniature_steps is not None and not miniature:
        raise UsageError("--miniature-steps sizes the miniature: add --miniature")
    if miniature:
        if preset is not None:
            raise UsageError("--miniature picks the CPU preset of the table's family itself: drop --preset")
        return _miniature(table, seeds, given, miniature_steps or MINI_STEPS)
    preset = preset or table.preset
    # the comparison point is the paper protocol's; under another preset the runs are read at their end
    at = table.at_tokens if preset == table.preset else None
    arms = tuple(ArmRuns(arm, run, {**table.settings, **given}, at) for arm, run in seeds.items())
    differs = preset != table.preset or any(_protocol(a.arm, preset, a.overrides) != _protocol(a.arm, table.preset,
                                                                                               table.settings)
                                            for a in arms)
    if preset != table.preset:
        _check_same_kind(table, preset)
    return TablePlan(table, preset, arms, given, differs=differs)


def _protocol(arm: str, preset: str, overrides: dict[str, Any]) -> str | None:
    from muonlab.arms import resolve_config  # noqa: PLC0415

    try:
        return resolve_config(arm, preset, overrides).protocol_id()
    except UsageError:
        return None


def data_kind(source: str) -> str:
    """What a data source holds: protein sequences, images, or text (whatever its tokenizer)."""
    return {"fasta": "protein", "synthetic_protein": "protein", "images": "images",
            "synthetic_images": "images"}.get(source, "text")


def _check_same_kind(table: PaperTable, preset: str) -> None:
    """A table is scored by runs of its own family and data kind only (a text GPT is no protein model)."""
    from muonlab.config import all_presets, build_config  # noqa: PLC0415

    presets = all_presets()
    if preset not in presets:
        raise UsageError(f"unknown preset {preset!r}; choose from {', '.join(presets)}")
    paper, other = (build_config([("preset", presets[p])]) for p in (table.preset, preset))
    for what, mine, theirs in (("family", paper.family, other.family),
                               ("data", data_kind(paper.data.source), data_kind(other.data.source))):
        if mine != theirs:
            raise UsageError(f"table {table.id} is a {mine} table ({what} of preset {table.preset}); preset {preset} "
                             f"runs {theirs}: name a preset of the table's {what}, or --miniature")


# ---------------------------------------------------------------------------- evaluation points
def evaluation_tokens(cfg) -> set[int]:
    """The training-token counts at which a run of `cfg` evaluates val: after every periodic evaluation and at
    its end (the final evaluation)."""
    t = cfg.train
    if t.num_steps is None:
        return set()
    every = t.eval_every or 0
    steps = set(range(every, t.num_steps + 1, every)) if every > 0 else set()
    return {s * t.total_batch_size for s in steps | {t.num_steps}}


def comparison_evaluated(cfg, at_tokens: int | None) -> bool:
    """Does a run of `cfg` evaluate at the comparison point (its end where the table compares at the end)?"""
    return at_tokens is None or at_tokens in evaluation_tokens(cfg)


# ---------------------------------------------------------------------------- the miniature
def _flat(cfg) -> dict[str, Any]:
    return {f"{section}.{k}": v for section, values in cfg.to_dict().items() if isinstance(values, dict)
            for k, v in values.items()}


def _divisors(n: int) -> list[int]:
    return sorted({d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)})


def _scale_factor(lengths: list[int], fixed: list[int], target: int = MINI_STEPS) -> int:
    """D: divides every step count in `fixed` (comparison steps, evaluation intervals), makes the longest run
    about `target` steps and none shorter than MIN_STEPS."""
    longest, shortest = max(lengths), min(lengths)
    candidates = _divisors(math.gcd(*fixed)) if fixed else range(1, longest + 1)
    fit = [d for d in candidates if round(shortest / d) >= MIN_STEPS] or [1]
    return min(fit, key=lambda d: (abs(longest / d - target), -d))


def _miniature(table: PaperTable, seeds: dict[str, tuple[int, ...]], given: dict[str, Any],
               target: int = MINI_STEPS) -> TablePlan:
    from muonlab.arms import resolve_config  # noqa: PLC0415
    from muonlab.config import all_presets, build_config  # noqa: PLC0415

    if table.preset not in STAND_INS:
        raise UsageError(f"table {table.id}: preset {table.preset} has no CPU stand-in for a miniature")
    stand_in, extra = STAND_INS[table.preset]
    presets = all_presets()
    paper_preset = _flat(build_config([("preset", presets[table.preset])]))
    small = _flat(build_config([("preset", {**presets[stand_in], **extra})]))
    full = {arm: _flat(resolve_config(arm, table.preset, table.settings)) for arm in seeds}
    compare = {}
    for arm, f in full.items():
        if table.at_tokens is None:
            compare[arm] = None
        elif table.at_tokens % f["train.total_batch_size"]:
            raise UsageError(f"table {table.id}: {table.at_tokens:,} tokens is no step of {arm}")
        else:
            compare[arm] = table.at_tokens // f["train.total_batch_size"]
    fixed = [c for c in compare.values() if c] + [f["train.eval_every"] for f in full.values()
                                                   if f["train.eval_every"] and table.at_tokens]
    scale = _scale_factor([f["train.num_steps"] for f in full.values()], fixed, target)
    settings = {k: v for k, v in table.settings.items() if k not in STEP_KEYS + SHAPE_KEYS}
    least = min(f["train.total_batch_size"] for f in full.values())
    arms = []
    for arm, f in full.items():
        mini = {**extra, **settings, **_scaled(f, small, paper_preset, scale, f["train.total_batch_size"] / least)}
        at = None if compare[arm] is None else compare[arm] // scale * mini["train.total_batch_size"]
        arms.append(ArmRuns(arm, seeds[arm], {**mini, **given}, at))
    return TablePlan(table, stand_in, tuple(arms), given, miniature=True, scale=scale, differs=True)


def _accumulation(values: dict[str, Any]) -> int:
    """Micro-batches a step (a step's tokens over one micro-batch's)."""
    return max(1, values["train.total_batch_size"] // (values["train.sequence_len"] * values["train.device_batch_size"]))


def _scaled(full: dict[str, Any], small: dict[str, Any], paper_preset: dict[str, Any], scale: int,
            batch_ratio: float) -> dict[str, Any]:
    """One arm's miniature settings: its durations / scale, the stand-in's batch times the arm's batch against the
    table's smallest (K.5's 1 : 16), and what the arm sizes against the paper's preset in the same ratio against the
    stand-in."""
    out: dict[str, Any] = {}
    for key in STEP_KEYS:
        if full.get(key):
            out[key] = max(1, round(full[key] / scale))
        elif key in full:
            out[key] = full[key]
    out["train.sequence_len"], out["train.device_batch_size"] = small["train.sequence_len"], small[
        "train.device_batch_size"]
    accumulation = max(1, round(_accumulation(small) * batch_ratio))
    out["train.total_batch_size"] = small["train.sequence_len"] * small["train.device_batch_size"] * accumulation
    out["train.eval_tokens"] = small["train.eval_tokens"]
    if full.get("data.vocab_size") != paper_preset.get("data.vocab_size") and full.get("data.vocab_size"):
        out["data.vocab_size"] = round(small["data.vocab_size"] * full["data.vocab_size"] / paper_preset["data.vocab_size"])
    oe_rows = (full.get("model.oe") or {}).get("m")
    if oe_rows and full.get("data.vocab_size"):  # the table's rows per vocabulary token, as the paper's
        vocab = out.get("data.vocab_size", small["data.vocab_size"])
        out["model.oe.m"] = max(1, round(oe_rows * vocab / full["data.vocab_size"]))
    if full.get("model.n_embd"):  # seed 004 K.4's widths, as multiples of the stand-in's head dim
        from muonlab.families.tied.model import TIED_SHAPES  # noqa: PLC0415

        paper, tiny = TIED_SHAPES[full["model.preset"]], TIED_SHAPES[small["model.preset"]]
        head = tiny.n_embd // tiny.n_head
        out["model.n_embd"] = max(head, round(tiny.n_embd * full["model.n_embd"] / paper.n_embd / head) * head)
    return out
