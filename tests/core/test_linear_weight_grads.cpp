// The linear_weight_grads kernel (a linear's weight and bias gradients from
// one product; core/kernels/kernel_list.h) on the CPU: the product g^T x and
// the column sums of g exactly as the matmul and sum kernels give them, and
// the linear op's gradients through it equal to the two computed apart.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"

namespace roformer {
namespace {

// The CPU's kernels with linear_weight_grads counted: which path the op took.
int fused_calls = 0;
bool last_fused = false;
void counted_linear_weight_grads(kernels::Stream s, kernels::KT g, kernels::KT x, kernels::KT dw,
                                 kernels::KT db, bool fused) {
  ++fused_calls;
  last_fused = fused;
  kernels::cpu_kernel_table.linear_weight_grads(s, g, x, dw, db, fused);
}
struct CountedKernels {
  kernels::KernelTable table = kernels::cpu_kernel_table;
  CountedKernels() {
    table.linear_weight_grads = counted_linear_weight_grads;
    fused_calls = 0;
    kernels::set_cpu_kernel_table_for_tests(&table);
  }
  ~CountedKernels() { kernels::set_cpu_kernel_table_for_tests(nullptr); }
};

void expect_same_bits(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(a.to(DType::f64).to_vector<double>(), b.to(DType::f64).to_vector<double>()) << what;
}

TEST(LinearWeightGrads, IsTheProductAndTheColumnSumsBitForBit) {
  Generator gen{5, 0};
  const Device cpu = Device::cpu();
  struct Case {
    DType in, dw;
  };
  for (const Case c : {Case{DType::f32, DType::f32}, Case{DType::f64, DType::f64},
                       Case{DType::bf16, DType::f32}}) {
    // 37 rows of g seen through a transposed view too: any strides.
    const Tensor g = Tensor::randn({37, 24}, gen).to(c.in);
    const Tensor x = Tensor::randn({16, 37}, gen).to(c.in).transpose(0, 1);
    Tensor dw = Tensor::full({24, 16}, NAN, c.dw);
    Tensor db = Tensor::full({24}, NAN, c.in);
    launch::linear_weight_grads(cpu, g, x, dw, db, true);
    Tensor ref_dw = Tensor::empty({24, 16}, c.dw);
    launch::matmul(cpu, g.transpose(0, 1), x, Tensor(), ref_dw);
    expect_same_bits(dw, ref_dw, "dw");
    expect_same_bits(db, sum(g, {0}), "db");
  }
}

TEST(LinearWeightGrads, RefusesShapesThatDoNotFit) {
  const Tensor g = Tensor::zeros({8, 4}), x = Tensor::zeros({8, 3});
  Tensor dw = Tensor::empty({4, 3}), db = Tensor::empty({4});
  Tensor wrong_db = Tensor::empty({3}), bf16_db = Tensor::empty({4}, DType::bf16);
  EXPECT_THROW(launch::linear_weight_grads(Device::cpu(), g, x, dw, wrong_db, false), Error);
  EXPECT_THROW(launch::linear_weight_grads(Device::cpu(), g, x, dw, bf16_db, false), Error);
  EXPECT_THROW(launch::linear_weight_grads(Device::cpu(), g, Tensor::zeros({7, 3}), dw, db, false),
               Error);
}

// The linear op's weight and bias gradients (both asked for: the fused
// kernel, once) against the product and the sum on their own, with and
// without autocast's bf16 products.
TEST(LinearWeightGrads, TheLinearOpsGradientsAreTheProductAndTheSum) {
  Generator gen{6, 0};
  for (const bool autocast : {false, true}) {
    const CountedKernels counted;
    std::optional<MatmulPrecisionScope> scope;
    if (autocast) scope.emplace(DType::bf16);
    const Tensor x = Tensor::randn({3, 5, 12}, gen);
    Tensor w = Tensor::randn({8, 12}, gen), b = Tensor::randn({8}, gen);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    const Tensor g = Tensor::randn({3, 5, 8}, gen);
    // bf16 activations under autocast: the gradient reaching the product is bf16 itself.
    const DType act = autocast ? DType::bf16 : DType::f32;
    const Tensor y = linear(x, w, b, act);
    sum(mul(y, g.to(act))).backward();
    EXPECT_EQ(fused_calls, 1) << "the weight and bias gradients came from one kernel call";
    const Tensor g2 = g.to(act).reshape({15, 8});
    const Tensor x2 = (autocast ? x.to(DType::bf16) : x).reshape({15, 12});
    Tensor ref_dw = Tensor::empty({8, 12});
    launch::matmul(Device::cpu(), g2.transpose(0, 1), x2, Tensor(), ref_dw);
    expect_same_bits(w.grad(), ref_dw, autocast ? "weight, autocast" : "weight");
    expect_same_bits(b.grad(), sum(g2, {0}).to(DType::f32), autocast ? "bias, autocast" : "bias");
  }
}

// set_bias_grad_in_product reaches the kernel (off by default), and the CPU
// gives the same bits either way.
TEST(LinearWeightGrads, TheSettingReachesTheKernel) {
  const CountedKernels counted;
  Generator gen{8, 0};
  const Tensor x = Tensor::randn({6, 12}, gen), g = Tensor::randn({6, 8}, gen);
  std::vector<Tensor> grads;
  for (const bool on : {false, true}) {
    EXPECT_FALSE(bias_grad_in_product()) << "off by default and after each case";
    set_bias_grad_in_product(on);
    Tensor w = Tensor::randn({8, 12}, gen), b = Tensor::randn({8}, gen);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    sum(mul(linear(x, w, b), g)).backward();
    set_bias_grad_in_product(false);
    EXPECT_EQ(last_fused, on);
    grads.push_back(b.grad());
  }
  expect_same_bits(grads[1], grads[0], "bias gradient, fused or not on the CPU");
}

// An f32 gradient cast to bf16 for the product keeps its bias gradient summed
// over the f32 values: that case takes the product and the sum apart.
TEST(LinearWeightGrads, AnF32GradientCastForTheProductKeepsF32Sums) {
  const CountedKernels counted;
  Generator gen{7, 0};
  const MatmulPrecisionScope scope(DType::bf16);
  const Tensor x = Tensor::randn({6, 12}, gen);
  Tensor w = Tensor::randn({8, 12}, gen), b = Tensor::randn({8}, gen);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor g = Tensor::randn({6, 8}, gen);
  sum(mul(linear(x, w, b, DType::f32), g)).backward();
  EXPECT_EQ(fused_calls, 0);
  expect_same_bits(b.grad(), sum(g, {0}), "bias summed in f32");
}

}  // namespace
}  // namespace roformer
