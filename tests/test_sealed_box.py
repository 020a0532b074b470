"""The target's code runs only in a sealed box (issue 36 item 3): a booby-trapped tree (a top-level
``json.py``, a fake ``python/torch/``, a module that reads ``GITHUB_TOKEN`` and forks a child meant to
outlive the run) gets no token, no real ``HOME``, no stdlib shadowing and no survivor; ``--no-run``
runs none of it; ``--python`` is taken from the current folder and refused inside the tree; and
``check``, ``contract`` and ``bisect`` never execute a target's code. Where the host allows it, the code writes
nowhere but its own folder (and the one a test gives it to report back), and cannot remount to undo that."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import watch_upstream as wu
from c128patch.errors import C128Error
from c128patch.fit import sandbox, treecheck
from c128patch.fit.sandbox import KEEP, Sealed, interpreter
from c128patch.git import Git
from c128patch.series.manifest import load_series
from support import REPO_ROOT, invoke, upstream_commit
from test_watch_behaviour import no_torch_python as bare_python

SERIES = load_series(REPO_ROOT)
TRAP = "python/sglang/trap.py"


@pytest.fixture(autouse=True)
def reports_back(tmp_path, monkeypatch):
    """The box may write to ``tmp_path`` (where the tests' traps report what they saw): the operator's scratch."""
    monkeypatch.setattr(treecheck, "Sealed", functools.partial(Sealed, writable=(str(tmp_path),)))


# tries to write outside its folder, then to remount / read-write and write again: prints each errno (0: written)
ESCAPE = """import os, subprocess, sys
for step in ("write", "remount"):
    if step == "remount":
        subprocess.run(["mount", "-o", "remount,rw", "/"], capture_output=True)
        subprocess.run(["mount", "-o", "remount,bind,rw", sys.argv[1]], capture_output=True)
    try:
        open(os.path.join(sys.argv[1], step), "w").close()
        print(step, 0)
    except OSError as exc:
        print(step, exc.errno)
"""


def test_the_targets_code_writes_nowhere_but_its_folder_and_cannot_remount(tmp_path_factory):
    """The operator's clone, ``~/.bashrc``, the release cache: any folder but the box's own is read-only to it (even
    one it is given to read; the others it does not even see)."""
    clone = tmp_path_factory.mktemp("clone")
    box = Sealed(sys.executable, ["-c", ESCAPE, str(clone)], 60, offline=True, readable=(str(clone),))  # seen
    home = box.home
    out, err = box.wait()
    if "writes NOT confined" in sandbox.isolation():
        assert sorted(p.name for p in clone.iterdir()) == ["remount", "write"]  # the host allows no seal: it says so
        pytest.skip(sandbox.isolation())
    assert (out, err) == ("write 30\nremount 30\n", "") and not any(clone.iterdir())  # EROFS
    assert not home.exists()


def test_where_the_host_refuses_the_seal_the_box_still_runs_and_says_what_is_not_confined(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "_cuts", lambda: ("no mount namespace or read-only remount here (refused)",
                                                   "no mount namespace or empty mounts here (refused)",
                                                   "no network namespace here (refused)",
                                                   "no pid namespace with a fresh /proc here (refused)"))
    box = Sealed(sys.executable, ["-c", ESCAPE, str(tmp_path)], 60, offline=True)
    assert box.wait() == ("write 0\nremount 0\n", "")
    assert sandbox.isolation() == ("writes NOT confined: no mount namespace or read-only remount here (refused); "
                                   "reads NOT confined: no mount namespace or empty mounts here (refused); "
                                   "processes NOT isolated: no pid namespace with a fresh /proc here (refused); "
                                   "no count of its processes (no user namespace here); "
                                   "network NOT cut off: no network namespace here (refused)")


# what the box says of its process count, in a user namespace of its own
CAPPED = ("no count of its processes (the kernel exempts root from it)" if os.geteuid() == 0 else
          f"at most {sandbox.PROCS} processes and threads at once")


def test_bisect_behaviour_says_it_runs_the_targets_code_and_what_the_host_does_not_confine(monkeypatch):
    """Each bisect step runs the tier: it said nothing, the box unconfined or not (watch and treecheck say it)."""
    from c128patch.fit import bisect

    monkeypatch.setattr(sandbox, "_cuts", lambda: ("no mount namespace here (refused)", "the same", "", "the same"))
    monkeypatch.setattr(bisect, "bisect", lambda *a, **k: dict(found=False, summary="fits", failing=[], commit="",
                                                                 subject=""))
    run = invoke("bisect", "--onto", "x", "--behaviour", "--series", str(REPO_ROOT), as_json=False)
    assert run.code == 0, run.err
    assert run.err.startswith("bisect --behaviour runs the target tree's code at each step, in the sealed box (leave "
                              "out --behaviour to run none): writes NOT confined: no mount namespace here (refused); "
                              "reads NOT confined: the same; processes NOT isolated: the same; "
                              f"{CAPPED}; no network (loopback only)\n"), run.err
    assert "NOT confined" not in invoke("bisect", "--onto", "x", "--series", str(REPO_ROOT), as_json=False).err


# reads each file it is given and prints what it read (or why not)
PEEK = """import sys
for path in sys.argv[1:]:
    try:
        print(path, open(path).read())
    except OSError as exc:
        print(path, exc.strerror)
"""


def test_the_targets_code_reads_no_secret_of_the_operators_home_tmp_or_etc(tmp_path_factory, monkeypatch):
    """``~/.ssh``, ``~/.netrc``, ``~/.git-credentials``, the release cache, another clone in ``/tmp``, ``/etc/shadow``:
    hidden from the code, even through the operator's process's ``/proc/PID/root`` (the namespace before the seal),
    while the interpreter and the folders it is given stay readable."""
    home, clone, tree = (tmp_path_factory.mktemp(n) for n in ("home", "clone", "tree"))
    secrets = [home / ".ssh" / "id_ed25519", home / ".netrc", home / ".git-credentials",
               home / ".cache" / "c128patch" / "token", clone / ".git" / "config"]
    for i, path in enumerate(secrets):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"secret-{i}-c128")
    (tree / "mod.py").write_text("needed-c128")
    monkeypatch.setenv("HOME", str(home))
    peek = [*map(str, secrets), f"/proc/{os.getpid()}/root{secrets[0]}", "/etc/shadow", str(tree / "mod.py")]
    out, err = Sealed(sys.executable, ["-c", PEEK, *peek], 60, offline=True, readable=(str(tree),)).wait()
    assert "needed-c128" in out and err == "", (out, err)  # what it is given it reads: the probe can see
    if "reads NOT confined" in sandbox.isolation():
        assert "secret-0-c128" in out  # the host allows no hiding: it says so
        pytest.skip(sandbox.isolation())
    assert "-c128\n" not in out.replace("needed-c128\n", ""), out
    assert f"{secrets[0]} No such file or directory" in out and "root:" not in out, out



def test_the_targets_code_reads_no_system_git_config(tmp_path):
    """Helper 155: git's system config (`/etc/gitconfig`: a credential helper, a token in an `http.extraHeader`) was
    readable by the target's code in the box; it is covered as `/etc/shadow` is."""
    assert "/etc/gitconfig" in sandbox._hidden()
    if not os.path.isfile("/etc/gitconfig") or not open("/etc/gitconfig").read():
        pytest.skip("no /etc/gitconfig on this host to read")
    (tmp_path / "mod.py").write_text("needed-c128")
    out = Sealed(sys.executable, ["-c", PEEK, "/etc/gitconfig", str(tmp_path / "mod.py")], 60, offline=True,
                 readable=(str(tmp_path),)).wait()[0]
    assert "needed-c128" in out, out
    if "reads NOT confined" in sandbox.isolation():
        pytest.skip(sandbox.isolation())
    assert out.startswith("/etc/gitconfig \n"), out  # (covered by /dev/null: empty)


def test_the_targets_code_reads_no_site_pip_config_but_pip_in_the_box_does(tmp_path_factory, monkeypatch):
    """Helper 134: the site's pip config (``/etc/pip.conf``, ``$XDG_CONFIG_DIRS/pip/pip.conf``: an index URL with its
    credentials) was read by the tier's code; only a box that runs pip (``Sealed(pip=True)``) reads it now."""
    site, tree = tmp_path_factory.mktemp("xdg"), tmp_path_factory.mktemp("tree")
    (site / "pip").mkdir()
    (site / "pip" / "pip.conf").write_text("[global]\nindex-url = https://user:secret-c128@index.invalid/simple\n")
    (tree / "mod.py").write_text("needed-c128")
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(site))
    peek = [str(site / "pip" / "pip.conf"), str(tree / "mod.py")]
    out = Sealed(sys.executable, ["-c", PEEK, *peek], 60, offline=True, readable=(str(site), str(tree))).wait()[0]
    assert "needed-c128" in out, out
    if "reads NOT confined" in sandbox.isolation():
        pytest.skip(sandbox.isolation())
    assert "secret-c128" not in out, out
    out = Sealed(sys.executable, ["-c", PEEK, *peek], 60, offline=True, readable=(str(site), str(tree)),
                 pip=True).wait()[0]
    assert "secret-c128" in out, out


