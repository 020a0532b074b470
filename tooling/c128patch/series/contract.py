"""The series' API contract lock (``patches/contract.lock``): the upstream surface the series uses.

One line per use: what kind of definition, its dotted (Python) or qualified (C++) name, our use site,
upstream's definition at the series base, the hash of its signature there (and of any signature
accepted since, comma-separated), the call's shape, and the signature text after ``#`` for the
reviewer. ``refresh`` writes it (``fit.contract``); a change of the surface shows in its diff.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from c128patch.errors import C128Error
from c128patch.series.manifest import read_series_file
from c128patch.series.paths import check_relpath, confine
from c128patch.textsafe import shell_quote

LOCK_NAME = "contract.lock"
HEADER = ("# c128patch API contract: the upstream surface this series uses, one line per use site.\n"
          "# Written by `c128patch refresh` from the patched tree at the series base; checked by "
          "`c128patch contract`.\n"
          "# kind  upstream-name  our-site  upstream-definition  sig=HASH[,ACCEPTED...]  [call=SHAPE]  # signature\n"
          "# (callback: ours called by upstream, site = upstream's call; installed: upstream's method ours replaces; "
          "member: on an untyped receiver; typed: on "
          "a receiver typed as upstream's class; mirror: a value the rules copy; declared: a namespace member the "
          "rules decide; config: a leaf of a config namespace the rules read; file: an upstream file our code mirrors "
          "with nothing to check, sig = its blob ids (recorded, then reviewed: `contract --accept`; refresh adds "
          "none), the signature says why)\n")


# the kinds of line refresh writes (``LockItem.kind``)
KINDS = frozenset(("module", "function", "class", "method", "attr", "value", "env", "header", "cxx", "member", "typed",
                   "mirror", "declared", "config", "callback", "installed", "file"))
_SIG = re.compile(r"-|[0-9a-f]{12,64}")
_AT = re.compile(r"(.+?)(?::([1-9][0-9]*))?")
_C1 = re.compile("[\x80-\x9f]")


def _odd(kind: str, site: str, where: str, sigs: list[str]) -> str:
    """Why a lock line's fields are not ones refresh writes ("" if they are): a known kind, our site a relative
    ``path:line`` in the tree, upstream's definition a relative ``path:line`` (a mirrored file's: ``path``), no
    control character, each signature hash hex or ``-``."""
    if kind not in KINDS:
        return f"kind {kind!r} is none of {', '.join(sorted(KINDS))}"
    for what, value, line in (("site", site, True), ("definition", where, kind != "file")):
        if _C1.search(value):  # (``check_relpath`` refuses C0 and DEL only)
            return f"its {what} {value!r} holds a control character"
        m = _AT.fullmatch(value)
        try:
            check_relpath(m[1] if m else value, f"its {what}")
        except C128Error as exc:
            return exc.message
        if line and not m[2]:
            return f"its {what} {value!r} is not path:line"
    if odd := next((s for s in sigs if not _SIG.fullmatch(s)), None):
        return f"signature hash {odd!r} is not hex"
    return ""


def sig_hash(text: str) -> str:
    """12 hex digits of the signature text's sha256 (``-`` for a definition without a signature)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text else "-"


@dataclass(frozen=True)
class LockItem:
    kind: str  # module function class method attr value env header cxx; member typed mirror declared config callback
    # installed file
    target: str
    site: str  # our file:line
    where: str  # upstream path:line at the base
    sigs: tuple[str, ...]  # the base's hash first, then accepted ones
    shape: str = ""
    signature: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.target

    def line(self) -> str:
        parts = [self.kind, self.target, self.site, self.where, "sig=" + ",".join(self.sigs)]
        if self.shape:
            parts.append("call=" + self.shape)
        text = "  ".join(parts)
        return f"{text}  # {self.signature}" if self.signature else text


