"""Where the layers come from (docs/layers.md "Which layers"): the operator's config only, never one inside a
repository a verb was pointed at; else, on a tree applied with layers, the tree's provenance; always said."""

from __future__ import annotations

import shutil
import subprocess

from c128patch.series.layers import CONFIG, ENV, lookup_layers
from support import REPO_ROOT, copy_series, invoke

EXAMPLE = REPO_ROOT / "docs" / "examples" / "acme-layer"


def test_the_config_of_a_repository_passed_with_repo_or_tree_is_not_read(tmp_path, monkeypatch):
    """A repository (not in upstream's layout) commits a c128patch.toml naming a layer: pointed at with --tree or
    --repo from inside it, nothing of it is read; the same config, the operator's (no --tree), is read and said."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo / "layers" / "acme")
    (repo / CONFIG).write_text('[layers]\npaths = ["layers/acme"]\n')
    (repo / "sub").mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(repo / "sub")
    assert lookup_layers((), exclude=[repo]) == ((), "")
    for args in (["status", "--tree", repo], ["lint", "--offline", "--repo", repo]):
        res = invoke(*args)
        assert "layers_in_effect" not in res.out and "acme" not in res.err, (args, res.out, res.err)
    res = invoke("gates")  # the operator's own config here: read, and said in the report
    assert res.code == 0, res.err
    assert res.out["layers_in_effect"]["from"] == str(repo / CONFIG)
    assert [r["name"] for r in res.out["layers_in_effect"]["layers"]] == ["acme"]
    # h146: the folder too (two layers named acme in two folders read alike): what the text says on stderr
    assert [r["folder"] for r in res.out["layers_in_effect"]["layers"]] == [str((repo / "layers" / "acme").resolve())]
    res = invoke("gates", as_json=False)
    assert f"layers from {repo / CONFIG}: {(repo / 'layers' / 'acme').resolve()}" in res.err, res.err


def test_every_verb_reading_a_tree_applied_with_layers_takes_them_from_its_provenance(
        tmp_path, sglang_release_repo, monkeypatch):
    """Applied with --layer, then run with no layers named (no env, no config): status, refresh --check and check
    (from inside the tree) take the tree's layers, say so, and write nothing into our series."""
    series, layer, tree = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "sglang"
    shutil.copytree(EXAMPLE, layer)
    monkeypatch.setenv("C128PATCH_SERIES", str(series))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--layer", layer).code == 0
    before = {p: p.read_bytes() for p in series.rglob("*") if p.is_file()}
    said = f"layers from the tree's provenance: {layer.resolve()}"
    res = invoke("status", "--tree", tree, as_json=False)
    assert res.code == 0 and said in res.err, (res.err, res.text)
    res = invoke("status", "--tree", tree)
    assert res.out["equals_series"] and res.out["layers_in_effect"]["from"] == "the tree's provenance", res.out
    assert [r["folder"] for r in res.out["layers_in_effect"]["layers"]] == [str(layer.resolve())], res.out
    res = invoke("refresh", "--check", "--tree", tree)
    assert res.code == 0 and res.out["changed"] == [], res.out
    assert [r["name"] for r in res.out["layers_in_effect"]["layers"]] == ["acme"]
    monkeypatch.chdir(tree)
    res = invoke("check", "--sglang-rev", "v0.5.23", as_json=False)
    assert res.code == 0 and said in res.err and "acme/acme-sps-floor" in res.text, (res.err, res.text)
    assert {p: p.read_bytes() for p in series.rglob("*") if p.is_file()} == before


def test_a_layer_a_rebase_took_from_the_operators_config_is_the_trees_from_anywhere(
        tmp_path, sglang_release_repo, monkeypatch):
    """Applied without layers, then taken onto the stack a c128patch.toml names (`rebase`, as status prints it):
    from a folder without that config, every verb reading the tree takes its layers from its provenance. The
    rebase did not record their folders (apply did), so status said nothing and exit 1 there, and contract,
    rebase and refresh refused."""
    series, work = copy_series(tmp_path / "series"), tmp_path / "work"
    shutil.copytree(EXAMPLE, work / "layers" / "acme")
    monkeypatch.setenv("C128PATCH_SERIES", str(series))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(work)
    assert invoke("apply", "--sglang-rev", "v0.5.23").code == 0
    (work / CONFIG).write_text('[layers]\npaths = ["layers/acme"]\n')
    assert invoke("rebase", "--onto", "v0.5.23", "--tree", work / "sglang").code == 0
    monkeypatch.chdir(tmp_path)  # no config here
    res = invoke("status", "--tree", work / "sglang")
    assert res.code == 0 and res.out["equals_series"], (res.err, res.out)
    assert res.out["layers_in_effect"]["from"] == "the tree's provenance"
    res = invoke("refresh", "--check", "--tree", work / "sglang")
    assert res.code == 0 and res.out["changed"] == [], (res.err, res.out)


def test_an_empty_env_switches_the_configs_layers_off_and_says_so(tmp_path, monkeypatch):
    """``C128PATCH_LAYERS=`` beside a config naming a layer: no layers (docs/layers.md), said on stderr and in
    the --json report, never silently."""
    shutil.copytree(EXAMPLE, tmp_path / "layers" / "acme")
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["layers/acme"]\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, "")
    res = invoke("gates", as_json=False)
    assert res.code == 0 and "acme" not in res.text, res.text
    assert f"layers: none (${ENV} is set and empty" in res.err, res.err
    res = invoke("gates")
    assert res.out["layers_in_effect"] == {"from": f"${ENV}", "layers": []}, res.out
    monkeypatch.delenv(ENV)
    assert invoke("gates").out["layers_in_effect"]["from"] == str(tmp_path / CONFIG)


def test_a_config_naming_no_layer_says_so_naming_it(tmp_path, monkeypatch):
    """Helper 185: a c128patch.toml with ``paths = []`` switches a tree's provenance layers off (it is given, so it
    wins), but no verb said so (the empty env's line is said), --json carried no ``layers_in_effect``, and `status`
    said the layers in effect came "from nowhere" (it reads the origin said here). Said on stderr and in --json."""
    (tmp_path / CONFIG).write_text("[layers]\npaths = []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV, raising=False)
    res = invoke("gates", as_json=False)
    assert res.code == 0, res.err
    assert f"layers: none ({tmp_path / CONFIG} names none" in res.err, res.err
    assert invoke("gates").out["layers_in_effect"] == {"from": str(tmp_path / CONFIG), "layers": []}


def test_verify_wheel_with_layer_says_the_layers_in_effect_in_its_json(tmp_path):
    """Helper 148: `verify-wheel --layer DIR --json` (its report and its error object) carried no `layers_in_effect`,
    where every other verb that reads a series says the layers it used."""
    shutil.copytree(EXAMPLE, tmp_path / "acme")
    wheel = tmp_path / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"not a zip")
    res = invoke("verify-wheel", wheel, "--layer", tmp_path / "acme")
    assert res.code == 2 and res.out["layers_in_effect"]["from"] == "--layer", res.out
    assert [r["name"] for r in res.out["layers_in_effect"]["layers"]] == ["acme"]
