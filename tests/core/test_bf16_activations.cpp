// bf16 activations (core/precision.h): under a bf16 scope a product may write
// bf16, which linear, attention and the layer norms then read without a cast.
// Each op's mixed form is checked against its f32 form on the same (bf16-
// representable) values: the casts it saves must not change the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"
#include "gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::random_f64;

// f32 values that bf16 holds exactly, so an f32 run and a bf16 run read the same.
Tensor bf16_exact(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  NoGradGuard no_grad;
  return random_f64(shape, seed, lo, hi).to(DType::bf16).to(DType::f32);
}

std::vector<float> values(const Tensor& t) {
  return t.to(DType::f32).to_vector<float>();
}

TEST(Bf16Activations, ActivationDtypeFollowsTheScope) {
  const Tensor x = Tensor::zeros({2, 3});
  EXPECT_EQ(activation_dtype(x), DType::f32);  // no scope: the input's dtype
  {
    MatmulPrecisionScope bf16_products(DType::bf16);
    EXPECT_EQ(activation_dtype(x), DType::bf16);
    EXPECT_EQ(activation_dtype(x.to(DType::bf16)), DType::bf16);
    EXPECT_EQ(activation_dtype(x.to(DType::f64)), DType::f64);  // gradient checks stay f64
    {
      MatmulPrecisionScope f32_activations(DType::bf16, false);
      EXPECT_EQ(activation_dtype(x), DType::f32);
      EXPECT_TRUE(autocast_bf16(Device::cpu(), DType::f32));  // products still bf16
    }
    EXPECT_EQ(activation_dtype(x), DType::bf16);  // restored
  }
  EXPECT_EQ(activation_dtype(x), DType::f32);
}

// linear(x, w, b, bf16) is the f32 result of the same bf16 product rounded
// once, and its gradients come in each input's dtype.
TEST(Bf16Activations, LinearWritesBf16AndGivesEachInputItsDtype) {
  MatmulPrecisionScope bf16_products(DType::bf16);
  Tensor w = bf16_exact({12, 20}, 1).set_requires_grad(true);
  Tensor b = bf16_exact({12}, 2).set_requires_grad(true);
  Tensor x = bf16_exact({3, 5, 20}, 3).set_requires_grad(true);
  const Tensor y = linear(x, w, b, DType::bf16);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.shape(), (Shape{3, 5, 12}));
  const Tensor y32 = linear(x, w, b);  // f32 result of the same bf16 operands
  // Within one bf16 rounding (the two results may come from differently
  // blocked kernels, so the f32 sums may differ in their last bits).
  const std::vector<float> got = values(y), ref = values(y32);
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], std::abs(ref[i]) / 256 + 1e-6) << "element " << i;
  const Tensor g = bf16_exact({3, 5, 12}, 4);
  y.backward(g.to(DType::bf16));
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  const std::vector<float> gx = values(x.grad()), gw = values(w.grad()), gb = values(b.grad());
  x.grad().zero_();
  w.grad().zero_();
  b.grad().zero_();
  y32.backward(g);
  EXPECT_EQ(gx, values(x.grad()));
  EXPECT_EQ(gw, values(w.grad()));
  // The bias gradient is summed in the gradient's dtype: bf16 here.
  const std::vector<float> gb32 = values(b.grad());
  for (size_t i = 0; i < gb.size(); ++i)
    EXPECT_NEAR(gb[i], gb32[i], std::abs(gb32[i]) / 256 + 1e-6) << "bias " << i;

  // A bf16 activation in: its gradient is bf16, the weight's f32.
  Tensor xb = x.detach().to(DType::bf16).set_requires_grad(true);
  const Tensor yb = linear(xb, w, b, DType::f32);
  EXPECT_EQ(values(yb), ref);  // no cast of x changed anything
  yb.backward(g);
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
}

