"""The behavioural tier's environment (docs/watch.md): a venv built from the target's own requirements (the
tree's ``python/pyproject.toml``, else its release wheel's), untrusted input (``filtered``), the CUDA-only ones
of ``patches/env/cuda-only.toml`` dropped (a ``tried`` one kept where its build imports), torch pinned CPU,
locked with hashes (committed in ``patches/env/``, else resolved at run time), installed by pip in
``fit.sandbox``'s box into ``<cache>/envs/<key>``."""

from __future__ import annotations

import configparser
import contextlib
import email
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.fit.sandbox import Sealed
from c128patch.jsonio import read_json, write_atomic
from c128patch.progress import NullReporter, Reporter
from c128patch.series.manifest import Series, read_series_file, tomllib
from c128patch.series.paths import confine
from c128patch.textsafe import one_line
from c128patch.upstream.releases import WheelZip, cache_dir, ensure_folder, locked, wheel_for

TORCH_PIN = "torch==2.13.0"  # the CPU build; the operator may name another: $C128PATCH_TORCH_PIN
RESOLVE_TIMEOUT, INSTALL_TIMEOUT = 600.0, 1200.0  # seconds
UNUSED_DAYS = 14  # an environment not used for as long is removed when another is built (``_prune``)
PIP_FILES = 8 << 30  # bytes of a file pip writes in the box (a wheel, a library: libtorch_cpu.so is 434 MB)
_IMPORT = ("import importlib, json, sys\nops = json.loads(sys.argv[1])\n"  # argv: ops to define, then names
           "libs = [__import__('torch').library.Library(op.split('::')[0], 'FRAGMENT') for op in ops]\n"
           "for lib, op in zip(libs, ops):\n    lib.define(op.split('::', 1)[1])\n"
           "for n in sys.argv[2:]:\n    importlib.import_module(n)\n")
_SCHEMA = re.compile(r"[A-Za-z_]\w*::[A-Za-z_][\w.]*\([^\x00-\x1f|]*\) -> [^\x00-\x1f|]+")  # an op, one line, no "|"
_LOCKED = re.compile(r"[a-z0-9][a-z0-9._-]*==[A-Za-z0-9.+!_-]+ --hash=sha256:[0-9a-f]{64}")  # a lock's package line
_VERSION = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def host() -> str:
    """The Python and platform a lock and a venv are for, e.g. ``cp311-linux-x86_64``."""
    return f"cp{sys.version_info[0]}{sys.version_info[1]}-{sys.platform}-{platform.machine()}"


def torch_pin() -> str:
    return os.environ.get("C128PATCH_TORCH_PIN") or TORCH_PIN


def cuda_only(series: Series) -> dict[str, dict]:
    """The series' table of CUDA-only requirements: name -> {"imports": [...], "reason": ...}."""
    path = confine(series.root, "patches/env/cuda-only.toml", "the series' CUDA-only table")
    if os.path.lexists(path):  # (a FIFO or a folder there was no table: every CUDA-only package then tried)
        confine(series.root, "patches/env/cuda-only.toml", "the series' CUDA-only table", regular=True)
    try:
        table = tomllib.loads(read_series_file(path).decode("utf-8")) if path.is_file() else {}  # (64 MiB at most)
    except (ValueError, RecursionError) as exc:  # (TOMLDecodeError, not UTF-8, a number past the digit limit)
        raise C128Error(f"{path}: not TOML ({one_line(str(exc))[:200] or 'nested too deeply'})") from None
    for name, row in table.items():  # input: a row of another shape, or a key line ("said") forged in ``build``
        imports, ops = (row.get("imports"), row.get("defines", [])) if isinstance(row, dict) else (None, None)
        if not (isinstance(imports, list) and all(isinstance(n, str) and all(p.isidentifier() for p in n.split("."))
                                                  for n in imports) and isinstance(row.get("reason"), str)
                and isinstance(row.get("tried", False), bool) and isinstance(ops, list) and (imports or not ops)
                and all(isinstance(op, str) and _SCHEMA.fullmatch(op) for op in ops)):
            raise C128Error(f"{path}: row {name!r} is not {{ imports = [import names], reason = \"...\", tried = "
                            "true|false, defines = [\"ns::op(args) -> ret\" op schemas, one line each] }")
    return {canonicalize_name(name): row for name, row in table.items()}


