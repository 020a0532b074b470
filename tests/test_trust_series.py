"""Trust boundaries of the series, its layers, its config and the release cache (issue 36 items 1, 2, 4
and 5; docs/security.md): each rule refused from a hostile input of our own, nothing written."""

from __future__ import annotations

import ast
import base64
import contextlib
import hashlib
import json
import multiprocessing
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.series import txn
from c128patch.series.layers import CONFIG, ENV, lookup_layers, stack
from c128patch.series.ledger import Ledger
from c128patch.series.manifest import load_series
from c128patch.series.patchfile import read_patch
from c128patch.series.paths import confine
from small_series import tree  # noqa: F401 (a fixture)
from support import REPO_ROOT, error_line, invoke, refused
from test_sealed_box import trapped_upstream  # noqa: F401 (a fixture)

SERIES = '[series]\nname = "{name}"\nversion = "1"\nbase = "v0.5.23"\n'


def series_folder(dest: Path, name: str = "site") -> Path:
    (dest / "patches").mkdir(parents=True)
    (dest / "patches" / "series.toml").write_text(SERIES.format(name=name))
    return dest


def journal(root: Path, moves: list, deletes: list, parts: list[str] | None = None) -> Path:
    """A committed refresh journal in ``root`` (its staged file 00000 holds b"evil")."""
    (root / txn.TXN / "files").mkdir(parents=True)
    (root / txn.TXN / "files" / "00000").write_bytes(b"evil")
    group = {"id": "g1", "parts": parts if parts is not None else [os.path.realpath(root)]}
    (root / txn.TXN / txn.PLAN).write_text(json.dumps({"moves": moves, "deletes": deletes, "group": group}))
    return root


# ----------------------------------------------------------------------------------------------- item 1: confine
@pytest.mark.parametrize("path, says", [
    ("/etc/passwd", "must be relative"), ("../x", "must be relative"), ("a/../../x", "must be relative"),
    (".GIT/config", "git's own folder"), ("a/.git./hooks/x", "git's own folder"), ("a/git~1/x", "git's own folder"),
    ("a/.git::$INDEX_ALLOCATION/hooks/x", "git's own folder"), ("a/.Git . :$DATA/x", "git's own folder"),
    ("a/.gitmodules:$DATA", "decides what git runs"),
    # helper 148: compatibility forms, as NFKC folds them (full-width, small-form, one-dot-leader dots; full-width GIT)
    ("\uff0egit/config", "git's own folder"), ("a/\ufe52GIT/x", "git's own folder"),
    ("\u2024git/x", "git's own folder"),
    ("a/.\uff27\uff29\uff34/x", "git's own folder"), ("\uff0egitmodules", "decides what git runs"),
    # helper 175: NTFS upper-cases names to compare them ($UpCase): the dotless i (U+0131) is I there, and casefold
    # keeps it: `.g\u0131t/config` passed lint, in a journal's moves and in a patch, and was written
    ("a/.g\u0131t/config", "git's own folder"), (".G\u0131T./hooks/x", "git's own folder"),
    ("a/.g\u0131tmodules", "decides what git runs"),
    ("a/\uff0e\uff0e/x", "must be relative"), ("a/\u2025/x", "must be relative"),
    # C1 (CSI, NEL) and bidi controls, as wheel members are refused: a terminal or report line taking the name
    ("a/\x9b2J/x", "control character"), ("a/\x85x", "control character"), ("a/x\u202egp.py", "control character"),
    ("a/\u2066x", "control character"),
    # helper 168: what ``textsafe.plain`` takes out of a report (zero-width characters, the Arabic letter mark, a BOM)
    # passed as a path, shown as another: an overlay target `environ<U+200B>.py` read as upstream's environ.py
    ("python/sglang/srt/environ\u200b.py", "control character"), ("a/x\u061cy", "control character"),
    ("a/\ufeffx", "control character"), ("a/x\u2060y", "control character"),
    # helper 152: a `.` part, which PurePosixPath drops (an overlay target `python/./sglang/srt/environ.py` passed
    # `lint --offline`; `lint` then failed on git's "Invalid path", naming no rule)
    ("python/./sglang/srt/environ.py", "must be relative"), ("./python/x", "must be relative"),
    ("a/.", "must be relative"), (".", "must be relative"),
    # helper 155: a part past NAME_MAX or a name past 1024 bytes (lint and check passed it; apply's first stat of
    # it was ENAMETOOLONG's traceback)
    ("python/" + "a" * 256 + "/x.py", "name too long"), ("python/" + "\u00e9" * 128 + ".py", "name too long"),
    ("python/" + "/".join(["b" * 200] * 6) + "/x.py", "name too long"),
])
def test_confine_refuses_what_leaves_the_root(tmp_path, path, says):
    with pytest.raises(C128Error, match=says) as exc:
        confine(tmp_path, path, "input X")
    assert "input X" in exc.value.message and repr(path) in exc.value.message


def test_confine_refuses_a_symlink_on_the_way_and_a_file_that_is_not_regular(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "in").symlink_to(tmp_path / "out")
    with pytest.raises(C128Error, match="goes through the symlink in"):
        confine(tmp_path, "in/x", "input X")
    (tmp_path / "folder").mkdir()
    with pytest.raises(C128Error, match="is a folder, not a regular file"):
        confine(tmp_path, "folder", "input X", regular=True)
    assert confine(tmp_path, "out/x", "input X") == tmp_path / "out" / "x"


@pytest.mark.parametrize("how", ["absolute", "dotdot", "foreign-folder", "symlinked-journal", "not-a-group", "deep",
                                 "foreign-folders-own-plan", "staged-link-after-a-file", "staged-fifo-after-a-file",
                                 "path-no-string-after-a-file", "name-no-string-after-a-file"])
def test_a_hostile_journal_moves_and_deletes_nothing(tmp_path, how):
    """A leftover journal naming an absolute path, a ``../`` path or a foreign folder of its group, or
    a journal folder that is a symlink: every read of the series refuses it in one line; nothing moves."""
    victim, outside = tmp_path / "victim.txt", tmp_path / "written.txt"
    victim.write_text("keep")
    foreign = series_folder(tmp_path / "foreign", "foreign")
    (foreign / "patches" / "keep.patch").write_text("keep")
    root = series_folder(tmp_path / "layer")
    if how == "absolute":
        journal(root, [["00000", str(outside)]], [])
    elif how == "dotdot":
        journal(root, [], ["../victim.txt"])
    elif how == "foreign-folder":
        journal(root, [["00000", "patches/x.patch"]], [], [os.path.realpath(root), str(foreign)])
        journal(foreign, [], ["patches/keep.patch"], ["/elsewhere"])  # a plan of another group
    elif how.startswith("staged-"):  # (helper 163: a staged file that is a link or a FIFO was refused only at its own
        # move, the moves before it done, and the refusal said "nothing was written")
        journal(root, [["00000", "patches/x.patch"], ["00001", "patches/y.patch"]], [])
        staged = root / txn.TXN / "files" / "00001"
        staged.symlink_to(victim) if how == "staged-link-after-a-file" else os.mkfifo(staged)
    elif how == "foreign-folders-own-plan":  # (helper 163: a plan of its own group, which names it: only the "same
        # refresh" check refuses it; without that check the foreign folder's plan ran as part of this one's recovery)
        journal(root, [["00000", "patches/x.patch"]], [], [os.path.realpath(root), os.path.realpath(foreign)])
        journal(foreign, [], ["patches/keep.patch"], [os.path.realpath(foreign)])
    elif how.endswith("no-string-after-a-file"):  # (helper 168: checked as str(...), then a TypeError at its own
        # move, the moves before it done)
        second = ["00001", 5] if how.startswith("path") else [12345, "patches/y.patch"]
        journal(root, [["00000", "patches/x.patch"], second], [])
        (root / txn.TXN / "files" / "00001").write_bytes(b"two")
    elif how == "deep":  # read back by the one reader of state files (jsonio.read_json): a RecursionError before
        journal(root, [["00000", "patches/x.patch"]], [])
        (root / txn.TXN / txn.PLAN).write_text("[" * 100_000 + "]" * 100_000)
    elif how == "not-a-group":
        journal(root, [["00000", "patches/x.patch"]], [])
        (root / txn.TXN / txn.PLAN).write_text(json.dumps({"moves": [["00000", "patches/x.patch"]], "deletes": [],
                                                           "group": "x"}))
    else:
        journal(tmp_path / "elsewhere", [["00000", "patches/x.patch"]], [], [os.path.realpath(root)])
        (root / txn.TXN).symlink_to(tmp_path / "elsewhere" / txn.TXN)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(C128Error, match="an interrupted refresh cannot be finished") as exc:
        load_series(root)
    assert "\n" not in exc.value.message
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert victim.read_text() == "keep" and not outside.exists()
    assert (foreign / "patches" / "keep.patch").read_text() == "keep"


@pytest.mark.parametrize("text", [b"\xff\xfe{", b"[" * 100_000 + b"]" * 100_000, b"[1]"],
                         ids=["not-utf8", "deep", "list"])
def test_a_journal_that_is_no_json_object_is_said_so(tmp_path, text):
    """Helper 175: a plan.json that is no JSON object (not UTF-8, too deep, a list) was refused as "'moves' must be
    pairs of a staged file and a path", which it does not hold: it is said to be no journal the tool writes."""
    root = journal(series_folder(tmp_path / "layer"), [], [])
    (root / txn.TXN / txn.PLAN).write_bytes(text)
    with pytest.raises(C128Error, match=r"plan\.json: not a journal the tool writes \(no JSON object") as exc:
        load_series(root)
    assert "must be pairs" not in exc.value.message and (root / txn.TXN / txn.PLAN).read_bytes() == text


@pytest.mark.parametrize("how", ["own-folder-another-users", "own-subfolder-another-users",
                                 "others-subfolder-writable"])
def test_a_journal_writing_through_a_folder_another_user_may_change_moves_nothing(tmp_path, how):
    """h152: only the group's *other* folders, and of each only it and its `patches/`, were checked for their owner:
    run as root, `lint --series DIR` on a folder of `nobody` holding a plan ran its deletes and moves there with root's
    authority (a subfolder `nobody` owns, or a world-writable `overlay/` of another part, too), where whoever may
    change a folder on the way can swap it for a link between `confine`'s check and the move."""
    if os.getuid() != 0 and how != "others-subfolder-writable":
        pytest.skip("chown needs root")
    root = series_folder(tmp_path / "layer")
    (root / "patches" / "keep.patch").write_text("keep")
    if how == "own-folder-another-users":
        journal(root, [], ["patches/keep.patch"])
        for path in (root, *root.rglob("*")):
            os.chown(path, 65534, 65534)
    elif how == "own-subfolder-another-users":
        (root / "patches" / "sub").mkdir()
        os.chown(root / "patches" / "sub", 65534, 65534)
        journal(root, [["00000", "patches/sub/x.patch"]], ["patches/keep.patch"])
    else:
        other = series_folder(tmp_path / "other", "other")
        (other / "overlay").mkdir()
        (other / "overlay").chmod(0o777)
        parts = [os.path.realpath(root), os.path.realpath(other)]
        journal(root, [], ["patches/keep.patch"], parts)
        journal(other, [["00000", "overlay/x.py"]], [], parts)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    err = refused(["lint", "--offline", "--series", root],
                  contains="an interrupted refresh cannot be finished")
    assert re.search(r"is (owned by another user \(uid \d+\)|writable by other users): not written", err), err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (root / "patches" / "keep.patch").read_text() == "keep"


def test_a_write_into_a_folder_another_user_owns_is_refused_before_its_commit_point(tmp_path):
    """h152: `refresh` or `layer add-entry` run as root into a series or layer folder of `nobody` wrote there with
    root's authority; refused as the plan is staged (not past the commit point, where a refused plan would be left
    committed and unfinishable): nothing written, no journal left."""
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    root = series_folder(tmp_path / "layer")
    os.chown(root, 65534, 65534)
    with pytest.raises(C128Error, match=r"refusing to write into .* is owned by another user \(uid 65534\)"):
        txn.commit_all([(root, {root / "patches" / "x.patch": b"x"}, [], None)])
    assert sorted(p.name for p in root.rglob("*")) == ["patches", "series.toml"]


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "relative", "another-user"])
def test_a_journal_whose_group_names_a_folder_others_may_change_moves_nothing(tmp_path, how, monkeypatch):
    """Helper 148: a plan's group may name another folder holding a plan of the same group; one that another user
    owns or may write (`/tmp/shared`) had its moves and deletes run with the operator's authority, and whoever could
    change it could swap a folder for a link between `confine`'s check and the move. A part must be the user's."""
    other = series_folder(tmp_path / "other", "other")
    (other / "patches" / "keep.patch").write_text("keep")
    root = series_folder(tmp_path / "layer")
    parts = [os.path.realpath(root), "other" if how == "relative" else os.path.realpath(other)]
    journal(root, [["00000", "patches/x.patch"]], [], parts)
    journal(other, [], ["patches/keep.patch"], parts)
    monkeypatch.chdir(tmp_path)
    if how == "another-user":
        if os.getuid() != 0:
            pytest.skip("chown needs root")
        os.chown(other, 65534, -1)
    elif how != "relative":
        other.chmod(0o777 if how == "world-writable" else 0o775)
        if how == "group-writable":
            os.chown(other, -1, next(g for g in (1, 2, 65534) if g != os.getgid())) if os.getuid() == 0 \
                else pytest.skip("chgrp to a group not one's own needs root")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(C128Error, match="an interrupted refresh cannot be finished.*its group names") as exc:
        load_series(root)
    assert "\n" not in exc.value.message
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (other / "patches" / "keep.patch").read_text() == "keep"


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "outside-plan"])
def test_a_journal_or_manifest_that_is_a_link_is_refused_before_it_is_read(tmp_path, target):
    """A layer can commit links: a plan linked to /dev/zero ran every reader out of memory (a FIFO: hung it); a
    manifest linked to a file of the machine was read. Each is one line now, nothing read through the link."""
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
    (tmp_path / "outside-plan").write_text("{}")
    where = tmp_path / target if target != "/dev/zero" else Path(target)
    layer = series_folder(tmp_path / "layer")
    (layer / txn.TXN).mkdir()
    (layer / txn.TXN / txn.PLAN).symlink_to(where)
    refused(["lint", "--offline", "--layer", layer], contains="a symbolic link; the tool writes a plain file there")
    shutil.rmtree(layer / txn.TXN)
    manifest = layer / "patches" / "series.toml"
    (tmp_path / "outside.toml").write_text(manifest.read_text())
    manifest.unlink()
    manifest.symlink_to(tmp_path / "outside.toml")
    refused(["lint", "--offline", "--layer", layer], contains="goes through the symlink patches/series.toml")


def test_lint_with_a_hostile_layer_journal_exits_non_zero_and_writes_nothing(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    layer = journal(series_folder(tmp_path / "layer"), [["00000", str(tmp_path / "w")]], ["../victim.txt"])
    refused(["lint", "--offline", "--layer", layer], contains="an interrupted refresh cannot be finished")
    assert victim.read_text() == "keep" and not (tmp_path / "w").exists()


@pytest.mark.parametrize("in_git", [False, True])
def test_the_way_back_from_a_journal_that_cannot_be_finished_works_as_printed(tmp_path, in_git):
    """Helper 155: the refusal printed `git -C LAYER checkout -- patches` for a layer folder in no git work tree
    (git's "not a git repository"), and said to remove the journal without a command."""
    from support import printed_command, run_printed

    layer = series_folder(tmp_path / "layer")
    if in_git:
        git = Git(layer)
        git.run("init", "-q")
        git.run("add", "-A")
        git.run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "layer")
    journal(layer, [["00000", "patches/series.toml"]], ["../victim.txt"])
    (layer / "patches" / "series.toml").write_text("damaged by the interrupted refresh")
    err = refused(["lint", "--offline", "--layer", layer], contains="an interrupted refresh cannot be finished")
    command = printed_command(err, "git -C" if in_git else "rm -rf")
    assert run_printed(command).returncode == 0, command
    if not in_git:
        assert "in no git work tree: put back its patches/" in err
        (layer / "patches" / "series.toml").write_text(SERIES.format(name="site"))
    assert not (layer / txn.TXN).exists()
    assert invoke("lint", "--offline", "--layer", layer, as_json=False).code == 0


def test_a_patch_file_that_is_a_fifo_is_said_so_not_missing(sglang_release_repo, tmp_path):
    """Helper 155: a layer whose patch file is a FIFO was refused as "is missing" by lint and check."""
    layer = tmp_path / "acme"
    shutil.copytree(REPO_ROOT / "docs" / "examples" / "acme-layer", layer)
    patch = layer / "patches" / "0002-acme-sps-floor-helper.patch"
    patch.unlink()
    os.mkfifo(patch)
    says = "is a FIFO, not a regular file"
    res = invoke("lint", "--offline", "--layer", layer, "--json")
    assert res.code == 1 and any(f["message"] == f"patches/{patch.name} {says}" for f in res.out["findings"]), res.out
    refused(["check", "--sglang-rev", "v0.5.23", "--layer", layer], contains=f"{patch} {says}")


def test_a_manifest_file_that_is_no_regular_file_is_said_as_every_path_option_says_it(tmp_path):
    """``series.paths.not_a_file`` had its own copy of ``errors.what_is``: a link to nothing was "is missing", a
    character device "a device". One wording now (``what_is``), "is missing" only where nothing is there."""
    from c128patch.errors import what_is
    from c128patch.series.paths import not_a_file

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    said = {p: not_a_file(tmp_path / p) for p in ("fifo", "folder", "dangling", "nowhere")}
    assert said == {"fifo": "is a FIFO, not a regular file", "folder": "is a folder, not a regular file",
                    "dangling": "is a link to nothing, not a regular file", "nowhere": "is missing"}
    assert not_a_file(Path("/dev/null")) == f"is {what_is('/dev/null')}, not a regular file"
    assert what_is("/dev/null") == "a character device"


@pytest.mark.parametrize("entry, file, says", [
    ("../../x", "python/x.py", "unsafe entry name in the ledger"),
    ("acme-sps-env", "/etc/passwd", "unsafe path in the ledger"),
    ("acme-sps-env", "python/.git/config", "unsafe path in the ledger"),
    ("acme-sps-env", "python/x.py", None),
    # helper 175: the entry's folder a link out of the layer: lint passed it (exit 0), refused only at a rebase's use
    ("linked", "python/x.py", "goes through the symlink patches/resolutions/linked"),
])
def test_lint_reads_a_layers_ledger_rows_through_the_rule(tmp_path, entry, file, says):
    """Helper 155: `lint` never read the ledger: a row naming entry '../../x' or file '/etc/passwd' passed
    `lint --offline` (exit 0), found only where a rebase used the row."""
    layer = tmp_path / "acme"
    shutil.copytree(REPO_ROOT / "docs" / "examples" / "acme-layer", layer)
    (layer / "patches" / "resolutions" / "acme-sps-env").mkdir(parents=True)
    (layer / "patches" / "resolutions" / "acme-sps-env" / ("a" * 20 + ".diff")).write_text("")
    shutil.copytree(layer / "patches" / "resolutions" / "acme-sps-env", tmp_path / "outside")
    (layer / "patches" / "resolutions" / "linked").symlink_to(tmp_path / "outside")
    (layer / "patches" / "resolutions" / "ledger.toml").write_text(tomli_w.dumps({"resolutions": [
        {"entry": entry, "key": "a" * 20, "file": file, "from": "v0.5.22", "onto": "v0.5.23"}]}))
    res = invoke("lint", "--offline", "--layer", layer, "--json")
    if says is None:
        assert res.code == 0, res.out
    else:
        assert res.code == 1 and any(says in f["message"] for f in res.out["findings"]), res.out


@pytest.mark.parametrize("make", ["link", "fifo", "folder", "missing"])
def test_lint_refuses_a_ledger_rows_diff_that_is_no_regular_file_in_one_line_never_opening_it(tmp_path, make):
    """Helper 187: a row's `.diff` that was a link (to a file outside), a FIFO, a folder or missing passed `lint`
    (exit 0, "0 error(s)"); `rebase` skipped that row's resolution. Now one line naming the row; a FIFO is only
    stat'ed (a read would wait for a writer forever)."""
    root = tmp_path / "s"
    shutil.copytree(REPO_ROOT / "patches", root / "patches", symlinks=True)
    for part in ("overlay", "csrc"):
        shutil.copytree(REPO_ROOT / part, root / part, symlinks=True)
    assert invoke("lint", "--offline", "--series", root).code == 0
    row = Ledger(load_series(root)).rows()[0]
    diff = root / "patches" / "resolutions" / row["entry"] / f"{row['key']}.diff"
    outside = tmp_path / "outside.diff"
    diff.rename(outside)
    {"link": lambda: diff.symlink_to(outside), "fifo": lambda: os.mkfifo(diff), "folder": diff.mkdir,
     "missing": lambda: None}[make]()
    res = invoke("lint", "--offline", "--series", root)
    says = {"link": "goes through the symlink", "fifo": "is a FIFO, not a regular file",
            "folder": "is a folder, not a regular file", "missing": "is missing"}[make]
    found = [f["message"] for f in res.out["findings"]]
    assert res.code == 1 and any(f"{row['key']}.diff {says}" in m and "\n" not in m for m in found), res.out


def test_a_symlinked_or_non_utf8_contract_lock_is_refused_in_one_line(tmp_path):
    from c128patch.series.contract import read_lock

    root = series_folder(tmp_path / "s")
    (tmp_path / "victim.txt").write_text("keep")
    (root / "patches" / "contract.lock").symlink_to(tmp_path / "victim.txt")
    with pytest.raises(C128Error, match="goes through the symlink patches/contract.lock"):
        read_lock(root / "patches")
    refused(["contract", "--sglang-rev", "v0.5.23", "--accept", "--series", root], contains="goes through the symlink")
    res = invoke("lint", "--offline", "--series", root)  # the link is a finding of lint too
    assert res.code == 1 and any("goes through the symlink" in f["message"] for f in res.out["findings"]), res.out
    assert (tmp_path / "victim.txt").read_text() == "keep"
    (root / "patches" / "contract.lock").unlink()
    (root / "patches" / "contract.lock").write_bytes(b"# base v0.5.23\nfunction a.\xff b c sig=1\n")
    with pytest.raises(C128Error, match=r"contract.lock:2: not UTF-8 .*; delete that line \(`sed -i 2d .*`\), then "
                       "rewrite the lock from the patched tree with `c128patch refresh --series .*`"):
        read_lock(root / "patches")
    assert invoke("lint", "--offline", "--series", root).code == 1


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_contract_lock_or_ledger_that_is_no_regular_file_is_refused_naming_it(tmp_path, kind):
    """Helper 163: a FIFO or a folder at ``patches/contract.lock`` was "no lock" (`lint` passed, `contract --accept`
    said it "does not exist: write it with `c128patch refresh`", and that refresh, onto a folder, failed past its
    commit point with IsADirectoryError's traceback, the series half written); at ``resolutions/ledger.toml`` it was
    "no ledger", its rows silently not used. Now each is refused in one line naming it, for every reader."""
    from c128patch.series.contract import read_lock

    def make(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path) if kind == "fifo" else path.mkdir()

    what = "a FIFO" if kind == "fifo" else "a folder"
    root = series_folder(tmp_path / "s")
    make(root / "patches" / "contract.lock")
    with pytest.raises(C128Error, match=f"patches/contract.lock is {what}, not a regular file"):
        read_lock(root / "patches")
    refused(["contract", "--sglang-rev", "v0.5.23", "--accept", "--series", root], contains=f"is {what}")
    res = invoke("lint", "--offline", "--series", root)
    assert res.code == 1 and any(f"contract.lock is {what}" in f["message"] for f in res.out["findings"]), res.out
    layer = series_folder(tmp_path / "layer", "site")
    make(layer / "patches" / "resolutions" / "ledger.toml")
    with pytest.raises(C128Error, match=f"resolutions/ledger.toml is {what}, not a regular file"):
        Ledger(load_series(layer)).rows()
    res = invoke("lint", "--offline", "--layer", layer)
    assert res.code == 1 and any(f"ledger.toml is {what}" in f["message"] for f in res.out["findings"]), res.out


