// Variable-length attention on a token stream and token-stream dropout:
// packed attention equals each document's attention run on its own (forward
// and gradients), no token sees another document, the draws equal the padded
// op's and both kernels' keep bits follow the shared Philox rule, f64 finite
// differences, and the errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <optional>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/philox.h"
#include "core/precision.h"
#include "gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::error_of;
using testing::gradcheck;
using testing::random_f64;

constexpr int64_t kH = 2, kD = 8;

// Segments [N, 4] of documents laid end to end in one row (positions run on).
Tensor packed_row(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> s;
  int64_t start = 0;
  for (int64_t len : lengths) {
    s.insert(s.end(), {start, len, 0, start});
    start += len;
  }
  return Tensor::from_vector(s, {int64_t(lengths.size()), 4});
}

Tensor stream(int64_t T, uint64_t seed, DType dtype) {
  NoGradGuard no_grad;
  return random_f64({T, kH, kD}, seed, -2.0, 2.0).to(dtype).set_requires_grad(true);
}

// A document's tokens [len, H, D] as the padded op's [1, H, len, D] view.
Tensor as_heads(const Tensor& x, int64_t start, int64_t len) {
  return x.narrow(0, start, len).unsqueeze(0).transpose(1, 2);
}

class VarlenAttention : public ::testing::TestWithParam<DType> {};

TEST_P(VarlenAttention, PackedEqualsEachDocumentAloneForwardAndGradients) {
  const DType dtype = GetParam();
  const std::vector<int64_t> lengths{5, 1, 9, 3};
  const int64_t T = 18;
  const Tensor q = stream(T, 1, dtype), k = stream(T, 2, dtype), v = stream(T, 3, dtype);
  const Tensor r = random_f64({T, kH, kD}, 4).to(dtype);
  DropoutContext ctx;
  const Tensor packed = varlen_attention(q, k, v, packed_row(lengths), 0.0, false, ctx, 0.3);
  sum(mul(packed, r)).backward();
  const Tensor gq = q.grad().clone(), gk = k.grad().clone(), gv = v.grad().clone();
  for (const Tensor* t : {&q, &k, &v}) t->zero_grad();

  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t len : lengths) {
    const Tensor alone = attention(as_heads(q, start, len), as_heads(k, start, len),
                                   as_heads(v, start, len), Tensor(), 0.0, false, ctx, 0.3);
    parts.push_back(alone.transpose(1, 2).squeeze(0));  // [len, H, D]
    start += len;
  }
  const Tensor separate = concat(parts, 0);
  sum(mul(separate, r)).backward();
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(all_close(packed, separate, tol, tol));
  EXPECT_TRUE(all_close(gq, q.grad(), tol, tol));
  EXPECT_TRUE(all_close(gk, k.grad(), tol, tol));
  EXPECT_TRUE(all_close(gv, v.grad(), tol, tol));
}

TEST_P(VarlenAttention, NoTokenAttendsAcrossADocumentBoundary) {
  const DType dtype = GetParam();
  const std::vector<int64_t> lengths{4, 6, 5};
  const int64_t T = 15;
  const Tensor q = stream(T, 11, dtype), k = stream(T, 12, dtype), v = stream(T, 13, dtype);
  DropoutContext ctx{3, 1, 0};
  const Tensor segments = packed_row(lengths);
  const Tensor before = varlen_attention(q, k, v, segments, 0.1, true, ctx, 0.4);
  // Change every q, k, v of the middle document (tokens 4..9).
  NoGradGuard no_grad;
  auto perturbed = [&](const Tensor& x) {
    Tensor y = x.detach().clone();
    y.narrow(0, 4, 6).copy_(random_f64({6, kH, kD}, 99).to(dtype));
    return y;
  };
  DropoutContext same{3, 1, 0};
  const Tensor after =
      varlen_attention(perturbed(q), perturbed(k), perturbed(v), segments, 0.1, true, same, 0.4);
  const std::vector<double> a = before.to_vector<double>(), b = after.to_vector<double>();
  const int64_t per_token = kH * kD;
  int64_t middle_changed = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < per_token; ++e) {
      const size_t i = size_t(t * per_token + e);
      if (t >= 4 && t < 10) {
        middle_changed += a[i] != b[i];
      } else {
        ASSERT_EQ(a[i], b[i]) << "token " << t << " of another document changed";
      }
    }
  EXPECT_GT(middle_changed, 0) << "the perturbation did not reach the middle document";
}

