// The bf16 tensor-core attention (core/cuda/kernels/flash_attention.cu)
// against the CPU kernels, at the kernel level (the ops refuse bf16 inputs):
// padded batches with a key mask (one row fully masked), packed token
// streams, dropout (the keep bits must equal the CPU's bit for bit), RoPE
// inside in both pair layouts and none, forward and backward; and, at head
// dim 32, the fallback (the simple kernels on f32 copies); every variant of
// the kernels (flash_variants), and the fused backward's run-to-run bits. The CPU
// reference runs in f32 on the same bf16-rounded values; device outputs
// start as NaN (keep bits as all ones) so an unwritten element shows.
#include <gtest/gtest.h>

#include "core/cuda/kernels/flash_attention.h"
#include "tests/cuda/flash_attention_cases.h"
#include "tests/cuda/gpu_test.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using namespace testing::flash;
using testing::bf16_values;
using testing::host;
using testing::kGpu;

class FlashAttention : public ::testing::TestWithParam<Case> {};

const FlashKnobs kKnobs{&kernels::cuda::flash_forward_rows_per_warp,
                        &kernels::cuda::set_flash_forward_rows_per_warp,
                        &kernels::cuda::flash_dq_blocks_per_sm,
                        &kernels::cuda::set_flash_dq_blocks_per_sm,
                        &kernels::cuda::flash_backward_passes,
                        &kernels::cuda::set_flash_backward_passes,
                        &kernels::cuda::flash_backward_splits,
                        &kernels::cuda::set_flash_backward_splits,
                        &kernels::cuda::flash_forward_uses_wgmma,
                        &kernels::cuda::set_flash_forward_uses_wgmma,
                        &kernels::cuda::flash_backward_uses_wgmma,
                        &kernels::cuda::set_flash_backward_uses_wgmma,
                        &kernels::cuda::flash_wgmma_available,
                        &kernels::cuda::flash_forward_schedule,
                        &kernels::cuda::set_flash_forward_schedule,
                        &kernels::cuda::flash_keep_bits_ahead,
                        &kernels::cuda::set_flash_keep_bits_ahead,
                        &kernels::cuda::flash_backward_alternates_sweeps,
                        &kernels::cuda::set_flash_backward_alternates_sweeps};

// Every variant (forward tilings, backward schemes, dq blocks an SM, fused
// splits: flash_variants) against the CPU, and against the defaults.
TEST_P(FlashAttention, MatchesTheCpuForwardAndBackward) {
  RF_REQUIRE_GPU();
  const Case& c = GetParam();
  const Problem p = make_problem(c);
  expect_variants_match(kKnobs, c, p, run(c, p, Device::cpu(), DType::f32),
                        [&] { return run(c, p, kGpu, DType::bf16); });
}

// The comparison itself, without a GPU: the CPU's f64 kernels against its f32
// ones on the same cases (what is compared, and the keep bits, must agree).
TEST_P(FlashAttention, TheReferenceAgreesWithItselfInF64) {
  const Case& c = GetParam();
  if (c.S > 300) GTEST_SKIP() << "long case: GPU only";
  const Problem p = make_problem(c);
  expect_match(c, p, run(c, p, Device::cpu(), DType::f64), run(c, p, Device::cpu(), DType::f32));
}

// The fused backward sums dq in f32 without atomics: two runs give the same
// bits, with the automatic split count and with three splits (a long
// sequence: 8 key tiles).
TEST(FlashAttentionEdges, TheFusedBackwardGivesTheSameBitsOnEveryRun) {
  RF_REQUIRE_GPU();
  const std::vector<Case> all = cases();
  const auto it =
      std::find_if(all.begin(), all.end(), [](const Case& c) { return c.name == "plain_long"; });
  ASSERT_NE(it, all.end());
  const Problem p = make_problem(*it);
  for (const bool wgmma : {false, true}) {
    if (wgmma && !kernels::cuda::flash_wgmma_available(0)) continue;  // said by the cases
    for (const int splits : {0, 3}) {
      SCOPED_TRACE(std::string(wgmma ? "wgmma" : "mma.sync") + ", splits " +
                   std::to_string(splits));
      const ScopedFlashSettings scoped(kKnobs, {16, 2, 1, splits, "fused", wgmma, wgmma});
      const Result a = run(*it, p, kGpu, DType::bf16), b = run(*it, p, kGpu, DType::bf16);
      expect_same_results(a, b, true);
    }
  }
}

