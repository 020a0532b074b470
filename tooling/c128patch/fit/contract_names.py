"""What the contract sees besides our calls into upstream (issue 38): the callables of ours upstream calls
(``callbacks``: a function a method of ours returns, called through the name upstream's code stores it in;
``installs``: a function of ours put in the place of an upstream class's method, which upstream's callers call),
the members we use on untyped receivers (``untyped_uses``: resolved by name against the classes that define them,
found at the base and recorded in the lock), the upstream values the startup rules mirror (``MIRRORS``) and
the namespaces whose every member the rules decide (``NAMESPACES``: a member the lock does not list is new)."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from dataclasses import dataclass, field

from c128patch.fit.resolve import (
    Upstream,
    Use,
    _imports,
    chain_of,
    module_name,
    nodes,
    nodes_on,
    signature_of,
    statements,
    syntax_tree,
    walk,
)

RULES = "python/sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py"
MIRRORS = (  # our name in RULES, the upstream definition whose values it mirrors
    ("C4_RING_DRAFT_CAP", "sglang.srt.mem_cache.deepseek_v4_memory_pool.get_compress_state_ring_size"),
    ("C4_RING_DRAFT_CAP", "sglang.srt.mem_cache.deepseek_v4_memory_pool.get_compress_state_write_pad"),
    ("_SHOWN_RAGGED_MODES", "sglang.srt.speculative.ragged_verify.RaggedVerifyMode.STATIC"),
    ("_SHOWN_RAGGED_MODES", "sglang.srt.speculative.ragged_verify.RaggedVerifyMode.COMPACT"),
)
NAMESPACES = (  # our name in RULES that decides it, the upstream class, which of its members ("": all)
    ("_algorithm", "sglang.srt.speculative.spec_info.SpeculativeAlgorithm", ""),
    ("_SHOWN_RAGGED_MODES", "sglang.srt.speculative.ragged_verify.RaggedVerifyMode", ""),
    ("RAGGED_ENV", "sglang.srt.environ.Envs", r"^SGLANG_\w*(DSPARK|RAGGED_VERIFY)"),
)
CONTEXT = ("config_from_context", {"exec_": "exec", "disagg": "disagg", "device": "device", "parallel": "parallel"})
# the function of RULES reading the live config namespaces, its parameter -> the namespace the caller passes it
# (``runtime_context.get_exec()``, ``get_disagg()``, ``get_device()``, ``get_parallel()``); upstream's
# ``_build_config_bags`` projects each namespace's leaves from the classes under FIELDS that declare its ``_NS_PATH``
FIELDS = "python/sglang/srt/arg_groups/fields/"
ADMITTED = (("RAGGED_ENV", "_SHOWN_RAGGED_MODES"),)  # our name in RULES holding an env's name, the values of it the
# rules admit: a changed upstream default the rules admit as they admitted the old one decides nothing differently
_MAX_CLASSES = 2  # a name more of the classes a receiver may be define is too common to tell which one we use


def mirrored_values(node: ast.AST | None) -> str:
    """A function's assignments and returns, one line: the values a rule mirroring it copies."""
    if not isinstance(node, ast.FunctionDef):
        return ""
    return " -> " + "; ".join(ast.unparse(s) for s in ast.walk(node) if isinstance(s, (ast.Assign, ast.Return)))


def rules(up: Upstream, ours: dict[str, set[int] | None], sources: dict[str, str]) -> tuple[list[Use], list[dict]]:
    """The definitions the startup rules mirror, as uses at our lines, and the members of the namespaces they
    decide, as lock items (kind ``declared``); none where the series has no RULES."""
    text = up.reader.text(RULES) if RULES in ours else None
    lines: dict[str, int] = {}
    for number, line in enumerate((text or "").splitlines(), 1):
        if m := re.match(r"^(?:def )?(\w+)\b", line):
            lines.setdefault(m.group(1), number)
    site = sources.get(RULES, RULES)
    mirrors = [Use(lines[name], upstream.split("."), kind="mirror") for name, upstream in MIRRORS if name in lines]
    spaces = [(lines[name], cls, pattern) for name, cls, pattern in NAMESPACES if name in lines]
    return mirrors, [{"kind": "declared", "target": target, "site": f"{site}:{line}", "where": where}
                     for line, cls, pattern in spaces for target, where in declared(up, cls, pattern)]


