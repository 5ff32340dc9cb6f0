// The row loops compare and clamp floats; without trapping-math semantics
// (nothing here reads floating-point exception flags) GCC if-converts and
// vectorises them. Values are unchanged: no reassociation is allowed.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/cpu/attention_rows.h"
#include "core/cpu/strided_loop.h"
#include "core/cpu/vector_math.h"
#include "core/kernels/attention_dtypes.h"
#include "core/philox.h"

namespace roformer::kernels::cpu {

// --- variable-length attention over a token stream ---------------------------------
//
// One work item per (segment, head), dynamically scheduled (segments differ
// in length); each item's rows and its dk/dv rows belong to it alone, so the
// result does not depend on the thread count.
//
// f32 and bf16 run the padded kernel's per-head oneDNN GEMMs and row loops on
// a per-thread scratch: the segment's rows of q, k, v (and dO) are copied in,
// zero-padded to a bucketed length (varlen_bucket), so a handful of cached
// primitives serve every length; the padding keys get probability 0 and the
// padding rows are dropped when the results are copied out. The rounding
// points are the padded kernel's: scores, softmax, lse and the outputs f32; under
// bf16 autocast q, k, v, dO and the probabilities (and dS) enter the products
// as bf16. f64 (the gradient checks) runs plain loops with vectorised dot
// products and axpys.

namespace {

using namespace attention_detail;

struct Segment {
  int64_t start, length, row, position;
};

std::vector<Segment> read_segments(const View& segments) {
  RF_CHECK(segments.dim() == 2 && segments.shape()[1] == 4 && segments.dtype() == DType::i64,
           "attention_varlen kernel: expected segments [N, 4] i64, got ", segments.desc());
  std::vector<Segment> out(size_t(segments.shape()[0]));
  const int64_t* p = static_cast<const int64_t*>(segments.data());
  const int64_t s0 = segments.strides()[0], s1 = segments.strides()[1];
  for (size_t n = 0; n < out.size(); ++n) {
    const int64_t* r = p + int64_t(n) * s0;
    out[n] = {r[0], r[s1], r[2 * s1], r[3 * s1]};
  }
  return out;
}

// Token-stream operands: [T, H, D] with unit last stride.
template <class T>
T* token_ptr(const View& t, int64_t token, int64_t h) {
  return static_cast<T*>(t.data()) + token * t.strides()[0] + h * t.strides()[1];
}

template <class T>
T simd_dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

template <class T>
void simd_axpy(T alpha, const T* __restrict x, T* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

template <class T>
T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return vexp(x);
  } else {
    return std::exp(x);
  }
}

struct VarlenGeometry {
  int64_t T, H, D, Dv, W;
  VarlenGeometry(const View& q, const View& k, const View& v, const std::vector<Segment>& segs) {
    RF_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.strides()[2] == 1 &&
                 k.strides()[2] == 1 && v.strides()[2] == 1,
             "attention_varlen kernel: expected q, k, v [T, H, D] with unit last stride, got ",
             q.desc(), ", ", k.desc(), ", ", v.desc());
    T = q.shape()[0];
    H = q.shape()[1];
    D = q.shape()[2];
    Dv = v.shape()[2];
    int64_t longest = 0;
    for (const Segment& s : segs) longest = std::max(longest, s.length);
    W = keep_words(longest);
  }
};

// The segment's rows of head h of a [T, H, D] operand, transposed into
// out [D, L]: a query row's scores (or a gradient row's products with V) are
// then D axpys over the keys, which vectorise without horizontal sums.
template <class T>
void transpose_head(const View& x, int64_t start, int64_t L, int64_t h, int64_t D,
                    std::vector<T>& out) {
  out.resize(size_t(D * L));
  for (int64_t j = 0; j < L; ++j) {
    const T* row = token_ptr<const T>(x, start + j, h);
    for (int64_t c = 0; c < D; ++c) out[size_t(c * L + j)] = row[c];
  }
}

// x[0..L) = scale * (a . columns of xt [D, L]).
template <class T>
void row_products(const T* a, const std::vector<T>& xt, int64_t D, int64_t L, T scale, T* x) {
  std::fill(x, x + L, T(0));
  for (int64_t c = 0; c < D; ++c) simd_axpy(a[c], xt.data() + c * L, x, L);
  if (scale != T(1))
    for (int64_t j = 0; j < L; ++j) x[j] *= scale;
}

