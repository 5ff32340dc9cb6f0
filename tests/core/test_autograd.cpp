// The autograd engine: graph shapes, memory, accumulation, retained graphs,
// grad mode, in-place checks and determinism.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/ops.h"
#include "core/profile.h"
#include "gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::random_f64;

std::string error_of(const std::function<void()>& fn) {
  return ::roformer::testing::error_of<Error>(fn);
}

Tensor leaf(const Shape& shape, uint64_t seed, DType dtype = DType::f64) {
  return random_f64(shape, seed).to(dtype).set_requires_grad(true);
}

TEST(Autograd, DiamondGraphSumsGradients) {
  // a feeds two branches that meet again: dy/dx = 2 (exp(2x) + 3).
  const Tensor x = leaf({5}, 1);
  const Tensor a = mul(x, 2.0);
  const Tensor y = sum(add(exp(a), mul(a, 3.0)));
  y.backward();
  const std::vector<double> xv = x.to_vector<double>(), gv = x.grad().to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(gv[i], 2 * (std::exp(2 * xv[i]) + 3), 1e-12);

  // The same tensor twice in one op, and a leaf reached by two edges.
  const Tensor z = leaf({4}, 2);
  sum(add(mul(z, z), mul(z, 5.0))).backward();
  EXPECT_TRUE(all_close(z.grad(), add(mul(z.detach(), 2.0), 5.0), 1e-12, 0));
}

TEST(Autograd, DeepChainRunsIterativelyAndFreesSavedTensors) {
  // 200,000 nodes: a recursive engine (or recursive graph destruction) would
  // overflow the stack. tanh saves its output, 64 bytes a node.
  constexpr int kDepth = 200000;
  auto& alloc = allocator_for(Device::cpu());
  const Tensor x = Tensor::from_vector<double>({0.5, -0.25, 1.0, 0.1}, {4}).set_requires_grad(true);
  const size_t before = alloc.stats().allocated_bytes;
  Tensor y = x;
  for (int i = 0; i < kDepth; ++i) y = tanh(y);
  const size_t after_forward = alloc.stats().allocated_bytes;
  EXPECT_GE(after_forward - before, size_t(kDepth) * 32);  // the saved outputs
  sum(y).backward();
  // Every node's saved output is gone; y and the gradients stay.
  EXPECT_LT(alloc.stats().allocated_bytes - before, size_t(64 << 10));

  // The analytic gradient: prod over steps of (1 - y_i^2).
  const std::vector<double> xv = x.to_vector<double>(), gv = x.grad().to_vector<double>();
  for (size_t k = 0; k < xv.size(); ++k) {
    double v = xv[k], d = 1.0;
    for (int i = 0; i < kDepth; ++i) {
      v = std::tanh(v);
      d *= 1.0 - v * v;
    }
    EXPECT_NEAR(gv[k], d, 1e-9 * std::abs(d) + 1e-300);
  }
  y = Tensor();  // frees the (released) chain of nodes
}

TEST(Autograd, DeepUnusedGraphIsFreedWithoutRecursion) {
  const Tensor x = Tensor::ones({2}, DType::f32).set_requires_grad(true);
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = add(y, 1e-6);
  EXPECT_TRUE(y.requires_grad());
  y = Tensor();  // never went through backward: the graph still has its closures
  SUCCEED();
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCallsUntilZeroed) {
  // Two micro-batches: the leaf's gradient is the sum of both.
  const Tensor w = leaf({3, 2}, 3);
  const Tensor b1 = random_f64({4, 3}, 4), b2 = random_f64({5, 3}, 5);
  sum(matmul(b1, w)).backward();
  const Tensor g1 = w.grad().clone();
  sum(matmul(b2, w)).backward();
  const Tensor g2_only = sum(b2, {0}).reshape({3, 1}).expand({3, 2});
  EXPECT_TRUE(all_close(w.grad(), add(g1, g2_only), 1e-12, 1e-12));
  EXPECT_FALSE(all_close(w.grad(), g1, 1e-6, 0));
  w.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  sum(matmul(b1, w)).backward();
  EXPECT_TRUE(all_close(w.grad(), g1, 0, 0));
}