def namespaces(up: Upstream) -> dict[str, tuple[str, str, dict[str, int]]]:
    """Each config namespace path -> (the class declaring it, its file:line, its leaves -> their lines): the classes
    under FIELDS whose body sets ``_NS_PATH`` (a field annotated or a ``Derived`` assigned in the body is a leaf)."""
    out: dict[str, tuple[str, str, dict[str, int]]] = {}
    for path in sorted(p for p in up.reader.files if p.startswith(FIELDS) and p.endswith(".py")):
        try:
            tree = syntax_tree(up.reader.text(path) or "", path)
        except (SyntaxError, ValueError):
            continue  # the parse error is upstream's: the tier's import check names it
        for cls in [s for s in tree.body if isinstance(s, ast.ClassDef)]:
            ns = next((s.value.value for s in cls.body if isinstance(s, ast.Assign)
                       and isinstance(s.value, ast.Constant)
                       and [getattr(t, "id", "") for t in s.targets] == ["_NS_PATH"]), None)
            if isinstance(ns, str):
                leaves = {n: s.lineno for s in cls.body for n in _bound_names(s) if not n.startswith("_")}
                out[ns] = (f"{module_name(path)}.{cls.name}", f"{path}:{cls.lineno}", leaves)
    return out


def context_reads(up: Upstream, ours: dict[str, set[int] | None], sources: dict[str, str],
                  context_lines: set[int]) -> tuple[list[dict], list[dict]]:
    """The config namespace leaves RULES' ``CONTEXT`` function reads (``exec_.overlap.enable_two_batch_overlap``:
    the leaf ``enable_two_batch_overlap`` of ``exec.overlap``), each resolved against the namespaces the tree declares
    (``namespaces``): lock items (kind ``config``) and, for a leaf its namespace no longer declares, an error (the
    read is an AttributeError when the startup rules run) naming the namespace that declares it now, if one does;
    ``context_lines`` gets the function's lines (its parameters are these namespaces, not untyped receivers)."""
    tree = up.parse(RULES) if RULES in ours else None
    fn = next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == CONTEXT[0]), None) if tree else None
    if fn is None:
        return [], []
    context_lines.update(range(fn.lineno, (fn.end_lineno or fn.lineno) + 1))
    inner = {id(n.value) for n in walk(fn) if isinstance(n, ast.Attribute)}
    reads = sorted({(n.lineno, tuple(chain_of(n))) for n in walk(fn) if isinstance(n, ast.Attribute)
                    and isinstance(n.ctx, ast.Load) and id(n) not in inner and chain_of(n)[:1]
                    and chain_of(n)[0] in CONTEXT[1]})
    declared_now = namespaces(up) if reads else {}
    site_file = sources.get(RULES, RULES)
    items, findings = [], []
    for line, chain in reads:
        ns, leaf = ".".join([CONTEXT[1][chain[0]], *chain[1:-1]]), chain[-1]
        site, target = f"{site_file}:{line}", f"{ns}.{leaf}"
        got = declared_now.get(ns)
        if got is not None and leaf in got[2]:
            items.append({"kind": "config", "target": target, "site": site,
                          "where": f"{got[1].rpartition(':')[0]}:{got[2][leaf]}"})
            continue
        elsewhere = [f"{other} ({cls}, {where.rpartition(':')[0]}:{leaves[leaf]})"
                     for other, (cls, where, leaves) in sorted(declared_now.items()) if leaf in leaves]
        why = (f"the config namespace {ns} ({got[0]}, {got[1]}) declares no {leaf}" if got is not None else
               f"no config namespace {ns} on this tree (no class under {FIELDS} sets _NS_PATH = {ns!r})")
        now = f"; upstream declares {leaf} in {', '.join(elsewhere)} now" if elsewhere else ""
        findings.append({"level": "error", "message": f"{site}: {'.'.join(chain)}: {why}{now} (the startup rules read "
                         f"it through runtime_context.get_{chain[0].rstrip('_')}(): an AttributeError at startup)",
                         "site": site, "where": got[1] if got is not None else "", "target": target})
    return items, findings


def declared(up: Upstream, dotted: str, pattern: str) -> list[tuple[str, str]]:
    """(name, file:line) of each member class ``dotted`` declares matching ``pattern``."""
    module, _, name = dotted.rpartition(".")
    mod = up.module(module)
    cls = up.member(mod, name) if mod.kind == "module" else mod
    if cls.kind != "class":
        return []
    named = [(s, s.targets[0] if isinstance(s, ast.Assign) else getattr(s, "target", None)) for s in cls.node.body]
    return [(f"{dotted}.{t.id}", f"{cls.path}:{s.lineno}") for s, t in named
            if isinstance(t, ast.Name) and re.search(pattern, t.id)]


