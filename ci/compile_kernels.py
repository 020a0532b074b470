"""Compile every CUDA header of the patch series the way sglang's JIT loader would, without a GPU.

    python ci/compile_kernels.py TREE [--arch sm_90a] [--json] [-j N] [--only NAME]
    python ci/compile_kernels.py --all-releases | --release vX.Y.Z ... [--record ci/gpu/results] [--json] [-j N]

TREE holds a *patched* ``sglang/`` (a checkout's ``python/`` or an unpacked wheel root, with our
``csrc/`` files installed). For each row of :data:`KERNELS` this writes the translation unit that
``kernels/jit/utils/compile/spec.py`` generates (the tvm-ffi includes, ``#include`` the ``.cuh``,
``TVM_FFI_DLL_EXPORT_TYPED_FUNC(export, (symbol))`` inside ``namespace sglang``), compiles it with
sglang's flags and links the module, all rows in parallel. The :data:`PROBE` row compiles
``ci/kernel_probe/upstream_signatures.cu`` against the tree's headers: it pins the signature of
every upstream helper our kernels use, and a failure names the helper. Exit 1 names every kernel
that failed, and every series ``.cuh`` (touched by ``patches/*.patch`` or shipped in ``csrc/``)
that has no row.

With ``--release``/``--all-releases`` each supported release is replayed with the series from the
release history (evidence.staging, nothing checked out) and every (release, row) pair is built in
one pool, once per distinct unit: a unit whose preprocessing (nvcc's own host and device ``-E``
steps) and flags equal an earlier release's is not compiled again, its row says ``same_as`` that
release and carries that build's result (``--build-every-unit`` compiles each); ``--record DIR``
writes ``DIR/<rev>/compile.json`` (the evidence `c128patch matrix` reads).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CSRC_UNDER = "sglang/kernels/jit/csrc"

_ONLINE = "FlashCompress128OnlineKernel<{args}>"
ONLINE_WRAPPERS = (
    ("decode", f"{_ONLINE}::run_decode"),
    ("prefill", f"{_ONLINE}::run_prefill"),
    ("plan_decode", "plan_compress_128_online_decode"),
    ("plan_prefill", "plan_compress_128_online_prefill"),
)
PLAN_WRAPPERS = (
    ("plan_prefill", "plan_compress_prefill"),
    ("plan_decode", "plan_compress_decode"),
    ("plan_prefill_legacy", "plan_compress_prefill_legacy"),
    ("plan_decode_legacy", "plan_compress_decode_legacy"),
)

_DSPARK = "DsparkC128Kernel<{args}>"
DSPARK_WRAPPERS = (
    ("plan", f"{_DSPARK}::run_plan"),
    ("verify_compress", f"{_DSPARK}::run_verify"),
    ("write_prefix", f"{_DSPARK}::run_write_prefix"),
    ("commit", f"{_DSPARK}::run_commit"),
)


@dataclass(frozen=True)
class Kernel:
    """One module as compress.py (or our ops module) asks ``load_jit`` for it. ``{args}`` in a
    symbol is replaced by the template args joined with ", " (as ``make_cpp_args`` renders them).
    A row with ``source`` compiles that file itself (compile only, no module)."""

    name: str
    cuh: str  # relative to kernels/jit/csrc
    wrappers: tuple[tuple[str, str], ...]
    args: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ("-use_fast_math",)
    source: Path | None = None


# One row per (header, instantiation). head_dim 512, fp32/bf16 state buffers, PDL on, as
# compress.py instantiates them on sm_90. Extend with one line per new kernel.
KERNELS: tuple[Kernel, ...] = (
    Kernel("compress_128_online_v2_fp32", "deepseek_v4/c128_online_v2.cuh", ONLINE_WRAPPERS, ("512", "fp32_t", "true")),
    Kernel("compress_128_online_v2_bf16", "deepseek_v4/c128_online_v2.cuh", ONLINE_WRAPPERS, ("512", "bf16_t", "true")),
    Kernel("compress_plan", "deepseek_v4/c_plan.cuh", PLAN_WRAPPERS, (), ()),
    Kernel("online_c128_dspark_fp32", "deepseek_v4/online_c128_dspark.cuh", DSPARK_WRAPPERS, ("512", "fp32_t", "true")),
    Kernel("online_c128_dspark_bf16", "deepseek_v4/online_c128_dspark.cuh", DSPARK_WRAPPERS, ("512", "bf16_t", "true")),
)

PROBE_SOURCE = REPO / "ci" / "kernel_probe" / "upstream_signatures.cu"
PROBE = Kernel("upstream_signatures", "(signature probe)", (), source=PROBE_SOURCE)
ROWS: tuple[Kernel, ...] = (*KERNELS, PROBE)

_FFI_INCLUDES = (
    "#include <tvm/ffi/container/tensor.h>",
    "#include <tvm/ffi/dtype.h>",
    "#include <tvm/ffi/error.h>",
    "#include <tvm/ffi/extra/c_env_api.h>",
    "#include <tvm/ffi/function.h>",
)


def wrapper_source(cuh_path: Path, kernel: Kernel) -> str:
    """The .cu sglang's loader generates (spec.py ``_wrapper_source``)."""
    args = ", ".join(kernel.args)
    lines = [*_FFI_INCLUDES, f'#include "{cuh_path}"', "namespace sglang {"]
    lines += [
        f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({symbol.format(args=args)}));"
        for export, symbol in kernel.wrappers
    ]
    lines.append("}  // namespace sglang")
    return "\n".join(lines) + "\n"


