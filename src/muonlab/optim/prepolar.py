"""The pre-polar extension point of the Muon step: which conditioner, on which matrices.

A muon param group picks a registered conditioner (extensions.register_prepolar; the built-in
ones live in addons/) with `prepolar` (None: off, the upstream step, bitwise) and restricts it
with `prepolar_scope`: "all" (default), "square_only" (rows == cols: the 32 attention matrices
at depth 8, seed 000 exp47), "rect_only" (its complement), or any other string: a regular
expression searched (re.search) in each matrix's name, read from the group's `param_names`
(torch's own key, aligned with `params`; torch then wants names on every group). A name filter
may pick a strict subset of a stack (the rest of the stack takes the upstream path; a
conditioner's per-matrix state keeps the whole stack's layout [N, ...]) unless the conditioner
is WHOLE_GROUPS_ONLY. A group the scope leaves out runs the upstream step and gets no state.

With a conditioner on, the group's state counts its completed updates (`prepolar_step`, t = 0
at the first update; replicated across ranks), which the conditioner's `step_inputs` reads.

The names `PREPOLARS`, `PREPOLAR_DEFAULTS`, `STACKED_STATE_KEYS` and `DTYPES` are read from the
registry when asked for (config validation and the training builder use them).
"""

from __future__ import annotations

import re

from muonlab.optim import extensions
from dataclasses import dataclass
from typing import ClassVar, Literal
from muonlab.errors import UsageError
from muonlab.settings import METHOD_OFF, MethodInfo, Section, setting

SCOPES = ("all", "square_only", "rect_only")
OPTIONS = dict(prepolar=None, prepolar_scope="all")  # this point's own keys
STEP_KEY = "prepolar_step"  # completed updates of the group (only present with a conditioner on)


def validate_group(group: dict) -> None:
    """Raise ValueError naming the first bad pre-polar option of a muon group."""
    registered = extensions.prepolars()
    name = group.get("prepolar")
    if name is not None and name not in registered:
        raise ValueError(f"prepolar must be None or one of {tuple(registered)}, got {name!r}")
    for cls in registered.values():  # every conditioner's keys, so a bad value never sits unnoticed
        cls.validate(extensions.options_of(group, cls.OPTIONS))
    scope = group.get("prepolar_scope", "all")
    if name is None or scope in SCOPES:
        return
    names = group.get("param_names")
    if names is None or len(names) != len(group["params"]):
        raise ValueError(f"prepolar_scope {scope!r} is a name filter: the group needs `param_names`")
    picked = selected_indices(group, 0, len(names))
    if registered[name].WHOLE_GROUPS_ONLY and 0 < len(picked) < len(names):
        raise ValueError(f"prepolar={name!r} acts on whole groups; scope {scope!r} "
                         f"selects {len(picked)} of {len(names)} matrices")
    re.compile(scope)


def selected_indices(group: dict, start: int, stop: int) -> list[int]:
    """Indices (relative to `start`) of the matrices [start, stop) of the group in scope."""
    scope = group.get("prepolar_scope", "all")
    rows, cols = group["params"][0].shape
    if scope == "all" or (scope == "square_only" and rows == cols) or (scope == "rect_only" and rows != cols):
        return list(range(stop - start))
    if scope in SCOPES:
        return []
    names = group["param_names"]
    return [i - start for i in range(start, stop) if re.search(scope, names[i])]


def conditioner(group: dict) -> tuple[extensions.PrePolar | None, bool]:
    """(the group's conditioner, whether it acts on a strict subset of the stack); (None, False)
    when `prepolar` is off or the scope leaves the whole group out."""
    name = group.get("prepolar")
    if name is None:
        return None, False
    n = len(group["params"])
    picked = selected_indices(group, 0, n)
    if not picked:
        return None, False
    cls = extensions.prepolars()[name]
    return cls.from_options(extensions.options_of(group, cls.OPTIONS)), len(picked) < n


def __getattr__(name: str):
    if name == "PREPOLARS":
        return tuple(extensions.prepolars())
    if name == "PREPOLAR_DEFAULTS":  # every option a muon group may carry, with its default
        out = dict(OPTIONS)
        for cls in extensions.prepolars().values():
            out.update(cls.OPTIONS)
        for addon in extensions.muon_stage_addons():
            out.update(addon.options)
        return out
    if name == "STACKED_STATE_KEYS":
        return extensions.stacked_state_keys()
    if name == "DTYPES":
        from muonlab.optim.addons.polar_precision import DTYPES
        return DTYPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# run-config settings of this method: its flags, their help, which options act when
@dataclass
class PrepolarSettings(Section):
    """Seed 000 §3.3, seed 002 §1.4a: a conditioner of the Nesterov tensor before Polar Express."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('prepolar', 'seed 000 §3.3; seed 002 §1.4a', __name__, ('tests/test_prepolar.py', 'tests/test_prepolar_arms.py'), 'kind', None)

    kind: str | None = setting(None, "hbieq | zeta | turbo_aol | muon2f, or a plug-in's name; none: off",
                               flag="prepolar")
    scope: str = setting("all", "all | square_only | rect_only | a regex on block parameter names",
                         flag="prepolar-scope")
    tau: float = setting(80.0, "hbieq homotopy horizon (seed 000: 80, seed 002: 25; 0 = undamped)", flag="prepolar-tau")
    passes: int = setting(2, "hbieq equilibration passes", flag="prepolar-passes")
    sides: Literal["both", "row"] = setting("both", "hbieq sides (row with passes 1: seed 000 exp51's control)",
                                            flag="prepolar-sides")

    def inactive(self) -> dict[str, str]:
        if self.kind is None:
            return {"scope": METHOD_OFF, "tau": METHOD_OFF, "passes": METHOD_OFF, "sides": METHOD_OFF}
        if self.kind != "hbieq":
            why = f"only hbieq reads it (prepolar is {self.kind})"
            return {"tau": why, "passes": why, "sides": why}
        return {}

    def validate(self) -> None:
        from muonlab.optim.prepolar import PREPOLARS  # noqa: PLC0415 (the optimizer's registry)

        if self.kind is not None and self.kind not in PREPOLARS:
            raise UsageError(f"prepolar must be one of {', '.join(PREPOLARS)}, got {self.kind!r}")
        if self.passes < 1 or self.tau < 0:
            raise UsageError("need prepolar_passes >= 1 and prepolar_tau >= 0")
