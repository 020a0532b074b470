"""Compile every CUDA header of the patch series the way sglang's JIT loader would, without a GPU.

    python ci/compile_kernels.py TREE [--arch sm_90a] [--json] [-j N]

TREE holds a *patched* ``sglang/`` (a checkout's ``python/`` or an unpacked wheel root, with our
``csrc/`` files installed). For each row of :data:`KERNELS` this writes the translation unit that
``kernels/jit/utils/compile/spec.py`` generates (the tvm-ffi includes, ``#include`` the ``.cuh``,
``TVM_FFI_DLL_EXPORT_TYPED_FUNC(export, (symbol))`` inside ``namespace sglang``), compiles it with
sglang's flags and links the module, all rows in parallel. Exit 1 names every kernel that failed,
and every series ``.cuh`` (touched by ``patches/*.patch`` or shipped in ``csrc/``) that has no row.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
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
    symbol is replaced by the template args joined with ", " (as ``make_cpp_args`` renders them)."""

    name: str
    cuh: str  # relative to kernels/jit/csrc
    wrappers: tuple[tuple[str, str], ...]
    args: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ("-use_fast_math",)


# One row per (header, instantiation). head_dim 512, fp32/bf16 state buffers, PDL on, as
# compress.py instantiates them on sm_90. Extend with one line per new kernel.
KERNELS: tuple[Kernel, ...] = (
    Kernel("compress_128_online_v2_fp32", "deepseek_v4/c128_online_v2.cuh", ONLINE_WRAPPERS, ("512", "fp32_t", "true")),
    Kernel("compress_128_online_v2_bf16", "deepseek_v4/c128_online_v2.cuh", ONLINE_WRAPPERS, ("512", "bf16_t", "true")),
    Kernel("compress_plan", "deepseek_v4/c_plan.cuh", PLAN_WRAPPERS, (), ()),
    Kernel("online_c128_dspark_fp32", "deepseek_v4/online_c128_dspark.cuh", DSPARK_WRAPPERS, ("512", "fp32_t", "true")),
    Kernel("online_c128_dspark_bf16", "deepseek_v4/online_c128_dspark.cuh", DSPARK_WRAPPERS, ("512", "bf16_t", "true")),
)

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


def build_one(tc: Toolchain, tree: Path, kernel: Kernel, work: Path) -> Result:
    start = time.monotonic()
    cuh = (tree / CSRC_UNDER / kernel.cuh).resolve()
    if not cuh.is_file():
        return Result(kernel.name, kernel.cuh, False, 0.0, f"missing {cuh}")
    d = work / kernel.name
    d.mkdir(parents=True)
    cu = d / "cuda.cu"
    cu.write_text(wrapper_source(cuh, kernel))
    log = ""
    for cmd in (tc.compile_cmd(cu, d / "cuda.o", kernel), tc.link_cmd(d / "cuda.o", d / f"{kernel.name}.so")):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log += f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        if proc.returncode != 0:
            return Result(kernel.name, kernel.cuh, False, time.monotonic() - start, log)
    return Result(kernel.name, kernel.cuh, True, time.monotonic() - start, log)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="folder holding the patched sglang/")
    parser.add_argument("--arch", default="sm_90a", help="sm_XX[a] (default sm_90a)")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", type=Path, help="build here and keep it (default: a temp dir)")
    parser.add_argument("--only", action="append", default=[], help="build only this row (repeatable)")
    args = parser.parse_args(argv)

    tree = args.tree.resolve()
    arch = args.arch.removeprefix("sm_")
    tc = find_toolchain(tree, arch)
    uncovered = sorted(series_headers() - {k.cuh for k in KERNELS})
    kernels = [k for k in KERNELS if not args.only or k.name in args.only]
    if args.only and len(kernels) != len(set(args.only)):
        raise SystemExit(f"unknown --only names; rows: {[k.name for k in KERNELS]}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="c128patch-kernels-"))
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda k: build_one(tc, tree, k, work), kernels))
    wall = time.monotonic() - start
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)

    failed = [r for r in results if not r.ok]
    if args.json:
        print(json.dumps({
            "tree": str(tree), "arch": f"sm_{arch}", "jobs": args.jobs, "wall_s": round(wall, 2),
            "kernels": [{**asdict(r), "seconds": round(r.seconds, 2), "log": r.log[-4000:] if not r.ok else ""} for r in results],
            "uncovered_series_headers": uncovered,
            "ok": not failed and not uncovered,
        }, indent=2))  # fmt: skip
    else:
        for r in results:
            print(f"{'ok  ' if r.ok else 'FAIL'} {r.name:32s} {r.cuh:40s} {r.seconds:6.1f} s")
        print(f"{len(results)} kernels, sm_{arch}, {args.jobs} jobs, {wall:.1f} s wall")
    for r in failed:
        print(f"FAILED: {r.name} ({r.cuh})\n{r.log[-4000:]}", file=sys.stderr)
    for h in uncovered:
        print(f"FAILED: series header {h} has no row in KERNELS ({__file__})", file=sys.stderr)
    return 1 if failed or uncovered else 0


if __name__ == "__main__":
    sys.exit(main())
