"""`check` predicts `apply` and `wheel`: the same file per entry, the same strictness, the same exit
code and the same entry stopping it. Real product series on every supported release and on v0.5.19
(older than any the series was made on), real CLI, real release wheels."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from c128patch.series.manifest import load_series
from c128patch.upstream.releases import ReleaseHistory
from support import RELEASES, REPO_ROOT, copy_series, invoke, run_printed

REVS = ("v0.5.19", *RELEASES)


def check(*revs: str, extra: tuple[str, ...] = ()) -> tuple[int, dict[str, dict]]:
    res = invoke("check", *[a for r in revs for a in ("--sglang-rev", r)], *extra)
    return res.code, {r["rev"]: r for r in res.out["revs"]}


@pytest.fixture(scope="module")
def checked(sglang_release_repo: Path) -> dict[str, dict]:
    ReleaseHistory().ensure(["0.5.19"])  # adding a release changes nothing already there
    code, revs = check(*REVS)
    assert code == 1  # v0.5.19 does not apply
    return revs


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory, checked) -> dict[str, tuple[int, dict]]:
    root = tmp_path_factory.mktemp("apply")
    out = {}
    for rev in REVS:
        res = invoke("apply", "--sglang-rev", rev, "--tree", str(root / rev))
        assert res.out, (rev, res.err)
        out[rev] = (res.code, {**res.out.get("report", res.out), "_hint": res.out.get("hint", "")})
    return out


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory, checked) -> dict[str, tuple[int, dict]]:
    root = tmp_path_factory.mktemp("wheels")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SOURCE_DATE_EPOCH", raising=False)
        for rev in REVS:
            res = invoke("wheel", "--from-release", rev.removeprefix("v"), "-o", str(root))
            assert res.out, (rev, res.err)
            out[rev] = (res.code, res.out)
    return out


def stopped_at(doc: dict) -> str:
    """The entry a failed apply/wheel names."""
    match = re.match(r"entry '([^']+)'", doc.get("error", ""))
    return match.group(1) if match else ""


@pytest.mark.parametrize("rev", REVS)
def test_apply_exits_and_stops_where_check_says(rev, checked, applied):
    code, report = applied[rev]
    want = checked[rev]["apply"]
    assert code == want["exit"]
    if code:
        (failed,) = [e["name"] for e in report["entries"] if e.get("status") == "conflict"]
        assert failed == want["entry"]


@pytest.mark.parametrize("rev", REVS)
def test_apply_takes_the_files_check_took(rev, checked, applied):
    _code, report = applied[rev]
    taken = {e["name"]: e["file"] for e in report["entries"] if e.get("file")}
    assert taken == {e["name"]: e["file"] for e in checked[rev]["entries"] if e["name"] in taken}
    assert taken  # apply got as far as one entry at least


@pytest.mark.parametrize("rev", REVS)
def test_wheel_exits_and_stops_where_check_says(rev, checked, wheels):
    code, doc = wheels[rev]
    want = checked[rev]["wheel"]
    assert code == want["exit"]
    assert stopped_at(doc) == want["entry"]


@pytest.mark.parametrize("rev", RELEASES)
def test_wheel_takes_the_files_check_took(rev, checked, wheels):
    _code, doc = wheels[rev]
    assert {e["name"]: e["file"] for e in doc["entries"]} == {e["name"]: e["file"] for e in checked[rev]["entries"]}


def test_a_rev_older_than_the_series_releases_gets_a_note_naming_the_oldest(checked):
    note = checked["v0.5.19"]["note"]
    assert note.startswith("v0.5.19 is older than (or not descended from) every release the series was made on; "
                           "the oldest is v0.5.20: use v0.5.20 or newer")


def test_installed_the_note_carries_back_through_a_copy_of_the_series_made_as_printed(
        sglang_release_repo, tmp_path, monkeypatch):
    """Installed (pip), the series is a package refresh never writes (it refuses): the note's refresh names a copy,
    made by the command the note prints; run as printed, the copy is a series lint accepts."""
    package = tmp_path / "site-packages" / "c128patch"
    package.mkdir(parents=True)
    copy_series(package / "_series")
    monkeypatch.setattr("c128patch.series.manifest.PACKAGE_DIR", package)
    monkeypatch.delenv("C128PATCH_SERIES", raising=False)
    run = invoke("check", "--sglang-rev", "v0.5.19", "--series", str(package / "_series"))
    assert "revs" in run.out, (run.out, run.err)
    note = run.out["revs"][0]["note"]
    copy = f"cp -R {package / '_series'} ~/c128patch-series"
    assert note.endswith(f"then {copy} && c128patch refresh --variant --series ~/c128patch-series"), note
    home = tmp_path / "home"
    home.mkdir()
    assert run_printed(f"HOME={home} && {copy}").returncode == 0
    assert invoke("lint", "--offline", "--series", str(home / "c128patch-series")).code == 0


@pytest.mark.parametrize("rev", RELEASES)
def test_the_series_releases_get_no_note(rev, checked):
    assert checked[rev]["note"] == ""


def test_apply_and_wheel_say_the_note_check_gives_and_still_try(checked, applied, wheels):
    note = checked["v0.5.19"]["note"]
    assert applied["v0.5.19"][1]["_hint"].startswith(f"note: {note}\n")  # then the conflict's hint: it tried
    assert wheels["v0.5.19"][1]["hint"].startswith(f"note: {note}")
    assert wheels["v0.5.19"][1]["error"].startswith("entry ")  # it tried, and stopped where check says
    for rev in RELEASES:
        assert "note: " not in applied[rev][1]["_hint"] and not wheels[rev][1]["support_note"]


def test_the_release_the_note_names_applies(checked):
    assert checked["v0.5.20"]["apply"]["exit"] == 0 and checked["v0.5.20"]["wheel"]["exit"] == 0


@pytest.fixture(scope="module")
def three_way_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product series' first entry alone: on v0.5.19 it applies only with a 3-way merge."""
    root = tmp_path_factory.mktemp("one-entry")
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    series = load_series(root)
    series.entries = series.entries[:1]
    series.save()
    return root


