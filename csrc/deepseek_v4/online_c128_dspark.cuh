// Online C128 compressor kernels for DSPARK's ragged target verify.
//
// Upstream's MTP kernels (online_c128_mtp.cuh) assume W <= 8 verify tokens per
// request at `bid * W + step` and commit lazily at the next forward. DSPARK
// verifies per-row lengths, packed ragged, padded to CUDA-graph token buckets
// with zero-length rows, and knows the accepted lengths on the device right
// after accept. This file provides, for that layout:
//
//   run_plan         device-only verify plan: one CompressPlan per 128-chunk that
//                    closes inside a row's verify window (the layout upstream's
//                    online prefill planner + stage 1 produce), plus per-row
//                    metadata. One block, block-wide scan; CUDA-graph safe.
//   run_verify       fused verify: fold each row's verify tokens from the committed
//                    state (bank 0), write bank k = state after k tokens, and emit
//                    the pooled kv of every chunk that closes in the window.
//   run_write_prefix the same fold without the emit (banks only).
//   run_commit       after accept: bank[accept] -> bank 0, all layers, one launch.
//
// State row layout (as upstream's online state): `[max | sum | kv]`, 3 * head_dim
// elements, `kv` normalized, `sum = sum exp(score - max)`, per channel. Row
// `rid + k * state_slot_stride` is bank k of request slot `rid`; bank 0 is the
// committed state and is only written by `run_commit`.
//
// Every device-side index that could leave its tensor (a bad extend_start_loc,
// verify_len, req_pool_index or seq_len) is clamped or skipped on the device by one
// function, `load_row_window`, which all four kernels use with the same packed-input
// size `num_q_tokens` and the same request-slot bound `max_num_reqs` (upstream's one
// max_num_reqs per entry point): the plan, the verify, the write prefix and the commit
// agree on every row's window (the commit accepts at most the tokens the verify folded,
// so it never copies a bank this verify did not write, and a slot the verify wrote is
// one the commit commits). A bad entry of the commit's layer pointer table traps.
//
// Request slots must be distinct among rows with a non-empty window. Rows that share
// a slot (e.g. padding rows on slot 0 given a length) are memory safe but race: each
// emitted row is still exact (it folds from bank 0, which only the commit writes), a
// bank row both write holds one writer's value per vector access, and the commit of
// that slot copies each 16-byte vector from one of the candidate banks
// (tests/gpu/test_dspark_kernels.py: test_duplicate_slots_race_within_their_own_rows).
//
// Upstream helpers: only those whose signatures are the same on every supported
// release (ci/kernel_probe/upstream_signatures.cu pins each one); the warp scan is
// our own (`warp::inclusive_sum` takes (lane_id, val) on 0.5.20, (val, lane_id) later).
//
// PDL: the verify kernels read the per-row metadata (seq_lens, verify_lens,
// extend_start_loc, req_pool_indices) and ape before griddepcontrol.wait, as
// upstream's c4/c128 prefill kernels read their plans: these must not be written
// by the kernel launched right before. kv_score_input, the state and the plan's
// row_emit are read after the wait.

#pragma once

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>

#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/vec.cuh>

#include <sgl_kernel/deepseek_v4/compress_v2.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace sglang {

namespace device::dspark_c128 {

using device::compress::CompressPlan;

inline constexpr int64_t kChunk = 128;
/// \brief Largest `num_banks` accepted (bounds the per-row emit count and the plan scan).
inline constexpr int64_t kMaxBanks = 1024;
/// \brief Largest batch the plan accepts (keeps the int32 emit scan far from overflow).
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;
/// \brief Largest packed input (CompressPlan::ragged_id is uint16).
inline constexpr int64_t kMaxQTokens = int64_t{1} << 16;

/// \brief One row's verify window after every device-side clamp.
struct RowWindow {
  int64_t seq_before;  // committed length before verify
  int64_t rid;         // request slot (bank 0 row)
  int32_t start;       // packed index of the first verify token
  int32_t len;         // tokens folded, 0 = row skipped
};

/// \brief Clamp one row: len = clamp(verify_len, 0, num_banks), cut to the input,
/// 0 when the slot, the start or the seq len is out of range. Shared by plan and verify.
SGL_DEVICE RowWindow load_row_window(
    const int64_t* __restrict__ seq_lens,
    const int32_t* __restrict__ lens,
    const int32_t* __restrict__ extend_start_loc,
    const int64_t* __restrict__ req_pool_indices,
    const uint32_t row,
    const int32_t num_banks,
    const int32_t num_tokens,
    const int64_t num_slots) {
  const int64_t seq_before = seq_lens[row];
  const int64_t rid = req_pool_indices[row];
  const int32_t start = extend_start_loc[row];
  const int32_t raw_len = lens[row];
  int32_t len = raw_len < 0 ? 0 : (raw_len > num_banks ? num_banks : raw_len);
  const bool valid = seq_before >= 0 && seq_before <= std::numeric_limits<int32_t>::max() - kMaxBanks && rid >= 0 &&
                     rid < num_slots && start >= 0 && start < num_tokens;
  if (!valid) {
    len = 0;
  } else if (len > num_tokens - start) {
    len = num_tokens - start;
  }
  return RowWindow{seq_before, rid, start, len};
}

/// \brief Inclusive prefix sum over the lanes of a full warp, in lane order.
SGL_DEVICE int32_t warp_inclusive_sum(int32_t value, const uint32_t lane_id) {
  static_assert(device::kWarpThreads == 32);
#pragma unroll
  for (uint32_t offset = 1; offset < device::kWarpThreads; offset *= 2) {
    const int32_t up = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane_id >= offset) value += up;
  }
  return value;
}

