"""State files read back as untrusted input: a series manifest, an apply journal and a resolution
ledger that are malformed or nested 100,000 deep give one line and a non-zero exit, never a
traceback (RecursionError included), and change nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.ops.applier import already_applied
from c128patch.ops.apply import refuse_switching, refuse_taken_branch
from c128patch.series.ledger import Ledger
from c128patch.series.manifest import load_series
from c128patch.series.provenance import PROVENANCE_PATH
from c128patch.upstream.source import Target
from small_series import series, tree  # noqa: F401 (fixtures)
from support import REPO_ROOT, copy_series, invoke, refused, small_clone, snapshot

DEEP_TOML = "x = " + "[" * 100_000 + "]" * 100_000 + "\n"
DEEP_JSON = "[" * 100_000 + "]" * 100_000


def test_a_deeply_nested_series_manifest_is_one_line(tmp_path: Path):
    series = tmp_path / "series"
    (series / "patches").mkdir(parents=True)
    (series / "patches" / "series.toml").write_text(DEEP_TOML)
    refused(["lint", "--series", series, "--offline"], contains="nested too deeply to read")


def test_a_deeply_nested_apply_journal_is_one_line(sglang_release_repo: Path, tmp_path: Path):
    git = small_clone(sglang_release_repo, tmp_path / "t")
    state = git.worktree / ".git" / "c128patch"
    state.mkdir()
    (state / "apply.json").write_text(DEEP_JSON)
    before = snapshot(git.worktree)
    line = refused(["status", "--tree", git.worktree], contains="nested too deeply to read")
    assert "apply journal" in line
    assert snapshot(git.worktree) == before


@pytest.mark.parametrize("ledger, said", [
    ("resolutions = [", "not valid TOML"),
    (DEEP_TOML, "nested too deeply to read"),
    ("resolutions = 3\n", "'resolutions' must be an array of tables"),
    ("resolutions = [1]\n", "resolution #1 needs string fields"),
    ('[[resolutions]]\nentry = "e"\nkey = 1\nfile = "f"\n', "resolution #1 needs string fields"),
])
def test_a_malformed_resolution_ledger_is_one_line(tmp_path: Path, ledger: str, said: str):
    series = load_series(copy_series(tmp_path / "s"))
    index = Ledger(series).index
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(ledger)
    with pytest.raises(C128Error) as err:
        Ledger(series).rows()
    assert f"{index}: not a resolution ledger (" in err.value.message and said in err.value.message
    assert "\n" not in err.value.message
    with pytest.raises(C128Error):
        Ledger(series).has("anything")  # what rebase asks first


@pytest.mark.parametrize("record", ['{"upstream": []}', '{"upstream": "x"}', DEEP_JSON], ids=["list", "str", "deep"])
def test_a_hostile_committed_provenance_is_no_record_to_apply_not_a_traceback(tmp_path: Path, record: str):
    """apply reads the provenance a tree's branch commits (an upstream may commit one) in three places; each read
    it its own way: an 'upstream' that is not an object, or one nested 100,000 deep, was a traceback."""
    tree = tmp_path / "sglang"
    (tree / PROVENANCE_PATH).parent.mkdir(parents=True)
    (tree / PROVENANCE_PATH).write_text(record)
    git = Git(worktree=tree)
    git.run("init", "-q", "-b", "b")
    git.run("add", "-A")
    git.run("commit", "-q", "-m", "upstream: a provenance of its own")
    git.run("commit", "-q", "--allow-empty", "-m", "a commit on top")
    target, series = Target("v0.5.23", "0" * 40, "release"), load_series(REPO_ROOT)
    with pytest.raises(C128Error, match=r"holds .* applying v0\.5\.23 there would switch it to a new branch b"):
        refuse_switching(tree, target, "b", series)
    assert already_applied(series, git, "b", target) is None
    refuse_taken_branch(series, git, "b", target)  # no record: nothing it holds to protect


@pytest.mark.parametrize("folders", ["[", "5", "[1]", DEEP_JSON, b"\xff", '["/a\\u0000b"]'],
                         ids=["bad", "int", "list", "deep", "bytes", "nul"])  # (nul: h146, ValueError's traceback)
def test_an_unreadable_record_of_a_trees_layer_folders_is_one_line(tmp_path: Path, folders):
    """Every verb in a layered tree reads the folders its layers were applied from (the git dir's layers.json):
    one that is not a list of paths was a traceback (ValueError, TypeError, RecursionError, UnicodeDecodeError)."""
    from c128patch.ops.treestate import c128_state_dir, tree_layers

    record = {"layers": [{"name": "acme", "version": "1", "digest": "0" * 64}]}
    (tmp_path / PROVENANCE_PATH).parent.mkdir(parents=True)
    (tmp_path / PROVENANCE_PATH).write_text(json.dumps(record))
    git = Git(worktree=tmp_path)
    git.run("init", "-q")
    c128_state_dir(git).mkdir()
    (c128_state_dir(git) / "layers.json").write_bytes(folders if isinstance(folders, bytes) else folders.encode())
    with pytest.raises(C128Error, match=r"was applied with layer\(s\) acme .*: name their folders"):
        tree_layers(git)


def test_damaged_trees_in_a_recorded_proof_are_none(tmp_path: Path):
    """The fresh replay's trees a proof records (a rebase compares the branch's commits with them) are state, so
    input: damaged, of another shape or under another key, they are none (the rebase replays), not a traceback."""
    from c128patch.ops.proofs import PROOF, recorded_trees

    key = {"head": "h"}
    for text in ("[", DEEP_JSON, *(f'{{"key": {{"head": "h"}}, "trees": {t}}}' for t in
                                   ("[]", '{"e": 5}', '{"e": ["a"]}', '{"e": [1, 2]}', DEEP_JSON,
                                    f'{{"e": ["--output=/tmp/x", "{"b" * 40}"]}}'))):
        (tmp_path / PROOF).write_text(text)
        assert recorded_trees(tmp_path, key) is None
    a, b = "a" * 40, "b" * 40
    (tmp_path / PROOF).write_text(f'{{"key": {{"head": "h"}}, "trees": {{"e": ["{a}", "{b}"]}}}}')
    assert recorded_trees(tmp_path, key) == {"e": (a, b)} and recorded_trees(tmp_path, {"head": "x"}) is None


@pytest.mark.parametrize("text", ["[", DEEP_JSON, "{}", '[{"path": "a.py"}]',
                                  '[{"path": 1, "key": "", "text": "", "match": ""}]',
                                  *(f'[{{"path": "{p}", "key": "ab", "text": "", "match": ""}}]'
                                    for p in ("../../victim", "/etc/passwd", ".git/hooks/post-commit", "python/a.py"))],
                         ids=["bad", "deep", "object", "short", "int", "dotdot", "absolute", "git", "another-key"])
def test_a_forged_or_damaged_conflicts_json_is_one_line_and_names_no_path_outside_the_tree(tmp_path: Path, text):
    """``rebase --continue`` reads the conflicts a stop saved in the git dir: input. A damaged one was a traceback
    (ValueError, TypeError); a path outside the tree reached the ledger's records."""
    from c128patch.ops.rebase_journal import save_conflicts, saved_conflicts
    from c128patch.ops.treestate import rebase_command
    from c128patch.series.ledger import Conflict

    tree = tmp_path / "a tree"  # the undo it says names it (a bare `c128patch rebase --abort` works only inside it)
    assert saved_conflicts(tmp_path, tree) == []
    saved = [Conflict.of("python/a.py", "<<<<<<<\nx\n=======\ny\n>>>>>>>\n")]
    save_conflicts(tmp_path, saved)
    assert saved_conflicts(tmp_path, tree) == saved
    (tmp_path / "conflicts.json").write_text(text)
    with pytest.raises(C128Error, match=r"conflicts\.json") as exc:
        saved_conflicts(tmp_path, tree)
    assert f"`{rebase_command(tree, 'abort')}` undoes the rebase" in exc.value.message


