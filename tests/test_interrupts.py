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
from support import default_signals


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
