"""Processes that smoke starts: own process group, output to a log file, always stopped.

Every child runs in a new session (its own process group), so a Ctrl-C at the terminal reaches
only us and we decide how the child ends. :meth:`Managed.stop` sends SIGTERM to the group and to
every descendant found under ``/proc`` (children that left the group with ``setsid`` included),
then SIGKILL after a grace period, and reports any pid still alive. :func:`signals_raise` turns
SIGTERM/SIGHUP into an exception, so ``with`` blocks unwind and clean up on those too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence


class Interrupted(Exception):
    """SIGTERM or SIGHUP arrived while a managed process ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise :class:`Interrupted` (SIGINT already raises
    KeyboardInterrupt). Only in the main thread; elsewhere a no-op."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous: dict[int, object] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP held off while we clean up (a second Ctrl-C must not leave
    children behind); delivered as usual afterwards. Main thread only; elsewhere a no-op."""
    got: list[int] = []
    previous: dict[int, object] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, lambda signum, _f: got.append(signum))
    except ValueError:
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        for signum in got[:1]:
            os.kill(os.getpid(), signum)


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of ``pid`` from /proc, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(fields[1]), int(fields[2]), fields[0]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    if st is None:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True  # no /proc (not Linux): trust kill(0)
    return st[2] != "Z"


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return []
    for name in entries:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def group_members(pgid: int) -> list[int]:
    members = []
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return []
    for name in entries:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st[1] == pgid and st[2] != "Z":
                members.append(int(name))
    return members


def _signal(pids: Sequence[int], pgid: int | None, sig: int) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass
class Managed:
    """A child process in its own process group, its output going to ``log``."""

    name: str
    argv: list[str]
    log: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen | None = None
    started: float = 0.0
    seen: set[int] = field(default_factory=set)  # every pid ever seen under us
    leftover: list[int] = field(default_factory=list)

    def start(self) -> "Managed":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(self.env) if self.env is not None else None, cwd=self.cwd,
                start_new_session=True,
            )
        self.started = time.monotonic()
        self.seen.add(self.proc.pid)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None
        self.seen.update(descendants(self.proc.pid))
        return self.proc.poll()

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if it is still running after ``timeout`` seconds."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the group and every descendant, SIGKILL what is left after ``grace``
        seconds; reap. Returns the exit code (None if it never started). Idempotent."""
        if self.proc is None:
            return None
        with _shielded():
            return self._stop(grace)

    def _stop(self, grace: float) -> int | None:
        assert self.proc is not None
        pgid = self.proc.pid  # session leader: pgid == pid
        self.seen.update(descendants(self.proc.pid))
        if self.proc.poll() is None or group_members(pgid) or any(alive(p) for p in self.seen):
            _signal(sorted(self.seen), pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.proc.poll()
                self.seen.update(descendants(self.proc.pid))
                if self.proc.returncode is not None and not group_members(pgid) and not any(
                    alive(p) for p in self.seen
                ):
                    break
                time.sleep(0.1)
            _signal([p for p in self.seen if alive(p)], pgid if group_members(pgid) else None, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        end = time.monotonic() + 5
        while time.monotonic() < end and any(alive(p) for p in self.seen):
            time.sleep(0.05)
        self.leftover = sorted(p for p in self.seen if alive(p))
        return self.proc.returncode

    def __enter__(self) -> "Managed":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exit_description(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        return f"exit {code} ({signal.Signals(code - 128).name})"
    return f"exit {code}"
