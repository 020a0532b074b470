"""The behavioural tier on a patched tree: every module the series adds or changes imported in the sealed box
(``fit.sandbox``) with the series' env gates off and on; each ok, failed, or not checked (a package the
interpreter lacks; without torch nothing is checked, and not checked is never a pass). Meanwhile each one's
``sglang`` imports (outside import guards and ``TYPE_CHECKING``) are resolved on the tree's files
(``fit.resolve``, no interpreter): a module or name missing is a failure.

``check_tree``: CPU checks of a patched branch ``head`` against its upstream ``base``, over the files it changes
(nothing checked out, no GPU): ``no-conflict-markers`` (``<<<<<<<``/``>>>>>>>`` opening a line; a bare ``=======``
is reST), ``python-compiles`` (each changed ``.py``, unless it did not compile on ``base`` either: a note), and
``gates-declared`` (each env gate declared in ``srt/environ.py`` as ``NAME = Env...(``). ``watch`` runs them.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from c128patch.errors import C128Error
from c128patch.fit import env as env_ops
from c128patch.fit.contract import patched_tree
from c128patch.fit.resolve import PACKAGE, PY_ROOT, Def, Upstream, absolute, module_name, statements
from c128patch.fit.sandbox import Flooded, Sealed, TimedOut, interpreter, isolation
from c128patch.git import Git
from c128patch.procs import scratch
from c128patch.progress import NullReporter, Reporter
from c128patch.series.manifest import Series
from c128patch.series.paths import symlink_on_path
from c128patch.textsafe import one_line, some

RUNNER = Path(__file__).with_name("treecheck_runner.py")
SCENARIOS = Path(__file__).with_name("scenarios_runner.py")  # the series' DSPARK scenarios, run after the imports
ENVIRON = "python/sglang/srt/environ.py"
TIER_ENV = {"OMP_NUM_THREADS": "1"}  # what the tier's box gets besides the allow-list: constants, never the operator's
_MARKER = re.compile(r"^(<{7}|>{7})( |$)")
# (module, zero-argument function, truthy with the gates on, with them off): behaviour the gates switch
PROBES = (("sglang.srt.layers.attention.dsv4.online_c128_dspark", "online_c128_dspark_env", True, False),)


@dataclass
class TierResult:
    gates: str  # "off" | "on"
    torch: bool = True
    modules: dict[str, dict] = field(default_factory=dict)
    probes: dict[str, dict] = field(default_factory=dict)
    scenarios: dict[str, dict] = field(default_factory=dict)  # name -> passed / failed / not run, with the detail

    def count(self, status: str) -> int:
        return sum(m["status"] == status for m in [*self.modules.values(), *self.probes.values()])


@dataclass
class TreecheckResult:
    tiers: list[TierResult] = field(default_factory=list)
    imports: dict[str, dict] = field(default_factory=dict)  # module -> its static import check (``check_imports``)
    ran: bool = True  # False: the target's code was not run (``why``)
    why: str = "the target's code was not run (--no-run)"
    env: dict = field(default_factory=dict)  # the environment it ran in (``fit.env.tier_python``; --python: {})
    fault: str = ""  # the box cut the target's code off for its own defect (``Flooded``): failed

    @property
    def failed(self) -> list[str]:
        return [f"behavioural tier: {self.fault}"] * bool(self.fault) + [
            f"gates {t.gates}: {name}: {m['detail']}" for t in self.tiers
                for name, m in [*t.modules.items(), *t.probes.items()] if m["status"] == "failed"] + [
            f"imports: {name}: {m['detail']}" for name, m in self.imports.items() if m["status"] == "failed"] + [
            f"gates {t.gates}: {s['detail']}" for t in self.tiers for s in t.scenarios.values()
            if s["status"] == "failed"]

    @property
    def checked(self) -> bool:
        """Every module the series adds or changes (and every probe) imported, gates off and on: else unchecked."""
        return self.ran and all(t.torch for t in self.tiers) and not any(t.count("not checked") for t in self.tiers) \
            and not self._not_run()

    def _not_run(self) -> dict[str, str]:
        """Scenario -> why it did not run (a module it needs did not import), the first tier's reason."""
        return {name: s["detail"] for t in reversed(self.tiers) for name, s in t.scenarios.items()
                if s["status"] == "not run"}

    def passed(self) -> list[str]:
        """The scenarios that passed with the gates off and on."""
        return sorted(set.intersection(*[{n for n, s in t.scenarios.items() if s["status"] == "passed"}
                                         for t in self.tiers])) if self.tiers else []

    def not_checked(self) -> list[str]:
        """One line per module (or probe) the tier could not run, with the reason; never a pass."""
        if not self.ran:
            return [] if self.fault else [f"behavioural tier: {self.why}"]
        if not all(t.torch for t in self.tiers):
            return ["behavioural tier: torch is not installed for this interpreter (nothing imported)"]
        seen = {name: m.get("detail", "") for t in reversed(self.tiers)  # the first tier's reason wins
                for name, m in [*t.modules.items(), *t.probes.items()] if m["status"] == "not checked"}
        return [f"{name}: not checked: {why}" for name, why in sorted(seen.items())] + [
            f"scenario {name}: not run: {why}" for name, why in sorted(self._not_run().items())]

    def verdict(self) -> str:
        ok = sum(m["status"] == "ok" for m in self.imports.values())
        said = f"; imports: {ok} of {len(self.imports)} modules' sglang imports resolve on the tree's files" \
            if self.imports else ""
        if not self.ran:
            return ("failed: " if self.failed else "unchecked: ") + f"{self.why}{said}"
        if not all(t.torch for t in self.tiers):
            return ("failed: " if self.failed else "") + \
                f"torch is not installed for this interpreter: behavioural tier not checked{said}"
        parts = [f"gates {t.gates}: {t.count('ok')} ok, {t.count('failed')} failed, "
                 f"{t.count('not checked')} not checked; scenarios: "
                 + ", ".join(f"{sum(s['status'] == k for s in t.scenarios.values())} {k}"
                             for k in ("passed", "failed", "not run")) for t in self.tiers]
        needs = sorted({m.get("detail", "").removeprefix("needs ").split(";")[0] for t in self.tiers
                        for m in t.modules.values() if m["status"] == "not checked"} - {""})
        missed = ["not every module imported here" + (f" (needs {', '.join(needs)})" if needs else "")] \
            if any(t.count("not checked") for t in self.tiers) else []
        missed += [f"scenarios not run: {', '.join(sorted(self._not_run()))}"] if self._not_run() else []
        head = "failed" if self.failed else "passed" if self.checked else f"unchecked: {'; '.join(missed)}"
        return f"{head} ({'; '.join(parts)}){said}"

    def modules(self) -> dict[str, str]:
        """Per module, its worse gate state: imported / imported with stand-ins (names) / failed / not checked."""
        out: dict[str, str] = {}
        for t in self.tiers:
            for name, m in t.modules.items():
                names = ", ".join(sorted({*m.get("stand_ins", []), *m.get("stand_ins_used", [])}))
                said = f"{m['status']}: {m.get('detail', '')}" if m["status"] != "ok" else \
                    f"imported with stand-ins ({names})" if names else "imported"
                out[name] = said if out.get(name, "imported").startswith("imported") else out[name]
        return out

    def to_json(self) -> dict:
        return {"ok": not self.failed and self.checked, "verdict": self.verdict(), "failed": self.failed,
                "not_checked": self.not_checked(), "modules": self.modules(), "env": self.env,
                "scenarios_passed": self.passed(), "tiers": [asdict(t) for t in self.tiers], "imports": self.imports}


