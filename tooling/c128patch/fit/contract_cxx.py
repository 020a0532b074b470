"""The CUDA side of the series' contract: upstream headers our ``.cuh`` code includes, and each
upstream name it uses with its declarations there (parameter lists included, so a parameter swap
of the same arity changes the hash), read from the headers as text. ``probe`` compiles the
series' nvcc signature probe (``ci/kernel_probe/upstream_signatures.cu``) against the tree's
headers where nvcc exists, and says so where it does not.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.fit.resolve import Reader
from c128patch.fit.sandbox import Sealed
from c128patch.git import Git, GitError
from c128patch.jsonio import read_json, write_json_atomic
from c128patch.series.manifest import read_series_file
from c128patch.series.paths import confine
from c128patch.textsafe import shell_join
from c128patch.upstream.releases import _changeable, cache_dir

INCLUDE_ROOT = "python/sglang/kernels/jit/include"
UPSTREAM_PREFIX = "sgl_kernel/"
PROBE = "ci/kernel_probe/upstream_signatures.cu"
# seconds nvcc may take for the probe: a header of the tree's may `#include "/dev/zero"` (the host compiler reads it
# for ever, its memory growing: contract hung)
PROBE_TIMEOUT = 900.0
VERSION_TIMEOUT = 60.0  # seconds ``nvcc --version`` may take (the probe's cache key)
SEALED = "sealed 1"  # the probe's way of running (fit.sandbox.Sealed) and of saying a failure, in its cache key
TVM_FFI = "apache-tvm-ffi"  # as sglang requires it
SOURCES = (".cuh", ".cu", ".h", ".hpp", ".cpp")
STATE_ROW = "the online c128 state row [max | sum | kv] our kernel reads and writes"
MIRRORED = (  # our file, the text of its line that says what it mirrors, the upstream file whose content it mirrors
    # with nothing checkable (literal slot offsets in kernel bodies), why: lock kind ``file``, its blob id
    ("python/sglang/kernels/jit/csrc/deepseek_v4/online_c128_dspark.cuh", "[max | sum | kv]",
     "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh", STATE_ROW),
    ("python/sglang/kernels/jit/csrc/deepseek_v4/online_c128_dspark.cuh", "[max | sum | kv]",
     "python/sglang/kernels/jit/csrc/deepseek_v4/online_c128_mtp.cuh", STATE_ROW),
)
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_NOT_DECL = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "static_assert", "catch",
             "new", "delete", "throw", "case", "else", "do", "noexcept", "requires", "defined", "alignas",
             "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "operator"}
_KEYWORDS = _NOT_DECL | {"const", "constexpr", "inline", "static", "template", "typename", "struct", "class",
                         "using", "namespace", "void", "auto", "int", "bool", "float", "double", "char", "unsigned",
                         "signed", "long", "short", "true", "false", "nullptr", "this", "public", "private",
                         "protected", "virtual", "override", "final", "explicit", "friend", "enum", "union",
                         "volatile", "extern", "typedef", "default", "break", "continue", "goto", "std", "size_t",
                         "int32_t", "int64_t", "uint32_t", "uint64_t", "uint16_t", "uint8_t", "int8_t", "int16_t",
                         "pragma", "once", "include", "define", "ifdef", "ifndef", "endif", "error", "concept"}


def strip(text: str) -> str:
    """Comments and string literals blanked, line numbers kept."""
    def blank(m: re.Match) -> str:
        s = m.group(0)
        return re.sub(r"[^\n]", " ", s) if s.startswith("/") else s[0] + re.sub(r"[^\n]", " ", s[1:-1]) + s[-1]
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'', blank, text, flags=re.S)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _close(text: str, open_at: int) -> int:
    """The index of the ``)`` that closes the ``(`` at ``open_at``; -1: none."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += (text[i] == "(") - (text[i] == ")")
        if depth == 0:
            return i
    return -1


_TYPE_DECL = re.compile(r"\b(?:struct|class|union|enum\s+class|enum)\s+(?:alignas\([^)]*\)\s*)?"
                        r"([A-Za-z_]\w*)\b[^;{()]*[;{]")
_USING = re.compile(r"\busing\s+([A-Za-z_]\w*)\s*=[^;]+;")
_CONST = re.compile(r"(?:\b(?:inline|static)\s+constexpr|^[ ]{0,4}constexpr)\b[^;=(){}]*?"
                    r"\b([A-Za-z_]\w*)\s*(?:=[^;]+|\{[^;{}]*\});", re.M)
_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)(\([^)]*\))?[^\n]*", re.M)
_CALLISH = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_RETURN_TYPE = re.compile(r"(?:[\w>]\s+|[*&]\s*)$")  # a return type (or `explicit`) right before the name
_STD = re.compile(r"\bstd::(?:[\w<>, ]*::)?$")
_AFTER = re.compile(r"\s*(?:const\b\s*)?(?:&&|&)?\s*(?:noexcept\b(?:\([^)]*\))?\s*)?"
                    r"(?:override\b\s*)?(?:->\s*[^{;]+?)?\s*([{;:])")


