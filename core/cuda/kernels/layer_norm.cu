// Layer norm over the last dim of contiguous rows. Forward: mean, then the
// biased variance, in A = f32 for f32/bf16, f64 for f64. Rows of up to 1,024
// columns in whole 16-byte words (a multiple of 8, every operand aligned)
// take a warp each, held in registers; other rows a block each. Backward:
// dx per row the same way; dweight and dbias as column sums in two passes
// (fixed row chunks, then the chunks in a fixed order): deterministic, no
// atomics. A warp-per-row backward sums its chunk of kWarpChunk rows while it
// computes their dx (x and dy read once); the block-per-row one leaves the
// sums to a kernel of their own, whose chunks are gridDim.y (at most 65535):
// they grow past kRowChunk rows when there are more than 65535 of them.
// A residual dropout (ResidualDropout) is applied to x where it is read, and
// to x's gradient where dx is written: dropout's draws and roundings (the
// unfused pair's bits), without its passes over memory.
#include <initializer_list>
#include <optional>

#include "core/cuda/kernels/common.cuh"
#include "core/cuda/kernels/dropout.cuh"
#include "core/kernels/layer_norm_dtypes.h"

namespace roformer::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kRowChunk = 64;  // rows per partial column sum (at least)

// With a residual, the first pass adds it and writes the sum, which the
// later passes read back (each thread its own columns: no barrier needed).
// TX is x's type: T, or bf16 added to an f32 residual (TX != T needs one).
template <class T, class TX>
__global__ void layer_norm_forward_kernel(const TX* x, const T* residual, const T* w, const T* b,
                                          T* y, bf16_t* y_low, T* sum, acc_t<T>* mean,
                                          acc_t<T>* var, int64_t cols, acc_t<T> eps,
                                          RowDropout drop) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const int64_t r = blockIdx.x;
  const T* rows = sum;  // the rows normalised: the sum, or x itself
  if constexpr (std::is_same_v<TX, T>) {
    if (!residual) rows = x;
  }
  const T* xr = rows + r * cols;
  T* yr = y + r * cols;
  A s = 0;
  if (residual) {
    uint32_t sequence = 0, position = 0;
    if (drop.on) drop.token(r, sequence, position);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      TX in = x[r * cols + c];
      if (drop.on)  // a Philox call an element: the fallback for rows not in whole packs
        in = dropped(drop.draw(sequence, position, c), drop.threshold, in, acc_t<TX>(drop.scale));
      // Rounded to T, as add() leaves it.
      const T v = convert<T>(convert<A>(in) + convert<A>(residual[r * cols + c]));
      sum[r * cols + c] = v;
      s += convert<A>(v);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += convert<A>(xr[c]);
  }
  const A m = block_sum(s, shared) / A(cols);
  A q = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A d = convert<A>(xr[c]) - m;
    q += d * d;
  }
  const A v = block_sum(q, shared) / A(cols);
  const A rstd = A(1) / sqrt(v + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    A out = (convert<A>(xr[c]) - m) * rstd;
    if (w) out *= convert<A>(w[c]);
    if (b) out += convert<A>(b[c]);
    yr[c] = convert<T>(out);
    if (y_low) y_low[r * cols + c] = convert<bf16_t>(yr[c]);
  }
  if (threadIdx.x == 0) {
    mean[r] = m;
    var[r] = v;
  }
}

// --- a warp per row ---------------------------------------------------------------------
// A block's 256 threads on a row of 768 columns took 3 columns each, with two
// barriers (and a shared-memory round) per reduction; a warp per row holds
// kPacks packs of eight a lane in registers, reduces by shuffles, and moves
// whole 16-byte words (Pack8).
constexpr int kWarpRowMaxPacks = 4;  // packs of eight a lane: rows of up to 1,024 columns
constexpr int kRowsPerWarpBlock = kRowThreads / 32;

