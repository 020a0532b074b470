#!/usr/bin/env bash
# One device call: `c128patch smoke upstream` on every release that
# ci/gpu/stage_upstream_suite.py staged, patched vs unpatched, all at once: one smoke per release,
# each running its two trees at the same time (--parallel-trees), so 8 pytest passes share the
# GPU and the cores. Each tree builds its own JIT modules into its own cache (tests/gpu/harness.py:
# $TMPDIR or /tmp, then c128patch-jit/<hash of the tree's path>); SGLANG_JIT_CACHE_DIR is unset so no two trees share one.
#
#   ci/gpu/upstream_suite_run.sh [--list]        (--list: collect only; no GPU needed)
#
# Env: OUT (what comes back; default /tmp/c128-upstream-out), STAGE (default .gpu-upstream),
# RELEASES (default: every v* folder of the stage), PASS_TIMEOUT (seconds per pytest pass, default
# 480), DEADLINE (seconds from the start at which a smoke still running is stopped, default 560),
# SMOKE (the command before `smoke`, default "python3 -m c128patch"), WHEELS (folder of wheels to
# install first, default $STAGE/whl).
# Under $OUT, three files: upstream-suite.tgz (each release's smoke folder: report, result file,
# pytest logs, JUnit, rows, smoke's own output), upstream-suite-run.json (releases, exit codes,
# seconds, versions, and the machine's paths that ci/gpu/collect_upstream_suite.py makes relative),
# upstream-suite-summary.txt.
# Exit: 0 every release's report is ok; 1 every release has a report, some not ok (see the summary);
# 2 a release has no report; 3 the stage or the wheels could not be used.
set -uo pipefail

main() {  # one function, read whole before it runs: editing this file mid-run cannot change a run
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-/tmp/c128-upstream-out}
STAGE=${STAGE:-.gpu-upstream}
WORK=$STAGE/out  # relative, so the commands the reports record hold no machine path
PASS_TIMEOUT=${PASS_TIMEOUT:-480}
DEADLINE=${DEADLINE:-560}
SMOKE=${SMOKE:-python3 -m c128patch}
WHEELS=${WHEELS:-$STAGE/whl}  # cp312 wheels (apache-tvm-ffi, msgspec); the CPU dry run sets WHEELS=none
LIST=()
[[ ${1:-} == --list ]] && LIST=(--list)
RELEASES=${RELEASES:-$(cd "$STAGE" 2>/dev/null && ls -d v*/ 2>/dev/null | tr -d / | tr '\n' ' ')}
[[ -n ${RELEASES// } ]] || { echo "no release staged under $STAGE (run ci/gpu/stage_upstream_suite.py)" >&2; exit 3; }
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT" || exit 3

SITE=/tmp/c128-upstream-site
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl > "$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log" >&2; exit 3; }
fi
export PYTHONPATH=$REPO/tooling:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 COLUMNS=200 OMP_NUM_THREADS=2 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
unset SGLANG_JIT_CACHE_DIR PYTEST_ADDOPTS

echo "releases: $RELEASES; pass timeout ${PASS_TIMEOUT}s; deadline ${DEADLINE}s; ${LIST[*]:-run}"
for rev in $RELEASES; do
  (
    t0=$SECONDS
    S=$STAGE/$rev
    timeout --kill-after=15 $((DEADLINE - SECONDS)) $SMOKE smoke upstream --tree "$S/patched" \
      --upstream-tree "$S/upstream" --tests "$S/upstream-tests" --parallel-trees \
      --timeout "$PASS_TIMEOUT" --out "$WORK/$rev" "${LIST[@]}" > "$WORK/$rev.log" 2>&1
    echo "$? $((SECONDS - t0))" > "$WORK/$rev.rc"
  ) &
done
wait

python3 - "$REPO" "$STAGE" "$WORK" "$SITE" "$OUT" "$RELEASES" "${LIST[*]:-run}" <<'EOF'
"""upstream-suite-run.json and upstream-suite-summary.txt from what each smoke left."""
import json, os, subprocess, sys, sysconfig
from pathlib import Path

repo, stage, work, site, out, releases, mode = sys.argv[1:]
work_abs = Path(repo) / work
def version(mod):
    try:
        return __import__(mod).__version__
    except Exception as exc:  # noqa: BLE001  (recorded, not fatal: the report says what failed)
        return f"not importable: {type(exc).__name__}"
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip() if subprocess.run(
                     ["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0 else "no nvidia-smi"
run = {"schema": 1, "mode": mode, "repo": repo, "stage": str((Path(repo) / stage).resolve()), "work": work,
       "site": site, "out": out,
       "python_paths": sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")} | {sys.prefix}),
       "versions": {m: version(m) for m in ("torch", "triton", "tvm_ffi")}, "nvidia_smi": smi, "releases": []}
lines = []
for rev in releases.split():
    rc_file = work_abs / f"{rev}.rc"
    rc, seconds = (rc_file.read_text().split() + ["", ""])[:2] if rc_file.is_file() else ("", "")
    result = work_abs / rev / "upstream-suite.json"
    entry = {"rev": rev, "exit": int(rc) if rc else None, "seconds": int(seconds) if seconds else None,
             "result": f"{rev}/upstream-suite.json" if result.is_file() else None}
    if result.is_file():
        r = json.loads(result.read_text())
        entry.update(ok=r["ok"], counts={k: v for k, v in r["counts"].items() if v}, problems=r["problems"])
        lines.append(f"{rev}: exit {rc} in {seconds}s, ok={r['ok']}, " + ", ".join(f"{v} {k}" for k, v in entry["counts"].items()))
        lines += [f"  problem: {p}" for p in r["problems"][:20]]
        lines += [f"  note: {n}" for n in r["notes"][:20]]
    else:
        lines.append(f"{rev}: exit {rc or '?'} in {seconds or '?'}s, NO REPORT (see {rev}.log in the tgz)")
    run["releases"].append(entry)
lines.append(f"versions: {run['versions']}; {smi}")
(Path(out) / "upstream-suite-run.json").write_text(json.dumps(run, indent=1) + "\n")
(Path(out) / "upstream-suite-summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
# a log larger than 4 MiB keeps its head and tail (each file that comes back is at most 16 MiB)
find "$WORK" -type f -name '*.log' -size +4M | while read -r f; do
  { head -c 1M "$f"; printf '\n... [cut by upstream_suite_run.sh] ...\n'; tail -c 2M "$f"; } > "$f.cut" && mv "$f.cut" "$f"
done
tar -czf "$OUT/upstream-suite.tgz" -C "$WORK" . || exit 3
ls -l "$OUT"
python3 - "$OUT/upstream-suite-run.json" <<'EOF'
import json, sys
rels = json.load(open(sys.argv[1]))["releases"]
sys.exit(2 if any(r["result"] is None for r in rels) else 0 if all(r.get("ok") for r in rels) else 1)
EOF
}

main "$@"