def untyped_uses(tree: ast.Module, lines: set[int] | None, path: str = "") -> list[Use]:
    """[attr] where our code reads an attribute (or ``getattr``/``hasattr`` a literal) of a receiver with no
    type: a parameter without annotation or annotated ``Any``, a local; not an import, a module-level name,
    a typed parameter nor ``self.attr``. Each use names its receiver (``_receiver``)."""
    typed = {"self", "cls"}
    for stmt in statements(tree.body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            typed |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            typed |= {t.id for t in walk(stmt) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    found = []
    for node in nodes(tree) if lines is None else nodes_on(tree, lines):  # a patch's lines: their statements
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            typed |= {a.arg for a in params if a.annotation is not None and "Any" not in ast.unparse(a.annotation)}
        elif lines is not None and getattr(node, "lineno", 0) not in lines:
            continue
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr") and node.args[1:]:
            found.append((node, chain_of(node.args[0]), getattr(node.args[1], "value", None)))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            found.append((node, chain_of(node.value), node.attr))
    spans = _class_spans(tree) if found else []
    return [Use(node.lineno, [name], kind="untyped", receiver=_receiver(path, max(
                (start for start, end in spans if start <= node.lineno <= end), default=0), chain))
            for node, chain, name in found if isinstance(name, str) and chain
            and (chain[0] not in typed or chain[0] in ("self", "cls") and chain[1:])]


def _class_spans(tree: ast.Module) -> list[tuple[int, int]]:
    """(first, last line) of each class, found through statements alone (a node's innermost class: the one of these
    holding its line that starts last)."""
    out: list[tuple[int, int]] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:  # not recursive: a file's nesting is input
        stmt = todo.pop()
        if isinstance(stmt, ast.ClassDef):
            out.append((stmt.lineno, stmt.end_lineno or stmt.lineno))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo += [c for c in getattr(stmt, field, None) or [] if isinstance(c, ast.AST)]
    return out


def _receiver(path: str, cls: int, chain: list[str]) -> str:
    """The receiver's key: ``self.x`` is one object in its class; another chain names one kind of object in its
    file (``backend.model_runner`` in each function of ours that takes a ``backend``)."""
    return f"{path}:{cls if chain[0] in ('self', 'cls') else ''}:{'.'.join(chain)}"


@dataclass
class Definers:
    """Who defines the names our code reads on untyped receivers."""

    owners: dict[str, dict[str, str]]  # class -> name -> the class it takes it from
    near: dict[str, dict[str, str]]  # the same, of the names the classes of the files our uses reached declare
    ours: set[str] = field(default_factory=set)  # names our lines define in upstream's classes: not upstream's
    strict: bool = True  # a receiver is told by a class defining every name read on it (else: those it knows)


def narrowed(definers: Definers, uses: list[Use],
             unresolved: dict[tuple[str, str], list[str]] | None = None) -> dict[tuple[str, str], list[str]]:
    """(receiver, name) -> the classes the use may read it on: a receiver read for several names that classes
    define all of (``self.x = ...`` included) is one of them; else the one near class declaring the name; else the
    classes the receiver's name names; none where more than ``_MAX_CLASSES`` remain (too common to tell which one
    we use). A name several near classes declare, on a receiver nothing else tells, is read on none of them: its
    type is not determined (``our_controller.enabled()`` is not ``DpFlags.enabled`` nor ``SpFlags.enabled``);
    ``unresolved`` gets those (receiver, name) -> the classes it could not choose between."""
    read: dict[str, set[str]] = {}
    for use in uses:
        read.setdefault(use.receiver, set()).add(use.chain[0])
    owners = definers.owners
    out: dict[tuple[str, str], list[str]] = {}
    for receiver, names in read.items():
        wanted = names - definers.ours if definers.strict else {n for n in names
                                                                 if any(n in d for d in owners.values())}
        common = [c for c in sorted(owners) if wanted <= owners[c].keys()] if len(wanted) > 1 else []
        common = [c for c in common if _named(c, receiver)] or common
        common = common if len(common) <= _MAX_CLASSES else []  # names many classes define all of tell nothing
        for name in names - definers.ours:  # then an instance attribute (``self.name = ...``) of a class it names
            near = {d[name] for d in definers.near.values() if name in d}
            told = {owners[c][name] for c in common if name in owners[c]} or (near if len(near) == 1 else set()) \
                or {d[name] for c, d in owners.items() if name in d and _named(c, receiver)}
            out[(receiver, name)] = sorted(told) if len(told) <= _MAX_CLASSES else []
            if not out[(receiver, name)] and len(near) > 1 and unresolved is not None:
                unresolved[(receiver, name)] = sorted(near)
    return out


def _named(cls: str, receiver: str) -> bool:
    """Whether the receiver's name names the class (``backend.model_runner``: ``...ModelRunner``)."""
    last = receiver.rsplit(".", 1)[-1].rsplit(":", 1)[-1].replace("_", "").lower()
    return len(last) > 2 and cls.rsplit(".", 1)[-1].lower().endswith(last)


def lock_definers(by_name: dict[str, list[str]]) -> Definers:
    """The definers the lock records (name -> classes): a receiver is told by the names it records."""
    owners: dict[str, dict[str, str]] = {}
    for name, classes in by_name.items():
        for cls in classes:
            owners.setdefault(cls, {})[name] = cls
    return Definers(owners, owners, strict=False)


def defining_classes(up: Upstream, names: set[str]) -> Definers:
    """Of ``names``, who defines each: the upstream classes of the files our uses reached (near: what their body
    declares) and of the upstream modules our files import (their body, ``self.name = ...`` in their methods, a
    base's)."""
    reached = set(up.parsed())
    found = Definers({}, {})
    seen: dict[str, dict[str, str]] = {}
    held = {n for path, tree in up.parsed().items() if not up.is_ours(path, 0)
            for cls in tree.body if isinstance(cls, ast.ClassDef)
            for n in _defined(up, path, module_name(path) or "", cls, seen)}
    for path, tree in sorted(_searched(up, names - held).items()):  # what no class reached defines, in the imports
        for cls in [s for s in tree.body if isinstance(s, ast.ClassDef)] if not up.is_ours(path, 0) else []:
            module = module_name(path) or ""
            dotted = f"{module}.{cls.name}"
            defined = {n: c for n, c in _defined(up, path, module, cls, seen).items() if n in names}
            found.ours |= {n for n, c in defined.items() if not c}
            found.owners[dotted] = {n: c for n, c in defined.items() if c}
            declared = {getattr(s, "name", None) or getattr(getattr(s, "target", None), "id", None): s.lineno
                        for s in cls.body} if path in reached else {}
            found.near[dotted] = {n: dotted for n, line in declared.items() if n in names
                                  and not up.is_ours(path, line)}
    return found


def _searched(up: Upstream, names: set[str]) -> dict[str, ast.Module]:
    """The upstream files our uses reached, and the sglang modules our files import (``TYPE_CHECKING`` too) whose text
    sets one of ``names`` on ``self`` (an instance attribute: parsing every one cost seconds)."""
    alt = "|".join(sorted(map(re.escape, names))) or "(?!)"
    defines = re.compile(rf"\bself\.(?:{alt})\s*(?::[^=\n]*)?=(?!=)")
    imported: set[str] = set()
    for path in [p for p in sorted(up.ours) if p.endswith(".py")]:
        tree = up.parse(path)
        for chain in _imports(path, tree, lambda n: False)[0].values() if tree else []:
            at = next((chain[:i] for i in range(len(chain), 0, -1) if up.module_path(".".join(chain[:i]))), [])
            found = up.module_path(".".join(at)) if at and at[0] == "sglang" else None
            if found and found.endswith(".py"):
                imported.add(found)
    for found in sorted(imported - set(up.parsed())):
        if defines.search(up.reader.text(found) or ""):
            up.parse(found)
    return up.parsed()


def _defined(up: Upstream, path: str, module: str, cls: ast.ClassDef,
             seen: dict[str, dict[str, str]]) -> dict[str, str]:
    """name -> the class ``cls`` takes it from: its body's and ``self.x = ...`` in its methods (itself; "": on our
    lines), else its bases'."""
    key = f"{path}:{cls.lineno}"
    if key in seen:
        return seen[key]
    seen[key] = {}  # a cycle of bases ends here
    names: dict[str, str] = {}
    for base in reversed(cls.bases):  # the first base wins
        got = up.expr(base, module)
        if got.kind == "class" and isinstance(got.node, ast.ClassDef):
            names.update(_defined(up, got.path, got.module, got.node, seen))
    own = [(n, s.lineno) for s in cls.body for n in _bound_names(s)]
    lines = (up.reader.text(path) or "").splitlines()[cls.lineno - 1:cls.end_lineno]  # its methods' self.x = ...:
    own += [(m.group(1), cls.lineno + i) for i, line in enumerate(lines)  # a scan of its lines, not of its statements
            for m in _SELF_SET.finditer(line)]
    for name, line in sorted(own, key=lambda o: not up.is_ours(path, o[1])):  # upstream's own definition wins
        names[name] = "" if up.is_ours(path, line) else f"{module}.{cls.name}"
    seen[key] = names
    return names


_SELF_SET = re.compile(r"\bself\.([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)")  # ``self.x = ...``, ``self.x: T = ...``


def _bound_names(stmt: ast.stmt) -> list[str]:
    """The names a statement of a class body defines: a method, a nested class, a field (annotated or not)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):  # as ``resolve`` reads it: no tuple unpacked
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [t.id for t in targets if isinstance(t, ast.Name)]
    return []


def callbacks(up: Upstream, ours: dict[str, set[int] | None],
              sources: dict[str, str]) -> list[tuple[dict, Use, inspect.Signature]]:
    """Each call upstream's code makes to a function of ours that a method of ours hands out (``functools.partial``
    of it, stored in a local and called): the lock item (site: the call, where: our function), the call, our
    signature less what the partial binds."""
    handed: dict[str, tuple[str, ast.FunctionDef, int, str]] = {}  # method -> (our function, its node, bound, where)
    for path in [p for p, lines in ours.items() if lines is None and "partial(" in (up.reader.text(p) or "")]:
        tree = up.parse(path)
        tops = {s.name: s for s in (tree.body if tree else []) if isinstance(s, ast.FunctionDef)}
        for method in [n for n in nodes(tree) if isinstance(n, ast.FunctionDef)] if tree else []:
            for ret in [r for r in walk(method) if isinstance(r, ast.Return) and isinstance(r.value, ast.Call)]:
                call = ret.value
                if chain_of(call.func)[-1:] == ["partial"] and call.args and getattr(call.args[0], "id", "") in tops:
                    fn = tops[call.args[0].id]
                    handed[method.name] = (f"{module_name(path)}.{fn.name}", fn, len(call.args) - 1,
                                           f"{sources.get(path, path)}:{fn.lineno}")
    out = []
    for path in [p for p in sorted(ours) if any(f".{m}(" in (up.reader.text(p) or "") for m in handed)]:
        for fn in [n for n in nodes(up.parse(path) or ast.Module([], [])) if isinstance(n, ast.FunctionDef)]:
            stored = {t.id: handed[chain_of(a.value.func)[-1]] for a in walk(fn) if isinstance(a, ast.Assign)
                      and isinstance(a.value, ast.Call) and chain_of(a.value.func)[-1:] and
                      chain_of(a.value.func)[-1] in handed for t in a.targets if isinstance(t, ast.Name)}
            for call in [c for c in walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "id", "") in stored]:
                target, ours_fn, bound, where = stored[call.func.id]
                full = signature_of(ours_fn.args)
                out.append(({"kind": "callback", "target": target, "site": f"{sources.get(path, path)}:{call.lineno}",
                             "where": where, "signature": f"def {ours_fn.name}{full}"},
                            _call_use(call), full.replace(parameters=list(full.parameters.values())[bound:])))
    return out


def installs(up: Upstream, ours: dict[str, set[int] | None],
             sources: dict[str, str]) -> list[tuple[Use, str, list[str], ast.FunctionDef]]:
    """Each function of ours our lines install as an attribute in upstream's place: a ``type(name, bases, {"attr":
    fn})`` namespace, ``setattr(x, "attr", fn)``, ``x.attr = fn`` (not on ``self``/``cls``), a method of our subclass
    of an upstream class: (the use ``[attr]`` at our line, our site file, the upstream classes the bases or ``x``
    name through imports ([]: not static), our function)."""
    out = []
    for path in [p for p in sorted(ours) if p.endswith(".py")]:
        tree = up.parse(path)
        if tree is None:
            continue
        tops = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
        found = []  # (line, attr, the receivers' expressions, our function, a subclass: only of upstream's)
        for node in nodes(tree) if ours[path] is None else nodes_on(tree, ours[path]):
            func = chain_of(getattr(node, "func", None)) if isinstance(node, ast.Call) else []
            if func == ["type"] and len(node.args) == 3 and isinstance(node.args[2], ast.Dict):
                bases = getattr(node.args[1], "elts", [])
                found += [(v.lineno, k.value, bases, tops[v.id], False) for k, v in
                          zip(node.args[2].keys, node.args[2].values) if isinstance(k, ast.Constant)
                          and getattr(v, "id", "") in tops]
            elif func == ["setattr"] and len(node.args) == 3 and getattr(node.args[2], "id", "") in tops:
                found.append((node.lineno, getattr(node.args[1], "value", None), node.args[:1], tops[node.args[2].id],
                              False))
            elif isinstance(node, ast.Assign) and getattr(node.value, "id", "") in tops:
                found += [(node.lineno, t.attr, [t.value], tops[node.value.id], False) for t in node.targets
                          if isinstance(t, ast.Attribute) and chain_of(t.value)[:1] not in (["self"], ["cls"])]
            elif isinstance(node, ast.ClassDef) and node.bases:
                found += [(s.lineno, s.name, node.bases, s, True) for s in node.body if isinstance(s, ast.FunctionDef)]
        bindings = _imports(path, tree, lambda n: False)[0] if found else {}
        for line, attr, bases, fn, subclass in found:
            classes = [".".join(bindings[c[0]] + c[1:]) for c in map(chain_of, bases)
                       if c and bindings.get(c[0], [""])[0] == "sglang"]
            if isinstance(attr, str) and (classes or not subclass):
                out.append((Use(line, [attr], kind="installed"), sources.get(path, path), classes, fn))
    return out


def replaced(up: Upstream, dotted: str, attr: str) -> tuple[int, tuple[str, ...]] | None:
    """The call that passes every parameter of the method ``attr`` of the upstream class ``dotted`` (the receiver
    included): what upstream's callers may pass (None: not a plain method there)."""
    module, _, name = dotted.rpartition(".")
    mod = up.module(module)
    cls = up.member(mod, name) if mod.kind == "module" else mod
    got = up.member(cls, attr) if cls.kind == "class" else cls
    if got.kind != "method" or not isinstance(got.node, ast.FunctionDef):
        return None
    ps = signature_of(got.node.args).parameters.values()
    return sum(p.kind <= p.POSITIONAL_OR_KEYWORD for p in ps), tuple(p.name for p in ps if p.kind == p.KEYWORD_ONLY)


