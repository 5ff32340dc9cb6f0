// Gradients summed by the products themselves (core/autograd.h,
// AccumulatingBackwardFn): the matmul_accumulate kernel on the CPU, and a
// linear's input gradient added into the sum autograd collected for that
// input instead of a new tensor the engine adds in a pass of its own. The
// results must not change: off (set_accumulate_in_backward) against on, and
// f64 against finite differences.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"
#include "tests/core/gradcheck.h"

namespace roformer {
namespace {

std::vector<double> values(const Tensor& t) {
  return t.to(DType::f64).to_vector<double>();
}

// The CPU's kernels with matmul_accumulate and binary (the engine's adds)
// counted.
int accumulate_calls = 0, binary_calls = 0;
void counted_matmul_accumulate(kernels::Stream s, kernels::KT a, kernels::KT b, kernels::KT out) {
  ++accumulate_calls;
  kernels::cpu_kernel_table.matmul_accumulate(s, a, b, out);
}
void counted_binary(kernels::Stream s, kernels::BinaryOp op, kernels::KT a, kernels::KT b,
                    kernels::KT out) {
  ++binary_calls;
  kernels::cpu_kernel_table.binary(s, op, a, b, out);
}
struct CountedKernels {
  kernels::KernelTable table = kernels::cpu_kernel_table;
  CountedKernels() {
    table.matmul_accumulate = counted_matmul_accumulate;
    table.binary = counted_binary;
    accumulate_calls = binary_calls = 0;
    kernels::set_cpu_kernel_table_for_tests(&table);
  }
  ~CountedKernels() { kernels::set_cpu_kernel_table_for_tests(nullptr); }
  CountedKernels(const CountedKernels&) = delete;
  CountedKernels& operator=(const CountedKernels&) = delete;
};

// Restores the default (on) whatever a test throws.
struct AccumulateSetting {
  explicit AccumulateSetting(bool on) { set_accumulate_in_backward(on); }
  ~AccumulateSetting() { set_accumulate_in_backward(true); }
  AccumulateSetting(const AccumulateSetting&) = delete;
  AccumulateSetting& operator=(const AccumulateSetting&) = delete;
};

TEST(MatmulAccumulate, AddsTheProductIntoOut) {
  Generator gen{11, 0};
  const Device cpu = Device::cpu();
  struct Case {
    DType in, out;
  };
  for (const Case c : {Case{DType::f32, DType::f32}, Case{DType::f64, DType::f64},
                       Case{DType::bf16, DType::f32}, Case{DType::bf16, DType::bf16}}) {
    SCOPED_TRACE(std::string(dtype_name(c.in)) + " into " + dtype_name(c.out));
    // b through a transposed view, out a transposed view too: any strides.
    const Tensor a = Tensor::randn({2, 19, 24}, gen).to(c.in);
    const Tensor b = Tensor::randn({2, 13, 24}, gen).to(c.in).transpose(1, 2);
    const Tensor before = Tensor::randn({2, 13, 19}, gen).to(c.out);
    Tensor out = before.clone().transpose(1, 2);
    launch::matmul_accumulate(cpu, a, b, out);
    Tensor product = Tensor::empty({2, 19, 13}, c.out);
    launch::matmul(cpu, a, b, Tensor(), product);
    // The product plus out's old value, as an add of the two gives it but
    // for the order oneDNN sums in (a rounding or two apart); exact in f64.
    // A bf16 out rounds the sum once, where the add rounds the product too.
    const double tolerance = c.in == DType::f64 ? 0.0 : c.out == DType::bf16 ? 1e-2 : 2e-6;
    EXPECT_TRUE(
        testing::all_close(out, add(before.transpose(1, 2), product), tolerance, tolerance));
  }
  // An empty sum (K = 0) leaves out as it was.
  const Tensor before = Tensor::randn({3, 4}, gen);
  Tensor out = before.clone();
  launch::matmul_accumulate(cpu, Tensor::zeros({3, 0}), Tensor::zeros({0, 4}), out);
  EXPECT_EQ(values(out), values(before));
}

// An encoder layer's pattern: h (with history) feeds three projections and
// the residual of a layer norm, so its gradient has four contributions.
struct LayerLike {
  Tensor x, wq, wk, wv, bq, ln_w, ln_b;
  Tensor run(DType act = DType::f32) const {
    const Tensor h = layer_norm(x, ln_w, ln_b, 1e-5);
    const Tensor q = linear(h, wq, bq, act), k = linear(h, wk, Tensor(), act);
    const Tensor v = linear(h, wv, Tensor(), act);
    return add_layer_norm(add(mul(q, k), v), h, ln_w, ln_b, 1e-5);
  }
  std::vector<Tensor> leaves() const { return {x, wq, wk, wv, bq, ln_w, ln_b}; }
};

LayerLike make_layer(uint64_t seed, DType dtype) {
  Generator gen{seed, 0};
  auto leaf = [&](const Shape& s) {
    return Tensor::randn(s, gen).to(dtype).set_requires_grad(true);
  };
  return {leaf({6, 5, 16}), leaf({16, 16}), leaf({16, 16}), leaf({16, 16}),
          leaf({16}),       leaf({16}),     leaf({16})};
}

// The gradients of every leaf of a fresh LayerLike with accumulation on or off.
std::vector<Tensor> layer_grads(bool accumulate, bool autocast, int* accumulates, int* adds) {
  const AccumulateSetting setting(accumulate);
  const LayerLike layer = make_layer(3, DType::f32);
  std::optional<MatmulPrecisionScope> scope;
  if (autocast) scope.emplace(DType::bf16);
  Generator gen{4, 0};
  const Tensor y = layer.run();
  const Tensor r = Tensor::randn(y.shape(), gen);
  const Tensor loss = sum(mul(y, r));
  const CountedKernels counted;
  loss.backward();
  *accumulates = accumulate_calls;
  *adds = binary_calls;
  std::vector<Tensor> grads;
  for (const Tensor& t : layer.leaves()) grads.push_back(t.grad());
  return grads;
}

TEST(AccumulateInBackward, ProductsAddIntoTheSumWithTheSameResult) {
  for (const bool autocast : {false, true}) {
    SCOPED_TRACE(autocast ? "bf16 autocast" : "f32");
    int acc_on = 0, adds_on = 0, acc_off = 0, adds_off = 0;
    const auto on = layer_grads(true, autocast, &acc_on, &adds_on);
    const auto off = layer_grads(false, autocast, &acc_off, &adds_off);
    // h's four contributions: the first is kept, the projections' are added
    // by their products (the residual's, from add_layer_norm, is its own
    // tensor: the engine may keep it or add it).
    EXPECT_GE(acc_on, 2);
    EXPECT_EQ(acc_off, 0);
    EXPECT_EQ(adds_off - adds_on, acc_on) << "each product's add replaces one of the engine's";
    ASSERT_EQ(on.size(), off.size());
    // The same sums, but for oneDNN's order of adding (a rounding apart).
    for (size_t i = 0; i < on.size(); ++i)
      EXPECT_TRUE(testing::all_close(on[i], off[i], 1e-5, 1e-5)) << "leaf " << i;
  }
}

// add() hands one gradient to both of its inputs: the sum autograd holds for
// one input is then the tensor another node reads, and must not be offered.
TEST(AccumulateInBackward, AGradientSharedWithAnotherNodeIsNotWrittenInPlace) {
  Generator gen{7, 0};
  const Tensor x = Tensor::randn({5, 8}, gen, DType::f64).set_requires_grad(true);
  const Tensor w = Tensor::randn({8, 8}, gen, DType::f64).set_requires_grad(true);
  const Tensor w2 = Tensor::randn({8, 8}, gen, DType::f64).set_requires_grad(true);
  auto f = [](const std::vector<Tensor>& in) {
    const Tensor h = mul(in[0], 1.5);  // h has history
    const Tensor a = linear(h, in[1]);
    // add's backward gives a's node and h's node the same gradient tensor;
    // the linear of `a` then runs with that tensor as its grad_output.
    return linear(add(a, h), in[2]);
  };
  EXPECT_TRUE(testing::gradcheck(f, {x, w, w2}));
}

// f64 gradients through products that add into their inputs' sums, against
// finite differences: the three projections of LayerLike and a tanh-GELU
// feed-forward block whose input also feeds the residual.
TEST(AccumulateInBackward, GradientsMatchFiniteDifferences) {
  const LayerLike layer = make_layer(9, DType::f64);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) {
        const LayerLike l{in[0], in[1], in[2], in[3], in[4], in[5], in[6]};
        return l.run(DType::f64);
      },
      layer.leaves()));
  Generator gen{10, 0};
  auto t = [&](const Shape& s) { return Tensor::randn(s, gen, DType::f64); };
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) {
        const Tensor h = mul(in[0], in[0]);
        const Tensor ffn = gelu_tanh_ffn(h, in[1], in[2], in[3], in[4]);
        return add_layer_norm(ffn, h, Tensor(), Tensor(), 1e-5);
      },
      {t({4, 6}), t({12, 6}), t({12}), t({6, 12}), t({6})}));
}

TEST(AccumulateInBackward, IsOnByDefault) {
  EXPECT_TRUE(accumulate_in_backward());
}

}  // namespace
}  // namespace roformer
