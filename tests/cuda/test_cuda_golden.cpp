// The whole model on the GPU against the golden fixtures: logits, loss and
// every parameter's gradient of RoFormerForMaskedLM and
// RoFormerForSequenceClassification. The fixtures come from
// tests/golden/make_golden_roformer.py; ROFORMER_GOLDEN_DIR points at a
// freshly generated set (scripts/gpu_check.sh writes one with transformers on
// the GPU machine), and ROFORMER_GOLDEN_REQUIRE_HF=1 makes the test insist
// that transformers itself made them.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "layers/roformer.h"
#include "tests/cuda/gpu_test.h"
#include "tests/layers/golden_h5.h"

namespace roformer {
namespace {

using testing::GoldenFile;
using testing::kGpu;
using testing::max_rel_error;

std::string golden(const char* name) {
  return testing::golden_path(name);
}

void check_origin(const GoldenFile& f, const char* model) {
  std::printf("golden reference: %s\n", f.attribute("reference").c_str());
  testing::expect_golden_origin(f, model);
}

StateDict golden_weights(const GoldenFile& f) {
  StateDict state;
  for (const auto& name : f.members("weights"))
    state.push_back({name, f.read("weights/" + name).to(DType::f32)});
  return state;
}

// GPU f32: other summation orders than the CPU's, so ten times its bounds.
constexpr double kLogitsTol = 1e-4, kLossTol = 1e-5, kGradTol = 1e-3;

void check_grads(const Module& model, const GoldenFile& f, const char* what) {
  ASSERT_EQ(f.members("grads").size(), model.named_parameters().size());
  double worst = 0;
  std::string worst_name;
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    ASSERT_TRUE(p.tensor.grad().device().is_cuda()) << p.name;
    const double err = max_rel_error(p.tensor.grad().to(Device::cpu()), f.read("grads/" + p.name));
    EXPECT_LT(err, kGradTol) << p.name;
    if (err > worst) worst = err, worst_name = p.name;
  }
  std::printf("golden %s on %s: worst gradient rel err %.2e (%s)\n", what, kGpu.str().c_str(),
              worst, worst_name.c_str());
}

TEST(CudaGolden, MaskedLMMatchesReference) {
  RF_REQUIRE_GPU();
  const GoldenFile f(golden("golden_roformer_mlm.h5"));
  check_origin(f, "RoFormerForMaskedLM");
  RoFormerForMaskedLM model(testing::golden_config(), 1);
  model.to(kGpu);
  model.load_state_dict(golden_weights(f));
  const Tensor ids = f.read("input_ids", DType::i32).to(kGpu);
  const Tensor types = f.read("token_type_ids", DType::i32).to(kGpu);
  const Tensor mask = f.read("attention_mask", DType::i32).to(kGpu);
  const Tensor labels = f.read("labels", DType::i32);  // host, as the trainer keeps them
  const int64_t B = ids.size(0), S = ids.size(1), V = 1000;

  const Tensor logits = model.mlm_logits(ids, types, mask).view({B, S, V});
  ASSERT_TRUE(logits.device().is_cuda());
  const double logits_err = max_rel_error(logits.to(Device::cpu()), f.read("logits"));
  EXPECT_LT(logits_err, kLogitsTol);

  DropoutContext gen{1, 0};
  const MlmOutput out = model.forward_mlm(ids, types, mask, labels, /*training=*/true, gen);
  const double ref_loss = f.read("loss").item(), loss = out.loss.item();
  EXPECT_NEAR(loss, ref_loss, kLossTol * std::abs(ref_loss));
  out.loss.backward();
  std::printf("golden MLM on %s: logits rel err %.2e, loss %.10f vs %.10f\n", kGpu.str().c_str(),
              logits_err, loss, ref_loss);
  check_grads(model, f, "MLM");
}

TEST(CudaGolden, SequenceClassificationMatchesReference) {
  RF_REQUIRE_GPU();
  const GoldenFile f(golden("golden_roformer_cls.h5"));
  check_origin(f, "RoFormerForSequenceClassification");
  RoFormerForSequenceClassification model(testing::golden_config(), 3, 1);
  model.to(kGpu);
  model.load_state_dict(golden_weights(f));
  const Tensor ids = f.read("input_ids", DType::i32).to(kGpu);
  const Tensor types = f.read("token_type_ids", DType::i32).to(kGpu);
  const Tensor mask = f.read("attention_mask", DType::i32).to(kGpu);
  const Tensor labels = f.read("labels", DType::i32).to(kGpu);
  DropoutContext gen{1, 0};
  const ClassificationOutput out = model.forward(ids, types, mask, labels, true, gen);
  const double logits_err = max_rel_error(out.logits.to(Device::cpu()), f.read("logits"));
  EXPECT_LT(logits_err, kLogitsTol);
  const double ref_loss = f.read("loss").item(), loss = out.loss.item();
  EXPECT_NEAR(loss, ref_loss, kLossTol * std::abs(ref_loss));
  out.loss.backward();
  std::printf("golden classification on %s: logits rel err %.2e, loss %.10f vs %.10f\n",
              kGpu.str().c_str(), logits_err, loss, ref_loss);
  check_grads(model, f, "classification");
}

}  // namespace
}  // namespace roformer
