"""The pre-polar extension point of the Muon step: which conditioner, on which matrices.

A muon param group picks a registered conditioner (extensions.register_prepolar; the built-in
ones live in addons/) with `prepolar.kind` (None: off, the upstream step, bitwise) and restricts it
with `prepolar.scope`: "all" (default), "square_only" (rows == cols: the 32 attention matrices
at depth 8, seed 000 exp47), "rect_only" (its complement), or any other string: a regular
expression searched (re.search) in each matrix's name, read from the group's `param_names`
(torch's own key, aligned with `params`; torch then wants names on every group). A name filter
may pick a strict subset of a stack (the rest of the stack takes the upstream path; a
conditioner's per-matrix state keeps the whole stack's layout [N, ...]) unless the conditioner
is WHOLE_GROUPS_ONLY. A group the scope leaves out runs the upstream step and gets no state.

With a conditioner on, the group's state counts its completed updates (`prepolar_step`, t = 0
at the first update; replicated across ranks), which the conditioner's `step_inputs` reads.

The run config's `optim.prepolar` section (PrepolarSettings) holds `kind`, `scope`, and every
registered conditioner's options (an OpenSection: the conditioners' own fields, read from the
registry), so a plug-in's options are flags and dotted keys like a built-in's.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, ClassVar

from muonlab.errors import UsageError
from muonlab.optim import extensions
from muonlab.settings import METHOD_OFF, MethodInfo, MethodSection, OpenSection, opened_values, option_settings, setting

SCOPES = ("all", "square_only", "rect_only")
STEP_KEY = "prepolar_step"  # a state key (not a group key): completed updates of the group, with a conditioner on
KIND_KEY = extensions.group_key(extensions.PREPOLAR, "kind")  # the group keys are the settings' dotted keys below optim.
SCOPE_KEY = extensions.group_key(extensions.PREPOLAR, "scope")
_POINT_KEYS = (KIND_KEY, SCOPE_KEY)


def names() -> tuple[str, ...]:
    """The registered conditioners, in registration order."""
    return tuple(extensions.prepolars())


def validate_group(group: dict) -> None:
    """Raise ValueError naming the first bad pre-polar option of a muon group: an unknown
    conditioner, an option key no chosen conditioner reads, a bad value, a bad scope."""
    registered = extensions.prepolars()
    name = group.get(KIND_KEY)
    if name is not None and name not in registered:
        raise ValueError(f"{KIND_KEY} must be None or one of {tuple(registered)}, got {name!r}")
    known = set(_POINT_KEYS) | (set(registered[name].group_defaults()) if name is not None else set())
    stray = sorted(k for k in group if k.startswith(extensions.GROUP_PREFIX) and k not in known)
    if stray:
        raise ValueError(f"{stray[0]} is not an option of {KIND_KEY}={name!r}")
    if name is not None:
        registered[name].from_group(group)
    scope = group.get(SCOPE_KEY, "all")
    if name is None or scope in SCOPES:
        return
    group_names = group.get("param_names")
    if group_names is None or len(group_names) != len(group["params"]):
        raise ValueError(f"{SCOPE_KEY} {scope!r} is a name filter: the group needs `param_names`")
    picked = selected_indices(group, 0, len(group_names))
    if registered[name].WHOLE_GROUPS_ONLY and 0 < len(picked) < len(group_names):
        raise ValueError(f"{KIND_KEY}={name!r} acts on whole groups; scope {scope!r} "
                         f"selects {len(picked)} of {len(group_names)} matrices")
    re.compile(scope)


def selected_indices(group: dict, start: int, stop: int) -> list[int]:
    """Indices (relative to `start`) of the matrices [start, stop) of the group in scope."""
    scope = group.get(SCOPE_KEY, "all")
    rows, cols = group["params"][0].shape
    if scope == "all" or (scope == "square_only" and rows == cols) or (scope == "rect_only" and rows != cols):
        return list(range(stop - start))
    if scope in SCOPES:
        return []
    group_names = group["param_names"]
    return [i - start for i in range(start, stop) if re.search(scope, group_names[i])]


def conditioner(group: dict) -> tuple[extensions.PrePolar | None, bool]:
    """(the group's conditioner, whether it acts on a strict subset of the stack); (None, False)
    when `prepolar.kind` is off or the scope leaves the whole group out."""
    name = group.get(KIND_KEY)
    if name is None:
        return None, False
    n = len(group["params"])
    picked = selected_indices(group, 0, n)
    if not picked:
        return None, False
    return extensions.prepolars()[name].from_group(group), len(picked) < n


# ---------------------------------------------------------------- the run-config section
@dataclasses.dataclass
class PrepolarSettings(OpenSection, MethodSection):
    """Seed 000 §3.3, seed 002 §2.1 (Tier 1): a conditioner of the Nesterov tensor before Polar Express.
    Its settings: `kind`, `scope`, and every registered conditioner's options (its fields not declared
    `fixed`), one namespace shared by the conditioners (register_prepolar keeps a shared name's type and
    default), so a plug-in's options are flags and dotted keys like a built-in's."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('prepolar', 'seed 000 §3.3; seed 002 §2.1 (Tier 1)', __name__,
                                              ('tests/optim/test_prepolar.py', 'tests/optim/test_prepolar_arms.py'), 'kind', None)

    kind: str | None = setting(None, "hbieq | zeta | turbo_aol | muon2f, or a plug-in's name; none: off",
                               flag="prepolar")
    scope: str = setting("all", "all | square_only | rect_only | a regex on block parameter names",
                         flag="prepolar-scope")
    values: dict = opened_values()

    def opened(self) -> list[tuple[str, Any, dataclasses.Field]]:
        return list(_options(registry_state()))

    def owners(self) -> dict[str, tuple[str, ...]]:
        """{option: the conditioners that declare it}."""
        return _owners(registry_state())

    def chosen(self) -> type[extensions.PrePolar] | None:
        return None if self.kind is None else extensions.prepolars().get(self.kind)

    def inactive(self) -> dict[str, str]:
        owners = self.owners()
        if self.kind is None:
            return {"scope": METHOD_OFF, **{name: METHOD_OFF for name in owners}}
        return {name: f"only {', '.join(names)} reads it (prepolar is {self.kind})"
                for name, names in owners.items() if self.kind not in names}

    def validate(self) -> None:
        if self.kind is not None and self.chosen() is None:
            raise UsageError(f"prepolar must be one of {', '.join(names())}, got {self.kind!r}")
        try:
            self.conditioner()
        except ValueError as exc:
            raise UsageError(f"prepolar {self.kind}: {exc}") from None

    def follows_homotopy(self) -> bool:
        """The chosen conditioner has a homotopy ramp (a `first_t` field: muonlab.optim.homotopy)."""
        cls = self.chosen()
        return cls is not None and "first_t" in {f.name for f in dataclasses.fields(cls)}

    def conditioner(self, first_t: int | None = None) -> extensions.PrePolar | None:
        """The chosen conditioner with these settings (and the run's homotopy first_t where it has a ramp)."""
        cls = self.chosen()
        if cls is None:
            return None
        values = {f.name: getattr(self, f.name) for f in cls.settings()}
        if first_t is not None and self.follows_homotopy():
            values["first_t"] = first_t
        return cls(**values)

    def needs_param_names(self) -> bool:
        """A name scope (a regular expression) reads each matrix's name: the groups carry `param_names`."""
        return self.kind is not None and self.scope not in SCOPES

    def param_group_keys(self, optim) -> dict[str, dict]:
        """The muon groups' pre-polar keys (muonlab.families.autoresearch adds them)."""
        keys = self.group_options(first_t=optim.homotopy_first_t)
        return {"muon": keys} if keys else {}

    def group_options(self, first_t: int | None = None) -> dict[str, Any]:
        """A muon group's pre-polar keys: none when off; the defaults are left out (a group at the defaults
        carries no key, as in every release's checkpoints)."""
        cond = self.conditioner(first_t)
        if cond is None:
            return {}
        scope = {} if self.scope == "all" else {SCOPE_KEY: self.scope}
        return {KIND_KEY: self.kind, **scope, **cond.group_options()}


def registry_state() -> tuple:
    """The registered conditioners as a hashable key (what the run-config section and its flags depend on)."""
    return tuple(extensions.prepolars().items())


@functools.lru_cache(maxsize=8)
def _options(state: tuple) -> tuple[tuple[str, Any, dataclasses.Field], ...]:
    seen: dict[str, tuple] = {}
    for name, cls in state:
        for spec in option_settings(cls, name, "prepolar"):
            seen.setdefault(spec[0], spec)  # a shared option: its first declaration's help
    return tuple(seen.values())


@functools.lru_cache(maxsize=8)
def _owners(state: tuple) -> dict[str, tuple[str, ...]]:
    owners: dict[str, list[str]] = {}
    for name, cls in state:
        for f in cls.settings():
            owners.setdefault(f.name, []).append(name)
    return {k: tuple(v) for k, v in owners.items()}
