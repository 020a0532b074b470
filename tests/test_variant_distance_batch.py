"""series.plan.base_distances: one history walk for all of a plan's variants gives each the distance
that its own path-limited ``rev-list`` gives (the nearest-ancestor rule of variant choice)."""

from __future__ import annotations

import subprocess

import pytest

from c128patch.git import Git
from c128patch.series import plan
from c128patch.series.manifest import Variant, default_series_root, load_series
from support import RELEASES

VARIANTS = [v for e in load_series(default_series_root()).entries for v in e.patch_files()]


def one_walk_each(git: Git, variant: Variant, target: str) -> int | None:
    """The distance as found before the batch: one ``rev-list`` of the variant's own paths."""
    if not variant.sources:
        return plan.base_distances(git, [variant], target)[variant]  # (no walk: its commit or tag)
    paths = [p for p, _ in variant.sources]
    touching = git.out("rev-list", f"--max-count={plan.ANCESTOR_SEARCH}", target, "--", *paths).split()
    newer = None
    for commit in [c for c in [target, *touching] if not (c == target and touching and touching[0] == target)]:
        if plan.sources_at(git, commit, paths) == variant.sources:
            return 0 if newer is None else git.count(f"{newer}..{target}") + 1
        newer = commit if commit != target else newer
    return None


@pytest.mark.parametrize("tag", RELEASES)
def test_the_one_walk_gives_every_variant_its_own_walk_s_distance(tag, sglang_release_repo, monkeypatch):
    git = Git(git_dir=sglang_release_repo)
    want = {v: one_walk_each(git, v, tag) for v in VARIANTS}
    assert tag == RELEASES[0] or any(d not in (None, 0) for d in want.values())  # (a base some commits back)
    calls, raw = [], Git._raw
    monkeypatch.setattr(Git, "_raw", lambda self, args, *a, **k: calls.append(args) or raw(self, args, *a, **k))
    assert plan.base_distances(git, VARIANTS, tag) == want
    walks = [args for args in calls if args[0] in ("rev-list", "log") and "--" in args]
    assert len(walks) == 1, walks  # one path-limited walk, not one per variant


def test_a_variant_whose_commits_the_cut_walk_missed_is_walked_on_its_own(sglang_release_repo, tmp_path, monkeypatch):
    series = load_series(default_series_root())
    old = next(v for v in series.entry("c128-dspark-online-commit").patch_files() if v.base == "v0.5.20")
    other = next(v for v in series.entry("c128-dspark-online-backend").patch_files() if v.base == "v0.5.23")
    assert not {p for p, _ in old.sources} & {p for p, _ in other.sources}
    repo = tmp_path / "sglang.git"  # a clone: the release history stays as it is
    subprocess.run(["git", "clone", "--quiet", "--bare", str(sglang_release_repo), str(repo)], check=True)
    git = Git(git_dir=repo).with_env(GIT_INDEX_FILE=str(tmp_path / "index"))
    tip = git.rev_parse("v0.5.21")
    git.run("read-tree", tip)
    # 2 commits on the old variant's file, then 9 on the other's: a walk cut at 4 x 2 sees only the latter
    for i, variant in enumerate([old] * 2 + [other] * 9):
        path = variant.sources[-1][0]  # (the other's second file)
        blob = git.out("hash-object", "-w", "--stdin", input=f"{git.blob(tip, path).decode()}# upstream {i}\n")
        git.run("update-index", "--cacheinfo", f"100644,{blob},{path}")
        tip = git.out("commit-tree", git.out("write-tree"), "-p", tip, input=f"upstream {i}")
    monkeypatch.setattr(plan, "ANCESTOR_SEARCH", 4)
    git = Git(git_dir=repo)
    want = {v: one_walk_each(git, v, tip) for v in (old, other)}
    assert want[old] is not None  # found past its two new commits: only if its own commits were walked
    assert plan.base_distances(git, [old, other], tip) == want
