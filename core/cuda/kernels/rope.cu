// Rotary position embedding (paper eq. 34): the cos/sin table of a call's
// positions (angles in f64), and the pair-wise rotation of x [..., S, D] by it
// -- interleaved pairs (2i, 2i+1) or halves (i, i + D/2); inverse rotates by
// minus the angle (the backward).
#include "core/cuda/kernels/common.cuh"
#include "core/kernels/fast_divmod.h"

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

// The divisors of a launch's index math: items a row, S, and x's sizes
// before [S, D], innermost first (outer[j] divides by size nd - 3 - j, so
// that an unrolled loop indexes them by constants: a kernel parameter
// indexed at run time is copied to local memory). The kernels take them
// (kFast) where every item index is under 2^31, FastDivmod's range: 64-bit
// divisions, a call of ~70 instructions each, had bounded the packed kernel
// at about twice its bytes' time.
struct RopeIndex {
  FastDivmod per_row, seq, outer[kMaxDims - 2];
};

// Whether a launch of `items` items takes the FastDivmods.
inline bool rope_index_fast(int64_t items) {
  return items < kFastDivmodLimit;
}

// The divisors of a launch of `items` items, per_row a row (left at their
// defaults where the launch divides in 64 bits).
RopeIndex rope_index(const KernelTensor& x, int64_t items, int64_t per_row) {
  RopeIndex ix;
  if (!rope_index_fast(items)) return ix;
  ix.per_row = FastDivmod(uint32_t(per_row));
  ix.seq = FastDivmod(uint32_t(x.size(-2)));
  for (int32_t j = 0; j + 2 < x.ndim; ++j)
    ix.outer[j] = FastDivmod(uint32_t(x.sizes[x.ndim - 3 - j]));
  return ix;
}

// Item idx of a launch of per_row items a row of x [..., S, D]: its row's
// position s = r % S, its place in the row, and the row's element offsets
// in x (geo) and out (out_geo, x's shape), one walk of the dims for both.
struct RopeItem {
  int64_t s, within, x, out;
};

template <bool kFast>
__device__ __forceinline__ RopeItem rope_item(const RopeIndex& ix, const KernelTensor& geo,
                                              const KernelTensor& out_geo, int64_t idx,
                                              int64_t per_row, int64_t S) {
  const int32_t nd = geo.ndim;
  int64_t within, s, rest;
  if constexpr (kFast) {
    uint32_t r, w, q, m;
    ix.per_row.divmod(uint32_t(idx), r, w);
    ix.seq.divmod(r, q, m);
    within = w;
    s = m;
    rest = q;
  } else {
    const int64_t r = idx / per_row;
    within = idx % per_row;
    s = r % S;
    rest = r / S;
  }
  RopeItem item{s, within, s * geo.strides[nd - 2], s * out_geo.strides[nd - 2]};
#pragma unroll
  for (int32_t j = 0; j < kMaxDims - 2; ++j) {
    if (j >= nd - 2) break;
    const int32_t d = nd - 3 - j;
    int64_t i;
    if constexpr (kFast) {
      uint32_t q, m;
      ix.outer[j].divmod(uint32_t(rest), q, m);
      i = m;
      rest = q;
    } else {
      i = rest % geo.sizes[d];
      rest /= geo.sizes[d];
    }
    item.x += i * geo.strides[d];
    item.out += i * out_geo.strides[d];
  }
  return item;
}

// The pair (x0, x1) rotated by the angle whose cosine is c and sine sk
// (minus the sine for the inverse), rounded to T.
template <class T, class A>
__device__ __forceinline__ void rotate_pair(A x0, A x1, A c, A sk, T& y0, T& y1) {
  y0 = convert<T>(x0 * c - x1 * sk);
  y1 = convert<T>(x1 * c + x0 * sk);
}

// One thread per pair of one row.
template <class T, bool kFast>
__global__ void rope_kernel(const T* x, KernelTensor geo, const acc_t<T>* table, T* out,
                            KernelTensor out_geo, RopeIndex ix, int64_t rows, int64_t S, int64_t D,
                            bool interleaved, bool inverse) {
  using A = acc_t<T>;
  const int64_t half = D / 2;
  const A* cos_table = table;
  const A* sin_table = table + S * half;
  const int64_t sd = geo.strides[geo.ndim - 1];
  RF_GRID_LOOP(idx, rows * half) {
    const RopeItem off = rope_item<kFast>(ix, geo, out_geo, idx, half, S);
    const int64_t s = off.s, k = off.within;
    const int64_t lo = interleaved ? 2 * k : k, hi = interleaved ? 2 * k + 1 : k + half;
    const A x0 = convert<A>(x[off.x + lo * sd]), x1 = convert<A>(x[off.x + hi * sd]);
    const A c = cos_table[s * half + k];
    const A sk = inverse ? -sin_table[s * half + k] : sin_table[s * half + k];
    rotate_pair(x0, x1, c, sk, out[off.out + lo], out[off.out + hi]);
  }
}

