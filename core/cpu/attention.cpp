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
#include <vector>

#include "core/cpu/attention_rows.h"
#include "core/cpu/strided_loop.h"
#include "core/cpu/vector_math.h"
#include "core/kernels/attention_dtypes.h"
#include "core/philox.h"

namespace roformer::kernels::cpu {

namespace {

using namespace attention_detail;

// What the loops below read: the list's arguments as Views.
struct AttentionArgs {
  View q, k, v;   // [B, H, Sq, D], [B, H, Sk, D], [B, H, Sk, Dv]; unit stride in the last dim
  View key_mask;  // [B, Sk], nonzero = attend, or undefined
  double scale = 1.0;
  // Dropout on the probabilities: keep bits are drawn in forward by the
  // shared rule of core/philox.h at this site and read back in backward.
  double dropout_p = 0.0;
  DropoutKey dropout;
  AttentionArgs(const AttentionParams& p, KT q_kt, KT k_kt, KT v_kt, KT mask_kt)
      : q(q_kt),
        k(k_kt),
        v(v_kt),
        key_mask(mask_kt),
        scale(p.scale),
        dropout_p(p.dropout_p),
        dropout(p.dropout) {
    RF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.strides()[3] == 1 &&
                 k.strides()[3] == 1 && v.strides()[3] == 1,
             "attention kernel: expected q, k, v [B, H, S, D] with unit last stride, got ",
             q.desc(), ", ", k.desc(), ", ", v.desc());
  }
};

// Keep bits of query i of batch row b, head h (the padded layout), by the
// shared rule (draw_keep_row in core/cpu/attention_rows.h).
void draw_keep_bits(const AttentionArgs& args, int64_t b, int64_t h, int64_t i, int64_t n,
                    uint32_t threshold, uint32_t* words) {
  draw_keep_row(args.dropout, uint32_t(args.dropout.first_sequence + b), uint32_t(i), uint32_t(h),
                n, threshold, words);
}

// Additive key mask (0 or -inf) and multiplicative keep (1 or 0) per key of
// batch element b, read from the mask tensor [B, Sk] (any dtype, any strides).
struct KeyMask {
  std::vector<float> add, keep;
  std::vector<uint8_t> kept;
  KeyMask(const View& mask, int64_t batch, int64_t sk)
      : add(size_t(batch * sk), 0.0f), keep(size_t(batch * sk), 1.0f), kept(size_t(batch * sk), 1) {
    if (!mask.defined()) return;
    RF_CHECK(mask.dim() == 2 && mask.shape()[0] == batch && mask.shape()[1] == sk,
             "attention kernel: key mask ", mask.desc(), " is not [", batch, ", ", sk, "]");
    dispatch_all(mask.dtype(), [&](auto tag) {
      using M = decltype(tag);
      const M* p = static_cast<const M*>(mask.data());
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t j = 0; j < sk; ++j) {
          if (float(p[b * mask.strides()[0] + j * mask.strides()[1]]) != 0.0f) continue;
          const size_t i = size_t(b * sk + j);
          add[i] = -std::numeric_limits<float>::infinity();
          keep[i] = 0.0f;
          kept[i] = 0;
        }
    });
  }
};

struct Dims {
  int64_t B, H, Sq, Sk, D, Dv;
  explicit Dims(const AttentionArgs& a)
      : B(a.q.shape()[0]),
        H(a.q.shape()[1]),
        Sq(a.q.shape()[2]),
        Sk(a.k.shape()[2]),
        D(a.q.shape()[3]),
        Dv(a.v.shape()[3]) {}
};

// Element pointer of t at (b, h, i) (unit stride in the last dim).
template <class T>
T* row_ptr(const View& t, int64_t b, int64_t h, int64_t i) {
  const Shape& s = t.strides();
  return static_cast<T*>(t.data()) + b * s[0] + h * s[1] + i * s[2];
}

