"""All-or-nothing writes into a series folder (``refresh``): stage, commit by one rename, roll forward.

``commit(root, files, deletes)`` stages every new file under ``<root>/.c128patch-txn/`` (a
temporary name while staging), writes the plan (which staged file goes where, which files go),
then renames the staging folder to its final name: that rename is the commit point. Only then
are the files moved into place (``os.replace``, the manifest last) and the stale ones removed.
A kill before the commit point leaves the old series (the half-staged folder is removed by the
next reader); a kill after it leaves a committed plan that ``recover`` (run by ``load_series``,
so by every command that reads the series) finishes. Either way every reader sees the old series
or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
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
        pass
    finally:
        os.close(fd)


def commit(root: Path, files: dict[Path, bytes], deletes: list[Path], last: Path | None = None,
           fault: Callable[[str], None] = _no_fault) -> None:
    """Write ``files`` and remove ``deletes`` under ``root`` as one transaction (``last``: the file
    moved into place last, the manifest). ``fault(point)`` is called at each named point (the
    fault-injection hook of the tests: ``ops.faults``)."""
    recover(root)
    staging, final = root / STAGING, root / TXN
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "files").mkdir(parents=True)
    order = sorted(files, key=lambda p: (last is not None and p == last, str(p)))
    moves = []
    for i, path in enumerate(order):
        rel = _rel(root, path)
        staged = staging / "files" / f"{i:05d}"
        with open(staged, "wb") as fh:
            fh.write(files[path])
            fh.flush()
            os.fsync(fh.fileno())
        moves.append([f"{i:05d}", rel])
        fault(f"refresh-staged:{i}")
    plan = {"moves": moves, "deletes": [_rel(root, p) for p in deletes]}
    with open(staging / PLAN, "w") as fh:
        json.dump(plan, fh)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(staging)
    fault("refresh-before-commit")
    os.replace(staging, final)  # the commit point
    _fsync_dir(root)
    fault("refresh-committed")
    _roll_forward(root, final, fault)


def _roll_forward(root: Path, txn: Path, fault: Callable[[str], None] = _no_fault) -> None:
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
    shutil.rmtree(txn)


def recover(root: Path) -> str | None:
    """Finish a committed transaction a kill interrupted, or drop an uncommitted one; says which."""
    if (root / TXN).is_dir():
        try:
            _roll_forward(root, root / TXN)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise C128Error(f"{root / TXN}: an interrupted refresh cannot be finished ({exc}); "
                            f"restore patches/ from git (git -C {root} checkout -- patches) and remove {root / TXN}") from None
        return "finished an interrupted refresh"
    if (root / STAGING).is_dir():
        shutil.rmtree(root / STAGING, ignore_errors=True)
        return "dropped an interrupted refresh that had not written anything"
    return None