def installed_calls(up: Upstream, ours: dict[str, set[int] | None], dotted: str, attr: str) -> list[tuple[str, Use]]:
    """Upstream's calls of the method ``attr`` we install on our subclass of the upstream class ``dotted``, found
    through the field upstream keeps our object in: in each file our patch changes, a name our lines assign (our
    object, which upstream then stores in the field of that name) that a class there annotates with a type naming
    ``dotted`` (through imports and type aliases); ``x.FIELD.attr(...)``, or ``x.FIELD`` passed to a function whose
    parameter it calls ``attr`` on: (the call's file, the call, the receiver counted as its first argument)."""
    out: list[tuple[str, Use]] = []
    for path, lines in sorted((p, ls) for p, ls in ours.items() if ls is not None and p.endswith(".py")):
        tree, module = up.parse(path), module_name(path) or ""
        assigned = _assigned(tree, frozenset(lines)) if tree else set()
        holders = {s.target.id for c in _walked(tree, ast.ClassDef) for s in c.body
                   if isinstance(s, ast.AnnAssign) and getattr(s.target, "id", "") in assigned
                   and _names_class(up, module, s.annotation, dotted)} if assigned else set()
        for call in _walked(tree, ast.Call) if holders else []:
            if chain_of(call.func)[-2:-1] and chain_of(call.func)[-2] in holders and call.func.attr == attr:
                out.append((path, _call_use(call, 1)))
            passed = [(i, a) for i, a in enumerate(call.args)] + [(k.arg, k.value) for k in call.keywords]
            for at in [at for at, arg in passed if isinstance(arg, ast.Attribute) and arg.attr in holders]:
                fn = up.member(up.module(module), call.func.id) if isinstance(call.func, ast.Name) else None
                if fn is None or fn.kind != "function" or not isinstance(fn.node, ast.FunctionDef):
                    continue
                params = [a.arg for a in [*fn.node.args.posonlyargs, *fn.node.args.args, *fn.node.args.kwonlyargs]]
                name = params[at] if isinstance(at, int) and at < len(params) else at
                out += [(fn.path, _call_use(c, 1)) for c in walk(fn.node) if isinstance(c, ast.Call)
                        and chain_of(c.func) == [name, attr]]
    return list({(p, u.line): (p, u) for p, u in out}.values())


