"""Bad input: a one-line error, exit 2, and nothing changed (files, refs, HEAD)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from c128patch.git import Git
from support import error_line, invoke, make_test_series, printed_command, refused, run_printed

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
EDIT = {CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n",
              "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch test\n")}


@pytest.fixture
def series(tmp_path: Path, sglang_release_repo: Path) -> Path:
    return make_test_series(tmp_path / "series", sglang_release_repo, EDIT)


def test_unknown_rev_is_named(sparse_clone: Path, series: Path):
    refused(["apply", "--sglang-rev", "v9.9.9-nope", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "unknown rev 'v9.9.9-nope'")
    refused(["check", "--sglang-rev", "deadbeef", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "unknown rev 'deadbeef'")


@pytest.mark.parametrize("rev", ["^v0.5.23", "^HEAD"])
def test_a_negative_rev_is_an_unknown_rev_not_a_git_failure(sparse_clone: Path, series: Path, rev: str):
    """Helper 185: `check --sglang-rev ^v0.5.23 --repo R`: git's rev-parse answers "^<sha>" (a negative rev, exit 0),
    taken as the commit: a raw "git ls-tree -r ^1310711... failed: fatal: Not a valid object name" per entry and
    exit 1 ("NOT all apply"). ``Git.rev_parse`` answers a commit id or none: one line, exit 2."""
    refused(["check", "--sglang-rev", rev, "--repo", str(sparse_clone), "--series", str(series)], sparse_clone,
            f"unknown rev '{rev}'")
    refused(["apply", "--sglang-rev", rev, "--repo", str(sparse_clone), "--series", str(series)], sparse_clone,
            f"unknown rev '{rev}'")


def test_a_release_version_without_its_v_is_named_with_its_tag(sparse_clone: Path, series: Path):
    refused(["apply", "--sglang-rev", "0.5.23", "--series", str(series)], None,
            "unknown rev '0.5.23' in the sglang release wheels (the release source knows v0.5.")
    refused(["apply", "--sglang-rev", "0.5.23", "--series", str(series)], None, "; did you mean 'v0.5.23'?")
    refused(["check", "--sglang-rev", "0.5.22", "--repo", str(sparse_clone), "--series", str(series)], sparse_clone,
            "; did you mean 'v0.5.22'?")


def test_non_release_rev_without_repo(series: Path):
    refused(["check", "--sglang-rev", "main", "--series", str(series)], None, "unknown rev 'main'")


def test_missing_repo(tmp_path: Path, series: Path):
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(tmp_path / "nope"), "--series", str(series)],
            None, "missing repo")


def test_not_a_git_repo(tmp_path: Path, series: Path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "file.txt").write_text("mine\n")
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(plain), "--series", str(series)], None,
            "not a git repository")
    assert (plain / "file.txt").read_text() == "mine\n" and sorted(p.name for p in plain.iterdir()) == ["file.txt"]


@pytest.mark.parametrize("kind", ["modified", "staged", "untracked"])
def test_dirty_tree(sparse_clone: Path, series: Path, kind: str):
    target = sparse_clone / "python/sglang/srt/environ.py"
    if kind == "untracked":
        (sparse_clone / "notes.txt").write_text("my notes\n")
    else:
        target.write_text(target.read_text() + "# my work\n")
        if kind == "staged":
            subprocess.run(["git", "-C", str(sparse_clone), "add", "-A"], check=True)
    refused(["apply", "--sglang-rev", "v0.5.22", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "uncommitted changes")


def test_corrupt_patch_file(sparse_clone: Path, series: Path):
    patch = series / "patches" / "0001-test.patch"
    text = patch.read_text()
    patch.write_text(text[: text.index("@@") + 40])  # truncated mid-hunk
    from c128patch.ops.lint import update_hashes
    from c128patch.series.manifest import load_series

    update_hashes(load_series(series))  # the manifest agrees: only the patch itself is broken
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "corrupt patch 0001-test.patch")
    refused(["check", "--sglang-rev", "v0.5.23", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "corrupt patch")


def test_patch_hash_mismatch(sparse_clone: Path, series: Path):
    patch = series / "patches" / "0001-test.patch"
    patch.write_text(patch.read_text().replace("c128patch test", "c128patch TEST"))
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "sha256 does not match")


@pytest.mark.parametrize("bad", ["../outside.txt", "/etc/passwd", "python/../../x"])
def test_unsafe_path_in_patch(sparse_clone: Path, series: Path, bad: str):
    patch = series / "patches" / "0001-test.patch"
    text = patch.read_text().replace(f"a/{CUH}", f"a/{bad}").replace(f"b/{CUH}", f"b/{bad}")
    patch.write_text(text)
    from c128patch.ops.lint import update_hashes
    from c128patch.series.manifest import load_series

    update_hashes(load_series(series))
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "unsafe path")


@pytest.mark.parametrize("bad", ["../outside.py", "/tmp/abs.py"])
def test_unsafe_overlay_target(sparse_clone: Path, series: Path, bad: str):
    manifest = series / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('target = "python/sglang/c128_test_overlay.py"',
                                                     f'target = "{bad}"'))
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "unsafe path")


def test_overlay_through_upstream_symlink(sparse_clone: Path, series: Path):
    link = sparse_clone / "python" / "sglang" / "linked"
    link.symlink_to("../../..")
    subprocess.run(["git", "-C", str(sparse_clone), "add", "--sparse", "python/sglang/linked"], check=True)
    subprocess.run(["git", "-C", str(sparse_clone), "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit",
                    "-qm", "a symlink"], check=True)
    manifest = series / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('target = "python/sglang/c128_test_overlay.py"',
                                                     'target = "python/sglang/linked/escaped.py"'))
    refused(["apply", "--sglang-rev", "HEAD", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "symlink")


def test_overlay_source_through_symlink(sparse_clone: Path, series: Path, tmp_path: Path):
    real = tmp_path / "elsewhere"
    shutil.move(str(series / "overlay" / "sglang"), real)
    (series / "overlay" / "sglang").symlink_to(real)
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "symlink")


def test_overlay_collides_with_upstream_file(sparse_clone: Path, series: Path):
    manifest = series / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('target = "python/sglang/c128_test_overlay.py"',
                                                     'target = "python/sglang/srt/environ.py"'))
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "collides with upstream")


def test_existing_branch_is_not_clobbered(sparse_clone: Path, series: Path):
    subprocess.run(["git", "-C", str(sparse_clone), "branch", "c128/v0.5.22", "v0.5.20"], check=True)
    refused(["apply", "--sglang-rev", "v0.5.22", "--repo", str(sparse_clone), "--series", str(series)],
            sparse_clone, "already exists")


def test_missing_git(tmp_path: Path, series: Path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bindir)}
    proc = subprocess.run([sys.executable, "-m", "c128patch", "check", "--sglang-rev", "v0.5.23",
                           "--series", str(series)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert [error_line(proc.stderr)] == [
        "c128patch: error: git not found on PATH; install git (>= 2.30) and retry"]


def test_bad_manifest(tmp_path: Path, series: Path):
    manifest = series / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('kind = "overlay"', 'kind = "sideload"'))
    refused(["check", "--sglang-rev", "v0.5.23", "--series", str(series)], None, "kind must be one of")
    manifest.write_text("[series\nname=")
    refused(["check", "--sglang-rev", "v0.5.23", "--series", str(series)], None, "not valid TOML")


@pytest.mark.parametrize("existed", [False, True], ids=["new-folder", "empty-folder"])
def test_refused_apply_into_a_new_tree_clones_nothing(tmp_path: Path, sglang_release_repo: Path, series: Path,
                                                      existed: bool):
    """The series is checked against upstream before any clone is made: a refusal leaves no half-made tree."""
    patch = series / "patches" / "0001-test.patch"
    patch.write_text(patch.read_text().replace("c128patch test", "c128patch TEST"))
    tree = tmp_path / "fresh"
    if existed:
        tree.mkdir()
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", str(sglang_release_repo), "--tree", str(tree),
             "--series", str(series)], contains="sha256 does not match")
    assert tree.is_dir() == existed and (not existed or not any(tree.iterdir()))


def test_a_rev_no_branch_name_can_hold_gets_a_branch_named_after_its_commit(upstream_clone: Path, series: Path):
    """`--sglang-rev main~1` (any commit-ish works with --repo, --help says) was refused as "invalid branch name:
    'c128/main~1'", with no word of --branch."""
    res = invoke("apply", "--sglang-rev", "main~1", "--repo", str(upstream_clone), "--series", str(series))
    commit = Git(worktree=upstream_clone).rev_parse("main~1")
    assert res.code == 0, res.err
    assert Git(worktree=upstream_clone).current_branch() == f"c128/{commit[:12]}"


