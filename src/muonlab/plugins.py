"""Plug-ins: a module or a .py file, imported before a run resolves its config.

A plug-in registers methods through the public registries (a pre-polar conditioner, a model
variant, an optimizer add-on); its methods are then named in the config like built-in ones. The
list is saved with the run (record.plugins), so `--resume` and sweep children import it again.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from muonlab.errors import UsageError

_LOADED: dict[str, object] = {}


def load_plugins(spec: str) -> list[str]:
    """Import each comma-separated module name or .py path once; return what was loaded."""
    loaded = []
    for item in (s.strip() for s in (spec or "").split(",")):
        if not item:
            continue
        if item not in _LOADED:
            _LOADED[item] = _import(item)
        loaded.append(item)
    return loaded


def _import(item: str):
    path = Path(item).expanduser()
    if item.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"plug-in file not found: {item}")
        name = f"muonlab_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path.resolve())
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise UsageError(f"plug-in {item} failed to import: {exc.__class__.__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(item)
    except ImportError as exc:
        raise UsageError(f"plug-in module {item!r} cannot be imported: {exc}") from exc
