"""Plug-ins: a module or a .py file, imported before a run resolves its config.

A plug-in registers methods through the public registries (a pre-polar conditioner, a model
variant, an optimizer add-on); its methods are then named in the config like built-in ones. The
list is saved with the run (record.plugins), so `--resume` and sweep children import it again, and so
is the content hash of each plug-in's source (source_digests): it is part of the run's config hash, so a
run made with an edited plug-in is another arm version, never "done" by the old runs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from muonlab.errors import UsageError


def is_builtin_module(module: str) -> bool:
    """Whether a registering module ships with muonlab (a built-in method: a plug-in that ships with the
    package); the one place this is decided. A plug-in file is imported as muonlab_plugin_<name>."""
    return module == "muonlab" or module.startswith("muonlab.")

_LOADED: dict[str, object] = {}
_IMPORTED: dict[str, str] = {}  # plug-in -> digest of the source this process imported


def load_plugins(spec: str) -> list[str]:
    """Import each comma-separated module name or .py path once; return what was loaded."""
    loaded = []
    for item in (s.strip() for s in (spec or "").split(",")):
        if not item:
            continue
        if item not in _LOADED:
            _LOADED[item] = _import(item)
            _IMPORTED[item] = _digest(_source_files(item))
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
            # compiled from the file's own bytes, the ones its digest reads: an import would write bytecode into the
            # user's folder, and read it back for a file edited within the same second at the same size
            exec(compile(path.read_bytes(), spec.origin, "exec"), module.__dict__)
            return module
        except (Exception, SystemExit) as exc:  # a plug-in's sys.exit() at import is its failure, not muonlab's exit
            del sys.modules[name]
            failure = exc
    else:
        try:
            return importlib.import_module(item)
        except ImportError as exc:
            raise UsageError(f"plug-in module {item!r} cannot be imported: {exc}") from exc
        except (Exception, SystemExit) as exc:
            failure = exc
    raise UsageError(f"plug-in {item} failed to import: {_said(failure)}") from failure


def _said(exc: BaseException) -> str:
    """An import failure: its class and message (a SystemExit: its code); the CLI prints it on one line."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) while importing"
    return f"{exc.__class__.__name__}: {exc}"


def source_digests(spec: str) -> dict[str, str]:
    """{plug-in: sha256 (16 hex digits) of its source}: a .py file's bytes; a module's file, or every .py
    file under a package's folder (with their relative paths). The source, not the import: what a run ran."""
    out = {}
    for item in (s.strip() for s in (spec or "").split(",")):
        if item:
            out[item] = _digest(_source_files(item))
            if _IMPORTED.get(item, out[item]) != out[item]:  # this process runs the source it imported
                raise UsageError(f"plug-in {item} changed since this process imported it: start a new one "
                                 "(muonlab imports a plug-in once per process)")
    return out


def changed_sources(saved: dict[str, str], spec: str) -> list[str]:
    """The plug-ins of `saved` (a run's recorded digests) whose source in `spec` differs now, each named with
    the file to look at."""
    now = source_digests(spec)
    return [item if item.endswith(".py") else f"{item} ({', '.join(str(f) for _, f in _source_files(item))})"
            for item in saved if now.get(item) != saved[item]]


def _source_files(item: str) -> list[tuple[str, Path]]:
    """The files of a plug-in's source: a .py file (gone: none); a module's file, or every .py file under a
    package's folder; none for a module without source files (a built-in one: nothing to edit)."""
    if item.endswith(".py"):
        path = Path(item).expanduser()
        return [(path.name, path)] if path.is_file() else []
    try:
        spec = importlib.util.find_spec(item)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        files = []
        for root in map(Path, spec.submodule_search_locations):
            files += [(str(f.relative_to(root)), f) for f in sorted(root.rglob("*.py"))]
        return files
    origin = Path(spec.origin) if spec.origin else None
    return [(origin.name, origin)] if origin is not None and origin.is_file() else []


def _digest(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for name, path in files:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def plugin_module(item: str) -> str | None:
    """The module name a loaded plug-in was imported as (None: not loaded in this process)."""
    module = _LOADED.get(item)
    return getattr(module, "__name__", None)


def forget(item: str) -> None:
    """Drop a loaded plug-in from this process's cache (its registrations stay: the caller removes them), so
    the next load_plugins imports its source again. For tests and interactive use."""
    module = _LOADED.pop(item, None)
    _IMPORTED.pop(item, None)
    name = getattr(module, "__name__", None)
    if name is not None and item.endswith(".py"):
        sys.modules.pop(name, None)
