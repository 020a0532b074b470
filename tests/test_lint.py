"""lint against upstream: a patch file's base tag and the commit the manifest records agree."""

from __future__ import annotations

import re
from pathlib import Path

from c128patch.upstream.releases import ReleaseHistory
from support import copy_series, invoke


def _series_with_commit_of(tmp_path: Path, base: str, other: str) -> tuple[Path, str, str]:
    """A copy of the product series whose first variant made on ``base`` records ``other``'s commit."""
    git = ReleaseHistory().git
    right, wrong = git.rev_parse(base), git.rev_parse(other)
    series = copy_series(tmp_path / "series")
    toml = series / "patches" / "series.toml"
    text, n = re.subn(rf'(base = "{re.escape(base)}"\ncommit = ")({right})(")', rf"\g<1>{wrong}\g<3>",
                      toml.read_text(), count=1)
    assert n == 1, f"no variant made on {base} in the product series"
    toml.write_text(text)
    return series, right, wrong


def test_a_variant_whose_commit_is_not_its_base_tag_is_an_error(tmp_path: Path):
    series, right, wrong = _series_with_commit_of(tmp_path, "v0.5.20", "v0.5.21")
    res = invoke("lint", "--series", series)
    assert res.code == 1
    (finding,) = [f for f in res.out["findings"] if "upstream, but the manifest records" in f["message"]]
    assert finding["level"] == "error"
    assert finding["message"].endswith(f": base v0.5.20 is commit {right[:12]} upstream, but the manifest "
                                       f"records {wrong[:12]}")


def test_offline_lint_cannot_check_the_base_commits(tmp_path: Path):
    series, _, _ = _series_with_commit_of(tmp_path, "v0.5.20", "v0.5.21")
    res = invoke("lint", "--series", series, "--offline")
    assert res.code == 0, res.out["findings"]


def test_the_product_series_bases_agree_with_the_release_tags():
    res = invoke("lint")
    assert res.code == 0 and res.out["findings"] == [], res.out["findings"]
