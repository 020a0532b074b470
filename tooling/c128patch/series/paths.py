"""What input may name: the one confinement rule for every path taken from a series, a layer, a
config, a journal, a ledger or a patch (``confine``), and for entry names, from which the paths of
the ledger and of reports are built (docs/security.md)."""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Iterable

from c128patch.errors import C128Error, what_is
from c128patch.git import folded_name, is_git_dir_name
from c128patch.textsafe import HIDDEN

ENTRY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}")
ENTRY_NAME_RULE = "1-80 characters of a-z 0-9 . _ -, starting with a letter or digit"
PROVENANCE_PATH = "python/sglang/c128patch_provenance.json"  # (series.provenance's; here for series.plan)
_GIT_FILES = (".gitattributes", ".gitmodules")  # the files that name programs and URLs for git
_GIT_FILES_83 = re.compile(r"(gitmod|gi7eba|gitatt|gi7d29)~[1-9]")  # their NTFS short names, as git itself checks
# C0, line and paragraph separators, and all ``textsafe.plain`` takes out of what it shows (DEL, C1, bidi controls,
# zero-width characters: a path holding U+200B or U+061C was shown as another): no series path nor wheel member
CONTROL = re.compile(rf"[\x00-\x1f\u2028\u2029{HIDDEN}]")
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
# bytes of a name's part (NAME_MAX) and of the whole name: a longer one was git's index entry and Linux's ENAMETOOLONG
# at apply's first stat of it (a traceback), after lint and check had passed it
MAX_PART, MAX_PATH = 255, 1024


def _unsafe(path: str, what: str, why: str) -> C128Error:
    return C128Error(f"unsafe path in {what}: {path!r} ({why})")


def check_relpath(path: str, what: str) -> str:
    """``path`` when a series may name it: relative, inside the tree, no control character, and
    nothing of git's own (a ``.git`` folder, ``.gitattributes``, ``.gitmodules``)."""
    if CONTROL.search(path):
        raise _unsafe(path, what, "it holds a control character")
    if _NOT_UTF8.search(path):  # (git's bytes kept as surrogates, ``git.Git._raw``): no manifest can name it
        raise _unsafe(path, what, "its name is not UTF-8")
    if len(path.encode(errors="surrogateescape")) > MAX_PATH or \
            any(len(p.encode(errors="surrogateescape")) > MAX_PART for p in path.split("/")):
        raise _unsafe(path, what, f"name too long: at most {MAX_PART} bytes a part and {MAX_PATH} in all")
    parts = PurePosixPath(path).parts  # (which drops a ``.`` part: ``python/./sglang/x`` passed, git refused it later)
    if not path or path.startswith(("/", "~")) or "\\" in path or path.endswith("/") or "//" in path or \
            any(unicodedata.normalize("NFKC", p) in ("..", ".", "") for p in path.split("/")):  # (full-width ．． too)
        raise _unsafe(path, what, "must be relative, inside the tree")
    for part in parts:
        if is_git_dir_name(part):
            raise _unsafe(path, what, "git's own folder: a series may not write into it")
        if folded_name(part) in _GIT_FILES or _GIT_FILES_83.fullmatch(folded_name(part)):
            raise _unsafe(path, what, f"{part} decides what git runs and fetches: a series may not carry one")
    return path


def symlink_on_path(root: Path, path: Path) -> Path | None:
    """The first symlink among ``path`` and its folders below ``root``, if any."""
    rel = path.relative_to(root)
    return next((root / p for p in [*reversed(rel.parents[:-1]), rel] if (root / p).is_symlink()), None)


def confine(root: Path, path: str, what: str, *, regular: bool = False) -> Path:
    """``root/path`` for a ``path`` taken from input (``what`` names it): ``check_relpath``'s rules, no
    symlink on the way, inside ``root`` once resolved; ``regular``: it must be an existing regular file."""
    dest = root / check_relpath(path, what)
    link = symlink_on_path(root, dest)
    if link is not None:
        raise C128Error(f"unsafe path in {what}: {path} goes through the symlink {link.relative_to(root)} "
                        f"(-> {os.readlink(link)}) in {root}; nothing was written")
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(dest)]) != real_root:
        raise C128Error(f"unsafe path in {what}: {path} resolves outside {root}; nothing was written")
    if regular and not (dest.exists() and stat.S_ISREG(dest.stat().st_mode)):
        raise C128Error(f"unsafe path in {what}: {path} {not_a_file(dest)} in {root}")
    return dest


def not_a_file(path: Path) -> str:
    """Why ``path``, a file the manifest names, cannot be read as one: "is missing", or what it is instead
    (``errors.what_is``: a FIFO named as a patch file was said to be missing)."""
    kind = what_is(path)
    return "is missing" if kind == "not there" else f"is {kind}, not a regular file"


def inside(path: str) -> bool:
    """Does ``path`` pass ``check_relpath``?"""
    try:
        return bool(check_relpath(path, ""))
    except C128Error:
        return False


def check_entry_name(name: str, where: str) -> str:
    """``name`` when it matches ENTRY_NAME: it becomes a path (the ledger's folders) and a trailer."""
    if not ENTRY_NAME.fullmatch(name):
        raise C128Error(f"unsafe entry name in {where}: {name!r} (an entry name is {ENTRY_NAME_RULE})")
    return name


def duplicates(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted."""
    return sorted(n for n, count in Counter(names).items() if count > 1)


def check_under(path: str, folder: str, what: str) -> None:
    """Refuse ``path`` inside ``folder`` (both relative to the tree), e.g. the tree's hooks folder."""
    inside = len(PurePosixPath(path).parts) == 1 if folder == "." else \
        PurePosixPath(path) == PurePosixPath(folder) or PurePosixPath(folder) in PurePosixPath(path).parents
    if folder and inside:
        raise _unsafe(path, what, f"it is under {folder}, the folder git runs hooks from")
