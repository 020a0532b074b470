"""Which file each entry takes on an upstream commit, and the pieces shared by everything that
replays the series there (``apply``, ``check``, ``wheel``, ``build``, ``rebase``: all call ``plan``).

Variant choice needs no tag names. Each file of an entry is a ``--full-index`` patch: its
``index <pre>..<post>`` lines name the blobs it was made on. Compared with the tree as replayed so
far (the target's files, plus the postimages of the earlier entries), the first rule that singles
out one file decides; a tie goes on to the next rule among the tied files:

1. ``exact``: every preimage blob matches;
2. ``most``: the most files match (at least one);
3. ``ancestor``: the file whose base is the nearest ancestor of the target (found by the base's
   recorded sources: the nearest ancestor holding them; else its recorded commit, else its tag name);
4. ``strict``: the first file (primary, then variants in manifest order) that applies with a plain
   ``git apply`` on the replayed tree;
5. ``primary``: none does: the primary (the replay then tries a 3-way merge).

An entry whose ``merged_in`` commit is an ancestor of the target is not planned (upstream holds it
there; ``merged_entries`` lists it). Planning writes nothing but objects into the repository.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Literal

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.git import Git, ReadMemo, blob_id, ls_tree, remembered
from c128patch.series.manifest import ABSENT, Entry, Series, Variant, hash_mismatch
from c128patch.series.patchfile import NULL_BLOB, PatchInfo, read_patch, read_patches
from c128patch.series.paths import PROVENANCE_PATH, not_a_file, symlink_on_path
from c128patch.series.trailers import ENTRY_TRAILER, GATE_TRAILER, SERIES_TRAILER, find_trailers
from c128patch.textsafe import one_line

Rule = Literal["only", "exact", "most", "ancestor", "strict", "primary"]
Entries = tuple[tuple[str, str, str], ...]  # (mode, blob, stage) of one path; () where the index has none
_PLAIN = re.compile(r"[A-Za-z0-9_./+@-]+")  # a path git neither quotes nor reads as a pattern


def plain_paths(paths: list[str]) -> bool:
    return all(_PLAIN.fullmatch(p) for p in paths)


class LazyIndex:
    """A replay's index held in memory for the series' paths (``check`` over many revs: ``ops.replay`` and
    ``ReplayedTree``'s probe with a ``ReadMemo``): only what ``key`` says a git call on the paths reads (``git apply``
    on the whole 5,800-file tree costs 3x), the commit's plus the entries' changes, written (one ``update-index``)
    only before a git call reads the file; ``flush()`` (``write-tree``) puts the commit's whole tree under them.
    ``key`` names what a replay of a patch reads, so its outcome is shared by every rev holding the same."""

    def __init__(self, git: Git, idx: Git, commit: str, paths: list[str]) -> None:
        """``idx``: ``git`` on the file (emptied); ``paths``: all a replay may touch."""
        self.git, self.idx, self.commit = git, idx, commit
        folders = ls_tree(git, commit, prefixes(paths))  # a file there: git puts nothing under it (D/F)
        self.kinds = {name: mode for name, (mode, _type, _sha) in folders.items()}
        self.entries: dict[str, Entries] = {name: ((mode, sha, "0"),) for name, (mode, kind, sha) in
                                            [*folders.items(), *ls_tree(git, commit, paths, "-r").items()]
                                            if kind != "tree"}
        Path(idx.env["GIT_INDEX_FILE"]).unlink(missing_ok=True)
        self.full = False  # the file holds the commit's whole tree
        self.dirty: set[str] = set(self.entries)  # entries the file does not hold yet
        self.stale: set[str] = set()  # paths git changed in the file, not read back yet
        self.waiting: list[tuple[dict, list[str]]] = []  # (record, paths): filled with the paths' entries when read

    def _current(self, paths: list[str]) -> None:
        """Read back what git changed where a git call on ``paths`` looks (one of them, a folder of one, under one)."""
        if any(s == p or p.startswith(s + "/") or s.startswith(p + "/") for s in self.stale for p in paths):
            self.reread()

    def holds(self, path: str) -> bool:
        """Does the index hold ``path`` or files under it (``git ls-files -- path``)?"""
        self._current([path])
        return bool(self.entries.get(path)) or any(p.startswith(path + "/") and e for p, e in self.entries.items())

    def key(self, paths: list[str]) -> tuple:
        """What the index holds that a git call on ``paths`` reads."""
        self._current(paths)
        out = []
        for path in paths:
            folders = [str(p) for p in PurePosixPath(path).parents][:-1]
            files = tuple(f for f in folders if (bool(self.entries[f]) if f in self.entries  # a file where a folder is
                                                 else self.kinds.get(f, "040000") != "040000"))
            out.append((path, self.entries.get(path, ()),
                        any(p.startswith(path + "/") and e for p, e in self.entries.items()), files))
        return tuple(out)

    def set(self, path: str, entries: Entries) -> None:
        if self.entries.get(path, ()) != entries:
            self.entries[path] = entries
            self.dirty.add(path)

    def flush(self, paths: list[str] | None = None) -> Git:
        """``git`` on the file, written as the entries say; ``paths`` None: for a call reading it whole."""
        if paths is None and not self.full:
            self.reread()  # (what git changed, before read-tree replaces the file)
            self.idx.run("read-tree", self.commit)
            self.full, self.dirty = True, set(self.entries)
        due = sorted(self.dirty)  # (all: one call now rather than one per later call)
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


@dataclass(frozen=True)
class Choice:
    """Which file an entry takes on a target, and the rule that chose it."""

    variant: Variant
    rule: Rule
    detail: str  # for people: "preimage blobs match (3/3 files)"


def index_git(git: Git, index_file: Path) -> Git:
    """``git`` on the index ``index_file`` (its folder: the work tree of a bare repository)."""
    idx = git.with_env(GIT_INDEX_FILE=str(index_file))
    return idx.with_env(GIT_WORK_TREE=str(index_file.parent)) if git.worktree is None else idx


def sources_at(git: Git, commit: str, paths: list[str]) -> tuple[tuple[str, str], ...]:
    """(path, blob id | ``absent``) of ``paths`` at ``commit``, sorted: a base by content (``Variant.sources``)."""
    found = _blobs(git, [(commit, p) for p in paths])
    return tuple(sorted((p, found[(commit, p)]) for p in paths))


_SOURCES: dict[tuple, str] = {}  # (repository, commit id, path) -> blob id or ABSENT: a commit never changes
_COMMIT_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _blobs(git: Git, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(commit, path) -> blob id | ``absent``: those not read yet in one ``cat-file --batch-check``."""
    repo = (str(git.cwd), git.env.get("GIT_DIR", str(git.git_dir)))
    found = {(*repo, c, p): _SOURCES.get((*repo, c, p)) for c, p in pairs}
    todo = [key for key, sha in found.items() if sha is None]
    if todo:
        out = git.out("cat-file", "--batch-check=%(objecttype) %(objectname)",
                      input="".join(f"{c}:{p}\n" for *_, c, p in todo)).splitlines()
        for key, line in zip(todo, out):  # "<commit>:<path> missing": absent too
            kind, _, sha = line.partition(" ")
            found[key] = sha if kind == "blob" else ABSENT
            if _COMMIT_ID.fullmatch(key[2]):  # (a name such as HEAD moves)
                _SOURCES[key] = found[key]
    return {(c, p): sha for (*_, c, p), sha in found.items()}


