"""What upstream really does, one change per case, each an upstream commit made in the test on the
real v0.5.23 (fixed identity and dates): a reformat of the lines an entry touches, a file moved
with its importers updated, an overlay upstream adds byte for byte, a file upstream creates at an
overlay's path, a conflict resolved to upstream's side, a fix upstream makes its own way. Each is
carried (or stopped) as a maintainer would want, and the result is proven."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from c128patch.git import Git
from c128patch.ops.lint import update_hashes
from c128patch.series.manifest import load_series
from c128patch.series.provenance import PROVENANCE_PATH
from support import REPO_ROOT, Run, copy_series, invoke, tree_of, upstream_commit

ZERO = "c128-plan-zero-rows"
ENV = "c128-dspark-online-env"
CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
PLAN = "python/sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh"
MOVED_PLAN = "python/sglang/kernels/jit/csrc/deepseek_v4/compress_plan.cuh"
ENVIRON = "python/sglang/srt/environ.py"
WHEN = {"GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "upstream@sglang.invalid",
        "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "upstream@sglang.invalid",
        "GIT_AUTHOR_DATE": "2026-06-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-06-01T00:00:00Z"}


def put(idx: Git, path: str, text: str) -> None:
    blob = idx.out("hash-object", "-w", "--stdin", input=text)
    idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")


def commit_on(git: Git, subject: str, edit, parent: str = "v0.5.23") -> str:
    return upstream_commit(git.with_env(**WHEN), parent, subject, edit)


def reformatted(git: Git) -> str:
    """clang-format realigns the two declarations zero-rows deletes; an aligner pads the env
    assignments around the one env inserts."""
    cuh = git.blob("v0.5.23", CUH).decode()
    old = ("    const uint32_t seq_len = static_cast<uint32_t>(p.seq_lens[i]);\n"
           "    const uint32_t extend_len = static_cast<uint32_t>(p.extend_lens[i]);\n")
    assert cuh.count(old) == 1
    cuh = cuh.replace(old, old.replace("seq_len =", "seq_len    ="))
    env = git.blob("v0.5.23", ENVIRON).decode()
    pads = {"    SGLANG_OPT_USE_JIT_INDEXER_METADATA = EnvBool(True)\n":
            "    SGLANG_OPT_USE_JIT_INDEXER_METADATA =   EnvBool(True)\n",
            "    SGLANG_OPT_USE_ONLINE_COMPRESS = EnvBool(False)\n":
            "    SGLANG_OPT_USE_ONLINE_COMPRESS      = EnvBool(False)\n"}
    for a, b in pads.items():
        assert env.count(a) == 1
        env = env.replace(a, b)

    def edit(idx: Git) -> None:
        put(idx, CUH, cuh)
        put(idx, ENVIRON, env)

    return commit_on(git, "style: clang-format deepseek_v4 planners, align env flags", edit)


def reformatted_and_more(git: Git) -> str:
    """The realignment of ``reformatted`` plus a new line in the same hunk's context: no longer
    a whitespace-only difference at the hunk, so only a 3-way merge ignoring whitespace takes it."""
    cuh = git.blob("reformatted", CUH).decode()
    line = "  uint32_t write_count = 0;\n"
    assert cuh.count(line) == 1
    return commit_on(git, "c128 planner: count extra segments", lambda idx: put(idx, CUH, cuh.replace(
        line, line + "  uint32_t extra_count = 0;\n")), parent="reformatted")


WORKER = "python/sglang/srt/speculative/dspark_components/dspark_worker_v2.py"
BACKEND = "python/sglang/srt/layers/attention/deepseek_v4_backend.py"
STREAMS = "c128-dspark-record-streams"
BACKEND_ENTRY = "c128-dspark-online-backend"
JOINED = "        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())\n"
SPLIT = ("            ragged_layout = self._resolve_verify_layout(\n"
         "                forward_batch,\n"
         "                bs=len(seq_lens),\n"
         "            )\n")


def rewrapped(git: Git) -> str:
    """black re-wraps the lines next to two insertions: it joins the 3-line record_stream call the
    record-streams entry inserts after onto one line, and splits the _resolve_verify_layout call the
    backend entry inserts after over four (with its magic trailing comma)."""
    edits = {WORKER: ("        batch.seq_lens.record_stream(\n"
                      "            torch.get_device_module(self.device).current_stream()\n"
                      "        )\n", JOINED),
             BACKEND: ("            ragged_layout = self._resolve_verify_layout(forward_batch, bs=len(seq_lens))\n",
                       SPLIT)}
    texts = {}
    for path, (old, new) in edits.items():
        text = git.blob("v0.5.23", path).decode()
        assert text.count(old) == 1
        texts[path] = text.replace(old, new)
    return commit_on(git, "style: black", lambda idx: [put(idx, path, text) for path, text in texts.items()])


def reindented(git: Git) -> str:
    """The join of ``rewrapped``, indented one level deeper: no re-wrap, a change of the code's block."""
    text = git.blob("rewrapped", WORKER).decode()
    return commit_on(git, "dspark: record the seq_lens stream in a block", lambda idx: put(
        idx, WORKER, text.replace(JOINED, "    " + JOINED)), parent="rewrapped")


