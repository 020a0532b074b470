"""Is a working tree safe to change? Dirty files, half-done git operations, our own journals, and the
per-repository lock that keeps two c128patch operations from racing on one repository.

The lock is ``flock`` on ``<git common dir>/c128patch.lock``: the kernel drops it when its holder
exits, however it exits, so a lock left by a killed process is taken over (the file still names
the dead holder, which is how the takeover is noticed and reported). While held, the file says
which operation and pid hold it; a second operation refuses at once and names them.

``fault_point`` is a test hook: it interrupts this process at a named point, as a crash or a Ctrl-C would.
``C128PATCH_FAULT=<how>-<where>:<name>`` (comma-separated): ``how`` is ``kill`` (SIGKILL), ``sigint``, ``sigterm``,
``sighup`` or ``fail`` (an ``OSError``, as a full disk raises); ``where:name`` a point the operations declare:
``before:<entry>``, ``after:<entry>`` (its commit made, the journal not saying so yet), ``at:clone``,
``at:provenance``. Unset: nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from c128patch.errors import C128Error
from c128patch.git import BOT_EMAIL, BOT_NAME, Git, ls_tree, stale_lock_message, user_can_commit
from c128patch.jsonio import MAX_JSON, open_regular, read_json, write_json_atomic
from c128patch.procs import running_owner
from c128patch.progress import echo
from c128patch.series.layers import layer_folders, operators, owned
from c128patch.series.manifest import MANIFEST, Series
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance
from c128patch.textsafe import shell_join, some

_GIT_BUSY = {"rebase-merge": "a git rebase", "rebase-apply": "a git am or rebase", "MERGE_HEAD": "a git merge",
             "CHERRY_PICK_HEAD": "a git cherry-pick", "REVERT_HEAD": "a git revert"}
RECOVERY_PREFIX = "refs/c128patch/recovery"  # HEAD before an apply or rebase
LOCK_NAME = "c128patch.lock"
FAULT_ENV = "C128PATCH_FAULT"
_SIGNALS = {"kill": signal.SIGKILL, "sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sighup": signal.SIGHUP}


def git_paths(git: Git, names: list[str], *more: str) -> list[Path]:
    """Paths inside the repository's git dir (worktree-aware), then those ``more`` rev-parse options name; the tool's
    state folder (``c128patch``) must be a folder or absent: a link there (to a folder elsewhere) had apply, status
    and refresh write their journal, proof and layers through it."""
    rels = git.run("rev-parse", *(a for name in names for a in ("--git-path", name)), *more).stdout.splitlines()
    paths = [(git.worktree or Path.cwd()) / rel for rel in rels]  # (an absolute one stays as it is)
    for name, path in zip(names, paths):
        if name == "c128patch" and (path.is_symlink() or path.exists() and not path.is_dir()):
            raise C128Error(f"{path}, where c128patch keeps the tree's state (journals, proof, layers), is "
                            f"{'a link' if path.is_symlink() else 'not a folder'}: nothing is read or written through "
                            f"it; remove it ({shell_join(['rm', str(path)])}) and run again")
    return paths


def _index_lock(tree: Path) -> Path | None:
    """``tree``'s ``index.lock`` path, None where ``tree`` is no repository (yet)."""
    if not (tree / ".git").exists():
        return None
    try:
        return git_paths(Git(worktree=tree), ["index.lock"])[0]
    except C128Error:
        return None


@contextlib.contextmanager
def own_index_lock(tree: Path) -> Iterator[None]:
    """On a signal in the block (``KeyboardInterrupt``), the ``index.lock`` the run's own git left: ended with its
    group (``procs.Group``: SIGKILL, after which git cannot remove its lock), it stayed, and the resume or undo the
    tool printed then failed on it. Removed; a lock that was there when the block began is not the run's, and stays."""
    lock = _index_lock(tree)
    had = lock is not None and lock.exists()
    try:
        yield
    except KeyboardInterrupt:
        lock = _index_lock(tree)
        if lock is not None and not had:
            lock.unlink(missing_ok=True)
        raise


def c128_state_dir(git: Git) -> Path:
    return git_paths(git, ["c128patch"])[0]