def _dropped(cuda: dict[str, dict]) -> set[str]:
    """The CUDA-only names never installed (a ``tried`` one is installed, and kept where it imports: ``build``)."""
    return {name for name, row in cuda.items() if not row.get("tried")}


def stand_ins(series: Series) -> dict[str, str]:
    """import name -> what it stands in for (``package: reason``), for the tier's runner."""
    return {name: f"{pkg}: {row['reason']}" for pkg, row in cuda_only(series).items() for name in row["imports"]}


def defines(series: Series) -> dict[str, list[str]]:
    """import name -> the op schemas its row ``defines``, for the tier's runner (defined where its import fails)."""
    return {row["imports"][0]: row["defines"] for row in cuda_only(series).values() if row.get("defines")}


def declared(tree: Path) -> tuple[list[str], str]:
    """The tree's requirement lines and where they came from."""
    pyproject = tree / "python" / "pyproject.toml"
    if os.path.lexists(pyproject):  # the target's file: a regular one in the tree, 64 MiB at most (helper 173)
        confine(tree, "python/pyproject.toml", "the tree's python/pyproject.toml", regular=True)
        try:
            deps = tomllib.loads(read_series_file(pyproject).decode("utf-8"))["project"]["dependencies"]
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                raise TypeError("not a list of strings")
            return deps, "python/pyproject.toml"
        except (ValueError, RecursionError, LookupError, TypeError) as exc:  # (TOMLDecodeError, not UTF-8, a number
            # past Python's digit limit: a ValueError tomllib does not wrap)
            raise C128Error(f"{pyproject}: no [project].dependencies list to build the tier's environment from "
                            f"({type(exc).__name__}: {one_line(str(exc))[:200]})") from None
    found = _VERSION.search((p.read_text(errors="replace") if (p := tree / "python/sglang/_version.py").is_file()
                             else ""))
    if not found:
        raise C128Error(f"{tree} has neither python/pyproject.toml nor python/sglang/_version.py: "
                        "no requirements to build the tier's environment from (pass --python)")
    return wheel_requirements(wheel_for(found.group(1))), f"the sglang {found.group(1)} release wheel"


def wheel_requirements(wheel: Path) -> list[str]:
    """A wheel's ``Requires-Dist`` values."""
    try:
        with WheelZip(wheel) as zf:
            name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            return email.message_from_bytes(zf.read(name)).get_all("Requires-Dist") or []
    except (zipfile.BadZipFile, StopIteration, OSError) as exc:
        raise C128Error(f"{wheel}: no readable METADATA ({exc or 'missing'}); delete it to fetch it again") from None


def filtered(lines: list[str], cuda: dict[str, dict]) -> tuple[list[str], list[str]]:
    """(the requirements to install, the CUDA-only names dropped); a line that is not a plain requirement refused."""
    keep, dropped = [], []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            raise C128Error(f"the target's requirement {line!r} is not 'name[extras] specifier; marker': "
                            "refused (no options, paths or indexes are taken from the target)") from None
        if req.url:
            raise C128Error(f"the target's requirement {line!r} is a direct URL, VCS reference or path: refused "
                            "(the tier installs from the operator's index only)")
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        req.marker, req.extras = None, set()
        if name in _dropped(cuda):
            dropped.append(name)
        else:  # torch: pinned by the constraint (``torch_pin``)
            keep.append("torch" if name == "torch" else str(req))
    return sorted(set(keep), key=str.lower), sorted(set(dropped))


def header(source: str, requirements: list[str], dropped: list[str]) -> str:
    """A lock's first lines: what it was resolved from; all but ``# from:`` compare it to a target's."""
    return "".join([f"# c128patch tier environment lock: {host()}; {torch_pin()}\n", f"# from: {source}\n",
                    *(f"# requirement: {r}\n" for r in requirements), f"# dropped: {' '.join(dropped)}\n"])


def _resolved_from(text: str) -> str:
    """A lock's header less its ``# from:`` line: two locks with the same one were resolved from the same input."""
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith("# ")
                   and not line.startswith("# from: "))


def lock_text(report: dict, head: str, cuda: dict[str, dict]) -> str:
    """A lock from pip's ``--report``: each package ``name==version --hash=sha256:...``, CUDA-only ones left out."""
    rows = []
    for item in report.get("install", []):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        sha = item.get("download_info", {}).get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha:
            raise C128Error(f"pip's report gives no sha256 for {name} {version}: no lock without hashes")
        if canonicalize_name(name) not in _dropped(cuda):
            rows.append(f"{canonicalize_name(name)}=={version} --hash=sha256:{sha}\n")
    return head + "".join(sorted(rows))