def plan_moved(git: Git) -> str:
    """c_plan.cuh moved to compress_plan.cuh with a line added at its top; every importer updated."""
    importers = [line.split(":", 2)[1] for line in git.out("grep", "-l", "c_plan.cuh", "v0.5.23", "--",
                                                          "python").splitlines()]

    def edit(idx: Git) -> None:
        text = git.blob("v0.5.23", PLAN).decode()
        idx.run("rm", "--cached", "--quiet", PLAN)
        put(idx, MOVED_PLAN, "// Compress plans (moved from c_plan.cuh).\n" + text)
        for path in importers:
            if path != PLAN:
                put(idx, path, git.blob("v0.5.23", path).decode().replace("c_plan.cuh", "compress_plan.cuh"))

    return commit_on(git, "deepseek_v4: rename c_plan.cuh to compress_plan.cuh", edit)


GUARD_OLD = "    RuntimeCheck(0 < extend_len && extend_len <= seq_len);\n"
GUARD_NEW = "    RuntimeCheck(extend_len <= seq_len);\n    if (extend_len == 0) continue;  // a padded row\n"
FIXED_SUBJECT = "deepseek_v4: accept zero-length rows in the C128 planners (#35848)"
HELPER = "c128-dspark-record-streams-helper"


def fixed_upstream(git: Git) -> str:
    """Upstream fixes zero-length rows its own way in both files, naming the entry's follow-up PR."""
    def edit(idx: Git) -> None:
        for path in (CUH, PLAN):
            text = git.blob("v0.5.23", path).decode()
            assert GUARD_OLD in text
            put(idx, path, text.replace(GUARD_OLD, GUARD_NEW))

    return commit_on(git, FIXED_SUBJECT, edit)


def half_fixed(git: Git) -> str:
    """Upstream guards zero-length rows in c_plan.cuh's plan_compress_prefill only, in a commit
    naming another PR: a semantic merge nothing in the text ties to the entry."""
    text = git.blob("v0.5.23", PLAN).decode()
    assert text.count(GUARD_OLD) == 2
    return commit_on(git, "deepseek_v4: skip empty rows when planning prefill compression (#36001)",
                     lambda idx: put(idx, PLAN, text.replace(GUARD_OLD, GUARD_NEW, 1)))


def half_fixed_then_reverted(git: Git) -> str:
    """``half_fixed``, then a commit taking it back: upstream's net change over the range leaves the function as it
    was, so no hint (what upstream made and took back does not handle anything now)."""
    text = git.blob("v0.5.23", PLAN).decode()
    return commit_on(git, "Revert: skip empty rows (#36002)", lambda idx: put(idx, PLAN, text),
                     parent=half_fixed(git))


def overlay_landed(git: Git) -> str:
    """Upstream adds the record-streams helper module, byte for byte ours."""

    series = load_series(REPO_ROOT)
    helper = series.entry(HELPER)
    return commit_on(git, "[DSPARK] record_stream helper for the verify inputs",
                     lambda idx: put(idx, helper.target, (series.root / helper.source).read_text()))