TEST_P(VarlenAttention, UnpaddedSequencesDrawThePaddedRowsDropout) {
  // Rows of lengths 7 and 4 padded to 8: the same masks and outputs.
  const DType dtype = GetParam();
  const int64_t S = 8;
  const std::vector<int64_t> lengths{7, 4};
  const Tensor q = stream(2 * S, 21, dtype), k = stream(2 * S, 22, dtype),
               v = stream(2 * S, 23, dtype);
  auto padded_heads = [&](const Tensor& x) { return x.view({2, S, kH, kD}).transpose(1, 2); };
  std::vector<int32_t> mask(size_t(2 * S), 0);
  std::vector<int64_t> index, segs;
  for (int64_t b = 0; b < 2; ++b) {
    segs.insert(segs.end(), {int64_t(index.size()), lengths[size_t(b)], b, 0});
    for (int64_t s = 0; s < lengths[size_t(b)]; ++s) {
      mask[size_t(b * S + s)] = 1;
      index.push_back(b * S + s);
    }
  }
  DropoutContext padded_ctx{5, 2, 6};
  const Tensor padded = attention(padded_heads(q), padded_heads(k), padded_heads(v),
                                  Tensor::from_vector(mask, {2, S}), 0.3, true, padded_ctx, 0.35)
                            .transpose(1, 2)
                            .reshape({2 * S, kH, kD});
  const Tensor rows = Tensor::from_vector(index, {int64_t(index.size())});
  DropoutContext stream_ctx{5, 2, 6};
  const Tensor unpadded =
      varlen_attention(index_select(q, rows), index_select(k, rows), index_select(v, rows),
                       Tensor::from_vector(segs, {2, 4}), 0.3, true, stream_ctx, 0.35);
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(all_close(unpadded, index_select(padded, rows), tol, tol));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, VarlenAttention, ::testing::Values(DType::f32, DType::f64));

TEST(VarlenAttention, FiniteDifferenceGradientsF64WithDropoutAndAGap) {
  // Token 6 is in no segment: its gradient must be zero.
  const Tensor segments =
      Tensor::from_vector<int64_t>({0, 4, 0, 0, 4, 2, 0, 4, 7, 3, 1, 0}, {3, 4});
  auto f = [&](const std::vector<Tensor>& x) {
    DropoutContext ctx{9, 0, 1};
    return varlen_attention(x[0], x[1], x[2], segments, 0.25, true, ctx, 0.5);
  };
  EXPECT_TRUE(gradcheck(
      f, {random_f64({10, 2, 3}, 31), random_f64({10, 2, 3}, 32), random_f64({10, 2, 5}, 33)}));
}

// Segment lengths across the kernel's length buckets (8, 24, 64, 96): the
// same bits for 1 and 2 threads, in f32 and under bf16 autocast.
TEST(VarlenAttention, BitwiseIndependentOfThreadCountF32AndBf16) {
  const std::vector<int64_t> lengths{3, 70, 17, 40};
  const int64_t T = 130;
  for (const DType products : {DType::f32, DType::bf16}) {
    auto run = [&](int threads) {
      omp_set_num_threads(threads);
      MatmulPrecisionScope scope(products);
      const Tensor q = stream(T, 71, DType::f32), k = stream(T, 72, DType::f32),
                   v = stream(T, 73, DType::f32);
      DropoutContext ctx{4, 1, 0};
      const Tensor out = varlen_attention(q, k, v, packed_row(lengths), 0.1, true, ctx, 0.35);
      sum(mul(out, random_f64({T, kH, kD}, 74).to(DType::f32))).backward();
      return std::vector<std::vector<float>>{out.to_vector<float>(), q.grad().to_vector<float>(),
                                             k.grad().to_vector<float>(),
                                             v.grad().to_vector<float>()};
    };
    const int saved = omp_get_max_threads();
    const auto one = run(1), two = run(2);
    omp_set_num_threads(saved);
    EXPECT_EQ(one, two) << dtype_name(products) << " products";
  }
}

