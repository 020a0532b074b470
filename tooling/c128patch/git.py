"""A thin wrapper over the git command line: git does the work."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.textsafe import shell_join, shell_quote

# Fixed identity and environment so that commits we make are reproducible.
BOT_NAME = "c128patch"
BOT_EMAIL = "c128patch@noreply.invalid"

# docs/security.md: the tool's own git calls run no program that a config names and sign nothing,
# whoever set it (a repository's config, the operator's, or a series that tried to write one).
UNION_AS_TEXT = "git merge-file --marker-size=%L %A %O %B"
FORCED_CONFIG = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", os.devnull),
    # no attributes file of the operator's ($XDG_CONFIG_HOME/git/attributes: `* -diff` made refresh write binary
    # hunks, `eol=crlf` a tree of CRLF files); GIT_ATTR_NOSYSTEM below for the system's
    ("core.attributesFile", os.devnull),
    # a patch applies as it is: `apply.whitespace=fix` with `core.whitespace=indent-with-non-tab` made `am` indent the
    # series' Python with tabs, then "identical to a fresh apply"; `error-all` made every entry a conflict
    ("apply.whitespace", "warn"), ("apply.ignoreWhitespace", "no"),
    ("core.safeCRLF", "false"),  # (with core.autocrlf=true, `add` of an overlay died: "LF would be replaced by CRLF")
    # the tool's commits are the same whatever the tree's config: `i18n.commitEncoding` wrote an `encoding` header
    # (other ids); `commit.cleanup=strip` with `core.commentChar=C`, or `trailer.ifExists=replace`/`trailer.where`,
    # dropped or moved the entry trailer `commit --trailer` adds (apply refused its own commit); `am.threeWay` made its
    # loose retry a 3-way merge
    ("i18n.commitEncoding", "UTF-8"), ("commit.cleanup", "default"), ("core.commentChar", "#"),
    ("trailer.where", "end"), ("trailer.ifExists", "addIfDifferentNeighbor"), ("trailer.ifMissing", "add"),
    ("trailer.separators", ":"), ("am.threeWay", "false"), ("am.keepCR", "false"), ("mailinfo.scissors", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("rerere.enabled", "false"),
    ("am.messageId", "false"),
    ("maintenance.auto", "false"),  # no `git maintenance run --auto` after each of its commits (3 ms each)
    ("log.showSignature", "false"),  # a signed commit in a log would run the config's gpg program
    ("merge.verifySignatures", "false"),
    ("gpg.program", "false"), ("gpg.ssh.program", "false"), ("gpg.x509.program", "false"),
    # never into a submodule's work tree, where its own config's filters run: a checkout's, a diff's inside a command
    # (a submodule's own ``ignore`` setting beats the second: _NO_PROGRAMS, Git._submodules_still)
    ("submodule.recurse", "false"), ("diff.ignoreSubmodules", "dirty"),
    # the diffs it parses and the patches refresh writes: git's defaults, whatever the repository's config says
    ("diff.noprefix", "false"), ("diff.mnemonicPrefix", "false"), ("diff.srcPrefix", "a/"), ("diff.dstPrefix", "b/"),
    ("diff.context", "3"), ("diff.interHunkContext", "0"), ("diff.algorithm", "myers"),
    ("diff.indentHeuristic", "true"), ("diff.suppressBlankEmpty", "false"), ("diff.relative", "false"),
    ("color.ui", "false"), ("color.diff", "false"),
    # a 3-way merge (am -3, apply --3way) is git's text merge whatever a tree's attributes say: `merge=union` in an
    # upstream's .gitattributes turned a conflict into both sides kept, reported applied and proven identical;
    # git looks a driver up in the config before its built-ins, and `merge-file` is the text merge itself
    ("merge.default", "text"), ("merge.union.driver", UNION_AS_TEXT),
)
# Test hook (as ops.treestate's C128PATCH_FAULT): a folder of hooks the tool's git runs instead of none,
# so that a test can interrupt inside git itself. Unset (always, outside tests), no hook runs.
FAULT_HOOKS_ENV = "C128PATCH_FAULT_HOOKS"
# Of the operator's GIT_* variables only these reach git (transport, tracing): the tool names its repository, index
# and identity itself (git sets GIT_DIR/GIT_INDEX_FILE for hooks, where it may run); git's test knobs never
# (GIT_TEST_ASSUME_DIFFERENT_OWNER=1 made every repository "owned by another user")
_KEPT_ENV = ("GIT_TRACE", "GIT_SSH", "GIT_ASKPASS", "GIT_SSL_", "GIT_HTTP_", "GIT_PROXY_", "GIT_CURL_",
             "GIT_CEILING_DIRECTORIES", "GIT_DISCOVERY_ACROSS_FILESYSTEM",
             "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM")
# the variables that name a program git runs (or a config file that may name one): only a clone or fetch keeps them,
# and only as an absolute path or a bare name looked up on PATH: git runs in the tree, where a relative one
# (`GIT_SSH=./x`) is the tree's own program (GIT_EXEC_PATH, which git puts first on PATH, is never kept)
_PROGRAM_ENV = ("GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS", "GIT_PROXY_COMMAND", "GIT_CONFIG_GLOBAL",
                "GIT_CONFIG_SYSTEM")
# git subcommands that keep the operator's global and system config (proxies, credentials, insteadOf)
_TRANSPORT = ("clone", "fetch", "ls-remote")
# every other call reaches no remote: a partial clone's lazy fetch of an object it lacks ran the program its config
# names for its promisor remote (`remote.<name>.uploadpack`, `core.sshCommand`); the command line's setting beats the
# repository's `protocol.<name>.allow` (GIT_NO_LAZY_FETCH: git >= 2.45 only)
_NO_REMOTE = (*(f"protocol.{p}.allow=never" for p in ("file", "git", "ssh", "http", "https", "ext")),
              "protocol.allow=never")
_PROMISOR = r"^extensions\.partialclone$|^remote\..+\.promisor$"
# options that keep a diff from running a program the config names (an external diff, a textconv filter), or git in a
# submodule's work tree (the option beats the submodule's own ``ignore`` setting, which beats diff.ignoreSubmodules)
_NO_PROGRAMS = {"diff": ("--no-ext-diff", "--no-textconv", "--ignore-submodules=dirty"),
                **dict.fromkeys(("log", "show", "range-diff"), ("--no-ext-diff", "--no-textconv")),
                "blame": ("--no-textconv",),
                **dict.fromkeys(("status", "diff-index", "diff-files"), ("--ignore-submodules=dirty",))}
# a sparse checkout's `add` (git >= 2.34) refuses a path outside its cone (an overlay, the provenance): apply stopped
# half done; `-c` here, not FORCED_CONFIG: a checkout would fill the tree in
_PER_COMMAND = {"add": ("core.sparseCheckout=false",)}
# the untimed calls that may run long and write a tree, a pack or refs: killed when the tool dies, even by SIGKILL
# (``procs.dying``, no preexec_fn): a SIGKILLed run's checkout wrote on into the folder the next run sweeps. Only
# these: the prefix costs a call two more execs (~1-1.5 ms of CPU, measured), and `check` makes 35 short ones a rev
_LONG = frozenset(("clone", "fetch", "checkout", "checkout-index", "read-tree", "reset", "am", "stash",
                   "clean", "worktree", "gc", "repack", "index-pack", "merge", "cherry-pick", "rebase", "archive"))
_DRIVERS = re.compile(r"^(filter|merge|diff)\.(.+)\.(clean|smudge|process|driver|textconv)$")
# another file the config includes: the check below sees .git/config change, never that file (a checkout may write
# it, a branch may turn it on)
_INCLUDES = r"^include\.path$|^includeif\..+\.path$"
_TRAILERS = re.compile(r"^trailer\..+\.(command|cmd)$")  # a program `commit --trailer` runs
# a trailer setting git applies to the tool's own (`C128patch-Entry`): its name or its key starts with the token
_OUR_TRAILER = re.compile(r"^trailer\.(?:c128patch-[^\n]*\.[a-z]+\n.*|[^\n]+\.key\nc128patch-.*)$", re.I | re.S)
_FILTERS: dict[tuple, tuple[list[str], str]] = {}  # (cwd, git dir, config stamp) -> (-c settings, refusal)
_DUBIOUS = re.compile(r"detected dubious ownership in repository at '([^']+)'")


# git's own folder under any spelling a file system may fold to it: case, trailing dots and spaces,
# the 8.3 short name, the code points HFS+ ignores.
_GIT_DIRS = (".git", "git~1")
_HFS_IGNORED = dict.fromkeys([*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])


@functools.lru_cache(maxsize=4096)  # a series' paths share their folders: status checks ~1000 parts
def folded_name(part: str) -> str:
    """A file name as case-folding, dot-trimming file systems (NTFS: ``.git::$INDEX_ALLOCATION``) may see it; its
    compatibility forms folded too (NFKC: a full-width ``．git``, ``﹒git``, a one-dot leader ``․git``), upper-cased
    before the fold as NTFS compares names (its ``$UpCase``: the dotless ``ı`` is ``I`` there, so ``.gıt`` opened
    ``.git``; casefold alone keeps ``ı``, and ``.gıt/config`` passed every rule, helper 175)."""
    folded = unicodedata.normalize("NFKC", part.translate(_HFS_IGNORED)).upper().casefold()
    return folded.split(":", 1)[0].rstrip(" .")


def is_git_dir_name(part: str) -> bool:
    """Is ``part`` a name under which a file system may open git's own folder?"""
    return folded_name(part) in _GIT_DIRS


