// Rotary position embedding: the kernel against a plain loop, its gradient, and
// the properties the paper derives for it (section 3.4, eq. 15 and eq. 34).
#include <gtest/gtest.h>

#include <cmath>

#include "core/ops.h"
#include "gradcheck.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::random_f64;

// Rotation of logical values [rows of S, D] at `positions`, written from the
// paper's formulas independently of the kernel.
std::vector<double> reference_rope(const std::vector<double>& x, const Shape& shape,
                                   const std::vector<int64_t>& positions, double base,
                                   RopeLayout layout) {
  const int64_t D = shape.back(), S = shape[shape.size() - 2];
  const int64_t rows = shape_numel(shape) / D;
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double m = double(positions[size_t(r % S)]);
    for (int64_t i = 0; i < D / 2; ++i) {
      const double theta = std::pow(base, -2.0 * double(i) / double(D));
      const int64_t a = layout == RopeLayout::interleaved ? 2 * i : i;
      const int64_t b = layout == RopeLayout::interleaved ? 2 * i + 1 : i + D / 2;
      const double x0 = x[size_t(r * D + a)], x1 = x[size_t(r * D + b)];
      out[size_t(r * D + a)] = x0 * std::cos(m * theta) - x1 * std::sin(m * theta);
      out[size_t(r * D + b)] = x1 * std::cos(m * theta) + x0 * std::sin(m * theta);
    }
  }
  return out;
}

Tensor positions_i64(std::vector<int64_t> p) {
  const int64_t n = int64_t(p.size());
  return Tensor::from_vector<int64_t>(p, {n});
}

// rope of a single vector [D] at position m, as doubles.
std::vector<double> rotate_one(const Tensor& v, int64_t m,
                               RopeLayout layout = RopeLayout::interleaved) {
  return rope(v.reshape({1, v.numel()}), positions_i64({m}), 10000.0, layout).to_vector<double>();
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

const RopeLayout kLayouts[] = {RopeLayout::interleaved, RopeLayout::half};

TEST(Rope, ForwardMatchesReferenceLoopForBothLayoutsAndDtypes) {
  const std::vector<int64_t> pos = {3, 0, 7, 12, 5};  // not an arange: positions are honoured
  for (RopeLayout layout : kLayouts) {
    for (double base : {10000.0, 500.0}) {
      const Tensor x = random_f64({2, 3, 5, 8}, 1);
      const auto want = reference_rope(x.to_vector<double>(), x.shape(), pos, base, layout);
      const Tensor want_t = Tensor::from_vector<double>(want, x.shape());
      EXPECT_TRUE(all_close(rope(x, positions_i64(pos), base, layout), want_t, 1e-12, 1e-12));
      // i32 positions give the same result.
      const Tensor p32 = Tensor::from_vector<int32_t>({3, 0, 7, 12, 5}, {5});
      EXPECT_TRUE(all_close(rope(x, p32, base, layout), want_t, 1e-12, 1e-12));
      EXPECT_TRUE(all_close(rope(x.to(DType::f32), p32, base, layout), want_t, 1e-5, 1e-6));
      // bf16: compare against the reference on the bf16-rounded input.
      const Tensor xb = x.to(DType::bf16);
      const auto want_b = reference_rope(xb.to_vector<double>(), x.shape(), pos, base, layout);
      const Tensor out_b = rope(xb, p32, base, layout);
      EXPECT_EQ(out_b.dtype(), DType::bf16);
      EXPECT_TRUE(all_close(out_b, Tensor::from_vector<double>(want_b, x.shape()), 1e-2, 1e-2));
    }
  }
}

TEST(Rope, HandlesStridedAndBroadcastInputs) {
  // [B, S, H, D] as the projections produce it, viewed as [B, H, S, D].
  const Tensor bshd = random_f64({2, 6, 3, 8}, 2);
  const Tensor x = bshd.permute({0, 2, 1, 3});
  ASSERT_FALSE(x.is_contiguous());
  const std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5};
  for (RopeLayout layout : kLayouts) {
    const Tensor out = rope(x, positions_i64(pos), 10000.0, layout);
    EXPECT_TRUE(out.is_contiguous());
    EXPECT_EQ(out.shape(), (Shape{2, 3, 6, 8}));
    EXPECT_TRUE(all_close(out, rope(x.contiguous(), positions_i64(pos), 10000.0, layout), 0, 0));
    // Head dim not unit-stride, and a broadcast (stride-0) batch dim.
    const Tensor xt = random_f64({8, 6}, 3).transpose(0, 1);  // [6, 8], strides (1, 6)
    EXPECT_TRUE(all_close(rope(xt, positions_i64(pos), 10000.0, layout),
                          rope(xt.contiguous(), positions_i64(pos), 10000.0, layout), 0, 0));
    const Tensor xe = random_f64({1, 6, 8}, 4).expand({3, 6, 8});
    const auto want = reference_rope(xe.to_vector<double>(), xe.shape(), pos, 10000.0, layout);
    EXPECT_TRUE(all_close(rope(xe, positions_i64(pos), 10000.0, layout),
                          Tensor::from_vector<double>(want, xe.shape()), 1e-12, 1e-12));
  }
}

