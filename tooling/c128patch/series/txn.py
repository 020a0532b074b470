"""All-or-nothing writes into a series folder (``refresh``): stage, commit by one rename, roll forward.

``commit(root, files, deletes)`` stages every new file under ``<root>/.c128patch-txn/`` (a
temporary name while staging), writes the plan (which staged file goes where, which files go),
then renames the staging folder to its final name: that rename is the commit point. Only then
are the files moved into place (``os.replace``, the manifest last) and the stale ones removed.
A kill before the commit point leaves the old series (the half-staged folder is removed by the
next reader); a kill after it leaves a committed plan that ``recover`` (run by ``load_series``,
so by every command that reads the series) finishes. Either way every reader sees the old series
or the new one, never a mix.

``commit_all`` writes several folders (a stack: our series and its layers) as one transaction
(``commit`` is the case of one): every part is staged first (a failure there removes every staging
folder: nothing changed), then the first part's staging is renamed (the one commit point), then the
others are swapped in and finished (``_finish_group``). ``recover`` finishes a group from any of its
parts once the first is committed, and drops it before; if that fails, the error names the way back.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path, PurePosixPath
from typing import Callable

from c128patch.errors import C128Error

TXN = ".c128patch-txn"
STAGING = ".c128patch-txn-staging"
PLAN = "plan.json"


def _no_fault(_name: str) -> None:
    return None


def _rel(root: Path, path: Path) -> str:
    try:  # by name (a symlink in the series is not followed here)
        rel = path.relative_to(root).as_posix() if path.is_absolute() else path.as_posix()
    except ValueError:
        rel = ""
    parts = PurePosixPath(rel).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or parts[0] in (TXN, STAGING):
        raise C128Error(f"internal: refusing to write {path} outside the series folder {root}")
    return rel


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every file system syncs a folder; the rename is still atomic
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _stage(root: Path, files: dict[Path, bytes], deletes: list[Path], last: Path | None,
           fault: Callable[[str], None], prefix: str = "", group: dict | None = None) -> None:
    """Stage the new files and the plan in ``root``'s staging folder (nothing in place changes)."""
    staging = root / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "files").mkdir(parents=True)
    order = sorted(files, key=lambda p: (last is not None and p == last, str(p)))
    moves = []
    for i, path in enumerate(order):
        rel = _rel(root, path)
        _write_synced(staging / "files" / f"{i:05d}", files[path])
        moves.append([f"{i:05d}", rel])
        fault(f"refresh-{prefix}staged:{i}")
    plan = {"moves": moves, "deletes": [_rel(root, p) for p in deletes], **({"group": group} if group else {})}
    _write_synced(staging / PLAN, json.dumps(plan).encode())
    _fsync_dir(staging)


def _swap(root: Path) -> None:
    os.replace(root / STAGING, root / TXN)
    _fsync_dir(root)


def commit(root: Path, files: dict[Path, bytes], deletes: list[Path], last: Path | None = None,
           fault: Callable[[str], None] = _no_fault) -> None:
    """Write ``files`` and remove ``deletes`` under ``root`` as one transaction (``last``: the file
    moved into place last, the manifest). ``fault(point)`` is called at each named point (the
    fault-injection hook of the tests: ``ops.faults``)."""
    commit_all([(root, files, deletes, last)], fault)


Part = tuple[Path, dict[Path, bytes], list[Path], Path | None]  # root, files, deletes, last


def commit_all(parts: list[Part], fault: Callable[[str], None] = _no_fault) -> None:
    """``commit`` for several folders as one transaction (see the module doc). Fault points of part
    ``k`` > 0 are named ``refresh-part<k>-...``; the swap's ``refresh-swapped:<k>``."""
    if not parts:
        return
    roots = [root for root, *_ in parts]
    group = {"id": uuid.uuid4().hex, "head": str(roots[0]), "parts": [str(r) for r in roots]}
    try:
        for k, (root, files, deletes, last) in enumerate(parts):
            recover(root)
            _stage(root, files, deletes, last, fault, "" if k == 0 else f"part{k}-", group)
        fault("refresh-before-commit")
    except BaseException as exc:
        for root in roots:
            shutil.rmtree(root / STAGING, ignore_errors=True)
        if isinstance(exc, OSError):
            raise C128Error(f"cannot stage the refresh ({exc}); nothing was changed in {', '.join(map(str, roots))}") \
                from None
        raise
    _swap(roots[0])  # the commit point: the first part's plan names the group
    fault("refresh-committed")
    _finish_group(roots[0], group, fault)


def _finish_group(head: Path, group: dict, fault: Callable[[str], None] = _no_fault) -> None:
    """Swap in and finish every other part of a committed group, keeping each one's plan (so a reader
    of that part finishes the group), then the first part, then the other plans."""
    others = [Path(part) for part in group["parts"][1:]]
    for k, root in enumerate(others, 1):
        if _plan_group(root / STAGING) == group["id"]:
            _swap(root)
        if (root / TXN).is_dir():
            _roll_forward(root, root / TXN, remove=False)
        fault(f"refresh-swapped:{k}")
    _roll_forward(head, head / TXN, fault)
    for root in others:
        shutil.rmtree(root / TXN, ignore_errors=True)


def _group(folder: Path) -> dict | None:
    """The group a staged or committed plan in ``folder`` belongs to (``commit_all``), if any."""
    try:
        group = json.loads((folder / PLAN).read_text()).get("group")
    except (OSError, ValueError, AttributeError):
        return None
    return group if isinstance(group, dict) and isinstance(group.get("id"), str) else None


def _plan_group(folder: Path) -> str | None:
    return (_group(folder) or {}).get("id")


def _committed(group: dict) -> bool:
    """Whether ``group``'s first part is committed (its plan, naming the group, under its TXN)."""
    return isinstance(group.get("head"), str) and _plan_group(Path(group["head"]) / TXN) == group["id"]


def _roll_forward(root: Path, txn: Path, fault: Callable[[str], None] = _no_fault, remove: bool = True) -> None:
    plan = json.loads((txn / PLAN).read_text())
    for n, (staged, rel) in enumerate(plan["moves"]):
        src = txn / "files" / staged
        if src.exists():  # not moved yet (a re-run after a kill skips the ones done)
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
        fault(f"refresh-moved:{n}")
    for rel in plan["deletes"]:
        try:
            (root / rel).unlink()
        except FileNotFoundError:
            pass
    if remove:
        shutil.rmtree(txn)


def recover(root: Path) -> str | None:
    """Finish a committed transaction a kill interrupted, or drop an uncommitted one; says which.
    A part of a group (``commit_all``) is finished with the whole group once its first part is committed."""
    try:
        for folder in (root / TXN, root / STAGING):
            group = _group(folder) if folder.is_dir() else None
            if group is not None and _committed(group):
                _finish_group(Path(group["head"]), group)
                return "finished an interrupted refresh"
        if (root / TXN).is_dir():
            _roll_forward(root, root / TXN)
            return "finished an interrupted refresh"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise C128Error(f"{root / TXN}: an interrupted refresh cannot be finished ({exc}); restore patches/ of "
                        f"each folder it wrote from git (git -C {root} checkout -- patches) and remove their "
                        f"{TXN} and {STAGING} folders") from None
    if (root / STAGING).is_dir():
        shutil.rmtree(root / STAGING, ignore_errors=True)
        return "dropped an interrupted refresh that had not written anything"
    return None