TEST(Bf16Activations, LinearRefusesMixedDtypesOutsideTheScope) {
  const Tensor w = Tensor::zeros({4, 6}), x = Tensor::zeros({2, 6}, DType::bf16);
  const std::string err = testing::error_of<Error>([&] { linear(x, w); });
  EXPECT_NE(err.find("linear: dtype mismatch"), std::string::npos) << err;
  EXPECT_NE(err.find("run.precision: bf16"), std::string::npos) << err;
  const std::string out = testing::error_of<Error>([&] {
    linear(Tensor::zeros({2, 6}), w, Tensor(), DType::bf16);
  });
  EXPECT_NE(out.find("output bf16"), std::string::npos) << out;
  MatmulPrecisionScope bf16_products(DType::bf16);
  const std::string f64 = testing::error_of<Error>([&] {
    linear(Tensor::zeros({2, 6}, DType::f64), w.to(DType::f64), Tensor(), DType::bf16);
  });
  EXPECT_NE(f64.find("output bf16"), std::string::npos) << f64;
}

// The tanh-GELU block with a bf16 result keeps pre and h in bf16 (its GEMM
// epilogue's dtype): within bf16 rounding of the block with f32 activations,
// each gradient in its input's dtype.
TEST(Bf16Activations, GeluTanhFfnKeepsItsInnerActivationsInBf16) {
  Tensor x = bf16_exact({10, 16}, 30).set_requires_grad(true);
  Tensor w1 = bf16_exact({24, 16}, 31).set_requires_grad(true);
  Tensor b1 = bf16_exact({24}, 32).set_requires_grad(true);
  Tensor w2 = bf16_exact({16, 24}, 33).set_requires_grad(true);
  Tensor b2 = bf16_exact({16}, 34).set_requires_grad(true);
  const Tensor g = bf16_exact({10, 16}, 35);
  auto run = [&](bool bf16_activations) {
    MatmulPrecisionScope bf16_products(DType::bf16, bf16_activations);
    for (Tensor* t : {&x, &w1, &b1, &w2, &b2})
      if (t->grad().defined()) t->grad().zero_();
    const Tensor y = gelu_tanh_ffn(x, w1, b1, w2, b2, activation_dtype(x));
    EXPECT_EQ(y.dtype(), bf16_activations ? DType::bf16 : DType::f32);
    y.backward(g.to(y.dtype()));
    std::vector<std::vector<float>> out{values(y)};
    for (Tensor* t : {&x, &w1, &b1, &w2, &b2}) {
      EXPECT_EQ(t->grad().dtype(), DType::f32);
      out.push_back(values(t->grad()));
    }
    return out;
  };
  const auto ref = run(false), got = run(true);
  for (size_t k = 0; k < ref.size(); ++k) {
    double top = 0;
    for (float r : ref[k]) top = std::max(top, double(std::abs(r)));
    for (size_t i = 0; i < ref[k].size(); ++i)
      EXPECT_NEAR(got[k][i], ref[k][i], 2e-2 * top) << "result " << k << " element " << i;
  }
  MatmulPrecisionScope bf16_products(DType::bf16);
  Tensor xb = x.detach().to(DType::bf16).set_requires_grad(true);
  gelu_tanh_ffn(xb, w1, b1, w2, b2, DType::bf16).backward(g.to(DType::bf16));
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
  const std::string err = testing::error_of<Error>(
      [&] { gelu_tanh_ffn(x.to(DType::f64), w1, b1, w2, b2, DType::bf16); });
  EXPECT_NE(err.find("expected floating tensors of one dtype"), std::string::npos) << err;
}

