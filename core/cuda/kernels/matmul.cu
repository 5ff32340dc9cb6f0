// matmul of the list: out[..., M, N] = a[..., M, K] b[..., K, N] (+ bias[N]),
// batch dims broadcast (stride 0); matmul_accumulate adds the product into
// out (cuBLASLt's beta = 1). f32 and bf16 go to cuBLASLt (core/cuda/
// gemm.h) as one strided-batched call when the batch dims collapse, else one
// call per batch entry; an operand without a unit stride in its matrix dims
// goes through a contiguous copy. f64 (gradient checks) and empty sums use a
// plain loop kernel.
#include <optional>
#include <vector>

#include "core/cuda/gemm.h"
#include "core/cuda/kernels/column_sums.cuh"
#include "core/cuda/kernels/common.cuh"
#include "core/kernels/gelu_tanh.h"
#include "core/kernels/linear_weight_grads_shapes.h"

namespace roformer::kernels::cuda {

namespace {

// Element offsets in a, b and out of batch entry `entry` (row-major over the
// result's batch dims; broadcast dims have stride 0).
struct BatchOffsets {
  int64_t a = 0, b = 0, out = 0;
};
__host__ __device__ inline BatchOffsets batch_offsets(const KernelTensor& a, const KernelTensor& b,
                                                      const KernelTensor& out, int64_t entry) {
  BatchOffsets o;
  for (int32_t d = out.ndim - 3; d >= 0; --d) {
    const int64_t idx = entry % out.sizes[d];
    entry /= out.sizes[d];
    o.a += idx * a.strides[d];
    o.b += idx * b.strides[d];
    o.out += idx * out.strides[d];
  }
  return o;
}

template <class T>
__global__ void matmul_loop_kernel(KernelTensor a, KernelTensor b, KernelTensor bias,
                                   KernelTensor out, int64_t total, bool accumulate) {
  const int32_t nd = out.ndim;
  const int64_t M = out.sizes[nd - 2], N = out.sizes[nd - 1], K = a.sizes[nd - 1];
  const T* pa = a.as<const T>();
  const T* pb = b.as<const T>();
  const T* pbias = bias.defined() ? bias.as<const T>() : nullptr;
  T* po = out.as<T>();
  RF_GRID_LOOP(i, total) {
    const int64_t n = i % N, m = (i / N) % M;
    const BatchOffsets o = batch_offsets(a, b, out, i / (M * N));
    const int64_t oa = o.a, ob = o.b, oo = o.out;
    double acc = pbias ? convert<double>(pbias[n * bias.strides[bias.ndim - 1]]) : 0.0;
    for (int64_t k = 0; k < K; ++k)
      acc += convert<double>(pa[oa + m * a.strides[nd - 2] + k * a.strides[nd - 1]]) *
             convert<double>(pb[ob + k * b.strides[nd - 2] + n * b.strides[nd - 1]]);
    T& result = po[oo + m * out.strides[nd - 2] + n * out.strides[nd - 1]];
    result = convert<T>(accumulate ? convert<double>(result) + acc : acc);
  }
}

// A matrix operand as cuBLASLt takes it: row-major (unit column stride) or
// transposed (unit row stride), with its row stride.
struct MatrixView {
  bool ok = false, transposed = false;
  int64_t ld = 0;
};

MatrixView matrix_view(const KernelTensor& t) {
  const int32_t nd = t.ndim;
  const int64_t rows = t.sizes[nd - 2], cols = t.sizes[nd - 1];
  const int64_t rs = t.strides[nd - 2], cs = t.strides[nd - 1];
  MatrixView v;
  if (cols == 1 || cs == 1) {  // row-major
    const int64_t ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
    if (ld >= (cols > 1 ? cols : 1)) return {true, false, ld};
  }
  if (rows == 1 || rs == 1) {  // stored transposed: column-major
    const int64_t ld = cols == 1 ? (rows > 1 ? rows : 1) : cs;
    if (ld >= (rows > 1 ? rows : 1)) return {true, true, ld};
  }
  return v;
}

// One stride per operand for all batch dims, if they collapse.
bool collapse_batch(const KernelTensor& out, const KernelTensor* const (&ops)[3], int64_t& count,
                    int64_t (&stride)[3]) {
  const int32_t nb = out.ndim - 2;
  count = 1;
  for (int k = 0; k < 3; ++k) stride[k] = 0;
  int32_t last = -1;  // the innermost batch dim of size > 1 seen so far
  for (int32_t d = nb - 1; d >= 0; --d) {
    if (out.sizes[d] == 1) continue;
    for (int k = 0; k < 3; ++k) {
      if (last < 0) {
        stride[k] = ops[k]->strides[d];
      } else if (ops[k]->strides[d] != ops[k]->strides[last] * out.sizes[last]) {
        return false;
      }
    }
    count *= out.sizes[d];
    last = d;
  }
  return true;
}

// A contiguous copy of t in scratch memory (kept alive by `keep`).
KernelTensor contiguous_copy(const Stream& stream, const KernelTensor& t,
                             std::vector<std::unique_ptr<Scratch>>& keep) {
  keep.push_back(std::make_unique<Scratch>(stream, nbytes_of(t)));
  const KernelTensor c = contiguous_like(t, keep.back()->as<void>(), t.dtype);
  copy(stream, t, c);
  return c;
}

// The cuBLASLt problem of out = a b (+ bias) for operands matrix_view takes
// and a row-major out (batch 1; the caller sets batch strides and pointers).
::roformer::cuda::GemmArgs product_args(const KernelTensor& a, const KernelTensor& b,
                                        const KernelTensor& bias, const KernelTensor& out) {
  RF_CHECK(a.dtype == b.dtype, "matmul kernel: operands of different dtypes");
  const int32_t nd = out.ndim;
  const MatrixView av = matrix_view(a), bv = matrix_view(b), ov = matrix_view(out);
  ::roformer::cuda::GemmArgs g;
  g.m = out.sizes[nd - 2], g.n = out.sizes[nd - 1], g.k = a.sizes[nd - 1];
  g.trans_a = av.transposed, g.lda = av.ld;
  g.trans_b = bv.transposed, g.ldb = bv.ld;
  g.ldc = ov.ld;
  g.input_dtype = a.dtype;
  g.output_dtype = out.dtype;
  if (bias.defined()) {
    g.bias = bias.data;
    g.bias_dtype = bias.dtype;
  }
  g.allow_tf32 = ::roformer::cuda::allow_tf32();
  g.a = a.data, g.b = b.data, g.c = out.data;
  return g;
}

// out = a b (+ bias), or out += a b.
void product(Stream stream, const KernelTensor& a_in, const KernelTensor& b_in,
             const KernelTensor& bias_in, const KernelTensor& out_in, bool accumulate) {
  RF_CHECK(out_in.ndim >= 2 && a_in.ndim == out_in.ndim && b_in.ndim == out_in.ndim,
           "matmul kernel: expected operands with the result's ", out_in.ndim, " dims");
  const int64_t total = out_in.numel();
  if (total == 0) return;
  const int32_t nd = out_in.ndim;
  const int64_t M = out_in.sizes[nd - 2], N = out_in.sizes[nd - 1], K = a_in.sizes[nd - 1];
  if (a_in.dtype == DType::f64 || K == 0) {
    on_floating_dtype(out_in.dtype, "matmul", [&](auto tag) {
      using T = decltype(tag);
      RF_LAUNCH((matmul_loop_kernel<T>), grid_for(total), kThreads, 0, native(stream), a_in, b_in,
                bias_in, out_in, total, accumulate);
    });
    return;
  }
  std::vector<std::unique_ptr<Scratch>> keep;
  KernelTensor a = a_in, b = b_in, bias = bias_in, out = out_in;
  if (!matrix_view(a).ok) a = contiguous_copy(stream, a, keep);
  if (!matrix_view(b).ok) b = contiguous_copy(stream, b, keep);
  if (bias.defined() && bias.strides[bias.ndim - 1] != 1)
    bias = contiguous_copy(stream, bias, keep);
  const MatrixView out_view = matrix_view(out);
  const bool out_direct = out_view.ok && !out_view.transposed;
  if (!out_direct) {
    keep.push_back(std::make_unique<Scratch>(stream, nbytes_of(out)));
    out = contiguous_like(out_in, keep.back()->as<void>(), out_in.dtype);
    if (accumulate) copy(stream, out_in, out);
  }
  ::roformer::cuda::GemmArgs g = product_args(a, b, bias, out);
  if (accumulate) g.beta = 1.0f;
  const KernelTensor* ops[3] = {&a, &b, &out};
  int64_t count = 1, stride[3];
  const size_t ea = dtype_size(a.dtype), eb = dtype_size(b.dtype), eo = dtype_size(out.dtype);
  if (collapse_batch(out, ops, count, stride)) {
    g.batch = count;
    g.stride_a = stride[0], g.stride_b = stride[1], g.stride_c = stride[2];
    ::roformer::cuda::gemm(g, stream.device_index, native(stream));
  } else {
    // One call per batch entry.
    const int64_t batches = total / (M * N);
    for (int64_t i = 0; i < batches; ++i) {
      const BatchOffsets o = batch_offsets(a, b, out, i);
      g.a = static_cast<const char*>(a.data) + o.a * int64_t(ea);
      g.b = static_cast<const char*>(b.data) + o.b * int64_t(eb);
      g.c = static_cast<char*>(out.data) + o.out * int64_t(eo);
      ::roformer::cuda::gemm(g, stream.device_index, native(stream));
    }
  }
  if (!out_direct) copy(stream, out, out_in);
}

}  // namespace

void matmul(Stream stream, const KernelTensor& a, const KernelTensor& b, const KernelTensor& bias,
            const KernelTensor& out) {
  product(stream, a, b, bias, out, /*accumulate=*/false);
}

void matmul_accumulate(Stream stream, const KernelTensor& a, const KernelTensor& b,
                       const KernelTensor& out) {
  product(stream, a, b, KernelTensor{}, out, /*accumulate=*/true);
}

// --- the products with the tanh-GELU epilogue -----------------------------------------
// cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD epilogues when they can take the
// problem (f32 or bf16 operands matrix_view takes, a bias, contiguous f32 or
// bf16 results with n a multiple of 8, 16-byte aligned, an algorithm for it);
// otherwise the matmul above and the passes below, with the same formulas
// (core/kernels/gelu_tanh.h).

namespace {

template <class T>
__global__ void gelu_tanh_kernel(const T* pre, T* y, int64_t n) {
  using A = acc_t<T>;
  RF_GRID_LOOP(i, n) y[i] = convert<T>(gelu_tanh(convert<A>(pre[i])));
}

template <class T>
__global__ void dgelu_tanh_kernel(const T* pre, T* d, int64_t n) {
  using A = acc_t<T>;
  RF_GRID_LOOP(i, n) d[i] = convert<T>(convert<A>(d[i]) * gelu_tanh_grad(convert<A>(pre[i])));
}

void check_gelu_geometry(const KernelTensor& a, const KernelTensor& pre, const KernelTensor& out) {
  RF_CHECK(a.ndim == 2 && pre.ndim == 2 && out.ndim == 2 && pre.is_contiguous() &&
               out.is_contiguous() && pre.sizes[0] == out.sizes[0] && pre.sizes[1] == out.sizes[1],
           "gelu gemm kernel: expected 2-D operands and contiguous [M, N] results");
}

// The epilogue problem for out = a b with `vector` (bias or bias gradient) and
// `aux` [M, N], or nullopt when cuBLASLt's epilogue cannot take it.
std::optional<::roformer::cuda::GemmArgs> epilogue_args(
    const KernelTensor& a, const KernelTensor& b, const KernelTensor& vector,
    const KernelTensor& aux, const KernelTensor& out, ::roformer::cuda::GemmEpilogue epilogue) {
  const bool low = a.dtype == DType::f32 || a.dtype == DType::bf16;
  const bool result = out.dtype == DType::f32 || out.dtype == DType::bf16;
  const int64_t N = out.sizes[1];
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!low || !result || a.dtype != b.dtype || aux.dtype != out.dtype || !vector.defined() ||
      vector.dtype != out.dtype || vector.strides[0] != 1 || N % 8 != 0 || out.sizes[0] == 0 ||
      a.sizes[1] == 0 || !matrix_view(a).ok || !matrix_view(b).ok || !aligned(aux.data) ||
      !aligned(out.data))
    return std::nullopt;
  ::roformer::cuda::GemmArgs g = product_args(a, b, vector, out);
  g.epilogue = epilogue;
  g.aux = aux.data;
  g.ld_aux = N;
  return g;
}

}  // namespace

