"""SIGINT, SIGTERM and SIGHUP during a real `wheel` or `watch` (issue 36.6): the run unwinds as Ctrl-C does, leaves
no scratch folder in the temp folder or --out, writes no report or wheel, claims no outcome, exits 128+N."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from c128patch.exitcodes import SIGNAL
from c128patch.git import FAULT_HOOKS_ENV
from support import cli_process, copy_series, default_signals, invoke


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
