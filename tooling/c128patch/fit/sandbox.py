"""The sealed box every run of a target's code goes through (the behavioural tier, the tier's environment build):
an allow-listed environment (no tokens, ``HOME`` a fresh folder), isolated Python (``-I``: no current folder, user
site or ``PYTHON*`` variables on the path), a time limit, and its own process group, killed whole on exit (a child
it forks does not outlive it). Where the host allows unprivileged user and mount namespaces, the places secrets live
(the operator's ``HOME``, ``/root``, ``/home``, ``/tmp``, the cache, ``/etc``'s password and ssh files) are hidden
under empty mounts but for what the run needs (its folders, the interpreter's prefix, the folders the caller names:
``readable``), every mount is made read-only but ``HOME`` and the folders the caller names (``writable``), and the
code runs with no capabilities (it cannot remount); ``offline``: no network but loopback. ``isolation`` says what the
box cuts off here, and what not."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from c128patch.errors import C128Error
from c128patch.procs import Group
from c128patch.smoke.device import run_child

# the environment the box keeps; the rest (tokens, credentials, PYTHON*) is dropped
KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES")
NOTICE = ("runs the target tree's code (imports its modules) in a sealed box: scrubbed environment, isolated "
          "Python, no network, no writes outside its folder, no reads of HOME, /tmp or secrets where the host "
          "allows it, a time limit, its processes killed at the end; --no-run skips it")
# hidden from the code (an empty mount over each, what it needs bound back): where secrets and other clones live
HIDDEN = ("/root", "/home", "/tmp", "/var/tmp", "/run/user", "/etc/ssh")
SECRET_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")
# loopback up where ``ip`` is (``$0``: offline), then the command
_RUN = 'unset PWD OLDPWD SHLVL _; [ "$0" = offline ] && command -v ip >/dev/null && ip link set lo up\n'
# the seal, run in a fresh user and mount (and network) namespace: each ``writable`` folder (``$1`` ... up to ``--``)
# bound on itself; each place to hide (after the ``readable`` folders, up to ``--``; outermost first) covered by an
# empty tmpfs, made aside and moved in, with the folders kept beneath it bound back; each secret file covered by
# /dev/null; every other mount remounted read-only; then ``_RUN`` with no capabilities (it cannot remount)
_SEAL = r"""w='
'
while [ "$1" != -- ]; do mount --bind "$1" "$1" || exit 125; w="$w$1
"; shift; done; shift
k=$w
while [ "$1" != -- ]; do k="$k$1
"; shift; done; shift
n=0; set -f; IFS='
'
while [ "$1" != -- ]; do
  h=$1; shift; [ -d "$h" ] || continue
  n=$((n+1)); s="$HOME/.seal/$n"; mkdir -p "$s" && mount -t tmpfs -o mode=755 c128box "$s" || exit 125
  for p in $k; do case "$p" in "$h"|"$h"/*) mkdir -p "$s${p#"$h"}" && mount --bind "$p" "$s${p#"$h"}" || exit 125;;
  esac; done
  mount --move "$s" "$h" || exit 125
done; shift; unset IFS
while [ "$1" != -- ]; do [ ! -f "$1" ] || mount --bind /dev/null "$1" || exit 125; shift; done; shift
while read -r _ _ _ _ mp _; do
  mp=$(printf '%b' "$mp"); [ -e "$mp" ] || continue  # (a mount in a hidden place)
  case "$w" in *"
$mp
"*) continue;; esac
  mount -o remount,bind,ro "$mp" 2>/dev/null || { echo "c128box: cannot make $mp read-only" >&2; exit 125; }
done </proc/self/mountinfo
""" + _RUN + 'exec setpriv --bounding-set=-all --inh-caps=-all -- "$@"'


def _sealed(argv: list[str], writable: list[str], offline: bool, readable: list[str] = (),
            hidden: list[str] | None = None) -> list[str]:
    """``argv`` in the seal (``offline``: in its own network namespace too); ``hidden``: the places to hide (``None``:
    none, nor the secret files), ``readable`` kept in them (``writable`` too)."""
    net = ["--net"] if offline else []
    hide = [] if hidden is None else [*readable, "--", *hidden, "--", *SECRET_FILES]
    return ["unshare", "--user", "--map-root-user", "--mount", *net, "sh", "-c", _SEAL, "offline" if offline else "sh",
            *writable, "--", *(hide or ["--", "--"]), "--", *argv]


def _hidden(*more: str) -> list[str]:
    """The places to hide, outermost first: ``HIDDEN``, the operator's ``HOME``, temporary folder and cache."""
    mine = [os.environ.get(k) for k in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "C128PATCH_CACHE")]
    return sorted({os.path.realpath(p) for p in (*HIDDEN, *mine, tempfile.gettempdir(), *more) if p} - {"/"},
                  key=lambda p: (p.count("/"), p))


def _kept(python: str, folders: tuple[str, ...]) -> list[str]:
    """The folders the run reads: ``folders`` and the interpreter's prefix (the named path's and the real one's)."""
    prefixes = {str(Path(p).parent.parent) for p in (os.path.abspath(python), os.path.realpath(python))}
    return sorted({os.path.realpath(p) for p in (*folders, *prefixes) if os.path.isdir(p)})


def _probe(argv: list[str]) -> str:
    """What went wrong running ``argv`` (a probe of the seal), "" if nothing."""
    try:
        return run_child(argv, 10)[1]
    except C128Error as exc:
        return exc.message


@functools.cache
def _cuts() -> tuple[str, str, str]:
    """("", "", "") where the seal holds here (a write outside its folder refused, a file in a hidden place unseen),
    else why not: (writes, reads, network)."""
    with tempfile.TemporaryDirectory(prefix="c128box-probe-") as tmp:
        inside, outside = (os.path.join(os.path.realpath(tmp), n) for n in ("in", "out"))
        os.mkdir(inside), os.mkdir(outside)
        Path(outside, "secret").write_text("")
        probe = ['sh', '-c', 'touch "$1/x" && ! touch "$2/x" 2>/dev/null || { echo "a write outside was not refused"'
                 ' >&2; exit 1; }; [ "$3" = writes ] || [ ! -e "$2/secret" ] || { echo "a hidden file was seen" >&2;'
                 ' exit 1; }', 'sh', inside, outside]
        reads = _probe(_sealed([*probe, "reads"], [inside], True, [], _hidden(outside)))
        if not reads:
            return "", "", ""
        writes = _probe(_sealed([*probe, "writes"], [inside], True))
        net = _probe(["unshare", "--user", "--map-root-user", "--net", "true"]) if writes else ""
        return (writes and f"no mount namespace or read-only remount here ({writes})",
                f"no mount namespace or empty mounts here ({reads})", net and f"no network namespace here ({net})")


def isolation() -> str:
    """What the box cuts off here, or why it cannot (said in the tier's output)."""
    writes, reads, net = _cuts()
    said = ["writes only to its own folders (every other mount read-only)" if not writes else
            f"writes NOT confined: {writes}",
            "no reads of HOME, /root, /home, /tmp, the cache or /etc's secrets (only what it runs kept)"
            if not reads else f"reads NOT confined: {reads}",
            "no network (loopback only)" if not net else f"network NOT cut off: {net}"]
    return "; ".join(said)


def interpreter(python: str, tree: Path | None = None) -> str:
    """``--python``: a path from the current folder, a bare name on PATH; never a program inside ``tree``."""
    found = os.path.abspath(python) if "/" in python else shutil.which(python)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise C128Error(f"--python {python}: no such interpreter (a path is taken from {Path.cwd()}, a name from PATH)")
    if tree is not None and any(Path(p).is_relative_to(t) for p in (found, os.path.realpath(found))
                                for t in (os.path.abspath(tree), os.path.realpath(tree))):
        raise C128Error(f"--python {python} lies inside the target tree {tree}: it would run the tree's own program; "
                        "pass an interpreter outside it")
    return found


class Sealed:
    """``python -I -B ARGS`` started in the box; ``wait`` gives (stdout, stderr); ``kill`` ends its whole group."""

    def __init__(self, python: str, args: list[str], timeout: float, *, env: dict[str, str] | None = None,
                 offline: bool = False, writable: tuple[str, ...] = (), readable: tuple[str, ...] = ()) -> None:
        """``env``: variables the caller adds (the operator's, never the target's); ``offline``: no network;
        ``writable``: folders besides its ``HOME`` it may write (the operator's scratch, never the target's);
        ``readable``: folders in hidden places it reads (the target's tree; the interpreter's prefix is kept)."""
        self.timeout = timeout
        self.home = Path(tempfile.mkdtemp(prefix="c128box-"))
        scrubbed = {k: os.environ[k] for k in KEEP if k in os.environ} | (env or {})
        scrubbed.update(HOME=str(self.home), TMPDIR=str(self.home))
        self.out, self.err = (open(self.home / name, "w+b") for name in (".stdout", ".stderr"))  # noqa: SIM115
        argv = [python, "-I", "-B", *args]
        writes, reads, net = _cuts()
        if not writes:
            hidden = None if reads else _hidden()
            argv = _sealed(argv, [os.path.realpath(p) for p in (self.home, *writable)], offline,
                           _kept(python, readable), hidden)
        elif offline and not net:  # the network cut off, the writes not
            argv = ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", _RUN + 'exec "$@"', "offline", *argv]
        try:
            self.proc = Group(argv, env=scrubbed, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err,
                              cwd=self.home)
        except OSError as exc:
            self.kill()
            raise C128Error(f"the target's code did not run: {exc}") from None

    def wait(self) -> tuple[str, str]:
        """What it printed, once it exits (not its children: they are killed); past the limit, an error."""
        try:
            self.proc.wait(timeout=self.timeout)
            for f in (self.out, self.err):
                f.seek(0)
            return self.out.read().decode(errors="replace"), self.err.read().decode(errors="replace")
        except subprocess.TimeoutExpired:
            raise C128Error(f"the target's code did not finish in {self.timeout:g} s") from None
        finally:
            self.kill()

    def kill(self) -> None:
        """Its process group killed (the leader's forks too), its files and ``HOME`` removed."""
        if hasattr(self, "proc"):
            self.proc.end()
        for f in (self.out, self.err):
            f.close()
        shutil.rmtree(self.home, ignore_errors=True)
