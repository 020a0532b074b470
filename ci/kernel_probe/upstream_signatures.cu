// Pins the exact signature of every upstream (sglang `kernels/jit/include`) helper and type
// that csrc/deepseek_v4/online_c128_dspark.cuh uses. ci/compile_kernels.py compiles this file
// against each supported release's headers with sglang's own flags: a helper whose signature
// changes fails CI with its name (the static_assert message, or the C128_PIN line an error
// points at). One C128_PIN per use; extend here when the kernel starts using another helper.
//
// Not pinned, because they are not sglang's: tvm::ffi::TensorView (apache-tvm-ffi, pinned by
// the wheel) and CUDA intrinsics (__shfl_up_sync, __expf, fmaxf). Not used on purpose:
// warp::inclusive_sum ((lane_id, val) on 0.5.20, (val, lane_id = ...) later; we carry our own
// scan) and TensorMatcher::ensure_alignment (0.5.23 only).

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>

#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/vec.cuh>

#include <sgl_kernel/deepseek_v4/compress_v2.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#ifndef SGL_DEVICE
#error "upstream signature changed: the SGL_DEVICE macro is gone (sgl_kernel/utils.cuh)"
#endif

namespace c128probe {

// Upstream names, looked up through a template parameter so that a changed overload makes
// its pin's concept false (a static_assert naming the helper) instead of a hard error.
template <class Tag>
struct Up {
  using TensorMatcher = sglang::host::TensorMatcher;
  using SymbolicSize = sglang::host::SymbolicSize;
  using SymbolicDevice = sglang::host::SymbolicDevice;
  using SizeRef = sglang::host::details::SizeRef;
  using DeviceRef = sglang::host::details::DeviceRef;
  using DebugInfo = sglang::host::DebugInfo;
  using LaunchKernel = sglang::host::LaunchKernel;
  using CompressPlan = sglang::device::compress::CompressPlan;
  template <class T, std::size_t N>
  using AlignedVector = sglang::device::AlignedVector<T, N>;
};
using U = Up<void>;

template <class C, class R, class... A>
using MemFn = R (C::*)(A...);
template <class C, class R, class... A>
using ConstMemFn = R (C::*)(A...) const;
template <class C, class R, class... A>
using RvalueMemFn = R (C::*)(A...) &&;
template <class C, class R, class... A>
using ConstRvalueMemFn = R (C::*)(A...) const&&;

struct KernelParams {
  int value;
};
using KernelRef = void (&)(KernelParams);

}  // namespace c128probe

