"""The one way the tool starts a child it must be able to end: in a new session (its own process group), under
an optional time limit, the whole group killed when it ends, times out or we are interrupted."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence


class Group(subprocess.Popen):
    """``Popen`` in a new session; ``end`` (and leaving its ``with`` block) kills its whole process group. On Linux
    the child is killed when the tool dies, even by SIGKILL (``dying_prefix``: no ``preexec_fn``, which makes Python
    fork in place of vfork and run its at-fork hooks, a deadlock from a thread): a killed run's clone does not write
    on into the folder the next run removes."""

    def __init__(self, argv: Sequence[str], *, contained: bool = False, **kw: Any) -> None:
        """``contained``: ``argv`` the first process of a pid namespace of its own where the host allows it
        (``contained()``): what it forks dies with it even when we are SIGKILLed (git's remote helper, stuck on a
        server that never answers, had run on for ever)."""
        argv = [*contained_prefix()[0], *argv] if contained else list(argv)
        if dying_prefix()[0]:  # what Popen raises for a program not there, not the prefix's exit 127
            _runnable(argv[0], kw.get("env"), kw.get("cwd"))
        super().__init__(dying(argv, kw.get("env")), start_new_session=True, **kw)
        self.args = argv  # what it runs (a timeout's message names it), not the prefix

    def end(self) -> None:
        """SIGKILL to the group (the child's forks too), the child reaped."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        # Ctrl-C handled right after ``wait(timeout)``'s ``_waitpid_lock.acquire(False)``, before its ``try`` (a
        # signal another thread took, the progress heartbeat's, is handled there), leaves the lock held: ``wait``
        # then blocked for ever (`watch` interrupted in its behavioural tier). One thread waits on a Group: held
        # past a moment, it is that stale hold.
        lock = self._waitpid_lock  # type: ignore[attr-defined]
        lock.acquire(timeout=2)  # ours, or past 2 s (the child is dead) the stale hold: released either way
        lock.release()
        self.wait()

    def __exit__(self, *exc: Any) -> None:
        self.end()
        with contextlib.suppress(BrokenPipeError):  # input still buffered for the child just killed
            super().__exit__(*exc)


# a variable whose name says a credential (GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY, HF_TOKEN, SSH_AUTH_SOCK, *_PASSWORD): a
# child that runs a target's code unsealed (smoke's pytest passes, its load driver) is given none, nor doctor's probes
CREDENTIAL = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|API_?KEY|ACCESS_KEY|PRIVATE_KEY|AUTH)(_|$)")


def without_credentials(env: "dict[str, str]", keep: "tuple[str, ...]" = ()) -> "dict[str, str]":
    """``env`` without a variable ``CREDENTIAL`` names (but those of ``keep``)."""
    return {k: v for k, v in env.items() if k in keep or not CREDENTIAL.search(k.upper())}


# run by ``sh`` once ``setpriv`` set the death signal: a tool that died before that (the child already another's)
# ends it here; the shell's own PWD and SHLVL (dash sets PWD, bash SHLVL) put back as they were in the env
_ORPHANED = '[ "$PPID" = {pid} ] || exit 1; {env}exec "$@"'


@functools.cache
def dying_prefix() -> tuple[list[str], str]:
    """(the prefix that has a command SIGKILLed when the thread that started it dies, ""), or ([], why not here);
    ``dying`` completes it. ``setpriv --pdeathsig`` sets ``PR_SET_PDEATHSIG`` and execs ``sh``, which checks that
    its parent is still ours and execs the command; the signal holds across exec (cleared only by running a
    set-user-ID or file-capability program): the child of a thread of ours dies with that thread, so a Group must
    outlive no thread that started it (``ThreadPoolExecutor``'s workers live to its shutdown)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return [], "no setpriv (util-linux)"
    prefix = [setpriv, "--pdeathsig", "KILL", "--", "/bin/sh", "-c"]
    try:  # (util-linux before 2.33 has no --pdeathsig)
        proc = subprocess.run([*prefix, _ORPHANED.format(pid=os.getpid(), env=""), "sh", setpriv, "--version"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=10,
                              start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)
    if proc.returncode != 0:
        return [], (proc.stderr.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return prefix, ""


def dying(argv: list[str], env: Any = None) -> list[str]:
    """``argv`` under ``dying_prefix`` (``env``: the one it runs with, None for ours), or as it is where there is
    none."""
    prefix = dying_prefix()[0]
    if not prefix:
        return argv
    # (Popen takes bytes and path-like names and values too)
    env = {os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()
           if os.fsdecode(k) in ("PWD", "SHLVL", "PATH")}
    kept = "".join(f"export {k}={shlex.quote(env[k])}; " if k in env else f"unset {k}; " for k in ("PWD", "SHLVL"))
    if "PATH" not in env:  # the command found where Popen looks (os.defpath), not in sh's default; not exported
        kept += f"PATH={shlex.quote(os.defpath)}; "
    return [*prefix, _ORPHANED.format(pid=os.getpid(), env=kept), "sh", *argv]


def _runnable(program: str, env: Any, cwd: Any) -> None:
    """``FileNotFoundError`` (``PermissionError``) as ``Popen`` raises it where ``program`` cannot be run: found as
    ``Popen`` looks (``env``'s PATH unless it holds a "/", relative to ``cwd``), a file that may be executed."""
    def here(path: str) -> str:
        return os.path.join(os.fsdecode(cwd), path) if cwd is not None else path

    name = os.fsdecode(program)  # (str, bytes or path-like, as Popen takes it)
    found = [here(name)] if os.path.dirname(name) else [here(os.path.join(d, name)) for d in os.get_exec_path(env)]
    if any(os.path.isfile(p) and os.access(p, os.X_OK) for p in found):
        return
    code = errno.EACCES if any(os.path.exists(p) for p in found) else errno.ENOENT
    raise (PermissionError if code == errno.EACCES else FileNotFoundError)(code, os.strerror(code), program)


@functools.cache
def contained_prefix() -> tuple[list[str], str]:
    """(the prefix that runs a command as the first process of a pid namespace of its own, ""), or ([], why not here).
    In one, all it forks (a daemon's double fork, ``setsid``, git's remote helper) dies with it, even when we are
    SIGKILLed: ``unshare`` dies with us (``Group``), its child, the namespace's first process, with it
    (``--kill-child``), and the kernel kills the rest of the namespace."""
    why = "no unshare"
    # (never --map-root-user: root inside, ssh reads root's ~/.ssh, not the operator's, and a probe sees euid 0)
    for user in ((), ("--user", "--map-current-user")):
        if not user and os.geteuid() != 0:
            continue
        argv = ["unshare", *user, "--pid", "--fork", "--kill-child"]
        try:
            with Group([*argv, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE) as proc:
                _, err = proc.communicate(timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = str(exc)
            continue
        if proc.returncode == 0:
            return argv, ""
        why = (err.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return [], why


def run(argv: Sequence[str], timeout: float | None, *, input: str | bytes | None = None, text: bool = True,
        **kw: Any) -> subprocess.CompletedProcess:
    """``argv`` to its end (``TimeoutExpired`` past ``timeout`` s), its group killed; text decoded with "replace"."""
    with Group(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, text=text, errors="replace" if text else None, **kw) as proc:
        out, err = proc.communicate(input, timeout=timeout)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)



@functools.cache
def run_tag() -> str:
    """Where a pid names a process of ours: this host's boot and pid namespace, hashed. A TMPDIR shared with a
    container (its own pid namespace) or another host holds pids that are not ours to test (helper 139: a live run's
    folder there was swept as dead)."""
    seen = []
    for read in (lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                 lambda: os.readlink("/proc/self/ns/pid")):
        try:
            seen.append(read())
        except OSError:
            seen.append("")
    return hashlib.sha256("\0".join(seen).encode()).hexdigest()[:8]


def named(prefix: str) -> str:
    """The start of a scratch name: ``<prefix><pid>-<run_tag>-`` (``sweep_stale`` reads it back)."""
    return f"{prefix}{os.getpid()}-{run_tag()}-"


_SWEPT: set[str] = set()
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no pid is larger


def sweep_stale(folder: Path, prefix: str) -> None:
    """Remove the ``<prefix><pid>-<run_tag>-*`` folders in ``folder`` whose process is gone (a killed run's), of
    every prefix (``prefix`` among them: a killed watch's box and environment folders had waited for a run that
    makes those same ones), only ours: of this host and pid namespace, a real folder (no link) the current user
    owns; once per folder in a process (``check`` makes three scratch folders per rev)."""
    if str(folder) in _SWEPT:
        return
    _SWEPT.add(str(folder))
    tag = run_tag()
    try:
        candidates = list(folder.glob(f"*-{tag}-*"))
    except OSError:
        return
    # every prefix ends in "-" (a pid's digits never run into it), ``mkdtemp``'s part has no "-"
    ours = re.compile(rf"-([0-9]+)-{tag}-[a-z0-9_]+")
    for path in candidates:
        m = ours.search(path.name)
        # a pid no process can have (another user's /tmp/x-99999999999999999999-TAG-a: os.kill's OverflowError
        # traceback in every run of every user) is no run's
        if not m or m.end() != len(path.name) or not 0 < int(m[1]) <= PID_MAX or int(m[1]) == os.getpid():
            continue
        try:
            os.kill(int(m[1]), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                st = path.lstat()
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                    shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def owner_tag() -> str:
    """``<pid>-<run_tag>``: this process, as a state file names the run that wrote it (``running_owner`` reads it)."""
    return f"{os.getpid()}-{run_tag()}"


def running_owner(owner: object) -> int | None:
    """The pid an ``owner_tag`` names when that process is another one of this host and pid namespace and still runs
    (not a zombie); else None (a dead run's, another host's, no tag at all)."""
    m = re.fullmatch(rf"([0-9]{{1,10}})-{run_tag()}", owner) if isinstance(owner, str) else None
    if not m or not 0 < int(m[1]) <= PID_MAX or int(m[1]) == os.getpid():
        return None
    try:
        os.kill(int(m[1]), 0)
        state = Path(f"/proc/{m[1]}/stat").read_text().rsplit(")", 1)[-1].split()[:1]
    except ProcessLookupError:
        return None
    except OSError:  # (no /proc: alive, as kill says; EPERM: another user's, alive)
        state = []
    return None if state == ["Z"] else int(m[1])


def scratch_dir(prefix: str, folder: str | Path | None = None) -> str:
    """A new folder ``<folder>/<prefix><pid>-<run_tag>-*`` (``folder``: ``$TMPDIR``), a SIGKILLed run's of that
    ``prefix`` (its pid dead) swept first. Every scratch folder the tool makes comes from here or ``scratch``
    (``tests/test_interrupts.py::test_no_scratch_bypasses_procs`` walks the code for one that does not)."""
    where = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    sweep_stale(where, prefix)
    return tempfile.mkdtemp(prefix=named(prefix), dir=where)


def scratch(prefix: str, folder: str | Path | None = None) -> tempfile.TemporaryDirectory:
    """``scratch_dir`` as a ``TemporaryDirectory`` (removed on leaving its ``with``)."""
    where = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    sweep_stale(where, prefix)
    return tempfile.TemporaryDirectory(prefix=named(prefix), dir=where)