// The same rotation eight elements a thread, as whole Pack8 words, where x's
// last dim is contiguous and every row starts on a Pack8 boundary: an
// interleaved pack holds four pairs, and for halves pack p of the first half
// pairs with pack p of the second (eight pairs). The row's offset is worked
// out once a pack, not once a pair: the per-pair 64-bit divisions bounded the
// kernel above (attention_bench's separate rows: 0.25 ms for q and k of 32K
// tokens, where their bytes take 0.07 at the H100's copy rate).
template <class T, bool kInterleaved, bool kFast>
__global__ void rope_packed_kernel(const T* x, KernelTensor geo, const acc_t<T>* table, T* out,
                                   KernelTensor out_geo, RopeIndex ix, int64_t rows, int64_t S,
                                   int64_t D, bool inverse) {
  using A = acc_t<T>;
  const int64_t half = D / 2;
  const int64_t per_row = kInterleaved ? D / 8 : D / 16;  // packs (pack pairs) a row
  RF_GRID_LOOP(idx, rows * per_row) {
    const RopeItem off = rope_item<kFast>(ix, geo, out_geo, idx, per_row, S);
    const int64_t s = off.s, p = off.within;
    const A* cos_row = table + s * half;
    const A* sin_row = table + S * half + s * half;
    const A sign = inverse ? A(-1) : A(1);
    if constexpr (kInterleaved) {
      const Pack8<T> in = *reinterpret_cast<const Pack8<T>*>(x + off.x + 8 * p);
      Pack8<T> o;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t k = 4 * p + e;
        const A x0 = convert<A>(in.v[2 * e]), x1 = convert<A>(in.v[2 * e + 1]);
        rotate_pair(x0, x1, cos_row[k], sign * sin_row[k], o.v[2 * e], o.v[2 * e + 1]);
      }
      *reinterpret_cast<Pack8<T>*>(out + off.out + 8 * p) = o;
    } else {
      const Pack8<T> lo = *reinterpret_cast<const Pack8<T>*>(x + off.x + 8 * p);
      const Pack8<T> hi = *reinterpret_cast<const Pack8<T>*>(x + off.x + half + 8 * p);
      Pack8<T> o_lo, o_hi;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t k = 8 * p + e;
        const A x0 = convert<A>(lo.v[e]), x1 = convert<A>(hi.v[e]);
        rotate_pair(x0, x1, cos_row[k], sign * sin_row[k], o_lo.v[e], o_hi.v[e]);
      }
      *reinterpret_cast<Pack8<T>*>(out + off.out + 8 * p) = o_lo;
      *reinterpret_cast<Pack8<T>*>(out + off.out + half + 8 * p) = o_hi;
    }
  }
}

// Whether rope_packed_kernel takes x and out: the last dims contiguous, whole
// packs (pairs of packs for halves) a row, every row start of both and both
// pointers on a Pack8 boundary.
template <class T>
bool rope_takes_packs(const KernelTensor& x, const KernelTensor& out, bool interleaved) {
  const int64_t D = x.size(-1);
  if (sizeof(Pack8<T>) != 8 * sizeof(T) || x.strides[x.ndim - 1] != 1 ||
      D % (interleaved ? 8 : 16) != 0)
    return false;
  for (int32_t d = 0; d + 1 < x.ndim; ++d)
    if (x.sizes[d] > 1 && (x.strides[d] % 8 != 0 || out.strides[d] % 8 != 0)) return false;
  return on_pack_boundary(x.data) && on_pack_boundary(out.data);
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
               x.size(-1) == 2 * table.sizes[2] && out.ndim == x.ndim && out.dtype == x.dtype &&
               out.strides[out.ndim - 1] == 1 && table.is_contiguous(),
           "rope kernel: bad geometry (x ", x.ndim, " dims, out ", out.ndim,
           " dims, out's last stride ", out.ndim > 0 ? out.strides[out.ndim - 1] : 0,
           "; x [..., S, D] needs a table [2, S, D/2] and an out of x's shape, last stride 1)");
  for (int32_t d = 0; d < x.ndim; ++d)
    RF_CHECK(out.sizes[d] == x.sizes[d], "rope kernel: out's size ", out.sizes[d], " in dim ", d,
             " is not x's ", x.sizes[d]);
  if (x.numel() == 0) return;
  const int64_t D = x.size(-1), S = x.size(-2), rows = x.numel() / D;
  on_floating_dtype(x.dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    RF_CHECK(table.dtype == (std::is_same_v<A, double> ? DType::f64 : DType::f32),
             "rope kernel: the table's dtype does not match x's arithmetic type");
    if (rope_takes_packs<T>(x, out, interleaved)) {
      const int64_t per_row = D / (interleaved ? 8 : 16), items = rows * per_row;
      const bool fast = rope_index_fast(items);
      const auto kernel =
          interleaved
              ? (fast ? rope_packed_kernel<T, true, true> : rope_packed_kernel<T, true, false>)
              : (fast ? rope_packed_kernel<T, false, true> : rope_packed_kernel<T, false, false>);
      RF_LAUNCH(kernel, grid_for(items), kThreads, 0, native(stream), x.as<const T>(), x,
                table.as<const A>(), out.as<T>(), out, rope_index(x, items, per_row), rows, S, D,
                inverse);
      return;
    }
    const int64_t items = rows * (D / 2);
    const auto kernel = rope_index_fast(items) ? rope_kernel<T, true> : rope_kernel<T, false>;
    RF_LAUNCH(kernel, grid_for(items), kThreads, 0, native(stream), x.as<const T>(), x,
              table.as<const A>(), out.as<T>(), out, rope_index(x, items, D / 2), rows, S, D,
              interleaved, inverse);
  });
}

}  // namespace roformer::kernels::cuda