# for each path it is given: a folder's names, a file's first bytes, or why not
LOOK = """import json, os, sys
seen = {}
for path in sys.argv[1:]:
    try:
        seen[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, "rb").read(64).decode("latin-1")
    except OSError as exc:
        seen[path] = exc.strerror
print(json.dumps(seen))
"""


def test_the_targets_code_sees_only_the_systems_top_level_folders_and_what_it_runs():
    """Every top-level entry of / but the system's (``/work``, ``/opt``, ``/srv``, ``/mnt``, ``/var``, ``/run``, a
    file at the top) is empty to the code, but for the way to what it runs (the interpreter's prefixes, its own
    folder): the tool's own checkout, a file the test puts in the first such folder it may write, and one in shared
    memory are unseen."""
    planted = [Path(d) / f"c128box-test-{os.getpid()}" for d in ("/srv", "/mnt", "/opt", "/media", "/var")
               if os.path.isdir(d) and os.access(d, os.W_OK)][:1]
    planted += [Path("/dev/shm") / f"c128box-test-{os.getpid()}"] if os.access("/dev/shm", os.W_OK) else []
    top = [f"/{e}" for e in os.listdir("/") if Path(os.path.realpath(f"/{e}")).parts[1:2] != ()
           and Path(os.path.realpath(f"/{e}")).parts[1] not in sandbox.SYSTEM]
    try:
        for path in planted:
            path.write_text("secret-c128")
        files = [*map(str, planted), str(REPO_ROOT / "pyproject.toml")]
        box = Sealed(sys.executable, ["-c", LOOK, *top, *files], 60, offline=True)
        kept = [*sandbox._kept(sys.executable, ()), os.path.realpath(box.home)]
        out, err = box.wait()
    finally:
        for path in planted:
            path.unlink()
    seen = json.loads(out)
    if "reads NOT confined" in sandbox.isolation():
        assert "[project]" in seen[files[-1]]  # the host allows no hiding: it says so
        pytest.skip(sandbox.isolation())
    assert {seen[f] for f in files} == {"No such file or directory"}, (seen, err)
    for path in top:
        real = Path(os.path.realpath(path))
        way = {Path(k).relative_to(real).parts[0] for k in kept if Path(k).is_relative_to(real) and Path(k) != real}
        assert set(seen[path]) <= way if real.is_dir() else seen[path] == "", (path, seen[path], way)
    assert any(seen[p] == [] for p in top if os.path.isdir(p) and os.listdir(p)), seen  # full outside, empty inside