template <class T>
void varlen_forward(const AttentionParams& params, const View& q, const View& k, const View& v,
                    const std::vector<Segment>& segs, const View& out, const View& lse,
                    const View& keep_bits) {
  const VarlenGeometry g(q, k, v, segs);
  const bool drop = params.dropout_p > 0.0;
  const uint32_t threshold = dropout_threshold(params.dropout_p);
  const T inv_keep = drop ? T(1.0 / (1.0 - params.dropout_p)) : T(1);
  const T scale = T(params.scale);
  T* plse = lse.data_as<T>();
  uint32_t* all_bits = drop ? reinterpret_cast<uint32_t*>(keep_bits.data_as<int32_t>()) : nullptr;
  const int64_t items = int64_t(segs.size()) * g.H;
  RegionErrors errors;
#pragma omp parallel
  {
    std::vector<T> x, kt;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item)
      errors.guard([&] {
        const Segment& s = segs[size_t(item / g.H)];
        const int64_t h = item % g.H, L = s.length;
        x.resize(size_t(L));
        transpose_head(k, s.start, L, h, g.D, kt);
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = s.start + i;
          row_products(token_ptr<const T>(q, t, h), kt, g.D, L, scale, x.data());
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < L; ++j) m = std::max(m, x[size_t(j)]);
          T total = 0;
          for (int64_t j = 0; j < L; ++j) {
            x[size_t(j)] = exp_of(x[size_t(j)] - m);
            total += x[size_t(j)];
          }
          plse[t * g.H + h] = m + std::log(total);
          uint32_t* bits = nullptr;
          if (drop) {
            bits = all_bits + (t * g.H + h) * g.W;
            draw_keep_row(params.dropout, uint32_t(params.dropout.first_sequence + s.row),
                          uint32_t(s.position + i), uint32_t(h), L, threshold, bits);
          }
          T* oi = token_ptr<T>(out, t, h);
          std::fill(oi, oi + g.Dv, T(0));
          const T inv_total = T(1) / total;
          for (int64_t j = 0; j < L; ++j) {
            T p = x[size_t(j)] * inv_total;
            if (drop) p *= ((bits[j >> 5] >> (j & 31)) & 1u) ? inv_keep : T(0);
            if (p != T(0)) simd_axpy(p, token_ptr<const T>(v, s.start + j, h), oi, g.Dv);
          }
        }
      });
  }
  errors.rethrow();
}

template <class T>
void varlen_backward(const AttentionParams& params, const View& q, const View& k, const View& v,
                     const std::vector<Segment>& segs, const View& out, const View& lse,
                     const View& keep_bits, const View& grad_out, const View& grad_q,
                     const View& grad_k, const View& grad_v) {
  const VarlenGeometry g(q, k, v, segs);
  const bool drop = params.dropout_p > 0.0;
  const T inv_keep = drop ? T(1.0 / (1.0 - params.dropout_p)) : T(1);
  const T scale = T(params.scale);
  const T* plse = lse.data_as<T>();
  const uint32_t* all_bits =
      drop ? reinterpret_cast<const uint32_t*>(keep_bits.data_as<int32_t>()) : nullptr;
  const int64_t items = int64_t(segs.size()) * g.H;
  RegionErrors errors;
#pragma omp parallel
  {
    std::vector<T> kt, vt, p, dp;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item)
      errors.guard([&] {
        const Segment& s = segs[size_t(item / g.H)];
        const int64_t h = item % g.H, L = s.length;
        transpose_head(k, s.start, L, h, g.D, kt);
        transpose_head(v, s.start, L, h, g.Dv, vt);
        p.resize(size_t(L));
        dp.resize(size_t(L));
        for (int64_t j = 0; j < L; ++j) {
          T* dkj = token_ptr<T>(grad_k, s.start + j, h);
          T* dvj = token_ptr<T>(grad_v, s.start + j, h);
          std::fill(dkj, dkj + g.D, T(0));
          std::fill(dvj, dvj + g.Dv, T(0));
        }
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = s.start + i;
          T* dqi = token_ptr<T>(grad_q, t, h);
          std::fill(dqi, dqi + g.D, T(0));
          const T* qi = token_ptr<const T>(q, t, h);
          const T* goi = token_ptr<const T>(grad_out, t, h);
          const T Di = simd_dot(goi, token_ptr<const T>(out, t, h), g.Dv);  // dO_i . O_i
          const T row_lse = plse[t * g.H + h];
          const uint32_t* bits = drop ? all_bits + (t * g.H + h) * g.W : nullptr;
          row_products(qi, kt, g.D, L, scale, p.data());    // scores
          row_products(goi, vt, g.Dv, L, T(1), dp.data());  // dPd_ij = dO_i . v_j
          for (int64_t j = 0; j < L; ++j) {
            const T pj = exp_of(p[size_t(j)] - row_lse);
            const T z = drop ? (((bits[j >> 5] >> (j & 31)) & 1u) ? inv_keep : T(0)) : T(1);
            const T ds = pj * (dp[size_t(j)] * z - Di) * scale;
            simd_axpy(ds, token_ptr<const T>(k, s.start + j, h), dqi, g.D);
            simd_axpy(ds, qi, token_ptr<T>(grad_k, s.start + j, h), g.D);
            if (pj * z != T(0)) simd_axpy(pj * z, goi, token_ptr<T>(grad_v, s.start + j, h), g.Dv);
          }
        }
      });
  }
  errors.rethrow();
}

