// RoPE linear attention (paper eq. 19) against a direct O(N^2) evaluation of
// the equation, finite differences, and its O(N) memory.
#include <gtest/gtest.h>

#include <cmath>

#include "layers/attention.h"
#include "tests/core/gradcheck.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::random_f64;

double phi(double x) {
  return x > 0 ? x + 1.0 : std::exp(x);
}

// R_m x for one head vector (interleaved pairs, theta_i = base^(-2i/d)).
std::vector<double> rotate(const std::vector<double>& x, int64_t m, double base) {
  const int64_t d = int64_t(x.size());
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = double(m) * std::pow(base, -2.0 * double(i) / double(d));
    const double c = std::cos(angle), s = std::sin(angle);
    out[size_t(2 * i)] = x[size_t(2 * i)] * c - x[size_t(2 * i + 1)] * s;
    out[size_t(2 * i + 1)] = x[size_t(2 * i + 1)] * c + x[size_t(2 * i)] * s;
  }
  return out;
}

// Eq. 19 term by term: out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n /
// sum_n phi(q_m)^T phi(k_n), over kept keys n.
Tensor direct_eq19(const Tensor& q, const Tensor& k, const Tensor& v,
                   const std::vector<std::vector<int>>& keep, bool rotated, double base) {
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3), Dv = v.size(3);
  const auto pq = q.contiguous().to_vector<double>(), pk = k.contiguous().to_vector<double>();
  const auto pv = v.contiguous().to_vector<double>();
  std::vector<double> out(size_t(B * H * S * Dv), 0.0);
  auto vec = [&](const std::vector<double>& src, int64_t b, int64_t h, int64_t s, int64_t n) {
    std::vector<double> x(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) x[size_t(c)] = phi(src[size_t(((b * H + h) * S + s) * n + c)]);
    return x;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t m = 0; m < S; ++m) {
        const auto fq = vec(pq, b, h, m, D);
        const auto rq = rotated ? rotate(fq, m, base) : fq;
        std::vector<double> num(size_t(Dv), 0.0);
        double den = 0;
        for (int64_t n = 0; n < S; ++n) {
          if (!keep[size_t(b)][size_t(n)]) continue;
          const auto fk = vec(pk, b, h, n, D);
          const auto rk = rotated ? rotate(fk, n, base) : fk;
          double w = 0, plain = 0;
          for (int64_t c = 0; c < D; ++c) {
            w += rq[size_t(c)] * rk[size_t(c)];
            plain += fq[size_t(c)] * fk[size_t(c)];
          }
          den += plain;
          for (int64_t c = 0; c < Dv; ++c)
            num[size_t(c)] += w * pv[size_t(((b * H + h) * S + n) * Dv + c)];
        }
        for (int64_t c = 0; c < Dv; ++c)
          out[size_t(((b * H + h) * S + m) * Dv + c)] = num[size_t(c)] / den;
      }
  return Tensor::from_vector(out, {B, H, S, Dv});
}

TEST(LinearAttention, MatchesDirectEquation19WithPadding) {
  const int64_t B = 2, H = 2, S = 9, D = 6, Dv = 5;
  const Tensor q = random_f64({B, H, S, D}, 1, -2, 2), k = random_f64({B, H, S, D}, 2, -2, 2);
  const Tensor v = random_f64({B, H, S, Dv}, 3);
  std::vector<std::vector<int>> keep{std::vector<int>(size_t(S), 1),
                                     std::vector<int>(size_t(S), 1)};
  std::vector<int32_t> mask(size_t(B * S), 1);
  for (int64_t s = 6; s < S; ++s) {
    keep[1][size_t(s)] = 0;
    mask[size_t(S + s)] = 0;
  }
  const Tensor m = Tensor::from_vector(mask, {B, S});
  const Tensor pos = Tensor::arange(0, S);
  for (const double base : {10000.0, 10.0}) {
    EXPECT_TRUE(all_close(rope_linear_attention(q, k, v, m, pos, true, base),
                          direct_eq19(q, k, v, keep, true, base), 1e-10, 1e-12))
        << "base " << base;
  }
  EXPECT_TRUE(all_close(rope_linear_attention(q, k, v, m, pos, false),
                        direct_eq19(q, k, v, keep, false, 10000.0), 1e-10, 1e-12));
  // f32 follows the same path.
  EXPECT_TRUE(all_close(
      rope_linear_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), m, pos, true),
      direct_eq19(q, k, v, keep, true, 10000.0), 1e-4, 1e-5));
}

