"""The key every piece of evidence is stored under: (upstream tree id, series hash).

* ``upstream_tree``: the git tree object of the upstream commit the series was replayed on
  (``git rev-parse <commit>^{tree}``). The release history is built reproducibly, so a
  release has the same tree id on every machine, and a user's commit with the same sources
  has it too.
* ``series_hash``: sha256 over the files that release's plan uses, in plan order: for each
  entry its name and the sha256 of the file chosen for that rev (the patch variant, or the
  overlay source). A change to any of them, or another variant chosen, is another key;
  a change to a variant another release uses is not.

A result whose key differs from the key computed now is stale: it proves something about
other files or other sources.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.series.manifest import Series, sha256_file
from c128patch.series.plan import Planned, plan


@dataclass(frozen=True)
class EvidenceKey:
    upstream_tree: str
    series_hash: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> EvidenceKey | None:
        if not isinstance(data, dict) or not data.get("upstream_tree") or not data.get("series_hash"):
            return None
        return cls(str(data["upstream_tree"]), str(data["series_hash"]))

    def short(self) -> str:
        return f"{self.upstream_tree[:10]}/{self.series_hash[:10]}"


def series_hash(entries: Iterable[tuple[str, str]]) -> str:
    """sha256 over (entry name, file sha256) pairs, in plan order."""
    h = hashlib.sha256()
    for name, digest in entries:
        h.update(f"{name}\0{digest}\n".encode())
    return h.hexdigest()


def planned_hash(planned: list[Planned]) -> str:
    return series_hash((item.entry.name, sha256_file(item.path)) for item in planned)


def upstream_tree(git: Git, commit: str) -> str:
    proc = git.run("rev-parse", "--verify", "--quiet", f"{commit}^{{tree}}", check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise C128Error(f"cannot read the tree of upstream commit {commit[:12]}")
    return proc.stdout.strip()


def key_for(series: Series, git: Git, commit: str) -> EvidenceKey:
    """The key of ``series`` replayed on ``commit`` (a commit id in ``git``)."""
    return EvidenceKey(upstream_tree(git, commit), planned_hash(plan(series, git, commit)))


def key_from_provenance(record: dict | None) -> EvidenceKey | None:
    """The key a provenance record proves, when it names the upstream tree (staged trees do)."""
    if not record:
        return None
    tree = (record.get("upstream") or {}).get("tree")
    entries = record.get("entries") or []
    if not tree or not entries or any("sha256" not in e for e in entries):
        return None
    return EvidenceKey(str(tree), series_hash((str(e["name"]), str(e["sha256"])) for e in entries))
