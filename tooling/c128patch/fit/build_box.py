"""A PEP 517 source build (``python -m build``) in the sealed box: the ``runner`` ``wheel.srcbuild.build_wheel`` takes
(``cli/build.py`` passes it: the box is ``fit``'s, a layer above ``wheel``)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.fit.env import PIP_FILES, pip_settings
from c128patch.fit.sandbox import Sealed

# the build front end in the box: its stdout and stderr into the log (the box reads back only 16 MiB), run from the
# source folder: ``-c DRIVER LOG CWD BUILD-ARGS...``
_DRIVER = """import os, runpy, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(fd, 1); os.dup2(fd, 2); os.chdir(sys.argv[2])
sys.argv = ["build", *sys.argv[3:]]
runpy.run_module("build", run_name="__main__", alter_sys=True)
"""
BUILD_TIMEOUT = 3600.0  # seconds a source build may take in the box


def run_build(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> int:
    """``python -m build`` (``cmd``) run in ``fit/sandbox.py``'s sealed box: it runs the target tree's PEP 517 backend.
    Its environment is the box's allow-list and ``env`` (no token; ``HOME`` a scratch folder), it writes only its
    build folder (``log``'s: the exported tree, the wheel, the log) and reads only the system's folders and what it
    runs. ``--no-isolation``: offline, none of the operator's pip settings; else the network and the operator's pip
    settings, which pip needs to install the build requirements (the backend sees them too)."""
    if cmd[:3] != [sys.executable, "-m", "build"]:
        raise C128Error(f"not a build command: {cmd[:3]}")
    offline, work = "--no-isolation" in cmd, log.parent
    with procs.scratch("c128build-pipconf-") as conf:
        pip_env, reads = ({}, []) if offline else pip_settings(conf)
        try:
            box = Sealed(sys.executable, ["-c", _DRIVER, str(log), str(cwd), *cmd[3:]], BUILD_TIMEOUT,
                         env={**pip_env, **env}, offline=offline, writable=(str(work),), readable=tuple(reads),
                         files=PIP_FILES, pip=not offline)
            _, err = box.wait()
        except C128Error as exc:  # did not start, ran past its time, wrote past its limits
            _append(log, f"\n{exc.message}\n")
            return 1
    if box.returncode and err.strip():  # what it said before its output went to the log (an interpreter's error)
        _append(log, err)
    return box.returncode


def _append(log: Path, text: str) -> None:
    """``text`` added to the build's log, never through a link the box left in its place (nor into a FIFO)."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError:
        return
    with os.fdopen(fd, "a") as out:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            out.write(text)