/// \brief Number of 128-chunks that close inside `[seq_before, seq_before + len)`.
SGL_DEVICE int32_t num_closing_chunks(const RowWindow& w) {
  return static_cast<int32_t>((w.seq_before + w.len) / kChunk - w.seq_before / kChunk);
}

/// \brief Online-softmax state of one channel.
struct OnlineState {
  float max;
  float sum;
  float kv;

  SGL_DEVICE void reset(const float score, const float value) {
    max = score;
    sum = 1.0f;
    kv = value;
  }

  /// \brief Fold one token (same update as upstream's online decode / MTP write-prefix).
  SGL_DEVICE void fold(const float score, const float value) {
    const float new_max = fmaxf(max, score);
    const float old_scaled = sum * __expf(max - new_max);
    const float new_exp = __expf(score - new_max);
    const float new_sum = old_scaled + new_exp;
    kv = (kv * old_scaled + value * new_exp) / new_sum;
    max = new_max;
    sum = new_sum;
  }
};

}  // namespace device::dspark_c128

// ---------------------------------------------------------------------------
// Plan kernel: one block; rows are scanned in tiles of the block size.
// ---------------------------------------------------------------------------

struct DsparkC128PlanParams {
  const int64_t* __restrict__ seq_lens;
  const int32_t* __restrict__ verify_lens;
  const int32_t* __restrict__ extend_start_loc;
  const int64_t* __restrict__ req_pool_indices;
  device::compress::CompressPlan* __restrict__ plan_c;  // [num_q_tokens]
  device::compress::CompressPlan* __restrict__ plan_w;  // [num_q_tokens], all invalid
  int32_t* __restrict__ row_emit;                       // [batch_size] first plan_c index of the row
  int32_t* __restrict__ row_len;                        // [batch_size] clamped verify length
  uint32_t batch_size;
  int32_t num_q_tokens;
  int32_t num_banks;
  int32_t state_slot_offset;
  int64_t max_num_reqs;  // request slots [0, max_num_reqs) are planned; the commit takes the same bound
};

inline constexpr uint32_t kDsparkPlanBlockSize = 1024;

template <bool kUsePDL>
__global__ __launch_bounds__(kDsparkPlanBlockSize, 1)  //
    void dspark_c128_plan_kernel(const __grid_constant__ DsparkC128PlanParams params) {
  using namespace device;
  using namespace device::dspark_c128;
  constexpr uint32_t kNumWarps = kDsparkPlanBlockSize / kWarpThreads;
  __shared__ int32_t s_warp_prefix[kNumWarps];
  __shared__ int32_t s_tile_total;

  const uint32_t tx = threadIdx.x;
  const uint32_t lane_id = tx % kWarpThreads;
  const uint32_t warp_id = tx / kWarpThreads;
  const int32_t num_q = params.num_q_tokens;

  // Inputs come from earlier kernels, and the plan tensors may still be read by
  // the previous step's consumers: wait before touching either.
  PDLWaitPrimary<kUsePDL>();

  // Every entry starts invalid; the rows then overwrite their own plan_c entries.
  for (int32_t k = static_cast<int32_t>(tx); k < num_q; k += kDsparkPlanBlockSize) {
    params.plan_w[k] = CompressPlan::invalid();
    params.plan_c[k] = CompressPlan::invalid();
  }
  __syncthreads();

  int32_t carry = 0;  // plan_c entries of the previous tiles (same value in every thread)
  for (uint32_t tile = 0; tile < params.batch_size; tile += kDsparkPlanBlockSize) {
    const uint32_t row = tile + tx;
    RowWindow w{0, 0, 0, 0};
    int32_t num_emit = 0;
    if (row < params.batch_size) {
      w = load_row_window(
          params.seq_lens,
          params.verify_lens,
          params.extend_start_loc,
          params.req_pool_indices,
          row,
          params.num_banks,
          num_q,
          params.max_num_reqs);
      num_emit = num_closing_chunks(w);
    }

    // Block-wide exclusive scan of num_emit.
    const int32_t incl = warp_inclusive_sum(num_emit, lane_id);
    if (lane_id == kWarpThreads - 1) s_warp_prefix[warp_id] = incl;
    __syncthreads();
    if (warp_id == 0) {
      const int32_t warp_total = s_warp_prefix[lane_id];
      const int32_t warp_incl = warp_inclusive_sum(warp_total, lane_id);
      s_warp_prefix[lane_id] = warp_incl - warp_total;
      if (lane_id == kWarpThreads - 1) s_tile_total = warp_incl;
    }
    __syncthreads();
    const int32_t first = carry + s_warp_prefix[warp_id] + incl - num_emit;

    if (row < params.batch_size) {
      params.row_emit[row] = first;
      params.row_len[row] = w.len;
      const int64_t first_close = (w.seq_before / kChunk + 1) * kChunk - 1;
      for (int32_t j = 0; j < num_emit; ++j) {
        const int32_t idx = first + j;
        // Only reachable with overlapping (invalid) windows or a broken scan: never write outside plan_c.
        if (idx < 0) continue;
        if (idx >= num_q) break;
        const int64_t last_pos = first_close + j * kChunk;
        const int64_t seg_begin = last_pos - (kChunk - 1) > w.seq_before ? last_pos - (kChunk - 1) : w.seq_before;
        params.plan_c[idx] = CompressPlan{
            .seq_len = static_cast<uint32_t>(last_pos + 1),
            .ragged_id = static_cast<uint16_t>(w.start + (last_pos - w.seq_before)),
            .buffer_len = static_cast<uint16_t>(last_pos - seg_begin + 1),
            .read_page_0 = static_cast<int32_t>(w.rid) + params.state_slot_offset,
            .read_page_1 = static_cast<int32_t>(w.rid),
        };
      }
    }
    carry += s_tile_total;
    __syncthreads();  // s_warp_prefix / s_tile_total are reused by the next tile
  }
}

