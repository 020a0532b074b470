"""``refresh``: export a patched branch back into patches/ and the manifest, deterministically.

Each commit above the upstream base carries a ``C128patch-Entry`` trailer (none: a new entry). ``format_patch``
writes it with a fixed date as ``NNNN-<entry>.patch`` (``NNNN-<entry>.<base>.patch``: a variant; names never
change), so an unchanged branch changes nothing: ``refresh --check`` tests that fixed point. A base is recorded
by content (each touched file's blob) beside a tag naming it, else the short id. An entry a rebase dropped as
merged stays with ``merged_in``. The tree is proven first (``ops.equivalence``): a difference no branch edit
explains is refused unless ``accept_differences``. Layers: each part in its folder, one ``series.txn``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from c128patch import procs
from c128patch.errors import C128Error, DifferenceError
from c128patch.git import Git
from c128patch.jsonio import locked
from c128patch.ops import proofs
from c128patch.ops.equivalence import Equivalence, prove
from c128patch.ops.replay import branch_commits
from c128patch.ops.treestate import c128_state_dir, ensure_clean, ensure_idle, fault_point, git_command, repo_lock
from c128patch.series import txn
from c128patch.series.contract import LOCK_NAME, Lock, LockItem, lock_path, merged, read_lock
from c128patch.series.layers import SEP, Stack, layer_args, layer_rows
from c128patch.series.manifest import Entry, Series, Variant, default_series_root, installed, load_series
from c128patch.series.patchfile import split_message
from c128patch.series.paths import check_relpath
from c128patch.series.plan import base_holding, choose, merged_entries, sources_at
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance
from c128patch.series.trailers import ENTRY_TRAILER, GATE_TRAILER, find_trailers
from c128patch.textsafe import plain, shell_join

FIXED_DATE = "Thu, 1 Jan 1970 00:00:00 +0000"
_DATE = re.compile(r"^Date: .*$", re.MULTILINE)

LockItems = Callable[[Series, Git, str, str], list[LockItem]]  # fit.contract.lock_items


@dataclass
class Export:
    files: dict[Path, bytes] = field(default_factory=dict)  # path -> new content
    series: Series | None = None
    manifest: str = ""
    notes: list[str] = field(default_factory=list)
    equivalence: Equivalence | None = None  # the tree against a fresh apply of the series (before the export)
    layers: list[Series] = field(default_factory=list)  # a stack's layers as exported (each written to its folder)
    tree_base: str = ""  # the tree's upstream base (its label)
    primary: bool = True  # its patches written as the primary files, else as the variants of ``tree_base``
    not_merged: list[str] = field(default_factory=list)  # entries left out below their own base: why kept as is
    ungated: list[tuple[str, str]] = field(default_factory=list)  # new entries whose commit has no gate trailer
    lint_errors: list[str] = field(default_factory=list)  # lint's errors on what was written ("entry: message")

    def changes(self, root: Path) -> list[str]:
        """Paths the export changes, relative to ``root`` (a layer's in full)."""
        changed = [_shown(p, root) for p, data in self.files.items() if _differs(p, data)]
        if (root / "patches" / "series.toml").read_text() != self.manifest:
            changed.append("patches/series.toml")
        changed += [_shown(layer.manifest_path, root) for layer in self.layers
                    if layer.manifest_path.read_text() != layer.to_toml()]
        return sorted(changed)


def _why(git: Git, sha: str) -> str:
    """A printed add-entry's ``--why``: the commit's subject as add-entry takes it (one printable line: a subject
    holding ESC or U+2028 printed a command add-entry refused), else what to write."""
    subject = "".join(c if c.isprintable() else " " for c in plain(git.out("log", "-1", "--format=%s", sha)))
    return " ".join(subject.split()) or "WHY the layer carries it"


def _differs(path: Path, data: bytes) -> bool:
    return not path.is_file() or path.read_bytes() != data


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "entry"


# what a tree's ``format.*`` config would add (a multipart mail the reader refuses, a sign-off, headers, notes)
_NOT_FROM_CONFIG = ("--no-attach", "--no-thread", "--no-notes", "--no-to", "--no-cc", "--no-add-header", "--no-base",
                    "--no-signoff", "--no-cover-letter", "--no-from")


def format_patch(git: Git, commit: str, entry_name: str, gate: str = "") -> bytes:
    """One commit as a normalized patch; adds the entry trailer (after ``gate``'s, unless given) if it lacks it."""
    # --text: a tree's `.gitattributes` (`*.py -diff`, `binary`) made this a "Binary files differ" hunk, a corrupt
    # patch written into the series (the series carries text patches only)
    text = git.run("format-patch", "-1", "--stdout", "--text", "--full-index", "--zero-commit", "--no-signature",
                   "--no-stat", "--no-numbered", "--subject-prefix=PATCH", "--encode-email-headers",
                   *_NOT_FROM_CONFIG, commit).stdout
    text = _DATE.sub(f"Date: {FIXED_DATE}", text, count=1)
    head, rest = split_message(text)
    have = {name for name, _ in find_trailers(head)}  # in any spelling git reads as one
    if ENTRY_TRAILER in have:
        return text.encode(errors="surrogateescape")  # (a file's bytes that are not UTF-8: as git gave them)
    mail, _, body = head.rstrip("\n").partition("\n\n")
    paragraphs = body.split("\n\n") if body.strip() else []
    trailers = bool(paragraphs) and all(re.match(r"^[A-Za-z0-9-]+: ", l) for l in paragraphs[-1].splitlines())
    gate = f"{GATE_TRAILER}: {gate}\n" if gate and GATE_TRAILER not in have else ""
    body = body + ("\n" if trailers else "\n\n" if body else "") + f"{gate}{ENTRY_TRAILER}: {entry_name}"
    return f"{mail}\n\n{body}\n{rest}".encode(errors="surrogateescape")


# a tag a series may take as its base: it becomes series.toml's base, a variant's file name and every report's text
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+/-]{0,63}")


