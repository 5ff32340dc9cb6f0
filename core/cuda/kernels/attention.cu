// Softmax attention without an S x S matrix in memory (flash-style, simple):
// - forward: one block per query row, keys in tiles of kTile with an online
//   softmax (running max and sum, the output rescaled per tile); the row's
//   log-sum-exp and, with dropout, its keep bits (the shared rule of
//   core/philox.h, as the CPU draws them) are written for the backward;
// - backward recomputes the probabilities from q, k and the log-sum-exp: one
//   block per query row for dq (and D = dO . O), then one block per key row
//   for dk and dv. Each output row is owned by one block: no atomics, the
//   same result on every run.
// Arithmetic in f32 for f32/bf16 and f64 for f64. bf16 q, k, v at head dim
// 64 go to the tensor-core kernel of flash_attention.cu instead.
#include "core/cuda/kernels/attention_common.cuh"
#include "core/cuda/kernels/cudnn_attention.h"
#include "core/cuda/kernels/flash_attention.h"

namespace roformer::kernels::cuda {

namespace {

constexpr int kTile = 128;  // keys (or queries) per tile = threads per block

template <class T>
__device__ __forceinline__ const T* row4(const KernelTensor& t, int64_t b, int64_t h, int64_t i) {
  return t.as<const T>() + b * t.strides[0] + h * t.strides[1] + i * t.strides[2];
}
template <class T>
__device__ __forceinline__ T* row4_mut(const KernelTensor& t, int64_t b, int64_t h, int64_t i) {
  return t.as<T>() + b * t.strides[0] + h * t.strides[1] + i * t.strides[2];
}

template <class T, class A>
__device__ __forceinline__ A dot_shared(const A* x, const T* y, int64_t n) {
  A acc = 0;
  for (int64_t c = 0; c < n; ++c) acc += x[c] * convert<A>(y[c]);
  return acc;
}

// The row a block owns: blockIdx.x counts (batch, head) pairs, each with
// `rows` rows (query or key), in one dimension, as gridDim.y's 65535 would
// not hold B x H of a large batch.
struct BlockRow {
  int64_t index, bh, b, h;
};
__device__ __forceinline__ BlockRow block_row(int64_t rows, int64_t H) {
  const int64_t bh = int64_t(blockIdx.x) / rows;
  return {int64_t(blockIdx.x) % rows, bh, bh / H, bh % H};
}

// One block per row of every (batch, head) pair.
dim3 row_grid(int64_t rows, int64_t pairs) {
  RF_CHECK(rows * pairs < (int64_t(1) << 31), "attention kernel: ", rows, " rows x ", pairs,
           " (batch, head) pairs is too large a grid");
  return dim3(unsigned(rows * pairs));
}

// The dropout factor of key j in a query row's keep bits (null: no dropout).
template <class A>
__device__ __forceinline__ A keep_factor(const uint32_t* row_bits, int64_t j, A inv_keep) {
  if (!row_bits) return A(1);
  return ((row_bits[j >> 5] >> (j & 31)) & 1u) ? inv_keep : A(0);
}

// acc[c] = acc[c] * carry + sum over t < tile of w[t] * row(t)[c], for c < n
// (threads stride over c; rows with a zero weight are not read).
template <class T, class A, class Row>
__device__ __forceinline__ void accumulate_tile(A* acc, int64_t n, A carry, const A* w,
                                                int64_t tile, Row row) {
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    A sum = acc[c] * carry;
    for (int64_t t = 0; t < tile; ++t)
      if (w[t] != A(0)) sum += w[t] * convert<A>(row(t)[c]);
    acc[c] = sum;
  }
}

template <class T>
__global__ void attention_forward_kernel(KernelTensor q, KernelTensor k, KernelTensor v,
                                         KernelTensor mask, KernelTensor out, KernelTensor lse,
                                         KernelTensor keep_bits, acc_t<T> scale, DropoutRule drop,
                                         int64_t H) {
  using A = acc_t<T>;
  RF_DYNAMIC_SHARED(smem_raw);
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int64_t Sq = q.sizes[2], Sk = k.sizes[2], D = q.sizes[3], Dv = v.sizes[3];
  const BlockRow r = block_row(Sq, H);
  const int64_t i = r.index, bh = r.bh, b = r.b, h = r.h;
  const int64_t row = bh * Sq + i, W = (Sk + 31) / 32;
  A* q_sh = smem;         // D
  A* acc = q_sh + D;      // Dv
  A* p_sh = acc + Dv;     // kTile
  A* red = p_sh + kTile;  // 32
  const T* qi = row4<T>(q, b, h, i);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) q_sh[c] = convert<A>(qi[c]);
  for (int64_t c = threadIdx.x; c < Dv; c += blockDim.x) acc[c] = 0;
  __syncthreads();
  A m = -INFINITY, l = 0;
  for (int64_t j0 = 0; j0 < Sk; j0 += kTile) {
    const int64_t j = j0 + threadIdx.x;
    A s = -INFINITY;
    if (j < Sk && key_kept(mask, b, j)) s = scale * dot_shared<T, A>(q_sh, row4<T>(k, b, h, j), D);
    const A tile_max = block_max(s, red);
    const A m_new = tile_max > m ? tile_max : m;
    A p = 0, corr = 1;
    if (m_new != -INFINITY) {
      corr = m == -INFINITY ? A(0) : exp(m - m_new);
      p = s == -INFINITY ? A(0) : exp(s - m_new);
    }
    l = l * corr + block_sum(p, red);
    A pd = p;
    if (drop.on) {
      const bool keep =
          j < Sk &&
          dropout_draw(drop.key, uint32_t(j), uint32_t(drop.first_position + i),
                       uint32_t(drop.first_sequence + b), drop.site, uint32_t(h)) >= drop.threshold;
      const unsigned bits = __ballot_sync(0xffffffffu, keep);
      const int64_t word = (j0 + (threadIdx.x / 32) * 32) / 32;
      if (threadIdx.x % 32 == 0 && word < W)
        keep_bits.as<int32_t>()[row * W + word] = int32_t(bits);
      pd = keep ? p * A(drop.inv_keep) : A(0);
    }
    p_sh[threadIdx.x] = pd;
    __syncthreads();
    const int64_t tile = Sk - j0 < kTile ? Sk - j0 : kTile;
    accumulate_tile<T>(acc, Dv, corr, p_sh, tile,
                       [&](int64_t t) { return row4<T>(v, b, h, j0 + t); });
    __syncthreads();
    m = m_new;
  }
  T* oi = row4_mut<T>(out, b, h, i);
  const bool empty = m == -INFINITY;  // no key to attend to
  for (int64_t c = threadIdx.x; c < Dv; c += blockDim.x)
    oi[c] = convert<T>(empty ? A(0) : acc[c] / l);
  if (threadIdx.x == 0) lse.as<A>()[row] = empty ? A(-INFINITY) : m + log(l);
}

