// Bench-only: the per-launch floor of a chain of graph nodes on this machine.
// Each block waits on the previous grid (PDL), optionally reads one word per
// thread from its layer's input and writes one word: one DRAM round trip.

#pragma once

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>

#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace sglang {

template <bool kUsePDL>
__global__ void launch_floor_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t stride) {
  using namespace device;
  PDLWaitPrimary<kUsePDL>();
  const int64_t i = blockIdx.x * stride + threadIdx.x;
  if (src != nullptr) dst[i] = src[i] + 1.0f;
  PDLTriggerSecondary<kUsePDL>();
}

template <bool kUsePDL>
struct LaunchFloorKernel {
  /// \brief `blocks` blocks of 32 threads; with `touch`, block b copies 32 floats at b * stride.
  static void run(tvm::ffi::TensorView src, tvm::ffi::TensorView dst, int64_t blocks, int64_t stride, bool touch) {
    host::RuntimeCheck(blocks >= 1 && (blocks - 1) * stride + 32 <= dst.numel() && dst.numel() <= src.numel(),
                       "launch_floor: tensors too small");
    host::LaunchKernel(static_cast<uint32_t>(blocks), 32, dst.device())
        .enable_pdl(kUsePDL)(launch_floor_kernel<kUsePDL>,
                             touch ? static_cast<const float*>(src.data_ptr()) : nullptr,
                             static_cast<float*>(dst.data_ptr()), stride);
  }
};

}  // namespace sglang