void gemm_gelu_forward(Stream stream, const KernelTensor& a, const KernelTensor& b,
                       const KernelTensor& bias, const KernelTensor& pre, const KernelTensor& y) {
  check_gelu_geometry(a, pre, y);
  const auto g = epilogue_args(a, b, bias, pre, y, ::roformer::cuda::GemmEpilogue::kGeluAux);
  if (g && ::roformer::cuda::try_gemm(*g, stream.device_index, native(stream))) return;
  matmul(stream, a, b, bias, pre);
  const int64_t n = pre.numel();
  if (n == 0) return;
  on_floating_dtype(pre.dtype, "gemm_gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    RF_LAUNCH((gelu_tanh_kernel<T>), grid_for(n), kThreads, 0, native(stream), pre.as<const T>(),
              y.as<T>(), n);
  });
}

void gemm_dgelu_backward(Stream stream, const KernelTensor& a, const KernelTensor& b,
                         const KernelTensor& pre, const KernelTensor& dpre,
                         const KernelTensor& dbias) {
  check_gelu_geometry(a, pre, dpre);
  RF_CHECK(dbias.ndim == 1 && dbias.sizes[0] == dpre.sizes[1] && dbias.strides[0] == 1,
           "gelu gemm kernel: expected a contiguous bias gradient [N]");
  const auto g =
      epilogue_args(a, b, dbias, pre, dpre, ::roformer::cuda::GemmEpilogue::kDGeluBiasGrad);
  if (g && ::roformer::cuda::try_gemm(*g, stream.device_index, native(stream))) return;
  matmul(stream, a, b, KernelTensor{}, dpre);
  const int64_t M = dpre.sizes[0], N = dpre.sizes[1];
  if (N == 0) return;
  on_floating_dtype(pre.dtype, "gemm_dgelu_backward", [&](auto tag) {
    using T = decltype(tag);
    if (M > 0)
      RF_LAUNCH((dgelu_tanh_kernel<T>), grid_for(M * N), kThreads, 0, native(stream),
                pre.as<const T>(), dpre.as<T>(), M * N);
    column_sums<acc_t<T>>(stream, dpre.as<const T>(), dbias.as<T>(), M, N);
  });
}

