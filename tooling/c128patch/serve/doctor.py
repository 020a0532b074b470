"""``doctor``: will the sglang this Python serves with do what the envs ask? Findings (ok/info/warn/error) in
``diagnose``'s order: python; sglang (installed, importable, the launch arguments through its own parser); the build
(label, provenance, SBOM, series, entries); RECORD; each series env var; the startup rules' refusals (serve.serving);
nvcc, apache-tvm-ffi and the GPU (errors when a series gate is on). A gate's ``requires``/``conflicts`` is an error
only where the build has no startup rules to say it. ``Report.ok`` (exit 0): no error."""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from c128patch.errors import C128Error
from c128patch.procs import dying_prefix
from c128patch.progress import NullReporter, Reporter
from c128patch.series.gates import Gate
from c128patch.series.manifest import Series
from c128patch.series.provenance import record_problem
from c128patch.serve import serving as bounds
from c128patch.serve.install import Dist, Interpreter, installer, probe
from c128patch.serve.serving import ONLINE_C128_DSPARK_RULES, Serving, contained, probe_install, probe_serving
from c128patch.smoke.device import nvidia_smi, probe_nvcc
from c128patch.smoke.trees import read_json
from c128patch.textsafe import count, shell_join, some
from c128patch.wheel.patch import LOCAL_TAG, WHEEL_PROVENANCE, record_version
from c128patch.wheel.sbom import SBOM_NAME, purl_pypi
from c128patch.wheel.tools import record_hashes

Level = Literal["ok", "info", "warn", "error"]
EVIDENCE_ARCHS = {"9.0": "H200"}  # where the series' GPU evidence was recorded (ci/gpu/results/)


@dataclass
class EnvReading:
    gate: Gate
    declared: bool  # this sglang's environ.py declares the variable
    raw: str | None  # as set in the environment (None: unset)
    value: Any = None  # what sglang will use (the default when unset or unparsable)
    default: Any = None
    problem: str = ""  # sglang's warning for a value it cannot parse

    @property
    def on(self) -> bool:
        """Set to something other than the default (a bool gate: true)."""
        return self.raw is not None and self.value != self.default and self.value not in (None, False, "")


@dataclass
class Finding:
    level: Level
    topic: str
    message: str


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    python: dict[str, Any] = field(default_factory=dict)
    sglang: dict[str, Any] | None = None
    build: dict[str, Any] | None = None
    env: list[dict[str, Any]] = field(default_factory=list)
    startup: dict[str, Any] | None = None
    serving: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    def add(self, level: Level, topic: str, message: str) -> None:
        self.findings.append(Finding(level, topic, message))

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


def diagnose(python: str, launch_args: Sequence[str], series: Series | None,
             rep: Reporter = NullReporter()) -> Report:
    """``rep`` is told each bounded wait on the install, with its bound (a looping `environ.py` was 60 s of silence)."""
    report = Report()
    interp = probe(python)
    report.python = {k: getattr(interp, k) for k in ("executable", "version", "tag", "platform")}
    report.add("ok", "python", f"{interp.executable}: Python {interp.version} ({interp.tag}, {interp.platform})")
    if contained()[1]:
        report.add("warn", "probes", f"the probes run without a pid namespace of their own here ({contained()[1]}): "
                                     "a process the install forks into a session of its own is ended when a probe "
                                     "ends, but outlives doctor if doctor is killed (SIGKILL)")
    if dying_prefix()[1]:  # (every verb's children: git, the sealed box, these probes)
        report.add("warn", "probes", f"the tool's children are not tied to it here ({dying_prefix()[1]}): one it "
                                     "starts (a probe, a git call, the sealed box) runs on to its own end if the tool "
                                     "is killed (SIGKILL)")
    sg = interp.dists.get("sglang")
    readings: list[EnvReading] = []
    if sg is None:
        pip = shell_join([interp.executable, "-m", "pip", "install"])
        report.add("error", "sglang", f"no sglang is installed for {interp.executable}: install the patched wheel "
                                      f"into the serving venv ({pip} sglang-<version>+c128...whl; docs/deploy.md in "
                                      "c128patch's repository)")
    else:
        package = sg.site / "sglang"
        report.sglang = {"version": sg.version, "path": str(package), "installer": installer(sg),
                         "import_path": str(interp.import_path) if interp.import_path else None}
        if interp.import_path is None:
            report.add("error", "sglang", f"sglang {sg.version} is installed but `import sglang` finds nothing")
        elif interp.import_path.resolve() != package.resolve():
            report.add("error", "sglang", f"`import sglang` resolves to {interp.import_path}, not the installed "
                                          f"sglang {sg.version} at {package} (a PYTHONPATH entry or the current "
                                          "folder shadows it)")
        else:
            report.add("ok", "sglang", f"sglang {sg.version} at {package} ({report.sglang['installer']})")
        rep.step(f"importing sglang in {interp.executable} (at most {bounds.TIMEOUT:g} s)")
        sv = _serving(report, interp, launch_args)
        record = _build(report, sg, series)
        _record(report, sg)
        gates = series.gates if series is not None else []
        rep.step(f"reading sglang's environ.py and startup rules in a child (at most {bounds.INSTALL_TIMEOUT:g} s)")
        got = probe_install(interp.executable, str(sg.site), [g.name for g in gates], launch_args)
        readings = _env(report, got.data, got.error, gates, record is not None)
        parsed = not launch_args or sv.args_checked
        _startup(report, got.data.get("startup"), got.error, launch_args, readings, record is not None, parsed)
    _toolchain(report, interp, any(r.on and r.gate.declared_by == "series" for r in readings))
    return report