// dq for one query row, and D = dO . O (kept for the key-row pass).
template <class T>
__global__ void attention_dq_kernel(KernelTensor q, KernelTensor k, KernelTensor v,
                                    KernelTensor mask, KernelTensor out, KernelTensor lse,
                                    KernelTensor keep_bits, KernelTensor grad_out,
                                    KernelTensor grad_q, acc_t<T>* delta, acc_t<T> scale,
                                    DropoutRule drop, int64_t H) {
  using A = acc_t<T>;
  RF_DYNAMIC_SHARED(smem_raw);
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int64_t Sq = q.sizes[2], Sk = k.sizes[2], D = q.sizes[3], Dv = v.sizes[3];
  const BlockRow r = block_row(Sq, H);
  const int64_t i = r.index, bh = r.bh, b = r.b, h = r.h;
  const int64_t row = bh * Sq + i, W = (Sk + 31) / 32;
  A* q_sh = smem;       // D
  A* go_sh = q_sh + D;  // Dv
  A* dq = go_sh + Dv;   // D
  A* ds_sh = dq + D;    // kTile
  A* red = ds_sh + kTile;
  const T* qi = row4<T>(q, b, h, i);
  const T* goi = row4<T>(grad_out, b, h, i);
  const T* oi = row4<T>(out, b, h, i);
  A partial = 0;
  for (int64_t c = threadIdx.x; c < Dv; c += blockDim.x) {
    go_sh[c] = convert<A>(goi[c]);
    partial += go_sh[c] * convert<A>(oi[c]);
  }
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    q_sh[c] = convert<A>(qi[c]);
    dq[c] = 0;
  }
  const A Di = block_sum(partial, red);  // also the barrier for the shared rows
  if (threadIdx.x == 0) delta[row] = Di;
  const A row_lse = lse.as<const A>()[row];
  if (row_lse != -INFINITY) {
    const uint32_t* bits =
        drop.on ? reinterpret_cast<const uint32_t*>(keep_bits.as<const int32_t>()) + row * W
                : nullptr;
    for (int64_t j0 = 0; j0 < Sk; j0 += kTile) {
      const int64_t j = j0 + threadIdx.x;
      A ds = 0;
      if (j < Sk && key_kept(mask, b, j)) {
        const A p = exp(scale * dot_shared<T, A>(q_sh, row4<T>(k, b, h, j), D) - row_lse);
        const A z = keep_factor(bits, j, A(drop.inv_keep));
        const A dp = dot_shared<T, A>(go_sh, row4<T>(v, b, h, j), Dv);
        ds = p * (dp * z - Di) * scale;
      }
      ds_sh[threadIdx.x] = ds;
      __syncthreads();
      const int64_t tile = Sk - j0 < kTile ? Sk - j0 : kTile;
      accumulate_tile<T>(dq, D, A(1), ds_sh, tile,
                         [&](int64_t t) { return row4<T>(k, b, h, j0 + t); });
      __syncthreads();
    }
  }
  T* dqi = row4_mut<T>(grad_q, b, h, i);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) dqi[c] = convert<T>(dq[c]);
}

