"""Run in a subprocess by ``fit.treecheck`` (no c128patch imports): import each module of a tree and
say, per module, ok / not checked (a third-party package this interpreter lacks) / failed.

argv: TREE_PYTHON_DIR GATES_JSON PROBES_JSON STAND_INS_JSON DEFINES_JSON PRELOAD_JSON SCENARIOS_PY MODULE...; prints
one JSON object. STAND_INS: import name -> what it stands in for (a CUDA-only package): a module found only where no
real one is, that imports (its submodules too) but raises on use (attribute access); each module says which its import
loaded. DEFINES: import name -> op schemas: an installed package whose import fails after torch's (its CUDA extension
does not load here, and its Python registers those ops) has them defined with no kernel, then imports without its ops
(each raises on use); each module whose import loaded it says so, as for a stand-in. PRELOAD: module -> the modules
outside sglang it imports (``fit.treecheck.preloads``): imported once, before the forks (torch's and transformers'
submodules: a third of a gate state's CPU), but none of the tree's, and none that reaches for sglang (that one is left
to the gate states); what they loaded of STAND_INS and DEFINES the first module whose preloads name them says as its
own. Run in ``fit.sandbox``'s box (``python -I``). torch and DEFINES are imported once, before the tree is on the path,
PRELOAD after it, then one forked child per gate state (off: the gates unset; on: each set to 1) imports sglang's
modules from a clean slate and calls each probe (module, zero-argument function, what it must return with the gates on
/ off) where its module imported, then runs the series' DSPARK scenarios (``SCENARIOS_PY``: our file, not the
target's; "": none). The gates-on child is forked once the gates-off one has imported: it reads the code that one
compiled (``_Compiled``), and its imports overlap the other's scenarios. A package ``__init__`` that stops on a
missing third-party package is kept as far as it ran.
"""

import ast
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import marshal
import os
import re
import runpy
import select
import shutil
import sys
import tempfile
import traceback
import types

TREE = sys.argv[1]  # run as `python -I -c SOURCE TREE ...`: no folder of ours on sys.path
STAND_INS: dict = json.loads(sys.argv[4])
DEFINES: dict = json.loads(sys.argv[5])
PRELOAD: dict = json.loads(sys.argv[6])
COMPILED = ""  # made by main() in the box's own folder (its TMPDIR), removed at its end as the tier files are
LOADED_BY: dict = {}  # a preloaded module -> the stand-ins and packages without ops its import loaded
WITHOUT_OPS: set = set()  # the names of DEFINES whose ops this run defined
partial: dict = {}


class StandInUsed(AttributeError):
    """A stand-in used: an AttributeError, so ``from X import Y`` still falls back to importing ``X.Y``."""


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr, what=None):
        if attr.startswith("__"):
            raise AttributeError(attr)
        top = self.__name__.split(".")[0]
        raise StandInUsed(f"{what or f'{self.__name__}.{attr}'}: {top} is a stand-in ({STAND_INS[top]}), not usable",
                          name=top)

    def __call__(self, *args, **kwargs):
        self.__getattr__("()", f"{self.__name__}()")


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: a real package wins. Only an unguarded import statement of the tree gets one;
    a guarded one (``try``) and a library's import find the package absent, as it is (a probe: ``_probe``)."""

    def find_spec(self, fullname, path, target=None):
        top, frame = fullname.split(".")[0], sys._getframe(1)
        while frame and (frame.f_code.co_filename.startswith("<frozen") or "importlib" in frame.f_code.co_filename):
            frame = frame.f_back
        if top not in STAND_INS:
            return None
        if isinstance(sys.modules.get(top), _StandInModule) and fullname != top or frame and \
                frame.f_code.co_filename.startswith(TREE) and frame.f_lineno not in _guarded(frame.f_code.co_filename):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)  # a stand-in's submodule: anyone's
        return None

    def create_module(self, spec):
        return _StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def _probe(name, package=None, find_spec=importlib.util.find_spec):
    """``importlib.util.find_spec``, a stand-in absent to it even once loaded (it reads ``sys.modules`` first):
    a library's availability check (transformers' ``is_torchvision_available``) must not take one as installed."""
    spec = find_spec(name, package)
    return None if spec is not None and isinstance(spec.loader, _StandIns) else spec