// --- f32 and bf16: per-(segment, head) GEMMs on a zero-padded scratch ---------------------

// Segment lengths rounded up: to 8 up to 32 (short fine-tuning texts), then
// to 32, so that few primitive geometries (cached) serve every length.
int64_t varlen_bucket(int64_t L) {
  return L <= 32 ? (L + 7) / 8 * 8 : (L + 31) / 32 * 32;
}

// Copies the segment's rows [start, start + L) of head h of a [T, H, cols]
// operand into dst [Lp, cols] (contiguous) and zeroes rows [L, Lp).
template <class E>
void load_segment_rows(const View& x, int64_t start, int64_t L, int64_t Lp, int64_t h, int64_t cols,
                       E* dst) {
  for (int64_t j = 0; j < L; ++j)
    std::copy_n(token_ptr<const E>(x, start + j, h), cols, dst + j * cols);
  std::fill(dst + L * cols, dst + Lp * cols, E{});
}

void load_segment_head(const View& x, int64_t start, int64_t L, int64_t Lp, int64_t h, int64_t cols,
                       void* dst) {
  if (x.dtype() == DType::bf16) {
    load_segment_rows(x, start, L, Lp, h, cols, static_cast<bf16*>(dst));
  } else {
    load_segment_rows(x, start, L, Lp, h, cols, static_cast<float*>(dst));
  }
}

// Rows [0, L) of src [., cols] into the segment's rows of head h of x (f32,
// or bf16 rounded once).
void store_segment_head(const float* src, int64_t L, int64_t cols, const View& x, int64_t start,
                        int64_t h) {
  const int64_t row_stride = x.strides()[0];
  if (x.dtype() == DType::bf16) {
    store_rows(src, L, cols, token_ptr<bf16>(x, start, h), DType::bf16, row_stride);
  } else {
    store_rows(src, L, cols, token_ptr<float>(x, start, h), DType::f32, row_stride);
  }
}

// The GEMMs of one bucketed length Lp: operands [Lp, D] / [Lp, Dv] in the
// gemm dtype, scores [Lp, Lp] f32 (bf16 where they enter a product).
struct VarlenGemms {
  std::shared_ptr<HeadGemm> qk, pv, dov, dv, dq, dk;
};

// Per bucket present in segs (indexed by bucket / 8), built before the
// parallel region.
std::vector<VarlenGemms> varlen_gemms(const std::vector<Segment>& segs, int64_t D, int64_t Dv,
                                      DType dtype, bool backward) {
  std::vector<VarlenGemms> out;
  for (const Segment& s : segs) {
    if (s.length == 0) continue;
    const int64_t Lp = varlen_bucket(s.length);
    if (size_t(Lp / 8) >= out.size()) out.resize(size_t(Lp / 8 + 1));
    VarlenGemms& g = out[size_t(Lp / 8)];
    if (g.qk) continue;
    const Matrix q{Lp, D, D, 1, dtype}, v{Lp, Dv, Dv, 1, dtype};
    const Matrix square{Lp, Lp, Lp, 1}, square_in = square.as(dtype);
    const Matrix out_v{Lp, Dv, Dv, 1}, out_q{Lp, D, D, 1};
    g.qk = head_gemm(q, q.t(), square);  // S = Q K^T
    if (!backward) {
      g.pv = head_gemm(square_in, v, out_v);  // O = P V
      continue;
    }
    g.dov = head_gemm(v, v.t(), square);        // dPd = dO V^T
    g.dv = head_gemm(square_in.t(), v, out_v);  // dV = Pd^T dO
    g.dq = head_gemm(square_in, q, out_q);      // dQ = dS K
    g.dk = head_gemm(square_in.t(), q, out_q);  // dK = dS^T Q
  }
  return out;
}