def base_label(git: Git, commit: str, rev: str) -> str:
    """A variant's base name: a tag at ``commit`` (``rev`` first), else the short id; never a branch. Only a tag that
    is a plain word (``LABEL``) is one: upstream names its tags (``<!--``, U+202E, a byte that is not UTF-8; U+2028,
    which ``str.splitlines`` cut into two plain words that are no tag)."""
    tags = [t for t in git.lines("tag", "--points-at", commit) if LABEL.fullmatch(t)]  # ("\n" only: a tag's U+2028)
    if rev in tags:
        return rev
    return sorted(tags)[0] if tags else commit[:12]


@dataclass
class Refreshed:
    """What ``refresh`` did (or, with ``check``, would do)."""

    result: Export
    changes: list[str]
    check: bool
    given: Series  # the series refreshed: with ``check`` its layers are reported (the new files are not written)

    @property
    def failed(self) -> bool:
        """``--check`` found something to change, or a tree it cannot prove; or lint has errors in what it wrote."""
        return bool(self.result.lint_errors) or self.check and (
            bool(self.changes) or not self.result.equivalence.ok)  # type: ignore[union-attr]

    def to_json(self) -> dict:
        proof, series = self.result.equivalence, self.result.series
        assert proof is not None and series is not None
        return {"ok": not self.failed, "check": self.check, "changed": self.changes, "notes": self.result.notes,
                "lint_errors": self.result.lint_errors,
                "equivalence": proof.to_json(), "tree": proof.summary(),
                "series": {"name": series.name, "version": series.version, "base": series.base},
                "tree_base": self.result.tree_base, "written_as": "primary" if self.result.primary else "variants",
                "layers": layer_rows(self.given if self.check else series)}