// dk and dv for one key row.
template <class T>
__global__ void attention_dkv_kernel(KernelTensor q, KernelTensor k, KernelTensor v,
                                     KernelTensor mask, KernelTensor lse, KernelTensor keep_bits,
                                     KernelTensor grad_out, KernelTensor grad_k,
                                     KernelTensor grad_v, const acc_t<T>* delta, acc_t<T> scale,
                                     DropoutRule drop, int64_t H) {
  using A = acc_t<T>;
  RF_DYNAMIC_SHARED(smem_raw);
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int64_t Sq = q.sizes[2], Sk = k.sizes[2], D = q.sizes[3], Dv = v.sizes[3];
  const BlockRow r = block_row(Sk, H);
  const int64_t j = r.index, bh = r.bh, b = r.b, h = r.h;
  const int64_t W = (Sk + 31) / 32;
  A* k_sh = smem;            // D
  A* v_sh = k_sh + D;        // Dv
  A* dk = v_sh + Dv;         // D
  A* dv = dk + D;            // Dv
  A* ds_sh = dv + Dv;        // kTile
  A* pz_sh = ds_sh + kTile;  // kTile
  const T* kj = row4<T>(k, b, h, j);
  const T* vj = row4<T>(v, b, h, j);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    k_sh[c] = convert<A>(kj[c]);
    dk[c] = 0;
  }
  for (int64_t c = threadIdx.x; c < Dv; c += blockDim.x) {
    v_sh[c] = convert<A>(vj[c]);
    dv[c] = 0;
  }
  __syncthreads();
  const bool kept = key_kept(mask, b, j);
  if (kept) {
    const uint32_t* bits =
        drop.on ? reinterpret_cast<const uint32_t*>(keep_bits.as<const int32_t>()) : nullptr;
    for (int64_t i0 = 0; i0 < Sq; i0 += kTile) {
      const int64_t i = i0 + threadIdx.x;
      A ds = 0, pz = 0;
      if (i < Sq) {
        const int64_t row = bh * Sq + i;
        const A row_lse = lse.as<const A>()[row];
        if (row_lse != -INFINITY) {
          const A p = exp(scale * dot_shared<T, A>(k_sh, row4<T>(q, b, h, i), D) - row_lse);
          const A z = keep_factor(bits ? bits + row * W : nullptr, j, A(drop.inv_keep));
          const A dp = dot_shared<T, A>(v_sh, row4<T>(grad_out, b, h, i), Dv);
          ds = p * (dp * z - delta[row]) * scale;
          pz = p * z;
        }
      }
      ds_sh[threadIdx.x] = ds;
      pz_sh[threadIdx.x] = pz;
      __syncthreads();
      const int64_t tile = Sq - i0 < kTile ? Sq - i0 : kTile;
      accumulate_tile<T>(dk, D, A(1), ds_sh, tile,
                         [&](int64_t t) { return row4<T>(q, b, h, i0 + t); });
      accumulate_tile<T>(dv, Dv, A(1), pz_sh, tile,
                         [&](int64_t t) { return row4<T>(grad_out, b, h, i0 + t); });
      __syncthreads();
    }
  }
  T* dkj = row4_mut<T>(grad_k, b, h, j);
  T* dvj = row4_mut<T>(grad_v, b, h, j);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) dkj[c] = convert<T>(dk[c]);
  for (int64_t c = threadIdx.x; c < Dv; c += blockDim.x) dvj[c] = convert<T>(dv[c]);
}

