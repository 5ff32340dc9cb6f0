// Dropout mask from Philox by the shared rule of core/philox.h: the decision
// for an element depends only on its (sequence, position, feature) and the
// site's key, never on the batch split, the padding or the thread count. The
// mask is never stored: the backward applies the identical mask by calling
// the kernel again on the gradient.
#include <vector>

#include "core/cpu/philox_simd.h"
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
    // The token's words come 16 blocks (64 features) at a time.
    parallel_rows(rows * positions, features, [&](int64_t token) {
      const int64_t r = token / positions, s = token % positions;
      const uint32_t sequence = uint32_t(key.first_sequence + r);
      const T* xt = px + token * features;
      T* ot = po + token * features;
      thread_local std::vector<uint32_t> words;
      if (int64_t(words.size()) < blocks * 4 + 64) words.resize(size_t(blocks * 4 + 64));
      const PhiloxCounter block = dropout_block(0, uint32_t(s), sequence, key.site, 0);
      for (int64_t b = 0; b < blocks; b += 16)
        philox_16_blocks(uint32_t(b), block[1], block[2], block[3], pkey, &words[size_t(b * 4)]);
      const uint32_t* w = words.data();
#pragma omp simd
      for (int64_t f = 0; f < features; ++f)
        ot[f] = (w[f] >> 8) >= threshold ? T(A(xt[f]) * scale) : T(0.0f);
    });
  });
}

}  // namespace roformer::kernels::cpu
