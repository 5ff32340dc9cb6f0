// Attention with RoPE inside (rope_attention, varlen_rope_attention) is the
// separate ops composed: attention(rope(q), rope(k), v) forward and
// gradients w.r.t. the unrotated q, k and v, for both pair layouts, with a
// key mask and dropout, and on a packed token stream. (Finite differences
// and f32-vs-f64 are in the op table.)
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "core/ops.h"
#include "gradcheck.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::random_f64;

Tensor input(const Shape& shape, uint64_t seed, DType dtype) {
  NoGradGuard no_grad;
  return random_f64(shape, seed, -2.0, 2.0).to(dtype).set_requires_grad(true);
}

struct Grads {
  Tensor out, dq, dk, dv;
};

// out and the gradients of sum(out * r) w.r.t. q, k, v (cleared after).
template <class Fn>
Grads run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& r, Fn fn) {
  Grads g;
  g.out = fn();
  sum(mul(g.out, r)).backward();
  g.dq = q.grad().clone();
  g.dk = k.grad().clone();
  g.dv = v.grad().clone();
  for (const Tensor* t : {&q, &k, &v}) t->zero_grad();
  return g;
}

void expect_same(const Grads& a, const Grads& b, double tol) {
  EXPECT_TRUE(all_close(a.out, b.out, tol, tol));
  EXPECT_TRUE(all_close(a.dq, b.dq, tol, tol));
  EXPECT_TRUE(all_close(a.dk, b.dk, tol, tol));
  EXPECT_TRUE(all_close(a.dv, b.dv, tol, tol));
}

class RopeAttention : public ::testing::TestWithParam<std::tuple<DType, RopeLayout>> {};

TEST_P(RopeAttention, PaddedEqualsRopeThenAttentionWithMaskAndDropout) {
  const auto [dtype, layout] = GetParam();
  const int64_t B = 2, H = 3, S = 7, D = 8;
  const Tensor q = input({B, H, S, D}, 1, dtype), k = input({B, H, S, D}, 2, dtype),
               v = input({B, H, S, D}, 3, dtype);
  const Tensor r = random_f64({B, H, S, D}, 4).to(dtype);
  const Tensor mask =
      Tensor::from_vector<int32_t>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {B, S});
  const Tensor positions = Tensor::from_vector<int64_t>({2, 3, 4, 5, 6, 7, 8}, {S});
  const RotaryEmbedding rotary{positions, 500.0, layout};
  const Grads fused = run(q, k, v, r, [&] {
    DropoutContext ctx{5, 1, 0};
    return rope_attention(q, k, v, mask, rotary, 0.3, true, ctx, 0.4);
  });
  const Grads separate = run(q, k, v, r, [&] {
    DropoutContext ctx{5, 1, 0};
    return attention(rope(q, positions, 500.0, layout), rope(k, positions, 500.0, layout), v, mask,
                     0.3, true, ctx, 0.4);
  });
  expect_same(fused, separate, dtype == DType::f64 ? 1e-12 : 1e-5);
}

TEST_P(RopeAttention, TokenStreamEqualsRopeThenVarlenAttention) {
  const auto [dtype, layout] = GetParam();
  const int64_t T = 14, H = 2, D = 8;
  const Tensor q = input({T, H, D}, 11, dtype), k = input({T, H, D}, 12, dtype),
               v = input({T, H, D}, 13, dtype);
  const Tensor r = random_f64({T, H, D}, 14).to(dtype);
  // Two documents packed in row 0 (positions restart), one in row 1; token 13 in none.
  const Tensor segments =
      Tensor::from_vector<int64_t>({0, 4, 0, 0, 4, 3, 0, 4, 7, 6, 1, 0}, {3, 4});
  const Tensor positions =
      Tensor::from_vector<int64_t>({0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5, 0}, {T});
  const RotaryEmbedding rotary{positions, 100.0, layout};
  const Grads fused = run(q, k, v, r, [&] {
    const RotateOnceScope inside(false);  // the kernels' RoPE, not the default's rotated copies
    DropoutContext ctx{9, 2, 1};
    return varlen_rope_attention(q, k, v, segments, rotary, 0.2, true, ctx, 0.5);
  });
  const Grads separate = run(q, k, v, r, [&] {
    DropoutContext ctx{9, 2, 1};
    auto rotate = [&](const Tensor& x) {
      return rope(x.transpose(0, 1), positions, 100.0, layout).transpose(0, 1);
    };
    return varlen_attention(rotate(q), rotate(k), v, segments, 0.2, true, ctx, 0.5);
  });
  expect_same(fused, separate, dtype == DType::f64 ? 1e-12 : 1e-5);
}

INSTANTIATE_TEST_SUITE_P(DTypesAndLayouts, RopeAttention,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64),
                                            ::testing::Values(RopeLayout::interleaved,
                                                              RopeLayout::half)));

TEST(RopeAttentionErrors, PositionsMustMatchTheSequence) {
  const Tensor q = Tensor::zeros({1, 1, 4, 4}, DType::f32);
  DropoutContext ctx;
  const RotaryEmbedding rotary{Tensor::from_vector<int64_t>({0, 1, 2}, {3})};
  EXPECT_THROW(
      {
        try {
          rope_attention(q, q, q, Tensor(), rotary, 0.0, false, ctx, 1.0);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("rope_attention: positions"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace roformer