def ls_tree(git: "Git", treeish: str, paths: list[str], *flags: str) -> dict[str, tuple[str, ...]]:
    """path -> (mode, type, object id) of ``git ls-tree FLAGS TREEISH -- PATHS`` ({} for no paths)."""
    lines = git.out("ls-tree", *flags, treeish, "--", *paths).splitlines() if paths else []
    return {name: tuple(meta.split()) for meta, name in (line.split("\t", 1) for line in lines)}


def blob_id(data: bytes) -> str:
    """git's blob id of ``data`` (what ``git hash-object`` prints), without writing it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 (git's id, not security)


# a patch's ``diff --git`` line, its paths plain (``a/x b/x``) or C-quoted (``"a/\303\251" "b/\303\251"``)
_QUOTED = r'"{0}/(?P<q{0}>(?:[^"\\]|\\.)*)"'
DIFF_HEADER = re.compile(rf"^diff --git (?:a/(?P<a>.*?)|{_QUOTED.format('a')}) (?:b/(?P<b>.*)|{_QUOTED.format('b')})$",
                         re.M)
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def stripspace(message: str) -> str:
    """``message`` as ``git commit -m`` stores it (``commit.cleanup=default`` without an editor: git's ``stripspace``
    without comments): each line's trailing spaces, tabs and CRs dropped, runs of empty lines made one, leading and
    trailing ones dropped, every line ended by a newline; "" for one of empty lines only (``git commit`` refuses it).
    For ``commit-tree`` to make the very commit ``commit -m`` makes (tests/test_apply_commits.py)."""
    out: list[str] = []
    empties = 0
    for line in message.split("\n"):
        line = line.rstrip(" \t\r")  # (git's isspace: \v and \f are not spaces to it)
        if not line:
            empties += 1
            continue
        if empties and out:
            out.append("")
        out.append(line)
        empties = 0
    return "".join(f"{line}\n" for line in out)


def header_path(match: re.Match) -> str:
    """The new path of a ``DIFF_HEADER`` match, unquoted."""
    if match["b"] is None:
        return unquote(f'"{match["qb"]}"')
    rest = match[0].removeprefix("diff --git ")  # "a/X b/X": X may hold " b/" (no renames: both halves alike)
    half = (len(rest) - 1) // 2
    return rest[2:half] if rest[half] == " " and rest[2:half] == rest[half + 3:] else match["b"]


def unquote(path: str) -> str:
    """A path as git prints it: C-quoted where it holds a quote, a backslash, a control character or (core.quotePath)
    a byte past ASCII; a plain one never starts with a quote."""
    if not (len(path) >= 2 and path[0] == path[-1] == '"'):
        return path
    out = bytearray()
    for plain, octal, char in re.findall(r'([^\\]+)|\\([0-7]{3})|\\(.)', path[1:-1]):
        out += plain.encode("utf-8", "surrogateescape") if plain else bytes([int(octal, 8) if octal else
                                                                              _ESCAPES.get(char, ord(char))])
    return out.decode("utf-8", "surrogateescape")


_WHICH: dict[str | None, str | None] = {}  # PATH -> the git on it


def git_executable() -> str:
    path = os.environ.get("PATH")
    if path not in _WHICH:
        absolute = os.pathsep.join(p for p in (path or os.defpath).split(os.pathsep) if os.path.isabs(p))
        _WHICH[path] = shutil.which("git", path=absolute)  # never a relative entry: the current folder's (a tree's)
    exe = _WHICH[path]
    if exe is None:
        raise C128Error("git not found on PATH; install git (>= 2.30) and retry")
    return exe


_EOL = re.compile(r"^core\.(autocrlf|eol)$")
_UNWRITTEN_INDEX = "Unable to write new index file"
_LOCKED = re.compile(r"Unable to create '([^']+\.lock)': File exists")


def stale_lock_message(path: str) -> str:
    """What to say about a git lock file that is in the way (git itself only says "remove the file")."""
    return (f"{path} exists: another git process is running in this repository, or one was killed; "
            f"if none is running, remove it (rm -f {shell_quote(path)}) and retry")


# git out of memory, threads, files or disk (ulimit -v, -u, -n, a full TMPDIR): never an answer ("does not apply")
_STARVED = (r"Out of memory|Cannot allocate memory|unable to create thread|Resource temporarily unavailable|"
            r"Too many open files|No space left on device|Out of diskspace|Disk quota exceeded")
_ENVIRONMENT = re.compile(r"Permission denied|Operation not permitted|Read-only file system|File too large|" + _STARVED)


def starved(text: str) -> str | None:
    """The line of ``text`` (git's output, or the tool's error about it) saying the machine ran out of memory, threads,
    files or disk, or a file reached ``ulimit -f`` (SIGXFSZ, EFBIG)."""
    return next((line.strip() for line in text.splitlines() if re.search(_STARVED + "|File too large|SIGXFSZ", line)),
                None)


def environment_problem(text: str) -> str | None:
    """The line of git's output that says the machine failed (permission, space), not the input."""
    return next((line.strip() for line in text.splitlines() if _ENVIRONMENT.search(line)), None)