// --- a linear's weight and bias gradients ----------------------------------------------
// `fused`: cuBLASLt's BGRADB epilogue sums g's columns while the product
// reads g (the bias gradient costs no pass of its own) where it takes the
// problem: f32 or bf16 operands, a result matrix_view writes directly, an
// algorithm for it. Otherwise the product, then `sum` over g's rows.
void linear_weight_grads(Stream stream, const KernelTensor& g, const KernelTensor& x,
                         const KernelTensor& dw, const KernelTensor& db, bool fused) {
  check_linear_weight_grads(g, x, dw, db);
  const KernelTensor gt = swapped(g, 0, 1);  // [N, T]: the product's A
  const bool low = g.dtype == DType::f32 || g.dtype == DType::bf16;
  const MatrixView out_view = matrix_view(dw);
  if (fused && low && g.dtype == x.dtype && (dw.dtype == DType::f32 || dw.dtype == DType::bf16) &&
      g.sizes[0] > 0 && g.sizes[1] > 0 && dw.sizes[1] > 0 && matrix_view(gt).ok &&
      matrix_view(x).ok && out_view.ok && !out_view.transposed) {
    ::roformer::cuda::GemmArgs args = product_args(gt, x, KernelTensor{}, dw);
    args.epilogue = ::roformer::cuda::GemmEpilogue::kRowSumsOfA;
    args.bias = db.data;
    args.bias_dtype = db.dtype;
    if (::roformer::cuda::try_gemm(args, stream.device_index, native(stream))) return;
  }
  matmul(stream, gt, x, KernelTensor{}, dw);
  sum(stream, g, 1u, db);
}

}  // namespace roformer::kernels::cuda
