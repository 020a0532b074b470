"""The series' API contract: the upstream surface our code (every overlay file, every line a patch adds)
uses, derived from a patched tree and checked on any tree (``fit.resolve`` collects the uses and resolves
them, ``fit.contract_names`` the other direction and the names, ``fit.contract_cxx`` the CUDA headers). A missing
module, name, attribute or header is an error; so is a call either way that does not bind (``Signature.bind``)
and a change of a ``VALUE_KINDS`` item, and a changed signature where our positional argument now lands on another
parameter (``fit.compat``: a same-arity swap, a NamedTuple's fields reordered); parameters only added with defaults
are a note; another signature the lock did not record at the base (or accept since) is a warning. An upstream file
our code mirrors with nothing to check (``contract_cxx.MIRRORED``, lock kind ``file``) whose blob the lock did not
record (nor accept since) is not checked (``unchecked``: never ``holds`` until reviewed and accepted); one gone is an
error. Each finding names our file:line, upstream's file:line and both sides."""

from __future__ import annotations

import inspect
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.fit import compat
from c128patch.fit import contract_cxx as cxx
from c128patch.fit import contract_names as names
from c128patch.fit.resolve import (
    PY_ROOT,
    TreeReader,
    Upstream,
    Use,
    collector_held,
    our_lines,
    signature_of,
    upstream_line,
    uses_in,
)
from c128patch.fit.unbound import unbound
from c128patch.git import Git
from c128patch.jsonio import locked, write_atomic
from c128patch.ops.replay import FAILED, replay_in_index
from c128patch.series.contract import Lock, LockItem, read_lock, sig_hash
from c128patch.series.manifest import Series
from c128patch.series.plan import index_git
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance
from c128patch.textsafe import shell_quote


@dataclass
class Item:
    """One resolved use: what the lock records and a check compares."""

    kind: str
    target: str
    site: str
    where: str = ""
    signature: str = ""
    shape: str = ""
    bind_error: str = ""
    blob: str = ""  # kind file: the upstream file's blob id (the signature says why we mirror it)

    @property
    def sig(self) -> str:
        return self.blob or sig_hash(self.signature)

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.target


@dataclass
class Finding:
    level: str  # error | warning | unchecked | note
    message: str
    site: str = ""
    where: str = ""
    target: str = ""
    recorded: str = ""
    now: str = ""
    acceptable: bool = False  # --accept may record it after review (a call that does not bind never is)


@dataclass
class ContractResult:
    items: list[Item] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def unchecked(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "unchecked"]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.warnings and not self.unchecked

    def verdict(self) -> str:
        n = len({(i.kind, i.target) for i in self.items})
        if self.errors:
            return (f"broken: {len(self.errors)} error(s), {len(self.warnings)} warning(s) "
                    f"over {n} upstream definition(s)")
        if self.warnings:
            return (f"changed: {len(self.warnings)} upstream signature(s) differ from the lock "
                    f"({n} definition(s) checked)")
        if self.unchecked:
            return (f"not checked: {len(self.unchecked)} upstream file(s) our code mirrors changed since the lock "
                    f"(review each, then --accept; {n} definition(s) checked)")
        return f"holds: {n} upstream definition(s) resolved and bound"

    def to_json(self) -> dict:
        return {"ok": self.ok, "verdict": self.verdict(), "errors": len(self.errors), "warnings": len(self.warnings),
                "unchecked": len(self.unchecked), "findings": [asdict(f) for f in self.findings],
                "items": [asdict(i) for i in self.items], "seconds": round(self.seconds, 3)}


def derive(series: Series, git: Git, upstream: str, head: str,
           lock: Lock | None = None) -> tuple[list[Item], list[Finding]]:
    """Every use of upstream by our code on ``head`` (a patched tree-ish over ``upstream``), resolved there;
    a member used on an untyped receiver in the classes ``lock`` records (None: those defining it on ``head``)."""
    with collector_held():
        return _derive(series, git, upstream, head, lock)