def _serving(report: Report, interp: Interpreter, launch_args: Sequence[str]) -> Serving:
    """``import sglang`` in the serving Python, and the launch arguments through its own parser."""
    sv = probe_serving(interp.executable, launch_args)
    report.serving = asdict(sv)
    if sv.import_error:
        report.add("error", "import", f"`import sglang` fails in {interp.executable}: {sv.import_error}; the server "
                                      "cannot start there (install sglang with its dependencies, then the patched "
                                      "wheel over it: docs/deploy.md in c128patch's repository)")
    else:
        report.add("ok", "import", f"`import sglang` works in {interp.executable} ({sv.seconds:.1f} s)")
    given = f"`{shell_join(launch_args)}`" if launch_args else "no launch arguments"
    missing = f"; not given: {', '.join(sv.required_missing)} (needed at launch)" if sv.required_missing else ""
    if sv.args_checked:
        report.add("ok", "args", f"sglang's own server-arguments parser accepts {given}{missing}")
    elif sv.parser_built:
        report.add("error", "args", f"sglang's own server-arguments parser refuses {given}: {sv.args_error}")
    elif launch_args or not sv.import_error:
        report.add("error", "args", f"cannot check {given} with sglang's own server-arguments parser: {sv.args_error}")
    return sv


def _build(report: Report, sg: Dist, series: Series | None) -> dict | None:
    """The provenance record of a c128patch build (None: plain upstream)."""
    try:
        record = read_json(sg.site / WHEEL_PROVENANCE)
    except C128Error as exc:
        report.add("error", "build", exc.message)
        return None
    problem = record_problem(record) if record is not None else None
    if problem:
        report.add("error", "build", f"{sg.site / WHEEL_PROVENANCE}: not a c128patch provenance record ({problem})")
        return None
    try:
        version = Version(sg.version)
    except InvalidVersion:
        report.add("error", "build", f"sglang's version {sg.version!r} is not a PEP 440 version")
        return None
    labelled = LOCAL_TAG in (version.local or "").split(".")
    if record is None:
        if labelled:
            report.add("error", "build",
                       f"sglang {sg.version} carries a c128patch version label but no {WHEEL_PROVENANCE}")
        else:
            report.add("warn", "build", f"plain sglang {sg.version}: not a c128patch build (no {WHEEL_PROVENANCE}); "
                                        "the series' gates do nothing here")
        return None
    s, up = record.get("series", {}), record.get("upstream", {})
    layers = record.get("layers", []) if isinstance(record.get("layers"), list) else []
    report.build = {"series": s, "upstream": up, "layers": layers, "entries": record.get("entries", [])}
    problems = _identity_problems(sg, version, record)
    for problem in problems:
        report.add("error", "build", problem)
    if not problems:
        origin = up.get("wheel") or str(up.get("commit", ""))[:12] or up.get("rev", "?")
        report.add("ok", "build", f"c128patch build: series {s.get('name')} {s.get('version')} (digest "
                                  f"{str(s.get('digest', ''))[:8]}) on sglang {up.get('version')} ({origin}); the "
                                  "version label and the SBOM agree with the provenance")
    for layer in layers:
        report.add("info", "layer", f"layer {layer.get('name')} {layer.get('version')} (digest "
                                    f"{str(layer.get('digest', ''))[:8]}, base {layer.get('base')}): "
                                    f"{count(len(layer.get('entries', [])), 'entry')}, after the series")
    if series is not None:
        if s.get("digest") == series.ours.digest():
            report.add("ok", "series", f"the build carries this tool's series {series.name} {series.version}")
        else:
            report.add("warn", "series", f"the build carries series {s.get('name')} {s.get('version')} (digest "
                                         f"{str(s.get('digest', ''))[:8]}), this tool {series.name} {series.version} "
                                         f"({series.digest()[:8]}): the env reference below is this tool's")
    for e in record.get("entries", []):
        report.add("info", "entry", f"{e.get('name')} ({e.get('kind')}, {e.get('file') or e.get('source')}): "
                                    f"gate {e.get('gate') or 'none'}")
    return record


