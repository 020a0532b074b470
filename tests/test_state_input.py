"""State files read back as untrusted input: a series manifest, an apply journal and a resolution
ledger that are malformed or nested 100,000 deep give one line and a non-zero exit, never a
traceback (RecursionError included), and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.series.ledger import Ledger
from c128patch.series.manifest import load_series
from support import copy_series, refused, small_clone, snapshot

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
