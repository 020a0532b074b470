"""Test hook: interrupt this process at a named point, as a crash or a Ctrl-C would.

``C128PATCH_FAULT=<how>-<where>:<name>`` (comma-separated): ``how`` is ``kill`` (SIGKILL), ``sigint`` or ``fail``
(an ``OSError``, as a full disk raises); ``where:name`` a point the operations declare: ``before:<entry>``,
``after:<entry>`` (its commit made, the journal not saying so yet), ``at:clone``, ``at:provenance``. Unset: nothing.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "C128PATCH_FAULT"
_SIGNALS = {"kill": signal.SIGKILL, "sigint": signal.SIGINT}


def fault_point(where: str, name: str) -> None:
    wanted = os.environ.get(ENV, "").split(",")  # unset: [""], which names no point
    for how, sig in _SIGNALS.items():
        if f"{how}-{where}:{name}" in wanted:
            os.kill(os.getpid(), sig)
    if f"fail-{where}:{name}" in wanted:
        raise OSError(errno.EIO, f"injected fault at {where}:{name}")