def test_a_write_or_a_journal_onto_a_folder_is_refused_before_anything_moves(tmp_path):
    """Helper 163: ``commit_all`` staged a file whose place held a folder and failed at its ``os.replace`` past the
    commit point (IsADirectoryError's traceback, the other files moved, a journal every read then refused); a journal
    moving onto a folder was checked only as it moved. Both are one line now, nothing changed."""
    root = series_folder(tmp_path / "s")
    (root / "patches" / "contract.lock").mkdir()
    (root / "patches" / "a.patch").write_text("old")
    with pytest.raises(C128Error, match="patches/contract.lock is a folder, not a regular file.*nothing was changed"):
        txn.commit_all([(root, {root / "patches" / "a.patch": b"new", root / "patches" / "contract.lock": b"x"}, [],
                         None)])
    assert (root / "patches" / "a.patch").read_text() == "old" and not (root / txn.TXN).exists() \
        and not (root / txn.STAGING).exists()
    journal(root, [["00000", "patches/contract.lock"]], [])
    (root / txn.TXN / "files" / "00001").write_bytes(b"new")
    plan = json.loads((root / txn.TXN / txn.PLAN).read_text())
    plan["moves"].insert(0, ["00001", "patches/a.patch"])
    (root / txn.TXN / txn.PLAN).write_text(json.dumps(plan))
    with pytest.raises(C128Error, match="patches/contract.lock is a folder, not a regular file.*nothing was moved"):
        load_series(root)
    assert (root / "patches" / "a.patch").read_text() == "old" and (root / txn.TXN / "files" / "00001").exists()


GOOD_ROW = "function  sglang.a.f  overlay/sglang/x.py:3  python/sglang/a.py:10  sig=0123456789ab"


@pytest.mark.parametrize("row", [
    "function  sglang.a.f  /etc/passwd:3  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  ../../victim.py:3  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py:0  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py:abc  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/\x1b]8;;https://evil/\x07x.py:3  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  .git/hooks/post-checkout:1  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py:3  /etc/shadow:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py:3  python/../../a.py:10  sig=0123456789ab",
    "bogus  sglang.a.f  overlay/sglang/x.py:3  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py:3  python/sglang/a.py:10  sig=0123456789ab,<img>",
    "function  sglang.a.f  overlay/\x9b31mx.py:3  python/sglang/a.py:10  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py:3  :5  sig=0123456789ab",
    "function  sglang.a.f  overlay/sglang/x.py:3  python/sglang/a.py  sig=0123456789ab",
    "function  sglang.a.f  overlay/．．/x.py:3  python/sglang/a.py:10  sig=0123456789ab",
])
def test_a_contract_lock_line_naming_an_odd_site_is_refused_naming_the_line(tmp_path, row):
    """A contract.lock line with a site or definition no refresh writes (absolute, `..`, git's own folder, a control
    character, no line number), an unknown kind or a hash that is not hex was taken silently; its fields reach the
    findings, the reports and, kept by refresh, the next lock. One line naming the file and line now."""
    from c128patch.series.contract import read_lock

    root = series_folder(tmp_path / "s")
    lock = root / "patches" / "contract.lock"
    lock.write_text(f"# base v0.5.23\n{GOOD_ROW}\n{row}\n")
    with pytest.raises(C128Error, match=rf"^{re.escape(str(lock))}:3: not a contract line refresh writes "):
        read_lock(root / "patches")
    lock.write_text(f"# base v0.5.23\n{GOOD_ROW}\n")
    assert [i.site for i in read_lock(root / "patches").items] == ["overlay/sglang/x.py:3"]


def test_a_bad_contract_lock_lines_printed_deletion_works_for_a_folder_holding_a_newline(tmp_path):
    """Helper 159: the printed ``sed -i Nd LOCK`` quoted the path with shlex.quote, whose newline the one printed line
    shows as ``⏎``: pasted, the command named no file. The path is in bash's ``$'...'`` (``textsafe.shell_quote``)."""
    from c128patch.series.contract import read_lock
    from c128patch.textsafe import one_line
    from support import printed_command, run_printed

    root = series_folder(tmp_path / "new\nline")
    lock = root / "patches" / "contract.lock"
    lock.write_text(f"# base v0.5.23\n{GOOD_ROW}\nfunction  sglang.a.f  /etc/passwd:3  python/sglang/a.py:10  sig=01\n")
    with pytest.raises(C128Error) as exc:
        read_lock(root / "patches")
    assert run_printed(printed_command(one_line(exc.value.message), "sed -i")).returncode == 0
    assert "/etc/passwd" not in lock.read_text() and [i.site for i in read_lock(root / "patches").items] == [
        "overlay/sglang/x.py:3"]


def test_a_good_journal_is_still_finished(tmp_path):
    root = series_folder(tmp_path / "layer")
    journal(root, [["00000", "patches/new.patch"]], ["patches/series.toml"])
    (root / "patches" / "series.toml").write_text(SERIES.format(name="site"))
    assert txn.recover(root) == "finished an interrupted refresh"
    assert (root / "patches" / "new.patch").read_bytes() == b"evil" and not (root / "patches/series.toml").exists()


def test_an_entry_name_from_a_journal_never_reaches_the_ledger_as_a_path(tmp_path):
    series = load_series(series_folder(tmp_path / "s"))
    with pytest.raises(C128Error, match="unsafe entry name"):
        Ledger(series).record(None, "../../../ESCAPE", "a", "b", [])  # type: ignore[arg-type]
    assert not list(tmp_path.rglob("ESCAPE*"))


@pytest.mark.parametrize("field, value", [("from", "v0.5.22\n- merged: all clean"), ("onto", "\x1b[2J\x1b]0;x\x07"),
                                          ("from", "@maintainer"), ("onto", "closes #12"), ("from", "a" * 201),
                                          ("onto", "v0.5.23\u202e")])
def test_a_ledger_row_whose_range_is_not_a_rev_is_refused_when_read(tmp_path, field, value):
    """A row's ``from``/``onto`` (a pull request's text) reached "reused from ..." and the rebase report as it was:
    a newline forged a line, ESC drove the terminal, ``@x``/``#12`` were live. Now one line naming the ledger and
    the row."""
    series = load_series(series_folder(tmp_path / "s"))
    row = {"entry": "e", "key": "ab", "file": "f", "from": "v0.5.22", "onto": "v0.5.23", field: value}
    (tmp_path / "s/patches/resolutions").mkdir()
    (tmp_path / "s/patches/resolutions/ledger.toml").write_text(tomli_w.dumps({"resolutions": [row]}))
    with pytest.raises(C128Error, match="resolution #1: " + field + " = .* is not a git rev name") as exc:
        Ledger(series).rows()
    assert "ledger.toml" in exc.value.message and "\n" not in exc.value.message and "\x1b" not in exc.value.message
    row[field] = "v0.5.21-rc1"
    (tmp_path / "s/patches/resolutions/ledger.toml").write_text(tomli_w.dumps({"resolutions": [row]}))
    assert Ledger(series).rows() == [row]


def test_a_ledger_is_parsed_once_per_content_and_its_rows_handed_out_as_copies(tmp_path, monkeypatch):
    """A pull request's ledger of 200,000 rows (37 MB, under the 64 MiB limit) was parsed again at every conflicting
    entry's has() and replay(), in the loop and in the proof: a rebase of 5 s took 1m43s (48 s CPU). Parsed once per
    content now (a rewrite of the same size is read again), and a caller's change to a row is not kept."""
    from c128patch.series import manifest

    series = load_series(series_folder(tmp_path / "s"))
    row = {"entry": "e", "key": "ab", "file": "f", "from": "v0.5.22", "onto": "v0.5.23"}
    (tmp_path / "s/patches/resolutions").mkdir()
    ledger = tmp_path / "s/patches/resolutions/ledger.toml"
    ledger.write_text(tomli_w.dumps({"resolutions": [row] * 3}))
    parsed, loads = [], manifest.tomllib.loads
    monkeypatch.setattr(manifest.tomllib, "loads", lambda text: parsed.append(1) or loads(text))
    rows = Ledger(series).rows()
    rows[0]["key"] = "changed"
    assert Ledger(series).has("e") and Ledger(series).rows() == [row] * 3 and len(parsed) == 1
    ledger.write_text(tomli_w.dumps({"resolutions": [{**row, "key": "cd"}] * 3}))  # (the same size)
    assert Ledger(series).rows() == [{**row, "key": "cd"}] * 3 and len(parsed) == 2


# Every join of a path taken from input goes through ``confine`` (or ``check_relpath``/``check_entry_name``
# at load): a join whose right side is not a constant must be listed here, with why it is safe.
REVIEWED = {
    "series/manifest.py": {"self.patches_dir / (variant.file if variant else entry.file)",  # checked at load
                           "self.root / entry.source"},  # checked at load (check_relpath)
    "series/paths.py": {"root / check_relpath(path, what)", "root / p"},  # the rule itself
    "series/ledger.py": {"git.worktree / path",  # a path git lists as unmerged
                         # the entry checked in the join itself, the key just above it
                         "self.root / check_entry_name(entry, 'the ledger') / f'{key}.diff'"},
    "series/txn.py": {"Path(part) / f",  # read only, to compare groups
                      # _on_the_way: its rels confine()d before, each folder on their way only lstat'd
                      "os.path.join(real, *PurePosixPath(rel).parts[:n])",
                      "root / folder",  # folder: TXN or STAGING
                      "staging / 'files' / f'{i:05d}'", "root / TXN / 'files' / staged",  # staged: checked
                      "root / rel",  # _not_files: rels confine()d before (commit_all's _rel, _plan), only stat'd
                      "root / staged"},  # _plan: TXN or STAGING, /files/, a name _STAGED matched; then confine()d
    "series/layers.py": {"start / p",  # the operator's env, resolved then checked (lookup_layers)
                         "Path(top) / name",  # os.walk of a layer folder, only stat'd for its owner (_inside)
                         # git's own pointer of a linked work tree to its git dir, only stat'd (_sparse)
                         "folder / dot.read_text(errors='replace').strip().removeprefix('gitdir:').strip()"},
    "upstream/releases.py": {"dest / wheel.name",  # a file pip wrote into our own folder
                             "cache_dir() / 'wheels' / name"},  # a release version (release_version) in a fixed name
    # helper 168: ops/ walked too (the journals', the tree's record's and a layer's readers)
    "ops/applier.py": {"self.tree / path"},  # a patch's path (check_relpath at parse), in its own symlink check
    "ops/audit.py": {"tree_root / rel"},  # a .py file a patch touches (check_relpath at parse), only read
    "ops/layer.py": {"layer.root / rel", "trial / rel",  # patches/NNNN-<entry>.patch: the entry name checked
                     "layer.patches_dir / file"},  # the same file, built from the checked entry name
    "ops/rebase.py": {"git.worktree / path"},  # a path git lists as unmerged
    "ops/rebase_loop.py": {"self.series.part(step.name)[0].root / step.file"},  # the manifest's file, checked at load
    "ops/refresh.py": {"series.part(name)[0].root / entry.source",  # the manifest's, checked at load
                       "series.patches_dir / v.file", "series.patches_dir / entry.file",  # the same
                       "series.patches_dir / f'{stem}.patch'",  # the stem of a manifest's file
                       # checked in the join itself
                       "series.patches_dir / check_relpath(f\"{stem}.{name.replace('/', '-')}.patch\", f\"entry "
                       "'{entry.name}'\")",
                       "tree.parent / 'layers' / f\"local{(i if i > 1 else '')}\""},  # a number
    "ops/replay.py": {"index_file.parent / f'renamed-{item.entry.name}.patch'"},  # a checked entry name, in scratch
    "ops/status.py": {"git.cwd / e['target']"},  # a provenance target (check_relpath when read), only hashed
    "ops/treestate.py": {"(git.worktree or Path.cwd()) / rel",  # git's own answer (rev-parse --git-path)
                         "git.worktree / p", "git.worktree / path"},  # paths git lists as changed
    # helper 168: wheel/ walked too (wheel members, a wheel's provenance and SBOM)
    "wheel/authentic.py": {"Path(tmp) / f'{i:03d}.diff'",  # a number
                           # an SBOM diff's path that git apply has just applied (it refuses `..` and absolute
                           # paths), in our scratch; written only for a member name of upstream's (check_archive)
                           "scratch / path"},
    "wheel/patch.py": {"iw.root / target", "root / target",  # an overlay's target: the manifest's, checked at load
                       "root / rel",  # _member_text: a path a series patch touches (check_relpath at parse)
                       "iw.root / dist_info",  # the wheel's own .dist-info name (dist_info_dir of its checked name)
                       "iw.root / dist_info / 'sboms' / SBOM_NAME"},
    "wheel/srcbuild.py": {"out_dir / staged.name",  # the wheel our own build staged
                          "tree / provenance.PROVENANCE_PATH"},  # a constant
    "wheel/tools.py": {"self.root / name",  # a member name (check_archive: the path rules, no link or device)
                       "self.root / self.dist_info", "self.root / new",  # the .dist-info name, from the checked one
                       "dest_dir / self.name.filename(version)", "work / dest.name",  # the file name we build
                       "total / 2 ** 20", "size / 2 ** 20", "total / size"},  # numbers, not paths
    "wheel/verify.py": {"Path(tmp) / f'{i:03d}.diff'",  # a number
                        # a provenance file or target: record_problem refuses one that is not inside() the tree
                        "iw.root / target", "iw.root / path", "scratch / path", "scratch / wheel_path(e['target'])"},
    # helper 172: capacity/, cli/ and serve/ walked too: numbers, constants, the installed RECORD's names
    "capacity/model.py": {"-(-raw // align) * align / page", "ring_size(inp, 4, False) / inp.page_size",  # numbers
                          "(inp.layout.num_layers + 1) / inp.layout.num_layers", "ring_size(inp, 4, False) / "
                          "WINDOW_SIZE", "n / (1 << 30)", "inp.budget_bytes / b", "avail / b",
                          "full_token / inp.layout.context_len"},
    "capacity/pr.py": {"(hi - lo) / (off_iv[1] - off_iv[0])", "(f_off - f_on) / b"},  # numbers
    "capacity/tables.py": {"100.0 * r.delta_tokens / r.off.full_tokens"},  # a number
    # the installed RECORD's names: _outside() refuses one that leaves the install (links followed); only hashed
    "serve/doctor.py": {"site / name", "sg.site / name"},
    "cli/smoke/upstream.py": {"stage_dir / suite.STAGED_TESTS"},  # a constant of the suite module
    # helper 172: evidence/ walked too (result_path confines a bundle's rev and label)
    "evidence/staging.py": {"dest / rev",  # a release tag: stage confine()s it first (and prepare.py refuses a non-tag)
                            "dest / rev / label",  # label: our own tree names (patched, upstream, before)
                            "dest / rev / label / Path(provenance.PROVENANCE_PATH).relative_to('python')",
                            "dest / Path(provenance.PROVENANCE_PATH).relative_to('python')"},  # a constant
    # helper 172: smoke/ walked too (copy_files confines each file of a tree it stages)
    "smoke/device.py": {"d / name"},  # a tool's constant name in the operator's PATH / CUDA_HOME folders
    "smoke/kernel.py": {"dest / k"},  # k: our tree labels (patched, upstream)
    "smoke/passes.py": {"out_dir / f'rows-{spec.label}.jsonl'", "out_dir / f'pytest-{spec.label}.log'",
                        "out_dir / 'results' / spec.label",  # a pass label: ours (patched, upstream,
                        "out_dir / f'junit-{spec.label}.xml'"},  # patched-<a --sanitizer choice>)
    "smoke/render.py": {"path.parent / result"},  # suite.RESULT, a constant
    "smoke/server.py": {"out / f'load-{mode}.jsonl'", "out / f'server-{mode}.log'",  # mode: on / off, ours
                        "out / f'load-{mode}.log'", "100.0 * gain / cap['off']", "tput['on'] / tput['off']"},
    "smoke/trees.py": {"dest / label",  # our tree labels
                       "target / rel"},  # our staging folder; rel confine()d in the tree just before
    "smoke/upstream_select.py": {
        # a module name out of an import (ast: identifiers, no '/' or '..'), only stat'd and read in the tree
        "self.root.joinpath(*module.split('.'))", "index.root.joinpath(*parts[:i])",
        "self.path.parent / f'{top}.py'", "self.path.parent / top",
        # a first part of a literal _CSRC_LITERAL matches: one name, never "." nor ".." (a word character first);
        # the files it lists are confine()d when copied (copy_files)
        "index.root / CSRC / folder",
        "upstream / rel", "patched / rel",  # a path a series patch touches (check_relpath at parse), only stat'd
        "patched / pkg.replace('.', '/')",  # its package, the same
        "Path(name).parent / sib.name"},  # a kernel's name, a string: no file opened
    "smoke/upstream_standins.py": {"Path(tree).joinpath(*module.split('.'))"},  # our stand-in table's modules
    "smoke/upstream_suite.py": {"dest / k"},  # k: STAGED_TESTS or our tree labels
    # helper 172: fit/ walked too (tvm_ffi_pin confines the lock upstream's __version__ names)
    "fit/contract.py": {"series.root / source"},  # an overlay's source: the manifest's, checked at load
    "fit/contract_cxx.py": {"cache_dir() / 'contract-probe' / f'{key}.json'",  # a hash
                            "Path(path).parent / name"},  # a string compared with the tree's file list, not opened
    "fit/env.py": {"cache_dir() / 'envs' / 'locks' / f'{name}.lock'", "root / key",  # hashes (and our host())
                   "ensure_folder(cached.parent) / cached.name",  # the same file
                   "site / str(f)",  # a RECORD name: relpath'd, then confine()d in the environment before unlinked
                   "venv / folder",  # the folder of such a confine()d file
                   "state / f'c128patch-{n}.json'"},  # n: untried / defined, ours
    "fit/rebase_flow.py": {"state / name", "report_dir / name"},  # name: our two report names
    "fit/sandbox.py": {"os.path.join(os.path.realpath(tmp), n)", "self.home / name",  # our own names in our scratch
                       "os.path.join(d, SITE_PIP[1])",  # $XDG_CONFIG_DIRS, the operator's, absolute only
                       "n / (1 << 30)", "n / (1 << 20)",  # numbers
                       "os.path.join(folder, name)"},  # os.walk of the tree, only lstat'd
    "fit/scenario_models.py": {"(kv * old + value * new) / new_s", "(w * kv).sum(0) / s"},  # numbers
    "fit/treecheck.py": {"self.top / path",  # a name of self.files, the tree's own listing (no link)
                         "tree / p"},  # paths git lists as changed, only stat'd
    # in the box: a tree path made one name ('/' -> '%') in the box's own folder
    "fit/treecheck_runner.py": {"os.path.join(COMPILED, self.path.replace('/', '%'))"},
    "fit/watch.py": {"target.root / c",  # what our refresh wrote in our copy (refresh_ops.write)
                     "self.out / name",  # WRITTEN, our report names
                     # a layer's name (check_entry_name at load), under our copy or --out
                     "dest / 'layers' / layer.name", "out / 'series' / 'layers' / layer.name",
                     "part.root / top", "to / top"},  # patches or an overlay source's first part, checked at load
    "serve/install.py": {"self.dist_info / name"},  # name: a constant of each caller (RECORD, INSTALLER, ...)
    # helper 174: the top-level modules walked too (below series/, so they cannot call confine themselves)
    # a path of rev's tree (a caller's constant or git ls-tree's answer under one) or a name git's read-tree took into
    # its index (git refuses '..' and '.git' parts there) written under a folder of ours that checkout made (no links)
    "git.py": {"dest / path", "dest / name",
               "self.cwd / objects", "self.cwd / proc.stdout.strip()",  # git's own answer for its object store / hooks
               "git.cwd / objects.stdout.strip()",  # the same answer, read by refuse_damaged
               # a store the operator's repository borrows from (info/alternates), as git reads it: its pack indexes
               # only hashed (damaged_index), nothing written or run
               "store / line",
               # git's own answer for the index it could not write, only named in the error (its free space read)
               "self.cwd / self.out('rev-parse', '--git-path', 'index', check=False)"},
    # a program name looked up as Popen does (PATH or cwd), only stat'd, never written
    "procs.py": {"os.path.join(os.fsdecode(cwd), path)", "os.path.join(d, name)"},
    "upstream/source.py": {"cache_dir() / 'remotes' / (hashlib.sha256(url.encode()).hexdigest()[:16] + '.git')",
                           # git's own answer for the tree the operator named (its object store), not a tree's file
                           "git.cwd / git.out('rev-parse', '--git-path', 'objects')"},
}
_CONSTANT = ("TXN", "STAGING", "PLAN", "MANIFEST", "CONFIG", "LOCK_NAME", "PROVENANCE_PATH", "MIRROR_DONE",
             "UPSTREAM_PACKAGE", "SUMS", "PROOF", "WHEEL_PROVENANCE", "DEFAULT_TREE", "ENVIRON",
             "ONLINE_C128_DSPARK_RULES", "SBOM_NAME", "REPORT",
             "RESULTS_UNDER", "SUITE", "PROVENANCE_IN_ROOT", "RESULT", "SOURCES", "STAGED_TESTS", "KERNEL_TESTS",
             "CSRC", "PROBE", "PY_ROOT", "PACKAGE")


def _constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id in _CONSTANT) \
        or isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values)


def unreviewed_joins(source: str, reviewed: set[str]) -> list[str]:
    """The joins in ``source`` (``a / b``, ``os.path.join(a, b)``, ``a.joinpath(b)``) whose right side is not a
    constant, less the reviewed ones (helper 168: only ``/`` was found, an ``os.path.join`` of input passed)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            rights = [node.right]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                (node.func.attr == "joinpath" or node.func.attr == "join" and ast.unparse(node.func) == "os.path.join"):
            rights = node.args[node.func.attr == "join":]
        else:
            continue
        if all(_constant(r) for r in rights):
            continue
        if ast.unparse(node) not in reviewed and not any(ast.unparse(node) in r for r in reviewed):
            found.append(ast.unparse(node))
    return found


def test_no_join_of_input_bypasses_confine():
    root = REPO_ROOT / "tooling" / "c128patch"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))  # every package and the top-level modules
    assert {"git.py", "procs.py", "jsonio.py", "series/paths.py", "cli/smoke/upstream.py"} <= set(files)
    found = {rel: unreviewed_joins((root / rel).read_text(), REVIEWED.get(rel, set())) for rel in files}
    assert {k: v for k, v in found.items() if v} == {}
    assert unreviewed_joins("root / plan['moves'][0]\nroot / 'x' / TXN\n", set()) == ["root / plan['moves'][0]"]
    assert unreviewed_joins("os.path.join(root, rel)\nroot.joinpath(*parts)\nos.path.join(root, 'patches')\n"
                            "', '.join(names)\n", set()) == ["os.path.join(root, rel)", "root.joinpath(*parts)"]


# ------------------------------------------------------------------------------------ item 2: config from the operator
def hostile_upstream(tmp_path: Path) -> Path:
    """An upstream checkout (python/sglang/) that commits a c128patch.toml naming its own layer folder."""
    up = tmp_path / "work" / "sglang"
    (up / "python" / "sglang").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(up)], check=True)
    series_folder(up / "evil")
    (up / CONFIG).write_text('[layers]\npaths = ["evil"]\n')
    return up


def test_a_config_committed_by_upstream_is_never_read(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    up = hostile_upstream(tmp_path)
    assert lookup_layers((), cwd=up / "python" / "sglang")[0] == ()
    assert lookup_layers((), cwd=up)[0] == ()
    monkeypatch.chdir(up / "python")  # `status` run from inside the tree, as README says: the config is not read
    res = invoke("status", as_json=False)
    assert "evil" not in res.err + res.text and "layers from" not in res.err, (res.err, res.text)
    (tmp_path / "work" / CONFIG).write_text('[layers]\npaths = ["mine"]\n')  # the operator's, above the tree
    assert lookup_layers((), cwd=up / "python")[0] == ((tmp_path / "work" / "mine").resolve(),)


def test_a_config_shipped_in_an_upstream_tree_without_git_is_never_read(tmp_path, monkeypatch):
    """Helper 100: a tarball or sdist of sglang (no .git) shipping c128patch.toml and its layer: it was read and stacked
    ("c128patch 4 + layer evil 1"); a tree in upstream's layout is one the tool patches, repository or not."""
    monkeypatch.delenv(ENV, raising=False)
    up = hostile_upstream(tmp_path)
    shutil.rmtree(up / ".git")
    assert lookup_layers((), cwd=up / "python" / "sglang")[0] == () and lookup_layers((), cwd=up)[0] == ()
    monkeypatch.setenv(ENV, str(up / "evil"))
    with pytest.raises(C128Error, match="a tree c128patch patches"):
        lookup_layers((), cwd=tmp_path)