template <class T, class TX, int kPacks>
__global__ void __launch_bounds__(kRowThreads)
    layer_norm_forward_warp_kernel(const TX* x, const T* residual, const T* w, const T* b, T* y,
                                   bf16_t* y_low, T* sum, acc_t<T>* mean, acc_t<T>* var,
                                   int64_t rows, int64_t cols, acc_t<T> eps, RowDropout drop) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerWarpBlock + threadIdx.x / 32;
  if (r >= rows) return;  // a whole warp
  const int64_t packs = cols / 8, first = r * packs;
  uint32_t sequence = 0, position = 0;
  if (drop.on) drop.token(r, sequence, position);
  A v[kPacks][8];
  A s = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = lane + 32 * k;
    if (p >= packs) continue;
    Pack8<TX> in = reinterpret_cast<const Pack8<TX>*>(x)[first + p];
    if (drop.on) {  // pack p is counter block p of the row's token
      const PhiloxCounter words = drop.words(sequence, position, p);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        in.v[e] = dropped(dropout_draw_of(words, uint32_t(e)), drop.threshold, in.v[e],
                          acc_t<TX>(drop.scale));
    }
    if (residual) {
      // Rounded to T, as add() leaves it, and written for the backward.
      const Pack8<T> res = reinterpret_cast<const Pack8<T>*>(residual)[first + p];
      Pack8<T> total;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        total.v[e] = convert<T>(convert<A>(in.v[e]) + convert<A>(res.v[e]));
        v[k][e] = convert<A>(total.v[e]);
      }
      reinterpret_cast<Pack8<T>*>(sum)[first + p] = total;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k][e] = convert<A>(in.v[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) s += v[k][e];
  }
  const A m = warp_reduce(s, SumOp{}) / A(cols);
  A q = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (lane + 32 * k >= packs) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e) q += (v[k][e] - m) * (v[k][e] - m);
  }
  const A variance = warp_reduce(q, SumOp{}) / A(cols);
  const A rstd = A(1) / sqrt(variance + eps);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = lane + 32 * k;
    if (p >= packs) continue;
    Pack8<T> wp{}, bp{}, out;
    if (w) wp = reinterpret_cast<const Pack8<T>*>(w)[p];
    if (b) bp = reinterpret_cast<const Pack8<T>*>(b)[p];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      A o = (v[k][e] - m) * rstd;
      if (w) o *= convert<A>(wp.v[e]);
      if (b) o += convert<A>(bp.v[e]);
      out.v[e] = convert<T>(o);
    }
    reinterpret_cast<Pack8<T>*>(y)[first + p] = out;
    if (y_low) {
      Pack8<bf16_t> low;
#pragma unroll
      for (int e = 0; e < 8; ++e) low.v[e] = convert<bf16_t>(out.v[e]);
      reinterpret_cast<Pack8<bf16_t>*>(y_low)[first + p] = low;
    }
  }
  if (lane == 0) {
    mean[r] = m;
    var[r] = variance;
  }
}

// Rows a warp of the backward takes in turn when it also sums the parameter
// gradients: its partial sums of dy * xhat and dy run over the chunk, then go
// out as one row of `partial` each.
constexpr int64_t kWarpChunk = 16;

// Where a warp keeps those running sums. In registers they took 48 of f32's
// 128 at 768 columns (two blocks an SM) and made the kernel spill; in shared
// memory (f32 up to 768 columns: 48 KB a block) it needs 116-118 and spills
// nothing at the same two blocks an SM (three, at 80 registers, would spill
// 96-168 bytes a thread: ptxas sm_90). Sum s (0: dy * xhat, 1: dy) of
// element e of lane `lane`'s pack k sits at [warp][s][k][e / 4][lane][e % 4],
// so a warp's 16-byte accesses are 512 adjacent bytes (no bank conflicts),
// and each lane touches its own elements alone (no barrier): the adds are
// the registers' in the same order, the same bits. f64 and wider rows keep
// the sums in registers, one block an SM.
template <class A, int kPacks, bool kParams>
struct WarpParamSums {
  static constexpr bool kShared = kParams && sizeof(A) == 4 && kPacks <= 3;
  struct alignas(16) Quad {
    A v[4];
  };
  static constexpr int kQuadsPerWarp = 2 * kPacks * 2 * 32;
  static constexpr int kQuads = kShared ? kRowsPerWarpBlock * kQuadsPerWarp : 1;
  // The sums' registers where they stay there: [kRegisterPacks][8] each.
  static constexpr int kRegisterPacks = kParams && !kShared ? kPacks : 1;
  static constexpr int kMinBlocks = kShared ? 2 : 1;
};