// ---------------------------------------------------------------------------
// Verify kernel: one block per (row, channel slice); each thread folds kVec
// channels over the row's verify tokens, kTokenTile tokens loaded at a time.
// ---------------------------------------------------------------------------

struct DsparkC128VerifyParams {
  const float* __restrict__ kv_score_input;  // [num_tokens, head_dim * 2] (kv | score)
  const float* __restrict__ ape;             // [128, head_dim]
  void* __restrict__ state;                  // [rows, head_dim * 3] (max | sum | kv)
  float* __restrict__ out;                   // [num_out, head_dim], emit only
  const int64_t* __restrict__ seq_lens;
  const int32_t* __restrict__ lens;  // verify_lens, clamped as the plan clamps them
  const int32_t* __restrict__ extend_start_loc;
  const int64_t* __restrict__ req_pool_indices;
  const int32_t* __restrict__ row_emit;  // emit only
  uint32_t batch_size;
  int32_t num_tokens;
  int32_t num_out;
  int32_t num_banks;
  int64_t state_slot_stride;
  int64_t max_num_reqs;  // the plan's and the commit's slot bound
};

inline constexpr uint32_t kDsparkVerifyThreads = 32;
inline constexpr uint32_t kDsparkVerifyVec = 2;
inline constexpr int32_t kDsparkTokenTile = 8;