_WRITTEN: dict[tuple, str] = {}  # (repository, file, its content) -> the blob ``hash-object -w`` wrote for it


def _written_key(git: Git, path: Path) -> tuple:
    return str(git.cwd), git.env.get("GIT_DIR", str(git.git_dir)), str(path), blob_id(path.read_bytes())


def written_blob(git: Git, path: Path) -> str:
    """``git hash-object -w`` of ``path``, once per process for the same content."""
    key = _written_key(git, path)
    if key not in _WRITTEN:
        _WRITTEN[key] = git.out("hash-object", "-w", "--no-filters", "--", str(path))
    return _WRITTEN[key]


def write_blobs(git: Git, paths: list[Path]) -> None:
    """``written_blob`` of each of ``paths``, by one ``hash-object -w`` for those not written yet (a replay's
    overlays: one call, not one each)."""
    keys = {path: _written_key(git, path) for path in dict.fromkeys(paths)}
    todo = [path for path, key in keys.items() if key not in _WRITTEN]
    if len(todo) < 2:
        return  # (one: written_blob asks for it alone)
    ids = git.out("hash-object", "-w", "--no-filters", "--", *(str(p) for p in todo)).split("\n")
    if len(ids) == len(todo):
        _WRITTEN.update((keys[path], blob) for path, blob in zip(todo, ids))


