"""The sealed box every run of a target's code goes through (the behavioural tier, the tier's environment build):
an allow-listed environment (no tokens, ``HOME`` a fresh folder), isolated Python (``-I``: no current folder, user
site or ``PYTHON*`` variables on the path), a time limit, its own process group, killed whole on exit (a child
it forks does not outlive it), and limits (``Sealed``'s ``memory``: 8 GiB of data a process, ``RLIMIT_DATA``;
``files``: 256 MiB a file it writes, its output included, ``RLIMIT_FSIZE``; ``output``: 16 MiB of its stdout and of
its stderr read back; past one, a one-line error). Where the host allows unprivileged user, mount and pid
namespaces, it sees only the system's top-level folders of ``/`` (``SYSTEM``): every other entry (``/work``,
``/opt``, ``/srv``, ``/home``, ``/root``, ``/tmp``, ``/var``, ``/run``, ...) is hidden under an empty mount, as are
``HIDDEN`` (``/etc``'s password and ssh files, ``/dev/shm``) and the operator's ``HOME``, temporary folder and
cache, but for what the run needs (its folders, the interpreter's prefixes, the folders the caller names:
``readable``); every mount is made read-only but ``HOME`` and the folders the caller names (``writable``); it runs
in its own pid namespace under a fresh ``/proc`` (it sees and signals none of the operator's processes, and all it
forks die with it) and its own IPC namespace (none of the operator's System V shared memory, semaphores or message
queues) with no capabilities (it cannot remount); ``offline``: no network but loopback. ``isolation``
says what the box cuts off here, and what not."""

from __future__ import annotations

import functools
import os
import re
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.procs import Group, scratch_dir
from c128patch.smoke.device import run_child

# the environment the box keeps; the rest (tokens, credentials, PYTHON*) is dropped
KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES")
NOTICE = ("runs the target tree's code (imports its modules) in a sealed box: scrubbed environment, isolated "
          "Python, no network, no writes outside its folder, no reads outside the system's folders and what it "
          "runs, its own processes only, where the host allows it, memory, file and time limits, its processes "
          "killed at the end; --no-run skips it")
# the top-level entries of / the code sees: the system's (/nix and /snap hold installed programs, an interpreter among
# them, world-readable by design); every other one (/work, /opt, /srv, /mnt, /var, a file; /run: sockets, secrets)
# is hidden, what the run needs bound back
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "sys", "nix", "snap")
# hidden in the system's: ssh's keys, shared memory (a scratch folder, a clone), the nix daemon's socket and
# profiles (its store stays), git's system config (a credential helper, a token in an `http.extraHeader`: the box
# runs no git); a file is covered by /dev/null
HIDDEN = ("/etc/ssh", "/dev/shm", "/nix/var", "/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/gitconfig")
# the site's pip config files (pip reads them wherever HOME is; one may hold an index URL's credentials): hidden but
# where the box runs pip (``Sealed(pip=True)``)
SITE_PIP = ("/etc/pip.conf", "pip/pip.conf")  # the second under each of $XDG_CONFIG_DIRS (/etc/xdg)
# bytes: of data a process (the tier on v0.5.23, torch CPU and sglang's modules: fails at 512 MiB, passes at 768),
# of a file it writes, of its stdout and of its stderr read back
MEMORY, FILES, OUTPUT = 8 << 30, 256 << 20, 16 << 20
# processes and threads in the box (torch starts a thread a core in each of the tier's three processes)
PROCS = max(4096, 16 * (os.cpu_count() or 1))
# the last line of a process out of memory (Python's, C++'s, ENOMEM's)
_NOMEM = re.compile(r"^MemoryError\b|std::bad_alloc|Cannot allocate memory")
# loopback up where ``ip`` is (``$0``: offline), then the command
_RUN = 'unset PWD OLDPWD SHLVL _; [ "$0" = offline ] && command -v ip >/dev/null && ip link set lo up\n'
# the seal, run in a fresh user and mount (and pid, and network) namespace: each ``writable`` folder (``$1`` ... up
# to ``--``) bound on itself; each place to hide (after the ``readable`` folders, up to ``--``; outermost first): a
# file covered by /dev/null, a folder by an empty tmpfs, made aside and moved in, with the folders kept beneath it
# bound back; every other mount remounted read-only; a fresh /proc, read-only, where it is the pid namespace's first
# process; then ``_RUN`` with no capabilities (it cannot remount), waited for there (all else dies when it exits)
_SEAL = r"""w='
'
while [ "$1" != -- ]; do mount -n --bind "$1" "$1" || exit 125; w="$w$1
"; shift; done; shift
k=$w
while [ "$1" != -- ]; do k="$k$1
"; shift; done; shift
n=0; set -f; IFS='
'
while [ "$1" != -- ]; do
  h=$1; shift
  if [ ! -d "$h" ]; then [ ! -e "$h" ] || mount -n --bind /dev/null "$h" || exit 125; continue; fi
  n=$((n+1)); s="$HOME/.seal/$n"; mkdir -p "$s" && mount -n -t tmpfs -o mode=755 c128box "$s" || exit 125
  for p in $k; do case "$p" in "$h"|"$h"/*) mkdir -p "$s${p#"$h"}" && mount -n --bind "$p" "$s${p#"$h"}" || exit 125;;
  esac; done
  mount -n --move "$s" "$h" || exit 125
done; shift; unset IFS
while read -r _ _ _ _ mp _; do
  mp=$(printf '%b' "$mp"); [ -e "$mp" ] || continue  # (a mount in a hidden place)
  case "$w" in *"
$mp
"*) continue;; esac
  mount -n -o remount,bind,ro "$mp" 2>/dev/null || { echo "c128box: cannot make $mp read-only" >&2; exit 125; }
done </proc/self/mountinfo
[ $$ != 1 ] || mount -n -t proc -o ro,nosuid,nodev,noexec c128box /proc || exit 125
""" + _RUN + 'set -- setpriv --bounding-set=-all --inh-caps=-all -- "$@"; [ $$ = 1 ] || exec "$@"; "$@"'


