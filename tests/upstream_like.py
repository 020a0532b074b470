"""A repository that looks like upstream's own SGLang clone, built from the release history: the
same ``python/`` tree per release, but re-committed under another author and other dates (so every
commit id differs from the tool's history), with real upstream's top-level folders beside
``python/`` (``sgl-kernel/``, ``test/``, ``docs/``, a README), annotated release tags
v0.5.20..v0.5.23, and ``main`` one commit past v0.5.23 that touches files outside
``python/sglang`` only. No commit of the tool's history is in it (only trees and blobs are copied).

    build(history, dest)                        -> the bare repository (about 10 s)
    edited(git, "v0.5.22", path, text, ref)     -> a commit beside it: that release with ``text`` appended
                                                   to one file of python/sglang
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from c128patch.git import Git

RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")
AUTHOR = {"GIT_AUTHOR_NAME": "SGLang Team", "GIT_AUTHOR_EMAIL": "team@sglang.invalid",
          "GIT_COMMITTER_NAME": "SGLang Bot", "GIT_COMMITTER_EMAIL": "bot@sglang.invalid"}
# Real upstream's folders beside python/ (a few small files each).
BESIDE = {"README.md": "# SGLang\n\nA fast serving framework.\n",
          "sgl-kernel/README.md": "# sgl-kernel\n\nKernel library for SGLang.\n",
          "sgl-kernel/pyproject.toml": "[project]\nname = \"sgl-kernel\"\n",
          "test/srt/test_srt_engine.py": "def test_engine():\n    pass\n",
          "test/README.md": "Run the tests with pytest.\n",
          "docs/index.md": "# Documentation\n"}
TOP_ONLY = {"docs/index.md": "# Documentation\n\nNow with a getting-started page.\n",
            "test/srt/test_new_feature.py": "def test_new_feature():\n    pass\n"}  # main: outside python/


def _copy_trees(history: Git, dest: Git, tags: tuple[str, ...]) -> None:
    """Trees and blobs of ``tags`` (no commit) into ``dest``, as one pack."""
    trees = [history.out("rev-parse", f"{t}^{{tree}}") for t in tags]
    objects = history.run("rev-list", "--objects", *trees).stdout
    pack = history.run("pack-objects", "--stdout", "-q", input=objects.encode(), binary=True).stdout
    dest.run("index-pack", "--stdin", input=pack, binary=True)


def _with_files(git: Git, index: Path, tree: str, files: dict[str, str], append: dict[str, str] | None = None) -> str:
    """``tree`` with ``files`` written (and ``append`` added to the end of existing files)."""
    idx = git.with_env(GIT_INDEX_FILE=str(index))
    idx.run("read-tree", tree)
    for path, text in {**files, **{p: git.blob(tree, p).decode() + t for p, t in (append or {}).items()}}.items():
        blob = git.out("hash-object", "-w", "--stdin", input=text)
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
    return idx.out("write-tree")


def edited(git: Git, tag: str, path: str, text: str, ref: str) -> str:
    """A commit whose tree is ``tag``'s with ``text`` appended to ``path``, at ``ref``; returns it."""
    index = Path(str(git.git_dir)) / "c128-edit.index"
    tree = _with_files(git, index, git.out("rev-parse", f"{tag}^{{tree}}"), {}, {path: text})
    index.unlink(missing_ok=True)
    env = {**AUTHOR, "GIT_AUTHOR_DATE": "1780000000 +0000", "GIT_COMMITTER_DATE": "1780000000 +0000"}
    commit = git.with_env(**env).out("commit-tree", tree, "-p", git.rev_parse(tag) or "", "-m",
                                     f"local change to {path}")
    git.run("update-ref", ref, commit)
    return commit


def build(history: Path, dest: Path) -> Path:
    """The upstream-like bare repository at ``dest`` (see the module docstring)."""
    src = Git(git_dir=history)
    subprocess.run(["git", "init", "--quiet", "--bare", str(dest)], check=True)
    git = Git(git_dir=dest)
    _copy_trees(src, git, RELEASES)
    parent: list[str] = []
    index = dest / "c128-build.index"
    for n, tag in enumerate(RELEASES):
        tree = _with_files(git, index, src.out("rev-parse", f"{tag}^{{tree}}"), BESIDE)
        date = f"{1767225600 + 86400 * 30 * n} +0800"  # 2026-01-01 and a month apart: none of the history's dates
        env = {**AUTHOR, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        commit = git.with_env(**env).out("commit-tree", tree, *parent, "-m", f"Release {tag}")
        git.with_env(**env).run("tag", "-a", tag, "-m", f"SGLang {tag}", commit)
        parent = ["-p", commit]
    top = _with_files(git, index, git.out("rev-parse", "v0.5.23^{tree}"), TOP_ONLY)
    env = {**AUTHOR, "GIT_AUTHOR_DATE": "1780000000 +0000", "GIT_COMMITTER_DATE": "1780000000 +0000"}
    main = git.with_env(**env).out("commit-tree", top, *parent, "-m", "docs, tests: a getting-started page")
    git.run("update-ref", "refs/heads/main", main)
    git.run("symbolic-ref", "HEAD", "refs/heads/main")
    index.unlink(missing_ok=True)
    return dest
