"""Run the gate audit (audit.py) on the series as replayed on an upstream rev."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from c128patch.errors import C128Error
from c128patch.fit.tree import PY_ROOT, TreeReader
from c128patch.git import Git
from c128patch.ops.audit import Finding, audit_patch
from c128patch.ops.check import index_git, replay_in_index
from c128patch.series.manifest import Series


def audit_series(series: Series, git: Git, rev: str, commit: str) -> list[Finding]:
    """Findings for every gated patch entry, on the whole series applied to ``commit``."""
    with tempfile.TemporaryDirectory(prefix="c128audit-") as tmp:
        index_file = Path(tmp) / "index"
        result, planned = replay_in_index(series, git, rev, commit, index_file)
        if not result.ok:
            failed = result.error or next(f"{e.name}: {e.detail}" for e in result.entries
                                          if e.status in ("conflict", "collision"))
            raise C128Error(f"cannot audit on {rev}: the series does not apply ({failed})")
        gated = [p for p in planned if p.patch is not None and p.entry.gate]
        if not gated:
            return []
        reader = TreeReader(git, index_git(git, index_file).out("write-tree"), PY_ROOT)  # read on demand
        try:
            return [replace(f, entry=item.entry.name) for item in gated
                    for f in audit_patch(item.path.read_text(), reader.text, item.entry.gate)]
        finally:
            reader.close()