@functools.lru_cache(maxsize=256)  # installed_calls asks once per method we install, of the same files
def _walked(tree: ast.Module, kind: type) -> list:
    """The nodes of ``kind`` in ``tree``."""
    return [n for n in nodes(tree) if isinstance(n, kind)]


@functools.lru_cache(maxsize=256)
def _assigned(tree: ast.Module, lines: frozenset[int]) -> frozenset[str]:
    """The names our ``lines`` assign."""
    return frozenset(t.id for n in nodes_on(tree, set(lines)) if isinstance(n, ast.Assign) for t in n.targets
                     if isinstance(t, ast.Name))


def _call_use(call: ast.Call, receiver: int = 0) -> Use:
    """The call's shape (``receiver``: 1 where the callable is a method reached through its instance)."""
    star = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
    return Use(call.lineno, [], (len(call.args) + receiver, tuple(k.arg for k in call.keywords if k.arg)), star)


def _names_class(up: Upstream, module: str, node: ast.AST, dotted: str, hops: int = 4) -> bool:
    """Whether the annotation ``node`` (read in ``module``) names the class ``dotted``, through the module's imports
    and type aliases (``X: TypeAlias = Union[A, B]``), ``hops`` deep."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return False
    for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
        got = up.member(up.module(module), name)
        if got.kind == "class" and got.name == dotted:
            return True
        value = getattr(got.node, "value", None)
        if got.kind == "value" and value is not None and hops and _names_class(up, got.module, value, dotted, hops - 1):
            return True
    return False


def in_context(use: Use, lines: set[int]) -> bool:
    """Whether an untyped use is a read of a config namespace parameter of RULES' ``CONTEXT`` function."""
    path, _, chain = use.receiver.rpartition(":")
    return path.startswith(f"{RULES}:") and use.line in lines and chain.split(".")[0] in CONTEXT[1]