def test_a_trees_recorded_layer_folders_must_be_the_operators(tmp_path: Path):
    """The git dir's layers.json (``remember_layers``) names the folders every verb in a layered tree loads: one
    inside a tree the tool patches (the tree's own, a layer upstream committed) or relative is refused."""
    from c128patch.ops.treestate import c128_state_dir, tree_layers
    from c128patch.series.manifest import MANIFEST

    tree, mine = tmp_path / "sglang", tmp_path / "mine"
    (tree / PROVENANCE_PATH).parent.mkdir(parents=True)
    (tree / PROVENANCE_PATH).write_text(json.dumps({"layers": [{"name": "acme", "version": "1", "digest": "0" * 64}]}))
    for folder in (tree / "acme", mine):
        (folder / MANIFEST).parent.mkdir(parents=True)
        (folder / MANIFEST).write_text("")
    git = Git(worktree=tree)
    git.run("init", "-q")
    c128_state_dir(git).mkdir()
    (tmp_path / "link").symlink_to(mine)  # helper 175: a folder reached through a link was "holds no
    # patches/series.toml", which it held
    for folders, refusal in (([str(mine)], None), (["../mine"], "name their folders"),
                             ([str(tree / "acme")], "a tree c128patch patches: layers come from the operator"),
                             ([str(tmp_path / "link")], rf"reached through a link \(it is {re.escape(str(mine))}\)")):
        (c128_state_dir(git) / "layers.json").write_text(json.dumps(folders))
        if refusal is None:
            assert tree_layers(git) == (mine,)
            continue
        with pytest.raises(C128Error, match=refusal):
            tree_layers(git)


