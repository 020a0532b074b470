"""One notion of "the tree": the commands that work on a patched tree find the one `apply` made when
run from where `apply` ran (the README's quick start: a c128patch clone, `apply` makes ./sglang), and
re-running `apply` on it is a no-op. Real release history, real product series, real CLI; every
fix a message prints is run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from c128patch.git import Git
from support import REPO_ROOT, Run, invoke, make_test_series, run_printed, snapshot


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path) -> Path:
    """A git repository (as the c128patch clone of the quick start is) where `apply --sglang-rev
    v0.5.23` ran: the patched tree is ./sglang."""
    root = tmp_path_factory.mktemp("quickstart")
    subprocess.run(["git", "init", "--quiet", str(root)], check=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        res = invoke("apply", "--sglang-rev", "v0.5.23", as_json=False)
    assert res.code == 0, res.err
    return root


def in_dir(folder: Path, *args: str) -> Run:
    """``c128patch ARGS`` run from ``folder`` (``--json`` only where ``args`` hold it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        return invoke(*args, as_json=False)


def test_status_finds_the_tree_apply_made_where_it_ran(workdir: Path):
    res = in_dir(workdir, "status", "--json")
    assert res.code == 0, res.err
    assert Path(res.out["tree"]).resolve() == (workdir / "sglang").resolve()
    assert res.out["branch"] == "c128/v0.5.23" and res.out["upstream"]["rev"] == "v0.5.23"


def test_status_inside_the_tree_uses_that_tree(workdir: Path):
    res = in_dir(workdir / "sglang" / "python" / "sglang", "status", "--json")
    assert res.code == 0, res.err
    assert Path(res.out["tree"]).resolve() == (workdir / "sglang").resolve()


def test_refresh_check_finds_the_tree_apply_made_where_it_ran(workdir: Path):
    res = in_dir(workdir, "refresh", "--check", "--json")
    assert res.code == 0, res.err
    assert res.out["changed"] == []  # the branch is exactly the series


def test_rebase_finds_the_tree_apply_made_where_it_ran(workdir: Path):
    """An unknown --onto is refused in the tree it found (the error names it); nothing changed."""
    tree = Git(worktree=workdir / "sglang").out("rev-parse", "--show-toplevel")
    before = snapshot(Path(tree))
    res = in_dir(workdir, "rebase", "--onto", "no-such-rev")
    assert res.code == 2
    assert res.err.startswith(f"c128patch: error: unknown rev 'no-such-rev' in {tree} ")
    assert snapshot(Path(tree)) == before


def test_smoke_finds_the_tree_apply_made_where_it_ran(workdir: Path):
    res = in_dir(workdir, "smoke", "kernel", "--list", "--json")
    tree = (workdir / "sglang" / "python").resolve()
    if importlib.util.find_spec("torch") is None:  # the suite's files skip without torch: said so, on that tree
        assert res.code == 2 and res.out["ok"] is False and f" on {tree}: torch does not import" in res.out["error"]
        return
    assert res.code == 0, res.err
    assert Path(res.out["tree"]).resolve() == tree


def test_outside_any_repository_the_error_says_which_folder_to_use(tmp_path: Path):
    res = in_dir(tmp_path, "status")
    assert res.code == 2
    assert res.err.strip() == (
        f"c128patch: error: no sglang tree here: {tmp_path} is not in a git repository and ./sglang (where "
        "`c128patch apply` makes its tree) is not one; run from the tree, or pass --tree DIR")


@pytest.mark.parametrize("branch", [None, "c128/v0.5.23\u00a0patched\u2028x"])
def test_status_on_a_checkout_below_the_record_names_the_patched_branch_to_check_out(workdir: Path, tmp_path: Path,
                                                                                     branch: str | None):
    """In ./sglang, HEAD detached below the provenance commit (git checkout HEAD~2): status said "`c128patch apply`
    makes its tree in ./sglang: run status there", the folder the user is in; it names the branch that is applied
    and the checkout that goes back to it, which runs as printed. A branch name holding U+00A0 or U+2028 (git allows
    both) was split by str.split and named no branch (helper 158)."""
    subprocess.run(["cp", "-a", str(workdir / "sglang"), str(tmp_path / "sglang")], check=True)
    tree = tmp_path / "sglang"
    if branch:
        subprocess.run(["git", "-C", str(tree), "branch", "--quiet", "-m", branch], check=True)
    subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", "--detach", "HEAD~2"], check=True)
    res = in_dir(tree, "status")
    assert res.code == 2 and "makes its tree in" not in res.err, res.err
    assert "HEAD is not a patched commit; branch c128/v0.5.23" in res.err and " is: git -C " in res.err, res.err
    assert run_printed(res.err.split(" is: ", 1)[1].strip()).returncode == 0
    assert in_dir(tree, "status").code == 0
    if branch:
        head = subprocess.run(["git", "-C", str(tree), "symbolic-ref", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout
        assert head.rstrip("\n") == branch


def test_status_in_a_repository_without_a_series_points_at_apply_s_tree(tmp_path: Path):
    subprocess.run(["git", "init", "--quiet", str(tmp_path)], check=True)
    res = in_dir(tmp_path, "status")
    assert res.code == 2
    first, hint = res.err.strip().splitlines()
    assert first.startswith(f"c128patch: error: no c128patch series is applied in {tmp_path}")
    assert hint == "`c128patch apply` makes its tree in ./sglang (or --tree DIR): run status there, or pass --tree DIR"


def test_reapplying_the_same_series_and_rev_is_a_no_op_that_says_so(workdir: Path):
    tree = workdir / "sglang"
    before = snapshot(tree)
    res = in_dir(workdir, "apply", "--sglang-rev", "v0.5.23")
    assert res.code == 0, res.err
    assert "sglang: c128/v0.5.23 already holds v0.5.23 + series c128patch" in res.text
    assert res.text.rstrip().endswith("nothing to do")
    assert snapshot(tree) == before


def test_reapplying_reports_the_earlier_result_as_json(workdir: Path):
    res = in_dir(workdir, "apply", "--sglang-rev", "v0.5.23", "--json")
    assert (res.out["ok"], res.out["already_applied"], res.out["branch"]) == (True, True, "c128/v0.5.23")
    assert res.out["head"] == Git(worktree=workdir / "sglang").head()


def test_another_series_on_an_applied_branch_prints_a_fix_that_works(tmp_path: Path, sglang_release_repo: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert invoke("apply", "--sglang-rev", "v0.5.23", as_json=False).code == 0
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {"python/sglang/srt/environ.py": ("import os\n", "import os  # c128patch test\n")})
    res = in_dir(tmp_path, "apply", "--sglang-rev", "v0.5.23", "--series", str(series))
    assert res.code == 2
    message = res.err.strip()
    tree = tmp_path / "sglang"
    assert f"branch c128/v0.5.23 already exists in {tree} (not this series on v0.5.23; it is checked out)" in message
    fix = message.split("or delete it (", 1)[1].rsplit("); nothing was changed", 1)[0]
    assert fix == f"git -C {tree} checkout --quiet --detach && git -C {tree} branch -D c128/v0.5.23"
    subprocess.run(fix, shell=True, cwd=tmp_path, check=True)
    again = in_dir(tmp_path, "apply", "--sglang-rev", "v0.5.23", "--series", str(series))
    assert again.code == 0, again.err
    assert Git(worktree=tmp_path / "sglang").current_branch() == "c128/v0.5.23"


def test_reapplying_with_the_branch_not_checked_out_prints_a_checkout_that_works(tmp_path: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert invoke("apply", "--sglang-rev", "v0.5.23", as_json=False).code == 0
    subprocess.run(["git", "-C", str(tmp_path / "sglang"), "checkout", "--quiet", "--detach"], check=True)
    res = in_dir(tmp_path, "apply", "--sglang-rev", "v0.5.23")
    assert res.code == 0, res.err
    fix = res.text.strip().rsplit("; not checked out: ", 1)[1]
    assert fix == "git -C sglang checkout c128/v0.5.23"
    subprocess.run(fix, shell=True, cwd=tmp_path, check=True)
    assert Git(worktree=tmp_path / "sglang").current_branch() == "c128/v0.5.23"


def test_another_rev_in_the_default_tree_is_refused_and_both_fixes_work(workdir: Path, tmp_path: Path):
    tree = workdir / "sglang"
    before = snapshot(tree)
    res = in_dir(workdir, "apply", "--sglang-rev", "v0.5.22")
    assert res.code == 2 and snapshot(tree) == before
    first, *fixes = res.err.strip().splitlines()
    assert first == ("c128patch: error: ./sglang holds v0.5.23 + series (branch c128/v0.5.23): applying v0.5.22 "
                     "there would switch it to a new branch c128/v0.5.22; say which you want")
    switch, beside = (line.split(": ", 1)[1] for line in fixes)
    assert beside == "c128patch apply --sglang-rev v0.5.22 --tree sglang-v0.5.22"
    ran = in_dir(workdir, *beside.split()[1:])
    assert ran.code == 0, ran.err
    assert Git(worktree=workdir / "sglang-v0.5.22").current_branch() == "c128/v0.5.22" and snapshot(tree) == before
    # the switch, on a clone of the tree (the fixture's stays on v0.5.23)
    subprocess.run(["git", "clone", "--quiet", "--branch", "c128/v0.5.23", str(tree), str(tmp_path / "sglang")],
                   check=True)
    assert switch == "c128patch apply --sglang-rev v0.5.22 --tree sglang"
    ran = in_dir(tmp_path, *switch.split()[1:])
    assert ran.code == 0, ran.err
    clone = Git(worktree=tmp_path / "sglang")
    assert clone.current_branch() == "c128/v0.5.22" and clone.rev_parse("refs/heads/c128/v0.5.23")


def test_the_fixes_for_another_rev_in_the_default_tree_keep_the_layers_named(tmp_path: Path):
    """`apply --layer L` into the default tree holding another rev: both printed commands carry --layer L (they
    dropped it, and the one run as printed applied the series alone)."""
    layer, workdir = (REPO_ROOT / "docs" / "examples" / "acme-layer").resolve(), tmp_path
    assert in_dir(workdir, "apply", "--sglang-rev", "v0.5.23").code == 0
    res = in_dir(workdir, "apply", "--sglang-rev", "v0.5.22", "--layer", str(layer))
    assert res.code == 2, res.err
    switch, beside = (line.split(": ", 1)[1] for line in res.err.strip().splitlines()[1:])
    assert switch.endswith(f"--tree sglang --layer {layer}") and beside.endswith(f"--layer {layer}"), res.err
    ran = run_printed(beside, cwd=workdir)
    assert ran.returncode == 0, ran.stderr
    record = json.loads((workdir / "sglang-v0.5.22" / "python/sglang/c128patch_provenance.json").read_text())
    assert [r["name"] for r in record["layers"]] == ["acme"]