@pytest.mark.parametrize("route", ["clone", "worktree"])
def test_a_config_committed_by_upstream_is_never_read_in_a_sparse_checkout_of_it(tmp_path, monkeypatch, route):
    """Helper 153: a sparse checkout of an upstream (cone `evil`: python/ left out of the work tree, the top's files
    and the layer in) is still a tree the tool patches; its committed c128patch.toml was read and its layer stacked
    ("layers from .../c128patch.toml"), as a clone or as a linked work tree alike."""
    monkeypatch.delenv(ENV, raising=False)
    up = hostile_upstream(tmp_path)
    (up / "python" / "sglang" / "__init__.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "-C", str(up), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(up), "commit", "-qm", "upstream"], check=True)
    sparse = tmp_path / "sparse"
    if route == "clone":
        subprocess.run([*git, "clone", "-q", "--no-checkout", str(up), str(sparse)], check=True)
    else:
        subprocess.run([*git, "-C", str(up), "worktree", "add", "-q", "--no-checkout", str(sparse)], check=True)
    subprocess.run([*git, "-C", str(sparse), "sparse-checkout", "set", "evil"], check=True, capture_output=True)
    subprocess.run([*git, "-C", str(sparse), "checkout", "-q"], check=True)
    assert (sparse / CONFIG).is_file() and (sparse / "evil").is_dir() and not (sparse / "python").exists()
    assert lookup_layers((), cwd=sparse)[0] == () and lookup_layers((), cwd=sparse / "evil")[0] == ()
    monkeypatch.chdir(sparse / "evil")
    res = invoke("lint", "--offline", as_json=False)
    assert res.code == 0 and "layers from" not in res.err and "evil" not in res.err + res.text, (res.err, res.text)
    # one whose config the tool's git refuses (an include): still not read, and no verb is refused for it
    subprocess.run(["git", "-C", str(sparse), "config", "include.path", str(tmp_path / "other.cfg")], check=True)
    assert lookup_layers((), cwd=sparse / "evil")[0] == ()
    res = invoke("lint", "--offline", as_json=False)
    assert res.code == 0 and "layers from" not in res.err, res.err


def test_a_layer_folder_inside_a_tree_the_tool_patches_is_refused(tmp_path, monkeypatch):
    up = hostile_upstream(tmp_path)
    monkeypatch.setenv(ENV, str(up / "evil"))
    with pytest.raises(C128Error, match="a tree c128patch patches"):
        lookup_layers((), cwd=tmp_path)


def test_a_config_of_another_user_or_symlinked_is_refused_and_a_deeply_nested_one_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    (tmp_path / CONFIG).write_text('[layers]\npaths = []\n')
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path / CONFIG).st_uid + 1)
    with pytest.raises(C128Error, match="owned by another user"):
        lookup_layers((), cwd=tmp_path)
    monkeypatch.undo()
    monkeypatch.delenv(ENV, raising=False)
    (tmp_path / "mine").mkdir()  # a link in a shared folder to the operator's own config: its paths were read
    (tmp_path / "mine" / CONFIG).write_text('[layers]\npaths = ["layer"]\n')  # under the link's folder
    (tmp_path / "shared" / "work").mkdir(parents=True)
    (tmp_path / "shared" / CONFIG).symlink_to(tmp_path / "mine" / CONFIG)
    with pytest.raises(C128Error, match=f"{CONFIG} is a symlink"):
        lookup_layers((), cwd=tmp_path / "shared" / "work")
    (tmp_path / CONFIG).write_text("x = " + "[" * 20_000 + "]" * 20_000 + "\n")  # within MAX_CONFIG
    with pytest.raises(C128Error, match="nested too deeply") as exc:
        lookup_layers((), cwd=tmp_path)
    assert "\n" not in exc.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_config_in_a_folder_of_another_user_or_naming_a_layer_of_another_user_is_refused(tmp_path, monkeypatch):
    """Helper 95: our own c128patch.toml in a folder another user owns (they may swap the file), or naming a layer
    folder they own, was read: git's safe.directory rule is about the folder."""
    monkeypatch.delenv(ENV, raising=False)
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    (shared / CONFIG).write_text('[layers]\npaths = ["lay"]\n')
    (shared / "lay").mkdir()
    os.chown(shared, 65534, 65534)
    with pytest.raises(C128Error, match=f"{shared} is owned by another user"):
        lookup_layers((), cwd=shared / "sub")
    os.chown(shared, 0, 0)
    os.chown(shared / "lay", 65534, 65534)
    with pytest.raises(C128Error, match=r"names layer .*lay, owned by another user"):
        lookup_layers((), cwd=shared / "sub")
    os.chown(shared / "lay", 0, 0)
    assert lookup_layers((), cwd=shared / "sub")[0] == ((shared / "lay").resolve(),)


def test_a_config_in_a_repository_another_user_owns_is_refused_as_git_refuses_it(tmp_path, monkeypatch):
    """Helper 179: our own c128patch.toml in a folder of a repository whose top (or git dir) another user owns was
    read and its layer stacked, where git refuses the repository ("dubious ownership": safe.directory)."""
    monkeypatch.delenv(ENV, raising=False)
    repo = tmp_path / "repo"
    (repo / "sub" / "lay").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "sub" / CONFIG).write_text('[layers]\npaths = ["lay"]\n')
    for path in (repo, repo / ".git"):
        os.chown(path, 65534, 65534)
        with pytest.raises(C128Error, match=f"the repository {path} is owned by another user .*safe.directory"):
            lookup_layers((), cwd=repo / "sub")
        os.chown(path, 0, 0)
    assert lookup_layers((), cwd=repo / "sub")[0] == ((repo / "sub" / "lay").resolve(),)


def test_a_config_or_layer_folder_others_may_write_is_refused(tmp_path, monkeypatch):
    """Helper 134: a c128patch.toml writable by others (mode 666), or in a folder they may write (777, no sticky bit:
    they may swap the file), or naming a layer folder they may write, was read and its layers stacked."""
    monkeypatch.delenv(ENV, raising=False)
    (tmp_path / "op" / "lay").mkdir(parents=True)
    config = tmp_path / "op" / CONFIG
    config.write_text('[layers]\npaths = ["lay"]\n')
    for path, mode in ((config, 0o666), (config.parent, 0o777), (config.parent / "lay", 0o777)):
        old = path.stat().st_mode
        path.chmod(mode)
        with pytest.raises(C128Error, match="writable by others: not read") as exc:
            lookup_layers((), cwd=config.parent)
        assert "\n" not in exc.value.message
        # helper 155: the fix is a command that works as printed ("chmod go-w it" named no path)
        from support import printed_command, run_printed
        assert run_printed(printed_command(exc.value.message, "chmod ")).returncode == 0
        assert lookup_layers((), cwd=config.parent)[0] == ((config.parent / "lay").resolve(),)
        path.chmod(old)
    config.parent.chmod(0o1777)  # as /tmp: the sticky bit lets no other user replace the file
    assert lookup_layers((), cwd=config.parent)[0] == ((config.parent / "lay").resolve(),)


def test_a_layer_folder_the_env_names_too_long_to_look_at_is_one_line(tmp_path, monkeypatch):
    """Helper 168: `$C128PATCH_LAYERS` naming a folder with a 300-byte part (or a path past PATH_MAX) was OSError's
    "File name too long" traceback, from the check that no layer lies inside a tree the tool patches."""
    for value in ("a" * 300, "a/" * 2100 + "a"):
        monkeypatch.setenv(ENV, value)
        with pytest.raises(C128Error, match=r"from \$C128PATCH_LAYERS\) cannot be looked at \(File name too long\)"):
            lookup_layers((), cwd=tmp_path)


def test_a_config_naming_a_layer_through_a_folder_another_user_may_change_is_refused(tmp_path, monkeypatch):
    """Helper 168: only the config, its folder and the layer folder were held to the owner rule: a ``layers/`` between
    them that another user owns (or any user may write, no sticky bit) let them rename the layer away and put theirs
    in its place, and its layers were stacked. The printed fix works as printed."""
    from support import printed_command, run_printed

    monkeypatch.delenv(ENV, raising=False)
    op = tmp_path / "op"
    (op / "layers" / "team" / "lay").mkdir(parents=True)
    (op / CONFIG).write_text('[layers]\npaths = ["layers/team/lay"]\n')
    for how in ("owner", "mode"):
        for way in (op / "layers", op / "layers" / "team"):
            os.chown(way, 65534, 65534) if how == "owner" else way.chmod(0o777)
            with pytest.raises(C128Error, match=f"through {way}, (owned by another user|writable by others)") as exc:
                lookup_layers((), cwd=op)
            assert "\n" not in exc.value.message
            assert run_printed(printed_command(exc.value.message, "chown " if how == "owner" else "chmod ")) \
                .returncode == 0
            assert lookup_layers((), cwd=op)[0] == ((op / "layers" / "team" / "lay").resolve(),)
    (op / "layers").chmod(0o1777)  # as /tmp: the sticky bit lets no other user rename what it holds
    assert lookup_layers((), cwd=op)[0] == ((op / "layers" / "team" / "lay").resolve(),)


def test_one_printed_command_makes_a_layer_or_series_folder_others_may_write_readable(tmp_path, monkeypatch):
    """Helper 159: each refusal printed ``chmod go-w`` of the one path it met first (the folder, then its patches/,
    then series.toml...): pasted, the next run named the next; a layer of N files took N runs. The command now takes
    the folder whose every entry is held to the rule whole (``chmod -R go-w``)."""
    from c128patch.series.layers import owned_series
    from support import printed_command, run_printed

    monkeypatch.delenv(ENV, raising=False)
    config = tmp_path / "op" / CONFIG
    layer = config.parent / "lay"
    for folder in (layer, tmp_path / "ser"):
        (folder / "patches" / "sub").mkdir(parents=True)
        for name in ("series.toml", "a.patch", "sub/b.patch"):
            (folder / "patches" / name).write_text("")
        for path in (folder, *folder.rglob("*")):
            path.chmod(path.stat().st_mode | 0o002)
    config.write_text('[layers]\npaths = ["lay"]\n')
    with pytest.raises(C128Error, match="writable by others: not read") as exc:
        lookup_layers((), cwd=config.parent)
    assert run_printed(printed_command(exc.value.message, "chmod ")).returncode == 0
    assert lookup_layers((), cwd=config.parent)[0] == (layer.resolve(),)
    series = tmp_path / "ser"
    for fixed in range(2):  # the folder itself, then its patches/ whole
        with pytest.raises(C128Error, match="writable by others: not read") as exc:
            owned_series(series, "the apply journal")
        assert run_printed(printed_command(exc.value.message, "chmod ")).returncode == 0
    assert owned_series(series, "the apply journal") == series


def _config_naming_a_layer(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """(a c128patch.toml naming the layer folder ``lay`` beside it, its empty manifest); no $C128PATCH_LAYERS."""
    monkeypatch.delenv(ENV, raising=False)
    config = tmp_path / "op" / CONFIG
    manifest = config.parent / "lay" / "patches" / "series.toml"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("")
    config.write_text('[layers]\npaths = ["lay"]\n')
    return config, manifest


def test_what_a_config_named_layer_folder_holds_is_held_to_the_configs_rule(tmp_path, monkeypatch):
    """Helper 142: only the layer folder itself was checked: its ``patches/`` or ``patches/series.toml`` owned by
    another user, or writable by others, was read and stacked (that user chose the layer's patches)."""
    config, manifest = _config_naming_a_layer(tmp_path, monkeypatch)
    for path in (manifest, manifest.parent):
        old = path.stat().st_mode
        path.chmod(old | 0o002)
        with pytest.raises(C128Error, match=f"\\(its {path.relative_to(config.parent / 'lay')}\\), writable by others"):
            lookup_layers((), cwd=config.parent)
        path.chmod(old)
        if os.geteuid() == 0:
            os.chown(path, 12345, -1)
            with pytest.raises(C128Error, match="owned by another user \\(uid 12345\\): not read"):
                lookup_layers((), cwd=config.parent)
            os.chown(path, 0, -1)
    git_file = config.parent / "lay" / ".git" / "objects" / "ab"  # a layer kept in its own repository: git's folder
    git_file.parent.mkdir(parents=True)                           # is not what the tool reads
    git_file.write_text("")
    git_file.chmod(0o666)
    assert lookup_layers((), cwd=config.parent)[0] == ((config.parent / "lay").resolve(),)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's file is made only as root")
def test_a_layer_or_config_another_user_owns_is_refused_with_a_chown_that_works_as_printed(tmp_path, monkeypatch):
    """Helper 157: the refusal said "take it over (chown)", no command to run. It prints the one that makes the
    path the user's (root's to run: no other user may give a file away): the whole layer folder, only the config
    or the folder holding it (maybe a repository's top)."""
    from support import printed_command, run_printed

    config, manifest = _config_naming_a_layer(tmp_path, monkeypatch)
    for path, recursive in ((manifest, True), (config, False)):
        os.chown(path, 12345, -1)
        with pytest.raises(C128Error, match="owned by another user \\(uid 12345\\)") as exc:
            lookup_layers((), cwd=config.parent)
        command = printed_command(exc.value.message, "chown")
        assert command.startswith("chown -R " if recursive else f"chown {os.getuid()} "), command
        assert run_printed(command).returncode == 0 and path.stat().st_uid == os.getuid(), command
    assert lookup_layers((), cwd=config.parent)[0] == ((config.parent / "lay").resolve(),)


def test_a_layer_folder_a_trees_record_or_a_journal_names_is_held_to_the_configs_rule(tmp_path):
    """Helper 137: the layer folders a tree's git dir records (``layers.json``, which every verb in a layered tree
    loads) or an apply/rebase journal names had no owner check and no others-may-write check, unlike those
    c128patch.toml names: a folder another user may write (777), or owns, was stacked. Now the same rule."""
    from c128patch.ops.treestate import c128_state_dir, tree_layers
    from c128patch.series.layers import recorded_stack
    from c128patch.series.manifest import MANIFEST
    from c128patch.series.provenance import PROVENANCE_PATH

    tree, lay = tmp_path / "sglang", tmp_path / "lay"
    (tree / PROVENANCE_PATH).parent.mkdir(parents=True)
    (tree / PROVENANCE_PATH).write_text(json.dumps({"layers": [{"name": "acme", "version": "1", "digest": "0" * 64}]}))
    (lay / MANIFEST).parent.mkdir(parents=True)
    (lay / MANIFEST).write_text("")
    git = Git(worktree=tree)
    git.run("init", "-q")
    c128_state_dir(git).mkdir()
    record = c128_state_dir(git) / "layers.json"
    record.write_text(json.dumps([str(lay)]))
    journal = c128_state_dir(git) / "apply.json"
    assert tree_layers(git) == (lay,)
    changes = [(lambda: lay.chmod(0o777), lambda: lay.chmod(0o755), "writable by others: not read")]
    if os.geteuid() == 0:
        changes.append((lambda: os.chown(lay, 65534, 65534), lambda: os.chown(lay, 0, 0), "owned by another user"))
    for change, undo, why in changes:
        change()
        with pytest.raises(C128Error, match=rf"^{record} names layer {lay}, {why}") as exc:
            tree_layers(git)
        assert "\n" not in exc.value.message
        with pytest.raises(C128Error, match=rf"^{journal} names layer {lay}, {why}"):
            recorded_stack(str(REPO_ROOT), [str(lay)], journal)
        undo()


def test_a_series_folder_a_journal_names_is_held_to_the_layer_folders_rule(tmp_path, monkeypatch):
    """Helper 156: an apply or rebase journal's `series_root` was loaded whoever owned it (only its layer folders were
    owner-checked): a series folder another user may write, or owns, chose what `apply --continue` applies. Now the
    layer folders' rule, but for the tool's own series and one given with --series."""
    from c128patch.ops.treestate import c128_state_dir
    from c128patch.series.layers import recorded_stack
    from c128patch.series.manifest import default_series_root

    tree, ours = tmp_path / "sglang", tmp_path / "ours"
    for part in ("patches", "overlay"):
        shutil.copytree(REPO_ROOT / part, ours / part)
    git = Git(worktree=tree)
    tree.mkdir()
    git.run("init", "-q")
    c128_state_dir(git).mkdir()
    journal = c128_state_dir(git) / "apply.json"
    assert recorded_stack(str(ours), [], journal).root == ours.resolve()
    changes = [(ours, lambda p: p.chmod(0o777), lambda p: p.chmod(0o755), "writable by others: not read"),
               (ours / "patches", lambda p: p.chmod(0o777), lambda p: p.chmod(0o755), "writable by others: not read")]
    if os.geteuid() == 0:
        changes += [(p, lambda p: os.chown(p, 65534, 65534), lambda p: os.chown(p, 0, 0), "owned by another user")
                    for p in (ours, ours / "patches" / "series.toml")]
    for path, change, undo, why in changes:
        change(path)
        at = "" if path == ours else rf" \(its {path.relative_to(ours)}\)"
        with pytest.raises(C128Error, match=rf"^{journal} names series {ours}{at}, {why}.*--series$") as exc:
            recorded_stack(str(ours), [], journal)
        assert "\n" not in exc.value.message
        assert recorded_stack(str(ours), [], journal, series_given=True).root == ours.resolve()
        with monkeypatch.context() as m:  # the tool's own series, installed by another user (root): read
            m.setattr("c128patch.series.layers.default_series_root", lambda: ours)
            assert recorded_stack(str(ours), [], journal).root == ours.resolve()
        undo(path)
    assert recorded_stack(str(default_series_root()), [], journal).root == default_series_root().resolve()


def test_an_overlay_source_a_journals_series_names_outside_its_held_parts_is_held_too(tmp_path):
    """Helper 159: ``owned_series`` checked the folder and its patches/, csrc/, overlay/, but an overlay entry's
    ``source`` may be any file of the folder (``extra/x.py``): one another user may write, or owns, in a folder others
    may write, was applied by ``apply --continue``. Each overlay source and the folders on its way are held too."""
    from c128patch.ops.treestate import c128_state_dir
    from c128patch.series.layers import recorded_stack

    ours, tree = tmp_path / "ours", tmp_path / "sglang"
    (ours / "patches").mkdir(parents=True)
    (ours / "extra").mkdir()
    (ours / "extra" / "x.py").write_text("x = 1\n")
    (ours / "patches" / "series.toml").write_text(
        '[series]\nname = "mine"\nversion = "1"\nbase = "v0.5.23"\n\n[[entries]]\nname = "ov"\nkind = "overlay"\n'
        'why = "x"\nsource = "extra/x.py"\ntarget = "python/sglang/x.py"\n')
    tree.mkdir()
    git = Git(worktree=tree)
    git.run("init", "-q")
    c128_state_dir(git).mkdir()
    journal = c128_state_dir(git) / "apply.json"
    assert recorded_stack(str(ours), [], journal).root == ours.resolve()
    for path in (ours / "extra", ours / "extra" / "x.py"):
        path.chmod(path.stat().st_mode | 0o002)
        with pytest.raises(C128Error, match=rf"\(its {path.relative_to(ours)}\), writable by others: not read"):
            recorded_stack(str(ours), [], journal)
        assert recorded_stack(str(ours), [], journal, series_given=True).root == ours.resolve()
        path.chmod(path.stat().st_mode & ~0o002)


def test_a_config_in_a_bare_repository_given_as_a_file_url_is_never_read(tmp_path, monkeypatch):
    """Helper 153: `--repo file:///R` from inside the bare repository R read R's c128patch.toml (and stacked its
    layer): only a --repo PATH was excluded from the search, and a bare repository has no `.git` to stop it."""
    monkeypatch.delenv(ENV, raising=False)
    bare = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    (bare / "evil" / "patches").mkdir(parents=True)
    (bare / "evil" / "patches" / "series.toml").write_text("bogus\n")
    (bare / CONFIG).write_text('[layers]\npaths = ["evil"]\n')
    monkeypatch.chdir(bare)
    for given in (str(bare), f"file://{bare}"):
        res = invoke("lint", "--offline", "--repo", given, as_json=False)
        assert res.code == 0 and "layers from" not in res.err and "evil" not in res.err + res.text, (given, res.err)


def test_a_config_in_a_work_tree_whose_git_dir_is_given_as_repo_is_never_read(tmp_path, monkeypatch):
    """Helper 163: `--repo R/.git` (or `.git` from inside R, or `file://R/.git`) names the repository R by its git dir:
    only that folder was excluded from the search, so R's committed c128patch.toml (a checked-out branch without
    python/sglang: nothing said R was a tree the tool patches) was read and its layer stacked ("layers from
    R/c128patch.toml")."""
    monkeypatch.delenv(ENV, raising=False)
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "evil" / "patches").mkdir(parents=True)
    (repo / "evil" / "patches" / "series.toml").write_text("bogus\n")
    (repo / CONFIG).write_text('[layers]\npaths = ["evil"]\n')
    monkeypatch.chdir(repo)
    for given in (".git", str(repo / ".git"), f"file://{repo}/.git"):
        res = invoke("lint", "--offline", "--repo", given, as_json=False)
        assert res.code == 0 and "layers from" not in res.err and "evil" not in res.err + res.text, (given, res.err)


def test_the_config_search_stops_at_a_bare_repositorys_root_as_at_a_work_trees(tmp_path, monkeypatch):
    """Helper 156: from inside a bare repository no verb was pointed at (its refs/, its root) the c128patch.toml
    search went on above it, stopping only at a `.git`: a config beyond the repository was read where git's own
    discovery stops (a git dir: HEAD, objects/, refs/). Now a bare repository's root ends the search too."""
    monkeypatch.delenv(ENV, raising=False)
    (tmp_path / "lay" / "patches").mkdir(parents=True)
    (tmp_path / "lay" / "patches" / "series.toml").write_text("")
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["lay"]\n')
    bare, plain = tmp_path / "r.git", tmp_path / "plain" / "refs"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    plain.mkdir(parents=True)
    assert lookup_layers(cwd=plain) == ((tmp_path / "lay",), str(tmp_path / CONFIG))  # no repository: read
    for start in (bare, bare / "refs" / "heads"):
        assert lookup_layers(cwd=start) == ((), ""), start
    (bare / CONFIG).write_text("[layers]\npaths = []\n")  # the repository's own root is its top, as a work tree's
    assert lookup_layers(cwd=bare / "refs") == ((), str(bare / CONFIG))


