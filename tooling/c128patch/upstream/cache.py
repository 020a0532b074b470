"""Where c128patch keeps what it downloads and builds (outside any repository)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from c128patch.errors import C128Error


def cache_dir() -> Path:
    explicit = os.environ.get("C128PATCH_CACHE")
    try:
        root = (Path(explicit) if explicit
                else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "c128patch")
    except RuntimeError as exc:  # no HOME and no passwd entry
        raise C128Error(f"cannot find a cache folder ({exc}); set C128PATCH_CACHE to a writable folder") from None
    ensure_folder(root)
    return root


def ensure_folder(folder: Path) -> Path:
    """Make a folder of the cache; one that cannot be made says how to move the cache."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable(folder, exc) from None
    return folder


def unwritable(folder: Path, exc: OSError) -> C128Error:
    return C128Error(f"cannot write the cache folder {folder} ({exc.strerror}); "
                     "set C128PATCH_CACHE to a writable folder (export C128PATCH_CACHE=/path/to/cache)")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so parallel runs don't build the same cache twice."""
    ensure_folder(path.parent)
    try:
        handle = open(path, "a+")
    except OSError as exc:
        raise unwritable(path.parent, exc) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