def _pip_config() -> str:
    """The operator's own pip config file (``PIP_CONFIG_FILE``, else the user's), read in the box where ``HOME`` is
    hidden; "" if none."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for path in (os.environ.get("PIP_CONFIG_FILE"), os.path.join(xdg, "pip", "pip.conf"),
                 os.path.join(home, ".pip", "pip.conf")):
        if path and path != os.devnull and os.path.isfile(path):
            return os.path.realpath(path)
    return ""


def _pip_folders(config: str) -> list[str]:
    """The local folders the operator's pip settings name (its ``PIP_*`` variables, its config file, the site's:
    a find-links folder, a ``file://`` index, a constraints file's folder): read in the box, which hides every folder
    outside the system's (the config file itself is handed in as a copy: ``_pip``)."""
    dirs = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    parser = configparser.RawConfigParser()
    with contextlib.suppress(configparser.Error, UnicodeDecodeError):
        parser.read([*([config] if config else []), "/etc/pip.conf", *(os.path.join(d, "pip/pip.conf") for d in dirs)])
    settings = [*((k.lower(), v) for k, v in os.environ.items() if k.startswith("PIP_") and k != "PIP_CONFIG_FILE"),
                *((k.lower(), v) for s in parser.sections() for k, v in parser[s].items())]
    paths = {t.removeprefix("file://") for _, v in settings for t in v.split()}
    # a local index's pages link to files beside it (bandersnatch's web/simple + web/packages, /opt/pypi/simple +
    # /opt/pypi/files: `../../files/x.whl`): its parent too, never /, HOME, the temporary folder (other runs' scratch)
    # or a folder above one
    mine = [os.path.realpath(p) for p in (os.path.expanduser("~"), tempfile.gettempdir())]
    paths |= {parent for k, v in settings if k.replace("_", "-").endswith("index-url") for t in v.split()
              if t.startswith("file:///")
              and (parent := os.path.dirname(os.path.normpath(t.removeprefix("file://")))) != "/"
              and not any(Path(m).is_relative_to(os.path.realpath(parent)) for m in mine)}
    return sorted({p if os.path.isdir(p) else os.path.dirname(p) for p in paths
                   if os.path.isabs(p) and os.path.exists(p)})


def pip_settings(conf: str) -> tuple[dict[str, str], list[str]]:
    """The operator's pip settings for a box (never the target's): (its ``PIP_*`` and proxy variables, its own config
    file copied into ``conf``; the folders the box must read for them, ``conf`` among them)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")}
    config = _pip_config()
    if config:
        env["PIP_CONFIG_FILE"] = shutil.copyfile(config, os.path.join(conf, "pip.conf"))
    return env, [*_pip_folders(config), conf]


def _pip(python: str, args: list[str], timeout: float, reporter: Reporter, what: str, into: Path,
         reads: tuple[str, ...] = ()) -> None:
    """``python -m pip ARGS`` in the sealed box (network kept: pip needs it; writes to ``into`` only, reads ``reads``
    too) with the operator's settings."""
    reporter.step(what)
    with procs.scratch("c128env-pipconf-") as conf:  # a copy: never its folder (HOME, say)
        env, folders = pip_settings(conf)
        box = Sealed(python, ["-m", "pip", "--disable-pip-version-check", *args], timeout, env=env,
                     writable=(str(into),), readable=(*folders, *reads), files=PIP_FILES, pip=True)
        try:
            stdout, stderr = box.wait()
        except C128Error as exc:
            raise C128Error(f"{what}: {exc.message}") from None
    if box.returncode:
        said = stderr if stderr.strip() else stdout  # pip says some errors on stdout
        last = [ln for ln in said.splitlines() if ln.strip() and not ln.startswith("WARNING:")] or ["?"]
        raise C128Error(f"{what}: pip failed: {last[-1].strip()}")


def resolve(head: str, requirements: list[str], cuda: dict[str, dict], reporter: Reporter = NullReporter(),
            timeout: float = RESOLVE_TIMEOUT) -> str:
    """The lock of ``requirements`` (pip's resolver, wheels only, torch pinned), with its ``header``."""
    with procs.scratch("c128env-resolve-") as tmp:
        (Path(tmp) / "req.txt").write_text("".join(f"{r}\n" for r in requirements))
        (Path(tmp) / "pin.txt").write_text(f"{torch_pin()}\n")
        _pip(sys.executable, ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:", "-q", "--report",
                              f"{tmp}/report.json", "-r", f"{tmp}/req.txt", "-c", f"{tmp}/pin.txt"], timeout, reporter,
             f"resolving the tier's environment ({len(requirements)} requirements)", Path(tmp))
        return lock_text(json.loads((Path(tmp) / "report.json").read_text()), head, cuda)


