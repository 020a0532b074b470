"""Content, not ids: on a clone that looks like upstream's own repository (tests/upstream_like.py:
the release trees re-committed with other ids, dates and author, sgl-kernel/, test/, docs/ beside
python/, main one commit past v0.5.23 outside python/sglang), apply, check, lint, refresh --check,
rebase, watch, matrix and the apply/wheel notes all agree with the tool's own history; a commit
whose python/sglang differs in one keyed file is unverified and that file is named."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import upstream_like
from c128patch.evidence.keys import key_for
from c128patch.evidence.matrix import KINDS, release_note, verification_note
from c128patch.fit.watch import EXIT
from c128patch.git import Git
from c128patch.ops.check import support_note
from c128patch.series.manifest import load_series
from support import RELEASES, REPO_ROOT, copy_series, invoke, tier_unchecked

PROVENANCE = "python/sglang/c128patch_provenance.json"
EDITED = "python/sglang/kernels/registry.py"  # in a keyed folder of the kernel tier, patched by no entry


@pytest.fixture(scope="session")
def like(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    repo = upstream_like.build(sglang_release_repo, tmp_path_factory.mktemp("upstream-like") / "sglang.git")
    git = Git(git_dir=repo)
    upstream_like.edited(git, "v0.5.22", EDITED, "# a local change\n", "refs/heads/edited")
    return git


@pytest.fixture(scope="session")
def history(sglang_release_repo: Path) -> Git:
    return Git(git_dir=sglang_release_repo)


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the product series with its committed evidence (ci/gpu/results)."""
    root = copy_series(tmp_path_factory.mktemp("series"))
    shutil.copytree(REPO_ROOT / "ci" / "gpu" / "results", root / "ci" / "gpu" / "results")
    return root


def repo(git: Git) -> str:
    return str(git.git_dir)


def python_tree(git: Git, rev: str) -> dict[str, str]:
    """path -> blob of python/ at ``rev``, the provenance record left out (it names commit ids)."""
    out = git.out("ls-tree", "-r", rev, "--", "python").splitlines()
    return {line.split("\t", 1)[1]: line.split()[2] for line in out if not line.endswith(PROVENANCE)}


def test_the_clone_has_other_ids_and_folders_and_the_same_python_sources(like: Git, history: Git):
    for tag in RELEASES:
        assert like.rev_parse(tag) != history.rev_parse(tag)
        assert like.out("rev-parse", f"{tag}:python") == history.out("rev-parse", f"{tag}:python")
        assert like.out("rev-parse", f"{tag}^{{tree}}") != history.out("rev-parse", f"{tag}^{{tree}}")
        assert like.out("cat-file", "-t", tag) == "tag"  # annotated, as upstream's
    assert like.run("cat-file", "-e", history.rev_parse("v0.5.23") or "", check=False).returncode != 0
    top = like.out("ls-tree", "--name-only", "main").split()
    assert {"python", "sgl-kernel", "test", "docs", "README.md"} <= set(top)
    changed = like.out("diff", "--name-only", "v0.5.23", "main").split()
    assert changed and not any(p.startswith("python/") for p in changed)


@pytest.mark.parametrize("rev", [*RELEASES, "main"])
def test_evidence_keys_match_the_tool_s_history(like: Git, history: Git, rev: str):
    series = load_series(REPO_ROOT)
    ours = key_for(series, history, history.rev_parse("v0.5.23" if rev == "main" else rev) or "")
    assert key_for(series, like, like.rev_parse(rev) or "") == ours


def test_check_chooses_the_files_the_tool_s_history_does(like: Git, history: Git, series: Path):
    def files(git: Git) -> dict:
        run = invoke("check", *[a for t in RELEASES for a in ("--sglang-rev", t)], "--repo", repo(git),
                     "--series", str(series))
        assert run.code == 0, run.err
        return {r["rev"]: {e["name"]: (e["file"], e["status"]) for e in r["entries"]} for r in run.out["revs"]}

    assert files(like) == files(history)


def test_lint_against_the_clone_has_no_finding(like: Git, series: Path):
    res = invoke("lint", "--repo", repo(like), "--series", str(series))
    assert res.code == 0 and res.out["findings"] == [], res.out["findings"]


@pytest.fixture(scope="module")
def applied_023(like: Git, series: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tree = tmp_path_factory.mktemp("apply-023") / "sglang"
    run = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", repo(like), "--tree", str(tree), "--series",
                 str(series), as_json=False)
    return tree, run


