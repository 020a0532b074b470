"""The resolution ledger: conflict resolutions made during rebases, kept in the series repo.

A conflict is keyed by its entry and by a hash of its conflict blocks (marker labels normalized, so
the key does not depend on commit ids). Its resolution is stored as a small unified diff from the
conflicted file to the resolved one: only the conflict regions and their context lines, never a
whole upstream file. Each row says the range it was recorded on (``from``, ``onto``) and a second
key, ``match``, over the blocks with whitespace normalized.

On a later replay, a conflict is resolved by the row with the same key (``git apply``, strict: it
only fits the very same conflicted text), else by a row for the same entry and file with the same
``match`` key (``git apply --ignore-whitespace``). Either way the use names its row; one recorded
on another range, or matched only after whitespace normalization, is "reused from <range>".
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.jsonio import locked, write_atomic
from c128patch.series.manifest import Series, read_toml
from c128patch.series.paths import check_entry_name, check_relpath, confine

_KEY = re.compile(r"[0-9a-f]{1,64}")
_REV = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]{0,199}")  # a row's ``from``/``onto``: a git rev name, shown in reports
MAX_LEDGER = 1 << 20  # ledger.toml's bytes: ours holds 3 rows in 591 bytes; 5,000 rows of ~200 bytes fit
MAX_LEDGER_ROWS = 5000  # (a 64 MiB ledger took 15 s to parse, at every verb that reads it)
_PARSED: dict[bytes, dict] = {}  # ledger.toml's content digest -> its TOML (``read_toml``; rows are handed out copied)
_MARKER = re.compile(r"^(<{7}|={7}|>{7}|\|{7})(?: .*)?$", re.M)


def _rev_name(git: Git, rev: str) -> str:
    """``rev`` as a row's ``from``/``onto`` may hold it (``_REV``), else its commit's short id: a 240-character tag or
    `--onto v0.5.23~0` made ``record`` write a ledger ``rows`` refuses, every later rebase of the series refused."""
    return rev if _REV.fullmatch(rev) else (git.rev_parse(rev) or "0" * 12)[:12]


def normalize_markers(text: str) -> str:
    """Conflict markers without their labels (which name commits)."""
    return _MARKER.sub(lambda m: m.group(1), text)


def conflict_key(path: str, text: str, *, whitespace: bool = True) -> str:
    """A hash of ``path`` and ``text``'s conflict blocks (markers normalized; ``whitespace=False``: runs as one)."""
    blocks, inside, current = [], False, []
    for line in normalize_markers(text).splitlines():
        line = line if whitespace else " ".join(line.split())
        if line == "<" * 7:
            inside, current = True, [line]
        elif inside:
            current.append(line)
            if line == ">" * 7:
                blocks.append("\n".join(current))
                inside = False
    h = hashlib.sha256(path.encode() + b"\0" + "\0".join(blocks).encode())
    return h.hexdigest()[:20]


@dataclass
class Conflict:
    path: str
    key: str
    text: str  # the conflicted file, markers normalized
    match: str = ""  # the key with whitespace normalized

    @classmethod
    def of(cls, path: str, text: str) -> "Conflict":
        text = normalize_markers(text)
        return cls(path, conflict_key(path, text), text, conflict_key(path, text, whitespace=False))


@dataclass(frozen=True)
class Resolution:
    """One ledger row used on a conflict."""

    entry: str
    key: str  # the row's key
    path: str
    recorded: str  # the range it was recorded on: "v0.5.22..v0.5.23"
    reused: bool  # recorded on another range, or matched after whitespace normalization

    @property
    def ref(self) -> str:
        return f"{self.entry}:{self.key}"

    def describe(self) -> str:
        return f"{self.ref} ({self.path})" + (f", reused from {self.recorded}" if self.reused else "")