// Under bf16 autocast the packed kernel rounds where the padded one does:
// each document's padded attention under autocast gives the same numbers
// (up to f32 summation order), and both differ from f32.
TEST(VarlenAttention, Bf16AutocastMatchesThePaddedKernel) {
  const std::vector<int64_t> lengths{5, 33, 12};
  const int64_t T = 50;
  const Tensor q = stream(T, 81, DType::f32), k = stream(T, 82, DType::f32),
               v = stream(T, 83, DType::f32);
  DropoutContext ctx;
  NoGradGuard no_grad;
  const Tensor plain = varlen_attention(q, k, v, packed_row(lengths), 0.0, false, ctx, 0.3);
  MatmulPrecisionScope bf16_products(DType::bf16);
  const Tensor packed = varlen_attention(q, k, v, packed_row(lengths), 0.0, false, ctx, 0.3);
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t len : lengths) {
    const Tensor alone = attention(as_heads(q, start, len), as_heads(k, start, len),
                                   as_heads(v, start, len), Tensor(), 0.0, false, ctx, 0.3);
    parts.push_back(alone.transpose(1, 2).squeeze(0));
    start += len;
  }
  EXPECT_TRUE(all_close(packed, concat(parts, 0), 1e-3, 1e-3));
  EXPECT_FALSE(all_close(packed, plain, 1e-6, 1e-6)) << "autocast had no effect";
}

// set_rotate_once: q and k rotated once by the rope kernel before the plain
// attention kernel, and the rope_attention backward taking the rotated
// copies, in place of rotating inside both, for the packed
// op and varlen_rope_attention alike: the same output and qkv gradient (f64,
// dropout, a token in no segment, both pair layouts), and the setting (on by
// default) back after its scope.
TEST(VarlenAttention, RotatingOnceGivesTheRopeInsideResult) {
  const Tensor segments = Tensor::from_vector<int64_t>({0, 5, 0, 0, 6, 6, 1, 0}, {2, 4});
  const Tensor positions = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5}, {12});
  const auto rope_calls = [] {
    return kernels::kernel_calls_by_id[size_t(kernels::KernelId::rope)].load();
  };
  const auto fused_calls = [] {
    return kernels::kernel_calls_by_id[size_t(kernels::KernelId::rope_attention_forward)].load();
  };
  const auto fused_backward_calls = [] {
    return kernels::kernel_calls_by_id[size_t(kernels::KernelId::rope_attention_backward)].load();
  };
  for (const RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half}) {
    SCOPED_TRACE(layout == RopeLayout::half ? "half" : "interleaved");
    std::vector<Tensor> outs, grads;
    for (const bool once : {false, true}) {
      const RotateOnceScope scope(once);
      const Tensor qkv = random_f64({12, 3 * kH * kD}, 61, -2.0, 2.0).set_requires_grad(true);
      DropoutContext ctx{9, 4, 0};
      const uint64_t rope_before = rope_calls(), fused_before = fused_calls(),
                     backward_before = fused_backward_calls();
      const Tensor out = varlen_attention_packed(
          qkv, kH, segments, RotaryEmbedding{positions, 100.0, layout}, 0.2, true, ctx, 0.4);
      sum(mul(out, random_f64(out.shape(), 62))).backward();
      // Rotated once: the rope kernel rotates q and k forward; else the
      // forward rotates inside. Back, the rope_attention kernel either way:
      // it takes the rotated copies and rotates dq and dk back.
      EXPECT_EQ(rope_calls() - rope_before, once ? 2u : 0u);
      EXPECT_EQ(fused_calls() - fused_before, once ? 0u : 1u);
      EXPECT_EQ(fused_backward_calls() - backward_before, 1u);
      outs.push_back(out.detach());
      grads.push_back(qkv.grad());
    }
    EXPECT_TRUE(all_close(outs[1], outs[0], 1e-12, 1e-12));
    EXPECT_TRUE(all_close(grads[1], grads[0], 1e-12, 1e-12));
  }
  EXPECT_TRUE(rotate_once());
}

TEST(VarlenAttention, TokensInNoSegmentGetZeros) {
  const Tensor q = random_f64({5, 1, 2}, 41);
  DropoutContext ctx;
  const Tensor out = varlen_attention(q, q, q, Tensor::from_vector<int64_t>({0, 3, 0, 0}, {1, 4}),
                                      0.0, false, ctx, 1.0);
  const std::vector<double> o = out.to_vector<double>();
  for (size_t i = 6; i < 10; ++i) EXPECT_EQ(o[i], 0.0);
  EXPECT_NE(o[0], 0.0);
}

