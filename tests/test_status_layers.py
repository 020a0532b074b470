"""``status`` where the layers in effect are not the tree's (docs/layers.md, "Which layers"): a c128patch.toml naming
another layer than the tree's provenance records. Before, status printed "the series has changed since ...: next:
c128patch rebase ...", a rebase that silently swapped the tree's layer stack (the tree's layer entries carried as
user commits); refresh already refuses there. It now says the layers differ and proposes no rebase; the status it
prints with the tree's own layers runs as printed. (A tree without layers and a config adding one still gets the
rebase: tests/test_layers.py::test_status_of_the_tree_whose_commit_became_the_layer_says_what_is_so.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from c128patch.git import Git
from c128patch.series.layers import CONFIG, ENV
from c128patch.series.manifest import load_series
from c128patch.series.provenance import PROVENANCE_PATH
from support import REPO_ROOT, invoke, printed_command, run_printed
from test_layers import EXAMPLE


def acme_tree(tmp_path: Path, monkeypatch) -> None:
    """docs/layers.md's example layer in ./layers/acme, applied on v0.5.23 in ./sglang-acme (the folder: tmp_path)."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(EXAMPLE, tmp_path / "layers" / "acme")
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--layer", "layers/acme", "--tree", "sglang-acme").code == 0


def other_layer_in_config(tmp_path: Path) -> None:
    """A c128patch.toml naming another layer than the tree's."""
    assert invoke("layer", "new", "layers/other", "--name", "other").code == 0
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["layers/other"]\n')


def test_status_with_a_config_naming_other_layers_than_the_trees_proposes_no_rebase(
        tmp_path, sglang_release_repo, monkeypatch):
    acme_tree(tmp_path, monkeypatch)
    other_layer_in_config(tmp_path)

    version = load_series(EXAMPLE).version
    res = invoke("status", "--tree", "sglang-acme", as_json=False)
    assert res.code == 1, res.text
    assert "c128patch rebase" not in res.text and "has changed since" not in res.text, res.text
    assert (f"the layers in effect (layer other 1, from {tmp_path / CONFIG}) differ from the tree's (layer acme "
            f"{version}): a rebase with them would carry the tree's layer entries as commits of yours, so none is "
            "proposed") in res.text, res.text
    assert invoke("status", "--tree", "sglang-acme").out["series_current"]["layers_differ"] is True

    ran = run_printed(printed_command(res.text, "c128patch status "), cwd=tmp_path)  # the tree against its own
    assert ran.returncode == 0 and "equals the series" in ran.stdout, ran.stdout + ran.stderr


def test_status_of_a_tree_whose_layer_folder_moved_says_it_was_not_compared(tmp_path, sglang_release_repo, monkeypatch):
    """Helper 101: the layer folder the tree's provenance names moved away; status was a traceback (AttributeError
    in the line on the layers in effect) and --json exited 1 without a word."""
    acme_tree(tmp_path, monkeypatch)
    (tmp_path / "layers" / "acme").rename(tmp_path / "layers" / "acme-moved")
    monkeypatch.chdir(tmp_path / "sglang-acme")
    res = invoke("status", as_json=False)
    assert res.code == 1 and "+ layer acme" in res.text, res.text
    said = ("not compared with a series: " f"{tmp_path / 'sglang-acme'} was applied with layer(s) acme (its "
            f"provenance says so); the folder it was applied with, {tmp_path / 'layers' / 'acme'} (layer acme) is "
            "gone (moved or removed): name their folders as they are now (--layer DIR, or c128patch.toml)")
    assert said in " ".join(res.text.split()), res.text  # helper 108's case 08c: which folder, and that it is gone
    data = invoke("status").out
    assert data["series_error"].startswith(said.split(": ", 1)[1]) and data["equals_series"] is False
    for verb in (["rebase", "--onto", "v0.5.22"], ["refresh", "--check"]):  # the same line from the verbs that move
        other = invoke(*verb, as_json=False)
        assert other.code == 2 and said.split(": ", 1)[1] in " ".join(other.err.split()), (verb, other.err)
    moved = invoke("status", "--layer", str(tmp_path / "layers" / "acme-moved"), as_json=False)
    assert moved.code == 0 and "equals the series" in moved.text, moved.text  # the fix it names, taken


def test_rebase_with_a_config_naming_other_layers_than_the_trees_is_refused_and_the_fix_runs(
        tmp_path, sglang_release_repo, monkeypatch):
    """Helper 101: status proposed no rebase there, but `rebase --onto` went ahead with the config's layers: the tree's
    layer entries carried as "your commit" and its record rewritten to name the other stack."""
    acme_tree(tmp_path, monkeypatch)
    other_layer_in_config(tmp_path)
    tree = Git(worktree=tmp_path / "sglang-acme")
    head = tree.head()
    for named in ((), ("--layer", "layers/other")):  # from the config, or named: the same trap
        res = invoke("rebase", "--onto", "v0.5.22", "--tree", "sglang-acme", *named, as_json=False)
        assert res.code == 2 and "cannot rebase: the tree carries layer(s) acme, the layers in effect are other: " \
            "the rebase would carry the tree's layer entries as commits of yours" in res.err, res.err
        assert tree.head() == head and not tree.status_porcelain()  # nothing was changed
    ran = run_printed(printed_command(res.err, "c128patch rebase "), cwd=tmp_path)  # the tree's own
    assert ran.returncode == 0, ran.stdout + ran.stderr
    record = json.loads((tmp_path / "sglang-acme" / PROVENANCE_PATH).read_text())
    assert [layer["name"] for layer in record["layers"]] == ["acme"] and record["upstream"]["rev"] == "v0.5.22"