def test_a_bare_repository_whose_head_is_a_symlink_stops_the_config_search_and_is_excluded(tmp_path, monkeypatch,
                                                                                            sglang_release_repo):
    """Helper 159: a bare repository whose HEAD is a symlink (``core.preferSymlinkRefs``, to a branch with no commit
    yet) is a repository to git, but not to the search (HEAD must be a file): from inside it the config above was read,
    and ``check --repo R`` run from inside R read R's own c128patch.toml and stacked its layer."""
    monkeypatch.delenv(ENV, raising=False)
    bare = tmp_path / "r.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(sglang_release_repo), str(bare)], check=True)
    (bare / "HEAD").unlink()
    (bare / "HEAD").symlink_to("refs/heads/none-yet")
    for folder in (tmp_path, bare):
        (folder / "lay" / "patches").mkdir(parents=True)
        (folder / "lay" / "patches" / "series.toml").write_text('[series]\nname = "lay"\nversion = "1"\n'
                                                                'base = "v0.5.23"\n')
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["lay"]\n')
    assert lookup_layers(cwd=bare / "refs") == ((), "")  # the config above the repository: not read
    (bare / CONFIG).write_text('[layers]\npaths = ["lay"]\n')
    monkeypatch.chdir(bare / "refs")
    res = invoke("check", "--repo", bare, "--sglang-rev", "v0.5.23", as_json=False)
    assert res.code == 0 and f"layers from {bare / CONFIG}" not in res.err, res.err  # (the one above: the operator's)


def test_apply_continue_and_rebase_onto_read_no_config_of_the_tree_they_were_pointed_at(tmp_path, monkeypatch):
    """Helper 137: `apply --continue --series DIR` and rebase's series loading called ``get_series``, which read
    c128patch.toml from the current folder excluding neither the tree nor the repository (`rebase --onto` looked
    the config up again where ``load_stack``, excluding them, had found none): run in a tree without upstream's
    layout, its own config's layer was loaded. Now both take the stack ``load_stack`` finds (rule 2)."""
    monkeypatch.delenv(ENV, raising=False)
    tree = tmp_path / "t"
    (tree / "evil" / "patches").mkdir(parents=True)
    (tree / "evil" / "patches" / "series.toml").write_text("bogus\n")
    (tree / CONFIG).write_text('[layers]\npaths = ["evil"]\n')
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    monkeypatch.chdir(tree)
    for args, said in ((["apply", "--continue", "--series", REPO_ROOT, "--tree", tree], "no c128patch apply is in"),
                       (["rebase", "--onto", "v0.5.22", "--tree", tree], "no c128patch series is applied in")):
        line = refused(args, tree)
        assert said in line and "evil" not in line, line


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_layer_folder_a_config_or_the_env_names_that_is_no_folder_is_said_as_such(tmp_path, monkeypatch, kind):
    """Helper 163: a c128patch.toml (or $C128PATCH_LAYERS) naming a regular file or a FIFO as a layer folder was "no
    layer at X: no patches/series.toml (make one with c128patch layer new X --name NAME)", a fix that fails as
    printed ("Directory X is a file", "Not a directory"); --layer said what it was. Now every way says it."""
    monkeypatch.delenv(ENV, raising=False)
    top = tmp_path / "work"
    top.mkdir()
    (top / "notalayer").write_text("x") if kind == "file" else os.mkfifo(top / "notalayer")
    (top / CONFIG).write_text('[layers]\npaths = ["notalayer"]\n')
    monkeypatch.chdir(top)
    what = "a regular file" if kind == "file" else "a FIFO"
    line = refused(["lint", "--offline"], contains=f"layer folder {top / 'notalayer'} is {what}, not a folder")
    assert "layer new" not in line
    (top / CONFIG).unlink()
    monkeypatch.setenv(ENV, "notalayer")
    refused(["lint", "--offline"], contains=f"is {what}, not a folder")


@pytest.mark.parametrize("spelling", [".git", ".GIT", ".git.", "git~1"])
def test_a_layer_folder_inside_gits_own_folder_is_refused_in_any_spelling(tmp_path, monkeypatch, spelling):
    """Helper 163: ``load_layer`` refuses a layer folder inside a git dir (``R/.git/L``: git's own files, which a
    hook or a config there could have written), in any spelling a file system may fold to it, but no test held it: with
    the check taken out, every layer test still passed. --layer and $C128PATCH_LAYERS alike, one line."""
    monkeypatch.delenv(ENV, raising=False)
    layer = series_folder(tmp_path / "r" / spelling / "L")
    refused(["lint", "--offline", "--layer", layer], contains=f"unsafe layer folder {layer}: it is inside git's own")
    monkeypatch.setenv(ENV, str(layer))
    refused(["lint", "--offline"], contains="it is inside git's own folder")


def test_a_huge_config_or_one_naming_a_folder_twice_is_one_line_at_once(tmp_path, monkeypatch):
    """Helper 134: a 10 MB c128patch.toml naming one layer 2,000,000 times ran for many minutes (each loaded);
    $C128PATCH_LAYERS naming one twice loaded it twice."""
    monkeypatch.delenv(ENV, raising=False)
    (tmp_path / "lay").mkdir()
    (tmp_path / CONFIG).write_text("[layers]\npaths = [" + '"lay",' * 2_000_000 + "]\n")
    started = time.monotonic()
    with pytest.raises(C128Error, match="over 64 KiB"):
        lookup_layers((), cwd=tmp_path)
    assert time.monotonic() - started < 5
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["lay", "lay"]\n')
    with pytest.raises(C128Error, match="is named twice"):
        lookup_layers((), cwd=tmp_path)
    monkeypatch.setenv(ENV, f"lay{os.pathsep}{os.pathsep}{tmp_path / 'lay'}")
    with pytest.raises(C128Error, match=f"lay \\(from \\${ENV}\\) is named twice"):
        lookup_layers((), cwd=tmp_path)


# ------------------------------------------------------------------------------------------ item 4: forged trailers
@pytest.mark.parametrize("spelling", ["c128patch-entry: ", "C128patch-Entry : ", "C128PATCH-ENTRY\t: "])
def test_a_layer_cannot_claim_one_of_our_entries_in_any_spelling(tmp_path, spelling):
    data = f"From x\nSubject: [PATCH] x\n\n{spelling}c128-dspark-online-env\n---\n".encode()
    layer = series_folder(tmp_path / "layer")
    (layer / "patches" / "0001-x.patch").write_bytes(data)
    with (layer / "patches" / "series.toml").open("a") as fh:
        fh.write('\n[[entries]]\nname = "x"\nkind = "patch"\nfile = "0001-x.patch"\nwhy = "w"\nbase = "v0.5.23"\n')
    with pytest.raises(C128Error, match="names its own entry only"):
        stack(load_series(REPO_ROOT), [layer])
    for verb in (["lint", "--offline"], ["check", "--sglang-rev", "v0.5.23"],
                 ["apply", "--sglang-rev", "v0.5.23", "--tree", tmp_path / "tree"]):
        refused([*verb, "--layer", layer], contains="names its own entry only")
    assert not (tmp_path / "tree").exists()


def test_an_entry_trailer_indented_under_the_gate_claims_nothing(tmp_path):
    """Helper 179: `` C128patch-Entry: <ours>`` on the line after the layer's gate trailer (one blank before it) is
    that trailer's continuation to git, so the gate's value, not an entry trailer: it passes lint, and the commit apply
    makes carries the layer's own entry only (what ``rebase``, ``refresh`` and ``status`` read), never ours."""
    from c128patch.ops.replay import branch_commits

    layer = tmp_path / "acme"
    shutil.copytree(REPO_ROOT / "docs" / "examples" / "acme-layer", layer)
    patch = layer / "patches" / "0001-acme-sps-env.patch"
    old = hashlib.sha256(patch.read_bytes()).hexdigest()
    patch.write_text(patch.read_text().replace("C128patch-Entry: acme/acme-sps-env",
                                               " C128patch-Entry: c128-dspark-online-env"))
    manifest = layer / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace(old, hashlib.sha256(patch.read_bytes()).hexdigest()))
    assert invoke("lint", "--offline", "--layer", layer).code == 0
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--layer", layer, "--tree", tmp_path / "tree").code == 0
    entries = [c.entry for c in branch_commits(Git(worktree=tmp_path / "tree"), "v0.5.23")]
    assert "acme/acme-sps-env" in entries and entries.count("c128-dspark-online-env") == 1, entries


def test_a_folded_entry_trailer_is_read_as_git_reads_it_whole(tmp_path):
    """helper 167: ``C128patch-Entry: site/x`` continued on a line starting with a blank is one trailer to git (its
    value both lines); read as its first line only it passed ``lint`` (0 errors), and ``apply`` read the branch's
    commits a line each: the continuation split the record, a ValueError traceback after the layer's commit."""
    data = b"From x\nSubject: [PATCH] x\n\nC128patch-Entry: site/x\n c128-dspark-online-env\n---\n"
    layer = series_folder(tmp_path / "layer")
    (layer / "patches" / "0001-x.patch").write_bytes(data)
    with (layer / "patches" / "series.toml").open("a") as fh:
        fh.write('\n[[entries]]\nname = "x"\nkind = "patch"\nfile = "0001-x.patch"\nwhy = "w"\nbase = "v0.5.23"\n')
    for verb in (["lint", "--offline"], ["check", "--sglang-rev", "v0.5.23"],
                 ["apply", "--sglang-rev", "v0.5.23", "--tree", tmp_path / "tree"]):
        refused([*verb, "--layer", layer], contains="carries 'C128patch-Entry: site/x c128-dspark-online-env'")
    assert not (tmp_path / "tree").exists()


def test_a_commit_with_a_folded_entry_trailer_is_one_branch_commit(tmp_path):
    """The reader of a patched branch's commits takes a folded trailer unfolded (a commit of the user's own on the
    branch, which ``status`` and ``rebase`` read): one record per commit, no traceback."""
    from c128patch.ops.replay import branch_commits

    git = Git(tmp_path)
    git.run("init", "-q")
    ident = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    git.run(*ident, "commit", "-q", "--allow-empty", "-m", "base")
    git.run(*ident, "commit", "-q", "--allow-empty", "-m", "mine\n\nC128patch-Entry: site/x\n  folded on\n")
    [commit] = branch_commits(git, "HEAD~1")
    assert (commit.entry, commit.subject) == ("site/x folded on", "mine")


# --------------------------------------------------------------------------------------- item 5: the cache is checked
def fake_wheel(folder: Path, version: str, text: str = "") -> Path:
    wheel = folder / f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/__init__.py", text or f"__version__ = '{version}'\n")
        zf.writestr("sglang/srt/environ.py", "X = 1\n")
        zf.writestr(f"sglang-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return wheel


@pytest.fixture
def fake_releases(tmp_path, monkeypatch):
    from c128patch.upstream.releases import DEFAULT_RELEASES

    house = tmp_path / "house"
    house.mkdir()
    wheels = {v: fake_wheel(house, v) for v in DEFAULT_RELEASES}
    monkeypatch.setenv("C128PATCH_WHEELHOUSE", str(house))
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    return wheels


def test_a_moved_tag_in_the_release_cache_is_refused_saying_how_to_rebuild(fake_releases, tmp_path):
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    assert ReleaseHistory().ensure() == root  # as built: accepted
    subprocess.run(["git", "--git-dir", str(root), "tag", "-f", "v0.5.23", "v0.5.22"], check=True, capture_output=True)
    with pytest.raises(C128Error, match="tag v0.5.23 does not name the sources") as exc:
        ReleaseHistory().ensure()
    assert f"rm -rf {root}" in exc.value.message
    (root / "c128patch-trees").unlink()  # no record: the wheel says what the tag must name
    with pytest.raises(C128Error, match="tag v0.5.23 does not name the sources"):
        ReleaseHistory().ensure()


@pytest.mark.parametrize("fresh", [False, True], ids=["built", "record-lost"])
def test_an_annotated_release_tag_at_its_commit_is_accepted_and_one_elsewhere_refused(fake_releases, tmp_path, fresh):
    """Helper 187: an annotated tag at the release's own commit was refused as "a moved tag" (for-each-ref's
    `%(tree)` is empty for a tag object). It is peeled once; one at another commit, a tag of a tag, one of a tree
    or of a blob stay refused, each saying how to rebuild."""
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    git = ["git", "-c", "user.name=x", "-c", "user.email=x@x.invalid", "-c", "advice.nestedTag=false",
           "--git-dir", str(root)]
    out = lambda *a: subprocess.run([*git, *a], check=True, capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = out("rev-parse", "v0.5.23^{commit}")
    out("tag", "-f", "-a", "-m", "annotated", "v0.5.23", commit)
    if fresh:
        (root / "c128patch-trees").unlink()
    assert ReleaseHistory().ensure() == root
    blob = out("rev-parse", f"{commit}:python/sglang/__init__.py")
    out("tag", "-f", "-a", "-m", "inner", "inner", commit)
    for target, why in (("v0.5.22", "does not name the sources"),
                        ("inner", r"does not name a commit \(it names a tag:"),
                        (f"{commit}^{{tree}}", r"does not name a commit \(it names a tree:"),
                        (blob, r"does not name a commit \(it names a blob:")):
        out("tag", "-f", "-a", "-m", "x", "v0.5.23", target)
        with pytest.raises(C128Error, match=f"tag v0.5.23 {why}") as exc:
            ReleaseHistory().ensure()
        assert f"rm -rf {root}" in exc.value.message
    out("tag", "-f", "v0.5.23", f"{commit}^{{tree}}")  # a lightweight tag of a tree
    with pytest.raises(C128Error, match="tag v0.5.23 does not name a commit"):
        ReleaseHistory().ensure()


@pytest.mark.parametrize("name, make", [("HEAD", "fifo"), ("config", "fifo"), ("packed-refs", "fifo"),
                                        ("refs/tags/v0.5.23", "fifo"), ("refs/tags/v0.5.23", "link"), ("refs", "link")])
def test_a_fifo_or_link_among_the_release_caches_refs_and_config_is_one_line_never_a_hang(fake_releases, tmp_path,
                                                                                         name, make):
    """Helper 187: a FIFO at the cache's HEAD, config, packed-refs or a tag's ref made git wait forever in the cache's
    first check (`check` hung with no word); a link there was followed out of the cache. Each is one line saying how
    to rebuild, found by lstat and scandir alone."""
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    path = root / name
    if name == "packed-refs" and not path.exists():
        subprocess.run(["git", "--git-dir", str(root), "pack-refs", "--all"], check=True)
    moved = path.rename(tmp_path / "moved")
    os.mkfifo(path) if make == "fifo" else path.symlink_to(moved)
    said = "a FIFO" if make == "fifo" else "a link"
    with pytest.raises(C128Error, match=f"the release cache {re.escape(str(root))}: {name} is {said}, not a") as exc:
        ReleaseHistory().ensure()
    assert f"rm -rf {root}" in exc.value.message and "\n" not in exc.value.message
    shutil.rmtree(root)  # the fix printed
    assert ReleaseHistory().ensure() == root


def test_a_tag_moved_with_its_tree_record_is_refused_by_the_version_its_sources_say(fake_releases, tmp_path):
    """Helper 177: tag v0.5.23 moved to 0.5.22's commit and its line in `c128patch-trees` changed to match (the wheel
    and its sum untouched): the tag matched the record, and `check`/`apply --sglang-rev v0.5.23` built on 0.5.22's
    sources, `status` saying "identical ... on v0.5.23". The sources' `_version.py` must say the tag's release."""
    from c128patch.upstream.releases import DEFAULT_RELEASES, ReleaseHistory

    for v, wheel in fake_releases.items():  # a `_version.py` as the real wheels hold (setuptools-scm's)
        with zipfile.ZipFile(wheel, "a") as zf:
            zf.writestr("sglang/_version.py", f"version: str\n__version__: str\n__version__ = version = '{v}'\n")
    root = ReleaseHistory().ensure()
    assert ReleaseHistory().ensure() == root  # as built: accepted
    older = DEFAULT_RELEASES[-2]
    subprocess.run(["git", "--git-dir", str(root), "tag", "-f", "v0.5.23", f"v{older}"], check=True,
                   capture_output=True)
    tree = subprocess.run(["git", "--git-dir", str(root), "rev-parse", f"v{older}^{{tree}}"], check=True,
                          capture_output=True, text=True).stdout.strip()
    record = root / "c128patch-trees"
    record.write_text(re.sub(r"(?m)^0\.5\.23 .*$", f"0.5.23 {tree}", record.read_text()))
    with pytest.raises(C128Error, match=rf"tag v0\.5\.23 names the sources of sglang {re.escape(older)} \(its "
                                        r"python/sglang/_version\.py\), not of 0\.5\.23") as exc:
        ReleaseHistory().ensure()
    assert f"rm -rf {root}" in exc.value.message
    shutil.rmtree(root)  # the fix printed: the next run imports the releases again
    assert ReleaseHistory().ensure() == root


def test_the_release_caches_tags_name_the_trees_the_tool_pins(sglang_release_repo):
    """The trees ``KNOWN_TREES`` pins are the ones an import of PyPI's wheels gives (in CI, a cold cache built here)."""
    from c128patch.upstream.releases import DEFAULT_RELEASES, KNOWN_TREES, tag_for

    assert set(KNOWN_TREES) == set(DEFAULT_RELEASES)
    for v in DEFAULT_RELEASES:
        tree = subprocess.run(["git", "--git-dir", str(sglang_release_repo), "rev-parse", f"{tag_for(v)}^{{tree}}"],
                              check=True, capture_output=True, text=True).stdout.strip()
        assert tree == KNOWN_TREES[v], v


def test_a_tag_moved_to_an_edited_commit_with_a_forged_record_is_refused_by_the_pinned_trees(
        fake_releases, tmp_path, monkeypatch):
    """Helper 181: tag v0.5.23 moved to a hand-edited commit (its `_version.py` still 0.5.23's) and its line in
    `c128patch-trees` forged to match: every check of the cache passed, `apply` said "identical". The tool pins the
    trees PyPI's wheels give (here: the stand-in wheels' trees), which nothing in the cache can change; an operator's
    wheelhouse is theirs."""
    from c128patch.upstream import releases
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    git = ["git", "--git-dir", str(root)]
    trees = dict(line.split() for line in (root / "c128patch-trees").read_text().splitlines())
    monkeypatch.setattr(releases, "KNOWN_TREES", trees)
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "index"), "GIT_AUTHOR_NAME": "x", "GIT_COMMITTER_NAME": "x",
           "GIT_AUTHOR_EMAIL": "x@x.invalid", "GIT_COMMITTER_EMAIL": "x@x.invalid"}
    out = lambda *a, **kw: subprocess.run([*git, *a], check=True, capture_output=True, text=True,  # noqa: E731
                                          env=env, **kw).stdout.strip()
    out("read-tree", "v0.5.23")
    blob = out("hash-object", "-w", "--stdin", input="X = 1  # edited\n")
    out("update-index", "--cacheinfo", f"100644,{blob},python/sglang/srt/environ.py")
    edited = out("write-tree")
    out("tag", "-f", "v0.5.23", out("commit-tree", edited, "-p", "v0.5.23", "-m", "edited"))
    record = root / "c128patch-trees"
    record.write_text(re.sub(r"(?m)^0\.5\.23 .*$", f"0.5.23 {edited}", record.read_text()))
    assert ReleaseHistory().ensure() == root  # the operator's wheelhouse: their record
    monkeypatch.delenv("C128PATCH_WHEELHOUSE")
    with pytest.raises(C128Error, match="tag v0.5.23 does not name the sources of the sglang 0.5.23 release wheel"):
        ReleaseHistory().ensure()


def test_a_ref_shadowing_a_release_tag_in_the_cache_is_refused_saying_how_to_rebuild(fake_releases, tmp_path):
    """Helper 148: `refs/v0.5.23` (the tag untouched) wins over `refs/tags/v0.5.23` where git resolves `v0.5.23`:
    `apply --sglang-rev v0.5.23` built on 0.5.22's tree and said "identical ... on v0.5.23"; a `refs/replace/` ref
    swaps the commit under every name. Any ref the import never makes is refused, saying how to rebuild."""
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    for ref in ("refs/v0.5.23", "refs/replace/" + "0" * 40):
        subprocess.run(["git", "--git-dir", str(root), "update-ref", ref, "refs/tags/v0.5.22"], check=True)
        with pytest.raises(C128Error, match=f"holds the ref '{ref}', which no import makes") as exc:
            ReleaseHistory().ensure()
        assert f"rm -rf {root}" in exc.value.message
        subprocess.run(["git", "--git-dir", str(root), "update-ref", "-d", ref], check=True)
    assert ReleaseHistory().ensure() == root


@pytest.mark.parametrize("content", ["sha", "symref"])
def test_a_file_at_the_top_of_the_cache_shadowing_a_release_tag_is_refused(fake_releases, tmp_path, content):
    """Helper 158: a file ``v0.5.23`` at the top of the cache's git dir (a commit id, or ``ref: refs/tags/v0.5.22``)
    is no ref ``for-each-ref`` lists, yet git resolves ``v0.5.23`` to it before ``refs/tags/v0.5.23``: `apply
    --sglang-rev v0.5.23` built on 0.5.22's commit and said "c128/v0.5.23 = v0.5.23 + series ... identical to a fresh
    apply ... on v0.5.23". Each release's tag name must resolve to its tag's commit, else one line saying how to
    rebuild."""
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    older = subprocess.run(["git", "--git-dir", str(root), "rev-parse", "v0.5.22"], check=True, capture_output=True,
                           text=True).stdout.strip()
    (root / "v0.5.23").write_text((older if content == "sha" else "ref: refs/tags/v0.5.22") + "\n")
    with pytest.raises(C128Error, match="v0.5.23 resolves to .* shadows the tag") as exc:
        ReleaseHistory().ensure()
    assert f"rm -rf {root}" in exc.value.message
    refused(["check", "--sglang-rev", "v0.5.23"], contains="shadows the tag")
    (root / "v0.5.23").unlink()
    assert ReleaseHistory().ensure() == root


def fake_release_cache(monkeypatch, tmp_path: Path) -> tuple[Path, Path]:
    """A release cache under ``tmp_path`` of fake release wheels (``fake_wheel``): its wheels folder and 0.5.23's."""
    from c128patch.upstream import releases
    from c128patch.upstream.releases import DEFAULT_RELEASES

    monkeypatch.delenv("C128PATCH_WHEELHOUSE", raising=False)
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(releases, "KNOWN_TREES", {})  # stand-in wheels: the trees pinned are PyPI's wheels', not theirs
    folder = tmp_path / "cache" / "wheels"
    folder.mkdir(parents=True)
    return folder, {v: fake_wheel(folder, v) for v in DEFAULT_RELEASES}["0.5.23"]



