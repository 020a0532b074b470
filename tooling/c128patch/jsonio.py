"""Files (JSON or bytes) written atomically: a kill leaves the old file or the new one, never half of one; the
advisory lock that serialises their writers; and the one way to read back a state file, which is input."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from c128patch.errors import C128Error
from c128patch.textsafe import one_line

_HELD: dict[str, int] = {}  # path -> the descriptor this process holds its lock on


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Writers one at a time: an exclusive advisory lock on ``path`` (a folder, or a file), re-entrant."""
    key = os.path.realpath(path)
    if key in _HELD:  # this process holds it already
        yield
        return
    fd = os.open(key, os.O_RDONLY | os.O_NONBLOCK)  # (a pipe's open waited for a writer, forever)
    if not stat.S_ISDIR(os.fstat(fd).st_mode) and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise C128Error(f"{one_line(key)} is not a folder or a regular file (a pipe, a device): it cannot be locked")
    _HELD[key] = fd
    try:
        _wait_for(_HELD[key], key)
        yield
    finally:
        os.close(_HELD.pop(key))  # (releases the lock)


def open_regular(path: Path, flags: int) -> int | None:
    """``path`` opened with ``flags`` (``O_CREAT`` makes it 0o644) without following a link or waiting on a pipe: its
    descriptor, or None where a link, a pipe or a folder is there (a dangling link made its target, anywhere; opening a
    pipe waited forever); any other OSError is raised."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            return None
        raise
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


LOCK_TIMEOUT_ENV = "C128PATCH_LOCK_TIMEOUT"  # seconds a run waits for a lock another run holds (default 600)
QUIET_WAIT = 1.0  # seconds a run waits for a lock before it says so


def lock_timeout() -> float:
    """``$C128PATCH_LOCK_TIMEOUT`` in seconds (600 unset), from 0 to a week (``-0``: 0, not "-0 s"); else one line."""
    try:
        limit = float(os.environ.get(LOCK_TIMEOUT_ENV) or 600) + 0.0
        if not 0 <= limit <= 604800:
            raise ValueError
    except ValueError:
        raise C128Error(f"{LOCK_TIMEOUT_ENV}={os.environ[LOCK_TIMEOUT_ENV]!r} is not a number of seconds from 0 to "
                        "604800") from None
    return limit


def _wait_for(fd: int, key: str) -> None:
    """The lock on ``fd`` (of ``key``): at once when free; else waited for, at most ``$C128PATCH_LOCK_TIMEOUT``
    seconds, then one line; a wait past ``QUIET_WAIT`` s is said on stderr (a run waiting on another, or on a process
    that holds the lock and never lets go, was silent and unbounded)."""
    limit = lock_timeout()  # read first: a bad value is said by every run, not only the one that has to wait
    start = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - start
            if not said and waited >= min(QUIET_WAIT, limit):  # another run's few-ms check is not worth a line
                sys.stderr.write(f"waiting for {one_line(key)}: another run holds its lock (at most {limit:g} s, "
                                 f"{LOCK_TIMEOUT_ENV})\n")
                sys.stderr.flush()
                said = True
            if waited >= limit:
                raise C128Error(f"{key} is still locked by another run after {limit:g} s: let it finish (or end it), "
                                f"then run again; {LOCK_TIMEOUT_ENV}=SECONDS waits longer") from None
            time.sleep(min(0.05 if waited < QUIET_WAIT else 0.2, max(limit - waited, 0.01)))


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> Path:
    """``data`` into ``path`` through a temporary file beside it (this process's own), synced (``sync``), then
    renamed. ``sync=False``: a state file in a tree's git dir, written as git writes its index (renamed into place,
    not synced: git syncs none of the loose objects of the commits such a file stands for); a kill still leaves the
    old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # a name anyone can guess: a link a series folder (a pull request) holds under it for each likely pid was written
    # through (`lint --update-hashes` wrote the manifest over the link's target): removed, then made anew, no link
    tmp.unlink(missing_ok=True)
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # (a write or fsync names no file: the line says which)
            exc.filename = str(path)
        raise
    return path


def write_json_atomic(path: Path, data: Any, *, sync: bool = True) -> Path:
    return write_atomic(path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode(), sync=sync)


MAX_JSON = 64 << 20  # the journals, plans and records the tool writes are far smaller


def read_json(path: Path, kind: type) -> Any:
    """The JSON in ``path`` if it reads as a ``kind``, else None (missing, unreadable, too deep, another shape; not a
    regular file (a link to /dev/zero or a FIFO: never read), or over ``MAX_JSON``)."""
    try:
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON:
                return None
            data = json.loads(f.read(MAX_JSON + 1))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, kind) else None
