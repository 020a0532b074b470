"""The evidence matrix: per release, does the series apply (replayed now, per entry), and what do the
committed results prove? A cell is ``verified`` (a passing result under today's key), ``failed``,
``stale`` (a result under another key: other series files or upstream sources) or ``unverified``
(none). Keys are by content (evidence.keys), so a user's clone is verified where its sources are the
evidenced ones; elsewhere the files that differ from the nearest evidenced release are named.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from c128patch.errors import C128Error
from c128patch.evidence.keys import EvidenceKey, differing, differing_files, is_old_style, key_for
from c128patch.evidence.results import KINDS, Result, load_results, results_root
from c128patch.git import Git
from c128patch.ops.check import check_rev
from c128patch.progress import NullReporter, Reporter
from c128patch.series.manifest import Series
from c128patch.textsafe import cell, md, md_cell, plain
from c128patch.upstream.releases import DEFAULT_RELEASES, ReleaseHistory, release_version, tag_for
from c128patch.upstream.source import open_upstream

State = Literal["verified", "failed", "stale", "unverified"]
SHOWN_FILES = 8


@dataclass(frozen=True)
class SourcesDiff:
    """How a commit's keyed sources differ from the nearest evidenced release's."""

    rev: str  # the evidenced release
    files: list[str]

    def text(self) -> str:
        names = ", ".join(self.files[:SHOWN_FILES]) + (f" and {len(self.files) - SHOWN_FILES} more"
                                                       if len(self.files) > SHOWN_FILES else "")
        n = len(self.files)
        return (f"{n} file{'s' if n != 1 else ''} differ{'s' if n == 1 else ''} from {self.rev}'s evidenced sources: "
                f"{names}")


@dataclass(frozen=True)
class Cell:
    state: State
    detail: str = ""
    path: str | None = None  # the result file, relative to the results folder


@dataclass
class ReleaseRow:
    rev: str
    commit: str
    key: EvidenceKey | None
    applies: dict[str, str] = field(default_factory=dict)  # entry -> clean | 3way | conflict | collision
    apply_error: str = ""
    cells: dict[str, Cell] = field(default_factory=dict)  # kind -> cell
    differs: SourcesDiff | None = None  # no evidence under these sources: how they differ from the nearest
    uncovered: str = ""  # the layers in effect, which the series' evidence says nothing of

    @property
    def applies_summary(self) -> str:
        if self.apply_error:
            return f"refused: {self.apply_error}"
        bad = [n for n, s in self.applies.items() if s in ("conflict", "collision")]
        if bad:
            return f"conflict ({', '.join(bad)})"
        three = [n for n, s in self.applies.items() if s == "3way"]
        return f"3-way ({len(three)} entries)" if three else "strict"

    def missing(self) -> list[str]:
        """Why this release is not fully verified (empty: it is)."""
        out = [f"applies {self.applies_summary}"] if self.applies_summary != "strict" else []
        out += [self.differs.text()] if self.differs else []
        out += [self.uncovered] if self.uncovered else []
        return out + [f"{kind} {cell.state}" for kind, cell in self.cells.items() if cell.state != "verified"]

    def to_json(self) -> dict[str, Any]:
        return {"rev": self.rev, "commit": self.commit, "key": self.key.to_json() if self.key else None,
                "applies": self.applies_summary, "entries": self.applies, "fully_verified": not self.missing(),
                "cells": {k: asdict(c) for k, c in self.cells.items()}, "missing": self.missing(),
                "differs": asdict(self.differs) if self.differs else None}


def evidenced_rev(results: list[Result], key: EvidenceKey | None, rev: str = "") -> str:
    """The release whose evidence was taken on ``key``'s sources (``rev`` itself first): a clone's commit with a
    release's files reads that release's older results as ``stale``, as the release does."""
    same = [r.rev for r in results if key is not None and r.key is not None and r.key.sources == key.sources]
    return rev if rev in same or not same else same[0]


def cell_for(results: list[Result], rev: str, kind: str, key: EvidenceKey | None, root: Path) -> Cell:
    """The cell of ``kind``: the result under ``key`` (any rev folder), else the rev's own file."""
    mine = [r for r in results if r.kind == kind and r.label == "patched"]
    match = next((r for r in mine if key is not None and r.key == key and r.rev == rev), None)
    match = match or next((r for r in mine if key is not None and r.key == key), None)
    rel = (lambda r: str(r.path.relative_to(root)))  # noqa: E731
    if match is not None:
        return Cell("verified" if match.ok else "failed", match.summary, rel(match))
    old = next((r for r in mine if r.rev == rev), None)
    if old is not None:
        why = ("old-style key (whole tree id): python ci/rekey_results.py" if is_old_style(old.data.get("key"))
               else "no key" if old.key is None else f"key {old.key.sources[:10]}/{old.key.series_hash[:10]}")
        return Cell("stale", f"{old.summary}; {why}", rel(old))
    return Cell("unverified")


