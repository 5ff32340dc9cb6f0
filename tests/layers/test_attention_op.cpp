// The fused attention op against a composite of plain ops, finite differences
// (f64), the f64 loop kernel (for the f32 oneDNN path), and its dropout and
// memory contracts.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/ops.h"
#include "core/philox.h"
#include "tests/core/gradcheck.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::random_f64;

// softmax(q k^T * scale + (mask ? 0 : -inf)) v from plain ops.
Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           double scale) {
  Tensor scores = mul(matmul(q, k.transpose(-1, -2)), scale);
  if (mask.defined()) {
    const int64_t B = mask.size(0), Sk = mask.size(1);
    const Tensor masked = rsub(mask.to(scores.dtype()), 1.0).view({B, 1, 1, Sk});
    scores = masked_fill(scores, masked, -std::numeric_limits<double>::infinity());
  }
  return matmul(softmax(scores), v);
}

Tensor padding_mask(int64_t B, int64_t S, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> m(size_t(B * S), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < lengths[size_t(b)]; ++s) m[size_t(b * S + s)] = 1;
  return Tensor::from_vector(m, {B, S});
}

TEST(AttentionOp, MatchesCompositeInF64AndF32) {
  const int64_t B = 2, H = 3, Sq = 7, Sk = 9, D = 4, Dv = 5;
  const Tensor q = random_f64({B, H, Sq, D}, 1), k = random_f64({B, H, Sk, D}, 2);
  const Tensor v = random_f64({B, H, Sk, Dv}, 3);
  const Tensor mask = padding_mask(B, Sk, {9, 6});
  DropoutContext gen{7, 0};
  const double scale = 1.0 / std::sqrt(double(D));
  const Tensor ref = reference_attention(q, k, v, mask, scale);
  const Tensor out = attention(q, k, v, mask, 0.1, /*training=*/false, gen, scale);
  EXPECT_EQ(out.shape(), (Shape{B, H, Sq, Dv}));
  EXPECT_TRUE(all_close(out, ref, 1e-12, 1e-13));
  EXPECT_EQ(gen.next_site, 0u) << "no dropout site outside training";
  const Tensor out32 =
      attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), mask, 0.0, true, gen, scale);
  EXPECT_EQ(out32.dtype(), DType::f32);
  EXPECT_TRUE(all_close(out32, ref, 1e-5, 1e-6));
  // Without a mask every key counts.
  EXPECT_TRUE(all_close(attention(q, k, v, Tensor(), 0.0, false, gen, scale),
                        reference_attention(q, k, v, Tensor(), scale), 1e-12, 1e-13));
}

TEST(AttentionOp, OutputIsHeadsMajorViewOfTokenMajorBuffer) {
  const int64_t B = 2, H = 3, S = 4, D = 2;
  DropoutContext gen{1, 0};
  const Tensor out = attention(random_f64({B, H, S, D}, 1), random_f64({B, H, S, D}, 2),
                               random_f64({B, H, S, D}, 3), Tensor(), 0.0, false, gen, 1.0);
  EXPECT_TRUE(out.transpose(1, 2).is_contiguous());
  EXPECT_NO_THROW(out.transpose(1, 2).view({B, S, H * D}));
}

TEST(AttentionOp, GradcheckWithPaddingMask) {
  const int64_t B = 2, H = 2, S = 5, D = 3;
  const Tensor mask = padding_mask(B, S, {5, 3});
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        DropoutContext gen{3, 0};
        return attention(in[0], in[1], in[2], mask, 0.0, true, gen, 0.7);
      },
      {random_f64({B, H, S, D}, 11), random_f64({B, H, S, D}, 12), random_f64({B, H, S, D}, 13)}));
}

TEST(AttentionOp, GradcheckWithDropoutAndStridedInputs) {
  const int64_t B = 2, H = 2, S = 6, D = 4;
  const Tensor mask = padding_mask(B, S, {6, 4});
  // q, k, v as views of one [B, S, 3 * H * D] projection, as the model passes them.
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        const Tensor qkv = in[0].view({B, S, 3, H, D});
        auto heads = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
        DropoutContext gen{1234, 8};  // the same keep mask on every evaluation
        return attention(heads(0), heads(1), heads(2), mask, 0.3, true, gen, 0.5);
      },
      {random_f64({B, S, 3 * H * D}, 21)}));
}

