"""Processes that smoke starts: each in its own session and process group, output to a log file, always
stopped (SIGTERM to the group and every descendant seen under /proc, SIGKILL after a grace period)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from c128patch.procs import Group


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP held off while we clean up (a second Ctrl-C must not orphan children), then delivered;
    main thread only, elsewhere a no-op. (SIGTERM/SIGHUP otherwise unwind a verb as Ctrl-C: ``cli.common``.)"""
    got: list[int] = []
    previous: dict[int, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, lambda signum, _f: got.append(signum))
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for signum in got[:1]:
            os.kill(os.getpid(), signum)


@dataclass(frozen=True)
class ProcStat:
    ppid: int
    pgid: int
    state: str
    start: int  # start time since boot, in clock ticks: tells a pid from a later reuse of it


def _stat(pid: int) -> ProcStat | None:
    """``pid``'s entry in /proc, or None when it is gone (or there is no /proc)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return ProcStat(int(fields[1]), int(fields[2]), fields[0], int(fields[19]))


def _all_stats() -> dict[int, ProcStat]:
    stats = {int(n): _stat(int(n)) for n in (os.listdir("/proc") if os.path.isdir("/proc") else []) if n.isdigit()}
    return {pid: st for pid, st in stats.items() if st is not None}


def group_members(pgid: int) -> list[int]:
    return [pid for pid, st in _all_stats().items() if st.pgid == pgid and st.state != "Z"]


@dataclass
class Managed:
    """A child process in its own process group, its output going to ``log``."""

    name: str
    argv: list[str]
    log: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen | None = None
    seen: dict[int, int] = field(default_factory=dict)  # every pid seen under us -> its start time
    leftover: list[int] = field(default_factory=list)
    grace: float = 15.0  # seconds between SIGTERM and SIGKILL on stop

    def start(self) -> "Managed":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = Group(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=dict(self.env) if self.env is not None else None, cwd=self.cwd)
        st = _stat(self.proc.pid)
        self.seen[self.proc.pid] = st.start if st else -1
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _watch(self) -> None:
        """Every live descendant into ``seen``, with its start time (Linux /proc; none elsewhere)."""
        stats = _all_stats()
        children: dict[int, list[int]] = {}
        for child, st in stats.items():
            children.setdefault(st.ppid, []).append(child)
        todo = [self.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                if stats[child].state != "Z":
                    self.seen.setdefault(child, stats[child].start)
                todo.append(child)

    def _ours(self, pid: int) -> bool:
        """Still the very process we saw (not a later process that got its pid), and alive."""
        st = _stat(pid)
        return st is not None and st.state != "Z" and (self.seen.get(pid, -1) in (-1, st.start))

    def poll(self) -> int | None:
        self._watch()
        return self.proc.poll()

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the group and every descendant seen, SIGKILL the rest after ``grace`` s (default: ours)."""
        if self.proc is None:
            return None
        with _shielded():
            self._watch()
            if self.proc.poll() is None or self._remaining():
                self._signal(signal.SIGTERM)
                deadline = time.monotonic() + (self.grace if grace is None else grace)
                while time.monotonic() < deadline and (self.proc.poll() is None or self._remaining()):
                    time.sleep(0.1)
                if self.proc.poll() is None or self._remaining():
                    self._signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            end = time.monotonic() + 5
            while time.monotonic() < end and self._remaining():
                time.sleep(0.05)
            self.leftover = self._remaining()
            return self.proc.returncode

    def _signal(self, sig: int) -> None:
        # The group while it has members (a pgid is never reused while its group lives), and
        # each process seen under us that is provably still the same process.
        if group_members(self.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        for pid in sorted(self.seen):
            if (pid != self.pid or self.proc.returncode is None) and self._ours(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def _remaining(self) -> list[int]:
        if self.proc.poll() is None:
            self._watch()
        return sorted({*group_members(self.pid), *(p for p in self.seen if self._ours(p))}
                      - ({self.pid} if self.proc.returncode is not None else set()))

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