// C128_PIN(name, "helper as our kernel uses it", requirement...): one requirement per helper.
#define C128_PIN(NAME, HELPER, ...)                               \
  namespace c128probe {                                           \
  template <class P>                                              \
  concept pin_##NAME = requires { __VA_ARGS__; };                 \
  static_assert(pin_##NAME<U>, "upstream signature changed: " HELPER); \
  }

// C128_FACT(name, "helper", constant expression): a type or layout fact.
#define C128_FACT(NAME, HELPER, ...) \
  namespace c128probe {              \
  static_assert(__VA_ARGS__, "upstream signature changed: " HELPER); \
  }

// ---- sgl_kernel/utils.h
C128_FACT(runtime_check_ctad, "host::RuntimeCheck(cond, args...) deduces RuntimeCheck<Args...>",
          std::is_same_v<decltype(sglang::host::RuntimeCheck(true, "n=", int64_t{1})),
                         sglang::host::RuntimeCheck<const char (&)[3], int64_t>>)
C128_FACT(runtime_check_ctor, "host::RuntimeCheck<Args...>(Cond&&, Args&&..., DebugInfo = {})",
          std::is_constructible_v<sglang::host::RuntimeCheck<const char (&)[3], int64_t>, bool, const char (&)[3],
                                  int64_t, sglang::host::DebugInfo>)

// ---- sgl_kernel/tensor.h
C128_FACT(symbolic_size_ctor, "host::SymbolicSize{\"name\"}",
          std::is_constructible_v<sglang::host::SymbolicSize, const char*>)
C128_FACT(symbolic_size_unwrap, "host::SymbolicSize::unwrap(DebugInfo = {}) const -> int64_t",
          std::is_same_v<decltype(&sglang::host::SymbolicSize::unwrap),
                         ConstMemFn<sglang::host::SymbolicSize, int64_t, sglang::host::DebugInfo>>)
C128_FACT(symbolic_device_ctor, "host::SymbolicDevice{}",
          std::is_default_constructible_v<sglang::host::SymbolicDevice>)
C128_PIN(symbolic_device_set_options, "host::SymbolicDevice::set_options<kDLCUDA>() -> void",
         static_cast<MemFn<typename P::SymbolicDevice, void>>(&P::SymbolicDevice::template set_options<kDLCUDA>))
C128_FACT(symbolic_device_unwrap, "host::SymbolicDevice::unwrap(DebugInfo = {}) const -> DLDevice",
          std::is_same_v<decltype(&sglang::host::SymbolicDevice::unwrap),
                         ConstMemFn<sglang::host::SymbolicDevice, DLDevice, sglang::host::DebugInfo>>)
C128_FACT(size_ref_from_int, "host::details::SizeRef(int64_t) (TensorMatcher({N, 16}))",
          std::is_constructible_v<sglang::host::details::SizeRef, int64_t>)
C128_FACT(size_ref_from_symbol, "host::details::SizeRef(SymbolicSize&)",
          std::is_constructible_v<sglang::host::details::SizeRef, sglang::host::SymbolicSize&>)
C128_FACT(device_ref_from_symbol, "host::details::DeviceRef(SymbolicDevice&)",
          std::is_constructible_v<sglang::host::details::DeviceRef, sglang::host::SymbolicDevice&>)
C128_FACT(tensor_matcher_ctor, "host::TensorMatcher(std::initializer_list<SizeRef>)",
          std::is_constructible_v<sglang::host::TensorMatcher, std::initializer_list<sglang::host::details::SizeRef>>)
C128_PIN(tensor_matcher_with_dtype, "host::TensorMatcher::with_dtype<T...>() && -> TensorMatcher&&",
         static_cast<RvalueMemFn<typename P::TensorMatcher, typename P::TensorMatcher&&>>(
             &P::TensorMatcher::template with_dtype<uint8_t>))
C128_PIN(tensor_matcher_with_device,
         "host::TensorMatcher::with_device<kDLCUDA>(DeviceRef&&) && -> TensorMatcher&& (restricts the symbol to CUDA)",
         static_cast<RvalueMemFn<typename P::TensorMatcher, typename P::TensorMatcher&&, typename P::DeviceRef&&>>(
             &P::TensorMatcher::template with_device<kDLCUDA>))
C128_FACT(tensor_matcher_verify,
          "host::TensorMatcher::verify(TensorView, DebugInfo = {}) const&& -> const TensorMatcher&&",
          std::is_same_v<decltype(&sglang::host::TensorMatcher::verify),
                         ConstRvalueMemFn<sglang::host::TensorMatcher, const sglang::host::TensorMatcher&&,
                                          tvm::ffi::TensorView, sglang::host::DebugInfo>>)

// ---- sgl_kernel/utils.cuh
C128_FACT(fp32_t, "fp32_t is float", std::is_same_v<sglang::fp32_t, float>)
C128_FACT(bf16_t, "bf16_t is __nv_bfloat16", std::is_same_v<sglang::bf16_t, __nv_bfloat16>)
C128_FACT(warp_threads, "device::kWarpThreads is a 32 of type const uint32_t",
          std::is_same_v<decltype(sglang::device::kWarpThreads), const uint32_t> &&
              sglang::device::kWarpThreads == 32)
C128_FACT(pdl_wait, "device::PDLWaitPrimary<bool>() -> void",
          std::is_same_v<decltype(sglang::device::PDLWaitPrimary<true>), void()>)
C128_FACT(pdl_trigger, "device::PDLTriggerSecondary<bool>() -> void",
          std::is_same_v<decltype(sglang::device::PDLTriggerSecondary<true>), void()>)
C128_FACT(launch_kernel_ctor, "host::LaunchKernel(dim3 grid, dim3 block, DLDevice, size_t smem = 0, DebugInfo = {})",
          std::is_constructible_v<sglang::host::LaunchKernel, dim3, dim3, DLDevice> &&
              std::is_constructible_v<sglang::host::LaunchKernel, dim3, dim3, DLDevice, std::size_t,
                                      sglang::host::DebugInfo>)
C128_FACT(launch_kernel_enable_pdl, "host::LaunchKernel::enable_pdl(bool = true) -> LaunchKernel&",
          std::is_same_v<decltype(&sglang::host::LaunchKernel::enable_pdl),
                         MemFn<sglang::host::LaunchKernel, sglang::host::LaunchKernel&, bool>>)
C128_PIN(launch_kernel_call, "host::LaunchKernel::operator()(T&& kernel, Args&&... args) const -> void",
         static_cast<ConstMemFn<typename P::LaunchKernel, void, KernelRef, const KernelParams&>>(
             &P::LaunchKernel::template operator()<KernelRef, const KernelParams&>))

// ---- sgl_kernel/type.cuh
C128_FACT(cast_bf16_to_float, "device::cast<float>(const bf16_t&) -> float",
          std::is_same_v<decltype(sglang::device::cast<float, sglang::bf16_t>), float(const sglang::bf16_t&)>)
C128_FACT(cast_float_to_bf16, "device::cast<bf16_t>(const float&) -> bf16_t",
          std::is_same_v<decltype(sglang::device::cast<sglang::bf16_t, float>), sglang::bf16_t(const float&)>)
C128_FACT(cast_float_to_float, "device::cast<float>(const float&) -> float",
          std::is_same_v<decltype(sglang::device::cast<float, float>), float(const float&)>)

// ---- sgl_kernel/vec.cuh (AlignedVector<float, 2>, <bf16_t, 2> as the verify kernel uses them)
C128_FACT(aligned_vector_layout, "device::AlignedVector<T, N> is N packed T, aligned to its size",
          sizeof(U::AlignedVector<float, 2>) == 8 && alignof(U::AlignedVector<float, 2>) == 8 &&
              sizeof(U::AlignedVector<sglang::bf16_t, 2>) == 4 && alignof(U::AlignedVector<sglang::bf16_t, 2>) == 4)
C128_FACT(aligned_vector_load, "device::AlignedVector<T, N>::load(const void*, int64_t offset = 0) -> void",
          std::is_same_v<decltype(&U::AlignedVector<float, 2>::load),
                         MemFn<U::AlignedVector<float, 2>, void, const void*, int64_t>>)
C128_FACT(aligned_vector_store, "device::AlignedVector<T, N>::store(void*, int64_t offset = 0) const -> void",
          std::is_same_v<decltype(&U::AlignedVector<float, 2>::store),
                         ConstMemFn<U::AlignedVector<float, 2>, void, void*, int64_t>>)
C128_PIN(aligned_vector_index, "device::AlignedVector<T, N>::operator[](std::size_t) -> T&",
         static_cast<MemFn<typename P::template AlignedVector<float, 2>, float&, std::size_t>>(
             &P::template AlignedVector<float, 2>::operator[]))

// ---- sgl_kernel/deepseek_v4/compress_v2.cuh (the plan rows upstream's compress kernels read)
C128_FACT(compress_plan_layout, "device::compress::CompressPlan is 16 bytes, aligned to 16",
          sizeof(U::CompressPlan) == 16 && alignof(U::CompressPlan) == 16)
C128_FACT(compress_plan_fields,
          "device::compress::CompressPlan{uint32 seq_len, uint16 ragged_id, uint16 buffer_len, "
          "int32 read_page_0, int32 read_page_1} at offsets 0, 4, 6, 8, 12",
          std::is_same_v<decltype(U::CompressPlan::seq_len), uint32_t> &&
              std::is_same_v<decltype(U::CompressPlan::ragged_id), uint16_t> &&
              std::is_same_v<decltype(U::CompressPlan::buffer_len), uint16_t> &&
              std::is_same_v<decltype(U::CompressPlan::read_page_0), int32_t> &&
              std::is_same_v<decltype(U::CompressPlan::read_page_1), int32_t> &&
              offsetof(U::CompressPlan, seq_len) == 0 && offsetof(U::CompressPlan, ragged_id) == 4 &&
              offsetof(U::CompressPlan, buffer_len) == 6 && offsetof(U::CompressPlan, read_page_0) == 8 &&
              offsetof(U::CompressPlan, read_page_1) == 12)
C128_FACT(compress_plan_invalid, "device::compress::CompressPlan::invalid() -> CompressPlan (static)",
          std::is_same_v<decltype(&U::CompressPlan::invalid), U::CompressPlan (*)()>)
