// The token-stream kernels (unpadded batches, docs/architecture.md "Token
// stream"): dropout keyed by each token's (row, position), and
// variable-length attention (segments on the device) on the tensor-core
// kernel (flash_attention.cu: bf16 q, k, v at head dim 64) or, for other
// operands, on the simple kernels of attention.cu per segment.
#include <vector>

#include "core/cuda/kernels/attention_common.cuh"
#include "core/cuda/kernels/dropout.cuh"
#include "core/cuda/kernels/flash_attention.h"
#include "core/philox.h"

namespace roformer::kernels::cuda {

namespace {

// Element (t, f) is feature f of token t = (row, position): the draw the
// padded dropout kernel makes for that row and position, a thread per
// token's group of eight features.
template <class T>
__global__ void dropout_tokens_kernel(const T* x, T* out, int64_t n_groups, int64_t features,
                                      const int64_t* tokens, int64_t s0, int64_t s1, PhiloxKey pkey,
                                      DropoutKey key, uint32_t threshold, acc_t<T> scale) {
  const int64_t groups = dropout_groups(features);
  RF_GRID_LOOP(i, n_groups) {
    const int64_t group = i % groups, t = i / groups;
    const int64_t row = tokens[t * s0], position = tokens[t * s0 + s1];
    drop_feature_group(x + t * features, out + t * features, features, group,
                       uint32_t(key.first_sequence + row), uint32_t(position), pkey, key.site,
                       threshold, scale);
  }
}

// --- the fallback for operands the tensor-core kernel does not take ---------------
// (f32, f64, other head dims): the simple padded kernels of attention.cu run
// per segment on [1, H, L, D] views of the stream, with the segment's dropout
// sequence and first position; lse and keep bits go through contiguous
// scratch (the layout those kernels index). One host read of the segments
// and a few launches per segment: correct, not fast.

struct HostSegment {
  int64_t start, length, row, position;
};

std::vector<HostSegment> host_segments(Stream stream, const KernelTensor& segments) {
  const int64_t n = segments.sizes[0];
  std::vector<int64_t> flat(size_t(n * 4));
  if (n == 0) return {};
  RF_CHECK(segments.dtype == DType::i64 && segments.is_contiguous(),
           "attention_varlen: expected contiguous segments [N, 4] i64");
  RF_CUDA_CHECK(cudaMemcpyAsync(flat.data(), segments.data, flat.size() * sizeof(int64_t),
                                cudaMemcpyDeviceToHost, native(stream)));
  RF_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
  std::vector<HostSegment> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[size_t(i)] = {flat[size_t(4 * i)], flat[size_t(4 * i + 1)], flat[size_t(4 * i + 2)],
                      flat[size_t(4 * i + 3)]};
  return out;
}

// Tokens [start, start + L) of a [T, H, ...] tensor seen as [1, H, L, ...].
KernelTensor segment_view(const KernelTensor& t, int64_t start, int64_t L) {
  KernelTensor v = t;
  v.data = static_cast<char*>(t.data) + start * t.strides[0] * int64_t(dtype_size(t.dtype));
  v.ndim = t.ndim + 1;
  v.sizes[0] = 1;
  v.strides[0] = 0;
  v.sizes[1] = t.sizes[1];
  v.strides[1] = t.strides[1];
  v.sizes[2] = L;
  v.strides[2] = t.strides[0];
  for (int32_t d = 2; d < t.ndim; ++d) {
    v.sizes[d + 1] = t.sizes[d];
    v.strides[d + 1] = t.strides[d];
  }
  return v;
}

// A contiguous [1, H, L, (W)] tensor over scratch memory.
KernelTensor packed(void* data, DType dtype, int64_t H, int64_t L, int64_t W = 0) {
  KernelTensor t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = W > 0 ? 4 : 3;
  const int64_t sizes[4] = {1, H, L, W};
  int64_t stride = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = stride;
    stride *= sizes[d];
  }
  return t;
}

// The segment's keep bits [1, H, L, ceil(L / 32)] inside bits [T, H, W].
KernelTensor segment_bits(const KernelTensor& bits, int64_t start, int64_t L) {
  KernelTensor v = segment_view(bits, start, L);
  v.sizes[3] = (L + 31) / 32;
  return v;
}

// A segment's lse [1, H, L] and keep bits [1, H, L, ceil(L / 32)] (with
// dropout) in contiguous scratch, the layout the simple kernels index.
struct SegmentStats {
  Scratch lse_mem, bits_mem;
  KernelTensor lse, bits;
  SegmentStats(Stream stream, int64_t H, int64_t L, DType lse_dtype, bool drop)
      : lse_mem(stream, size_t(H * L) * dtype_size(lse_dtype)),
        bits_mem(stream, drop ? size_t(H * L * ((L + 31) / 32)) * sizeof(int32_t) : 1),
        lse(packed(lse_mem.as<void>(), lse_dtype, H, L)),
        bits(drop ? packed(bits_mem.as<void>(), DType::i32, H, L, (L + 31) / 32) : KernelTensor{}) {
  }
};

DropoutRule segment_rule(const AttentionParams& params, const HostSegment& s) {
  DropoutRule rule = dropout_rule(params);
  rule.first_sequence += s.row;
  rule.first_position = s.position;
  return rule;
}

// Calls fn(view, rule, stats) per non-empty segment: view(t) is the
// segment's [1, H, L, ...] view of a stream tensor, rule its dropout rule,
// stats its contiguous lse and keep-bit scratch.
template <class Fn>
void for_each_segment(Stream stream, const AttentionParams& params, const KernelTensor& q,
                      const KernelTensor& segments, DType lse_dtype, Fn&& fn) {
  const bool drop = params.dropout_p > 0.0;
  for (const HostSegment& s : host_segments(stream, segments)) {
    if (s.length == 0) continue;
    const SegmentStats stats(stream, q.sizes[1], s.length, lse_dtype, drop);
    auto view = [&](const KernelTensor& t) { return segment_view(t, s.start, s.length); };
    auto bits = [&](const KernelTensor& t) { return segment_bits(t, s.start, s.length); };
    fn(view, bits, segment_rule(params, s), stats);
  }
}

void fallback_forward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                      const KernelTensor& k, const KernelTensor& v, const KernelTensor& segments,
                      const KernelTensor& out, const KernelTensor& lse,
                      const KernelTensor& keep_bits) {
  for_each_segment(stream, params, q, segments, lse.dtype,
                   [&](auto view, auto bits, const DropoutRule& rule, const SegmentStats& stats) {
                     simple_attention_forward(stream, params.scale, rule, view(q), view(k), view(v),
                                              KernelTensor{}, view(out), stats.lse, stats.bits);
                     copy(stream, stats.lse, view(lse));
                     if (rule.on) copy(stream, stats.bits, bits(keep_bits));
                   });
}

