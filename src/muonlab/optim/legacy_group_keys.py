"""The optimizer group keys of earlier releases and their names now.

A method's group key is its setting's dotted key below `optim.` (`optim.whiten.tau` is `whiten.tau`,
extensions.group_key). Releases before it wrote the flat flag name with underscores (`whiten_tau`,
`prepolar` for `prepolar.kind`, `post_polar_dtype` for `polar.post_dtype`). A checkpoint written then
still resumes: MuonAdamW.load_state_dict renames its groups' keys (torch replaces a group's options by the
saved ones, so an old key left in place would silently run the default). A group written in code with an
old key is refused, naming the new one.
"""

from __future__ import annotations

from typing import Any

from muonlab.optim.extensions import GROUP_PREFIX, prepolars

# what earlier releases wrote (frozen: history, not derived from today's classes); every name on the right is a
# group key of today's methods (tests/optim/test_legacy_group_keys.py)
RENAMED = {
    "polar_dtype": "polar.dtype", "post_polar_dtype": "polar.post_dtype",
    "whiten": "whiten.kind", "whiten_tau": "whiten.tau", "whiten_terms": "whiten.terms",
    "whiten_mean_addback": "whiten.mean_addback", "whiten_first_t": "whiten.first_t", "whiten_eps": "whiten.eps",
    "table_whiten": "table_whiten.kind", "table_whiten_tau": "table_whiten.tau",
    "table_whiten_first_t": "table_whiten.first_t",
    "prepolar": "prepolar.kind", "prepolar_scope": "prepolar.scope",
    # the conditioners' own prefixes before `prepolar_` (only ever set in Python: runs kept the defaults)
    "zeta_beta2": "prepolar.beta2", "zeta_eps": "prepolar.eps", "aol_reuse_gram": "prepolar.reuse_gram",
}
OLD_PREPOLAR_PREFIX = "prepolar_"  # a conditioner's option `f` (a plug-in's too) was `prepolar_f`, now GROUP_PREFIX + f


def new_name(key: str) -> str | None:
    """Today's name of an earlier release's group key; None for a key that was not renamed."""
    if key in RENAMED:
        return RENAMED[key]
    if key.startswith(OLD_PREPOLAR_PREFIX):
        return GROUP_PREFIX + key.removeprefix(OLD_PREPOLAR_PREFIX)
    return None


def renamed_group(group: dict[str, Any]) -> dict[str, Any]:
    """A copy of a saved group with every old key under its new name."""
    return {new_name(key) or key: value for key, value in group.items()}


def refuse_old_keys(group: dict[str, Any]) -> None:
    """ValueError naming the first old key of a group made in code and its name now (a `prepolar_` key only where
    a registered conditioner has that option: a misspelt one was never a name)."""
    for key in group:
        new = new_name(key)
        if new is None:
            continue
        if key in RENAMED or any(new in cls.group_defaults() for cls in prepolars().values()):
            raise ValueError(f"{key} is now {new} (a method's group key is its dotted key below optim.)")
        raise ValueError(f"{key} is not a group key (a conditioner's option `x` is the group key prepolar.x)")