// dx for `chunk` consecutive rows a warp (one without the parameter
// gradients), and dx_x (x's gradient in TX, the residual dropout's mask
// applied) where given; with kParams, partial[w][c] and partial[chunks + w][c]
// get warp w's sums of dy * xhat and dy over its rows (chunks = the warps
// with rows).
// The next row's statistics and token are loaded while this row is worked
// on, so a row starts with its dropout draws, not a wait on memory.
// kDrop: whether the residual dropout applies (a template flag, so the
// kernel without it keeps the registers it had before the dropout existed).
template <class T, class TX, int kPacks, bool kParams, bool kDrop>
__global__ void __launch_bounds__(kRowThreads,
                                  (WarpParamSums<acc_t<T>, kPacks, kParams>::kMinBlocks))
    layer_norm_dx_warp_kernel(const T* x, const T* w, const acc_t<T>* mean, const acc_t<T>* var,
                              const T* dy, T* dx, TX* dx_x, int64_t rows, int64_t cols,
                              acc_t<T> eps, int64_t chunk, acc_t<T>* partial, RowDropout drop) {
  using A = acc_t<T>;
  using Sums = WarpParamSums<A, kPacks, kParams>;
  using Quad = typename Sums::Quad;
  __shared__ Quad shared_sums[Sums::kQuads];
  const int lane = threadIdx.x % 32;
  const int64_t warp = int64_t(blockIdx.x) * kRowsPerWarpBlock + threadIdx.x / 32;
  const int64_t chunks = (rows + chunk - 1) / chunk;
  if (warp >= chunks) return;
  const int64_t packs = cols / 8;
  const int64_t r_begin = warp * chunk;
  const int64_t r_end = (warp + 1) * chunk < rows ? (warp + 1) * chunk : rows;
  // Quad h of sum s of pack k: this lane's elements 4 h... of it.
  Quad* const own = shared_sums + (Sums::kShared ? (threadIdx.x / 32) * Sums::kQuadsPerWarp : 0);
  const auto quad = [&](int s, int k, int h) -> Quad& {
    return own[((s * kPacks + k) * 2 + h) * 32 + lane];
  };
  A sum_gx[Sums::kRegisterPacks][8] = {}, sum_g[Sums::kRegisterPacks][8] = {};
  if constexpr (Sums::kShared) {
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int k = 0; k < kPacks; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h) quad(s, k, h) = Quad{};
  }
  // Row r's mean and variance, and its token when dropout draws: loaded a
  // row ahead.
  A next_m = mean[r_begin], next_v = var[r_begin];
  uint32_t next_sequence = 0, next_position = 0;
  if constexpr (kDrop) drop.token(r_begin, next_sequence, next_position);
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int64_t first = r * packs;
    const A m = next_m, rstd = A(1) / sqrt(next_v + eps);
    const uint32_t sequence = next_sequence, position = next_position;
    if (r + 1 < r_end) {
      next_m = mean[r + 1];
      next_v = var[r + 1];
      if constexpr (kDrop) drop.token(r + 1, next_sequence, next_position);
    }
    // The residual dropout's decisions for the row (bit 8 k + e: element e
    // of pack k), drawn before the row's values are live: one register,
    // where the Philox words would not fit beside them.
    uint32_t keep = 0;
    if constexpr (kDrop) {
#pragma unroll 1
      for (int k = 0; k < kPacks; ++k)
        if (lane + 32 * k < packs)
          keep |= drop.keep_bits(sequence, position, lane + 32 * k) << (8 * k);
    }
    A gw[kPacks][8], xhat[kPacks][8];
    A sg = 0, sgx = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t p = lane + 32 * k;
      if (p >= packs) continue;
      const Pack8<T> xp = reinterpret_cast<const Pack8<T>*>(x)[first + p];
      const Pack8<T> gp = reinterpret_cast<const Pack8<T>*>(dy)[first + p];
      Pack8<T> wp{};
      if (w) wp = reinterpret_cast<const Pack8<T>*>(w)[p];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const A g = convert<A>(gp.v[e]);
        gw[k][e] = g * (w ? convert<A>(wp.v[e]) : A(1));
        xhat[k][e] = (convert<A>(xp.v[e]) - m) * rstd;
        sg += gw[k][e];
        sgx += gw[k][e] * xhat[k][e];
      }
      if constexpr (Sums::kShared) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          Quad gx = quad(0, k, h), g = quad(1, k, h);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const A gv = convert<A>(gp.v[4 * h + j]);
            gx.v[j] += gv * xhat[k][4 * h + j];
            g.v[j] += gv;
          }
          quad(0, k, h) = gx;
          quad(1, k, h) = g;
        }
      } else if constexpr (kParams) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const A g = convert<A>(gp.v[e]);
          sum_gx[k][e] += g * xhat[k][e];
          sum_g[k][e] += g;
        }
      }
    }
    sg = warp_reduce(sg, SumOp{}) / A(cols);
    sgx = warp_reduce(sgx, SumOp{}) / A(cols);
    // dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = dy * weight.
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t p = lane + 32 * k;
      if (p >= packs) continue;
      Pack8<T> out;
