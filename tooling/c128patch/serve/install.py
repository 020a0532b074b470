"""Where sglang is installed for a Python and what its ``.dist-info`` says, asked in a stdlib-only subprocess
(``PROBE``: no sglang code runs, but the venv's site hooks do: run as doctor's probes are, ``serving.output``), so
doctor inspects any venv without running in it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c128patch.errors import C128Error
from c128patch.serve.serving import output

MAX_DIST_FILE = 16 << 20  # bytes: a .dist-info file (sglang's RECORD: ~2 MB)

PROBE = r"""
import sys
here = sys.path[:1] == [""]  # the current folder (``python -c``): none of its files imported (a tree's json.py)
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import importlib.util, json, platform, sysconfig
from importlib import metadata
def dist(name):
    try:
        d = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    path = getattr(d, "_path", None)
    return {"version": d.version, "dist_info": str(path) if path else None, "site": str(d.locate_file("")),
            "requires": list(d.requires or [])}
dists = {n: dist(n) for n in ("sglang", "torch", "apache-tvm-ffi", "c128patch")}
sys.path[:0] = [""] if here else []  # where `import sglang` resolves at a launch from here (find_spec runs nothing)
spec = importlib.util.find_spec("sglang")
sys.path[:] = [p for p in sys.path if p != ""]
print(json.dumps({
    "executable": sys.executable, "version": platform.python_version(),
    "tag": "%s%d%d" % ({"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, "py"), *sys.version_info[:2]),
    "platform": sysconfig.get_platform(),
    "import_path": (list(spec.submodule_search_locations or [None])[0] if spec else None),
    "dists": dists,
}))
"""


@dataclass
class Dist:
    version: str
    dist_info: Path | None
    site: Path
    requires: list[str] = field(default_factory=list)

    def read(self, name: str) -> str | None:
        """A file of the ``.dist-info`` folder (None when missing)."""
        path = self.dist_info / name if self.dist_info else None
        if not (path and path.is_file()):
            return None
        size = path.stat().st_size
        if size > MAX_DIST_FILE:  # (a RECORD linked to /proc/kcore: read whole)
            raise C128Error(f"{path} is over {MAX_DIST_FILE >> 20} MiB: not an installer's file; reinstall the wheel")
        if not size:  # not opened: /proc's files say 0, and some block (/proc/kmsg)
            return ""
        with path.open("rb") as f:
            return f.read(size).decode(errors="replace")


@dataclass
class Interpreter:
    executable: str
    version: str
    tag: str
    platform: str
    import_path: Path | None  # where `import sglang` resolves (None: it does not)
    dists: dict[str, Dist | None]  # sglang, torch, apache-tvm-ffi, c128patch (None: not installed)


def probe(python: str) -> Interpreter:
    """Ask ``python`` what it has installed (one subprocess, stdlib only)."""
    if Path(python).is_dir():  # a venv's folder, say: running it said only "Permission denied"
        inside = Path(python) / "bin" / "python"
        raise C128Error(f"{python} is a folder, not a Python: pass --python the serving interpreter"
                        + (f" ({inside})" if inside.is_file() else ", e.g. /path/to/venv/bin/python"))
    out, why = output(python, PROBE, 120)  # as doctor's other probes: site hooks (a .pth) run there
    lines = out.strip().splitlines()
    if not lines:
        raise C128Error(f"cannot ask {python} what it has installed: {why or 'it printed nothing'}")
    try:
        raw = json.loads(lines[-1])
    except (ValueError, RecursionError):
        raw = None
    problem = _probe_problem(raw)
    if problem:
        raise C128Error(f"{python} did not answer as a Python does ({problem}; it printed {lines[-1][:80]!r}): "
                        "pass --python the serving interpreter, e.g. /path/to/venv/bin/python")
    dists = {name: d and Dist(d["version"], Path(d["dist_info"]) if d["dist_info"] else None, Path(d["site"]),
                              d["requires"]) for name, d in raw["dists"].items()}
    return Interpreter(raw["executable"], raw["version"], raw["tag"], raw["platform"],
                       Path(raw["import_path"]) if raw["import_path"] else None, dists)


def _probe_problem(raw: Any) -> str | None:
    """What makes ``raw`` not the probe's answer (None: it is)."""
    if not isinstance(raw, dict):
        return "not a JSON object"
    for key in ("executable", "version", "tag", "platform"):
        if not isinstance(raw.get(key), str):
            return f"no {key}"
    if not isinstance(raw.get("import_path"), (str, type(None))) or not isinstance(raw.get("dists"), dict):
        return "no import path / distributions"
    for d in (d for d in raw["dists"].values() if d is not None):
        if not (isinstance(d, dict) and isinstance(d.get("version"), str) and isinstance(d.get("site"), str)
                and isinstance(d.get("dist_info"), (str, type(None))) and isinstance(d.get("requires"), list)):
            return "a distribution without version and site"
    return None


def installer(dist: Dist) -> str:
    """'pip, from file:///…/x.whl' (INSTALLER and PEP 610 direct_url.json), as far as they say."""
    who = (dist.read("INSTALLER") or "").strip() or "an unknown installer"
    raw = dist.read("direct_url.json")
    if not raw:
        return f"{who}, from an index"
    try:
        url = json.loads(raw)
    except (ValueError, RecursionError):
        url = None
    if not isinstance(url, dict) or not isinstance(url.get("url", ""), str):
        return f"{who}, from an unreadable direct_url.json"
    dir_info = url.get("dir_info")
    editable = " (editable)" if isinstance(dir_info, dict) and dir_info.get("editable") is True else ""
    return f"{who}, from {url.get('url', '?')}{editable}"
