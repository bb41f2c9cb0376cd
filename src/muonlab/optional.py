"""The optional packages: each imported only where a feature needs it, each missing one a one-line usage error.

The package itself, `--help`, training on the synthetic source or on already-tokenized data (`--source
memmap`) and every report number but p-values need none of them. A feature that needs one calls
`require`, which names the feature, the package and the command that installs it (exit 2).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from muonlab.errors import UsageError

# import name -> (distribution on PyPI, muonlab extra that installs it; None: a dependency of muonlab itself,
# which `pip install muonlab` brings, imported lazily so that an image without it still runs the rest)
OPTIONAL: dict[str, tuple[str, str | None]] = {
    "rustbpe": ("rustbpe", None),
    "kernels": ("kernels", "fa3"),
    "submitit": ("submitit", "slurm"),
    "transformers": ("transformers", "hf"),
    "matplotlib": ("matplotlib", None),
    "scipy": ("scipy", None),
    "wandb": ("wandb", "sinks"),
    "tensorboard": ("tensorboard", "sinks"),
}


class MissingPackage(UsageError):
    """A feature was asked for whose optional package is not installed (exit 2)."""


def install_hint(module: str) -> str:
    distribution, extra = OPTIONAL[module.split(".")[0]]
    if extra is None:  # a dependency this environment lacks (an image installed without dependencies)
        return f"pip install {distribution} (a dependency of muonlab this environment lacks)"
    return f"pip install 'muonlab[{extra}]' (or pip install {distribution})"


def require(module: str, feature: str) -> ModuleType:
    """Import `module` (an optional package or one of its submodules) for `feature`, or say how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        root = module.split(".")[0]
        kind = "optional package" if OPTIONAL[root][1] else "package"
        raise MissingPackage(f"{feature} needs the {kind} {OPTIONAL[root][0]}: {install_hint(root)}") from exc