def test_a_journals_series_folder_inside_a_patched_tree_is_refused_as_a_series_folder(tmp_path: Path):
    """A rebase or apply journal naming a series folder inside a tree the tool patches was refused as a "layer
    folder" (helper 175): the refusal names what it is."""
    from c128patch.series.layers import recorded_stack
    from c128patch.series.manifest import MANIFEST

    tree = tmp_path / "sglang"
    (tree / PROVENANCE_PATH).parent.mkdir(parents=True)
    (tree / PROVENANCE_PATH).write_text("{}")
    (tree / "s" / MANIFEST).parent.mkdir(parents=True)
    (tree / "s" / MANIFEST).write_text("")
    with pytest.raises(C128Error, match=r"^series folder .* is inside .*: series come from the operator, not from"):
        recorded_stack(str(tree / "s"), [], tmp_path / "rebase.json")


def test_a_forged_or_damaged_contract_probe_cache_entry_does_not_turn_the_verdict(tmp_path: Path, monkeypatch):
    """The nvcc probe's verdict is cached by key in the shared cache: input. A damaged entry was a traceback; one
    of another shape, another key or a line that is not its verdict's was taken as the verdict."""
    from c128patch.fit import contract_cxx

    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    nvcc = tmp_path / "nvcc"  # fails every compile, naming a changed signature (at the probe's line, as nvcc does)
    nvcc.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo fake 1.0; exit 0; }\n'
                    'echo "$2(1): error: static assertion failed with \\"upstream signature changed: f(int)\\"" >&2; '
                    'exit 1\n')
    nvcc.chmod(0o755)
    monkeypatch.setattr(contract_cxx, "nvcc", lambda: str(nvcc))
    series, tree = tmp_path / "series", tmp_path / "tree"
    (series / contract_cxx.PROBE).parent.mkdir(parents=True)
    (series / contract_cxx.PROBE).write_text("// probe\n")
    (tree / contract_cxx.INCLUDE_ROOT).mkdir(parents=True)
    (tree / contract_cxx.INCLUDE_ROOT / "a.h").write_text("int f(int);\n")
    git = Git(worktree=tree)
    git.run("init", "-q")
    git.run("add", "-A")
    git.run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "headers")
    pytest.importorskip("tvm_ffi", reason="the probe compiles only where tvm-ffi gives its headers")
    failed = (False, "nvcc signature probe fails: f(int)")
    assert contract_cxx.probe(series, git, "HEAD") == failed
    (entry,) = (tmp_path / "cache" / "contract-probe").glob("*.json")
    assert contract_cxx.probe(series, git, "HEAD") == (False, failed[1] + " (cached)")
    compiles = "nvcc signature probe compiles against the tree's headers (sm_90a)"
    for forged in ("{", DEEP_JSON, json.dumps([True, compiles]),
                   json.dumps({"key": "0" * 24, "ok": True, "line": compiles}),
                   json.dumps({"key": entry.stem, "ok": True, "line": "nvcc signature probe fails: x"}),
                   json.dumps({"key": entry.stem, "ok": 1, "line": compiles})):
        entry.write_text(forged)
        assert contract_cxx.probe(series, git, "HEAD") == failed, forged