// --- f32 and bf16: per-head oneDNN GEMMs + fused f32 row loops, parallel over (batch, head) ---

// Threads working on heads (and so per-thread S x S buffers): no more than heads.
int head_threads(const Dims& d) {
  return int(std::clamp<int64_t>(d.B * d.H, 1, omp_get_max_threads()));
}

// The [rows, cols] matrix of head (b, h) of a [B, H, S, D] tensor.
Matrix head_matrix(const View& t) {
  return {t.shape()[2], t.shape()[3], t.strides()[2], 1, t.dtype()};
}
template <class T>
T* head_ptr(const View& t, int64_t b, int64_t h) {
  return static_cast<T*>(t.data()) + b * t.strides()[0] + h * t.strides()[1];
}
// The same (at row i) for a view of either GEMM dtype (f32, bf16).
const void* head_bytes(const View& t, int64_t b, int64_t h, int64_t i = 0) {
  return static_cast<const char*>(t.data()) +
         (b * t.strides()[0] + h * t.strides()[1] + i * t.strides()[2]) *
             int64_t(dtype_size(t.dtype()));
}

void forward_gemm(const AttentionArgs& args, const View& out, const View& lse,
                  const View& keep_bits) {
  const Dims d(args);
  const KeyMask mask(args.key_mask, d.B, d.Sk);
  const bool drop = args.dropout_p > 0.0;
  const uint32_t threshold = dropout_threshold(args.dropout_p);
  const float inv_keep = drop ? float(1.0 / (1.0 - args.dropout_p)) : 1.0f;
  const float scale = float(args.scale);
  const int64_t W = keep_words(d.Sk);
  const Matrix scores{d.Sq, d.Sk, d.Sk, 1};
  // bf16 q, k, v: the probabilities enter the second product as bf16.
  const DType gemm_dtype = args.q.dtype();
  const bool low = gemm_dtype == DType::bf16;
  // A bf16 out: the product goes to a per-thread f32 head, then rounded once.
  const bool out_low = out.dtype() == DType::bf16;
  const Matrix out_f32{d.Sq, d.Dv, d.Dv, 1};
  const auto qk = head_gemm(head_matrix(args.q), head_matrix(args.k).t(), scores);
  const auto pv =
      head_gemm(scores.as(gemm_dtype), head_matrix(args.v), out_low ? out_f32 : head_matrix(out));
  float* plse = lse.data_as<float>();
  uint32_t* all_bits = drop ? reinterpret_cast<uint32_t*>(keep_bits.data_as<int32_t>()) : nullptr;
  // One S x S scores buffer per thread (and its bf16 copy).
  const int threads = head_threads(d);
  const Scratch scratch({threads, d.Sq * d.Sk}, DType::f32);
  const Scratch scratch_low({low ? threads : 0, d.Sq * d.Sk}, DType::bf16);
  const Scratch scratch_out({out_low ? threads : 0, d.Sq * d.Dv}, DType::f32);
  RegionErrors errors;
#pragma omp parallel num_threads(threads)
  {
    float* ps = scratch.view().data_as<float>() + omp_get_thread_num() * d.Sq * d.Sk;
    bf16* pl =
        low ? scratch_low.view().data_as<bf16>() + omp_get_thread_num() * d.Sq * d.Sk : nullptr;
    float* po = out_low ? scratch_out.view().data_as<float>() + omp_get_thread_num() * d.Sq * d.Dv
                        : nullptr;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < d.B * d.H; ++bh)
      errors.guard([&] {
        const int64_t b = bh / d.H, h = bh % d.H;
        run(*qk, head_bytes(args.q, b, h), head_bytes(args.k, b, h), ps);
        const float* add = mask.add.data() + b * d.Sk;
        const float* keep = mask.keep.data() + b * d.Sk;
        for (int64_t i = 0; i < d.Sq; ++i) {
          const int64_t global_row = bh * d.Sq + i;
          float* x = ps + i * d.Sk;
          const float m = scale_mask_max(x, add, scale, d.Sk);
          uint32_t* bits = drop ? all_bits + global_row * W : nullptr;
          if (drop) draw_keep_bits(args, b, h, i, d.Sk, threshold, bits);
          if (m == -std::numeric_limits<float>::infinity()) {  // no key to attend to
            std::fill(x, x + d.Sk, 0.0f);
            if (low) to_bf16_row(x, pl + i * d.Sk, d.Sk);
            plse[global_row] = m;
            continue;
          }
          const float total = exp_sum(x, keep, m, d.Sk);
          plse[global_row] = m + std::log(total);
          if (drop) {
            scale_kept(x, bits, inv_keep / total, d.Sk);
          } else {
            const float inv = 1.0f / total;
#pragma omp simd
            for (int64_t j = 0; j < d.Sk; ++j) x[j] *= inv;
          }
          if (low) to_bf16_row(x, pl + i * d.Sk, d.Sk);
        }
        const void* p_in = low ? static_cast<const void*>(pl) : ps;
        if (out_low) {
          run(*pv, p_in, head_bytes(args.v, b, h), po);
          store_rows(po, d.Sq, d.Dv, head_ptr<bf16>(out, b, h), DType::bf16, out.strides()[2]);
        } else {
          run(*pv, p_in, head_bytes(args.v, b, h), head_ptr<float>(out, b, h));
        }
      });
  }
  errors.rethrow();
}