def refresh_command(git: Git, series: Series, report: dict, lock_items: LockItems | None = None) -> tuple[str, str]:
    """After a rebase (``report``): the refresh to run ("": up to date), or a note when it would write the tool's
    own series for a layer or a commit of the user's clone. ``--primary`` only forward onto a tag past the base."""
    onto = report["new_base"]["commit"]
    label = base_label(git, onto, report["new_base"]["rev"])
    base = git.rev_parse(series.base) if series.base else None
    primary = (report["direction"] == "forward" and label != onto[:12]
               and (base is None or git.is_ancestor(base, onto)))

    new_entry = False  # a commit of the user's, with no entry trailer, that would become an entry of ours
    refused = ""  # why refresh itself would refuse
    not_merged: list[str] = []  # entries left out below their own base (a backward rebase's skip): kept as they are

    def changes(primary: bool | None) -> list[str]:
        nonlocal new_entry, refused, not_merged
        try:
            done = export(series, git, primary=primary, lock_items=lock_items)
        except C128Error as exc:
            refused = exc.message.removeprefix("cannot refresh: ")
            return ["?"]
        new_entry = any(note.startswith("new entry ") for note in done.notes)
        not_merged = done.not_merged
        return done.changes(series.root)

    found = changes(None)  # what ``refresh --check`` says
    if not found:
        return "", "; ".join(not_merged)
    if refused:
        return "", f"refresh would refuse: {refused}"
    found = found if primary == (label == series.base) else changes(primary)
    own = series.ours.root == default_series_root().resolve()  # the tool's checkout or installed package
    if own and (series.layers or new_entry or label == onto[:12] or installed(series.ours.root)) and any(
            not Path(c).is_absolute() for c in found):
        what = ("would take your commit(s) on the branch as new entries" if new_entry else
                f"would need files for {report['new_base']['rev']}")
        return "", (f"series {series.ours.name} (the tool's own, in {series.ours.root}) {what}: not refreshed from "
                    "here, it would write there" + (f"; make them entries of a layer of yours: "
                                                    f"{_as_layer_entries(git, series, report, label)}"
                                                    if new_entry else ""))
    return shell_join(["c128patch", "refresh", "--primary" if primary else "--variant", "--tree", str(git.worktree),
                       *([] if own else ["--series", str(series.ours.root)]), *layer_args(series)]), ""


def _as_layer_entries(git: Git, series: Series, report: dict, label: str) -> str:
    """The commands that make the user's commits the rebase carried entries of a layer: of the stack's last layer on
    this tree's base, else of a new one (``layers/local`` beside the tree) on ``label`` where a layer may start, else
    on the series' base, the tree rebased back there first (its provenance record then on top of the commits)."""
    from c128patch.series.layers import known_bases

    ours = series.ours
    commits = [e["new_sha"] for e in report.get("entries", []) if e.get("kind") == "commit" and e.get("new_sha")]
    if not commits:
        return "c128patch layer add-entry (docs/layers.md)"
    tree = Path(str(git.worktree))
    layer = next((x for x in reversed(series.layers) if x.base == label), None)
    steps: list[str] = []
    refs = [sha[:12] for sha in commits]
    if layer is not None:
        folder = layer.root
    else:
        folder = next(f for i in range(1, 1000) if not (f := tree.parent / "layers" / f"local{i if i > 1 else ''}")
                      .exists())
        here = label in known_bases(ours)
        steps.append(shell_join(["c128patch", "layer", "new", str(folder), "--name", folder.name,
                                 *(["--base", label] if here else [])]))
        if not here:  # a layer starts on a base of ours: the tree goes back to the series' (ids change: from HEAD)
            steps.append(shell_join(["c128patch", "rebase", "--onto", ours.base, "--tree", str(tree)]))
            refs = [f"HEAD~{len(commits) - i}" for i in range(len(commits))]
    # an empty commit is no entry (add-entry refuses it, which stopped the && chain before the commits after it)
    kept = [(ref, sha) for ref, sha in zip(refs, commits)
            if git.out("diff-tree", "-r", "--name-only", "--no-commit-id", sha).strip()]
    if not kept:
        return "c128patch layer add-entry (docs/layers.md)"
    steps += [shell_join(["c128patch", "layer", "add-entry", "--layer", str(folder), "--from-commit", ref,
                          "--tree", str(tree), "--why", _why(git, sha)])
              for ref, sha in kept]
    return " && ".join(steps)


def refresh(series: Series, git: Git, *, check: bool = False, primary: bool | None = None, version: str | None = None,
            accept_differences: bool = False, lock_items: LockItems | None = None) -> Refreshed:
    """``export`` and (unless ``check``) ``write``, locked, on an idle tree with nothing uncommitted."""
    # the series folder locked from export's read of contract.lock to the write (``fit.contract.accept``'s lock), and
    # each layer's, the lock `layer add-entry` writes under (an entry it added while this ran was dropped)
    with repo_lock(git, "refresh"), contextlib.nullcontext() if check else _all_locked(series):
        ensure_idle(git, "refresh")
        read_provenance(git.worktree)  # type: ignore[arg-type]  # a damaged record is said as such first
        ensure_clean(git, "refresh --check" if check else "refresh")
        result = export(series, git, primary=primary, version=version, lock_items=lock_items)
        changes = result.changes(series.root)
        if installed(series.ours.root) and (ours := [c for c in changes if not Path(c).is_absolute()]):
            why = (f"series {series.ours.name} as installed in {series.ours.root} (a package, not a checkout); make "
                   "your commits entries of a layer (docs/layers.md: c128patch layer add-entry) or refresh a "
                   "checkout of the series (--series DIR)")
            if not check:
                raise C128Error(f"cannot refresh: it would write {', '.join(ours)} of {why}; nothing was written")
            result.notes.append(f"refresh will not write {', '.join(ours)}: they are of {why}")  # --check: so say
        if result.ungated:
            why = _ungated(git, result.ungated)
            if not check:
                raise C128Error(f"cannot refresh: {why}; nothing was written")
            result.notes.append(f"refresh will refuse: {why}")
        if not check:
            changes = write(series, result, accept_differences=accept_differences)
        if changes and not check and result.series is not None:  # what was written, linted as `lint` would
            from c128patch.ops.lint import lint_stack

            result.lint_errors = [f"{f.entry}: {f.message}" for f in lint_stack(result.series) if f.level == "error"]
        if (proof := result.equivalence) and proof.identical and not proof.without and not changes:  # for status
            key = proofs.proof_key(git, series, proof.rev, proof.commit, proof.head)
            proofs.record(c128_state_dir(git), key, proof.to_json())
    return Refreshed(result, changes, check, series)