#pragma unroll
      for (int e = 0; e < 8; ++e) out.v[e] = convert<T>(rstd * (gw[k][e] - sg - xhat[k][e] * sgx));
      reinterpret_cast<Pack8<T>*>(dx)[first + p] = out;
      if (dx_x) {
        Pack8<TX> gx;
#pragma unroll
        for (int e = 0; e < 8; ++e) gx.v[e] = convert<TX>(out.v[e]);
        if constexpr (kDrop) {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            gx.v[e] =
                scaled_or_zero(((keep >> (8 * k + e)) & 1u) != 0, gx.v[e], acc_t<TX>(drop.scale));
        }
        reinterpret_cast<Pack8<TX>*>(dx_x)[first + p] = gx;
      }
    }
  }
  if constexpr (kParams) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t p = lane + 32 * k;
      if (p >= packs) continue;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        A gx_sum, g_sum;
        if constexpr (Sums::kShared) {
          gx_sum = quad(0, k, e / 4).v[e % 4];
          g_sum = quad(1, k, e / 4).v[e % 4];
        } else {
          gx_sum = sum_gx[k][e];
          g_sum = sum_g[k][e];
        }
        partial[warp * cols + 8 * p + e] = gx_sum;
        partial[(chunks + warp) * cols + 8 * p + e] = g_sum;
      }
    }
  }
}

// Packs of eight a lane for a warp per row, or 0: the row goes to a block
// (columns not a multiple of 8, more than 1,024, or an operand off a
// 16-byte boundary).
inline int warp_row_packs(int64_t cols, std::initializer_list<const void*> data) {
  if (cols % 8 != 0 || cols > 8 * 32 * kWarpRowMaxPacks) return 0;
  for (const void* p : data)
    if (p && !on_pack_boundary(p)) return 0;
  return int((cols / 8 + 31) / 32);
}

// fn(std::integral_constant<int, kPacks>{}) for packs in 1..kWarpRowMaxPacks.
template <class Fn>
void with_packs(int packs, Fn&& fn) {
  switch (packs) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    default:
      return fn(std::integral_constant<int, 4>{});
  }
}

