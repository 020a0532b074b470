"""Which file each entry takes on a release (series.plan), as check reports it: preimage blobs first,
then the nearest-ancestor base, then the first file that applies strictly; the same with or without
tag names."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from c128patch.git import Git
from c128patch.series import plan
from c128patch.series.manifest import load_series
from support import RELEASES, copy_series, invoke

RS = "c128-dspark-record-streams"
STARTUP = "c128-dspark-online-startup"
BACKEND = "c128-dspark-online-backend"
COMMIT = "c128-dspark-online-commit"


def chosen(repo: Path, series: Path, rev: str) -> dict[str, tuple[str, str]]:
    """entry -> (file, rule: detail) that check reports for ``rev``."""
    run = invoke("check", "--sglang-rev", rev, "--repo", str(repo), "--series", str(series))
    assert run.code == 0, run.out
    return {e["name"]: (e["file"], e["chosen_by"]) for e in run.out["revs"][0]["entries"]}


@pytest.fixture(scope="session")
def series_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_series(tmp_path_factory.mktemp("series"))


@pytest.fixture(scope="session")
def tagless(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of the release history with every tag deleted (a fork cloned without tags)."""
    dest = tmp_path_factory.mktemp("tagless") / "sglang.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(sglang_release_repo), str(dest)], check=True)
    git = Git(git_dir=dest)
    git.run("tag", "--delete", *git.out("tag", "--list").split())
    assert git.out("tag", "--list") == ""
    return dest


@pytest.mark.parametrize("tag", RELEASES)
def test_an_entry_takes_the_file_whose_preimage_blobs_are_the_release_s(tag, sglang_release_repo, series_dir):
    entry = load_series(series_dir).entry(RS)
    want = next(v.file for v in entry.patch_files() if v.base == tag)
    assert chosen(sglang_release_repo, series_dir, tag)[RS] == (f"patches/{want}",
                                                               "exact: preimage blobs match (3/3 files)")


def test_with_no_blob_matching_the_nearest_ancestor_base_decides(sglang_release_repo, series_dir):
    file, why = chosen(sglang_release_repo, series_dir, "v0.5.21")[COMMIT]
    assert file == "patches/0010-c128-dspark-online-commit.v0.5.20.patch"
    # by content: v0.5.21 itself holds the file as v0.5.20 had it (the earlier entry's edit is what differs)
    assert why == "ancestor: nearest ancestor base v0.5.20 (0 commit(s) back)"


def test_the_nearest_ancestor_search_reads_every_candidate_in_one_git_call(sglang_release_repo, series_dir, tmp_path,
                                                                           monkeypatch):
    variant = next(v for v in load_series(series_dir).entry(COMMIT).patch_files() if v.base == "v0.5.20")
    path = variant.sources[0][0]
    repo = tmp_path / "sglang.git"  # a clone: the release history stays as it is
    subprocess.run(["git", "clone", "--quiet", "--bare", str(sglang_release_repo), str(repo)], check=True)
    git = Git(git_dir=repo).with_env(GIT_INDEX_FILE=str(tmp_path / "index"))
    tip = git.rev_parse("v0.5.21")
    git.run("read-tree", tip)
    for i in range(6):  # six upstream commits on top of v0.5.21, each on the file the v0.5.20 base has
        blob = git.out("hash-object", "-w", "--stdin", input=f"{git.blob(tip, path).decode()}# upstream {i}\n")
        git.run("update-index", "--cacheinfo", f"100644,{blob},{path}")
        tip = git.out("commit-tree", git.out("write-tree"), "-p", tip, input=f"upstream {i}")
    calls, raw = [], Git._raw
    monkeypatch.setattr(Git, "_raw", lambda self, args, *a, **k: calls.append(args[0]) or raw(self, args, *a, **k))
    assert plan.base_distances(Git(git_dir=repo), [variant], tip)[variant] == 7  # v0.5.21 changed the file too: 6 + 1
    assert calls.count("cat-file") + calls.count("ls-tree") <= 2, calls  # not one per candidate commit


def test_the_file_with_most_preimage_blobs_matching_wins(sglang_release_repo, series_dir):
    file, why = chosen(sglang_release_repo, series_dir, "v0.5.22")[BACKEND]
    assert file == "patches/0009-c128-dspark-online-backend.v0.5.21.patch"
    assert why == "most: most preimage blobs match (1/2 files)"


@pytest.mark.parametrize("tag", RELEASES)
def test_a_clone_without_tags_chooses_the_files_a_clone_with_tags_does(tag, tagless, sglang_release_repo, series_dir):
    commit = Git(git_dir=sglang_release_repo).rev_parse(tag)
    files = lambda picks: {name: file for name, (file, _why) in picks.items()}  # noqa: E731
    assert files(chosen(tagless, series_dir, commit)) == files(chosen(sglang_release_repo, series_dir, tag))


def test_without_tags_or_base_commits_the_first_file_that_applies_strictly_decides(tagless, sglang_release_repo,
                                                                                   tmp_path):
    """A series that records no bases (no sources, no commits), in a clone without tags: nothing names an ancestor."""
    series = load_series(copy_series(tmp_path / "series"))
    for e in series.entries:
        e.base_commit, e.base_sources = "", ()
        e.variants = [type(v)(v.file, v.base, v.sha256) for v in e.variants]
    series.save()
    commit = Git(git_dir=sglang_release_repo).rev_parse("v0.5.22")
    file, why = chosen(tagless, series.root, commit)[STARTUP]
    assert (file, why) == ("patches/0008-c128-dspark-online-startup.patch",
                           "strict: the first file that applies strictly")


def test_check_shows_the_file_and_rule_in_its_table(sglang_release_repo, series_dir):
    # a wide console: rich reads COLUMNS (click's terminal_width never reached it), and a narrow
    # terminal would cut the entry names
    res = invoke("check", "--sglang-rev", "v0.5.21", "--repo", str(sglang_release_repo), "--series", str(series_dir),
                 as_json=False, env={"COLUMNS": "200"})
    assert res.code == 0, res.err
    lines = res.text.splitlines()
    row = next(line for line in lines if COMMIT in line)
    below = lines[lines.index(row) + 1]
    assert "strict" in row and "v0.5.20 variant (ancestor)" in below