def test_a_git_failure_is_said_by_gits_reason_not_its_last_line():
    """A checkout in the way of untracked files ended "git checkout --quiet --detach failed: Aborting"."""
    from c128patch.git import git_reason

    said = ("error: The following untracked working tree files would be overwritten by checkout:\n\tpython/a.py\n"
            "\tpython/b.py\nPlease move or remove them before you switch branches.\nAborting\n")
    assert git_reason(said) == ("error: The following untracked working tree files would be overwritten by checkout: "
                                "python/a.py (and 1 more)")
    assert git_reason("some line\nhint: try this\n") == "some line" and git_reason("fatal: no\n") == "fatal: no"


def test_doctor_given_a_launch_argument_before_the_dashes_prints_the_command_with_them():
    """``doctor --tp 8`` is a launch argument in doctor's place: the error prints the command with ``--``, doctor's
    own flags kept before it, and that command runs as printed (no usage error: doctor's verdict, exit 0 or 1)."""
    line = refused(["doctor", "--tp", "8", "--json"], code=2)
    command = printed_command(line, "c128patch doctor --json")
    assert command == "c128patch doctor --json -- --tp 8", line
    ran = run_printed(command)
    assert ran.returncode in (0, 1), ran.stderr
    assert "No such option" not in ran.stderr + ran.stdout


