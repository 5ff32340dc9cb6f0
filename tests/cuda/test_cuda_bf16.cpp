// bf16 mixed precision on the GPU (core/precision.h): the fused AdamW's bf16
// working copy feeding the next forward with no cast, and a short training run
// of a small model on the GPU in bf16 against the CPU in f32. The matrix ops
// under autocast are in test_cuda_ops.cpp. Skips without a GPU.
#include <cmath>
#include <cstdio>

#include "core/ops.h"
#include "core/precision.h"
#include "layers/roformer.h"
#include "layers/token_layout.h"
#include "optim/adamw.h"
#include "tests/cuda/gpu_test.h"
#include "tests/layers/golden_h5.h"

namespace roformer {
namespace {

using testing::kGpu;

std::vector<optim::NamedParameter> adamw_params(const Module& model) {
  std::vector<optim::NamedParameter> params;
  for (const NamedTensor& p : model.named_parameters())
    params.push_back({p.name, p.tensor, optim::decays_by_default(p.name)});
  return params;
}

struct MlmBatch {
  Tensor ids, types, mask, labels;
};

// A fixed batch: random ids, the last two positions of row 1 padded, about a
// third of the positions labelled.
MlmBatch batch(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  Generator gen{seed, 0};
  const std::vector<float> u = Tensor::rand({B * S * 2}, gen).to_vector<float>();
  std::vector<int32_t> ids(size_t(B * S)), mask(size_t(B * S), 1), labels(size_t(B * S), -100);
  for (int64_t i = 0; i < B * S; ++i) {
    ids[size_t(i)] = 1 + int32_t(u[size_t(i)] * float(vocab - 1)) % int32_t(vocab - 1);
    if (u[size_t(B * S + i)] < 0.33f) labels[size_t(i)] = ids[size_t(i)];
  }
  mask[size_t(2 * S - 1)] = mask[size_t(2 * S - 2)] = 0;
  labels[size_t(2 * S - 1)] = labels[size_t(2 * S - 2)] = -100;
  return {Tensor::from_vector(ids, {B, S}), Tensor::zeros({B, S}, DType::i32),
          Tensor::from_vector(mask, {B, S}), Tensor::from_vector(labels, {B, S})};
}

// Losses of `steps` steps of AdamW (clipped at 1) on one repeated batch.
std::vector<double> train(Device device, DType products, int steps, int64_t* casts_after_first) {
  ModelConfig c = testing::golden_config();
  RoFormerForMaskedLM model(c, 7);
  model.to(device);
  const std::vector<optim::NamedParameter> params = adamw_params(model);
  optim::AdamW adamw(params, {});
  const MlmBatch b = batch(4, 32, c.vocab_size, 3);
  const Tensor ids = b.ids.to(device), types = b.types.to(device), mask = b.mask.to(device);
  clear_bf16_weights();
  MatmulPrecisionScope scope(products);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    if (step == 1) *casts_after_first = bf16_weight_casts();
    DropoutContext dropout{1, uint64_t(step)};
    const MlmOutput out = model.forward_mlm(ids, types, mask, b.labels, true, dropout);
    losses.push_back(out.loss.item());
    out.loss.backward();
    adamw.step(1e-3, optim::clip_scale(optim::global_grad_norm(params), 1.0));
    adamw.zero_grad();
  }
  return losses;
}

TEST(CudaBf16, TrainingMatchesTheCpuInF32AndCastsNoWeightAfterTheFirstStep) {
  RF_REQUIRE_GPU();
  constexpr int kSteps = 12;
  int64_t cpu_casts = 0, gpu_casts = 0;
  const std::vector<double> cpu = train(Device::cpu(), DType::f32, kSteps, &cpu_casts);
  const int64_t hits = bf16_working_copy_hits();
  const std::vector<double> gpu = train(kGpu, DType::bf16, kSteps, &gpu_casts);
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) {
    const double rel = std::abs(gpu[size_t(s)] - cpu[size_t(s)]) / std::abs(cpu[size_t(s)]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 2e-2) << "step " << s << ": gpu bf16 " << gpu[size_t(s)] << ", cpu f32 "
                         << cpu[size_t(s)];
  }
  EXPECT_LT(gpu.back(), gpu.front()) << "the loss did not fall";
  // After the first step every weight comes from the working copy the AdamW
  // kernel wrote: no cast beyond the first forward's.
  EXPECT_EQ(bf16_weight_casts(), gpu_casts);
  EXPECT_GT(bf16_working_copy_hits(), hits);
  std::printf(
      "bf16 on %s vs f32 on the CPU, %d steps: worst loss rel diff %.2e (%.6f vs %.6f last)\n",
      kGpu.str().c_str(), kSteps, worst, gpu.back(), cpu.back());
}

