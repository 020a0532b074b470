"""status reads the proof apply (or an earlier status) recorded while every key it depends on holds, and proves
again when one moved: HEAD (an amend, a commit), the series (an entry's file, the ledger), or on --prove."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from c128patch.git import Git
from c128patch.ops import equivalence
from c128patch.ops.lint import update_hashes
from c128patch.ops.proofs import PROOF
from c128patch.series.manifest import load_series
from support import invoke, make_test_series, small_clone

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
EDIT = {CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n",
              "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch test\n")}


@pytest.fixture
def applied(tmp_path: Path, sglang_release_repo: Path) -> tuple[Path, Path]:
    series = make_test_series(tmp_path / "series", sglang_release_repo, EDIT)
    tree = small_clone(sglang_release_repo, tmp_path / "sglang").worktree
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series)
    assert res.code == 0, res.err
    return series, tree


def status_of(series: Path, tree: Path, *extra: str, as_json: bool = True):
    return invoke("status", "--tree", tree, "--series", series, *extra, as_json=as_json)


def no_replay(*args, **kw):
    raise AssertionError("status replayed the series where its recorded proof holds")


def test_status_reads_the_proof_apply_recorded_without_replaying(applied, monkeypatch):
    series, tree = applied
    assert (tree / ".git" / "c128patch" / PROOF).is_file()
    monkeypatch.setattr(equivalence, "prove", no_replay)
    res = status_of(series, tree)
    assert res.code == 0 and res.out["proof"] == "recorded" and res.out["equals_series"]
    assert res.out["equivalence"]["identical"] and res.out["equivalence"]["head"] == Git(worktree=tree).head()
    text = status_of(series, tree, as_json=False)
    assert text.code == 0 and "equals the series: identical to a fresh apply" in text.text
    assert "(recorded proof)" in text.text


def test_status_loads_no_replay_or_layer_module(applied):
    """status reads: the modules that replay, lint or edit layers, or fetch upstream (the release cache's zipfile and
    urllib: ~90 ms once ``load_stack`` took ``local_repo`` from there), stay unimported (its start-up cost)."""
    series, tree = applied
    probe = ("import sys\nfrom c128patch.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('c128patch.ops.layer', 'c128patch.ops.replay', 'c128patch.ops.lint', "
             "'c128patch.upstream.source', 'c128patch.upstream.releases') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe, "status", "--json", "--tree", str(tree), "--series",
                           str(series)], capture_output=True, text=True, check=False)
    assert '"proof": "recorded"' in proc.stdout and proc.stdout.rstrip().endswith("[]"), proc.stdout + proc.stderr


def test_prove_forces_the_replay_and_gives_the_recorded_verdict(applied):
    series, tree = applied
    recorded = status_of(series, tree).out
    proved = status_of(series, tree, "--prove").out
    assert proved["proof"] == "computed" and proved["equivalence"] == recorded["equivalence"]
    assert status_of(series, tree).out["proof"] == "recorded"


def amend_content(series: Path, tree: Path) -> None:
    (tree / CUH).write_text((tree / CUH).read_text() + "// amended in\n")
    Git(worktree=tree).run("commit", "-q", "-a", "--amend", "--no-edit")


def amend_message(series: Path, tree: Path) -> None:
    Git(worktree=tree).run("commit", "-q", "--amend", "-m", "c128patch: provenance (reworded)")


def user_commit(series: Path, tree: Path) -> None:
    (tree / CUH).write_text((tree / CUH).read_text() + "// committed\n")
    Git(worktree=tree).run("commit", "-q", "-a", "-m", "a user commit")


def overlay_changed(series: Path, tree: Path) -> None:
    (series / "overlay" / "sglang" / "c128_test_overlay.py").write_text("VALUE = 2\n")
    update_hashes(load_series(series))


def ledger_changed(series: Path, tree: Path) -> None:
    (series / "patches" / "resolutions").mkdir()
    (series / "patches" / "resolutions" / "ledger.toml").write_text("resolutions = []\n")


@pytest.mark.parametrize("move, equal", [
    (amend_content, False),  # HEAD and its tree moved: the old record must not say "equals"
    (amend_message, True),  # HEAD moved, its tree did not: proved again all the same
    (user_commit, False),
    (overlay_changed, False),  # the series moved after the record: HEAD no longer equals it
    (ledger_changed, True),  # outside the digest, read by the replay
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_moved_key_proves_again_and_the_stale_record_is_never_read(applied, move, equal):
    series, tree = applied
    assert status_of(series, tree).out["proof"] == "recorded"
    move(series, tree)
    res = status_of(series, tree)
    assert res.out["proof"] == "computed" and res.out["equals_series"] is equal and res.code == (0 if equal else 1)
    assert status_of(series, tree).out["proof"] == "recorded"  # recorded again, under the new key


def test_a_tracked_file_edited_after_the_record_is_not_equal(applied):
    series, tree = applied
    (tree / CUH).write_text((tree / CUH).read_text() + "// not committed\n")
    res = status_of(series, tree)
    assert res.code == 1 and res.out["uncommitted"] == [CUH] and not res.out["equals_series"]
    assert res.out["proof"] == "recorded"  # the proof covers HEAD, which did not move


def test_a_record_of_another_tree_and_series_copied_in_is_not_read(applied, tmp_path, sglang_release_repo):
    series, tree = applied
    other_series = make_test_series(tmp_path / "other-series", sglang_release_repo, EDIT)
    overlay_changed(other_series, tree)
    other = small_clone(sglang_release_repo, tmp_path / "other").worktree
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", other, "--series", other_series).code == 0
    foreign = (other / ".git" / "c128patch" / PROOF).read_bytes()
    assert json.loads(foreign)["equivalence"]["identical"]
    (tree / ".git" / "c128patch" / PROOF).write_bytes(foreign)
    res = status_of(other_series, tree)  # `tree` carries the first series: it does not equal the other one
    assert res.out["proof"] == "computed" and not res.out["equals_series"] and res.code == 1


@pytest.mark.parametrize("forge", [lambda record: "not json", lambda record: "[]",
                                   lambda record: json.dumps({**record, "equivalence": {"identical": "yes"}})],
                         ids=["not-json", "not-an-object", "no-verdict"])
def test_a_record_that_does_not_parse_is_a_miss(applied, forge):
    series, tree = applied
    path = tree / ".git" / "c128patch" / PROOF
    path.write_text(forge(json.loads(path.read_text())))
    res = status_of(series, tree)
    assert res.code == 0 and res.out["proof"] == "computed"
    assert json.loads(path.read_text())["equivalence"]["identical"] is True  # recorded again


def test_a_record_that_cannot_be_written_is_proved_each_time(applied):
    series, tree = applied
    path = tree / ".git" / "c128patch" / PROOF
    path.unlink()
    path.mkdir()  # neither readable nor replaceable as a file
    for _ in range(2):
        res = status_of(series, tree)
        assert res.code == 0 and res.out["proof"] == "computed" and res.out["equals_series"], res.err



def test_status_proves_a_read_only_repository_without_writing_to_it(applied, tmp_path):
    """A tree whose repository cannot be written (a read-only mount, or no write permission) is proven with the
    replay's objects in a scratch store: git's hash-object -w failed there and status exited 2 (helper 183)."""
    series, tree = applied
    (tree / ".git" / "c128patch" / PROOF).unlink()
    view = tmp_path / "ro"
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(tree), str(view)], capture_output=True,
                             check=False).returncode == 0 if hasattr(os, "geteuid") and os.geteuid() == 0 else False
    if not mounted:
        view = tree
        subprocess.run(["chmod", "-R", "a-w", str(tree / ".git")], check=True)
    try:
        if os.access(view / ".git" / "objects", os.W_OK):
            pytest.skip("cannot make the repository read-only here")
        res = status_of(series, view)
        assert res.code == 0 and res.out["proof"] == "computed" and res.out["equals_series"], res.err
    finally:
        if mounted:
            subprocess.run(["umount", str(view)], check=False)
        else:
            subprocess.run(["chmod", "-R", "u+w", str(tree / ".git")], check=False)