// Every allocation filled with NaN bytes for the guard's lifetime.
struct PoisonedCpuAllocations {
  PoisonedCpuAllocations() { allocator_for(Device::cpu()).set_poison(true); }
  ~PoisonedCpuAllocations() { allocator_for(Device::cpu()).set_poison(false); }
  PoisonedCpuAllocations(const PoisonedCpuAllocations&) = delete;
  PoisonedCpuAllocations& operator=(const PoisonedCpuAllocations&) = delete;
};

// Outputs and gradients of a stream whose segments cover every token are not
// zero-filled first (the kernels write every element), those of a stream
// with a gap are: with every allocation poisoned, both come out as without.
TEST(VarlenAttention, EveryElementIsWrittenOrZeroFilledUnderPoisonedAllocations) {
  for (const bool gap : {false, true}) {
    SCOPED_TRACE(gap ? "a token in no segment" : "every token in a segment");
    const int64_t T = 12;
    const Tensor segments =
        gap ? Tensor::from_vector<int64_t>({0, 5, 0, 0, 6, 6, 1, 0}, {2, 4}) : packed_row({5, 7});
    std::vector<std::vector<double>> runs;
    for (const bool poison : {false, true}) {
      const Tensor q = stream(T, 51, DType::f32), k = stream(T, 52, DType::f32);
      const Tensor v = stream(T, 53, DType::f32);
      std::optional<PoisonedCpuAllocations> poisoned;
      if (poison) poisoned.emplace();
      DropoutContext ctx{3, 1, 0};
      const Tensor out = varlen_attention(q, k, v, segments, 0.2, true, ctx, 0.4);
      sum(mul(out, random_f64({T, kH, kD}, 54).to(DType::f32))).backward();
      std::vector<double> all = out.to_vector<double>();
      for (const Tensor* t : {&q, &k, &v}) {
        const std::vector<double> g = t->grad().to_vector<double>();
        all.insert(all.end(), g.begin(), g.end());
      }
      runs.push_back(all);
    }
    EXPECT_EQ(runs[1], runs[0]);
  }
}

// The keep bits of both CPU attention kernels follow the shared rule of
// core/philox.h, which the CUDA kernels (flash_attention.cu, attention.cu)
// draw on their own: key j is the feature, the query's position the position
// (a segment's position + i in a token stream, i when padded), the sequence
// first_sequence + the batch row (the segment's row), the head goes with the
// site; masked keys are drawn like the others.
TEST(AttentionKeepBits, FollowTheSharedRulePaddedAndPerSegment) {
  kernels::AttentionParams params;
  params.scale = 0.5;
  params.dropout_p = 0.3;
  params.dropout = DropoutKey{7, 2, 9, 3};  // seed, step, first sequence, site
  const PhiloxKey key = dropout_key(7, 2);
  const uint32_t threshold = dropout_threshold(0.3);
  auto rule = [&](int64_t j, int64_t position, int64_t row, int64_t head) {
    return dropout_draw(key, uint32_t(j), uint32_t(position), uint32_t(9 + row), 3,
                        uint32_t(head)) >= threshold;
  };
  int64_t checked = 0, dropped = 0;
  // Every key bit of `rows` query rows against the rule; want(row, j).
  auto expect_bits = [&](const Tensor& bits, int64_t rows, int64_t keys, auto want) {
    const std::vector<int32_t> w = bits.to_vector<int32_t>();
    const int64_t W = bits.size(-1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < keys; ++j, ++checked) {
        const bool got = (uint32_t(w[size_t(r * W + j / 32)]) >> (j % 32)) & 1u;
        const bool expected = want(r, j);
        ASSERT_EQ(got, expected) << "row " << r << ", key " << j;
        dropped += !expected;
      }
  };
  {  // A token stream: rows and positions other than 0, a segment across words,
     // token 40 in no segment.
    const std::vector<int64_t> segs{0, 37, 1, 5, 37, 3, 0, 0, 41, 70, 2, 11};
    const int64_t T = 111;
    const Tensor x = random_f64({T, kH, kD}, 61).to(DType::f32);
    const Tensor out = Tensor::empty({T, kH, kD}), lse = Tensor::empty({T, kH});
    const Tensor bits = Tensor::zeros({T, kH, 3}, DType::i32);
    params.longest_segment = 70;
    launch::attention_varlen_forward(Device::cpu(), params, x, x, x,
                                     Tensor::from_vector(segs, {3, 4}), out, lse, bits);
    for (size_t n = 0; n < segs.size(); n += 4) {
      const int64_t start = segs[n], len = segs[n + 1], row = segs[n + 2], pos = segs[n + 3];
      const Tensor seg_bits = bits.narrow(0, start, len).contiguous();
      expect_bits(seg_bits, len * kH, len,
                  [&](int64_t r, int64_t j) { return rule(j, pos + r / kH, row, r % kH); });
    }
  }
  {  // Padded, a key mask hiding the last 9 keys of batch row 1.
    const int64_t B = 2, S = 40;
    const Tensor x = random_f64({B, kH, S, kD}, 62).to(DType::f32);
    std::vector<int32_t> m(size_t(B * S), 1);
    for (int64_t j = S - 9; j < S; ++j) m[size_t(S + j)] = 0;
    const Tensor out = Tensor::empty({B, kH, S, kD}), lse = Tensor::empty({B, kH, S});
    const Tensor bits = Tensor::zeros({B, kH, S, 2}, DType::i32);
    params.longest_segment = 0;
    launch::attention_forward(Device::cpu(), params, x, x, x, Tensor::from_vector(m, {B, S}), out,
                              lse, bits);
    expect_bits(bits, B * kH * S, S,
                [&](int64_t r, int64_t j) { return rule(j, r % S, r / (kH * S), (r / S) % kH); });
  }
  EXPECT_GT(dropped, checked / 5);  // p = 0.3: the rule does drop
  EXPECT_LT(dropped, checked * 2 / 5);
}