def _gates(series: Series) -> list[str]:
    return sorted({e.gate for e in series.entries if e.gate} | {r for g in series.gates for r in g.requires})


class Pending:
    """The tier on ``tree`` (a folder holding ``python/sglang``) for the ``paths`` the series changes, started in the
    sealed box (both gate states at once); ``finish`` waits for it. ``run_code=False``: only the static import check.
    No ``python``: the target's own environment (``fit.env``), built first if missing; one that cannot be built
    is said in one line (unchecked)."""

    def __init__(self, series: Series, tree: Path, paths: list[str], *, python: str | None = None,
                 timeout: float = 600, run_code: bool = True, reporter: Reporter = NullReporter()) -> None:
        if not (tree / PY_ROOT / "sglang").is_dir():
            raise C128Error(f"{tree} holds no {PY_ROOT}/sglang: pass the top of a patched sglang tree")
        missing = [p for p in paths if not (tree / p).is_file()]
        if missing:
            raise C128Error(f"{tree} lacks {some(missing, 1)}, which the series writes: apply the series there first")
        self.tree, self.modules = tree, sorted({m for p in paths if (m := module_name(p))})
        self.box: Sealed | None = None  # None: not run (``why``)
        self.why, self.env = TreecheckResult.why, {}
        if not run_code:
            return
        given = "--python " if python else "C128PATCH_TIER_PYTHON="  # (a message names what the operator set)
        python = python or os.environ.get("C128PATCH_TIER_PYTHON")  # the operator's standing --python
        try:
            python, self.env = (interpreter(python, tree, given), {}) if python else \
                env_ops.tier_python(series, tree, reporter)
        except C128Error as exc:
            self.why = f"the target's code was not run: no environment for it ({exc.message})"
            return
        self.env["isolation"] = isolation()
        preload = json.dumps(preloads(tree, self.modules))  # the tree's: past 64 KiB (one argument's limit is
        preload = preload if len(preload) <= 1 << 16 else "{}"  # 128 KiB) none, each gate state imports its own
        args = ["-c", RUNNER.read_text(), str((tree / PY_ROOT).resolve()), json.dumps(_gates(series)),
                json.dumps([p for p in PROBES if p[0] in self.modules]), json.dumps(env_ops.stand_ins(series)),
                json.dumps(env_ops.defines(series)), preload, str(SCENARIOS), *self.modules]
        # (torch's second OpenMP thread only spun waiting for the first: 16 % of a tier's CPU, helper 171)
        self.box = Sealed(python, args, timeout, env=TIER_ENV, offline=True,
                          readable=(str(tree / PY_ROOT), str(SCENARIOS.parent)))

    def finish(self) -> TreecheckResult:
        imports = check_imports(self.tree, self.modules)  # while the box runs
        if self.box is None:
            return TreecheckResult(imports=imports, ran=False, why=self.why)
        try:
            stdout, stderr = self.box.wait()
        except TimedOut as exc:
            return TreecheckResult(imports=imports, ran=False, env=self.env, why=f"{exc.message} (the box's time "
                                   "limit; a slow host: treecheck --timeout SECONDS gives it more)")
        except Flooded as exc:
            return TreecheckResult(imports=imports, ran=False, env=self.env, why=exc.message, fault=exc.message)
        data = _answer(stdout, stderr, self.box.returncode, self.modules)
        result = TreecheckResult(imports=imports, env=self.env)
        for state in ("off", "on"):
            tier = data["tiers"].get(state, {})
            if "error" in tier:
                raise C128Error(f"the behavioural tier (gates {state}) failed to run: {tier['error']}")
            for name, m in tier.get("modules", {}).items():  # not imported but its imports resolve: say that
                if m["status"] == "not checked" and imports.get(name, {}).get("status") == "ok":
                    m["detail"] += f"; its {imports[name]['imports']} sglang imports resolve on this tree's files"
            result.tiers.append(TierResult(state, data["torch"], tier.get("modules", {}), tier.get("probes", {}),
                                           tier.get("scenarios", {})))
        return result

    def kill(self) -> None:
        if self.box is not None:
            self.box.kill()