@dataclass
class Lock:
    path: Path
    items: list[LockItem] = field(default_factory=list)
    base: str = ""

    def accepted(self) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for item in self.items:
            out.setdefault(item.key, set()).update(item.sigs)
        return out

    def recorded(self) -> dict[tuple[str, str], LockItem]:
        return {item.key: item for item in self.items}

    def classes(self) -> dict[str, list[str]]:
        """attribute -> the classes defining it at the base, for the members we use on untyped receivers."""
        pairs = sorted({tuple(item.target.rsplit(".", 1)) for item in self.items if item.kind == "member"})
        return {attr: [cls for cls, a in pairs if a == attr] for _, attr in pairs}

    def text(self) -> str:
        lines = [HEADER + f"# base {self.base}\n"]
        lines += [item.line() + "\n" for item in sorted(set(self.items), key=lambda i: (i.kind, i.target, i.site))]
        return "".join(lines)


def lock_path(patches_dir: Path) -> Path:
    return patches_dir / LOCK_NAME


def read_lock(patches_dir: Path) -> Lock | None:
    """The committed lock, or None when the series has none; a malformed line or a symlink is refused."""
    path = lock_path(patches_dir)
    if not os.path.lexists(path):
        return None  # (a FIFO or a folder there was "no lock", and refresh's write onto a folder a traceback)
    confine(patches_dir.parent, f"{patches_dir.name}/{LOCK_NAME}", "the contract lock", regular=True)
    lock = Lock(path)
    data = read_series_file(path)  # (over 64 MiB: one line, never read into memory)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = data[:exc.start].count(b"\n") + 1
        raise C128Error(f"{path}:{number}: not UTF-8 (at byte {exc.start}); {_rewrite(path, number)}") from None
    for number, raw in enumerate(text.splitlines(), 1):
        body, _, signature = raw.partition("  # ")
        if raw.startswith("# base "):
            lock.base = raw.removeprefix("# base ").strip()
        if not body.strip() or body.lstrip().startswith("#"):
            continue
        parts = body.split()
        if len(parts) < 5 or not parts[4].startswith("sig="):
            raise C128Error(f"{path}:{number}: not a contract line (kind name site definition sig=HASH ...); "
                            + _rewrite(path, number))
        if why := _odd(parts[0], parts[2], parts[3], parts[4][4:].split(",")):
            raise C128Error(f"{path}:{number}: not a contract line refresh writes ({why}); {_rewrite(path, number)}")
        shape = next((p.removeprefix("call=") for p in parts[5:] if p.startswith("call=")), "")
        lock.items.append(LockItem(parts[0], parts[1], parts[2], parts[3], tuple(parts[4][4:].split(",")), shape,
                                   signature.strip()))
    return lock


def _rewrite(path: Path, number: int) -> str:
    """The fix for a bad line: refresh reads the lock it rewrites (the signatures it accepted), so the line goes
    first; the refresh names the series the lock is of (without it, the tool's own was refreshed: helper 175)."""
    series = path.absolute().parent.parent
    return (f"delete that line (`sed -i {number}d {shell_quote(path)}`), then rewrite the lock from the patched tree "
            f"with `c128patch refresh --series {shell_quote(series)}`")


def merged(new: list[LockItem], old: Lock | None) -> list[LockItem]:
    """``new`` with the signatures ``old`` accepted for the same (kind, name) kept after the base's, and the
    namespace members ``old`` lists as reviewed that the base does not declare; a mirrored file (kind ``file``) the
    lock has keeps the blobs it holds, the new base's not added: only ``contract --accept`` adds one, after review."""
    accepted = old.accepted() if old is not None else {}
    keys = {item.key for item in new}
    kept = [i for i in (old.items if old is not None else []) if i.kind == "declared" and i.key not in keys]
    files = {i.key: i.sigs for i in (old.items if old is not None else []) if i.kind == "file"}
    return [replace(item, sigs=files[item.key]) if item.key in files else
            replace(item, sigs=item.sigs + tuple(sorted(accepted.get(item.key, set()) - set(item.sigs))))
            for item in new] + kept
