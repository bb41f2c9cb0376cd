"""Which plug-ins' source a run's config is a function of: those whose methods it selects.

A plug-in that registered pre-polar conditioners or model variants acts on a run only when the run
selects one of them (optim.prepolar.kind, model.extra_variants): a baseline that loads the plug-in beside
it keeps its hash when the plug-in is edited. A plug-in that registered neither (an arm, a family, or
nothing a registry shows: it may change anything at import) counts for every run that loads it.
"""

from __future__ import annotations

from typing import Any

from muonlab.plugins import plugin_module, source_digests


def plugin_code(cfg: Any) -> dict[str, str]:
    """{plug-in: sha256 of its source} for the plug-ins of cfg.record.plugins that act on cfg."""
    spec = cfg.record.plugins
    if not spec:
        return {}
    return {item: digest for item, digest in source_digests(spec).items() if _acts_on(item, cfg)}


def _acts_on(item: str, cfg: Any) -> bool:
    module = plugin_module(item)
    if module is None:  # not imported here: nothing says what it registered
        return True
    mine = lambda m: m == module or m.startswith(module + ".")  # noqa: E731
    from muonlab.model.extensions import REGISTRY  # noqa: PLC0415
    from muonlab.optim.extensions import records  # noqa: PLC0415

    conditioners = [r.name for r in records() if mine(r.module)]
    variants = [name for name, info in REGISTRY.items() if mine(info.variant.__module__)]
    if not (conditioners or variants):
        return True
    prepolar = getattr(getattr(cfg.optim, "prepolar", None), "kind", None)
    chosen = set(getattr(cfg.model, "extra_variant_names", lambda: ())())
    return prepolar in conditioners or any(name in chosen for name in variants)