def test_a_commit_made_an_entry_on_a_tree_with_its_layer_is_taken_by_the_rebase_printed(
        tmp_path, sglang_release_repo, monkeypatch):
    """Helper 101: on a tree applied with the layer, `layer add-entry`'s next was an apply of a third tree
    (`sglang-acme-acme`), and `refresh --check` went on advising the add-entry that had been run (which then failed:
    the commit is an entry already). Both now print the rebase that takes the commit as the entry, which runs."""
    acme_tree(tmp_path, monkeypatch)
    tree = Git(worktree=tmp_path / "sglang-acme")
    version = tmp_path / "sglang-acme" / "python/sglang/version.py"
    version.write_text(version.read_text() + "# a site note\n")
    tree.run("-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit", "-qam", "site note")
    added = invoke("layer", "add-entry", "--layer", "layers/acme", "--from-commit", "HEAD", "--why", "a note",
                   "--tree", "sglang-acme", as_json=False)
    rebase = printed_command(added.text, "c128patch rebase ")
    assert added.code == 0 and rebase == (f"c128patch rebase --onto v0.5.23 --tree {tmp_path / 'sglang-acme'} "
                                          f"--layer {tmp_path / 'layers' / 'acme'}"), added.text
    check = invoke("refresh", "--check", "--tree", "sglang-acme", as_json=False)
    assert check.code == 2 and "is entry 'acme/site-note' of layer acme already" in check.err, check.err
    assert printed_command(check.err, "c128patch rebase ") == rebase and "add-entry" not in check.err
    ran = run_printed(rebase, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert invoke("refresh", "--check", "--tree", "sglang-acme").code == 0
    assert invoke("status", "--tree", "sglang-acme").out["equals_series"] is True


def test_add_entry_refuses_a_commit_lint_would_reject_and_writes_nothing(tmp_path, sglang_release_repo, monkeypatch):
    """Helper 101: a commit changing README.md (outside python/) was written as an entry, then reported as a lint
    error, with no way back but editing series.toml by hand."""
    acme_tree(tmp_path, monkeypatch)
    tree = Git(worktree=tmp_path / "sglang-acme")
    (tmp_path / "sglang-acme" / "NOTES.md").write_text("site notes\n")
    tree.run("add", "NOTES.md")
    tree.run("-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit", "-qm", "site notes")
    before = {p: p.read_bytes() for p in (tmp_path / "layers" / "acme").rglob("*") if p.is_file()}
    res = invoke("layer", "add-entry", "--layer", "layers/acme", "--from-commit", "HEAD", "--why", "notes", "--tree",
                 "sglang-acme", as_json=False)
    assert res.code == 2 and res.err.startswith(
        f"c128patch: error: commit {tree.head()[:12]} cannot be an entry of layer acme: patches/0004-site-notes.patch "
        "touches NOTES.md, outside python/ (lint); change the commit (git commit --amend), then add it; nothing was "
        "written"), res.err
    assert {p: p.read_bytes() for p in (tmp_path / "layers" / "acme").rglob("*") if p.is_file()} == before
    assert invoke("lint", "--offline", "--layer", "layers/acme").code == 0


def test_apply_over_a_branch_of_an_earlier_version_of_the_stack_prints_the_rebase_status_does(
        tmp_path, sglang_release_repo, monkeypatch):
    """Helper 101: with no commit of the user's on it, apply advised `git branch -D` for a branch holding an earlier
    version of the same layer, while status proposed a rebase; both now propose the rebase, which runs."""
    acme_tree(tmp_path, monkeypatch)
    layer = load_series(tmp_path / "layers" / "acme")
    layer.version = str(int(layer.version) + 1)  # the layer changed since (a new entry would bump it)
    layer.save()
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--layer", "layers/acme", "--tree", "sglang-acme",
                 as_json=False)
    assert res.code == 2 and "branch -D" not in res.err, res.err
    assert f"holds series c128patch {load_series(REPO_ROOT).version} + layer acme " in res.err
    rebase = printed_command(res.err, "c128patch rebase ")
    assert rebase == (f"c128patch rebase --onto v0.5.23 --tree {tmp_path / 'sglang-acme'} --layer "
                      f"{tmp_path / 'layers' / 'acme'}"), res.err
    ran = run_printed(rebase, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert invoke("status", "--tree", "sglang-acme").out["equals_series"] is True


def test_a_wheel_made_beside_another_of_its_release_says_to_install_it_by_name(tmp_path, monkeypatch):
    """Helper 101: after docs/layers.md, README's wheel line in the same folder took the layer from ./sglang's record
    (as it says) and dist/ held both wheels: README's install pattern matched two (pip: ResolutionImpossible)."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(EXAMPLE, tmp_path / "layers" / "acme")
    plain = invoke("wheel", "--from-release", "0.5.23", "-o", "dist")
    assert plain.code == 0 and plain.out["beside"] == [], plain.err
    res = invoke("wheel", "--from-release", "0.5.23", "-o", "dist", "--layer", "layers/acme", as_json=False)
    made = Path(next(line for line in res.text.splitlines() if line.endswith(".whl") and not line.startswith(" ")))
    assert res.code == 0 and ".acme." in made.name, res.text
    assert f"note: dist also holds {Path(plain.out['wheel']).name}: install this wheel by its name ({made.name}), " \
        "not by a pattern" in res.text, res.text
