"""Where muonlab keeps data, tokenizers and runs: a cache directory outside the repository.

Default `~/.cache/muonlab`; override with the environment variable `MUONLAB_CACHE`
or with `--cache-dir` on the CLI.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MUONLAB_CACHE"


def cache_root(override: str | os.PathLike | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "muonlab"