TEST(AttentionOp, F32BackwardMatchesF64Loop) {
  // Odd Sq exercises the split into two row blocks; Sq != Sk and Dv != D.
  const int64_t B = 3, H = 2, Sq = 11, Sk = 13, D = 8, Dv = 6;
  const Tensor mask = padding_mask(B, Sk, {13, 7, 1});
  const Tensor q = random_f64({B, H, Sq, D}, 31), k = random_f64({B, H, Sk, D}, 32);
  const Tensor v = random_f64({B, H, Sk, Dv}, 33), w = random_f64({B, H, Sq, Dv}, 34);
  for (const double p : {0.0, 0.25}) {
    std::vector<Tensor> grads[2];
    std::vector<Tensor> outs;
    for (const DType dt : {DType::f64, DType::f32}) {
      Tensor qq = q.to(dt).detach().set_requires_grad(true);
      Tensor kk = k.to(dt).detach().set_requires_grad(true);
      Tensor vv = v.to(dt).detach().set_requires_grad(true);
      DropoutContext gen{77, 0};
      const Tensor out = attention(qq, kk, vv, mask, p, true, gen, 0.35);
      sum(mul(out, w.to(dt))).backward();
      outs.push_back(out.detach());
      grads[dt == DType::f32] = {qq.grad(), kk.grad(), vv.grad()};
    }
    EXPECT_TRUE(all_close(outs[1], outs[0], 1e-5, 1e-6)) << "p = " << p;
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(all_close(grads[1][size_t(i)], grads[0][size_t(i)], 1e-4, 1e-5))
          << "input " << i << ", p = " << p;
  }
}

TEST(AttentionOp, DropoutKeepsOrZeroesScaledProbabilities) {
  // With v = identity the output rows are the (dropped) probabilities.
  const int64_t B = 2, H = 2, S = 64;
  const Tensor q = random_f64({B, H, S, 8}, 41), k = random_f64({B, H, S, 8}, 42);
  const Tensor eye = Tensor::zeros({S, S}, DType::f64);
  {
    double* p = eye.data_as<double>();
    for (int64_t i = 0; i < S; ++i) p[i * S + i] = 1.0;
  }
  const Tensor v = eye.expand({B, H, S, S});
  const double p = 0.2;
  DropoutContext gen{5, 3, 10};
  const auto probs = attention(q, k, v, Tensor(), 0.0, false, gen, 1.0).to_vector<double>();
  const auto dropped = attention(q, k, v, Tensor(), p, true, gen, 1.0).to_vector<double>();
  EXPECT_EQ(gen.next_site, 1u);
  int64_t zeros = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (dropped[i] == 0.0) {
      ++zeros;
    } else {
      EXPECT_NEAR(dropped[i], probs[i] / (1.0 - p), 1e-12);
    }
  }
  EXPECT_NEAR(double(zeros) / double(probs.size()), p, 0.02);
  // The decisions follow the shared rule of core/philox.h: batch row b is
  // sequence 10 + b, the head goes with the site, the query is the position
  // and the key the feature.
  const PhiloxKey key = dropout_key(5, 3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) {
          const PhiloxCounter bits = philox4x32(
              dropout_block(uint32_t(j / 8), uint32_t(i), uint32_t(10 + b), 0, uint32_t(h)), key);
          const uint32_t word = bits[int(j % 8 / 2)];
          const uint32_t draw = j % 2 ? word >> 16 : word & 0xFFFFu;
          const bool keep = draw >= uint32_t(std::ceil(p * 65536.0));
          ASSERT_EQ(dropped[size_t(((b * H + h) * S + i) * S + j)] != 0.0, keep)
              << b << " " << h << " " << i << " " << j;
        }
  // The next site of the same forward pass is a different mask.
  const auto again = attention(q, k, v, Tensor(), p, true, gen, 1.0).to_vector<double>();
  EXPECT_NE(again, dropped);
  // Two micro-batches of one sequence each draw the masks of the whole batch.
  DropoutContext first{5, 3, 10}, second{5, 3, 11};
  auto row = [&](int64_t b, DropoutContext& ctx) {
    return attention(q.narrow(0, b, 1), k.narrow(0, b, 1), v.narrow(0, b, 1), Tensor(), p, true,
                     ctx, 1.0)
        .to_vector<double>();
  };
  auto split = row(0, first);
  const auto tail = row(1, second);
  split.insert(split.end(), tail.begin(), tail.end());
  EXPECT_EQ(split, dropped);
}

