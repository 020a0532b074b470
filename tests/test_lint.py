"""lint against upstream: a patch file's base tag holds the sources the manifest records for it
(bases by content: commit ids are never compared)."""

from __future__ import annotations

from pathlib import Path

from c128patch.series.manifest import load_series
from c128patch.upstream.releases import ReleaseHistory
from support import copy_series, invoke

FILE = "0003-c128-dspark-record-streams.v0.5.20.patch"


def _series_made_on_other_sources(tmp_path: Path, base: str, other: str) -> tuple[Path, list[str]]:
    """A copy of the product series whose variant made on ``base`` records ``other``'s sources (as if
    it had been made on another repository's ``base``); returns it and the files that then differ."""
    series = load_series(copy_series(tmp_path / "series"))
    entry = series.entry("c128-dspark-record-streams")
    git = ReleaseHistory().git
    [variant] = [v for v in entry.variants if v.base == base]
    moved = tuple((p, git.out("rev-parse", f"{other}:{p}")) for p, _ in variant.sources)
    entry.variants = [v if v is not variant else type(v)(v.file, v.base, v.sha256, v.commit, moved)
                      for v in entry.variants]
    series.save()
    return series.root, [p for (p, a), (_, b) in zip(variant.sources, moved) if a != b]


def test_a_base_tag_with_other_sources_than_the_variant_was_made_on_is_an_error_naming_the_files(tmp_path: Path):
    series, differ = _series_made_on_other_sources(tmp_path, "v0.5.20", "v0.5.21")
    assert differ
    res = invoke("lint", "--series", series)
    assert res.code == 1
    (finding,) = [f for f in res.out["findings"] if "other sources" in f["message"]]
    assert finding["level"] == "error"
    assert finding["message"] == (f"{FILE}: v0.5.20 in this repository has other sources than the variant was made "
                                  f"on: {', '.join(differ)}")


def test_offline_lint_cannot_check_the_bases(tmp_path: Path):
    series, _ = _series_made_on_other_sources(tmp_path, "v0.5.20", "v0.5.21")
    res = invoke("lint", "--series", series, "--offline")
    assert res.code == 0, res.out["findings"]
    assert res.out["unchecked"].startswith("--offline: the bases")
    said = invoke("lint", "--series", series, "--offline", as_json=False)
    assert said.code == 0 and "0 error(s), 0 warning(s); not checked: --offline: the bases (" in said.text


def test_a_manifest_without_recorded_sources_is_not_checked_and_says_so(tmp_path: Path):
    series = load_series(copy_series(tmp_path / "series"))
    entry = series.entry("c128-dspark-record-streams")
    entry.variants = [type(v)(v.file, v.base, v.sha256, "0" * 40) for v in entry.variants]  # an old manifest's
    series.save()
    res = invoke("lint", "--series", series.root)
    assert res.code == 0
    assert {f["level"] for f in res.out["findings"]} == {"warning"} and len(res.out["findings"]) == 3
    assert all("has no recorded sources" in f["message"] for f in res.out["findings"])


def test_the_product_series_bases_agree_with_the_release_tags():
    res = invoke("lint")
    assert res.code == 0 and res.out["findings"] == [], res.out["findings"]
    series = load_series(Path(__file__).resolve().parents[1])
    assert all(v.sources and not v.commit for e in series.entries for v in e.patch_files())


def test_lint_names_each_phase_for_a_piped_run(monkeypatch):
    import contextlib

    import c128patch.progress

    steps: list[str] = []

    class Steps:
        def step(self, message: str) -> None:
            steps.append(message)

        def transfer(self, what: str, done: int, total: int | None) -> None:
            pass

    monkeypatch.setattr(c128patch.progress, "reporter", lambda *a, **k: contextlib.nullcontext(Steps()))
    assert invoke("lint").code == 0
    assert [s.split(" ")[:2] for s in steps[-2:]] == [["the", "files,"], ["the", "gate"]], steps


def test_update_hashes_with_a_file_of_the_manifest_gone_is_one_line_and_writes_nothing(tmp_path: Path):
    """Helper 148: `lint --update-hashes` on a series missing a file its manifest names (a copy without `csrc/`) was
    FileNotFoundError's traceback."""
    series = copy_series(tmp_path / "series")
    (series / "csrc" / "deepseek_v4" / "online_c128_dspark.cuh").unlink()
    manifest = (series / "patches" / "series.toml").read_bytes()
    res = invoke("lint", "--series", series, "--offline", "--update-hashes", as_json=False)
    assert res.code == 2 and "Traceback" not in res.err and "online_c128_dspark.cuh cannot be read" in res.err, res.err
    assert res.err.strip().count("\n") == 0 and (series / "patches" / "series.toml").read_bytes() == manifest


def test_a_patch_unidiff_cannot_parse_is_one_finding_line(tmp_path: Path) -> None:
    """Helper 161: a `+++` line with no `---` before it (unidiff's "Target without source: <line>\\n") gave lint an
    error line and an empty one after it (the parser's message ends in the patch's own newline)."""
    import pytest

    from c128patch.errors import C128Error
    from c128patch.series.patchfile import read_patch

    patch = tmp_path / "0001-x.patch"
    patch.write_text("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: x <x@x.invalid>\n"
                     "Date: Thu, 1 Jan 1970 00:00:00 +0000\nSubject: [PATCH] x\n\nx\n\n"
                     "diff --git a/python/ok b/python/ok\nnew file mode 100644\n"
                     "index 0000000000000000000000000000000000000000..3b18e512dba79e4c8300dd08aeb37f8e728b8dad\n"
                     "+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+hello\n")
    with pytest.raises(C128Error, match="corrupt patch 0001-x.patch") as exc:
        read_patch(patch)
    assert "\n" not in exc.value.message and exc.value.message == exc.value.message.strip(), repr(exc.value.message)