def _obj(doc: dict, key: str) -> dict:
    """``doc[key]`` when it is an object, else {} (a wrong-shaped SBOM is a mismatch, not a crash)."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _identity_problems(sg: Dist, version: Version, record: dict) -> list[str]:
    problems = []
    s, up = record.get("series", {}), record.get("upstream", {})
    try:
        want = record_version(record)
    except (C128Error, InvalidVersion):
        return [f"{WHEEL_PROVENANCE} names no valid upstream version and series ({up.get('version')!r}, "
                f"{s.get('version')!r})"]
    if version != want:
        problems.append(f"the installed version {version} is not {want}, the one its provenance gives")
    try:
        sbom = read_json(sg.dist_info / "sboms" / SBOM_NAME) if sg.dist_info else None
    except C128Error as exc:
        return [*problems, exc.message]
    if sbom is None:
        problems.append(f"no SBOM ({sg.dist_info.name if sg.dist_info else '.dist-info'}/sboms/{SBOM_NAME})")
        return problems
    comp = _obj(_obj(sbom, "metadata"), "component")
    if comp.get("version") != sg.version:
        problems.append(f"the SBOM describes sglang {comp.get('version')}, not the installed {sg.version}")
    ancestors = _obj(comp, "pedigree").get("ancestors", [])
    purls = [a.get("purl") for a in ancestors if isinstance(a, dict)] if isinstance(ancestors, list) else None
    if purls != [purl_pypi("sglang", str(up.get("version")))]:
        problems.append(f"the SBOM's ancestor is not sglang {up.get('version')}, the provenance's upstream")
    return problems


def _record(report: Report, sg: Dist) -> None:
    """Every installed file RECORD lists with a hash, hashed again."""
    text = sg.read("RECORD")
    if text is None:
        report.add("warn", "record", f"{sg.dist_info} has no RECORD: the installed files cannot be checked")
        return
    listed = record_hashes(text)
    if not listed:  # nothing to check: not "0 installed files match"
        report.add("warn", "record", f"{sg.dist_info}/RECORD lists no file with a hash: the installed files cannot be "
                                     "checked")
        return
    sizes = {row[0]: row[2] for row in csv.reader(io.StringIO(text, newline="")) if len(row) >= 3}
    why = {name: "outside the install: not read" if _outside(sg.site, name) else
           _unlike_record(sg.site / name, digest, sizes.get(name, "")) for name, digest in listed.items()}
    bad = [f"{name} ({what})" for name, what in why.items() if what and what != "missing"]
    bad += [f"{name} (missing)" for name, what in why.items() if what == "missing"]
    if not bad:
        report.add("ok", "record", f"{len(listed)} installed files match RECORD")
    else:
        report.add("error", "record", f"{len(bad)} of {len(listed)} installed files differ from RECORD: "
                                      f"{some(bad, 3)}; reinstall the wheel")


def _outside(site: Path, name: str) -> bool:
    """Does RECORD's ``name`` lie (links followed) outside the install: its site folder, or its environment's scripts
    folder (pip's ``../../../bin/sglang``)? A row naming ``../../etc/shadow`` or ``/etc/shadow`` was hashed and its
    match said: such a file is not read."""
    where = os.path.realpath(site / name)
    roots = [os.path.realpath(site), *([os.path.realpath(site.parents[2] / "bin")] if len(site.parents) > 2 else [])]
    return not any(where == root or where.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


MAX_RECORDED = 1 << 30  # bytes: a file RECORD names is hashed only up to this (sglang's largest is ~25 MB)


def _unlike_record(path: Path, digest: str, size: str) -> str:
    """How the file at ``path`` differs from its RECORD row ("": it matches), never reading more than RECORD's size
    of it nor ``MAX_RECORDED``, nor anything but a regular file (a row naming ``../../proc/kcore`` or a 10 GB sparse
    file was read whole into memory)."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return "missing" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    if size.isdigit() and int(size) != st.st_size:
        return "modified"
    if st.st_size > MAX_RECORDED:
        return f"over {MAX_RECORDED >> 30} GiB: not read"
    sha, left = hashlib.sha256(), st.st_size  # (0: not opened; /proc's files say 0 and some block: /proc/kmsg)
    try:
        with path.open("rb") if left else contextlib.nullcontext() as f:
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                sha.update(chunk)
                left -= len(chunk)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    got = "sha256=" + base64.urlsafe_b64encode(sha.digest()).rstrip(b"=").decode()
    return "" if got == digest else "modified"


def _env(report: Report, data: dict, error: str, gates: list[Gate], is_build: bool) -> list[EnvReading]:
    if not gates:
        report.add("warn", "env", "this tool carries no env reference ([[gates]]): the envs are not read")
        return []
    error = data.get("environ_error") or (f"the child process reading it: {error}" if error else "")
    if error:
        report.add("error", "env", f"cannot read sglang's environ.py: {error}")
        return []
    readings = [EnvReading(g, r["declared"], r["raw"], r["value"], r["default"], r["problem"])
                for g, r in zip(gates, data["gates"])]
    for r in readings:
        name = r.gate.name
        report.env.append({"name": name, "set": r.raw, "declared": r.declared, "value": repr(r.value),
                           "default": repr(r.default), "on": r.on})
        if r.raw is None:
            what = f"default {r.default}" if r.declared else "this sglang does not declare it"
            report.add("info", "env", f"{name} unset ({what})")
        elif not r.declared:
            why = "" if is_build else " (not a c128patch build)"
            report.add("error", "env", f"{name}={r.raw} is set, but this sglang does not declare it{why}: it does "
                                       "nothing here")
        elif r.problem:
            report.add("error", "env", f"{name}={r.raw}: {r.problem}")
        elif r.gate.choices and r.value not in r.gate.choices:
            report.add("error", "env", f"{name}={r.raw}: sglang takes only {', '.join(r.gate.choices)} and refuses "
                                       "anything else at launch")
        elif r.on:
            report.add("ok", "env", f"{name}={r.raw}: {r.gate.enables}")
        else:
            report.add("info", "env", f"{name}={r.raw} (off: the default {r.default})")
    return readings


def _env_refusal(st: dict, readings: list[EnvReading]) -> dict:
    """An env value the build's startup check cannot parse (``env_error``) is what it raises at launch, where its gate
    is on as sglang reads it; with the gate off the check does not run and refuses nothing."""
    if not st.get("env_error"):
        return st
    gate_on = any(r.on for r in readings if r.gate.name == st.get("gate"))
    return {**st, "refusals": [st["env_error"]] if gate_on else []}


def _startup(report: Report, st: dict | None, error: str, launch_args: Sequence[str], readings: list[EnvReading],
             is_build: bool, parsed: bool) -> None:
    """What the build's rules refuse; ``ok`` only for launch arguments sglang's own parser read (``parsed``)."""
    st = st or {"path": "", "available": True, "config": {}, "refusals": [],
                "error": f"the child process running the rules: {error}"}
    report.startup = st = _env_refusal(st, readings)
    level: Level = "info" if st["available"] else "error"  # the env reference's needs: the build's rules say them
    on = {r.gate.name for r in readings if r.on}
    raw = {r.gate.name: r.raw for r in readings}
    for r in (r for r in readings if r.on):
        for need in r.gate.requires:
            if need not in on:
                state = "not set" if raw.get(need) is None else f"off here ({need}={raw[need]})"
                report.add(level, "env", f"{r.gate.name} needs {need}, which is {state}: without it {r.gate.name} "
                                         "does nothing")
        for other in r.gate.conflicts:
            if other in on:
                report.add(level, "env", f"{r.gate.name} and {other} are both set: they do not go together")
    args = f" for `{shell_join(launch_args)}`" if launch_args else ""
    if not st["available"]:
        if is_build:
            report.add("warn", "startup", f"this build carries no startup rules ({ONLINE_C128_DSPARK_RULES}): what "
                                          f"startup would refuse{args} is not checked")
        return
    if st["error"]:
        report.add("error", "startup", f"cannot check the launch arguments: {st['error']}")
    for line in st["refusals"]:
        report.add("error", "startup", f"startup would refuse{args}: {line}")
    if not st["error"] and not st["refusals"] and not parsed:
        report.add("warn", "startup", f"the rules refuse nothing{args}, but sglang's own parser did not read these "
                                      "arguments (see args): not checked")
    elif not st["error"] and not st["refusals"]:
        hint = "" if launch_args else " (no launch arguments given: c128patch doctor -- <launch args>)"
        report.add("ok", "startup", f"startup would refuse nothing{args}{hint}")


def _toolchain(report: Report, interp: Interpreter, series_gate_on: bool) -> None:
    level: Level = "error" if series_gate_on else "warn"
    found = probe_nvcc()
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if found:
        report.add("ok", "jit", f"nvcc {found.get('nvcc_version')} at {found['nvcc']}"
                                + (f" (CUDA_HOME={home})" if home else ""))
    else:
        report.add(level, "jit", f"nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin; CUDA_HOME="
                                 f"{home or 'unset'}): sglang builds its JIT kernels, and the series', with it at "
                                 "startup")
    problem = tvm_ffi_problem(interp) if interp.dists.get("sglang") else None
    if problem:
        report.add(level, "jit", problem)
    elif interp.dists.get("apache-tvm-ffi"):
        report.add("ok", "jit", f"apache-tvm-ffi {interp.dists['apache-tvm-ffi'].version}")
    devices, why = nvidia_smi("name,compute_cap")
    if not devices:
        needs = ": the series' gates set run its kernels on the GPU" if series_gate_on else ""
        report.add(level, "gpu", f"no NVIDIA GPU here ({why}){needs}")
    known = ", ".join(f"{n} (sm_{c.replace('.', '')})" for c, n in EVIDENCE_ARCHS.items())
    for name, capability in dict.fromkeys(devices):
        where = EVIDENCE_ARCHS.get(capability)
        report.add("ok" if where else "warn", "gpu", f"{name} (sm_{capability.replace('.', '')}): the series' GPU "
                   f"evidence was recorded on {f'{where} (ci/gpu/results/)' if where else f'{known} only'}")


def tvm_ffi_problem(interp: Interpreter) -> str | None:
    """None when apache-tvm-ffi is installed as sglang requires it; else what is wrong."""
    have = interp.dists.get("apache-tvm-ffi")
    wanted = []
    for text in interp.dists["sglang"].requires:  # doctor asks only where sglang is installed
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name == "apache-tvm-ffi" and (req.marker is None or req.marker.evaluate()):
            wanted.append(req)
    if have is None:
        pin = f" ({wanted[0]})" if wanted else ""
        return f"apache-tvm-ffi is not installed in {interp.executable}{pin}: sglang's JIT kernels load through it"
    for req in wanted:
        if not req.specifier.contains(have.version, prereleases=True):
            return f"apache-tvm-ffi {have.version} is installed, sglang requires {req}"
    return None