// Alternating sweeps keep dq's bits, at one split and three: a long
// sequence (8 key tiles) and the model's case (a token stream with dropout,
// q and k rotated once) at one split.
TEST(FlashAttentionEdges, AlternatingSweepsKeepDqsBits) {
  RF_REQUIRE_GPU();
  if (!kernels::cuda::flash_wgmma_available(0)) GTEST_SKIP() << "not compute capability 9.0";
  for (const Case& c : cases()) {
    const bool model = c.name == "packed_dropout_rotated_once_interleaved";
    if (c.name != "plain_long" && !model) continue;
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c);
    expect_alternating_sweeps_keep_dq(kKnobs, model ? std::vector<int>{1} : std::vector<int>{1, 3},
                                      [&] { return run(c, p, kGpu, DType::bf16); });
  }
}

constexpr int64_t kH = 3;  // heads of the edge cases

// No query rows (Sq = 0) but keys: the key and value gradients are zeros,
// written (they start as NaN), as the CPU and the simple kernel write them;
// on mma.sync and, on compute capability 9.0, on wgmma.
TEST(FlashAttentionEdges, NoQueryRowsGiveZeroKeyGradients) {
  RF_REQUIRE_GPU();
  for (const FlashSettings& settings : {mma_sync_variant(), wgmma_variant()}) {
    if (settings.wgmma && !kernels::cuda::flash_wgmma_available(0)) continue;
    SCOPED_TRACE(settings.what);
    const ScopedFlashSettings scoped(kKnobs, settings);
    const int64_t Sk = 70;
    auto gpu = [](const Shape& shape, uint64_t seed) {
      return bf16_values(shape, seed).to(DType::bf16).to(kGpu);
    };
    const Tensor q = Tensor::zeros({2, kH, 0, 64}, DType::bf16, kGpu);  // (randn: no empty shapes)
    const Tensor k = gpu({2, kH, Sk, 64}, 2), v = gpu({2, kH, Sk, 64}, 3);
    const Tensor grad_out = Tensor::zeros({2, kH, 0, 64}, DType::bf16, kGpu);
    auto nan = [](const Shape& shape) { return Tensor::full(shape, NAN, DType::f32, kGpu); };
    const Tensor out = nan({2, kH, 0, 64}), lse = nan({2, kH, 0}), dq = nan({2, kH, 0, 64});
    const Tensor dk = nan({2, kH, Sk, 64}), dv = nan({2, kH, Sk, 64});
    kernels::AttentionParams params;
    params.scale = 0.125;
    launch::attention_backward(kGpu, params, q, k, v, Tensor(), out, lse, Tensor(), grad_out, dq,
                               dk, dv);
    for (const Tensor* g : {&dk, &dv})
      for (double x : host(*g)) ASSERT_EQ(x, 0.0);
  }
}

// A RoPE table with fewer rows than q's sequence is refused, not read past
// its end (the rope kernel's check, kept by the fused path).
TEST(FlashAttentionEdges, ATableShorterThanTheSequenceIsAnError) {
  RF_REQUIRE_GPU();
  const int64_t S = 40;
  const Tensor x = bf16_values({1, kH, S, 64}, 5).to(DType::bf16).to(kGpu);
  const Tensor positions = Tensor::from_vector(std::vector<int64_t>(size_t(S - 1), 0), {S - 1});
  const Tensor table = rope_table(positions.to(kGpu), 64, 10000.0, DType::f32);
  const Tensor out = Tensor::empty({1, kH, S, 64}, DType::f32, kGpu);
  const Tensor lse = Tensor::empty({1, kH, S}, DType::f32, kGpu);
  kernels::AttentionParams params;
  const std::string msg = testing::error_of([&] {
    launch::rope_attention_forward(kGpu, params, table, true, x, x, x, Tensor(), out, lse,
                                   Tensor());
  });
  EXPECT_NE(msg.find("RoPE table"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashAttention, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace roformer