void backward_gemm(const AttentionArgs& args, const View& out, const View& lse,
                   const View& keep_bits, const View& grad_out, const View& grad_q,
                   const View& grad_k, const View& grad_v) {
  const Dims d(args);
  const KeyMask mask(args.key_mask, d.B, d.Sk);
  const bool drop = args.dropout_p > 0.0;
  const float inv_keep = drop ? float(1.0 / (1.0 - args.dropout_p)) : 1.0f;
  const float scale = float(args.scale);
  const int64_t W = keep_words(d.Sk);
  const Matrix square{d.Sq, d.Sk, d.Sk, 1};
  const Matrix q = head_matrix(args.q), k = head_matrix(args.k), v = head_matrix(args.v);
  const Matrix dO = head_matrix(grad_out);
  // bf16 q, k, v, dO: Pd and dS enter the last three products as bf16.
  const DType gemm_dtype = args.q.dtype();
  const bool low = gemm_dtype == DType::bf16;
  // bf16 gradients: the products go to per-thread f32 heads, then rounded once.
  const bool grad_low = grad_q.dtype() == DType::bf16;
  auto grad_matrix = [&](const View& g) {
    return grad_low ? Matrix{g.shape()[2], g.shape()[3], g.shape()[3], 1} : head_matrix(g);
  };
  const Matrix dv_c = grad_matrix(grad_v), dq_c = grad_matrix(grad_q), dk_c = grad_matrix(grad_k);
  const Matrix square_in = square.as(gemm_dtype);
  const auto qk = head_gemm(q, k.t(), square);              // S = Q K^T
  const auto dov = head_gemm(dO, v.t(), square);            // dPd = dO V^T
  const auto dv_gemm = head_gemm(square_in.t(), dO, dv_c);  // dV = Pd^T dO
  const auto dq_gemm = head_gemm(square_in, k, dq_c);       // dQ = dS K
  const auto dk_gemm = head_gemm(square_in.t(), q, dk_c);   // dK = dS^T Q
  const int64_t grad_floats = d.Sk * d.Dv + d.Sq * d.D + d.Sk * d.D;
  const float* plse = lse.data_as<float>();
  const uint32_t* all_bits =
      drop ? reinterpret_cast<const uint32_t*>(keep_bits.data_as<int32_t>()) : nullptr;
  // Per thread, the probabilities and their gradient for the head at hand
  // (and their bf16 copies).
  const int threads = head_threads(d);
  const Scratch scratch({threads, 2 * d.Sq * d.Sk}, DType::f32);
  const Scratch scratch_low({low ? threads : 0, 2 * d.Sq * d.Sk}, DType::bf16);
  const Scratch scratch_grads({grad_low ? threads : 0, grad_floats}, DType::f32);
  RegionErrors errors;
#pragma omp parallel num_threads(threads)
  {
    float* pp = scratch.view().data_as<float>() + omp_get_thread_num() * 2 * d.Sq * d.Sk;
    float* pdp = pp + d.Sq * d.Sk;
    bf16* pl =
        low ? scratch_low.view().data_as<bf16>() + omp_get_thread_num() * 2 * d.Sq * d.Sk : nullptr;
    bf16* pdl = low ? pl + d.Sq * d.Sk : nullptr;
    float* dvs = grad_low
                     ? scratch_grads.view().data_as<float>() + omp_get_thread_num() * grad_floats
                     : nullptr;
    float* dqs = grad_low ? dvs + d.Sk * d.Dv : nullptr;
    float* dks = grad_low ? dqs + d.Sq * d.D : nullptr;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < d.B * d.H; ++bh)
      errors.guard([&] {
        const int64_t b = bh / d.H, h = bh % d.H;
        const void* qh = head_bytes(args.q, b, h);
        const void* kh = head_bytes(args.k, b, h);
        const void* dOh = head_bytes(grad_out, b, h);
        run(*qk, qh, kh, pp);
        run(*dov, dOh, head_bytes(args.v, b, h), pdp);
        for (int64_t i = 0; i < d.Sq; ++i) {
          const int64_t global_row = bh * d.Sq + i;
          float* x = pp + i * d.Sk;
          float* y = pdp + i * d.Sk;
          const float row_lse = plse[global_row];
          if (row_lse == -std::numeric_limits<float>::infinity()) {
            std::fill(x, x + d.Sk, 0.0f);
            std::fill(y, y + d.Sk, 0.0f);
          } else {
            // D_i = sum_j Pd_ij dPd_ij = dO_i . O_i
            const float D = dot_f32(head_bytes(grad_out, b, h, i), gemm_dtype,
                                    head_bytes(out, b, h, i), out.dtype(), d.Dv);
            backward_row(x, y, mask.add.data() + b * d.Sk, mask.keep.data() + b * d.Sk,
                         drop ? all_bits + global_row * W : nullptr, scale, row_lse, D, inv_keep,
                         d.Sk);
          }
          if (low) {
            to_bf16_row(x, pl + i * d.Sk, d.Sk);
            to_bf16_row(y, pdl + i * d.Sk, d.Sk);
          }
        }
        const void* p_in = low ? static_cast<const void*>(pl) : pp;
        const void* ds_in = low ? static_cast<const void*>(pdl) : pdp;
        if (grad_low) {
          run(*dv_gemm, p_in, dOh, dvs);
          run(*dq_gemm, ds_in, kh, dqs);
          run(*dk_gemm, ds_in, qh, dks);
          store_rows(dvs, d.Sk, d.Dv, head_ptr<bf16>(grad_v, b, h), DType::bf16,
                     grad_v.strides()[2]);
          store_rows(dqs, d.Sq, d.D, head_ptr<bf16>(grad_q, b, h), DType::bf16,
                     grad_q.strides()[2]);
          store_rows(dks, d.Sk, d.D, head_ptr<bf16>(grad_k, b, h), DType::bf16,
                     grad_k.strides()[2]);
        } else {
          run(*dv_gemm, p_in, dOh, head_ptr<float>(grad_v, b, h));
          run(*dq_gemm, ds_in, kh, head_ptr<float>(grad_q, b, h));
          run(*dk_gemm, ds_in, qh, head_ptr<float>(grad_k, b, h));
        }
      });
  }
  errors.rethrow();
}