def lock_for(series: Series, tree: Path, reporter: Reporter = NullReporter()) -> tuple[str, str]:
    """(the lock text, where it came from): a committed lock resolved from the same requirements, else resolved."""
    cuda = cuda_only(series)
    lines, source = declared(tree)
    requirements, dropped = filtered(lines, cuda)
    head = header(source, requirements, dropped)
    for path in sorted((series.patches_dir / "env").glob("*.lock")):
        text = read_series_file(confine(series.root, f"patches/env/{path.name}", "the series' locks", regular=True)
                                ).decode(errors="replace")  # (64 MiB at most)
        if _resolved_from(text) == _resolved_from(head):
            return text, str(path.relative_to(series.root))
    name = hashlib.sha256(_resolved_from(head).encode()).hexdigest()[:16]
    cached = cache_dir() / "envs" / "locks" / f"{name}.lock"
    if not cached.is_file():
        write_atomic(ensure_folder(cached.parent) / cached.name, resolve(head, requirements, cuda, reporter).encode())
    return cached.read_text(), f"resolved at run time ({cached})"


def _imports(venv: Path, names: list[str], ops: list[str]) -> str:
    """Why ``names`` do not import in ``venv`` with ``ops`` defined first (its last error line); "" if they do."""
    box = Sealed(str(venv / "bin/python"), ["-c", _IMPORT, json.dumps(ops), *names], 300, offline=True)
    try:
        stderr = box.wait()[1]
        return box.returncode and ([ln.strip() for ln in stderr.splitlines() if ln.strip()] or ["?"])[-1] or ""
    except C128Error as exc:  # a hang: past the limit
        return exc.message


def _untried(venv: Path, tried: dict[str, dict], reporter: Reporter) -> tuple[dict[str, str], dict[str, str]]:
    """Of the ``tried`` packages (installed in ``venv``) whose imports fail there (a CUDA build beside CPU torch):
    (those uninstalled, so the runner's stand-in takes their place; those that import once their ``defines`` are
    defined, kept without their ops): name -> why (the plain import's last error line)."""
    out, defined = {}, {}
    for name, row in sorted(tried.items()):
        why = _imports(venv, row["imports"], [])
        if why and row.get("defines") and not _imports(venv, row["imports"], row["defines"]):
            defined[name] = why
        elif why:
            out[name] = why
            reporter.step(f"{name} does not import here ({why}): uninstalled, a stand-in takes its place")
            _uninstall(venv, name)
    return out, defined


def _uninstall(venv: Path, name: str) -> None:
    """The files ``name``'s RECORD lists, removed by us (``pip --python`` would start the environment's interpreter,
    its installed ``.pth`` files run, with the environment writable and the network on); one outside ``venv`` or
    through a link is left."""
    site = next(venv.glob("lib/python*/site-packages"))
    dist = next((d for d in importlib.metadata.distributions(path=[str(site)])
                 if canonicalize_name(d.metadata["Name"] or "") == name), None)
    if dist is None:
        raise C128Error(f"the tier's environment: {name} is not installed in {venv}, so it cannot be uninstalled")
    folders = set()  # those its files were in: removed where left empty, as pip leaves none
    for rel in (os.path.relpath(os.path.normpath(site / str(f)), venv) for f in dist.files or ()):
        with contextlib.suppress(C128Error, OSError):
            if not rel.startswith(".."):
                confine(venv, rel, f"{name}'s RECORD").unlink(missing_ok=True)
                folders.add(Path(rel).parent)
    for folder in sorted(folders, key=lambda f: -len(f.parts)):
        with contextlib.suppress(OSError):
            (venv / folder).rmdir()