def _sealed(argv: list[str], writable: list[str], offline: bool, readable: list[str] = (),
            hidden: list[str] | None = None, pids: bool = False) -> list[str]:
    """``argv`` in the seal (``offline``: in its own network namespace too; ``pids``: in its own pid and IPC
    namespaces); ``hidden``: the places to hide (``None``: none), ``readable`` kept in them (``writable`` too)."""
    if odd := next((p for p in (*writable, *readable, *(hidden or ())) if "\n" in p), None):
        # the seal's lists are lines: one split there kept a part of it, or hid nothing (reads NOT confined, said
        # with a false reason)
        raise C128Error(f"the sealed box cannot name the folder {odd!r}: it holds a newline (from TMPDIR, HOME, "
                        "XDG_CACHE_HOME, C128PATCH_CACHE, LD_LIBRARY_PATH, CUDA_HOME or a path given); use one without")
    # (--kill-child: the namespace's first process, the seal's shell, dies with ``unshare``, which dies with us
    # (``Group``): without it a SIGKILLed watch left the shell and pip running for good)
    ns = [*(["--pid", "--fork", "--kill-child", "--ipc"] if pids else []), *(["--net"] if offline else [])]
    return ["unshare", "--user", "--map-root-user", "--mount", *ns, "sh", "-c", _SEAL, "offline" if offline else "sh",
            *writable, "--", *readable, "--", *(hidden or ()), "--", *argv]


def _hidden(*more: str) -> list[str]:
    """The places to hide, outermost first: each top-level entry of / but ``SYSTEM`` (and a link into it),
    ``HIDDEN``, the operator's ``HOME``, temporary folder and cache."""
    system = [Path(os.path.realpath(f"/{name}")) for name in SYSTEM]
    top = {p for e in os.scandir("/") if e.name not in SYSTEM
           if not any(Path(p := os.path.realpath(e.path)).is_relative_to(s) for s in system)}
    mine = [os.environ.get(k) for k in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "C128PATCH_CACHE")]
    return sorted(({os.path.realpath(p) for p in (*HIDDEN, *mine, tempfile.gettempdir(), *more) if p} | top) - {"/"},
                  key=lambda p: (p.count("/"), p))