int64_t longest_bucket(const std::vector<Segment>& segs) {
  int64_t longest = 0;
  for (const Segment& s : segs) longest = std::max(longest, varlen_bucket(s.length));
  return longest;
}

// What both directions set up: the geometry, dropout and scale, the GEMMs of
// every bucket present, the per-row no-mask vectors and the thread count.
struct VarlenPlan {
  VarlenGeometry g;
  bool drop, low;
  float inv_keep, scale;
  int64_t esize;
  std::vector<VarlenGemms> gemms;
  int64_t Lm;  // longest bucketed length
  std::vector<float> no_mask, all_kept;
  int64_t items;
  int threads;
  VarlenPlan(const AttentionParams& params, const View& q, const View& k, const View& v,
             const std::vector<Segment>& segs, bool backward)
      : g(q, k, v, segs),
        drop(params.dropout_p > 0.0),
        low(q.dtype() == DType::bf16),
        inv_keep(drop ? float(1.0 / (1.0 - params.dropout_p)) : 1.0f),
        scale(float(params.scale)),
        esize(int64_t(dtype_size(q.dtype()))),
        gemms(varlen_gemms(segs, g.D, g.Dv, q.dtype(), backward)),
        Lm(longest_bucket(segs)),
        no_mask(size_t(Lm), 0.0f),
        all_kept(size_t(Lm), 1.0f),
        items(int64_t(segs.size()) * g.H),
        threads(int(std::clamp<int64_t>(items, 1, omp_get_max_threads()))) {}
};

// One work item: its segment, head, length, bucketed length and GEMMs, with
// its q, k, v rows loaded into the thread's scratch qs | ks | vs.
struct VarlenItem {
  const Segment& s;
  int64_t h, L, Lp;
  const VarlenGemms* gm;
  char *qs, *ks, *vs;
};
VarlenItem load_item(const VarlenPlan& p, const std::vector<Segment>& segs, int64_t item,
                     const View& q, const View& k, const View& v, char* qs) {
  const Segment& s = segs[size_t(item / p.g.H)];
  VarlenItem it{s, item % p.g.H, s.length, varlen_bucket(s.length), nullptr, qs, nullptr, nullptr};
  it.ks = qs + p.Lm * p.g.D * p.esize;
  it.vs = it.ks + p.Lm * p.g.D * p.esize;
  if (it.L == 0) return it;
  it.gm = &p.gemms[size_t(it.Lp / 8)];
  load_segment_head(q, s.start, it.L, it.Lp, it.h, p.g.D, it.qs);
  load_segment_head(k, s.start, it.L, it.Lp, it.h, p.g.D, it.ks);
  load_segment_head(v, s.start, it.L, it.Lp, it.h, p.g.Dv, it.vs);
  return it;
}