// add_layer_norm(bf16 x, f32 residual) normalises the f32 sum: the f32 op's
// bits, with x's gradient rounded to bf16 and the residual's unchanged.
TEST(Bf16Activations, AddLayerNormTakesABf16InputOnAnF32Residual) {
  const int64_t cols = 37;
  Tensor x = bf16_exact({4, 3, cols}, 5, -3.0, 3.0);
  Tensor r = random_f64({4, 3, cols}, 6).to(DType::f32).set_requires_grad(true);
  Tensor w = bf16_exact({cols}, 7).set_requires_grad(true);
  Tensor b = bf16_exact({cols}, 8).set_requires_grad(true);
  Tensor xb = x.to(DType::bf16).set_requires_grad(true);
  x.set_requires_grad(true);
  const Tensor g = random_f64({4, 3, cols}, 9).to(DType::f32);
  const Tensor y = add_layer_norm(xb, r, w, b, 1e-5);
  EXPECT_EQ(y.dtype(), DType::f32);
  y.backward(g);
  const std::vector<float> gr = values(r.grad()), gw = values(w.grad()), gb = values(b.grad());
  r.grad().zero_();
  w.grad().zero_();
  b.grad().zero_();
  const Tensor y32 = add_layer_norm(x, r, w, b, 1e-5);
  EXPECT_EQ(values(y), values(y32));
  y32.backward(g);
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
  EXPECT_EQ(values(xb.grad()), values(x.grad().to(DType::bf16)));
  EXPECT_EQ(gr, values(r.grad()));
  EXPECT_EQ(gw, values(w.grad()));
  EXPECT_EQ(gb, values(b.grad()));
  // A bf16 residual under an f32 x is not a form the op takes.
  const std::string err = testing::error_of<Error>(
      [&] { add_layer_norm(x.detach(), r.detach().to(DType::bf16), w, b, 1e-5); });
  EXPECT_NE(err.find("or be f32 for a bf16 x"), std::string::npos) << err;
}

// Under bf16 activations the residual layer norm writes its f32 output's bf16
// copy in the same pass, and the product that reads the output next takes
// that copy with no cast kernel: the bits a cast gives, served until the
// output changes.
TEST(Bf16Activations, ResidualLayerNormServesItsOutputsBf16Copy) {
  const MatmulPrecisionScope precision(DType::bf16);
  const auto copies = [] {
    return kernels::kernel_calls_by_id[size_t(kernels::KernelId::copy)].load();
  };
  const Tensor x = bf16_exact({5, 40}, 20).to(DType::bf16);
  const Tensor r = random_f64({5, 40}, 21).to(DType::f32);
  Tensor y = add_layer_norm(x, r, Tensor(), Tensor(), 1e-5);
  uint64_t before = copies();
  const Tensor served = to_bf16(y);
  EXPECT_EQ(copies(), before) << "the layer norm's copy, no cast kernel";
  NoGradGuard no_grad;
  Tensor cast = Tensor::empty(y.shape(), DType::bf16);
  cast.copy_(y);
  EXPECT_EQ(values(served), values(cast));
  // A linear reading y gives what it gives on a y without the copy.
  const Tensor w = random_f64({8, 40}, 22).to(DType::f32);
  EXPECT_EQ(values(linear(y, w, Tensor())), values(linear(y.clone(), w, Tensor())));
  // Once y changes, the copy is stale: a cast again.
  y.fill_(0.5);
  before = copies();
  const Tensor recast = to_bf16(y);
  EXPECT_GT(copies(), before);
  EXPECT_EQ(values(recast), values(y.to(DType::bf16)));
  // Without bf16 activations (and without autocast) no copy is made.
  const MatmulPrecisionScope f32_activations(DType::bf16, false);
  const Tensor y2 = add_layer_norm(x, r, Tensor(), Tensor(), 1e-5);
  before = copies();
  to_bf16(y2);
  EXPECT_GT(copies(), before);
}

