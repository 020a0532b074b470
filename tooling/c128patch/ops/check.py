"""``check``: does the series apply to a rev? Replayed in a temporary index; nothing is checked out.

Per entry it says which file was chosen and why (``series.plan``), and for a conflict the files
the 3-way merge really leaves conflicted (``ops.replay``).
"""

from __future__ import annotations

import concurrent.futures
import os
import tempfile
from pathlib import Path

from c128patch.git import Git
from c128patch.ops.replay import EntryCheck, RevCheck, replay_in_index
from c128patch.series.manifest import Series
from c128patch.series.plan import index_git

__all__ = ["EntryCheck", "RevCheck", "check_rev", "check_revs", "index_git", "replay_in_index"]


def check_rev(series: Series, git: Git, rev: str, commit: str) -> RevCheck:
    with tempfile.TemporaryDirectory(prefix="c128check-") as tmp:
        return replay_in_index(series, git, rev, commit, Path(tmp) / "index")[0]


def check_revs(series: Series, git: Git, revs: list[tuple[str, str]], jobs: int | None = None) -> list[RevCheck]:
    """``check_rev`` for many (rev, commit) pairs, in parallel (git does the work; each has its own index)."""
    jobs = jobs or min(8, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda rc: check_rev(series, git, *rc), revs))