RULES = "c128-dspark-online-rules"
RULES_TARGET = "python/sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py"
RULES_USER = "python/sglang/srt/layers/attention/dsv4/upstream_rules_user.py"


def rules_taken(git: Git) -> str:
    """Upstream creates its own module at the rules overlay's path, and a module that imports it."""
    def edit(idx: Git) -> None:
        put(idx, RULES_TARGET, "UPSTREAM_RULES = ()\n")
        put(idx, RULES_USER, "from sglang.srt.layers.attention.dsv4.online_c128_dspark_rules import UPSTREAM_RULES\n")

    return commit_on(git, "dsv4: upstream's own online c128 rules", edit)


@pytest.fixture(scope="session")
def remote(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    """A bare clone of the release history with one branch per upstream change."""
    dest = tmp_path_factory.mktemp("remote") / "sglang.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(sglang_release_repo), str(dest)], check=True)
    git = Git(git_dir=dest)
    for branch, make in (("reformatted", reformatted), ("reformatted-more", reformatted_and_more),
                         ("rewrapped", rewrapped),
                         ("reindented", reindented),
                         ("plan-moved", plan_moved), ("fixed", fixed_upstream), ("half-fixed", half_fixed),
                         ("half-fixed-reverted", half_fixed_then_reverted), ("overlay-landed", overlay_landed),
                         ("rules-taken", rules_taken)):
        git.run("update-ref", f"refs/heads/{branch}", make(git))
    return git


def apply_at(remote: Git, root: Path, rev: str) -> tuple[Git, Path]:
    series = copy_series(root / "series")
    run = invoke("apply", "--sglang-rev", rev, "--repo", str(remote.git_dir), "--tree", str(root / "tree"),
                 "--series", str(series))
    assert run.code == 0, run.err
    return Git(worktree=root / "tree"), series


@pytest.fixture(scope="session")
def at_023(remote: Git, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product series applied at v0.5.23 from ``remote``: the clone each test copies (``applied``)."""
    return apply_at(remote, tmp_path_factory.mktemp("at-023"), "v0.5.23")[0].worktree


def copied(tree: Path, series: Path, root: Path) -> tuple[Git, Path]:
    """A copy of a clone (cp -a: its .git state with it) and of its series, in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(tree), str(root / "tree")], check=True)
    return Git(worktree=root / "tree"), Path(shutil.copytree(series, root / "series"))


def applied(at_023: Path, root: Path) -> tuple[Git, Path]:
    """The product series applied at v0.5.23 (a copy of ``at_023``), with a series of its own."""
    return copied(at_023, at_023.parent / "series", root)


def rebase(git: Git, series: Path, *args: str) -> Run:
    return invoke("rebase", *args, "--tree", str(git.worktree), "--series", str(series))


def entry(run: Run, name: str) -> dict:
    return next(e for e in (run.out.get("report") or run.out)["entries"] if e["name"] == name)


def check_row(remote: Git, series: Path, rev: str, name: str) -> dict:
    run = invoke("check", "--sglang-rev", rev, "--repo", str(remote.git_dir), "--series", str(series))
    return next(e for e in run.out["revs"][0]["entries"] if e["name"] == name)


# -- reformatting only: carried by a whitespace-insensitive retry, marked, proven ----------------


@pytest.fixture(scope="session")
def reformat_rebased(remote: Git, at_023, tmp_path_factory: pytest.TempPathFactory) -> tuple[Git, Path, Run]:
    git, series = applied(at_023, tmp_path_factory.mktemp("reformat"))
    return git, series, rebase(git, series, "--onto", remote.rev_parse("reformatted"))


def test_a_reformat_only_change_is_carried_with_no_stop(reformat_rebased):
    _, _, run = reformat_rebased
    assert run.code == 0, run.err
    for name in (ZERO, ENV):
        assert entry(run, name)["applied"] == "whitespace" and "whitespace-merged" in entry(run, name)["detail"]
    assert run.out["equivalence"]["identical"], run.out["equivalence"]["summary"]


