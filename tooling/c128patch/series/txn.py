"""All-or-nothing writes into series folders (``refresh``, ``layer add-entry``): stage, commit by one
rename, roll forward. ``commit_all(parts)`` stages each part's files and a plan (moves, deletes, the
group of folders written together) under ``<root>/.c128patch-txn-staging/``; a failure there removes
every staging folder: nothing changed. Renaming the first part's staging to ``.c128patch-txn`` is the
one commit point; then every part is swapped in and moved into place (the manifest last), SIGINT, SIGTERM and
SIGHUP held until it is done (then said: exit 128+N). ``recover``
(run by ``load_series``) finishes a committed plan after a kill and drops an uncommitted one. A plan is
input: ``_plan`` checks it before anything moves (its paths ``paths.confine``d, every folder of its
group holding a plan of that group). ``locked`` serialises the writers of one folder."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import signal
from pathlib import Path, PurePosixPath
from typing import Callable, TypeVar

from c128patch.errors import C128Error, Interrupted
from c128patch.jsonio import locked, read_json, write_atomic
from c128patch.series.paths import confine, not_a_file
from c128patch.textsafe import shell_join, shell_quote

TXN = ".c128patch-txn"
STAGING = ".c128patch-txn-staging"
PLAN = "plan.json"
_STAGED = re.compile(r"\d{5}")
_STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

Part = tuple[Path, dict[Path, bytes], list[Path], "Path | None"]  # root, files, deletes, last
F = TypeVar("F", bound=Callable)


def _no_fault(_name: str) -> None:
    return None


def serialised(func: F) -> F:
    """``func(folder, ...)`` under ``locked(folder)``: a load, change and commit of one folder at a time."""
    @functools.wraps(func)
    def wrapper(folder: Path, *args, **kw):  # noqa: ANN202
        with locked(folder):
            return func(folder, *args, **kw)
    return wrapper  # type: ignore[return-value]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    with contextlib.suppress(OSError):  # not every file system syncs a folder; the rename is still atomic
        os.fsync(fd)
    os.close(fd)


def _rel(root: Path, path: Path) -> str:
    rel = path.relative_to(root).as_posix() if path.is_absolute() and path.is_relative_to(root) else str(path)
    confine(root, rel, f"the refresh of {root}")
    if rel.split("/")[0] in (TXN, STAGING):
        raise C128Error(f"internal: refusing to write {path} into the transaction folder of {root}")
    return rel


def commit_all(parts: list[Part], fault: Callable[[str], None] = _no_fault) -> None:
    """Each part's ``files`` written, ``deletes`` removed, ``last`` moved last: all parts one transaction."""
    if not parts:
        return
    roots = [root for root, *_ in parts]
    group = {"id": os.urandom(16).hex(), "parts": [os.path.realpath(r) for r in roots]}
    with contextlib.ExitStack() as stack:
        for root in roots:
            stack.enter_context(locked(root))
        try:
            for k, (root, files, deletes, last) in enumerate(parts):
                recover(root)
                staging, moves = root / STAGING, []  # the new files and the plan: nothing in place changes
                shutil.rmtree(staging, ignore_errors=True)
                (staging / "files").mkdir(parents=True)
                for i, path in enumerate(sorted(files, key=lambda p: (p == last, str(p)))):
                    write_atomic(staging / "files" / f"{i:05d}", files[path])
                    moves.append([f"{i:05d}", _rel(root, path)])
                    fault(f"refresh-{'' if k == 0 else f'part{k}-'}staged:{i}")
                plan = {"moves": moves, "deletes": [_rel(root, p) for p in deletes], "group": group}
                if odd := _not_files(root, [*(rel for _, rel in moves), *plan["deletes"]]):  # (a folder there: the
                    raise C128Error(f"refusing to write into {root}: {odd}; nothing was changed")  # move failed late)
                if why := _on_the_way(root, [*(rel for _, rel in moves), *plan["deletes"]]):  # (before the commit
                    raise C128Error(f"refusing to write into {root}: {why} (whoever else may change it can swap a "
                                    "folder for a link while the tool writes); nothing was changed")  # point, h152)
                write_atomic(staging / PLAN, json.dumps(plan).encode())
                _fsync_dir(staging)
            fault("refresh-before-commit")
        except BaseException as exc:
            for root in roots:
                shutil.rmtree(root / STAGING, ignore_errors=True)
            if isinstance(exc, OSError):
                raise C128Error(f"cannot stage the refresh ({exc}); nothing was changed in "
                                f"{', '.join(map(str, roots))}") from None
            raise
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)  # from the commit point on, a signal waits for the end
        try:
            os.replace(roots[0] / STAGING, roots[0] / TXN)  # the commit point: the first part's plan names the group
            _fsync_dir(roots[0])
            fault("refresh-committed")
            _finish(group, fault)
        finally:
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)  # (a signal that came is raised here)
            except KeyboardInterrupt as stop:
                raise Interrupted.by(stop, f"the write into {', '.join(map(str, roots))} was whole before it stopped "
                                           "(the signal came past its commit point)") from None


