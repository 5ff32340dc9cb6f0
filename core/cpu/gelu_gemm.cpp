// The products with the tanh-GELU epilogue, unfused on the CPU: the matmul
// kernel, then one pass for the GELU (in backward also the bias gradient),
// with the formulas of core/kernels/gelu_tanh.h that cuBLASLt's epilogues
// compute on the GPU.
#include <algorithm>

#include "core/cpu/strided_loop.h"
#include "core/kernels/gelu_tanh.h"
#include "core/kernels/kernel_list.h"

namespace roformer::kernels::cpu {

namespace {

void check_matrix(const View& t, int64_t rows, int64_t cols, const char* what) {
  RF_CHECK(
      t.shape().size() == 2 && t.shape()[0] == rows && t.shape()[1] == cols && t.is_contiguous(),
      "gelu gemm kernel: ", what, " must be a contiguous [", rows, ", ", cols, "] matrix, got ",
      t.desc());
}

}  // namespace

void gemm_gelu_forward(Stream stream, KT a, KT b, KT bias, KT pre_kt, KT y_kt) {
  const View pre(pre_kt), y(y_kt);
  const int64_t M = pre.shape().at(0), N = pre.shape().at(1);
  check_matrix(pre, M, N, "pre");
  check_matrix(y, M, N, "y");
  matmul(stream, a, b, bias, pre_kt);
  dispatch_floating(pre.dtype(), "gemm_gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* pp = pre.data_as<T>();
    T* py = y.data_as<T>();
    parallel_rows(M, N, [&](int64_t m) {
      for (int64_t c = m * N; c < (m + 1) * N; ++c) py[c] = T(gelu_tanh(A(pp[c])));
    });
  });
}

void gemm_dgelu_backward(Stream stream, KT a, KT b, KT pre_kt, KT dpre_kt, KT dbias_kt) {
  const View pre(pre_kt), dpre(dpre_kt), dbias(dbias_kt);
  const int64_t M = pre.shape().at(0), N = pre.shape().at(1);
  check_matrix(pre, M, N, "pre");
  check_matrix(dpre, M, N, "dpre");
  RF_CHECK(dbias.shape() == Shape{N} && dbias.is_contiguous(),
           "gelu gemm kernel: dbias must be a contiguous [", N, "] vector, got ", dbias.desc());
  matmul(stream, a, b, KernelTensor{}, dpre_kt);
  dispatch_floating(pre.dtype(), "gemm_dgelu_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* pp = pre.data_as<T>();
    T* pd = dpre.data_as<T>();
    T* pb = dbias.data_as<T>();
    // One pass over column blocks: each element's GELU gradient is applied in
    // place and added to its column's sum, rows in order, so the bias
    // gradient has the same bits at any thread count.
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (N + kBlock - 1) / kBlock;
    parallel_rows(blocks, M * kBlock, [&](int64_t blk) {
      const int64_t c0 = blk * kBlock, c1 = std::min(N, c0 + kBlock);
      A sums[kBlock] = {};
      for (int64_t m = 0; m < M; ++m)
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t i = m * N + c;
          pd[i] = T(A(pd[i]) * gelu_tanh_grad(A(pp[i])));
          sums[c - c0] += A(pd[i]);
        }
      for (int64_t c = c0; c < c1; ++c) pb[c] = T(sums[c - c0]);
    });
  });
}

}  // namespace roformer::kernels::cpu
