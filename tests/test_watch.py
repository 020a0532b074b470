"""watch: the series carried onto a newer upstream in a scratch clone, proven, checked, and classified
clean / refreshed / merged / conflict with its report; a refreshed series it writes applies strictly
on the target and is a refresh fixed point there. On the real release history (a series made at
v0.5.22 watched onto v0.5.23) and on upstream commits made in the test on v0.5.23
(tests/watch_upstream.py)."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import watch_upstream as wu
from c128patch.fit.treecheck import check_tree
from c128patch.fit.watch import EXIT
from c128patch.git import Git
from c128patch.ops.lint import update_hashes
from c128patch.series.manifest import load_series
from support import (
    REPO_ROOT,
    Run,
    copy_series,
    forget_resolutions,
    invoke,
    snapshot,
    tier_unchecked,
    tree_of,
    upstream_commit,
)

RS, HELPER = wu.RS, wu.RS_HELPER
BACKEND = "c128-dspark-online-backend"
COMMIT = "c128-dspark-online-commit"
ENVIRON = "python/sglang/srt/environ.py"
VERIFY = wu.VERIFY
PRODUCT = load_series(REPO_ROOT)
V, N = int(PRODUCT.version), len(PRODUCT.entries)  # the product series' version and entries


@dataclass
class Watched:
    run: Run
    out: Path
    series: Path

    @property
    def report(self) -> dict:
        return self.run.out

    @property
    def md(self) -> str:
        return (self.out / "watch-report.md").read_text()

    def how(self) -> dict[str, str]:
        return {e["name"]: e["on_rev"] for e in self.report["entries"]}


def watch(out: Path, series: Path, onto: str, *args: str) -> Watched:
    return Watched(invoke("watch", "--onto", onto, "--out", str(out), "--series", str(series), *args), out, series)


def apply_into(repo: Path | str, tree: Path, series: Path, rev: str) -> Run:
    return invoke("apply", "--sglang-rev", rev, "--repo", str(repo), "--tree", str(tree), "--series", str(series))


@pytest.fixture(scope="session")
def stand_in(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    """The remote: the release history plus one branch per upstream change of watch_upstream."""
    git = wu.stand_in(sglang_release_repo, tmp_path_factory.mktemp("remote") / "sglang.git")
    for branch, commit in (("rename", wu.rename_in_context(git)), ("moved", wu.method_moved(git)),
                           ("landed", wu.landed_reformatted(git, REPO_ROOT)), ("unrelated", wu.unrelated(git))):
        wu.set_branch(git, branch, commit)
    return git


def remote(git: Git) -> str:
    return str(git.git_dir)


@pytest.fixture(scope="session")
def series_022(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wu.series_made_at(tmp_path_factory.mktemp("s022"), sglang_release_repo, "v0.5.22")


# -- refreshed, on the real releases: a series made at v0.5.22 watched onto v0.5.23 ----------


@pytest.fixture(scope="session")
def onto_023(series_022: Path, tmp_path_factory: pytest.TempPathFactory) -> Watched:
    return watch(tmp_path_factory.mktemp("w023") / "out", series_022, "v0.5.23")


def test_watch_says_on_stderr_that_it_runs_the_targets_code_on_a_terminal_or_not(onto_023: Watched, tmp_path):
    """Off a terminal (CI, and here) the tier's step line showed only at the reporter's beat: a short tier never
    said it ran the target's code. Said as the tier starts now; a refusal before any work stays one line."""
    assert "watch runs the target tree's code" in onto_023.run.err and "--no-run skips it" in onto_023.run.err
    refused = watch(tmp_path / "out", REPO_ROOT, "no-such-rev")
    assert refused.run.code == 2 and refused.run.err.startswith("c128patch: error: unknown rev 'no-such-rev'")


def test_a_series_made_at_v0_5_22_is_refreshed_onto_v0_5_23(onto_023):
    assert onto_023.run.code == EXIT["refreshed"] == 3, onto_023.run.err
    assert onto_023.report["outcome"] == "refreshed"
    needed = {n: h for n, h in onto_023.how().items() if h != "strict"}
    assert needed == {RS: "ledger", BACKEND: "ledger", COMMIT: "3-way"}


