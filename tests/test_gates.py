"""The env reference ([[gates]] in the manifest): lint keeps it true to the series' own files and to
upstream's environ.py, `c128patch gates` prints it, docs/gates.md carries it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.ops.lint import lint_series
from c128patch.series.gates import render_markdown
from c128patch.series.manifest import load_series
from support import REPO_ROOT, invoke

BEGIN, END = "<!-- gates:begin (generated: c128patch gates --markdown) -->\n", "<!-- gates:end -->"


def edited_series(dest: Path, old: str, new: str) -> Path:
    """A copy of the product series whose manifest has ``old`` replaced by ``new`` (once)."""
    for part in ("patches", "overlay", "csrc"):
        shutil.copytree(REPO_ROOT / part, dest / part)
    manifest = dest / "patches" / "series.toml"
    text = manifest.read_text()
    assert old in text, old
    manifest.write_text(text.replace(old, new, 1))
    return dest


def without_gate(dest: Path, name: str) -> Path:
    series = load_series(edited_series(dest, "", ""))
    series.gates = [g for g in series.gates if g.name != name]
    series.save()
    return dest


def messages(series_root: Path, upstream=None) -> list[str]:
    return [f.message for f in lint_series(load_series(series_root), upstream)]


def test_the_product_reference_agrees_with_the_series_and_upstream(sglang_release_repo: Path):
    from c128patch.git import Git

    assert messages(REPO_ROOT, Git(git_dir=sglang_release_repo)) == []


def test_every_gate_an_entry_names_is_in_the_reference(tmp_path: Path):
    found = messages(without_gate(tmp_path, "SGLANG_DSPARK_RECORD_VERIFY_STREAMS"))
    assert "gate SGLANG_DSPARK_RECORD_VERIFY_STREAMS is not in the env reference ([[gates]] in the manifest)" in found


def test_every_variable_a_patch_adds_a_line_for_is_in_the_reference(tmp_path: Path):
    found = messages(without_gate(tmp_path, "SGLANG_OPT_USE_ONLINE_COMPRESS"))
    assert "SGLANG_OPT_USE_ONLINE_COMPRESS is read or written by the series but is not in the env reference" in found


def test_a_gate_names_only_gates_of_the_reference(tmp_path: Path):
    found = messages(without_gate(tmp_path, "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"))
    assert ("gate SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK names SGLANG_EXPERIMENTAL_ONLINE_C128_MTP, "
            "which is not in the env reference") in found


def test_a_gate_a_patch_declares_but_the_reference_gives_to_upstream_says_what_to_write(tmp_path: Path):
    root = edited_series(tmp_path, 'name = "SGLANG_DSPARK_RECORD_VERIFY_STREAMS"\ndeclared_by = "series"',
                         'name = "SGLANG_DSPARK_RECORD_VERIFY_STREAMS"\ndeclared_by = "upstream"')
    assert ("gate SGLANG_DSPARK_RECORD_VERIFY_STREAMS is declared_by upstream but a patch of the series declares it: "
            'write declared_by = "series" in its [[gates]] row of the manifest') in messages(root)


def test_a_series_gate_has_the_default_its_patch_declares(tmp_path: Path):
    root = edited_series(tmp_path, 'name = "SGLANG_DSPARK_RECORD_VERIFY_STREAMS"\ndeclared_by = "series"\n'
                                   'type = "bool"\ndefault = "False"',
                         'name = "SGLANG_DSPARK_RECORD_VERIFY_STREAMS"\ndeclared_by = "series"\n'
                         'type = "bool"\ndefault = "True"')
    assert messages(root) == ["gate SGLANG_DSPARK_RECORD_VERIFY_STREAMS: a patch of the series declares the default "
                              "False, the reference says True"]


def test_an_upstream_gate_has_the_default_upstream_declares(tmp_path: Path, sglang_release_repo: Path):
    from c128patch.git import Git

    root = edited_series(tmp_path, 'default = "\\"static\\""', 'default = "\\"compact\\""')
    assert messages(root, Git(git_dir=sglang_release_repo)) == [
        'gate SGLANG_RAGGED_VERIFY_MODE: python/sglang/srt/environ.py at v0.5.23 declares the default "static", '
        'the reference says "compact"']


def test_a_str_default_written_without_its_quotes_says_exactly_what_to_write(tmp_path: Path, sglang_release_repo: Path):
    """Helper 108's case 05: `default = "static"` for a str env said 'declares the default "static", the reference
    says static' (the two look the same). It says the row to write; written as said, lint is clean."""
    from c128patch.git import Git

    root = edited_series(tmp_path, 'default = "\\"static\\""', 'default = "static"')
    upstream = Git(git_dir=sglang_release_repo)
    [line] = messages(root, upstream)
    assert line.startswith('gate SGLANG_RAGGED_VERIFY_MODE: python/sglang/srt/environ.py at v0.5.23 declares the '
                           'default "static", the reference says static; ')
    row = line.split("write ", 1)[1].split(" in its [[gates]] row")[0]
    assert row == "default = '\"static\"'", line
    manifest = root / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('default = "static"', row, 1))
    assert messages(root, upstream) == []


