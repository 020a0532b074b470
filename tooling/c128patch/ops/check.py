"""``check``: does the series apply to a rev? Replayed in a temporary index; nothing is checked out.

It runs what the other verbs run (``series.plan``'s file choice, ``check_paths_at``, exact context as ``wheel``,
a 3-way merge as ``apply``), so each rev gets each verb's exit code (``Verdict``): 0 applies, 1 an entry does
not apply, 2 refused first. ``wheel`` is predicted for releases only; a rev older than every base gets a note."""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path
from typing import Sequence

from packaging.version import Version

from c128patch import exitcodes, procs
from c128patch.errors import C128Error
from c128patch.git import Git, ReadMemo
from c128patch.ops.merged import upstream_hints
from c128patch.ops.replay import FAILED, WS_MERGE, EntryCheck, RevCheck, Verdict, replay_in_index
from c128patch.progress import NullReporter, Reporter
from c128patch.series.layers import overlap_note
from c128patch.series.manifest import Series, installed
from c128patch.series.plan import Planned, base_distances, index_git, validate_files
from c128patch.textsafe import shell_quote
from c128patch.upstream.releases import damaged_cached_wheel, release_version
from c128patch.upstream.source import Target, Upstream, damage_note, open_upstream

__all__ = ["EntryCheck", "RevCheck", "Verdict", "check_rev", "check_revs", "check_upstream", "index_git",
           "replay_in_index"]


def predict(result: RevCheck) -> None:
    """Fill in ``apply``/``wheel`` (and ``ok``) from the per-entry results."""
    if result.error:
        result.apply = Verdict(exitcodes.USAGE, detail=result.error)
        result.wheel, result.ok = result.apply if release_version(result.rev) else None, False
        return
    collision = next((e for e in result.entries if e.status == "collision"), None)
    conflict = next((e for e in result.entries if e.status == "conflict"
                     or (e.status == "whitespace" and WS_MERGE in e.detail)), None)  # git am has no such merge
    inexact = next((e for e in result.entries if e.status not in ("clean", "skipped") or e.renamed), None)
    if collision is not None:  # refused before anything is applied, by apply and by wheel
        result.apply = Verdict(exitcodes.USAGE, collision.name, collision.detail)
    elif conflict is not None:
        result.apply = Verdict(exitcodes.FAILED, conflict.name, conflict.detail)
    if release_version(result.rev):
        if collision is not None:
            result.wheel = result.apply
        elif inexact is not None:  # (clean: a renamed file, the wheel has no such path)
            why = {"3way": "a 3-way merge", "whitespace": "a whitespace-insensitive merge"}.get(inexact.status)
            result.wheel = Verdict(exitcodes.FAILED, inexact.name, f"needs {why}; a wheel is patched with exact "
                                                                   "context" if why else inexact.detail)
        else:
            result.wheel = Verdict()
    result.ok = result.apply.exit == exitcodes.OK


def _bases(series: Series) -> dict[str, str]:
    """The revs the series' files were made on -> their recorded commit ("" where none is)."""
    bases: dict[str, str] = {}
    for e in series.entries:
        for v in e.patch_files():
            bases.setdefault(v.base, v.commit)
    if series.base:
        bases.setdefault(series.base, "")
    return bases


def _by_version(base: str) -> tuple[Version, str]:
    return (Version(release_version(base)) if release_version(base) else Version("0"), base)  # type: ignore[arg-type]


def supported_releases(series: Series) -> list[str]:
    """The releases the series' files were made on, oldest first: what ``check`` checks when no rev is named."""
    return sorted((b for b in _bases(series) if release_version(b)), key=_by_version)


def support_note(series: Series, git: Git, rev: str, commit: str) -> str:
    """A note when ``commit`` descends from none of the revs the series' files were made on."""
    bases = _bases(series)
    here = []
    for b, recorded in bases.items():  # (one rev-parse to the rev itself where it is one of them: apply's usual case)
        c = (recorded and git.rev_parse(recorded)) or git.rev_parse(b)
        if c == commit:
            return ""
        here += [c] if c else []
    if any(git.is_ancestor(c, commit) for c in here):
        return ""
    variants = [v for e in series.entries for v in e.patch_files() if v.sources]
    if not here and any(d is not None for d in base_distances(git, variants, commit).values()):
        return ""  # none of them here by tag or commit (a clone of one's own): by a file's sources, as plan reads
    return _older_note(series, rev, min(bases, key=_by_version)) if bases else ""


def release_support_note(series: Series, version: str) -> str:
    """``support_note`` for a release wheel of ``version``, by version number (no git history)."""
    bases = _bases(series)
    versions = [release_version(b) for b in bases]
    if not bases or None in versions or release_version(version) is None:
        return ""
    if Version(release_version(version)) >= min(Version(v) for v in versions if v):
        return ""
    return _older_note(series, f"v{release_version(version)}", min(bases, key=_by_version))