@contextlib.contextmanager
def _all_locked(series: Series) -> Iterator[None]:
    """The series' folder and each layer's locked (in one order: two refreshes of one stack wait, never deadlock), then
    each checked to be as it was read before the locks were taken: another run's write since (`layer add-entry`, a
    refresh of another tree) is one line, nothing written, never overwritten by this export."""
    parts = [series.ours, *(series.layers if isinstance(series, Stack) else [])]
    with contextlib.ExitStack() as held:
        for root in sorted({os.path.realpath(part.root) for part in parts}):
            held.enter_context(locked(Path(root)))
        for part in parts:
            if load_series(part.root).to_toml() != part.to_toml():
                what = f"the series {part.name}" if part is series.ours else f"the layer {part.name}"
                raise C128Error(f"cannot refresh: {what} ({part.root}) changed since this run read it (another run "
                                "wrote it: layer add-entry, or a refresh of another tree); nothing was written; run "
                                "c128patch refresh again")
        yield


def bumped(version: str) -> str:
    """A part's next version: its last number up by one, else ".1" added."""
    m = re.match(r"^(.*?)(\d+)$", version)
    return f"{m.group(1)}{int(m.group(2)) + 1}" if m else f"{version}.1"


def export(series: Series, git: Git, *, primary: bool | None = None, version: str | None = None,
           lock_items: LockItems | None = None) -> Export:
    """patches/ and the manifest refreshed from the branch in ``git``: ``primary`` (default: the tree is on the
    series base), the primary files, else the variants of the tree's base; ``lock_items``: the API contract."""
    record = read_provenance(git.worktree)  # type: ignore[arg-type]
    upstream = record.get("upstream", {})
    base_commit, base_rev = upstream.get("commit"), upstream.get("rev")
    if not base_commit or not git.rev_parse(base_commit):
        raise C128Error(f"cannot refresh: the upstream base {base_commit!r} recorded in {PROVENANCE_PATH} is not in "
                        f"{git.worktree}")
    label = base_label(git, base_commit, base_rev or "")
    _one_file_a_base(series, git, label)
    primary = label == series.base if primary is None else primary
    left_out = [d["name"] for d in record.get("dropped", []) if d.get("status") in ("dropped-as-merged", "skipped")]
    commits = [(c.sha, c.entry or slug(c.subject)) for c in branch_commits(git, base_commit)
               if c.entry != "provenance"]  # oldest first
    patches = [(sha, name) for sha, name in commits if name in {e.name for e in series.entries if e.is_patch}]
    trees = git.out("rev-parse", *(f"{sha}{up}^{{tree}}" for sha, _ in patches for up in ("", "~1"))).split() \
        if patches else []
    empty = {name: sha for (sha, name), tree, parent in zip(patches, trees[::2], trees[1::2]) if tree == parent}
    result = Export(equivalence=prove(series, git, base_rev or label, base_commit, without=left_out + list(empty)),
                    tree_base=label, primary=primary)
    exported: dict[str, Entry] = {}
    for sha, name in commits:
        if name in empty:  # an empty patch is no patch: upstream holds the entry here (kept with merged_in)
            record = {**record, "dropped": [*record.get("dropped", []), {
                "name": name, "status": "dropped-as-merged", "merged_in": base_commit,
                "detail": f"its commit {sha[:12]} changes nothing on {label}"}]}
        elif name in exported:
            raise C128Error(f"cannot refresh: two commits carry '{ENTRY_TRAILER}: {name}'; squash them first")
        else:
            exported[name] = _export_commit(series, git, sha, name, exported, (label, base_commit, primary), result)
    recorded = {str(r.get("name")) for key in ("entries", "dropped") for r in record.get(key, [])
                if isinstance(r, dict)} | {e.name for e in merged_entries(series, git, base_commit)}
    if newer := [e.name for e in series.entries if e.name not in exported and e.name not in recorded]:
        again = shell_join(["c128patch", "rebase", "--onto", base_rev or label, "--tree", str(git.worktree),
                            *layer_args(series)])
        raise C128Error(f"cannot refresh: the stack has entries this tree was never applied with ({', '.join(newer)}); "
                        "exported from here they would be dropped from it; nothing was written",
                        hint=f"  take them into the tree first: {again}")
    entries = list(exported.values())  # branch order, each kept entry right after its predecessor in the series
    names = [e.name for e in series.entries]
    for name, entry in _kept_without_commit(series, git, record, base_commit, exported, result).items():
        before = [n for n in names[: names.index(name)] if any(x.name == n for x in entries)]
        at = next(i for i, x in enumerate(entries) if x.name == before[-1]) + 1 if before else 0
        entries.insert(at, entry)
    stacked = isinstance(series, Stack)
    new = series.rebuilt(entries, label if primary else "") if stacked else Series(  # type: ignore[attr-defined]
        series.root, series.name, series.version, label if primary else series.base, entries, gates=series.gates)
    parts = []  # each part bumped when its own files change; ``version`` is our series'
    for old, part in zip((series.ours, *series.layers), (new.ours, *new.layers)):
        changed = part.to_toml() != old.to_toml() or any(_differs(p, d)
                                                          for p, d in _files_of(old, series, result.files).items())
        want = version if old is series.ours else None
        parts.append(replace(part, version=want or (bumped(old.version) if changed else old.version)))
    result.series = Stack(parts[0], parts[1:]) if stacked else parts[0]
    result.manifest, result.layers = parts[0].to_toml(), parts[1:]
    if primary and stacked:  # our lock is our series' own, made on a tree without layers: it is not rewritten here
        result.notes.append(f"{LOCK_NAME} not rewritten: the tree carries layers (refresh without them records it)")
    elif primary:
        _record_contract(parts[0], git, base_commit, label, result, lock_items)
    return result


