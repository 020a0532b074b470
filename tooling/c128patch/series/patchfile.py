"""What a format-patch file says: its header trailers, the paths and hunks it touches."""

from __future__ import annotations

import email
import email.policy
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from unidiff import Hunk, PatchSet
from unidiff.errors import UnidiffParseError

from c128patch.errors import C128Error
from c128patch.git import Git, unquote
from c128patch.series.manifest import read_series_file
from c128patch.series.paths import check_relpath
from c128patch.series.trailers import check_message, find_trailers

_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: \d+)?$")
_MOVED = re.compile(r"^(rename|copy) (from|to) (.*)$")  # git reads these paths, unidiff the header's
NULL_BLOB = "0" * 40


def hunk_header(hunk: Hunk, *, section: bool = False) -> str:
    """``@@ -a,b +c,d @@`` of a unidiff hunk (with its section text when ``section``): the one spelling."""
    head = f"@@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"
    return f"{head} {hunk.section_header}" if section and hunk.section_header else head


@dataclass
class PatchInfo:
    path: Path
    subject: str
    body: str
    trailers: dict[str, str]
    files: list[str]  # post-image paths (pre-image for deletions)
    patchset: PatchSet = field(repr=False)

    @property
    def blobs(self) -> dict[str, tuple[str, str]]:
        """path -> (preimage, postimage) blob ids of a ``--full-index`` patch's ``index`` lines (full ids only)."""
        out = {}
        for pf in self.patchset:
            for line in pf.patch_info:
                m = _INDEX.match(str(line).rstrip("\n"))
                if m and len(m.group(1)) == len(m.group(2)) == 40:
                    out[_strip(pf.path)] = (m.group(1), m.group(2))
        return out

    @property
    def paths(self) -> list[str]:
        """Every path the patch reads or writes (both sides of a rename)."""
        sides = (side for pf in self.patchset for side in (pf.source_file, pf.target_file))
        return list(dict.fromkeys(_strip(side) for side in sides if side != "/dev/null"))

    @property
    def added(self) -> list[str]:
        """Every line the patch adds, in order."""
        return [line.value for pf in self.patchset for hunk in pf for line in hunk if line.is_added]

    @property
    def symlinks(self) -> list[str]:
        """Paths the patch makes into symlinks (new or by a mode change): by the mode's type bits, as git reads a mode
        (``120644`` is a symlink to git, as ``120000`` is)."""
        return [_strip(pf.target_file) for pf in self.patchset if _is_link(pf.target_mode)]

    @property
    def gitlinks(self) -> list[str]:
        """Paths the patch makes into submodule entries (``160000``, new or by a mode change), by the type bits: a
        commit id in the tree where a file was, not a file a series carries."""
        return [_strip(pf.target_file) for pf in self.patchset if _is_link(pf.target_mode, 0o160000)]

    @property
    def needs(self) -> list[str]:
        """Paths that must exist before the patch (it does not create them)."""
        return [_strip(pf.path) for pf in self.patchset if not pf.is_added_file]

    def hunk_at(self, path: str, line: int) -> tuple[int, str] | None:
        """(1-based hunk number, header) of the hunk of ``path`` whose pre-image starts at ``line``."""
        for pf in (pf for pf in self.patchset if _strip(pf.path) == path):
            before = [(i, hunk) for i, hunk in enumerate(pf, 1) if hunk.source_start <= line]  # hunks go in order
            return (before[-1][0], hunk_header(before[-1][1], section=True)) if before else None
        return None


def _is_link(mode: str | None, kind: int = 0o120000) -> bool:
    try:
        return int(mode or "0", 8) & 0o170000 == kind
    except ValueError:
        return False


def _strip(path: str) -> str:
    """A patch's path as git reads it: C-quoted (``"b/.gitattributes"``, ``"b/\\056git"``: unidiff keeps the quotes,
    every rule read the quoted name and passed it) unquoted, its ``a/``/``b/`` prefix off."""
    path = unquote(path)
    return path[2:] if path.startswith(("a/", "b/")) else path


def _moved_elsewhere(pf) -> str | None:
    """A ``rename``/``copy`` ``from``/``to`` line of the file's extended header naming another path than its
    ``diff --git`` header: git applies it there, unidiff (and so every path check) reads the header."""
    lines = [str(line).rstrip("\n") for line in pf.patch_info]
    start = max((i for i, line in enumerate(lines) if line.startswith("diff --git ")), default=len(lines))
    for line in lines[start + 1:]:
        m = _MOVED.match(line)
        if m and unquote(m.group(3)) != _strip(pf.source_file if m.group(2) == "from" else pf.target_file):
            return line
    return None


