"""Stage the series' GPU evidence run: every release's patched and unpatched kernel-tier sources, side
by side, small enough to carry to a GPU machine in one call: ``dest/stage.json`` (revs, commits, keys),
``dest/<rev>/patched/sglang/...`` (the suite's subset of <rev> + the series, with a provenance record
naming the upstream sources), ``dest/<rev>/upstream/...`` (as released) and optionally
``dest/<rev>/before/...`` (the series of another commit: a fix's "before" record). Trees are replayed
in a temporary index (``ops.check.replay_in_index``); a release the series does not apply to is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.evidence.keys import KERNEL_TIER_PATHS, key_from_provenance, planned_key
from c128patch.git import Git
from c128patch.ops.check import index_git, replay_in_index
from c128patch.series import provenance
from c128patch.series.manifest import Series, load_series
from c128patch.series.paths import confine
from c128patch.smoke.trees import extract_python, read_json
from c128patch.smoke.trees import stage as stage_subsets

SERIES_PATHS = ("patches", "csrc", "overlay")
MANIFEST = "stage.json"
SCHEMA = 1


def patched_sources(series: Series, git: Git, rev: str, dest: Path, paths: tuple[str, ...] = KERNEL_TIER_PATHS) -> Path:
    """``paths`` of ``rev`` + the series under ``dest/sglang``, with a provenance naming the keyed sources."""
    commit = git.rev_parse(rev)
    if commit is None:
        raise C128Error(f"unknown upstream revision {rev!r}")
    dest.mkdir(parents=True, exist_ok=True)
    with procs.scratch("c128stage-") as tmp:
        index_file = Path(tmp) / "index"
        result, planned = replay_in_index(series, git, rev, commit, index_file)
        if not result.ok:
            bad = next((e for e in result.entries if e.status in ("conflict", "collision")), None)
            why = f"{bad.name}: {bad.status} ({bad.detail})" if bad else result.error
            raise C128Error(f"the series does not apply to {rev}: {why}")
        idx = index_git(git, index_file)
        files = idx.out("ls-files", "--", *paths)
        out = Path(tmp) / "out"
        idx.run("checkout-index", f"--prefix={out}/", "--stdin", input=files + "\n")
        shutil.copytree(out / "python" / "sglang", dest / "sglang", dirs_exist_ok=True)
    key = planned_key(git, commit, planned)
    upstream = {"rev": rev, "commit": commit, "sources": {"id": key.sources, "files": dict(key.files)},
                "source": "release history"}
    applied = [{"name": e.name, "applied": e.status} for e in result.entries]
    record = provenance.build(series, planned, upstream, applied)
    (dest / Path(provenance.PROVENANCE_PATH).relative_to("python")).write_text(provenance.dumps(record))
    return dest


def export_series(repo: Git, rev: str, dest: Path) -> Series:
    """The series as committed at ``rev`` of this repository (patches/, csrc/, overlay/)."""
    if repo.rev_parse(rev) is None:
        raise C128Error(f"--before: {rev!r} is not a commit of {repo.worktree}")
    for path in SERIES_PATHS:
        repo.extract(rev, path, dest)
    return load_series(dest)


def stage_release(series: Series, git: Git, rev: str, dest: Path, suite: Path, *,
                  before: Series | None = None) -> dict[str, Any]:
    """Stage one release under ``dest/<rev>`` (see the module docstring); returns its manifest entry."""
    commit = git.rev_parse(rev)  # patched_sources refuses an unknown one first
    with procs.scratch("c128stage-") as tmp:
        work = Path(tmp)
        patched = patched_sources(series, git, rev, work / "patched")
        present = git.out("ls-tree", "--name-only", str(commit), "--", *KERNEL_TIER_PATHS).split()
        trees = {"patched": patched, "upstream": extract_python(git, str(commit), work, tuple(present))}
        if before is not None:
            trees["before"] = patched_sources(before, git, rev, work / "before")
        sizes = stage_subsets(suite, trees, dest / rev)
    staged: dict[str, Any] = {"rev": rev, "commit": commit, "trees": {}}
    for label, info in sizes.items():
        record_path = dest / rev / label / Path(provenance.PROVENANCE_PATH).relative_to("python")
        key = key_from_provenance(read_json(record_path))
        staged["trees"][label] = {"path": f"{rev}/{label}", "files": info["files"], "bytes": info["bytes"],
                                  **({"key": key.to_json()} if key else {})}  # the patched and before trees'
    return staged


def stage(series: Series, git: Git, revs: list[str], dest: Path, suite: Path, *,
          before: Series | None = None, before_revs: tuple[str, ...] = (), before_from: str = "") -> dict[str, Any]:
    """Stage ``revs`` (and the before trees) under ``dest``, replacing earlier ones; writes and returns the manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    releases = []
    for rev in revs:  # (a rev becomes a folder here: confined before anything is removed, whoever the caller)
        shutil.rmtree(confine(dest, rev, "the releases to stage"), ignore_errors=True)
        releases.append(stage_release(series, git, rev, dest, suite,
                                      before=before if rev in before_revs else None))
    manifest = {"schema": SCHEMA, "series": {"name": series.name, "version": series.version, "digest": series.digest()},
                "before_from": before_from or None, "releases": releases}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def read_manifest(dest: Path) -> dict[str, Any]:
    manifest = read_json(dest / MANIFEST)
    if manifest is None:
        raise C128Error(f"no {MANIFEST} in {dest}: stage it first (python ci/gpu/prepare.py)")
    return manifest