void fallback_backward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                       const KernelTensor& k, const KernelTensor& v, const KernelTensor& segments,
                       const KernelTensor& out, const KernelTensor& lse,
                       const KernelTensor& keep_bits, const KernelTensor& grad_out,
                       const KernelTensor& grad_q, const KernelTensor& grad_k,
                       const KernelTensor& grad_v) {
  for_each_segment(stream, params, q, segments, lse.dtype,
                   [&](auto view, auto bits, const DropoutRule& rule, const SegmentStats& stats) {
                     copy(stream, view(lse), stats.lse);
                     if (rule.on) copy(stream, bits(keep_bits), stats.bits);
                     simple_attention_backward(stream, params.scale, rule, view(q), view(k),
                                               view(v), KernelTensor{}, view(out), stats.lse,
                                               stats.bits, view(grad_out), view(grad_q),
                                               view(grad_k), view(grad_v));
                   });
}

}  // namespace

void dropout_tokens(Stream stream, const KernelTensor& x, const KernelTensor& out,
                    const KernelTensor& tokens, double p, const DropoutKey& key) {
  RF_CHECK(x.ndim == 2 && x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel() &&
               tokens.ndim == 2 && tokens.sizes[0] == x.sizes[0] && tokens.sizes[1] == 2 &&
               tokens.dtype == DType::i64,
           "dropout_tokens kernel: expected contiguous x and out [T, features] and tokens [T, 2] "
           "i64");
  if (x.numel() == 0) return;
  const int64_t n_groups = x.sizes[0] * dropout_groups(x.sizes[1]);
  on_floating_dtype(x.dtype, "dropout", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    RF_LAUNCH((dropout_tokens_kernel<T>), grid_for(n_groups), kThreads, 0, native(stream),
              x.as<const T>(), out.as<T>(), n_groups, x.sizes[1], tokens.as<const int64_t>(),
              tokens.strides[0], tokens.strides[1], dropout_key(key.seed, key.step), key,
              dropout_threshold(p), A(1.0 / (1.0 - p)));
  });
}

void attention_varlen_forward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                              const KernelTensor& k, const KernelTensor& v,
                              const KernelTensor& segments, const KernelTensor& out,
                              const KernelTensor& lse, const KernelTensor& keep_bits) {
  check_attention_forward_dtypes("attention_varlen kernel", q, k, v, out, lse);
  if (flash_supported(q, k, v) && lse.dtype == DType::f32) {
    flash_forward(stream, params, FlashRope{}, q, k, v, KernelTensor{}, segments, out, lse,
                  keep_bits);
  } else if (upcast(q, out)) {
    const F32Copy q32(stream, q), k32(stream, k), v32(stream, v);
    fallback_forward(stream, params, q32.tensor, k32.tensor, v32.tensor, segments, out, lse,
                     keep_bits);
  } else {
    fallback_forward(stream, params, q, k, v, segments, out, lse, keep_bits);
  }
}

void attention_varlen_backward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                               const KernelTensor& k, const KernelTensor& v,
                               const KernelTensor& segments, const KernelTensor& out,
                               const KernelTensor& lse, const KernelTensor& keep_bits,
                               const KernelTensor& grad_out, const KernelTensor& grad_q,
                               const KernelTensor& grad_k, const KernelTensor& grad_v) {
  check_attention_backward_dtypes("attention_varlen kernel", q, k, v, out, lse, grad_out, grad_q,
                                  grad_k, grad_v);
  if (flash_supported(q, k, v, grad_out) && lse.dtype == DType::f32) {
    flash_backward(stream, params, FlashRope{}, q, k, v, KernelTensor{}, segments, out, lse,
                   keep_bits, grad_out, grad_q, grad_k, grad_v);
  } else if (upcast(q, grad_q)) {
    const F32Copy q32(stream, q), k32(stream, k), v32(stream, v), o32(stream, out),
        g32(stream, grad_out);
    fallback_backward(stream, params, q32.tensor, k32.tensor, v32.tensor, segments, o32.tensor, lse,
                      keep_bits, g32.tensor, grad_q, grad_k, grad_v);
  } else {
    fallback_backward(stream, params, q, k, v, segments, out, lse, keep_bits, grad_out, grad_q,
                      grad_k, grad_v);
  }
}

}  // namespace roformer::kernels::cuda