// --- f64 (and reference): plain loops, parallel over (batch, head) ----------------

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

template <class T>
void forward_loop(const AttentionArgs& args, const View& out, const View& lse,
                  const View& keep_bits) {
  const Dims d(args);
  const bool drop = args.dropout_p > 0.0;
  const uint32_t threshold = dropout_threshold(args.dropout_p);
  const T inv_keep = drop ? T(1.0 / (1.0 - args.dropout_p)) : T(1);
  const int64_t W = keep_words(d.Sk);
  const KeyMask mask(args.key_mask, d.B, d.Sk);
  T* plse = lse.data_as<T>();
  RegionErrors errors;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh)
    errors.guard([&] {
      const int64_t b = bh / d.H, h = bh % d.H;
      std::vector<T> x(size_t(d.Sk));
      for (int64_t i = 0; i < d.Sq; ++i) {
        const int64_t global_row = bh * d.Sq + i;
        const T* qi = row_ptr<const T>(args.q, b, h, i);
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < d.Sk; ++j) {
          const bool kept = mask.kept[size_t(b * d.Sk + j)] != 0;
          x[j] = kept ? T(args.scale) * dot(qi, row_ptr<const T>(args.k, b, h, j), d.D)
                      : -std::numeric_limits<T>::infinity();
          m = std::max(m, x[j]);
        }
        uint32_t* bits = nullptr;
        if (drop) {
          bits = reinterpret_cast<uint32_t*>(keep_bits.data_as<int32_t>()) + global_row * W;
          draw_keep_bits(args, b, h, i, d.Sk, threshold, bits);
        }
        T* oi = row_ptr<T>(out, b, h, i);
        std::fill(oi, oi + d.Dv, T(0));
        if (m == -std::numeric_limits<T>::infinity()) {
          plse[global_row] = m;
          continue;
        }
        T total = 0;
        for (int64_t j = 0; j < d.Sk; ++j) {
          x[j] = std::exp(x[j] - m);
          total += x[j];
        }
        plse[global_row] = m + std::log(total);
        for (int64_t j = 0; j < d.Sk; ++j) {
          T p = x[j] / total;
          if (drop) p *= ((bits[j >> 5] >> (j & 31)) & 1u) ? inv_keep : T(0);
          if (p == T(0)) continue;
          const T* vj = row_ptr<const T>(args.v, b, h, j);
          for (int64_t c = 0; c < d.Dv; ++c) oi[c] += p * vj[c];
        }
      }
    });
  errors.rethrow();
}