# its own pid, the pids its /proc lists, and whether it may signal the pid it is given (the operator's)
PIDS = """import json, os, sys
try:
    os.kill(int(sys.argv[1]), 0)
    signalled = "yes"
except OSError as exc:
    signalled = exc.strerror
print(json.dumps({"me": os.getpid(), "proc": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                  "signalled": signalled}))
"""


def test_the_targets_code_sees_and_signals_none_of_the_operators_processes(monkeypatch):
    """In its own pid namespace under a fresh /proc it lists only itself and its namespace's first process (the
    seal's shell), and the operator's process it started from is no such process; where the host refuses the
    namespace, the box runs without one and says so."""
    got = json.loads(Sealed(sys.executable, ["-c", PIDS, str(os.getpid())], 60, offline=True).wait()[0])
    if "processes NOT isolated" in sandbox.isolation():
        assert got["signalled"] == "yes"  # the host allows no pid namespace: it says so
        pytest.skip(sandbox.isolation())
    assert got["signalled"] == "No such process" and got["proc"] == [1, got["me"]], got
    monkeypatch.setattr(sandbox, "_cuts", lambda c=sandbox._cuts(): (*c[:3], "no pid namespace here (refused)"))
    got = json.loads(Sealed(sys.executable, ["-c", PIDS, str(os.getpid())], 60, offline=True).wait()[0])
    assert got["signalled"] == "yes" and os.getpid() in got["proc"], got
    assert "processes NOT isolated: no pid namespace here (refused)" in sandbox.isolation()


# System V shared memory by key (argv[1]): the segment's id, or the errno of looking it up
SHM = """import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(int(sys.argv[1]), 0, 0), ctypes.get_errno())
"""


def test_the_targets_code_sees_none_of_the_operators_system_v_shared_memory():
    """A segment the operator holds (made here by key) is found from a plain child, not from the box: it has its own
    IPC namespace (with the pid namespace: where the host refuses that, it says so)."""
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x0C128000 + os.getpid() % 4096
    shm = libc.shmget(key, 4096, 0o600 | 0o1000)  # IPC_CREAT
    assert shm >= 0, os.strerror(ctypes.get_errno())
    try:
        outside = subprocess.run([sys.executable, "-c", SHM, str(key)], capture_output=True, text=True, check=True)
        assert outside.stdout.split() == [str(shm), "0"]  # the probe finds it where it is shared
        inside = Sealed(sys.executable, ["-c", SHM, str(key)], 60, offline=True).wait()[0].split()
    finally:
        libc.shmctl(shm, 0, None)  # IPC_RMID
    if "processes NOT isolated" in sandbox.isolation():
        assert inside[0] == str(shm)  # the host allows no namespace: it says so
        pytest.skip(sandbox.isolation())
    assert inside == ["-1", str(errno.ENOENT)], inside


# forks a child that leaves the box's session (and so its process group) and appends a dot to a file every 50 ms
# for 5 s; exits once the child has begun
SURVIVOR = """import os, sys, time
if os.fork() == 0:
    os.setsid()
    for _ in range(100):
        with open(sys.argv[1], "a") as f:
            f.write(".")
        time.sleep(0.05)
    os._exit(0)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
"""


def test_a_child_that_leaves_the_boxs_process_group_dies_with_the_box(tmp_path):
    trace = tmp_path / "trace"
    Sealed(sys.executable, ["-c", SURVIVOR, str(trace)], 60, offline=True, writable=(str(tmp_path),)).wait()
    size = trace.stat().st_size
    time.sleep(0.5)
    if "processes NOT isolated" in sandbox.isolation():
        pytest.skip(sandbox.isolation())  # (it lives on its 5 s)
    assert trace.stat().st_size == size, "the child outlived the box"


# run by an unprivileged user (the kernel exempts root from the count): holds 50 processes of its own outside the box,
# then a fork bomb in a box allowed 40 (argv[1]: a copy of the package); prints what the bomb and the box said
BOMB_DRIVER = """import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from c128patch.fit.sandbox import Sealed, isolation
BOMB = '''import os, time
n = 0
try:
    while n < 500:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    print(n, 0)
except OSError as exc:
    print(n, exc.errno)
'''
outside = [subprocess.Popen(["sleep", "60"]) for _ in range(50)]
try:
    out, err = Sealed(sys.executable, ["-c", BOMB], 60, offline=True, procs=40).wait()
finally:
    for p in outside:
        p.kill()
print(json.dumps({"out": out, "err": err, "isolation": isolation()}))
"""