void varlen_forward_gemm(const AttentionParams& params, const View& q, const View& k, const View& v,
                         const std::vector<Segment>& segs, const View& out, const View& lse,
                         const View& keep_bits) {
  const VarlenPlan p(params, q, k, v, segs, false);
  const VarlenGeometry& g = p.g;
  const int64_t Lm = p.Lm;
  const uint32_t threshold = dropout_threshold(params.dropout_p);
  float* plse = lse.data_as<float>();
  uint32_t* all_bits = p.drop ? reinterpret_cast<uint32_t*>(keep_bits.data_as<int32_t>()) : nullptr;
  // Per thread: q, k, v rows in the gemm dtype (sized in floats, which hold
  // either dtype); scores (f32 and bf16) and output rows.
  const int64_t operand_floats = Lm * (2 * g.D + g.Dv);
  const int64_t floats = Lm * Lm + Lm * g.Dv;
  const Scratch operands({p.threads, operand_floats}, DType::f32);
  const Scratch scores({p.threads, floats}, DType::f32);
  const Scratch scores_low({p.low ? p.threads : 0, Lm * Lm}, DType::bf16);
  RegionErrors errors;
#pragma omp parallel num_threads(p.threads)
  {
    const int tid = omp_get_thread_num();
    char* qs = reinterpret_cast<char*>(operands.view().data_as<float>() + tid * operand_floats);
    float* ps = scores.view().data_as<float>() + tid * floats;
    float* os = ps + Lm * Lm;
    bf16* pl = p.low ? scores_low.view().data_as<bf16>() + tid * Lm * Lm : nullptr;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < p.items; ++item)
      errors.guard([&] {
        const VarlenItem it = load_item(p, segs, item, q, k, v, qs);
        const int64_t h = it.h, L = it.L, Lp = it.Lp;
        if (L == 0) return;
        run(*it.gm->qk, it.qs, it.ks, ps);
        for (int64_t i = 0; i < Lp; ++i) {
          float* x = ps + i * Lp;
          if (i < L) {
            const int64_t t = it.s.start + i;
            const float m = scale_mask_max(x, p.no_mask.data(), p.scale, L);
            const float total = exp_sum(x, p.all_kept.data(), m, L);
            plse[t * g.H + h] = m + std::log(total);
            if (p.drop) {
              uint32_t* bits = all_bits + (t * g.H + h) * g.W;
              draw_keep_row(params.dropout, uint32_t(params.dropout.first_sequence + it.s.row),
                            uint32_t(it.s.position + i), uint32_t(h), L, threshold, bits);
              scale_kept(x, bits, p.inv_keep / total, L);
            } else {
              const float inv = 1.0f / total;
#pragma omp simd
              for (int64_t j = 0; j < L; ++j) x[j] *= inv;
            }
            std::fill(x + L, x + Lp, 0.0f);  // padding keys
          } else {
            std::fill(x, x + Lp, 0.0f);  // padding rows
          }
          if (p.low) to_bf16_row(x, pl + i * Lp, Lp);
        }
        run(*it.gm->pv, p.low ? static_cast<const void*>(pl) : ps, it.vs, os);
        store_segment_head(os, L, g.Dv, out, it.s.start, h);
      });
  }
  errors.rethrow();
}