def remember_layers(git: Git, series: Series, state: Path | None = None) -> None:
    """Keep the layer folders a tree was applied or rebased with in its git dir (``state``: its ``c128_state_dir``,
    read already), for ``tree_layers``."""
    write_json_atomic((state or c128_state_dir(git)) / "layers.json", layer_folders(series), sync=False)


def tree_layers(git: Git) -> tuple[Path, ...]:
    """The folders of the layers the tree's provenance names (``remember_layers``); () for none; one gone: an error."""
    try:
        names = [str(r.get("name")) for r in read_provenance(git.cwd).get("layers", [])]
    except C128Error:
        return ()  # no record, or a damaged one: the verb says so itself
    if not names:
        return ()
    path = c128_state_dir(git) / "layers.json"
    # input: the git dir's (a NUL in one: ValueError's traceback in every verb run in the tree)
    folders = [Path(f) for f in read_json(path, list) or [] if isinstance(f, str) and "\0" not in f]
    usable = [f.is_absolute() and f.resolve() == f and (f / MANIFEST).is_file() for f in folders]
    if len(folders) != len(names) or not all(usable):
        gone = [f"{f} (layer {name}) " + ("is gone (moved or removed)" if not f.exists() else
                                          f"is reached through a link (it is {f.resolve()}): not read"
                                          if f.resolve() != f else f"holds no {MANIFEST}")
                for f, name, ok in zip(folders, names, usable) if not ok and f.is_absolute()]  # (a link was "holds
        # no patches/series.toml", which it held, helper 175)
        where = (f"; the folder it was applied with, {', '.join(gone)}" if len(gone) == 1 else
                 f"; the folders it was applied with: {'; '.join(gone)}" if gone else "")
        raise C128Error(f"{git.cwd} was applied with layer(s) {', '.join(names)} (its provenance says so){where}: "
                        "name their folders as they are now (--layer DIR, or c128patch.toml); nothing was changed")
    return owned(operators(folders, str(path)), str(path))


def rebase_journal(git: Git) -> Path:
    return c128_state_dir(git) / "rebase.json"


def apply_journal(git: Git) -> Path:
    return c128_state_dir(git) / "apply.json"


def apply_commands(tree: Path) -> tuple[str, str]:
    """(resume, undo): the commands that finish or undo an apply stopped in ``tree``."""
    where = str(Path(tree).resolve())
    return (shell_join(["c128patch", "apply", "--continue", "--tree", where]),
            shell_join(["c128patch", "apply", "--abort", "--tree", where]))


def git_command(tree: Path) -> str:
    """``git -C TREE``, with the tool's identity (``-c user.name=...``) where the user's git has none."""
    words = ["git", "-C", str(tree)]
    if not user_can_commit(tree):
        words += ["-c", f"user.name={BOT_NAME}", "-c", f"user.email={BOT_EMAIL}"]
    return shell_join(words)


def rebase_command(tree: Path, verb: str, *args: str) -> str:
    """``c128patch rebase --<verb> [ARGS]`` for ``tree`` (the journal names the series)."""
    return shell_join(["c128patch", "rebase", f"--{verb}", *args, "--tree", str(Path(tree).resolve())])


def refuse_cloning(tree: Path, owner: object) -> None:
    """Refuse while the apply that clones into ``tree`` still runs: its journal comes with the clone, before that apply
    holds the tree's lock (``repo_lock``), and a second `apply --tree` there said it "was interrupted", printing an
    `--abort` that would remove the clone under it."""
    if pid := running_owner(owner):
        raise C128Error(f"another c128patch apply is cloning into {tree} (pid {pid}); wait for it to finish and "
                        "retry; nothing was changed")