@dataclass
class Toolchain:
    nvcc: str
    cuda_home: str | None
    includes: list[str]
    tvm_lib_dir: str
    tvm_lib: str
    arch: str  # e.g. "90a"

    def compile_cmd(self, cu: Path, obj: Path, kernel: Kernel) -> list[str]:
        sm = re.match(r"\d+", self.arch).group(0)
        return [
            self.nvcc, "-c", str(cu), "-o", str(obj),
            f"-gencode=arch=compute_{self.arch},code=sm_{self.arch}",
            f"-DSGL_CUDA_ARCH={int(sm) * 10}",
            "-std=c++20", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
            *kernel.cflags, *(f"-I{d}" for d in self.includes),
        ]  # fmt: skip

    def link_cmd(self, obj: Path, so: Path) -> list[str]:
        cmd = [self.nvcc, "-shared", str(obj), "-o", str(so), f"-L{self.tvm_lib_dir}", f"-l{self.tvm_lib}"]
        if self.cuda_home:
            cmd += [f"-L{self.cuda_home}/lib64", "-lcudart"]
        return cmd


def find_toolchain(tree: Path, arch: str) -> Toolchain:
    import tvm_ffi.libinfo as info  # apache-tvm-ffi, as sglang pins it

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = str(Path(home) / "bin" / "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not Path(nvcc).exists():
        raise SystemExit("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    if not home:  # nvcc may be a wrapper script: look for the toolkit that has libcudart
        for cand in (Path(nvcc).resolve().parent.parent, Path("/usr/local/cuda")):
            if any((cand / "lib64").glob("libcudart.so*")):
                home = str(cand)
                break
    lib = Path(info.find_libtvm_ffi())
    includes = [str(tree / "sglang/kernels/jit/include")]
    includes += list(dict.fromkeys([info.find_include_path(), info.find_dlpack_include_path()]))
    return Toolchain(nvcc, home, includes, str(lib.parent), lib.stem.removeprefix("lib"), arch)


@dataclass
class Result:
    name: str
    cuh: str
    ok: bool
    seconds: float
    log: str = field(default="", repr=False)
    failed_helpers: list[str] = field(default_factory=list)  # the probe row: which pins broke
    same_as: str = ""  # not built: the same preprocessed source and flags as this release's build


_CHANGED = re.compile(r'upstream signature changed: (.*?)"')
_PIN_LINE = re.compile(r'^C128_(?:PIN|FACT)\(\w+,\s*"(.*?)"', re.M)


def probe_failures(log: str, source: Path = PROBE_SOURCE) -> list[str]:
    """The helpers a failed probe build names: static_assert / #error messages, and for any
    other error in the probe file the C128_PIN / C128_FACT it falls in."""
    found = [m.group(1) for m in _CHANGED.finditer(log) if m.group(1)]  # not the echoed source line
    text = source.read_text()
    starts = [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _PIN_LINE.finditer(text)]
    for m in re.finditer(re.escape(source.name) + r"\((\d+)\): error", log):
        line = int(m.group(1))
        owner = [helper for start, helper in starts if start <= line]
        if owner and owner[-1] not in found:
            found.append(owner[-1])
    return list(dict.fromkeys(found))


def unit_source(tree: Path, kernel: Kernel, d: Path) -> Path | Result:
    """The .cu nvcc compiles for this row (written under ``d``), or the failed Result when its .cuh is missing."""
    d.mkdir(parents=True, exist_ok=True)
    if kernel.source is not None:  # the probe: compiled as it is, against this tree's headers
        return kernel.source
    cuh = (tree / CSRC_UNDER / kernel.cuh).resolve()
    if not cuh.is_file():
        return Result(kernel.name, kernel.cuh, False, 0.0, f"missing {cuh}")
    cu = d / "cuda.cu"
    cu.write_text(wrapper_source(cuh, kernel))
    return cu


def build_unit(tc: Toolchain, kernel: Kernel, cu: Path, d: Path) -> Result:
    """Compile (and, but for the probe, link) one unit written by ``unit_source``."""
    start = time.monotonic()
    if kernel.source is not None:  # the probe: compile only
        cmd = tc.compile_cmd(cu, d / "probe.o", kernel)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        ok = proc.returncode == 0
        return Result(kernel.name, kernel.cuh, ok, time.monotonic() - start, log, [] if ok else probe_failures(log))
    log = ""
    for cmd in (tc.compile_cmd(cu, d / "cuda.o", kernel), tc.link_cmd(d / "cuda.o", d / f"{kernel.name}.so")):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log += f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        if proc.returncode != 0:
            return Result(kernel.name, kernel.cuh, False, time.monotonic() - start, log)
    return Result(kernel.name, kernel.cuh, True, time.monotonic() - start, log)


def build_one(tc: Toolchain, tree: Path, kernel: Kernel, work: Path) -> Result:
    cu = unit_source(tree, kernel, work / kernel.name)
    return cu if isinstance(cu, Result) else build_unit(tc, kernel, cu, work / kernel.name)


_LINE_MARKER = re.compile(r'^# \d+ ".*$\n?', re.M)
_NVCC_TEMP = re.compile(r"tmpxft_[0-9a-f]+_[0-9a-f]+")


def source_key(tc: Toolchain, tree: Path, kernel: Kernel, cu: Path, d: Path) -> str | None:
    try:
        return _source_key(tc, tree, kernel, cu, d)
    except (ValueError, OSError):  # a step line shlex cannot read, a step that cannot run: built
        return None


def _source_key(tc: Toolchain, tree: Path, kernel: Kernel, cu: Path, d: Path) -> str | None:
    """What nvcc would compile for this unit, as a hash: the output of the preprocessing steps of
    ``nvcc --dryrun`` (host and device, run as nvcc runs them) and every step's command line, with the
    tree's and the unit's folders and nvcc's temp names as placeholders (line markers dropped). Two
    units with one key are the same text built with the same flags: one build answers for both.
    None when it cannot be told (that unit is built)."""
    cmds = [tc.compile_cmd(cu, d / "cuda.o", kernel), tc.link_cmd(d / "cuda.o", d / f"{kernel.name}.so")]
    places = sorted({str(tree), str(tree.resolve()), str(d), str(d.resolve())}, key=len, reverse=True)

    def placeholders(text: str) -> str:
        for i, place in enumerate(places):
            text = text.replace(place, f"<folder{i}>")
        return _NVCC_TEMP.sub("tmpxft", text)

    proc = subprocess.run([cmds[0][0], "--dryrun", *cmds[0][1:]], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    env, parts, preprocessed = dict(os.environ), [kernel.name, *(placeholders(shlex.join(c)) for c in cmds)], 0
    for n, line in enumerate(line[3:].strip() for line in proc.stderr.splitlines() if line.startswith("#$ ")):
        parts.append(placeholders(line))
        assign = re.match(r"([A-Za-z_]\w*)=(.*)$", line)
        if assign:  # the environment nvcc runs its steps in
            env[assign.group(1)] = " ".join(shlex.split(assign.group(2)))
            continue
        argv = shlex.split(line)
        if "-E" not in argv:
            continue
        if "$" in line or "-o" not in argv:  # not a step we can run as nvcc would
            return None
        argv[argv.index("-o") + 1] = str(d / f"preprocessed-{n}.ii")
        step = subprocess.run(argv, capture_output=True, text=True, env=env)
        if step.returncode != 0:
            return None
        parts.append(placeholders(_LINE_MARKER.sub("", (d / f"preprocessed-{n}.ii").read_text(errors="replace"))))
        preprocessed += 1
    if not preprocessed:  # nvcc named no preprocessing step: nothing to compare
        return None
    # the host compile of cudafe++'s output includes crt/host_runtime.h anew: a tree header of that name would win
    parts += [f"{p.relative_to(tree)}:{hashlib.sha256(p.read_bytes()).hexdigest()}" for inc in tc.includes
              if Path(inc).resolve().is_relative_to(tree.resolve()) for p in sorted((Path(inc) / "crt").rglob("*"))
              if p.is_file()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


Unit = tuple[Toolchain, Path, Kernel, Path, str]  # toolchain, tree, row, build folder, its label (the rev)


def build_all(units: list[Unit], jobs: int, dedupe: bool) -> tuple[list[Result], int]:
    """Each unit's Result and the number of builds run, ``jobs`` at a time. With ``dedupe`` a unit whose
    source_key equals an earlier unit's is not built: that build's result stands for it (``same_as``)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        cus = list(pool.map(lambda u: unit_source(u[1], u[2], u[3]), units))

        def key(i: int) -> str | None:
            tc, tree, kernel, d, _ = units[i]
            return None if not dedupe or isinstance(cus[i], Result) else source_key(tc, tree, kernel, cus[i], d)

        first: dict[str, int] = {}
        owner = [first.setdefault(k, i) if k else i for i, k in enumerate(pool.map(key, range(len(units))))]
        todo = [i for i in range(len(units)) if owner[i] == i and not isinstance(cus[i], Result)]
        built = dict(zip(todo, pool.map(lambda i: build_unit(units[i][0], units[i][2], cus[i], units[i][3]), todo)))
    results = []
    for i, cu in enumerate(cus):
        if isinstance(cu, Result):
            results.append(cu)
        elif owner[i] == i:
            results.append(built[i])
        else:
            r, label = built[owner[i]], units[owner[i]][4]
            results.append(Result(r.name, r.cuh, r.ok, 0.0, f"not built: the same preprocessed source and flags as "
                                  f"{label}'s build, whose log follows\n{r.log}", list(r.failed_helpers), label))
    return results, len(todo)


def series_headers(repo: Path = REPO) -> set[str]:
    """``.cuh`` files (relative to kernels/jit/csrc) the series patches or ships in csrc/."""
    out: set[str] = set()
    marker = "python/" + CSRC_UNDER + "/"
    for patch in sorted((repo / "patches").glob("*.patch")):
        for m in re.finditer(r"^\+\+\+ b/(\S+\.cuh)$", patch.read_text(), re.M):
            if m.group(1).startswith(marker):
                out.add(m.group(1)[len(marker):])
    csrc = repo / "csrc"
    if csrc.is_dir():
        out |= {str(p.relative_to(csrc)) for p in csrc.rglob("*.cuh")}
    return out


def _row_json(r: Result) -> dict:
    out = {**asdict(r), "seconds": round(r.seconds, 2), "log": r.log[-4000:] if not r.ok else ""}
    for key in ("failed_helpers", "same_as"):
        if not out[key]:
            out.pop(key)
    return out


def _report_failures(results: list[Result], where: str = "") -> None:
    for r in results:
        if r.ok:
            continue
        if r.name == PROBE.name:
            named = "; ".join(r.failed_helpers) or "see the log"
            print(f"FAILED: upstream signature probe{where}: {named}\n{r.log[-4000:]}", file=sys.stderr)
        else:
            print(f"FAILED: {r.name} ({r.cuh}){where}\n{r.log[-4000:]}", file=sys.stderr)


def stage_release_trees(revs: list[str], dest: Path) -> dict[str, dict]:
    """Each rev's kernel sources with the series applied (from the release history) under dest/<rev>."""
    from c128patch.evidence.keys import key_for
    from c128patch.evidence.staging import patched_sources
    from c128patch.series.manifest import load_series
    from c128patch.upstream.releases import ReleaseHistory, release_version

    versions = [release_version(r) for r in revs]
    if None in versions:
        raise SystemExit(f"not release tags: {[r for r, v in zip(revs, versions) if v is None]}")
    history = ReleaseHistory()
    history.ensure([v for v in versions if v])
    series, git = load_series(REPO), history.git
    out = {}
    for rev in revs:
        tree = patched_sources(series, git, rev, dest / rev, paths=("python/sglang/kernels/jit",))
        commit = git.rev_parse(rev)
        out[rev] = {"tree": tree, "commit": commit, "key": key_for(series, git, commit)}
    return out


def record(dest: Path, rev: str, info: dict, results: list[Result], arch: str, command: str) -> Path:
    """``dest/<rev>/compile.json`` (evidence.results)."""
    import datetime

    from c128patch.evidence.results import SCHEMA, write_result

    nvcc = subprocess.run([find_toolchain(info["tree"], arch).nvcc, "--version"], capture_output=True, text=True)
    release = re.search(r"release (\S+),", nvcc.stdout)
    import tvm_ffi

    probe = next(r for r in results if r.name == PROBE.name)
    kernels = [r for r in results if r.name != PROBE.name]
    data = {
        "schema": SCHEMA, "kind": "compile", "rev": rev, "label": "patched", "key": info["key"].to_json(),
        "command": command, "date": datetime.date.today().isoformat(),
        "device": f"no GPU: nvcc {release.group(1) if release else '?'}, "
                  f"tvm_ffi {getattr(tvm_ffi, '__version__', '?')}, sm_{arch}",
        "kernels": [{"name": r.name, "cuh": r.cuh, "ok": r.ok, "seconds": round(r.seconds, 1),
                     **({"same_as": r.same_as} if r.same_as else {})} for r in kernels],
        "probe_ok": probe.ok, "probe_failed_helpers": probe.failed_helpers,
        "ok": probe.ok and all(r.ok for r in kernels),
    }
    return write_result(dest, rev, "compile", data)


def _print_report(args: argparse.Namespace, trees: dict, by_rev: dict, built: list[Result], builds: int,
                  rows: int, arch: str, wall: float, uncovered: list[str]) -> None:
    """The table (or --json), then every failure and every header without a row, on stderr."""
    failed = [r for r in built if not r.ok]
    if args.json:
        if args.release:
            body = {"releases": {rev: {"commit": trees[rev]["commit"], "key": trees[rev]["key"].to_json(),
                                       "kernels": [_row_json(r) for r in by_rev[rev]],
                                       "ok": all(r.ok for r in by_rev[rev])} for rev in trees}}
        else:
            body = {"tree": str(trees[""]["tree"]), "kernels": [_row_json(r) for r in built]}
        print(json.dumps({**body, "arch": f"sm_{arch}", "jobs": args.jobs, "wall_s": round(wall, 2),
                          "units": len(built), "builds": builds,
                          "uncovered_series_headers": uncovered, "ok": not failed and not uncovered}, indent=2))
    else:
        for rev, results in by_rev.items():
            for r in results:
                took = f"same as {r.same_as}" if r.same_as else f"{r.seconds:6.1f} s"
                print(f"{'ok  ' if r.ok else 'FAIL'} {rev or '-':8s} {r.name:32s} {r.cuh:40s} {took}")
        print(f"{len(built)} units ({len(trees)} tree(s) x {rows} rows), {builds} built (the rest: the same "
              f"preprocessed source and flags as a build), sm_{arch}, {args.jobs} jobs, {wall:.1f} s wall")
    for rev, results in by_rev.items():
        _report_failures(results, f" on {rev}" if rev else "")
    for h in uncovered:
        print(f"FAILED: series header {h} has no row in KERNELS ({__file__})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, nargs="?", help="folder holding the patched sglang/")
    parser.add_argument("--release", action="append", default=[], help="build this release + the series (repeatable)")
    parser.add_argument("--all-releases", action="store_true", help="every supported release (0.5.20-0.5.23)")
    parser.add_argument("--record", type=Path, help="with --release: write DIR/<rev>/compile.json")
    parser.add_argument("--arch", default="sm_90a", help="sm_XX[a] (default sm_90a)")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", type=Path, help="build here and keep it (default: a temp dir)")
    parser.add_argument("--only", action="append", default=[], help="build only this row (repeatable)")
    parser.add_argument("--build-every-unit", action="store_true",
                        help="build a release's unit even when its preprocessed source and flags equal another's")
    args = parser.parse_args(argv)
    if args.all_releases:
        from c128patch.upstream.releases import DEFAULT_RELEASES, tag_for

        args.release = [tag_for(v) for v in DEFAULT_RELEASES]
    if (args.tree is None) == (not args.release):
        parser.error("give TREE, or --release/--all-releases")
    if args.record and not args.release:
        parser.error("--record needs --release/--all-releases")

    arch = args.arch.removeprefix("sm_")
    uncovered = sorted(series_headers() - {k.cuh for k in KERNELS})
    kernels = [k for k in ROWS if not args.only or k.name in args.only]
    if args.only and len(kernels) != len(set(args.only)):
        raise SystemExit(f"unknown --only names; rows: {[k.name for k in ROWS]}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="c128patch-kernels-"))
    start = time.monotonic()
    try:
        if args.release:
            trees = stage_release_trees(args.release, work / "trees")
        else:
            trees = {"": {"tree": args.tree.resolve()}}
        jobs = [(rev, k) for rev in trees for k in kernels]
        tcs = {rev: find_toolchain(info["tree"], arch) for rev, info in trees.items()}
        units = [(tcs[rev], trees[rev]["tree"], k, work / "build" / (rev or "tree") / k.name, rev) for rev, k in jobs]
        built, builds = build_all(units, args.jobs, dedupe=len(trees) > 1 and not args.build_every_unit)
        wall = time.monotonic() - start
        by_rev = {rev: [r for (rv, _), r in zip(jobs, built) if rv == rev] for rev in trees}
        if args.record:
            command = "python ci/compile_kernels.py " + " ".join(a for a in (argv or sys.argv[1:]))
            for rev, results in by_rev.items():
                record(args.record, rev, trees[rev], results, arch, command)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    _print_report(args, trees, by_rev, built, builds, len(kernels), arch, wall, uncovered)
    failed = [r for r in built if not r.ok]
    return 1 if failed or uncovered else 0


if __name__ == "__main__":
    sys.exit(main())
