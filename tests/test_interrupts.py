"""SIGINT, SIGTERM and SIGHUP during a real `wheel` or `watch` (issue 36.6): the run unwinds as Ctrl-C does, leaves
no scratch folder in the temp folder or --out, writes no report or wheel, claims no outcome, exits 128+N. During
`refresh` and `layer add-entry`: the series or layer as it was, or (past the commit point) whole, never half."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from c128patch.exitcodes import SIGNAL
from c128patch.git import FAULT_HOOKS_ENV
from c128patch.ops.treestate import FAULT_ENV
from c128patch.series.manifest import load_series
from support import REPO_ROOT, cli_process, copy_series, default_signals, invoke, run_printed
from test_refresh import applied, applied_once  # noqa: F401 (fixtures)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("verb", ["wheel", "watch"])
def test_a_signal_during_wheel_or_watch_leaves_no_scratch_and_claims_no_outcome(tmp_path, sglang_release_repo, verb,
                                                                                 sig):
    scratch, out = tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir()
    args = {"wheel": ["wheel", "--from-release", "0.5.23", "-o", out],
            "watch": ["watch", "--onto", "v0.5.21", "--repo", sglang_release_repo, "--out", out, "--no-run"]}[verb]
    proc = subprocess.Popen([sys.executable, "-m", "c128patch", *map(str, args)], env={**os.environ, "TMPDIR": str(
        scratch)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    until = time.monotonic() + 300
    while not any(scratch.iterdir()) and proc.poll() is None and time.monotonic() < until:
        time.sleep(0.02)
    time.sleep(0.3)  # inside the work, past making its scratch folder
    assert proc.poll() is None, ("it ended before the signal", proc.communicate())
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == SIGNAL + sig, (proc.returncode, stderr)
    assert f"c128patch: interrupted ({sig.name}): no outcome" in stderr, stderr
    assert list(scratch.iterdir()) == [], list(scratch.iterdir())
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()], list(out.rglob("*"))
    assert "failed" not in stdout + stderr and "Traceback" not in stderr, (stdout, stderr)


def test_sigterm_to_apply_alone_mid_clone_leaves_no_half_clone(sglang_release_repo, tmp_path):
    """A supervisor's ``kill PID`` reaches the tool, not its git: git, ended by the tool, had left a half clone
    holding the apply journal, under "no outcome; its scratch folders are removed". A git hook (the tests' fault
    folder) sends SIGTERM to the tool alone while git clone updates its refs."""
    series, tree = copy_series(tmp_path / "series"), tmp_path / "tree"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "reference-transaction").write_text("#!/bin/sh\nkill -TERM $(ps -o ppid= $PPID | tr -d ' ')\nsleep 2\n")
    (hooks / "reference-transaction").chmod(0o755)
    proc = cli_process(["apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series],
                       {FAULT_HOOKS_ENV: str(hooks)})
    assert proc.returncode == SIGNAL + signal.SIGTERM, proc.stderr
    assert "c128patch: interrupted (SIGTERM): no outcome" in proc.stderr and not tree.exists(), proc.stderr


def test_sigterm_during_apply_says_its_signal_and_exits_with_it(sglang_release_repo, tmp_path):
    """Past the clone the apply journal is kept to resume: the line names SIGTERM and the exit is 143, not
    Ctrl-C's 130."""
    series, tree = copy_series(tmp_path / "series"), tmp_path / "tree"
    proc = cli_process(["apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series],
                       {"C128PATCH_FAULT": "sigterm-before:c128-dspark-kernels-csrc"})
    assert proc.returncode == SIGNAL + signal.SIGTERM, proc.stderr
    assert "interrupted (SIGTERM): the apply journal is intact; resume with" in proc.stderr, proc.stderr
    assert invoke("apply", "--continue", "--tree", tree).code == 0


def test_a_signal_during_applys_proof_says_what_works_not_a_journal_that_is_gone(sglang_release_repo, tmp_path):
    """Past its provenance commit the apply journal is gone and the proof runs: a signal there had said "the apply
    journal is intact; resume with apply --continue", which then answered "no apply is in progress". It says the
    series is applied and unproven, with a command that proves it and one that undoes it, both working as printed."""
    series, tree = copy_series(tmp_path / "series"), tmp_path / "tree"
    proc = cli_process(["apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series],
                       {"C128PATCH_FAULT": "sigterm-at:proof", "TMPDIR": str(tmp_path)})
    assert proc.returncode == SIGNAL + signal.SIGTERM, proc.stderr
    assert "journal is intact" not in proc.stderr and "proof was cut short (no outcome)" in proc.stderr, proc.stderr
    prove, undo = re.findall(r"`([^`]+)`", proc.stderr.splitlines()[-1])
    assert invoke(*shlex.split(prove)[1:], "--series", series).out["equals_series"] is True
    assert run_printed(undo).returncode == 0 and not tree.exists()


def test_a_signal_during_a_layered_applys_proof_leaves_a_tree_whose_status_finds_its_layers(sglang_release_repo,
                                                                                             tmp_path):
    """The tree's layer folders were kept only after the proof: a layered apply cut short in it left a tree whose
    `status` (the command the signal's line prints) refused it, asking for `--layer`. They are kept before it."""
    series, tree, layer = copy_series(tmp_path / "series"), tmp_path / "tree", tmp_path / "acme"
    shutil.copytree(REPO_ROOT / "docs" / "examples" / "acme-layer", layer)
    proc = cli_process(["apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series, "--layer", layer],
                       {"C128PATCH_FAULT": "sigterm-at:proof", "TMPDIR": str(tmp_path)})
    assert proc.returncode == SIGNAL + signal.SIGTERM, proc.stderr
    prove = re.findall(r"`([^`]+)`", proc.stderr.splitlines()[-1])[0]
    res = invoke(*shlex.split(prove)[1:], "--series", series)
    assert res.code == 0 and res.out["equals_series"] is True, res.err


def test_a_signal_after_the_rebase_is_done_says_it_finished_not_no_outcome(sglang_release_repo, tmp_path):
    """Past the rebase's end (its contract checked, the refresh check after the table) a signal said "no outcome;
    its scratch folders are removed" over a branch already moved: it says the rebase finished, with a status that
    works as printed."""
    series, tree = copy_series(tmp_path / "series"), tmp_path / "tree"
    assert invoke("apply", "--sglang-rev", "v0.5.22", "--tree", tree, "--series", series).code == 0
    proc = cli_process(["rebase", "--onto", "v0.5.23", "--tree", tree, "--series", series],
                       {"C128PATCH_FAULT": "sigterm-at:rebase-done", "TMPDIR": str(tmp_path)})
    assert proc.returncode == SIGNAL + signal.SIGTERM, proc.stderr
    assert "no outcome" not in proc.stderr and "the rebase was finished before it stopped" in proc.stderr, proc.stderr
    status = run_printed(re.findall(r"`([^`]+)`", proc.stderr.splitlines()[-1])[0] + " --series " + str(series))
    assert status.returncode == 0 and "on c128/v0.5.23" in status.stdout, status.stdout + status.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["plain", "json"])
def test_a_signal_past_the_verbs_end_never_says_nothing_was_done(applied, tmp_path, as_json: bool):
    """Helper 164: a SIGINT just past `refresh`'s end (the series written, its summary printed; click and the
    interpreter on their way out, the verb's handlers put back) said "interrupted (SIGINT): no outcome; nothing was
    done" over a series it had just changed. The line says what it did stands; 128+N; with --json one object."""
    from test_refresh import amend_entry, files

    series, tree = applied
    amend_entry(tree)
    before = files(series)
    proc = cli_process(["refresh", "--tree", tree, "--series", series, *(["--json"] if as_json else [])],
                       {FAULT_ENV: "sigint-at:verb-ended", "TMPDIR": str(tmp_path)})
    assert proc.returncode == SIGNAL + signal.SIGINT, proc.stderr
    assert files(series) != before  # the refresh was done
    assert "no outcome" not in proc.stderr and "nothing was done" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("c128patch: interrupted (SIGINT) after the command ended: what it "
                                                    "did and printed above stands"), proc.stderr
    if as_json:
        assert json.loads(proc.stdout)["ok"] is True  # its one object: the report


# sends the signal as CPython's finalization collects it (after the verb, its output and exit code: by then the
# interpreter has put SIG_DFL back on every signal that had a Python handler), then runs the tool as its entry does
_LATE = """import gc, os, signal, sys
class Late:
    def __del__(self):
        os.kill(os.getpid(), signal.{sig})
late = Late(); late.cycle = late; del late
gc.disable()  # (collected in finalization only)
sys.argv = ["c128patch", *sys.argv[1:]]
from c128patch.__main__ import main
main()
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_as_the_interpreter_exits_after_the_verb_does_not_kill_it(tmp_path, sig):
    """Helper 169: 2 of 70 SIGINTs near the end of a `refresh` that wrote the series (3 of 60 for `lint`) killed the
    tool silently (-2; -15, -1 for the others) once the verb was done: CPython's finalization puts SIG_DFL back on a
    signal with a Python handler. Past the verb they are ignored: its exit code stands, nothing half-said."""
    proc = subprocess.run([sys.executable, "-c", _LATE.format(sig=sig), "lint", "--offline", "--series",
                           str(REPO_ROOT)], capture_output=True, text=True, timeout=300, preexec_fn=default_signals)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)


def test_a_signal_after_refresh_wrote_the_series_says_it_was_written(applied, tmp_path):
    """Helper 164: a signal while refresh printed what it had written (the series changed) said "no outcome; its
    scratch folders are removed". It says the refresh was written, and where."""
    from test_refresh import amend_entry, files

    series, tree = applied
    amend_entry(tree)
    before = files(series)
    proc = cli_process(["refresh", "--tree", tree, "--series", series],
                       {FAULT_ENV: "sigterm-at:refresh-written", "TMPDIR": str(tmp_path)})
    assert proc.returncode == SIGNAL + signal.SIGTERM, proc.stderr
    assert files(series) != before and "no outcome" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "c128patch: error: interrupted (SIGTERM): the refresh was written before it stopped: "), proc.stderr
    assert str(series) in proc.stderr


def _signalled(args: list, sig: signal.Signals, point: str, scratch) -> subprocess.CompletedProcess:
    """``args`` run with ``sig`` sent to the tool at the transaction's ``point`` (``ops.treestate``'s fault hook)."""
    scratch.mkdir(exist_ok=True)
    return cli_process(args, {FAULT_ENV: f"{sig.name.lower()}-at:{point}", "TMPDIR": str(scratch)})


def _no_leftovers(proc: subprocess.CompletedProcess, sig: signal.Signals, folder, scratch) -> None:
    assert proc.returncode == SIGNAL + sig, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and not list(scratch.iterdir()), proc.stderr
    assert not list(folder.glob(".c128patch-txn*")), list(folder.glob(".c128patch-txn*"))  # no reader finished it


def test_a_signal_during_refresh_leaves_the_old_or_the_whole_new_series_and_no_scratch(applied, tmp_path):
    """Before the commit point: the series as it was, no outcome. Past it (the first file moved in, the manifest not
    yet): the signal waits until the series is whole, then says so; no journal is left for a reader to finish."""
    from test_refresh import amend_entry, files

    series, tree = applied
    amend_entry(tree)
    old, saved = files(series), tmp_path / "saved"
    shutil.copytree(series, saved)
    assert invoke("refresh", "--tree", tree, "--series", series).code == 0
    new = files(series)
    for sig, point, after in ((signal.SIGTERM, "refresh-staged:0", old), (signal.SIGHUP, "refresh-moved:0", new)):
        shutil.rmtree(series)
        shutil.copytree(saved, series)
        proc = _signalled(["refresh", "--tree", tree, "--series", series], sig, point, tmp_path / "tmp")
        _no_leftovers(proc, sig, series, tmp_path / "tmp")
        assert files(series) == after, point
        said = "no outcome" if after is old else f"the write into {series} was whole before it stopped"
        assert f"interrupted ({sig.name}): {said}" in proc.stderr, proc.stderr


def test_a_signal_during_layer_add_entry_leaves_the_layer_as_it_was_or_whole(tmp_path, upstream_clone):
    from test_layers import ENV_PY, commit_on

    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone).code == 0
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    sha = commit_on(upstream_clone, ENV_PY, anchor, anchor + "    SGLANG_ACME_X = EnvBool(False)\n", "acme: x")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    before = {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    add = ["layer", "add-entry", "--layer", layer, "--from-commit", sha, "--tree", upstream_clone, "--why", "w"]
    for sig, point in ((signal.SIGHUP, "refresh-staged:0"), (signal.SIGTERM, "refresh-moved:0")):
        proc = _signalled(add, sig, point, tmp_path / "tmp")
        _no_leftovers(proc, sig, layer, tmp_path / "tmp")
        entries = [e.name for e in load_series(layer).entries]
        if point == "refresh-staged:0":
            assert "no outcome" in proc.stderr and entries == [], proc.stderr
            assert {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()} == before
        else:
            assert entries == ["acme-x"] and (layer / "patches" / "0001-acme-x.patch").is_file(), proc.stderr
            assert f"interrupted ({sig.name}): the write into {layer} was whole" in proc.stderr, proc.stderr


def test_a_sigkilled_runs_scratch_in_tmpdir_is_swept_by_pid_only_ours(sglang_release_repo, tmp_path, monkeypatch):
    """SIGKILL leaves `apply`'s, watch's and the box's folders in TMPDIR (`c128fresh-*`, `c128prove-*`,
    `c128watch-*`, `c128box-*`): nothing swept them, unlike wheel's. The next run of the same kind removes those whose
    recorded pid is dead, and only those: a live run's, a link, another name stay."""
    from c128patch.procs import run_tag, scratch_dir

    tmp, victim = tmp_path / "tmp", tmp_path / "victim"
    tmp.mkdir()
    victim.mkdir()
    (victim / "keep").write_text("x")
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    stale = [tmp / f"{p}{dead.pid}-{run_tag()}-abc" for p in ("c128fresh-", "c128prove-", "c128box-", "c128watch-")]
    for folder in stale:
        (folder / "sub").mkdir(parents=True)
    kept = [tmp / f"c128fresh-{os.getpid()}-{run_tag()}-live", tmp / "c128fresh-abc",
            tmp / f"c128prove-{dead.pid}-{run_tag()}-link"]
    kept[0].mkdir()
    kept[1].mkdir()
    kept[2].symlink_to(victim)
    series, tree = copy_series(tmp_path / "series"), tmp_path / "tree"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series).code == 0
    assert not stale[0].exists() and not stale[1].exists() and all(os.path.lexists(k) for k in kept)
    assert (victim / "keep").exists()
    for prefix, folder in (("c128box-", stale[2]), ("c128watch-", stale[3])):
        made = Path(scratch_dir(prefix))
        assert not folder.exists() and made.name.startswith(f"{prefix}{os.getpid()}-")
        made.rmdir()


