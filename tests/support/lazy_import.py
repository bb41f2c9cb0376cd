"""An optional package a test file uses, imported when a test first uses it rather than when the file is collected:
every pytest-xdist worker collects every file, so an import at collection is paid once per worker (scipy.stats:
2.4 s), and only the worker that runs the file needs it."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import pytest


class _LazyModule:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # what pytest probes on every object of a test module, never a package's API here
            raise AttributeError(attr)
        module: ModuleType = importlib.import_module(self._name)
        return getattr(module, attr)


def optional_module(name: str, reason: str) -> _LazyModule:
    """`name`, imported at its first attribute read; the whole file skipped (as pytest.importorskip would) where
    its package is not installed."""
    if importlib.util.find_spec(name.partition(".")[0]) is None:
        pytest.skip(reason, allow_module_level=True)
    return _LazyModule(name)