template <int64_t kHeadDim, typename BufferFloat, bool kUsePDL, bool kEmit>
__global__ __launch_bounds__(kDsparkVerifyThreads)  //
    void dspark_c128_verify_kernel(const __grid_constant__ DsparkC128VerifyParams params) {
  using namespace device;
  using namespace device::dspark_c128;
  constexpr uint32_t kVec = kDsparkVerifyVec;
  constexpr uint32_t kSliceDim = kDsparkVerifyThreads * kVec;
  constexpr uint32_t kNumSlices = kHeadDim / kSliceDim;
  constexpr int32_t kTile = kDsparkTokenTile;
  static_assert(kHeadDim % kSliceDim == 0);
  using InVec = AlignedVector<float, kVec>;
  using StateVec = AlignedVector<BufferFloat, kVec>;

  const uint32_t row = blockIdx.x / kNumSlices;
  const uint32_t slice = blockIdx.x % kNumSlices;
  if (row >= params.batch_size) return;

  // Row metadata and ape are ready before the forward (upstream's c4/c128 kernels read
  // their plans the same way): read them while the previous kernel drains.
  const auto w = load_row_window(
      params.seq_lens,
      params.lens,
      params.extend_start_loc,
      params.req_pool_indices,
      row,
      params.num_banks,
      params.num_tokens,
      params.max_num_reqs);
  if (w.len == 0) return;

  const int64_t channel = static_cast<int64_t>(slice) * kSliceDim + threadIdx.x * kVec;
  auto* const state = static_cast<BufferFloat*>(params.state);
  InVec kv[kTile];
  InVec score[kTile];
  InVec bias[kTile];
  const auto load_bias = [&](const int32_t base) {
#pragma unroll
    for (int32_t t = 0; t < kTile; ++t) {
      if (base + t < w.len) bias[t].load(params.ape + ((w.seq_before + base + t) % kChunk) * kHeadDim + channel);
    }
  };
  const auto load_tokens = [&](const int32_t base) {
#pragma unroll
    for (int32_t t = 0; t < kTile; ++t) {
      if (base + t < w.len) {
        const float* const src = params.kv_score_input + (static_cast<int64_t>(w.start) + base + t) * (kHeadDim * 2);
        kv[t].load(src + channel);
        score[t].load(src + kHeadDim + channel);
      }
    }
  };
  load_bias(0);

  PDLWaitPrimary<kUsePDL>();  // kv_score_input, bank 0 and row_emit may come from the kernels just before

  int32_t emit_idx = 0;
  if constexpr (kEmit) emit_idx = params.row_emit[row];
  load_tokens(0);  // every load of the first tile is in flight before the first use

  OnlineState run[kVec];
  if (w.seq_before % kChunk != 0) {
    // Continue the committed partial chunk (bank 0, read only).
    const BufferFloat* const bank0 = state + w.rid * (kHeadDim * 3) + channel;
    StateVec m, s, k;
    m.load(bank0);
    s.load(bank0 + kHeadDim);
    k.load(bank0 + kHeadDim * 2);
#pragma unroll
    for (uint32_t i = 0; i < kVec; ++i) {
      run[i] = OnlineState{cast<float>(m[i]), cast<float>(s[i]), cast<float>(k[i])};
    }
  } else {
#pragma unroll
    for (uint32_t i = 0; i < kVec; ++i) {
      run[i] = OnlineState{0.0f, 0.0f, 0.0f};  // never read: the first token restarts the chunk
    }
  }
  PDLTriggerSecondary<kUsePDL>();

  for (int32_t base = 0;;) {
#pragma unroll
    for (int32_t t = 0; t < kTile; ++t) {
      if (base + t < w.len) {
        const int64_t step = base + t;
        const int64_t pos = (w.seq_before + step) % kChunk;
#pragma unroll
        for (uint32_t i = 0; i < kVec; ++i) {
          const float sc = score[t][i] + bias[t][i];
          if (pos == 0) {
            run[i].reset(sc, kv[t][i]);
          } else {
            run[i].fold(sc, kv[t][i]);
          }
        }
        if (pos != kChunk - 1) {
          // Bank step+1 = state after step+1 tokens (skipped at a closing position).
          BufferFloat* const dst = state + (w.rid + (step + 1) * params.state_slot_stride) * (kHeadDim * 3) + channel;
          StateVec m, s, k;
#pragma unroll
          for (uint32_t i = 0; i < kVec; ++i) {
            m[i] = cast<BufferFloat>(run[i].max);
            s[i] = cast<BufferFloat>(run[i].sum);
            k[i] = cast<BufferFloat>(run[i].kv);
          }
          m.store(dst);
          s.store(dst + kHeadDim);
          k.store(dst + kHeadDim * 2);
        } else if constexpr (kEmit) {
          // The chunk closes: emit its pooled kv to the plan_c row of this chunk.
          if (emit_idx >= 0 && emit_idx < params.num_out) {
            InVec o;
#pragma unroll
            for (uint32_t i = 0; i < kVec; ++i) {
              o[i] = run[i].kv;
            }
            o.store(params.out + static_cast<int64_t>(emit_idx) * kHeadDim + channel);
          }
          ++emit_idx;
        }
      }
    }
    base += kTile;
    if (base >= w.len) break;
    load_bias(base);
    load_tokens(base);
  }
}

// ---------------------------------------------------------------------------
// Commit kernel: grid (row, layer); copies bank[accept] -> bank 0 with 16-byte
// vectors. Layers are addressed through a device table of state base pointers.
// ---------------------------------------------------------------------------

struct DsparkC128CommitParams {
  const int64_t* __restrict__ state_ptrs;  // [num_layers] base address of each layer's state
  const int64_t* __restrict__ seq_lens;    // before verify
  const int64_t* __restrict__ new_seq_lens;
  const int32_t* __restrict__ verify_lens;
  const int32_t* __restrict__ extend_start_loc;
  const int64_t* __restrict__ req_pool_indices;
  uint32_t batch_size;
  int32_t num_tokens;  // the verify's num_q_tokens: windows are clamped as the verify clamped them
  int32_t num_banks;
  int64_t state_slot_stride;
  int64_t max_num_reqs;
  int64_t row_vecs;  // 16-byte vectors per state row
};

inline constexpr uint32_t kDsparkCommitThreads = 128;
inline constexpr uint32_t kDsparkCommitUnroll = 4;

