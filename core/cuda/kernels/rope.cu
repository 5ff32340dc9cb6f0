// Rotary position embedding (paper eq. 34): the cos/sin table of a call's
// positions (angles in f64), and the pair-wise rotation of x [..., S, D] by it
// -- interleaved pairs (2i, 2i+1) or halves (i, i + D/2); inverse rotates by
// minus the angle (the backward).
#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

template <class I, class T>
__global__ void rope_table_kernel(const I* positions, int64_t pstride, double base, T* table,
                                  int64_t S, int64_t half) {
  RF_GRID_LOOP(idx, S * half) {
    const int64_t s = idx / half, i = idx % half;
    const double theta = pow(base, -2.0 * double(i) / double(2 * half));
    const double angle = double(positions[s * pstride]) * theta;
    table[idx] = T(cos(angle));
    table[S * half + idx] = T(sin(angle));
  }
}

// One thread per pair of one row; the row's element offset from its index.
template <class T>
__global__ void rope_kernel(const T* x, KernelTensor geo, const acc_t<T>* table, T* out,
                            int64_t rows, int64_t S, int64_t D, bool interleaved, bool inverse) {
  using A = acc_t<T>;
  const int64_t half = D / 2;
  const A* cos_table = table;
  const A* sin_table = table + S * half;
  const int32_t nd = geo.ndim;
  const int64_t sd = geo.strides[nd - 1];
  RF_GRID_LOOP(idx, rows * half) {
    const int64_t r = idx / half, k = idx % half;
    const int64_t s = r % S;
    int64_t off = s * geo.strides[nd - 2], rest = r / S;
    for (int32_t d = nd - 3; d >= 0; --d) {
      off += (rest % geo.sizes[d]) * geo.strides[d];
      rest /= geo.sizes[d];
    }
    const int64_t lo = interleaved ? 2 * k : k, hi = interleaved ? 2 * k + 1 : k + half;
    const A x0 = convert<A>(x[off + lo * sd]), x1 = convert<A>(x[off + hi * sd]);
    const A c = cos_table[s * half + k];
    const A sk = inverse ? -sin_table[s * half + k] : sin_table[s * half + k];
    out[r * D + lo] = convert<T>(x0 * c - x1 * sk);
    out[r * D + hi] = convert<T>(x1 * c + x0 * sk);
  }
}

}  // namespace

void rope_table(Stream stream, const KernelTensor& positions, double base,
                const KernelTensor& table) {
  RF_CHECK(table.ndim == 3 && table.sizes[0] == 2 && table.is_contiguous() && positions.ndim == 1 &&
               positions.sizes[0] == table.sizes[1],
           "rope_table: expected positions [S] and a contiguous table [2, S, D/2]");
  const int64_t S = table.sizes[1], half = table.sizes[2];
  if (S * half == 0) return;
  on_index_dtype(positions.dtype, "rope positions", [&](auto itag) {
    using I = decltype(itag);
    on_floating_dtype(table.dtype, "rope table", [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bf16_t>) {
        throw Error("rope_table: the table is f32 or f64, not bf16");
      } else {
        RF_LAUNCH((rope_table_kernel<I, T>), grid_for(S * half), kThreads, 0, native(stream),
                  positions.as<const I>(), positions.strides[0], base, table.as<T>(), S, half);
      }
    });
  });
}

void rope(Stream stream, const KernelTensor& x, const KernelTensor& table, bool interleaved,
          bool inverse, const KernelTensor& out) {
  RF_CHECK(x.ndim >= 2 && table.ndim == 3 && x.size(-2) == table.sizes[1] &&
               x.size(-1) == 2 * table.sizes[2] && out.is_contiguous() && out.dtype == x.dtype &&
               table.is_contiguous() && out.numel() == x.numel(),
           "rope kernel: bad geometry");
  if (x.numel() == 0) return;
  const int64_t D = x.size(-1), S = x.size(-2), rows = x.numel() / D;
  on_floating_dtype(x.dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    RF_CHECK(table.dtype == (std::is_same_v<A, double> ? DType::f64 : DType::f32),
             "rope kernel: the table's dtype does not match x's arithmetic type");
    RF_LAUNCH((rope_kernel<T>), grid_for(rows * (D / 2)), kThreads, 0, native(stream),
              x.as<const T>(), x, table.as<const A>(), out.as<T>(), rows, S, D, interleaved,
              inverse);
  });
}

}  // namespace roformer::kernels::cuda
