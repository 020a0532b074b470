"""A stand-in for nvcc where there is none (tests/test_compile_kernels.py runs ci/compile_kernels.py with it).

`--dryrun` prints nvcc-style steps (`#$ NAME=value` and commands) whose two preprocessing steps, host and
device, run this script's own preprocessor (quoted #includes expanded, each file once, with line markers);
`-c` and `-shared` write their output, append their command line to $FAKE_NVCC_LOG, and fail when
$FAKE_NVCC_FAIL occurs in it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

INCLUDE = re.compile(r'\s*#\s*include\s*"([^"]+)"')


def preprocess(path: Path, includes: list[Path], seen: set[Path], out: list[str]) -> None:
    out.append(f'# 1 "{path}"\n')
    for line in path.read_text().splitlines(keepends=True):
        m = INCLUDE.match(line)
        found = m and next((b / m.group(1) for b in (path.parent, *includes) if (b / m.group(1)).is_file()), None)
        if not found:
            out.append(line)
        elif found.resolve() not in seen:
            seen.add(found.resolve())
            preprocess(found, includes, seen, out)
            out.append(f'# 2 "{path}"\n')


def main(argv: list[str]) -> int:
    includes = [Path(a[2:]) for a in argv if a.startswith("-I")]
    if argv[0] == "--fake-cpp":  # ... SOURCE -o OUT
        out = [f"// {' '.join(a for a in argv if a.startswith('-D'))}\n"]
        preprocess(Path(argv[-3]), includes, set(), out)
        Path(argv[-1]).write_text("".join(out))
        return 0
    if argv[0] == "--dryrun":
        args = argv[1:]
        source, tmp = args[args.index("-c") + 1], f"/tmp/tmpxft_{os.getpid():08x}_00000000"
        flags = shlex.join(a for a in args if a.startswith(("-I", "-D", "-std", "-O", "-gencode")))
        cpp = f"{shlex.quote(sys.executable)} {shlex.quote(__file__)} --fake-cpp"
        steps = [f"_HERE_={Path(__file__).parent}", f'PATH="{os.environ["PATH"]}"',
                 f'{cpp} -D__CUDA_ARCH_LIST__=900 -E {flags} "{source}" -o "{tmp}-5_cuda.cpp4.ii"',
                 f'{cpp} -D__CUDA_ARCH__=900 -E {flags} "{source}" -o "{tmp}-7_cuda.cpp1.ii"',
                 f'"$CICC_PATH/cicc" -arch compute_90a "{tmp}-7_cuda.cpp1.ii" -o "{tmp}-6_cuda.ptx"',
                 f'gcc -c -x c++ {flags} "{tmp}-6_cuda.cudafe1.cpp" -o "{args[args.index("-o") + 1]}"']
        print("\n".join(f"#$ {step}" for step in steps), file=sys.stderr)
        return 0
    with open(os.environ["FAKE_NVCC_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\n")
    if os.environ.get("FAKE_NVCC_FAIL") and os.environ["FAKE_NVCC_FAIL"] in " ".join(argv):
        print(f"{argv[1]}(1): error: fake failure", file=sys.stderr)
        return 1
    Path(argv[argv.index("-o") + 1]).write_bytes(b"fake")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
