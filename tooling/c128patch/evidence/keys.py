"""The key every piece of evidence is stored under: (upstream sources, series hash).

``sources``: sha256 over (path, git object id) of the kernel tier's paths and every file the series
touches there (absent ones as absent), listed in ``files``: a content id, so any clone with the same
sources gets the same key, and only a change to a keyed file changes it. ``series_hash``: sha256 over
each planned entry's name and the sha256 of its chosen file, in plan order. A result whose key
differs from today's is stale; an old-style key (``upstream_tree``) is re-keyed by ``ci/rekey_results.py``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.series.manifest import ABSENT, Series, sha256_file
from c128patch.series.plan import Planned, plan

# What the kernel tier reads of a tree; the suite's tree_subset.py picks its files from these.
KERNEL_TIER_PATHS = ("python/sglang/__init__.py", "python/sglang/kernels", "python/sglang/srt/__init__.py",
                     "python/sglang/srt/environ.py",
                     "python/sglang/srt/layers/attention/dsv4",  # the series III controller's folder
                     # upstream sources the series III GPU tests run from source
                     "python/sglang/srt/layers/attention/deepseek_v4_backend.py",
                     "python/sglang/srt/model_executor/forward_batch_info.py",
                     "python/sglang/srt/speculative/ragged_verify.py")


@dataclass(frozen=True)
class EvidenceKey:
    sources: str
    series_hash: str
    files: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # (path, "type oid" | absent)

    def to_json(self) -> dict[str, Any]:
        files = {"files": dict(self.files)} if self.files else {}
        return {"sources": self.sources, "series_hash": self.series_hash, **files}

    @classmethod
    def from_json(cls, data: Any) -> EvidenceKey | None:
        """The key of a result; None when it has none or an old-style one (``is_old_style``)."""
        if not isinstance(data, dict) or not data.get("sources") or not data.get("series_hash"):
            return None
        files = data.get("files") if isinstance(data.get("files"), dict) else {}
        return cls(str(data["sources"]), str(data["series_hash"]),
                   tuple(sorted((str(k), str(v)) for k, v in files.items())))


def is_old_style(data: Any) -> bool:
    """A key naming the whole upstream tree (before keys were by content)."""
    return isinstance(data, dict) and bool(data.get("upstream_tree")) and not data.get("sources")


def series_hash(entries: Iterable[tuple[str, str]]) -> str:
    """sha256 over (entry name, file sha256) pairs, in plan order."""
    h = hashlib.sha256()
    for name, digest in entries:
        h.update(f"{name}\0{digest}\n".encode())
    return h.hexdigest()


def planned_hash(planned: list[Planned]) -> str:
    return series_hash((item.entry.name, sha256_file(item.path)) for item in planned)


def source_paths(touched: Iterable[str]) -> list[str]:
    """The keyed paths: the kernel tier's and the files the series touches."""
    return sorted(set(KERNEL_TIER_PATHS) | set(touched))


def source_files(git: Git, commit: str, paths: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(path, "<type> <oid>" or ``absent``) for each of ``paths`` at ``commit`` (one ``cat-file --batch-check``)."""
    paths = list(paths)
    if not git.ok("rev-parse", "--verify", "--quiet", f"{commit}^{{tree}}"):
        raise C128Error(f"cannot read the tree of upstream commit {commit[:12]}")
    query = "".join(f"{commit}:{p}\n" for p in paths)
    lines = git.out("cat-file", "--batch-check=%(objecttype) %(objectname)", input=query).splitlines()
    if len(lines) != len(paths):
        raise C128Error(f"cannot read the keyed sources of upstream commit {commit[:12]}")
    return tuple(sorted((p, ABSENT if line.endswith(" missing") else line) for p, line in zip(paths, lines)))


def key_of(files: tuple[tuple[str, str], ...], series: str) -> EvidenceKey:
    """The key of ``files`` ((path, object id) pairs: their sha256, sorted by path) under ``series``."""
    return EvidenceKey(series_hash(sorted(files)), series, files)


def planned_key(git: Git, commit: str, planned: list[Planned]) -> EvidenceKey:
    """The key of ``planned`` (a plan for ``commit``) replayed on ``commit``."""
    paths = source_paths(p for item in planned for p in item.touched)
    return key_of(source_files(git, commit, paths), planned_hash(planned))


def key_for(series: Series, git: Git, commit: str) -> EvidenceKey:
    """The key of ``series`` replayed on ``commit`` (a commit id in ``git``)."""
    return planned_key(git, commit, plan(series, git, commit))


def key_from_provenance(record: dict | None, git: Git | None = None) -> EvidenceKey | None:
    """The key a provenance record proves: its recorded upstream ``sources``, else read from ``git``."""
    if not record:
        return None
    entries = record.get("entries") or []
    if not entries or any("sha256" not in e for e in entries):
        return None
    digest = series_hash((str(e["name"]), str(e["sha256"])) for e in entries)
    upstream = record.get("upstream") or {}
    recorded = upstream.get("sources")
    if isinstance(recorded, dict) and isinstance(recorded.get("files"), dict):
        files = tuple(sorted((str(k), str(v)) for k, v in recorded["files"].items()))
        return key_of(files, digest)
    if git is None or not upstream.get("commit"):
        return None
    paths = source_paths(p for e in entries for p in e.get("files") or [])
    return key_of(source_files(git, str(upstream["commit"]), paths), digest)


def differing(evidenced: Iterable[tuple[str, str]], ours: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(path, evidenced oid, our oid) for every keyed path whose content differs."""
    a, b = dict(evidenced), dict(ours)
    return [(p, a.get(p, ABSENT), b.get(p, ABSENT)) for p in sorted(set(a) | set(b))
            if a.get(p, ABSENT) != b.get(p, ABSENT)]


def differing_files(git: Git, diffs: list[tuple[str, str, str]], alternates: str | None = None) -> list[str]:
    """The files behind ``differing``: a folder on both sides expanded (``diff-tree``; ``alternates``: an objects
    folder that may hold the evidenced tree), else named with a '/'."""
    out: list[str] = []
    reader = git.with_env(GIT_ALTERNATE_OBJECT_DIRECTORIES=alternates) if alternates else git
    for path, old, new in diffs:
        trees = [oid.split()[-1] for oid in (old, new) if oid.startswith("tree ")]
        if len(trees) == 2:
            proc = reader.run("diff-tree", "-r", "--name-only", *trees, check=False)
            if proc.returncode == 0 and proc.stdout.strip():
                out += [f"{path}/{name}" for name in proc.stdout.split()]
                continue
        out.append(f"{path}/" if trees else path)
    return out