TEST(Rope, F32AnglesAreComputedInDoubleAtLongPositions) {
  // Angles near 8000 rad lose ~1e-3 in f32 arithmetic; computed in double and
  // then rounded, the f32 result stays within f32 rounding of the f64 one.
  std::vector<int64_t> pos;
  for (int64_t p = 8000; p < 8016; ++p) pos.push_back(p);
  const Tensor x = random_f64({2, 16, 64}, 5);
  for (RopeLayout layout : kLayouts) {
    const Tensor want = rope(x, positions_i64(pos), 10000.0, layout);
    const Tensor got = rope(x.to(DType::f32), positions_i64(pos), 10000.0, layout);
    EXPECT_TRUE(all_close(got, want, 0, 2e-6));
  }
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  for (RopeLayout layout : kLayouts) {
    const Tensor pos = positions_i64({4, 1, 9});
    auto f = [&](const std::vector<Tensor>& in) { return rope(in[0], pos, 10000.0, layout); };
    EXPECT_TRUE(gradcheck(f, {random_f64({2, 3, 6}, 6)}));
    // Through a permuted view, as attention uses it.
    auto g = [&](const std::vector<Tensor>& in) {
      return rope(in[0].permute({1, 0, 2}), pos, 100.0, layout);
    };
    EXPECT_TRUE(gradcheck(g, {random_f64({3, 2, 4}, 7)}));
  }
}

TEST(Rope, F32BackwardMatchesF64Backward) {
  const Tensor pos = positions_i64({0, 5, 2, 40});
  for (RopeLayout layout : kLayouts) {
    const Tensor x64 = random_f64({3, 4, 16}, 8).set_requires_grad(true);
    const Tensor x32 = x64.detach().to(DType::f32).set_requires_grad(true);
    const Tensor w = random_f64({3, 4, 16}, 9);
    sum(mul(rope(x64, pos, 10000.0, layout), w)).backward();
    sum(mul(rope(x32, pos, 10000.0, layout), w.to(DType::f32))).backward();
    EXPECT_EQ(x32.grad().dtype(), DType::f32);
    EXPECT_TRUE(all_close(x32.grad(), x64.grad(), 1e-5, 1e-6));
    // The gradient is R^T w (the inverse rotation), so rotating it forward
    // gives w back, and it is not w itself.
    EXPECT_TRUE(all_close(rope(x64.grad(), pos, 10000.0, layout), w, 1e-12, 1e-12));
    EXPECT_FALSE(all_close(x64.grad(), w, 1e-3, 0));
  }
}

TEST(Rope, ScoreDependsOnlyOnRelativePosition) {
  // Paper eq. 16: <R_m q, R_n k> = q^T R_{n-m} k.
  for (RopeLayout layout : kLayouts) {
    const Tensor q = random_f64({64}, 10), k = random_f64({64}, 11);
    for (auto [m, n] : {std::pair<int64_t, int64_t>{0, 0}, {3, 10}, {10, 3}, {100, 37}}) {
      const double score = dot(rotate_one(q, m, layout), rotate_one(k, n, layout));
      for (int64_t shift : {1, 17, 1000}) {
        const double shifted =
            dot(rotate_one(q, m + shift, layout), rotate_one(k, n + shift, layout));
        EXPECT_NEAR(shifted, score, 1e-10) << "m=" << m << " n=" << n << " shift=" << shift;
      }
      // ... and does depend on m - n.
      const double other = dot(rotate_one(q, m, layout), rotate_one(k, n + 1, layout));
      EXPECT_GT(std::abs(other - score), 1e-6);
    }
  }
}

TEST(Rope, RotationPreservesNorms) {
  std::vector<int64_t> pos;
  for (int64_t p = 0; p < 9; ++p) pos.push_back(p * 37);
  const Tensor x = random_f64({4, 9, 32}, 12);
  for (RopeLayout layout : kLayouts) {
    const Tensor y = rope(x, positions_i64(pos), 10000.0, layout);
    const Tensor nx = sum(mul(x, x), {-1}), ny = sum(mul(y, y), {-1});
    EXPECT_TRUE(all_close(ny, nx, 1e-12, 0));
    const Tensor y32 = rope(x.to(DType::f32), positions_i64(pos), 10000.0, layout);
    EXPECT_TRUE(all_close(sum(mul(y32, y32), {-1}), nx.to(DType::f32), 1e-5, 0));
    // Not the identity, except at position 0.
    EXPECT_FALSE(all_close(y.narrow(1, 1, 8), x.narrow(1, 1, 8), 1e-3, 0));
    EXPECT_TRUE(all_close(y.narrow(1, 0, 1), x.narrow(1, 0, 1), 0, 0));
  }
}