def _answer(stdout: str, stderr: str, code: int, modules: list[str]) -> dict:
    """The runner's last line, taken only from a runner that exited 0 and naming every module in each tier it ran:
    the target's code shares its stdout (it may print a verdict and kill the runner, or outlive it and print last)."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1]) if code == 0 else None
        if set(data["tiers"]) != ({"off", "on"} if data["torch"] is True else set()) or any(
                "error" not in t and sorted(t["modules"]) != modules for t in data["tiers"].values()):
            raise ValueError
    except (IndexError, ValueError, KeyError, TypeError, AttributeError):
        why = f"signal {-code}" if code < 0 else f"exit {code}" if code else "its answer is not the runner's"
        raise C128Error(f"the behavioural tier's interpreter failed ({why}): "
                        f"{(stderr.strip().splitlines() or ['?'])[-1]}") from None
    return _one_line(data)


def _one_line(value: Any) -> Any:
    """The runner's answer with each string on one line: its details quote the target's exceptions, which could
    print a line of ours (``treecheck: passed``; helper 100)."""
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, dict):
        return {_one_line(k): _one_line(v) for k, v in value.items()}
    return [_one_line(v) for v in value] if isinstance(value, list) else value


def run(series: Series, tree: Path, paths: list[str], *, python: str | None = None, timeout: float = 600,
        run_code: bool = True, reporter: Reporter = NullReporter()) -> TreecheckResult:
    """The tier on ``tree`` (a folder holding ``python/sglang``) for the ``paths`` the series changes."""
    pending = Pending(series, tree, paths, python=python, timeout=timeout, run_code=run_code, reporter=reporter)
    try:
        return pending.finish()
    finally:
        pending.kill()


def run_rev(series: Series, git: Git, rev: str, commit: str, *, python: str | None = None, timeout: float = 600,
            run_code: bool = True, reporter: Reporter = NullReporter()) -> TreecheckResult:
    """The tier on the series replayed at ``commit`` (``fit.contract.patched_tree``), unpacked in a temporary folder."""
    head = patched_tree(series, git, rev, commit)
    with scratch("c128treecheck-") as tmp:  # 87 MB of sglang: a SIGKILLed run's swept by pid
        git.extract(head, f"{PY_ROOT}/sglang", Path(tmp))
        if git.blob(head, f"{PY_ROOT}/pyproject.toml") is not None:  # the requirements of ``fit.env``
            git.extract(head, f"{PY_ROOT}/pyproject.toml", Path(tmp))
        return run(series, Path(tmp), git.changed_files(commit, head), python=python, timeout=timeout,
                   run_code=run_code, reporter=reporter)


# ---------------------------------------------------------------------------- the static import check
class _FolderReader:
    """The files of a tree's ``python/sglang`` on disk, read as ``fit.resolve.Upstream`` reads a tree-ish: regular
    files only, none through a symlink (the tree is input: a link may name any file of the machine)."""

    def __init__(self, top: Path) -> None:
        self.top, package = top, top / PY_ROOT / PACKAGE
        linked = symlink_on_path(top, package) if package.exists() or package.is_symlink() else None
        self.files = set() if linked else {p.relative_to(top).as_posix() for p in package.rglob("*")
                                           if not p.is_symlink() and p.is_file()}  # rglob enters no linked folder

    def text(self, path: str) -> str | None:
        return (self.top / path).read_text(errors="replace") if path in self.files else None


def _problem(up: Upstream, module: str, names: tuple[str, ...]) -> str:
    mod = up.module(module)
    if mod.kind == "missing":
        return f"no module {module} on this tree"
    if mod.kind != "module":
        return mod.why
    missing = [n for n in names if up.member(mod, n).kind == "missing"]
    return f"{mod.path.rstrip('/')} defines no {', '.join(missing)}" if missing else ""


def check_imports(top: Path, modules: list[str]) -> dict[str, dict]:
    """module -> {"status": "ok" | "failed", "detail", "imports": N} for each of ``modules`` of the tree at ``top``."""
    up = Upstream(_FolderReader(top), {})
    out: dict[str, dict] = {}
    for module in modules:
        path = up.module_path(module) or "/"
        tree = up.parse(path) if not path.endswith("/") else None
        if tree is None:
            detail = up.errors.get(path, f"no file for {module} on this tree")
            out[module] = {"status": "failed", "detail": detail, "imports": 0}
            continue
        mod = Def("module", module, path, module=module)
        uses: list[tuple[int, str, tuple[str, ...]]] = []
        for node in statements(tree.body, None, guarded=False):  # its sglang imports, outside guards and TYPE_CHECKING
            if isinstance(node, ast.Import):  # (line, module, names; none: ``import module``)
                uses += [(node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] == PACKAGE]
            elif isinstance(node, ast.ImportFrom) and (source := absolute(node, mod)).split(".")[0] == PACKAGE:
                uses.append((node.lineno, source, tuple(a.name for a in node.names if a.name != "*")))
        uses.sort(key=lambda use: use[0])  # in source order
        problems = [f"{path}:{line}: " + (f"from {name} import {', '.join(names)}" if names else f"import {name}")
                    + f": {said}" for line, name, names in uses if (said := _problem(up, name, names))]
        out[module] = {"status": "failed" if problems else "ok", "detail": "; ".join(problems), "imports": len(uses)}
    return out


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _top_imports(text: str) -> list[ast.stmt]:
    """The import statements that start a line (none in an ``if``, ``try`` or function), each parsed by itself: a
    file's whole syntax tree costs ten times as much, and a tier reaches hundreds of sglang's files."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        line, i = lines[i], i + 1
        if line.startswith(("import ", "from ")):
            statement = [line]
            while i < len(lines) and (statement[-1].rstrip().endswith("\\") or
                                      "(" in line and ")" not in "".join(statement)):
                statement.append(lines[i])
                i += 1
            try:
                found += ast.parse("\n".join(statement)).body
            except (SyntaxError, ValueError):
                continue
    return [s for s in found if isinstance(s, (ast.Import, ast.ImportFrom))]


