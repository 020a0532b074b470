"""Same upstream wheel + same series = same patched wheel bytes, whatever the cache holds.

The release history's commit ids are local facts of a cache; a patched wheel names upstream by
content (release, wheel sha256, source tree id), and each release's commit depends on that release
alone (its parent is the nearest older supported release), so adding a release to the cache changes
nothing already there. Real sglang release wheels 0.5.19-0.5.23, real series, real CLI.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from c128patch.git import Git
from c128patch.upstream.releases import DEFAULT_RELEASES, SUPERSEDED_PREFIX, ReleaseHistory, history_parent, wheel_for
from support import Run, invoke

EXTRA = "0.5.19"  # older than every supported release: never in the default cache


@pytest.fixture(scope="module")
def wheelhouse(sglang_release_repo: Path) -> Path:
    """The default cache's wheels, with the 0.5.19 release wheel beside the four defaults."""
    wheel_for(EXTRA)
    return sglang_release_repo.parent / "wheels"


def in_cache(cache: Path, wheelhouse: Path, *args: str) -> Run:
    """Run the CLI against cache ``cache`` (release wheels taken from ``wheelhouse``)."""
    env = {"C128PATCH_CACHE": str(cache), "C128PATCH_WHEELHOUSE": str(wheelhouse), "SOURCE_DATE_EPOCH": None}
    return invoke(*args, as_json=False, env=env)


def tags(cache: Path) -> dict[str, str]:
    git = Git(git_dir=cache / "sglang-releases.git")
    return {v: git.rev_parse(f"v{v}") for v in (*DEFAULT_RELEASES, EXTRA) if git.rev_parse(f"v{v}")}


def build(cache: Path, wheelhouse: Path, out: Path) -> dict:
    res = in_cache(cache, wheelhouse, "wheel", "--from-release", "0.5.23", "-o", str(out), "--json")
    assert res.code == 0, res.err
    return res.out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> dict:
    """Cache A: build, `check --sglang-rev v0.5.19`, build again. Cache B: the check first, then build."""
    root = tmp_path_factory.mktemp("repro")
    a, b = root / "cache-a", root / "cache-b"
    first = build(a, wheelhouse, root / "a1")
    tags_before = tags(a)
    check = in_cache(a, wheelhouse, "check", "--sglang-rev", f"v{EXTRA}", "--json")
    tags_after = tags(a)
    second = build(a, wheelhouse, root / "a2")
    in_cache(b, wheelhouse, "check", "--sglang-rev", f"v{EXTRA}", "--json")
    other = build(b, wheelhouse, root / "b")
    return {"cache_a": a, "first": first, "second": second, "other": other, "check": check,
            "tags_before": tags_before, "tags_after": tags_after, "tags_b": tags(b)}


def test_a_wheel_keeps_its_bytes_after_an_older_release_joins_the_cache(runs):
    assert f"v{EXTRA}" in runs["check"].text  # the check did run on 0.5.19 (its verdict is check's business)
    assert runs["second"]["sha256"] == runs["first"]["sha256"]


def test_two_caches_filled_in_a_different_order_give_the_same_wheel(runs):
    assert runs["other"]["sha256"] == runs["first"]["sha256"]


def test_adding_a_release_changes_no_commit_already_in_the_cache(runs):
    assert set(runs["tags_after"]) == {*runs["tags_before"], EXTRA}
    assert {v: runs["tags_after"][v] for v in runs["tags_before"]} == runs["tags_before"]


def test_every_release_has_the_same_commit_in_every_cache(runs):
    assert runs["tags_b"] == runs["tags_after"]


def test_the_wheel_names_upstream_by_content_not_by_a_history_commit(runs):
    with zipfile.ZipFile(runs["first"]["wheel"]) as zf:
        record = json.loads(zf.read("sglang/c128patch_provenance.json"))
        sbom = json.loads(next(zf.read(n) for n in zf.namelist() if n.endswith("sboms/c128patch.cdx.json")))
    up = record["upstream"]
    tree = Git(git_dir=ReleaseHistory().root).out("rev-parse", "v0.5.23^{tree}")
    assert "commit" not in up
    assert (up["tree"], up["wheel_sha256"], up["version"]) == (tree, runs["first"]["upstream_sha256"], "0.5.23")
    (ancestor,) = sbom["metadata"]["component"]["pedigree"]["ancestors"]
    assert {"name": "c128patch:upstream:tree", "value": tree} in ancestor["properties"]


@pytest.mark.parametrize("version, parent", [
    ("0.5.19", None), ("0.5.20", None), ("0.5.21", "0.5.20"), ("0.5.23", "0.5.22"),
    ("0.5.23.post1", "0.5.23"), ("0.5.24", "0.5.23"),
], ids=["older-extra", "oldest", "default", "newest", "post-release", "newer-extra"])
def test_a_release_descends_from_the_nearest_older_supported_release(version, parent):
    assert history_parent(version) == parent


def test_an_extra_release_older_than_the_supported_ones_is_a_root_commit(runs):
    git = Git(git_dir=runs["cache_a"] / "sglang-releases.git")
    assert git.out("log", "--format=%P", "-1", f"v{EXTRA}") == ""
    assert not git.is_ancestor(git.rev_parse(f"v{EXTRA}"), git.rev_parse("v0.5.20"))


def test_a_cache_of_the_old_layout_moves_its_tags_and_keeps_the_old_commits(runs, tmp_path: Path, wheelhouse: Path):
    """Layout 1 chained every release in the cache: v0.5.20 descended from v0.5.19. Such a tag
    moves to the canonical commit; the commit trees were made from stays reachable."""
    source = runs["cache_a"] / "sglang-releases.git"
    repo = tmp_path / "cache" / "sglang-releases.git"
    shutil.copytree(source, repo)
    git = Git(git_dir=repo)
    canonical = git.rev_parse("v0.5.20")
    old = git.out("commit-tree", "v0.5.20^{tree}", "-p", f"v{EXTRA}", "-m", "sglang 0.5.20 (layout 1)")
    git.run("update-ref", "refs/tags/v0.5.20", old)
    (repo / "c128patch-layout").unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
        mp.setenv("C128PATCH_WHEELHOUSE", str(wheelhouse))
        ReleaseHistory().ensure()
    assert git.rev_parse("v0.5.20") == canonical
    assert git.rev_parse(f"{SUPERSEDED_PREFIX}/v0.5.20-{old[:12]}") == old
    assert (repo / "c128patch-layout").read_text().strip() == "2"