@functools.cache
def _guarded(path: str) -> frozenset:
    """The lines of ``path`` inside a ``try`` whose handlers catch an ImportError."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read())
    return frozenset(line for node in ast.walk(tree) if isinstance(node, ast.Try) and any(
        h.type is None or {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"} & {
            n.id for n in ast.walk(h.type) if isinstance(n, ast.Name)} for h in node.handlers)
        for stmt in node.body for line in range(stmt.lineno, stmt.end_lineno + 1))


def _stand_ins(before: set) -> list:
    """The stand-ins (and packages without their ops: ``DEFINES``) first loaded since ``before`` (the modules then)."""
    return sorted({n.split(".")[0] for n in set(sys.modules) - before if isinstance(sys.modules[n], _StandInModule)}
                  | {f"{n} (without its ops)" for n in WITHOUT_OPS if n in sys.modules and n not in before})


def _third_party(exc: BaseException) -> str:
    name = getattr(exc, "name", None) or ""
    return name if isinstance(exc, ModuleNotFoundError) and name and name.split(".")[0] != "sglang" else ""


class _Tolerant(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def exec_module(self, module):
        try:
            self.inner.exec_module(module)
        except Exception as exc:  # noqa: BLE001
            missing = _third_party(exc)
            if not missing:
                raise
            partial[module.__name__] = missing


class _Compiled(importlib.machinery.SourceFileLoader):
    """A tree module's code compiled once per run: the first gate state writes it to the box's own folder (``-B``
    and the read-only tree keep Python from writing a .pyc), the second, forked once those imports are done, reads
    it. Keyed by the source's path: the tree does not change while the tier runs."""

    def get_code(self, fullname):
        cached = os.path.join(COMPILED, self.path.replace("/", "%"))
        try:
            with open(cached, "rb") as f:
                return marshal.load(f)
        except (OSError, EOFError, ValueError, TypeError):
            pass
        code = super().get_code(fullname)
        try:
            fd, tmp = tempfile.mkstemp(dir=COMPILED)
            with os.fdopen(fd, "wb") as f:
                marshal.dump(code, f)
            os.replace(tmp, cached)
        except OSError:
            pass
        return code


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path or [TREE])
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _Compiled(fullname, spec.loader.path)
        if spec is not None and spec.submodule_search_locations is not None and spec.loader is not None:
            spec.loader = _Tolerant(spec.loader)
        return spec


class _NeedsTree(BaseException):
    """sglang asked for while preloading (not an ImportError: no ``except ImportError`` takes it for absent)."""


class _NoTree(importlib.abc.MetaPathFinder):
    """While preloading: sglang, or any module found in the tree's folder (a namespace package's portion there too),
    is left to the gate states."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "sglang" or fullname.startswith("sglang."):
            raise _NeedsTree(fullname)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and any(str(w).startswith(TREE)
                                    for w in [*(spec.submodule_search_locations or []), spec.origin or ""]):
            raise _NeedsTree(fullname)
        return None


def _preload() -> None:
    """PRELOAD's modules, imported once for both gate states; one that fails, or reaches for sglang, is left to each
    gate state's own import (a failed import leaves no module of its own behind)."""
    sys.meta_path.insert(0, _NoTree())
    try:
        for name in sorted({n for names in PRELOAD.values() for n in names}):
            if name.split(".")[0] not in STAND_INS and name.split(".")[0] not in DEFINES:
                before = set(sys.modules)
                try:
                    importlib.import_module(name)  # one found in the tree: _NoTree refuses it
                except BaseException:  # noqa: BLE001
                    pass
                LOADED_BY[name] = _stand_ins(before)
    finally:
        del sys.meta_path[0]


def _tier(gates: str, probes: list, scenarios: str, modules: list[str], imported=lambda: None) -> dict:
    out: dict = {"modules": {}}
    said: set = set()  # what preloads loaded, said by the first module that imports them
    for name in modules:
        before = set(sys.modules)
        preloaded = set().union(*(LOADED_BY.get(p, ()) for p in PRELOAD.get(name, ()))) - said
        said |= preloaded
        try:
            importlib.import_module(name)
            out["modules"][name] = {"status": "ok", "stand_ins": sorted(set(_stand_ins(before)) | preloaded)}
        except BaseException as exc:  # noqa: BLE001
            loaded = sorted(set(_stand_ins(before)) | preloaded)
            for stale in set(sys.modules) - before:  # the next import starts clean, not from half-run modules
                if stale == "sglang" or stale.startswith("sglang."):
                    del sys.modules[stale]
            missing = _third_party(exc)
            if not missing and isinstance(exc, ImportError) and getattr(exc, "name", None) in partial:
                missing = partial[exc.name]  # a package whose __init__ stopped on a missing package
            if missing:
                out["modules"][name] = {"status": "not checked", "detail": f"needs {missing.split('.')[0]}"}
                continue
            why = _stand_in_detail(exc)
            if why:
                out["modules"][name] = {"status": "not checked", "stand_ins": loaded, "detail": why}
                continue
            out["modules"][name] = {"status": "failed", "detail": f"{_where(exc)}{type(exc).__name__}: {exc}"}
    imported()
    out["probes"] = {}
    for module, function, on, off in probes:
        key = f"{module}.{function}()"
        if out["modules"].get(module, {}).get("status") != "ok":
            out["probes"][key] = {"status": "not checked", "detail": f"{module} did not import"}
            continue
        want = on if gates == "on" else off
        try:
            got = getattr(sys.modules[module], function)()
        except Exception as exc:  # noqa: BLE001
            out["probes"][key] = {"status": "failed", "detail": f"{_where(exc)}{type(exc).__name__}: {exc}"}
            continue
        ok = bool(got) == want
        out["probes"][key] = {"status": "ok" if ok else "failed",
                              "detail": "" if ok else f"returned {got!r} with the gates {gates}, expected {want}"}
    out["scenarios"] = runpy.run_path(scenarios)["run"](gates, TREE, modules) if scenarios else {}
    return out


