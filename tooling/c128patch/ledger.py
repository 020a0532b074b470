"""The resolution ledger: conflict resolutions made during rebases, kept in the series repo.

git's rerere does the matching: a conflict is keyed by the hash of its conflicted hunks, and
``rr-cache/<hash>/{preimage,postimage}`` holds the resolution. We keep those folders under
``patches/resolutions/rr-cache/`` with an index (``ledger.toml``: entry, upstream range, conflict
hash, files) and, before picking an entry, install only that entry's resolutions into the
repository's rr-cache, so the same conflict is resolved the same way on any machine and in CI.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from .git import Git
from .manifest import Series
from .treestate import git_path

_SKIP = {"thisimage"}


class Ledger:
    def __init__(self, series: Series) -> None:
        self.root = series.patches_dir / "resolutions"
        self.index = self.root / "ledger.toml"

    def rows(self) -> list[dict]:
        if not self.index.is_file():
            return []
        return list(tomllib.loads(self.index.read_text()).get("resolutions", []))

    def refs(self, entry: str, ids: list[str]) -> list[str]:
        known = {(r["entry"], r["conflict"]) for r in self.rows()}
        return [f"{entry}:{i[:12]}" for i in ids if (entry, i) in known]

    def install(self, git: Git, entry: str) -> int:
        """Copy this entry's recorded resolutions into the repository's rr-cache."""
        cache = git_path(git, "rr-cache")
        count = 0
        for row in self.rows():
            if row["entry"] != entry:
                continue
            src = self.root / "rr-cache" / row["conflict"]
            if src.is_dir():
                dest = cache / row["conflict"]
                dest.mkdir(parents=True, exist_ok=True)
                for f in src.iterdir():
                    shutil.copyfile(f, dest / f.name)
                count += 1
        return count

    def record(self, git: Git, entry: str, from_rev: str, onto_rev: str, ids: list[str]) -> list[str]:
        """Keep the resolutions rerere recorded for ``ids`` (after the commit that resolved them)."""
        cache = git_path(git, "rr-cache")
        rows = self.rows()
        have = {(r["entry"], r["conflict"]) for r in rows}
        refs = []
        for cid in ids:
            src = cache / cid
            if not (src / "postimage").is_file():
                continue  # rerere recorded no resolution (e.g. the file was deleted)
            dest = self.root / "rr-cache" / cid
            dest.mkdir(parents=True, exist_ok=True)
            for f in src.iterdir():
                if f.name not in _SKIP:
                    shutil.copyfile(f, dest / f.name)
            if (entry, cid) not in have:
                rows.append({"entry": entry, "conflict": cid, "from": from_rev, "onto": onto_rev})
            refs.append(f"{entry}:{cid[:12]}")
        if refs:
            self.root.mkdir(parents=True, exist_ok=True)
            rows.sort(key=lambda r: (r["entry"], r["conflict"]))
            self.index.write_text(tomli_w.dumps({"resolutions": rows}))
        return refs