def test_the_whitespace_merge_keeps_upstream_s_formatting_and_our_change(reformat_rebased):
    git, _, _ = reformat_rebased
    env = (git.worktree / ENVIRON).read_text()
    assert "SGLANG_OPT_USE_ONLINE_COMPRESS      = EnvBool(False)" in env
    assert "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK = EnvBool(False)" in env
    cuh = (git.worktree / CUH).read_text()
    assert "static_cast<uint32_t>(p.seq_lens[i])" not in cuh and "seq_len_i64" in cuh


def test_check_marks_the_whitespace_merge(remote, reformat_rebased):
    _, series, _ = reformat_rebased
    row = check_row(remote, series, "reformatted", ZERO)
    assert row["status"] == "whitespace" and "whitespace-merged" in row["detail"]


def test_a_reformat_next_to_other_upstream_lines_is_carried_by_a_whitespace_insensitive_3way_merge(
        remote, at_023, tmp_path):
    git, series = applied(at_023, tmp_path)
    run = rebase(git, series, "--onto", remote.rev_parse("reformatted-more"))
    assert run.code == 0, run.err
    row = entry(run, ZERO)
    assert row["applied"] == "whitespace" and "a 3-way merge ignoring whitespace changes" in row["detail"]
    assert run.out["equivalence"]["identical"], run.out["equivalence"]["summary"]
    cuh = (git.worktree / CUH).read_text()
    assert "  uint32_t extra_count = 0;\n" in cuh and "seq_len_i64" in cuh and "p.seq_lens[i]);" not in cuh
    check = invoke("check", "--sglang-rev", "reformatted-more", "--repo", str(remote.git_dir), "--series", str(series))
    verdict = check.out["revs"][0]["apply"]  # git am has no whitespace-insensitive 3-way merge: said, not hidden
    assert verdict["exit"] == 1 and verdict["entry"] == ZERO


def test_context_lines_a_formatter_joined_or_split_are_carried_with_no_stop(remote, at_023, tmp_path):
    git, series = applied(at_023, tmp_path)
    run = rebase(git, series, "--onto", remote.rev_parse("rewrapped"))
    assert run.code == 0, run.err
    for name in (STREAMS, BACKEND_ENTRY):  # strict, 3-way and whitespace-insensitive merges all fail them
        row = entry(run, name)
        assert row["applied"] == "whitespace" and "re-wrapped (joined or split)" in row["detail"], row
    assert run.out["equivalence"]["identical"], run.out["equivalence"]["summary"]
    worker = (git.worktree / WORKER).read_text()  # upstream's wrapping kept, our lines right after it
    assert JOINED + "        if envs.SGLANG_DSPARK_RECORD_VERIFY_STREAMS.get():\n" in worker
    backend = (git.worktree / BACKEND).read_text()
    assert SPLIT + "            self.online_c128_dspark.prepare_verify(\n" in backend
    assert backend.count("self.online_c128_dspark.prepare_verify(") == 2
    row = check_row(remote, series, "rewrapped", BACKEND_ENTRY)
    assert row["status"] == "whitespace" and "re-wrapped" in row["detail"]


def test_context_upstream_indented_otherwise_is_no_rewrap(remote, tmp_path):
    row = check_row(remote, copy_series(tmp_path / "series"), "reindented", STREAMS)
    assert row["status"] == "conflict", row


# -- a patched file moved upstream: the hunk follows it ----------------------------------------


@pytest.fixture(scope="session")
def moved_rebased(remote: Git, at_023, tmp_path_factory: pytest.TempPathFactory) -> tuple[Git, Path, Run]:
    git, series = applied(at_023, tmp_path_factory.mktemp("moved"))
    return git, series, rebase(git, series, "--onto", remote.rev_parse("plan-moved"))


def test_a_renamed_file_is_carried_with_no_stop(moved_rebased):
    git, _, run = moved_rebased
    assert run.code == 0, run.err
    row = entry(run, ZERO)
    assert f"followed upstream's rename {PLAN} -> {MOVED_PLAN}" in row["detail"]
    assert run.out["equivalence"]["identical"], run.out["equivalence"]["summary"]
    text = (git.worktree / MOVED_PLAN).read_text()
    assert text.startswith("// Compress plans (moved") and "ext_ptr[i] <= seq_ptr[i]" in text
    assert not (git.worktree / PLAN).exists()


