"""The one runner (``c128patch.procs``): a child's whole process group ends with it, on its exit and past its
time limit, so that a fork of the child never outlives the call (device probes, git past a limit, doctor)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from c128patch import procs
from c128patch.smoke.device import run_child

# the child forks a grandchild that lets go of the output and sleeps 60 s, prints its pid, then waits ARGV[1] s
FORKER = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    os.close(1); os.close(2); time.sleep(60)\n"
          "    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(float(sys.argv[1]))\n")


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_fork_of_the_child_ends_when_the_child_exits():
    out, why = run_child([sys.executable, "-c", FORKER, "0"], 30)
    assert not why and _gone(int(out))


def test_past_its_limit_the_whole_group_is_killed():
    with procs.Group([sys.executable, "-c", FORKER, "60"], stdout=subprocess.PIPE, text=True) as proc:
        grandchild = int(proc.stdout.readline())
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
    assert proc.returncode == -9 and _gone(grandchild)
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run([sys.executable, "-c", "import time; time.sleep(60)"], 0.5)


def test_a_groups_child_dies_with_the_tool_even_by_sigkill():
    """kill -9 of the tool (no cleanup runs) still ends its Group's child: it cannot write on into a folder the
    next run removes (a killed first mirror clone, tests/test_apply.py). Without PR_SET_PDEATHSIG it sleeps on."""
    code = ("import time; from c128patch import procs; g = procs.Group(['sleep', '30']); print(g.pid, flush=True); "
            "time.sleep(60)")
    tool = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(tool.stdout.readline())
    tool.kill()
    tool.wait()
    deadline = time.monotonic() + 10
    state = ""
    while time.monotonic() < deadline:
        try:
            state = next(ln for ln in Path(f"/proc/{child}/status").read_text().splitlines() if ln.startswith("State"))
        except FileNotFoundError:
            state = "gone"
        if "Z" in state.split(":", 1)[-1] or state == "gone":
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
    assert state == "gone" or "zombie" in state, state


def test_ending_a_child_whose_wait_an_interrupt_left_holding_its_lock_does_not_hang():
    """`watch` interrupted (Ctrl-C) in its behavioural tier hung for ever: the SIGINT, taken by the progress thread,
    was handled in the main thread right after ``Popen.wait(timeout)``'s ``_waitpid_lock.acquire(False)``, before
    its ``try``; the lock stayed held, and the cleanup's ``end()`` blocked on it (the box a zombie, unreaped)."""
    import threading

    proc = procs.Group([sys.executable, "-c", "import time; time.sleep(60)"])
    proc._waitpid_lock.acquire()  # what the interrupted wait left behind
    ender = threading.Thread(target=proc.end, daemon=True)
    ender.start()
    ender.join(15)
    assert not ender.is_alive(), "end() blocked on the lock an interrupted wait left held"
    assert proc.returncode == -signal.SIGKILL and _gone(proc.pid)