def preloads(top: Path, modules: list[str]) -> dict[str, list[str]]:
    """module -> the modules outside sglang that importing it imports (static): the import statements that start a
    line of its file, of the tree's sglang modules those reach and of their packages' ``__init__`` (none under an
    ``if``, a platform's branch, or an import guard). The runner imports them once for both gate states."""
    reader = _FolderReader(top)
    up = Upstream(reader, {})
    direct: dict[str, tuple[set[str], set[str]]] = {}  # sglang module -> (its sglang imports, the others)

    def imports(module: str) -> tuple[set[str], set[str]]:
        if module not in direct:
            parts = module.split(".")
            ours, others = {".".join(parts[:i]) for i in range(1, len(parts))}, set()
            path = up.module_path(module) or "/"
            mod = Def("module", module, path, module=module)
            for node in _top_imports(reader.text(path) or "") if path.endswith(".py") else []:
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif source := absolute(node, mod):
                    names = [source, *(f"{source}.{a.name}" for a in node.names if source.split(".")[0] == PACKAGE
                                       and up.module_path(f"{source}.{a.name}"))]  # a submodule of ours
                else:
                    continue
                for name in names:
                    (ours if name.split(".")[0] == PACKAGE else others).add(name)
            direct[module] = ours, {n for n in others if _DOTTED.fullmatch(n) and n != "__future__"}
        return direct[module]

    out = {}
    for module in modules:
        seen, todo, found = set(), [module], set()
        while todo:
            if (name := todo.pop()) not in seen:
                seen.add(name)
                ours, others = imports(name)
                todo += ours
                found |= others
        out[module] = sorted(found)
    return out