def test_a_malformed_gate_is_one_line_naming_it(tmp_path: Path):
    root = edited_series(tmp_path, 'declared_by = "series"', 'declared_by = "somebody"')
    with pytest.raises(C128Error, match="gate SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK: declared_by must be one of "
                                        "series, upstream, not 'somebody'"):
        load_series(root)


def test_a_gates_choices_hold_its_default_and_belong_to_a_str_gate(tmp_path: Path):
    choices = 'choices = ["static", "cap-accept", "compact"]'
    root = edited_series(tmp_path / "a", choices, 'choices = ["cap-accept", "compact"]')
    assert 'gate SGLANG_RAGGED_VERIFY_MODE: its default "static" is not one of its choices (cap-accept, compact)' \
        in messages(root)
    root = edited_series(tmp_path / "b", 'type = "str"', 'type = "int"')
    with pytest.raises(C128Error, match="gate SGLANG_RAGGED_VERIFY_MODE: 'choices' is for a str gate, not a int one"):
        load_series(root)
    root = edited_series(tmp_path / "c", choices, 'choices = ["static", ""]')
    with pytest.raises(C128Error, match="'choices' must be a list of non-empty strings"):
        load_series(root)


def test_saving_the_manifest_keeps_the_reference(tmp_path: Path):
    root = edited_series(tmp_path, "", "")
    series = load_series(root)
    series.save()
    assert load_series(root).gates == series.gates
    assert (root / "patches" / "series.toml").read_text() == (REPO_ROOT / "patches" / "series.toml").read_text()


def test_docs_gates_md_carries_the_rendered_reference(real_series):
    doc = (REPO_ROOT / "docs" / "gates.md").read_text()
    table = doc.split(BEGIN, 1)[1].split(END, 1)[0]
    assert table == render_markdown(real_series.gates, {e.name: e.gate for e in real_series.entries})


def test_gates_markdown_is_the_rendered_reference(real_series):
    res = invoke("gates", "--markdown", as_json=False)
    assert res.code == 0
    assert res.text == render_markdown(real_series.gates, {e.name: e.gate for e in real_series.entries})


def test_gates_json_lists_every_variable_with_the_entries_it_gates(real_series):
    out = invoke("gates").out
    rows = {g["name"]: g for g in out["gates"]}
    assert list(rows) == [g.name for g in real_series.gates]
    assert rows["SGLANG_DSPARK_RECORD_VERIFY_STREAMS"]["entries"] == ["c128-dspark-record-streams-helper",
                                                                      "c128-dspark-record-streams"]
    assert rows["SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK"]["requires"] == ["SGLANG_OPT_USE_ONLINE_COMPRESS"]


def test_gates_with_a_layer_lists_the_layers_own_gates_marked_with_it(tmp_path, real_series):
    """Helper 156: docs/layers.md has a layer describe each env its entries add in its own [[gates]] (its env
    reference), yet `gates --layer L` listed our series' gates only: the layer's were nowhere. Now each verb form
    lists them after ours, marked with their layer."""
    from test_layers import write_layer

    gate = ('\n[[gates]]\nname = "SGLANG_ACME_SPS_FLOOR"\ndeclared_by = "series"\ntype = "int"\ndefault = "0"\n'
            'enables = "acme floor"\n')
    layer = write_layer(tmp_path / "acme", name="acme", gates=gate)
    out = invoke("gates", "--layer", layer).out
    assert [g["name"] for g in out["gates"]] == [g.name for g in real_series.gates] + ["SGLANG_ACME_SPS_FLOOR"]
    assert out["gates"][-1]["layer"] == "acme" and "layer" not in out["gates"][0]
    md = invoke("gates", "--markdown", "--layer", layer, as_json=False)
    assert md.code == 0 and "| `SGLANG_ACME_SPS_FLOOR` | series (layer `acme`) | `0` (int) | acme floor |" in md.text
    table = invoke("gates", "--layer", layer, as_json=False)
    assert table.code == 0 and "SGLANG_ACME_SPS_FLOOR" in table.text and "(series, layer acme)" in table.text