TEST(Autograd, LeafGradientsAreIndependentTensors) {
  // add passes its gradient through unchanged to both inputs; the leaves must
  // still get their own storage (optimizers and clipping write .grad in place).
  const Tensor a = leaf({3}, 6), b = leaf({3}, 7);
  const Tensor g = Tensor::full({3}, 2.0, DType::f64);
  add(a, b).backward(g);
  EXPECT_FALSE(a.grad().shares_storage_with(b.grad()));
  EXPECT_FALSE(a.grad().shares_storage_with(g));
  a.grad().fill_(0.0);
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{2, 2, 2}));
  // backward() straight on a leaf.
  const Tensor c = leaf({2}, 8);
  const Tensor gc = Tensor::ones({2}, DType::f64);
  c.backward(gc);
  EXPECT_FALSE(c.grad().shares_storage_with(gc));
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  const Tensor x = leaf({3}, 9);
  const Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  const Tensor g1 = x.grad().clone();
  y.backward();
  EXPECT_TRUE(all_close(x.grad(), mul(g1, 2.0), 1e-12, 0));
  const std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
  EXPECT_NE(msg.find("freed"), std::string::npos) << msg;

  // Without retain_graph, the second call through the same graph fails.
  const Tensor z = leaf({3}, 10);
  const Tensor h = exp(z);
  const Tensor l1 = sum(h), l2 = sum(mul(h, 2.0));
  l1.backward();
  const std::string msg2 = error_of([&] { l2.backward(); });
  EXPECT_NE(msg2.find("exp"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("retain_graph"), std::string::npos) << msg2;
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  const Tensor x = leaf({2, 3}, 11);
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard outer;
    EXPECT_FALSE(grad_enabled());
    {
      NoGradGuard inner;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // nested guards restore the outer state
    const Tensor y = matmul(exp(x), x.transpose(0, 1));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_EQ(x.transpose(0, 1).grad_fn(), nullptr);
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_NE(exp(x).grad_fn(), nullptr);
}

TEST(Autograd, RequiresGradPropagatesOnlyFromInputsThatNeedIt) {
  const Tensor x = leaf({2, 3}, 12);
  const Tensor c = random_f64({2, 3}, 13);
  EXPECT_FALSE(add(c, c).requires_grad());
  EXPECT_FALSE(exp(c).requires_grad());
  const Tensor y = mul(x, c);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn()->name(), "mul");
  EXPECT_TRUE(x.transpose(0, 1).requires_grad());
  EXPECT_TRUE(x.reshape({6}).requires_grad());
  EXPECT_FALSE(y.detach().requires_grad());
  EXPECT_TRUE(y.detach().shares_storage_with(y));
  sum(y).backward();
  EXPECT_FALSE(c.grad().defined());
  EXPECT_FALSE(y.grad().defined());  // only leaves accumulate
  EXPECT_TRUE(all_close(x.grad(), c, 0, 0));
  // Only floating leaves can require grad; only leaves can be switched.
  EXPECT_THROW(Tensor::zeros({2}, DType::i64).set_requires_grad(true), Error);
  Tensor nonleaf = mul(x, 2.0);
  EXPECT_THROW(nonleaf.set_requires_grad(false), Error);
  // No history, no backward.
  const std::string msg = error_of([&] { sum(c).backward(); });
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;
}

