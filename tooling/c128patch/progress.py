"""Progress and console output (rich), silenced for --json."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, TextIO

from c128patch.textsafe import one_line, plain

if TYPE_CHECKING:  # rich is imported where it prints: a command that prints no line (--json) never loads it
    from rich.console import Console
    from rich.progress import Progress


class Reporter(Protocol):
    def step(self, message: str) -> None: ...


class NullReporter:
    def step(self, message: str) -> None:
        return None

    def transfer(self, what: str, done: int, total: int | None) -> None:
        return None


def transfer_line(what: str, done: int, total: int | None, seconds: float) -> str:
    """``<what>: 12.6 of 34.5 MB, 14 s``, or ``<what>: 14 s`` when the bytes are unknown (``done`` -1)."""
    if done < 0:
        return f"{what}: {seconds:.0f} s"
    size = f"{done / 1e6:.1f} of {total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
    return f"{what}: {size}, {seconds:.0f} s"


class RichReporter:
    def __init__(self, progress: Progress, task: int) -> None:
        self._progress, self._task = progress, task
        self._started: dict[str, float] = {}

    def step(self, message: str) -> None:
        self._progress.update(self._task, description=plain(message), advance=1)

    def transfer(self, what: str, done: int, total: int | None) -> None:
        start = self._started.setdefault(what, time.monotonic())
        self._progress.update(self._task, description=plain(transfer_line(what, done, total, time.monotonic() - start)))


BEAT = 10.0  # seconds without a line: with start-up and a busy machine, a piped run is never silent 15 s


class PlainReporter:
    """Off a terminal, lines on stderr: ``<step>: <elapsed> s`` of the open step after ``beat`` (``BEAT``) s with no
    line, however many steps began in it (a timer thread, from the first step to ``close``); a transfer's line when
    it starts, every ``every`` s and at its end (unknown bytes, ``done`` -1: none in its first ``every`` s)."""

    def __init__(self, stream: TextIO | None = None, every: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, beat: float | None = None) -> None:
        self._stream, self._every, self._clock, self._beat = stream, every, clock, beat or BEAT
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._ended: set[str] = set()
        self._phase: tuple[str, float] | None = None
        self._wake, self._closed = threading.Event(), False

    def step(self, message: str) -> None:
        started, self._phase = self._phase, (message, self._clock())
        if started is None:
            threading.Thread(target=self._heartbeat, daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._closed:
            if self._wake.wait(self._beat):
                self._wake.clear()
            elif not self._closed:
                message, start = self._phase
                self._print(f"{message}: {self._clock() - start:.0f} s")

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _print(self, line: str) -> None:
        print(plain(line), file=self._stream or sys.stderr, flush=True)

    def transfer(self, what: str, done: int, total: int | None) -> None:
        now = self._clock()
        start, ended = self._started.setdefault(what, now), total is not None and done >= total
        if what in self._ended or (done < 0 and now - start < self._every) or (
                not ended and what in self._last and now - self._last[what] < self._every):
            return
        self._last[what] = now
        if ended:
            self._ended.add(what)
        self._print(transfer_line(what, done, total, now - start))
        self._wake.set()  # the beat counts from the last line said


def transfer(reporter: Reporter, what: str, done: int, total: int | None) -> None:  # a download's bytes, if shown
    getattr(reporter, "transfer", NullReporter().transfer)(what, done, total)


def is_terminal(stream: Any) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


def echo(text: str, stderr: bool = True) -> None:
    """``text`` as it is (``textsafe.plain``), flushed: what rich prints with no markup and no wrap, without its
    import (about 0.05 s CPU on this project's 2-core host); ``console`` is for tables and styled lines. Each of its
    lines stays one (``one_line``): a U+2028/U+2029 in upstream's text (bisect's subject) is a line break to some
    terminals and log viewers, shown as ``⏎``."""
    print("\n".join(map(one_line, text.split("\n"))), file=sys.stderr if stderr else sys.stdout, flush=True)


def console(stderr: bool = True) -> Console:
    """Off a terminal (a pipe, a file) a line is as long as its content: no table cut to a width nobody sees."""
    from rich.console import Console

    width = None if is_terminal(sys.stderr if stderr else sys.stdout) else 1_000_000
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


WIDTH = 100  # a table a person reads (issue 37): its width piped, and the most a terminal's takes


def table_console(stderr: bool = False) -> Console:
    """A table at most ``WIDTH`` columns wide (a narrower terminal's width on one), piped too: its cells wrap (a
    column made ``overflow="fold"`` folds a long word), nothing is cut; the details are in the verb's ``--json``."""
    import shutil

    from rich.console import Console

    on_terminal = is_terminal(sys.stderr if stderr else sys.stdout)
    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns) if on_terminal else WIDTH
    return Console(stderr=stderr, width=width, highlight=False, soft_wrap=False)


@contextlib.contextmanager
def reporter(enabled: bool, total: int | None = None, title: str = "working") -> Iterator[Reporter]:
    """A progress bar on a terminal's stderr, plain lines off one (``PlainReporter``). Not ``enabled`` (--json):
    nothing on a terminal; off one (CI's log) still the plain lines, on stderr: a long step is never silent."""
    if not enabled and is_terminal(sys.stderr):
        yield NullReporter()
        return
    if not is_terminal(sys.stderr):
        with contextlib.closing(PlainReporter()) as plain:
            yield plain
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    prog = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), TimeElapsedColumn(),
                    console=console(), transient=True)
    with prog:
        yield RichReporter(prog, prog.add_task(title, total=total))