template <bool kUsePDL>
__global__ __launch_bounds__(kDsparkCommitThreads)  //
    void dspark_c128_commit_kernel(const __grid_constant__ DsparkC128CommitParams params) {
  using namespace device;
  using namespace device::dspark_c128;
  const uint32_t row = blockIdx.x;
  const uint32_t layer = blockIdx.y;
  if (row >= params.batch_size) return;

  PDLWaitPrimary<kUsePDL>();

  // Every row and layer input at once: one round trip before the copy.
  const int64_t seq_after = params.new_seq_lens[row];
  const auto base_addr = static_cast<uintptr_t>(params.state_ptrs[layer]);
  // The verify's own window of this row (slots past max_num_reqs are not committed):
  // banks 1..w.len are the ones this verify wrote.
  const auto w = load_row_window(
      params.seq_lens,
      params.verify_lens,
      params.extend_start_loc,
      params.req_pool_indices,
      row,
      params.num_banks,
      params.num_tokens,
      params.max_num_reqs);
  const int64_t rid = w.rid;
  const int64_t seq_before = w.seq_before;
  const int64_t delta = seq_after - seq_before;
  const int64_t accept = delta < 0 ? 0 : (delta > w.len ? w.len : delta);
  // Nothing accepted, or the accepted prefix closes a chunk: bank 0 is stale but
  // the next token restarts the chunk (upstream's MTP commit rule).
  // A bad table entry is a broken caller (make_state_ptr_table checks what it builds):
  // stop the launch loudly rather than skip the layer's commit.
  if (base_addr == 0 || base_addr % 16 != 0) __trap();
  if (accept == 0 || (seq_before + accept) % kChunk == 0) return;

  PDLTriggerSecondary<kUsePDL>();

  auto* const base = reinterpret_cast<uint4*>(base_addr);
  const uint4* const src = base + (rid + accept * params.state_slot_stride) * params.row_vecs;
  uint4* const dst = base + rid * params.row_vecs;
  for (int64_t i0 = threadIdx.x; i0 < params.row_vecs; i0 += kDsparkCommitThreads * kDsparkCommitUnroll) {
    uint4 tmp[kDsparkCommitUnroll];
#pragma unroll
    for (uint32_t u = 0; u < kDsparkCommitUnroll; ++u) {
      const int64_t i = i0 + u * kDsparkCommitThreads;
      if (i < params.row_vecs) tmp[u] = src[i];
    }
#pragma unroll
    for (uint32_t u = 0; u < kDsparkCommitUnroll; ++u) {
      const int64_t i = i0 + u * kDsparkCommitThreads;
      if (i < params.row_vecs) dst[i] = tmp[u];
    }
  }
}

// ---------------------------------------------------------------------------
// Host entries.
// ---------------------------------------------------------------------------

template <int64_t kHeadDim, typename BufferFloat, bool kUsePDL>
struct DsparkC128Kernel {
  static_assert(kHeadDim == 512, "online c128 DSPARK kernels only support head_dim=512");
  static_assert(std::is_same_v<BufferFloat, fp32_t> || std::is_same_v<BufferFloat, bf16_t>);
  static constexpr int64_t kStateDim = kHeadDim * 3;
  static constexpr uint32_t kNumSlices = kHeadDim / (kDsparkVerifyThreads * kDsparkVerifyVec);
  template <bool kEmit>
  static constexpr auto verify_kernel = dspark_c128_verify_kernel<kHeadDim, BufferFloat, kUsePDL, kEmit>;

  /// \brief Checks shared by the entries on the per-row tensors. `.template with_device<kDLCUDA>(sym)`,
  /// not upstream's `.with_device(sym)`: that form resets the symbol's options to any device, so a
  /// CPU tensor would pass where CUDA is required. (`ensure_alignment` exists on 0.5.23 only:
  /// check_aligned below instead.)
  static void verify_row_tensors(
      const tvm::ffi::TensorView seq_lens,
      const tvm::ffi::TensorView lens,
      const tvm::ffi::TensorView extend_start_loc,
      const tvm::ffi::TensorView req_pool_indices,
      host::SymbolicSize& B,
      host::SymbolicDevice& device_) {
    using namespace host;
    TensorMatcher({B}).with_dtype<int64_t>().template with_device<kDLCUDA>(device_).verify(seq_lens);
    TensorMatcher({B}).with_dtype<int32_t>().template with_device<kDLCUDA>(device_).verify(lens);
    TensorMatcher({B}).with_dtype<int32_t>().template with_device<kDLCUDA>(device_).verify(extend_start_loc);
    TensorMatcher({B}).with_dtype<int64_t>().template with_device<kDLCUDA>(device_).verify(req_pool_indices);
    RuntimeCheck(
        B.unwrap() <= device::dspark_c128::kMaxBatch,
        "dspark c128: batch size ",
        B.unwrap(),
        " exceeds the limit ",
        device::dspark_c128::kMaxBatch);
  }

  /// \brief The kernels use vector accesses; contiguous rows of these widths keep every row aligned.
  static void check_aligned(const tvm::ffi::TensorView t, const char* name) {
    host::RuntimeCheck(
        reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "dspark c128: ", name, " must be 16-byte aligned");
  }

  static void check_num_banks(const int64_t num_banks) {
    using device::dspark_c128::kMaxBanks;
    host::RuntimeCheck(
        num_banks >= 1 && num_banks <= kMaxBanks, "dspark c128: num_banks must be in [1, ", kMaxBanks, "], got ", num_banks);
  }

  static void check_banks(int64_t num_banks, int64_t state_slot_stride, int64_t state_rows) {
    using namespace host;
    check_num_banks(num_banks);
    RuntimeCheck(state_slot_stride >= 1, "dspark c128: state_slot_stride must be positive, got ", state_slot_stride);
    RuntimeCheck(
        state_slot_stride <= std::numeric_limits<int32_t>::max() / (num_banks + 1),
        "dspark c128: state_slot_stride ",
        state_slot_stride,
        " too large for ",
        num_banks,
        " banks (int32 slot ids)");
    RuntimeCheck(
        (num_banks + 1) * state_slot_stride <= state_rows,
        "dspark c128: state has ",
        state_rows,
        " rows but ",
        num_banks + 1,
        " banks of stride ",
        state_slot_stride,
        " need ",
        (num_banks + 1) * state_slot_stride);
  }