def _named_elsewhere(text: str, patchset) -> str | None:
    """A ``---``/``+++`` line naming another path than its file's ``diff --git`` header: git takes the file's old
    (new) path from it, unidiff (and so every check) the header's. ``diff --git a/x b/x`` with ``--- a/y`` was a
    rename of y to x to git (y removed, x written from y's lines), "x modified" to lint, check and audit
    (helper 167)."""
    files, pf, header = iter(patchset), None, False
    for line in text.split("\n"):
        if line.startswith("diff --git "):
            pf, header = next(files, None), True
            # a header without a/ and b/: git's -p1 drops its first part (`diff --git python/x python/x` with no hunk
            # made x, read here as python/x)
            if pf is not None and any(unquote(side) != "/dev/null" and not unquote(side).startswith(("a/", "b/"))
                                      for side in (pf.source_file, pf.target_file)):
                return line
        elif line.startswith("@@"):
            header = False
        elif header and pf is not None and line.startswith(("--- ", "+++ ")):
            name = unquote(line[4:].split("\t", 1)[0])  # (git ends the name at a tab)
            # git (am and apply take -p1) drops its first part, whatever it is: `--- d/x` is x's old path, not d/x's
            if name != "/dev/null" and name.partition("/")[2] != _strip(pf.source_file if line[0] == "-"
                                                                          else pf.target_file):
                return line
    return None


def split_message(text: str) -> tuple[str, str]:
    """(mail header + message, rest) of a format-patch text; rest starts at '---' or the diff."""
    cut = min([i for i in (text.find("\n---\n"), text.find("\ndiff --git ")) if i >= 0], default=len(text))
    return text[:cut], text[cut:]


_PARSED: dict[tuple[Path, bytes], PatchInfo] = {}  # (path, content) -> parsed: a replay reads each file often
_GIT_PARSED: set[tuple[Path, bytes]] = set()  # files git's parser took in one call for several (read_patches)


def _read(path: Path) -> tuple[tuple[Path, bytes], bytes]:
    try:
        raw = read_series_file(path)
    except OSError as exc:
        raise C128Error(f"cannot read patch {path}: {exc.strerror}") from exc
    return (path.resolve(), hashlib.sha256(raw).digest()), raw


def read_patch(path: Path) -> PatchInfo:
    """Parse a git format-patch file; a corrupt one is a C128Error naming the file."""
    key, raw = _read(path)
    if key not in _PARSED:
        _PARSED[key] = _parse(path, raw, key in _GIT_PARSED)
    return _PARSED[key]


def read_patches(paths: list[Path]) -> list[PatchInfo]:
    """``read_patch`` of each; git's parser reads the new ones in one call (one by one to name a bad one)."""
    new = {key: path for path in paths if (key := _read(path)[0]) not in _PARSED}
    if len(new) > 1:
        git = Git(worktree=next(iter(new.values())).parent, filters_off=[])
        if git.ok("apply", "--numstat", *(str(key[0]) for key in new)):
            _GIT_PARSED.update(new)
    return [read_patch(path) for path in paths]


def _parse(path: Path, raw: bytes, git_parsed: bool = False) -> PatchInfo:
    try:  # first: every check below reads the text as it is, git am reads the message it decodes
        check_message(raw, several=True)  # a run's file may hold several commits (test_faults)
    except ValueError as exc:
        raise C128Error(f"corrupt patch {path.name}: {exc}") from None
    text = raw.decode("utf-8", errors="replace")
    head, sep = split_message(text)
    if not sep or not text.startswith("From "):
        raise C128Error(f"corrupt patch {path.name}: not a git format-patch file (no mail header)")
    msg = email.message_from_string(head.split("\n", 1)[1], policy=email.policy.default)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(msg.get("Subject", "")).strip())
    body = msg.get_payload() if not msg.is_multipart() else ""  # (a str: parsed from one)
    try:
        patchset = PatchSet(text)
    except UnidiffParseError as exc:  # (its message ends in the patch line's own newline: an empty line in lint)
        raise C128Error(f"corrupt patch {path.name}: {str(exc).strip()}") from exc
    if len(patchset) == 0:
        raise C128Error(f"corrupt patch {path.name}: no diff in it")
    info = PatchInfo(path, subject, body.strip(), dict(find_trailers(body)), [_strip(pf.path) for pf in patchset],
                     patchset)
    for pf in patchset:
        if line := _moved_elsewhere(pf):
            raise C128Error(f"corrupt patch {path.name}: '{line}' names another path than its diff header "
                            f"({pf.source_file} -> {pf.target_file}), the one every check reads")
    if line := _named_elsewhere(text, patchset):
        raise C128Error(f"corrupt patch {path.name}: '{line}' " + (
            "has no a/ and b/ prefixes (git drops each path's first part: another path than every check reads)"
            if line.startswith("diff --git ") else
            "names another path than its diff header, the one every check reads (git would take it as a rename)"))
    for side in info.paths:  # the path rules first: an unsafe patch is refused as such, whatever else it is
        check_relpath(side, f"patch {path.name}")
    # git's own parser is stricter than unidiff about stray lines between hunks.
    proc = None if git_parsed else Git(worktree=path.parent, filters_off=[]).run(
        "apply", "--numstat", str(path.resolve()), check=False)
    if proc is not None and proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["git apply cannot parse it"])[-1]
        raise C128Error(f"corrupt patch {path.name}: {detail.removeprefix('error: ')}")
    binary = next((pf.path for pf in patchset if pf.is_binary_file), None)
    if binary is not None:
        raise C128Error(f"corrupt patch {path.name}: binary hunks are not supported ({binary})")
    return info