def _read(folder: Path) -> dict | None:
    """The plan in ``folder``: a regular file there, none through a link (it could name any file of the machine)."""
    path = folder / PLAN
    if os.path.islink(folder) or os.path.islink(path):
        raise C128Error(f"the interrupted refresh {path}: a symbolic link; the tool writes a plain file there")
    return read_json(path, dict)


def _plan(root: Path, folder: str, group: bool = True) -> dict:
    """``root``'s plan in ``folder``, checked: paths confined, its group naming ``root`` (and holding it)."""
    where = f"the interrupted refresh {root / folder / PLAN}"
    confine(root, f"{folder}/{PLAN}", where, regular=True)
    plan = _object(_read(root / folder), where)
    moves, deletes, group_of = plan.get("moves"), plan.get("deletes"), plan.get("group")
    parts = group_of.get("parts") if isinstance(group_of, dict) else None
    if not isinstance(moves, list) or not isinstance(deletes, list) or not all(isinstance(d, str) for d in deletes) \
            or not all(isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m)  # (an int: a
                       and _STAGED.fullmatch(m[0]) for m in moves):  # TypeError at its move, the ones before done)
        raise C128Error(f"{where}: 'moves' must be pairs of a staged file and a path, 'deletes' paths")
    for rel in [*(rel for _, rel in moves), *deletes]:
        if rel.split("/")[0] in (TXN, STAGING):
            raise C128Error(f"{where}: {rel!r} is the transaction's own folder")
        confine(root, rel, where)
    for staged in (f"{folder}/files/{m[0]}" for m in moves):  # each one still to move: a regular file, no link (a
        if os.path.lexists(root / staged):  # link or FIFO was refused only at its own move, the ones before it done)
            confine(root, staged, where, regular=True)
    if why := _not_files(root, [*(rel for _, rel in moves), *deletes]):
        raise C128Error(f"{where}: {why}; nothing was moved")
    if why := _on_the_way(root, [*(rel for _, rel in moves), *deletes]):
        raise C128Error(f"{where}: {why}: not written (whoever else may change it can swap a folder for a link "
                        "between the check and the move)")
    if not isinstance(parts, list) or os.path.realpath(root) not in parts:
        raise C128Error(f"{where}: its group does not name its own folder {root}")
    for part in parts if group else ():
        if why := _not_the_users(part, root):
            raise C128Error(f"{where}: its group names {part!r}, {why}: not written (whoever else may change it "
                            "can swap a folder for a link between the check and the move)")
        if not any((_read(Path(part) / f) or {}).get("group") == group_of for f in (TXN, STAGING)):
            raise C128Error(f"{where}: {part!r} is not a folder of the same refresh")
    return plan


def _object(plan: dict | None, where: str) -> dict:
    """A plan read as a JSON object; else one line that says so (bytes that are none, not UTF-8 or too deep, were
    "'moves' must be pairs of a staged file and a path", helper 175)."""
    if plan is None:
        raise C128Error(f"{where}: not a journal the tool writes (no JSON object: damaged, not UTF-8 or nested too "
                        "deeply)")
    return plan


def _not_the_users(part: object, root: Path) -> str:
    """Why another folder of a plan's group is not one only the user may change ("" when it is): not an absolute path,
    another user's, or writable by others or by a group not the user's own (it, or its ``patches/``)."""
    if not isinstance(part, str) or not os.path.isabs(part):
        return "not an absolute path"
    if os.path.realpath(part) == os.path.realpath(root):
        return ""
    return next(filter(None, map(_others_may_change, (part, os.path.join(part, "patches")))), "")


def _not_files(root: Path, rels: list[str]) -> str:
    """Why a path a plan replaces or removes cannot be (it is there and no regular file: a folder, a FIFO), "" when
    each can: ``os.replace`` onto a folder failed past the commit point (a traceback, the folder half written)."""
    return next((f"{rel} {not_a_file(root / rel)} (put a regular file there, or remove it)" for rel in rels
                 if os.path.lexists(root / rel) and not (root / rel).is_file()), "")


def _on_the_way(root: Path, rels: list[str]) -> str:
    """Why a folder a plan writes through (``root`` itself and each folder on the way to its paths) is one another user
    may change ("" when none is): theirs, or writable by others or by a group not the user's own."""
    real = os.path.realpath(root)  # (a link to the folder is the operator's spelling; confine refuses one below it)
    folders = {os.path.join(real, *PurePosixPath(rel).parts[:n]) for rel in rels
               for n in range(len(PurePosixPath(rel).parts))}
    return next((f"{folder} is {why}" for folder in sorted(folders) if (why := _others_may_change(folder))), "")