# ---------------------------------------------------------------------------- the CPU tree checks
@dataclass
class TreeCheck:
    name: str
    ok: bool = True
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, finding: str) -> None:
        self.ok = False
        self.findings.append(finding)


def _text(git: Git, rev: str, path: str) -> str | None:
    data = git.blob(rev, path)
    return None if data is None or b"\0" in data else data.decode(errors="replace")


def _compile_error(text: str, path: str) -> str:
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}: {exc.msg}"
    except ValueError as exc:  # e.g. a null byte
        return f"{path}: {exc}"
    return ""


def check_tree(git: Git, base: str, head: str, gates: list[str]) -> list[TreeCheck]:
    """The checks of the module docstring on ``head``; ``gates``: the env gates to look for."""
    files = git.changed_files(base, head)
    texts = {p: t for p in files if (t := _text(git, head, p)) is not None}
    markers, compiles = TreeCheck("no-conflict-markers"), TreeCheck("python-compiles")
    declared = TreeCheck("gates-declared")
    for path, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            if _MARKER.match(line):
                markers.fail(f"{path}:{number}: conflict marker {line[:7]!r}")
                break
        if path.endswith(".py"):
            error = _compile_error(text, path)
            if error:
                before = _text(git, base, path)
                if before is not None and _compile_error(before, path):
                    compiles.notes.append(f"{error} (does not compile upstream either)")
                else:
                    compiles.fail(error)
    compiles.notes.append(f"{sum(p.endswith('.py') for p in texts)} changed Python file(s) compiled")
    environ = _text(git, head, ENVIRON) or ""
    for gate in sorted(set(gates)):
        if not re.search(rf"^\s+{re.escape(gate)}\s*(:[^=\n]*)?=\s*Env\w*\(", environ, re.M):
            declared.fail(f"{gate} is not declared in {ENVIRON}")
    return [markers, compiles, declared]
