// What the CPU attention kernels share (core/cpu/attention.cpp for padded
// batches, core/cpu/attention_varlen.cpp for token streams): the per-head
// oneDNN GEMMs, the dropout keep-bit draw of one query row, and the
// vectorised row kernels of the softmax and its backward. Internal to those
// two files, which compile it with no-trapping-math (see their first lines).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cpu/onednn.h"
#include "core/cpu/philox_simd.h"
#include "core/cpu/vector_math.h"
#include "core/philox.h"

namespace roformer::kernels::cpu::attention_detail {

inline int64_t keep_words(int64_t sk) {
  return (sk + 31) / 32;
}

// --- per-head GEMMs on oneDNN ---------------------------------------------------------
//
// Every (batch, head) has the same geometry, so one primitive per product
// serves all heads; threads run it on their own heads concurrently, each with
// its own stream and scratchpad (oneDNN's shared library scratchpad is not
// safe for concurrent execution). Inside the parallel region oneDNN runs
// single-threaded: a head's products do not depend on the thread count.

// A head's 2-D operand: rows x cols with the given strides (one of them 1),
// f32 or bf16 (bf16 autocast: products accumulate in f32, write f32).
struct Matrix {
  int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;
  DType dtype = DType::f32;
  dnnl::memory::desc desc() const {
    return dnnl::memory::desc({rows, cols}, onednn_dtype(dtype), {row_stride, col_stride});
  }
  std::string key() const {
    return std::string(dtype_name(dtype)) + std::to_string(rows) + "x" + std::to_string(cols) +
           "/" + std::to_string(row_stride) + "," + std::to_string(col_stride);
  }
  Matrix t() const { return {cols, rows, col_stride, row_stride, dtype}; }
  Matrix as(DType d) const { return {rows, cols, row_stride, col_stride, d}; }
  // What the product reads where oneDNN has no bf16 matmul: a bf16 operand
  // as a dense f32 copy (run makes it), anything else as it is.
  Matrix gemm_operand() const {
    if (dtype != DType::bf16 || onednn_has_bf16_matmul()) return *this;
    return {rows, cols, cols, 1, DType::f32};
  }
};

struct HeadGemm {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratchpad;
  // The operands as the callers hold them, and whether run widens each into
  // f32 first (Matrix::gemm_operand).
  Matrix a_in, b_in;
  bool widen_a = false, widen_b = false;
};

// c = a x b (c in f32).
inline std::shared_ptr<HeadGemm> head_gemm(const Matrix& a, const Matrix& b, const Matrix& c) {
  RF_CHECK(c.dtype == DType::f32, "attention head product: f32 results only, not ",
           dtype_name(c.dtype));
  const Matrix ga = a.gemm_operand(), gb = b.gemm_operand();
  const std::string key =
      "attn_head_gemm|" + a.key() + "|" + b.key() + "|" + c.key() + "|" + ga.key() + "|" + gb.key();
  return cached_primitive<HeadGemm>(key, [&] {
    count_primitive_built();
    HeadGemm g;
    g.a = ga.desc();
    g.b = gb.desc();
    g.c = c.desc();
    g.a_in = a;
    g.b_in = b;
    g.widen_a = ga.dtype != a.dtype;
    g.widen_b = gb.dtype != b.dtype;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g.a, g.b, g.c), attr, onednn_engine());
    g.scratchpad = pd.scratchpad_desc();
    g.primitive = dnnl::matmul(pd);
    return g;
  });
}

// A bf16 matrix m at src as dense f32 rows into dst (exact), by the copy
// kernel's casts.
inline const float* widened(const Matrix& m, const void* src, std::vector<float>& dst) {
  dst.resize(size_t(m.rows * m.cols));
  const View in(const_cast<void*>(src), DType::bf16, {m.rows, m.cols},
                {m.row_stride, m.col_stride});
  const View out(dst.data(), DType::f32, {m.rows, m.cols}, {m.cols, 1});
  copy(Stream{}, in.kt(), out.kt());
  return dst.data();
}

// Per-thread execution state: a stream and a scratchpad buffer.
struct ThreadGemmState {
  dnnl::stream stream{onednn_engine()};
  std::vector<char> scratchpad;
  std::vector<float> a32, b32;  // widened operands (HeadGemm::widen_a, widen_b)
};

inline void run(const HeadGemm& g, const void* a, const void* b, void* c) {
  thread_local ThreadGemmState state;
  if (g.widen_a) a = widened(g.a_in, a, state.a32);
  if (g.widen_b) b = widened(g.b_in, b, state.b32);
  const size_t need = g.scratchpad.get_size();
  if (state.scratchpad.size() < need) state.scratchpad.resize(need);
  dnnl::engine& eng = onednn_engine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(g.a, eng, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(g.b, eng, const_cast<void*>(b))},
      {DNNL_ARG_DST, dnnl::memory(g.c, eng, c)}};
  if (need)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(g.scratchpad, eng, state.scratchpad.data()));
  g.primitive.execute(state.stream, args);
  state.stream.wait();
}

// --- elementwise helpers ---------------------------------------------------------

