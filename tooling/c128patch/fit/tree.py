"""Reading the target of the contract: the files of one tree-ish (``TreeReader``), and which of their
lines are ours (``our_lines``: what ``git diff`` of the tree against its upstream commit adds,
parsed with unidiff) with upstream's numbering of the others (``upstream_line``)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Protocol

from unidiff import Hunk, PatchSet

from c128patch.git import BlobBatch, Git

PY_ROOT = "python"
PACKAGE = "sglang"


def module_name(path: str) -> str | None:
    """The module a tree path holds (``python/sglang/a/__init__.py`` -> ``sglang.a``); None: no Python module."""
    p = PurePosixPath(path)
    if p.suffix != ".py" or not p.parts or p.parts[0] != PY_ROOT:
        return None
    parts = list(p.with_suffix("").parts[1:])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Reader(Protocol):
    """What resolving reads: a tree's file paths and their texts (``TreeReader``; a folder on disk for the tier)."""

    files: set[str]

    def text(self, path: str) -> str | None: ...


class TreeReader:
    """Files of one tree-ish under ``root``, read through one ``git cat-file --batch``."""

    def __init__(self, git: Git, rev: str, root: str = f"{PY_ROOT}/{PACKAGE}") -> None:
        self.git, self.rev = git, rev
        self.files = set(git.out("ls-tree", "-r", "--name-only", rev, "--", root).splitlines())
        self._texts: dict[str, str | None] = {}
        self._batch = BlobBatch(git)

    def text(self, path: str) -> str | None:
        """The file's text; None where the tree has no such file or it is binary."""
        if path not in self._texts:
            data = self._batch.read(f"{self.rev}:{path}") if path in self.files else None
            self._texts[path] = None if data is None or b"\0" in data else data.decode(errors="replace")
        return self._texts[path]

    def close(self) -> None:
        self._batch.close()


def our_lines(git: Git, upstream: str, head: str,
              paths: list[str]) -> tuple[dict[str, set[int]], dict[str, list[Hunk]]]:
    """path -> the line numbers on ``head`` that ``upstream..head`` adds (``git diff -U0``), and path ->
    its hunks (for ``upstream_line``)."""
    if not paths:
        return {}, {}
    diff = git.run("diff", "-U0", "--no-renames", "--no-color", upstream, head, "--", *paths).stdout
    files = [f for f in PatchSet(diff) if len(f)]  # a binary or mode-only change: no lines
    return ({f.path: {line.target_line_no for hunk in f for line in hunk if line.is_added} for f in files},
            {f.path: list(f) for f in files})


def upstream_line(hunks: list[Hunk], line: int) -> int:
    """A line of the patched file (not one the patch adds) as it numbers in upstream's file."""
    delta = 0
    for h in hunks:
        start, count = h.target_start, h.target_length
        if (count and start + count - 1 < line) or (not count and start < line):
            delta += count - h.source_length
    return line - delta
