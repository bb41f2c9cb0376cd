"""Atomic file writes: temp file in the same directory, fsync, rename; whole-line appends.

A reader never sees a half-written file, and a crash mid-write leaves the previous
version (if any) intact. `append_whole` appends all of a line or nothing of it. Files are
created with the process umask (0644 under 022, 0664 under a team's 002), as `open` would
create them: a shared cache or runs directory stays readable by the team.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from pathlib import Path
from typing import IO, Iterator

# Appends go out in writes of at most this many bytes. A write may be partial anyway (a full disk,
# a signal), so a long line is never one system call: what keeps concurrent writers' lines whole
# is their lock, not O_APPEND.
WRITE_CHUNK = 1 << 16


class _WriteErrorKept:
    """A file that remembers the first OSError its `write` raised: torch.save turns a failed write
    (a full disk) into a RuntimeError that no longer says what happened."""

    def __init__(self, f: IO):
        self._f, self.error = f, None

    def write(self, data):
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name):
        return getattr(self._f, name)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temp file beside `path`; on clean exit fsync it and rename it over `path`.

    A failed write is raised as an OSError naming `path`, whatever the writer made of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp_beside(path)
    kept = None
    try:
        with os.fdopen(fd, mode) as f:
            kept = _WriteErrorKept(f)
            yield kept
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        cause = kept.error if kept is not None and kept.error is not None else exc
        if isinstance(exc, Exception) and isinstance(cause, OSError) and cause.errno and not cause.filename:
            raise OSError(cause.errno, cause.strerror, str(path)) from exc
        raise
    _fsync_dir(path.parent)


def create_temp_beside(path: Path) -> tuple[int, str]:
    """A new, uniquely named temp file beside `path`, open for writing: (fd, its path). Unlike
    tempfile.mkstemp (always 0600), its mode is 0666 less the umask, as the final file's should be."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temp file name", str(path))


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str | os.PathLike, obj, indent: int | None = 2) -> None:
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=indent, sort_keys=False)
        f.write("\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def append_whole(fd: int, data: bytes, sync: bool = False) -> None:
    """Append all of `data` to `fd` (opened with O_APPEND), or nothing: if any write (or, with
    `sync`, the fsync) fails or is interrupted, the file is cut back to its size before.
    Concurrent writers must hold a lock."""
    size = os.fstat(fd).st_size
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view[:WRITE_CHUNK])
            if written <= 0:  # not an error, yet no progress: a write that accepts nothing
                raise OSError(errno.ENOSPC, f"write accepted no bytes ({len(data) - len(view)} of {len(data)} written)")
            view = view[written:]
        if sync:
            os.fsync(fd)
    except BaseException:
        os.ftruncate(fd, size)  # never leave a torn line behind
        raise


@contextlib.contextmanager
def folder_undone_on_failure(folder: str | os.PathLike) -> Iterator[Path]:
    """Create `folder` (and its parents) for a block that fills it; when the block fails and this call
    created it, remove it again (with its lock file and whatever the block wrote): a refused `prepare`
    leaves the cache as it found it."""
    folder = Path(folder)
    created = []
    for parent in reversed([folder, *folder.parents]):
        if not parent.exists():
            created.append(parent)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        if created:
            import shutil  # noqa: PLC0415

            shutil.rmtree(created[0], ignore_errors=True)  # the outermost folder this call made
        raise


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path`, or its nearest parent that exists (where a file still to come would be created)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable_error(path: str | os.PathLike) -> OSError | None:
    """Why `path` (a file that may not exist yet) could not be written, or None: an existing file is
    opened for append (nothing written), else a scratch file is created and removed in the nearest
    folder that exists. The file system answers, read-only mounts and root included, where
    os.access only reads permission bits."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
            return None
        folder = path if path.is_dir() else nearest_existing(path.parent)
        fd, name = create_temp_beside(folder / ".muonlab-write-check")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return exc
    return None