def _unprivileged() -> tuple[list[str], str]:
    """How to run a program as an unprivileged user (nothing if we are one; else ``nobody`` through ``setpriv``), and
    an interpreter that user can run; skips where there is none."""
    if os.geteuid() != 0:
        return [], sys.executable
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    reaches = "import os, sys; sys.exit(not os.path.isdir(os.path.dirname(os.path.realpath(sys.executable))))"
    for python in ("/usr/bin/python3", "/usr/local/bin/python3", os.path.realpath(sys.executable)):
        if subprocess.run([*as_nobody, python, "-S", "-c", reaches], capture_output=True).returncode == 0:
            return as_nobody, python
    pytest.skip("no interpreter the unprivileged user nobody can run")


def test_the_box_dies_with_the_tool_even_by_sigkill(tmp_path):
    """The box's first process in its pid namespace (the seal's shell, ``unshare --fork``'s child) outlived a
    SIGKILLed tool: a `watch` killed during the tier's environment build left pip running for good. ``unshare``
    dies with the tool (``Group``); ``--kill-child`` takes the namespace with it."""
    if sandbox._cuts()[3]:
        pytest.skip(sandbox.isolation())
    token = f"c128-box-sigkill-{os.getpid()}"
    boxed = f"import pathlib, time; pathlib.Path({str(tmp_path / 'up')!r}).touch(); time.sleep(60)"
    code = (f"import sys, time; from c128patch.fit.sandbox import Sealed; box = Sealed(sys.executable, ['-c', "
            f"{boxed!r}, {token!r}], 120, writable=({str(tmp_path)!r},)); time.sleep(120)")
    tool = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not (tmp_path / "up").exists() and tool.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "up").exists(), "the box never started"
    tool.kill()
    tool.wait()

    def left() -> list[int]:  # the boxed python and the seal's shell: their argv holds the token
        found = []
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if proc.name.isdigit() and token.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
        return [pid for pid in found if pid > 1]
    deadline = time.monotonic() + 5
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    still = left()
    for pid in still:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    assert not still, still


