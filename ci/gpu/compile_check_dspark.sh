#!/usr/bin/env bash
# Compile-check csrc/deepseek_v4/online_c128_dspark.cuh for sm_90a the way sglang's
# load_jit would (generated wrapper .cu, same flags), instantiating every exported
# entry for fp32 and bf16 state. Prints ptxas resource usage.
#
# usage: ci/gpu/compile_check_dspark.sh [SGLANG_PACKAGE_DIR]
#   SGLANG_PACKAGE_DIR: an sglang/ package folder (default $C128PATCH_SGLANG_DIR or
#   /tmp/sgl/v0.5.23/sglang); only its kernels/jit/include is used.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
sgl="${1:-${C128PATCH_SGLANG_DIR:-/tmp/sgl/v0.5.23/sglang}}"
nvcc="${NVCC:-nvcc}"
ffi_inc="$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_include_path())')"
dlpack_inc="$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_dlpack_include_path())')"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for dtype in fp32_t bf16_t; do
  for pdl in true false; do
    cls="DsparkC128Kernel<512, ${dtype}, ${pdl}>"
    cat >"$work/cuda_${dtype}_${pdl}.cu" <<CU
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include "${repo}/csrc/deepseek_v4/online_c128_dspark.cuh"
namespace sglang {
TVM_FFI_DLL_EXPORT_TYPED_FUNC(plan, (${cls}::run_plan));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(verify_compress, (${cls}::run_verify));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(write_prefix, (${cls}::run_write_prefix));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(commit, (${cls}::run_commit));
}  // namespace sglang
CU
    echo "== ${cls}"
    "$nvcc" -c "$work/cuda_${dtype}_${pdl}.cu" -o "$work/cuda_${dtype}_${pdl}.o" \
      -gencode=arch=compute_90a,code=sm_90a -DSGL_CUDA_ARCH=900 -std=c++20 -O3 \
      --expt-relaxed-constexpr -use_fast_math -Xcompiler -fPIC -Xptxas=-v \
      -I"$sgl/kernels/jit/include" -I"$ffi_inc" -I"$dlpack_inc" 2>&1 |
      grep -E "error|warning|Compiling entry|registers|spill" || true
    test -s "$work/cuda_${dtype}_${pdl}.o"
  done
done
echo "compile check OK"