  /// \brief The one request-slot bound of plan, verify, write prefix and commit.
  static void check_max_num_reqs(const int64_t max_num_reqs, const int64_t state_slot_stride, const char* what) {
    host::RuntimeCheck(
        max_num_reqs >= 0 && max_num_reqs <= state_slot_stride,
        "dspark c128 ",
        what,
        ": max_num_reqs ",
        max_num_reqs,
        " must be in [0, state_slot_stride=",
        state_slot_stride,
        "]");
  }

  /// \brief Device-only verify plan (see the file comment). plan_c / plan_w are
  /// `[num_q_tokens, 16]` uint8, row_emit / row_len `[batch_size]` int32.
  static void run_plan(
      const tvm::ffi::TensorView seq_lens,
      const tvm::ffi::TensorView verify_lens,
      const tvm::ffi::TensorView extend_start_loc,
      const tvm::ffi::TensorView req_pool_indices,
      const tvm::ffi::TensorView plan_c,
      const tvm::ffi::TensorView plan_w,
      const tvm::ffi::TensorView row_emit,
      const tvm::ffi::TensorView row_len,
      const int64_t num_banks,
      const int64_t state_slot_offset,
      const int64_t max_num_reqs) {
    using namespace host;
    using device::dspark_c128::kMaxQTokens;
    auto B = SymbolicSize{"batch_size"};
    auto N = SymbolicSize{"num_q_tokens"};
    auto device_ = SymbolicDevice{};
    device_.set_options<kDLCUDA>();

    verify_row_tensors(seq_lens, verify_lens, extend_start_loc, req_pool_indices, B, device_);
    TensorMatcher({N, sizeof(device::compress::CompressPlan)})
        .with_dtype<uint8_t>()
        .template with_device<kDLCUDA>(device_)
        .verify(plan_c)
        .verify(plan_w);
    TensorMatcher({B}).with_dtype<int32_t>().template with_device<kDLCUDA>(device_).verify(row_emit).verify(row_len);
    RuntimeCheck(
        N.unwrap() <= kMaxQTokens,
        "dspark c128 plan: num_q_tokens ",
        N.unwrap(),
        " exceeds ",
        kMaxQTokens,
        " (CompressPlan.ragged_id is uint16)");
    check_num_banks(num_banks);
    RuntimeCheck(
        state_slot_offset >= 1 && state_slot_offset <= std::numeric_limits<int32_t>::max() / 2,
        "dspark c128 plan: state_slot_offset must be in [1, INT32_MAX / 2], got ",
        state_slot_offset);
    check_max_num_reqs(max_num_reqs, state_slot_offset, "plan");

    const auto batch_size = static_cast<uint32_t>(B.unwrap());
    const auto num_q_tokens = static_cast<int32_t>(N.unwrap());
    if (batch_size == 0 && num_q_tokens == 0) return;
    const auto params = DsparkC128PlanParams{
        .seq_lens = static_cast<const int64_t*>(seq_lens.data_ptr()),
        .verify_lens = static_cast<const int32_t*>(verify_lens.data_ptr()),
        .extend_start_loc = static_cast<const int32_t*>(extend_start_loc.data_ptr()),
        .req_pool_indices = static_cast<const int64_t*>(req_pool_indices.data_ptr()),
        .plan_c = static_cast<device::compress::CompressPlan*>(plan_c.data_ptr()),
        .plan_w = static_cast<device::compress::CompressPlan*>(plan_w.data_ptr()),
        .row_emit = static_cast<int32_t*>(row_emit.data_ptr()),
        .row_len = static_cast<int32_t*>(row_len.data_ptr()),
        .batch_size = batch_size,
        .num_q_tokens = num_q_tokens,
        .num_banks = static_cast<int32_t>(num_banks),
        .state_slot_offset = static_cast<int32_t>(state_slot_offset),
        .max_num_reqs = max_num_reqs,
    };
    LaunchKernel(1, kDsparkPlanBlockSize, device_.unwrap())  //
        .enable_pdl(kUsePDL)(dspark_c128_plan_kernel<kUsePDL>, params);
  }

  template <bool kEmit>
  static void launch_verify(const DsparkC128VerifyParams& params, DLDevice device) {
    if (params.batch_size == 0) return;
    host::LaunchKernel(params.batch_size * kNumSlices, kDsparkVerifyThreads, device)  //
        .enable_pdl(kUsePDL)(verify_kernel<kEmit>, params);
  }

  static void verify_io_tensors(
      const tvm::ffi::TensorView state,
      const tvm::ffi::TensorView kv_score_input,
      const tvm::ffi::TensorView ape,
      host::SymbolicSize& T,
      host::SymbolicDevice& device_) {
    using namespace host;
    TensorMatcher({-1, kStateDim})  // (max | sum | kv), one row per slot and bank
        .with_dtype<BufferFloat>()
        .template with_device<kDLCUDA>(device_)
        .verify(state);
    TensorMatcher({T, kHeadDim * 2})  // kv | score, packed ragged
        .with_dtype<float>()
        .template with_device<kDLCUDA>(device_)
        .verify(kv_score_input);
    TensorMatcher({128, kHeadDim})
        .with_dtype<float>()
        .template with_device<kDLCUDA>(device_)
        .verify(ape);
    check_aligned(state, "state");
    check_aligned(kv_score_input, "kv_score_input");
    check_aligned(ape, "ape");
    RuntimeCheck(
        T.unwrap() <= std::numeric_limits<int32_t>::max(), "dspark c128: kv_score_input has too many rows: ", T.unwrap());
  }

