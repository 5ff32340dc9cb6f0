#include "core/cpu/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/cpu/strided_loop.h"

namespace roformer::cpu {

namespace {
// ids as i64 whatever their stored dtype.
template <class Fn>
void with_ids(const Tensor& ids, Fn&& fn) {
  dispatch_index(ids.dtype(), "embedding", [&](auto tag) {
    using I = decltype(tag);
    const I* p = static_cast<const I*>(ids.data());
    fn([p](int64_t n) { return int64_t(p[n]); });
  });
}
}  // namespace

int64_t embedding_first_bad_id(const Tensor& ids, int64_t vocab) {
  int64_t bad = -1;
  with_ids(ids, [&](auto id) {
    for (int64_t n = 0; n < ids.numel(); ++n) {
      const int64_t v = id(n);
      if (v < 0 || v >= vocab) {
        bad = n;
        return;
      }
    }
  });
  return bad;
}

void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const int64_t count = ids.numel(), dim = weight.shape()[1];
  const size_t row_bytes = size_t(dim) * dtype_size(weight.dtype());
  const char* w = static_cast<const char*>(weight.data());
  char* o = static_cast<char*>(out.data());
  with_ids(ids, [&](auto id) {
    parallel_rows(count, dim, [&](int64_t n) {
      std::memcpy(o + size_t(n) * row_bytes, w + size_t(id(n)) * row_bytes, row_bytes);
    });
  });
}

void embedding_backward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight) {
  const int64_t count = ids.numel(), dim = grad_weight.shape()[1];
  if (count == 0 || dim == 0) return;
  // One block of columns per thread (whole cache lines); each block walks all
  // ids in order. Every element is summed in id order whatever the split, so
  // the split may follow the thread count without changing a bit.
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t block = std::max<int64_t>(16, (dim + threads * 16 - 1) / (threads * 16) * 16);
  const int64_t blocks = (dim + block - 1) / block;
  dispatch_floating(grad_weight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* g = static_cast<const T*>(grad_out.data());
    T* gw = static_cast<T*>(grad_weight.data());
    with_ids(ids, [&](auto id) {
      parallel_rows(blocks, count * block, [&](int64_t b) {
        const int64_t c0 = b * block, c1 = std::min(dim, c0 + block);
        for (int64_t n = 0; n < count; ++n) {
          T* dst = gw + id(n) * dim;
          const T* src = g + n * dim;
          for (int64_t c = c0; c < c1; ++c) dst[c] = T(A(dst[c]) + A(src[c]));
        }
      });
    });
  });
}

}  // namespace roformer::cpu