template <class T, class TX>
__global__ void layer_norm_dx_kernel(const T* x, const T* w, const acc_t<T>* mean,
                                     const acc_t<T>* var, const T* dy, T* dx, TX* dx_x,
                                     int64_t cols, acc_t<T> eps, RowDropout drop) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  const T* gr = dy + r * cols;
  const A m = mean[r], rstd = A(1) / sqrt(var[r] + eps);
  A sg = 0, sgx = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A gw = convert<A>(gr[c]) * (w ? convert<A>(w[c]) : A(1));
    sg += gw;
    sgx += gw * (convert<A>(xr[c]) - m) * rstd;
  }
  sg = block_sum(sg, shared) / A(cols);
  sgx = block_sum(sgx, shared) / A(cols);
  uint32_t sequence = 0, position = 0;
  if (drop.on) drop.token(r, sequence, position);
  // dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = dy * weight.
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A gw = convert<A>(gr[c]) * (w ? convert<A>(w[c]) : A(1));
    const A xhat = (convert<A>(xr[c]) - m) * rstd;
    const T d = convert<T>(rstd * (gw - sg - xhat * sgx));
    dx[r * cols + c] = d;
    if (!dx_x) continue;
    TX g = convert<TX>(d);
    if (drop.on)  // a Philox call an element: the fallback for rows not in whole packs
      g = dropped(drop.draw(sequence, position, c), drop.threshold, g, acc_t<TX>(drop.scale));
    dx_x[r * cols + c] = g;
  }
}

// partial[chunk][c] (weight) and partial[chunks + chunk][c] (bias).
template <class T>
__global__ void layer_norm_param_partials(const T* x, const acc_t<T>* mean, const acc_t<T>* var,
                                          const T* dy, acc_t<T>* partial, int64_t rows,
                                          int64_t cols, int64_t chunk_rows, acc_t<T> eps) {
  using A = acc_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t r0 = chunk * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  A sw = 0, sb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const A g = convert<A>(dy[r * cols + c]);
    const A rstd = A(1) / sqrt(var[r] + eps);
    sw += g * (convert<A>(x[r * cols + c]) - mean[r]) * rstd;
    sb += g;
  }
  partial[chunk * cols + c] = sw;
  partial[(chunks + chunk) * cols + c] = sb;
}

// dw[c] and db[c] from the chunks' partial sums (partial[k][c] and
// partial[chunks + k][c]): a block of 32 x 32 threads takes 32 columns, each
// of its 32 rows of threads every 32nd chunk, and one row adds the 32 sums in
// order: the same bits on every run, and 32 loads in flight a column.
constexpr int kFinishRows = 32;

template <class T>
__global__ void __launch_bounds__(32 * kFinishRows)
    layer_norm_param_finish(const acc_t<T>* partial, T* dw, T* db, int64_t chunks, int64_t cols) {
  using A = acc_t<T>;
  __shared__ A shared_w[kFinishRows][33], shared_b[kFinishRows][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  A sw = 0, sb = 0;
  if (c < cols) {
    for (int64_t k = threadIdx.y; k < chunks; k += kFinishRows) {
      sw += partial[k * cols + c];
      sb += partial[(chunks + k) * cols + c];
    }
  }
  shared_w[threadIdx.y][threadIdx.x] = sw;
  shared_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  A w = 0, b = 0;
  for (int y = 0; y < kFinishRows; ++y) {
    w += shared_w[y][threadIdx.x];
    b += shared_b[y][threadIdx.x];
  }
  if (dw) dw[c] = convert<T>(w);
  if (db) db[c] = convert<T>(b);
}

template <class T>
const T* optional(const KernelTensor& t) {
  return t.defined() ? t.as<const T>() : nullptr;
}

RowDropout row_dropout(const ResidualDropout& drop, const KernelTensor& tokens) {
  RowDropout d;
  if (!(drop.p > 0.0)) return d;
  d.on = true;
  d.pkey = dropout_key(drop.key.seed, drop.key.step);
  d.site = drop.key.site;
  d.threshold = dropout_threshold(drop.p);
  d.scale = 1.0 / (1.0 - drop.p);
  d.first_sequence = drop.key.first_sequence;
  d.positions = drop.positions;
  d.tokens = tokens.defined() ? tokens.as<const int64_t>() : nullptr;
  return d;
}

}  // namespace

