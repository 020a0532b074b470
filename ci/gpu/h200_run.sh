#!/usr/bin/env bash
# One call on the H200 (device tool): install the carried wheels, then run the GPU suite on the
# patched tree (tests/gpu, upstream tree for differential checks), the benchmark, and the suite
# again under compute-sanitizer at a small scale. Everything lands in $OUT/results.tgz.
#   ci/gpu/h200_run.sh [phases: tests bench memcheck racecheck]   (default: all four)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/c128-out}
RES=/tmp/c128-res
mkdir -p "$OUT" "$RES"
phases=${*:-tests bench memcheck racecheck}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export C128PATCH_TREE=$PWD/.gpu/patched C128PATCH_UPSTREAM_TREE=$PWD/.gpu/upstream
export C128PATCH_GPU_RESULTS_DIR=$RES SGLANG_JIT_CACHE_DIR=/tmp/c128-jit
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch;print('torch', torch.__version__)"; nvcc --version | tail -1; } > "$RES/device.txt" 2>&1
PYTEST=(python3 -m pytest tests/gpu -p no:cacheprovider --confcutdir=tests/gpu -q -rfEs)
run() {  # name timeout cmd...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$RES/phases.txt"
  tail -n 25 "$RES/$name.log"
}
for phase in $phases; do
  case $phase in
    tests) run tests ${TESTS_LIMIT:-300} "${PYTEST[@]}" --junitxml="$RES/junit.xml" ;;
    bench) run bench ${BENCH_LIMIT:-170} python3 ci/bench/bench_online_c128_dspark.py --out "$RES/bench_dspark.json" ;;
    memcheck|racecheck)
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 C128PATCH_GPU_SCALE=${SANITIZER_SCALE:-0.02} \
        run "$phase" "${SANITIZER_LIMIT:-240}" compute-sanitizer --tool "$phase" --error-exitcode 99 "${PYTEST[@]}" \
        --junitxml="$RES/junit_$phase.xml"
      grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$RES/$phase.log" | tail -3 ;;
  esac
done
tar -czf "$OUT/results.tgz" -C "$RES" .