def test_apply_proves_the_tree_and_prints_the_note_the_tool_s_history_gets(applied_023, history: Git, like: Git,
                                                                         series: Path):
    tree, run = applied_023
    assert run.code == 0, run.err
    assert "identical to a fresh apply" in run.text and "differ" not in run.text
    expected = verification_note(load_series(series), history, history.rev_parse("v0.5.23") or "", "v0.5.23")
    assert (expected in run.text) if expected else ("note:" not in run.text)  # the note the tool's history gets
    record = json.loads((tree / PROVENANCE).read_text())
    assert record["upstream"]["commit"] == like.rev_parse("v0.5.23") != history.rev_parse("v0.5.23")


def test_refresh_check_is_a_fixed_point_after_a_fresh_apply(applied_023, series: Path):
    tree, _ = applied_023
    res = invoke("refresh", "--check", "--tree", str(tree), "--series", str(series))
    assert res.code == 0, res.err or res.out


def test_rebase_from_v0_5_22_gives_the_tree_a_fresh_apply_gives_in_the_tool_s_history(
        like: Git, history: Git, series: Path, tmp_path: Path):
    tree = tmp_path / "sglang"
    run = invoke("apply", "--sglang-rev", "v0.5.22", "--repo", repo(like), "--tree", str(tree), "--series", str(series))
    assert run.code == 0, run.err
    check = invoke("refresh", "--check", "--tree", str(tree), "--series", str(series))
    assert check.code == 0, check.err or check.out  # a variant base's fixed point too
    rebased = invoke("rebase", "--onto", "v0.5.23", "--repo", repo(like), "--tree", str(tree), "--series", str(series))
    assert rebased.code == 0, rebased.err
    ours = tmp_path / "ours"
    fresh = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", repo(history), "--tree", str(ours), "--series",
                   str(series))
    assert fresh.code == 0, fresh.err
    assert python_tree(Git(worktree=tree), "HEAD") == python_tree(Git(worktree=ours), "HEAD")


def test_watch_onto_its_v0_5_23_is_clean_where_every_module_imported(like: Git, series: Path, tmp_path: Path):
    pytest.importorskip("torch", reason="watch is clean only where its behavioural tier can import: needs torch")
    res = invoke("watch", "--onto", "v0.5.23", "--repo", repo(like), "--out", str(tmp_path / "out"),
                 "--series", str(series))
    assert [u for u in res.out["unchecked"] if not u.startswith("C++: ")] == tier_unchecked(res.out["behaviour"])
    outcome = "unchecked" if res.out["unchecked"] else "clean"
    assert res.code == EXIT[outcome] and res.out["outcome"] == outcome, (res.err, res.out.get("headline"))


def test_matrix_of_the_clone_shows_what_the_tool_s_history_shows(like: Git, series: Path):
    res = invoke("matrix", "--repo", repo(like), "--series", str(series))
    ours = invoke("matrix", "--series", str(series))
    assert res.code == 0 and ours.code == 0, res.err or ours.err
    rows = {r["rev"]: r for r in res.out["releases"]}
    expected = {r["rev"]: r for r in ours.out["releases"]}
    assert list(rows) == list(RELEASES) == list(expected)
    assert all(r["differs"] is None for r in rows.values())
    assert {k: (r["fully_verified"], r["missing"]) for k, r in rows.items()} == \
        {k: (r["fully_verified"], r["missing"]) for k, r in expected.items()}


@pytest.mark.parametrize("rev", [*RELEASES, "main"])
def test_the_apply_and_wheel_notes_agree_with_the_tool_s_history(like: Git, history: Git, rev: str):
    series = load_series(REPO_ROOT)
    tag = "v0.5.23" if rev == "main" else rev
    ours = verification_note(series, history, history.rev_parse(tag) or "", tag)
    note = verification_note(series, like, like.rev_parse(rev) or "", rev)
    assert note == (ours.replace(f"note: {tag} ", f"note: {rev} ", 1) if ours else None)
    assert release_note(series, tag.removeprefix("v")) == (ours.replace(f"note: {tag} ", f"note: sglang {tag[1:]} ", 1)
                                                           if ours else None)