def test_a_changed_wheel_in_the_cache_is_refused_before_it_is_patched_or_trusted(tmp_path, monkeypatch):
    """Helper 93: a payload added to the cached release wheel (its RECORD fixed) went into `wheel --from-release`'s
    output and `verify-wheel` called that "authentic". A cache wheel is checked against its bytes as downloaded and,
    with that record gone too, against the tree the release history recorded for it (cache-mechanics stand-in
    wheels, as the tests above)."""
    from c128patch.upstream.releases import ReleaseHistory, cached_wheel

    folder, wheel = fake_release_cache(monkeypatch, tmp_path)
    ReleaseHistory().ensure()  # records each release wheel's tree
    assert cached_wheel(wheel) == wheel and (folder / "SHA256SUMS").is_file()  # first use: its bytes recorded
    fake_wheel(folder, "0.5.23", text="import os\nos.system('touch /tmp/PWNED')\n")
    with pytest.raises(C128Error, match="changed since it was downloaded") as exc:
        cached_wheel(wheel)
    assert f"rm {wheel}" in exc.value.message
    run = invoke("wheel", "--from-release", "0.5.23", "-o", str(tmp_path / "out"), as_json=False)
    assert run.code == 2 and "changed since it was downloaded" in run.err and not (tmp_path / "out").exists(), run.err
    (folder / "SHA256SUMS").unlink()  # that record gone too: the history says what the wheel must give
    with pytest.raises(C128Error, match="does not give the sources the release history recorded for sglang 0.5.23"):
        cached_wheel(wheel)


def test_a_cached_wheel_renamed_to_another_release_is_refused_naming_the_cache_and_the_fix(tmp_path, monkeypatch):
    """Helper 172: the cache's 0.5.21 wheel renamed 0.5.22, its SHA256SUMS and c128patch-trees lines gone: `wheel
    --from-release 0.5.22` said only "METADATA says version 0.5.21, the file name 0.5.22", naming neither the cache
    nor a fix. One line naming the cached file and the fix (rm it: it is downloaded again)."""
    from c128patch.upstream.releases import cached_wheel

    folder, _ = fake_release_cache(monkeypatch, tmp_path)
    renamed = folder / "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(renamed, "w") as zf:  # 0.5.21's, under 0.5.22's name
        zf.writestr("sglang/__init__.py", "__version__ = '0.5.21'\n")
        zf.writestr("sglang-0.5.21.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.21\n")
        zf.writestr("sglang-0.5.21.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    with pytest.raises(C128Error, match="says version 0.5.21 in its METADATA, not the 0.5.22 of its name") as exc:
        cached_wheel(renamed)
    assert f"in the cache {folder}" in exc.value.message and f"rm {renamed}" in exc.value.message
    assert "\n" not in exc.value.message and not (folder / "SHA256SUMS").exists()  # (not recorded as downloaded)
    run = invoke("wheel", "--from-release", "0.5.22", "-o", str(tmp_path / "out"), as_json=False)
    assert run.code == 2 and f"rm {renamed}" in run.err and not (tmp_path / "out").exists(), run.err


def test_a_swapped_non_canonical_cached_wheel_with_its_sum_replaced_is_refused(tmp_path, monkeypatch):
    """Helper 161: the cache's cp312 wheel (README's production path: wheel --from-release X --python-tag cp312)
    swapped for one with a payload, its SHA256SUMS line replaced to match, went into the patched wheel: only the
    canonical cp311 wheel was checked against the tree the release history recorded. Every wheel of a release with a
    record gives its sources (executable bits aside: a release's wheels differ in them)."""
    from c128patch.upstream.releases import ReleaseHistory, _record_sum, cached_wheel, file_sha256

    folder, wheel = fake_release_cache(monkeypatch, tmp_path)
    ReleaseHistory().ensure()  # records each release wheel's tree (from the canonical cp311 wheels)
    other = folder / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(wheel) as zi, zipfile.ZipFile(other, "w") as zo:  # the same sources, one made executable
        for info in zi.infolist():
            if info.filename == "sglang/srt/environ.py":
                info.external_attr = 0o100755 << 16
            zo.writestr(info, zi.read(info))
    assert cached_wheel(other) == other  # the release's own: taken, its bytes recorded
    with zipfile.ZipFile(other, "w") as zo:
        zo.writestr("sglang/__init__.py", "import os\nos.system('touch /tmp/PWNED')\n")
        zo.writestr("sglang/srt/environ.py", "X = 1\n")
        zo.writestr("sglang-0.5.23.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    _record_sum(folder, other.name, file_sha256(other))  # the record replaced with it
    with pytest.raises(C128Error, match="does not give the sources the release history recorded for sglang 0.5.23"):
        cached_wheel(other)


def test_a_cached_wheel_that_is_a_link_a_device_or_a_pipe_is_refused_in_one_line_not_read(tmp_path, monkeypatch):
    """h107 attack 10: a cached release wheel symlinked to /dev/zero hung `wheel --from-release` (its sha256 read
    through the link to no end). A cache wheel is read only if it is a regular file, never through a link; any wheel
    the tool opens (WheelZip) only if it leads to a regular file."""
    from c128patch.upstream.releases import ReleaseHistory, WheelZip, cached_wheel

    folder, wheel = fake_release_cache(monkeypatch, tmp_path)
    ReleaseHistory().ensure()
    (tmp_path / "elsewhere").mkdir()
    real = wheel.rename(tmp_path / "elsewhere" / wheel.name)
    wheel.symlink_to(real)  # a link to a whole wheel first: the old code read through it and took it
    for make in (lambda: None, lambda: (wheel.unlink(), wheel.symlink_to("/dev/zero")),
                 lambda: (wheel.unlink(), os.mkfifo(wheel))):
        make()
        with pytest.raises(C128Error, match="is not a regular file") as exc:
            cached_wheel(wheel)
        assert f"in the cache {folder}" in exc.value.message and f"rm {wheel}" in exc.value.message
        assert "\n" not in exc.value.message
    run = invoke("wheel", "--from-release", "0.5.23", "-o", str(tmp_path / "out"), as_json=False)  # the FIFO
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1 and "is not a regular file" in run.err, run.err
    for odd in ("/dev/zero", wheel):  # through WheelZip (any reader: --from-wheel, verify-wheel), by any path
        with pytest.raises(C128Error, match="is not a regular file"):
            WheelZip(Path(odd))


@pytest.mark.parametrize("name, text", [("c128patch-versions", b"0.5.20\n0.5.23\nnot-a-version\n"),
                                        ("c128patch-trees", b"0.5.20 \xff\xfe\n"), ("c128patch-layout", b"\xff\n")],
                         ids=["versions", "trees", "layout"])
def test_a_damaged_state_file_of_the_release_cache_is_one_line_saying_how_to_rebuild(sglang_release_repo, tmp_path,
                                                                                     monkeypatch, name, text):
    """The real history copied, one of its state files damaged: `check` printed InvalidVersion's or
    UnicodeDecodeError's traceback."""
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(sglang_release_repo, cache / sglang_release_repo.name)
    (cache / "wheels").symlink_to(sglang_release_repo.parent / "wheels")
    (cache / sglang_release_repo.name / name).write_bytes(text)
    monkeypatch.setenv("C128PATCH_CACHE", str(cache))
    line = refused(["check", "--sglang-rev", "v0.5.23", "--series", REPO_ROOT],
                   contains=f"the release cache {cache / sglang_release_repo.name}: {name}")
    assert f"rm -rf {cache / sglang_release_repo.name}" in line


def test_a_truncated_cached_wheel_and_a_corrupt_pack_are_one_line_naming_the_cache(fake_releases, tmp_path):
    from c128patch.upstream.releases import ReleaseHistory

    wheel = fake_releases["0.5.21"]
    wheel.write_bytes(wheel.read_bytes()[:40])
    with pytest.raises(C128Error, match="not a whole wheel") as exc:
        ReleaseHistory().ensure()
    assert str(wheel) in exc.value.message and "\n" not in exc.value.message
    fake_wheel(wheel.parent, "0.5.21")
    root = ReleaseHistory().ensure()
    subprocess.run(["git", "--git-dir", str(root), "repack", "-adq"], check=True)
    for pack in (root / "objects" / "pack").glob("*.pack"):
        pack.chmod(0o644)
        pack.write_bytes(pack.read_bytes()[:100])
    with pytest.raises(C128Error, match="the release cache .* is corrupt") as exc:
        ReleaseHistory().ensure()
    assert f"rm -rf {root}" in exc.value.message


@pytest.mark.parametrize("make", ["truncated", "empty", "link", "fifo"])
def test_check_says_a_cached_release_wheel_that_is_no_whole_zip_beside_its_wheel_verdict(tmp_path, monkeypatch, make):
    """Helper 187: with the cached 0.5.23 wheel truncated, `check` said "wheel: applies" and nothing else while `wheel
    --from-release 0.5.23` refused it. The verdict is the release's sources' (the wheel is never read), and a cached
    wheel that is no whole zip (its directory's end, one read) is said beside it with the fix `wheel` prints."""
    from c128patch.upstream.releases import ReleaseHistory

    folder, wheel = fake_release_cache(monkeypatch, tmp_path)
    ReleaseHistory().ensure()
    notes = lambda: [r["note"] for r in invoke("check", "--sglang-rev", "v0.5.23").out["revs"]]  # noqa: E731
    assert "cached wheel" not in notes()[0]  # whole: nothing said
    good = wheel.read_bytes()
    wheel.unlink()
    {"truncated": lambda: wheel.write_bytes(good[:-30]), "empty": lambda: wheel.write_bytes(b""),
     "link": lambda: wheel.symlink_to(tmp_path / "elsewhere.whl"), "fifo": lambda: os.mkfifo(wheel)}[make]()
    note = notes()[0]
    assert f"the cached wheel {wheel} " in note and f"(rm {wheel}; it is downloaded again)" in note, note
    assert "\n" not in note


@pytest.mark.parametrize("make", ["not-utf8", "link", "fifo", "huge"])
def test_a_state_file_of_the_cache_not_utf8_a_link_a_pipe_or_huge_is_one_line_for_every_reader(tmp_path, monkeypatch,
                                                                                             make):
    """h133: `wheel --from-release` and `verify-wheel` read `c128patch-trees` on their own (`cached_wheel`): a byte that
    is not UTF-8 was UnicodeDecodeError's traceback there; and every reader of a state file read it through a link and
    whole (a sparse file of gigabytes into memory). Now each is read as one small regular file, else one line."""
    from c128patch.upstream.releases import ReleaseHistory, cached_wheel

    folder, wheel = fake_release_cache(monkeypatch, tmp_path)
    root = ReleaseHistory().ensure()
    trees = root / "c128patch-trees"
    kept = trees.rename(tmp_path / "trees")
    {"not-utf8": lambda: trees.write_bytes(kept.read_bytes() + b"0.5.19 \xff\n"),
     "link": lambda: trees.symlink_to(kept), "fifo": lambda: os.mkfifo(trees),
     "huge": lambda: trees.write_bytes(kept.read_bytes() + b" " * (2 << 20))}[make]()
    for read in (lambda: cached_wheel(wheel), ReleaseHistory().ensure):
        with pytest.raises(C128Error, match=f"the release cache {root}: c128patch-trees cannot be read") as exc:
            read()
        assert f"rm -rf {root}" in exc.value.message and "\n" not in exc.value.message


@pytest.mark.parametrize("make", ["huge", "link", "fifo"])
def test_the_caches_record_of_its_wheels_huge_a_link_or_a_pipe_is_one_line_unread(tmp_path, monkeypatch, make):
    """h133: `wheels/SHA256SUMS` was read whole through whatever stood there: an 8 GB sparse one ran `wheel
    --from-release` and `verify-wheel` out of memory (MemoryError's traceback)."""
    from c128patch.upstream.releases import ReleaseHistory, cached_wheel

    folder, wheel = fake_release_cache(monkeypatch, tmp_path)
    ReleaseHistory().ensure()
    assert cached_wheel(wheel) == wheel  # its sum recorded
    sums = folder / "SHA256SUMS"
    kept = sums.rename(tmp_path / "sums")
    {"huge": lambda: (sums.touch(), os.truncate(sums, 8 << 30)),  # (sparse: no disk used)
     "link": lambda: sums.symlink_to(kept), "fifo": lambda: os.mkfifo(sums)}[make]()
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: pytest.fail(f"{self} read whole")
                        if self.name == "SHA256SUMS" else read_bytes(self).decode())
    with pytest.raises(C128Error, match=f"the cache's record of its wheels {sums} cannot be read") as exc:
        cached_wheel(wheel)
    assert f"rm -rf {folder}" in exc.value.message


@pytest.mark.parametrize("folder", ["", "wheels", "sglang-releases.git"], ids=["cache", "wheels", "history"])
def test_a_cache_folder_everyone_may_write_or_another_user_owns_is_refused_in_one_line(fake_releases, tmp_path,
                                                                                     folder):
    """h133: a cache folder (or its wheels or history) writable by every user, or another user's, was used as it was:
    whoever could write it chose the wheel `wheel --from-release` patched and the history taken as upstream's."""
    from c128patch.upstream.releases import ReleaseHistory

    ReleaseHistory().ensure()
    target = tmp_path / "cache" / folder
    target.mkdir(exist_ok=True)  # (wheels/: the stand-ins come from a wheelhouse)
    target.chmod(0o1777)
    line = refused(["check", "--sglang-rev", "v0.5.23"],
                   contains=f"the cache folder {target} is writable by every user")
    assert "set C128PATCH_CACHE to a folder of your own" in line
    target.chmod(0o755)
    run = invoke("check", "--sglang-rev", "v0.5.23", as_json=False)  # (stand-in wheels: the series does not fit them)
    assert run.code == 1 and "the cache folder" not in run.err, run.err
    if os.getuid() == 0:  # (chown needs root)
        os.chown(target, 65534, -1)
        refused(["check", "--sglang-rev", "v0.5.23"], contains=f"the cache folder {target} is owned by another user")


def test_one_printed_chmod_makes_a_cache_everyone_may_write_usable(fake_releases, tmp_path):
    """Helper 159: each run named one cache folder writable by every user and printed its ``chmod go-w``: a cache made
    writable by all (``chmod -R o+w``) took nine runs, one command each. The printed command now takes them all."""
    from c128patch.upstream.releases import ReleaseHistory
    from support import printed_command, run_printed

    root = ReleaseHistory().ensure()
    folders = [root.parent, root.parent / "wheels", root, root / "refs", root / "refs" / "tags", root / "objects",
               root / "objects" / "pack", root / "objects" / "info", root / "config"]
    folders[1].mkdir(exist_ok=True)  # (wheels/: the stand-ins come from a wheelhouse)
    for folder in folders:
        folder.chmod(folder.stat().st_mode | 0o002)
    line = refused(["check", "--sglang-rev", "v0.5.23"], contains=f"the cache folder {root.parent} is writable by "
                   "every user (and 8 more of its folders)")
    assert run_printed(printed_command(line, "chmod go-w")).returncode == 0
    assert not [f for f in folders if f.stat().st_mode & 0o002]
    run = invoke("check", "--sglang-rev", "v0.5.23", as_json=False)  # (stand-in wheels: the series does not fit them)
    assert run.code == 1 and "the cache folder" not in run.err, run.err


def test_a_cached_nvcc_verdict_another_user_may_change_is_not_taken(tmp_path, monkeypatch):
    """Helper 187: `contract`'s cached nvcc verdicts (`contract-probe/<key>.json`) were taken from a folder and files
    another user owned: a forged "compiles" stood in for the compile. The folder is one of the cache's checked ones;
    a verdict file others may write is compiled again (its verdict rewritten)."""
    from c128patch.fit.contract_cxx import _COMPILES, _FAILS, _cached_verdict

    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("C128PATCH_WHEELHOUSE", raising=False)
    folder = tmp_path / "cache" / "contract-probe"
    folder.mkdir(parents=True)
    path = folder / "k.json"
    for ok, line in ((True, _COMPILES), (False, _FAILS + "x")):
        path.write_text(json.dumps({"key": "k", "ok": ok, "line": line}))
        path.chmod(0o644)
        assert _cached_verdict(path, "k") == (ok, line + " (cached)")
        path.chmod(0o666)
        assert _cached_verdict(path, "k") is None
    folder.chmod(0o777)
    refused(["check", "--sglang-rev", "v0.5.23"], contains=f"the cache folder {folder} is writable by every user")


def test_what_of_the_cache_decides_the_tree_or_the_wheel_others_may_write_is_refused_in_one_line(fake_releases,
                                                                                                tmp_path):
    """Helper 148: only the cache folder, its wheels/ and its history's folder were checked: a world-writable
    `refs/tags` (whoever writes it moves a tag) or `c128patch-trees` (the record the tags are checked against, moved
    with them), a group-writable cache of a group not the user's, were used as they were."""
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    (root / "refs" / "tags").chmod(0o777)
    line = refused(["check", "--sglang-rev", "v0.5.23"], contains=f"the cache folder {root / 'refs' / 'tags'} is "
                   "writable by every user")
    fix = f"chmod go-w {root / 'refs' / 'tags'}"
    assert f"; {fix}, or set C128PATCH_CACHE" in line, line
    subprocess.run(fix.split(), check=True)  # the fix, as printed
    (root / "c128patch-trees").chmod(0o666)
    line = refused(["check", "--sglang-rev", "v0.5.23"], contains="c128patch-trees cannot be read (writable by every "
                   "user)")
    assert f"rm -rf {root}" in line
    (root / "c128patch-trees").chmod(0o644)
    if os.getuid() == 0:  # (chgrp to a group not one's own needs root)
        os.chown(root.parent, -1, 1)
        root.parent.chmod(0o775)
        refused(["check", "--sglang-rev", "v0.5.23"], contains=f"the cache folder {root.parent} is writable by group 1")
        root.parent.chmod(0o755)
    assert ReleaseHistory().ensure() == root


def test_a_cached_wheel_others_may_write_is_refused_saying_to_remove_it(tmp_path, monkeypatch):
    """Helper 148: a cached release wheel writable by every user was patched by `wheel --from-release` (its sum
    recorded at its first use: whoever changed it first had it recorded)."""
    from c128patch.upstream.releases import cached_wheel

    _, wheel = fake_release_cache(monkeypatch, tmp_path)
    wheel.chmod(0o666)
    with pytest.raises(C128Error, match="is writable by every user") as exc:
        cached_wheel(wheel)
    assert f"rm {wheel}" in exc.value.message
    wheel.chmod(0o644)
    assert cached_wheel(wheel) == wheel


@pytest.mark.parametrize("make", ["fifo", "dangling-link", "link-to-dev-zero", "folder"])
def test_a_lock_file_of_the_cache_that_is_no_regular_file_is_one_line_never_a_hang_or_a_write_elsewhere(
        fake_releases, tmp_path, make):
    """h133: the cache's lock file was opened with O_CREAT through whatever stood at its name: a FIFO there hung every
    verb (opening a pipe for writing waits for a reader), a dangling link made its target outside the cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    lock, outside = cache / "sglang-releases.lock", tmp_path / "outside" / "made-here"
    outside.parent.mkdir()
    {"fifo": lambda: os.mkfifo(lock), "dangling-link": lambda: lock.symlink_to(outside),
     "link-to-dev-zero": lambda: lock.symlink_to("/dev/zero"), "folder": lock.mkdir}[make]()
    run = subprocess.run([sys.executable, "-m", "c128patch", "check", "--sglang-rev", "v0.5.23"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "C128PATCH_CACHE": str(cache)})
    assert run.returncode == 2 and [error_line(run.stderr)] == [
        f"c128patch: error: the lock file {lock} of the cache {cache} is not a regular file (a link, a pipe or a "
        f"folder): not used; remove it (rm -r {lock}) and run again"], run.stderr
    assert not outside.exists() and not (cache / "sglang-releases.git").exists()


def test_jsonio_locked_on_a_pipe_or_device_is_one_line_never_a_hang(tmp_path):
    """Helper 170 (issue 36's open item): `jsonio.locked` opened its path for reading and waited: a FIFO there (no
    caller hands it one: series and layer folders, and the cache's lock files, are checked first) waited forever for a
    writer. It refuses what is neither a folder nor a regular file, at once."""
    os.mkfifo(tmp_path / "fifo")
    code = ("import sys; from pathlib import Path; from c128patch import jsonio\n"
            "from c128patch.errors import C128Error\n"
            "for path in (Path(sys.argv[1]), Path('/dev/null')):\n"
            "    try:\n        with jsonio.locked(path): print('locked', path)\n"
            "    except C128Error as exc: print(exc.message)\n")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fifo")], capture_output=True, text=True,
                         timeout=30)
    assert run.stdout.splitlines() == [
        f"{tmp_path / 'fifo'} is not a folder or a regular file (a pipe, a device): it cannot be locked",
        "/dev/null is not a folder or a regular file (a pipe, a device): it cannot be locked"], run.stderr


def test_a_lock_of_the_cache_another_process_holds_is_said_and_waited_for_in_bounded_time(tmp_path):
    """Helper 153: a process holding the cache's lock (another run building it, or one that hangs holding it) made
    every verb wait silently, with no limit: `check` and `apply` sat there until killed. The folder's name is input:
    its controls never reach the terminal."""
    cache = tmp_path / "cache\x1b]0;title\x07"
    cache.mkdir()
    lock = cache / "sglang-releases.lock"
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; fd = open(sys.argv[1]); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        run = subprocess.run([sys.executable, "-m", "c128patch", "check", "--sglang-rev", "v0.5.23"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "C128PATCH_CACHE": str(cache), "C128PATCH_LOCK_TIMEOUT": "1"})
    finally:
        holder.kill()
        holder.wait()
    shown = str(lock).replace("\x1b", "").replace("\x07", "")
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        f"waiting for {shown}: another run holds its lock (at most 1 s, C128PATCH_LOCK_TIMEOUT)",
        f"c128patch: error: {shown} is still locked by another run after 1 s: let it finish (or end it), then run "
        "again; C128PATCH_LOCK_TIMEOUT=SECONDS waits longer"], run.stderr
    assert not (cache / "sglang-releases.git").exists()


@pytest.mark.parametrize("value, said", [("abc", "'abc' is not a number of seconds"),
                                         ("nan", "'nan' is not a number of seconds"),
                                         ("-0", "still locked by another run after 0 s:")])
def test_a_lock_timeout_that_is_no_number_is_said_with_the_lock_free_and_minus_zero_is_zero(tmp_path, value, said):
    """Helper 159: ``$C128PATCH_LOCK_TIMEOUT`` was read only once a lock was taken: a typo (``abc``) passed every run
    until the one that had to wait, which then failed where it was meant to wait longer; ``-0`` said "after -0 s"."""
    from c128patch.jsonio import locked

    lock = tmp_path / "lock"
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; fd = open(sys.argv[1]); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True) if value == "-0" else None
    try:
        assert holder is None or holder.stdout.readline().strip() == "held"
        with pytest.MonkeyPatch.context() as mp, pytest.raises(C128Error, match=re.escape(said)):
            mp.setenv("C128PATCH_LOCK_TIMEOUT", value)
            with locked(lock):
                pass
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


@pytest.mark.parametrize("member", [
    "sglang/a.py\ndata 0\n\ncommit refs/heads/injected\ncommitter a <a@b> 0 +0000",  # commands for fast-import
    "sglang/../../x.py", "sglang/.GIT/hooks/post-checkout",
], ids=["newline", "dotdot", "git-dir"])
def test_a_release_wheels_member_names_are_confined_before_they_reach_the_history(fake_releases, tmp_path, member):
    """A member name went into fast-import's stream as it was: a newline added a ref and moved what the tag
    names, and the import recorded it as the release's tree."""
    from c128patch.upstream.releases import ReleaseHistory

    with zipfile.ZipFile(fake_releases["0.5.23"], "a") as zf:
        zf.writestr(member, "x = 1\n")
    with pytest.raises(C128Error, match="unsafe path in the wheel .*sglang-0.5.23-") as exc:
        ReleaseHistory().ensure()
    assert "\n" not in exc.value.message
    refs = subprocess.run(["git", "--git-dir", str(tmp_path / "cache" / "sglang-releases.git"), "for-each-ref"],
                          capture_output=True, text=True).stdout
    assert refs == "", refs


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """The URL of a server that accepts and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/sglang.git"
    finally:
        server.close()


@pytest.mark.timeout(120)  # unbounded, it would hang: fail instead
def test_check_on_a_server_that_never_answers_ends_in_time(tmp_path):
    with silent_server() as url:
        start = time.monotonic()
        res = invoke("check", "--repo", url, "--sglang-rev", "main", as_json=False,
                     env={"C128PATCH_NET_TIMEOUT": "3", "C128PATCH_CACHE": str(tmp_path / "cache")})
    assert res.code == 2 and "no answer within 3 s" in res.err, res.err
    assert time.monotonic() - start < 60


def test_an_http_clone_that_receives_nothing_ends_at_the_stall_bound_not_the_whole_limit(tmp_path, monkeypatch):
    """Helper 186 (b): a server that accepts and never answers held ``check --repo URL`` the whole 600 s
    (C128PATCH_NET_TIMEOUT) in silence. An http(s) transfer that receives nothing for ``STALL`` s ends then, in one
    line saying so; the operator's GIT_HTTP_LOW_SPEED_TIME still decides (then the whole limit)."""
    from c128patch.upstream import source

    monkeypatch.setattr(source, "STALL", 2)
    with silent_server() as url:
        start = time.monotonic()
        res = invoke("check", "--repo", url, "--sglang-rev", "main", as_json=False,
                     env={"C128PATCH_NET_TIMEOUT": "60", "C128PATCH_CACHE": str(tmp_path / "cache")})
        assert time.monotonic() - start < 30
        assert res.code == 2 and res.err.strip() == (f"c128patch: error: cannot clone {url}: the server sent nothing "
                                                     "for 2 s (a stalled transfer; GIT_HTTP_LOW_SPEED_TIME=SECONDS "
                                                     "waits longer)"), res.err
        monkeypatch.setenv("C128PATCH_NET_TIMEOUT", "60")
        assert source.net_limits(url) == (60, 2) and source.net_limits("git://h/r") == (60, None)
        monkeypatch.delenv("C128PATCH_NET_TIMEOUT")
        res = invoke("check", "--repo", url, "--sglang-rev", "main", as_json=False,
                     env={"C128PATCH_NET_TIMEOUT": "4", "GIT_HTTP_LOW_SPEED_TIME": "600",
                          "C128PATCH_CACHE": str(tmp_path / "cache")})
        assert res.code == 2 and "no answer within 4 s" in res.err, res.err


def _trickle(server: socket.socket) -> None:
    """An HTTP server that answers one byte at a time, never finishing."""
    with contextlib.suppress(OSError):
        while True:
            conn, _ = server.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-git-upload-pack-advertisement\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n1\r\n0\r\n")


@pytest.mark.parametrize("how", ["silent", "trickle"])
@pytest.mark.parametrize("verb", [["treecheck", "--no-run", "--sglang-rev", "main"], ["bisect", "--onto", "main"],
                                  ["matrix"]])
def test_every_verb_on_a_server_that_never_answers_or_trickles_ends_in_time_in_one_line(tmp_path, verb, how):
    """Helper 142: ``treecheck --repo URL`` opened the URL with no reporter: AttributeError's traceback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # silent: accepts, never answers
    if how == "trickle":
        threading.Thread(target=_trickle, args=(server,), daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/sglang.git"
    start = time.monotonic()
    try:
        res = invoke(*verb, "--repo", url, as_json=False,
                     env={"C128PATCH_NET_TIMEOUT": "1", "C128PATCH_CACHE": str(tmp_path / "cache")})
    finally:
        server.close()
    said = f"c128patch: error: cannot clone {url}: no answer within 1 s (a server that does not answer; set "
    assert res.code == 2 and res.err.strip() == said + "C128PATCH_NET_TIMEOUT to wait longer)", res.err
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "-1", "0", "abc"])
def test_a_network_time_limit_that_is_no_number_of_seconds_is_one_line(tmp_path, value):
    """Helper 93: nan, inf and 1e400 gave a ValueError/OverflowError traceback, -1 "no answer within -1 s". Helper
    169: 0 was refused by a line saying "from 0 to 86400"."""
    res = invoke("check", "--repo", "http://127.0.0.1:9/sglang.git", "--sglang-rev", "main", as_json=False,
                 env={"C128PATCH_NET_TIMEOUT": value, "C128PATCH_CACHE": str(tmp_path / "cache")})
    assert res.code == 2 and res.err.startswith(f"c128patch: error: C128PATCH_NET_TIMEOUT='{value}' is not a number"), \
        res.err
    assert res.err.rstrip().endswith("more than 0 and at most 86400 (a day)"), res.err


# ------------------------------------------------------------------------------------- concurrent writers: the lock
@txn.serialised  # what `layer add-entry` does: load, change, commit, one writer at a time
def _add(folder: Path, name: str, hold: float) -> None:
    text = (folder / "patches" / "series.toml").read_text()
    time.sleep(hold)  # both have read the manifest before either writes, unless serialised
    data = text + f'\n[[entries]]\nname = "{name}"\nkind = "overlay"\nsource = "o"\ntarget = "t"\nwhy = "w"\n'
    txn.commit_all([(folder, {folder / "patches" / "series.toml": data.encode()}, [], None)])


def test_two_writers_of_one_layer_are_serialised_by_its_lock(tmp_path):
    layer = series_folder(tmp_path / "layer")
    ctx = multiprocessing.get_context("fork" if sys.platform != "darwin" else "spawn")
    procs = [ctx.Process(target=_add, args=(layer, name, 1.0)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(e.name for e in load_series(layer).entries) == ["a", "b"]


def locked_by_another(folder: Path) -> bool:
    """Does another open file hold ``folder``'s lock (flock, as the tool's writers take it)?"""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_layer_add_entry_reads_the_layer_under_its_lock(tmp_path, monkeypatch):
    """`layer add-entry` itself (not only a writer built for the test) holds the layer's lock from its first read."""

    from c128patch.ops import layer as ops_layer

    layer, held = series_folder(tmp_path / "layer"), []

    def probe(folder: Path, _series: object) -> None:  # another writer, as add-entry loads the layer
        held.append(locked_by_another(folder))
        raise C128Error("probed")

    monkeypatch.setattr(ops_layer, "load_layer", probe)
    with pytest.raises(C128Error, match="probed"):
        ops_layer.add_entry(layer, None, None, "HEAD", "why")  # type: ignore[arg-type]
    assert held == [True]


@txn.serialised  # another writer of the layer (what `layer add-entry` does): it reads, waits, then commits
def _add_slowly(folder: Path, hold: float) -> None:
    manifest = folder / "patches" / "series.toml"
    text = manifest.read_text()
    time.sleep(hold)
    txn.commit_all([(folder, {manifest: (text + '\n[[entries]]\nname = "added"\nkind = "overlay"\nsource = '
                                         '"overlay/x.py"\ntarget = "python/x.py"\nwhy = "w"\n').encode()}, [], None)])


def test_lint_update_hashes_writes_a_layer_under_its_lock(tmp_path):
    """Helper 158: `lint --update-hashes` read and wrote a layer's manifest without its lock: run while `layer
    add-entry` held it between its read and its commit, its hashes were written at once and then lost under the
    entry's commit (or, the other way round, the new entry lost under the hashes). It waits for the lock and reads
    the manifest again under it: both the entry and the hash are kept."""
    layer = tmp_path / "acme"
    shutil.copytree(REPO_ROOT / "docs" / "examples" / "acme-layer", layer)
    (layer / "overlay").mkdir(exist_ok=True)
    (layer / "overlay" / "x.py").write_text("x = 1\n")
    manifest = layer / "patches" / "series.toml"
    right = load_series(layer).entries[0].sha256
    manifest.write_text(manifest.read_text().replace(right, "0" * 64, 1))
    writer = multiprocessing.get_context("fork").Process(target=_add_slowly, args=(layer, 2.0))
    writer.start()
    time.sleep(0.5)  # it holds the lock, its manifest read
    res = invoke("lint", "--update-hashes", "--offline", "--layer", layer, as_json=False)
    writer.join(60)
    assert writer.exitcode == 0 and res.code == 0, res.err
    entries = {e.name: e for e in load_series(layer).entries}
    assert "added" in entries and next(iter(entries.values())).sha256 == right, manifest.read_text()


def test_refresh_holds_each_layers_lock_and_refuses_a_layer_written_since_it_read_it(tmp_path, monkeypatch):
    """Helper 177: `refresh` locked our series' folder only: run beside `layer add-entry` on one of its layers (the
    stack read, then add-entry's commit, then refresh's), it wrote the layer as it had read it, the new entry's patch
    file deleted as stale and its row gone, both exiting 0 (sequentially refresh refuses: "the stack has entries this
    tree was never applied with"). It takes each layer's lock, the one add-entry writes under, and refuses a layer
    that changed since it was read: one line, nothing written."""

    from c128patch.ops import refresh as ops_refresh

    layer = tmp_path / "acme"
    shutil.copytree(REPO_ROOT / "docs" / "examples" / "acme-layer", layer)
    stk = stack(load_series(REPO_ROOT), [layer])  # what the verb read before any lock
    repo = tmp_path / "tree"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    held = []

    def probe(*_args: object, **_kw: object) -> None:  # what refresh reads and writes, while it runs
        held.append(locked_by_another(layer))
        raise C128Error("probed")

    for name in ("ensure_idle", "export"):
        monkeypatch.setattr(ops_refresh, name, probe)
    with pytest.raises(C128Error, match="probed"):
        ops_refresh.refresh(stk, Git(worktree=repo))
    assert held == [True]
    manifest = layer / "patches" / "series.toml"
    before = {p.name: p.read_bytes() for p in (layer / "patches").iterdir()}
    manifest.write_text(manifest.read_text().replace('version = "', 'version = "9', 1))  # add-entry's commit
    with pytest.raises(C128Error, match=r"cannot refresh: the layer acme \(.*\) changed since this run read it"):
        ops_refresh.refresh(stk, Git(worktree=repo))
    assert held == [True]  # refused before anything is read or written
    assert {p.name: p.read_bytes() for p in (layer / "patches").iterdir()} == {
        **before, "series.toml": manifest.read_bytes()}


ROW = {"entry": "other", "key": "ab", "match": "ab", "file": "python/o.py", "from": "v1", "onto": "v2"}


@txn.serialised  # another tree's `rebase --continue` recording into the same layer's ledger
def _record_slowly(folder: Path, hold: float) -> None:
    import tomli_w

    index = folder / "patches" / "resolutions" / "ledger.toml"
    rows = Ledger(load_series(folder)).rows()
    time.sleep(hold)
    index.write_text(tomli_w.dumps({"resolutions": [*rows, ROW]}))


def test_a_ledger_row_is_recorded_under_the_layers_lock(tmp_path):
    """Helper 158: ``Ledger.record`` (`rebase --continue`) read the ledger's rows and wrote them back with its own
    without the folder's lock: a row another writer recorded in between was lost. It reads and writes under it."""
    from c128patch.series.ledger import Conflict

    layer = series_folder(tmp_path / "layer")
    (layer / "patches" / "resolutions").mkdir()
    (layer / "patches" / "resolutions" / "ledger.toml").write_text("resolutions = []\n")
    repo = tmp_path / "tree"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "python").mkdir()
    (repo / "python" / "a.py").write_text("resolved\n")
    subprocess.run(["git", "-C", str(repo), "add", "python/a.py"], check=True)
    writer = multiprocessing.get_context("fork").Process(target=_record_slowly, args=(layer, 2.0))
    writer.start()
    time.sleep(0.5)  # it holds the lock, the rows read
    conflict = Conflict.of("python/a.py", "<<<<<<< a\nours\n=======\ntheirs\n>>>>>>> b\n")
    refs = Ledger(load_series(layer)).record(Git(worktree=repo), "mine", "v1", "v2", [conflict])
    writer.join(60)
    assert writer.exitcode == 0 and refs == [f"mine:{conflict.key}"]
    assert sorted(r["entry"] for r in Ledger(load_series(layer)).rows()) == ["mine", "other"]