  /// \brief Fused verify: banks 1..len plus the pooled kv of every closing chunk,
  /// written to `out[row_emit[b] + j]` (the plan_c rows). Takes the plan's inputs
  /// (verify_lens as given: the kernel clamps them as the plan did).
  static void run_verify(
      const tvm::ffi::TensorView state,
      const tvm::ffi::TensorView kv_score_input,
      const tvm::ffi::TensorView ape,
      const tvm::ffi::TensorView out,
      const tvm::ffi::TensorView plan_c,
      const tvm::ffi::TensorView seq_lens,
      const tvm::ffi::TensorView extend_start_loc,
      const tvm::ffi::TensorView req_pool_indices,
      const tvm::ffi::TensorView verify_lens,
      const tvm::ffi::TensorView row_emit,
      const int64_t num_banks,
      const int64_t state_slot_stride,
      const int64_t max_num_reqs) {
    using namespace host;
    auto B = SymbolicSize{"batch_size"};
    auto N = SymbolicSize{"num_q_tokens"};
    auto T = SymbolicSize{"num_input_rows"};
    auto device_ = SymbolicDevice{};
    device_.set_options<kDLCUDA>();

    verify_io_tensors(state, kv_score_input, ape, T, device_);
    verify_row_tensors(seq_lens, verify_lens, extend_start_loc, req_pool_indices, B, device_);
    TensorMatcher({B}).with_dtype<int32_t>().template with_device<kDLCUDA>(device_).verify(row_emit);
    TensorMatcher({N, sizeof(device::compress::CompressPlan)})
        .with_dtype<uint8_t>()
        .template with_device<kDLCUDA>(device_)
        .verify(plan_c);
    TensorMatcher({N, kHeadDim}).with_dtype<float>().template with_device<kDLCUDA>(device_).verify(out);
    check_aligned(out, "out");
    check_banks(num_banks, state_slot_stride, state.size(0));
    check_max_num_reqs(max_num_reqs, state_slot_stride, "verify");
    RuntimeCheck(
        T.unwrap() >= N.unwrap(),
        "dspark c128 verify: kv_score_input has ",
        T.unwrap(),
        " rows, fewer than the plan's num_q_tokens ",
        N.unwrap());

    launch_verify<true>(
        DsparkC128VerifyParams{
            .kv_score_input = static_cast<const float*>(kv_score_input.data_ptr()),
            .ape = static_cast<const float*>(ape.data_ptr()),
            .state = state.data_ptr(),
            .out = static_cast<float*>(out.data_ptr()),
            .seq_lens = static_cast<const int64_t*>(seq_lens.data_ptr()),
            .lens = static_cast<const int32_t*>(verify_lens.data_ptr()),
            .extend_start_loc = static_cast<const int32_t*>(extend_start_loc.data_ptr()),
            .req_pool_indices = static_cast<const int64_t*>(req_pool_indices.data_ptr()),
            .row_emit = static_cast<const int32_t*>(row_emit.data_ptr()),
            .batch_size = static_cast<uint32_t>(B.unwrap()),
            .num_tokens = static_cast<int32_t>(N.unwrap()),
            .num_out = static_cast<int32_t>(N.unwrap()),
            .num_banks = static_cast<int32_t>(num_banks),
            .state_slot_stride = state_slot_stride,
            .max_num_reqs = max_num_reqs,
        },
        device_.unwrap());
  }

  /// \brief The packed-input size every kernel clamps the windows to (the verify's plan rows).
  static void check_num_q_tokens(const int64_t num_q_tokens, const char* what) {
    host::RuntimeCheck(
        num_q_tokens >= 0 && num_q_tokens <= device::dspark_c128::kMaxQTokens,
        "dspark c128 ",
        what,
        ": num_q_tokens must be in [0, ",
        device::dspark_c128::kMaxQTokens,
        "], got ",
        num_q_tokens);
  }