def test_a_scratch_folder_of_another_pid_namespace_or_host_is_not_swept(tmp_path, monkeypatch):
    """Helper 139: a TMPDIR shared with a container (its own pid namespace) or another host holds folders named by
    pids that are not ours: a live run's ``c128watch-302-*`` there was swept by a run here, where 302 was dead. Only
    a folder named with this host's boot and pid namespace (``procs.run_tag``) is ours to sweep."""
    from c128patch.procs import run_tag, scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    theirs = [tmp_path / f"c128watch-{dead.pid}-{'0' * 8}-live", tmp_path / f"c128watch-{dead.pid}-live"]
    ours = tmp_path / f"c128watch-{dead.pid}-{run_tag()}-dead"
    for folder in (*theirs, ours):
        folder.mkdir()
    made = Path(scratch_dir("c128watch-"))
    assert made.name.startswith(f"c128watch-{os.getpid()}-{run_tag()}-")
    assert all(f.is_dir() for f in theirs) and not ours.exists()


def test_a_sigkilled_runs_scratch_of_every_prefix_is_swept_by_the_next_run_of_any_kind(tmp_path, monkeypatch):
    """A watch SIGKILLed in its behavioural tier left `c128box-*`, `c128env-lock-*` and `c128env-pipconf-*`; the next
    `watch --no-run` swept only its own `c128watch-*`: the rest waited for a run that makes those same folders. The
    first scratch folder a run makes sweeps a dead run's of every prefix; a live one's, another tag's, a name whose
    digits run into the prefix, stay."""
    from c128patch.procs import run_tag, scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    stale = [tmp_path / f"{p}{dead.pid}-{run_tag()}-ab_9" for p in ("c128box-", "c128env-lock-", "c128env-pipconf-",
                                                                     "c128box-probe-")]
    kept = [tmp_path / f"c128box-{os.getppid()}-{run_tag()}-live", tmp_path / f"c128box-{dead.pid}-{'0' * 8}-theirs",
            tmp_path / f"c128box{dead.pid}-{run_tag()}-nodash", tmp_path / f"c128box-{dead.pid}-{run_tag()}-a-b"]
    for folder in (*stale, *kept):
        (folder / "sub").mkdir(parents=True)
    made = Path(scratch_dir("c128watch-"))
    assert made.name.startswith(f"c128watch-{os.getpid()}-")
    assert not [f for f in stale if f.exists()] and all(f.is_dir() for f in kept)


