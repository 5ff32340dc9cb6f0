// Dropout mask from Philox, never stored: the backward applies the identical
// mask by calling the kernel again on the gradient.
#include <cmath>

#include "core/cpu/strided_loop.h"
#include "core/philox.h"

namespace roformer::kernels::cpu {

// The decision for element i depends only on (seed, offset, i) -- the same word
// Tensor::rand would draw there -- never on the thread count.
void dropout(Stream, KT x_kt, KT out_kt, const DropoutKey& key_in) {
  const View x(x_kt), out(out_kt);
  RF_CHECK(x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape(),
           "dropout kernel: expected contiguous x and out of one shape, got ", x.desc(), " and ",
           out.desc());
  const double p = key_in.p;
  const uint64_t seed = key_in.seed, offset = key_in.offset;
  const int64_t n = x.numel();
  if (n == 0) return;
  const PhiloxKey key{uint32_t(seed), uint32_t(seed >> 32)};
  // keep <=> uniform_from_bits(bits) >= p <=> (bits >> 8) >= ceil(p * 2^24),
  // exact since uniform_from_bits is (bits >> 8) / 2^24.
  const uint32_t threshold = uint32_t(std::ceil(p * 16777216.0));
  // One Philox call yields the 4 words of a counter block; walk whole blocks.
  const uint64_t first_block = offset / 4;
  const uint64_t end_word = offset + uint64_t(n);
  const int64_t blocks = int64_t((end_word + 3) / 4 - first_block);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A scale = A(1.0 / (1.0 - p));
    const T* px = static_cast<const T*>(x.data());
    T* po = static_cast<T*>(out.data());
    parallel_rows(blocks, 16, [&](int64_t b) {
      const uint64_t block = first_block + uint64_t(b);
      const PhiloxCounter bits = philox4x32({uint32_t(block), uint32_t(block >> 32), 0, 0}, key);
      for (uint64_t j = 0; j < 4; ++j) {
        const uint64_t word = block * 4 + j;
        if (word < offset || word >= end_word) continue;
        const uint64_t i = word - offset;
        po[i] = (bits[j] >> 8) >= threshold ? T(A(px[i]) * scale) : T(0.0f);
      }
    });
  });
}

}  // namespace roformer::kernels::cpu
