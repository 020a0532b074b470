"""State files read back as untrusted input: a series manifest, an apply journal and a resolution
ledger that are malformed or nested 100,000 deep give one line and a non-zero exit, never a
traceback (RecursionError included), and change nothing."""

from __future__ import annotations

import json
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
from support import REPO_ROOT, copy_series, refused, small_clone, snapshot

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
        refuse_switching(tree, target, "b")
    assert already_applied(series, git, "b", target) is None
    refuse_taken_branch(series, git, "b", target)  # no record: nothing it holds to protect


@pytest.mark.parametrize("folders", ["[", "5", "[1]", DEEP_JSON, b"\xff"], ids=["bad", "int", "list", "deep", "bytes"])
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