void check_geometry(const KernelTensor& q, const KernelTensor& k, const KernelTensor& v) {
  RF_CHECK(q.ndim == 4 && k.ndim == 4 && v.ndim == 4 && q.strides[3] == 1 && k.strides[3] == 1 &&
               v.strides[3] == 1,
           "attention kernel: expected q, k, v [B, H, S, D] with unit last stride");
}

// Whether the tensor-core kernel (flash_attention.cu) takes the call: bf16
// q, k, v at head dim 64, f32 or bf16 outputs, f32 lse.
bool flash_outputs(const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                   const KernelTensor& out, const KernelTensor& lse) {
  return flash_supported(q, k, v) && (out.dtype == DType::f32 || out.dtype == DType::bf16) &&
         lse.dtype == DType::f32;
}

}  // namespace

void simple_attention_forward(Stream stream, double scale, const DropoutRule& drop,
                              const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                              const KernelTensor& key_mask, const KernelTensor& out,
                              const KernelTensor& lse, const KernelTensor& keep_bits) {
  check_geometry(q, k, v);
  RF_CHECK(out.dtype == q.dtype && lse.dtype == (q.dtype == DType::f64 ? DType::f64 : DType::f32),
           "attention kernel: the simple CUDA kernel writes out in q's dtype and lse in its "
           "arithmetic type");
  if (out.numel() == 0) return;
  const int64_t B = q.sizes[0], H = q.sizes[1], Sq = q.sizes[2], D = q.sizes[3], Dv = v.sizes[3];
  on_floating_dtype(q.dtype, "attention", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const size_t shared = size_t(D + Dv + kTile + 32) * sizeof(A);
    allow_shared(attention_forward_kernel<T>, shared);
    RF_LAUNCH((attention_forward_kernel<T>), row_grid(Sq, B * H), kTile, shared, native(stream), q,
              k, v, key_mask, out, lse, keep_bits, A(scale), drop, H);
  });
}

