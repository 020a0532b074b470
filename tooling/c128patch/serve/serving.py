"""What the serving install does, asked in time-bounded child processes of the serving Python: ``import sglang``
and the launch arguments through its own parser (``probe_serving``); the series' env vars through the installed
``environ.py`` and the build's startup rules (``probe_install``). The installed code runs only there: a child that
exits without its answer, dies or outlives its limit is an error (``Answer.error``); its process group is ended."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from c128patch.errors import C128Error
from c128patch.procs import CREDENTIAL, Group, contained_prefix

# What the probe imports (a test points them at a stand-in where a real install cannot import).
MODULES = {"package": "sglang", "server_args": "sglang.srt.server_args",
           "config": "sglang.srt.utils.server_args_config_parser"}
TIMEOUT = 300.0  # seconds: importing sglang (torch, CUDA) on a cold disk
INSTALL_TIMEOUT = 60.0  # seconds: environ.py and the rules are stdlib-only
OUTPUT = 16 << 20  # bytes of a probe's stdout and of its stderr read back (as the sealed box's)
# the environment a probe keeps: what finds and configures the install (its gates, sglang's, CUDA's, torch's, the
# paths); the rest (HF_TOKEN, AWS_*, SSH_AUTH_SOCK, *_PASSWORD, ...) is dropped: it answers without them
# (names whole: a prefix "HOME" kept HOMEBREW_GITHUB_API_TOKEN, "LANG" LANGCHAIN_API_KEY; of a family, none naming a
# credential: SGLANG_PRECISION_HF_TOKEN, NVIDIA_API_KEY)
KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME",
        "VIRTUAL_ENV", "CONDA_PREFIX", "HF_HOME", "HF_HUB_OFFLINE")
FAMILIES = ("LC_", "XDG_", "SGLANG_", "SGL_", "CUDA_", "NCCL_", "NVIDIA_", "NVCC_", "TORCH", "PYTORCH_", "TRITON_",
            "FLASHINFER_", "OMP_", "MKL_")
ENVIRON = "sglang/srt/environ.py"
ONLINE_C128_DSPARK_RULES = "sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py"
_MARK = "C128PATCH-ANSWER"  # then this run's secret (read from stdin before any installed code loads), the answer

# (first: ``python -c`` puts the current folder first on sys.path; the probe's own imports, json's say, would run a
# json.py there, an upstream tree's top level when doctor runs in it, helper 139)
_COMMON = r'''
import sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import importlib, importlib.util, json, os, warnings
payload = json.loads(sys.argv[1])
def answerer(mark, real_stdout):
    return lambda out: real_stdout.write("%s %s\n" % (mark, json.dumps(out, default=repr)))
answer, sys.stdout = answerer(sys.stdin.readline().strip(), sys.stdout), sys.stderr  # the code's prints: not it
def why(e):
    return "%s: %s" % (type(e).__name__, e)
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
'''

_SERVING = _COMMON + r'''
import argparse
modules, argv = payload
out = {"import_error": "", "args_error": "", "args_checked": False, "parser_built": False, "required_missing": []}
try:
    importlib.import_module(modules["package"])
except BaseException as e:
    out["import_error"] = why(e)
if out["import_error"]:
    out["args_error"] = "it needs `import %s`, which fails" % modules["package"]
else:
    try:
        mod = importlib.import_module(modules["server_args"])
        parser = argparse.ArgumentParser(prog="sglang serve")
        mod.ServerArgs.add_cli_args(parser)
    except BaseException as e:
        out["args_error"] = "%s does not import or build its parser (%s)" % (modules["server_args"], why(e))
    else:
        out["parser_built"] = True
        def refuse(message):
            raise ValueError(message)
        parser.error = refuse
        for action in (a for a in parser._actions if a.required):
            if not any(t == o or t.startswith(o + "=") for o in action.option_strings for t in argv):
                out["required_missing"].append(action.option_strings[0])
            action.required = False
        try:
            if "--config" in argv:
                merger = importlib.import_module(modules["config"]).ConfigArgumentMerger(parser)
                argv = merger.merge_config_with_args(argv)
            parser.parse_args(argv)
            out["args_checked"] = True
        except SystemExit as e:
            out["args_error"] = "the parser exited (%s)" % e.code
        except BaseException as e:
            out["args_error"] = str(e) if isinstance(e, ValueError) else why(e)
answer(out)
'''

_INSTALL = _COMMON + r'''
environ_path, gates, rules_path, argv = payload
out = {"environ_error": "", "gates": [], "startup": {"path": rules_path, "available": os.path.isfile(rules_path),
       "config": {}, "refusals": [], "error": ""}}
saved = dict(os.environ)
os.environ.pop("SGLANG_CUDA_COREDUMP", None)  # it would import sglang's debug utilities
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = load(environ_path, "c128patch_doctor_sglang_environ")
    os.environ.clear()
    os.environ.update(saved)
    envs, field_type = getattr(module, "envs", None), getattr(module, "EnvField", None)
    for name in gates:
        f = getattr(envs, name, None) if envs is not None else None
        r = {"name": name, "declared": field_type is not None and isinstance(f, field_type),
             "raw": os.environ.get(name), "value": None, "default": None, "problem": ""}
        if r["declared"]:
            r["default"] = "(computed at run time)" if callable(f.default) else f.default
            if not callable(f.default):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    r["value"] = f.get()
                r["problem"] = str(caught[0].message) if caught else ""
        out["gates"].append(r)
except BaseException as e:
    out["environ_error"] = "%s does not load here: %s" % (environ_path, why(e))
os.environ.clear()
os.environ.update(saved)
st = out["startup"]
if st["available"]:
    try:
        rules = load(rules_path, "c128patch_doctor_online_c128_dspark_rules")
    except BaseException as e:
        st["error"] = "%s does not load here: %s" % (rules_path, why(e))
    else:
        # the build's startup check reads the envs itself, strictly, where its gate is on (as sglang reads it):
        # a value it cannot parse is what that check raises at launch, not arguments doctor could not check
        st["gate"] = getattr(rules, "GATE_ENV", "")
        try:
            getattr(rules, "env_config", lambda environ: None)(dict(os.environ))
        except ValueError as e:
            st["env_error"] = str(e)
        try:
            if not st.get("env_error"):
                st["config"] = dict(rules.config_from_args(list(argv), dict(os.environ)))
                st["refusals"] = [str(line) for line in rules.startup_refusals(st["config"])]
        except BaseException as e:
            st["error"] = why(e)
answer(out)
'''


@dataclass
class Answer:
    data: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # no answer: why (a silent exit, a crash, the time limit)
    seconds: float = 0.0


def ask(python: str, script: str, payload: Any, timeout: float,
        problem: Callable[[dict], str | None] = lambda data: None) -> Answer:
    """Run ``script`` in ``python`` (its own process group, ended on return) and read its one answer line: the
    only line naming ``_MARK``, with this run's secret (the installed code, which shares its stdout, may print one),
    holding an object ``problem`` finds nothing wrong with (the installed code runs in that process and can reach the
    script's ``answer``: what it writes there is checked, not trusted, helper 173)."""
    started, mark = time.monotonic(), f"{_MARK}-{secrets.token_hex(16)} "
    try:
        proc = _run(python, [script, json.dumps(payload)], timeout, mark + "\n")
    except OSError as exc:
        return Answer(error=f"cannot run {python}: {exc.strerror or exc}")  # (the path once, not again in exc)
    except subprocess.TimeoutExpired:
        return Answer(error=f"it did not finish in {timeout:g} s", seconds=round(time.monotonic() - started, 1))
    seconds = round(time.monotonic() - started, 1)
    if proc is None:
        return Answer(error=f"it wrote more than {OUTPUT >> 20} MiB to its stdout or stderr: none of it is taken",
                      seconds=seconds)
    found = [line for line in proc.stdout.splitlines() if _MARK in line]
    if len(found) > 1 or found and not found[0].startswith(mark):
        return Answer(error=f"its output holds an answer line it did not write ({len(found)} for one): code it loaded "
                            "forged one", seconds=seconds)
    if found:
        try:
            data = json.loads(found[0][len(mark):])
        except (ValueError, RecursionError):
            data = None
        wrong = problem(data) if isinstance(data, dict) else "not a JSON object"
        if wrong:
            return Answer(error=f"its answer line is not the probe's ({wrong}): code it loaded wrote it",
                          seconds=seconds)
        return Answer(data, seconds=seconds)
    if proc.returncode == 0:
        return Answer(error="it exited (status 0) without an answer: code it loaded ended the process",
                      seconds=seconds)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return Answer(error=f"the interpreter died ({tail[0]})", seconds=seconds)


def output(python: str, script: str, timeout: float) -> tuple[str, str]:
    """``python -c script`` run as a probe is (``_run``): (its stdout, "") where it exits 0, else ("", why)."""
    try:
        proc = _run(python, [script], timeout, "")
    except OSError as exc:
        raise C128Error(f"cannot run {python}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        return "", f"it did not finish in {timeout:g} s"
    if proc is None:
        return "", f"it wrote more than {OUTPUT >> 20} MiB to its stdout or stderr"
    if proc.returncode == 0:
        return proc.stdout, ""
    return "", ((proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"])[0]


def _run(python: str, args: list[str], timeout: float, line: str) -> subprocess.CompletedProcess | None:
    """``python -c ARGS`` given ``line`` on stdin, with the environment's ``KEEP`` only, read until it exits (not
    until its pipes close: a child it forked into a session of its own may hold them, helper 134) within ``timeout``
    s, its group ended; None past ``OUTPUT`` bytes of its stdout or stderr (3 GB printed held 9 GB of the tool's
    memory)."""
    deadline, got = time.monotonic() + timeout, {1: bytearray(), 2: bytearray()}
    env = {k: v for k, v in os.environ.items() if k in KEEP or k.startswith(FAMILIES) and not CREDENTIAL.search(k)}
    prefix = contained()[0]
    if prefix:  # what Popen says of a program it cannot run (``unshare`` would run, then fail to)
        path = python if "/" in python else shutil.which(python) or python
        if not stat.S_ISREG(os.stat(path).st_mode) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    with _reaping(), Group([*prefix, python, "-c", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env) as proc:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(line.encode())
            proc.stdin.close()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, got[1])
            sel.register(proc.stderr, selectors.EVENT_READ, got[2])
            while sel.get_map():
                exited = proc.poll() is not None
                ready = sel.select(0 if exited else min(0.5, max(0.0, deadline - time.monotonic())))
                for key, _ in ready:
                    chunk = os.read(key.fd, 1 << 16)
                    key.data.extend(chunk)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    if len(key.data) > OUTPUT:
                        return None
                if exited and not ready:
                    break  # what it wrote before it exited is read; a survivor holding the pipe is not waited for
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(python, timeout)
        code = proc.wait(max(0.0, deadline - time.monotonic()))
    text = [bytes(got[n]).decode(errors="replace") for n in (1, 2)]
    return subprocess.CompletedProcess([python], code, *text)


contained = contained_prefix  # (doctor's probes: the one probe of the host, procs')


@contextlib.contextmanager
def _reaping() -> Iterator[None]:
    """While a probe runs, this process is the subreaper of what it forks (Linux): a child that left its session
    (``setsid``, a daemon's double fork) comes back to us when its parent dies, and is killed with the probe, not
    left running after doctor (helper 134); children we had before are left alone."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        yield
        return
    before, subreaper = _children(), prctl(36, 1) == 0  # PR_SET_CHILD_SUBREAPER
    try:
        yield
    finally:
        for _ in range(100) if subreaper else ():  # a killed one's own children come back to us in turn
            left = _children() - before
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        if subreaper:
            prctl(36, 0)


def _children() -> set[int]:
    """The processes whose parent is this one."""
    me, found = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        with contextlib.suppress(OSError, IndexError):
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[1].decode() == me:
                    found.add(int(pid))
    return found


@dataclass
class Serving:
    import_error: str = ""  # `import sglang` failed (or did not finish): the server cannot start
    args_error: str = ""  # the launch arguments were refused, or could not be checked
    args_checked: bool = False
    parser_built: bool = False  # sglang's parser was built: an args_error is its refusal
    required_missing: list[str] = field(default_factory=list)
    seconds: float = 0.0


def probe_serving(python: str, launch_args: Sequence[str]) -> Serving:
    """``import sglang`` in ``python``, and ``launch_args`` through its parser."""
    got = ask(python, _SERVING, [MODULES, list(launch_args)], TIMEOUT, _serving_problem)
    if got.error:
        not_checked = " (the import did not finish)" if got.error.startswith("it did not finish") else ""
        return Serving(import_error=got.error, args_error=f"not checked{not_checked}", seconds=got.seconds)
    return Serving(**got.data, seconds=got.seconds)


def probe_install(python: str, site: str, gates: list[str], launch_args: Sequence[str]) -> Answer:
    """The gates as the installed ``environ.py`` reads them, and what the installed rules refuse."""
    payload = [os.path.join(site, ENVIRON), gates, os.path.join(site, ONLINE_C128_DSPARK_RULES), list(launch_args)]
    return ask(python, _INSTALL, payload, INSTALL_TIMEOUT, lambda data: _install_problem(data, len(gates)))


def _typed(data: dict, types: dict[str, type | tuple[type, ...]]) -> str | None:
    """The first key of ``types`` that ``data`` lacks or holds with another type (None: all are there)."""
    for key, kind in types.items():
        if key not in data or not isinstance(data[key], kind) or kind is int and isinstance(data[key], bool):
            return f"{key}: {type(data.get(key)).__name__}"
    return None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _serving_problem(data: dict) -> str | None:
    """What makes ``data`` not ``_SERVING``'s answer (None: it is)."""
    if set(data) != {"import_error", "args_error", "args_checked", "parser_built", "required_missing"}:
        return "other keys"
    return _typed(data, {"import_error": str, "args_error": str, "args_checked": bool, "parser_built": bool}) or (
        None if _strings(data["required_missing"]) else "required_missing: not a list of strings")


def _install_problem(data: dict, gates: int) -> str | None:
    """What makes ``data`` not ``_INSTALL``'s answer for ``gates`` gates (None: it is)."""
    wrong = _typed(data, {"environ_error": str, "gates": list, "startup": dict})
    if wrong:
        return wrong
    if not data["environ_error"] and len(data["gates"]) != gates:
        return f"{len(data['gates'])} gates for {gates}"
    for gate in data["gates"]:
        wrong = "a gate: not an object" if not isinstance(gate, dict) else _typed(
            gate, {"declared": bool, "raw": (str, type(None)), "problem": str})
        if wrong or "value" not in gate or "default" not in gate:
            return wrong or "a gate without value and default"
    st = data["startup"]
    wrong = _typed(st, {"path": str, "available": bool, "config": dict, "error": str})
    if wrong or not _strings(st.get("refusals")):
        return f"startup {wrong or 'refusals: not a list of strings'}"
    return _typed(st, {k: str for k in ("gate", "env_error") if k in st})