class Ledger:
    def __init__(self, series: Series) -> None:
        self.series = series
        self.root = series.patches_dir / "resolutions"
        self.index = self.root / "ledger.toml"

    def _of(self, entry: str) -> tuple[Ledger, str]:
        """The ledger of ``entry`` (a layer's own) and its name there, checked: it becomes a folder."""
        part, local = self.series.part(entry)
        return Ledger(part), check_entry_name(local, f"the ledger {self.index}")

    def rows(self) -> list[dict]:
        """The ledger's rows; a ledger that is not one (bad TOML, wrong shape) is a one-line error. Parsed once per
        content (a pull request's 64 MiB of rows was parsed again at every conflicting entry, loop and proof)."""
        if not os.path.lexists(self._confined("ledger.toml")):  # (read through no link of the series')
            return []
        confine(self.series.root, "patches/resolutions/ledger.toml", f"the ledger of {self.series.root}",
                regular=True)  # (a FIFO or a folder there was no ledger: its rows silently not used)
        bad = f"{self.index}: not a resolution ledger"
        doc = read_toml(self.index, bad, _PARSED, MAX_LEDGER)
        rows = doc.get("resolutions", [])
        if not isinstance(rows, list):
            raise C128Error(f"{bad} ('resolutions' must be an array of tables)")
        if len(rows) > MAX_LEDGER_ROWS:
            raise C128Error(f"{bad} ({len(rows)} resolutions, over the {MAX_LEDGER_ROWS} a ledger may hold)")
        for i, row in enumerate(rows, 1):
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("entry", "key", "file")) \
                    or not all(isinstance(row.get(k, ""), str) for k in ("match", "from", "onto")):
                raise C128Error(f"{bad} (resolution #{i} needs string fields entry, key and file)")
            if not _KEY.fullmatch(row["key"]):  # (a file's name: refused as read, before a rebase writes its journal)
                raise C128Error(f"unsafe ledger key in {self.index}: {row['key']!r} (a key is 1-64 hex digits)")
            # its entry becomes a folder and its file a tree path: both held to the rule as read (`lint` passed a row
            # naming entry '../../x' or file '/etc/passwd', found only where a rebase used it)
            check_entry_name(row["entry"], f"the ledger {self.index}")
            check_relpath(row["file"], f"the ledger {self.index}")
            for k in ("from", "onto"):  # free text of a pull request's that reaches "reused from ..." and reports
                if row.get(k) and not _REV.fullmatch(row[k]):
                    raise C128Error(f"{bad} (resolution #{i}: {k} = {row[k]!r} is not a git rev name)")
        for entry in {row["entry"] for row in rows}:  # each entry's folder confined as read (once: a ledger holds up
            # to MAX_LEDGER_ROWS rows): one that was a link out of the series passed `lint`, refused only where a rebase
            # used its row (helper 175)
            self._confined(entry)
        return [dict(row) for row in rows]

    def check(self) -> None:
        """Every ledger of the stack read (``rows``): a bad one refused before a rebase writes its journal."""
        for part in (self.series.ours, *self.series.layers):
            Ledger(part).rows()

    def diffs(self) -> list[Path]:
        """Each row's diff, a regular file inside the ledger (``confine``, stat only: a FIFO is never opened); one
        that is a link, a pipe, a folder or missing is one line for `lint` (it was silent; `rebase` refuses a link
        where it uses the row, and skips any other)."""
        return [confine(self.series.root, f"patches/resolutions/{row['entry']}/{row['key']}.diff",
                        f"the ledger of {self.series.root} (resolution {row['entry']}:{row['key']})", regular=True)
                for row in self.rows()]

    def has(self, entry: str) -> bool:
        """Does the ledger hold any resolution for ``entry``?"""
        ledger, local = self._of(entry)
        return any(r["entry"] == local for r in ledger.rows())

    def _diff_path(self, entry: str, key: str) -> Path:
        """Built from a name ``_of`` checked and a checked key: both come from files a pull request can change."""
        if not _KEY.fullmatch(str(key)):
            raise C128Error(f"unsafe ledger key in {self.index}: {key!r} (a key is 1-64 hex digits)")
        return self._confined(f"{check_entry_name(entry, 'the ledger')}/{key}.diff")

    @staticmethod
    def _only(git: Git, diff: Path, path: str) -> bool:
        """Does ``diff`` (a pull request's) change ``path``'s lines and nothing else, as git reads it? Else the row
        does not fit: one that also wrote other files in the tree, or made the file a symlink, was applied (and the
        symlink committed, which no series may carry)."""
        stat = git.run("apply", "--numstat", "-z", str(diff), check=False)
        summary = git.run("apply", "--summary", str(diff), check=False)
        return (stat.returncode == summary.returncode == 0 and not summary.stdout.strip()
                and re.fullmatch(r"(\d+|-)\t(\d+|-)\t" + re.escape(path) + "\0", stat.stdout) is not None)

    def _confined(self, name: str) -> Path:
        """``patches/resolutions/<name>`` through the confinement rule: a series (a pull request's) holding that folder
        or an entry's as a link had ``record`` write through it, outside the series."""
        return confine(self.series.root, f"patches/resolutions/{name}", f"the ledger of {self.series.root}")

    @staticmethod
    def conflicts(git: Git, paths: list[str]) -> list[Conflict]:
        """The unmerged files as they stand, markers normalized in the work tree too."""
        out = []
        for path in paths:
            file = git.worktree / path  # type: ignore[operator]
            conflict = Conflict.of(path, file.read_text())
            file.write_text(conflict.text)
            out.append(conflict)
        return out

    def replay(self, git: Git, entry: str, conflicts: list[Conflict], span: str = "") -> list[Resolution]:
        """Resolve and ``git add`` each conflict the entry's rows fit; ``span``: the range ("v0.5.22..v0.5.23")."""
        ledger, local = self._of(entry)
        rows = [r for r in ledger.rows() if r["entry"] == local]
        used = []
        for c in conflicts:
            exact = [r for r in rows if r["key"] == c.key]
            near = [r for r in rows if r.get("match") == c.match and r["file"] == c.path and r not in exact]
            for row, flags in [*((r, ()) for r in exact), *((r, ("--ignore-whitespace",)) for r in near)]:
                diff = ledger._diff_path(local, row["key"])
                if diff.is_file() and Ledger._only(git, diff, c.path) and git.ok("apply", *flags, str(diff)):
                    git.run("add", "--", c.path)
                    recorded = f"{row['from']}..{row['onto']}"
                    used.append(Resolution(entry, row["key"], c.path, recorded,
                                           bool(flags) or bool(span) and recorded != span))
                    break
        return used

    def record(self, git: Git, entry: str, from_rev: str, onto_rev: str, conflicts: list[Conflict]) -> list[str]:
        """Keep how the user resolved ``conflicts`` (their staged content), as diffs; its rows read and written under
        the part's folder lock (``locked``: `layer add-entry`, `refresh` and another tree's `rebase --continue` write
        that folder too: a row recorded between this read and write was lost)."""
        ledger, local = self._of(entry)
        with locked(ledger.series.root):
            return ledger._record(git, local, entry, from_rev, onto_rev, conflicts)

    def _record(self, git: Git, local: str, entry: str, from_rev: str, onto_rev: str,
                conflicts: list[Conflict]) -> list[str]:
        rows = [r for r in self.rows() if not (r["entry"] == local and r["key"] in {c.key for c in conflicts})]
        refs = []
        for c in conflicts:
            resolved = git.run("show", f":{c.path}", check=False).stdout
            diff = "".join(difflib.unified_diff(c.text.splitlines(keepends=True), resolved.splitlines(keepends=True),
                                                f"a/{c.path}", f"b/{c.path}", n=3))
            if not diff:
                continue
            target = self._diff_path(local, c.key)
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, diff.encode())
            rows.append({"entry": local, "key": c.key,
                         "match": c.match or conflict_key(c.path, c.text, whitespace=False),
                         "file": c.path, "from": _rev_name(git, from_rev), "onto": _rev_name(git, onto_rev)})
            refs.append(f"{entry}:{c.key}")
        if refs:
            rows.sort(key=lambda r: (r["entry"], r["file"], r["key"]))
            write_atomic(self._confined("ledger.toml"), tomli_w.dumps({"resolutions": rows}).encode())
        return refs