def ensure_idle(git: Git, action: str) -> None:
    """Refuse to ``action`` while a c128patch apply/rebase or a git operation is half done."""
    tree, where = git.worktree, git.worktree or Path.cwd()
    state, *busy, index_lock = git_paths(git, ["c128patch", *_GIT_BUSY, "index.lock"])
    if (state / "apply.json").is_file():
        refuse_cloning(where, (read_json(state / "apply.json", dict) or {}).get("cloning"))
        resume, undo = apply_commands(where)
        raise C128Error(f"cannot {action}: a c128patch apply was interrupted in {tree}; finish it ({resume}) "
                        f"or undo it ({undo})")
    if (state / "rebase.json").is_file():
        raise C128Error(f"cannot {action}: a c128patch rebase is in progress in {tree}; finish it "
                        f"(`{rebase_command(where, 'continue')}`, or `{rebase_command(where, 'skip')}` to drop the "
                        f"entry it stopped at) or undo it (`{rebase_command(where, 'abort')}`)")
    for path, what in zip(busy, _GIT_BUSY.values()):
        if path.exists():
            raise C128Error(f"cannot {action}: {what} is in progress in {tree}; finish or abort it first")
    if index_lock.exists():
        raise C128Error(f"cannot {action}: {stale_lock_message(str(index_lock))}")


def worktree_state(git: Git) -> tuple[dict[str, str], list[str]]:
    """``git status``'s headers (``branch.oid``, ``branch.head``) and every path it lists (both sides of a
    rename), exactly as named (``-z``)."""
    out = iter(git.run("status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all").stdout.split("\0"))
    headers, paths = {}, []
    for entry in filter(None, out):
        kind, _, rest = entry.partition(" ")
        if kind == "#":
            name, _, value = rest.partition(" ")
            headers[name] = value
        else:  # the path follows 7 fields (1: changed), 8 (2: renamed or copied), 9 (u: unmerged), 0 (?)
            paths.append(rest.split(" ", {"1": 7, "2": 8, "u": 9}.get(kind, 0))[-1])
            if kind == "2":  # a rename's source follows
                paths.append(next(out))
    return headers, paths


def changed_paths(git: Git) -> list[str]:
    return worktree_state(git)[1]


_MARKER = re.compile(r"^([<=>|])\1{6}(\s|$)")  # git's own rule at the default marker size


def _added_markers(diff: str) -> list[str]:
    """``path:line`` of each added line of a ``--unified=0`` diff that is a conflict marker."""
    found, path, number, prev = [], "", 0, ""
    for line in diff.splitlines():
        header, prev = prev.startswith("--- ") and line.startswith("+++ "), line  # (not an added "++ " line)
        if header:
            path = line[6:] if line.startswith("+++ b/") else ""
        elif line.startswith("@@ ") and (m := re.match(r"@@ -\S+ \+(\d+)", line)):
            number = int(m.group(1))
        elif line.startswith("+") and path:
            if _MARKER.match(line[1:]):
                found.append(f"{path}:{number}")
            number += 1
    return found


def refuse_conflict_markers(git: Git, base: str, target: str | None, action: str,
                            fix: str = "resolve it, `git add` the file, and retry") -> None:
    """Refuse conflict markers added from ``base`` to ``target`` (None: the index), by ``git diff --check``."""
    proc = git.run("diff", "--check", base, *([target] if target else ["--cached"]), check=False)
    found = [line.rsplit(":", 1)[0] for line in proc.stdout.splitlines() if line.endswith(": leftover conflict marker")]
    if not found:  # --check skips a file the tree's .gitattributes calls binary (`-diff`): its added lines, as text
        found = _added_markers(git.run("diff", "--text", "--unified=0", "--no-color", "--no-renames", base,
                                       *([target] if target else ["--cached"]), check=False).stdout)
    if found:
        path, _, line = found[0].rpartition(":")
        more = f" (and {len(found) - 1} more marker line(s))" if len(found) > 1 else ""
        raise C128Error(f"cannot {action}: {path} still holds a conflict marker at line {line}{more}; {fix}")


def ensure_clean(git: Git, action: str) -> None:
    """Refuse uncommitted or untracked files: nothing of the user's may be lost."""
    changes = git.status_porcelain()
    if changes:
        stash = shell_join(["git", "-C", str(git.worktree), "stash", "-u"])
        raise C128Error(f"cannot {action}: {git.worktree} has uncommitted changes ({some([c[3:] for c in changes], 3)}"
                        f"); commit or stash them ({stash}) and retry; nothing was changed")


