"""Run in a subprocess by ``ops.treecheck`` (no c128patch imports): import each module of a tree and
say, per module, ok / not checked (a third-party package this interpreter lacks) / failed.

argv: TREE_PYTHON_DIR GATES(on|off) PROBES_JSON MODULE...; prints one JSON object. Each probe
(module, zero-argument function, what it must return with the gates on / off) is called after the
imports, where its module imported. A package ``__init__`` that stops on a
missing third-party package is kept as far as it ran (the modules below it are still tried).
"""

import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import traceback

TREE = sys.argv[1]  # run as `python -c SOURCE TREE ...`: no folder of ours on sys.path
partial: dict = {}


def _third_party(exc: BaseException) -> str:
    name = getattr(exc, "name", None) or ""
    return name if isinstance(exc, ModuleNotFoundError) and name and name.split(".")[0] != "sglang" else ""


class _Tolerant(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        try:
            self.inner.exec_module(module)
        except Exception as exc:  # noqa: BLE001
            missing = _third_party(exc)
            if not missing:
                raise
            partial[module.__name__] = missing


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path or [TREE])
        if spec is not None and spec.submodule_search_locations is not None and spec.loader is not None:
            spec.loader = _Tolerant(spec.loader)
        return spec


def main() -> None:
    sys.path.insert(0, TREE)
    sys.meta_path.insert(0, _Finder())
    out = {"python": sys.executable, "torch": True, "modules": {}}
    try:
        import torch  # noqa: F401
    except ImportError:
        out["torch"] = False
        print(json.dumps(out))
        return
    gates, probes = sys.argv[2], json.loads(sys.argv[3])
    for name in sys.argv[4:]:
        before = set(sys.modules)
        try:
            importlib.import_module(name)
            out["modules"][name] = {"status": "ok"}
        except BaseException as exc:  # noqa: BLE001
            for stale in set(sys.modules) - before:  # the next import starts clean, not from half-run modules
                if stale == "sglang" or stale.startswith("sglang."):
                    del sys.modules[stale]
            missing = _third_party(exc)
            if not missing and isinstance(exc, ImportError) and getattr(exc, "name", None) in partial:
                missing = partial[exc.name]  # a package whose __init__ stopped on a missing package
            if missing:
                out["modules"][name] = {"status": "not checked", "detail": f"needs {missing.split('.')[0]}"}
                continue
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(TREE)]
            where = f"{frames[-1].filename[len(TREE) + 1:]}:{frames[-1].lineno}: " if frames else ""
            out["modules"][name] = {"status": "failed", "detail": f"{where}{type(exc).__name__}: {exc}"}
    out["partial"] = partial
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
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(TREE)]
            where = f"{frames[-1].filename[len(TREE) + 1:]}:{frames[-1].lineno}: " if frames else ""
            out["probes"][key] = {"status": "failed", "detail": f"{where}{type(exc).__name__}: {exc}"}
            continue
        ok = bool(got) == want
        out["probes"][key] = {"status": "ok" if ok else "failed",
                              "detail": "" if ok else f"returned {got!r} with the gates {gates}, expected {want}"}
    print(json.dumps(out))


main()