TEST(CudaBf16, WorkingCopyHoldsTheUpdatedWeightsRounded) {
  RF_REQUIRE_GPU();
  Generator gen{21, 0};
  const Tensor w0 = Tensor::randn({24, 40}, gen), b0 = Tensor::randn({24}, gen);
  const Tensor gw = Tensor::randn({24, 40}, gen), gb = Tensor::randn({24}, gen);
  Tensor w = w0.to(kGpu).detach().set_requires_grad(true);
  Tensor b = b0.to(kGpu).detach().set_requires_grad(true);
  optim::AdamW adamw({{"w", w, true}, {"b", b, false}}, {});
  MatmulPrecisionScope scope(DType::bf16);
  const Tensor x = Tensor::randn({5, 40}, gen).to(kGpu);
  sum(mul(linear(x, w, b), linear(x, gw.to(kGpu)))).backward();
  adamw.step(1e-2);
  // The next forward reads the working copy: the same product as a fresh cast.
  const int64_t casts = bf16_weight_casts(), hits = bf16_working_copy_hits();
  const Tensor from_copy = linear(x, w, b);
  EXPECT_EQ(bf16_weight_casts(), casts);
  EXPECT_EQ(bf16_working_copy_hits(), hits + 1);
  NoGradGuard no_grad;
  MatmulPrecisionScope f32_products(DType::f32);
  auto rounded = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
  const Tensor fresh = linear(rounded(x), rounded(w.detach()), b.detach());
  const std::vector<float> got = from_copy.to_vector<float>();
  const std::vector<float> expect = fresh.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-4) << i;
  clear_bf16_weights();
}

// The token-stream model (data.unpadded on CUDA under bf16, the tensor-core
// varlen kernel) against the padded model on the CPU in f32: the same batch,
// its padding dropped, the same loss and gradients at bf16 tolerance.
TEST(CudaBf16, TokenStreamMatchesThePaddedModelOnTheCpu) {
  RF_REQUIRE_GPU();
  ModelConfig c = testing::golden_config();
  constexpr int64_t B = 4, S = 32;
  const MlmBatch b = batch(B, S, c.vocab_size, 5);
  const std::vector<int32_t> ids = b.ids.to_vector<int32_t>(), mask = b.mask.to_vector<int32_t>(),
                             labels = b.labels.to_vector<int32_t>();
  std::vector<int32_t> stream_ids, stream_labels;
  std::vector<int64_t> lengths;
  for (int64_t r = 0; r < B; ++r) {
    int64_t len = 0;
    for (int64_t i = 0; i < S; ++i)
      if (mask[size_t(r * S + i)]) {
        stream_ids.push_back(ids[size_t(r * S + i)]);
        stream_labels.push_back(labels[size_t(r * S + i)]);
        ++len;
      }
    lengths.push_back(len);
  }
  const int64_t T = int64_t(stream_ids.size());
  auto grads = [](const Module& m) {
    std::vector<double> g;
    for (const NamedTensor& p : m.named_parameters())
      for (double v : p.tensor.grad().to(Device::cpu()).to_vector<double>()) g.push_back(v);
    return g;
  };
  RoFormerForMaskedLM cpu_model(c, 7), gpu_model(c, 7);
  gpu_model.to(kGpu);
  DropoutContext d1{1, 0}, d2{1, 0};
  const MlmOutput padded = cpu_model.forward_mlm(b.ids, b.types, b.mask, b.labels, true, d1);
  padded.loss.backward();
  MlmOutput stream;
  {
    clear_bf16_weights();
    MatmulPrecisionScope scope(DType::bf16);
    stream = gpu_model.forward_mlm(Tensor::from_vector(stream_ids, {T}, kGpu),
                                   Tensor::zeros({T}, DType::i32, kGpu),
                                   TokenLayout::of_lengths(lengths).to(kGpu),
                                   Tensor::from_vector(stream_labels, {T}), true, d2);
    stream.loss.backward();
  }
  EXPECT_EQ(stream.num_masked, padded.num_masked);
  EXPECT_NEAR(stream.loss.item(), padded.loss.item(), 2e-2 * std::abs(padded.loss.item()));
  const std::vector<double> gp = grads(cpu_model), gs = grads(gpu_model);
  ASSERT_EQ(gp.size(), gs.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < gp.size(); ++i) {
    num += (gs[i] - gp[i]) * (gs[i] - gp[i]);
    den += gp[i] * gp[i];
  }
  EXPECT_LT(std::sqrt(num / den), 3e-2) << "relative gradient error";
  clear_bf16_weights();
}

}  // namespace
}  // namespace roformer