class ReplayedTree:
    """The blobs of ``target`` as the entries planned so far leave them: known while each preimage matched,
    else read from a probe index replaying them (in memory with a ``ReadMemo``: ``LazyIndex``)."""

    def __init__(self, git: Git, target: str, paths: list[str], scratch: Path) -> None:
        self.git, self.target, self.scratch, self.paths = git, target, scratch, paths
        self.blobs: dict[str, str | None] = {p: NULL_BLOB for p in paths}  # None: not known
        self.blobs.update({name: sha for name, (_mode, _kind, sha) in ls_tree(git, target, paths, "-r").items()})
        self.done: list[Planned] = []
        self._probe: Git | None = None
        self._lazy: LazyIndex | None = None
        # paths the probe surely lacks: absent at the target, and every patch since that touched them
        # needed a file the probe lacked (git apply, strict or 3-way, then changes nothing)
        self.lacks = {p for p, b in self.blobs.items() if b == NULL_BLOB}

    def fails(self, patch: PatchInfo) -> bool:
        """Does ``git apply`` surely refuse ``patch`` on the probe (it needs a file the probe lacks)?"""
        return plain_patch(patch) and any(p in self.lacks for p in patch.needs)

    def blob(self, path: str) -> str:
        if self.blobs.get(path, NULL_BLOB) is None and path not in self.lacks:
            probe, lazy = self._index(), self._lazy
            held = lazy is None or lazy.holds(path)  # (reads back what git changed there)
            entries = lazy.entries.get(path, ()) if lazy is not None else ()
            if entries or not held:  # else files under it: git's answer
                self.blobs[path] = entries[0][1] if entries else NULL_BLOB
            else:
                out = (lazy.flush([path]) if lazy is not None else probe).out("ls-files", "-s", "--", path).split()
                self.blobs[path] = out[1] if out else NULL_BLOB
        return self.blobs.get(path) or NULL_BLOB

    def applies_strictly(self, patch: PatchInfo) -> bool:
        if self.fails(patch):
            return False
        probe, lazy, check = self._index(), self._lazy, ("apply", "--cached", "--check", str(patch.path))
        if lazy is None or not plain_patch(patch):
            return (lazy.flush() if lazy is not None else probe).ok(*check)
        key = ("probe check", str(patch.path), blob_id(patch.path.read_bytes()), lazy.key(patch.paths))
        return remembered(self.git, key, lambda: lazy.flush(patch.paths).ok(*check))

    def advance(self, item: Planned) -> None:
        """Record ``item`` as replayed on top of the tree."""
        if item.patch is None or not self.fails(item.patch):
            self.lacks -= set(item.touched)
        if item.patch is not None:
            for path, (pre, post) in item.patch.blobs.items():
                self.blobs[path] = post if self.blobs.get(path, NULL_BLOB) == pre else None
            for path in set(item.patch.files) - set(item.patch.blobs):
                self.blobs[path] = None
        else:
            self.blobs[item.entry.target] = blob_id(item.path.read_bytes())
        self.done.append(item)
        if self._probe is not None:
            self._apply(item)

    def _index(self) -> Git:
        if self._probe is None:
            self._probe = index_git(self.git, self.scratch / "probe.index")
            if isinstance(self.git, ReadMemo) and plain_paths(self.paths):
                self._lazy = LazyIndex(self.git, self._probe, self.target, self.paths)
            else:
                self._probe.run("read-tree", self.target)
            for item in self.done:
                self._apply(item)
        return self._probe

    def _apply(self, item: Planned) -> None:
        lazy = self._lazy
        if lazy is None:
            _probe_apply(self._probe, item)
        elif item.patch is None:
            lazy.set(item.entry.target, (("100644", written_blob(lazy.idx, item.path), "0"),))
        elif not plain_patch(item.patch):
            _probe_apply(lazy.flush(), item)
            lazy.changed(item.patch.paths)
        else:
            paths = item.patch.paths
            found = tuple(self.git.ok("cat-file", "-e", f"{b}^{{blob}}") for b, _ in item.patch.blobs.values()
                          if b != NULL_BLOB)

            def apply() -> dict:  # ("strict": what ``ops.replay`` reuses rather than apply it again)
                record: dict = {"after": None, "strict": _probe_apply(lazy.flush(paths), item)}
                lazy.changed(paths, record)
                return record

            record = remembered(self.git, ("probe apply", str(item.path), blob_id(item.path.read_bytes()),
                                           lazy.key(paths), found), apply)
            if record["after"] is None and lazy.stale.isdisjoint(paths):
                record = apply()  # another rev applies it now and has not read the result back yet
            if record["after"] is not None:
                for path, entries in record["after"].items():
                    lazy.set(path, entries)