def _made_an_entry(series: Stack, git: Git, sha: str, label: str) -> None:
    """Refuse a commit that ``layer add-entry`` made an entry already (the same change): a rebase onto the same rev
    takes it in the tree as that entry (the advice to add it again failed: it is one; helper 101)."""
    from c128patch.ops.merged import entry_making  # only for a commit of no entry, on a tree with layers

    for layer in series.layers:
        if same := entry_making(git, layer, sha):
            rebase = shell_join(["c128patch", "rebase", "--onto", label, "--tree", str(git.worktree),
                                 *layer_args(series)])
            raise C128Error(f"cannot refresh: commit {sha[:12]} is entry '{layer.name}{SEP}{same}' of layer "
                            f"{layer.name} already (the same change, not yet taken in this tree as it): {rebase}, "
                            "then refresh; nothing was written")


def _export_commit(series: Series, git: Git, sha: str, name: str, exported: dict[str, Entry],
                   base: tuple[str, str, bool], result: Export) -> Entry:
    """One commit's entry (a new one numbered last), its file in ``result``; ``base``: (label, commit, primary)."""
    label, base_commit, primary = base
    old = next((e for e in series.entries if e.name == name), None)
    if old is None and SEP in name:  # a layer's entry is never written into our series
        raise C128Error(f"cannot refresh: commit {sha[:12]} is entry '{name}' of layer {name.split(SEP)[0]}, not in "
                        f"the series given; name the layer (--layer DIR or c128patch.toml); nothing was written")
    if old is None and isinstance(series, Stack):
        _made_an_entry(series, git, sha, label)
    if old is None and isinstance(series, Stack):  # whose entry would it be? the team says, with add-entry
        add = shell_join(["c128patch", "layer", "add-entry", "--layer", str(series.layers[-1].root), "--from-commit",
                          sha[:12], "--why", _why(git, sha), "--tree", str(git.worktree)])
        raise C128Error(f"cannot refresh: commit {sha[:12]} carries no {ENTRY_TRAILER} trailer; make it an entry of "
                        f"a layer ({add}, or another layer's folder) or of the series, then refresh")
    if old is None:
        result.notes.append(f"new entry '{name}' from commit {sha[:12]}")
        gates = [v.split() for k, v in find_trailers(git.out("log", "-1", "--format=%B", sha)) if k == GATE_TRAILER]
        if not gates or not gates[-1]:
            result.ungated.append((name, sha))  # lint refuses its header: ``refresh`` says so before writing
        gate = gates[-1][0] if gates and gates[-1] and gates[-1][0] != "none" else ""  # the commit's own gate
        old = Entry(name=name, kind="patch", why=git.out("log", "-1", "--format=%s", sha), base=label, gate=gate)
        number = max((int(m.group(1)) for e in [*series.entries, *exported.values()]
                      if (m := re.match(r"^(\d+)-", e.file or ""))), default=0) + 1
        stem = f"{number:04d}-{name}"
    else:
        stem = old.file.removesuffix(".patch")
    entry = replace(old, variants=list(old.variants))
    if not entry.is_patch:
        content = git.blob(sha, entry.target)
        if content is None:
            raise C128Error(f"cannot refresh: overlay commit {sha[:12]} does not hold {entry.target}")
        result.files[series.part(name)[0].root / entry.source] = content
        entry.sha256 = hashlib.sha256(content).hexdigest()
        entry.base = label if primary else entry.base
        return entry
    data: bytes | None = format_patch(git, sha, name)
    if not primary and old.file and _fallback_gives_same_tree(series, old, git, sha, label):
        data = None  # the file chosen without a variant for this base already makes this commit
    touched = [p for p in git.out("diff-tree", "-r", "-z", "--name-only", "--no-commit-id", sha).split("\0") if p]
    for path in touched:  # (a name that is not UTF-8 no manifest can hold: one line, as layer add-entry says)
        check_relpath(path, f"commit {sha[:12]}")
    sources = sources_at(git, base_commit, touched)
    _export_patch(series.part(name)[0], old, entry, data, stem,
                  (label, base_commit if label == base_commit[:12] else "", sources), primary, result)
    return entry


