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

// One token (sequence, position): its features are whole counter blocks,
// their draws made up to 16 blocks (128 features) at a time.
template <class T, class A>
void drop_token(const T* __restrict xt, T* __restrict ot, int64_t features, uint32_t sequence,
                uint32_t position, const DropoutKey& key, const PhiloxKey& pkey, uint32_t threshold,
                A scale) {
  const uint16_t* d =
      dropout_draws_row(dropout_block(0, position, sequence, key.site, 0), pkey, features);
#pragma omp simd
  for (int64_t f = 0; f < features; ++f)
    ot[f] = uint32_t(d[f]) >= threshold ? T(A(xt[f]) * scale) : T(0.0f);
}

}  // namespace

void dropout_rows(const View& x, const View& out, double p, const DropoutKey& key,
                  const View& tokens, int64_t positions) {
  RF_CHECK(x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel() &&
               x.dtype() == out.dtype(),
           "dropout kernel: expected contiguous x and out of one size and dtype, got ", x.desc(),
           " and ", out.desc());
  if (x.numel() == 0) return;
  const int64_t features = x.shape().back(), rows = x.numel() / features;
  const PhiloxKey pkey = dropout_key(key.seed, key.step);
  const uint32_t threshold = dropout_threshold(p);
  const int64_t* ids = tokens.defined() ? static_cast<const int64_t*>(tokens.data()) : nullptr;
  const int64_t s0 = ids ? tokens.strides()[0] : 0, s1 = ids ? tokens.strides()[1] : 0;
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A scale = A(1.0 / (1.0 - p));
    const T* px = static_cast<const T*>(x.data());
    T* po = static_cast<T*>(out.data());
    parallel_rows(rows, features, [&](int64_t r) {
      const int64_t row = ids ? ids[r * s0] : r / positions;
      const int64_t position = ids ? ids[r * s0 + s1] : r % positions;
      drop_token(px + r * features, po + r * features, features, uint32_t(key.first_sequence + row),
                 uint32_t(position), key, pkey, threshold, scale);
    });
  });
}

void dropout(Stream, KT x_kt, KT out_kt, double p, const DropoutKey& key) {
  const View x(x_kt), out(out_kt);
  RF_CHECK(x.dim() == 3 && x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape(),
           "dropout kernel: expected contiguous x and out [rows, positions, features], got ",
           x.desc(), " and ", out.desc());
  dropout_rows(x, out, p, key, View(), x.shape()[1]);
}

void dropout_tokens(Stream, KT x_kt, KT out_kt, KT tokens_kt, double p, const DropoutKey& key) {
  const View x(x_kt), out(out_kt), tokens(tokens_kt);
  RF_CHECK(x.dim() == 2 && x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape() &&
               tokens.dim() == 2 && tokens.shape()[0] == x.shape()[0] && tokens.shape()[1] == 2 &&
               tokens.dtype() == DType::i64,
           "dropout_tokens kernel: expected contiguous x and out [T, features] and tokens [T, 2] "
           "i64, got ",
           x.desc(), ", ", out.desc(), ", ", tokens.desc());
  // The draws dropout() gives element (row, position, feature).
  dropout_rows(x, out, p, key, tokens, 1);
}

}  // namespace roformer::kernels::cpu