  /// \brief Standalone ragged write-prefix: banks 1..len only, windows clamped to
  /// `num_q_tokens` packed rows as the plan and the fused verify clamp them.
  static void run_write_prefix(
      const tvm::ffi::TensorView state,
      const tvm::ffi::TensorView kv_score_input,
      const tvm::ffi::TensorView ape,
      const tvm::ffi::TensorView seq_lens,
      const tvm::ffi::TensorView verify_lens,
      const tvm::ffi::TensorView extend_start_loc,
      const tvm::ffi::TensorView req_pool_indices,
      const int64_t num_banks,
      const int64_t state_slot_stride,
      const int64_t num_q_tokens,
      const int64_t max_num_reqs) {
    using namespace host;
    auto B = SymbolicSize{"batch_size"};
    auto T = SymbolicSize{"num_input_rows"};
    auto device_ = SymbolicDevice{};
    device_.set_options<kDLCUDA>();

    verify_io_tensors(state, kv_score_input, ape, T, device_);
    verify_row_tensors(seq_lens, verify_lens, extend_start_loc, req_pool_indices, B, device_);
    check_banks(num_banks, state_slot_stride, state.size(0));
    check_num_q_tokens(num_q_tokens, "write prefix");
    check_max_num_reqs(max_num_reqs, state_slot_stride, "write prefix");
    RuntimeCheck(
        T.unwrap() >= num_q_tokens,
        "dspark c128 write prefix: kv_score_input has ",
        T.unwrap(),
        " rows, fewer than num_q_tokens ",
        num_q_tokens);

    launch_verify<false>(
        DsparkC128VerifyParams{
            .kv_score_input = static_cast<const float*>(kv_score_input.data_ptr()),
            .ape = static_cast<const float*>(ape.data_ptr()),
            .state = state.data_ptr(),
            .out = nullptr,
            .seq_lens = static_cast<const int64_t*>(seq_lens.data_ptr()),
            .lens = static_cast<const int32_t*>(verify_lens.data_ptr()),
            .extend_start_loc = static_cast<const int32_t*>(extend_start_loc.data_ptr()),
            .req_pool_indices = static_cast<const int64_t*>(req_pool_indices.data_ptr()),
            .row_emit = nullptr,
            .batch_size = static_cast<uint32_t>(B.unwrap()),
            .num_tokens = static_cast<int32_t>(num_q_tokens),
            .num_out = 0,
            .num_banks = static_cast<int32_t>(num_banks),
            .state_slot_stride = state_slot_stride,
            .max_num_reqs = max_num_reqs,
        },
        device_.unwrap());
  }

  /// \brief Commit after accept, every layer in one launch. `state_ptrs` holds the
  /// base address of each layer's `[num_state_rows, row_elems]` BufferFloat state.
  /// Takes the verify's row inputs and `num_q_tokens`: a row accepts at most the
  /// tokens of its verified window.
  static void run_commit(
      const tvm::ffi::TensorView state_ptrs,
      const tvm::ffi::TensorView seq_lens,
      const tvm::ffi::TensorView new_seq_lens,
      const tvm::ffi::TensorView verify_lens,
      const tvm::ffi::TensorView extend_start_loc,
      const tvm::ffi::TensorView req_pool_indices,
      const int64_t num_q_tokens,
      const int64_t num_banks,
      const int64_t state_slot_stride,
      const int64_t max_num_reqs,
      const int64_t num_state_rows,
      const int64_t row_elems) {
    using namespace host;
    auto B = SymbolicSize{"batch_size"};
    auto L = SymbolicSize{"num_layers"};
    auto device_ = SymbolicDevice{};
    device_.set_options<kDLCUDA>();

    TensorMatcher({L}).with_dtype<int64_t>().template with_device<kDLCUDA>(device_).verify(state_ptrs);
    verify_row_tensors(seq_lens, verify_lens, extend_start_loc, req_pool_indices, B, device_);
    TensorMatcher({B}).with_dtype<int64_t>().template with_device<kDLCUDA>(device_).verify(new_seq_lens);
    check_banks(num_banks, state_slot_stride, num_state_rows);
    check_num_q_tokens(num_q_tokens, "commit");
    check_max_num_reqs(max_num_reqs, state_slot_stride, "commit");
    RuntimeCheck(
        row_elems > 0 && (row_elems * static_cast<int64_t>(sizeof(BufferFloat))) % 16 == 0,
        "dspark c128 commit: a state row of ",
        row_elems,
        " elements is not a whole number of 16-byte vectors");
    RuntimeCheck(
        L.unwrap() <= 65535, "dspark c128 commit: at most 65535 layers per launch, got ", L.unwrap());

    const auto batch_size = static_cast<uint32_t>(B.unwrap());
    const auto num_layers = static_cast<uint32_t>(L.unwrap());
    if (batch_size == 0 || num_layers == 0) return;
    const auto params = DsparkC128CommitParams{
        .state_ptrs = static_cast<const int64_t*>(state_ptrs.data_ptr()),
        .seq_lens = static_cast<const int64_t*>(seq_lens.data_ptr()),
        .new_seq_lens = static_cast<const int64_t*>(new_seq_lens.data_ptr()),
        .verify_lens = static_cast<const int32_t*>(verify_lens.data_ptr()),
        .extend_start_loc = static_cast<const int32_t*>(extend_start_loc.data_ptr()),
        .req_pool_indices = static_cast<const int64_t*>(req_pool_indices.data_ptr()),
        .batch_size = batch_size,
        .num_tokens = static_cast<int32_t>(num_q_tokens),
        .num_banks = static_cast<int32_t>(num_banks),
        .state_slot_stride = state_slot_stride,
        .max_num_reqs = max_num_reqs,
        .row_vecs = row_elems * static_cast<int64_t>(sizeof(BufferFloat)) / 16,
    };
    LaunchKernel(dim3{batch_size, num_layers}, kDsparkCommitThreads, device_.unwrap())  //
        .enable_pdl(kUsePDL)(dspark_c128_commit_kernel<kUsePDL>, params);
  }
};

}  // namespace sglang