def _interpreter(venv: Path) -> dict[str, str]:
    """What ``venv``'s interpreter is: its ``bin/python*`` links and its ``pyvenv.cfg``; a package that replaces one
    (a wheel's ``.data/scripts/python``) would run in its place, where the environment is writable too."""
    said = {}
    for path in [*sorted((venv / "bin").glob("python*")), venv / "pyvenv.cfg"]:
        mode = os.lstat(path).st_mode if os.path.lexists(path) else 0
        said[path.name] = (f"-> {os.readlink(path)}" if stat.S_ISLNK(mode) else "none" if not mode else
                           f"a special file ({stat.filemode(mode)})" if not stat.S_ISREG(mode) else
                           path.open("rb").read(4096).decode(errors="replace") if path.name == "pyvenv.cfg" else
                           f"a file of {os.lstat(path).st_size} bytes")
    return said


def _unchanged(venv: Path, made: dict[str, str], step: str) -> None:
    """Refuses the environment where ``step`` changed its interpreter (``_interpreter``) from what ``venv`` made."""
    now = _interpreter(venv)
    changed = sorted(k for k in {*made, *now} if made.get(k) != now.get(k))
    if changed:
        raise C128Error(f"building the tier's environment: {step} changed its interpreter ({', '.join(changed)}: "
                        "a package of the lock installs a file in its place): refused, nothing was kept")


# every .py under argv[1] compiled by one forked child a core (the box has no /dev/shm for compileall's process pool);
# a file that does not compile for this Python (torch's 3.12-only test helpers) is left to its import; a package's
# own test suite (a ``tests`` folder: pandas', scipy's, sympy's, numba's; 3362 files, 17 % of v0.5.23's source) is
# never imported by the tier, so not compiled (one that is imported compiles in memory, as without this step)
_COMPILE = """import compileall, contextlib, os, sys
files = []
for d, ds, fs in os.walk(sys.argv[1]):
    ds[:] = [x for x in ds if x != "tests"]
    files += [os.path.join(d, f) for f in fs if f.endswith(".py")]
files.sort()
n, kids = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, []
for i in range(n):
    kids.append(os.fork())
    if not kids[-1]:
        for f in files[i::n]:
            with contextlib.suppress(Exception):
                compileall.compile_file(f, quiet=2)
        os._exit(0)
sys.exit(any(os.waitpid(pid, 0)[1] for pid in kids))
"""


def _compile(venv: Path, reporter: Reporter, timeout: float) -> bool:
    """The bytecode of every module ``venv`` installed, written once: the tier reads the environment but cannot write
    to it, so each gate state of each run compiled every module it imported again (about 40 % of the tier's CPU on
    v0.5.23). Whether it was; one that fails is said and tried again on the next use (no ``c128patch-compiled``):
    the tier runs as well without it, only slower."""
    reporter.step("compiling the bytecode of the tier's environment")
    # -S: no site-packages, so no installed ``.pth`` runs while the environment is writable
    box = Sealed(str(venv / "bin" / "python"), ["-S", "-c", _COMPILE, str(venv / "lib")], timeout,
                 writable=(str(venv),))
    try:
        box.wait()
        failed = f"exit {box.returncode}" if box.returncode else ""
    except C128Error as exc:
        failed = exc.message
    if failed:
        reporter.step(f"the tier's environment was not compiled ({failed}): it runs slower, compiled on its next use")
    return not failed


