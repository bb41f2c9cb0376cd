"""The analyses a report is asked for beyond "every arm against the baseline".

Command-line forms (each option repeatable):
- `--contrast A:B`          paired Δ = A − B in each protocol (e.g. seed 002 Table 5b's 12m − 11);
- `--dod A:B,C:D`           difference-of-differences (A − B) − (C − D) per seed in each protocol
                            (seed 002 Tables 3, 5b, 7: DoD(OE×Opt) = (11 − 10) − (01 − 00));
- `--dod A:B --across KEY`  the same contrast A − B in two protocols that differ only in KEY,
                            (A − B)[KEY=v1] − (A − B)[KEY=v2] per seed (e.g. depth 6 vs 8);
- `--retention A:B,C:D`     descriptive ratio mean(A − B) / mean(C − D) (seed 002: 48.6 %), and
  `--retention A:B --across KEY` the ratio of one contrast in two protocols;
- `--single-seed A:B[@SEED]` seed 003's preregistered gate rule: one seed's Δ against θ.
`--across KEY=v1,v2` names the two values and their order (default: the two values present,
ascending). Every option acts or is refused: a single-contrast --dod without --across, or an
--across with nothing to compare across, is a usage error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from muonlab.errors import UsageError
from muonlab.lab.report.selection import coerce_setting, parse_setting


@dataclass(frozen=True)
class Pair:
    """One paired contrast: arm − reference."""

    arm: str
    reference: str

    @property
    def name(self) -> str:
        return f"{self.arm} - {self.reference}"


@dataclass(frozen=True)
class SingleSeed:
    pair: Pair
    seed: int | None  # None: the one seed both arms have

    @property
    def name(self) -> str:
        return self.pair.name + ("" if self.seed is None else f" @ seed {self.seed}")


@dataclass(frozen=True)
class Across:
    """Two protocols that differ in `key`: condition 1 (`values[0]`) minus condition 2."""

    key: str
    raw: tuple[str, ...]  # the values as given, or () for "the two values present"
    coerced: tuple[dict[str, Any], ...]  # per value: family -> value

    def describe(self) -> str:
        return self.key + (f"={','.join(self.raw)}" if self.raw else "")


@dataclass(frozen=True)
class Requests:
    contrasts: tuple[Pair, ...] = ()
    dods: tuple[tuple[Pair, Pair], ...] = ()
    retentions: tuple[tuple[Pair, Pair], ...] = ()
    single_seed: tuple[SingleSeed, ...] = ()
    across_dods: tuple[Pair, ...] = ()
    across_retentions: tuple[Pair, ...] = ()
    across: Across | None = None
    arms: tuple[str, ...] = field(default=())  # every arm named, for the "no such arm" check


def _pair(text: str, option: str) -> Pair:
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise UsageError(f"{option} expects ARM:REFERENCE contrasts, got {text!r}")
    arm, ref = (p.strip() for p in parts)
    if arm == ref:
        raise UsageError(f"{option} {text!r}: an arm against itself is 0 on every seed")
    return Pair(arm, ref)


def _pairs(text: str, option: str) -> tuple[Pair, ...]:
    pairs = tuple(_pair(p, option) for p in text.split(","))
    if len(pairs) > 2:
        raise UsageError(f"{option} takes one contrast A:B (with --across) or two, A:B,C:D; got {text!r}")
    return pairs


def _single(text: str) -> SingleSeed:
    body, _, seed = text.partition("@")
    if seed:
        try:
            return SingleSeed(_pair(body, "--single-seed"), int(seed))
        except ValueError:
            raise UsageError(f"--single-seed expects ARM:REFERENCE@SEED with an integer seed, got {text!r}") from None
    return SingleSeed(_pair(body, "--single-seed"), None)


def _across(text: str) -> Across:
    key_text, _, values = text.partition("=")
    key = parse_setting(key_text, "--across")
    raw = tuple(v.strip() for v in values.split(",")) if values else ()
    if values and (len(raw) != 2 or not all(raw) or raw[0] == raw[1]):
        raise UsageError(f"--across {text!r}: name two different values, e.g. --across depth=6,8")
    return Across(key, raw, tuple(coerce_setting(key, v, "--across") for v in raw))


def parse_requests(contrast: Sequence[str] = (), dod: Sequence[str] = (), retention: Sequence[str] = (),
                   single_seed: Sequence[str] = (), across: str | None = None) -> Requests:
    """The report's extra analyses from their command-line texts (see the module docstring)."""
    dods = [_pairs(t, "--dod") for t in dod]
    rets = [_pairs(t, "--retention") for t in retention]
    spec = _across(across) if across else None
    singles = [p for p in dods + rets if len(p) == 1]
    if singles and spec is None:
        raise UsageError(f"--dod/--retention {singles[0][0].arm}:{singles[0][0].reference} compares one contrast "
                         f"across two protocols: add --across KEY (e.g. --across depth), or give two "
                         f"contrasts A:B,C:D to compare within a protocol")
    if spec is not None and not singles:
        raise UsageError("--across compares one contrast in two protocols: give it a --dod A:B or --retention A:B")
    contrasts = tuple(_pair(t, "--contrast") for t in contrast)
    single = tuple(_single(t) for t in single_seed)
    named = [p for p in contrasts] + [p for ps in dods + rets for p in ps] + [s.pair for s in single]
    arms = tuple(dict.fromkeys(a for p in named for a in (p.arm, p.reference)))
    return Requests(contrasts, tuple(p for p in dods if len(p) == 2), tuple(p for p in rets if len(p) == 2),
                    single, tuple(p[0] for p in dods if len(p) == 1), tuple(p[0] for p in rets if len(p) == 1),
                    spec, arms)
