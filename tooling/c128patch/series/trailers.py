"""The trailers c128patch writes into commit messages and patch headers: each name is defined here
only (stdlib only: reading a layer must not pull in the diff parser)."""

from __future__ import annotations

import re

ENTRY_TRAILER = "C128patch-Entry"  # the entry a commit or patch file is ("<layer>/<entry>" for a layer's)
SERIES_TRAILER = "C128patch-Series"  # the series name and version an overlay commit came from
GATE_TRAILER = "C128patch-Gate"  # the env gate that turns the entry on ("none (<why>)": always on)
_TRAILER = re.compile(r"^(C128patch-[A-Za-z-]+):\s*(.*)$", re.MULTILINE)


def find_trailers(text: str) -> list[tuple[str, str]]:
    """(name, value) of every ``C128patch-*`` trailer line in ``text``, in order."""
    return _TRAILER.findall(text)