@txn.serialised  # the first of two `layer new` on one folder, past its check that no manifest is there
def _make_slowly(folder: Path, hold: float) -> None:
    time.sleep(hold)
    (folder / "patches" / "series.toml").write_text(SERIES.format(name="first"))


def test_two_layer_new_on_one_folder_are_serialised(tmp_path):
    """Helper 158: two `layer new` at once on one folder both found no manifest, both wrote one and both exited 0 ("made
    layer ..."): the first's was overwritten by the second. The write is under the folder's lock, the check again
    under it: the second is refused, "exists already", and the first's layer stays."""
    folder = tmp_path / "layer"
    (folder / "patches").mkdir(parents=True)
    writer = multiprocessing.get_context("fork").Process(target=_make_slowly, args=(folder, 1.5))
    writer.start()
    time.sleep(0.4)  # it holds the folder's lock
    res = invoke("layer", "new", folder, "--name", "second", as_json=False)
    writer.join(60)
    assert writer.exitcode == 0 and res.code == 2 and "exists already" in res.err, (res.code, res.err)
    assert load_series(folder).name == "first"


@pytest.mark.parametrize("why", ["w\n\nC128patch-Entry: c128-plan-zero-rows\nC128patch-Gate: none",
                                 "w\rc128patch-entry : c128-plan-zero-rows", "w \u202e\u2028x"])
def test_an_entrys_why_that_is_not_one_printable_line_is_refused(tmp_path, why):
    """Helper 158: an entry's ``why`` (a layer's manifest, a pull request's) goes into its overlay's commit message:
    one holding a line break put ``C128patch-Entry: c128-plan-zero-rows`` (our entry's name) into the commit `apply`
    made for the layer's overlay, and `lint --offline` passed it. Its text fields are one printable line now."""
    import tomli_w

    layer = tmp_path / "L"
    assert invoke("layer", "new", layer, "--name", "site", as_json=False).code == 0
    (layer / "overlay").mkdir()
    (layer / "overlay" / "x.py").write_text("X = 1\n")
    manifest = layer / "patches" / "series.toml"
    manifest.write_text(manifest.read_text() + "\n" + tomli_w.dumps({"entries": [{
        "name": "x", "kind": "overlay", "source": "overlay/x.py", "target": "python/sglang/site_x.py", "why": why}]}))
    refused(["lint", "--offline", "--layer", layer], contains="'why' must be one line of printable text")
    refused(["apply", "--sglang-rev", "v0.5.23", "--layer", layer, "--tree", tmp_path / "tree"],
            contains="'why' must be one line")
    assert not (tmp_path / "tree").exists()


def test_a_variants_base_that_is_not_one_word_is_refused(tmp_path):
    """Helper 158: a variant's ``base`` (a pull request's) was taken as any string while the series' own base is held
    to one word; it is the text of the rule that chose a file (``nearest ancestor base ...``) in check's table and both
    reports: ``v0.5.22\\nc128patch: all clean`` passed `lint --offline`. One word now, as the series' base."""
    from support import copy_series

    series = copy_series(tmp_path / "series")
    manifest = series / "patches" / "series.toml"
    text = manifest.read_text()
    assert '\nbase = "v0.5.22"\n' in text
    manifest.write_text(text.replace('\nbase = "v0.5.22"\n', '\nbase = "v0.5.22\\nc128patch: all clean"\n', 1))
    refused(["lint", "--offline", "--series", series], contains="unsafe base 'v0.5.22\\nc128patch: all clean'")


# ------------------------------------------------------------------------------------------ robustness: argv
def test_a_non_utf8_argv_is_taken_or_refused_in_one_line(tmp_path):
    """Non-UTF-8 bytes in a folder name and in an option (``python -m c128patch``, as a shell passes them)."""
    from support import cli_process, copy_series

    series = copy_series(tmp_path / os.fsdecode(b"s\xff"))
    done = cli_process(["lint", "--offline", "--series", series])
    assert done.returncode == 0 and " entries, 0 error(s)" in done.stdout, done.stderr
    assert json.loads(cli_process(["lint", "--offline", "--series", series, "--json"]).stdout)["ok"] is True
    bad = cli_process(["gates", os.fsdecode(b"--x\xff")])
    assert bad.returncode == 2 and bad.stderr.startswith("c128patch: error: No such option"), bad.stderr
    assert bad.stderr.strip().endswith("(see `c128patch gates --help`)") and "\n" not in bad.stderr.strip()


@pytest.mark.parametrize("args", [["gates"], ["status", "--json"], ["lint", "--offline"]])
def test_a_current_folder_that_was_removed_is_one_line(tmp_path, args):
    """A shell still in a folder removed under it: ``Path.cwd()`` (the layers' lookup, the tree) was a traceback."""
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run(["bash", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "$0" -m c128patch "$@"',
                           sys.executable, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "c128patch: error: the current folder was removed" in proc.stderr.splitlines()[-1], proc.stderr


def test_watch_refuses_a_read_only_out_before_any_work(tmp_path):
    from test_trust_git import read_only

    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro"):
        started = time.monotonic()
        refused(["watch", "--onto", "v0.5.23", "--out", tmp_path / "ro" / "out", "--no-run"],
                contains=f"--out {tmp_path / 'ro' / 'out'}: {tmp_path / 'ro'} is not writable")
        assert time.monotonic() - started < 30  # refused up front: no clone, no carry
    assert not list((tmp_path / "ro").iterdir())


@pytest.mark.parametrize("err", ["EPERM", "ENOSPC"])
def test_an_output_folder_access_allows_but_a_write_refuses_is_one_line_before_any_work(tmp_path, monkeypatch, err):
    """helper 167: access() says "writable" where a write is refused (root in sysfs, a full disk): ``wheel -o`` did
    the whole patch, then mkdir's PermissionError was a traceback (a full disk: one line, after the work). The output
    check makes and removes a folder there first: one line naming the option and the folder, nothing written."""
    import errno

    out = tmp_path / "out"
    out.mkdir()
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kw):
        if os.path.dirname(os.fspath(path)) == str(out):
            raise OSError(getattr(errno, err), os.strerror(getattr(errno, err)), os.fspath(path))
        return real_mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    refused(["wheel", "--from-release", "0.5.23", "-o", out / "new"],
            contains=f"cannot write in {out} ({os.strerror(getattr(errno, err))})")
    assert not list(out.iterdir())


def test_a_full_disk_while_watch_writes_its_report_is_one_line_and_leaves_no_report(tmp_path, monkeypatch):
    import errno

    from c128patch.fit import watch as watch_ops

    def full(path: Path, data: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(watch_ops, "write_json_atomic", full)
    out = tmp_path / "out"
    refused(["watch", "--onto", "v0.5.23", "--out", out, "--no-run"],
            contains=f"cannot write the report under --out {out} (No space left on device)")
    assert not [p for p in out.iterdir() if p.name in watch_ops.WRITTEN]


# ------------------------------------------------------------------ item 3: verbs that only read never run the target
def test_apply_status_lint_and_matrix_never_run_the_targets_code(trapped_upstream, tmp_path):
    """The verbs test_sealed_box.py's trap does not cover, on the same booby-trapped upstream (its control proves
    the trap fires when the target's code runs)."""
    git, marker = trapped_upstream
    tree = tmp_path / "sglang"
    for verb in (["apply", "--sglang-rev", "trap", "--repo", git.git_dir, "--tree", tree], ["status", "--tree", tree],
                 ["lint", "--repo", git.git_dir], ["matrix"]):
        run = invoke(*verb, "--series", REPO_ROOT)
        assert run.code == 0, (verb, run.out, run.err)
        assert not marker.exists(), (verb, marker.read_text())
    assert (tree / "json.py").is_file()  # the trap is in the tree apply made


def test_status_prints_a_hostile_commit_subject_without_its_controls(upstream_clone):
    """The commit HEAD was on before apply (an upstream's, say) is listed by status as a recovery ref: its subject
    reaches the terminal without ESC, OSC-8 or BEL."""
    hostile = "evil \x1b]8;;https://evil.invalid\x1b\\link\x1b]8;;\x1b\\ \x07end"
    subprocess.run(["git", "-C", str(upstream_clone), "-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit",
                    "-q", "--allow-empty", "-m", hostile], check=True)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone).code == 0
    res = invoke("status", "--tree", upstream_clone, as_json=False)
    assert "evil ]8;;https://evil.invalid\\link]8;;\\ end" in res.text, res.text
    assert not any(c in res.text for c in "\x1b\x07"), res.text


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x1c", "\x1e", "\r"],
                         ids=["LS", "PS", "NEL", "FS", "RS", "CR"])
def test_status_lists_a_recovery_ref_whose_subject_holds_a_line_separator(upstream_clone, separator: str):
    """Helper 164: the commit HEAD was on before apply (upstream's) with U+2028, NEL or \\x1c in its subject: status
    split git's records with ``str.splitlines``, which cuts there, and printed KeyError's traceback (``--json`` too).
    Listed as one ref, its subject one line without them."""
    hostile = f"before{separator}after \x1b[31mred"
    subprocess.run(["git", "-C", str(upstream_clone), "-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit",
                    "-q", "--allow-empty", "-m", hostile], check=True)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone).code == 0
    res = invoke("status", "--tree", upstream_clone, as_json=False)
    assert res.code == 0, (res.code, res.err)
    (line,) = [x for x in res.text.splitlines() if "refs/c128patch/recovery/" in x]
    assert "before" in line and "after" in line and not any(c in res.text for c in "\x1b\u2028\u2029\x85\x1c\x1e\r")
    res = invoke("status", "--tree", upstream_clone)
    (ref,) = json.loads(res.text)["recovery_refs"]
    assert ref["subject"].startswith("before") and ref["subject"].endswith("red"), ref


def test_status_and_refresh_print_what_a_trees_provenance_says_on_its_own_lines(upstream_clone):
    """The provenance a tree commits is the tree's: a newline in its series name, version or upstream rev split
    status's and refresh's lines, the rest (``forged: ok``) a line of its own."""
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone).code == 0
    path = upstream_clone / "python" / "sglang" / "c128patch_provenance.json"
    record = json.loads(path.read_text())
    for part, key in (("series", "name"), ("series", "version"), ("upstream", "rev")):
        record[part][key] += "\x1b]8;;https://evil.invalid\x07\u202e\nforged: ok"
    path.write_text(json.dumps(record))
    subprocess.run(["git", "-C", str(upstream_clone), "-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit",
                    "-qam", "the tree's own provenance"], check=True)
    for verb in ("status", "refresh"):  # refresh --check: its proof's summary names the rev
        res = invoke(verb, "--tree", upstream_clone, *(["--check"] if verb == "refresh" else []), as_json=False)
        assert "⏎ forged: ok" in res.text and not any(c in res.text for c in "\x1b\x07\u202e"), res.text
        assert not any(line.startswith("forged") for line in res.text.splitlines()), res.text


@pytest.mark.parametrize("key, value", [("base", "v0.5.23\x1b]8;;https://evil\x07"), ("base", "v0.5.23 [/x]"),
                                        ("version", "1\u202e")])
def test_a_series_base_or_version_that_is_not_one_printable_word_is_refused(tmp_path, key, value):
    """The base reaches progress lines (rich markup there), reports and git; the version trailers and labels."""
    folder = series_folder(tmp_path / "s")
    manifest = folder / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('version = "1"' if key == "version" else 'base = "v0.5.23"',
                                                     f'{key} = {json.dumps(value)}'))
    with pytest.raises(C128Error, match=f"unsafe {key}"):
        load_series(folder)


def _layer_claiming(tmp_path: Path, data: bytes) -> Path:
    layer = series_folder(tmp_path / "layer")
    (layer / "patches" / "0001-x.patch").write_bytes(data)
    with (layer / "patches" / "series.toml").open("a") as fh:
        fh.write('\n[[entries]]\nname = "x"\nkind = "patch"\nfile = "0001-x.patch"\nwhy = "w"\nbase = "v0.5.23"\n')
    return layer