def test_a_commit_whose_sources_differ_in_one_file_is_unverified_and_names_it(like: Git, series: Path):
    res = invoke("matrix", "--repo", repo(like), "--sglang-rev", "edited", "--sglang-rev", "v0.5.22",
                 "--series", str(series))
    assert res.code == 0, res.err
    edited, release = res.out["releases"]
    assert release["differs"] is None and not any("differ" in m for m in release["missing"])
    assert not edited["fully_verified"] and edited["differs"] == {"rev": "v0.5.22", "files": [EDITED]}
    assert f"1 file differs from v0.5.22's evidenced sources: {EDITED}" in edited["missing"]
    note = verification_note(load_series(series), like, like.rev_parse("edited") or "", "edited")
    assert note == (f"note: edited + this series is not fully verified: 1 file differs from v0.5.22's evidenced "
                    f"sources: {EDITED}; see `c128patch matrix`")
    text = invoke("matrix", "--repo", repo(like), "--sglang-rev", "edited", "--series", str(series), as_json=False)
    assert max(len(line) for line in text.text.splitlines()) <= 100  # wrapped to 100 columns, words whole
    assert f"edited: not fully verified: 1 file differs from v0.5.22's evidenced sources: {EDITED}" in " ".join(
        text.text.split())


def test_a_clone_without_the_release_tags_is_placed_by_content_not_called_older(sglang_release_repo: Path,
                                                                                packed_release_repo: Path,
                                                                                tmp_path: Path):
    """Issue 37's clone of one's own: the releases re-committed with other ids and no tags. Its 0.5.22 holds the
    files the series' variants were made on: no note sending the user to v0.5.20 or to new variants of our series
    (apply printed one); a commit holding none of them still gets it."""
    subprocess.run(["git", "init", "--quiet", "--bare", str(tmp_path / "mine.git")], check=True)
    git = Git(git_dir=tmp_path / "mine.git")
    git.run("fetch", "--quiet", "--no-tags", str(packed_release_repo), "refs/tags/*:refs/theirs/*")  # objects only
    mine = git.with_env(GIT_AUTHOR_NAME="me", GIT_AUTHOR_EMAIL="me@x.invalid", GIT_COMMITTER_NAME="me",
                        GIT_COMMITTER_EMAIL="me@x.invalid")
    ids, parent = {}, []
    for tag in RELEASES:
        tree = Git(git_dir=sglang_release_repo).out("rev-parse", f"{tag}^{{tree}}")
        ids[tag] = mine.out("commit-tree", tree, *parent, "-m", f"my {tag}")
        parent = ["-p", ids[tag]]
    assert not git.out("tag") and git.rev_parse("v0.5.20") is None
    series = load_series(REPO_ROOT)
    assert support_note(series, git, "mine", ids["v0.5.22"]) == ""
    empty = mine.out("commit-tree", git.out("hash-object", "-t", "tree", "-w", "--stdin", input=""), "-m", "none")
    assert support_note(series, git, "none", empty).startswith("none is older than (or not descended from) every")


def test_a_root_commit_with_a_release_s_files_names_each_state_as_apply_does(packed_release_repo: Path,
                                                                             tmp_path: Path, series: Path):
    """A clone whose one commit holds v0.5.22's files and no history: where the series picks other variant files
    there than on the release, the same evidence reads the same in `matrix` as in apply's note (it read
    "unverified" in one and "stale" in the other)."""
    subprocess.run(["git", "init", "--quiet", "--bare", str(tmp_path / "mine.git")], check=True)
    git = Git(git_dir=tmp_path / "mine.git")
    git.run("fetch", "--quiet", "--no-tags", str(packed_release_repo), "refs/tags/v0.5.22:refs/theirs/v0.5.22")
    tree = git.out("rev-parse", "refs/theirs/v0.5.22^{tree}")
    commit = git.with_env(GIT_AUTHOR_NAME="me", GIT_AUTHOR_EMAIL="me@x.invalid", GIT_COMMITTER_NAME="me",
                          GIT_COMMITTER_EMAIL="me@x.invalid").out("commit-tree", tree, "-m", "my 0.5.22")
    git.run("update-ref", "refs/heads/mine", commit)
    res = invoke("matrix", "--repo", str(git.git_dir), "--sglang-rev", "mine", "--series", str(series))
    assert res.code == 0, res.err
    missing = res.out["releases"][0]["missing"]
    note = verification_note(load_series(series), git, commit, "mine")
    states = {m.rsplit(" ", 1)[1] for m in missing if m.split(" ", 1)[0] in KINDS}
    assert states <= {"verified", "failed", "stale"}  # the release's own results, under another key: stale
    assert (note is None) == (not missing)
    if note is not None:
        assert all(m in note for m in missing), (note, missing)
