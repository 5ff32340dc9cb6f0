// attention_bench: our attention kernels and cuDNN's at head dim 64 in bf16 on the GPU,
// forward and backward TFLOP/s for S = 512, 1536, 4096, 16384 (B x S = 32768
// tokens, 12 heads, no mask, no dropout but in one row), these ways:
//   ours-plain      attention_forward / attention_backward (no RoPE) on
//                   mma.sync: the kernel to set beside torch's SDPA, which
//                   has no RoPE
//   ours-fused      rope_attention_forward / _backward: Q and K rotated while
//                   their tiles load, gradients rotated back in the epilogue
//   ours-*-r32      the same with the forward's 32 rows per warp (4 warps a
//                   block) in place of 16 (8 warps): flash_attention.h
//   ours-*-wgmma    the same with the forward and the fused backward on
//                   Hopper's wgmma (flash_attention_wgmma.cu,
//                   flash_attention_backward_wgmma.cu; compute capability 9.0
//                   only, and the default there), the forward in step;
//                   ours-*-dropout-wgmma with dropout 0.1
//   ours-*-wgmma-pipelined  the wgmma forward's pipelined schedule
//                   (set_flash_forward_schedule; the backward's times are the
//                   -wgmma row's, the same kernel). The default schedule
//                   pipelines the plain forwards (no RoPE inside) alone.
//   ours-*-dropout-wgmma-bitsahead  the keep bits drawn by a kernel of
//                   their own before the wgmma forward, which reads them
//                   (set_flash_keep_bits_ahead, the default since session
//                   24; the forward's time includes that kernel, the
//                   backward is the same kernel): plain pipelined (the
//                   model's forward), RoPE inside in step. The -wgmma rows
//                   before them draw the bits inside the forward, the rows
//                   after them ahead
//   ours-*-wgmma-alternating  the fused wgmma backward with its sweeps of
//                   the query tiles alternating in direction
//                   (set_flash_backward_alternates_sweeps): the plain one
//                   and the model's (q and k rotated once, dropout); the
//                   forward's times are the -wgmma rows'. ours-*-upwards:
//                   the same backwards sweeping upwards, timed right before'
//   ours-plain-*wgmma-legacysplits  the plain wgmma backward (without and
//                   with dropout) at the split count of the first rule
//                   (flash_backward_splits.h) rather than the default's, where
//                   the two differ; a
//                   line "attention splits S=.. legacy=.. default=.." says both
//   ours-*-2pass    the same with the two-pass backward (dq per query
//                   tile, then dk/dv per key tile: seven products) in place
//                   of the fused one (five): flash_attention.h
//   ours-*-2pass-dq1  the two-pass backward with its dq pass at one block an
//                   SM (fragments in registers) in place of two
//   ours-fused-dropout  ours-fused with attention dropout 0.1 (the keep bits
//                   written forward, read backward), as RoFormer-base trains
//   ours-separate   the rope kernel writes rotated copies of q and k, then
//                   attention; backward: attention, then dq and dk rotated back
//                   (also on wgmma, and with dropout there:
//                   ours-separate-wgmma, ours-separate-dropout-wgmma)
//   cudnn-plain     cuDNN's fused attention (core/cuda/cudnn_sdpa.cpp), no RoPE
//   cudnn-separate  the rope kernels, then cuDNN's attention: what
//                   model.attention_kernel: cudnn_sdpa runs
// FLOPs as FlashAttention counts them: forward 4 B H S^2 D (two products),
// backward 2.5 x that (five products; the two-pass backward recomputes S
// and dP in both passes, seven products, but is credited with five).
// Prints one line per (implementation, S):
//   attention impl=ours-fused S=512 B=64 H=12 D=64 fwd_ms=... bwd_ms=... fwd_tflops=...
//   bwd_tflops=...
// bench/gpu/attention_table.sh runs it beside bench/gpu/attention_bench_torch.py.
// `attention_bench --once S...` launches the kernels of RoFormer-base's step
// once each (launch_once), untimed, for ncu (bench/gpu/attention_table.sh
// kernels).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda/backend.h"
#include "core/cuda/check.h"
#include "core/cuda/kernels/flash_attention.h"
#include "core/cuda/kernels/flash_backward_splits.h"
#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/ops/rope_table.h"

