// Flat parameter and gradient memory: parameters become views of one buffer,
// backward accumulates into persistent gradient views in place, and each
// parameter's "gradient ready" hook fires once per backward, after its last
// contribution.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/flat_parameters.h"
#include "core/ops.h"
#include "gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::random_f64;

Tensor param(const Shape& shape, uint64_t seed) {
  return random_f64(shape, seed).to(DType::f32).set_requires_grad(true);
}

std::vector<float> values(const Tensor& t) {
  return t.to_vector<float>();
}

TEST(FlatParameters, ParametersBecomeAlignedViewsOfOneBufferWithTheirValues) {
  const Tensor a = param({3}, 1), b = param({2, 5}, 2), c = param({17}, 3);
  const auto va = values(a), vb = values(b), vc = values(c);
  const auto flat = FlatParameters::create({a, b, c});
  ASSERT_EQ(flat->size(), 3u);
  EXPECT_EQ(flat->num_elements(), 3 + 10 + 17);
  EXPECT_EQ(flat->offset(0), 0);
  EXPECT_EQ(flat->offset(1), 16);  // 64-byte aligned slices
  EXPECT_EQ(flat->offset(2), 32);
  EXPECT_EQ(flat->padded_numel(), 64);
  // The handles held before flattening see the flat memory, values unchanged.
  EXPECT_EQ(values(a), va);
  EXPECT_EQ(values(b), vb);
  EXPECT_EQ(values(c), vc);
  EXPECT_EQ(b.shape(), (Shape{2, 5}));
  for (const Tensor& t : {a, b, c}) EXPECT_TRUE(t.shares_storage_with(flat->data()));
  EXPECT_EQ(b.data_as<float>(), flat->data().data_as<float>() + 16);
  Tensor whole = flat->data();
  whole.narrow(0, 16, 1).fill_(42.0);
  EXPECT_EQ(values(b)[0], 42.0f);
  // Padding is zero.
  const auto all = values(flat->data());
  for (int64_t i = 3; i < 16; ++i) EXPECT_EQ(all[size_t(i)], 0.0f);
  EXPECT_EQ(FlatParameters::of({a, b, c}), flat);
  EXPECT_EQ(FlatParameters::of({a, c, b}), nullptr);
  EXPECT_EQ(FlatParameters::of({a, b}), nullptr);
  EXPECT_EQ(FlatParameters::owner_of(c), flat);
}

TEST(FlatParameters, RejectsWhatCannotBeFlattenedNamingIt) {
  using roformer::testing::error_of;
  const Tensor d = random_f64({3}, 4).set_requires_grad(true);
  EXPECT_NE(error_of([&] { FlatParameters::create({d}); }).find("parameter 0 (f64[3])"),
            std::string::npos);
  const Tensor a = param({4}, 5);
  EXPECT_NE(error_of([&] {
              FlatParameters::create({a, a});
            }).find("listed twice"),
            std::string::npos);
  const Tensor whole = param({4}, 6);
  const Tensor view = whole.detach().narrow(0, 1, 2);
  EXPECT_NE(error_of([&] { FlatParameters::create({view}); }).find("shares its memory"),
            std::string::npos);
  const auto flat = FlatParameters::create({a});
  EXPECT_NE(error_of([&] { FlatParameters::create({a}); }).find("already flat"), std::string::npos);
}

TEST(FlatParameters, BackwardAccumulatesInPlaceIntoThePersistentGradient) {
  const Tensor w = param({3, 2}, 7), unused = param({5}, 8), bias = param({2}, 9);
  const auto flat = FlatParameters::create({w, unused, bias});
  const Tensor x = random_f64({4, 3}, 10).to(DType::f32);
  auto loss = [&] { return sum(linear(x, w.transpose(0, 1), bias)); };
  loss().backward();
  const Tensor g1 = w.grad().clone();
  const float* where = w.grad().data_as<float>();
  EXPECT_EQ(where, flat->grad().data_as<float>() + flat->offset(0));
  EXPECT_TRUE(flat->has_grad(0));
  EXPECT_FALSE(flat->has_grad(1));
  EXPECT_FALSE(unused.grad().defined());
  loss().backward();  // a second micro-batch adds in place
  EXPECT_EQ(w.grad().data_as<float>(), where);
  const auto one = values(g1), two = values(w.grad());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(two[i], one[i] + one[i]);
  EXPECT_EQ(values(bias.grad()), (std::vector<float>{8.0f, 8.0f}));
  // zero_grad: one fill of the buffer; gradients read as absent again.
  flat->zero_grad();
  EXPECT_FALSE(w.grad().defined());
  for (float v : values(flat->grad())) EXPECT_EQ(v, 0.0f);
  loss().backward();
  EXPECT_EQ(values(w.grad()), one);
  EXPECT_EQ(w.grad().data_as<float>(), where);
  // set_grad and Tensor::zero_grad write the buffer too.
  bias.set_grad(Tensor::full({2}, 3.0));
  EXPECT_EQ(values(flat->grad().narrow(0, flat->offset(2), 2)), (std::vector<float>{3, 3}));
  bias.zero_grad();
  EXPECT_EQ(values(flat->grad().narrow(0, flat->offset(2), 2)), (std::vector<float>{0, 0}));
  EXPECT_FALSE(bias.grad().defined());
}