def _stand_in_detail(exc: BaseException) -> str:
    """Why ``exc`` is a CUDA-only package's doing: a stand-in used at import (``exc`` or what it was raised while
    handling), or a library's ImportError naming one the tree loaded (absent to ``_probe``); "" if neither."""
    cause: BaseException | None = exc
    for _ in range(20):
        if cause is None or isinstance(cause, StandInUsed):
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, StandInUsed):
        return f"needs {cause.name} (CUDA-only, a stand-in here, used at import: {_where(exc)}{cause})"
    said = " ".join(str(exc).split()).split(". ")[0] if isinstance(exc, ImportError) else ""  # its first sentence
    top = next((t for t in STAND_INS if isinstance(sys.modules.get(t), _StandInModule)
                and re.search(rf"\b{t}\b", said, re.I)), "")
    return top and f"needs {top} (CUDA-only, a stand-in here, absent to a library: {_where(exc)}{said})"


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(TREE)]
    return f"{frames[-1].filename[len(TREE) + 1:]}:{frames[-1].lineno}: " if frames else ""


def _fork(state: str, gates: list[str], probes: list, scenarios: str, modules: list[str]) -> tuple[int, str]:
    """A child that runs the tier for ``state`` and writes its JSON to the returned file (not a pipe: a
    process the target forks would hold a pipe open, and the box kills it once this runner exits). Returns once
    the child has imported the modules (or exited): the next one reads the code it compiled (``_Compiled``)."""
    fd, path = tempfile.mkstemp(prefix=f"tier-{state}-")
    ready, said = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(ready)

        def imported() -> None:
            os.write(said, b"1")
            os.close(said)

        code = 0
        try:
            for g in gates:  # off: unset; on: each set to 1
                os.environ.pop(g, None)
            os.environ.update(dict.fromkeys(gates, "1") if state == "on" else {})
            data = json.dumps(_tier(state, probes, scenarios, modules, imported)).encode()
        except BaseException as exc:  # noqa: BLE001
            data, code = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode(), 1
        os.write(fd, data)
        os._exit(code)
    os.close(fd)
    os.close(said)
    # a process the child forks may hold the pipe open: its exit is looked for too
    while not select.select([ready], [], [], 0.2)[0] and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG |
                                                                     os.WNOWAIT) is None:
        pass
    os.close(ready)
    return pid, path


def main() -> None:
    gates, probes, scenarios, modules = json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[7], sys.argv[8:]
    out: dict = {"python": sys.executable, "torch": True, "tiers": {}}
    importlib.util.find_spec = _probe  # first: a module that binds it at import (torch's) gets this one
    try:  # before the tree is on the path: a torch the tree holds is never the one imported
        import torch
    except ImportError:
        out["torch"] = False
    libs = []  # the ops of each package of DEFINES whose import fails here (alive while this runs)
    for name, ops in DEFINES.items() if out["torch"] else ():
        try:
            importlib.import_module(name) if importlib.util.find_spec(name) else None
        except Exception:  # noqa: BLE001
            for stale in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
                del sys.modules[stale]
            libs += [torch.library.Library(op.split("::")[0], "FRAGMENT") for op in ops]
            for lib, op in zip(libs[-len(ops):], ops):
                lib.define(op.split("::", 1)[1])
            WITHOUT_OPS.add(name)
    sys.path.append(TREE)  # after DEFINES, last: it shadows neither the stdlib nor an installed package
    if out["torch"]:
        _preload()
    sys.meta_path.insert(0, _Finder())
    sys.meta_path.append(_StandIns())
    states = ("off", "on") if out["torch"] else ()
    global COMPILED
    COMPILED = tempfile.mkdtemp(prefix="tier-compiled-")
    children = []
    try:  # (run outside a box, with the host's TMPDIR, it had left them there)
        children += [(state, *_fork(state, gates, probes, scenarios, modules)) for state in states]
        for state, pid, path in children:
            os.waitpid(pid, 0)
            try:
                with open(path, "rb") as f:
                    out["tiers"][state] = json.loads(f.read())
            except ValueError:
                out["tiers"][state] = {"error": f"the gates-{state} child died without a result"}
    finally:
        for _state, _pid, path in children:
            try:
                os.unlink(path)
            except OSError:
                pass
        shutil.rmtree(COMPILED, ignore_errors=True)
    print(json.dumps(out))


main()