def _derive(series: Series, git: Git, upstream: str, head: str,
            lock: Lock | None) -> tuple[list[Item], list[Finding]]:
    reader = TreeReader(git, head)
    sources = {e.target: e.source for e in reversed(series.entries) if not e.is_patch}  # an overlay: ours, its source
    try:
        changed = git.changed_files(upstream, head)
        ours: dict[str, set[int] | None] = {p: None for p in changed if p in sources}
        added, hunks = our_lines(git, upstream, head, [p for p in changed if p not in sources])
        ours.update(added)
        up = Upstream(reader, ours)
        items: list[Item] = []
        findings: list[Finding] = []
        uses: list[tuple[Use, str]] = []
        for path in sorted(ours):
            if not path.endswith(".py") or not path.startswith(f"{PY_ROOT}/"):
                continue
            tree = up.parse(path)
            if tree is None:
                findings.append(Finding("error", up.errors.get(path, f"{path}: unreadable"), site=path))
                continue
            found = uses_in(path, tree, ours[path]) + names.untyped_uses(tree, ours[path], path)
            uses += [(use, sources.get(path, path)) for use in found]
            findings += [Finding("error", f"{sources.get(path, path)}:{line}: our line reads {name}, which neither "
                                 f"{fn} nor its module binds on this tree (a NameError when the line runs)",
                                 site=f"{sources.get(path, path)}:{line}", target=name)
                         for line, name, fn in unbound(tree, up.reader.text(path) or "", path, ours[path])]
        mirrors, spaces = names.rules(up, ours, sources)
        uses += [(use, sources.get(names.RULES, names.RULES)) for use in mirrors]
        items += [Item(**fields) for fields in spaces]
        context: set[int] = set()  # the lines of the rules' function reading the config namespaces
        config_items, config_findings = names.context_reads(up, ours, sources, context)
        items += [Item(**fields) for fields in config_items]
        findings += [Finding(**fields) for fields in config_findings]
        uses = [(u, site) for u, site in uses if u.kind != "untyped" or not names.in_context(u, context)]
        typed = {(site, u.line, u.chain[-1]) for u, site in uses if u.kind == "typed"}  # ``self.x.y``, ``x`` typed
        untyped = [(u, site) for u, site in uses if u.kind == "untyped" and (site, u.line, u.chain[0]) not in typed]
        _resolve_all(up, [(u, site) for u, site in uses if u.kind not in ("untyped", "typed")], items, findings)
        # the untyped names: in the classes the lock records, else in those defining them at the base, narrowed
        # by the names each receiver reads
        told = _told(up, untyped, lock, set(sources.values()), findings)
        recorded = lock.recorded() if lock is not None else {}
        for use, site in [(u, site) for u, site in uses if u.kind == "typed"]:  # what resolves at the base (not a
            got, found = _resolve_use(up, use, site)  # mixin's self.attr), then what the lock records
            if got or ("typed", ".".join(use.chain)) in recorded:
                items, findings = items + got, findings + found
        _resolve_members(up, untyped, told, items, findings)
        _installed(up, names.installs(up, ours, sources), lock, items, findings, ours, sources)
        for fields, call, sig in names.callbacks(up, ours, sources):
            items.append(Item(**fields))
            findings += _bound(items[-1], sig, call, f"upstream's call of our {items[-1].target}")
        for path, why in sorted(up.errors.items()):
            if path not in ours:
                findings.append(Finding("error", f"upstream code does not parse: {why}", where=path))
        c_items, c_findings = cxx.derive(reader, ours, lambda p: sources.get(p, p))
        items += [Item(**i) for i in c_items]
        findings += [Finding(**f) for f in c_findings]
        f_items, f_findings = cxx.mirrored(git, upstream, reader, ours, lambda p: sources.get(p, p))
        items += [Item(**i) for i in f_items]
        findings += [Finding(**f) for f in f_findings]
    except RecursionError:  # input: an expression that parses but nests past what reading it back recurses through
        raise C128Error(f"upstream code on {head} nests too deeply to read (past Python's recursion limit): no "
                        "contract derived") from None
    finally:
        reader.close()
    for item in items:  # upstream's definitions as upstream numbers them: our patches shift no lock line
        path, _, line = item.where.rpartition(":")
        if path in hunks and line.isdigit():
            item.where = f"{path}:{upstream_line(hunks[path], int(line))}"
    unique = {(i.kind, i.target, i.site): i for i in items}
    return sorted(unique.values(), key=lambda i: (i.kind, i.target, i.site)), findings