def _others_may_change(path: str) -> str:
    """Why a user other than the current one may change ``path`` ("" when none may, or it is not there): theirs, or
    writable by others or by a group not the user's own."""
    try:
        st = os.lstat(path)
    except OSError:
        return ""
    if st.st_uid != os.getuid():
        return f"owned by another user (uid {st.st_uid})"
    return "writable by other users" if st.st_mode & 0o002 or st.st_mode & 0o020 and st.st_gid != os.getgid() else ""


def _finish(group: dict, fault: Callable[[str], None] = _no_fault) -> None:
    """Finish every other part of a committed group (plans kept until all are done), then the first."""
    head, *others = (Path(p) for p in group["parts"])
    plans = {root: _plan(root, TXN if (root / TXN).is_dir() else STAGING) for root in (head, *others)}
    for k, root in enumerate(others, 1):
        if not (root / TXN).is_dir():
            os.replace(root / STAGING, root / TXN)
            _fsync_dir(root)
        _roll_forward(root, plans[root])
        fault(f"refresh-swapped:{k}")
    _roll_forward(head, plans[head], fault)
    for root in (head, *others):  # a part whose first part's plan is gone finishes alone
        shutil.rmtree(root / TXN, ignore_errors=True)


def _roll_forward(root: Path, plan: dict, fault: Callable[[str], None] = _no_fault) -> None:
    where = f"the refresh of {root}"
    for n, (staged, rel) in enumerate(plan["moves"]):
        src = root / TXN / "files" / staged
        if src.exists():  # not moved yet (a re-run after a kill skips the ones done)
            confine(root, f"{TXN}/files/{staged}", where, regular=True)
            dest = confine(root, rel, where)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
        fault(f"refresh-moved:{n}")
    for rel in plan["deletes"]:
        confine(root, rel, where).unlink(missing_ok=True)


def _undo(root: Path) -> str:
    """The way back from a journal that cannot be finished, as commands that work as printed (``git -C ROOT checkout``
    was printed for a folder in no git work tree too)."""
    rm = f"rm -rf {shell_join([root / TXN, root / STAGING])}"
    if any((p / ".git").exists() for p in (root.absolute(), *root.absolute().parents)):
        return (f"restore patches/ of each other folder it wrote from git too, then here: "
                f"git -C {shell_quote(root)} checkout -- patches && {rm}")
    return (f"{root} is in no git work tree: put back its patches/ (and each other folder it wrote) from your copy, "
            f"then remove its journal: {rm}")


# what a sound journal meets where the folder cannot take a write now: it is kept for a run that can
_NOT_HERE = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM}


def recover(root: Path) -> str | None:
    """Finish an interrupted committed transaction (with its whole group), or drop an uncommitted one; says which."""
    if not ((root / TXN).exists() or (root / STAGING).exists()):
        return None
    with locked(root):  # not while a writer stages
        try:
            for folder in (TXN, STAGING):
                group = (_read(root / folder) or {}).get("group") if (root / folder).is_dir() else None
                parts = group.get("parts") if isinstance(group, dict) else None
                if isinstance(parts, list) and parts and isinstance(parts[0], str) \
                        and (_read(Path(parts[0]) / TXN) or {}).get("group") == group:
                    _plan(root, folder)
                    _finish(group)
                    return "finished an interrupted refresh"
            if (root / TXN).is_dir():  # its first part's plan is gone: the group was finished but for this one
                _roll_forward(root, _plan(root, TXN, group=False))
                shutil.rmtree(root / TXN)
                return "finished an interrupted refresh"
        except (OSError, ValueError, KeyError, TypeError, C128Error) as exc:
            why = exc.message if isinstance(exc, C128Error) else str(exc)
            if isinstance(exc, OSError) and exc.errno in _NOT_HERE and (root / TXN).is_dir():
                # a sound journal the folder cannot take now (a read-only mount, a full disk): the undo threw away a
                # write past its commit point, and its `rm -rf` failed there as printed (helper 164)
                raise C128Error(f"{root / TXN}: an interrupted refresh cannot be finished here ({why}); it is past its "
                                f"commit point: nothing of it is lost; make {root} writable (or free space) and run "
                                "it again: reading the folder finishes the write") from None
            raise C128Error(f"{root / TXN}: an interrupted refresh cannot be finished ({why}); {_undo(root)}") from None
        if (root / STAGING).is_dir():
            shutil.rmtree(root / STAGING, ignore_errors=True)
            return "dropped an interrupted refresh that had not written anything"
        return None