def _record_contract(series: Series, git: Git, base_commit: str, label: str, result: Export,
                     lock_items: LockItems | None) -> None:
    """The branch's API contract into ``contract.lock`` (the old lock's accepted signatures kept)."""
    if lock_items is None:
        result.notes.append(f"{LOCK_NAME} not rewritten: no contract reader was given")
        return
    try:
        items = lock_items(series, git, base_commit, "HEAD")
    except C128Error as exc:
        result.notes.append(f"{LOCK_NAME} not rewritten: {exc.message}")
        return
    lock = Lock(lock_path(series.patches_dir), merged(items, read_lock(series.patches_dir)), label)
    result.files[lock.path] = lock.text().encode()


def _kept_without_commit(series: Series, git: Git, record: dict, base_commit: str, exported: dict[str, Entry],
                         result: Export) -> dict[str, Entry]:
    """The entries without a commit on the branch that stay: merged, skipped, or merged here already."""
    dropped = {d["name"]: d for d in record.get("dropped", [])}
    merged_here = {e.name for e in merged_entries(series, git, base_commit)}
    kept = {}
    for e in series.entries:
        if e.name in exported:
            continue
        why = dropped.get(e.name, {})
        if why.get("merged_in") and (held := _held_by_a_base(git, e, why["merged_in"])):
            kept[e.name] = e  # left out on an older release than its own: not merged (that would drop it there too)
            result.not_merged.append(_not_merged_note(series, git, e, held, result.tree_base))
            result.notes.append(result.not_merged[-1])
        elif why.get("status") == "dropped-as-merged" and why.get("merged_in"):
            kept[e.name] = replace(e, merged_in=why["merged_in"])
            result.notes.append(f"entry '{e.name}' is merged upstream in {why['merged_in'][:12]} "
                                f"({why.get('detail', '')}): kept for the revisions without that commit (merged_in)")
        elif e.name in merged_here:
            kept[e.name] = e
        elif why.get("status") == "skipped" and why.get("merged_in"):
            kept[e.name] = replace(e, merged_in=why["merged_in"])
            result.notes.append(f"entry '{e.name}' was skipped at a stop of the rebase: merged_in = "
                                f"{why['merged_in'][:12]}, so revisions with that commit skip it too; kept for the "
                                "others (remove it from series.toml to drop it for good)")
        elif why.get("status") == "skipped":
            kept[e.name] = e
            result.notes.append(f"entry '{e.name}' was skipped in the rebase: kept as it is for the other bases "
                                "(remove it from series.toml to drop it for good)")
        else:
            result.notes.append(f"entry '{e.name}' has no commit on the branch: dropped from the series")
            continue
        for variant in kept[e.name].patch_files() or [None]:
            path = series.file_of(e, variant)
            result.files[path] = path.read_bytes()
    return kept


