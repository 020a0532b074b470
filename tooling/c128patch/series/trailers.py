"""The trailers c128patch writes into commit messages and patch headers: each name is defined here
only (stdlib only: reading a layer must not pull in the diff parser)."""

from __future__ import annotations

import re

ENTRY_TRAILER = "C128patch-Entry"  # the entry a commit or patch file is ("<layer>/<entry>" for a layer's)
SERIES_TRAILER = "C128patch-Series"  # the series name and version an overlay commit came from
GATE_TRAILER = "C128patch-Gate"  # the env gate that turns the entry on ("none (<why>)": always on)
_NAMES = {name.lower(): name for name in (ENTRY_TRAILER, SERIES_TRAILER, GATE_TRAILER)}
# as git reads a trailer: the name in any case, blanks before the colon
_TRAILER = re.compile(r"^(c128patch-[a-z-]+)[ \t]*:[ \t]*(.*)$", re.MULTILINE | re.IGNORECASE)


def find_trailers(text: str) -> list[tuple[str, str]]:
    """(name, value) of every ``C128patch-*`` trailer line in ``text``, in order, in any spelling git
    takes for one (case, blanks before the colon), named as defined here."""
    return [(_NAMES.get(name.lower(), name), value) for name, value in _TRAILER.findall(text)]