def test_check_says_the_entry_follows_the_rename(remote, moved_rebased):
    _, series, _ = moved_rebased
    row = check_row(remote, series, "plan-moved", ZERO)
    assert row["status"] in ("clean", "3way") and row["renamed"] == {PLAN: MOVED_PLAN}
    assert f"followed upstream's rename {PLAN} -> {MOVED_PLAN}" in row["detail"]


def test_refresh_exports_the_entry_at_the_new_path(moved_rebased):
    git, series, _ = moved_rebased
    run = invoke("refresh", "--tree", str(git.worktree), "--series", str(series))
    assert run.code == 0, run.err
    exported = [p for p in (series / "patches").glob("0001-*.patch") if f"diff --git a/{MOVED_PLAN} b/{MOVED_PLAN}"
                in p.read_text()]
    assert exported and f"a/{PLAN}" not in exported[0].read_text()
    again = invoke("refresh", "--check", "--tree", str(git.worktree), "--series", str(series))
    assert again.code == 0 and again.out["changed"] == [], again.out
    assert invoke("lint", "--series", str(series)).code == 0


@pytest.mark.parametrize("rev", ["reformatted", "plan-moved"])
def test_apply_there_gives_the_rebased_tree_as_check_predicts(remote, reformat_rebased, moved_rebased, rev, tmp_path):
    rebased, series, _ = reformat_rebased if rev == "reformatted" else moved_rebased
    run = invoke("check", "--sglang-rev", rev, "--repo", str(remote.git_dir), "--series", str(series))
    assert run.out["revs"][0]["apply"]["exit"] == 0 and run.out["revs"][0]["wheel"] is None
    git, _ = apply_at(remote, tmp_path, rev)
    assert tree_of(git) == tree_of(rebased)


# -- a conflict resolved to upstream's side: the entry is merged, never an empty patch ------------


@pytest.fixture(scope="session")
def fixed_stop(remote: Git, at_023, tmp_path_factory: pytest.TempPathFactory) -> tuple[Git, Path, Run]:
    git, series = applied(at_023, tmp_path_factory.mktemp("fixed"))
    return git, series, rebase(git, series, "--onto", remote.rev_parse("fixed"))


def test_the_stop_names_the_upstream_commit_that_names_the_entry_s_pr(remote, fixed_stop):
    _, _, run = fixed_stop
    assert run.code == 1 and run.err.startswith(f"c128patch: error: entry '{ZERO}' conflicts on ")
    sha = remote.rev_parse("fixed")
    assert f"  upstream may now handle this: {sha[:12]} {FIXED_SUBJECT!r} (names PR #35848)\n" in run.err


@pytest.fixture(scope="session")
def resolved_to_upstream(remote: Git, fixed_stop) -> tuple[Git, Path, Run, Run]:
    git, series, _ = fixed_stop
    git.run("checkout", "HEAD", "--", CUH, PLAN)  # upstream's side of every conflict
    done = rebase(git, series, "--continue")
    return git, series, done, invoke("refresh", "--tree", str(git.worktree), "--series", str(series))


def test_an_entry_resolved_to_upstream_s_side_is_merged_not_resolved_by_hand(remote, resolved_to_upstream):
    _, _, done, _ = resolved_to_upstream
    assert done.code == 0, done.err
    row = entry(done, ZERO)
    assert row["status"] == "dropped-as-merged" and row["detail"].startswith("empty: ")
    assert "resolved by hand" not in row["detail"] and not row["new_sha"]
    assert done.out["equivalence"]["ok"]


def test_refresh_keeps_it_with_merged_in_and_writes_no_empty_patch(remote, resolved_to_upstream):
    git, series, _, refreshed = resolved_to_upstream
    assert refreshed.code == 0, refreshed.err
    s = load_series(series)
    assert s.entry(ZERO).merged_in == remote.rev_parse("fixed")
    assert all(p.read_text().startswith("From ") for p in (series / "patches").glob("*.patch"))
    assert invoke("lint", "--series", str(series)).code == 0
    again = invoke("refresh", "--check", "--tree", str(git.worktree), "--series", str(series))
    assert again.code == 0 and again.out["changed"] == [], again.out


