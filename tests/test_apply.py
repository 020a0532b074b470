"""apply / check / status on the real sglang release history (mechanics, with a small real patch)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from c128patch.git import Git
from c128patch.series.provenance import PROVENANCE_PATH
from support import RELEASES, invoke, make_test_series, printed_command, run_printed, snapshot

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
VERIFY = "python/sglang/srt/speculative/dspark_components/dspark_verify.py"
ONLY_IN_023 = "from sglang.kernels.ops.speculative.dspark.static_accept_tail import static_accept_tail\n"


def run(*args: str) -> tuple[int, dict | str, str]:
    res = invoke(*args, as_json=False)
    return res.code, res.out or res.text, res.err


@pytest.fixture
def portable_series(tmp_path: Path, sglang_release_repo: Path) -> Path:
    """A real patch to a kernel file that is the same in all four releases, plus an overlay."""
    return make_test_series(
        tmp_path / "series", sglang_release_repo,
        {CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n",
               "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch test\n")},
    )


@pytest.fixture
def drifting_series(tmp_path: Path, sglang_release_repo: Path) -> Path:
    """A real patch next to an import that only 0.5.23 has: it cannot apply to older releases."""
    return make_test_series(
        tmp_path / "series", sglang_release_repo,
        {VERIFY: (ONLY_IN_023, ONLY_IN_023 + "# c128patch test\n")}, overlay=False,
    )


def test_apply_gives_clean_patched_branch_with_one_commit_per_entry(upstream_clone: Path, portable_series: Path):
    code, out, err = run("apply", "--sglang-rev", "v0.5.22", "--repo", str(upstream_clone),
                         "--series", str(portable_series), "--json")
    assert code == 0, err
    git = Git(worktree=upstream_clone)
    assert git.current_branch() == "c128/v0.5.22"
    assert git.status_porcelain() == []
    subjects = git.out("log", "--format=%s", "v0.5.22..HEAD").splitlines()
    assert subjects == ["c128patch: provenance (series test 1 on v0.5.22)",
                        "c128: add c128_test_overlay.py (overlay)", "c128: test change"]
    assert "C128patch-Entry: test-patch" in git.out("log", "-1", "--format=%B", "HEAD~2")
    assert "// c128patch test" in (upstream_clone / CUH).read_text()
    assert (upstream_clone / "python/sglang/c128_test_overlay.py").read_text() == "VALUE = 1\n"
    record = json.loads((upstream_clone / PROVENANCE_PATH).read_text())
    assert record["upstream"]["rev"] == "v0.5.22"
    assert record["upstream"]["commit"] == git.rev_parse("v0.5.22")
    assert [e["name"] for e in record["entries"]] == ["test-patch", "test-overlay"]
    assert all(len(e["sha256"]) == 64 for e in record["entries"])
    assert record["tool"]["name"] == "c128patch" and record["series"]["version"] == "1"
    # the user's branch is untouched and a recovery ref points at it
    assert git.rev_parse("main") == git.rev_parse("v0.5.23")
    assert git.rev_parse(out["recovery_ref"]) == git.rev_parse("main")


def test_apply_proves_its_tree_against_a_fresh_replay(upstream_clone: Path, portable_series: Path):
    code, out, err = run("apply", "--sglang-rev", "v0.5.22", "--repo", str(upstream_clone),
                         "--series", str(portable_series), "--json")
    assert code == 0, err
    assert out["equivalence"]["summary"] == "identical to a fresh apply of series test 1 on v0.5.22"
    assert out["equivalence"]["tree"] == out["equivalence"]["fresh_tree"]


def test_apply_from_release_source_into_new_tree(tmp_path: Path, portable_series: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run("apply", "--sglang-rev", "v0.5.23", "--series", str(portable_series), "--json")
    assert code == 0, err
    tree = tmp_path / "sglang"
    assert Git(worktree=tree).current_branch() == "c128/v0.5.23"
    assert (tree / "python/sglang/srt/environ.py").is_file()
    assert not list(tree.rglob("*.so"))
    # run again from inside that tree (its python/ folder): that tree, as status takes it, not ./sglang inside it
    monkeypatch.chdir(tree / "python")
    code, out, err = run("apply", "--sglang-rev", "v0.5.23", "--series", str(portable_series))
    assert code == 0 and f"applying in the tree you are in, {tree} (pass --tree DIR for another)" in out, err
    assert "already holds v0.5.23" in out + err and not (tree / "python" / "sglang" / ".git").exists()
    assert not Git(worktree=tree).out("status", "--porcelain")


def test_apply_conflict_leaves_branch_at_last_good_entry(upstream_clone: Path, drifting_series: Path):
    git = Git(worktree=upstream_clone)
    code, out, err = run("apply", "--sglang-rev", "v0.5.20", "--repo", str(upstream_clone),
                         "--series", str(drifting_series))
    assert code == 1
    first = err.splitlines()[0]
    assert "entry 'test-patch'" in first and VERIFY in first and "v0.5.20" in first
    assert "inspect:" in err and "undo:" in err and "git -C" in err
    assert git.current_branch() == "c128/v0.5.20"
    assert git.rev_parse("HEAD") == git.rev_parse("v0.5.20")  # last good = upstream itself
    assert git.status_porcelain() == []
    assert git.rev_parse("main") == git.rev_parse("v0.5.23")
    assert not (upstream_clone / ".git" / "rebase-apply").exists()


def test_check_reports_per_rev_and_entry_without_checkout(upstream_clone: Path, drifting_series: Path):
    before = snapshot(upstream_clone)
    code, out, _ = run("check", *[a for r in RELEASES for a in ("--sglang-rev", r)],
                       "--repo", str(upstream_clone), "--series", str(drifting_series), "--json")
    assert code == 1
    status = {r["rev"]: r["entries"][0]["status"] for r in out["revs"]}
    assert status == {"v0.5.20": "conflict", "v0.5.21": "conflict", "v0.5.22": "conflict", "v0.5.23": "clean"}
    assert "dspark_verify.py" in out["revs"][0]["entries"][0]["detail"]
    assert snapshot(upstream_clone) == before


def test_check_all_releases_from_release_source(portable_series: Path):
    code, out, _ = run("check", *[a for r in RELEASES for a in ("--sglang-rev", r)],
                       "--series", str(portable_series), "--json")
    assert code == 0 and out["ok"]
    assert [r["rev"] for r in out["revs"]] == list(RELEASES)
    assert all(e["status"] == "clean" for r in out["revs"] for e in r["entries"])


def test_status_reports_series_and_drift(upstream_clone: Path, portable_series: Path):
    assert run("apply", "--sglang-rev", "v0.5.23", "--repo", str(upstream_clone), "--series",
               str(portable_series))[0] == 0
    code, out, _ = run("status", "--tree", str(upstream_clone), "--series", str(portable_series), "--json")
    assert code == 0
    assert out["upstream"]["rev"] == "v0.5.23" and out["series"]["name"] == "test"
    assert out["drift"] == [] and out["series_current"]["up_to_date"]
    (upstream_clone / CUH).write_text((upstream_clone / CUH).read_text() + "// local edit\n")
    (upstream_clone / "python/sglang/c128_test_overlay.py").unlink()
    code, out, _ = run("status", "--tree", str(upstream_clone), "--series", str(portable_series), "--json")
    drift = {d["entry"]: d["files"] for d in out["drift"]}
    assert drift == {"test-patch": {CUH: "modified"}, "test-overlay": {"python/sglang/c128_test_overlay.py": "deleted"}}
    text = invoke("status", "--tree", str(upstream_clone), "--series", str(portable_series), as_json=False).text
    assert f"drift in test-patch: {CUH} (modified)" in text, text
    git = Git(worktree=upstream_clone)  # the edit committed, as docs/layers.md has the user do: their work
    git.run("-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit", "-qm", "mine", "--", CUH)
    text = invoke("status", "--tree", str(upstream_clone), "--series", str(portable_series), as_json=False).text
    assert f"changed by the commit(s) on top, in test-patch: {CUH} (modified)" in text, text
    assert "drift in test-overlay: python/sglang/c128_test_overlay.py (deleted)" in text
    assert "drift in test-patch" not in text


def test_apply_is_reproducible(tmp_path: Path, sglang_release_repo: Path, portable_series: Path):
    heads = []
    for name in ("a", "b"):
        dest = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(sglang_release_repo), str(dest)], check=True)
        assert run("apply", "--sglang-rev", "v0.5.21", "--repo", str(dest), "--series", str(portable_series))[0] == 0
        heads.append(Git(worktree=dest).head())
    assert heads[0] == heads[1]


def test_apply_and_check_from_a_url_mirror_once(tmp_path: Path, packed_release_repo: Path, portable_series: Path,
                                                monkeypatch):
    """--repo URL: cloned once (as a mirror) into the cache, then reused; the tree is a clone of it."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    url = packed_release_repo.as_uri()  # file:///...: a URL, as far as git and the tool are concerned
    code, out, err = run("apply", "--sglang-rev", "v0.5.21", "--repo", url, "--tree", str(tmp_path / "t"),
                         "--series", str(portable_series), "--json")
    assert code == 0, err
    mirrors = list((tmp_path / "cache" / "remotes").glob("*.git"))
    assert len(mirrors) == 1 and Git(git_dir=mirrors[0]).rev_parse("v0.5.21") == out["upstream_commit"]
    assert Git(worktree=tmp_path / "t").current_branch() == "c128/v0.5.21"
    record = json.loads((tmp_path / "t" / PROVENANCE_PATH).read_text())
    assert record["upstream"] == {"rev": "v0.5.21", "commit": out["upstream_commit"], "source": "url", "url": url}
    stamp = mirrors[0].stat().st_mtime_ns
    code, out, _ = run("check", "--sglang-rev", "v0.5.22", "--repo", url, "--series", str(portable_series), "--json")
    assert code == 0 and out["ok"] and mirrors[0].stat().st_mtime_ns == stamp  # no second clone