def test_an_entry_only_a_3_way_merge_takes_is_ok_for_apply_and_not_for_wheel(three_way_only: Path, checked,
                                                                            tmp_path: Path):
    code, revs = check("v0.5.19", extra=("--series", str(three_way_only)))
    (entry,) = revs["v0.5.19"]["entries"]
    assert (code, entry["status"], revs["v0.5.19"]["apply"]["exit"],
            revs["v0.5.19"]["wheel"]["exit"]) == (0, "3way", 0, 1)
    tree = invoke("apply", "--sglang-rev", "v0.5.19", "--tree", str(tmp_path / "t"), "--series", str(three_way_only),
                  as_json=False)
    assert tree.code == 0 and "(needed a 3-way merge)" in tree.text
    wheel = invoke("wheel", "--from-release", "0.5.19", "-o", str(tmp_path / "d"), "--series", str(three_way_only),
                   as_json=False)
    assert wheel.code == 1 and "does not apply to sglang-0.5.19" in wheel.err


def test_check_strict_fails_where_wheel_would(three_way_only: Path, checked):
    code, revs = check("v0.5.19", extra=("--series", str(three_way_only), "--strict"))
    assert code == 1 and revs["v0.5.19"]["ok"] is True  # apply would; a wheel would not


def test_the_closing_line_says_where_the_wheel_stops_though_all_apply(three_way_only: Path, checked):
    """The last line a user reads never says "all apply" alone while a row says the wheel stops."""
    run = invoke("check", "--sglang-rev", "v0.5.19", "--series", str(three_way_only), as_json=False)
    last = run.text.strip().splitlines()[-1]
    assert run.code == 0 and "v0.5.19: apply: applies; wheel: stops at" in run.text, run.text
    assert last.startswith("all apply; the wheel stops on v0.5.19 (its line above; --strict makes that an exit 1)")


def test_check_alone_checks_every_release_the_series_supports(checked):
    """README's `c128patch check`, as written: no --sglang-rev, the four releases, oldest first."""
    res = invoke("check")
    assert res.code == 0, res.err
    assert [r["rev"] for r in res.out["revs"]] == list(RELEASES)
    assert [r["apply"] for r in res.out["revs"]] == [checked[rev]["apply"] for rev in RELEASES]