def test_the_refreshed_report_says_what_needed_a_merge_and_that_it_is_proven(onto_023):
    md = onto_023.md
    assert md.startswith("# c128patch watch: `refreshed` on `v0.5.23@")
    assert (f"3 of {N} entries needed a 3-way merge or a recorded resolution ({RS} (ledger), {BACKEND} (ledger), "
            f"{COMMIT} (3-way)); the refreshed series c128patch {V + 2} applies strictly there"
            in onto_023.report["headline"])
    assert f"| {COMMIT} | 3-way | `patches/0010-c128-dspark-online-commit.patch (ancestor)` |" in md
    assert (f"## Proof\n\n`identical to a fresh apply of series c128patch {V + 1} on v0.5.23 with ledger resolutions"
            in md)
    assert "- applied fresh on `v0.5.23@" in md and "every entry strictly, the same tree as the proven rebase; " \
                                                 "`refresh --check` there changes nothing" in md


def test_the_refreshed_series_moves_its_base_to_the_release_tag(onto_023):
    refreshed = load_series(onto_023.out / "series")
    assert ((refreshed.base, refreshed.version, onto_023.report["refreshed"]["mode"])
            == ("v0.5.23", str(V + 2), "primary"))
    assert all({v.base for v in e.variants} >= {"v0.5.22"} for e in refreshed.entries if e.is_patch)


@pytest.fixture(scope="session")
def applied_refreshed(onto_023, sglang_release_repo, tmp_path_factory) -> tuple[Run, Git]:
    tree = tmp_path_factory.mktemp("applied") / "tree"
    return apply_into(sglang_release_repo, tree, onto_023.out / "series", "v0.5.23"), Git(worktree=tree)


def test_the_refreshed_series_applies_strictly_on_v0_5_23(applied_refreshed):
    run, _ = applied_refreshed
    assert run.code == 0, run.err
    assert {e["applied"] for e in run.out["entries"]} == {"clean"}


def test_the_refreshed_series_gives_the_tree_of_the_product_series_on_v0_5_23(applied_refreshed,
                                                                               sglang_release_repo, tmp_path):
    """The ledger resolutions and the 3-way merge rebuild the very files the product carries for 0.5.23."""
    run = apply_into(sglang_release_repo, tmp_path / "product", REPO_ROOT, "v0.5.23")
    assert run.code == 0, run.err
    assert tree_of(applied_refreshed[1]) == tree_of(Git(worktree=tmp_path / "product"))


def test_the_refreshed_series_passes_refresh_check_on_v0_5_23(applied_refreshed, onto_023):
    run = invoke("refresh", "--check", "--tree", str(applied_refreshed[1].worktree), "--series",
                 str(onto_023.out / "series"))
    assert run.code == 0 and run.out["changed"] == [], run.out


def test_the_refresh_change_comes_with_its_commit_message(onto_023):
    message = (onto_023.out / "commit-message.txt").read_text()
    assert message.startswith("patches: refresh the series for upstream v0.5.23@")
    assert (f"\n{COMMIT}: 3-way\n" in message
            and f"Series c128patch {V + 1} -> {V + 2} (primary files for v0.5.23)." in message)


@pytest.mark.parametrize("outcome", ["broken", "failed"])
def test_a_refreshed_series_that_does_not_fit_comes_with_no_commit_message(onto_023, tmp_path, outcome):
    """The refreshed series stays under ``series/`` for the report, but no message proposes committing it (it said
    "propose entries merged upstream" on any outcome other than ``refreshed``)."""
    from c128patch.fit.watch import Watch

    report = {**json.loads(json.dumps(onto_023.report)), "outcome": outcome, "json": {}}
    subprocess.run(["cp", "-R", str(onto_023.out / "series"), str(tmp_path / "refreshed")], check=True)
    out = tmp_path / "out"
    Watch(load_series(onto_023.series), None, "v0.5.23", out).write(report, tmp_path)
    assert (out / "series" / "patches" / "series.toml").is_file() and not (out / "commit-message.txt").exists()


# -- conflict, on the real releases: the same series without its ledger ---------------------


