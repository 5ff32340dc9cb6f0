// Dropout mask from Philox by the shared rule of core/philox.h: the decision
// for an element depends only on its (sequence, position, feature) and the
// site's key, never on the batch split, the padding or the thread count. The
// mask is never stored: the backward applies the identical mask by calling
// the kernel again on the gradient.
#include "core/cpu/strided_loop.h"
#include "core/philox.h"

namespace roformer::kernels::cpu {

void dropout(Stream, KT x_kt, KT out_kt, double p, const DropoutKey& key) {
  const View x(x_kt), out(out_kt);
  RF_CHECK(x.dim() == 3 && x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape(),
           "dropout kernel: expected contiguous x and out [rows, positions, features], got ",
           x.desc(), " and ", out.desc());
  if (x.numel() == 0) return;
  const int64_t rows = x.shape()[0], positions = x.shape()[1], features = x.shape()[2];
  const PhiloxKey pkey = dropout_key(key.seed, key.step);
  const uint32_t threshold = dropout_threshold(p);
  const int64_t blocks = (features + 3) / 4;
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A scale = A(1.0 / (1.0 - p));
    const T* px = static_cast<const T*>(x.data());
    T* po = static_cast<T*>(out.data());
    // One token (row, position) per task: its features are whole counter blocks.
    parallel_rows(rows * positions, features, [&](int64_t token) {
      const int64_t r = token / positions, s = token % positions;
      const uint32_t sequence = uint32_t(key.first_sequence + r);
      const T* xt = px + token * features;
      T* ot = po + token * features;
      for (int64_t b = 0; b < blocks; ++b) {
        const PhiloxCounter bits =
            philox4x32(dropout_block(uint32_t(b), uint32_t(s), sequence, key.site, 0), pkey);
        const int64_t f0 = b * 4, n = std::min<int64_t>(4, features - f0);
        for (int64_t j = 0; j < n; ++j)
          ot[f0 + j] = (bits[size_t(j)] >> 8) >= threshold ? T(A(xt[f0 + j]) * scale) : T(0.0f);
      }
    });
  });
}

void dropout_tokens(Stream, KT x_kt, KT out_kt, KT tokens_kt, double p, const DropoutKey& key) {
  const View x(x_kt), out(out_kt), tokens(tokens_kt);
  RF_CHECK(x.dim() == 2 && x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape() &&
               tokens.dim() == 2 && tokens.shape()[0] == x.shape()[0] && tokens.shape()[1] == 2 &&
               tokens.dtype() == DType::i64,
           "dropout_tokens kernel: expected contiguous x and out [T, features] and tokens [T, 2] "
           "i64, got ",
           x.desc(), ", ", out.desc(), ", ", tokens.desc());
  if (x.numel() == 0) return;
  const int64_t T = x.shape()[0], features = x.shape()[1];
  const PhiloxKey pkey = dropout_key(key.seed, key.step);
  const uint32_t threshold = dropout_threshold(p);
  const int64_t blocks = (features + 3) / 4;
  const int64_t* ids = static_cast<const int64_t*>(tokens.data());
  const int64_t s0 = tokens.strides()[0], s1 = tokens.strides()[1];
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T_ = decltype(tag);
    using A = acc_t<T_>;
    const A scale = A(1.0 / (1.0 - p));
    const T_* px = static_cast<const T_*>(x.data());
    T_* po = static_cast<T_*>(out.data());
    // The same draws as dropout() gives element (row, position, feature).
    parallel_rows(T, features, [&](int64_t t) {
      const uint32_t sequence = uint32_t(key.first_sequence + ids[t * s0]);
      const uint32_t position = uint32_t(ids[t * s0 + s1]);
      const T_* xt = px + t * features;
      T_* ot = po + t * features;
      for (int64_t b = 0; b < blocks; ++b) {
        const PhiloxCounter bits =
            philox4x32(dropout_block(uint32_t(b), position, sequence, key.site, 0), pkey);
        const int64_t f0 = b * 4, n = std::min<int64_t>(4, features - f0);
        for (int64_t j = 0; j < n; ++j)
          ot[f0 + j] = (bits[size_t(j)] >> 8) >= threshold ? T_(A(xt[f0 + j]) * scale) : T_(0.0f);
      }
    });
  });
}

}  // namespace roformer::kernels::cpu
