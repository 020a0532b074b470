"""What upstream really does, one change per case, each an upstream commit made in the test on the
real v0.5.23 (fixed identity and dates): a reformat of the lines an entry touches, a file moved
with its importers updated, an overlay upstream adds byte for byte, a file upstream creates at an
overlay's path, a conflict resolved to upstream's side, a fix upstream makes its own way. Each is
carried (or stopped) as a maintainer would want, and the result is proven."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from c128patch.git import Git
from support import Run, copy_series, invoke, tree_of, upstream_commit

ZERO = "c128-plan-zero-rows"
ENV = "c128-dspark-online-env"
CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
PLAN = "python/sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh"
MOVED_PLAN = "python/sglang/kernels/jit/csrc/deepseek_v4/compress_plan.cuh"
ENVIRON = "python/sglang/srt/environ.py"
WHEN = {"GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "upstream@sglang.invalid",
        "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "upstream@sglang.invalid",
        "GIT_AUTHOR_DATE": "2026-06-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-06-01T00:00:00Z"}


def put(idx: Git, path: str, text: str) -> None:
    blob = idx.out("hash-object", "-w", "--stdin", input=text)
    idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")


def commit_on(git: Git, subject: str, edit, parent: str = "v0.5.23") -> str:
    return upstream_commit(git.with_env(**WHEN), parent, subject, edit)


def reformatted(git: Git) -> str:
    """clang-format realigns the two declarations zero-rows deletes; an aligner pads the env
    assignments around the one env inserts."""
    cuh = git.blob("v0.5.23", CUH).decode()
    old = ("    const uint32_t seq_len = static_cast<uint32_t>(p.seq_lens[i]);\n"
           "    const uint32_t extend_len = static_cast<uint32_t>(p.extend_lens[i]);\n")
    assert cuh.count(old) == 1
    cuh = cuh.replace(old, old.replace("seq_len =", "seq_len    ="))
    env = git.blob("v0.5.23", ENVIRON).decode()
    pads = {"    SGLANG_OPT_USE_JIT_INDEXER_METADATA = EnvBool(True)\n": "    SGLANG_OPT_USE_JIT_INDEXER_METADATA =   EnvBool(True)\n",
            "    SGLANG_OPT_USE_ONLINE_COMPRESS = EnvBool(False)\n": "    SGLANG_OPT_USE_ONLINE_COMPRESS      = EnvBool(False)\n"}
    for a, b in pads.items():
        assert env.count(a) == 1
        env = env.replace(a, b)

    def edit(idx: Git) -> None:
        put(idx, CUH, cuh)
        put(idx, ENVIRON, env)

    return commit_on(git, "style: clang-format deepseek_v4 planners, align env flags", edit)


def plan_moved(git: Git) -> str:
    """c_plan.cuh moved to compress_plan.cuh with a line added at its top; every importer updated."""
    importers = [line.split(":", 2)[1] for line in git.out("grep", "-l", "c_plan.cuh", "v0.5.23", "--",
                                                          "python").splitlines()]

    def edit(idx: Git) -> None:
        text = git.blob("v0.5.23", PLAN).decode()
        idx.run("rm", "--cached", "--quiet", PLAN)
        put(idx, MOVED_PLAN, "// Compress plans (moved from c_plan.cuh).\n" + text)
        for path in importers:
            if path != PLAN:
                put(idx, path, git.blob("v0.5.23", path).decode().replace("c_plan.cuh", "compress_plan.cuh"))

    return commit_on(git, "deepseek_v4: rename c_plan.cuh to compress_plan.cuh", edit)


@pytest.fixture(scope="session")
def remote(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    """A bare clone of the release history with one branch per upstream change."""
    dest = tmp_path_factory.mktemp("remote") / "sglang.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(sglang_release_repo), str(dest)], check=True)
    git = Git(git_dir=dest)
    for branch, make in (("reformatted", reformatted), ("plan-moved", plan_moved)):
        git.run("update-ref", f"refs/heads/{branch}", make(git))
    return git


def applied(remote: Git, root: Path, rev: str = "v0.5.23") -> tuple[Git, Path]:
    series = copy_series(root / "series")
    run = invoke("apply", "--sglang-rev", rev, "--repo", str(remote.git_dir), "--tree", str(root / "tree"),
                 "--series", str(series))
    assert run.code == 0, run.err
    return Git(worktree=root / "tree"), series


def rebase(git: Git, series: Path, *args: str) -> Run:
    return invoke("rebase", *args, "--tree", str(git.worktree), "--series", str(series))


def entry(run: Run, name: str) -> dict:
    return next(e for e in (run.out.get("report") or run.out)["entries"] if e["name"] == name)


def check_row(remote: Git, series: Path, rev: str, name: str) -> dict:
    run = invoke("check", "--sglang-rev", rev, "--repo", str(remote.git_dir), "--series", str(series))
    return next(e for e in run.out["revs"][0]["entries"] if e["name"] == name)


# -- reformatting only: carried by a whitespace-insensitive retry, marked, proven ----------------


@pytest.fixture(scope="session")
def reformat_rebased(remote: Git, tmp_path_factory: pytest.TempPathFactory) -> tuple[Git, Path, Run]:
    git, series = applied(remote, tmp_path_factory.mktemp("reformat"))
    return git, series, rebase(git, series, "--onto", remote.rev_parse("reformatted"))


def test_a_reformat_only_change_is_carried_with_no_stop(reformat_rebased):
    _, _, run = reformat_rebased
    assert run.code == 0, run.err
    for name in (ZERO, ENV):
        assert entry(run, name)["applied"] == "whitespace" and "whitespace-merged" in entry(run, name)["detail"]
    assert run.out["equivalence"]["identical"], run.out["equivalence"]["summary"]


def test_the_whitespace_merge_keeps_upstream_s_formatting_and_our_change(reformat_rebased):
    git, _, _ = reformat_rebased
    env = (git.worktree / ENVIRON).read_text()
    assert "SGLANG_OPT_USE_ONLINE_COMPRESS      = EnvBool(False)" in env
    assert "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK = EnvBool(False)" in env
    cuh = (git.worktree / CUH).read_text()
    assert "static_cast<uint32_t>(p.seq_lens[i])" not in cuh and "seq_len_i64" in cuh


def test_check_marks_the_whitespace_merge(remote, reformat_rebased):
    _, series, _ = reformat_rebased
    row = check_row(remote, series, "reformatted", ZERO)
    assert row["status"] == "whitespace" and "whitespace-merged" in row["detail"]


# -- a patched file moved upstream: the hunk follows it ----------------------------------------


@pytest.fixture(scope="session")
def moved_rebased(remote: Git, tmp_path_factory: pytest.TempPathFactory) -> tuple[Git, Path, Run]:
    git, series = applied(remote, tmp_path_factory.mktemp("moved"))
    return git, series, rebase(git, series, "--onto", remote.rev_parse("plan-moved"))


def test_a_renamed_file_is_carried_with_no_stop(moved_rebased):
    git, _, run = moved_rebased
    assert run.code == 0, run.err
    row = entry(run, ZERO)
    assert f"followed upstream's rename {PLAN} -> {MOVED_PLAN}" in row["detail"]
    assert run.out["equivalence"]["identical"], run.out["equivalence"]["summary"]
    text = (git.worktree / MOVED_PLAN).read_text()
    assert text.startswith("// Compress plans (moved") and "ext_ptr[i] <= seq_ptr[i]" in text
    assert not (git.worktree / PLAN).exists()


def test_check_says_the_entry_follows_the_rename(remote, moved_rebased):
    _, series, _ = moved_rebased
    row = check_row(remote, series, "plan-moved", ZERO)
    assert row["status"] in ("clean", "3way") and row["renamed"] == {PLAN: MOVED_PLAN}
    assert f"followed upstream's rename {PLAN} -> {MOVED_PLAN}" in row["detail"]


def test_refresh_exports_the_entry_at_the_new_path(moved_rebased):
    git, series, _ = moved_rebased
    run = invoke("refresh", "--tree", str(git.worktree), "--series", str(series))
    assert run.code == 0, run.err
    exported = [p for p in (series / "patches").glob("0001-*.patch") if f"diff --git a/{MOVED_PLAN} b/{MOVED_PLAN}"
                in p.read_text()]
    assert exported and f"a/{PLAN}" not in exported[0].read_text()
    again = invoke("refresh", "--check", "--tree", str(git.worktree), "--series", str(series))
    assert again.code == 0 and again.out["changed"] == [], again.out
    assert invoke("lint", "--series", str(series)).code == 0


@pytest.mark.parametrize("rev", ["reformatted", "plan-moved"])
def test_apply_there_gives_the_rebased_tree_as_check_predicts(remote, reformat_rebased, moved_rebased, rev, tmp_path):
    rebased, series, _ = reformat_rebased if rev == "reformatted" else moved_rebased
    run = invoke("check", "--sglang-rev", rev, "--repo", str(remote.git_dir), "--series", str(series))
    assert run.out["revs"][0]["apply"]["exit"] == 0 and run.out["revs"][0]["wheel"] is None
    git, _ = applied(remote, tmp_path, rev)
    assert tree_of(git) == tree_of(rebased)