def admitted_default(rules_text: str, target: str, old: str, new: str) -> tuple[bool, str] | None:
    """For an env default the rules judge by the values they admit (``ADMITTED``; ``old``/``new``: the lock's and the
    tree's ``= EnvStr('x')``): (whether the change decides nothing differently, why); None where this is not one.
    The rules keep a copy of the default (``env_config``'s fallback, which ``c128patch doctor`` uses) while the live
    startup reads upstream's: both admitted (``static`` -> ``compact``) is harmless; else they disagree."""
    try:
        tree = ast.parse(rules_text)
    except SyntaxError:
        return None
    consts = {t.id: s.value for s in tree.body if isinstance(s, ast.Assign)
              for t in s.targets if isinstance(t, ast.Name)}
    values = []
    for text in (old, new):
        m = re.fullmatch(r"= \w+\((.*)\)", text.strip())
        try:
            values.append(ast.literal_eval(m.group(1)) if m else None)
        except (ValueError, SyntaxError):
            values.append(None)
    for env_name, admitted_name in ADMITTED:
        env, admitted = consts.get(env_name), consts.get(admitted_name)
        if not (isinstance(env, ast.Constant) and target.endswith(f".{env.value}") and admitted is not None):
            continue
        try:
            shown = ast.literal_eval(admitted)
        except ValueError:
            return None
        if not all(isinstance(v, str) for v in values):
            return None
        was, now = (v in shown for v in values)
        if was == now:
            return True, (f"the rules admit both {values[0]!r} and {values[1]!r} ({admitted_name}): their copy of the "
                          "default decides as upstream's does")
        return False, (f"the rules {'admit' if now else 'refuse'} upstream's new default {values[1]!r} but "
                       f"{'admit' if was else 'refuse'} their copy {values[0]!r} ({admitted_name}; env_config's "
                       "fallback, which the startup check and `c128patch doctor` judge a launch by): a launch leaving "
                       f"{env.value} unset is judged as the mode it does not run")
    return None