def plain_patch(patch: PatchInfo) -> bool:
    """Does ``patch`` name each file once (no rename, no copy)?"""
    return all(not pf.is_rename and (pf.is_added_file or pf.source_file[2:] == pf.target_file[2:])
               for pf in patch.patchset)


def _probe_apply(idx: Git, item: Planned) -> bool:
    """``item`` on the probe; True: it applied strictly."""
    if item.patch is None:
        sha = idx.out("hash-object", "-w", "--no-filters", "--", str(item.path))
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{sha},{item.entry.target}")
    elif not idx.ok("apply", "--cached", str(item.path)):
        idx.run("apply", "--cached", "--3way", str(item.path), check=False)  # a conflict stays unknown
        return False
    return True


ANCESTOR_SEARCH = 200  # commits touching a variant's files searched back for its base's sources


def _walks(git: Git, variants: list[Variant], target: str) -> dict[Variant, list[str]]:
    """Each variant's candidates: ``target``, then ``rev-list --max-count=ANCESTOR_SEARCH TARGET -- its paths``
    from one walk on all their paths where history is linear (at a merge, history simplifies per path)."""
    paths = {v: [p for p, _ in v.sources] for v in variants}
    union, limit = sorted({p for ps in paths.values() for p in ps}), ANCESTOR_SEARCH * len(variants)
    linear = plain_paths(union) and not git.out("rev-list", "--merges", "--max-count=1", target)
    # --no-renames: a file renamed away is named too; --root: the first commit's files; NUL: a commit's start
    walk = [c.split() for c in git.out("log", "--format=%x00%H", "--name-only", "--no-renames", "--root",
                                       f"--max-count={limit}", target, "--", *union).split("\0")[1:]] if linear else []
    out = {v: [c for c, *files in walk if any(f == p or f.startswith(p + "/") for f in files for p in ps)]
           for v, ps in paths.items()}
    for v, ps in paths.items():  # (a walk cut at ``limit`` may miss older commits of a variant it holds few of)
        if not linear or (len(walk) == limit and len(out[v]) < ANCESTOR_SEARCH):
            out[v] = git.out("rev-list", f"--max-count={ANCESTOR_SEARCH}", target, "--", *ps).split()
    return {v: [target, *t[:ANCESTOR_SEARCH]] if t[:1] != [target] else t[:ANCESTOR_SEARCH] for v, t in out.items()}


def base_distances(git: Git, variants: list[Variant], target: str) -> dict[Variant, int | None]:
    """Commits from each variant's base to ``target`` (None: not an ancestor): the nearest ancestor holding its
    sources (``_walks``), else its recorded commit, else its tag; one walk and two source reads for them all."""
    out: dict[Variant, int | None] = {}
    for v in (v for v in variants if not v.sources):
        base = (git.rev_parse(v.commit) if v.commit else None) or git.rev_parse(v.base)
        out[v] = git.count(f"{base}..{target}") if base is not None and git.is_ancestor(base, target) else None
    walks = _walks(git, [v for v in variants if v.sources], target)
    for part in (slice(0, 1), slice(1, None)):  # the newest alone first (most often the answer), the rest in one read
        todo = {v: walk[part] for v, walk in walks.items() if v not in out}
        found = _blobs(git, [(c, p) for v, chunk in todo.items() for c in chunk for p, _ in v.sources])
        for v, chunk in todo.items():
            newer = walks[v][0] if part.start and walks[v][0] != target else None  # the newest touching one after
            for commit in chunk:
                if tuple(sorted((p, found[(commit, p)]) for p, _ in v.sources)) == v.sources:
                    out[v] = 0 if newer is None else git.count(f"{newer}..{target}") + 1
                    break
                newer = commit if commit != target else newer
    return {v: out.get(v) for v in variants}