def _older_note(series: Series, rev: str, oldest: str) -> str:
    where = series.ours.root  # installed, a package refresh never writes: a copy of it
    copy = f"cp -R {shell_quote(str(where.resolve()))} ~/c128patch-series && " if installed(where) else ""
    return (f"{rev} is older than (or not descended from) every release the series was made on; the oldest is "
            f"{oldest}: use {oldest} or newer (c128patch apply --sglang-rev {oldest}), or carry the series back "
            f"with new variants: in that tree c128patch rebase --onto {rev}, then {copy}c128patch refresh --variant"
            + (" --series ~/c128patch-series" if copy else ""))


def _as_replayed(git: Git, commit: str, before: list[Planned], path: str) -> str:
    """``path`` at ``commit`` with the lines the entries ``before`` write there (enough to tell a line it lacks)."""
    upstream = (git.blob(commit, path) or b"").decode(errors="replace")
    added = [line for p in before if p.patch is not None for pf in p.patch.patchset
             if pf.target_file.removeprefix("b/") == path for h in pf for line in (x.value for x in h if x.is_added)]
    made = [p.path.read_text(errors="replace") for p in before if p.patch is None and p.entry.target == path]
    return "\n".join([upstream, *added, *made])


def check_rev(series: Series, git: Git, rev: str, commit: str, hints: dict[str, str] | None = None) -> RevCheck:
    """The replay of the series on ``commit``, with what ``apply`` and ``wheel`` would do there; ``hints``: a cache."""
    git = git if isinstance(git, ReadMemo) else ReadMemo(git)
    with procs.scratch("c128check-") as tmp:
        result, planned = replay_in_index(series, git, rev, commit, Path(tmp) / "index", keep_index=False)
    by_name, cache = {p.entry.name: p for p in planned}, {} if hints is None else hints
    touched = [(p.entry.name, p.touched) for p in planned]
    every = sorted({path for _, paths in touched for path in paths})  # one log of the range serves every entry
    for row in result.entries:
        item = by_name.get(row.name)
        if item is not None and row.status in FAILED:  # a layer entry: an entry changing its lines, or upstream's
            before = planned[: planned.index(item)]
            row.detail += overlap_note(series, before, item, [*row.conflicts, *item.touched], rev,
                                       lambda path, b=before: _as_replayed(git, commit, b, path))
        if item is not None and item.patch is not None and item.variant is not None:
            old = ((git.rev_parse(item.variant.commit) if item.variant.commit else None)
                   or git.rev_parse(item.variant.base))
            row.hints = [h.line() for h in upstream_hints(git, item.entry, item.patch, old or "", commit, row.renamed,
                                                          cache, every)]
    predict(result)
    if not result.error:
        result.note = support_note(series, git, rev, commit)
    if result.wheel is not None and (damaged := damaged_cached_wheel(release_version(rev) or "")):
        # `wheel`'s verdict is the release's sources'; the cached file it would patch is said apart
        path, why = damaged
        result.note = "; ".join(filter(None, [result.note, f"the cached wheel {path} {why}: `wheel --from-release` "
                                              f"refuses it until it is removed (rm {shell_quote(str(path))}; it is "
                                              "downloaded again)"]))
    return result


def check_revs(series: Series, git: Git, targets: Sequence[Target], jobs: int | None = None) -> list[RevCheck]:
    """``check_rev`` for many targets, in parallel (git does the work; each has its own index)."""
    jobs = jobs or min(8, os.cpu_count() or 1)
    shared, hints = ReadMemo(git), {}  # the revs share rev names, ancestry, objects and upstream commits' diffs
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda t: check_rev(series, shared, t.rev, t.commit, hints), targets))


def check_upstream(series: Series, repo: str | None, revs: Sequence[str],
                   reporter: Reporter = NullReporter()) -> tuple[Upstream, list[RevCheck], float]:
    """``check_revs`` on ``revs`` of ``repo`` (None: the releases): the upstream, the results, the seconds."""
    validate_files(series)
    upstream = open_upstream(repo, list(revs), reporter)
    targets = [Target.of(upstream, rev) for rev in revs]
    reporter.step(f"checking {len(targets)} rev(s)")
    start = time.perf_counter()
    try:
        results = check_revs(series, upstream.git, targets)
    except C128Error as exc:  # git's "inflate: data stream error" named neither the cache nor the fix
        exc.message += damage_note(upstream, str(upstream.git.git_dir or upstream.git.worktree), exc.message)
        raise
    return upstream, results, time.perf_counter() - start


def exact(result: RevCheck) -> bool:
    """Every entry applies with exact context (what ``wheel`` needs; ``check --strict``)."""
    return all(e.status in ("clean", "skipped") for e in result.entries)