@pytest.fixture(scope="session")
def unresolved_023(series_022: Path, tmp_path_factory: pytest.TempPathFactory) -> Watched:
    root = tmp_path_factory.mktemp("w023-noledger")
    series = root / "series"
    subprocess.run(["cp", "-R", str(series_022), str(series)], check=True)
    forget_resolutions(series, RS)
    forget_resolutions(series, BACKEND)
    return watch(root / "out", series, "v0.5.23")


def test_without_the_ledger_every_conflicting_entry_is_reported_in_one_run(unresolved_023):
    assert unresolved_023.run.code == EXIT["conflict"] == 5, unresolved_023.run.err
    assert [c["entry"] for c in unresolved_023.report["conflicts"]] == [RS, BACKEND]
    assert {n for n, h in unresolved_023.how().items() if h == "conflict"} == {RS, BACKEND}


def test_a_conflict_names_each_file_hunk_and_upstream_commit(unresolved_023, sglang_release_repo):
    rs = unresolved_023.report["conflicts"][0]
    assert sorted({b["path"] for b in rs["blocks"]}) == [ENVIRON, VERIFY]
    release = Git(git_dir=sglang_release_repo).out("log", "-1", "--format=%h %s", "v0.5.23")
    assert all(b["hunk"].startswith("@@ ") and b["upstream"] == [release] for b in rs["blocks"])
    assert unresolved_023.report["headline"].startswith(f"entry {RS} conflicts on v0.5.23@")
    assert f"## Conflict: {RS}\n" in unresolved_023.md and f"- `{VERIFY}` lines " in unresolved_023.md


def test_a_conflict_writes_no_series(unresolved_023):
    assert not (unresolved_023.out / "series").exists() and unresolved_023.report["refreshed"] is None


# -- clean, on the real releases: the product series watched onto v0.5.22 from your clone -----