def test_a_committed_provenance_whose_upstream_commit_is_a_number_is_one_line_to_every_verb(series, tree):
    """A field of 'upstream', 'series' or 'tool' that is not a string (a branch can commit such a record) reached
    git as an int: rebase, refresh --check and contract each ended in a traceback."""
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series).code == 0
    record = json.loads((tree / PROVENANCE_PATH).read_text())
    record["upstream"]["commit"] = 123456789
    (tree / PROVENANCE_PATH).write_text(json.dumps(record))
    Git(worktree=tree).run("commit", "-q", "-am", "a record of its own")
    for verb in (["rebase", "--onto", "v0.5.22"], ["refresh", "--check"], ["contract"], ["status"]):
        refused([*verb, "--tree", tree, "--series", series], tree, "'upstream.commit' is not a string")


def test_a_state_folder_that_is_a_link_is_refused_before_anything_is_written_through_it(series, tree,  # noqa: F811
                                                                                         tmp_path):
    """Helper 170 (issue 36's open item): `.git/c128patch` a link to a folder elsewhere: `apply` wrote its journal,
    proof.json and layers.json there, `status` and `refresh` read and rewrote them. Each refuses in one line naming it,
    nothing written there; the `rm` it prints works as printed, and apply then runs."""
    import shlex
    import subprocess

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = tree / ".git" / "c128patch"
    state.symlink_to(elsewhere)
    says = f"{state}, where c128patch keeps the tree's state (journals, proof, layers), is a link: nothing is read"
    apply = ["apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series]
    line = refused(apply, tree=tree, contains=says)
    for verb in (["status"], ["refresh", "--check"], ["refresh"]):
        refused([*verb, "--tree", tree, "--series", series], contains=says)
    assert list(elsewhere.iterdir()) == []
    subprocess.run(shlex.split(line.split("remove it (", 1)[1].split(") and run again", 1)[0]), check=True)
    assert invoke(*apply).code == 0 and state.is_dir() and not state.is_symlink()
    assert list(elsewhere.iterdir()) == []


def test_a_lock_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch):
    """Helper 183: `rebase --abort` (any verb taking the repository's lock) on a full disk: the lock's pwrite gave
    "cannot write in a folder (No space left on device)", naming none. Now one line naming the lock, nothing done."""
    import errno
    import os
    import subprocess

    from c128patch.ops import treestate

    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True)

    def full(*_args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(C128Error) as err:
        with treestate.repo_lock(Git(worktree=tmp_path / "r"), "rebase"):
            raise AssertionError("the lock was taken")
    lock = tmp_path / "r" / ".git" / treestate.LOCK_NAME
    assert err.value.message == (f"cannot rebase: cannot write the lock {lock} (No space left on device); nothing was "
                                 "changed; free space there and run it again")