def lint_command(series: Series) -> str:
    """The ``lint`` of ``series`` (its folder unless the tool's own, and its layers), as a user runs it."""
    own = series.ours.root == default_series_root().resolve()
    return shell_join(["c128patch", "lint", *([] if own else ["--series", str(series.ours.root)]),
                       *layer_args(series)])


def _ungated(git: Git, ungated: list[tuple[str, str]]) -> str:
    """Why new entries made of commits without a gate trailer are not written (lint refuses their header), and the
    command that adds one to the first (``HEAD``: an amend; deeper: a reword)."""
    name, sha = ungated[0]
    trailer = f"{GATE_TRAILER}: none (<why it needs no gate>)"
    fix = (f"{git_command(Path(str(git.worktree)))} "  # (with an identity where git has none: it runs as printed)
           + shell_join(["commit", "--amend", "--no-edit", "--trailer", trailer])
           if sha == git.head() else f"reword commit {sha[:12]} (git rebase -i) to end with '{trailer}'")
    return (f"commit {sha[:12]} would be new entry '{name}' without a '{GATE_TRAILER}:' trailer, which lint requires "
            f"of its header ('{GATE_TRAILER}: none (<why>)', or the env gate that turns it on, described in "
            f"[[gates]]); add it: {fix}, then refresh"
            + (f" ({len(ungated) - 1} more such commit(s): {', '.join(s[:12] for _, s in ungated[1:])})"
               if len(ungated) > 1 else ""))


def _held_by_a_base(git: Git, entry: Entry, merged_in: str) -> str:
    """The entry's own base that contains ``merged_in`` (``plan.base_holding``), else ""."""
    commit = git.rev_parse(merged_in)
    return base_holding(git, entry, commit) if commit else ""


def _not_merged_note(series: Series, git: Git, entry: Entry, held: str, label: str) -> str:
    """Why an entry left out on ``label`` (an older release than its base ``held``) is not recorded as merged."""
    check = shell_join(["c128patch", "check", "--sglang-rev", label,
                        *([] if series.ours.root == default_series_root().resolve() else
                          ["--series", str(series.ours.root)]), *layer_args(series)])
    return (f"entry '{entry.name}' was left out on {label}, " + ("its own base" if label == held else
                                                                   f"an older release than its own base {held}")
            + f": not recorded as merged upstream (merged_in there would drop it from {held} too); kept as it is, "
              f"without a file for {label} (where it applies: {check})")


def _fallback_gives_same_tree(series: Series, old: Entry, git: Git, sha: str, base_rev: str) -> bool:
    """Does the file ``apply`` chooses for ``base_rev`` without its variant make this commit, strictly?"""
    others = replace(old, variants=[v for v in old.variants if v.base != base_rev])
    fallback = choose(series, git, others, git.out("rev-parse", f"{sha}^")).variant
    with procs.scratch("c128refresh-") as tmp:
        idx = git.with_env(GIT_INDEX_FILE=str(Path(tmp) / "index"))
        idx.run("read-tree", f"{sha}^")
        if not idx.ok("apply", "--cached", str(series.file_of(old, fallback))):
            return False
        return idx.out("write-tree") == git.out("rev-parse", f"{sha}^{{tree}}")


def _one_file_a_base(series: Series, git: Git, label: str) -> None:
    """Refuse a tag ``label`` whose variant file would be another base's (``_export_patch`` names a file with '/' as
    '-': upstream's tags ``v1/x`` and ``v1-x`` named one file, the second refresh's patch written over the first's)."""
    other = sorted({b for e in series.entries for b in (e.base, *(v.base for v in e.variants))
                    if b and b != label and b.replace("/", "-") == label.replace("/", "-")})
    if other:
        raise C128Error(f"cannot refresh: the tag {label}'s patch files would be named as those of the series' base "
                        f"{other[0]}; delete the tag in your clone, its commit then names them "
                        f"({shell_join(['git', '-C', str(git.worktree), 'tag', '-d', label])}), and run again; nothing "
                        "was written")