DIFF = b"---\n f | 2 +-\n\ndiff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
ENCODED = b"From x\nSubject: [PATCH] x\nMIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\n"


@pytest.mark.parametrize("data", [  # each as git am reads it: the message carries our entry's trailer
    ENCODED + b"Content-Transfer-Encoding: quoted-printable\n\nx\n\n=43128patch-Entry: c128-dspark-online-env\n" + DIFF,
    ENCODED + b"Content-Transfer-Encoding: base64\n\n"
    + __import__("base64").encodebytes(b"x\n\nC128patch-Entry: c128-dspark-online-env\n" + DIFF),
    b"From x\nSubject: [PATCH] x\n\nC128patch-Entry: site/x\n" + DIFF  # a second message in the same file
    + b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] y\n\n"
    b"C128patch-Entry: c128-dspark-online-env\n" + DIFF,
    ENCODED.replace(b"UTF-8", b"UTF-7") + b"\nx\n\n+AEM-128patch-Entry: c128-dspark-online-env\n" + DIFF,
    # git am decodes base64 and quoted-printable only: a uuencoded body is read as text, its trailer with it
    ENCODED + b"Content-Transfer-Encoding: x-uuencode\n\nbegin 644 x\n`\nend\n\nx\n\n"
    b"C128patch-Entry: c128-dspark-online-env\n" + DIFF,
], ids=["quoted-printable", "base64", "two-messages", "utf-7", "x-uuencode"])
def test_a_layer_cannot_claim_one_of_our_entries_in_an_encoded_body_or_a_second_message(tmp_path, data):
    with pytest.raises(C128Error, match="names its own entry only|more than one message|transfer encoding") as exc:
        stack(load_series(REPO_ROOT), [_layer_claiming(tmp_path, data)])
    assert "\n" not in exc.value.message


def test_a_layer_patch_in_8bit_naming_its_own_entry_is_taken(tmp_path):
    data = ENCODED + b"Content-Transfer-Encoding: 8bit\n\nx\nFrom the docs: 1:2\n\n" \
        b"C128patch-Entry: site/x\n" + DIFF  # a "From " line git does not split at: one message
    assert [e.name for e in stack(load_series(REPO_ROOT), [_layer_claiming(tmp_path, data)]).entries][-1] == "site/x"


# ------------------------------------------------ item 4b: the patch git am reads is the text every check reads
MAIL = (b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: x <x@x.invalid>\n"
        b"Date: Thu, 1 Jan 1970 00:00:00 +0000\nSubject: [PATCH] q\nMIME-Version: 1.0\n")
SHOWN = (b"diff --git a/python/sglang/ok.py b/python/sglang/ok.py\nnew file mode 100644\n--- /dev/null\n"
         b"+++ b/python/sglang/ok.py\n@@ -0,0 +1 @@\n+x = 1\n")  # the one diff the raw text shows
HIDDEN = (b"diff --git a/python/.gitattributes b/python/.gitattributes\nnew file mode 100644\n--- /dev/null\n"
          b"+++ b/python/.gitattributes\n@@ -0,0 +1 @@\n+* filter=evil\n"
          b"diff --git a/python/sglang/keys b/python/sglang/keys\nnew file mode 120000\n--- /dev/null\n"
          b"+++ b/python/sglang/keys\n@@ -0,0 +1 @@\n+/root/.ssh\n\\ No newline at end of file\n"
          b"diff --git a/python/.gitmodules b/python/.gitmodules\nnew file mode 100644\n--- /dev/null\n"
          b"+++ b/python/.gitmodules\n@@ -0,0 +1,2 @@\n+[submodule \"x\"]\n+\turl = ext::sh -c touch% /tmp/pwned\n")
MESSAGE = b"C128patch-Gate: none (x)\nC128patch-Entry: evil/q\n\n---\n"


def _quoted_printable(diff: bytes) -> bytes:
    """Each line's first character as =XX: the raw text holds no 'diff --git' line, git am decodes one."""
    return b"".join(b"=%02X" % line[0] + line[1:] + b"\n" if line else b"" for line in diff.split(b"\n"))


HOSTILE = {  # a whole file diff (a .gitattributes, a symlink to /root/.ssh, a .gitmodules) the raw text hides
    "quoted-printable": MAIL + b"Content-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: quoted-printable"
    b"\n\n" + MESSAGE + SHOWN + _quoted_printable(HIDDEN),
    "base64": MAIL + b"Content-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: base64\n\n"
    + base64.encodebytes(MESSAGE + HIDDEN) + b"\n" + SHOWN,
    "base64-folded": MAIL + b"Content-Type: text/plain; charset=UTF-8\nContent-transfer-encoding:\n\tBASE64\n\n"
    + base64.encodebytes(MESSAGE + HIDDEN) + b"\n" + SHOWN,
    "8bit-then-base64": MAIL + b"Content-Transfer-Encoding: 8bit\nContent-Transfer-Encoding: base64\n\n"
    + base64.encodebytes(MESSAGE + HIDDEN) + b"\n" + SHOWN,
    # git mailinfo unstuffs (drops a leading blank of) every line of a flowed message, its diff's too
    "format-flowed": MAIL + b"Content-Type: text/plain; charset=UTF-8; format=flowed\n\n" + MESSAGE + SHOWN
    + b"".join(b" " + line + b"\n" for line in HIDDEN.split(b"\n") if line),
    "multipart": MAIL + b'Content-Type: multipart/mixed; boundary="b"\n\n--b\nContent-Type: text/plain\n'
    b"Content-Transfer-Encoding: base64\n\n" + base64.encodebytes(MESSAGE + HIDDEN) + b"--b--\n"
    + SHOWN,
}


def hostile_layer(folder: Path, data: bytes) -> Path:
    """A layer ``evil`` of one patch entry ``q`` made on v0.5.23 whose file is ``data`` (its hash recorded)."""
    layer = series_folder(folder, "evil")
    (layer / "patches" / "0001-q.patch").write_bytes(data)
    with (layer / "patches" / "series.toml").open("a") as fh:
        fh.write('\n[[entries]]\nname = "q"\nkind = "patch"\nfile = "0001-q.patch"\nwhy = "w"\nbase = "v0.5.23"\n'
                 f'sha256 = "{hashlib.sha256(data).hexdigest()}"\n\n[entries.base_sources]\n'
                 '"python/sglang/ok.py" = "absent"\n')
    return layer


@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_layer_patch_whose_mail_git_am_decodes_is_refused_by_every_verb_before_any_write(tmp_path, tree, how):
    """Helper 107's holes 1-3: a quoted-printable or base64 body (or a flowed or multipart mail) hid a whole file
    diff from every path rule (they read the raw text); git am decoded it and committed a symlink to /root/.ssh,
    a .gitattributes or a .gitmodules on the branch. ``trailers.check_message`` refuses the file, in one line, in
    ``load_layer``: every verb, before any write."""
    layer = hostile_layer(tmp_path / "L", HOSTILE[how])
    says = "format=flowed" if how == "format-flowed" else "multipart" if how == "multipart" else "transfer encoding"
    fresh = tmp_path / "fresh"
    for verb in (["lint", "--offline"], ["check", "--sglang-rev", "v0.5.23"],
                 ["apply", "--sglang-rev", "v0.5.23", "--tree", fresh],
                 ["wheel", "--from-release", "0.5.23", "-o", tmp_path / "dist"]):
        line = refused([*verb, "--layer", layer], contains=says)
        assert "0001-q.patch" in line, line
    assert not fresh.exists() and not (tmp_path / "dist").exists()
    for verb in (["apply", "--sglang-rev", "v0.5.23", "--repo", tree], ["refresh", "--check", "--tree", tree],
                 ["refresh", "--tree", tree],
                 ["layer", "add-entry", "--from-commit", "HEAD", "--why", "w", "--tree", tree]):
        refused([*verb, "--layer", layer], tree, contains=says)
    assert Git(worktree=tree).rev_parse("refs/heads/c128/v0.5.23") is None
    assert not any(os.path.lexists(tree / p) for p in ("python/sglang/keys", "python/.gitattributes",
                                                      "python/.gitmodules"))
    with pytest.raises(C128Error, match=f"corrupt patch 0001-q.patch: .*{says}") as exc:  # the diff parser's own
        read_patch(layer / "patches" / "0001-q.patch")
    assert "\n" not in exc.value.message


@pytest.mark.parametrize("encoding", ["7bit", "8bit", "binary", " 8BIT "])
def test_a_patch_in_a_plain_transfer_encoding_is_read(tmp_path, encoding):
    """git format-patch writes 8bit (a non-ASCII message): git am reads those as they are; nothing is refused."""
    data = MAIL + f"Content-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding:{encoding}\n\n".encode() \
        + b"C128patch-Entry: evil/q\n\n---\n" + SHOWN
    layer = hostile_layer(tmp_path / "L", data)
    assert stack(load_series(REPO_ROOT), [layer]).entries[-1].name == "evil/q"
    assert read_patch(layer / "patches" / "0001-q.patch").files == ["python/sglang/ok.py"]


@pytest.fixture(scope="module")
def applied_023(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our series applied at v0.5.23 into a new clone (``apply --tree``): made once, copied for each test that starts
    there (``applied_t``)."""
    tree = tmp_path_factory.mktemp("applied-023") / "t"
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", REPO_ROOT).code == 0
    return tree


@pytest.fixture
def applied_t(applied_023: Path, tmp_path: Path) -> Path:
    """tmp_path/t after ``apply --sglang-rev v0.5.23 --tree tmp_path/t --series REPO_ROOT``: a copy of ``applied_023``
    (cp -a: its .git state with it; the tree records no absolute path of its own), for one test to change."""
    subprocess.run(["cp", "-a", str(applied_023), str(tmp_path / "t")], check=True)
    return tmp_path / "t"


@pytest.mark.parametrize("lost", ["patches/0003-c128-dspark-record-streams.v0.5.20.patch",
                                  "overlay/sglang/srt/speculative/dspark_components/c128_record_streams.py"])
def test_a_series_that_lost_a_file_is_one_line_for_status(tmp_path, applied_t, lost):
    """A series (a pull request's) whose manifest names a variant or an overlay file it no longer holds: `status` of a
    patched tree hashed the series' files for its proof key and printed a FileNotFoundError traceback."""
    from support import copy_series

    tree = applied_t
    series = copy_series(tmp_path / "series")
    (series / lost).unlink()
    refused(["status", "--tree", tree, "--series", series], tree, contains=f"{series / lost} cannot be read")


def test_a_link_at_the_temporary_name_of_a_write_is_never_written_through(tmp_path):
    """A series folder (a pull request's) holding a link at `patches/.series.toml.<pid>.tmp` (one for each likely
    pid): `lint --update-hashes` wrote the manifest into the link's target outside the folder, made series.toml that
    link, and said "nothing was written". The link is removed, the manifest written in the folder."""
    from support import copy_series

    series = copy_series(tmp_path / "series")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    manifest = series / "patches" / "series.toml"
    (series / "patches" / f".series.toml.{os.getpid()}.tmp").symlink_to(victim)  # (invoke runs in this process)
    text = manifest.read_text()
    sha = text.split('sha256 = "', 1)[1][:64]
    manifest.write_text(text.replace(sha, "0" * 64, 1))
    run = invoke("lint", "--offline", "--update-hashes", "--series", series, as_json=False)
    assert run.code == 0, run.err
    assert victim.read_text() == "precious\n"
    assert not manifest.is_symlink() and sha in manifest.read_text()


@pytest.mark.parametrize("dangling", [False, True])
def test_layer_add_entry_never_writes_through_a_link_at_the_new_patchs_name(tmp_path, applied_t, dangling):
    """Helper 185: a layer holding a link at the name its next patch gets (``0001-<subject>.patch``): add-entry's trial
    copy kept the link and wrote the patch through it into the file it names outside the layer, then refused with
    "nothing was written". It is refused naming the link before any copy; the victim is untouched (or not made)."""
    tree = applied_t
    layer = tmp_path / "L"
    assert invoke("layer", "new", layer, "--name", "site", as_json=False).code == 0
    (tree / "python" / "sglang" / "version.py").open("a").write("# site\n")
    Git(worktree=tree).run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "site fix")
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("precious\n")
    (layer / "patches" / "0001-site-fix.patch").symlink_to(victim)
    line = refused(["layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--why", "w", "--tree", tree],
                   tree, contains="patches/0001-site-fix.patch is a link (to ")
    assert "nothing was written" in line
    assert (victim.read_text() == "precious\n") if not dangling else not victim.exists()
    assert "[[entries]]" not in (layer / "patches" / "series.toml").read_text()


def test_a_huge_patch_file_is_refused_in_one_line_unread(tmp_path):
    """Helper 107's minor 32: a 20 GB sparse patch file in a layer was read whole (a MemoryError traceback). Every
    file a series carries is checked against ``manifest.MAX_SERIES_FILE`` by its size before it is read."""
    layer = hostile_layer(tmp_path / "L", b"")
    os.truncate(layer / "patches" / "0001-q.patch", 20 << 30)
    fresh = tmp_path / "fresh"
    for verb in (["lint", "--offline"], ["check", "--sglang-rev", "v0.5.23"],
                 ["apply", "--sglang-rev", "v0.5.23", "--tree", fresh]):
        line = refused([*verb, "--layer", layer], contains="0001-q.patch is 21474836480 bytes, over the 64 MiB")
        assert "Traceback" not in line and "MemoryError" not in line
    assert not fresh.exists()
    with pytest.raises(C128Error, match="over the 64 MiB"):
        read_patch(layer / "patches" / "0001-q.patch")
    link = series_folder(tmp_path / "linked", "linked")  # a link to it: readers follow links
    (link / "patches" / "0001-q.patch").symlink_to(layer / "patches" / "0001-q.patch")
    (link / "patches" / "series.toml").write_text((layer / "patches" / "series.toml").read_text()
                                                  .replace('"evil"', '"linked"'))
    with pytest.raises(C128Error, match="over the 64 MiB"):
        load_series(link)


def test_a_provenance_record_that_is_huge_or_a_link_is_refused_in_one_line_unread(tmp_path, applied_t, monkeypatch):
    """h133: a tree's `python/sglang/c128patch_provenance.json` was read whole, through whatever stood there: an 8 GB
    sparse file was read into memory (MemoryError's traceback for `status`), a link out of the tree read its target
    as the tree's record; a committed record blob was read whole too (zeros compress to nothing)."""
    from c128patch.series import provenance

    tree = applied_t
    record = tree / provenance.PROVENANCE_PATH
    good = record.rename(tmp_path / "record.json")
    record.symlink_to(good)  # a whole record, outside the tree
    refused(["status", "--tree", tree], contains=f"{provenance.PROVENANCE_PATH} goes through the symlink")
    record.unlink()
    with open(record, "wb") as f:
        f.truncate(8 << 30)  # sparse: no disk used
    refused(["status", "--tree", tree], contains="provenance file is 8589934592 bytes")
    record.unlink()
    shutil.copy(good, record)
    git = Git(worktree=tree)
    assert provenance.committed(git, "HEAD") is not None
    monkeypatch.setattr(provenance, "MAX_JSON", 100)  # the committed record is now "too big": never read
    monkeypatch.setattr(Git, "blob", lambda *args: pytest.fail("a record bigger than any was read"))
    assert provenance.committed(git, "HEAD") is None


def test_an_apply_or_rebase_journal_that_is_huge_or_a_link_is_one_line_unread(tmp_path, applied_t):
    """h133: a tree's `.git/c128patch/apply.json` or `rebase.json` was read whole, through whatever stood there: an 8 GB
    sparse file was read into memory (MemoryError's traceback for `status` and `apply --continue`), a link out of the
    tree read its target as the tree's journal."""
    tree = applied_t
    (tmp_path / "elsewhere.json").write_text("{}")
    for name in ("apply", "rebase"):
        journal = tree / ".git" / "c128patch" / f"{name}.json"
        journal.symlink_to(tmp_path / "elsewhere.json")
        refused(["status", "--tree", tree],
                contains=f"cannot read the c128patch {name} journal {journal} (Too many levels of symbolic links)")
        journal.unlink()
        with open(journal, "wb") as f:
            f.truncate(8 << 30)  # sparse: no disk used
        for verb in (["status"], [name, "--continue"]):
            refused([*verb, "--tree", tree], contains=f"cannot read the c128patch {name} journal {journal} "
                                                       "(not a regular file of at most 64 MB)")
        journal.unlink()


def test_a_manifest_config_or_ledger_that_is_huge_is_one_line_unread(tmp_path, monkeypatch):
    """h133: `read_toml` read the whole file: an 8 GB sparse `patches/series.toml`, `c128patch.toml` or the resolution
    ledger's `ledger.toml` ran `lint` (and every verb reading them) out of memory, MemoryError's traceback."""
    def huge(path: Path) -> Path:
        path.unlink(missing_ok=True)
        with open(path, "wb") as f:
            f.truncate(8 << 30)  # sparse: no disk used
        return path

    series = series_folder(tmp_path / "s")
    huge(series / "patches" / "series.toml")
    refused(["lint", "--series", series], contains="not a series manifest (not a regular file of at most 64 MiB")
    operator = tmp_path / "op"
    operator.mkdir()
    huge(operator / CONFIG)
    monkeypatch.chdir(operator)
    monkeypatch.delenv(ENV, raising=False)
    refused(["lint", "--series", REPO_ROOT], contains="not a valid c128patch config (over 64 KiB")
    ledger = series_folder(tmp_path / "l")
    (ledger / "patches" / "resolutions").mkdir()
    huge(ledger / "patches" / "resolutions" / "ledger.toml")
    with pytest.raises(C128Error, match="not a resolution ledger \\(not a regular file of at most 1 MiB"):
        Ledger(load_series(ledger)).rows()


def test_read_toml_reads_no_file_that_is_not_regular(tmp_path):
    """Helper 175 (rule 7 check): the row "read only as regular files of at most 64 MiB" named only the huge-file test;
    with `read_toml`'s regular-file check taken out it and every FIFO test still passed (a FIFO read as empty TOML,
    `{}`: a manifest of no entries). Its own proof: a FIFO and a folder are one line, never read."""
    from c128patch.series.manifest import read_toml

    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "folder.toml").mkdir()
    for name in ("fifo.toml", "folder.toml"):
        with pytest.raises(C128Error, match=r"^BAD \((not a regular file of at most 64 MiB|cannot read it)"):
            read_toml(tmp_path / name, "BAD")


def test_a_manifest_config_or_ledger_holding_an_integer_past_pythons_digit_limit_is_one_line(tmp_path, monkeypatch):
    """h152: `x = 999...` (5,000 digits, 5 KB) in `patches/series.toml`, `c128patch.toml` or `ledger.toml`: tomllib's
    int() raised ValueError (not a TOMLDecodeError): `lint` (and every verb reading them) printed its traceback."""
    big = "9" * 5000
    series = series_folder(tmp_path / "s")
    (series / "patches" / "series.toml").write_text(SERIES.format(name="s") + f"x = {big}\n")
    refused(["lint", "--offline", "--series", series], contains="not a series manifest (not readable as TOML: Exceeds")
    operator = tmp_path / "op"
    operator.mkdir()
    (operator / CONFIG).write_text(f"[layers]\npaths = []\nx = {big}\n")
    monkeypatch.chdir(operator)
    monkeypatch.delenv(ENV, raising=False)
    refused(["lint", "--offline", "--series", REPO_ROOT], contains="not a valid c128patch config (not readable as TOML")
    ledger = series_folder(tmp_path / "l")
    (ledger / "patches" / "resolutions").mkdir()
    (ledger / "patches" / "resolutions" / "ledger.toml").write_text(f"x = {big}\n")
    with pytest.raises(C128Error, match="not a resolution ledger \\(not readable as TOML"):
        Ledger(load_series(ledger)).rows()


def test_the_proof_key_reads_the_resolutions_folder_as_the_ledger_does(tmp_path, monkeypatch):
    """h152: `proofs.proof_key` (every apply's proof, every status) read each file under a part's `patches/resolutions/`
    whole and through links: an 8 GB sparse file there (a layer's) ran `apply` out of memory after its commits. Now as
    the ledger reads it: at most the series files' limit (one line naming it), nothing through a link."""
    from c128patch.ops.proofs import proof_key
    from c128patch.series import manifest

    monkeypatch.setattr(manifest, "MAX_SERIES_FILE", 1 << 20)  # (the 64 MiB limit, made small to keep the test fast)
    root = series_folder(tmp_path / "s")
    (root / "patches" / "resolutions").mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"a" * (2 << 20))
    (root / "patches" / "resolutions" / "link").symlink_to(outside)
    key = proof_key(None, load_series(root), "v0.5.23", "c" * 40, "h" * 40, tree="t" * 40)  # type: ignore[arg-type]
    outside.write_bytes(b"b")
    assert proof_key(None, load_series(root), "v0.5.23", "c" * 40, "h" * 40, tree="t" * 40) == key  # never read
    with open(root / "patches" / "resolutions" / "huge", "wb") as f:
        f.truncate(2 << 20)
    with pytest.raises(C128Error, match="resolutions/huge is 2097152 bytes, over the 1 MiB"):
        proof_key(None, load_series(root), "v0.5.23", "c" * 40, "h" * 40, tree="t" * 40)  # type: ignore[arg-type]


def test_a_ledger_is_capped_in_bytes_and_rows_to_what_real_ones_hold(tmp_path):
    """h146: a 64 MiB `ledger.toml` (under the series files' limit) took ~15 s to parse, at every verb reading it, and
    its rows were not counted. Ours holds 3 rows in 591 bytes: a ledger is read only up to 1 MiB and 5,000 rows, else
    one line naming it; one of 4,000 real-sized rows reads."""
    from c128patch.series.ledger import MAX_LEDGER, MAX_LEDGER_ROWS

    series = load_series(series_folder(tmp_path / "s"))
    (tmp_path / "s/patches/resolutions").mkdir()
    ledger = tmp_path / "s/patches/resolutions/ledger.toml"
    row = {"entry": "c128-dspark-record-streams", "key": "0123456789abcdef0123", "match": "0123456789abcdef0123",
           "file": "python/sglang/srt/speculative/eagle_worker.py", "from": "v0.5.22", "onto": "v0.5.23"}
    ledger.write_text(tomli_w.dumps({"resolutions": [row] * 4000}))
    assert len(Ledger(series).rows()) == 4000
    ledger.write_text("resolutions = [" + ",".join(['{entry="e",key="0",file="f"}'] * (MAX_LEDGER_ROWS + 1)) + "]\n")
    with pytest.raises(C128Error, match=f"not a resolution ledger \\({MAX_LEDGER_ROWS + 1} resolutions, over the "):
        Ledger(series).rows()
    ledger.write_text("# " + "x" * MAX_LEDGER + "\nresolutions = []\n")
    with pytest.raises(C128Error, match="not a resolution ledger \\(not a regular file of at most 1 MiB: not read"):
        Ledger(series).rows()


def test_status_never_reads_an_overlay_target_bigger_than_any_overlay(tmp_path, applied_t, monkeypatch):
    """h133: `status` hashed each overlay's target in the tree read whole: an 8 GB sparse file there ran it out of
    memory (MemoryError's traceback). A file bigger than any overlay may be is drift, unread."""
    from c128patch.series.manifest import MAX_SERIES_FILE

    tree = applied_t
    target = "python/sglang/srt/speculative/dspark_components/c128_record_streams.py"
    (tree / target).unlink()
    with open(tree / target, "wb") as f:
        f.truncate(8 << 30)  # sparse: no disk used
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: (read_bytes(self) if self.stat().st_size <= MAX_SERIES_FILE
                                                          else pytest.fail(f"{self} read whole")))
    run = invoke("status", "--tree", tree)
    assert {"entry": "c128-dspark-record-streams-helper", "files": {target: "modified"}} in run.out["drift"], run.out


