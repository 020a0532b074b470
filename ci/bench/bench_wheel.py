#!/usr/bin/env python3
"""Patched-wheel speed (budget: <= 20 s for the 39 MB sglang 0.5.23 wheel on a 2-core machine) vs raw
(`wheel unpack` + `git apply` of the planned patches + the overlays copied + `wheel pack`), N paired runs
interleaved, next to what a source build would need.

  python ci/bench/bench_wheel.py [--version 0.5.23] [--runs 3] [--series DIR] [--out ci/bench/results/wheel.json]

Times the whole CLI (`c128patch wheel --from-release X --json`, a fresh process each time) and
`c128patch verify-wheel`. For the source build it records what it can measure here:
the PEP 517 front end and plugins, the Rust toolchain, a toolchain smoke test (rustc compiling a
small cdylib), and the compiled extensions the release wheel carries (what a source build must
compile); and says what it cannot measure.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from benchlib import append, c128patch, interleaved, measure, parser, ratio, table, target

from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan
from c128patch.upstream.releases import BINARY_SUFFIXES, ReleaseHistory, wheel_for

SMOKE_RS = """
#[no_mangle]
pub extern "C" fn c128_sum(xs: *const u64, n: usize) -> u64 {
    let s = unsafe { std::slice::from_raw_parts(xs, n) };
    s.iter().copied().fold(0u64, |a, b| a.wrapping_add(b))
}
"""


def raw_wheel(wheel: Path, items: list, out: Path) -> None:
    """wheel unpack, git apply (paths under python/ in the patches: -p2), the overlays copied, wheel pack."""
    subprocess.run([sys.executable, "-m", "wheel", "unpack", "-d", str(out), str(wheel)], check=True,
                   capture_output=True)
    root = next(out.iterdir())
    for item in items:
        if item.patch is not None:
            subprocess.run(["git", "apply", "-p2", str(item.path)], cwd=root, check=True, capture_output=True)
        else:
            shutil.copyfile(item.path, root / item.entry.target.removeprefix("python/"))
    subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", str(out), str(root)], check=True,
                   capture_output=True)


def version_of(name: str, dist: bool = False) -> str | None:
    """A Python distribution's version (``dist``), else the first line of ``name --version``; None if absent."""
    if dist:
        return next((d.version for d in importlib.metadata.distributions(name=name)), None)
    proc = subprocess.run([name, "--version"], capture_output=True, text=True) if shutil.which(name) else None
    return (proc.stdout or proc.stderr).strip().splitlines()[0] if proc and proc.returncode == 0 else None


def rust_smoke(work: Path) -> float | None:
    """Seconds for rustc -O to build a small cdylib, or None without rustc."""
    if shutil.which("rustc") is None:
        return None
    (work / "smoke.rs").write_text(SMOKE_RS)
    argv = ["rustc", "-O", "--crate-type", "cdylib", "--edition", "2021", "-o", str(work / "libsmoke.so"),
            str(work / "smoke.rs")]
    took, _, proc = measure(lambda: subprocess.run(argv, capture_output=True))
    return round(took, 2) if proc.returncode == 0 else None


def source_build_prerequisites(wheel: Path, work: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        binaries = {i.filename: i.file_size for i in zf.infolist() if i.filename.endswith(BINARY_SUFFIXES)}
    return {
        "pep517_frontend_build": version_of("build", dist=True),
        **{name.replace("-", "_"): version_of(name, dist=True) for name in ("setuptools", "setuptools-scm",
                                                                          "setuptools-rust")},
        **{name: version_of(name) for name in ("maturin", "cargo", "rustc")},
        "rustc_smoke_cdylib_s": rust_smoke(work),
        "compiled_extensions_in_wheel": {k: round(v / 1e6, 1) for k, v in sorted(binaries.items())},
        "compiled_extensions_mb": round(sum(binaries.values()) / 1e6, 1),
        "not_measured": [
            "compile time of sglang's Rust extensions: their sources (the rust/ cargo workspace upstream "
            "builds with `cargo build --release --locked`) are not in the release wheels and no upstream "
            "checkout is available here",
            "their crate dependencies come from crates.io, which these machines cannot reach, so even "
            "with the sources an offline build would need a vendored cargo registry",
            "an isolated `python -m build` also downloads setuptools, setuptools-scm and setuptools-rust "
            "into its build environment (PyPI)",
        ],
    }


def main() -> int:
    ap = parser("wheel")
    ap.add_argument("--version", default="0.5.23")
    ap.add_argument("--series", type=Path, default=None)
    args = ap.parse_args()
    series = load_series(args.series or default_series_root())
    git = Git(git_dir=ReleaseHistory().ensure([args.version]))  # not part of the timing: built once per cache
    items, wheel = plan(series, git, git.rev_parse(f"v{args.version}")), wheel_for(args.version)
    work = Path(tempfile.mkdtemp(prefix="bench-wheel-"))
    ours = f"c128patch wheel --from-release {args.version}"
    try:
        figures, last = interleaved({
            "raw: wheel unpack + git apply + wheel pack": lambda i: raw_wheel(wheel, items, work / f"raw{i}"),
            ours: lambda i: json.loads(c128patch("wheel", "--from-release", args.version, "--series", str(series.root),
                                                 "-o", str(work / f"out{i}")).stdout)}, args.runs)
        verify, _ = interleaved({"c128patch verify-wheel": lambda i: c128patch(
            "verify-wheel", last[ours]["wheel"], "--series", str(series.root))}, args.runs)
        hashes = {hashlib.sha256(next((work / f"out{i}").glob("*.whl")).read_bytes()).hexdigest()
                  for i in range(args.runs)}
        prereq = source_build_prerequisites(wheel, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw, seconds = next(iter(figures)), figures[ours]["wall"]["median"]
    table({**figures, **verify})
    print(f"same bytes on every run: {len(hashes) == 1}\nsource build would need:")
    for key, value in prereq.items():
        print(f"  {key:30} {'missing' if value is None else value}")
    record = {"runs": args.runs, "figures": {**figures, **verify}, "ratios": {"wheel / raw": ratio(figures, ours, raw)},
              "targets": [target("wheel (s)", seconds, 20)], "upstream_wheel": wheel.name,
              "upstream_wheel_mb": round(wheel.stat().st_size / 1e6, 1), "wheel_cli_s": seconds,
              "wheel_in_process_s": last[ours].get("seconds"), "budget_s": 20, "within_budget": seconds <= 20,
              "identical_bytes_across_runs": len(hashes) == 1, "patched_version": last[ours].get("version"),
              "source_build_prerequisites": prereq}
    return int(append(args.out, record, revs=(f"v{args.version}",), series_root=args.series)["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