def test_a_fork_bomb_is_capped_counting_the_boxs_processes_alone():
    """``procs``: a fork bomb in the box stops at the cap, set in its own user namespace, so the operator's other
    processes (50 here) do not count against it (set before the namespace, they would: it could not fork at all)."""
    as_user, python = _unprivileged()
    with tempfile.TemporaryDirectory(prefix="c128box-nproc-", dir="/tmp") as tmp:  # /tmp: the user reaches it
        shutil.copytree(REPO_ROOT / "tooling/c128patch", Path(tmp, "pkg/c128patch"))
        for d, _, _ in os.walk(tmp):
            os.chmod(d, 0o777)
        env = {"PATH": os.environ["PATH"], "HOME": tmp, "TMPDIR": tmp}
        proc = subprocess.run([*as_user, python, "-S", "-c", BOMB_DRIVER, str(Path(tmp, "pkg"))], env=env,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    if "processes and threads" not in got["isolation"]:
        pytest.skip(got["isolation"])
    forked, error = map(int, got["out"].split())
    assert error == errno.EAGAIN and 30 <= forked < 40, got


def test_a_folder_to_keep_that_is_a_hidden_place_itself_is_one_line_not_a_failed_seal(tmp_path, monkeypatch):
    """A kept folder that is a place the seal hides (``LD_LIBRARY_PATH=/opt``, a Python in ``~/bin``: HOME) cannot be
    shown without all of it: one line saying what to move, not exit 125 from the seal."""
    if "writes NOT confined" in sandbox.isolation() or "reads NOT confined" in sandbox.isolation():
        pytest.skip(sandbox.isolation())
    monkeypatch.setattr(sandbox, "_hidden", lambda *more: [str(tmp_path)])
    with pytest.raises(C128Error, match=rf"^the sealed box would have to show all of {tmp_path}, a place it hides "):
        Sealed(sys.executable, ["-c", "pass"], 60, offline=True, readable=(str(tmp_path),))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("variable", ["TMPDIR", "HOME", "LD_LIBRARY_PATH"])
def test_a_folder_holding_a_newline_is_one_line_not_a_split_seal(tmp_path, monkeypatch, variable):
    """The seal's lists are lines: a TMPDIR holding a newline split there; the probe failed and the box ran with
    reads and processes NOT confined, said with a false reason (mount failed). Now one line naming it, nothing left."""
    if "writes NOT confined" in sandbox.isolation():
        pytest.skip(sandbox.isolation())
    odd, tmp = tmp_path / "a\nb", tmp_path / "tmp"
    odd.mkdir(), tmp.mkdir()
    monkeypatch.setenv(variable, str(odd))
    monkeypatch.setattr(tempfile, "tempdir", str(odd if variable == "TMPDIR" else tmp))
    sandbox._cuts.cache_clear()
    try:
        with pytest.raises(C128Error, match=r"^the sealed box cannot name the folder '.*a\\nb.*': it holds a newline"):
            Sealed(sys.executable, ["-c", "pass"], 60, offline=True)
    finally:
        sandbox._cuts.cache_clear()
    assert not list(odd.iterdir()) and not list(tmp.iterdir())


def test_a_memory_hog_is_stopped_in_one_line():
    """Past ``memory`` bytes of data a process (2 GiB asked, 1 GiB allowed), the run is one line saying so."""
    with pytest.raises(C128Error, match=r"^the target's code ran out of memory \(the box allows 1 GiB of data a "
                                        r"process\): MemoryError$"):
        Sealed(sys.executable, ["-c", "b = bytearray(2 << 30)"], 60, offline=True, memory=1 << 30).wait()


def test_a_flood_of_output_or_a_file_past_the_limit_is_cut_off(tmp_path):
    """8 MiB printed with 1 MiB read back is one line, none of it taken; a file written past ``files`` (4 MiB) stops
    there (the write fails: "File too large")."""
    flood = "import sys\nfor _ in range(128):\n    sys.stdout.write('x' * 65536)\n"
    with pytest.raises(C128Error, match=r"^the target's code wrote more than 1 MiB to its stdout \(the box's "
                                        r"limit\): none of it is taken$"):
        Sealed(sys.executable, ["-c", flood], 60, offline=True, output=1 << 20, files=4 << 20).wait()
    big = tmp_path / "big"
    write = "import sys\nwith open(sys.argv[1], 'wb') as f:\n    for _ in range(128):\n        f.write(b'x' * 65536)\n"
    box = Sealed(sys.executable, ["-c", write, str(big)], 60, offline=True, files=4 << 20, writable=(str(tmp_path),))
    err = box.wait()[1]
    assert big.stat().st_size == 4 << 20 and err.rstrip().endswith("File too large"), (big.stat().st_size, err)
    assert box.returncode == 1

def trapped_tree(tmp: Path, marker: Path, module: str = "") -> Path:
    """A tree whose ``json.py``, ``python/json.py`` and ``python/torch`` write ``marker`` when run."""
    tree = tmp / "tree"
    (tree / "python" / "sglang").mkdir(parents=True)
    (tree / "python" / "torch").mkdir()
    trap = f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n"
    for path in ("json.py", "python/json.py", "python/torch/__init__.py", "python/sitecustomize.py"):
        (tree / path).write_text(trap)
    (tree / "python" / "sglang" / "__init__.py").write_text("")
    (tree / TRAP).write_text(module or trap)
    return tree


def test_a_package_of_defines_the_tree_holds_is_never_imported_from_it_before_the_fork(tmp_path):
    """The series' ``defines`` packages (torchvision) are imported before the fork, with the gates unset, where this
    interpreter has them: never the tree's copy (a ``python/torchvision/`` it commits), as torch is not."""
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: the tree's copy is shadowed either way")
    marker = tmp_path / "ran.txt"
    tree = trapped_tree(tmp_path, marker, "VALUE = 1\n")
    (tree / "python" / "torchvision").mkdir()
    (tree / "python" / "torchvision" / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('torchvision')\n")
    assert "torchvision" in treecheck.env_ops.defines(SERIES)
    result = treecheck.run(SERIES, tree, [TRAP])
    assert [t.modules["sglang.trap"]["status"] for t in result.tiers] == ["ok", "ok"], result.to_json()
    assert not marker.exists(), marker.read_text()


def test_the_target_sees_no_token_no_home_and_no_fake_torch(tmp_path, tmp_path_factory, monkeypatch):
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    seen, marker, clone = tmp_path / "seen.json", tmp_path / "ran.txt", tmp_path_factory.mktemp("clone")
    tree = trapped_tree(tmp_path, marker, "import contextlib, json, os, torch\n"
                       f"with contextlib.suppress(OSError):\n    open({str(clone / 'escaped')!r}, 'w')\n"
                       f"open({str(seen)!r} + str(os.getpid()), 'w').write(json.dumps({{'env': dict(os.environ), "
                       "'torch': torch.__file__, 'json': json.__file__}))\n")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    result = treecheck.run(SERIES, tree, [TRAP])
    assert [t.modules["sglang.trap"]["status"] for t in result.tiers] == ["ok", "ok"], result.to_json()
    files = list(tmp_path.glob("seen.json*"))  # one per gate child: they run side by side
    assert len(files) == 2, files
    for got in (json.loads(f.read_text()) for f in files):
        assert "GITHUB_TOKEN" not in got["env"] and "ghp_secret" not in json.dumps(got)
        assert got["env"]["HOME"] != os.environ["HOME"] and not Path(got["env"]["HOME"]).exists()
        assert set(got["env"]) <= {*KEEP, "HOME", "TMPDIR", *treecheck._gates(SERIES), *treecheck.TIER_ENV}, got["env"]
        assert got["env"]["OMP_NUM_THREADS"] == "1"  # (a constant of ours, never the operator's)
        assert str(tree) not in got["torch"] and str(tree) not in got["json"]
    assert not marker.exists()
    assert result.env["isolation"] == sandbox.isolation()
    assert (clone / "escaped").exists() == ("writes NOT confined" in sandbox.isolation())


def test_a_child_the_target_forks_does_not_outlive_the_run(tmp_path):
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    pids, late = tmp_path / "pids", tmp_path / "late"
    tree = trapped_tree(tmp_path, tmp_path / "ran.txt", "import os, time\npid = os.fork()\nif pid == 0:\n"
                        f"    time.sleep(20)\n    open({str(late)!r}, 'w').write('outlived')\n    os._exit(0)\n"
                        f"open({str(pids)!r}, 'a').write(f'{{pid}}\\n')\n")
    treecheck.run(SERIES, tree, [TRAP])
    children = [int(p) for p in pids.read_text().split()]
    assert len(children) == 2  # gates off and on
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.1)
    assert not any(_alive(p) for p in children) and not late.exists()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_fake_torch_in_the_tree_does_not_make_the_tier_pass(tmp_path):
    marker = tmp_path / "ran.txt"
    tree = trapped_tree(tmp_path, marker)
    result = treecheck.run(SERIES, tree, [TRAP], python=bare_python(tmp_path))
    assert result.verdict().startswith("torch is not installed for this interpreter")
    assert not result.to_json()["ok"] and not marker.exists()


@pytest.mark.parametrize("answer", ['{"python": "x", "torch": true, "tiers": {}}', "[]"], ids=["passed", "garbage"])
def test_a_target_that_prints_an_answer_and_kills_the_runner_is_one_line_not_a_verdict(tmp_path, answer):
    """The target's code shares the runner's stdout: its own last line ("passed" with nothing checked, or a
    shape the parser trips on) is not the runner's answer once the runner it kills exits non-zero."""
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    tree = trapped_tree(tmp_path, tmp_path / "ran.txt", f"import os\nprint({answer!r}, flush=True)\n"
                        "os.kill(os.getppid(), 9)\n")
    with pytest.raises(C128Error, match=r"the behavioural tier's interpreter failed \(signal 9\)"):
        treecheck.run(SERIES, tree, [TRAP])


def test_no_run_runs_nothing_and_is_unchecked(tmp_path):
    marker = tmp_path / "ran.txt"
    result = treecheck.run(SERIES, trapped_tree(tmp_path, marker), [TRAP], run_code=False)
    assert result.verdict().startswith("unchecked: the target's code was not run (--no-run)")
    assert not result.to_json()["ok"] and not marker.exists()


def test_python_is_taken_from_the_current_folder_and_refused_inside_the_tree(tmp_path, monkeypatch):
    tree = trapped_tree(tmp_path, tmp_path / "ran.txt")
    for folder in (tree, tmp_path / "here"):
        folder.mkdir(exist_ok=True)
        (folder / "pyx").symlink_to(os.path.realpath(bare_python(tmp_path)) if folder != tree else "/bin/sh")
    monkeypatch.chdir(tmp_path / "here")
    assert interpreter("./pyx", tree) == str(tmp_path / "here" / "pyx")
    monkeypatch.chdir(tree)
    with pytest.raises(C128Error, match="lies inside the target tree"):
        interpreter("./pyx", tree)
    run = invoke("treecheck", "--tree", str(tree), "--python", "./pyx", "--series", str(REPO_ROOT))
    assert run.code == 2 and "--python ./pyx lies inside the target tree" in run.err


def test_a_standing_tier_python_inside_the_tree_is_refused_naming_the_variable(tmp_path, monkeypatch):
    """Helper 186: ``C128PATCH_TIER_PYTHON=./pyx`` (the operator's standing --python) inside the tree is refused, but
    the line said "--python ./pyx lies inside", an option the operator never gave; it names the variable now."""
    tree = trapped_tree(tmp_path, tmp_path / "ran.txt")
    (tree / "pyx").symlink_to(os.path.realpath(bare_python(tmp_path)))
    monkeypatch.chdir(tree)
    monkeypatch.setenv("C128PATCH_TIER_PYTHON", "./pyx")
    pending = treecheck.Pending(load_series(REPO_ROOT), tree, [TRAP])
    assert pending.box is None and "C128PATCH_TIER_PYTHON=./pyx lies inside the target tree" in pending.why, pending.why
    assert "--python" not in pending.why and not (tmp_path / "ran.txt").exists()


@pytest.mark.parametrize("verb", ["watch", "bisect"])
@pytest.mark.parametrize("how", ["path", "file-url"])
def test_a_python_inside_the_local_repo_watch_or_bisect_is_given_is_refused(tmp_path, monkeypatch, verb, how):
    """Helper 153: ``watch --repo . --python ./pyx`` (and ``bisect --behaviour``) from inside an upstream clone took
    the clone's own committed ``pyx`` as the interpreter: only treecheck's ``--tree`` was the target tree then."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    (repo / "pyx").write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\nexec {sys.executable} \"$@\"\n")
    (repo / "pyx").chmod(0o755)
    git = Git(worktree=repo)
    git.run("init", "-q")
    git.run("add", "pyx")
    git.run("commit", "-q", "-m", "a program of upstream's")
    monkeypatch.chdir(repo)
    given = "." if how == "path" else f"file://{repo}"
    extra = ["--behaviour"] if verb == "bisect" else ["--out", str(tmp_path / "out")]
    run = invoke(verb, "--repo", given, "--onto", "HEAD", "--python", "./pyx", *extra)
    assert run.code == 2 and "--python ./pyx lies inside the target tree" in run.err, run.err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


def test_a_python_hard_linked_to_a_file_of_the_tree_is_refused(tmp_path):
    """Helper 95: a hard link outside the tree to a script inside it passed as --python (the tree's script ran)."""
    tree = trapped_tree(tmp_path, tmp_path / "ran.txt")
    (tree / "python" / "evilpy").write_text("#!/bin/sh\ntouch ran\n")
    (tree / "python" / "evilpy").chmod(0o755)
    (tmp_path / "bin").mkdir()
    os.link(tree / "python" / "evilpy", tmp_path / "bin" / "python")
    with pytest.raises(C128Error, match="is a hard link to a file of the target tree"):
        interpreter(str(tmp_path / "bin" / "python"), tree)
    assert interpreter(os.path.realpath(bare_python(tmp_path)), tree)  # an interpreter of its own is taken


@pytest.fixture(scope="module")
def trapped_upstream(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Git, Path]:
    """v0.5.23 with a commit whose every runnable file (``json.py``, a fake torch, sglang's own
    ``__init__``; what Python, pytest or a build would run by itself: a ``.pth``, ``sitecustomize.py``,
    ``usercustomize.py``, ``conftest.py``, a ``pyproject.toml`` build backend, a ``git`` and a ``python3`` at the
    top) writes a marker when executed."""
    tmp = tmp_path_factory.mktemp("trapped")
    marker = tmp / "ran.txt"
    git = wu.stand_in(sglang_release_repo, tmp / "sglang.git")
    trap = f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n"

    def edit(idx: Git) -> None:
        init = idx.blob("v0.5.23", "python/sglang/__init__.py").decode()
        program = f"#!/bin/sh\necho \"$0\" >> {str(marker)!r}\n"
        backend = '[build-system]\nrequires = []\nbuild-backend = "trapped"\nbackend-path = ["."]\n'
        for path, text in (("json.py", trap), ("python/torch/__init__.py", trap), ("setup.py", trap),
                           ("python/sglang/__init__.py", trap + init), ("python/trap.pth", "import os; " + trap),
                           ("python/sitecustomize.py", trap), ("python/usercustomize.py", trap),
                           ("conftest.py", trap), ("python/conftest.py", trap), ("trapped.py", trap),
                           ("pyproject.toml", backend), ("git", program), ("python3", program)):
            blob = idx.out("hash-object", "-w", "--stdin", input=text)
            mode = "100755" if text is program else "100644"
            idx.run("update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}")

    wu.set_branch(git, "trap", upstream_commit(git, "v0.5.23", "upstream: booby traps", edit))
    return git, marker


@pytest.mark.parametrize("verb", [["check", "--sglang-rev", "trap"], ["contract", "--sglang-rev", "trap", "--no-nvcc"],
                                  ["bisect", "--onto", "trap"]], ids=["check", "contract", "bisect"])
def test_check_contract_and_bisect_never_run_the_targets_code(trapped_upstream, verb):
    git, marker = trapped_upstream
    run = invoke(*verb, "--repo", str(git.git_dir), "--series", str(REPO_ROOT))
    assert run.code == 0, (run.out, run.err)
    assert not marker.exists(), marker.read_text()


@pytest.mark.parametrize("entry", [".", "", "bin"])
def test_a_git_or_unshare_in_the_current_folder_never_runs_through_a_relative_path_entry(tmp_path, monkeypatch, entry):
    """Helper 134: `PATH=.:$PATH c128patch status` run from a tree holding an executable `git` ran the tree's `./git`
    (then a FileNotFoundError traceback); the tool takes its programs from PATH's absolute entries only."""
    from c128patch import git as gitmod

    tree = tmp_path / "tree"
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    marker = tmp_path / "ran.txt"
    for name in ("git", "unshare", "prlimit", "sh"):
        (tree / entry / name).parent.mkdir(exist_ok=True)
        (tree / entry / name).write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        (tree / entry / name).chmod(0o755)
    path = f"{entry}{os.pathsep}{os.environ['PATH']}"
    for verb in (["status"], ["lint", "--offline"], ["treecheck", "--tree", ".", "--no-run"]):
        run = subprocess.run([sys.executable, "-m", "c128patch", *verb], cwd=tree, env={**os.environ, "PATH": path},
                             capture_output=True, text=True, timeout=300)
        assert "Traceback" not in run.stderr, (verb, run.stderr)
        assert not marker.exists(), (verb, marker.read_text())
    monkeypatch.chdir(tree)
    monkeypatch.setenv("PATH", path)
    assert os.path.isabs(gitmod.git_executable()) and not gitmod.git_executable().startswith(str(tree))


@pytest.mark.skipif(not shutil.which("cc") or not shutil.which("ldd"), reason="needs a C compiler and ldd")
def test_a_library_in_the_current_folder_never_loads_through_an_empty_library_path_entry(tmp_path, monkeypatch):
    """Helper 134: `LD_LIBRARY_PATH=:/opt/x` (an unset variable extended) run from a tree holding a library git loads
    (`libpcre2-8.so.0`, `libz.so.1`) loaded the tree's into every git the tool ran: its constructor ran."""
    from c128patch.git import git_executable

    tree, marker = tmp_path / "tree", tmp_path / "ran.txt"
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tmp_path / "evil.c").write_text('#include <stdio.h>\n__attribute__((constructor)) static void boom(void) '
                                     f'{{ FILE *f = fopen("{marker}", "a"); if (f) fclose(f); }}\n')
    found = subprocess.run(["ldd", git_executable()], capture_output=True, text=True).stdout
    # git's own, not one Python loads too (libz: the loader reads LD_LIBRARY_PATH as the tool's process starts)
    libs = [(line.split()[0], line.split()[2]) for line in found.splitlines() if line.split()[0].startswith("libpcre")]
    if not libs:
        pytest.skip("a git without libpcre")
    for name, real in libs:  # each one: a filter on the real library, its constructor writing the marker
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tree / name), str(tmp_path / "evil.c"),
                        f"-Wl,--filter={real}", f"-Wl,-soname,{name}"], check=True)
    env = {**os.environ, "LD_LIBRARY_PATH": f"{os.pathsep}/nonexistent"}
    run = subprocess.run([sys.executable, "-m", "c128patch", "status"], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=300)
    assert "Traceback" not in run.stderr and not marker.exists(), run.stderr
    monkeypatch.chdir(tree)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{os.pathsep}/nonexistent")
    Git(worktree=tree).run("status")
    assert not marker.exists()
    subprocess.run(["git", "status"], cwd=tree, env=env, capture_output=True)  # the control: git alone loads it
    assert marker.exists()


