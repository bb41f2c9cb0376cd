"""Ledger lines -> protocols: which runs may be pooled into one sample.

A line written since protocol ids exist carries its `protocol` (muonlab.record.protocol): lines
are grouped by it, exactly. An older line has none, so its protocol is *derived* from its
recorded config: the settings that could change a number (acting or not), less the seed and
less every setting that an arm among the derived lines overrides (a setting an arm changes
cannot tell two protocols apart). Where the lines whose own arm leaves such a setting alone
disagree on it, the group is split by its value; a line whose arm overrides that setting
cannot be placed then, and stands apart as *ambiguous*. A line with no config at all has no
protocol and enters no study.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from muonlab.errors import UsageError
from muonlab.lab.report.protocol import is_overridden, recorded_settings
from muonlab.record.protocol import protocol_hash, recorded_protocol

@dataclass
class Protocol:
    """One protocol's lines (ok and failed, ledger order) and the settings they agree on."""

    id: str
    derived: bool
    records: list[dict]
    shared: dict[str, Any] = field(default_factory=dict)
    ambiguous: bool = False
    unchecked: tuple[str, ...] = ()  # derived: settings some arm overrides, so not compared
    unknown: bool = False  # lines with neither a protocol id nor a config (one each, or vouched for together)
    unread: str | None = None  # why this muonlab cannot read the lines' configs (a newer config format)


def known_settings(record: dict, overrides: Mapping[str, set[str]]) -> dict[str, Any]:
    """What a line says about its protocol: countable settings less the seed and its arm's own
    (cached on the record per overrides mapping: grouping asks for it many times)."""
    cache = record.setdefault("_known", {})
    if id(overrides) not in cache:
        settings = recorded_settings(record)
        own = overrides.get(record["arm"], set())
        cache[id(overrides)] = {} if settings is None else {
            k: v for k, v in settings.countable.items() if k != "seed" and not is_overridden(k, own)}
    return cache[id(overrides)]


