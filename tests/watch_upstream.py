"""Newer upstream commits for the watch tests, made in the test on top of the real v0.5.23 (the way
upstream would land them), in a bare clone of the release history that stands in for the remote.

* ``rename_in_context``: upstream renames ``candidate_request_length_bound`` in dspark_verify.py;
  the name sits two lines below record-streams' hunk, in its context: strict fails, 3-way merges;
* ``method_moved``: upstream moves ``TargetVerifyExecutor._forward_prepared_verify`` (the method
  that hunk edits) to the end of its class and renames a parameter on the way: a conflict whose
  code went elsewhere;
* ``landed_reformatted``: upstream lands record-streams (and its helper module) with other
  formatting (no space after commas, two after ``#``): the same change by content, not by text;
* ``unrelated``: upstream touches a file the series does not.

Each returns the new commit; ``set_branch`` points a branch of the stand-in at it.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from c128patch.git import Git
from c128patch.series.manifest import load_series
from support import RELEASES, copy_series, invoke, upstream_commit

VERIFY = "python/sglang/srt/speculative/dspark_components/dspark_verify.py"
RS = "c128-dspark-record-streams"
RS_HELPER = "c128-dspark-record-streams-helper"
RENAMED = ("candidate_request_length_bound", "request_length_upper_bound")
MOVED = "_forward_prepared_verify"
LANDED_SUBJECT = "[DSPARK] opt-in record_stream of the verify inputs (#32035)"


def stand_in(release_repo: Path, dest: Path) -> Git:
    """A bare clone of the release history (tags v0.5.20-v0.5.23, branch main at v0.5.23)."""
    subprocess.run(["git", "clone", "--quiet", "--bare", str(release_repo), str(dest)], check=True)
    git = Git(git_dir=dest)
    set_branch(git, "main", "v0.5.23")
    return git


def set_branch(git: Git, branch: str, commit: str) -> None:
    git.run("update-ref", f"refs/heads/{branch}", git.out("rev-parse", f"{commit}^{{commit}}"))


def _put(idx: Git, path: str, text: str) -> None:
    blob = idx.out("hash-object", "-w", "--stdin", input=text)
    idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")


def rename_in_context(git: Git, parent: str = "v0.5.23") -> str:
    old, new = RENAMED
    text = git.blob(parent, VERIFY).decode()
    assert text.count(old) >= 2
    return upstream_commit(git, parent, f"dspark_verify: rename {old} to {new}",
                           lambda idx: _put(idx, VERIFY, re.sub(rf"\b{old}\b", new, text)))


def method_moved(git: Git, parent: str = "v0.5.23") -> str:
    text = git.blob(parent, VERIFY).decode()
    lines = text.splitlines(keepends=True)
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "TargetVerifyExecutor")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == MOVED)
    body = lines[method.lineno - 1: method.end_lineno]
    rest = lines[: method.lineno - 1] + lines[method.end_lineno + 1:]  # and the blank line after it
    at = cls.end_lineno - len(body) - 1
    moved = "".join(rest[:at] + ["\n"] + body + rest[at:]).replace("        seq_lens_sum_backup,\n    ) ->",
                                                                    "        seq_lens_sum_before,\n    ) ->", 1)
    assert moved.count("seq_lens_sum_before,") == 1
    return upstream_commit(git, parent, f"dspark_verify: move {MOVED} to the end of TargetVerifyExecutor",
                           lambda idx: _put(idx, VERIFY, moved))


def reformat(line: str) -> str:
    """Whitespace only: no space after a comma, two after a comment's ``#``."""
    return re.sub(r"^(\s*)# ", r"\1#  ", line.replace(", ", ","))


def landed_reformatted(git: Git, series_root: Path, parent: str = "v0.5.23") -> str:
    """record-streams' file applied on ``parent``, its added lines reformatted; the helper module added."""
    series = load_series(series_root)
    patch = series.file_of(series.entry(RS))
    helper = series.entry(RS_HELPER)

    def land(idx: Git) -> None:
        before = {p: idx.out("ls-files", "-s", "--", p).split()[1] for p in _files(patch)}
        idx.run("apply", "--cached", str(patch))
        for path in _files(patch):
            old = git.run("cat-file", "blob", before[path]).stdout.splitlines(keepends=True)
            new = idx.run("cat-file", "blob", f":{path}").stdout.splitlines(keepends=True)
            _put(idx, path, "".join(line if line in old else reformat(line) for line in new))
        _put(idx, helper.target, (series.root / helper.source).read_text())

    return upstream_commit(git, parent, LANDED_SUBJECT, land)


def unrelated(git: Git, parent: str = "v0.5.23") -> str:
    path = "python/sglang/version.py"
    text = git.blob(parent, path).decode()
    return upstream_commit(git, parent, "version: a comment", lambda idx: _put(idx, path, text + "# unrelated\n"))


def _files(patch: Path) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", patch.read_text(), re.M)


def series_made_at(dest: Path, release_repo: Path, base: str) -> Path:
    """The product series as ``refresh --primary`` makes it on a ``base`` tree (its base moves
    there), without the files of later releases: a series made before they were out."""
    series = copy_series(dest / "series")
    run = invoke("apply", "--sglang-rev", base, "--repo", str(release_repo), "--tree", str(dest / "tree"),
                 "--series", str(series))
    assert run.code == 0, run.err
    run = invoke("refresh", "--primary", "--tree", str(dest / "tree"), "--series", str(series))
    assert run.code == 0, run.err
    later = RELEASES[RELEASES.index(base) + 1:]
    made = load_series(series)
    assert made.base == base
    for entry in made.entries:
        for v in [v for v in entry.variants if v.base in later]:
            (made.patches_dir / v.file).unlink()
        entry.variants = [v for v in entry.variants if v.base not in later]
    made.save()
    return series
