// Dropout mask from Philox by the shared rule of core/philox.h: the decision
// for an element depends only on its (sequence, position, feature) and the
// site's key, never on the batch split, the padding or the thread count. The
// mask is never stored: the backward applies the identical mask by calling
// the kernel again on the gradient.
#include "core/cpu/dropout_rows.h"
#include "core/cpu/philox_simd.h"
#include "core/cpu/strided_loop.h"
#include "core/philox.h"

namespace roformer::kernels::cpu {

namespace {

// Where contiguous rows are in the global batch: row r is token
// (first_sequence + ids[r][0], ids[r][1]), or without ids (first_sequence +
// r / positions, r % positions).
struct RowTokens {
  const int64_t* ids = nullptr;
  int64_t s0 = 0, s1 = 0, positions = 1, first_sequence = 0;
  RowTokens(const View& tokens, int64_t positions_, int64_t first_sequence_)
      : positions(positions_), first_sequence(first_sequence_) {
    if (!tokens.defined()) return;
    ids = static_cast<const int64_t*>(tokens.data());
    s0 = tokens.strides()[0];
    s1 = tokens.strides()[1];
  }
  uint32_t sequence(int64_t r) const {
    return uint32_t(first_sequence + (ids ? ids[r * s0] : r / positions));
  }
  uint32_t position(int64_t r) const { return uint32_t(ids ? ids[r * s0 + s1] : r % positions); }
};

// fn(r, draws) for every row, draws[f] being feature f's 16-bit draw: the
// row's features are whole counter blocks, drawn up to 16 blocks (128
// features) at a time.
template <class Fn>
void for_rows_with_draws(int64_t rows, int64_t features, const DropoutKey& key,
                         const RowTokens& where, Fn&& fn) {
  const PhiloxKey pkey = dropout_key(key.seed, key.step);
  parallel_rows(rows, features, [&](int64_t r) {
    fn(r, dropout_draws_row(dropout_block(0, where.position(r), where.sequence(r), key.site, 0),
                            pkey, features));
  });
}

// fn(tag_a, tag_b) for the dtype pairs a row loop takes: one dtype for both,
// or the one mixed pair (MixedA, MixedB) it names.
template <class MixedA, class MixedB, class Fn>
void dispatch_pair(DType a, DType b, const char* what, Fn&& fn) {
  if (a == dtype_of<MixedA>() && b == dtype_of<MixedB>()) return fn(MixedA{}, MixedB{});
  RF_CHECK(a == b, what, ": unsupported dtypes ", dtype_name(a), " and ", dtype_name(b));
  dispatch_floating(a, what, [&](auto tag) { fn(tag, tag); });
}

}  // namespace

void dropout_rows(const View& x, const View& out, double p, const DropoutKey& key,
                  const View& tokens, int64_t positions) {
  RF_CHECK(x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel(),
           "dropout rows: expected contiguous x and out of one size, got ", x.desc(), " and ",
           out.desc());
  if (x.numel() == 0) return;
  const int64_t features = x.shape().back(), rows = x.numel() / features;
  const uint32_t threshold = dropout_threshold(p);
  // f32 into bf16: an f32 gradient dropped into a bf16 input's.
  dispatch_pair<float, bf16>(x.dtype(), out.dtype(), "dropout", [&](auto in_tag, auto out_tag) {
    using I = decltype(in_tag);
    using T = decltype(out_tag);
    using A = acc_t<T>;
    const A scale = A(1.0 / (1.0 - p));
    const I* px = static_cast<const I*>(x.data());
    T* po = static_cast<T*>(out.data());
    for_rows_with_draws(rows, features, key, RowTokens(tokens, positions, key.first_sequence),
                        [&](int64_t r, const uint16_t* d) {
                          const I* __restrict xr = px + r * features;
                          T* __restrict o = po + r * features;
#pragma omp simd
                          for (int64_t f = 0; f < features; ++f)
                            o[f] = uint32_t(d[f]) >= threshold ? T(A(T(xr[f])) * scale) : T(0.0f);
                        });
  });
}

void dropout_add_rows(const View& x, const View& residual, const View& sum, double p,
                      const DropoutKey& key, const View& tokens, int64_t positions) {
  RF_CHECK(x.is_contiguous() && residual.is_contiguous() && sum.is_contiguous() &&
               x.numel() == sum.numel() && residual.numel() == sum.numel() &&
               residual.dtype() == sum.dtype(),
           "dropout_add_rows: expected contiguous x, residual and sum of one size, got ", x.desc(),
           ", ", residual.desc(), ", ", sum.desc());
  if (x.numel() == 0) return;
  const int64_t features = x.shape().back(), rows = x.numel() / features;
  const uint32_t threshold = dropout_threshold(p);
  // x's dtype X is the sum's T, or bf16 on an f32 residual.
  dispatch_pair<bf16, float>(x.dtype(), sum.dtype(), "dropout_add_rows", [&](auto x_tag, auto tag) {
    using X = decltype(x_tag);
    using T = decltype(tag);
    using AX = acc_t<X>;
    using A = acc_t<T>;
    const AX scale = AX(1.0 / (1.0 - p));
    const X* px = static_cast<const X*>(x.data());
    const T* pr = static_cast<const T*>(residual.data());
    T* ps = static_cast<T*>(sum.data());
    for_rows_with_draws(rows, features, key, RowTokens(tokens, positions, key.first_sequence),
                        [&](int64_t r, const uint16_t* d) {
                          const X* __restrict xr = px + r * features;
                          const T* __restrict rr = pr + r * features;
                          T* __restrict o = ps + r * features;
#pragma omp simd
                          for (int64_t f = 0; f < features; ++f) {
                            // dropout's output in x's dtype, then the residual add's rounding.
                            const X dropped =
                                uint32_t(d[f]) >= threshold ? X(AX(xr[f]) * scale) : X(0.0f);
                            o[f] = T(A(dropped) + A(rr[f]));
                          }
                        });
  });
}

void dropout(Stream, KT x_kt, KT out_kt, double p, const DropoutKey& key) {
  const View x(x_kt), out(out_kt);
  RF_CHECK(x.dim() == 3 && x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape() &&
               x.dtype() == out.dtype(),
           "dropout kernel: expected contiguous x and out [rows, positions, features], got ",
           x.desc(), " and ", out.desc());
  dropout_rows(x, out, p, key, View(), x.shape()[1]);
}

void dropout_tokens(Stream, KT x_kt, KT out_kt, KT tokens_kt, double p, const DropoutKey& key) {
  const View x(x_kt), out(out_kt), tokens(tokens_kt);
  RF_CHECK(x.dim() == 2 && x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape() &&
               x.dtype() == out.dtype() && tokens.dim() == 2 && tokens.shape()[0] == x.shape()[0] &&
               tokens.shape()[1] == 2 && tokens.dtype() == DType::i64,
           "dropout_tokens kernel: expected contiguous x and out [T, features] and tokens [T, 2] "
           "i64, got ",
           x.desc(), ", ", out.desc(), ", ", tokens.desc());
  // The draws dropout() gives element (row, position, feature).
  dropout_rows(x, out, p, key, tokens, 1);
}

}  // namespace roformer::kernels::cpu