def _installed(up: Upstream, installs: list, lock: Lock | None, items: list[Item], findings: list[Finding],
               ours: dict[str, set[int] | None], sources: dict[str, str]) -> None:
    """The methods of upstream's classes our functions replace, each resolved (on the install's static bases, else on
    the classes our code names: those the lock records replaced or defining it now), and upstream's full call of it
    bound to ours, as is each call upstream's code makes of it (``names.installed_calls``: an error at its line)."""
    named = sorted({i.target for i in items if i.kind == "class"})
    recorded = {i.target for i in lock.items if i.kind == "installed"} if lock is not None else set()
    for use, site, static, fn in installs:
        attr, sig = use.chain[0], signature_of(fn.args)
        for cls in [c for c in static or named if f"{c}.{attr}" in recorded or names.replaced(up, c, attr)]:
            got, found = _resolve_use(up, Use(use.line, [*cls.split("."), attr], kind="installed"), site)
            call = names.replaced(up, cls, attr)
            items += got
            findings += found
            if got and call:
                findings += _bound(got[0], sig, Use(use.line, [], call), f"upstream's call of {got[0].target}",
                                   f"our {fn.name} ({site}:{fn.lineno}) `def {fn.name}{sig}`")
            for path, at in names.installed_calls(up, ours, cls, attr) if got else []:
                called = Item("installed", got[0].target, f"{sources.get(path, path)}:{at.line}", got[0].where)
                findings += _bound(called, sig, at, f"upstream's call of {got[0].target}",
                                   f"our {fn.name} ({site}:{fn.lineno}) `def {fn.name}{sig}`")


def _told(up: Upstream, untyped: list[tuple[Use, str]], lock: Lock | None, stable: set[str],
          findings: list[Finding]) -> list[list[str]]:
    """The classes each untyped use may read its name on: told by its receiver among those defining it at the base,
    or those the lock records; in the files of ``stable`` (our overlays, whose lines do not move) the classes the
    lock records at its line. A use whose receiver's type is not determined (several classes declare the name and
    nothing tells which) is read on none: a note says so (unresolved, not guessed)."""
    definers = names.lock_definers(lock.classes()) if lock is not None else \
        names.defining_classes(up, {u.chain[0] for u, _ in untyped})
    unresolved: dict[tuple[str, str], list[str]] = {}
    classes = names.narrowed(definers, [u for u, _ in untyped], unresolved)
    for use, site in untyped:
        if (use.receiver, use.chain[0]) in unresolved:
            receiver = use.receiver.rsplit(":", 1)[-1]
            findings.append(Finding(
                "note", f"{site}:{use.line}: {receiver}.{use.chain[0]}: the receiver's type is not determined "
                        f"({', '.join(unresolved[(use.receiver, use.chain[0])])} declare {use.chain[0]}): unresolved, "
                        "not checked", f"{site}:{use.line}", "", use.chain[0]))
    at: dict[tuple[str, str], list[str]] = {}
    for item in [i for i in lock.items if i.kind == "member"] if lock is not None else []:
        cls, _, name = item.target.rpartition(".")
        at.setdefault((item.site, name), []).append(cls)
    return [at.get((f"{site}:{u.line}", u.chain[0]), []) if lock is not None and site in stable
            else classes.get((u.receiver, u.chain[0]), []) for u, site in untyped]


def _resolve_members(up: Upstream, untyped: list[tuple[Use, str]], told: list[list[str]],
                     items: list[Item], findings: list[Finding]) -> None:
    """Each untyped use's name on each class it may be read on (``told``): an error where one of them no longer
    defines it; a class gone altogether is a note where another of them still defines it."""
    for (use, site), recorded in zip(untyped, told):
        got = [_resolve_use(up, Use(use.line, [*c.split("."), *use.chain], kind="member"), site) for c in recorded]
        held = any(found_items and not any(f.level == "error" for f in found) for found_items, found in got)
        for cls, (found_items, found) in zip(recorded, got):
            gone = [f for f in found if f.level == "error" and f.target != f"{cls}.{use.chain[0]}"]
            items += found_items
            findings += [replace(f, level="note") if held and f in gone else f for f in found]


def _resolve_all(up: Upstream, uses: list[tuple[Use, str]], items: list[Item], findings: list[Finding]) -> None:
    for use, site_file in uses:
        items_of, found = _resolve_use(up, use, site_file)
        items += items_of
        findings += found


