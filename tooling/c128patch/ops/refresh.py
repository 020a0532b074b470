"""``refresh``: export a patched branch back into patches/ and the manifest, deterministically.

Each commit between the upstream base and HEAD carries a ``C128patch-Entry`` trailer naming its
entry (commits without one become new patch entries). Patch files are written with
``git format-patch --full-index --zero-commit --no-signature --no-stat`` and a fixed date, named
``NNNN-<entry>.patch`` (``NNNN-<entry>.<base>.patch`` for a variant made on an older base), so
refreshing an unchanged branch changes nothing: ``refresh --check`` tests that fixed point.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.series.manifest import Entry, Series, Variant
from c128patch.series.patchfile import split_message
from c128patch.series.plan import ENTRY_TRAILER, choose
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance

FIXED_DATE = "Thu, 1 Jan 1970 00:00:00 +0000"
_DATE = re.compile(r"^Date: .*$", re.MULTILINE)


@dataclass
class Export:
    files: dict[Path, bytes] = field(default_factory=dict)  # path -> new content
    series: Series | None = None
    manifest: str = ""
    notes: list[str] = field(default_factory=list)

    def changes(self, root: Path) -> list[str]:
        changed = [str(p.relative_to(root)) for p, data in self.files.items() if not p.is_file() or p.read_bytes() != data]
        manifest = root / "patches" / "series.toml"
        if manifest.read_text() != self.manifest:
            changed.append("patches/series.toml")
        return sorted(changed)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "entry"


def format_patch(git: Git, commit: str, entry_name: str) -> bytes:
    """One commit as a normalized patch; adds the entry trailer if the message lacks it."""
    text = git.run("format-patch", "-1", "--stdout", "--full-index", "--zero-commit", "--no-signature",
                   "--no-stat", "--no-numbered", "--subject-prefix=PATCH", "--encode-email-headers", commit).stdout
    text = _DATE.sub(f"Date: {FIXED_DATE}", text, count=1)
    head, rest = split_message(text)
    if f"\n{ENTRY_TRAILER}:" in head:
        return text.encode()
    mail, _, body = head.rstrip("\n").partition("\n\n")
    paragraphs = body.split("\n\n") if body.strip() else []
    trailers = bool(paragraphs) and all(re.match(r"^[A-Za-z0-9-]+: ", l) for l in paragraphs[-1].splitlines())
    body = body + ("\n" if trailers else "\n\n" if body else "") + f"{ENTRY_TRAILER}: {entry_name}"
    return f"{mail}\n\n{body}\n{rest}".encode()


def _commits(git: Git, base: str) -> list[tuple[str, str]]:
    """(sha, entry name) of each commit on top of ``base``, oldest first, provenance left out."""
    out = []
    fmt = f"%H%x00%(trailers:key={ENTRY_TRAILER},valueonly,separator=%x20)%x00%s"
    for line in git.out("log", "--reverse", f"--format={fmt}", f"{base}..HEAD").splitlines():
        sha, name, subject = line.split("\0")
        name = name.strip()
        if name == "provenance":
            continue
        out.append((sha, name or slug(subject)))
    return out


def export(series: Series, git: Git, *, primary: bool | None = None, version: str | None = None) -> Export:
    """What patches/ and the manifest would hold if refreshed from the branch in ``git``.

    ``primary``: the branch's files become the entries' primary files and the series base moves to
    the branch's base (the default when that base is the series base already). Otherwise they
    become the per-release variants for the branch's base.
    """
    tree = git.worktree
    assert tree is not None
    upstream = read_provenance(tree).get("upstream", {})
    base_commit, base_rev = upstream.get("commit"), upstream.get("rev")
    if not base_commit or not git.rev_parse(base_commit):
        raise C128Error(f"cannot refresh: the upstream base {base_commit!r} recorded in {PROVENANCE_PATH} is not in {tree}")
    if primary is None:
        primary = base_rev == series.base
    result = Export()
    by_name = {e.name: e for e in series.entries}
    entries: list[Entry] = []
    for index, (sha, name) in enumerate(_commits(git, base_commit), 1):
        if any(e.name == name for e in entries):
            raise C128Error(f"cannot refresh: two commits carry '{ENTRY_TRAILER}: {name}'; squash them first")
        old = by_name.get(name)
        if old is None:
            result.notes.append(f"new entry '{name}' from commit {sha[:12]}")
            old = Entry(name=name, kind="patch", why=git.out("log", "-1", "--format=%s", sha), base=base_rev)
        entry = Entry(**{**old.__dict__, "variants": list(old.variants)})
        if entry.is_patch:
            data = format_patch(git, sha, name)
            if not primary and old.file and _fallback_gives_same_tree(series, old, git, sha, base_rev):
                data = None  # the file chosen without a variant for this base already makes this commit
            _export_patch(series, old, entry, data, f"{index:04d}-{name}", base_rev, primary, result)
        else:
            content = git.blob(sha, entry.target)
            if content is None:
                raise C128Error(f"cannot refresh: overlay commit {sha[:12]} does not hold {entry.target}")
            result.files[series.root / entry.source] = content
            entry.sha256 = hashlib.sha256(content).hexdigest()
            if primary:
                entry.base = base_rev
        entries.append(entry)
    for e in series.entries:
        if e.name not in by_name or all(x.name != e.name for x in entries):
            result.notes.append(f"entry '{e.name}' has no commit on the branch: dropped from the series")
    new = Series(series.root, series.name, series.version, base_rev if primary else series.base, entries)
    payload_changed = new.to_toml() != series.to_toml() or any(
        not p.is_file() or p.read_bytes() != d for p, d in result.files.items()
    )
    new.version = version or (_bump(series.version) if payload_changed else series.version)
    result.series, result.manifest = new, new.to_toml()
    return result


def _fallback_gives_same_tree(series: Series, old: Entry, git: Git, sha: str, base_rev: str) -> bool:
    """Would the file ``apply`` chooses for ``base_rev`` without a variant of its own (the nearest
    older variant, else the primary) make this very commit, strictly (no 3-way merge)?"""
    others = Entry(**{**old.__dict__, "variants": [v for v in old.variants if v.base != base_rev]})
    fallback = choose(series, git, others, git.out("rev-parse", f"{sha}^")).variant
    with tempfile.TemporaryDirectory(prefix="c128refresh-") as tmp:
        idx = git.with_env(GIT_INDEX_FILE=str(Path(tmp) / "index"))
        idx.run("read-tree", f"{sha}^")
        if not idx.ok("apply", "--cached", str(series.file_of(old, fallback))):
            return False
        return idx.out("write-tree") == git.out("rev-parse", f"{sha}^{{tree}}")


def _export_patch(series: Series, old: Entry, entry: Entry, data: bytes | None, stem: str, base_rev: str,
                  primary: bool, result: Export) -> None:
    """Place one exported patch as the primary file or as the variant for ``base_rev``
    (``data`` None: no variant is needed for ``base_rev``, drop any)."""
    variants = {v.base: series.patches_dir / v.file for v in old.variants}
    if primary or not old.file:
        if old.file and old.base and old.base != base_rev and old.base not in variants:
            variants[old.base] = series.file_of(old)  # the old primary stays, as its base's variant
        variants.pop(base_rev, None)
        entry.file, entry.base = f"{stem}.patch", base_rev
        result.files[series.patches_dir / entry.file] = data
    else:
        result.files[series.patches_dir / f"{stem}.patch"] = series.file_of(old).read_bytes()
        entry.file = f"{stem}.patch"
        variants.pop(base_rev, None)
        if data is not None:
            variants[base_rev] = None  # filled below from ``data``
    entry.variants = []
    for base in sorted(variants):
        path = series.patches_dir / f"{stem}.{base}.patch"
        content = data if variants[base] is None else variants[base].read_bytes()
        result.files[path] = content
        entry.variants.append(Variant(path.name, base, hashlib.sha256(content).hexdigest()))
    entry.sha256 = hashlib.sha256(result.files[series.patches_dir / entry.file]).hexdigest()


def _bump(version: str) -> str:
    m = re.match(r"^(.*?)(\d+)$", version)
    return f"{m.group(1)}{int(m.group(2)) + 1}" if m else f"{version}.1"


def write(series: Series, result: Export) -> list[str]:
    """Write the export; remove patch files no entry refers to any more. Returns what changed."""
    changed = result.changes(series.root)
    for path, data in result.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
    keep = {p.name for p in result.files if p.parent == series.patches_dir}
    for stale in series.patches_dir.glob("*.patch"):
        if stale.name not in keep:
            stale.unlink()
            changed.append(str(stale.relative_to(series.root)))
    series.manifest_path.write_text(result.manifest)
    return sorted(set(changed))
