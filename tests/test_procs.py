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


def _preexec_fns(root: Path) -> list[str]:
    """Where a module under ``root`` passes a ``preexec_fn`` (a keyword, or a key of a ``**`` mapping)."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.keyword) and node.arg == "preexec_fn"
                    or isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "preexec_fn"
                                                          for k in node.keys)):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno if hasattr(node, 'lineno') else '?'}")
    return sorted(found)


def test_no_child_of_the_tool_is_started_with_a_preexec_fn(tmp_path):
    """A ``preexec_fn`` makes Python fork in place of vfork and run its at-fork hooks in a thread that may not own
    the locks they take: a rebase proving in a worker thread deadlocked CI on logging's module lock (705acf5); a
    Group's ``PR_SET_PDEATHSIG`` had the same hazard. None anywhere in the tool (``procs.dying_prefix`` instead)."""
    tooling = Path(procs.__file__).resolve().parent.parent
    assert _preexec_fns(tooling) == []
    planted = tmp_path / "pkg"
    planted.mkdir()
    (planted / "m.py").write_text("import subprocess\nsubprocess.run(['true'], preexec_fn=print)\n"
                                  "kw = {'preexec_fn': print}\n")
    assert _preexec_fns(planted) == ["pkg/m.py:2", "pkg/m.py:3"]  # the walk sees both shapes


def test_a_group_started_from_a_worker_thread_while_another_holds_a_lock_across_the_fork_completes():
    """The deadlock's shape: one thread holds logging's module lock (which a fork's at-fork hook takes) while a
    worker starts a Group. With a ``preexec_fn`` the worker blocked in the fork until the lock was let go; without
    one (vfork, no Python hook) it runs and ends."""
    import logging
    import threading

    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(procs.run(["true"], 10).returncode), daemon=True)
    lock = logging._lock  # type: ignore[attr-defined]
    lock.acquire()
    try:
        worker.start()
        worker.join(15)
        assert not worker.is_alive() and done == [0], "the Group's start waited on a lock another thread holds"
    finally:
        lock.release()
        worker.join(15)


def test_a_program_that_is_not_there_is_said_as_popen_says_it(tmp_path):
    """The child starts under ``setpriv`` (``dying_prefix``): a missing ``git`` or ``nvcc`` is still Popen's
    ``FileNotFoundError`` naming it (the one line callers print), not setpriv's exit 127."""
    assert procs.dying_prefix()[0], procs.dying_prefix()[1]  # (this host has setpriv: the prefix is tested)
    for argv, kw, kind in ((["c128-no-such-program"], {}, FileNotFoundError),
                           (["c128-no-such-program"], {"env": {"PATH": str(tmp_path)}}, FileNotFoundError),
                           ([str(tmp_path / "none")], {}, FileNotFoundError), ([b"c128-none"], {}, FileNotFoundError),
                           (["./x"], {"cwd": tmp_path}, PermissionError), ([str(tmp_path)], {}, PermissionError)):
        (tmp_path / "x").write_text("")
        with pytest.raises(kind) as exc:
            procs.run(argv, 10, **kw)
        with pytest.raises(kind) as plain:
            subprocess.run(argv, **kw)
        assert str(exc.value) == str(plain.value)
    (tmp_path / "x").chmod(0o755)  # found relative to cwd, and on the env's PATH, as Popen finds it
    assert procs.run(["./x"], 10, cwd=tmp_path).returncode == 0
    assert procs.run(["x"], 10, env={"PATH": str(tmp_path)}).returncode == 0
    assert procs.run([b"x"], 10, cwd=os.fsencode(tmp_path), env={"PATH": "."}).returncode == 0  # bytes, as Popen
    with pytest.raises(subprocess.TimeoutExpired, match=r"\['sleep', '5'\]"):  # the command, not the prefix
        procs.run(["sleep", "5"], 0.2)


def test_without_setpriv_a_group_still_runs_and_the_prefix_says_why(monkeypatch, tmp_path):
    """A host without util-linux's setpriv (macOS, busybox): the probe says why, a Group runs its command as given
    (tied to the tool no more, a limit docs/security.md says)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert procs.dying_prefix.__wrapped__() == ([], "no setpriv (util-linux)")
    monkeypatch.undo()
    monkeypatch.setattr(procs, "dying_prefix", lambda: ([], "no setpriv (util-linux)"))
    assert procs.dying(["true"]) == ["true"]
    with procs.Group(["sh", "-c", "echo $PPID"], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.communicate(timeout=30)[0] == f"{os.getpid()}\n"  # the command itself is our child
    with pytest.raises(FileNotFoundError, match="c128-no-such-program"):
        procs.run(["c128-no-such-program"], 10)


def test_a_child_whose_starter_died_before_its_death_signal_was_set_does_not_run():
    """``setpriv`` sets the death signal after we start it: a tool SIGKILLed in between would leave it running for
    good (the SIGKILL test above failed so, under load). Its ``sh`` runs the command only where its parent is still
    the tool; here another process (a shell) starts it, as the orphan's new parent would be."""
    argv = procs.dying(["echo", "ran"])
    assert argv[0].endswith("setpriv")
    other = subprocess.run(["sh", "-c", '"$@"; echo "exit $?"', "sh", *argv], capture_output=True, text=True,
                           timeout=30)
    assert other.stdout == "exit 1\n"
    assert procs.run(["echo", "ran"], 10).stdout == "ran\n"


@pytest.mark.parametrize("env", [None, {"A": "1"}, {"A": "1", "PWD": "/elsewhere ' $x", "SHLVL": "7"},
                                 {b"PWD": b"/bytes", "SHLVL": Path("/a path")}])
def test_the_childs_environment_is_the_one_given_not_its_prefix_shells(env):
    """The prefix's ``sh`` sets PWD (dash), SHLVL (bash): the command sees the environment it was given."""
    def seen(out: str) -> dict[str, str]:
        return {k: v for k, v in (kv.split("=", 1) for kv in out.split("\0") if kv) if k != "_"}  # (bash as sh sets _)

    plain = subprocess.run(["env", "-0"], env=env, cwd="/", capture_output=True, text=True, timeout=30).stdout
    assert seen(procs.run(["env", "-0"], 10, env=env, cwd="/").stdout) == seen(plain)


@pytest.mark.parametrize("sub", ["clone", "checkout"])
def test_a_long_untimed_git_call_dies_with_the_tool_even_by_sigkill(tmp_path, sub):
    """An untimed git call that writes a tree (clone, checkout, read-tree -u, am) outlived a SIGKILLed tool and wrote
    on into the folder the next run sweeps (8f698c7's preexec_fn fix deadlocked CI and was reverted in 705acf5).
    Through ``procs.dying`` now: a git that sleeps stands in for a long one; it must die with the tool."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True).stdout.strip()
    (bin_ / "git").write_text(f'#!/bin/sh\ncase " $* " in *" {sub} "*) echo $$ > "{tmp_path}/pid"; exec sleep 30;; '
                              f'esac\nexec {real} "$@"\n')
    (bin_ / "git").chmod(0o755)
    subprocess.run([real, "init", "-q", str(tmp_path / "repo")], check=True)
    code = (f"from pathlib import Path; from c128patch.git import Git; Git(Path({str(tmp_path / 'repo')!r}))"
            f".run({sub!r}, 'x', check=False)")
    tool = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"})
    pid_file = tmp_path / "pid"
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()) and tool.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    git = int(pid_file.read_text())
    tool.kill()
    tool.wait()
    gone = _gone(git)
    if not gone:
        os.kill(git, signal.SIGKILL)
    assert gone
