"""apply commits an overlay and the provenance record by plumbing (``Apply._commit_file``: update-index of the one
file, write-tree, commit-tree, update-ref) where it ran ``git add --force`` and ``git commit -m`` (each refreshed the
whole index); the commits must be the very ones those made, ignore files notwithstanding. The proof takes the
fresh replay's tree for the branch's less its provenance file where one diff-tree shows just that file added
(``equivalence.tree_without_provenance``); it must give what the read-tree/update-index/write-tree gives."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from c128patch.git import BOT_EMAIL, BOT_NAME, Git, stripspace
from c128patch.ops.equivalence import tree_without_provenance
from c128patch.series.provenance import PROVENANCE_PATH
from support import invoke, make_test_series, small_clone

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
OVERLAY = "python/sglang/c128_test_overlay.py"
MESSY = ["a\n", "a", "\n\n  \nsubject  \t\n\n\n\nbody\r\n  \n", "x\n\n\n", "#kept\n\n# also\n", "s\v\n\fb \n",
         "  lead\n\ttab\t\n", "\n", ""]


def git_in(repo: Path, *args: str, input: str | None = None) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_NAME": BOT_NAME, "GIT_AUTHOR_EMAIL": BOT_EMAIL, "GIT_COMMITTER_NAME": BOT_NAME,
           "GIT_COMMITTER_EMAIL": BOT_EMAIL, "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+01:00",
           "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+01:00"}
    return subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True, text=True, check=True,
                          env=env).stdout


@pytest.mark.parametrize("message", MESSY)
def test_stripspace_is_what_git_commit_m_stores(tmp_path: Path, message: str):
    assert stripspace(message) == git_in(tmp_path, "stripspace", input=message)
    if not stripspace(message):
        return  # (git commit refuses an empty message)
    git_in(tmp_path, "init", "-q")
    git_in(tmp_path, "commit", "-q", "--allow-empty", "-m", message)
    assert git_in(tmp_path, "log", "-1", "--format=%B").removesuffix("\n") == stripspace(message)


def test_an_overlay_and_provenance_commit_are_the_ones_add_force_and_commit_m_make(sglang_release_repo: Path,
                                                                                   tmp_path: Path):
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n",
                                     "    const uint32_t prefix_len = seq_len - extend_len;  // test\n")})
    manifest = series / "patches" / "series.toml"  # a why git's cleanup changes: trailing spaces
    manifest.write_text(manifest.read_text().replace(
        'target = "python/sglang/c128_test_overlay.py"\nwhy = "test"',
        'target = "python/sglang/c128_test_overlay.py"\nwhy = "two words   "'))
    from c128patch.ops.lint import update_hashes
    from c128patch.series.manifest import load_series

    update_hashes(load_series(series))
    tree = small_clone(sglang_release_repo, tmp_path / "sglang").worktree
    (tree / ".git" / "info" / "exclude").write_text("*.py\n*.json\n")  # ignored: committed all the same
    res = invoke("apply", "--sglang-rev", "v0.5.22", "--repo", tree, "--series", series)
    assert res.code == 0, res.err
    git = Git(worktree=tree)
    assert git.status_porcelain() == []
    for rev, path in (("HEAD~1", OVERLAY), ("HEAD", PROVENANCE_PATH)):  # made again as apply made them before
        made = git.out("rev-parse", rev)
        parent, date = git.out("rev-parse", f"{rev}~1"), git.out("log", "-1", "--format=%cI", made)
        message = git.run("log", "-1", "--format=%B", made).stdout
        again = tmp_path / f"again-{path.rsplit('/', 1)[-1]}"
        git_in(tree, "worktree", "add", "-q", "--detach", str(again), parent)
        (again / path).write_bytes(git.blob(made, path) or b"")
        git_in(again, "add", "--force", "--", path)
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        subprocess.run(["git", "-C", str(again), "-c", "commit.cleanup=default", "commit", "-q", "--no-verify", "-m",
                        message], check=True, env={"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
                                                   "PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": BOT_NAME,
                                                   "GIT_AUTHOR_EMAIL": BOT_EMAIL, "GIT_COMMITTER_NAME": BOT_NAME,
                                                   "GIT_COMMITTER_EMAIL": BOT_EMAIL, **env})
        assert git_in(again, "rev-parse", "HEAD").strip() == made, path
    body = git.run("log", "-1", "--format=%B", "HEAD~1").stdout
    assert "\n\ntwo words\n\n" in body  # cleaned as git commit -m cleans it: no trailing spaces


def test_the_proofs_tree_less_provenance_is_the_slow_paths_in_every_case(tmp_path: Path):
    repo = tmp_path / "r"
    git_in(tmp_path, "init", "-q", str(repo))
    (repo / "a.txt").write_text("a\n")
    git_in(repo, "add", "a.txt")
    git_in(repo, "commit", "-q", "-m", "base")
    like = git_in(repo, "rev-parse", "HEAD^{tree}").strip()

    def commit(files: dict[str, str]) -> str:
        git_in(repo, "read-tree", like)
        for path, text in files.items():
            blob = git_in(repo, "hash-object", "-w", "--stdin", input=text).strip()
            git_in(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
        return git_in(repo, "commit-tree", git_in(repo, "write-tree").strip(), "-m", "x").strip()

    git = Git(git_dir=repo / ".git")
    scratch = tmp_path / "index"  # (the work tree of the index: a folder beside the repository, as procs.scratch's)
    scratch.mkdir()
    with_record = commit({PROVENANCE_PATH: "{}"})
    cases = {"provenance added": with_record, "and another file": commit({PROVENANCE_PATH: "{}", "b.txt": "b\n"}),
             "nothing added": commit({}), "a file changed": commit({PROVENANCE_PATH: "{}", "a.txt": "z\n"})}
    like_with = git_in(repo, "rev-parse", f"{with_record}^{{tree}}").strip()  # a fresh tree holding the file
    modified = commit({PROVENANCE_PATH: "{\"x\": 1}"})
    for name, head in cases.items():
        slow = tree_without_provenance(git, head, scratch / f"{name}.index")
        assert tree_without_provenance(git, head, scratch / f"{name}-fast.index", like=like) == slow, name
    assert tree_without_provenance(git, cases["provenance added"], scratch / "f.index", like=like) == like
    for head in (with_record, modified):  # ``like`` holds the file: head's tree less it is never ``like``
        slow = tree_without_provenance(git, head, scratch / "s.index")
        assert tree_without_provenance(git, head, scratch / "w.index", like=like_with) == slow != like_with
