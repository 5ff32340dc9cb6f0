// matmul of the list: out[..., M, N] = a[..., M, K] b[..., K, N] (+ bias[N]),
// batch dims broadcast (stride 0). f32 and bf16 go to cuBLASLt (core/cuda/
// gemm.h) as one strided-batched call when the batch dims collapse, else one
// call per batch entry; an operand without a unit stride in its matrix dims
// goes through a contiguous copy. f64 (gradient checks) and empty sums use a
// plain loop kernel.
#include <vector>

#include "core/cuda/gemm.h"
#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

template <class T>
__global__ void matmul_loop_kernel(KernelTensor a, KernelTensor b, KernelTensor bias,
                                   KernelTensor out, int64_t total) {
  const int32_t nd = out.ndim;
  const int64_t M = out.sizes[nd - 2], N = out.sizes[nd - 1], K = a.sizes[nd - 1];
  const T* pa = a.as<const T>();
  const T* pb = b.as<const T>();
  const T* pbias = bias.defined() ? bias.as<const T>() : nullptr;
  T* po = out.as<T>();
  RF_GRID_LOOP(i, total) {
    const int64_t n = i % N, m = (i / N) % M;
    int64_t rest = i / (M * N), oa = 0, ob = 0, oo = 0;
    for (int32_t d = nd - 3; d >= 0; --d) {
      const int64_t idx = rest % out.sizes[d];
      rest /= out.sizes[d];
      oa += idx * a.strides[d];
      ob += idx * b.strides[d];
      oo += idx * out.strides[d];
    }
    double acc = pbias ? convert<double>(pbias[n * bias.strides[bias.ndim - 1]]) : 0.0;
    for (int64_t k = 0; k < K; ++k)
      acc += convert<double>(pa[oa + m * a.strides[nd - 2] + k * a.strides[nd - 1]]) *
             convert<double>(pb[ob + k * b.strides[nd - 2] + n * b.strides[nd - 1]]);
    po[oo + m * out.strides[nd - 2] + n * out.strides[nd - 1]] = convert<T>(acc);
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

}  // namespace

void matmul(Stream stream, const KernelTensor& a_in, const KernelTensor& b_in,
            const KernelTensor& bias_in, const KernelTensor& out_in) {
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
                bias_in, out_in, total);
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
  }
  const MatrixView av = matrix_view(a), bv = matrix_view(b), ov = matrix_view(out);

  ::roformer::cuda::GemmArgs g;
  g.m = M, g.n = N, g.k = K;
  g.trans_a = av.transposed, g.lda = av.ld;
  g.trans_b = bv.transposed, g.ldb = bv.ld;
  g.ldc = ov.ld;
  g.input_dtype = a.dtype;
  g.output_dtype = out.dtype;
  RF_CHECK(a.dtype == b.dtype, "matmul kernel: operands of different dtypes");
  if (bias.defined()) {
    g.bias = bias.data;
    g.bias_dtype = bias.dtype;
  }
  g.allow_tf32 = ::roformer::cuda::allow_tf32();
  const KernelTensor* ops[3] = {&a, &b, &out};
  int64_t count = 1, stride[3];
  const size_t ea = dtype_size(a.dtype), eb = dtype_size(b.dtype), eo = dtype_size(out.dtype);
  if (collapse_batch(out, ops, count, stride)) {
    g.batch = count;
    g.stride_a = stride[0], g.stride_b = stride[1], g.stride_c = stride[2];
    g.a = a.data, g.b = b.data, g.c = out.data;
    ::roformer::cuda::gemm(g, stream.device_index, native(stream));
  } else {
    // One call per batch entry.
    const int64_t batches = total / (M * N);
    for (int64_t i = 0; i < batches; ++i) {
      int64_t rest = i, oa = 0, ob = 0, oo = 0;
      for (int32_t d = nd - 3; d >= 0; --d) {
        const int64_t idx = rest % out.sizes[d];
        rest /= out.sizes[d];
        oa += idx * a.strides[d];
        ob += idx * b.strides[d];
        oo += idx * out.strides[d];
      }
      g.a = static_cast<const char*>(a.data) + oa * int64_t(ea);
      g.b = static_cast<const char*>(b.data) + ob * int64_t(eb);
      g.c = static_cast<char*>(out.data) + oo * int64_t(eo);
      ::roformer::cuda::gemm(g, stream.device_index, native(stream));
    }
  }
  if (!out_direct) copy(stream, out, out_in);
}

}  // namespace roformer::kernels::cuda