TEST(Autograd, InPlaceWriteToASavedTensorIsAnErrorNamingTheOp) {
  // exp saves its output; fill_ on it afterwards.
  const Tensor x = leaf({4}, 14);
  Tensor y = exp(x);
  const Tensor loss = sum(y);
  y.fill_(1.0);
  const std::string msg = error_of([&] { loss.backward(); });
  EXPECT_NE(msg.find("'exp'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;

  // log saves its input; copy_ into a view of it (shared storage) is caught too.
  const Tensor z = leaf({2, 3}, 15);
  Tensor a = add(z, 2.0);
  const Tensor l2 = sum(log(a));
  a.narrow(1, 0, 1).copy_(Tensor::ones({2, 1}, DType::f64));
  const std::string msg2 = error_of([&] { l2.backward(); });
  EXPECT_NE(msg2.find("'log'"), std::string::npos) << msg2;

  // An op that saved nothing is unaffected by writes to its input.
  const Tensor w = leaf({3}, 16);
  Tensor b = mul(w, 1.0);
  const Tensor l3 = sum(add(b, 1.0));
  b.fill_(5.0);
  l3.backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, 1, 1}));
}

TEST(Autograd, NonScalarBackwardNeedsAnExplicitGradient) {
  const Tensor x = leaf({2, 3}, 17, DType::f32);
  const Tensor y = mul(x, 3.0);
  const std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("explicit gradient"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[2, 3]"), std::string::npos) << msg;
  const std::string bad = error_of([&] { y.backward(Tensor::ones({3, 2})); });
  EXPECT_NE(bad.find("f32[3, 2]"), std::string::npos) << bad;
  EXPECT_NE(bad.find("f32[2, 3]"), std::string::npos) << bad;
  const Tensor g = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  y.backward(g);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3, 6, 9, 12, 15, 18}));
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

TEST(Autograd, SameInputsGiveBitwiseSameOutputsAndGradients) {
  // Large enough that oneDNN and the OpenMP loops use both threads.
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<std::vector<uint8_t>> first;
    for (int run = 0; run < 2; ++run) {
      const Tensor x = leaf({4, 64, 192}, 18, dt);
      const Tensor w = leaf({160, 192}, 19, dt);
      const Tensor b = leaf({160}, 20, dt);
      const Tensor m = leaf({192, 96}, 21, dt);
      const Tensor h = linear(x, w, b);               // [4, 64, 160]
      const Tensor p = matmul(h.transpose(1, 2), x);  // [4, 160, 192]
      const Tensor q = matmul(p, m);                  // [4, 160, 96]
      const Tensor s = sum(q, {0, 2});                // [160]
      const Tensor loss = sum(mul(s, s));
      loss.backward();
      const std::vector<std::vector<uint8_t>> now = {
          bytes(h),        bytes(q),        bytes(s),        bytes(loss),
          bytes(x.grad()), bytes(w.grad()), bytes(b.grad()), bytes(m.grad())};
      if (run == 0) {
        first = now;
      } else {
        for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(now[i], first[i]) << "tensor " << i;
      }
    }
  }
}

}  // namespace
}  // namespace roformer

namespace roformer {
namespace {

// set_profile_sync: each profile scope calls the sync at its start and end
// (how the GPU benchmark times ops), none while profiling is off, and a sync
// that throws at a scope's end does not escape its destructor.
TEST(Profile, ScopesCallTheSyncAtStartAndEnd) {
  int calls = 0;
  bool throw_at_end = false;
  set_profile_sync([&] {
    ++calls;
    if (throw_at_end && calls % 2 == 0) throw Error("device error");
  });
  set_profiling(false);
  { ProfileScope off("off"); }
  EXPECT_EQ(calls, 0);
  set_profiling(true);
  {
    ProfileScope outer("outer");
    { ProfileScope inner("inner"); }
    EXPECT_EQ(calls, 3);  // outer's start, inner's start and end
  }
  EXPECT_EQ(calls, 4);
  throw_at_end = true;
  EXPECT_NO_THROW({ ProfileScope failing("failing"); });
  EXPECT_EQ(calls, 6);
  set_profile_sync({});
  { ProfileScope plain("plain"); }
  EXPECT_EQ(calls, 6);
  set_profiling(false);
  profile_reset();
}

}  // namespace
}  // namespace roformer