def select_variant(git: Git, entry: Entry, target: str, tree: ReplayedTree, patches: dict[Variant, PatchInfo],
                   distances: Callable[[], dict[Variant, int | None]] | None = None) -> Choice:
    """The file ``entry`` takes on ``target`` as ``tree`` holds it (the module doc's rules); ``distances``: a plan's."""
    files = entry.patch_files()
    if len(files) == 1:
        return Choice(files[0], "only", "the entry's only file")
    score = {v: sum(tree.blob(path) == pre for path, (pre, _post) in patches[v].blobs.items()) for v in files}
    exact = [v for v in files if score[v] == len(patches[v].blobs) > 0]
    if len(exact) == 1:
        return Choice(exact[0], "exact", "preimage blobs match ({0}/{0} files)".format(score[exact[0]]))
    tied = exact or [v for v in files if score[v] == max(score.values()) > 0]
    if len(tied) == 1:
        v = tied[0]
        return Choice(v, "most", f"most preimage blobs match ({score[v]}/{len(patches[v].blobs)} files)")
    tied = tied or files
    cache = distances() if distances is not None else base_distances(git, tied, target)
    near = {v: cache[v] for v in tied if cache[v] is not None}
    if near:
        best = min(near.values())
        closest = [v for v in tied if near.get(v) == best]
        if len(closest) == 1:
            v = closest[0]
            return Choice(v, "ancestor", f"nearest ancestor base {v.base} ({best} commit(s) back)")
        tied = closest
    for v in tied:
        if tree.applies_strictly(patches[v]):
            return Choice(v, "strict", "the first file that applies strictly")
    return Choice(files[0], "primary", "no file matches or applies strictly: the primary (3-way)")


def choose(series: Series, git: Git, entry: Entry, target: str) -> Choice:
    """``select_variant`` for one entry on commit ``target``'s tree (the earlier entries already in it)."""
    patches = {v: read_patch(verify_file(series, entry, v)) for v in entry.patch_files()}
    paths = sorted({p for info in patches.values() for p in info.files})
    with procs.scratch("c128plan-") as tmp:
        return select_variant(git, entry, target, ReplayedTree(git, target, paths, Path(tmp)), patches)


@dataclass
class Planned:
    """One entry as it will be replayed on a given upstream commit."""

    entry: Entry
    variant: Variant | None
    path: Path  # the patch file, or the overlay source
    patch: PatchInfo | None
    choice: Choice | None = None  # None for overlays

    @property
    def touched(self) -> list[str]:
        return self.patch.files if self.patch else [self.entry.target]

    @property
    def label(self) -> str:
        return f"patches/{self.variant.file}" if self.variant else self.entry.source

    @property
    def chosen_by(self) -> str:
        """Why this file: the rule and its detail (overlays: their one source)."""
        return f"{self.choice.rule}: {self.choice.detail}" if self.choice else "overlay"


def verify_file(series: Series, entry: Entry, variant: Variant | None) -> Path:
    path = series.file_of(entry, variant)
    if not path.is_file():
        raise C128Error(f"entry '{entry.name}': {path} {not_a_file(path)}")
    root = series.part(entry.name)[0].root
    link = symlink_on_path(root, path)
    if link is not None:
        raise C128Error(f"unsafe path in entry '{entry.name}': {path} goes through the symlink {link}")
    want = variant.sha256 if variant else entry.sha256
    if want and (why := hash_mismatch(path, want)):
        raise C128Error(f"corrupt series file {path.relative_to(root)}: {why}" + (
            " (restore it, or record the change with `c128patch lint --update-hashes`)" if why.startswith("sha256")
            else ""))
    return path


def validate_files(series: Series) -> None:
    """Every file of every entry (all variants) exists, matches its hash and parses."""
    for entry in series.entries:
        for variant in entry.patch_files() or [None]:
            path = verify_file(series, entry, variant)
            if variant is not None:
                read_patch(path)


