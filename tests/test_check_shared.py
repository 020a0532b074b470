"""`check` over many revs shares git's answers and the entries' replays by content (``ReadMemo``,
``ops.replay.replay_patch_shared``, ``series.plan.LazyIndex``): its rows are those of a replay on a real
index, and a rev whose files were replayed already costs few git calls. Real product series, every
supported release and v0.5.19 (where entries conflict)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from c128patch.git import Git
from c128patch.ops.check import check_revs
from c128patch.ops.lint import update_hashes
from c128patch.ops.replay import RevCheck, replay_in_index
from c128patch.series.manifest import default_series_root, load_series
from c128patch.upstream.releases import ReleaseHistory
from c128patch.upstream.source import Target
from support import RELEASES, upstream_commit

REVS = ("v0.5.19", *RELEASES)


def rows(result: RevCheck) -> list[tuple]:
    return [(e.name, e.status, e.detail, e.file, e.chosen_by, e.conflicts, e.renamed) for e in result.entries]


def test_shared_replays_give_the_rows_of_a_replay_on_a_real_index(sglang_release_repo: Path, tmp_path: Path) -> None:
    ReleaseHistory().ensure(["0.5.19"])  # adding a release changes nothing already there
    series, git = load_series(default_series_root()), Git(git_dir=sglang_release_repo)
    revs = [Target(rev, git.rev_parse(rev)) for rev in REVS]
    checked = check_revs(series, git, [*revs, *revs])  # the second round replays nothing anew
    assert any(e.status == "conflict" for e in checked[0].entries)  # v0.5.19: the failing paths too
    for i, (rev, commit) in enumerate((t.rev, t.commit) for t in revs):
        (tmp_path / rev).mkdir()
        plain, _ = replay_in_index(series, git, rev, commit, tmp_path / rev / "index")  # a plain Git: a real index
        assert rows(checked[i]) == rows(plain) == rows(checked[i + len(revs)]), rev


def test_a_rev_replayed_already_costs_few_git_calls(sglang_release_repo: Path, monkeypatch) -> None:
    series, git = load_series(default_series_root()), Git(git_dir=sglang_release_repo)
    rev = Target("v0.5.23", git.rev_parse("v0.5.23"))
    calls = []
    raw = Git._raw
    monkeypatch.setattr(Git, "_raw", lambda self, args, *a, **k: calls.append(args[0]) or raw(self, args, *a, **k))
    check_revs(series, git, [rev], jobs=1)
    once = len(calls)
    calls.clear()
    twice = check_revs(series, git, [rev, rev], jobs=1)
    assert twice[0] == twice[1]
    assert len(calls) - once <= 2, calls[once:]  # the second: git's answers and the replays remembered


def test_a_file_where_an_entry_adds_a_folder_fails_as_on_a_real_index(sglang_release_repo: Path,
                                                                      tmp_path: Path) -> None:
    """The in-memory index holds only the series' paths; git refuses a file under a file (``a/b`` where ``a`` is
    one) only if the file at the folder is there too."""
    work = tmp_path / "up.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(sglang_release_repo), str(work)], check=True)
    git, folder = Git(git_dir=work), "python/sglang/c128_new"
    blob = git.out("hash-object", "-w", "--stdin", input="x\n")
    commit = upstream_commit(git, "v0.5.23", "a file", lambda idx: idx.run(
        "update-index", "--add", "--cacheinfo", f"100644,{blob},{folder}"))
    (tmp_path / "s" / "patches").mkdir(parents=True)
    (tmp_path / "s" / "patches" / "0001-add.patch").write_text(
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: t <t@t>\nSubject: [PATCH] "
        f"add\n\ndiff --git a/{folder}/mod.py b/{folder}/mod.py\nnew file mode 100644\nindex "
        f"0000000000000000000000000000000000000000..{blob}\n--- /dev/null\n+++ b/{folder}/mod.py\n@@ -0,0 +1 @@\n+x\n")
    (tmp_path / "s" / "patches" / "series.toml").write_text(
        '[series]\nname = "t"\nversion = "1"\nbase = "v0.5.23"\n\n[[entries]]\nname = "add"\nkind = "patch"\n'
        'file = "0001-add.patch"\nwhy = "t"\nbase = "v0.5.23"\n')
    update_hashes(load_series(tmp_path / "s"))
    series = load_series(tmp_path / "s")
    revs = [Target("v0.5.23", git.rev_parse("v0.5.23")), Target("file", commit)]
    checked = check_revs(series, git, revs)
    assert [r.ok for r in checked] == [True, False]
    (tmp_path / "idx").mkdir()  # (a work tree above the clone would make git apply skip every path outside it)
    for i, target in enumerate(revs):
        plain, _ = replay_in_index(series, git, target.rev, target.commit, tmp_path / "idx" / f"{i}.index")
        assert rows(checked[i]) == rows(plain), target.rev


def test_what_the_plans_probe_applied_strictly_is_not_applied_again(sglang_release_repo: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    """Upstream changed a file two entries patch (away from their hunks): the first one's result is unknown to
    variant choice, so the plan's probe replays the entries; the replay takes what the probe applied strictly."""
    work = tmp_path / "up.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(sglang_release_repo), str(work)], check=True)
    git, path = Git(git_dir=work), "python/sglang/srt/speculative/dspark_components/dspark_worker_v2.py"
    blob = git.out("hash-object", "-w", "--stdin", input=git.blob("v0.5.23", path).decode() + "# upstream\n")
    commit = upstream_commit(git, "v0.5.23", "a line at the end", lambda idx: idx.run(
        "update-index", "--cacheinfo", f"100644,{blob},{path}"))
    series, calls, raw = load_series(default_series_root()), [], Git._raw
    monkeypatch.setattr(Git, "_raw", lambda self, args, *a, **k: calls.append(tuple(args)) or raw(self, args, *a, **k))
    [checked] = check_revs(series, git, [Target("up", commit)], jobs=1)
    applied = [args for args in calls if args[:2] == ("apply", "--cached")]
    assert len(applied) >= 3 and len(set(applied)) == len(applied), applied  # the probe's, once each
    (tmp_path / "idx").mkdir()
    plain, _ = replay_in_index(series, git, "up", commit, tmp_path / "idx" / "index")
    assert checked.ok and rows(checked) == rows(plain)