void varlen_backward_gemm(const AttentionParams& params, const View& q, const View& k,
                          const View& v, const std::vector<Segment>& segs, const View& out,
                          const View& lse, const View& keep_bits, const View& grad_out,
                          const View& grad_q, const View& grad_k, const View& grad_v) {
  const VarlenPlan p(params, q, k, v, segs, true);
  const VarlenGeometry& g = p.g;
  const int64_t Lm = p.Lm;
  const float* plse = lse.data_as<float>();
  const uint32_t* all_bits =
      p.drop ? reinterpret_cast<const uint32_t*>(keep_bits.data_as<int32_t>()) : nullptr;
  // Per thread: q, k, v, dO rows (gemm dtype); Pd, dS (f32 and bf16); dq, dk, dv rows.
  const int64_t operand_floats = Lm * 2 * (g.D + g.Dv);
  const int64_t floats = 2 * Lm * Lm + Lm * (2 * g.D + g.Dv);
  const Scratch operands({p.threads, operand_floats}, DType::f32);
  const Scratch scores({p.threads, floats}, DType::f32);
  const Scratch scores_low({p.low ? p.threads : 0, 2 * Lm * Lm}, DType::bf16);
  RegionErrors errors;
#pragma omp parallel num_threads(p.threads)
  {
    const int tid = omp_get_thread_num();
    char* qs = reinterpret_cast<char*>(operands.view().data_as<float>() + tid * operand_floats);
    char* dos = qs + Lm * (2 * g.D + g.Dv) * p.esize;
    float* pp = scores.view().data_as<float>() + tid * floats;
    float* pdp = pp + Lm * Lm;
    float* dqs = pdp + Lm * Lm;
    float* dks = dqs + Lm * g.D;
    float* dvs = dks + Lm * g.D;
    bf16* pl = p.low ? scores_low.view().data_as<bf16>() + tid * 2 * Lm * Lm : nullptr;
    bf16* pdl = p.low ? pl + Lm * Lm : nullptr;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < p.items; ++item)
      errors.guard([&] {
        const VarlenItem it = load_item(p, segs, item, q, k, v, qs);
        const int64_t h = it.h, L = it.L, Lp = it.Lp;
        if (L == 0) return;
        load_segment_head(grad_out, it.s.start, L, Lp, h, g.Dv, dos);
        run(*it.gm->qk, it.qs, it.ks, pp);
        run(*it.gm->dov, dos, it.vs, pdp);
        for (int64_t i = 0; i < Lp; ++i) {
          float* x = pp + i * Lp;
          float* y = pdp + i * Lp;
          if (i < L) {
            const int64_t t = it.s.start + i;
            // D_i = sum_j Pd_ij dPd_ij = dO_i . O_i
            const float D = dot_f32(dos + i * g.Dv * p.esize, q.dtype(),
                                    out.dtype() == DType::bf16
                                        ? static_cast<const void*>(token_ptr<const bf16>(out, t, h))
                                        : token_ptr<const float>(out, t, h),
                                    out.dtype(), g.Dv);
            backward_row(x, y, p.no_mask.data(), p.all_kept.data(),
                         p.drop ? all_bits + (t * g.H + h) * g.W : nullptr, p.scale,
                         plse[t * g.H + h], D, p.inv_keep, L);
            std::fill(x + L, x + Lp, 0.0f);  // padding keys
            std::fill(y + L, y + Lp, 0.0f);
          } else {
            std::fill(x, x + Lp, 0.0f);  // padding rows
            std::fill(y, y + Lp, 0.0f);
          }
          if (p.low) {
            to_bf16_row(x, pl + i * Lp, Lp);
            to_bf16_row(y, pdl + i * Lp, Lp);
          }
        }
        const void* p_in = p.low ? static_cast<const void*>(pl) : pp;
        const void* ds_in = p.low ? static_cast<const void*>(pdl) : pdp;
        run(*it.gm->dv, p_in, dos, dvs);
        run(*it.gm->dq, ds_in, it.ks, dqs);
        run(*it.gm->dk, ds_in, it.qs, dks);
        store_segment_head(dqs, L, g.D, grad_q, it.s.start, h);
        store_segment_head(dks, L, g.D, grad_k, it.s.start, h);
        store_segment_head(dvs, L, g.Dv, grad_v, it.s.start, h);
      });
  }
  errors.rethrow();
}

}  // namespace

void attention_varlen_forward(Stream, const AttentionParams& params, KT q, KT k, KT v, KT segments,
                              KT out, KT lse, KT keep_bits) {
  check_attention_forward_dtypes("attention_varlen kernel", q, k, v, out, lse);
  const View vq(q), vk(k), vv(v);
  const std::vector<Segment> segs = read_segments(View(segments));
  if (vq.dtype() == DType::f32 || vq.dtype() == DType::bf16) {
    varlen_forward_gemm(params, vq, vk, vv, segs, View(out), View(lse), View(keep_bits));
  } else if (vq.dtype() == DType::f64) {
    varlen_forward<double>(params, vq, vk, vv, segs, View(out), View(lse), View(keep_bits));
  } else {
    throw Error(detail::concat("attention_varlen: no CPU kernel for ", vq.desc()));
  }
}

void attention_varlen_backward(Stream, const AttentionParams& params, KT q, KT k, KT v, KT segments,
                               KT out, KT lse, KT keep_bits, KT grad_out, KT grad_q, KT grad_k,
                               KT grad_v) {
  check_attention_backward_dtypes("attention_varlen kernel", q, k, v, out, lse, grad_out, grad_q,
                                  grad_k, grad_v);
  const View vq(q), vk(k), vv(v);
  const std::vector<Segment> segs = read_segments(View(segments));
  if (vq.dtype() == DType::f32 || vq.dtype() == DType::bf16) {
    varlen_backward_gemm(params, vq, vk, vv, segs, View(out), View(lse), View(keep_bits),
                         View(grad_out), View(grad_q), View(grad_k), View(grad_v));
  } else if (vq.dtype() == DType::f64) {
    varlen_backward<double>(params, vq, vk, vv, segs, View(out), View(lse), View(keep_bits),
                            View(grad_out), View(grad_q), View(grad_k), View(grad_v));
  } else {
    throw Error(detail::concat("attention_varlen: no CPU kernel for ", vq.desc()));
  }
}

}  // namespace roformer::kernels::cpu