@pytest.fixture(scope="session")
def clean_022(sglang_release_repo, tmp_path_factory) -> tuple[Watched, dict, dict]:
    pytest.importorskip("torch", reason="watch is clean only where its behavioural tier can import: needs torch")
    root = tmp_path_factory.mktemp("w022")
    clone = root / "sglang"
    subprocess.run(["git", "clone", "--quiet", str(sglang_release_repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", "-b", "mine", "v0.5.23"], check=True)
    (clone / "notes.txt").write_text("uncommitted work of the user\n")
    before = snapshot(clone)
    watched = watch(root / "out", REPO_ROOT, "v0.5.22", "--repo", str(clone))
    return watched, before, snapshot(clone)


def test_a_series_whose_files_apply_strictly_is_clean_only_where_every_module_imported(clean_022):
    watched = clean_022[0]
    tier = tier_unchecked(watched.report["behaviour"])
    assert [u for u in watched.report["unchecked"] if not u.startswith("C++: ")] == tier
    outcome = "unchecked" if watched.report["unchecked"] else "clean"
    assert watched.run.code == EXIT[outcome] and watched.report["outcome"] == outcome, watched.run.err
    assert set(watched.how().values()) == {"strict"}
    assert watched.report["headline"].startswith(f"series c128patch {V} applies strictly on v0.5.22@")
    assert f"({N} entries, proven)" in watched.report["headline"]
    assert watched.report["headline"].endswith(
        f" but is not checked here: {'; '.join(watched.report['unchecked'])}" if tier else "; nothing to do")


def test_watch_never_touches_the_user_s_clone(clean_022):
    _, before, after = clean_022
    assert after == before


# -- upstream commits made in the test on v0.5.23 --------------------------------------------


# --no-run where the behavioural tier is not the subject (it is watch's costliest step: test_watch_behaviour's
# subject, and `unrelated`'s below): refreshed, merged and failed outrank the unchecked it leaves.
@pytest.fixture(scope="session")
def renamed(stand_in, tmp_path_factory) -> Watched:
    return watch(tmp_path_factory.mktemp("w-rename") / "out", REPO_ROOT, "rename", "--repo", remote(stand_in),
                 "--no-run")


def test_a_rename_in_a_hunk_s_context_is_refreshed_by_a_3way_merge(renamed):
    assert renamed.run.code == EXIT["refreshed"], renamed.run.err
    assert {n: h for n, h in renamed.how().items() if h != "strict"} == {RS: "3-way"}
    assert renamed.report["equivalence"]["identical"]


def test_a_refresh_for_an_untagged_commit_adds_a_variant_and_keeps_the_base(renamed, stand_in):
    commit = stand_in.rev_parse("rename")
    refreshed = load_series(renamed.out / "series")
    assert refreshed.base == "v0.5.23" and renamed.report["refreshed"]["mode"] == "variant"
    [variant] = [v for v in refreshed.entry(RS).variants if v.base == commit[:12]]
    assert variant.commit == commit
    assert renamed.report["refreshed"]["changed"] == [f"patches/{variant.file}", "patches/series.toml"]


def test_the_variant_applies_strictly_on_the_commit_and_passes_refresh_check(renamed, stand_in, tmp_path):
    tree = tmp_path / "tree"
    run = apply_into(remote(stand_in), tree, renamed.out / "series", "rename")
    assert run.code == 0, run.err
    assert {e["applied"] for e in run.out["entries"]} == {"clean"}
    assert wu.RENAMED[1] in (tree / VERIFY).read_text()
    check = invoke("refresh", "--check", "--tree", str(tree), "--series", str(renamed.out / "series"))
    assert check.code == 0 and check.out["changed"] == [], check.out


@pytest.fixture(scope="session")
def moved(stand_in, tmp_path_factory) -> Watched:
    return watch(tmp_path_factory.mktemp("w-moved") / "out", REPO_ROOT, "moved", "--repo", remote(stand_in))


def _moved_method_lines(stand_in: Git) -> tuple[int, int]:
    text = stand_in.blob("moved", VERIFY).decode()
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "TargetVerifyExecutor")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == wu.MOVED)
    return method.lineno, method.end_lineno


def test_a_moved_method_is_a_conflict_that_says_where_the_code_went(moved, stand_in):
    assert moved.run.code == EXIT["conflict"], moved.run.err
    [conflict] = moved.report["conflicts"]
    [block] = conflict["blocks"]
    first, last = _moved_method_lines(stand_in)
    assert conflict["entry"] == RS and block["path"] == VERIFY and block["empty"]
    assert first <= block["moved_to"] <= last
    subject = stand_in.out("log", "-1", "--format=%h %s", "moved")
    assert block["upstream"] == [subject]
    assert moved.report["headline"] == (
        f"entry {RS} conflicts on moved@{stand_in.rev_parse('moved')[:12]} in {VERIFY} since upstream commit "
        f"{subject}; the code its hunk edits now lives at {VERIFY}:{block['moved_to']}")


def test_the_other_entries_of_a_conflict_are_proven_without_it(moved):
    assert moved.report["equivalence"]["summary"].startswith(f"identical to a fresh apply of series c128patch {V} "
                                                              f"without {RS} on moved")
    assert {h for n, h in moved.how().items() if n != RS} == {"strict"}


def test_the_printed_commands_reproduce_the_stop(moved, tmp_path):
    commands = moved.report["reproduce"]
    assert commands == moved.report["next"][:2] and "```sh\n" + "\n".join(commands) in moved.md
    ours = f"{shlex.quote(sys.executable)} -m c128patch "  # this interpreter: the venv may not be activated
    procs = [subprocess.run(shlex.split(c.replace("c128patch ", ours, 1)), cwd=tmp_path, capture_output=True,
                            text=True) for c in commands]
    assert procs[0].returncode == 0, procs[0].stderr
    assert procs[1].returncode == 1
    assert procs[1].stderr.startswith(f"c128patch: error: entry '{RS}' conflicts on ")
    assert f" in {VERIFY}\n" in procs[1].stderr.splitlines(keepends=True)[0]


@pytest.fixture(scope="session")
def landed(stand_in, tmp_path_factory) -> Watched:
    return watch(tmp_path_factory.mktemp("w-landed") / "out", REPO_ROOT, "landed", "--repo", remote(stand_in),
                 "--no-run")


def test_an_entry_upstream_landed_with_other_formatting_is_reported_merged(landed):
    assert landed.run.code == EXIT["merged"] == 4, landed.run.err
    assert [m["entry"] for m in landed.report["merged"]] == [HELPER, RS]
    assert {n for n, h in landed.how().items() if h == "merged upstream (proposed)"} == {HELPER, RS}


def test_merged_is_proposed_on_content_evidence_naming_the_upstream_commit(landed, stand_in):
    commit = stand_in.rev_parse("landed")
    signals = {m["entry"]: {s["kind"]: s for s in m["signals"]} for m in landed.report["merged"]}
    assert signals[RS]["patch-id"]["commit"] == commit and "reverse-apply" not in signals[RS]  # not the same text
    assert "overlay-identical" in signals[HELPER]
    assert f"## Merged upstream (proposed): {RS}\n\n" in landed.md
    assert "names PR #32035` (a hint, not evidence)" in landed.md  # the #ref inert in a code span


def test_the_proposed_series_keeps_the_merged_entries_with_merged_in(landed, stand_in, tmp_path):
    commit = stand_in.rev_parse("landed")
    proposed = load_series(landed.out / "series")
    assert {e.name: e.merged_in for e in proposed.entries if e.merged_in} == {RS: commit, HELPER: commit}
    run = apply_into(remote(stand_in), tmp_path / "tree", landed.out / "series", "landed")
    assert run.code == 0, run.err
    assert {e["name"] for e in run.out["entries"] if e["status"] == "skipped"} == {RS, HELPER}


@pytest.fixture(scope="session")
def unrelated(stand_in, tmp_path_factory) -> Watched:
    pytest.importorskip("torch", reason="watch is clean only where its behavioural tier can import: needs torch")
    return watch(tmp_path_factory.mktemp("w-unrelated") / "out", REPO_ROOT, "unrelated", "--repo", remote(stand_in))


def test_an_upstream_commit_the_series_does_not_meet_is_clean_where_every_module_imported(unrelated):
    tier = tier_unchecked(unrelated.report["behaviour"])
    outcome = "unchecked" if unrelated.report["unchecked"] else "clean"
    assert [u for u in unrelated.report["unchecked"] if not u.startswith("C++: ")] == tier
    assert unrelated.run.code == EXIT[outcome] and unrelated.report["outcome"] == outcome, unrelated.run.err
    assert unrelated.report["next"] == []


def test_clean_writes_the_reports_and_nothing_else(unrelated):
    assert sorted(p.name for p in unrelated.out.iterdir()) == [".gitignore", "rebase-report.json", "rebase-report.md",
                                                                 "watch-report.json", "watch-report.md"]
    assert json.loads((unrelated.out / "watch-report.json").read_text()) == unrelated.report


def test_every_check_runs_and_passes_on_a_clean_run(unrelated):
    checks = {c["name"]: c for c in unrelated.report["checks"]}
    assert list(checks) == ["lint", "audit", "no-conflict-markers", "python-compiles", "gates-declared"]
    assert all(c["ok"] and not c.get("skipped") for c in checks.values())


def test_a_series_that_carries_but_fails_a_check_is_failed_and_offers_nothing(stand_in, tmp_path):
    """The env entry's header names the wrong gate: everything applies, lint finds it."""
    series = copy_series(tmp_path / "series")
    patch = series / "patches" / "0006-c128-dspark-online-env.patch"
    patch.write_text(patch.read_text().replace("C128patch-Gate: SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK (default off)",
                                               "C128patch-Gate: none (wrong)"))
    update_hashes(load_series(series))
    w = watch(tmp_path / "out", series, "rename", "--repo", remote(stand_in), "--no-run")
    assert w.run.code == EXIT["failed"] == 6, w.run.err
    [problem] = w.report["problems"]
    assert problem == ("lint: c128-dspark-online-env: patches/0006-c128-dspark-online-env.patch: header must say "
                       "'C128patch-Gate: SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK'")
    assert w.report["headline"].endswith(problem) and "| lint | **FAILED** |" in w.md
    assert w.report["next"] == [] and not w.report["ok"]


def test_refresh_exports_a_branch_whose_entry_upstream_landed_with_other_formatting(stand_in, tmp_path):
    """The rebase drops it on content evidence; refresh proves the tree without it, as the rebase did."""
    series = copy_series(tmp_path / "series")
    tree = tmp_path / "tree"
    assert apply_into(remote(stand_in), tree, series, "v0.5.23").code == 0
    rebased = invoke("rebase", "--onto", "landed", "--repo", remote(stand_in), "--drop-merged", "--tree", str(tree),
                     "--series", str(series))
    assert rebased.code == 0, rebased.err
    run = invoke("refresh", "--tree", str(tree), "--series", str(series))
    assert run.code == 0, run.err
    assert run.out["tree"].startswith(f"identical to a fresh apply of series c128patch {V} without {HELPER}, {RS} on ")
    assert load_series(series).entry(RS).merged_in == stand_in.rev_parse("landed")


# -- bounded, and bad input ----------------------------------------------------------------------


def test_watch_gives_up_at_its_timeout_and_says_where(stand_in, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    w = watch(tmp_path / "out", REPO_ROOT, "rename", "--repo", remote(stand_in), "--timeout", "1")
    assert w.run.code == EXIT["timeout"] == 124
    assert w.run.err.startswith("c128patch: error: watch timed out after 1 s while ")
    assert f"  report: {tmp_path / 'out' / 'watch-report.md'}\n" in w.run.err
    report = json.loads((tmp_path / "out" / "watch-report.json").read_text())
    assert report["outcome"] == "timeout" and w.run.err.splitlines()[0].endswith(report["phase"])
    assert list((tmp_path / "tmp").iterdir()) == []  # the scratch clone is gone


def test_watch_refuses_an_out_folder_of_other_files(stand_in, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine\n")
    w = watch(tmp_path / "out", REPO_ROOT, "rename", "--repo", remote(stand_in))
    assert w.run.code == 2
    assert w.run.err.startswith(f"c128patch: error: --out {tmp_path / 'out'} holds files that are not a c128patch "
                                "watch report")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_watch_refuses_an_unknown_rev_in_one_line(stand_in, tmp_path):
    w = watch(tmp_path / "out", REPO_ROOT, "no-such-branch", "--repo", remote(stand_in))
    assert w.run.code == 2 and w.run.err == f"c128patch: error: unknown rev 'no-such-branch' in {remote(stand_in)}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("said", ["fatal: sha1 file 'x/.git/index.lock' write error. Out of diskspace",
                                  "error: unable to write file x.py: File too large"], ids=["disk-full", "ulimit-f"])
def test_a_full_disk_or_file_size_limit_at_the_base_is_no_outcome_not_failed(sglang_release_repo, tmp_path,
                                                                            monkeypatch, said):
    """Helper 181: a full TMPDIR (or ``ulimit -f``) as watch checked the series out at its base: outcome `failed`
    (exit 6), "the series does not apply at its own base", a report of a finding about the series. The machine's
    failure: one line, exit 2, no report."""
    from support import failing_git

    fake = failing_git(tmp_path / "bin", '*" checkout --quiet -b "*', said)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    w = watch(tmp_path / "out", REPO_ROOT, "v0.5.23", "--repo", str(sglang_release_repo), "--no-run")
    (line,) = w.run.err.strip().splitlines()[-1:]
    assert w.run.code == 2 and line.startswith("c128patch: error: watch stopped: the machine") and said in line, \
        w.run.err
    assert not (tmp_path / "out" / "watch-report.json").exists()


# -- the tree checks ---------------------------------------------------------------------------


def _tree_with(git: Git, text: str) -> str:
    def edit(idx: Git) -> None:
        blob = idx.out("hash-object", "-w", "--stdin", input=text)
        idx.run("update-index", "--cacheinfo", f"100644,{blob},{VERIFY}")

    return upstream_commit(git, "v0.5.23", "test", edit)


def test_tree_checks_find_a_conflict_marker(stand_in):
    text = stand_in.blob("v0.5.23", VERIFY).decode()
    head = _tree_with(stand_in, text.replace("\n\n", "\n<<<<<<<\n\n", 1))
    markers = {c.name: c for c in check_tree(stand_in, "v0.5.23", head, [])}["no-conflict-markers"]
    assert not markers.ok and markers.findings[0].startswith(f"{VERIFY}:")


def test_tree_checks_find_python_that_no_longer_compiles(stand_in):
    text = stand_in.blob("v0.5.23", VERIFY).decode()
    head = _tree_with(stand_in, text + "def broken(:\n")
    compiles = {c.name: c for c in check_tree(stand_in, "v0.5.23", head, [])}["python-compiles"]
    assert not compiles.ok and compiles.findings == [f"{VERIFY}:{text.count(chr(10)) + 1}: invalid syntax"]


def test_tree_checks_find_a_gate_environ_py_does_not_declare(stand_in):
    head = _tree_with(stand_in, stand_in.blob("v0.5.23", VERIFY).decode() + "# x\n")
    gates = {c.name: c for c in check_tree(stand_in, "v0.5.23", head, ["SGLANG_DSPARK_FUSED_ACCEPT_TAIL",
                                                                         "SGLANG_NOT_A_GATE"])}["gates-declared"]
    assert gates.findings == [f"SGLANG_NOT_A_GATE is not declared in {ENVIRON}"]


def test_docs_and_help_give_every_outcome_its_exit_code():
    doc = (REPO_ROOT / "docs" / "watch.md").read_text()
    readme = (REPO_ROOT / "README.md").read_text()
    help_text = invoke("watch", "--help", as_json=False).text
    for outcome, code in EXIT.items():
        assert f"| `{outcome}` | {code} |" in doc
        assert f"{outcome} {code}" in help_text
        in_readme = rf"timed out \({code}\)" if outcome == "timeout" else rf"`{outcome}` \((exit )?{code}\b"
        assert re.search(in_readme, readme), outcome



@pytest.mark.parametrize("run_code", [True, False])
def test_the_tier_step_says_whether_the_targets_code_runs(tmp_path, run_code):
    from c128patch.errors import C128Error
    from c128patch.fit.watch import Watch

    class Steps(list):
        def step(self, message: str) -> None:
            self.append(message)

    class NoCheckout:  # the tier's start stops at the checkout: only its first line is the subject
        def run(self, *args: str) -> None:
            raise C128Error("no checkout here")

    said = Steps()
    w = Watch(load_series(REPO_ROOT), None, "v0.5.23", tmp_path, run_code=run_code, reporter=said)
    assert w._start_tier(NoCheckout(), w.series, "", "") == "no checkout here"
    assert ("(started, in the sealed box)" in said[0]) is run_code, said
    assert "runs the target tree's code" not in said[0], said  # said once as the tier starts: a beat repeated it
    assert ("--no-run, the target's code is not run (unchecked)" in said[0]) is not run_code, said


def test_watch_off_a_terminal_prints_its_report_with_no_line_padded(tmp_path):
    """Issue 37's walk: `c128patch watch --onto REV > log` printed each paragraph of its Markdown report padded with
    spaces to a million columns (15 MB of log). Off a terminal the report is printed as written."""
    res = invoke("watch", "--onto", "v0.5.23", "--no-run", "--out", str(tmp_path / "out"), as_json=False)
    assert res.code in (EXIT["clean"], EXIT["unchecked"]), res.err
    lines = res.text.splitlines()
    assert lines[-1] == f"report: {tmp_path / 'out' / 'watch-report.md'} (exit {res.code})", lines[-1]
    assert all(line == line.rstrip() for line in lines) and max(map(len, lines)) < 1000, max(map(len, lines))
    assert res.text.startswith((tmp_path / "out" / "watch-report.md").read_text().rstrip("\n"))


def test_watch_run_inside_a_patched_tree_leaves_it_clean_for_the_next_rebase(sglang_release_repo, tmp_path,
                                                                             monkeypatch):
    """From inside the tree apply made, watch's default ./c128patch-watch lands in it: the folder ignores itself,
    so the tree stays clean and the rebase the user runs next is not refused for untracked files."""
    tree = tmp_path / "sglang"
    assert apply_into(sglang_release_repo, tree, REPO_ROOT, "v0.5.23").code == 0
    monkeypatch.chdir(tree)
    ran = invoke("watch", "--onto", "v0.5.23", "--repo", str(sglang_release_repo), "--no-run")
    assert ran.code == EXIT["unchecked"], ran.err
    assert (tree / "c128patch-watch" / "watch-report.json").is_file()
    assert Git(worktree=tree).out("status", "--porcelain", "--untracked-files=all") == ""
    moved = invoke("rebase", "--onto", "v0.5.22")
    assert moved.code == 0, moved.err
    assert (tree / "c128patch-watch" / "watch-report.json").is_file()