TEST(LinearAttention, Gradcheck) {
  const int64_t B = 2, H = 1, S = 5, D = 4;
  const Tensor m = Tensor::from_vector<int32_t>({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {B, S});
  const Tensor pos = Tensor::arange(0, S);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return rope_linear_attention(in[0], in[1], in[2], m, pos, true, 100.0);
      },
      {random_f64({B, H, S, D}, 11), random_f64({B, H, S, D}, 12), random_f64({B, H, S, D}, 13)}));
}

TEST(LinearAttention, EveryKeyMaskedGivesZerosNotNaN) {
  const int64_t B = 2, H = 2, S = 4, D = 4;
  const Tensor m = Tensor::from_vector<int32_t>({1, 1, 1, 0, 0, 0, 0, 0}, {B, S});
  const Tensor pos = Tensor::arange(0, S);
  Tensor q = random_f64({B, H, S, D}, 21).set_requires_grad(true);
  Tensor k = random_f64({B, H, S, D}, 22).set_requires_grad(true);
  Tensor v = random_f64({B, H, S, D}, 23).set_requires_grad(true);
  const Tensor out = rope_linear_attention(q, k, v, m, pos, true, 100.0);
  const auto got = out.to_vector<double>();
  const int64_t per_batch = H * S * D;
  for (int64_t i = 0; i < B * per_batch; ++i) {
    ASSERT_TRUE(std::isfinite(got[size_t(i)])) << "element " << i;
    if (i >= per_batch) {
      EXPECT_EQ(got[size_t(i)], 0.0) << "element " << i;
    }
  }
  // Batch 0 is untouched by the guard; gradients stay finite as well.
  std::vector<std::vector<int>> keep{{1, 1, 1, 0}, {1, 1, 1, 1}};
  const Tensor ref = direct_eq19(q.detach(), k.detach(), v.detach(), keep, true, 100.0);
  EXPECT_TRUE(all_close(out.narrow(0, 0, 1), ref.narrow(0, 0, 1), 1e-10, 1e-12));
  sum(out).backward();
  for (const Tensor& t : {q, k, v}) {
    for (double g : t.grad().to_vector<double>()) ASSERT_TRUE(std::isfinite(g));
  }
}

TEST(LinearAttention, MemoryIsLinearInSequenceLength) {
  // S = 4096: an S x S f32 matrix per head would be 64 MiB; the whole
  // forward + backward stays far below it.
  const int64_t B = 1, H = 1, S = 4096, D = 8;
  Allocator& alloc = allocator_for(Device::cpu());
  Tensor q = random_f64({B, H, S, D}, 21).to(DType::f32).set_requires_grad(true);
  Tensor k = random_f64({B, H, S, D}, 22).to(DType::f32).set_requires_grad(true);
  Tensor v = random_f64({B, H, S, D}, 23).to(DType::f32).set_requires_grad(true);
  alloc.reset_peak();
  const size_t start = alloc.stats().allocated_bytes;
  const Tensor out = rope_linear_attention(q, k, v, Tensor(), Tensor::arange(0, S), true);
  sum(out).backward();
  const size_t peak = alloc.stats().peak_allocated_bytes - start;
  EXPECT_LT(peak, size_t(S * S) * sizeof(float) / 16) << "peak " << peak << " bytes";
}

}  // namespace
}  // namespace roformer