def read_journal(git: Git, path: Path, what: str) -> dict:
    """The JSON object in a journal; an unreadable one is a one-line error that says how to forget it."""
    try:  # never through a link, a pipe or a device, nor a file bigger than any journal (read whole: MemoryError)
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON:
                raise ValueError(f"not a regular file of at most {MAX_JSON >> 20} MB")
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "nested too deeply to read" if isinstance(exc, RecursionError) else \
            str(getattr(exc, "msg", None) or getattr(exc, "strerror", None) or exc)
        raise corrupt_journal(git, path, what, why) from None
    if not isinstance(data, dict):
        raise corrupt_journal(git, path, what, f"a JSON {type(data).__name__}, not an object")
    return data


_FOLDERS = ("series_root", "layers")  # a journal's folders: paths, each a non-empty string


def shown_value(value: Any) -> str:
    """A journal's value in a message: short, on one line."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:60] + "…"


_TYPES: dict[str, type] = {"str": str, "int": int, "bool": bool, "dict": dict, "list": list, "None": type(None)}


def checked_fields(cls: type, data: dict, git: Git, path: Path, what: str) -> dict[str, Any]:
    """``data`` as keyword arguments of the journal dataclass ``cls``, every field of its declared type."""
    fields = dataclasses.fields(cls)
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise corrupt_journal(git, path, what, f"unknown field {unknown[0]!r}")
    for f in fields:
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise corrupt_journal(git, path, what, f"no {f.name!r}")
            continue
        value, names = data[f.name], [part.strip().split("[")[0] for part in str(f.type).split("|")]
        allowed = tuple(_TYPES[n] for n in names if n in _TYPES)
        known = len(allowed) == len(names)  # else an alias: the dataclass's own business
        if known and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            raise corrupt_journal(git, path, what, f"{f.name!r} is a {type(value).__name__}")
        if f.name in _GIT_WORDS and isinstance(value, str) and value.startswith("-"):
            raise corrupt_journal(git, path, what, f"{f.name!r} starts with '-' (git would take it for an option)")
        if f.name in _FOLDERS and not all(isinstance(v, str) and v and "\0" not in v
                                          for v in (value if isinstance(value, list) else [value])):
            # (`"layers": [1]` was TypeError's traceback at --continue, a NUL ValueError's)
            raise corrupt_journal(git, path, what, f"{f.name!r} holds {shown_value(value)}, not folder paths")
    return dict(data)


# a journal's fields that reach git as a word of its command line (`checkout ORIG_BRANCH`: `--orphan=x`, `-Bmain`)
_GIT_WORDS = {"onto_rev", "onto_commit", "old_rev", "old_commit", "orig_branch", "orig_head", "recovery_ref",
              "head_before", "sha", "new_sha", "edit_from", "edit_to", "series_tree", "rev", "upstream_commit",
              "branch"}


def corrupt_journal(git: Git, path: Path, what: str, reason: str) -> C128Error:
    """The error for an unreadable journal: how to forget it and, where HEAD moved, get back (``@{-1}``)."""
    back = ""
    previous = git.out("rev-parse", "--symbolic-full-name", "@{-1}", check=False)  # a failure prints no ref
    if (what == "apply" or git.current_branch() is None) and previous.startswith("refs/heads/"):
        back = ("; the branch you started from is untouched: "
                + shell_join(["git", "-C", str(git.worktree), "checkout", previous.removeprefix("refs/heads/")]))
    return C128Error(
        f"cannot read the c128patch {what} journal {path} ({reason}); nothing was changed; to forget the {what} "
        f"(HEAD, index and files stay as they are): {shell_join(['rm', '-f', str(path)])}{back}"
    )


@dataclass(frozen=True)
class Holder:
    action: str
    pid: int
    since: str = ""


def _open_lock(path: Path, flags: int, action: str) -> int:
    """``path``'s descriptor: a regular file, opened without following a link or waiting on a pipe; else one line."""
    try:
        fd = open_regular(path, flags)
    except OSError as exc:
        raise C128Error(f"cannot {action}: cannot create the lock {path} ({exc.strerror})") from None
    if fd is None:
        raise C128Error(f"cannot {action}: the lock {path} is not a regular file (a link, a pipe or a folder): not "
                        f"used; nothing was changed; remove it ({shell_join(['rm', '-r', str(path)])}) and run again")
    return fd


def _holder(fd: int) -> Holder | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return Holder(str(data["action"]), int(data["pid"]), str(data.get("since", "")))
    except (ValueError, TypeError, KeyError):
        return None