TEST(AttentionOp, BitwiseIndependentOfThreadCount) {
  const int64_t B = 2, H = 4, S = 40, D = 16;
  const Tensor mask = padding_mask(B, S, {40, 29});
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Tensor q = random_f64({B, H, S, D}, 51).to(DType::f32).set_requires_grad(true);
    Tensor k = random_f64({B, H, S, D}, 52).to(DType::f32).set_requires_grad(true);
    Tensor v = random_f64({B, H, S, D}, 53).to(DType::f32).set_requires_grad(true);
    DropoutContext gen{9, 0};
    const Tensor out = attention(q, k, v, mask, 0.1, true, gen, 0.25);
    sum(mul(out, random_f64({B, H, S, D}, 54).to(DType::f32))).backward();
    std::vector<std::vector<float>> r{out.to_vector<float>(), q.grad().to_vector<float>(),
                                      k.grad().to_vector<float>(), v.grad().to_vector<float>()};
    return r;
  };
  const int saved = omp_get_max_threads();
  const auto one = run(1);
  const auto two = run(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(AttentionOp, RowsWithoutKeysGiveZerosNotNaN) {
  const int64_t B = 2, H = 1, S = 4, D = 2;
  const Tensor mask = padding_mask(B, S, {4, 0});
  for (const DType dt : {DType::f64, DType::f32}) {
    Tensor q = random_f64({B, H, S, D}, 61).to(dt).set_requires_grad(true);
    DropoutContext gen{1, 0};
    const Tensor out = attention(q, q, q, mask, 0.0, true, gen, 1.0);
    sum(out).backward();
    for (double x : out.select(0, 1).to_vector<double>()) EXPECT_EQ(x, 0.0);
    for (double x : q.grad().to_vector<double>()) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(AttentionOp, KeepsNoSquareBuffersForBackward) {
  // Between forward and backward only O(B H S) state stays alive; the
  // backward's scratch is two S x S buffers per thread (threads <= heads),
  // never one per head.
  const int64_t B = 2, H = 4, S = 256, D = 16;
  Allocator& alloc = allocator_for(Device::cpu());
  Tensor q = random_f64({B, H, S, D}, 71).to(DType::f32).set_requires_grad(true);
  Tensor k = random_f64({B, H, S, D}, 72).to(DType::f32).set_requires_grad(true);
  Tensor v = random_f64({B, H, S, D}, 73).to(DType::f32).set_requires_grad(true);
  const size_t square = size_t(S * S) * sizeof(float);
  const size_t before = alloc.stats().allocated_bytes;
  DropoutContext gen{3, 0};
  Tensor out = attention(q, k, v, Tensor(), 0.1, true, gen, 0.25);
  const size_t kept = alloc.stats().allocated_bytes - before;
  EXPECT_LT(kept, size_t(B * H) * square / 8) << "forward kept " << kept << " bytes";
  alloc.reset_peak();
  const size_t start = alloc.stats().allocated_bytes;
  out.backward(Tensor::ones(out.shape()));
  const size_t peak = alloc.stats().peak_allocated_bytes - start;
  const size_t threads = size_t(std::min<int64_t>(omp_get_max_threads(), B * H));
  const size_t grads = 3 * size_t(B * H * S * D) * sizeof(float);
  EXPECT_LE(peak, 2 * threads * square + 2 * grads + (size_t(64) << 10))
      << "backward peak " << peak << " bytes";
}

TEST(AttentionOp, RejectsBadShapesNamingTheOp) {
  DropoutContext gen{1, 0};
  const Tensor x = random_f64({1, 2, 3, 4}, 1);
  try {
    attention(x, random_f64({1, 2, 3, 5}, 2), x, Tensor(), 0.0, false, gen, 1.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention"), std::string::npos) << e.what();
  }
  EXPECT_THROW(attention(x, x, x, Tensor::ones({1, 4}), 0.0, false, gen, 1.0), Error);
  EXPECT_THROW(attention(x, x, x, Tensor(), 1.0, true, gen, 1.0), Error);
  EXPECT_THROW(attention(x.view({2, 3, 4}), x, x, Tensor(), 0.0, false, gen, 1.0), Error);
}

}  // namespace
}  // namespace roformer