TEST(VarlenAttention, ErrorsNameTheSegmentAndShapes) {
  const Tensor q = random_f64({6, 1, 2}, 51);
  DropoutContext ctx;
  auto run = [&](std::vector<int64_t> s) {
    return error_of([&] {
      varlen_attention(q, q, q, Tensor::from_vector(s, {int64_t(s.size() / 4), 4}), 0.0, false, ctx,
                       1.0);
    });
  };
  EXPECT_NE(run({0, 4, 0, 0, 3, 2, 0, 3}).find("segment 1 (first token 3, length 2"),
            std::string::npos);
  EXPECT_NE(run({0, 7, 0, 0}).find("leaves the 6 tokens"), std::string::npos);
  EXPECT_NE(error_of([&] {
              varlen_attention(q, q.view({6, 2, 1}), q, Tensor::zeros({0, 4}, DType::i64), 0.0,
                               false, ctx, 1.0);
            }).find("expected q, k [T, H, D]"),
            std::string::npos);
}

TEST(TokenDropout, DrawsWhatThePaddedRowsDraw) {
  // Rows of lengths 3 and 5 padded to 5, features 6.
  const int64_t S = 5, F = 6;
  const Tensor x = random_f64({2, S, F}, 61).to(DType::f32);
  std::vector<int64_t> index, tokens;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < (b == 0 ? 3 : 5); ++s) {
      index.push_back(b * S + s);
      tokens.insert(tokens.end(), {b, s});
    }
  const int64_t T = int64_t(index.size());
  DropoutContext padded_ctx{8, 4, 10};
  const Tensor padded = dropout(x, 0.4, true, padded_ctx).reshape({2 * S, F});
  DropoutContext stream_ctx{8, 4, 10};
  const Tensor rows = Tensor::from_vector(index, {T});
  const Tensor unpadded = dropout(index_select(x.reshape({2 * S, F}), rows), 0.4, true, stream_ctx,
                                  Tensor::from_vector(tokens, {T, 2}));
  EXPECT_TRUE(all_close(unpadded, index_select(padded, rows), 0.0, 0.0));
  EXPECT_EQ(stream_ctx.next_site, padded_ctx.next_site);
  auto f = [&](const std::vector<Tensor>& in) {
    DropoutContext ctx{8, 4, 10};
    return dropout(in[0], 0.4, true, ctx, Tensor::from_vector(tokens, {T, 2}));
  };
  EXPECT_TRUE(gradcheck(f, {random_f64({T, F}, 62)}));
}

}  // namespace
}  // namespace roformer
