#!/usr/bin/env python3
"""Turn what ci/gpu/upstream_suite_run.sh brought back into the committed per-release results.

  python ci/gpu/collect_upstream_suite.py FOLDER [--dest ci/gpu/results] [--allow-list]

FOLDER holds upstream-suite-run.json and upstream-suite.tgz (the device call's $OUT, as fetched).
Writes ci/gpu/results/<rev>/upstream-suite.json for each release that has a result (the evidence
matrix's "upstream's own tests" column), with every path of the GPU machine made relative: the
repository root is dropped (".gpu-upstream/v0.5.23/patched/sglang/..."), the JIT caches become
"$SGLANG_JIT_CACHE_DIR", the machine's Python folders "<python>", the carried wheels "<site>", a
stage outside the repository "<stage>".
Each result gets the evidence key (upstream tree id, series hash) of the patched tree it ran on,
read from that tree's provenance record in the stage (--stage; default: the run's stage where it
exists here, else .gpu-upstream/), and the patched pass's passed/failed/skipped.
A result that still names a machine path, a collect-only result (unless --allow-list), a
release without a result, a result of another release than its folder, or one whose staged tree
is missing or carries another series than the result names is refused: nothing is written then.
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tooling"))

from c128patch.errors import C128Error  # noqa: E402
from c128patch.evidence.keys import key_from_provenance  # noqa: E402
from c128patch.upstream.releases import ReleaseHistory  # noqa: E402

RESULT = "upstream-suite.json"
PROVENANCE = Path("patched") / "sglang" / "c128patch_provenance.json"
BAD = ("failed", "error", "crashed")
JIT_CACHE = re.compile(r"(?<![\w.<>$-])/[^\s'\"():,]*/c128patch-jit/[0-9a-f]{12}")  # under the temporary folder
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


def keyed(result: dict[str, Any], stage: Path, rev: str) -> tuple[dict[str, Any], str]:
    """``result`` with the staged patched tree's key and the patched pass's counts; or an error."""
    path = stage / rev / PROVENANCE
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return result, f"{rev}: cannot read the staged tree's provenance {path} ({exc})"
    try:  # an `apply` record names the commit only: its sources are read in the release history
        key = key_from_provenance(record, ReleaseHistory().git)
    except C128Error as exc:
        return result, f"{rev}: {exc.message}"
    if key is None:
        return result, f"{rev}: {path} names no upstream commit or entry digests"
    staged, ran = (record.get("series") or {}).get("digest"), (result.get("series") or {}).get("digest")
    if staged != ran:
        return result, (f"{rev}: the stage holds series {str(staged)[:12]}, "
                        f"the result ran series {str(ran)[:12]} (staged again since?)")
    counts = result.get("patched") or {}
    return {**result, "key": key.to_json(), "passed": counts.get("passed", 0),
            "failed": sum(counts.get(k, 0) for k in BAD), "skipped": counts.get("skipped", 0)}, ""


def collect(folder: Path, dest: Path, allow_list: bool, stage: Path | None = None) -> list[Path]:
    run = json.loads((folder / "upstream-suite-run.json").read_text())
    if stage is None:
        stage = Path(run["stage"]) if Path(run["stage"]).is_dir() else REPO / ".gpu-upstream"
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
            result, error = keyed(result, stage, rev)
            if error:
                errors.append(error)
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
    ap.add_argument("--stage", type=Path, help="the stage the run used (default: the run's, else .gpu-upstream)")
    args = ap.parse_args()
    for path in collect(args.folder, args.dest, args.allow_list, args.stage):
        r = json.loads(path.read_text())
        counts = ", ".join(f"{v} {k}" for k, v in r["counts"].items() if v)
        print(f"{path}: {r['rev']} ok={r['ok']} {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