def machine_failed(text: str) -> bool:
    """Does ``text`` (an error) say the machine failed (``starved``, ``environment_problem``), not the input."""
    return bool(starved(text) or environment_problem(text))


def _ended(returncode: int) -> str:
    """How git ended without a word: its exit code, or the signal that killed it by name (SIGXFSZ: the file size
    limit, ``ulimit -f``; it said "exit -25")."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"killed by signal {-returncode}"
    if name == "SIGXFSZ":
        return "killed by SIGXFSZ: a file reached the file size limit; raise it (ulimit -f unlimited) and run it again"
    return f"killed by {name}"


class GitError(C128Error):
    def __init__(self, args: Sequence[str], returncode: int, stderr: str, stdout: str = "") -> None:
        locked = _LOCKED.search(stderr)
        detail = stale_lock_message(locked.group(1)) if locked else environment_problem(stderr) or \
            git_reason(stderr or stdout) or _ended(returncode)
        super().__init__(f"git {' '.join(args[:3])} failed: {detail}")


def _full(exc: GitError, dest: Path) -> C128Error:
    """git's "unable to write file" said as what it is where the disk holding ``dest`` is full (git names no errno)."""
    try:
        free = shutil.disk_usage(dest).free
    except OSError:
        return exc
    if free >= 1 << 20:
        return exc
    return C128Error(f"cannot write the files into {dest}: no space left on its disk ({free >> 10} KiB free); "
                     "free some, or point TMPDIR at a folder with room where it is a scratch folder")


