// The bf16 tensor-core attention (core/cuda/kernels/flash_attention.cu)
// against the CPU kernels, at the kernel level (the ops refuse bf16 inputs):
// padded batches with a key mask (one row fully masked), packed token
// streams, dropout (the keep bits must equal the CPU's bit for bit), RoPE
// inside in both pair layouts and none, forward and backward; and, at head
// dim 32, the fallback (the simple kernels on f32 copies). The CPU
// reference runs in f32 on the same bf16-rounded values; device outputs
// start as NaN (keep bits as all ones) so an unwritten element shows.
#include <gtest/gtest.h>

#include "tests/cuda/flash_attention_cases.h"
#include "tests/cuda/gpu_test.h"

namespace roformer {
namespace {

using namespace testing::flash;
using testing::kGpu;

class FlashAttention : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttention, MatchesTheCpuForwardAndBackward) {
  RF_REQUIRE_GPU();
  const Case& c = GetParam();
  const Problem p = make_problem(c);
  expect_match(c, p, run(c, p, kGpu, DType::bf16), run(c, p, Device::cpu(), DType::f32));
}

// The comparison itself, without a GPU: the CPU's f64 kernels against its f32
// ones on the same cases (what is compared, and the keep bits, must agree).
TEST_P(FlashAttention, TheReferenceAgreesWithItselfInF64) {
  const Case& c = GetParam();
  if (c.S > 300) GTEST_SKIP() << "long case: GPU only";
  const Problem p = make_problem(c);
  expect_match(c, p, run(c, p, Device::cpu(), DType::f64), run(c, p, Device::cpu(), DType::f32));
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashAttention, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace roformer