TEST(Rope, ElementwiseFormEqualsBlockDiagonalRotationMatrix) {
  // Paper eq. 15: R_{Theta,m} = diag(R(m theta_1), ..., R(m theta_{d/2})) with
  // 2x2 blocks [[cos, -sin], [sin, cos]]; eq. 34 is R x computed elementwise.
  const int64_t D = 12;
  const double base = 10000.0;
  const Tensor x = random_f64({D}, 13);
  const std::vector<double> xv = x.to_vector<double>();
  for (int64_t m : {0, 1, 5, 63, 511}) {
    std::vector<double> R(size_t(D * D), 0.0);
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = double(m) * std::pow(base, -2.0 * double(i) / double(D));
      R[size_t((2 * i) * D + 2 * i)] = std::cos(a);
      R[size_t((2 * i) * D + 2 * i + 1)] = -std::sin(a);
      R[size_t((2 * i + 1) * D + 2 * i)] = std::sin(a);
      R[size_t((2 * i + 1) * D + 2 * i + 1)] = std::cos(a);
    }
    std::vector<double> Rx(size_t(D), 0.0);
    for (int64_t r = 0; r < D; ++r)
      for (int64_t c = 0; c < D; ++c) Rx[size_t(r)] += R[size_t(r * D + c)] * xv[size_t(c)];
    const std::vector<double> got = rotate_one(x, m);
    for (int64_t r = 0; r < D; ++r) EXPECT_NEAR(got[size_t(r)], Rx[size_t(r)], 1e-12) << m;
    // R is orthogonal: R^T R x = x, matching the backward's inverse rotation.
    std::vector<double> RtRx(size_t(D), 0.0);
    for (int64_t r = 0; r < D; ++r)
      for (int64_t c = 0; c < D; ++c) RtRx[size_t(r)] += R[size_t(c * D + r)] * Rx[size_t(c)];
    for (int64_t r = 0; r < D; ++r) EXPECT_NEAR(RtRx[size_t(r)], xv[size_t(r)], 1e-12);
  }
}

TEST(Rope, HalfLayoutIsInterleavedUnderAPermutation) {
  // "Rotate half" pairs (i, i + D/2); moving those to (2i, 2i+1) makes it the
  // interleaved rotation, the relation used to convert LLaMA-style weights.
  const int64_t D = 10;
  const Tensor x = random_f64({3, D}, 14);
  const Tensor pos = positions_i64({2, 9, 30});
  std::vector<int64_t> perm(static_cast<size_t>(D));  // interleaved slot -> half slot
  for (int64_t i = 0; i < D / 2; ++i) {
    perm[size_t(2 * i)] = i;
    perm[size_t(2 * i + 1)] = i + D / 2;
  }
  const Tensor idx = Tensor::from_vector<int64_t>(perm, {D});
  auto columns = [&](const Tensor& t) {
    return index_select(t.transpose(0, 1), idx).transpose(0, 1);
  };
  EXPECT_TRUE(all_close(columns(rope(x, pos, 10000.0, RopeLayout::half)),
                        rope(columns(x), pos, 10000.0, RopeLayout::interleaved), 1e-12, 1e-12));
}

TEST(Rope, RejectsBadArgumentsClearly) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string odd = message([] { rope(Tensor::zeros({1, 3, 7}), positions_i64({0, 1, 2})); });
  EXPECT_NE(odd.find("rope: head dimension 7 must be even"), std::string::npos) << odd;
  const std::string len = message([] { rope(Tensor::zeros({3, 8}), positions_i64({0, 1})); });
  EXPECT_NE(len.find("i64[2]"), std::string::npos) << len;
  EXPECT_NE(len.find("f32[3, 8]"), std::string::npos) << len;
  const std::string pdt = message([] {
    rope(Tensor::zeros({2, 8}), Tensor::from_vector<float>({0, 1}, {2}));
  });
  EXPECT_NE(pdt.find("rope"), std::string::npos) << pdt;
  EXPECT_NE(pdt.find("f32"), std::string::npos) << pdt;
  EXPECT_THROW(rope(Tensor::zeros({8}), positions_i64({0})), Error);
  EXPECT_THROW(rope(Tensor::zeros({2, 8}, DType::i64), positions_i64({0, 1})), Error);
}

TEST(Rope, NodeSavesNoActivations) {
  // The backward needs only the angle table: modifying x after rope is fine.
  Tensor x = random_f64({2, 4, 8}, 15).set_requires_grad(true);
  Tensor xs = mul(x, 1.0);
  const Tensor y = rope(xs, positions_i64({0, 1, 2, 3}));
  {
    NoGradGuard no_grad;
    xs.fill_(3.0);
  }
  const Tensor w = random_f64({2, 4, 8}, 16);
  sum(mul(y, w)).backward();
  EXPECT_TRUE(all_close(rope(x.grad(), positions_i64({0, 1, 2, 3})), w, 1e-12, 1e-12));
}

}  // namespace
}  // namespace roformer
