"""The sealed box every run of a target's code goes through (the behavioural tier): an allow-listed
environment (no tokens, ``HOME`` a fresh folder), isolated Python (``-I``: no current folder, user site
or ``PYTHON*`` variables on the path), a time limit, and its own process group, killed whole on exit (a
child it forks does not outlive it). Network is not cut off: the host gives no unprivileged way to."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from c128patch.errors import C128Error

# the environment the box keeps; the rest (tokens, credentials, PYTHON*) is dropped
KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES")
NOTICE = ("runs the target tree's code (imports its modules) in a sealed box: scrubbed environment, isolated "
          "Python, a time limit, its processes killed at the end; --no-run skips it")


def interpreter(python: str | None, tree: Path | None = None) -> str:
    """``--python``: a path from the current folder, a bare name on PATH; never a program inside ``tree``."""
    if python is None:
        return sys.executable
    found = os.path.abspath(python) if "/" in python else shutil.which(python)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise C128Error(f"--python {python}: no such interpreter (a path is taken from {Path.cwd()}, a name from PATH)")
    if tree is not None and any(Path(p).is_relative_to(t) for p in (found, os.path.realpath(found))
                                for t in (os.path.abspath(tree), os.path.realpath(tree))):
        raise C128Error(f"--python {python} lies inside the target tree {tree}: it would run the tree's own program; "
                        "pass an interpreter outside it")
    return found


class Sealed:
    """``python -I -B ARGS`` started in the box; ``wait`` gives (stdout, stderr); ``kill`` ends its whole group."""

    def __init__(self, python: str, args: list[str], timeout: float) -> None:
        self.timeout = timeout
        self.home = Path(tempfile.mkdtemp(prefix="c128box-"))
        env = {k: os.environ[k] for k in KEEP if k in os.environ}
        env.update(HOME=str(self.home), TMPDIR=str(self.home))
        self.out, self.err = (open(self.home / name, "w+b") for name in (".stdout", ".stderr"))  # noqa: SIM115
        try:
            self.proc = subprocess.Popen([python, "-I", "-B", *args], env=env, stdin=subprocess.DEVNULL,
                                         stdout=self.out, stderr=self.err, cwd=self.home, start_new_session=True)
        except OSError as exc:
            self.kill()
            raise C128Error(f"the target's code did not run: {exc}") from None

    def wait(self) -> tuple[str, str]:
        """What it printed, once it exits (not its children: they are killed); past the limit, an error."""
        try:
            self.proc.wait(timeout=self.timeout)
            for f in (self.out, self.err):
                f.seek(0)
            return self.out.read().decode(errors="replace"), self.err.read().decode(errors="replace")
        except subprocess.TimeoutExpired:
            raise C128Error(f"the target's code did not finish in {self.timeout:g} s") from None
        finally:
            self.kill()

    def kill(self) -> None:
        """Its process group killed (the leader's forks too), its files and ``HOME`` removed."""
        proc = getattr(self, "proc", None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for f in (self.out, self.err):
            f.close()
        shutil.rmtree(self.home, ignore_errors=True)
