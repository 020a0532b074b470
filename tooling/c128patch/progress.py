"""Progress and console output (rich), silenced for --json runs."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class Reporter(Protocol):
    def step(self, message: str) -> None: ...


class NullReporter:
    def step(self, message: str) -> None:
        return None


class RichReporter:
    def __init__(self, progress: Progress, task: int) -> None:
        self._progress = progress
        self._task = task

    def step(self, message: str) -> None:
        self._progress.update(self._task, description=message, advance=1)


def console(stderr: bool = True) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def reporter(enabled: bool, total: int | None = None, title: str = "working") -> Iterator[Reporter]:
    """A progress bar on stderr when interactive output is wanted; a no-op otherwise."""
    if not enabled:
        yield NullReporter()
        return
    prog = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console(),
        transient=True,
        disable=not sys.stderr.isatty(),
    )
    with prog:
        task = prog.add_task(title, total=total)
        yield RichReporter(prog, task)