def test_lint_rejects_a_patch_file_without_a_mail_header_in_one_line(tmp_path):
    series = copy_series(tmp_path / "series")
    s = load_series(series)
    (s.patches_dir / s.entry(ZERO).file).write_text(f"C128patch-Entry: {ZERO}\n")
    update_hashes(s)
    run = invoke("lint", "--series", str(series), as_json=False)
    assert run.code != 0
    [line] = [l for l in run.err.splitlines() + run.text.splitlines() if "no mail header" in l]
    assert ZERO in line


# -- a semantic merge upstream: the hint in check, the stop and watch ---------------------------


def test_check_reads_a_rev_s_range_in_one_log_for_every_entry_s_hints(remote, tmp_path, monkeypatch):
    series, calls, raw = copy_series(tmp_path / "series"), [], Git._raw
    monkeypatch.setattr(Git, "_raw", lambda self, args, *a, **k: calls.append(args) or raw(self, args, *a, **k))
    row = check_row(remote, series, "half-fixed", ZERO)
    assert "changes plan_compress_prefill() as this entry does" in row["hints"][0]
    assert sum(args[0] == "log" and "-p" in args for args in calls) == 1, calls


def test_check_shows_the_hint_of_an_upstream_fix_in_the_same_function(remote, tmp_path):
    series = copy_series(tmp_path / "series")
    row = check_row(remote, series, "half-fixed", ZERO)
    sha = remote.rev_parse("half-fixed")
    [hint] = row["hints"]
    assert hint.startswith(f"upstream may now handle this: {sha[:12]} ")
    assert "changes plan_compress_prefill() as this entry does (extend_len" in hint


def test_a_fix_upstream_made_and_took_back_in_the_range_is_no_hint(remote, tmp_path):
    """The hints read the range's net change first (one diff), then only its commits where that touches one of the
    entry's functions with its names: a rebase diffs far fewer commits (issue 35), and a fix reverted is none."""
    series = copy_series(tmp_path / "series")
    assert check_row(remote, series, "half-fixed", ZERO)["hints"]
    assert check_row(remote, series, "half-fixed-reverted", ZERO)["hints"] == []