def _site_pip() -> list[str]:
    """The site's pip config files (``SITE_PIP``)."""
    dirs = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    return [SITE_PIP[0], *(os.path.join(d, SITE_PIP[1]) for d in dirs if os.path.isabs(d))]


def _kept(python: str, folders: tuple[str, ...]) -> list[str]:
    """The folders the run reads: ``folders``; the interpreter's prefixes (the named path's, the real one's and, of a
    venv, its base's: ``home`` in ``pyvenv.cfg``, a copy's too); the libraries ``LD_LIBRARY_PATH`` and ``CUDA_HOME``
    name; the folder ``/etc/resolv.conf`` resolves into (on ``/run`` with systemd: pip's DNS)."""
    bins = {os.path.dirname(p) for p in (os.path.abspath(python), os.path.realpath(python))}
    for cfg in [Path(b).parent / "pyvenv.cfg" for b in bins]:
        try:
            home = re.search(r"^home\s*=\s*(.+?)\s*$", cfg.read_text(errors="replace"), re.M)
        except OSError:
            continue
        bins |= {home[1], os.path.realpath(home[1])} if home else set()
    libs = [p for p in (*os.environ.get("LD_LIBRARY_PATH", "").split(":"), os.environ.get("CUDA_HOME", ""))
            if os.path.isabs(p)]
    return sorted({os.path.realpath(p) for p in (*folders, *(str(Path(b).parent) for b in bins), *libs,
                                                 os.path.dirname(os.path.realpath("/etc/resolv.conf")))
                   if os.path.isdir(p)})


def _limited(argv: list[str], memory: int, files: int) -> list[str]:
    """``argv`` under ``prlimit``: ``memory`` bytes of data a process, ``files`` bytes a file (no more than the hard
    limits we run under: those we cannot raise)."""
    return ["prlimit", f"--data={_capped(resource.RLIMIT_DATA, memory)}",
            f"--fsize={_capped(resource.RLIMIT_FSIZE, files)}", "--", *argv]


def _capped(limit: int, n: int) -> int:
    """``n``, no more than the hard ``limit`` we run under (which we cannot raise)."""
    hard = resource.getrlimit(limit)[1]
    return n if hard == resource.RLIM_INFINITY else min(n, hard)


def _size(n: int) -> str:
    return f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):g} MiB"


def _probe(argv: list[str]) -> str:
    """What went wrong running ``argv`` (a probe of the seal), "" if nothing."""
    try:
        return run_child(argv, 10)[1]
    except C128Error as exc:
        return exc.message


@functools.cache
def _cuts() -> tuple[str, str, str, str]:
    """("", "", "", "") where the seal holds here (a write outside its folder refused, a file in a hidden place unseen,
    a pid namespace of its own), else why not: (writes, reads, network, processes)."""
    with procs.scratch("c128box-probe-") as tmp:
        inside, outside = (os.path.join(os.path.realpath(tmp), n) for n in ("in", "out"))
        os.mkdir(inside), os.mkdir(outside)
        Path(outside, "secret").write_text("")
        probe = ['sh', '-c', 'touch "$1/x" && ! touch "$2/x" 2>/dev/null || { echo "a write outside was not refused"'
                 ' >&2; exit 1; }; [ "$3" = writes ] || [ ! -e "$2/secret" ] || { echo "a hidden file was seen" >&2;'
                 ' exit 1; }; [ -z "$4" ] || [ "$(readlink /proc/self/ns/pid)" != "$4" ] || { echo "its pid '
                 'namespace was the operator\'s" >&2; exit 1; }', 'sh', inside, outside]
        ours = os.readlink("/proc/self/ns/pid")
        pids = _probe(_sealed([*probe, "reads", ours], [inside], True, [], _hidden(outside), pids=True))
        if not pids:
            return "", "", "", ""
        reads = _probe(_sealed([*probe, "reads", ""], [inside], True, [], _hidden(outside)))
        writes = reads and _probe(_sealed([*probe, "writes", ""], [inside], True))
        net = _probe(["unshare", "--user", "--map-root-user", "--net", "true"]) if writes else ""
        return (writes and f"no mount namespace or read-only remount here ({writes})",
                reads and f"no mount namespace or empty mounts here ({reads})", net and f"no network namespace here "
                f"({net})", f"no pid namespace with a fresh /proc here ({pids})")