@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "-1"])
@pytest.mark.parametrize("verb", [["watch", "--onto", "v0.5.23", "--no-run"], ["bisect", "--onto", "v0.5.23"]])
def test_a_time_limit_that_is_no_number_of_seconds_is_one_line(tmp_path, monkeypatch, verb, value):
    """Helper 142: ``watch --timeout nan`` was ValueError's traceback, ``inf`` and ``1e300`` OverflowError's; ``bisect
    --timeout nan`` passed FloatRange's bounds and ran with no limit."""
    monkeypatch.chdir(tmp_path)
    res = invoke(*verb, "--timeout", value, as_json=False)
    assert res.code == 2 and res.err.startswith("c128patch: error: Invalid value for '--timeout': "), res.err
    assert len(res.err.strip().splitlines()) == 1 and not (tmp_path / "c128patch-watch").exists()


@pytest.mark.parametrize("kind", ["fifo", "device-link", "dangling-link"])
def test_a_path_that_is_no_regular_file_is_said_to_be_what_it_is_not_missing(tmp_path: Path, kind: str):
    """Helper 144: ``verify-wheel FIFO`` said "does not exist"; --series/--layer FIFO "no manifest"; ``matrix
    --results FIFO`` printed an empty table. Each says what the path is, in one line, and never opens it."""
    path = tmp_path / "thing"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null" if kind == "device-link" else tmp_path / "nowhere")
    said = {"fifo": "a FIFO", "device-link": "a character device (through a link)",
            "dangling-link": "a link to nothing"}[kind]
    for args, message in [(["verify-wheel", str(path)], f"not a wheel: {path} is {said}, not a regular file"),
                          (["wheel", "--from-wheel", str(path), "-o", str(tmp_path / "o")],
                           f"not a wheel: {path} is {said}, not a regular file"),
                          (["lint", "--series", str(path)], f"--series {path} is {said}, not a folder"),
                          (["lint", "--layer", str(path)], f"--layer {path} is {said}, not a folder"),
                          (["matrix", "--results", str(path)], f"--results {path} is {said}, not a folder")]:
        res = invoke(*args, as_json=False)
        assert res.code == 2 and res.err == f"c128patch: error: {message}\n", (args, res.err)