template <class T>
void backward_loop(const AttentionArgs& args, const View& out, const View& lse,
                   const View& keep_bits, const View& grad_out, const View& grad_q,
                   const View& grad_k, const View& grad_v) {
  const Dims d(args);
  const bool drop = args.dropout_p > 0.0;
  const T inv_keep = drop ? T(1.0 / (1.0 - args.dropout_p)) : T(1);
  const T scale = T(args.scale);
  const int64_t W = keep_words(d.Sk);
  const KeyMask mask(args.key_mask, d.B, d.Sk);
  const T* plse = lse.data_as<T>();
  RegionErrors errors;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh)
    errors.guard([&] {
      const int64_t b = bh / d.H, h = bh % d.H;
      for (int64_t j = 0; j < d.Sk; ++j) {
        T* dkj = row_ptr<T>(grad_k, b, h, j);
        T* dvj = row_ptr<T>(grad_v, b, h, j);
        std::fill(dkj, dkj + d.D, T(0));
        std::fill(dvj, dvj + d.Dv, T(0));
      }
      for (int64_t i = 0; i < d.Sq; ++i) {
        const int64_t global_row = bh * d.Sq + i;
        T* dqi = row_ptr<T>(grad_q, b, h, i);
        std::fill(dqi, dqi + d.D, T(0));
        const T row_lse = plse[global_row];
        if (row_lse == -std::numeric_limits<T>::infinity()) continue;
        const T* qi = row_ptr<const T>(args.q, b, h, i);
        const T* goi = row_ptr<const T>(grad_out, b, h, i);
        const T D = dot(goi, row_ptr<const T>(out, b, h, i), d.Dv);
        const uint32_t* bits =
            drop ? reinterpret_cast<const uint32_t*>(keep_bits.data_as<int32_t>()) + global_row * W
                 : nullptr;
        for (int64_t j = 0; j < d.Sk; ++j) {
          if (!mask.kept[size_t(b * d.Sk + j)]) continue;
          const T* kj = row_ptr<const T>(args.k, b, h, j);
          const T* vj = row_ptr<const T>(args.v, b, h, j);
          const T p = std::exp(scale * dot(qi, kj, d.D) - row_lse);
          const T z = drop ? (((bits[j >> 5] >> (j & 31)) & 1u) ? inv_keep : T(0)) : T(1);
          const T ds = p * (dot(goi, vj, d.Dv) * z - D) * scale;
          T* dkj = row_ptr<T>(grad_k, b, h, j);
          T* dvj = row_ptr<T>(grad_v, b, h, j);
          for (int64_t c = 0; c < d.D; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
          for (int64_t c = 0; c < d.Dv; ++c) dvj[c] += p * z * goi[c];
        }
      }
    });
  errors.rethrow();
}

}  // namespace

