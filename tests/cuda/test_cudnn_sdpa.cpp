// cuDNN's fused attention (core/cuda/cudnn_sdpa.cpp through the list's
// attention kernels with params.engine vendor; model.attention_kernel:
// cudnn_sdpa). Here, without a GPU: the forward and backward graphs'
// descriptors finalize (cuDNN checks every tensor and operation without a
// handle), bad shapes and the op's refusals are clear errors. On a GPU:
// forward and backward against the CPU attention on random bf16 values
// (padded rows with a key mask, f32 and bf16 outputs), a mask cuDNN cannot
// take is reported, and a small model trains to the same losses as with
// fused_rope.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "core/cuda/cudnn_sdpa.h"
#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"
#include "layers/roformer.h"
#include "optim/adamw.h"
#include "tests/cuda/gpu_test.h"

namespace roformer {
namespace {

using cuda::SdpaGeometry;
using cuda::SdpaTensor;
using testing::bf16_values;
using testing::host;
using testing::kGpu;
using testing::relative_error;

// [B, H, S, D] over [B, S, H, D] memory (the projections' layout) for every tensor.
SdpaGeometry geometry(int64_t B, int64_t H, int64_t S, int64_t D) {
  SdpaGeometry g;
  g.batch = B, g.heads = H, g.seq_q = S, g.seq_kv = S, g.head_dim = D;
  for (auto& s : g.strides) s = {S * H * D, D, H * D, 1};
  return g;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudnnSdpaGraph, ForwardAndBackwardDescriptorsFinalizeWithoutAGpu) {
  // Forward: q k^T, scale, padding mask (2 index, 2 compare, and, select),
  // softmax (max, sub, exp, sum, log, add -> stats, div), p v.
  EXPECT_EQ(cuda::sdpa_graph_operations(geometry(2, 12, 512, 64), false), 16);
  // Backward: rowsum(dO o) (mul, sum, copy to scratch), the scores as
  // forward (8), sub stats, exp, P^T dO (reshape, matmul), dO v^T, sub,
  // mul, scale, dS^T q (reshape, matmul), dS k (reshape k, matmul, copy).
  EXPECT_EQ(cuda::sdpa_graph_operations(geometry(2, 12, 512, 64), true), 24);
  // Another geometry (contiguous [B, H, S, D], unequal lengths) builds too.
  SdpaGeometry g = geometry(3, 2, 100, 64);
  g.seq_kv = 70;
  for (SdpaTensor t : {SdpaTensor::q, SdpaTensor::o, SdpaTensor::grad_o, SdpaTensor::grad_q})
    g.stride(t) = {2 * 100 * 64, 100 * 64, 64, 1};
  for (SdpaTensor t : {SdpaTensor::k, SdpaTensor::v, SdpaTensor::grad_k, SdpaTensor::grad_v})
    g.stride(t) = {2 * 70 * 64, 70 * 64, 64, 1};
  EXPECT_EQ(cuda::sdpa_graph_operations(g, true), 24);
}

TEST(CudnnSdpaGraph, BadShapesAreErrorsNamingTheShapeOrTheDescriptor) {
  const std::string empty =
      error_of([] { cuda::sdpa_graph_operations(geometry(2, 12, 0, 64), false); });
  EXPECT_NE(empty.find("B=2 H=12 Sq=0 Skv=0 D=64"), std::string::npos) << empty;
  // A tensor cuDNN refuses (negative strides): the call and the tensor named.
  SdpaGeometry g = geometry(2, 4, 64, 64);
  g.stride(SdpaTensor::q) = {-1, -1, -1, 1};
  const std::string bad = error_of([&] { cuda::sdpa_graph_operations(g, false); });
  EXPECT_NE(bad.find("cuDNN"), std::string::npos) << bad;
  EXPECT_NE(bad.find("tensor q"), std::string::npos) << bad;
}

// Where cuDNN does not take the call (here: the CPU, with dropout), the
// device's own kernels compute attention() itself, the same bits.
TEST(CudnnSdpaOp, OffCudaItIsAttention) {
  Generator gen{3, 0};
  const Tensor q = Tensor::randn({2, 2, 8, 64}, gen), k = Tensor::randn({2, 2, 8, 64}, gen),
               v = Tensor::randn({2, 2, 8, 64}, gen);
  const Tensor mask = Tensor::from_vector(std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1,  //
                                                               1, 1, 1, 1, 1, 0, 0, 0},
                                          {2, 8});
  DropoutContext a{5, 1}, b{5, 1};
  const Tensor ours = attention(q, k, v, mask, 0.2, true, a, 0.125);
  const Tensor vendor = cudnn_attention(q, k, v, mask, 0.2, true, b, 0.125);
  EXPECT_EQ(ours.to_vector<float>(), vendor.to_vector<float>());
}

// --- on a GPU ---------------------------------------------------------------------------

constexpr int64_t kH = 3, kD = 64;

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// Forward and backward through the list's attention kernels on `device`:
// the CPU in f32, the GPU on bf16 operands with cuDNN (outputs of `out_dtype`).
Result run(Device device, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
           const Tensor& mask, DType out_dtype) {
  kernels::AttentionParams params;
  params.scale = 0.125;
  const bool gpu = !device.is_cpu();
  if (gpu) params.engine = kernels::AttentionEngine::vendor;
  auto in = [&](const Tensor& t) { return t.to(gpu ? DType::bf16 : DType::f32).to(device); };
  auto poisoned = [&](const Shape& s) { return Tensor::full(s, NAN, out_dtype, device); };
  Result r;
  r.out = poisoned(q.shape());
  r.lse = Tensor::full({q.size(0), kH, q.size(2)}, NAN, DType::f32, device);
  r.dq = poisoned(q.shape());
  r.dk = poisoned(k.shape());
  r.dv = poisoned(v.shape());
  const Tensor m = mask.defined() ? mask.to(device) : Tensor();
  const Tensor qd = in(q), kd = in(k), vd = in(v), gd = in(g);
  launch::attention_forward(device, params, qd, kd, vd, m, r.out, r.lse, Tensor());
  launch::attention_backward(device, params, qd, kd, vd, m, r.out, r.lse, Tensor(), gd, r.dq, r.dk,
                             r.dv);
  return r;
}

struct Case {
  const char* name;
  int64_t B, S;
  bool mask;
  DType out_dtype;
};

// gtest prints a parameter in test listings: the name, not a byte dump.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class CudnnSdpa : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnSdpa, MatchesTheCpuAttentionForwardAndBackward) {
  RF_REQUIRE_GPU();
  const Case c = GetParam();
  const Shape shape{c.B, kH, c.S, kD};
  const Tensor q = bf16_values(shape, 1), k = bf16_values(shape, 2), v = bf16_values(shape, 3),
               g = bf16_values(shape, 4);
  Tensor mask;
  if (c.mask) {
    // Row b keeps its first S - 37 b keys (padding at the end, as batches have).
    std::vector<int32_t> m(size_t(c.B * c.S), 1);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = std::max<int64_t>(1, c.S - 37 * b); j < c.S; ++j) m[size_t(b * c.S + j)] = 0;
    mask = Tensor::from_vector(m, {c.B, c.S});
  }
  const Result cpu = run(Device::cpu(), q, k, v, g, mask, DType::f32);
  const Result gpu = run(kGpu, q, k, v, g, mask, c.out_dtype);
  EXPECT_LT(relative_error(host(gpu.out), host(cpu.out)), 2e-2) << c.name;
  EXPECT_LT(relative_error(host(gpu.lse), host(cpu.lse)), 1e-2) << c.name;
  EXPECT_LT(relative_error(host(gpu.dq), host(cpu.dq)), 4e-2) << c.name;
  EXPECT_LT(relative_error(host(gpu.dk), host(cpu.dk)), 4e-2) << c.name;
  EXPECT_LT(relative_error(host(gpu.dv), host(cpu.dv)), 4e-2) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudnnSdpa,
                         ::testing::Values(Case{"masked_f32_outputs", 3, 200, true, DType::f32},
                                           Case{"masked_bf16_outputs", 2, 256, true, DType::bf16},
                                           Case{"no_mask", 2, 128, false, DType::f32},
                                           Case{"odd_length", 2, 77, true, DType::f32}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

TEST(CudnnSdpaOp, ReportsAMaskWithAGapAndLeavesDropoutToOurKernels) {
  RF_REQUIRE_GPU();
  MatmulPrecisionScope scope(DType::bf16);
  const Tensor q = bf16_values({2, 2, 16, kD}, 5).to(kGpu);
  DropoutContext ctx{1, 0}, same{1, 0};
  // With dropout cuDNN does not take the call: our kernel's Philox masks.
  EXPECT_EQ(attention(q, q, q, Tensor(), 0.1, true, same, 0.125).to_vector<float>(),
            cudnn_attention(q, q, q, Tensor(), 0.1, true, ctx, 0.125).to_vector<float>());
  std::vector<int32_t> m(32, 1);
  m[3] = 0;  // row 0 keeps 15 keys, and key 15 lies past them
  const Tensor mask = Tensor::from_vector(m, {2, 16}, kGpu);
  // The check runs on the device; the host read (to_vector) raises it.
  const std::string gap =
      error_of([&] { cudnn_attention(q, q, q, mask, 0.0, false, ctx, 0.125).to_vector<float>(); });
  EXPECT_NE(gap.find("row 0 keeps key 15 after a masked one (15 kept in all)"), std::string::npos)
      << gap;
}

// Losses of three AdamW steps of a small model (head dim 64, no dropout) on
// the GPU under bf16 with `kernel`.
std::vector<double> train(AttentionKernel kernel) {
  ModelConfig c;
  c.vocab_size = 500, c.hidden_size = 128, c.num_attention_heads = 2, c.num_hidden_layers = 2;
  c.intermediate_size = 256, c.max_position_embeddings = 64;
  c.hidden_dropout_prob = 0.0, c.attention_probs_dropout_prob = 0.0;
  c.attention_kernel = kernel;
  RoFormerForMaskedLM model(c, 7);
  model.to(kGpu);
  std::vector<optim::NamedParameter> params;
  for (const NamedTensor& p : model.named_parameters())
    params.push_back({p.name, p.tensor, optim::decays_by_default(p.name)});
  optim::AdamW adamw(params, {});
  const int64_t B = 4, S = 48;
  std::vector<int32_t> ids(size_t(B * S)), mask(size_t(B * S), 1), labels(size_t(B * S), -100);
  for (int64_t i = 0; i < B * S; ++i) {
    ids[size_t(i)] = int32_t(1 + (i * 7919) % 499);
    if (i % 3 == 0) labels[size_t(i)] = ids[size_t(i)];
    if (i / S == 1 && i % S >= S - 9) mask[size_t(i)] = 0, labels[size_t(i)] = -100;
  }
  const Tensor t_ids = Tensor::from_vector(ids, {B, S}, kGpu);
  const Tensor t_types = Tensor::zeros({B, S}, DType::i32, kGpu);
  const Tensor t_mask = Tensor::from_vector(mask, {B, S}, kGpu);
  const Tensor t_labels = Tensor::from_vector(labels, {B, S});
  MatmulPrecisionScope scope(DType::bf16);
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    DropoutContext dropout{1, uint64_t(step)};
    const MlmOutput out = model.forward_mlm(t_ids, t_types, t_mask, t_labels, true, dropout);
    losses.push_back(out.loss.item());
    out.loss.backward();
    adamw.step(1e-3, optim::clip_scale(optim::global_grad_norm(params), 1.0));
    adamw.zero_grad();
  }
  return losses;
}

TEST(CudnnSdpaModel, TrainsToTheLossesOfFusedRope) {
  RF_REQUIRE_GPU();
  const std::vector<double> fused = train(AttentionKernel::kFusedRope);
  const std::vector<double> cudnn = train(AttentionKernel::kCudnnSdpa);
  ASSERT_EQ(fused.size(), cudnn.size());
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_NEAR(cudnn[i], fused[i], 2e-2 * std::abs(fused[i])) << "step " << i;
  EXPECT_LT(fused.back(), fused.front());  // the steps train
}

}  // namespace
}  // namespace roformer