def _token(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def shared_settings(records: Iterable[dict], overrides: Mapping[str, set[str]]) -> dict[str, Any]:
    """Settings that every line knowing them agrees on (a line of an arm that overrides a setting
    does not know its protocol's value)."""
    seen: dict[str, dict[str, Any]] = {}
    for r in records:
        for k, v in known_settings(r, overrides).items():
            seen.setdefault(k, {})[_token(v)] = v
    return {k: next(iter(vals.values())) for k, vals in sorted(seen.items()) if len(vals) == 1}


def _split(members: list[dict], keys: list[str], overrides: Mapping[str, set[str]]
           ) -> list[tuple[list[dict], bool]]:
    """Split derived lines by each arm-overridden setting their knowers disagree on."""
    for i, key in enumerate(keys):
        by_value: dict[str, list[dict]] = {}
        wild = []
        for r in members:
            known = known_settings(r, overrides)
            if key in known:
                by_value.setdefault(_token(known[key]), []).append(r)
            else:
                wild.append(r)
        if len(by_value) > 1:
            out = [part for sub in by_value.values() for part in _split(sub, keys[i + 1:], overrides)]
            out += [(sub, True) for sub, _ in _split(wild, keys[i + 1:], overrides)] if wild else []
            return out
    return [(members, False)]


def _derived(lines: list[dict], overrides: Mapping[str, set[str]]) -> list[Protocol]:
    arm_keys = set().union(*(overrides.get(r["arm"], set()) for r in lines))
    coarse: dict[str, list[dict]] = {}
    for r in lines:
        base = {k: v for k, v in known_settings(r, overrides).items() if not is_overridden(k, arm_keys)}
        coarse.setdefault(protocol_hash(base), []).append(r)
    protocols = []
    for members in coarse.values():
        keys = sorted({k for r in members for k in recorded_settings(r).countable
                       if k != "seed" and is_overridden(k, arm_keys)})
        for group, ambiguous in _split(members, keys, overrides):
            shared = shared_settings(group, overrides)
            pid = protocol_hash({"derived": True, "ambiguous": ambiguous, **shared})
            protocols.append(Protocol(pid, True, group, shared, ambiguous, tuple(keys)))
    return protocols


def group_protocols(records: list[dict], overrides: Mapping[str, set[str]], protocol_free: bool = False
                    ) -> tuple[list[Protocol], list[dict]]:
    """(the protocols, in order of their first ledger line; the lines that have no config and no
    protocol id, e.g. results imported from elsewhere). Such lines are each a protocol of their own
    (nothing says two of them ran alike), or, with `protocol_free` (the user vouches that they did),
    one protocol together."""
    exact: dict[str, list[dict]] = {}
    old, orphans = [], []
    unread: dict[str, tuple[str, list[dict]]] = {}
    for r in records:
        pid = recorded_protocol(r)
        why = unreadable_config(r)
        if pid is not None and why is not None:  # its id may hash settings this version cannot see: never pooled
            unread.setdefault(pid, (why, []))[1].append(r)
        elif pid is not None:
            exact.setdefault(pid, []).append(r)
        elif recorded_settings(r) is not None:
            old.append(r)
        else:
            orphans.append(r)
    protocols = [Protocol(pid, False, lines, shared_settings(lines, overrides)) for pid, lines in exact.items()]
    protocols += [Protocol(protocol_hash({"unread": pid}), False, lines, {}, unread=why)
                  for pid, (why, lines) in unread.items()]
    protocols += _derived(old, overrides) if old else []
    if protocol_free and not orphans:
        raise UsageError("--protocol-free joins the ledger lines that record no protocol (imported results); the "
                         "selected lines all record theirs: drop --protocol-free")
    if protocol_free and orphans:
        protocols.append(Protocol(protocol_hash({"protocol_free": True}), True, orphans, {}, unknown=True))
    else:
        protocols += [Protocol(protocol_hash({"unknown": r.get("run_id"), "line": r["_line"]}), True, [r], {},
                               unknown=True) for r in orphans]
    ids: set[str] = set()
    for p in protocols:  # a derived id equal to another protocol's would merge them in the output
        while p.id in ids:
            p.id = protocol_hash({"collides": p.id})
        ids.add(p.id)
    protocols.sort(key=lambda p: min(r["_line"] for r in p.records))
    return protocols, orphans


def unreadable_config(record: Mapping[str, Any]) -> str | None:
    """Why this muonlab cannot read a line's config (a newer config format, a section it does not know), or
    None: such a line's settings and protocol id are another version's, so it is a study of its own."""
    from muonlab.config import CONFIG_FORMAT, RunConfig  # noqa: PLC0415

    config = record.get("config")
    if not isinstance(config, Mapping):
        return None
    fmt = config.get("format")
    if isinstance(fmt, int) and fmt > CONFIG_FORMAT:
        return f"config format {fmt}, newer than this muonlab's {CONFIG_FORMAT}"
    known = {f.name for f in dataclasses.fields(RunConfig)} | {"format", "protocol", "layers", "plugin_code", "preset"}
    unknown = sorted(k for k in config if k not in known)
    if unknown and fmt is not None:
        return f"section {unknown[0]!r}, which this muonlab does not know (a newer version wrote it)"
    return None


def distinguishing(protocols: list[Protocol]) -> dict[str, dict[str, Any]]:
    """Per protocol id, the shared settings on which it differs from another protocol."""
    keys = sorted({k for p in protocols for k in p.shared
                   if len({_token(q.shared[k]) for q in protocols if k in q.shared}) > 1})
    return {p.id: {k: p.shared[k] for k in keys if k in p.shared} for p in protocols}


def agree(a: Mapping[str, Any], b: Mapping[str, Any], ignore: Iterable[str] = ()) -> bool:
    """Do two protocols' shared settings agree on every key both have (less `ignore`)?"""
    skip = set(ignore)
    return all(_token(a[k]) == _token(b[k]) for k in set(a) & set(b) if k not in skip)
