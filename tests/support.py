"""Helpers for tests: real-upstream test series, tree snapshots, unpacked release sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from c128patch.evidence import staging
from c128patch.git import Git
from c128patch.series.manifest import Series, load_series
from c128patch.series.patchfile import read_patch

REPO_ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")


def unpack_release(repo: Path, tag: str, dest: Path, paths: list[str]) -> Path:
    """Extract ``paths`` of release ``tag`` as an unpacked wheel would hold them (``dest/sglang/...``)."""
    dest.mkdir(parents=True, exist_ok=True)
    present = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "--name-only", tag, "--", *paths],
                             check=True, capture_output=True, text=True).stdout.split()
    archive = subprocess.run(["git", "--git-dir", str(repo), "archive", "--format=tar", tag, *present],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(dest)], input=archive, check=True)
    return dest


def snapshot(tree: Path) -> dict:
    """Everything a refused command must leave untouched: refs, HEAD, index and worktree state."""
    git = Git(worktree=tree)
    return {
        "refs": git.out("for-each-ref", "--format=%(refname) %(objectname)"),
        "head": git.out("symbolic-ref", "-q", "HEAD", check=False) or git.out("rev-parse", "HEAD"),
        "status": git.out("status", "--porcelain=v1", "--untracked-files=all"),
        "diff": git.out("diff", "HEAD"),
    }


def make_test_series(dest: Path, upstream: Path, edits: dict[str, tuple[str, str]], overlay: bool = True) -> Path:
    """A series with one real patch made against real upstream v0.5.23 (``edits``: path -> (old, new))
    and, optionally, one overlay file. For mechanics tests; the product series lives in patches/.
    Made with git plumbing in a shared bare clone: nothing is checked out."""
    work = dest / "work.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(upstream), str(work)], check=True)
    git = Git(git_dir=work).with_env(GIT_INDEX_FILE=str(dest / "index"))
    git.run("read-tree", "v0.5.23")
    for path, (old, new) in edits.items():
        text = git.blob("v0.5.23", path).decode()
        assert old in text, f"{old!r} not in {path}"
        sha = git.out("hash-object", "-w", "--stdin", input=text.replace(old, new, 1))
        git.run("update-index", "--cacheinfo", f"100644,{sha},{path}")
    tree = git.out("write-tree")
    commit = git.out("commit-tree", tree, "-p", "v0.5.23", "-m",
                     "c128: test change\n\nWhy: mechanics test.\n\nC128patch-Gate: none (test)")
    (dest / "patches").mkdir(parents=True)
    patch = git.run("format-patch", "-1", "--full-index", "--zero-commit", "--no-signature", "--stdout", commit).stdout
    (dest / "patches" / "0001-test.patch").write_text(patch)
    entries = [
        '[[entries]]\nname = "test-patch"\nkind = "patch"\nfile = "0001-test.patch"\n'
        'why = "test"\nbase = "v0.5.23"\n'
    ]
    if overlay:
        (dest / "overlay" / "sglang").mkdir(parents=True)
        (dest / "overlay" / "sglang" / "c128_test_overlay.py").write_text("VALUE = 1\n")
        entries.append(
            '[[entries]]\nname = "test-overlay"\nkind = "overlay"\nsource = "overlay/sglang/c128_test_overlay.py"\n'
            'target = "python/sglang/c128_test_overlay.py"\nwhy = "test"\nbase = "v0.5.23"\n'
        )
    (dest / "patches" / "series.toml").write_text(
        '[series]\nname = "test"\nversion = "1"\nbase = "v0.5.23"\n\n' + "\n".join(entries)
    )
    from c128patch.ops.lint import update_hashes

    update_hashes(load_series(dest))
    shutil.rmtree(work)
    (dest / "index").unlink()
    return dest


# What the kernel tier needs of a tree (tests/gpu/tree_subset.py picks its files from these).
KERNEL_TIER_PATHS = list(staging.KERNEL_TIER_PATHS)


def series_paths(series: Series) -> list[str]:
    """Every upstream path the series writes: the files of each patch (all variants) and the overlay targets."""
    paths: set[str] = set()
    for entry in series.entries:
        if entry.is_patch:
            for variant in entry.patch_files():
                paths.update(read_patch(series.file_of(entry, variant)).files)
        else:
            paths.add(entry.target)
    return sorted(paths)


def release_tree(repo: Path, tag: str, dest: Path, paths: list[str] = KERNEL_TIER_PATHS) -> Path:
    """``paths`` (default: the kernel tier) of upstream release ``tag``; ``dest`` holds ``sglang/``."""
    return unpack_release(repo, tag, dest, paths)


def patched_tree(series_root: Path, repo: Path, tag: str, dest: Path, paths: list[str] = KERNEL_TIER_PATHS) -> Path:
    """``paths`` (default: the kernel tier) of release ``tag`` with the whole series applied, as
    ``c128patch check`` replays it (each entry's selected file, in manifest order); ``dest`` holds ``sglang/``."""
    from c128patch.ops.check import index_git, replay_in_index

    git = Git(git_dir=repo)
    dest.mkdir(parents=True, exist_ok=True)
    index_file = dest / ".index"
    result, _ = replay_in_index(load_series(series_root), git, tag, git.rev_parse(tag), index_file)
    assert result.ok, result.to_json()
    idx = index_git(git, index_file)
    files = idx.out("ls-files", "--", *paths)
    out = dest / ".out"
    idx.run("checkout-index", f"--prefix={out}/", "--stdin", input=files + "\n")
    shutil.move(str(out / "python" / "sglang"), str(dest / "sglang"))
    shutil.rmtree(out)
    index_file.unlink()
    return dest