TEST(FlatParameters, ExistingGradientsMoveIntoTheBuffer) {
  const Tensor a = param({2}, 11);
  a.set_grad(Tensor::full({2}, 5.0));
  const auto flat = FlatParameters::create({a});
  EXPECT_TRUE(a.grad().shares_storage_with(flat->grad()));
  EXPECT_EQ(values(flat->grad()).front(), 5.0f);
}

// Records, per backward, which parameter became ready when and what its
// gradient was at that moment.
struct ReadyLog {
  std::vector<size_t> order;
  std::vector<std::vector<float>> snapshot;
};

TEST(FlatParameters, ReadyHooksFireOnceAfterTheLastContributionInGraphOrder) {
  // w1 is used twice (like the tied embedding: gathered early, reused late):
  // by the first matmul and by a term added at the end. w2 sits between them.
  const Tensor w1 = param({3, 4}, 12), w2 = param({4, 2}, 13), idle = param({3}, 14);
  const auto flat = FlatParameters::create({w1, w2, idle});
  ReadyLog log;
  flat->set_grad_ready_hook([&](size_t i) {
    log.order.push_back(i);
    log.snapshot.push_back(values(flat->parameters()[i].grad()));
  });
  const Tensor x = random_f64({5, 3}, 15).to(DType::f32);
  const Tensor s = random_f64({3, 4}, 16).to(DType::f32);
  auto loss = [&] { return add(sum(matmul(matmul(x, w1), w2)), sum(mul(w1, s))); };
  for (int pass = 1; pass <= 2; ++pass) {
    log = {};
    loss().backward();
    // Once each, w2 (nearer the loss) before w1, never the unused parameter.
    ASSERT_EQ(log.order, (std::vector<size_t>{1, 0})) << "pass " << pass;
    // At hook time the gradient was already complete (both uses of w1, and
    // the earlier pass's gradient for pass 2).
    EXPECT_EQ(log.snapshot[0], values(w2.grad()));
    EXPECT_EQ(log.snapshot[1], values(w1.grad()));
  }
  // Removing the hooks stops the calls.
  flat->set_grad_ready_hook(nullptr);
  log = {};
  loss().backward();
  EXPECT_TRUE(log.order.empty());
}

TEST(FlatParameters, ReadyHookOnAPlainLeafAndOnABackwardFromTheLeafItself) {
  const Tensor a = param({2}, 17);
  int calls = 0;
  set_grad_ready_hook(a, [&] { ++calls; });
  sum(mul(a, a)).backward();  // two edges into a from one node
  EXPECT_EQ(calls, 1);
  a.backward(Tensor::ones({2}));
  EXPECT_EQ(calls, 2);
  EXPECT_THROW(set_grad_ready_hook(mul(a, 2.0), [] {}), Error);
}

TEST(FlatParameters, MovesBetweenDevicesOrFailsWithTensorToError) {
  const Tensor a = param({3}, 18);
  const auto flat = FlatParameters::create({a});
  const auto before = values(a);
  flat->to(Device::cpu());  // already there: nothing moves
  EXPECT_TRUE(a.shares_storage_with(flat->data()));
  const std::string tensor_error =
      roformer::testing::error_of([] { (void)Tensor::zeros({1}).to(Device::cuda(0)); });
  if (tensor_error == "no error") {  // a build and machine with a GPU: a round trip
    flat->to(Device::cuda(0));
    EXPECT_TRUE(a.device().is_cuda());
    EXPECT_TRUE(a.shares_storage_with(flat->data()));
    flat->to(Device::cpu());
    EXPECT_EQ(values(a), before);
    return;
  }
  EXPECT_EQ(roformer::testing::error_of([&] { flat->to(Device::cuda(0)); }), tensor_error);
  EXPECT_TRUE(flat->device().is_cpu());
  EXPECT_EQ(values(a), before);
}

}  // namespace
}  // namespace roformer