void layer_norm_forward(Stream stream, const KernelTensor& x, const KernelTensor& residual,
                        const KernelTensor& weight, const KernelTensor& bias, double eps,
                        const ResidualDropout& drop, const KernelTensor& drop_tokens,
                        const KernelTensor& y, const KernelTensor& y_low, const KernelTensor& sum,
                        const KernelTensor& mean, const KernelTensor& var) {
  RF_CHECK(x.ndim >= 1 && x.is_contiguous() && y.is_contiguous(),
           "layer_norm_forward: expected contiguous x and y");
  RF_CHECK(!residual.defined() || (residual.is_contiguous() && sum.defined() &&
                                   sum.is_contiguous() && residual.numel() == x.numel()),
           "layer_norm_forward: a residual needs contiguous residual and sum of x's size (x ",
           x.numel(), " elements, residual ", residual.numel(), ")");
  check_layer_norm_forward_dtypes(x, residual, weight, bias, y, sum, mean, var);
  check_residual_dropout("layer_norm_forward", x, drop, drop_tokens, residual);
  check_layer_norm_y_low(y, y_low);
  if (x.numel() == 0) return;
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const RowDropout dropout = row_dropout(drop, drop_tokens);
  // T: the dtype of everything but x (and the statistics).
  on_floating_dtype(y.dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    T* const sum_rows = sum.defined() ? sum.as<T>() : nullptr;
    bf16_t* const low = y_low.defined() ? y_low.as<bf16_t>() : nullptr;
    const int packs = warp_row_packs(cols, {x.data, optional<T>(residual), optional<T>(weight),
                                            optional<T>(bias), y.data, sum_rows, low});
    const auto run = [&](auto x_tag) {
      using TX = decltype(x_tag);
      if (packs > 0)
        return with_packs(packs, [&](auto k) {
          RF_LAUNCH((layer_norm_forward_warp_kernel<T, TX, decltype(k)::value>),
                    unsigned((rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock), kRowThreads, 0,
                    native(stream), x.as<const TX>(), optional<T>(residual), optional<T>(weight),
                    optional<T>(bias), y.as<T>(), low, sum_rows, mean.as<A>(), var.as<A>(), rows,
                    cols, A(eps), dropout);
        });
      RF_LAUNCH((layer_norm_forward_kernel<T, TX>), unsigned(rows), kRowThreads, 0, native(stream),
                x.as<const TX>(), optional<T>(residual), optional<T>(weight), optional<T>(bias),
                y.as<T>(), low, sum_rows, mean.as<A>(), var.as<A>(), cols, A(eps), dropout);
    };
    if constexpr (std::is_same_v<T, float>) {
      if (layer_norm_mixed_residual(x, residual)) return run(bf16_t{});
    }
    run(T{});
  });
}