def test_a_sigkilled_treechecks_unpacked_tree_is_swept_by_the_next_run(sglang_release_repo, tmp_path, monkeypatch):
    """Helper 139: SIGKILL during ``treecheck --sglang-rev`` left its unpacked tree (87 MB of sglang,
    ``c128treecheck-*``) and git's private index (``c128extract-*``) in TMPDIR, named by no pid: never swept."""
    from c128patch.procs import run_tag

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    stale = [tmp_path / f"{p}{dead.pid}-{run_tag()}-x" for p in ("c128treecheck-", "c128extract-")]
    for folder in stale:
        (folder / "python").mkdir(parents=True)
    run = invoke("treecheck", "--sglang-rev", "v0.5.23", "--no-run", "--series", REPO_ROOT, as_json=False)
    assert run.code == 8, run.err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


# every call of tempfile that makes a folder or file; (module under tooling/c128patch, call) -> how many are reviewed
_MAKERS = {"TemporaryDirectory", "mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile",
           "mktemp"}
_REVIEWED_TEMPFILE = {
    ("procs.py", "mkdtemp"): 1, ("procs.py", "TemporaryDirectory"): 1,  # the one function that names them
    ("upstream/releases.py", "TemporaryFile"): 1,  # unlinked when made (no name): a SIGKILL leaves nothing
    # the box's own runner (no c128patch imports): its TMPDIR is the box's scratch folder, removed with the box
    ("fit/treecheck_runner.py", "mkdtemp"): 1, ("fit/treecheck_runner.py", "mkstemp"): 2,
    ("fit/scenarios_runner.py", "TemporaryDirectory"): 1,
    ("smoke/trees.py", "mkdtemp"): 1,  # smoke's report folder without --out: output the user reads, not scratch
    ("wheel/srcbuild.py", "mkstemp"): 1,  # a failed build's log the hint names: output the user reads, not scratch
}