def test_a_killed_first_mirror_is_detected_and_rebuilt(tmp_path: Path, packed_release_repo: Path,
                                                       portable_series: Path, monkeypatch):
    """kill -9 during the first clone of a --repo URL: the half-made mirror is never taken for one;
    the next run names it, removes it and clones again. A half-made mirror at the final name (as
    the old layout left one) is rebuilt the same way."""
    import os
    import shutil
    import signal
    import sys
    import time

    from support import default_signals

    cache = tmp_path / "cache"
    monkeypatch.setenv("C128PATCH_CACHE", str(cache))
    url = packed_release_repo.as_uri()
    args = [sys.executable, "-m", "c128patch", "check", "--sglang-rev", "v0.5.22", "--repo", url,
            "--series", str(portable_series)]
    proc = subprocess.Popen(args, env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=default_signals)
    deadline = time.monotonic() + 120
    while not list((cache / "remotes").glob("*.git.part-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)  # the tool and its git clone
    proc.wait()
    assert proc.returncode == -9
    (part,) = (cache / "remotes").glob("*.git.part-*")
    assert not list((cache / "remotes").glob("*.git"))  # nothing at the final name
    res = invoke("check", "--sglang-rev", "v0.5.22", "--repo", url, "--series", str(portable_series), as_json=False)
    assert res.code == 0, res.err
    assert f"removing {part}, a half-made mirror of {url}" in res.err
    (mirror,) = (cache / "remotes").glob("*.git")
    assert not part.exists() and Git(git_dir=mirror).rev_parse("v0.5.22")
    # the old layout's half-made mirror: HEAD there, the clone's objects not
    shutil.rmtree(mirror)
    Git().run("init", "--quiet", "--bare", str(mirror))
    res = invoke("check", "--sglang-rev", "v0.5.22", "--repo", url, "--series", str(portable_series), as_json=False)
    assert res.code == 0, res.err
    assert f"removing {mirror}, a half-made mirror of {url}" in res.err


class Steps:
    """A reporter that keeps the steps it is told (a piped reporter prints a heartbeat while one is open)."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, message: str) -> None:
        self.steps.append(message)

    def transfer(self, what: str, done: int, total: int | None) -> None:
        pass


def test_apply_names_each_long_phase_after_the_downloads(upstream_clone: Path, portable_series: Path):
    from c128patch.ops.apply import apply_rev
    from c128patch.series.manifest import load_series

    rep = Steps()
    apply_rev(load_series(portable_series), str(upstream_clone), "v0.5.22", reporter=rep)
    phases = [next((i for i, s in enumerate(rep.steps) if s.startswith(p)), -1)
              for p in ("planning the series on v0.5.22", "preparing the tree", "applying test-patch",
                        "applying test-overlay", "proving the tree")]
    assert -1 not in phases and phases == sorted(phases), rep.steps


def _process_state() -> dict:
    import os
    import resource
    import shutil
    import tempfile

    tmp, umask = tempfile.gettempdir(), os.umask(0o022)
    os.umask(umask)
    return {"env": {k: v for k, v in os.environ.items() if k.startswith(("GIT_", "TMP", "C128PATCH"))},
            "tempdir": tmp, "tempdir_exists": os.path.isdir(tmp), "umask": oct(umask),
            "fsize": resource.getrlimit(resource.RLIMIT_FSIZE), "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
            "as": resource.getrlimit(resource.RLIMIT_AS), "free": shutil.disk_usage(tmp),
            "inodes": os.statvfs(tmp).f_favail}


def test_reapplying_on_a_branch_carrying_a_users_commit_keeps_it_and_never_advises_deleting_it(
        upstream_clone: Path, portable_series: Path):
    from c128patch.series.manifest import load_series

    code, _, err = run("apply", "--sglang-rev", "v0.5.22", "--repo", str(upstream_clone), "--series",
                       str(portable_series), "--json")
    assert code == 0, (err, _process_state())  # (CI on 0524aed and 7443ef4 only: git's "Unable to write new index
    # file", not reproduced here; what of this worker's state could make git fail to write a file)
    (upstream_clone / "USER.txt").write_text("mine\n")
    subprocess.run(["git", "-C", str(upstream_clone), "add", "USER.txt"], check=True)
    subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@x.invalid", "-C", str(upstream_clone), "commit",
                    "-qm", "my change"], check=True)
    series = load_series(portable_series)
    series.version = "2"  # the series changed since (as a stack with a new layer would)
    series.save()
    before = snapshot(upstream_clone)
    code, _, err = run("apply", "--sglang-rev", "v0.5.22", "--repo", str(upstream_clone), "--series",
                       str(portable_series))
    assert code == 2 and "not this series" not in err and "branch -D" not in err, err
    assert "holds series test 1 on v0.5.22 with 1 commit(s) of yours on top, not series test 2" in err
    assert "--branch c128/v0.5.22-new" in err and snapshot(upstream_clone) == before


def test_apply_into_your_own_clone_from_elsewhere_prints_how_status_finds_it(
        tmp_path: Path, upstream_clone: Path, portable_series: Path, monkeypatch):
    """README's main job with `--repo PATH`, run from a working folder: the branch is made in the clone, where
    status, rebase and refresh, run from that folder, do not look (issue 37's walk: `no sglang tree here`). The
    output names the tree for them, and the `next:` it prints runs."""
    from support import run_printed

    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, "--series", portable_series,
                 as_json=False)
    assert res.code == 0, res.err
    (line,) = [x for x in res.text.splitlines() if "next: " in x]
    assert line == "  from here, status, rebase and refresh need --tree; next: c128patch status --tree " \
        f"{upstream_clone} --series {portable_series}", line
    done = run_printed(line.split("next: ", 1)[1], elsewhere)
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(upstream_clone)  # run in the tree: no such line
    again = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, "--series", portable_series,
                   as_json=False)
    assert again.code == 0 and "next:" not in again.text, again.text


def test_abort_of_a_new_clone_holding_your_edit_keeps_it_clean_at_the_rev_and_its_printed_commands_work(
        tmp_path: Path, sglang_release_repo: Path, drifting_series: Path):
    """Finding 03 (helper 108): `apply --abort` of an apply into a new --tree, stopped at a conflict, with an edit of
    the user's there, said "back on detached HEAD at None", left the tree on the half-applied branch (status: "no
    c128patch series is applied"; apply again: "branch ... already exists"). The clone is kept (it holds the edit,
    stashed), at the rev with no branch of the series; the line says so and every command it prints works."""
    upstream = tmp_path / "sglang.git"  # v0.5.20 and v0.5.23 of VERIFY's folder alone: a cheap clone
    git = Git(git_dir=sglang_release_repo).with_env(GIT_INDEX_FILE=str(tmp_path / "index"))
    subprocess.run(["git", "init", "--quiet", "--bare", str(upstream)], check=True)
    for tag in ("v0.5.20", "v0.5.23"):
        git.run("read-tree", "--empty")
        git.run("update-index", "--index-info", input=git.out("ls-tree", "-r", tag, "--", str(Path(VERIFY).parent)))
        git.run("push", "--quiet", str(upstream), f"{git.out('commit-tree', git.out('write-tree'), '-m', tag)}:"
                f"refs/tags/{tag}")
    tree = tmp_path / "new"
    stopped = invoke("apply", "--sglang-rev", "v0.5.20", "--repo", upstream, "--tree", tree, "--series",
                     drifting_series, as_json=False)
    assert stopped.code == 1 and Git(worktree=tree).current_branch() == "c128/v0.5.20", stopped.err
    (tree / "notes.txt").write_text("my wip\n")
    res = invoke("apply", "--abort", "--tree", tree, as_json=False)
    assert res.code == 0, res.err
    line = res.text.strip()
    assert "\n" not in line and "None" not in line and f"the clone {tree} it made is kept" in line, line
    clone = Git(worktree=tree)
    assert (clone.current_branch(), clone.head()) == (None, Git(git_dir=upstream).rev_parse("v0.5.20"))
    assert clone.rev_parse("refs/heads/c128/v0.5.20") is None and clone.status_porcelain() == []
    listing = run_printed(printed_command(line, "git -C"))
    assert listing.returncode == 0 and "c128patch apply --abort: work in progress" in listing.stdout, listing
    assert clone.out("show", "refs/stash^3:notes.txt") == "my wip"
    assert "no c128patch series is applied" in invoke("status", "--tree", tree).err  # the rev as upstream has it
    again = run_printed(printed_command(line, "c128patch apply"))  # the same conflict, in the kept clone
    assert again.returncode == 1 and "test-patch" in again.stderr and "already exists" not in again.stderr, again
    assert invoke("apply", "--abort", "--tree", tree).code == 0 and clone.current_branch() is None
    assert run_printed(printed_command(line, "rm -rf")).returncode == 0 and not tree.exists()