def _export_patch(series: Series, old: Entry, entry: Entry, data: bytes | None, stem: str,
                  base: tuple[str, str, tuple[tuple[str, str], ...]], primary: bool, result: Export) -> None:
    """One patch as the primary or the variant of ``base`` (label, commit, sources); ``data`` None: no variant."""
    label, commit, sources = base
    variants = {v.base: (series.patches_dir / v.file, v.commit, v.sources) for v in old.variants}
    variants.pop(label, None)
    if primary or not old.file:
        if old.file and old.base and old.base != label and old.base not in variants:  # the old primary stays, as
            variants[old.base] = (series.file_of(old), old.base_commit, old.base_sources)  # its base's variant
        entry.file, entry.base, entry.base_commit, entry.base_sources = f"{stem}.patch", label, commit, sources
        result.files[series.patches_dir / entry.file] = data
    else:
        result.files[series.patches_dir / f"{stem}.patch"] = series.file_of(old).read_bytes()
        entry.file = f"{stem}.patch"
        if data is not None:
            variants[label] = (None, commit, sources)  # filled below from ``data``
    entry.variants = []
    named: dict[str, str] = {}  # file name -> the base it holds ("v1/x" and "v1-x" name one file: one's lost)
    for name in sorted(variants):
        source, source_commit, source_sources = variants[name]
        path = series.patches_dir / check_relpath(f"{stem}.{name.replace('/', '-')}.patch", f"entry '{entry.name}'")
        if named.setdefault(path.name, name) != name:
            raise C128Error(f"cannot refresh: entry '{entry.name}''s patches for {named[path.name]} and {name} would "
                            f"both be named {path.name} (series.toml names both bases): nothing was written")
        if len(os.fsencode(path.name)) > 255:  # a 240-character tag: OSError's "File name too long", a traceback
            raise C128Error(f"cannot refresh: entry '{entry.name}''s patch for {name} would be named {path.name} "
                            f"({len(os.fsencode(path.name))} bytes; a file name holds at most 255): rebase onto a "
                            "shorter tag or the commit itself; nothing was written")
        content = data if source is None else source.read_bytes()
        result.files[path] = content
        entry.variants.append(Variant(path.name, name, hashlib.sha256(content).hexdigest(), source_commit,
                                      source_sources))
    entry.sha256 = hashlib.sha256(result.files[series.patches_dir / entry.file]).hexdigest()


def write(series: Series, result: Export, *, accept_differences: bool = False) -> list[str]:
    """Write the export (stale patch files removed), unless unproven and not ``accept_differences``; what changed."""
    proof = result.equivalence
    if proof is not None and not proof.ok and not accept_differences:
        raise DifferenceError(f"refusing to export: {proof.summary()}; nothing was written",
                              hint="  look:   c128patch status (or the hunks with --json)\n"
                                   "  export: c128patch refresh --accept-differences (writes them into the series)",
                              report={"equivalence": proof.to_json()})
    changed = result.changes(series.root)
    parts = [(series.ours, result.manifest), *((layer, layer.to_toml()) for layer in result.layers)]
    writes: list[txn.Part] = []
    for part, manifest in parts:  # each part in its own folder only; all parts one transaction
        files = _files_of(part, series, result.files)
        new = {path: data for path, data in files.items() if _differs(path, data)}
        if part.manifest_path.read_text() != manifest:
            new[part.manifest_path] = manifest.encode()
        keep = {p.name for p in files if p.parent == part.patches_dir}
        stale = [p for p in sorted(part.patches_dir.glob("*.patch")) if p.name not in keep]
        if new or stale:  # the changed files, the manifest last, the stale patch files
            writes.append((part.root, new, stale, part.manifest_path))
            changed += [_shown(p, series.root) for p in stale]
    txn.commit_all(writes, fault=lambda point: fault_point("at", point))
    return sorted(set(changed))


def _files_of(part: Series, series: Series, files: dict[Path, bytes]) -> dict[Path, bytes]:
    """The files of ``files`` in ``part``'s folder and in no layer folder inside it."""
    roots = [series.ours.root, *(layer.root for layer in series.layers)]

    def owner(path: Path) -> Path:
        return max((r for r in roots if path.is_relative_to(r)), key=lambda r: len(r.parts), default=Path("/"))
    return {p: d for p, d in files.items() if owner(p) == part.root}