TEST(Bf16Activations, LayerNormOfABf16InputIsTheF32OneOfItsValues) {
  Tensor x = bf16_exact({6, 24}, 10, -2.0, 2.0);
  Tensor xb = x.to(DType::bf16).set_requires_grad(true);
  x.set_requires_grad(true);
  const Tensor w = bf16_exact({24}, 11), b = bf16_exact({24}, 12);
  const Tensor y = layer_norm(xb, w, b, 1e-12);
  EXPECT_EQ(y.dtype(), DType::f32);
  const Tensor y32 = layer_norm(x, w, b, 1e-12);
  EXPECT_EQ(values(y), values(y32));
  const Tensor g = random_f64({6, 24}, 13).to(DType::f32);
  y.backward(g);
  y32.backward(g);
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
  EXPECT_EQ(values(xb.grad()), values(x.grad().to(DType::bf16)));
}

// bf16 q, k, v are read as they are, and the output and gradients come back
// in bf16: the output is autocast's f32 result on the same values rounded
// once; the gradients differ from bf16-rounded f32 ones only by that
// rounding of the output (which their D = rowsum(dO * O) reads). Padded and
// token streams, RoPE inside or not.
TEST(Bf16Activations, AttentionReadsAndWritesBf16Activations) {
  MatmulPrecisionScope bf16_products(DType::bf16);
  const Tensor q = bf16_exact({2, 3, 7, 8}, 14, -2.0, 2.0), k = bf16_exact({2, 3, 7, 8}, 15),
               v = bf16_exact({2, 3, 7, 8}, 16);
  const Tensor mask =
      Tensor::from_vector<int32_t>({1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1}, {2, 7});
  const Tensor positions = Tensor::arange(0, 7, DType::i64);
  auto expect_rounded = [](const std::vector<float>& got, const std::vector<float>& ref,
                           double slack, const char* what) {
    ASSERT_EQ(got.size(), ref.size());
    double top = 0;
    for (float r : ref) top = std::max(top, double(std::abs(r)));
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(got[i], float(bf16(ref[i])), slack * top) << what << " element " << i;
  };
  for (bool rotary : {false, true}) {
    SCOPED_TRACE(rotary ? "rope inside" : "plain");
    auto run = [&](DType dtype, std::vector<float>* grads) {
      auto leaf = [&](const Tensor& t) { return t.detach().to(dtype).set_requires_grad(true); };
      Tensor qi = leaf(q), ki = leaf(k), vi = leaf(v);
      DropoutContext ctx{21, 3, 0};
      const Tensor out =
          rotary ? rope_attention(qi, ki, vi, mask, {positions, 100.0, RopeLayout::half}, 0.2, true,
                                  ctx, 0.35)
                 : attention(qi, ki, vi, mask, 0.2, true, ctx, 0.35);
      EXPECT_EQ(out.dtype(), dtype);
      out.backward(bf16_exact(out.shape(), 17).to(dtype));
      for (const Tensor* t : {&qi, &ki, &vi}) {
        EXPECT_EQ(t->grad().dtype(), dtype);
        for (float f : values(t->grad())) grads->push_back(f);
      }
      return values(out);
    };
    std::vector<float> g32, g16;
    const std::vector<float> ref = run(DType::f32, &g32), got = run(DType::bf16, &g16);
    expect_rounded(got, ref, 0.0, "output");
    expect_rounded(g16, g32, 1e-2, "gradient");
  }
  // Token streams: two segments of one stream.
  const Tensor qs = bf16_exact({9, 2, 8}, 18), ks = bf16_exact({9, 2, 8}, 19),
               vs = bf16_exact({9, 2, 8}, 20);
  const Tensor segments = Tensor::from_vector<int64_t>({0, 4, 0, 0, 4, 5, 1, 0}, {2, 4});
  DropoutContext c1{5, 1, 0}, c2{5, 1, 0};
  const Tensor ref = varlen_attention(qs, ks, vs, segments, 0.1, true, c1, 0.35);
  const Tensor got = varlen_attention(qs.to(DType::bf16), ks.to(DType::bf16), vs.to(DType::bf16),
                                      segments, 0.1, true, c2, 0.35);
  EXPECT_EQ(got.dtype(), DType::bf16);
  expect_rounded(values(got), values(ref), 0.0, "token-stream output");
}

}  // namespace
}  // namespace roformer