void attention_forward(Stream stream, const AttentionParams& params, KT q, KT k, KT v, KT key_mask,
                       KT out_kt, KT lse_kt, KT keep_bits_kt) {
  check_attention_forward_dtypes("attention kernel", q, k, v, out_kt, lse_kt);
  const AttentionArgs args(params, q, k, v, key_mask);
  const View out(out_kt), lse(lse_kt), keep_bits(keep_bits_kt);
  if (out.numel() == 0) return;
  if (args.k.shape()[2] == 0) {  // no key: zeros, lse -inf (oneDNN builds no empty product)
    fill(stream, out_kt, 0.0);
    fill(stream, lse_kt, -std::numeric_limits<double>::infinity());
    return;
  }
  if (args.q.dtype() == DType::f32 || args.q.dtype() == DType::bf16) {
    forward_gemm(args, out, lse, keep_bits);
  } else if (args.q.dtype() == DType::f64) {
    forward_loop<double>(args, out, lse, keep_bits);
  } else {
    throw Error(detail::concat("attention: no CPU kernel for ", args.q.desc()));
  }
}

void attention_backward(Stream stream, const AttentionParams& params, KT q, KT k, KT v, KT key_mask,
                        KT out_kt, KT lse_kt, KT keep_bits_kt, KT grad_out_kt, KT grad_q_kt,
                        KT grad_k_kt, KT grad_v_kt) {
  check_attention_backward_dtypes("attention kernel", q, k, v, out_kt, lse_kt, grad_out_kt,
                                  grad_q_kt, grad_k_kt, grad_v_kt);
  const AttentionArgs args(params, q, k, v, key_mask);
  if (args.q.shape()[2] == 0 || args.k.shape()[2] == 0) {
    // No query rows or no keys: every gradient is zero (and oneDNN builds no
    // empty product).
    for (KT g : {grad_q_kt, grad_k_kt, grad_v_kt}) fill(stream, g, 0.0);
    return;
  }
  const View out(out_kt), lse(lse_kt), keep_bits(keep_bits_kt), grad_out(grad_out_kt),
      grad_q(grad_q_kt), grad_k(grad_k_kt), grad_v(grad_v_kt);
  if (args.q.dtype() == DType::f32 || args.q.dtype() == DType::bf16) {
    backward_gemm(args, out, lse, keep_bits, grad_out, grad_q, grad_k, grad_v);
  } else if (args.q.dtype() == DType::f64) {
    backward_loop<double>(args, out, lse, keep_bits, grad_out, grad_q, grad_k, grad_v);
  } else {
    throw Error(detail::concat("attention: no CPU kernel for ", args.q.desc()));
  }
}

}  // namespace roformer::kernels::cpu
