"""The console entry (`c128patch`) and `python -m c128patch`: the click CLI of cli/."""

import signal
import sys


def _starting(signum: int, _frame: object) -> None:
    """SIGTERM or SIGHUP as the tool starts (before a verb's handler): raised as Ctrl-C is, with its number; by default
    they ended it silently (exit 143, 129: nothing said, nothing done)."""
    raise KeyboardInterrupt(signum)


for _sig in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_sig) != signal.SIG_IGN:  # (nohup's stays ignored)
        signal.signal(_sig, _starting)

try:  # Ctrl-C as the tool starts (its imports are most of that): nothing was done, and a traceback said so
    import gc
    import os
    from typing import Any, TextIO

    from c128patch import cli
except KeyboardInterrupt as _stop:
    _num = _stop.args[0] if _stop.args and isinstance(_stop.args[0], int) else signal.SIGINT
    sys.stderr.write(f"c128patch: interrupted ({signal.Signals(_num).name}): no outcome; nothing was done\n")
    raise SystemExit(128 + _num) from None  # (exitcodes.SIGNAL + N: that module is not imported yet)


class ReaderGone:
    """``sys.stdout`` for a reader that may stop reading (``c128patch check | head -1``): once a write meets a closed
    pipe, the rest of the output goes to /dev/null and the command finishes with its own exit code (click would
    exit 1 at that write, in the middle of the work). Output that cannot be written (a full disk, ``> /dev/full``: a
    traceback) goes there too, and is said at the end (``lost``): one line, never an exit 0."""

    def __init__(self, stream: TextIO, closed: bool = False) -> None:
        self._stream = stream
        self.lost = ""  # why output was lost, where that is not a reader gone
        self._closed = closed  # stdout was closed (``c128patch lint >&-``): what is written is lost

    def _gone(self, exc: OSError) -> None:
        if not isinstance(exc, BrokenPipeError):
            self.lost = self.lost or (exc.strerror or str(exc))
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())  # what the stream still buffers is flushed there, at exit too
        os.close(null)

    def write(self, text: str) -> int:
        if self._closed and text:
            self.lost = self.lost or "stdout is closed"
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._gone(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._gone(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _reopen_closed() -> dict[int, bool]:
    """Which of stdout and stderr were closed (``>&-``), each now /dev/null: else the next file the tool opened (a
    lock, a report) took its number, and a child's output went into it."""
    closed = {}
    for fd in (1, 2):
        try:
            os.fstat(fd)
            closed[fd] = False
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            closed[fd] = True
    return closed


def main() -> None:
    """One short-lived process, whose programs (git, unshare, prlimit, the box's PATH) and their libraries are taken
    from the absolute entries of ``PATH`` and ``LD_LIBRARY_PATH`` only (``PATH=.:$PATH`` run from a tree ran the
    tree's ``./git``, ``LD_LIBRARY_PATH=:/x`` loaded its ``libpcre2-8.so.0`` into git); the cyclic collector runs
    less often (it walks every parsed syntax tree the contract keeps: derive ~15 % less CPU); cycles are still
    collected."""
    gc.set_threshold(100_000, 50, 100)
    for name in ("PATH", "LD_LIBRARY_PATH"):  # a relative entry ("", ".", "bin") finds programs or libraries in the
        if name in os.environ:  # current folder: a tree's (":/opt/x", an unset variable extended, loaded its .so)
            os.environ[name] = os.pathsep.join(p for p in os.environ[name].split(os.pathsep) if os.path.isabs(p))
    closed = _reopen_closed()
    if closed[1]:  # (python made sys.stdout None: the report went nowhere, exit 0)
        sys.stdout = open(1, "w", closefd=False)  # (fd 1 is /dev/null now)
    if closed[2]:
        sys.stderr = open(2, "w", closefd=False)
    out = sys.stdout = ReaderGone(sys.stdout, closed[1]) if sys.stdout is not None else None  # type: ignore[assignment]
    inspected = sys.flags.inspect and os.environ.pop("PYTHONINSPECT", "")  # the operator's environment, not ``-i``
    try:
        try:
            cli.main()  # click exits with the command's code
        except SystemExit as done:
            came = _hold_stops()  # (first: the verb is over)
            if out is not None:
                out.flush()
            if out is not None and out.lost:
                print(f"c128patch: error: its output could not be written to stdout ({out.lost}): what it said is lost",
                      file=sys.stderr)
                done = SystemExit(done.code or 2)  # (exitcodes.USAGE: the machine's failure, not the work's)
            _ignore_stops()
            if came and not (isinstance(done.code, int) and done.code > 128):  # (an interrupted verb's is the first's)
                cli.interrupted_after_the_verb(KeyboardInterrupt(came[0]))
            raise done from None
    except SystemExit as done:
        # an interrupted verb (128+N) exits now: in CPython's finalization after it, 2 of 80 SIGTERMed `lint` runs
        # ended by SIGINT (-2, its unhandled-KeyboardInterrupt exit) though the verb had said SIGTERM and exited 143
        if inspected or (isinstance(done.code, int) and done.code > 128):
            _exit_now(done.code)
        raise


_STOPS = ("SIGINT", "SIGTERM", "SIGHUP")


def _hold_stops() -> list[int]:
    """Past the verb, a stop signal is noted in the list returned (``_ignore_stops`` says it), never raised."""
    import signal

    came: list[int] = []
    for name in _STOPS:
        if signal.getsignal(sig := getattr(signal, name)) != signal.SIG_IGN:  # (nohup's stays ignored)
            signal.signal(sig, lambda signum, _frame: came.append(signum))
    return came


def _ignore_stops() -> None:
    """The stop signals ignored from here to the exit: CPython's finalization puts SIG_DFL back for a signal with a
    Python handler, and one that came then killed the process silently (-2, -15) after a verb that had done its work
    (`refresh` had written the series: 2 of 70 SIGINTs near its end, helper 169)."""
    import signal

    for name in _STOPS:
        if signal.getsignal(sig := getattr(signal, name)) != signal.SIG_IGN:
            signal.signal(sig, signal.SIG_IGN)


def _exit_now(code: object) -> None:
    """Exit with ``code`` as ``SystemExit`` would, where ``PYTHONINSPECT`` is set: the interpreter then takes no
    ``SystemExit`` (every verb exited 1 with its traceback, the verb's code lost) and opens its prompt on a terminal
    (where ``PYTHONSTARTUP`` runs)."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code or 0)


if __name__ == "__main__":
    main()
