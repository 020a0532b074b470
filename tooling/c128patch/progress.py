"""Progress and console output (rich), silenced for --json runs."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Iterator, Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class Reporter(Protocol):
    def step(self, message: str) -> None: ...


class NullReporter:
    def step(self, message: str) -> None:
        return None

    def transfer(self, what: str, done: int, total: int | None) -> None:
        return None


def transfer_line(what: str, done: int, total: int | None, seconds: float) -> str:
    """``downloading sglang 0.5.22 wheel (file 3 of 4): 12.6 of 34.5 MB, 14 s`` (``...: 14 s`` when
    ``done`` is -1: bytes unknown)."""
    if done < 0:  # bytes unknown (an older pip): the time alone
        return f"{what}: {seconds:.0f} s"
    size = f"{done / 1e6:.1f} of {total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
    return f"{what}: {size}, {seconds:.0f} s"


class RichReporter:
    def __init__(self, progress: Progress, task: int) -> None:
        self._progress = progress
        self._task = task
        self._started: dict[str, float] = {}

    def step(self, message: str) -> None:
        self._progress.update(self._task, description=message, advance=1)

    def transfer(self, what: str, done: int, total: int | None) -> None:
        start = self._started.setdefault(what, time.monotonic())
        self._progress.update(self._task, description=transfer_line(what, done, total, time.monotonic() - start))


class PlainReporter:
    """Off a terminal: steps are silent (the command's output says what it did); a long transfer
    prints a plain line on stderr when it starts, every ``every`` seconds and when it ends. A
    transfer of unknown bytes (``done`` -1) says nothing for its first ``every`` seconds: one that
    ends (or fails) sooner prints no line of its own."""

    def __init__(self, stream: TextIO | None = None, every: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream, self._every, self._clock = stream, every, clock
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._ended: set[str] = set()

    def step(self, message: str) -> None:
        return None

    def transfer(self, what: str, done: int, total: int | None) -> None:
        now = self._clock()
        start = self._started.setdefault(what, now)
        if done < 0 and now - start < self._every:
            return
        if total is not None and done >= total:
            if what in self._ended:
                return
            self._ended.add(what)
        elif what in self._last and now - self._last[what] < self._every:
            return
        self._last[what] = now
        print(transfer_line(what, done, total, now - start), file=self._stream or sys.stderr, flush=True)


def transfer(reporter: Reporter, what: str, done: int, total: int | None) -> None:
    """Bytes of a long transfer (a download), for reporters that show them."""
    hook = getattr(reporter, "transfer", None)
    if hook is not None:
        hook(what, done, total)


# Off a terminal (a pipe, a file) a line is as long as its content: a table is never cut or folded
# to fit a width nobody sees (rich would take 80 columns, or $COLUMNS).
UNBOUNDED = 1_000_000


def is_terminal(stream: Any) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


def console(stderr: bool = True) -> Console:
    width = None if is_terminal(sys.stderr if stderr else sys.stdout) else UNBOUNDED
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


@contextlib.contextmanager
def reporter(enabled: bool, total: int | None = None, title: str = "working") -> Iterator[Reporter]:
    """A progress bar on stderr when interactive output is wanted and stderr is a terminal; plain
    lines for long transfers when it is not; a no-op for --json."""
    if not enabled:
        yield NullReporter()
        return
    if not is_terminal(sys.stderr):
        yield PlainReporter()
        return
    prog = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console(),
        transient=True,
    )
    with prog:
        task = prog.add_task(title, total=total)
        yield RichReporter(prog, task)