def test_the_trap_fires_when_the_targets_code_does_run(trapped_upstream):
    """The control: the tier (which runs the target's code, sealed) sets the trap off, so the test above can fail."""
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    git, marker = trapped_upstream
    with pytest.MonkeyPatch.context() as mp:  # the trap reports back beside the repository
        mp.setattr(treecheck, "Sealed", functools.partial(Sealed, writable=(str(marker.parent),)))
        run = invoke("treecheck", "--sglang-rev", "trap", "--repo", str(git.git_dir), "--series", str(REPO_ROOT))
    assert run.err.startswith("treecheck runs the target tree's code (imports its modules) in a sealed box")
    try:
        assert "python/sglang/__init__.py" in marker.read_text()
    finally:
        marker.unlink(missing_ok=True)


def test_treecheck_no_run_is_unchecked_exit_8_and_says_nothing_ran(sglang_release_repo):
    run = invoke("treecheck", "--sglang-rev", "v0.5.23", "--no-run", "--series", str(REPO_ROOT))
    assert run.code == 8 and run.out["verdict"].startswith("unchecked: the target's code was not run (--no-run)")
    assert run.out["tiers"] == [] and "sealed box" not in run.err


def test_the_static_import_check_reads_no_file_through_a_symlink_of_the_tree(tmp_path):
    """The tree is input: a module that is a link (to any file of the machine) or sits in a linked folder is not read,
    and a ``python/sglang`` that is itself a link gives no files at all (its walk would cover the link's target)."""
    secret = tmp_path / "outside"
    (secret / "pkg").mkdir(parents=True)
    (secret / "secret.py").write_text("from sglang.srt.gone import X\n")
    (secret / "pkg" / "inner.py").write_text("from sglang.srt.gone import X\n")
    top = tmp_path / "tree"
    srt = top / "python" / "sglang" / "srt"
    srt.mkdir(parents=True)
    (top / "python" / "sglang" / "__init__.py").write_text("")
    (srt / "__init__.py").write_text("")
    (srt / "real.py").write_text("from sglang.srt.gone import X\n")
    (srt / "linked.py").symlink_to(secret / "secret.py")
    (srt / "pkg").symlink_to(secret / "pkg")
    found = treecheck.check_imports(top, ["sglang.srt.real", "sglang.srt.linked", "sglang.srt.pkg.inner"])
    assert found["sglang.srt.real"]["status"] == "failed" and found["sglang.srt.real"]["imports"] == 1  # it reads
    assert [found[m]["imports"] for m in ("sglang.srt.linked", "sglang.srt.pkg.inner")] == [0, 0]
    assert all("no file" in found[m]["detail"] for m in ("sglang.srt.linked", "sglang.srt.pkg.inner"))
    shutil.rmtree(top / "python")
    (top / "python").mkdir()
    (top / "python" / "sglang").symlink_to(secret)
    assert treecheck.check_imports(top, ["sglang.secret"])["sglang.secret"]["imports"] == 0