@contextlib.contextmanager
def repo_lock(git: Git, action: str) -> Iterator[None]:
    """Hold the repository's c128patch lock for ``action`` (not re-entrant: no operation calls another)."""
    path = git_paths(git, [], "--git-common-dir")[0] / LOCK_NAME
    # never through a link (one to ~/.bashrc was truncated, a dangling one made its target), nor a pipe (a traceback)
    fd = _open_lock(path, os.O_RDWR | os.O_CREAT, action)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        who = f"c128patch {holder.action}" if holder else "c128patch operation"
        pid = f" (pid {holder.pid})" if holder else ""
        raise C128Error(f"another {who} is running in {git.worktree}{pid}; wait for it to finish and retry; "
                        "nothing was changed") from None
    stale = _holder(fd)  # still written: its holder died without releasing
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"action": action, "pid": os.getpid(),
                                  "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode(), 0)
    except OSError as exc:  # a full disk: "cannot write in a folder", naming none (helper 183)
        os.close(fd)
        raise C128Error(f"cannot {action}: cannot write the lock {path} ({exc.strerror}); nothing was changed; free "
                        "space there and run it again") from None
    try:
        yield
        if stale is not None:  # said once the operation went through (a refusal says what matters)
            echo(f"c128patch: note: took over the lock {path} of c128patch {stale.action} (pid {stale.pid}, since "
                 f"{stale.since}), which is no longer running")
    finally:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def running(common_dir: Path) -> Holder | None:
    """Which c128patch operation holds the lock (in the git common dir ``common_dir``) right now (None: none)."""
    path = common_dir / LOCK_NAME
    try:  # (no link followed, no pipe waited on: not a lock of ours)
        fd = open_regular(path, os.O_RDONLY)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (the close releases it)
        return None
    except BlockingIOError:
        return _holder(fd) or Holder("operation", 0)
    finally:
        os.close(fd)


def fault_point(where: str, name: str) -> None:
    wanted = os.environ.get(FAULT_ENV, "").split(",")  # unset: [""], which names no point
    for how, sig in _SIGNALS.items():
        if f"{how}-{where}:{name}" in wanted:
            os.kill(os.getpid(), sig)
    if f"fail-{where}:{name}" in wanted:
        raise OSError(errno.EIO, f"injected fault at {where}:{name}")


def fault_named(where: str, name: str) -> bool:
    """Is there a fault at this point (a step must end there for ``fault_point`` to act on it)?"""
    wanted = os.environ.get(FAULT_ENV, "").split(",")
    return any(f"{how}-{where}:{name}" in wanted for how in (*_SIGNALS, "fail"))


def tree_state(git: Git) -> dict[str, str]:
    """path -> blob id of each changed or untracked path of the work tree ("" when deleted)."""
    paths = changed_paths(git)
    present = [p for p in paths if (git.worktree / p).is_file()]  # type: ignore[operator]
    ids = git.out("hash-object", "--", *present).splitlines() if present else []
    return {**{p: "" for p in paths}, **dict(zip(present, ids))}


def cut_checkout(git: Git, target: str, since: str = "HEAD") -> tuple[list[str], list[str]]:
    """The changed paths of a tree (clean before) whose checkout of ``target`` was cut short, HEAD not moved yet:
    (those the checkout left, the rest: the user's). The checkout's: on a path it changes, ``target``'s content, a
    file missing (removed, or not written yet) or the start of ``target``'s content (cut while writing it); the
    provenance. ``since``: what the tree held before (a clone made with no checkout: the empty tree)."""
    state = tree_state(git)
    changes = set(git.out("diff", "--name-only", "--no-renames", "-z", since, target).split("\0"))
    tip = {path: sha for path, (*_, sha) in ls_tree(git, target, sorted(state), "-r").items()}

    def written(path: str, blob: str) -> bool:
        if path == PROVENANCE_PATH or blob == tip.get(path, ""):
            return True
        if path not in changes or not blob or path not in tip or (git.worktree / path).is_symlink():
            return not blob and path in changes
        return (git.blob(target, path) or b"").startswith((git.worktree / path).read_bytes())

    theirs = sorted(p for p, blob in state.items() if written(p, blob))
    return theirs, sorted(set(state) - set(theirs))
