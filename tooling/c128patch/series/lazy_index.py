"""A replay's index held in memory for the series' paths (``check`` over many revs: ``ops.replay`` and
``series.plan``'s probe with a ``ReadMemo``): the commit's tree plus the entries' changes, written
(``read-tree``, one ``update-index``) only before a git call reads the file. ``key`` names what a replay
of a patch reads there, so its outcome is shared by every rev holding the same (``git.remembered``)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from c128patch.git import Git

Entries = tuple[tuple[str, str, str], ...]  # (mode, blob, stage) of one path; () where the index has none
_PLAIN = re.compile(r"[A-Za-z0-9_./+@-]+")  # a path git neither quotes nor reads as a pattern


def plain_paths(paths: list[str]) -> bool:
    return all(_PLAIN.fullmatch(p) for p in paths)


def ls_tree(git: Git, treeish: str, paths: list[str], *flags: str) -> dict[str, tuple[str, ...]]:
    """path -> (mode, type, object id) of ``git ls-tree FLAGS TREEISH -- PATHS`` ({} for no paths)."""
    lines = git.out("ls-tree", *flags, treeish, "--", *paths).splitlines() if paths else []
    return {name: tuple(meta.split()) for meta, name in (line.split("\t", 1) for line in lines)}


class LazyIndex:
    def __init__(self, git: Git, idx: Git, commit: str, paths: list[str], kinds: dict[str, str]) -> None:
        """``idx``: ``git`` on the file; ``paths``: all a replay may touch; ``kinds``: their folders' modes."""
        self.git, self.idx, self.commit, self.kinds = git, idx, commit, kinds
        self.entries: dict[str, Entries] = {
            name: ((mode, sha, "0"),) for name, (mode, _type, sha) in ls_tree(git, commit, paths, "-r").items()}
        self.written = False
        self.dirty: set[str] = set()  # entries the file does not hold yet
        self.stale: set[str] = set()  # paths git changed in the file, not read back yet
        self.waiting: list[tuple[dict, list[str]]] = []  # (record, paths): filled with the paths' entries when read

    @staticmethod
    def _near(path: str, paths: list[str]) -> bool:
        """Can a git call on ``paths`` see ``path``'s entry (one of them, a folder of one, a file under one)?"""
        return any(path == p or p.startswith(path + "/") or path.startswith(p + "/") for p in paths)

    def _current(self, paths: list[str]) -> None:
        if any(self._near(s, paths) for s in self.stale):
            self.reread()

    def holds(self, path: str) -> bool:
        """Does the index hold ``path`` or files under it (``git ls-files -- path``)?"""
        self._current([path])
        return bool(self.entries.get(path)) or any(p.startswith(path + "/") and e for p, e in self.entries.items())

    def _file_at(self, folder: str) -> bool:
        if folder in self.entries:
            return bool(self.entries[folder])
        return folder in self.kinds and self.kinds[folder] != "040000"

    def key(self, paths: list[str]) -> tuple:
        """What the index holds that a git call on ``paths`` reads."""
        self._current(paths)
        out = []
        for path in paths:
            folders = [str(p) for p in PurePosixPath(path).parents][:-1]
            out.append((path, self.entries.get(path, ()),
                        any(p.startswith(path + "/") and e for p, e in self.entries.items()),
                        tuple(f for f in folders if self._file_at(f))))
        return tuple(out)

    def set(self, path: str, entries: Entries) -> None:
        if self.entries.get(path, ()) != entries:
            self.entries[path] = entries
            self.dirty.add(path)

    def flush(self, paths: list[str] | None = None) -> Git:
        """``git`` on the file, written as the entries say (only where a git call on ``paths`` looks)."""
        if not self.written:
            self.idx.run("read-tree", self.commit)
            self.written = True
        due = sorted(p for p in self.dirty if paths is None or self._near(p, paths))
        if due:
            lines = []
            for path in due:
                lines += [f"0 {'0' * 40}\t{path}"] + [f"{m} {sha} {stage}\t{path}"
                                                      for m, sha, stage in self.entries[path]]
            self.idx.run("update-index", "--index-info", input="".join(line + "\n" for line in lines))
            self.dirty.difference_update(due)
        return self.idx

    def changed(self, paths: list[str], record: dict | None = None) -> None:
        """git changed ``paths`` in the file; ``record["after"]`` gets their entries once read back."""
        self.stale.update(paths)
        if record is not None:
            self.waiting.append((record, paths))

    def reread(self) -> None:
        """Read back what git changed in the file."""
        paths = sorted(self.stale)
        found: dict[str, list[tuple[str, str, str]]] = {p: [] for p in paths}
        for line in self.idx.out("ls-files", "-s", "--", *paths).splitlines() if paths else []:
            meta, name = line.split("\t", 1)
            mode, sha, stage = meta.split()
            found.setdefault(name, []).append((mode, sha, stage))
        for name, entries in found.items():
            self.entries[name] = tuple(entries)
            self.dirty.discard(name)
        self.stale.clear()
        for record, names in self.waiting:
            record["after"] = {p: self.entries.get(p, ()) for p in names}
        self.waiting.clear()