def git_reason(text: str) -> str:
    """git's reason in one line: its first ``error:``/``fatal:`` line with the first path it lists after it (git
    ends with a bare "Aborting"), else its last line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("hint: ")] or lines  # git's advice, not its reason
    first = next((i for i, line in enumerate(lines) if line.startswith(("error: ", "fatal: "))), None)
    if first is None:
        return lines[-1].strip() if lines else ""
    listed = [line.strip() for line in lines[first + 1:] if line[:1].isspace()]
    more = f" (and {len(listed) - 1} more)" if len(listed) > 1 else ""
    return lines[first].strip() + (f" {listed[0]}{more}" if listed else "")


@dataclass
class Git:
    """Runs git in one repository (``git_dir`` for bare/object-only use, else ``worktree``)."""

    worktree: Path | None = None
    git_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    # -c settings turning off the filters of the repository's config: None, asked on first use; [] for a
    # call that reads no file of a repository (parsing a patch)
    filters_off: list[str] | None = field(default=None, repr=False, compare=False)
    _trusted: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def _base_env(self, transport: bool = False) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k.startswith(_KEPT_ENV)}
        for key in ("LD_LIBRARY_PATH", "PATH"):  # git runs in the tree: a relative entry ("", ".") is the tree's
            if key in env:
                env[key] = os.pathsep.join(p for p in env[key].split(os.pathsep) if os.path.isabs(p))
        if "LD_PRELOAD" in env:  # a relative library (./x.so) is the tree's, loaded into git; a bare name is searched
            env["LD_PRELOAD"] = " ".join(p for p in re.split(r"[: ]", env["LD_PRELOAD"])
                                         if p and ("/" not in p or os.path.isabs(p)))
        for key in (k for k in _PROGRAM_ENV if k in env):
            words = env[key].split() if key.endswith("_COMMAND") else [env[key]]  # (a shell's: `sh -c ./x` too)
            if not transport:
                env.pop(key)
            elif any("/" in w and not w.startswith(("/", "~", "-", "$")) for w in words):
                raise C128Error(f"${key} is {env[key]!r}, a relative path: git runs in the tree it works on, where "
                                "that is the tree's own file; give its absolute path")
        if not transport:  # the operator's global and system config change nothing the tool does
            env.update({"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"})
            env.pop("GIT_CONFIG_SYSTEM", None)
        env.update(GIT_AUTHOR_NAME=BOT_NAME, GIT_AUTHOR_EMAIL=BOT_EMAIL, GIT_COMMITTER_NAME=BOT_NAME,
                   GIT_COMMITTER_EMAIL=BOT_EMAIL, GIT_TERMINAL_PROMPT="0", GIT_NO_REPLACE_OBJECTS="1", LC_ALL="C",
                   GIT_ATTR_NOSYSTEM="1", GIT_NO_LAZY_FETCH="1", GIT_EDITOR=":", GIT_SEQUENCE_EDITOR=":",
                   GIT_PAGER="cat")  # no $EDITOR
        if self.git_dir is not None:
            env["GIT_DIR"] = str(self.git_dir)
        env.update(self.env)
        return env

    def with_env(self, **extra: str) -> "Git":
        return Git(self.worktree, self.git_dir, {**self.env, **extra}, self.filters_off, self._trusted)

    @property
    def cwd(self) -> Path:
        return self.worktree if self.worktree is not None else (self.git_dir or Path.cwd())

    def _settings(self, remote: bool = False) -> list[str]:
        """``-c`` options: FORCED_CONFIG, the repository's filters off, the folders the operator trusts; no remote
        reached unless ``remote`` (a clone or fetch)."""
        if self.filters_off is None:
            self.filters_off = self._filters_off() if self.worktree is not None or self.git_dir is not None else []
        forced = [f"{k}={v}" for k, v in FORCED_CONFIG]
        if os.environ.get(FAULT_HOOKS_ENV):
            forced.append(f"core.hooksPath={os.environ[FAULT_HOOKS_ENV]}")
        return [*forced, *(() if remote else _NO_REMOTE), *self.filters_off,
                *(f"safe.directory={p}" for p in self._trusted)]

    def _filters_off(self) -> list[str]:
        """``-c`` settings turning off the config's filters and textconv programs (``cat`` for one: range-diff's own
        ``git log`` takes no ``--no-textconv``); a merge program, a driver ``-c`` cannot name (its name holds ``=``)
        another config file included (``include.path``, ``includeIf.<cond>.path``) or a trailer program
        (``trailer.<token>.command``, ``.cmd``) is refused; once per config state."""
        git_dir = self.env.get("GIT_DIR") or self.git_dir
        config = Path(git_dir) / "config" if git_dir else self.cwd / ".git" / "config"
        try:  # (not a plain repository top: ask every time)
            stamp: tuple | None = (str(config), config.stat().st_mtime_ns, config.stat().st_size,
                                   (config.parent / "config.worktree").exists())
        except OSError:
            stamp = None
        key = (str(self.cwd), str(git_dir), stamp)  # (a changed config: another key)
        if stamp is None or key not in _FILTERS:
            forced = [f"{k}={v}" for k, v in FORCED_CONFIG]
            items, eol = self._read_config(forced)
            off, refusal = [], ""
            for item in items:
                name, _, value = item.partition("\n")  # (a name may hold a space)
                if name in ("core.worktree", "extensions.objectformat"):  # (where and how it is, not a program)
                    refusal = refusal or self._layout_refusal(name, value, forced)
                    continue
                if re.match(_PROMISOR, name) and value.strip().lower() in ("false", "no", "off", "0"):
                    continue
                m = _DRIVERS.match(name)
                if name == "merge.union.driver" and value == UNION_AS_TEXT:  # (ours, FORCED_CONFIG)
                    continue
                what = "a merge program" if m and m.group(1) == "merge" and value.strip() else \
                    "a program under a name c128patch cannot turn off" if m and "=" in m.group(2) else \
                    "a trailer program" if _TRAILERS.match(name) else \
                    "how git writes c128patch's own trailer" if _OUR_TRAILER.match(item) else \
                    "a partial clone" if re.match(_PROMISOR, name) else \
                    "another config file to include, which may change after this check" if re.match(_INCLUDES, name) \
                    else ""
                if what and not refusal and re.match(_PROMISOR, name):
                    refusal = self._partial_refusal(name, value)
                elif what and not refusal:
                    refusal = (f"{self.cwd}: its git config names {what} ({name} = {value}); c128patch takes no "
                               "program, nor a setting of its own commits, from a repository's config: remove that "
                               "setting, or use a clone without it")
                elif m and m.group(1) == "filter":
                    off += [f"filter.{m.group(2)}.{k}" for k in ("clean=", "smudge=", "process=", "required=false")]
                elif m and m.group(1) == "diff":  # (its cache would write notes into the repository)
                    off += [f"diff.{m.group(2)}.textconv=cat", f"diff.{m.group(2)}.cachetextconv=false"]
            off += eol
            _FILTERS[key] = (off, refusal)
        off, refusal = _FILTERS[key]
        if refusal:
            raise C128Error(refusal)
        return list(off)

    def converts_eol(self) -> bool:
        """Does the operator's git convert line ends here (``core.autocrlf``/``core.eol`` set: ``_read_config``)?"""
        self._settings()
        return any(s.startswith(("core.autocrlf=", "core.eol=")) for s in self.filters_off or ())

    def _read_config(self, forced: list[str]) -> tuple[list[str], list[str]]:
        """The repository's own settings ``_filters_off`` reads (``name\nvalue``), and ``core.autocrlf`` and
        ``core.eol`` as the operator's git reads them here (the repository's, else their global or system config's,
        which the tool's calls read nothing else of), in one git call: a tree their git checked out with CRLF line
        ends was "uncommitted changes" to the tool's git, and the `git stash -u` printed said "No local changes to
        save"; the commits are the same either way (``FORCED_CONFIG``'s core.safeCRLF, overlays staged
        ``--no-filters``). No line-end settings without a work tree, nor where the operator's config cannot be read
        (then the repository's alone, as the tool's calls read it)."""
        pattern = (f"{_DRIVERS.pattern}|{_INCLUDES}|^trailer\\.|{_PROMISOR}|^core\\.worktree$"
                   "|^extensions\\.objectformat$")
        if self.worktree is not None:
            env = self._base_env()
            for name in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_SYSTEM"):
                env.pop(name, None)
                if name in os.environ:  # (a relative file would be the tree's: none read)
                    value = os.environ[name]
                    env[name] = value if name.endswith("NOSYSTEM") or os.path.isabs(value) else os.devnull
            proc = self._raw(["config", "-z", "--show-scope", "--get-regexp", f"{pattern}|{_EOL.pattern}"], env, forced)
            if proc.returncode in (0, 1):  # (1: none set)
                fields = proc.stdout.split("\0")
                pairs = list(zip(fields[0::2], fields[1::2]))
                eol = {name: value for _, (name, _, value) in ((s, i.partition("\n")) for s, i in pairs)
                       if _EOL.match(name)}  # (the last one wins, as git's)
                # the operator's own files (global, system and what they include) change no program the tool runs
                own = [item for scope, item in pairs if scope in ("local", "worktree", "command")
                       and not _EOL.match(item.partition("\n")[0])]
                return own, [f"{name}={value}" for name, value in eol.items()]
        proc = self._raw(["config", "-z", "--get-regexp", pattern], self._base_env(), forced)
        return [item for item in proc.stdout.split("\0") if item], []

    def _layout_refusal(self, name: str, value: str, forced: list[str]) -> str:
        """Why c128patch cannot work in this repository as its config lays it out ("": it can)."""
        if name == "extensions.objectformat":  # the series' patches and check's index name SHA-1 ids
            return "" if value.strip().lower() == "sha1" else (
                f"{self.cwd}: its objects are named by {value} (extensions.objectFormat), not SHA-1 as sglang's are; "
                "the series' patches and c128patch's checks name SHA-1 ids: use a SHA-1 clone of upstream")
        top = self._raw(["rev-parse", "--show-toplevel"], self._base_env(), forced).stdout.strip()
        if self.worktree is not None and (not top or Path(top).resolve() != self.worktree.resolve()):
            return (f"{self.cwd}: its git config sets core.worktree = {value}, another folder than this one; "
                    f"c128patch works only in the tree it is given: "
                    f"{shell_join(['git', '-C', str(self.cwd), 'config', '--unset', 'core.worktree'])}")
        if self.worktree is None and top:  # a git dir given alone (the release cache) that says it has a work tree: git
            # ran `apply --cached` there against it, and every entry "did not exist in index" (helper 168)
            return (f"{self.cwd}: its git config gives it the work tree {top} (core.worktree = {value}, core.bare not "
                    f"true); c128patch reads it as a bare repository: "
                    f"{shell_join(['git', '-C', str(self.cwd), 'config', 'core.bare', 'true'])}")
        return ""

    def _partial_refusal(self, name: str, value: str) -> str:
        """A partial clone: what it is, and a full clone made from its remote, as a command."""
        remote = value.strip() if name == "extensions.partialclone" else name.split(".", 1)[1].rsplit(".", 1)[0]
        url = shell_join(["git", "-C", str(self.cwd), "remote", "get-url", remote])
        full = f"{self.cwd}-full"
        return (f"{self.cwd}: a partial clone ({name} = {value}): git fetches the objects it lacks with the programs "
                f"its config names, and c128patch takes no program from a repository's config; use a full clone: "
                f'git clone "$({url})" {shell_quote(full)}, then --repo {shell_quote(full)}')

    def _submodules_still(self) -> list[str]:
        """``submodule.<name>.ignore=dirty`` for each submodule a .gitmodules (work tree, index, HEAD) names: a commit
        or stash takes no ``--ignore-submodules``, and that setting (config, else .gitmodules) beats
        ``diff.ignoreSubmodules``."""
        names = set()
        here = [["--file", ".gitmodules"]] if (self.cwd / ".gitmodules").is_file() else []  # none: nothing to read
        found = self._raw(["cat-file", "--batch-check=%(objectname) %(objecttype)"], self._base_env(),
                          self._settings(), input=":.gitmodules\nHEAD:.gitmodules\n").stdout.split()
        blobs = [found[i] for i in range(0, len(found) - 1, 2) if found[i + 1] == "blob"]  # (one call where none is)
        for source in (*here, *(["--blob", blob] for blob in blobs)):
            proc = self._raw(["config", "-z", "--name-only", *source, "--get-regexp", r"^submodule\..+\."],
                             self._base_env(), self._settings())
            names |= {key.split(".", 1)[1].rsplit(".", 1)[0] for key in proc.stdout.split("\0") if key}
        if odd := next((n for n in sorted(names) if "=" in n or "\n" in n), None):
            raise C128Error(f"{self.cwd}: .gitmodules names a submodule {odd!r}, which c128patch cannot keep git out "
                            "of; rename it there, or use a clone without it")
        return [f"submodule.{name}.ignore=dirty" for name in sorted(names)]

    def _raw(self, args: list[str], env: dict[str, str], settings: list[str], input=None, binary: bool = False,
             timeout: float | None = None) -> subprocess.CompletedProcess:
        cmd = [git_executable(), *(x for s in settings for x in ("-c", s)), *args]
        try:
            if timeout is None:
                argv = procs.dying(cmd, env) if args[:1] and args[0] in _LONG else cmd
                proc = subprocess.run(argv, cwd=self.cwd, env=env, input=input, capture_output=True, text=not binary,
                                      errors=None if binary else "surrogateescape")  # bytes that are not UTF-8: kept
                proc.args = cmd
            else:  # git and its helpers end together past ``timeout``, on an interrupt, or (contained) when we die
                proc = procs.run(cmd, timeout, input=input, text=not binary, cwd=self.cwd, env=env, contained=True)
        except OSError as exc:  # (no pipe for git: ``ulimit -n`` too low, a traceback before)
            import errno
            import resource

            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            raise C128Error(f"cannot run git: {exc.strerror} (the limit of open files, ulimit -n "
                            f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, is too low); raise it and run again"
                            ) from None
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        dubious = _DUBIOUS.search(err) if proc.returncode != 0 else None
        if dubious and dubious.group(1) not in self._trusted:
            path = dubious.group(1)
            # the operator's own config may trust it (safe.directory in their global config)
            probe = subprocess.run([git_executable(), "rev-parse", "--git-dir"], cwd=self.cwd, capture_output=True,
                                   env=self._base_env(transport=True))
            if probe.returncode != 0:
                raise C128Error(f"git refuses {path}: it is owned by another user (git's safe.directory check: "
                                "\"detected dubious ownership\"); if you trust it, run: "
                                f"{shell_join(['git', 'config', '--global', '--add', 'safe.directory', path])}")
            self._trusted = (*self._trusted, path)
            return self._raw(args, env, [*settings, f"safe.directory={path}"], input, binary, timeout)
        return proc

    def stream(self, *args: str) -> procs.Group:
        """A hardened git call fed as it runs (``cat-file --batch``, ``fast-import``): stdin, stdout, stderr piped."""
        return procs.Group([git_executable(), *(x for s in self._settings() for x in ("-c", s)), *args], cwd=self.cwd,
                           env=self._base_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, *args: str, check: bool = True, input: str | bytes | None = None,
            env: Mapping[str, str] | None = None, binary: bool = False, transport: bool = False,
            timeout: float | None = None) -> subprocess.CompletedProcess:
        """git; ``transport``: a clone or fetch keeping the operator's config; killed past ``timeout`` s."""
        full_env = {**self._base_env(transport=transport and bool(args) and args[0] in _TRANSPORT), **(env or {})}
        argv = [*args[:1], *_NO_PROGRAMS.get(args[0] if args else "", ()), *args[1:]]
        data = input.encode() if isinstance(input, str) and binary else input
        settings = [*self._settings(bool(args) and args[0] in (*_TRANSPORT, "push")),
                    *(self._submodules_still() if args[:1] in (("commit",), ("stash",)) else ()),
                    *_PER_COMMAND.get(args[0] if args else "", ())]
        proc = self._raw(argv, full_env, settings, data, binary, timeout)
        if proc.returncode and _UNWRITTEN_INDEX in str(proc.stderr):
            raise GitError(args, proc.returncode, f"fatal: {self._index_state(full_env)}")
        # a git starved of memory, threads or files gives no answer a caller may read as "no" (does not apply); ``am``
        # is aborted and said by its caller (``ops.applier``)
        return _checked(args, proc) if check or args[:1] != ("am",) and _starved(proc) else proc

    def _index_state(self, env: Mapping[str, str]) -> str:
        """git's "Unable to write new index file" (it names no file, no errno) with the file and what is wrong
        there: its folder gone, or the free space left."""
        index = Path(env.get("GIT_INDEX_FILE") or self.cwd / self.out("rev-parse", "--git-path", "index", check=False))
        try:
            state = f"{shutil.disk_usage(index.parent).free >> 10} KiB free there"
        except OSError as exc:
            state = f"its folder: {exc.strerror}"
        return f"Unable to write new index file {index} ({state})"

    def out(self, *args: str, **kw) -> str:
        return self.run(*args, **kw).stdout.strip()

    def lines(self, *args: str, **kw) -> list[str]:
        """``out``'s lines, split at "\n" only: a subject may hold U+2028, \x1c-\x1e or \x85, which
        ``str.splitlines`` also splits at (a commit's record cut in two), or a CR (``named``)."""
        text = self.named(*args, **kw)
        return text.split("\n") if text else []

    def named(self, *args: str, **kw) -> str:
        """``out`` read as bytes, for output that carries upstream's subjects or names: a CR in a subject stays one
        (a text-mode read, universal newlines, made it "\n": a line of ours a subject forged, helper 169)."""
        return self.run(*args, binary=True, **kw).stdout.decode("utf-8", "surrogateescape").strip()

    def ok(self, *args: str, **kw) -> bool:
        return self.run(*args, check=False, **kw).returncode == 0

    def changed_files(self, base: str, head: str) -> list[str]:
        """Files ``base..head`` adds or modifies (deleted ones have nothing to read; no rename pairing)."""
        return self.out("diff", "--name-only", "--no-renames", "--diff-filter=AM", base, head).splitlines()

    def extract(self, rev: str, path: str, dest: Path) -> None:
        """``path`` (a folder, a file or ".") of tree-ish ``rev`` written under ``dest`` at its own path, by git's own
        checkout into a private index: nothing of the repository's changes, no symlink is made (one is written as a
        file holding its target), no path leaves ``dest`` (git's checkout refuses one). Half the CPU of ``git archive``
        unpacked by ``tarfile`` (sglang's 5772 files: 0.93 s against 1.88 s, measured once on 2 cores)."""
        kind = self.run("cat-file", "-t", f"{rev}:{path}" if path != "." else rev, check=False).stdout.strip()
        if kind not in ("tree", "blob", "commit"):
            raise GitError(["extract", rev, path], 128, f"fatal: path '{path}' does not exist in '{rev}'")
        if kind == "blob":
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.run("cat-file", "blob", f"{rev}:{path}", binary=True).stdout)
            return
        tree = self.out("rev-parse", "--verify", f"{rev}^{{tree}}" if path == "." else f"{rev}:{path}")
        objects = Path(self.out("rev-parse", "--git-path", "objects"))
        dest.mkdir(parents=True, exist_ok=True)
        with procs.scratch("c128extract-") as tmp:  # (a SIGKILLed run's swept by pid)
            # the committed bytes, whatever the repository says: an empty git dir borrowing its objects (no config:
            # core.autocrlf; no info/attributes), the trees' .gitattributes out of the index (eol, ident,
            # working-tree-encoding changed what the tier, the contract and a source build read), written raw
            shell = Path(tmp) / "git"
            (shell / "objects" / "info").mkdir(parents=True)
            (shell / "refs").mkdir()
            (shell / "HEAD").write_text("ref: refs/heads/none\n")
            # its objects named by GIT_OBJECT_DIRECTORY, not an alternates file (a path holding a newline broke it)
            private = Git(git_dir=shell, env={"GIT_INDEX_FILE": str(Path(tmp) / "index"),
                                              "GIT_OBJECT_DIRECTORY": str((self.cwd / objects).resolve())})
            prefix = [] if path == "." else [f"--prefix={path.rstrip('/')}/"]
            top = ["-c", "core.symlinks=false", "--work-tree", str(dest.resolve())]
            private.run(*top, "read-tree", *prefix, tree)
            attrs = [(meta.split()[1], name) for meta, _, name in (e.partition("\t") for e in private.out(
                "ls-files", "-s", "-z").split("\0") if e) if name.rsplit("/", 1)[-1] == ".gitattributes"
                     and not meta.startswith("160000")]
            if attrs:
                private.run("update-index", "--force-remove", "--", *(n for _, n in attrs))
            try:
                private.run(*top, "checkout-index", "-a", "-f")
            except GitError as exc:
                raise _full(exc, dest) from None
            for blob, name in attrs:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                (dest / name).write_bytes(private.run("cat-file", "blob", blob, binary=True).stdout)

    def operator_hooks_dir(self) -> Path | None:
        """The folder the operator's own git runs this repository's hooks from (the tool's calls run none)."""
        proc = subprocess.run([git_executable(), "rev-parse", "--git-path", "hooks"], cwd=self.cwd, capture_output=True,
                              text=True, env=self._base_env(transport=True))
        return self.cwd / proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None

    # --- queries -------------------------------------------------------------
    def rev_parse(self, rev: str) -> str | None:
        if rev.startswith("-"):  # never an option to git
            return None
        proc = self.run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        sha = proc.stdout.strip() if proc.returncode == 0 else ""
        # ("^v0.5.23" is "^<sha>" to git, a negative rev: a raw `git ls-tree` failure later, helper 185)
        return sha if re.fullmatch(r"[0-9a-f]{40}(?:[0-9a-f]{24})?", sha) else None

    def current_branch(self) -> str | None:
        return self.out("symbolic-ref", "--quiet", "--short", "HEAD", check=False) or None

    def head(self) -> str | None:
        return self.rev_parse("HEAD")

    def status_porcelain(self) -> list[str]:
        """``XY path`` lines (not stripped: X may be a space)."""
        text = self.run("status", "--porcelain=v1", "--untracked-files=normal").stdout
        return [line for line in text.splitlines() if line]

    def is_ancestor(self, a: str, b: str) -> bool:
        return self.ok("merge-base", "--is-ancestor", a, b)

    def count(self, rng: str) -> int:
        return int(self.out("rev-list", "--count", rng))

    def blob(self, rev: str, path: str) -> bytes | None:
        proc = self.run("cat-file", "blob", f"{rev}:{path}", check=False, binary=True)
        return proc.stdout if proc.returncode == 0 else None