def isolation() -> str:
    """What the box cuts off here, or why it cannot (said in the tier's output)."""
    writes, reads, net, pids = _cuts()
    said = ["writes only to its own folders (every other mount read-only)" if not writes else
            f"writes NOT confined: {writes}",
            "reads only the system's folders and what it runs (HOME, /tmp, /work, /opt, the cache, /etc's secrets "
            "and every other top-level folder hidden)" if not reads else f"reads NOT confined: {reads}",
            "its own processes only (a pid namespace: it sees and signals none of the operator's, all it forks die "
            "with it; an IPC namespace: none of their System V shared memory, semaphores or queues)" if not pids
            else f"processes NOT isolated: {pids}",
            "no count of its processes (no user namespace here)" if writes and net else
            "no count of its processes (the kernel exempts root from it)" if os.geteuid() == 0 else
            f"at most {_capped(resource.RLIMIT_NPROC, PROCS)} processes and threads at once",
            "no network (loopback only)" if not net else f"network NOT cut off: {net}"]
    return "; ".join(said)


def interpreter(python: str, tree: Path | None = None, given: str = "--python ") -> str:
    """``--python``: a path from the current folder, a bare name on PATH; never a program inside ``tree``
    (``given``: how the operator named it, for the message: ``C128PATCH_TIER_PYTHON=``)."""
    found = os.path.abspath(python) if "/" in python else shutil.which(python)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise C128Error(f"{given}{python}: no such interpreter (a path is taken from {Path.cwd()}, a name from PATH)")
    if tree is not None and any(Path(p).is_relative_to(t) for p in (found, os.path.realpath(found))
                                for t in (os.path.abspath(tree), os.path.realpath(tree))):
        raise C128Error(f"{given}{python} lies inside the target tree {tree}: it would run the tree's own program; "
                        "pass an interpreter outside it")
    if tree is not None and _linked_into(os.path.realpath(found), Path(tree)):
        raise C128Error(f"{given}{python} is a hard link to a file of the target tree {tree}: it would run the "
                        "tree's own program; pass an interpreter outside it")
    return found


def _linked_into(path: str, tree: Path) -> bool:
    """Is ``path`` a hard link to a file of ``tree`` (only looked for where the file has other links: rare)."""
    st = os.stat(path)
    if st.st_nlink < 2:
        return False
    for folder, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            try:
                other = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return True
    return False


class Flooded(C128Error):
    """Its output past the box's limit: the target's defect (``fit.treecheck``: failed, never unchecked)."""


class TimedOut(C128Error):
    """Past the box's time limit: a slow host as well as a hang (``fit.treecheck``: unchecked, never failed)."""


