"""Re-wrapped context: a patch whose hunks sit on lines upstream joined or split (black joining a
call onto one line, or splitting one over several), placed ignoring line breaks.

Tried where strict, 3-way and whitespace-insensitive merges all fail (``ops.replay``). Each hunk is
found in upstream's file by its preimage with every whitespace character left out, line breaks
too, and a comma before a closing bracket (the trailing comma black adds when it splits a call and
drops when it joins one). The hunk's context may start or end inside a line upstream joined, but
its change must begin and end at line boundaries of upstream's file, and each line that starts at
the same place in both must be indented the same (a re-indented block is no re-wrap). The lines
the hunk removes, as upstream wrapped them, are replaced by the lines it adds, as the patch has
them; upstream's wrapping of everything around them is kept. Where the text occurs more than
once, the place nearest the hunk's own line is taken. One hunk that does not fit fails the patch.
"""

from __future__ import annotations

import re

from unidiff import PatchedFile

_DROPPED = re.compile(r",(?=[)\]}])")


def _stream(lines: list[str]) -> tuple[str, list[int]]:
    """The lines' text without whitespace (a blank line: one mark) and each line's offset in it, then the end."""
    parts = ["".join(line.split()) or "\n" for line in lines]
    text = "".join(parts)
    cut = [m.start() for m in _DROPPED.finditer(text)]  # a comma before a closing bracket
    starts, at, k = [], 0, 0
    for part in [*parts, ""]:
        while k < len(cut) and cut[k] < at:
            k += 1
        starts.append(at - k)
        at += len(part)
    return _DROPPED.sub("", text), starts


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _place(lines: list[str], pre: list[str], cut: tuple[int, int], near: int) -> tuple[int, int] | None:
    """The lines (first, end) of ``lines`` that ``pre[cut[0]:cut[1]]`` covers, the nearest to line ``near``."""
    text, starts = _stream(lines)
    ptext, pstarts = _stream(pre)
    line_at: dict[int, list[int]] = {}
    for i, offset in enumerate(starts):
        line_at.setdefault(offset, []).append(i)
    tries = [(ptext, pstarts)]
    if ptext.endswith(","):  # its last line's comma, which a closing bracket after the hunk drops upstream
        tries.append((ptext[:-1], [min(o, len(ptext) - 1) for o in pstarts]))
    found = []
    for ptext, pstarts in tries:
        q = text.find(ptext) if ptext else -1
        while q >= 0:
            first, end = line_at.get(q + pstarts[cut[0]], []), line_at.get(q + pstarts[cut[1]], [])
            aligned = all(_indent(lines[line_at[q + pstarts[k]][0]]) == _indent(pre[k]) for k in range(len(pre))
                          if pre[k].strip() and line_at.get(q + pstarts[k], [len(lines)])[0] < len(lines))
            if len(first) == 1 and len(end) == 1 and aligned:
                found.append((first[0], end[0]))
            q = text.find(ptext, q + 1)
    return min(found, key=lambda f: abs(f[0] - near)) if found else None


def rewrapped(text: str, pf: PatchedFile) -> str | None:
    """``text`` with the hunks of ``pf`` placed as the module says; None when one does not fit."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        return None
    shift = 0
    for hunk in pf:
        kinds = [line.line_type for line in hunk]
        if "\\" in kinds or not any(k in "+-" for k in kinds):
            return None
        first = next(i for i, k in enumerate(kinds) if k in "+-")
        last = max(i for i, k in enumerate(kinds) if k in "+-")
        pre = [line.value for line in hunk if not line.is_added]
        lead = sum(1 for k in kinds[:first] if k == " ")
        middle = list(hunk)[first: last + 1]
        removed = sum(1 for line in middle if not line.is_added)
        place = _place(lines, pre, (lead, lead + removed), hunk.source_start - 1 + lead + shift)
        if place is None:
            return None
        start, end = place
        added = [line.value for line in middle if not line.is_removed]
        lines[start:end] = added
        shift = start + len(added) - (hunk.source_start - 1 + lead + removed)
    return "".join(lines)
