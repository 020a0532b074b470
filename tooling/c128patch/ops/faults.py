"""Test hook: interrupt this process at a named point, as a crash or a Ctrl-C would.

``C128PATCH_FAULT=<how>-<where>:<name>`` (several, comma-separated): ``how`` is ``kill`` (SIGKILL), ``sigint``
(SIGINT) or ``fail`` (an ``OSError`` there, as a full disk would raise); ``where:name`` is a point the operations
declare, e.g. ``before:<entry>`` (an entry is about to start), ``after:<entry>`` (its commit is made, the journal does
not say so yet), ``at:clone``, ``at:provenance``. Unset (always, outside tests), it does nothing.
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
