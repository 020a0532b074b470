#!/usr/bin/env python3
"""Turn what ci/gpu/upstream_suite_run.sh brought back into the committed per-release results.

  python ci/gpu/collect_upstream_suite.py FOLDER [--dest ci/gpu/results] [--allow-list]

FOLDER holds upstream-suite-run.json and upstream-suite.tgz (the device call's $OUT, as fetched).
Writes ci/gpu/results/<rev>/upstream-suite.json for each release that has a result (the evidence
matrix's "upstream's own tests" column), with every path of the GPU machine made relative: the
repository root is dropped (".gpu-upstream/v0.5.23/patched/sglang/..."), the JIT caches become
"$SGLANG_JIT_CACHE_DIR", the machine's Python folders "<python>", the carried wheels "<site>", a
stage outside the repository "<stage>".
A result that still names a machine path, a collect-only result (unless --allow-list), a
release without a result, or a result of another release than its folder is refused: nothing
is written then.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

RESULT = "upstream-suite.json"
JIT_CACHE = re.compile(r"/tmp/c128patch-jit/[0-9a-f]{12}")
MACHINE_PATH = re.compile(r"(?<![\w.<>$-])/(?:root|home|tmp|opt|work|mnt|srv|var|scratch)/[^\s'\"():,]*")


def rewrite(value: Any, roots: list[tuple[str, str]]) -> Any:
    """``value`` with each root (longest first) replaced, in every string it holds."""
    if isinstance(value, str):
        value = JIT_CACHE.sub("$SGLANG_JIT_CACHE_DIR", value)
        for root, token in roots:
            value = value.replace(root, token)
        return value
    if isinstance(value, list):
        return [rewrite(v, roots) for v in value]
    if isinstance(value, dict):
        return {k: rewrite(v, roots) for k, v in value.items()}
    return value


def machine_paths(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(MACHINE_PATH.findall(value))
    if isinstance(value, list):
        return set().union(*(machine_paths(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return machine_paths(list(value.values()))
    return set()


def roots_of(run: dict[str, Any]) -> list[tuple[str, str]]:
    repo = run["repo"].rstrip("/")
    roots = [(repo + "/", ""), (repo, "."), (run["site"], "<site>"), (run["out"], "<out>")]
    roots += [(p, "<python>") for p in run["python_paths"]]
    if not (run["stage"] + "/").startswith(repo + "/"):  # a stage outside the repository (a dry run's)
        roots.append((run["stage"], "<stage>"))
    return sorted(roots, key=lambda r: -len(r[0]))


def collect(folder: Path, dest: Path, allow_list: bool) -> list[Path]:
    run = json.loads((folder / "upstream-suite-run.json").read_text())
    roots = roots_of(run)
    out: dict[Path, dict[str, Any]] = {}
    errors: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(folder / "upstream-suite.tgz") as tar:
            tar.extractall(tmp, filter="data")
        for rel in run["releases"]:
            rev = rel["rev"]
            path = Path(tmp) / rev / RESULT
            if not path.is_file():
                errors.append(f"{rev}: no {RESULT} (smoke exit {rel['exit']}; see {rev}.log in the tgz)")
                continue
            result = rewrite(json.loads(path.read_text()), roots)
            if result.get("rev") != rev:
                errors.append(f"{rev}: the result is of {result.get('rev')!r}")
            if "collect-only" in result.get("mode", "") and not allow_list:
                errors.append(f"{rev}: a collect-only result (--list run); pass --allow-list to keep it")
            left = machine_paths(result)
            if left:
                errors.append(f"{rev}: machine paths left after rewriting: {', '.join(sorted(left)[:5])}")
            out[dest / rev / RESULT] = result
    if errors:
        raise SystemExit("collect_upstream_suite: nothing written:\n  " + "\n  ".join(errors))
    for path, result in out.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return list(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--dest", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--allow-list", action="store_true", help="keep collect-only results (a dry run)")
    args = ap.parse_args()
    for path in collect(args.folder, args.dest, args.allow_list):
        r = json.loads(path.read_text())
        counts = ", ".join(f"{v} {k}" for k, v in r["counts"].items() if v)
        print(f"{path}: {r['rev']} ok={r['ok']} {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
