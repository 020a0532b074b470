"""Errors the CLI turns into one-line messages and exit codes."""

from __future__ import annotations

import signal

from c128patch.exitcodes import FAILED, INTERRUPTED, SIGNAL, USAGE


class C128Error(Exception):
    """A user-facing failure: bad input, a refused operation, a conflict."""

    exit_code: int = USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConflictError(C128Error):
    """An entry of the series does not apply; the tree is left as described."""

    exit_code = FAILED

    def __init__(self, message: str, *, hint: str | None = None, report: dict | None = None) -> None:
        super().__init__(message, hint=hint)
        self.report = report or {}


class DifferenceError(ConflictError):
    """A finished command's tree is not what the series says (kept; the hint says how to undo)."""


class Interrupted(C128Error):
    """A Ctrl-C stopped an operation; the message says how to resume or undo it."""

    exit_code = INTERRUPTED

    @classmethod
    def by(cls, stop: KeyboardInterrupt, then: str) -> "Interrupted":
        """``interrupted (SIGTERM): <then>``, exit 128+N: the signal ``stop`` came from (``handles_errors``)."""
        signum = stop.args[0] if stop.args and isinstance(stop.args[0], int) else signal.SIGINT  # (``_stop``)
        error = cls(f"interrupted ({signal.Signals(signum).name}): {then}")
        error.exit_code = SIGNAL + signum
        return error

    def stop(self) -> KeyboardInterrupt:
        """The signal this stands for: a caller that ran the interrupted work in a scratch folder of its own
        (``watch``) unwinds by it, "no outcome", never a finding naming a folder that goes."""
        return KeyboardInterrupt(self.exit_code - SIGNAL if self.exit_code > SIGNAL else signal.SIGINT)


def what_is(path: object) -> str:
    """What is at ``path`` when it is not a regular file (for a one-line error): it never opens it (a FIFO: no hang)."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode  # type: ignore[arg-type]
    except OSError:
        return "a link to nothing" if os.path.islink(path) else "not there"  # type: ignore[arg-type]
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"))
    kind = next((k for test, k in kinds if test(mode)), "not a regular file")
    return f"{kind} (through a link)" if os.path.islink(path) else kind  # type: ignore[arg-type]


def need_file(path: object, missing: str, other: str) -> None:
    """Refuse ``path`` unless it is a regular file: ``missing: PATH does not exist``, else ``other: PATH is a FIFO, not
    a regular file`` (a FIFO was said not to exist)."""
    import os

    if os.path.isfile(path):  # type: ignore[arg-type]
        return
    if not os.path.lexists(path):  # type: ignore[arg-type]
        raise C128Error(f"{missing}: {path} does not exist")
    raise C128Error(f"{other}: {path} is {what_is(path)}, not a regular file")