namespace roformer {
namespace {

constexpr int64_t kHeads = 12, kDim = 64, kTokens = 32768;

// Mean milliseconds of fn over at least `min_seconds` (after warm-up runs).
double time_ms(Device device, const std::function<void()>& fn, double min_seconds = 0.3) {
  for (int i = 0; i < 3; ++i) fn();
  launch::synchronize(device);
  int iters = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  do {
    fn();
    ++iters;
    if (iters % 5 == 0 || iters < 5) {
      launch::synchronize(device);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  } while (elapsed < min_seconds || iters % 5 != 0);
  return 1e3 * elapsed / iters;
}

// [B, S, H, D] storage seen as [B, H, S, D]: the layout the model's projections give.
Tensor heads(int64_t B, int64_t S, DType dtype, Device device, uint64_t seed) {
  Generator gen{seed, 0};
  return Tensor::randn({B, S, kHeads, kDim}, gen, DType::f32).to(dtype).to(device).transpose(1, 2);
}

void print(const char* impl, int64_t S, int64_t B, double fwd_ms, double bwd_ms) {
  const double flops = 4.0 * double(B) * kHeads * double(S) * double(S) * kDim;
  std::printf(
      "attention impl=%s S=%lld B=%lld H=%lld D=%lld fwd_ms=%.3f bwd_ms=%.3f fwd_tflops=%.1f "
      "bwd_tflops=%.1f\n",
      impl, static_cast<long long>(S), static_cast<long long>(B), static_cast<long long>(kHeads),
      static_cast<long long>(kDim), fwd_ms, bwd_ms, flops / fwd_ms * 1e-9,
      2.5 * flops / bwd_ms * 1e-9);
  std::fflush(stdout);
}

// The operands of one length: B x S = kTokens tokens, 12 heads of 64.
struct Operands {
  int64_t B;
  Tensor q, k, v, grad_out, table, out, lse, dq, dk, dv, keep;
  kernels::AttentionParams params;   // plain
  kernels::AttentionParams dropped;  // attention dropout 0.1, as the model trains
};

Operands operands(int64_t S, Device device) {
  Operands o;
  o.B = std::max<int64_t>(1, kTokens / S);
  const int64_t B = o.B;
  const DType bf16 = DType::bf16;
  o.q = heads(B, S, bf16, device, 1);
  o.k = heads(B, S, bf16, device, 2);
  o.v = heads(B, S, bf16, device, 3);
  o.grad_out = heads(B, S, bf16, device, 4);
  const Tensor positions = Tensor::arange(0, S, DType::i64).to(device);
  o.table = rope_table(positions, kDim, 10000.0, DType::f32);
  o.params.scale = 0.125;
  o.dropped = o.params;
  o.dropped.dropout_p = 0.1;
  o.dropped.dropout = {7, 0, 0, 0};
  o.out = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  o.lse = Tensor::empty({B, kHeads, S}, DType::f32, device);
  o.dq = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  o.dk = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  o.dv = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  o.keep = Tensor::empty({B, kHeads, S, (S + 31) / 32}, DType::i32, device);
  return o;
}

// The model's attention backward (q and k rotated once: q and k standing
// for the rotated copies, dq and dk rotated back as they are written) under
// `p`, with `bits` the forward's keep bits (none without dropout).
void rotated_once_backward(Device device, const Operands& o, const kernels::AttentionParams& p,
                           const Tensor& bits) {
  launch::rope_attention_backward(device, p, o.table, true, kernels::RopeInputs::rotated, o.q, o.k,
                                  o.v, Tensor(), o.out, o.lse, bits, o.grad_out, o.dq, o.dk, o.dv);
}

// One launch each of the kernels RoFormer-base's step runs, under the
// default flash settings and untimed, for a kernel profiler (ncu) to measure
// exactly these (bench/gpu/attention_table.sh kernels), each beside what it
// is measured against:
//   1. the plain forward without dropout (the baseline of 3);
//   2. the plain backward without dropout (the baseline of 4);
//   3. the model's forward: dropout 0.1, q and k rotated once (the keep
//      bits kernel, then the forward reading its bits): its two kernels'
//      times split dropout's cost between drawing and applying;
//   4. the model's backward: dropout, dq and dk rotated back at the stores;
//   5. the same with its sweeps alternating (set_flash_backward_alternates_
//      sweeps): its L2 hit rate and DRAM bytes beside 4's.
// The model's step runs these kernels on token streams ([T, H, D] with
// sequence boundaries); here on [B, H, S, D] batches of whole sequences:
// the same kernels, other strides. On a GPU without wgmma the same calls
// run the mma.sync kernels.
void launch_once(int64_t S, Device device) {
  const Operands o = operands(S, device);
  const Tensor none;
  launch::attention_forward(device, o.params, o.q, o.k, o.v, none, o.out, o.lse, none);
  launch::attention_backward(device, o.params, o.q, o.k, o.v, none, o.out, o.lse, none, o.grad_out,
                             o.dq, o.dk, o.dv);
  launch::attention_forward(device, o.dropped, o.q, o.k, o.v, none, o.out, o.lse, o.keep);
  const auto model_backward = [&] { rotated_once_backward(device, o, o.dropped, o.keep); };
  model_backward();
  const bool alternated = kernels::cuda::flash_backward_alternates_sweeps();
  kernels::cuda::set_flash_backward_alternates_sweeps(!alternated);
  model_backward();
  kernels::cuda::set_flash_backward_alternates_sweeps(alternated);
  launch::synchronize(device);
  const bool wgmma = kernels::cuda::flash_forward_uses_wgmma() &&
                     kernels::cuda::flash_backward_uses_wgmma() &&
                     kernels::cuda::flash_wgmma_available(device.index);
  std::printf(
      "attention_bench: one launch each of the plain forward and backward, the model's forward "
      "(dropout 0.1) and the model's backward with its sweeps %s, then %s, at S=%lld%s\n",
      alternated ? "alternating" : "upwards", alternated ? "upwards" : "alternating",
      static_cast<long long>(S), wgmma ? " (wgmma)" : " (mma.sync)");
}

void bench(int64_t S, Device device) {
  const Operands o = operands(S, device);
  const int64_t B = o.B;
  const DType bf16 = DType::bf16;
  const Tensor &q = o.q, &k = o.k, &v = o.v, &grad_out = o.grad_out, &table = o.table;
  const Tensor &out = o.out, &lse = o.lse, &dq = o.dq, &dk = o.dk, &dv = o.dv;
  const kernels::AttentionParams& params = o.params;
  const Tensor none;

  // Our kernels under the current flash settings (flash_attention.h), in
  // milliseconds: plain attention, and RoPE inside (`p`: with or without
  // dropout, `keep` its bits).
  const kernels::AttentionParams& dropped = o.dropped;
  const Tensor& keep = o.keep;
  auto plain_fwd = [&](const kernels::AttentionParams& p, const Tensor& bits) {
    return time_ms(device,
                   [&] { launch::attention_forward(device, p, q, k, v, none, out, lse, bits); });
  };
  auto plain_bwd = [&](const kernels::AttentionParams& p, const Tensor& bits) {
    return time_ms(device, [&] {
      launch::attention_backward(device, p, q, k, v, none, out, lse, bits, grad_out, dq, dk, dv);
    });
  };
  auto fused_fwd = [&](const kernels::AttentionParams& p, const Tensor& bits) {
    return time_ms(device, [&] {
      launch::rope_attention_forward(device, p, table, true, q, k, v, none, out, lse, bits);
    });
  };
  auto once_bwd = [&](const kernels::AttentionParams& p, const Tensor& bits) {
    return time_ms(device, [&] { rotated_once_backward(device, o, p, bits); });
  };
  auto fused_bwd = [&](const kernels::AttentionParams& p, const Tensor& bits) {
    return time_ms(device, [&] {
      launch::rope_attention_backward(device, p, table, true, kernels::RopeInputs::unrotated, q, k,
                                      v, none, out, lse, bits, grad_out, dq, dk, dv);
    });
  };

  // Plain attention, and RoPE inside, under both forward tilings (the
  // backward is the same kernel for both). The default tiling's forward
  // times stand beside the one-block dq pass below.
  double default_plain_fwd = 0.0, default_fused_fwd = 0.0;
  for (const int rows : {16, 32}) {
    kernels::cuda::set_flash_forward_rows_per_warp(rows);
    const std::string suffix = rows == 16 ? "" : "-r32";
    const double plain_f = plain_fwd(params, none), plain_b = plain_bwd(params, none);
    print(("ours-plain" + suffix).c_str(), S, B, plain_f, plain_b);
    const double fused_f = fused_fwd(params, none), fused_b = fused_bwd(params, none);
    print(("ours-fused" + suffix).c_str(), S, B, fused_f, fused_b);
    if (rows == 16) {
      default_plain_fwd = plain_f;
      default_fused_fwd = fused_f;
    }
  }
  kernels::cuda::set_flash_forward_rows_per_warp(16);

  // RoPE as separate kernels with rotated copies (model.attention_kernel:
  // separate), the attention by `p`'s engine (`bits`: dropout's keep bits).
  const Tensor rq = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  const Tensor rk = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  const Tensor dq_rot = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  const Tensor dk_rot = Tensor::empty({B, kHeads, S, kDim}, bf16, device);
  auto separate = [&](const char* impl, const kernels::AttentionParams& p, const Tensor& bits) {
    const double fwd = time_ms(device, [&] {
      launch::rope(device, q, table, true, false, rq);
      launch::rope(device, k, table, true, false, rk);
      launch::attention_forward(device, p, rq, rk, v, none, out, lse, bits);
    });
    const double bwd = time_ms(device, [&] {
      launch::attention_backward(device, p, rq, rk, v, none, out, lse, bits, grad_out, dq_rot,
                                 dk_rot, dv);
      launch::rope(device, dq_rot, table, true, true, dq);
      launch::rope(device, dk_rot, table, true, true, dk);
    });
    print(impl, S, B, fwd, bwd);
  };

  // The forward and backward on wgmma, before the rows a budget may cut;
  // and RoPE as separate kernels around the plain wgmma kernels, with and
  // without dropout: whether rotating once beats rotating in every block.
  if (kernels::cuda::flash_wgmma_available(device.index)) {
    using kernels::cuda::ForwardSchedule;
    kernels::cuda::set_flash_forward_uses_wgmma(true);
    kernels::cuda::set_flash_backward_uses_wgmma(true);
    kernels::cuda::set_flash_forward_schedule(ForwardSchedule::in_step);
    kernels::cuda::set_flash_keep_bits_ahead(false);  // until the -bitsahead rows
    const double plain_f = plain_fwd(params, none), plain_b = plain_bwd(params, none);
    print("ours-plain-wgmma", S, B, plain_f, plain_b);
    const double fused_f = fused_fwd(params, none), fused_b = fused_bwd(params, none);
    print("ours-fused-wgmma", S, B, fused_f, fused_b);
    const double dropout_f = fused_fwd(dropped, keep), dropout_b = fused_bwd(dropped, keep);
    print("ours-fused-dropout-wgmma", S, B, dropout_f, dropout_b);
    // The plain kernels with dropout: the training step's forward when q
    // and k are rotated once (set_rotate_once, the default); its backward is
    // the next row's, the same kernel rotating dq and dk back as it writes
    // them (q and k standing for the rotated copies).
    const double plain_dropout_f = plain_fwd(dropped, keep),
                 plain_dropout_b = plain_bwd(dropped, keep);
    print("ours-plain-dropout-wgmma", S, B, plain_dropout_f, plain_dropout_b);
    print("ours-once-dropout-wgmma", S, B, plain_dropout_f, once_bwd(dropped, keep));
    // The backward at the first split rule's count (flash_backward_splits.h),
    // beside the default's above (the forward is the same kernel).
    {
      kernels::cuda::BackwardSplitProblem split;
      split.per_split = B * kHeads;
      split.key_tiles = (S + 127) / 128;
      split.query_rows = S;
      split.dq_elements = B * S * kHeads * kDim;
      int sms = 0;
      RF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index));
      split.sms = sms;
      const int64_t legacy = kernels::cuda::legacy_backward_splits(split);
      const int64_t chosen = kernels::cuda::auto_backward_splits(split);
      std::printf("attention splits S=%lld legacy=%lld default=%lld\n", static_cast<long long>(S),
                  static_cast<long long>(legacy), static_cast<long long>(chosen));
      if (legacy != chosen) {  // the same count: nothing to set beside the default
        const int before = kernels::cuda::flash_backward_splits();
        kernels::cuda::set_flash_backward_splits(int(legacy));
        print("ours-plain-wgmma-legacysplits", S, B, plain_f, plain_bwd(params, none));
        print("ours-plain-dropout-wgmma-legacysplits", S, B, plain_dropout_f,
              plain_bwd(dropped, keep));
        kernels::cuda::set_flash_backward_splits(before);
      }
    }
    // The forward's pipelined schedule (the backward is the same kernel:
    // its times are the rows' above).
    kernels::cuda::set_flash_forward_schedule(ForwardSchedule::pipelined);
    print("ours-plain-wgmma-pipelined", S, B, plain_fwd(params, none), plain_b);
    print("ours-fused-wgmma-pipelined", S, B, fused_fwd(params, none), fused_b);
    print("ours-fused-dropout-wgmma-pipelined", S, B, fused_fwd(dropped, keep), dropout_b);
    print("ours-plain-dropout-wgmma-pipelined", S, B, plain_fwd(dropped, keep), plain_dropout_b);
    kernels::cuda::set_flash_forward_schedule(ForwardSchedule::automatic);
    // The keep bits drawn ahead of the forward (each forward under the
    // default schedule: the plain one pipelined, RoPE inside in step).
    kernels::cuda::set_flash_keep_bits_ahead(true);
    print("ours-plain-dropout-wgmma-bitsahead", S, B, plain_fwd(dropped, keep), plain_dropout_b);
    print("ours-fused-dropout-wgmma-bitsahead", S, B, fused_fwd(dropped, keep), dropout_b);
    // The backward's sweeps alternating, beside the same backwards sweeping
    // upwards timed right before them (the forwards are the rows' above).
    const double plain_up = plain_bwd(params, none), once_up = once_bwd(dropped, keep);
    kernels::cuda::set_flash_backward_alternates_sweeps(true);
    const double plain_alt = plain_bwd(params, none), once_alt = once_bwd(dropped, keep);
    kernels::cuda::set_flash_backward_alternates_sweeps(false);
    print("ours-plain-wgmma-upwards", S, B, plain_f, plain_up);
    print("ours-plain-wgmma-alternating", S, B, plain_f, plain_alt);
    print("ours-once-dropout-wgmma-upwards", S, B, plain_dropout_f, once_up);
    print("ours-once-dropout-wgmma-alternating", S, B, plain_dropout_f, once_alt);
    separate("ours-separate-wgmma", params, none);
    separate("ours-separate-dropout-wgmma", dropped, keep);
    kernels::cuda::set_flash_forward_uses_wgmma(false);
    kernels::cuda::set_flash_backward_uses_wgmma(false);
  } else {
    std::printf("attention impl=ours-plain-wgmma S=%lld unavailable: not compute capability 9.0\n",
                static_cast<long long>(S));
  }

