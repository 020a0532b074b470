"""What a series may name: the one set of rules for every path it carries or writes (overlay
targets and sources, patch files, the paths inside patches) and for entry names, from which the
paths of the ledger and of reports are built (docs/security.md)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Iterable

from c128patch.errors import C128Error
from c128patch.git import folded_name, is_git_dir_name

ENTRY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}")
ENTRY_NAME_RULE = "1-80 characters of a-z 0-9 . _ -, starting with a letter or digit"
_GIT_FILES = (".gitattributes", ".gitmodules")  # the files that name programs and URLs for git


def _unsafe(path: str, what: str, why: str) -> C128Error:
    return C128Error(f"unsafe path in {what}: {path!r} ({why})")


def check_relpath(path: str, what: str) -> str:
    """``path`` when a series may name it: relative, inside the tree, no control character, and
    nothing of git's own (a ``.git`` folder, ``.gitattributes``, ``.gitmodules``)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise _unsafe(path, what, "it holds a control character")
    if not path or path.startswith(("/", "~")) or "\\" in path:
        raise _unsafe(path, what, "must be relative, inside the tree")
    parts = PurePosixPath(path).parts
    if any(p in ("..", ".", "") for p in parts) or path.endswith("/") or "//" in path:
        raise _unsafe(path, what, "must be relative, inside the tree")
    for part in parts:
        if is_git_dir_name(part):
            raise _unsafe(path, what, "git's own folder: a series may not write into it")
        if folded_name(part) in _GIT_FILES:
            raise _unsafe(path, what, f"{part} decides what git runs and fetches: a series may not carry one")
    return path


def check_entry_name(name: str, where: str) -> str:
    """``name`` when it matches ENTRY_NAME: it becomes a path (the ledger's folders) and a trailer."""
    if not ENTRY_NAME.fullmatch(name):
        raise C128Error(f"unsafe entry name in {where}: {name!r} (an entry name is {ENTRY_NAME_RULE})")
    return name


def duplicates(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted."""
    seen = list(names)
    return sorted({n for n in seen if seen.count(n) > 1})


def check_under(path: str, folder: str, what: str) -> None:
    """Refuse ``path`` inside ``folder`` (both relative to the tree), e.g. the tree's hooks folder."""
    inside = len(PurePosixPath(path).parts) == 1 if folder == "." else \
        PurePosixPath(path) == PurePosixPath(folder) or PurePosixPath(folder) in PurePosixPath(path).parents
    if folder and inside:
        raise _unsafe(path, what, f"it is under {folder}, the folder git runs hooks from")
