"""Test hook: interrupt this process at a named point, as a crash or a Ctrl-C would.

``C128PATCH_FAULT=<how>-<where>:<name>`` (several, comma-separated): ``how`` is ``kill`` (SIGKILL)
or ``sigint`` (SIGINT); ``where:name`` is a point the operations declare, e.g. ``before:<entry>``
(an entry is about to start), ``after:<entry>`` (its commit is made, the journal does not say so
yet), ``at:clone``, ``at:provenance``. Unset (always, outside tests), it does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "C128PATCH_FAULT"
_SIGNALS = {"kill": signal.SIGKILL, "sigint": signal.SIGINT}


def fault_point(where: str, name: str) -> None:
    wanted = os.environ.get(ENV, "")
    if not wanted:
        return
    for how, sig in _SIGNALS.items():
        if f"{how}-{where}:{name}" in wanted.split(","):
            os.kill(os.getpid(), sig)