def tempfile_calls(source: str) -> list[str]:
    """The tempfile makers ``source`` calls (``tempfile.X(...)`` or ``X(...)`` imported from tempfile)."""
    import ast

    tree, found = ast.parse(source), []
    imported = {a.asname or a.name: a.name for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module == "tempfile" for a in n.names}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in _MAKERS:
            found.append(f.attr)
        elif isinstance(f, ast.Name) and imported.get(f.id) in _MAKERS:
            found.append(imported[f.id])
    return found


def test_no_scratch_bypasses_procs():
    """About 18 scratch prefixes (``c128check-``, ``c128plan-``, ``c128rebase-``, apply's ``c128patch-template-``...)
    were plain ``tempfile`` folders named by no pid: a SIGKILL left them for ever. Every one now comes from
    ``procs.scratch``/``procs.scratch_dir`` (named by pid, a dead run's swept); this walks the code for a call that
    does not, outside a reviewed few."""
    root = REPO_ROOT / "tooling" / "c128patch"
    seen: dict[tuple[str, str], int] = {}
    for path in sorted(root.rglob("*.py")):
        for name in tempfile_calls(path.read_text()):
            key = (str(path.relative_to(root)), name)
            seen[key] = seen.get(key, 0) + 1
    assert seen == _REVIEWED_TEMPFILE
    assert tempfile_calls("import tempfile\ntempfile.mkdtemp(prefix='x')\n") == ["mkdtemp"]
    assert tempfile_calls("from tempfile import TemporaryDirectory as T\nT()\n") == ["TemporaryDirectory"]