void simple_attention_backward(Stream stream, double scale, const DropoutRule& drop,
                               const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                               const KernelTensor& key_mask, const KernelTensor& out,
                               const KernelTensor& lse, const KernelTensor& keep_bits,
                               const KernelTensor& grad_out, const KernelTensor& grad_q,
                               const KernelTensor& grad_k, const KernelTensor& grad_v) {
  check_geometry(q, k, v);
  const int64_t B = q.sizes[0], H = q.sizes[1], Sq = q.sizes[2], Sk = k.sizes[2];
  const int64_t D = q.sizes[3], Dv = v.sizes[3];
  if (B * H == 0) return;
  on_floating_dtype(q.dtype, "attention", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    Scratch delta(stream, size_t(B * H * (Sq > 0 ? Sq : 1)) * sizeof(A));
    if (Sq > 0) {
      const size_t shared = size_t(2 * D + Dv + kTile + 32) * sizeof(A);
      allow_shared(attention_dq_kernel<T>, shared);
      RF_LAUNCH((attention_dq_kernel<T>), row_grid(Sq, B * H), kTile, shared, native(stream), q, k,
                v, key_mask, out, lse, keep_bits, grad_out, grad_q, delta.as<A>(), A(scale), drop,
                H);
    }
    if (Sk > 0) {
      const size_t shared = size_t(2 * D + 2 * Dv + 2 * kTile) * sizeof(A);
      allow_shared(attention_dkv_kernel<T>, shared);
      RF_LAUNCH((attention_dkv_kernel<T>), row_grid(Sk, B * H), kTile, shared, native(stream), q, k,
                v, key_mask, lse, keep_bits, grad_out, grad_k, grad_v, delta.as<const A>(),
                A(scale), drop, H);
    }
  });
}

void attention_forward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                       const KernelTensor& k, const KernelTensor& v, const KernelTensor& key_mask,
                       const KernelTensor& out, const KernelTensor& lse,
                       const KernelTensor& keep_bits) {
  check_geometry(q, k, v);
  check_attention_forward_dtypes("attention kernel", q, k, v, out, lse);
  if (out.numel() == 0) return;
  if (params.engine == AttentionEngine::vendor) {
    cudnn_attention_forward(stream, params, q, k, v, key_mask, out, lse);
    return;
  }
  if (flash_outputs(q, k, v, out, lse)) {
    flash_forward(stream, params, FlashRope{}, q, k, v, key_mask, KernelTensor{}, out, lse,
                  keep_bits);
    return;
  }
  if (upcast(q, out)) {
    const F32Copy q32(stream, q), k32(stream, k), v32(stream, v);
    simple_attention_forward(stream, params.scale, dropout_rule(params), q32.tensor, k32.tensor,
                             v32.tensor, key_mask, out, lse, keep_bits);
    return;
  }
  simple_attention_forward(stream, params.scale, dropout_rule(params), q, k, v, key_mask, out, lse,
                           keep_bits);
}

void attention_backward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                        const KernelTensor& k, const KernelTensor& v, const KernelTensor& key_mask,
                        const KernelTensor& out, const KernelTensor& lse,
                        const KernelTensor& keep_bits, const KernelTensor& grad_out,
                        const KernelTensor& grad_q, const KernelTensor& grad_k,
                        const KernelTensor& grad_v) {
  check_geometry(q, k, v);
  check_attention_backward_dtypes("attention kernel", q, k, v, out, lse, grad_out, grad_q, grad_k,
                                  grad_v);
  if (params.engine == AttentionEngine::vendor) {
    cudnn_attention_backward(stream, params, q, k, v, key_mask, out, lse, grad_out, grad_q, grad_k,
                             grad_v);
    return;
  }
  if (flash_outputs(q, k, v, out, lse) && flash_supported(q, k, v, grad_out) &&
      flash_outputs(q, k, v, grad_q, lse) && grad_k.dtype == grad_q.dtype &&
      grad_v.dtype == grad_q.dtype) {
    if (q.sizes[0] * q.sizes[1] == 0) return;
    flash_backward(stream, params, FlashRope{}, q, k, v, key_mask, KernelTensor{}, out, lse,
                   keep_bits, grad_out, grad_q, grad_k, grad_v);
    return;
  }
  if (upcast(q, grad_q)) {
    const F32Copy q32(stream, q), k32(stream, k), v32(stream, v), o32(stream, out),
        g32(stream, grad_out);
    simple_attention_backward(stream, params.scale, dropout_rule(params), q32.tensor, k32.tensor,
                              v32.tensor, key_mask, o32.tensor, lse, keep_bits, g32.tensor, grad_q,
                              grad_k, grad_v);
    return;
  }
  simple_attention_backward(stream, params.scale, dropout_rule(params), q, k, v, key_mask, out, lse,
                            keep_bits, grad_out, grad_q, grad_k, grad_v);
}

}  // namespace roformer::kernels::cuda
