"""Which runs a report covers: `--where KEY=VALUE` on the recorded configs, `--protocol ID`.

A key is a flag name (`depth`, `num-steps`, `num_steps`) or a dotted key (`model.depth`); a value
is coerced as the config coerces it (`6` -> int, `none` -> None, `0.04` -> float), so it
compares equal to what a run recorded. An unknown key or a value of the wrong type is a usage
error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from muonlab.errors import UsageError
from muonlab.lab.report.protocol import recorded_settings


def parse_setting(text: str, option: str) -> str:
    """The dotted key of a flag name or dotted key; UsageError when no family has it."""
    from muonlab.config import TOP_LEVEL, canonical_key, families_with  # noqa: PLC0415

    name = text.strip()
    try:
        key = canonical_key(name) if name else ""
    except UsageError:
        key = ""
    if not key or (key not in TOP_LEVEL and not families_with(key)):
        raise UsageError(f"{option}: unknown setting {text!r} (give a flag name such as depth or num-steps, "
                         f"or a dotted key such as model.depth)")
    return key


def coerce_setting(key: str, raw: Any, option: str) -> dict[str, Any]:
    """{family: the value as that family's config would hold it} for every family with `key`."""
    from muonlab.config import TOP_LEVEL, families_with, family_leaves  # noqa: PLC0415
    from muonlab.families import all_families  # noqa: PLC0415
    from muonlab.settings import coerce  # noqa: PLC0415

    out, errors = {}, []
    for family in (list(all_families()) if key in TOP_LEVEL else families_with(key)):
        leaf = next(leaf for leaf in family_leaves(family) if leaf.key == key)
        try:
            out[family] = coerce(raw, leaf.type, key, leaf.allow_inf)
        except UsageError as exc:
            errors.append(str(exc))
    if not out:
        raise UsageError(f"{option} {key}={raw}: {errors[0]}")
    return out


@dataclass(frozen=True)
class Where:
    """One `--where` filter: a run matches when its recorded config holds the value."""

    key: str
    raw: str
    values: Mapping[str, Any]  # family -> coerced value

    def matches(self, record: dict) -> bool:
        settings = recorded_settings(record)
        if settings is None or self.key not in settings.values:
            return False
        family = settings.values.get("family", "autoresearch")
        return family in self.values and _same(settings.values[self.key], self.values[family])

    def describe(self) -> str:
        return f"{self.key}={self.raw}"


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, default=str) == json.dumps(b, default=str)  # 6 == 6.0 is not one protocol


def parse_where(items: Sequence[str] | Mapping[str, Any] | None) -> list[Where]:
    """Filters from `KEY=VALUE` strings (the command line) or a {key: value} mapping."""
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for item in items or ():
            if "=" not in item:
                raise UsageError(f"--where expects KEY=VALUE (e.g. depth=6), got {item!r}")
            key, raw = item.split("=", 1)
            pairs.append((key, raw))
    filters: dict[str, Where] = {}
    for name, raw in pairs:
        key = parse_setting(str(name), "--where")
        if key in filters:
            raise UsageError(f"--where names {key} twice; a run has one value of it")
        filters[key] = Where(key, str(raw), coerce_setting(key, raw, "--where"))
    return list(filters.values())


def select_records(records: list[dict], filters: Iterable[Where]) -> list[dict]:
    """The records every filter matches; UsageError (naming the recorded values) when none does."""
    filters = list(filters)
    if not filters:
        return records
    kept = [r for r in records if all(f.matches(r) for f in filters)]
    if not kept:
        seen = {f.key: sorted({_show(recorded_settings(r).values.get(f.key)) for r in records
                               if recorded_settings(r) is not None}) for f in filters}
        shown = "; ".join(f"{k}: {', '.join(v) or 'none recorded'}" for k, v in seen.items())
        raise UsageError(f"no run matches --where {' '.join(f.describe() for f in filters)} "
                         f"(recorded values: {shown})")
    return kept


def _show(value: Any) -> str:
    return "none" if value is None else str(value)