def build(lock: str, cuda: dict[str, dict], reporter: Reporter = NullReporter(),
          timeout: float = INSTALL_TIMEOUT) -> tuple[Path, bool]:
    """(the venv's python for ``lock``, whether it was built now): installed from the lock's hashes, cached; of
    ``cuda``'s ``tried`` rows, those that do not import there uninstalled (``c128patch-untried.json``) or, where
    they import with their ``defines`` defined, kept without their ops (``c128patch-defined.json``)."""
    root = cache_dir() / "envs"
    packages = "".join(line for line in lock.splitlines(keepends=True) if not line.startswith("#"))
    for line in (ln for ln in packages.splitlines() if ln.strip() and not _LOCKED.fullmatch(ln)):  # pip takes options
        raise C128Error(f"a line of the tier's lock is not 'name==version --hash=sha256:HEX': {line!r} (no option, "
                        "file, path or index is taken from a lock)")
    tried = {n: r for n, r in cuda.items() if r.get("tried") and r["imports"] and f"\n{n}==" in f"\n{packages}"}
    # which are tried (and the ops each defines) decides what the build keeps: part of the key (none: the key it had)
    said = "".join(f"# tried: {n} {' '.join(r['imports'])}{''.join(f' | {op}' for op in r.get('defines', []))}\n"
                   for n, r in sorted(tried.items()))
    key = f"{hashlib.sha256((packages + said).encode()).hexdigest()[:16]}-{host()}"
    # ours: the lock, what the build found, its markers; ``venv/``: the environment, the only folder a box writes
    final = root / key
    with locked(root / ".lock"):
        if (final / "c128patch-ready").is_file() and (final / "venv").is_dir():
            with contextlib.suppress(OSError):  # its last use, for ``_prune`` (a read-only cache: never pruned)
                os.utime(final / "c128patch-ready")
            if not (final / "c128patch-compiled").is_file() and _compile(final / "venv", reporter, timeout):
                (final / "c128patch-compiled").write_text("")  # built before its bytecode was
            return final / "venv" / "bin" / "python", False
        for stale in [*root.glob(".build-*"), final]:  # an interrupted build (never marked ready), an older layout
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(procs.scratch_dir(f".build-{key}-", root))
        venv = tmp / "venv"
        try:
            Sealed(sys.executable, ["-m", "venv", "--without-pip", str(venv)], 300, writable=(str(tmp),)).wait()
            made = _interpreter(venv)
            with procs.scratch("c128env-lock-") as reqs:
                (Path(reqs) / "lock.txt").write_text(lock)
                args = ["--python", str(venv / "bin/python"), "install", "-q", "--no-deps", "--no-compile", "-r"]
                _pip(sys.executable, [*args, f"{reqs}/lock.txt", "--only-binary=:all:", "--require-hashes"], timeout,
                     reporter, f"building the tier's environment {key}: installing {packages.count(chr(10))} "
                     "packages", venv, reads=(reqs,))
            _unchanged(venv, made, "installing the lock")
            untried, defined = _untried(venv, tried, reporter)
            (tmp / "c128patch-untried.json").write_text(json.dumps(untried))
            (tmp / "c128patch-defined.json").write_text(json.dumps(defined))
            if _compile(venv, reporter, timeout):
                (tmp / "c128patch-compiled").write_text("")
            _unchanged(venv, made, "compiling its bytecode")
            (tmp / "c128patch-ready").write_text(lock)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _prune(root, final, reporter)
    return final / "venv" / "bin" / "python", True


def _prune(root: Path, kept: Path, reporter: Reporter) -> None:
    """Remove the environments of ``root`` not used for ``UNUSED_DAYS`` (~3 GB each: a nightly watch of upstream
    ``main`` builds one per change of its requirements), when ``kept`` was built; under the cache's lock."""
    now, gone = time.time(), []
    for folder in root.iterdir():
        ready = folder / "c128patch-ready"
        if folder != kept and ready.is_file() and not folder.is_symlink() and \
                now - ready.stat().st_mtime > UNUSED_DAYS * 86400:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder.name)
    if gone:
        reporter.step(f"removed {len(gone)} tier environment(s) unused for {UNUSED_DAYS} days: {', '.join(gone)}")


def tier_python(series: Series, tree: Path, reporter: Reporter = NullReporter()) -> tuple[str, dict]:
    """The interpreter the tier runs on ``tree`` with no ``--python``, and what to say about it (JSON)."""
    lock, source = lock_for(series, tree, reporter)
    python, built = build(lock, cuda_only(series), reporter)
    # each absent in an environment built before it was written; input: a shared cache
    state = python.parents[2]  # the build's folder, beside its ``venv/``
    untried, defined = ({str(k): str(v) for k, v in (read_json(state / f"c128patch-{n}.json", dict)
                                                     or {}).items()} for n in ("untried", "defined"))
    dropped = lock.split("# dropped: ", 1)[1].split("\n", 1)[0].split()
    return str(python), {"key": state.name, "lock": source, "built": built, "python": str(python),
                         "dropped": sorted({*dropped, *untried}), "untried": untried, "defined": defined}


def describe(info: dict) -> str:
    """One line on the environment the tier ran in (``tier_python``'s dict, with ``isolation``)."""
    if not info.get("key"):
        return f"behavioural tier: the interpreter given (--python); {info['isolation']}"
    return (f"behavioural tier environment {info['key']} ({'built now' if info['built'] else 'cached'}; lock: "
            f"{info['lock']}); stand-ins for {', '.join(info['dropped']) or 'none'}; "
            + "".join(f"{name} installed but stood in: it does not import here ({why}); "
                      for name, why in info.get("untried", {}).items())
            + "".join(f"{name} installed without its ops: its extension does not load here ({why}), the ops it "
                      "registers at import defined with no kernel (each raises on use); "
                      for name, why in info.get("defined", {}).items()) + info["isolation"])