class Sealed:
    """``python -I -B ARGS`` started in the box; ``wait`` gives (stdout, stderr); ``kill`` ends its whole group."""

    def __init__(self, python: str, args: list[str], timeout: float, *, env: dict[str, str] | None = None,
                 offline: bool = False, writable: tuple[str, ...] = (), readable: tuple[str, ...] = (),
                 memory: int = MEMORY, files: int = FILES, output: int = OUTPUT, procs: int = PROCS,
                 pip: bool = False) -> None:
        """``env``: variables the caller adds (the operator's, never the target's); ``offline``: no network;
        ``writable``: folders besides its ``HOME`` it may write (the operator's scratch, never the target's);
        ``readable``: folders in hidden places it reads (the target's tree, the tool's files it runs; the
        interpreter's prefixes are kept); ``memory``: bytes of data each of its processes may hold; ``files``: bytes
        of a file it writes (its output included); ``output``: bytes of its stdout and of its stderr read back;
        ``procs``: processes and threads it may run at once, counted in its own user namespace (set there, so the
        operator's other processes do not count; the kernel exempts root), where the host gives it one; ``pip``: it
        runs pip, which reads the site's pip config files (else hidden: ``SITE_PIP``)."""
        self.timeout, self.memory, self.files, self.output = timeout, memory, files, output
        writes, reads, net, pids = _cuts()  # (before its folder is made: a refusal there leaves none)
        self.home = Path(scratch_dir("c128box-"))  # (a SIGKILLed run's swept by pid)
        scrubbed = {k: os.environ[k] for k in KEEP if k in os.environ} | (env or {})
        scrubbed.update(HOME=str(self.home), TMPDIR=str(self.home))
        self.out, self.err = (open(self.home / name, "w+b") for name in (".stdout", ".stderr"))  # noqa: SIM115
        # a tree's __pycache__ may hold an unchecked-hash .pyc that Python runs instead of its source (-B only stops
        # writes): every hash-based one is checked against its source (helper 100)
        argv = [python, "-I", "-B", "--check-hash-based-pycs", "always", *args]
        self.pids = not pids  # its own pid namespace (only with the whole seal)
        if not writes or (offline and not net):  # in a user namespace of its own
            argv = ["prlimit", f"--nproc={_capped(resource.RLIMIT_NPROC, procs)}", "--", *argv]
        if not writes:
            kept, hidden = _kept(python, readable), None if reads else _hidden(*([] if pip else _site_pip()))
            if whole := sorted(set(kept) & set(hidden or ())):  # the seal shows what it keeps inside a hidden place
                self.kill()
                raise C128Error(f"the sealed box would have to show all of {whole[0]}, a place it hides (HOME, the "
                                f"temporary folder or a top-level folder), to run {python}: {whole[0]} is itself a "
                                "folder it needs (the interpreter's prefix, two folders above it; a folder in "
                                "LD_LIBRARY_PATH or one a pip setting names): keep that folder one level deeper (a "
                                f"Python at {Path(whole[0]) / 'py' / 'bin' / 'python'} has its prefix at "
                                f"{Path(whole[0]) / 'py'})")
            try:
                argv = _sealed(argv, [os.path.realpath(p) for p in (self.home, *writable)], offline, kept, hidden,
                               self.pids)
            except C128Error:
                self.kill()
                raise
        elif offline and not net:  # the network cut off, the writes not
            argv = ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", _RUN + 'exec "$@"', "offline", *argv]
        try:
            self.proc = Group(_limited(argv, memory, files), env=scrubbed, stdin=subprocess.DEVNULL, stdout=self.out,
                              stderr=self.err, cwd=self.home)
        except OSError as exc:
            self.kill()
            raise C128Error(f"the target's code did not run: {exc}") from None

    @property
    def returncode(self) -> int:
        """Its exit status, negative for the signal that ended it (which a pid namespace's first process, a shell,
        says as 128 + the signal)."""
        code = self.proc.returncode
        return 128 - code if self.pids and 128 < code <= 128 + 64 else code

    def _read(self, f: IO[bytes], name: str) -> str:
        """What it wrote to ``name``; past ``output`` (or cut off at ``files``), a one-line error."""
        size = os.fstat(f.fileno()).st_size
        if size > self.output or size >= self.files:
            raise Flooded(f"the target's code wrote more than {_size(min(self.output, self.files))} to its {name} "
                            "(the box's limit): none of it is taken")
        f.seek(0)
        return f.read(size).decode(errors="replace")

    def wait(self) -> tuple[str, str]:
        """What it printed, once it exits (not its children: they are killed); past the time limit, past the output
        limit, or out of memory (a failure whose last line says so), an error."""
        try:
            self.proc.wait(timeout=self.timeout)
            out, err = self._read(self.out, "stdout"), self._read(self.err, "stderr")
            last = ([ln.strip() for ln in err.splitlines() if ln.strip()] or [""])[-1]
            if self.returncode and _NOMEM.search(last):
                raise C128Error(f"the target's code ran out of memory (the box allows {_size(self.memory)} of data a "
                                f"process): {last[:200]}")
            return out, err
        except subprocess.TimeoutExpired:
            raise TimedOut(f"the target's code did not finish in {self.timeout:g} s") from None
        finally:
            self.kill()

    def kill(self) -> None:
        """Its process group killed (the leader's forks too), its files and ``HOME`` removed."""
        if hasattr(self, "proc"):
            self.proc.end()
        for f in (self.out, self.err):
            f.close()
        shutil.rmtree(self.home, ignore_errors=True)