def merged_entries(series: Series, git: Git, target: str) -> list[Entry]:
    """Entries upstream holds at ``target``: their ``merged_in`` commit is an ancestor of it, and of none of the
    entry's own bases (a file made on a release that has that commit changes something there: upstream does not
    hold it; such a ``merged_in`` is ignored here, and ``lint`` says so)."""
    return [e for e in series.entries
            if e.merged_in and (commit := git.rev_parse(e.merged_in)) is not None and git.is_ancestor(commit, target)
            and not base_holding(git, e, commit)]


def base_holding(git: Git, entry: Entry, commit: str) -> str:
    """The base (label) of one of ``entry``'s files whose release contains ``commit``, else "": such a commit cannot
    be where upstream took the entry (its file was made there, and changes something there)."""
    bases = [(v.commit, v.base) for v in entry.patch_files()] or [(entry.base_commit, entry.base)]
    for at, label in bases:
        base = (git.rev_parse(at) if at else None) or (
            git.rev_parse(f"refs/tags/{label}") or git.rev_parse(label) if label else None)
        if base is not None and git.is_ancestor(commit, base):
            return label or base[:12]
    return ""


def symlink_refusal(entry: Entry, label: str, info: PatchInfo) -> str | None:
    """Why a patch making a symlink may not be carried (a later write could go through it); None: it makes none."""
    if info.gitlinks:  # (a submodule entry: lint, check and apply took one, "identical to a fresh apply")
        return (f"entry '{entry.name}': {label} makes {info.gitlinks[0]} a submodule entry (mode 160000); a series "
                "carries only regular files")
    return (f"entry '{entry.name}': {label} creates the symlink {info.symlinks[0]}; a series may not create symlinks "
            "(a later write through it could leave the tree)") if info.symlinks else None


def plan(series: Series, git: Git, target: str) -> list[Planned]:
    """Each entry's file for ``target``, validated, less ``merged_entries``; writes only objects."""
    skip = {e.name for e in merged_entries(series, git, target)}
    entries = [e for e in series.entries if e.name not in skip]
    files = {e.name: {v: verify_file(series, e, v) for v in e.patch_files()} for e in entries}
    read_patches([path for by_variant in files.values() for path in by_variant.values()])  # one git call
    patches = {name: {v: read_patch(path) for v, path in by_variant.items()} for name, by_variant in files.items()}
    for name, by_variant in patches.items():  # a file claiming another entry, in any spelling git reads
        for info in by_variant.values():
            if claims := [v.strip() for k, v in find_trailers(info.body) if k == ENTRY_TRAILER and v.strip() != name]:
                raise C128Error(f"entry '{name}': {info.path.name} carries '{ENTRY_TRAILER}: {claims[0]}', not "
                                f"'{name}': fix its message")
    if isinstance(git, ReadMemo):  # which preimage blobs the repository has, in one call
        git.find_blobs([b for by_variant in patches.values() for info in by_variant.values()
                        for b, _ in info.blobs.values() if b != NULL_BLOB])
    paths = sorted({p for files in patches.values() for info in files.values() for p in info.files}
                   | {e.target for e in entries if not e.is_patch})
    out = []
    tieable = [v for e in entries if len(e.patch_files()) > 1 for v in e.patch_files()]
    distances = functools.cache(lambda: base_distances(git, tieable, target))
    with procs.scratch("c128plan-") as tmp:
        tree = ReplayedTree(git, target, paths, Path(tmp))
        for entry in entries:
            if entry.is_patch:
                choice = select_variant(git, entry, target, tree, patches[entry.name], distances)
                info = patches[entry.name][choice.variant]
                refusal = symlink_refusal(entry, f"patches/{choice.variant.file}", info)
                if refusal:
                    raise C128Error(f"unsafe {refusal}")
                item = Planned(entry, choice.variant, info.path, info, choice)
            else:
                item = Planned(entry, None, verify_file(series, entry, None), None)
            tree.advance(item)
            out.append(item)
        if tree._lazy is not None and tree._lazy.waiting:
            tree._lazy.reread()  # what the probe applied, for the replay to reuse (``ops.replay``)
    return out