  // The two-pass backward, its dq pass at two blocks an SM and at one (rows
  // ours-*-2pass, ours-*-2pass-dq1; the forward is the same kernel, so its
  // times are the default tiling's).
  kernels::cuda::set_flash_backward_passes(2);
  for (const int dq_blocks : {2, 1}) {
    kernels::cuda::set_flash_dq_blocks_per_sm(dq_blocks);
    const std::string suffix = dq_blocks == 2 ? "-2pass" : "-2pass-dq1";
    const double plain_b = plain_bwd(params, none), fused_b = fused_bwd(params, none);
    print(("ours-plain" + suffix).c_str(), S, B, default_plain_fwd, plain_b);
    print(("ours-fused" + suffix).c_str(), S, B, default_fused_fwd, fused_b);
  }
  kernels::cuda::set_flash_dq_blocks_per_sm(2);
  kernels::cuda::set_flash_backward_passes(1);

  // With attention dropout, as the model trains (p = 0.1).
  const double dropout_f = fused_fwd(dropped, keep), dropout_b = fused_bwd(dropped, keep);
  print("ours-fused-dropout", S, B, dropout_f, dropout_b);

  separate("ours-separate", params, none);

  // cuDNN's fused attention (model.attention_kernel: cudnn_sdpa): plain, and
  // after the rope kernels as the model runs it. No engine for a shape: a line
  // saying so, the other lengths still measured.
  kernels::AttentionParams vendor = params;
  vendor.engine = kernels::AttentionEngine::vendor;
  try {
    const double cudnn_fwd = time_ms(
        device, [&] { launch::attention_forward(device, vendor, q, k, v, none, out, lse, none); });
    const double cudnn_bwd = time_ms(device, [&] {
      launch::attention_backward(device, vendor, q, k, v, none, out, lse, none, grad_out, dq, dk,
                                 dv);
    });
    print("cudnn-plain", S, B, cudnn_fwd, cudnn_bwd);
    separate("cudnn-separate", vendor, none);
  } catch (const Error& e) {
    std::printf("attention impl=cudnn-plain S=%lld unavailable: %s\n", static_cast<long long>(S),
                e.what());
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace roformer

int main(int argc, char** argv) {
  using namespace roformer;
  try {
    if (cuda::device_count() == 0) {
      std::printf("attention_bench: no GPU on this machine, nothing measured\n");
      return 0;
    }
    std::vector<int64_t> lengths{512, 1536, 4096, 16384};
    const bool once = argc > 1 && std::string(argv[1]) == "--once";
    if (argc > 1 + int(once)) {
      lengths.clear();
      for (int i = 1 + int(once); i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
    }
    // --once: the model's kernels, under the library's defaults.
    if (once) {
      for (int64_t S : lengths) launch_once(S, Device::cuda(0));
      return 0;
    }
    // The rows without -wgmma are the mma.sync kernels (every GPU's); on
    // compute capability 9.0 wgmma is the default, so it is switched off
    // here and on only for the -wgmma rows.
    kernels::cuda::set_flash_forward_uses_wgmma(false);
    kernels::cuda::set_flash_backward_uses_wgmma(false);
    for (int64_t S : lengths) bench(S, Device::cuda(0));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
