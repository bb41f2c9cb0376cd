"""The `stdlib` corpus: the running interpreter's own standard-library Python sources.

Present on every machine with no network, about 12 MB for CPython 3.11 once test
suites are left out. Each file is one document, identified by its path relative to
the stdlib root (so the corpus is the same wherever Python is installed).
"""

from __future__ import annotations

import hashlib
import platform
import sys
import sysconfig
from pathlib import Path

from muonlab.errors import UsageError

# Directory names whose contents are test suites or fixtures (test/, tests/,
# idlelib/idle_test, lib2to3/tests, ...), installed packages, or build configuration.
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def _excluded(rel: Path) -> bool:
    parts = rel.parts
    for part in parts[:-1]:
        if part in _EXCLUDED_DIRS or part.startswith("config-") or part.startswith("."):
            return True
    # Generated at build time with machine-specific paths.
    return parts[-1].startswith("_sysconfigdata")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Sorted paths (relative to `root`) of the stdlib's .py files, tests excluded.

    Non-UTF-8 files are dropped later, when read.
    """
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise UsageError(f"standard library not found at {root}")
    files = [p.relative_to(root) for p in root.rglob("*.py") if p.is_file()]
    return sorted((rel for rel in files if not _excluded(rel)), key=lambda p: p.as_posix())


class StdlibSource:
    name = "stdlib"

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else stdlib_root()
        self.files = stdlib_files(self.root)

    def identity(self) -> dict:
        # Relative paths and sizes pin the content for a given Python build cheaply.
        listing = hashlib.sha256()
        for rel in self.files:
            listing.update(f"{rel.as_posix()}\0{(self.root / rel).stat().st_size}\n".encode())
        return {
            "python": platform.python_version(),
            "implementation": sys.implementation.name,
            "files": listing.hexdigest(),
        }

    def documents(self) -> list[tuple[str, str]]:
        docs = []
        for rel in self.files:
            try:
                text = (self.root / rel).read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text:
                docs.append((rel.as_posix(), text))
        return docs

    def meta(self) -> dict:
        return {"python": platform.python_version(), "files": len(self.files)}
