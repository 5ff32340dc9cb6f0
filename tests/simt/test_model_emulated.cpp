// The whole model on the CUDA kernels, without a GPU: the CPU device is given
// the SIMT emulator's kernel table (every kernel of core/cuda/kernels/ run
// from its own source over host memory; the GEMMs and the device services
// stay the CPU's, cuBLASLt having no emulated version), and one MLM step,
// forward and backward, is compared with the same step on the CPU kernels:
// padded batches and token streams, RoPE inside the attention kernel (the
// tensor-core kernel at head dim 64, the others at 32) and as separate ops, f32 and bf16 with
// bf16 activations. What a GPU run would meet first (a dtype pairing, a
// layout, a stride an op hands a kernel) shows here.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "core/ops/dispatch.h"
#include "core/precision.h"
#include "layers/roformer.h"
#include "tests/simt/emulated_kernels.h"

namespace roformer {
namespace {

// The emulated CUDA kernels, with the CPU's GEMMs and device services.
kernels::KernelTable hybrid_table() {
  kernels::KernelTable t = kernels::simt_cuda_kernel_table;
  const kernels::KernelTable& cpu = kernels::cpu_kernel_table;
  t.default_stream = cpu.default_stream;
  t.take_error = cpu.take_error;
  t.synchronize = cpu.synchronize;
  t.matmul = cpu.matmul;
  t.matmul_accumulate = cpu.matmul_accumulate;
  t.linear_weight_grads = cpu.linear_weight_grads;
  t.gemm_gelu_forward = cpu.gemm_gelu_forward;
  t.gemm_dgelu_backward = cpu.gemm_dgelu_backward;
  return t;
}

// Installs the table for its lifetime, whatever the test throws.
struct EmulatedKernels {
  kernels::KernelTable table = hybrid_table();
  EmulatedKernels() { kernels::set_cpu_kernel_table_for_tests(&table); }
  ~EmulatedKernels() { kernels::set_cpu_kernel_table_for_tests(nullptr); }
  EmulatedKernels(const EmulatedKernels&) = delete;
  EmulatedKernels& operator=(const EmulatedKernels&) = delete;
};

ModelConfig config(AttentionKernel kernel, int64_t head_dim) {
  ModelConfig c;
  c.vocab_size = 61;
  c.hidden_size = 2 * head_dim;  // heads of 64 take the tensor-core attention kernel
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 96;
  c.max_position_embeddings = 64;
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  c.attention_kernel = kernel;
  return c;
}

struct Step {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per parameter
};

// One MLM step on rows of `lengths` (padded to S, or as a token stream).
Step mlm_step(const ModelConfig& c, bool stream, bool bf16) {
  const std::vector<int64_t> lengths{21, 33, 9};
  const int64_t B = 3, S = 33;
  std::vector<int32_t> ids(size_t(B * S), 0), mask(size_t(B * S), 0), labels(size_t(B * S), -100);
  std::vector<int32_t> s_ids, s_labels;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < lengths[size_t(b)]; ++s) {
      const size_t i = size_t(b * S + s);
      ids[i] = int32_t(1 + (b * 11 + s * 7) % 60);
      mask[i] = 1;
      labels[i] = s % 4 == 1 ? int32_t((s * 5 + b) % 61) : -100;
      s_ids.push_back(ids[i]);
      s_labels.push_back(labels[i]);
    }
  RoFormerForMaskedLM model(c, 17);
  std::optional<MatmulPrecisionScope> scope;
  if (bf16) scope.emplace(DType::bf16);
  DropoutContext ctx{5, 2, 0};
  const int64_t T = int64_t(s_ids.size());
  const MlmOutput out = stream ? model.forward_mlm(Tensor::from_vector(s_ids, {T}), Tensor(),
                                                   TokenLayout::of_lengths(lengths),
                                                   Tensor::from_vector(s_labels, {T}), true, ctx)
                               : model.forward_mlm(Tensor::from_vector(ids, {B, S}), Tensor(),
                                                   Tensor::from_vector(mask, {B, S}),
                                                   Tensor::from_vector(labels, {B, S}), true, ctx);
  out.loss.backward();
  Step r;
  r.loss = out.read().first;
  for (const auto& p : model.named_parameters())
    r.grads.push_back(p.tensor.grad().to(DType::f32).to_vector<float>());
  return r;
}

// max |a - b| / max |b| over one parameter's gradient.
double scaled_error(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, double(std::abs(a[i] - b[i])));
    ref = std::max(ref, double(std::abs(b[i])));
  }
  return ref > 0 ? err / ref : err;
}

struct Case {
  const char* name;
  AttentionKernel kernel;
  bool stream, bf16;
  int64_t head_dim = 64;
  const char* hidden_act = "gelu";
  bool rotate_once = false;  // set_rotate_once: q and k rotated by the rope kernel once
};

class ModelEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(ModelEmulated, OneMlmStepMatchesTheCpuKernels) {
  const Case& k = GetParam();
  ModelConfig c = config(k.kernel, k.head_dim);
  c.hidden_act = k.hidden_act;
  const Step cpu = mlm_step(c, k.stream, k.bf16);
  Step emulated;
  {
    EmulatedKernels use;
    const RotateOnceScope once(k.rotate_once);
    emulated = mlm_step(c, k.stream, k.bf16);
  }
  // The kernels sum in other orders; bf16 rounds differently where they do.
  const double tol = k.bf16 ? 2e-2 : 1e-4;
  EXPECT_NEAR(emulated.loss, cpu.loss, tol * std::abs(cpu.loss));
  ASSERT_EQ(emulated.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    ASSERT_EQ(emulated.grads[i].size(), cpu.grads[i].size());
    for (float g : emulated.grads[i]) ASSERT_TRUE(std::isfinite(g)) << "parameter " << i;
    EXPECT_LT(scaled_error(emulated.grads[i], cpu.grads[i]), k.bf16 ? 5e-2 : 1e-3)
        << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ModelEmulated,
    ::testing::Values(Case{"padded_f32_separate_rope", AttentionKernel::kSeparate, false, false},
                      Case{"padded_bf16_fused_rope", AttentionKernel::kFusedRope, false, true},
                      Case{"padded_bf16_separate_rope", AttentionKernel::kSeparate, false, true},
                      Case{"stream_bf16_separate_rope", AttentionKernel::kSeparate, true, true},
                      Case{"stream_f32_fused_rope", AttentionKernel::kFusedRope, true, false},
                      Case{"stream_bf16_fused_rope", AttentionKernel::kFusedRope, true, true},
                      // Head dim 32: the simple and per-segment kernels in bf16.
                      Case{"padded_bf16_head_dim_32", AttentionKernel::kFusedRope, false, true, 32},
                      Case{"stream_bf16_head_dim_32", AttentionKernel::kFusedRope, true, true, 32},
                      // The tanh GELU: the FFN's products with GELU epilogues, bf16 inside.
                      Case{"stream_bf16_gelu_new", AttentionKernel::kFusedRope, true, true, 64,
                           "gelu_new"},
                      // q and k rotated once by the rope kernel: the plain forward on
                      // the copies, the backward rotating dq and dk back as it writes.
                      Case{"stream_bf16_rotated_once", AttentionKernel::kFusedRope, true, true, 64,
                           "gelu", true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace roformer
