// Row gathers (embedding lookup, index_select) and their deterministic
// scatter-add backward.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cpu/strided_loop.h"

namespace roformer::kernels::cpu {

namespace {
// ids as i64 whatever their stored dtype.
template <class Fn>
void with_ids(const View& ids, Fn&& fn) {
  dispatch_index(ids.dtype(), "gather ids", [&](auto tag) {
    using I = decltype(tag);
    const I* p = static_cast<const I*>(ids.data());
    fn([p](int64_t n) { return int64_t(p[n]); });
  });
}

void check_rows(const View& table, const View& ids, const char* kernel) {
  RF_CHECK(table.dim() == 2 && table.is_contiguous() && ids.is_contiguous(), kernel,
           ": expected a contiguous table [N, R] and contiguous ids, got ", table.desc(), " and ",
           ids.desc());
}
}  // namespace

void gather_rows(Stream stream, KT table_kt, KT ids_kt, int32_t site, KT out_kt) {
  const View table(table_kt), ids(ids_kt), out(out_kt);
  check_rows(table, ids, "gather_rows");
  const int64_t count = ids.numel(), rows = table.shape()[0], width = table.shape()[1];
  const size_t row_bytes = size_t(width) * dtype_size(table.dtype());
  const char* w = static_cast<const char*>(table.data());
  char* o = static_cast<char*>(out.data());
  with_ids(ids, [&](auto id) {
    // The first bad id in order (a cheap scan), so the report names the
    // first position whatever the thread count.
    for (int64_t n = 0; n < count; ++n) {
      const int64_t v = id(n);
      if (v < 0 || v >= rows) {
        report_index_error(stream, site, n, v);
        break;
      }
    }
    parallel_rows(count, width, [&](int64_t n) {
      const int64_t v = id(n);
      char* dst = o + size_t(n) * row_bytes;
      if (v < 0 || v >= rows)
        std::memset(dst, 0, row_bytes);  // reported above; raised at the next sync
      else
        std::memcpy(dst, w + size_t(v) * row_bytes, row_bytes);
    });
  });
}

void scatter_add_rows(Stream, KT grad_out_kt, KT ids_kt, KT grad_table_kt) {
  const View grad_out(grad_out_kt), ids(ids_kt), grad_table(grad_table_kt);
  check_rows(grad_table, ids, "scatter_add_rows");
  const int64_t count = ids.numel(), rows = grad_table.shape()[0], dim = grad_table.shape()[1];
  if (count == 0 || dim == 0) return;
  RF_CHECK(grad_out.is_contiguous() && grad_out.dtype() == grad_table.dtype() &&
               grad_out.numel() == count * dim,
           "scatter_add_rows: gradient ", grad_out.desc(), " does not match ", count, " rows of ",
           grad_table.desc());
  // One block of columns per thread (whole cache lines); each block walks all
  // ids in order. Every element is summed in id order whatever the split, so
  // the split may follow the thread count without changing a bit.
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t block = std::max<int64_t>(16, (dim + threads * 16 - 1) / (threads * 16) * 16);
  const int64_t blocks = (dim + block - 1) / block;
  dispatch_floating(grad_table.dtype(), "scatter_add_rows", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* g = static_cast<const T*>(grad_out.data());
    T* gw = static_cast<T*>(grad_table.data());
    // Sums in A: a bf16 table is summed in an f32 copy and rounded once (an
    // id can take most of the batch, and bf16 sums of thousands of rows lose
    // whole digits); f32 and f64 sum in place.
    std::vector<A> wide;
    A* acc = nullptr;
    if constexpr (std::is_same_v<T, A>) {
      acc = gw;
    } else {
      wide.assign(gw, gw + rows * dim);
      acc = wide.data();
    }
    with_ids(ids, [&](auto id) {
      parallel_rows(blocks, count * block, [&](int64_t b) {
        const int64_t c0 = b * block, c1 = std::min(dim, c0 + block);
        for (int64_t n = 0; n < count; ++n) {
          const int64_t v = id(n);
          if (v < 0 || v >= rows) continue;  // reported by the forward
          A* dst = acc + v * dim;
          const T* src = g + n * dim;
          for (int64_t c = c0; c < c1; ++c) dst[c] += A(src[c]);
        }
      });
    });
    if constexpr (!std::is_same_v<T, A>)
      for (int64_t i = 0; i < rows * dim; ++i) gw[i] = T(wide[size_t(i)]);
  });
}

}  // namespace roformer::kernels::cpu
