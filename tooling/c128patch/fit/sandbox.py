"""The sealed box every run of a target's code goes through (the behavioural tier): an allow-listed
environment (no tokens, ``HOME`` a fresh folder), isolated Python (``-I``: no current folder, user site
or ``PYTHON*`` variables on the path), a time limit, and its own process group, killed whole on exit (a
child it forks does not outlive it). ``offline``: no network but loopback (``unshare -rn``, a user and network
namespace) where the host allows it; ``isolation`` says whether it did."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from c128patch.errors import C128Error
from c128patch.procs import Group
from c128patch.smoke.device import run_child

# the environment the box keeps; the rest (tokens, credentials, PYTHON*) is dropped
KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES")
NOTICE = ("runs the target tree's code (imports its modules) in a sealed box: scrubbed environment, isolated "
          "Python, no network where the host allows it, a time limit, its processes killed at the end; --no-run "
          "skips it")
# loopback up where ``ip`` is, then the command: run inside a fresh user and network namespace
_OFFLINE = ["unshare", "--user", "--map-root-user", "--net", "sh", "-c",
            'command -v ip >/dev/null && ip link set lo up; unset PWD OLDPWD SHLVL _; exec "$@"', "sh"]


@functools.cache
def isolation() -> str:
    """How the box cuts the network off here, or why it cannot (said in the tier's output)."""
    try:
        why = run_child([*_OFFLINE, "true"], 10)[1]
    except C128Error as exc:
        why = exc.message
    return f"network not cut off: no unprivileged network namespace here ({why})" if why else \
        "no network (loopback only: unshare -rn)"


def interpreter(python: str, tree: Path | None = None) -> str:
    """``--python``: a path from the current folder, a bare name on PATH; never a program inside ``tree``."""
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

    def __init__(self, python: str, args: list[str], timeout: float, *, env: dict[str, str] | None = None,
                 offline: bool = False) -> None:
        """``env``: variables the caller adds (the operator's, never the target's); ``offline``: ``isolation``."""
        self.timeout = timeout
        self.home = Path(tempfile.mkdtemp(prefix="c128box-"))
        scrubbed = {k: os.environ[k] for k in KEEP if k in os.environ} | (env or {})
        scrubbed.update(HOME=str(self.home), TMPDIR=str(self.home))
        self.out, self.err = (open(self.home / name, "w+b") for name in (".stdout", ".stderr"))  # noqa: SIM115
        cut = offline and not isolation().startswith("network not cut off")
        try:
            self.proc = Group([*(_OFFLINE if cut else []), python, "-I", "-B", *args], env=scrubbed,
                              stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err, cwd=self.home)
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
        if hasattr(self, "proc"):
            self.proc.end()
        for f in (self.out, self.err):
            f.close()
        shutil.rmtree(self.home, ignore_errors=True)