void layer_norm_backward(Stream stream, const KernelTensor& x, const KernelTensor& weight,
                         const KernelTensor& mean, const KernelTensor& var, const KernelTensor& dy,
                         double eps, const ResidualDropout& drop, const KernelTensor& drop_tokens,
                         const KernelTensor& dx, const KernelTensor& dx_x,
                         const KernelTensor& dweight, const KernelTensor& dbias) {
  RF_CHECK(x.ndim >= 1 && x.is_contiguous() && dy.is_contiguous() && dx.is_contiguous(),
           "layer_norm_backward: expected contiguous x, dy and dx");
  check_layer_norm_x_grad(dx, dx_x);
  check_residual_dropout("layer_norm_backward", x, drop, drop_tokens, dx_x);
  const RowDropout dropout = row_dropout(drop, drop_tokens);
  const int64_t cols = x.ndim > 0 ? x.size(-1) : 0;
  const int64_t rows = cols > 0 ? x.numel() / cols : 0;
  on_floating_dtype(x.dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    // TX: x's gradient's type, T's or bf16 on an f32 dx.
    const auto run = [&](auto x_tag) {
      using TX = decltype(x_tag);
      TX* const gx = dx_x.defined() ? dx_x.as<TX>() : nullptr;
      const int packs = warp_row_packs(cols, {x.data, optional<T>(weight), dy.data, dx.data, gx});
      const bool params = (dweight.defined() || dbias.defined()) && cols > 0;
      // The parameter gradients' partial sums: a warp's chunk each (written by
      // the dx kernel), or fixed row chunks of a kernel of their own.
      const int64_t chunk_rows = packs > 0 ? kWarpChunk : grid_y_chunk(rows, kRowChunk);
      const int64_t chunks = rows > 0 ? (rows + chunk_rows - 1) / chunk_rows : 1;
      std::optional<Scratch> partial;
      if (params) partial.emplace(stream, size_t(2 * chunks * cols) * sizeof(A));
      A* const partial_data = params ? partial->as<A>() : nullptr;
      if (rows > 0 && packs > 0) {
        // Without parameter gradients a warp takes one row (more warps in flight).
        const int64_t warp_rows = params ? kWarpChunk : 1;
        const int64_t warps = (rows + warp_rows - 1) / warp_rows;
        with_packs(packs, [&](auto k) {
          constexpr int kPacks = decltype(k)::value;
          const auto kernel =
              params ? (dropout.on ? layer_norm_dx_warp_kernel<T, TX, kPacks, true, true>
                                   : layer_norm_dx_warp_kernel<T, TX, kPacks, true, false>)
                     : (dropout.on ? layer_norm_dx_warp_kernel<T, TX, kPacks, false, true>
                                   : layer_norm_dx_warp_kernel<T, TX, kPacks, false, false>);
          RF_LAUNCH(kernel, unsigned((warps + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock),
                    kRowThreads, 0, native(stream), x.as<const T>(), optional<T>(weight),
                    mean.as<const A>(), var.as<const A>(), dy.as<const T>(), dx.as<T>(), gx, rows,
                    cols, A(eps), warp_rows, partial_data, dropout);
        });
      } else if (rows > 0) {
        RF_LAUNCH((layer_norm_dx_kernel<T, TX>), unsigned(rows), kRowThreads, 0, native(stream),
                  x.as<const T>(), optional<T>(weight), mean.as<const A>(), var.as<const A>(),
                  dy.as<const T>(), dx.as<T>(), gx, cols, A(eps), dropout);
        if (params) {
          const dim3 grid(unsigned((cols + kThreads - 1) / kThreads), unsigned(chunks));
          RF_LAUNCH((layer_norm_param_partials<T>), grid, kThreads, 0, native(stream),
                    x.as<const T>(), mean.as<const A>(), var.as<const A>(), dy.as<const T>(),
                    partial_data, rows, cols, chunk_rows, A(eps));
        }
      }
      if (!params) return;
      if (rows == 0)
        RF_CUDA_CHECK(
            cudaMemsetAsync(partial_data, 0, size_t(2 * cols) * sizeof(A), native(stream)));
      RF_LAUNCH((layer_norm_param_finish<T>), unsigned((cols + 31) / 32), dim3(32, kFinishRows), 0,
                native(stream), partial_data, dweight.defined() ? dweight.as<T>() : nullptr,
                dbias.defined() ? dbias.as<T>() : nullptr, chunks, cols);
    };
    if constexpr (std::is_same_v<T, float>) {
      if (dx_x.defined() && dx_x.dtype == DType::bf16) return run(bf16_t{});
    }
    run(T{});
  });
}

}  // namespace roformer::kernels::cuda