@pytest.fixture(scope="session")
def half_fixed_watch(remote: Git, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("w-half") / "out"
    return invoke("watch", "--onto", "half-fixed", "--repo", str(remote.git_dir), "--out", str(out),
                  "--series", str(REPO_ROOT))


def test_the_stop_and_watch_show_the_hint_of_an_upstream_fix(remote, at_023, half_fixed_watch, tmp_path):
    sha = remote.rev_parse("half-fixed")
    git, series = applied(at_023, tmp_path)
    stop = rebase(git, series, "--onto", sha)
    assert stop.code == 1 and f"  upstream may now handle this: {sha[:12]} " in stop.err
    report = half_fixed_watch.out
    assert half_fixed_watch.code == 5, half_fixed_watch.err
    [conflict] = report["conflicts"]
    assert conflict["entry"] == ZERO and conflict["hints"][0]["commit"] == sha
    [block] = conflict["blocks"]  # the hunk that conflicted, not its twin in the legacy planner
    assert block["path"] == PLAN and block["hunk"].startswith("@@ -569,12 +569,16 @@ inline PrefillPlan "
                                                              "plan_compress_prefill(")
    md = (Path(report["out"]) / "watch-report.md").read_text()
    assert f"upstream may now handle this: {sha[:12]} " in md


# -- an overlay upstream adds byte for byte: merged beats lint -----------------------------------


def test_the_printed_drop_of_an_entry_upstream_merged_works_and_records_merged_in(remote, at_023, tmp_path):
    git, series = applied(at_023, tmp_path)
    stop = rebase(git, series, "--onto", remote.rev_parse("overlay-landed"))
    assert stop.code == 1 and f"entry '{HELPER}' looks merged upstream" in stop.err, stop.err
    [line] = [line for line in stop.err.splitlines() if line.startswith("  drop it: ")]
    argv = shlex.split(line.removeprefix("  drop it: "))
    assert argv[:4] == ["c128patch", "rebase", "--drop", HELPER]
    other = rebase(git, series, "--drop", ENV)
    assert other.code != 0 and f"cannot drop '{ENV}': the rebase is stopped at entry '{HELPER}'" in other.err
    run = invoke(*argv[1:])
    assert run.code == 0, run.err
    assert entry(run, HELPER)["status"] == "dropped-as-merged"
    assert run.out["equivalence"]["ok"] and f"without {HELPER}" in run.out["equivalence"]["summary"]
    refreshed = invoke("refresh", "--tree", str(git.worktree), "--series", str(series))
    assert refreshed.code == 0, refreshed.err
    assert load_series(series).entry(HELPER).merged_in == remote.rev_parse("overlay-landed")


def test_drop_from_the_start_carries_no_stop_and_records_the_upstream_fix(remote, at_023, tmp_path):
    git, series = applied(at_023, tmp_path)
    run = rebase(git, series, "--onto", remote.rev_parse("fixed"), "--drop", ZERO)  # a conflict otherwise
    assert run.code == 0, run.err
    row = entry(run, ZERO)
    assert row["status"] == "dropped-as-merged" and row["detail"].startswith("dropped: ") and not row["new_sha"]
    assert run.out["equivalence"]["ok"] and f"without {ZERO}" in run.out["equivalence"]["summary"]
    record = json.loads((git.worktree / PROVENANCE_PATH).read_text())
    [dropped] = record["dropped"]  # the upstream commit naming its PR, not merely the new base
    assert dropped["name"] == ZERO and dropped["merged_in"] == remote.rev_parse("fixed")
    assert GUARD_NEW in (git.worktree / PLAN).read_text()


def test_drop_refuses_an_unknown_entry_in_one_line_and_starts_nothing(remote, at_023, tmp_path):
    git, series = applied(at_023, tmp_path)
    head, branch = git.head(), git.current_branch()
    run = rebase(git, series, "--onto", "v0.5.23", "--drop", "no-such-entry")
    assert run.code != 0
    assert run.err.strip().splitlines() == [
        "c128patch: error: cannot rebase: --drop no-such-entry: the series has no such entry (its entries: "
        + ", ".join(e.name for e in load_series(series).entries) + ")"]
    assert (git.head(), git.current_branch()) == (head, branch)
    assert not list((Path(git.out("rev-parse", "--absolute-git-dir")) / "c128patch").glob("rebase*.json"))


def test_an_overlay_upstream_holds_byte_for_byte_is_merged_not_failed(remote, tmp_path):
    out = tmp_path / "out"  # --no-run: merged outranks the unchecked a skipped behavioural tier leaves
    run = invoke("watch", "--onto", "overlay-landed", "--primary", "--repo", str(remote.git_dir), "--out", str(out),
                 "--series", str(REPO_ROOT), "--no-run")
    assert run.code == 4, run.out.get("problems")
    assert [m["entry"] for m in run.out["merged"]] == [HELPER]
    assert next(c for c in run.out["checks"] if c["name"] == "lint")["ok"]


# -- upstream creates its own file at an overlay's path: a stop that says who, and two ways through --


@pytest.fixture(scope="session")
def taken(remote: Git, at_023: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Git, Path, Run]:
    """A rebase onto rules-taken, stopped (shared: a test that changes it takes ``taken_stop``)."""
    git, series = applied(at_023, tmp_path_factory.mktemp("taken"))
    return git, series, rebase(git, series, "--onto", remote.rev_parse("rules-taken"))


def taken_stop(taken: tuple[Git, Path, Run], root: Path) -> tuple[Git, Path, Run]:
    """A copy of the stop ``taken`` (its journal with it), for one test to change."""
    return *copied(taken[0].worktree, taken[1], root), taken[2]


def test_the_stop_names_the_upstream_commit_and_its_importers(remote, taken):
    _, _, run = taken
    assert run.code == 1 and run.err.startswith(f"c128patch: error: entry '{RULES}' conflicts on ")
    made = remote.out("log", "-1", "--format=%h %s", "rules-taken")
    assert f"  upstream created {RULES_TARGET} in {made}; imported upstream by {RULES_USER}\n" in run.err
    assert "  way through: rename our target (entries c128-dspark-online-controller import ours)" in run.err


@pytest.mark.parametrize("way", [("--skip",), ("--drop", RULES)])
def test_dropping_ours_as_superseded_is_proven(remote, taken, tmp_path, way):
    git, series, _ = taken_stop(taken, tmp_path)
    run = rebase(git, series, *way)
    assert run.code == 0, run.err
    assert run.out["equivalence"]["ok"] and f"without {RULES}" in run.out["equivalence"]["summary"]
    assert (git.worktree / RULES_TARGET).read_text() == "UPSTREAM_RULES = ()\n"
    refreshed = invoke("refresh", "--tree", str(git.worktree), "--series", str(series))
    assert refreshed.code == 0, refreshed.err

    assert load_series(series).entry(RULES).merged_in == remote.rev_parse("rules-taken")


def test_renaming_our_target_is_proven(remote, taken, tmp_path):
    git, series, _ = taken_stop(taken, tmp_path)
    manifest = series / "patches/series.toml"
    manifest.write_text(manifest.read_text().replace(f'target = "{RULES_TARGET}"',
                                                     f'target = "{RULES_TARGET[:-3]}_c128patch.py"'))
    run = rebase(git, series, "--continue")
    assert run.code == 0, run.err
    assert run.out["equivalence"]["identical"], run.out["equivalence"]["summary"]
    assert (git.worktree / RULES_TARGET).read_text() == "UPSTREAM_RULES = ()\n"
    assert (git.worktree / f"{RULES_TARGET[:-3]}_c128patch.py").is_file()


def test_watch_says_which_way_through(remote, tmp_path):
    run = invoke("watch", "--onto", "rules-taken", "--repo", str(remote.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT))
    assert run.code == 5, run.err
    [conflict] = [c for c in run.out["conflicts"] if c["entry"] == RULES]
    assert conflict["taken"]["way"] == "rename" and conflict["taken"]["importers"] == [RULES_USER]
    assert run.out["headline"].startswith(f"entry {RULES} conflicts on rules-taken@")
    assert f" in {RULES_TARGET}" in run.out["headline"]
    report = (tmp_path / "out/watch-report.md").read_text()  # its command names the reproduce commands' tree (a
    assert "way through: **rename our target**" in report  # bare `rebase --continue` there looks for ./sglang)
    assert "then `c128patch rebase --continue --tree sglang-watch`" in report


def test_files_whose_paths_git_quotes_are_each_their_own_in_the_per_file_ids_and_the_hints(tmp_path):
    """A ``diff --git`` line C-quotes a path outside plain ASCII (and one with a quote or a tab): each such file is
    its own part of a commit's diff, under its real path, not glued to the file before it (a wrong patch-id) nor
    left out of the hints (``_net_hunks``)."""
    from c128patch.ops.merged import _hunks, _net_hunks, commit_diffs, per_commit_file_ids

    git = Git(tmp_path)
    git.run("init", "-q")
    paths = ["a.py", 'p\u00e9 "q".py', "sp b/x.py", "z\tt.py"]
    for i, text in enumerate(["def f():\n    return 1\n", "def f():\n    return 2\n"]):
        for path in paths:
            (tmp_path / path).parent.mkdir(exist_ok=True)
            (tmp_path / path).write_text(text.replace("f(", f"f_{len(path)}("))
        git.run("add", "-A")
        git.run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}")
    old, new = git.rev_parse("HEAD~1"), git.rev_parse("HEAD")
    ids = per_commit_file_ids(git, commit_diffs(git, [new], "--unified=0", "--no-renames", "--full-index"))[new]
    alone = {path: git.run("patch-id", "--stable", input=git.out("diff", "--unified=0", "--full-index", old, new,
                                                                   "--", path)).stdout.split()[0] for path in paths}
    assert ids == alone
    _hunks.cache_clear()
    hunks = _net_hunks(git, {}, old, new, paths)
    assert sorted(path for path, _, _ in hunks) == sorted(paths)