@functools.lru_cache(maxsize=128)  # each of our files reads the headers it includes: mostly the same ones
def declarations(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """name -> [(line, declaration, "name" | "member" | "function")] of what the header ``text`` declares (by regex;
    read only: shared by the callers of the same text)."""
    raw = text
    text = strip(text)
    out: dict[str, list[tuple[int, str, str]]] = {}

    def add(name: str, pos: int, decl: str, what: str = "name") -> None:
        if name not in _KEYWORDS:
            out.setdefault(name, []).append((_line(text, pos), re.sub(r"\s+", " ", decl).strip(), what))

    for m in _DEFINE.finditer(raw):
        add(m.group(1), m.start(1), m.group(0))
    for m in _TYPE_DECL.finditer(text):
        add(m.group(1), m.start(1), m.group(0).rstrip("{;"))
    for m in _USING.finditer(text):
        add(m.group(1), m.start(1), m.group(0))
    for m in _CONST.finditer(text):
        add(m.group(1), m.start(1), m.group(0), "name" if re.match(r"k[A-Z]", m.group(1)) else "member")
    for m in _CALLISH.finditer(text):
        before = text[max(0, m.start() - 80): m.start()]
        if m.group(1) in _NOT_DECL or not _RETURN_TYPE.search(before) or re.search(
                r"\b(return|new|throw|case|else|do|co_return)\s*$", before):
            continue
        end = _close(text, m.end() - 1)
        after = _AFTER.match(text, end + 1) if end >= 0 else None
        if after is not None:
            add(m.group(1), m.start(), text[m.start(): after.start(1)], "function")
    return out


def _headers_of(text: str, path: str, files: set[str]) -> list[tuple[str, str]]:
    """(include as written, tree path) of each upstream header ``text`` includes."""
    out = []
    for m in _INCLUDE.finditer(text):
        name = m.group(1)
        upstream = name.startswith(UPSTREAM_PREFIX)
        local = f"{INCLUDE_ROOT}/{name}" if upstream else str(Path(path).parent / name)
        if upstream or local in files:
            out.append((name, local))
    return out


def derive(reader: Reader, ours: dict[str, set[int] | None],  # noqa: C901  one pass: includes, then names
           site_name: Callable[[str], str]) -> tuple[list[dict], list[dict]]:
    """Items and findings (as ``ops.contract.Item`` / ``Finding`` fields) for our C++ code."""
    items: list[dict] = []
    findings: list[dict] = []
    for path in sorted(ours):
        text = reader.text(path) if path.endswith(SOURCES) else None
        if text is None:
            continue
        lines = ours[path]
        mine = (lambda n: True) if lines is None else (lambda n: n in lines)
        clean = strip(text)
        site_file = site_name(path)
        closure: dict[str, str] = {}
        direct = {m.group(1): _line(text, m.start(1)) for m in _INCLUDE.finditer(text)}
        queue = _headers_of(text, path, reader.files)
        for name, header in queue:
            if header in closure:
                continue
            number = direct.get(name, 0)
            body = reader.text(header)
            if body is None:
                if number and mine(number):
                    findings.append({"level": "error", "message": f"{site_file}:{number}: #include <{name}>: no "
                                     f"{header} on this tree", "site": f"{site_file}:{number}", "target": name})
                continue
            closure[header] = body
            if number and mine(number):
                items.append({"kind": "header", "target": name, "site": f"{site_file}:{number}",
                              "where": f"{header}:1"})
            queue += [h for h in _headers_of(body, header, reader.files) if h[1] not in closure]
        upstream: dict[str, list[tuple[str, int, str]]] = {}
        named: set[str] = set()  # types, aliases, macros, k-constants: a use is any mention
        for header, body in closure.items():
            for name, decls in declarations(body).items():
                upstream.setdefault(name, []).extend((header, line, decl) for line, decl, _ in decls)
                named.update(name for _, _, what in decls if what == "name")
        own = set(declarations(text)) if lines is None else set()
        first: dict[str, int] = {}
        for number, line in enumerate(clean.splitlines(), 1):
            if not mine(number) or line.lstrip().startswith("#include"):
                continue
            for m in _IDENT.finditer(line):
                name = m.group(0)
                if _STD.search(line[: m.start()]) or line[: m.start()].endswith("#"):
                    continue
                called = re.match(r"\s*[(<]", line[m.end():]) is not None
                if name in upstream and name not in own and name not in _KEYWORDS and (name in named or called):
                    first.setdefault(name, number)
        for name, number in sorted(first.items()):
            decls = upstream[name]
            header, line, _ = decls[0]
            signature = " | ".join(sorted({d for _, _, d in decls}))
            items.append({"kind": "cxx", "target": name, "site": f"{site_file}:{number}", "where": f"{header}:{line}",
                          "signature": signature})
    return items, findings


def mirrored(git: Git, upstream: str, reader: Reader, ours: dict[str, set[int] | None],
             site_of: Callable[[str], str]) -> tuple[list[dict], list[dict]]:
    """The upstream files our code mirrors with nothing to check (``MIRRORED``, where our file is in the tree): lock
    items (kind ``file``: the file's blob id on ``upstream``, why as the signature); one gone there is an error."""
    rows = [row for row in MIRRORED if row[0] in ours]
    if not rows:
        return [], []
    listed = git.out("ls-tree", "-z", upstream, "--", *sorted({path for _, _, path, _ in rows})).split("\0")
    blobs = {entry.split("\t", 1)[1]: entry.split()[2] for entry in listed if "\t" in entry}
    items, findings = [], []
    for path, mark, theirs, why in rows:
        line = next((n for n, text in enumerate((reader.text(path) or "").splitlines(), 1) if mark in text), 1)
        site = f"{site_of(path)}:{line}"
        if theirs in blobs:
            items.append({"kind": "file", "target": theirs, "site": site, "where": theirs, "signature": why,
                          "blob": blobs[theirs]})
        else:
            findings.append({"level": "error", "message": f"{site}: {theirs} is gone from this tree: our code mirrors "
                             f"what it held ({why}), which nothing upstream states now", "site": site,
                             "where": theirs, "target": theirs})
    return items, findings


def nvcc() -> str | None:
    return shutil.which("nvcc")


_COMPILES, _FAILS = "nvcc signature probe compiles against the tree's headers (sm_90a)", "nvcc signature probe fails: "


def tvm_ffi_pin(series_root: Path, git: Git, head: str) -> str:
    """The requirement ``head`` pins tvm-ffi at: its ``python/pyproject.toml``'s, else the series' lock of its
    release (``patches/env/vX.lock``); unpinned where neither says."""
    from packaging.requirements import InvalidRequirement, Requirement

    from c128patch.fit.env import _VERSION
    from c128patch.series.manifest import tomllib

    def ours(line: str) -> bool:
        try:
            return Requirement(line).name.lower().replace("_", "-") == TVM_FFI
        except InvalidRequirement:
            return False

    text = (git.blob(head, "python/pyproject.toml") or b"").decode(errors="replace")
    try:  # upstream's file: input (TOMLDecodeError, an integer past Python's digit limit, another shape: helper 173)
        project = tomllib.loads(text).get("project") if text else None
    except (ValueError, RecursionError):
        project = None
    lines = project.get("dependencies") if isinstance(project, dict) else None
    lines = lines if isinstance(lines, list) else []
    if not lines and (found := _VERSION.search((git.blob(head, "python/sglang/_version.py") or b"").decode(
            errors="replace"))) and (lock := confine(series_root, f"patches/env/v{found[1]}.lock",  # upstream's
                                                     "the lock of upstream's __version__")).is_file():
        lines = [line.split(" --hash", 1)[0] for line in lock.read_text(errors="replace").splitlines()]
    pins = [line.split(";", 1)[0].strip() for line in lines if isinstance(line, str) and ours(line)]
    return pins[0] if pins else TVM_FFI


def _cached_verdict(path: Path, key: str) -> tuple[bool, str] | None:
    """Input: only an entry of this key whose line says its verdict counts, in a file no other user may change (one
    another user owned was taken: a forged "compiles" in place of the compile, helper 187)."""
    try:
        theirs = bool(_changeable(os.lstat(path)))
    except OSError:
        theirs = False
    entry = {} if theirs else read_json(path, dict) or {}
    ok, line = entry.get("ok"), entry.get("line")
    if entry.get("key") == key and isinstance(ok, bool) and isinstance(line, str) and (
            line == _COMPILES if ok else line.startswith(_FAILS)):
        return ok, line + " (cached)"
    return None


def probe(series_root: Path, git: Git, head: str, *, cached: bool = True) -> tuple[bool | None, str]:
    """Compile the series' signature probe against ``head``'s headers: (ok, one line); ``ok`` None: not checked (no
    nvcc, no tvm-ffi, no probe in the series). A verdict is cached by the headers' tree id, the probe and nvcc."""
    if not os.path.lexists(series_root / PROBE):
        return None, f"no {PROBE} in the series: C++ contract not compiled"
    # a series' file: never through a link (its target's words reached nvcc's error lines), nor a FIFO ("no probe")
    source = confine(series_root, PROBE, "the series' signature probe", regular=True)
    text = read_series_file(source).decode(errors="replace")  # (64 MiB at most: it was read whole)
    compiler = nvcc()
    if compiler is None:
        return None, "nvcc not found: C++ contract not checked (only the header text was compared)"
    compiler = os.path.abspath(compiler)  # a relative PATH entry names a folder of here, not of the box's
    headers = git.run("rev-parse", "--verify", "--quiet", f"{head}:{INCLUDE_ROOT}", check=False).stdout.strip()
    path = None
    if cached and headers:
        try:  # (bounded: a wrapper nvcc that never answers hung contract and watch)
            version = procs.run([compiler, "--version"], VERSION_TIMEOUT).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"nvcc --version did not answer ({exc}): C++ contract not checked"
        # (SEALED: a verdict from before the probe ran sealed, whose line may hold a file's text, is compiled again)
        key = hashlib.sha256("\0".join([headers, text, compiler, version, SEALED]).encode()
                             ).hexdigest()[:24]
        path = cache_dir() / "contract-probe" / f"{key}.json"
        if (verdict := _cached_verdict(path, key)) is not None:
            return verdict
    try:
        import tvm_ffi.libinfo as info  # apache-tvm-ffi, as sglang pins it
    except ImportError:
        return None, ("tvm-ffi not installed: C++ contract not compiled "
                      f"({shell_join([sys.executable, '-m', 'pip', 'install', tvm_ffi_pin(series_root, git, head)])})")
    with procs.scratch("c128contract-") as tmp:
        try:
            git.extract(head, INCLUDE_ROOT, Path(tmp))
        except GitError:
            return False, f"the tree has no {INCLUDE_ROOT}: C++ contract broken"
        includes = [f"{tmp}/{INCLUDE_ROOT}", info.find_include_path(), info.find_dlpack_include_path()]
        cmd = [compiler, "-c", str(source), "-o", f"{tmp}/probe.o", "-gencode=arch=compute_90a,code=sm_90a",
               "-DSGL_CUDA_ARCH=900", "-std=c++20", "--expt-relaxed-constexpr",
               *(f"-I{d}" for d in dict.fromkeys(includes))]
        try:  # in the sealed box: a header of the tree's may include a secret of the operator's (HOME, /proc, /etc)
            box = Sealed(sys.executable, ["-c", _EXEC, *cmd],
                         PROBE_TIMEOUT, offline=True, writable=(tmp,), readable=(str(source.parent), *includes[1:],
                                                           *_prefixes(compiler)))
        except C128Error as exc:  # the box did not start (nvcc in a place it hides): nothing ran, no verdict
            return None, f"nvcc signature probe not run ({exc.message}): C++ contract not checked"
        try:
            out, err = box.wait()
        except C128Error as exc:  # (not cached: a loaded machine may be slow)
            return False, _FAILS + (f"nvcc did not finish in {PROBE_TIMEOUT:g} s (a header it reads that never ends?)"
                                    if "did not finish" in exc.message else exc.message)
        if box.returncode == _NO_EXEC and err.startswith(_NO_EXEC_SAID):  # nvcc never started: no verdict
            return None, (f"nvcc signature probe not run ({compiler} cannot be run in the sealed box: "
                          f"{err[len(_NO_EXEC_SAID):].strip()[:200]}): C++ contract not checked")
        ok = box.returncode == 0
        line = _COMPILES if ok else _FAILS + _failure(out + err, tmp, source)
    if path is not None:
        write_json_atomic(path, {"key": path.stem, "ok": ok, "line": line})
    return ok, line


def _prefixes(compiler: str) -> set[str]:
    """The folders nvcc runs from (its ``bin``'s parent, of the path named and of the real one: /opt/cuda, say; its
    own folder too, where that parent holds a place the box hides: ``$HOME/nvcc``)."""
    return {d for p in (os.path.abspath(compiler), os.path.realpath(compiler))
            for d in (os.path.dirname(p), os.path.dirname(os.path.dirname(p)))}


# the box's first step: nvcc in place of itself, or (exit ``_NO_EXEC``) why it cannot start there: not nvcc's verdict
_NO_EXEC, _NO_EXEC_SAID = 126, "c128probe: cannot start nvcc:"
_EXEC = ("import os, sys\ntry:\n    os.execv(sys.argv[1], sys.argv[1:])\nexcept OSError as e:\n"
         f"    sys.stderr.write('{_NO_EXEC_SAID} %s\\n' % e)\n    sys.exit({_NO_EXEC})\n")


# an error line of nvcc's front end (``FILE(LINE): error: ...``) or of the host compiler (``FILE:LINE:COL: error:``)
_ERROR = re.compile(r"^(.+?)(?:\((\d+)\)|:(\d+):\d+):\s*(?:fatal |catastrophic )?error\b:?\s*(.*)$")


def _failure(text: str, tmp: str, source: Path) -> str:
    """What a failed probe says: the helpers whose signature changed (the probe's own messages), else where its first
    errors are, in the probe or the tree's headers, with their messages; an error in any other file (one a header
    includes: it may be a secret of the operator's) only as that, never its text."""
    named, sites = [], []
    own = os.path.realpath(tmp) + os.sep
    for m in filter(None, map(_ERROR.match, text.splitlines())):
        where, number, message = m[1], m[2] or m[3], m[4]
        real = os.path.realpath(where)
        name = PROBE if real == os.path.realpath(source) else real[len(own):] if real.startswith(own) else None
        if name is None:
            sites.append("an error in a file outside the tree's headers and the probe (one a header includes?)")
        elif changed := re.search(r'upstream signature changed: ([^"]*)"', message):
            named.append(changed[1])
        else:
            sites.append(f"{name}:{number}: {message}")
    return "; ".join(dict.fromkeys(named)) or " | ".join(list(dict.fromkeys(sites))[:3]) or "nvcc failed"