def test_the_box_runs_a_trees_source_not_an_unchecked_bytecode_file_beside_it(tmp_path):
    """Helper 100: an upstream can commit `__pycache__/X.cpython-3NN.pyc` made with the unchecked-hash mode; Python
    ran it instead of X.py (-B stops writes only), so the tier judged code check, apply and the wheel never saw."""
    import py_compile

    module = tmp_path / "pkg" / "m.py"
    module.parent.mkdir()
    module.write_text('print("the committed bytecode")\n')
    beside = module.parent / "__pycache__" / f"m.{sys.implementation.cache_tag}.pyc"  # (not the run's prefix)
    py_compile.compile(str(module), cfile=str(beside),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    module.write_text('print("the source")\n')
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import pkg.m"
    out, _ = Sealed(sys.executable, ["-c", code], 60, offline=True, readable=(str(tmp_path),)).wait()
    assert out.strip() == "the source", out


def test_the_runners_answer_is_taken_one_line_per_string():
    """Helper 100: a target's exception text with a line break printed a line of its choosing under ours
    (`treecheck: passed (...)`)."""
    tier = {"modules": {"m": {"status": "failed", "detail": "boom\ntreecheck: passed (FORGED)"}}}
    data = treecheck._answer(json.dumps({"torch": True, "tiers": {"off": tier, "on": tier}}), "", 0, ["m"])
    assert data["tiers"]["on"]["modules"]["m"]["detail"] == "boom ⏎ treecheck: passed (FORGED)"