def _resolve_use(up: Upstream, use: Use, site_file: str) -> tuple[list[Item], list[Finding]]:  # noqa: C901  one walk down a chain
    site = f"{site_file}:{use.line}"
    findings: list[Finding] = []
    chain = use.chain
    # the longest module prefix, then attributes
    at = next((i for i in range(len(chain), 0, -1) if up.module_path(".".join(chain[:i])) is not None), 0)
    if not at:
        name = ".".join(chain[:2]) if len(chain) > 1 else chain[0]
        return [], [Finding("error", f"{site}: {'.'.join(chain)}: no module {name} on this tree", site, "",
                            ".".join(chain))]
    current = up.module(".".join(chain[:at]))
    if current.kind == "ours":
        return [], []
    if current.kind == "unknown":
        return [], [Finding("error", f"{site}: {current.why}", site, current.where, current.name)]
    last: Item = Item("module", current.name, site, current.where)
    for attr in chain[at:]:
        if current.kind not in ("module", "class", "instance"):
            break  # a value or function: what it holds is not upstream's surface we can see
        nxt = up.member(current, attr)
        if nxt.kind in ("ours", "external"):
            break
        if nxt.kind == "missing":
            return [], [Finding("error", f"{site}: {'.'.join(chain)}: {nxt.why}", site, nxt.where, nxt.name)]
        if nxt.kind == "unknown" and use.kind in ("member", "typed", "installed") and attr == chain[-1]:  # at the base
            where = current.where if current.kind == "class" else nxt.where  # the class's own (nxt's: a base's)
            return [], [Finding("error", f"{site}: {'.'.join(chain)}: class {chain[-2]} ({where}) has no {attr} "
                                         f"({nxt.why})", site, where, nxt.name)]
        if nxt.kind == "unknown":
            findings.append(Finding("note", f"{site}: {nxt.name}: not resolved statically ({nxt.why})", site, nxt.where,
                                    nxt.name))
            break
        current = nxt
        text, _ = up.signature(current)
        kind = {"instance": "value"}.get(current.kind, current.kind)
        if use.kind and attr == chain[-1]:  # env, member, typed, mirror
            kind, text = use.kind, text + names.mirrored_values(current.node if use.kind == "mirror" else None)
        last = Item(kind, current.name, site, current.where, text)
    else:
        if use.call is not None and current.kind in ("function", "method", "class") and chain[at:]:
            _, sig = up.signature(current)
            findings += _bound(last, sig, use, f"call {current.name}")
    return [last] if use.kind not in ("typed", "installed") or last.kind == use.kind else [], findings  # its attr


def _bound(item: Item, sig: inspect.Signature | None, use: Use, call: str, to: str = "") -> list[Finding]:
    """The call's shape on ``item``; an error where it does not bind to ``sig`` (beside ``*args``: its keywords);
    ``to``: ``sig``'s file:line and text when not the item's (ours, installed in upstream's place)."""
    item.shape = f"{use.call[0]}" + "".join(f",{k}=" for k in use.call[1]) + (",*" if use.star else "")
    try:
        if sig is not None and use.star:
            sig.bind_partial(**dict.fromkeys(use.call[1]))
        elif sig is not None:
            sig.bind(*[None] * use.call[0], **dict.fromkeys(use.call[1]))
        return []
    except TypeError as exc:
        item.bind_error = str(exc)
    args = ", ".join([*(f"arg{i + 1}" for i in range(use.call[0])), *(f"{k}=..." for k in use.call[1])])
    to = to or f"{item.where} `{item.signature}`"
    return [Finding("error", f"{item.site}: {call}({args}) does not bind to {to}: "
                             f"{item.bind_error}", item.site, item.where, item.target, now=item.signature)]


VALUE_KINDS = ("env", "mirror", "member", "typed", "declared", "installed")  # a change: an error until --accept


class Review(NamedTuple):
    """How a finding's commands name the target: the repository ``git -C`` diffs in, the rev, the accept command."""

    repo: str
    rev: str
    accept: str


