"""Copy the part of a sglang ``python/`` tree that the GPU kernel tier needs (≈ 1 MB).

The GPU machine takes at most 64 MiB per call and the whole ``sglang/`` tree is ≈ 130 MB, so the
kernel tier runs on this subset: the JIT loader (``kernels/jit/utils``), its headers
(``kernels/jit/include``), the C128/plan ``.cuh`` sources, the DSV4 op modules that wrap them
(our overlay ops modules included), ``srt/environ.py``, the series III controller and the
upstream sources its GPU tests run (the DSV4 backend, ForwardMode, the ragged verify layouts)
and the package ``__init__`` files.

    python -m tests.gpu.tree_subset SRC DST      # SRC holds sglang/ (a checkout's python/ or a wheel root)
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import sys
from pathlib import Path

# (folder under sglang/, glob patterns, recursive). Extend here: one line per need.
SUBSET: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("kernels/jit", ("__init__.py",), False),
    ("kernels/jit/utils", ("*.py",), True),
    ("kernels/jit/include", ("*",), True),
    ("kernels/jit/csrc/deepseek_v4", ("*c128*.cuh", "c4_v2.cuh", "c_plan.cuh", "*dspark*.cuh"), False),
    (
        "kernels/ops/attention/dsv4",
        ("compress.py", "utils.py", "kv_layout.py", "*c128*.py", "*dspark*.py"),
        False,
    ),
    ("srt", ("environ.py",), False),
    # series III: the controller and its rules; 0.5.23's MTP controller (the simulation's
    # upstream arm); the backend, ForwardMode and ragged layouts the GPU tests run from source
    ("srt/layers/attention/dsv4", ("online_c128_dspark*.py", "online_c128_mtp.py"), False),
    ("srt/layers/attention", ("deepseek_v4_backend.py",), False),
    ("srt/model_executor", ("forward_batch_info.py",), False),
    ("srt/speculative", ("ragged_verify.py",), False),
    ("kernels/ops/speculative", ("ragged_verify_kernels.py",), False),
)


def subset_files(src: Path) -> list[Path]:
    """Paths relative to ``src`` (which holds ``sglang/``), package ``__init__`` files included."""
    root = src / "sglang"
    if not root.is_dir():
        raise FileNotFoundError(f"{src} does not hold sglang/")
    picked: set[Path] = set()
    for folder, patterns, recursive in SUBSET:
        base = root / folder
        if not base.is_dir():
            raise FileNotFoundError(base)
        for path in base.rglob("*") if recursive else base.iterdir():
            if path.is_file() and "__pycache__" not in path.parts and any(
                fnmatch.fnmatch(path.name, pat) for pat in patterns
            ):
                picked.add(path.relative_to(src))
    for rel in list(picked):  # every package on the way down keeps its __init__.py
        for parent in rel.parents:
            init = src / parent / "__init__.py"
            if parent != Path(".") and init.is_file():
                picked.add(init.relative_to(src))
    return sorted(picked)


def copy_subset(src: Path, dst: Path) -> list[Path]:
    """Copy the subset of ``src`` into ``dst`` (same layout); returns the copied relative paths."""
    files = subset_files(src)
    for rel in files:
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, out)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="folder holding sglang/")
    parser.add_argument("dst", type=Path, help="output folder (gets sglang/...)")
    args = parser.parse_args(argv)
    files = copy_subset(args.src, args.dst)
    size = sum((args.dst / f).stat().st_size for f in files)
    print(f"{len(files)} files, {size / 1e6:.2f} MB -> {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