def _starved(proc: subprocess.CompletedProcess) -> bool:
    """Did git fail for want of memory, threads, files or disk, or at ``ulimit -f`` (``starved``)."""
    err = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode(errors="replace")
    return proc.returncode != 0 and starved(err) is not None


def _checked(args: Sequence[str], proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``proc``, or ``GitError`` where it failed."""
    if proc.returncode != 0:
        raise GitError(args, proc.returncode, *(x if isinstance(x, str) else x.decode(errors="replace")
                                                for x in (proc.stderr, proc.stdout)))
    return proc


class BlobBatch:
    """Objects read through one ``git cat-file --batch`` (hardened as ``Git.run``), started on the first read."""

    def __init__(self, git: Git) -> None:
        self.git = git
        self._proc: subprocess.Popen | None = None

    def read(self, spec: str) -> bytes | None:
        """The content of the object ``spec`` names (``rev:path``); None where there is none."""
        if self._proc is None:
            self._proc = self.git.stream("cat-file", "--batch")
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"{spec}\n".encode(errors="surrogateescape"))  # a path as git gave it
        self._proc.stdin.flush()
        header = self._proc.stdout.readline().split()  # "<sha> <type> <size>", or "<spec> missing"
        return self._proc.stdout.read(int(header[2]) + 1)[:-1] if len(header) == 3 else None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            self._proc.wait()
            self._proc = None


_QUERIES = ("rev-parse", "cat-file", "merge-base", "rev-list", "log", "ls-tree")  # read objects and refs only


class ReadMemo(Git):
    """``git`` remembering its answers to ``_QUERIES`` for a call reading many revs without moving refs
    (``check``); not a missing object (the call may write it), nor calls with another environment."""

    def __init__(self, git: Git) -> None:
        super().__init__(git.worktree, git.git_dir, dict(git.env), git.filters_off, git._trusted)
        self._memo: dict[tuple, subprocess.CompletedProcess] = {}
        self._parents: dict[str, list[str]] | None = None  # every commit the refs reach -> its parents
        self._ancestors: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def _reach(self, *commits: str) -> list[set[str]] | None:
        """Each commit's ancestors (itself too) from one ``rev-list --parents --all``; None: one the refs miss."""
        with self._lock:
            if self._parents is None:
                out = super().run("rev-list", "--parents", "--all", check=False).stdout
                self._parents = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
        if any(c not in self._parents for c in commits):
            return None
        for b in commits:
            if b not in self._ancestors:
                seen, todo = {b}, [b]
                while todo:
                    for parent in self._parents.get(todo.pop(), []):
                        if parent not in seen:
                            seen.add(parent)
                            todo.append(parent)
                self._ancestors[b] = seen
        return [self._ancestors[c] for c in commits]

    def is_ancestor(self, a: str, b: str) -> bool:
        """``merge-base --is-ancestor`` from ``_reach`` where the refs reach both."""
        reach = self._reach(b)
        return a in reach[0] if reach and a in (self._parents or {}) else super().is_ancestor(a, b)

    def count(self, rng: str) -> int:
        """``rev-list --count a..b`` from ``_reach`` (one git call per rev grew with its distance)."""
        a, _, b = rng.partition("..")
        reach = self._reach(b, a) if a and b else None
        return len(reach[0] - reach[1]) if reach else super().count(rng)

    def run(self, *args: str, check: bool = True, binary: bool = False, **kw) -> subprocess.CompletedProcess:
        if not args or args[0] not in _QUERIES or any(v is not None and v is not False for v in kw.values()):
            return super().run(*args, check=check, binary=binary, **kw)
        key = (args, binary)
        proc = self._memo.get(key)
        if proc is None:
            proc = super().run(*args, check=False, binary=binary)
            if proc.returncode == 0 or args[0] != "cat-file":
                self._memo[key] = proc
        return _checked(args, proc) if check else proc

    def find_blobs(self, ids: list[str]) -> None:
        """Which of ``ids`` are blobs, in one ``cat-file --batch-check``: later ``cat-file -e`` answers."""
        key = lambda i: (("cat-file", "-e", f"{i}^{{blob}}"), False)  # noqa: E731
        want = [i for i in dict.fromkeys(ids) if key(i) not in self._memo]
        if not want:
            return
        out = super().run("cat-file", "--batch-check=%(objectname) %(objecttype)",
                          input="".join(f"{i}\n" for i in want), check=False).stdout
        for line in out.splitlines():
            name, _, kind = line.partition(" ")
            if kind == "blob" and name in want:
                self._memo[key(name)] = subprocess.CompletedProcess(list(key(name)[0]), 0, "", "")


T = TypeVar("T")


def remembered(git: Git, key: tuple, compute: Callable[[], T]) -> T:
    """``compute()`` once per ``key`` (naming all it depends on) for a ``ReadMemo``; every time for a ``Git``."""
    if not isinstance(git, ReadMemo):
        return compute()
    if key not in git._memo:
        git._memo[key] = compute()  # type: ignore[assignment]
    return git._memo[key]  # type: ignore[return-value]


def recalled(git: Git, key: tuple) -> Any:
    """What ``remembered`` holds for ``key``; None: nothing (always, for a ``Git``)."""
    return git._memo.get(key) if isinstance(git, ReadMemo) else None


def work_tree_top(path: Path) -> Path | None:
    """The top of the work tree ``path`` is in (one git call); None where it is in none."""
    if not path.is_dir():
        return None
    said = Git(worktree=path).run("rev-parse", "--is-inside-work-tree", "--show-toplevel", check=False).stdout
    inside, _, top = said.partition("\n")  # (a top holding a newline, its own line break kept: one path)
    return Path(top.removesuffix("\n")) if inside == "true" and top.strip() else None


def is_work_tree(path: Path) -> bool:
    return work_tree_top(path) is not None


def toplevel(path: Path) -> Path:
    proc = Git(worktree=path).run("rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        raise C128Error(f"not a git repository: {path}")
    return Path(proc.stdout.strip())


def user_can_commit(tree: Path) -> bool:
    """Has git, as the user runs it in ``tree``, an identity to commit with (a printed command must work)?"""
    try:
        proc = subprocess.run([git_executable(), "-C", str(tree), "var", "GIT_COMMITTER_IDENT"], capture_output=True,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"}, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0

def refuse_git_dir(tree: Path) -> None:
    """Refuse, before anything is written, a tree inside a git dir (``R/.git/new``, a bare repository:
    git's own files) or one that looks like an option (``--tree=--bare``: git would read it as one)."""
    if str(tree).startswith("-"):
        raise C128Error(f"--tree {tree} looks like an option, not a folder; for a folder of that name pass ./{tree}")
    absolute = tree.absolute()
    probe = absolute
    while not probe.is_dir() and probe.parent != probe:
        probe = probe.parent
    inside = any(is_git_dir_name(p) for p in absolute.parts) or \
        Git(worktree=probe).out("rev-parse", "--is-inside-git-dir", check=False) == "true"
    if inside:
        raise C128Error(f"--tree {tree} is inside a git dir (git's own files, not a work tree); pass the work "
                        "tree itself or a new folder outside any .git")


def index_sound(idx: Path) -> bool:
    """Does a pack's ``.idx`` hold its own checksum (its last 20 bytes: SHA-1 of the rest) and its pack's (the 20
    before, the pack's own last 20 bytes)? A regular file only (a link, a FIFO: not sound); one over 64 MiB (a
    history of millions of objects) is held to its pack's checksum alone, not read whole on every verb."""
    try:
        fd = os.open(idx, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size < 40:
                return False
            if st.st_size > 64 << 20:
                f.seek(-40, os.SEEK_END)
            data = f.read()
        with open(idx.with_suffix(".pack"), "rb") as pack:
            pack.seek(-20, os.SEEK_END)
            tail = pack.read(20)
    except OSError:
        return False
    whole = st.st_size <= 64 << 20
    return (not whole or hashlib.sha1(data[:-20]).digest() == data[-20:]) and data[-40:-20] == tail


def not_plain(git_dir: Path) -> str | None:
    """What of a bare repository of the cache's git would read not as git writes it: "HEAD is a FIFO" (HEAD, config,
    packed-refs and every ref regular files, ``refs`` a folder), else None. lstat and scandir only (~0.1 ms): git
    waited forever on a FIFO there (`check` hung, no word), and followed a link out of the cache."""
    from c128patch.errors import what_is

    found: list[Path] = []
    refs = git_dir / "refs"
    for path, folder in ((git_dir / "HEAD", False), (git_dir / "config", False), (git_dir / "packed-refs", False),
                         (refs, True)):
        try:
            if not (stat.S_ISDIR if folder else stat.S_ISREG)(os.lstat(path).st_mode):
                found.append(path)
        except FileNotFoundError:
            continue
    stack = [] if found else [refs]
    while stack and not found:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif not entry.is_file(follow_symlinks=False):
                        found.append(Path(entry.path))
        except FileNotFoundError:
            continue
    if not found:
        return None
    what = "a link" if os.path.islink(found[0]) else what_is(found[0])
    return f"{found[0].relative_to(git_dir)} is {what}, not a {'folder' if found[0] == refs else 'regular file'}"


def damaged_index(objects: Path, root: Path | None = None) -> str | None:
    """The first pack index of the object store ``objects`` or of a store it borrows from (``info/alternates``, as
    git follows them: 5 deep) that fails its checksum (``index_sound``), else None: its path from ``root`` (default
    ``objects``' parent), or an absolute one outside it."""
    root = (root or objects.parent).resolve()
    stores, seen = [(objects, 0)], set()
    while stores:
        store, depth = stores.pop(0)
        if store.resolve() in seen:
            continue
        seen.add(store.resolve())
        for idx in sorted((store / "pack").glob("*.idx")):
            if not index_sound(idx):
                path = idx.resolve()
                return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        if depth < 5:
            stores += [(store / line if not os.path.isabs(line) else Path(line), depth + 1)
                       for line in _alternates(store)]
    return None


def _alternates(store: Path) -> list[str]:
    """The stores ``store/info/alternates`` names (``#`` comments and blank lines skipped), none where unreadable."""
    try:
        text = (store / "info" / "alternates").read_text(errors="surrogateescape")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def refuse_damaged(git: Git, path: Path) -> None:
    """Refuse the operator's repository ``path`` (``git`` runs in it: ``--repo PATH``, a tree the verbs work on) where a
    pack index of its object store fails its checksum: one line naming it and ``git -C PATH fsck`` (git's "Could not
    read ...", "packed object ... is corrupt" or "unknown rev" named neither; ``status`` even said "equals the series").
    ~1 ms a pack index (the release cache's three, 413 KB: 0.7 ms), and a git call (~5 ms) only where ``path`` is not
    a work tree holding its own ``.git`` folder (a bare one, a linked work tree)."""
    dot_git = path / ".git"
    if dot_git.is_dir() and not dot_git.is_symlink() and not (dot_git / "commondir").exists():
        store = (dot_git / "objects").resolve()  # (the tool's git sees no GIT_OBJECT_DIRECTORY)
    else:
        objects = git.run("rev-parse", "--git-path", "objects", check=False)
        if objects.returncode != 0:
            raise C128Error(f"not a git repository: {path}")
        store = (git.cwd / objects.stdout.strip()).resolve()
    if bad := damaged_index(store, path):
        raise C128Error(damaged_repository(str(path.resolve()), bad))


def damaged_repository(repo: str, index: str) -> str:
    """The line for the operator's repository ``repo`` whose pack ``index`` fails its checksum: how to check it."""
    return (f"the repository {repo} is damaged ({index} fails its checksum), not the series: check it (git -C "
            f"{shell_quote(repo)} fsck), then repair it or clone it again")