def prefixes(paths: list[str]) -> list[str]:
    """Each path's folders, then the path, once each."""
    return list(dict.fromkeys(f for p in paths for f in [*map(str, reversed(PurePosixPath(p).parents[:-1])), p]))


def tree_modes(git: Git, treeish: str, paths: list[str]) -> dict[str, str]:
    """path -> mode at ``treeish`` of ``paths`` (not recursive: a folder is one entry)."""
    return {name: mode for name, (mode, _kind, _sha) in ls_tree(git, treeish, paths).items()}


def refuse_symlinks_at(git: Git, treeish: str, planned: list[Planned]) -> dict[str, str]:
    """Refuse a path through an upstream symlink (``rebase --onto`` before its journal: an overlay's was a git error
    half way, its journal left); path -> mode of the touched paths and their folders there."""
    kinds = tree_modes(git, treeish, prefixes([p for item in planned for p in (item.patch.paths if item.patch
                                                                               else item.touched)]))
    for item in planned:
        for path in item.patch.paths if item.patch else item.touched:
            for prefix in (p for p in prefixes([path]) if kinds.get(p) == "120000"):
                raise C128Error(f"unsafe path in entry '{item.entry.name}': {path} goes through the symlink {prefix} "
                                "upstream")
    return kinds


def written_paths(planned: list[Planned]) -> list[str]:
    """The paths the series writes in a tree: its patches', its overlays', the provenance."""
    return sorted({PROVENANCE_PATH, *(p for item in planned for p in (item.patch.paths if item.patch
                                                                      else item.touched))})


def refuse_encoding_at(git: Git, treeish: str, paths: list[str]) -> None:
    """Refuse a path whose attributes at ``treeish`` (its .gitattributes, the repository's info/attributes) name a
    ``working-tree-encoding``: check's index took the series' bytes as they are, apply's ``git add`` failed to encode
    them ("all apply", then apply stopped)."""
    names = [f"{d}/.gitattributes" if d != "." else ".gitattributes"
             for d in dict.fromkeys(str(PurePosixPath(p).parent) for p in prefixes(paths))]
    found = ls_tree(git, treeish, names)
    with procs.scratch("c128attr-") as tmp:  # those files alone, in a private index
        idx = git.with_env(GIT_INDEX_FILE=str(Path(tmp) / "index"))
        cacheinfo = [a for n, m in found.items() if m[1] == "blob" for a in ("--cacheinfo", f"{m[0]},{m[2]},{n}")]
        if cacheinfo:  # (arguments, no stdin: one pipe fewer; `ulimit -n` low is refused after the clone)
            idx.run("update-index", "--add", *cacheinfo)
        out = idx.out("check-attr", "--cached", "-z", "working-tree-encoding", "--", *paths).split("\0")
    for path, _attr, value in zip(out[0::3], out[1::3], out[2::3]):
        if value not in ("unspecified", "unset") and value.lower() not in ("utf-8", "utf8"):  # (git: no encoding)
            raise C128Error(f"{path} has the attribute working-tree-encoding={one_line(value)} at {treeish[:12]} (its "
                            ".gitattributes or the repository's info/attributes): git would re-encode the series' "
                            "UTF-8 files there; c128patch does not patch such a tree")


def check_paths_at(git: Git, treeish: str, planned: list[Planned]) -> set[str]:
    """Refuse a path through an upstream symlink, an overlay on an upstream file, a path git re-encodes; which touched
    paths exist."""
    kinds = refuse_symlinks_at(git, treeish, planned)
    refuse_encoding_at(git, treeish, written_paths(planned))
    for item in planned:
        if not item.entry.is_patch and item.entry.target in kinds:
            raise C128Error(f"overlay '{item.entry.name}' collides with upstream: {item.entry.target} already exists "
                            f"at {treeish[:12]}")
    return set(kinds)


def overlay_message(entry: Entry, series: Series) -> str:
    return (f"c128: add {PurePosixPath(entry.target).name} (overlay)\n\n{entry.why}\n\n"
            f"Installs {entry.source} at {entry.target}.\n\n{ENTRY_TRAILER}: {entry.name}\n"
            f"{SERIES_TRAILER}: {series.name} {series.version}\n{GATE_TRAILER}: {entry.gate or 'none'}\n")
