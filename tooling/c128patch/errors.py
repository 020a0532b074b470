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