def test_a_sigkilled_applys_template_and_plan_folders_are_swept_by_the_next_apply(sglang_release_repo, tmp_path):
    """SIGKILL during `apply`'s clone left its ``c128patch-template-*`` folder (the journal of the clone) in TMPDIR,
    named by no pid: no run removed it. A git hook kills the tool (SIGKILL) while git clone writes its refs; the next
    apply sweeps it."""
    scratch, hooks = tmp_path / "tmp", tmp_path / "hooks"
    scratch.mkdir()
    hooks.mkdir()
    (hooks / "reference-transaction").write_text("#!/bin/sh\nkill -KILL $(ps -o ppid= $PPID | tr -d ' ')\nsleep 2\n")
    (hooks / "reference-transaction").chmod(0o755)
    series = copy_series(tmp_path / "series")
    args = ["apply", "--sglang-rev", "v0.5.23", "--series", series]
    killed = cli_process([*args, "--tree", tmp_path / "t1"], {FAULT_HOOKS_ENV: str(hooks), "TMPDIR": str(scratch)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [p.name for p in scratch.iterdir() if p.name.startswith("c128patch-template-")], list(scratch.iterdir())
    again = cli_process([*args, "--tree", tmp_path / "t2"], {"TMPDIR": str(scratch)})
    assert again.returncode == 0, again.stderr
    assert list(scratch.iterdir()) == [], list(scratch.iterdir())


@pytest.mark.parametrize("point", ["at:proof", "after:provenance"])
def test_a_signal_during_watchs_apply_at_its_base_claims_no_outcome(sglang_release_repo, tmp_path, point):
    """SIGHUP while watch's apply at the base proved its tree (6 s in): watch caught the apply's "interrupted
    (SIGHUP): the series is applied ... but its proof was cut short; prove it with `c128patch status --tree
    <scratch>`" as a finding, reported `failed` (exit 6) and wrote watch-report.md naming a tree it then removed."""
    scratch, out = tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir()
    proc = cli_process(["watch", "--onto", "v0.5.21", "--repo", sglang_release_repo, "--out", out, "--no-run"],
                       {"TMPDIR": str(scratch), FAULT_ENV: f"sighup-{point}"})
    assert proc.returncode == SIGNAL + signal.SIGHUP, (proc.returncode, proc.stderr)
    assert "c128patch: interrupted (SIGHUP): no outcome" in proc.stderr, proc.stderr
    assert "failed" not in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()], list(out.rglob("*"))
    assert list(scratch.iterdir()) == [], list(scratch.iterdir())


def test_a_sigkilled_check_leaves_no_git_remote_helper_on_a_server_that_never_answers(tmp_path):
    """`check --repo http://HOST/x.git` on a server that accepts and never answers, the tool SIGKILLed: git clone died
    with it (PR_SET_PDEATHSIG) but its child `git remote-http` ran on for ever, stuck on the socket. A network git runs
    as the first process of a pid namespace of its own (``procs.Group(contained=True)``): all of it dies with us."""
    import socket

    from c128patch.procs import contained_prefix

    if contained_prefix()[1]:
        pytest.skip(f"no pid namespace here: {contained_prefix()[1]}")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    url = f"http://127.0.0.1:{server.getsockname()[1]}/c128-{os.getpid()}.git"
    proc = subprocess.Popen([sys.executable, "-m", "c128patch", "check", "--repo", url, "--sglang-rev", "v0.5.23"],
                            env={**os.environ, "C128PATCH_CACHE": str(tmp_path / "cache")}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)

    def helpers(kind: bytes = b"") -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                line = Path(f"/proc/{pid}/cmdline").read_bytes()
                if url.encode() in line and kind in line:
                    found.append(pid)
        return found

    try:
        until = time.monotonic() + 60
        while not helpers(b"remote-http") and time.monotonic() < until:
            time.sleep(0.05)
        assert helpers(), "git never reached the server"
        proc.kill()
        proc.wait()
        for _ in range(50):
            if not helpers():
                break
            time.sleep(0.1)
        assert helpers() == []
    finally:
        server.close()


def test_an_interrupted_json_run_prints_its_one_error_object(sglang_release_repo, tmp_path):
    """docs/schemas/README.md: every `--json` run prints one JSON object on stdout. An interrupted one ("no outcome")
    printed nothing there (the line on stderr only): a consumer read an empty stdout."""
    series, tree, hooks = copy_series(tmp_path / "series"), tmp_path / "tree", tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "reference-transaction").write_text("#!/bin/sh\nkill -TERM $(ps -o ppid= $PPID | tr -d ' ')\nsleep 2\n")
    (hooks / "reference-transaction").chmod(0o755)
    proc = cli_process(["apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series, "--json"],
                       {FAULT_HOOKS_ENV: str(hooks)})
    assert proc.returncode == SIGNAL + signal.SIGTERM, proc.stderr
    import json

    said = json.loads(proc.stdout)
    assert said["ok"] is False and said["error"].startswith("interrupted (SIGTERM): no outcome") and said["schema"]


def _hangups_ignored() -> None:
    """``preexec_fn``: as ``nohup`` starts a program (SIGHUP ignored), SIGINT at its default."""
    default_signals()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_hangup_the_operator_ignores_with_nohup_does_not_stop_a_verb(sglang_release_repo, tmp_path):
    """Helper 158: ``nohup c128patch watch ... &`` then logging out: every verb put its own SIGHUP handler over the
    ignored one nohup set, so the hangup it was started to survive unwound it ("interrupted (SIGHUP): no outcome",
    exit 129). A signal the operator ignores stays ignored; the apply goes on to its end."""
    series, tree = copy_series(tmp_path / "series"), tmp_path / "tree"
    args = ["apply", "--sglang-rev", "v0.5.23", "--tree", str(tree), "--series", str(series)]
    proc = subprocess.run([sys.executable, "-m", "c128patch", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, FAULT_ENV: "sighup-before:c128-dspark-kernels-csrc"},
                          preexec_fn=_hangups_ignored, start_new_session=True)
    assert proc.returncode == 0 and "interrupted" not in proc.stderr, (proc.returncode, proc.stderr)
    assert invoke("status", "--tree", tree, "--series", series).out["equals_series"] is True


_TWICE = """
import os, shutil, signal, sys
from c128patch import procs
from c128patch.cli.common import handles_errors

rmtree = shutil.rmtree
def pressed_again(*args, **kwargs):  # Ctrl-C pressed a second time as the scratch folder is being removed
    os.kill(os.getpid(), signal.SIGINT)
    return rmtree(*args, **kwargs)

@handles_errors
def verb(run):
    with procs.scratch("c128watch-"):
        shutil.rmtree = pressed_again
        os.kill(os.getpid(), signal.SIG{first})

verb()
"""


@pytest.mark.parametrize("first", ["INT", "TERM", "HUP"])
def test_a_second_signal_while_a_verb_unwinds_leaves_no_scratch_and_keeps_the_first_signals_exit(tmp_path, first):
    """Helper 158: Ctrl-C pressed twice (or a supervisor's SIGTERM, then a terminal's SIGINT) during `watch`: the
    second KeyboardInterrupt cut short the removal the first had started, leaving ``c128watch-*`` in $TMPDIR under
    "its scratch folders are removed", and the exit was the second's. A signal that comes while a verb unwinds waits;
    the removal ends and the exit is the first signal's."""
    proc = subprocess.run([sys.executable, "-c", _TWICE.format(first=first)], env={**os.environ, "TMPDIR": str(
        tmp_path)}, capture_output=True, text=True, timeout=60, preexec_fn=default_signals)
    sig = getattr(signal, f"SIG{first}")
    assert proc.returncode == SIGNAL + sig, (proc.returncode, proc.stderr)
    assert f"c128patch: interrupted ({sig.name}): no outcome" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


@pytest.mark.parametrize("pid", ["99999999999999999999", "4294967296"])
def test_a_folder_named_by_a_pid_no_process_can_have_is_passed_over_not_a_traceback(tmp_path, monkeypatch, pid):
    """Helper 159: another user of a shared /tmp made ``x-99999999999999999999-TAG-a`` (the tag is this host's boot
    and pid namespace, which every user reads): ``sweep_stale``'s ``os.kill`` raised OverflowError, a traceback in
    every run of every user that makes a scratch folder. A pid no process can have names no run: passed over."""
    from c128patch.procs import run_tag, scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    odd = tmp_path / f"x-{pid}-{run_tag()}-a"
    odd.mkdir()
    made = Path(scratch_dir("c128watch-"))
    assert made.is_dir() and odd.is_dir()


def test_ctrl_c_while_the_command_line_is_read_claims_no_outcome(monkeypatch, capsys):
    """Helper 158: Ctrl-C while click read the command line or imported the verb's module (a tenth of a second of
    every run, before the verb's own handler) printed click's "Aborted!" and exited 1, the code of `lint`'s errors or
    `check`'s "does not apply". It is the tool's one line and 130, as inside a verb."""
    from c128patch import cli

    def cut_short(name: str, *args: object) -> object:
        raise KeyboardInterrupt  # as Python raises it for SIGINT

    monkeypatch.setattr(cli.importlib, "import_module", cut_short)
    for json_too in (False, True):
        with pytest.raises(SystemExit) as done:
            cli.main.main(["lint", "--offline", *(["--json"] if json_too else [])], prog_name="c128patch")
        out, err = capsys.readouterr()
        assert done.value.code == SIGNAL + signal.SIGINT, (done.value.code, err)
        assert err.strip() == "c128patch: interrupted (SIGINT): no outcome; nothing was done", err
        assert (json.loads(out) if json_too else out) == ({"ok": False, "error": err.strip().removeprefix(
            "c128patch: "), "schema": 1} if json_too else ""), out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_during_a_wheel_download_ends_pip_and_leaves_none_of_its_folders(tmp_path, sig):
    """helper 167: ``pip download`` (a release wheel not in the cache) ran as a plain child: a SIGTERM or SIGHUP to the
    tool alone left it running on (the cache's lock given up, writing into the cache after "no outcome"), and pip's
    own temporary folders (pip-download-*, pip-build-tracker-*) were left in $TMPDIR. A stand-in pip (on PYTHONPATH,
    as ``python -m pip`` finds it) makes its folder in $TMPDIR, says its pid and waits."""
    fake, scratch, said = tmp_path / "fakepip", tmp_path / "tmp", tmp_path / "pip.pid"
    (fake / "pip").mkdir(parents=True)
    scratch.mkdir()
    (fake / "pip" / "__init__.py").write_text("")
    (fake / "pip" / "__main__.py").write_text(
        "import os, tempfile, time\ntempfile.mkdtemp(prefix='pip-download-')\n"
        f"open({str(said)!r} + '.tmp', 'w').write(str(os.getpid()))\nos.rename({str(said)!r} + '.tmp', {str(said)!r})\n"
        "time.sleep(120)\n")
    env = {**os.environ, "TMPDIR": str(scratch), "C128PATCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(fake)}
    env.pop("C128PATCH_WHEELHOUSE", None)
    proc = subprocess.Popen([sys.executable, "-m", "c128patch", "wheel", "--from-release", "0.5.22", "--python-tag",
                             "cp312", "-o", str(tmp_path / "out")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    until = time.monotonic() + 120
    while not said.exists() and proc.poll() is None and time.monotonic() < until:
        time.sleep(0.05)
    assert said.exists(), ("pip was never started", proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
    pid = int(said.read_text())
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    try:
        assert proc.returncode == SIGNAL + sig and f"interrupted ({sig.name}): no outcome" in stderr, stderr
        gone = time.monotonic() + 10
        while time.monotonic() < gone and _running(pid):
            time.sleep(0.05)
        assert not _running(pid), "pip outlived the tool"
        assert list(scratch.iterdir()) == [], list(scratch.iterdir())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Is ``pid`` a live process (not gone, not a zombie)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("code, exits_now", [(SIGNAL + signal.SIGTERM, True), (SIGNAL + signal.SIGINT, True),
                                              (1, False), (0, False), (None, False)])
def test_an_interrupted_verbs_exit_code_is_the_processs_own(monkeypatch, capsys, code, exits_now: bool):
    """SIGTERM early in `lint --offline` (20-270 ms): the verb said "interrupted (SIGTERM)" and raised SystemExit(143),
    yet 6 of 200 runs ended by SIGINT (-2): CPython's unhandled-KeyboardInterrupt exit, taken in its finalization
    (strace: no traceback, SIGINT set to SIG_DFL, then kill(self, SIGINT)). An interrupted verb's code (128+N) now
    ends the process at once, its output flushed (0 of 200 runs); other codes leave by SystemExit as before."""
    import c128patch.__main__ as entry

    def verb() -> None:
        print("said before the end")
        raise SystemExit(code)

    ended: list[object] = []
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # (main wraps it: put back after the test)
    monkeypatch.setattr(entry.cli, "main", verb)
    monkeypatch.setattr(entry.os, "_exit", lambda c: (ended.append(c), sys.exit(c)))
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit) as done:
            entry.main()
    finally:  # (past the verb the entry ignores them to the process's end: this process goes on)
        for s, handler in kept.items():
            signal.signal(s, handler)
    assert done.value.code == code and ended == ([code] if exits_now else [])
    assert "said before the end" in capsys.readouterr().out


def test_a_second_apply_into_a_tree_another_apply_is_cloning_waits_it_is_not_called_interrupted(tmp_path):
    """Helper 177: `apply` clones with its journal in the clone's template, before it holds the tree's lock: a second
    `apply --tree` onto that folder meanwhile took the lock and said "a c128patch apply was interrupted in ...; finish
    it (apply --continue) or undo it (apply --abort)", and that `--abort` removed the clone under the first apply. The
    journal names the cloning run (``procs.owner_tag``) until it holds the lock: while it runs, ``ensure_idle``,
    `--continue` and `--abort` say so; a dead one's is interrupted, as before."""
    from c128patch.git import Git
    from c128patch.ops.applier import Apply
    from c128patch.ops.treestate import ensure_idle
    from c128patch.procs import run_tag

    tree = tmp_path / "sglang"
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / ".git" / "c128patch").mkdir()
    journal = {"rev": "v0.5.23", "upstream_commit": "0" * 40, "branch": "c128/v0.5.23", "series_root": str(REPO_ROOT),
               "series_digest": "x", "upstream_info": {}, "names": [], "fresh_clone": True, "phase": "clone"}
    cloner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tree / ".git" / "c128patch" / "apply.json").write_text(json.dumps(
            {**journal, "cloning": f"{cloner.pid}-{run_tag()}"}))
        said = f"another c128patch apply is cloning into {tree} (pid {cloner.pid}); wait for it to finish and retry"
        for attempt in (lambda: ensure_idle(Git(worktree=tree), "apply"), Apply(Git(worktree=tree)).abort,
                        Apply(Git(worktree=tree)).resume):
            with pytest.raises(Exception, match=re.escape(said)):
                attempt()
        assert (tree / ".git" / "c128patch" / "apply.json").is_file()  # nothing undone under the cloning run
    finally:
        cloner.kill()
        cloner.wait()
    with pytest.raises(Exception, match="a c128patch apply was interrupted in"):  # its run gone: interrupted
        ensure_idle(Git(worktree=tree), "apply")


_AS_IT_STARTS = """
import builtins, os, runpy, signal, sys
real = builtins.__import__
def imported(name, globals=None, locals=None, fromlist=(), level=0):
    if name == "c128patch" and fromlist and "cli" in fromlist:  # the entry's own imports, before any verb's handler
        os.kill(os.getpid(), signal.SIG{sig})
    return real(name, globals, locals, fromlist, level)
builtins.__import__ = imported
sys.argv = ["c128patch", "lint", "--offline"]
runpy.run_module("c128patch", run_name="__main__")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_as_the_tool_starts_says_so_not_a_silent_exit(tmp_path, sig):
    """Helper 181 (round 32's leftover): SIGTERM or SIGHUP in the first ~0.2 s of a run, while the entry imports the
    CLI (before a verb's handler), ended it by the default disposition: exit 143 or 129 and not a word. Now the line
    every interrupted run says, and 128+N."""
    proc = subprocess.run([sys.executable, "-c", _AS_IT_STARTS.format(sig=sig.name.removeprefix("SIG"))],
                          env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=60,
                          preexec_fn=default_signals)
    assert proc.returncode == SIGNAL + sig, (proc.returncode, proc.stderr)
    assert proc.stderr == f"c128patch: interrupted ({sig.name}): no outcome; nothing was done\n", proc.stderr