def compare(items: list[Item], lock: Lock | None, review: Review | None = None) -> list[Finding]:
    """Warnings for definitions whose signature the lock did not record (nor accept since); errors for the values
    and names of ``VALUE_KINDS`` and a namespace member the lock does not list; a mirrored upstream file (kind
    ``file``) whose blob the lock does not hold is not checked (``unchecked``), with the commands of ``review``."""
    if lock is None:
        return [Finding("warning", "the series has no patches/contract.lock: nothing to compare the signatures "
                                   "with (c128patch refresh writes it)")]
    accepted, recorded = lock.accepted(), lock.recorded()
    out, first = [], {}
    for item in sorted(items, key=lambda i: not i.shape):  # a call's line before its import's
        first.setdefault((item.kind, item.target), item)
    for key, item in first.items():
        if key not in accepted and item.kind == "declared":
            out.append(Finding(
                "error", f"{item.where}: upstream declares {item.target}, which the rules ({item.site}) neither "
                         f"accept nor refuse and {lock.path.name} does not list as ignored (review, then --accept)",
                item.site, item.where, item.target, now=item.signature, acceptable=True))
        elif key not in accepted:
            out.append(Finding("note", f"{item.site}: {item.target} is not in {lock.path.name} (checked, not compared)",
                               item.site, item.where, item.target, now=item.signature))
        elif item.kind == "file" and item.sig not in accepted[key]:
            out.append(_file_changed(item, recorded[key].sigs[0], lock.base, review))
        elif item.sig not in accepted[key]:
            out.append(_changed(item, recorded[key], lock.base, [i for i in items if i.key == key and i.shape]))
    return out


def _changed(item: Item, old: LockItem, base: str, calls: list[Item]) -> Finding:
    """A signature the lock does not hold: an error for a value (``VALUE_KINDS``) and, never acceptable, for a call of
    ours whose positional argument now lands on another parameter (``compat.moved``); a note where parameters were
    only added with defaults (``compat.compatible``); else a warning to review."""
    said = (f"{item.target} changed since the lock: {old.where} `{old.signature}` at {base or 'the base'}, now "
            f"{item.where} `{item.signature}`")
    if item.kind in VALUE_KINDS:
        return Finding("error", f"{item.site}: {said}", item.site, item.where, item.target, recorded=old.signature,
                       now=item.signature, acceptable=True)
    offset = {"function": 0, "class": int(": __init__(" in old.signature)}.get(item.kind)  # (self: binding's)
    for call in calls if offset is not None else []:  # (one that does not bind is an error already)
        if not call.bind_error and (why := compat.moved(old.signature, item.signature, call.shape, offset)):
            return Finding("error", f"{call.site}: our call of {item.target} binds differently now ({why}; change "
                                    f"our call): {said}", call.site, item.where, item.target, recorded=old.signature,
                           now=item.signature)
    if compat.compatible(old.signature, item.signature):
        return Finding("note", f"{item.site}: {said}: parameters only added, with defaults (each call binds as at "
                               "the base)", item.site, item.where, item.target, recorded=old.signature,
                       now=item.signature, acceptable=True)
    return Finding("warning", f"{item.site}: {said}", item.site, item.where, item.target, recorded=old.signature,
                   now=item.signature, acceptable=True)


def _file_changed(item: Item, old: str, base: str, review: Review | None) -> Finding:
    """A mirrored upstream file whose blob the lock does not hold: not checked, one line with the diff to review (from
    the blob the lock records at its base) and the command that then accepts it."""
    review = review or Review(".", "REV", "c128patch contract --sglang-rev REV --accept")
    diff = f"git -C {shell_quote(review.repo)} diff {old} {shell_quote(f'{review.rev}:{item.target}')}"
    return Finding("unchecked", f"{item.target}: changed upstream since the lock ({old[:12]} at {base or 'the base'}, "
                                f"now {item.blob[:12]}), and nothing checks what our {item.site} mirrors of it: "
                                f"{item.signature}; review `{diff}`, then `{review.accept}`",
                   item.site, item.where, item.target, recorded=old, now=item.blob, acceptable=True)


def _judged_defaults(series: Series, findings: list[Finding]) -> list[Finding]:
    """A changed default of an env the rules judge by the values they admit (``names.admitted_default``): a note
    where the rules decide the new default as the old, else the error says why it matters."""
    source = next((e.source for e in series.entries if not e.is_patch and e.target == names.RULES), "")
    path = series.root / source if source else None
    text = path.read_text(errors="replace") if path is not None and path.is_file() else ""
    out = []
    for f in findings:
        judged = names.admitted_default(text, f.target, f.recorded, f.now) \
            if text and f.level == "error" and f.acceptable and f.recorded.startswith("= ") else None
        if judged is not None:
            f = replace(f, level="note" if judged[0] else "error", message=f"{f.message}: {judged[1]}")
        out.append(f)
    return out