def sources_diff(git: Git, results: list[Result], key: EvidenceKey | None, rev: str = "") -> SourcesDiff | None:
    """None when some result is keyed by ``key``'s sources (or nothing can be compared); else the
    files that differ from the evidenced release nearest to them (``rev``'s own on a tie)."""
    keyed = [r for r in results if r.label == "patched" and r.key is not None and r.key.files]
    if key is None or not key.files or not keyed or any(r.key.sources == key.sources for r in keyed):
        return None
    best = min(keyed, key=lambda r: (len(differing(r.key.files, key.files)), r.rev != rev, r.rev))
    objects = ReleaseHistory().root / "objects"  # the release history's objects hold the evidenced trees
    alternates = str(objects) if objects.is_dir() else None
    return SourcesDiff(best.rev, differing_files(git, differing(best.key.files, key.files), alternates))


def build_matrix(series: Series, git: Git, revs: list[str], root: Path) -> list[ReleaseRow]:
    results, rows = load_results(root), []
    for rev in revs:
        commit = git.rev_parse(rev)
        if commit is None:
            raise C128Error(f"unknown upstream revision {rev!r}")
        check = check_rev(series, git, rev, commit)
        row = ReleaseRow(rev, commit, None, {e.name: e.status for e in check.entries}, check.error)
        ours, layers = series.ours, series.layers
        if layers:  # the evidence is of our series: its cells say so, the layers' entries have none of their own
            row.uncovered = (f"layer(s) {', '.join(layer.name for layer in layers)} not covered (the evidence is of "
                             f"series {ours.name} {ours.version} alone)")
        try:
            row.key = key_for(ours, git, commit)
        except C128Error as exc:
            row.apply_error = row.apply_error or exc.message
        row.cells = {kind: cell_for(results, evidenced_rev(results, row.key, rev), kind, row.key, root)
                     for kind in KINDS}
        row.differs = sources_diff(git, results, row.key, rev)
        rows.append(row)
    return rows


def matrix_for(series: Series, repo: str | None, revs: list[str], root: Path,
               reporter: Reporter = NullReporter()) -> list[ReleaseRow]:
    """``matrix``'s rows: ``revs`` (default: every supported release) of ``repo`` (default: the release history)."""
    wanted = revs or [tag_for(v) for v in DEFAULT_RELEASES]
    if repo is None:
        bad = [rev for rev in wanted if release_version(rev) is None]
        if bad:
            raise C128Error(f"--sglang-rev {bad[0]}: not a release tag (vX.Y.Z); evidence is kept per release "
                            "(pass --repo PATH|URL to evaluate other revisions of your repository)")
        wanted = [tag_for(release_version(rev) or rev) for rev in wanted]
    upstream = open_upstream(repo, wanted, reporter)
    for rev in wanted:
        upstream.resolve(rev)
    reporter.step("replaying the series on each release")
    return build_matrix(series, upstream.git, wanted, root)


def verification_note(series: Series, git: Git, commit: str, label: str, root: Path | None = None) -> str | None:
    """One line when ``commit`` + the series is not fully verified by the committed results (by key); else None."""
    root = results_root(series) if root is None else root
    try:
        key = key_for(series, git, commit)
    except C128Error:
        return f"note: {label} + this series is unverified (the series does not plan on it); see `c128patch matrix`"
    results = load_results(root)
    cells = {kind: cell_for(results, evidenced_rev(results, key), kind, key, root) for kind in KINDS}
    missing = [f"{kind} {cell.state}" for kind, cell in cells.items() if cell.state != "verified"]
    if not missing:
        return None
    diff = sources_diff(git, results, key)
    if diff is not None:
        return f"note: {label} + this series is not fully verified: {diff.text()}; see `c128patch matrix`"
    return f"note: {label} + this series is not fully verified ({', '.join(missing)}); see `c128patch matrix`"


def release_note(series: Series, version: str) -> str | None:
    """``verification_note`` for an sglang release (what `wheel` patches), via the release history."""
    git = ReleaseHistory().git
    commit = git.rev_parse(tag_for(version))
    if commit is None:
        return (f"note: sglang {version} + this series is unverified (not in the release history); "
                "see `c128patch matrix`")
    return verification_note(series, git, commit, f"sglang {version}")


def markdown(rows: list[ReleaseRow]) -> str:
    """The release table as Markdown (what README.md shows)."""
    head = ["release", "applies", *KINDS]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [f"{c.state}" + (f" ({c.detail})" if c.detail else "") for c in (row.cells[k] for k in KINDS)]
        rev = row.rev if re.fullmatch(r"[\w.+-]+", row.rev) else md(row.rev)  # a --repo's rev (`^{/<b>|@x}`): data
        # (a cell quotes a results file: an upstream test's id is any string, ``t[<img src=x> @x #12]``)
        lines.append("| " + " | ".join([cell(plain(rev)), *(md_cell(c) for c in [row.applies_summary, *cells])]) + " |")
    return "\n".join(lines) + "\n"