// Keep bits for the n keys of one query row (sequence, query position, head)
// by the shared dropout rule (core/philox.h): key j is draw j % 8 of counter
// block dropout_block(j / 8, position, sequence, site, head); keep when the
// 16-bit uniform is >= p (threshold = ceil(p 2^16)). draw_keep_bits: batch
// row b, head h, query i of the padded layout.
inline void draw_keep_row(const DropoutKey& site, uint32_t sequence, uint32_t position,
                          uint32_t head, int64_t n, uint32_t threshold, uint32_t* words) {
  const uint16_t* u = dropout_draws_row(dropout_block(0, position, sequence, site.site, head),
                                        dropout_key(site.seed, site.step), n);
  for (int64_t w = 0; w * 32 < n; ++w) {
    const int len = int(std::min<int64_t>(32, n - w * 32));
    const uint16_t* uw = u + w * 32;
    uint32_t bits = 0;
#pragma omp simd reduction(| : bits)
    for (int t = 0; t < len; ++t) bits |= uint32_t(uint32_t(uw[t]) >= threshold) << t;
    words[w] = bits;
  }
}

// --- row kernels (vectorised) -------------------------------------------------------

// sum_c a[c] b[c] in f32 (D_i = dO_i . O_i of the backward): a in the gemm
// dtype, b (the forward's output) f32 or bf16.
template <class A, class B>
float dot_f32(const A* __restrict a, const B* __restrict b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t c = 0; c < n; ++c) acc += float(a[c]) * float(b[c]);
  return acc;
}

// The same with a's and b's dtypes given at run time.
inline float dot_f32(const void* a, DType a_dtype, const void* b, DType b_dtype, int64_t n) {
  const bool a_low = a_dtype == DType::bf16, b_low = b_dtype == DType::bf16;
  if (a_low && b_low) return dot_f32(static_cast<const bf16*>(a), static_cast<const bf16*>(b), n);
  if (a_low) return dot_f32(static_cast<const bf16*>(a), static_cast<const float*>(b), n);
  if (b_low) return dot_f32(static_cast<const float*>(a), static_cast<const bf16*>(b), n);
  return dot_f32(static_cast<const float*>(a), static_cast<const float*>(b), n);
}

// rows x cols f32 (row stride cols) into dst (f32 or bf16, rounded once; row
// stride dst_stride elements).
inline void store_rows(const float* src, int64_t rows, int64_t cols, void* dst, DType dst_dtype,
                       int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    if (dst_dtype == DType::bf16) {
      to_bf16_row(src + r * cols, static_cast<bf16*>(dst) + r * dst_stride, cols);
    } else {
      std::copy_n(src + r * cols, cols, static_cast<float*>(dst) + r * dst_stride);
    }
  }
}

// x = x * scale + add; returns max(x).
inline float scale_mask_max(float* __restrict x, const float* __restrict add, float scale,
                            int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) {
    const float v = x[j] * scale + add[j];
    x[j] = v;
    m = std::max(m, v);
  }
  return m;
}

// x = exp(x - m) * keep; returns sum(x).
inline float exp_sum(float* __restrict x, const float* __restrict keep, float m, int64_t n) {
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < n; ++j) {
    const float e = vexp(x[j] - m) * keep[j];
    x[j] = e;
    total += e;
  }
  return total;
}

// x *= bit j of bits ? kept : 0, 32 elements per word.
inline void scale_kept(float* __restrict x, const uint32_t* __restrict bits, float kept,
                       int64_t n) {
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const uint32_t word = bits[j0 >> 5];
    const int len = int(std::min<int64_t>(32, n - j0));
    float* __restrict xs = x + j0;
#pragma omp simd
    for (int t = 0; t < len; ++t) xs[t] *= ((word >> t) & 1u) ? kept : 0.0f;
  }
}

// Backward of one row: from raw scores x (q . k) and dPd y, writes
// x = Pd = P z and y = dS = P (y z - D) scale, with P = exp(x scale + add - lse)
// and z the dropout multiplier (1 without dropout).
inline void backward_row(float* __restrict x, float* __restrict y, const float* __restrict add,
                         const float* __restrict keep, const uint32_t* __restrict bits, float scale,
                         float lse, float D, float inv_keep, int64_t n) {
  if (!bits) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float p = vexp(x[j] * scale + add[j] - lse) * keep[j];
      x[j] = p;
      y[j] = p * (y[j] - D) * scale;
    }
    return;
  }
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const uint32_t word = bits[j0 >> 5];
    const int len = int(std::min<int64_t>(32, n - j0));
    float* __restrict xs = x + j0;
    float* __restrict ys = y + j0;
    const float* __restrict as = add + j0;
    const float* __restrict ks = keep + j0;
#pragma omp simd
    for (int t = 0; t < len; ++t) {
      const float p = vexp(xs[t] * scale + as[t] - lse) * ks[t];
      const float z = ((word >> t) & 1u) ? inv_keep : 0.0f;
      xs[t] = p * z;
      ys[t] = p * (ys[t] * z - D) * scale;
    }
  }
}

}  // namespace roformer::kernels::cpu::attention_detail