def check(series: Series, git: Git, upstream: str, head: str, *, lock: Lock | None = None,
          review: Review | None = None) -> ContractResult:
    """The contract on ``head`` (a patched tree-ish over the upstream commit ``upstream``); ``review``: how the
    commands a finding prints name the repository and the rev (default: ``git``'s folder, the commit)."""
    start = time.perf_counter()
    lock = lock if lock is not None else read_lock(series.patches_dir)
    items, findings = derive(series, git, upstream, head, lock)
    review = review or Review(str(git.cwd), upstream[:12], f"c128patch contract --sglang-rev {upstream[:12]} --accept")
    findings = _judged_defaults(series, findings + compare(items, lock, review))
    order = {"error": 0, "warning": 1, "unchecked": 2, "note": 3}
    return ContractResult(items, sorted(findings, key=lambda f: order[f.level]), seconds=time.perf_counter() - start)


def lock_items(series: Series, git: Git, upstream: str, head: str) -> list[LockItem]:
    """What ``refresh`` writes: every resolved use on the tree at the series base."""
    items, findings = derive(series, git, upstream, head)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise C128Error(f"cannot record the contract: {errors[0].message}"
                        + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    return [LockItem(i.kind, i.target, i.site, i.where, (i.sig,), i.shape, i.signature) for i in items]


def patched_tree(series: Series, git: Git, rev: str, commit: str) -> str:
    """The tree id of the series replayed on ``commit`` in a temporary index (nothing checked out)."""
    with procs.scratch("c128contract-") as tmp:
        result, _ = replay_in_index(series, git, rev, commit, Path(tmp) / "index")
        if not result.ok:
            failing = next((e for e in result.entries if e.status in FAILED), None)
            what = result.error or (f"{failing.name}: {failing.status} {failing.detail}".strip() if failing else "")
            raise C128Error(f"the series does not apply on {rev}: {what}; the contract is checked on a tree the series "
                            "applies to (c128patch check shows where it stops)")
        return index_git(git, Path(tmp) / "index").out("write-tree")


def tree_base(git: Git) -> str:
    """The upstream commit a patched tree was applied on (its provenance record)."""
    commit = read_provenance(git.worktree).get("upstream", {}).get("commit", "")
    if not commit or not git.rev_parse(commit):
        raise C128Error(f"{git.worktree} holds no c128patch provenance ({PROVENANCE_PATH}) naming an upstream commit "
                        "it has: apply the series there first (c128patch apply)")
    return commit


def accept(lock: Lock, result: ContractResult) -> int:
    """Accept (and write) the changes ``result`` found in ``lock`` after review (a changed signature or value, a new
    namespace member); how many. A call that no longer binds stays an error; a lock that is a link is refused."""
    if lock.path.is_symlink():
        raise C128Error(f"{lock.path} is a symbolic link: --accept writes only a regular file in the series; "
                        "nothing was written")
    with locked(lock.path.parent.parent):  # the series folder's writers one at a time (``series.txn``: refresh)
        return _accept(lock, result)


def _accept(lock: Lock, result: ContractResult) -> int:
    fresh = read_lock(lock.path.parent)  # as it is now: another --accept or a refresh may have written it since
    if fresh is None:
        raise C128Error(f"{lock.path} was removed while the contract was checked; nothing was written")
    lock.items, lock.base = fresh.items, fresh.base
    unbound = {f.target for f in result.errors if not f.acceptable}
    now = {(f.target, f.now) for f in result.findings if f.acceptable and f.target not in unbound}
    by_key = {(i.kind, i.target): i for i in result.items}
    known = {item.key for item in lock.items}
    added = 0
    for i, item in enumerate(lock.items):
        current = by_key.get(item.key)
        if current is not None and (item.target, current.blob or current.signature) in now \
                and current.sig not in item.sigs:
            lock.items[i] = replace(item, sigs=item.sigs + (current.sig,))
            added += 1
    new = [i for i in result.items if i.kind == "declared" and i.key not in known and (i.target, i.signature) in now]
    lock.items += [LockItem(i.kind, i.target, i.site, i.where, (i.sig,)) for i in new]
    try:  # whole or not at all: a full disk or a signal mid-write had left a cut lock
        write_atomic(lock.path, lock.text().encode())
    except OSError as exc:
        raise C128Error(f"cannot write {lock.path} ({exc.strerror or exc}); it is as it was") from None
    return added + len(new)