def damaged_cache_copy(release_repo: Path, tmp_path: Path, spots, junk: bytes) -> Path:
    """A copy of the release cache (``tmp_path/cache``) whose packs have ``junk`` written at ``spots(size)``."""
    cache = tmp_path / "cache"
    cache.mkdir()
    root = cache / release_repo.name
    shutil.copytree(release_repo, root)
    (cache / "wheels").symlink_to(release_repo.parent / "wheels")
    for pack in (root / "objects" / "pack").glob("*.pack"):
        pack.chmod(0o644)
        with open(pack, "r+b") as f:
            for at in spots(pack.stat().st_size):
                f.seek(at)
                f.write(junk)
    return root


def test_a_pack_of_the_release_cache_damaged_past_its_refs_is_one_line_saying_how_to_rebuild(sglang_release_repo,
                                                                                            tmp_path, monkeypatch):
    """h133: bytes of the release history's pack damaged where no tag or commit lies (a disk error, a bad copy): the
    cache's check reads refs and commits only, so `apply` cloned it and failed at the checkout with git's "inflate:
    data stream error", the clone removed, never naming the cache nor how to rebuild it."""
    root = damaged_cache_copy(sglang_release_repo, tmp_path, lambda size: range(size // 3, size // 3 + 50 * 4096, 4096),
                              b"\xde\xad\xbe\xef" * 4)
    monkeypatch.setenv("C128PATCH_CACHE", str(root.parent))
    line = refused(["apply", "--sglang-rev", "v0.5.23", "--tree", tmp_path / "t"],
                   contains=f"the release cache {root} is damaged: rebuild it: rm -rf {root}")
    assert not (tmp_path / "t").exists(), line


def test_check_on_a_release_cache_pack_damaged_past_its_refs_says_the_cache_and_how_to_rebuild(sglang_release_repo,
                                                                                                tmp_path, monkeypatch):
    """Helper 187: the same damage as above made `check` say only git's "git cat-file blob ... failed: error: inflate:
    data stream error", naming neither the cache nor the fix (`apply` said both)."""
    # (every 256 KiB past the first MiB: the blobs check reads are somewhere there)
    root = damaged_cache_copy(sglang_release_repo, tmp_path, lambda size: range(1 << 20, size - 4096, 1 << 18),
                              b"\xde\xad\xbe\xef" * 16)
    monkeypatch.setenv("C128PATCH_CACHE", str(root.parent))
    refused(["check", "--sglang-rev", "v0.5.23"],
            contains=f"the release cache {root} is damaged: rebuild it: rm -rf {root}")


@pytest.mark.parametrize("verb", ["apply", "check"])
def test_a_release_cache_missing_a_blob_is_the_cache_damaged_never_a_conflict(sglang_release_repo, tmp_path,
                                                                              monkeypatch, verb):
    """Helper 187: one blob of v0.5.23 missing from the cache's packs (its refs, commits and trees sound): git's
    checkout exited 0 with the file left out, and `apply` said entry c128-plan-zero-rows "does not apply", the clone
    left with a conflict; `check` said git's "bad file" alone. Both now say the cache is damaged and how to rebuild."""
    cache = tmp_path / "cache"
    cache.mkdir()
    root = cache / sglang_release_repo.name
    shutil.copytree(sglang_release_repo, root)
    (cache / "wheels").symlink_to(sglang_release_repo.parent / "wheels")
    git = ["git", "--git-dir", str(root)]
    blob = subprocess.run([*git, "rev-parse", "v0.5.23:python/sglang/srt/environ.py"], check=True,
                          capture_output=True, text=True).stdout.strip()
    objects = subprocess.run([*git, "rev-list", "--objects", "--all"], check=True, capture_output=True,
                             text=True).stdout.splitlines()
    keep = "".join(line.split(" ", 1)[0] + "\n" for line in objects if not line.startswith(blob))
    old = list((root / "objects" / "pack").iterdir())
    subprocess.run([*git, "pack-objects", "-q", str(root / "objects" / "pack" / "pack")], input=keep, check=True,
                   capture_output=True, text=True)
    for path in old:
        path.unlink()
    for loose in (root / "objects").glob("??/*"):
        loose.unlink()
    monkeypatch.setenv("C128PATCH_CACHE", str(cache))
    args = ["apply", "--sglang-rev", "v0.5.23", "--tree", tmp_path / "t"] if verb == "apply" else \
        ["check", "--sglang-rev", "v0.5.23"]
    refused(args, contains=f"the release cache {root} is damaged: rebuild it: rm -rf {root}")
    assert not (tmp_path / "t").exists()


def test_a_release_cache_whose_config_gives_it_a_work_tree_is_refused_saying_how_to_fix_it(sglang_release_repo,
                                                                                          tmp_path, monkeypatch):
    """Helper 168: a release cache whose config says `core.bare = false` and `core.worktree = DIR` (a git dir with a
    work tree elsewhere) had `check` run `git apply --cached` against it: every entry "does not exist in index", "NOT
    all apply", on a sound release (under that folder). One line; the printed command makes it read as the bare
    repository it is."""
    from support import invoke, printed_command, run_printed

    cache = tmp_path / "cache"
    cache.mkdir()
    root = cache / sglang_release_repo.name
    shutil.copytree(sglang_release_repo, root)
    (cache / "wheels").symlink_to(sglang_release_repo.parent / "wheels")
    for key, value in (("core.bare", "false"), ("core.worktree", str(tmp_path))):  # (a folder holding the cache)
        subprocess.run(["git", "-C", str(root), "config", key, value], check=True)
    monkeypatch.setenv("C128PATCH_CACHE", str(cache))
    line = refused(["check", "--sglang-rev", "v0.5.23"], contains=f"{root}: its git config gives it the work tree")
    assert run_printed(printed_command(line, "git -C ")).returncode == 0
    assert invoke("check", "--sglang-rev", "v0.5.23", as_json=False).code == 0


def test_a_commit_graph_in_the_release_cache_is_refused_saying_how_to_rebuild(sglang_release_repo, tmp_path,
                                                                             monkeypatch):
    """h146: a commit-graph in the release cache (which never writes one) saying v0.5.23's commit has v0.5.22's tree:
    git's `log --format=%T` read the forged tree; `apply` cloned it into the user's tree (whose `git diff v0.5.23`
    then showed 2,099 files changed) and said "identical". Refused before any clone, one line naming the cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    root = cache / sglang_release_repo.name
    shutil.copytree(sglang_release_repo, root)
    (cache / "wheels").symlink_to(sglang_release_repo.parent / "wheels")
    git = Git(git_dir=root)
    git.run("commit-graph", "write", "--reachable")
    graph = root / "objects" / "info" / "commit-graph"
    real, older = (bytes.fromhex(git.out("rev-parse", f"{tag}^{{tree}}")) for tag in ("v0.5.23", "v0.5.22"))
    graph.chmod(0o644)
    graph.write_bytes(graph.read_bytes().replace(real, older))
    assert git.out("log", "-1", "--format=%T", "v0.5.23") == older.hex()  # git reads the forged tree
    monkeypatch.setenv("C128PATCH_CACHE", str(cache))
    for verb in (["apply", "--sglang-rev", "v0.5.23", "--tree", tmp_path / "t"], ["check", "--sglang-rev", "v0.5.23"]):
        refused(verb, contains=f"the release cache {root} holds objects/info/commit-graph, which this tool never "
                               f"writes (git would read the releases' trees from it, not from the commits); rebuild "
                               f"it: rm -rf {root}")
    assert not (tmp_path / "t").exists()
    graph.rename(tmp_path / "commit-graph")  # the same graph in another object store the cache borrows from
    (tmp_path / "alt" / "info").mkdir(parents=True)
    (root / "objects" / "info" / "alternates").write_text(f"{tmp_path / 'alt'}\n")
    (tmp_path / "commit-graph").rename(tmp_path / "alt" / "info" / "commit-graph")
    assert git.out("log", "-1", "--format=%T", "v0.5.23") == older.hex()  # read there too
    refused(["check", "--sglang-rev", "v0.5.23"], contains=f"the release cache {root} holds objects/info/alternates")


def test_a_pack_index_of_the_release_cache_damaged_is_one_line_saying_how_to_rebuild(sglang_release_repo, tmp_path,
                                                                                   monkeypatch):
    """h146: 100 bytes of the release history's pack index damaged (a disk error, a bad copy): git found some objects
    where they are not, and `apply` said entry c128-plan-zero-rows "does not apply to v0.5.23" (exit 1, a conflict
    left in a fresh tree). The index's own checksum is checked first (~1 ms): one line naming the cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    root = cache / sglang_release_repo.name
    shutil.copytree(sglang_release_repo, root)
    (cache / "wheels").symlink_to(sglang_release_repo.parent / "wheels")
    monkeypatch.setenv("C128PATCH_CACHE", str(cache))
    idx = max((root / "objects" / "pack").glob("*.idx"), key=lambda p: p.stat().st_size)
    idx.chmod(0o644)
    data = idx.read_bytes()
    idx.write_bytes(data[:2000] + b"\xff" * 100 + data[2100:])
    for verb in (["apply", "--sglang-rev", "v0.5.23", "--tree", tmp_path / "t"], ["check", "--sglang-rev", "v0.5.23"]):
        refused(verb, contains=f"the release cache {root} is corrupt (objects/pack/{idx.name} fails its checksum); "
                               f"rebuild it: rm -rf {root}")
    assert not (tmp_path / "t").exists()
    idx.write_bytes(data)
    assert invoke("check", "--sglang-rev", "v0.5.23").code == 0


def test_apply_repo_with_a_damaged_pack_index_is_one_line_not_a_conflict(sglang_release_repo, tmp_path):
    """h146: `apply --repo BARE` whose pack index is damaged: the fresh clone shares it, git found some objects where
    they are not, and apply said entry c128-plan-zero-rows "does not apply" (a conflict, the clone left). At a stop in
    a fresh clone the source's indexes are checked (only then): one line naming the repository, the clone removed."""
    repo = tmp_path / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--no-hardlinks", str(sglang_release_repo), str(repo)], check=True)
    idx = max((repo / "objects" / "pack").glob("*.idx"), key=lambda p: p.stat().st_size)
    idx.chmod(0o644)
    data = idx.read_bytes()
    idx.write_bytes(data[:2000] + b"\xff" * 100 + data[2100:])
    refused(["apply", "--repo", repo, "--sglang-rev", "v0.5.23", "--tree", tmp_path / "t"],
            contains=f"the repository {repo.resolve()} is damaged (objects/pack/{idx.name} fails its checksum), not "
                     f"the series: check it (git -C {repo.resolve()} fsck), then repair it or clone it again")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "work-tree"])
def test_the_operators_repo_path_with_a_damaged_pack_index_is_one_line_naming_it_and_fsck(sglang_release_repo,
                                                                                         tmp_path, bare):
    """Helper 170: `--repo PATH` (a clone of one pack) whose pack index is damaged: `check` said "all apply" or
    "unknown rev 'v0.5.23'", `lint --repo` "git read-tree ... failed: fatal: unable to read tree", `lint` passed
    with "base ... not in the upstream repository" (git's words, or none, naming neither the repository nor a
    check). Its indexes are checked when it is opened, as the mirror's: one line naming it and `git -C PATH fsck`,
    which works as printed (and finds the damage)."""
    repo = tmp_path / ("repo.git" if bare else "repo")
    subprocess.run(["git", "clone", "-q", *(["--bare"] if bare else ["--no-checkout"]),
                    f"file://{sglang_release_repo}", str(repo)], check=True)
    objects = repo / ("objects" if bare else ".git/objects")
    (idx,) = (objects / "pack").glob("*.idx")
    idx.chmod(0o644)
    data = idx.read_bytes()
    count = int.from_bytes(data[8 + 255 * 4:8 + 256 * 4], "big")
    offsets = 8 + 1024 + 24 * count  # every object's offset in the pack: 4096
    idx.write_bytes(data[:offsets] + b"\0\0\x10\0" * count + data[offsets + 4 * count:])
    for verb in (["check", "--sglang-rev", "v0.5.23"], ["apply", "--sglang-rev", "v0.5.23", "--tree", tmp_path / "t"],
                 ["lint"]):
        line = refused([*verb, "--repo", repo], contains=f"the repository {repo.resolve()} is damaged "
                       f"({objects.relative_to(repo)}/pack/{idx.name} fails its checksum), not the series: check it "
                       f"(git -C {repo.resolve()} fsck), then repair it or clone it again")
    assert not (tmp_path / "t").exists()
    fsck = subprocess.run(shlex.split(line.split("check it (", 1)[1].split(")", 1)[0]), capture_output=True, text=True)
    assert fsck.returncode != 0 and idx.stem in fsck.stderr, fsck.stderr
    idx.write_bytes(data)
    assert invoke("check", "--repo", repo, "--sglang-rev", "v0.5.23").code == 0


def test_a_tree_with_a_damaged_pack_index_is_one_line_naming_it_and_fsck_for_every_verb(applied_t, monkeypatch):
    """Helper 174: the tree's own pack index damaged: `status` said "equals the series" (exit 0), `refresh --check`
    "series is up to date", `rebase` "git log ... failed: fatal: unable to read tree" (git's words). The tree's
    indexes are checked where its Git is opened (`locate_tree`), as `--repo PATH`'s: one line naming it and
    `git -C T fsck`, which works as printed."""
    import shlex

    idx = max((applied_t / ".git" / "objects" / "pack").glob("*.idx"), key=lambda p: p.stat().st_size)
    data = idx.read_bytes()
    idx.unlink()  # (a copy of its own: never the cache's file, to which apply's clone links it)
    idx.write_bytes(data[:2000] + b"\xff" * 100 + data[2100:])
    want = (f"the repository {applied_t.resolve()} is damaged (.git/objects/pack/{idx.name} fails its checksum), not "
            f"the series: check it (git -C {applied_t.resolve()} fsck), then repair it or clone it again")
    for verb in (["status", "--tree", applied_t], ["refresh", "--check", "--tree", applied_t],
                 ["rebase", "--onto", "v0.5.22", "--tree", applied_t], ["contract", "--tree", applied_t],
                 ["treecheck", "--no-run", "--tree", applied_t]):
        line = refused(verb, contains=want)
    monkeypatch.chdir(applied_t)  # the tree found from inside it, as README says (contract's: not "no tree here")
    refused(["status"], contains=want)
    refused(["contract"], contains=want)
    fsck = subprocess.run(shlex.split(line.split("check it (", 1)[1].split(")", 1)[0]), capture_output=True, text=True)
    assert fsck.returncode != 0 and idx.stem in fsck.stderr, fsck.stderr
    idx.write_bytes(data)
    assert invoke("status").code == 0


def test_a_urls_mirror_in_the_cache_with_a_damaged_pack_index_is_one_line_saying_how_to_rebuild(
        sglang_release_repo, tmp_path, monkeypatch):
    """Helper 163: a `--repo URL`'s mirror in the cache whose pack index is damaged gave `check` and `apply` "git
    ls-tree -r ... failed: error: Could not read <id>", naming neither the cache nor a fix (the release history's own
    indexes are checked at every use). The mirror's are too: one line naming it, whose rm -rf works as printed."""
    import hashlib
    import shlex

    from c128patch.upstream.source import MIRROR_DONE

    origin = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--no-hardlinks", str(sglang_release_repo), str(origin)],
                   check=True)
    url = f"file://{origin}"
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    mirror = tmp_path / "cache" / "remotes" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    mirror.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--mirror", "--no-hardlinks", url, str(mirror)], check=True)
    (mirror / MIRROR_DONE).write_text(url + "\n")
    idx = max((mirror / "objects" / "pack").glob("*.idx"), key=lambda p: p.stat().st_size)
    idx.chmod(0o644)
    data = idx.read_bytes()
    idx.write_bytes(data[:2000] + b"\xff" * 100 + data[2100:])
    for verb in (["check"], ["apply", "--tree", tmp_path / "t"]):
        line = refused([*verb, "--repo", url, "--sglang-rev", "v0.5.23"],
                       contains=f"the mirror {mirror} of {url} in the cache is corrupt (objects/pack/{idx.name} fails "
                                "its checksum); rebuild it: rm -rf ")
        assert not (tmp_path / "t").exists()
    subprocess.run(shlex.split(line.split("rebuild it: ", 1)[1].split(" (the next run", 1)[0]), check=True)
    assert invoke("check", "--repo", url, "--sglang-rev", "v0.5.23").code == 0


def test_a_huge_contract_lock_or_cuda_only_table_is_one_line_unread(tmp_path, monkeypatch):
    """h133: `patches/contract.lock` (`lint`, `contract`) and `patches/env/cuda-only.toml` (the tier's environment) were
    read whole: an 8 GB sparse one ran the verb out of memory (MemoryError's traceback). Read as every series file is:
    at most 64 MiB, else one line naming it."""
    from c128patch.fit.env import cuda_only, lock_for
    from c128patch.series.contract import read_lock

    for method in ("read_bytes", "read_text"):
        def unread(self: Path, *args, _read=getattr(Path, method), **kwargs):
            return _read(self, *args, **kwargs) if self.stat().st_size < 1 << 26 else pytest.fail(f"{self} read whole")
        monkeypatch.setattr(Path, method, unread)
    series = series_folder(tmp_path / "s")
    (series / "patches" / "env").mkdir()
    for name in ("contract.lock", "env/cuda-only.toml"):
        with open(series / "patches" / name, "wb") as f:
            f.truncate(8 << 30)  # sparse: no disk used
    with pytest.raises(C128Error, match="contract.lock is 8589934592 bytes, over the 64 MiB"):
        read_lock(series / "patches")
    with pytest.raises(C128Error, match="cuda-only.toml is 8589934592 bytes, over the 64 MiB"):
        cuda_only(load_series(series))
    (series / "patches" / "env" / "cuda-only.toml").unlink()
    with open(series / "patches" / "env" / "torch.lock", "wb") as f:  # a committed lock of the tier's environment
        f.truncate(8 << 30)
    tree = tmp_path / "tree"
    (tree / "python").mkdir(parents=True)
    (tree / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\ndependencies = ["numpy"]\n')
    with pytest.raises(C128Error, match="torch.lock is 8589934592 bytes, over the 64 MiB"):
        lock_for(load_series(series), tree)


@pytest.mark.parametrize("make", ["link", "file"])
def test_a_mirror_in_the_cache_that_is_a_link_or_a_file_is_one_line_and_nothing_removed(tmp_path, monkeypatch, make):
    """h133: a `--repo URL`'s mirror in the cache (`remotes/<hash>.git`) that is a link (or a file) and holds no marker
    of a finished clone was removed with rmtree: OSError's (NotADirectoryError's) traceback."""
    import hashlib

    url = "file:///nonexistent/upstream.git"
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    mirror = tmp_path / "cache" / "remotes" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    mirror.parent.mkdir(parents=True)
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "kept").write_text("x")
    mirror.symlink_to(tmp_path / "victim") if make == "link" else mirror.write_text("x")
    refused(["check", "--repo", url, "--sglang-rev", "v0.5.23"],
            contains=f"the mirror {mirror} of {url} in the cache is not a folder (a link or a file): not used")
    assert (tmp_path / "victim" / "kept").is_file() and (mirror.is_symlink() or mirror.is_file())


@pytest.mark.parametrize("name", ["HEAD", "config", "packed-refs"])
def test_a_fifo_in_a_urls_mirror_in_the_cache_is_one_line_never_a_hang(tmp_path, monkeypatch, name):
    """Helper 187: a FIFO at a `--repo URL` mirror's HEAD, config or packed-refs made git wait forever (`check --repo
    URL` hung with no word), as at the release history's. One line naming the mirror, with an `rm -rf` that works."""
    import hashlib

    from c128patch.upstream.source import MIRROR_DONE

    url = "file:///nonexistent/upstream.git"
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    mirror = tmp_path / "cache" / "remotes" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    mirror.parent.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    (mirror / MIRROR_DONE).write_text(url + "\n")
    (mirror / name).unlink(missing_ok=True)
    os.mkfifo(mirror / name)
    refused(["check", "--repo", url, "--sglang-rev", "v0.5.23"],
            contains=f"the mirror {mirror} of {url} in the cache: {name} is a FIFO, not a regular file as git writes "
                     f"it (git would wait on a FIFO there, or follow a link out of the cache); rebuild it: rm -rf "
                     f"{mirror}")


@pytest.mark.parametrize("name", ["my layer", "l\x1b[2J"], ids=["space", "escape"])
def test_the_layer_new_a_missing_layer_prints_works_as_printed(tmp_path, monkeypatch, name):
    """helper 167: "no layer at my layer: ... (make one with c128patch layer new my layer --name NAME)": run as printed
    it made ``my/`` and refused the extra ``layer``; an ESC in the name was dropped from the printed path."""
    from support import printed_command, run_printed

    monkeypatch.chdir(tmp_path)
    line = refused(["lint", "--offline", "--layer", name], contains="no layer at")
    made = run_printed(printed_command(line, "c128patch layer new").replace("NAME", "mine"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / name / "patches" / "series.toml").is_file()


def test_a_repo_path_borrowing_objects_from_a_damaged_store_is_one_line_naming_that_store(sglang_release_repo,
                                                                                           tmp_path):
    """Round 31 left: the pack-index check read the repository's own packs only. A clone made with `--shared` (or
    `--reference`) reads its objects from another store (objects/info/alternates): that store's damaged index gave
    git's words again. The borrowed stores are checked too, as git follows them; the line names the damaged index
    by its absolute path and `git -C PATH fsck`, which works as printed and finds it."""
    import shlex

    lender = tmp_path / "lender.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--no-hardlinks", str(sglang_release_repo), str(lender)],
                   check=True)
    borrower = tmp_path / "borrower"
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(lender), str(borrower)], check=True)
    assert not list((borrower / ".git" / "objects" / "pack").glob("*.idx"))  # every object is the lender's
    idx = max((lender / "objects" / "pack").glob("*.idx"), key=lambda p: p.stat().st_size)
    idx.chmod(0o644)
    data = idx.read_bytes()
    idx.write_bytes(data[:2000] + b"\xff" * 100 + data[2100:])
    line = refused(["check", "--repo", borrower, "--sglang-rev", "v0.5.23"],
                   contains=f"the repository {borrower.resolve()} is damaged ({idx.resolve()} fails its checksum), "
                            f"not the series: check it (git -C {borrower.resolve()} fsck)")
    fsck = subprocess.run(shlex.split(line.split("check it (", 1)[1].split(")", 1)[0]), capture_output=True, text=True)
    assert fsck.returncode != 0, fsck.stderr
    idx.write_bytes(data)
    assert invoke("check", "--repo", borrower, "--sglang-rev", "v0.5.23").code == 0


def test_a_full_disk_under_the_release_cache_is_one_line_naming_it(fake_releases, tmp_path, monkeypatch):
    """Helper 181: the cache's disk full as its trees record (``c128patch-trees``) was written: OSError's traceback
    (ENOSPC) out of `apply`. One line naming the cache's folder, exit 2; no temporary file left there."""
    import errno

    from c128patch import jsonio
    from c128patch.upstream.releases import ReleaseHistory

    root = ReleaseHistory().ensure()
    (root / "c128patch-trees").unlink()  # written again by the next run

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonio.os, "fsync", full)
    res = invoke("check", "--sglang-rev", "v0.5.23", as_json=False)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith(f"c128patch: error: cannot write in {root} (No space left on device)"), \
        res.err
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]
