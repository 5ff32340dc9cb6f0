// The unpadded (token-stream) model against the padded one: the same hidden
// states on the real tokens, the same MLM and classification losses and
// gradients, dropout included (the masks are keyed by (row, position) in both
// layouts); packed documents equal the same documents in rows of their own.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"
#include "layers/roformer.h"
#include "layers/token_layout.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

ModelConfig config_with(PositionEncoding position, bool rotary_value) {
  ModelConfig c;
  c.vocab_size = 61;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 40;
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.2;
  c.position = position;
  c.rotary_value = rotary_value;
  return c;
}

// Rows of the given lengths: ids, types and labels, padded to S and unpadded.
struct Batch {
  int64_t B, S, T = 0;
  std::vector<int64_t> lengths;
  std::vector<int32_t> ids, types, mask, labels;  // [B, S]
  std::vector<int32_t> s_ids, s_types, s_labels;  // [T]
  std::vector<int64_t> real;                      // flat padded index of each token
  Batch(std::vector<int64_t> lens, int64_t S_) : B(int64_t(lens.size())), S(S_), lengths(lens) {
    ids.assign(size_t(B * S), 0);
    types.assign(size_t(B * S), 0);
    mask.assign(size_t(B * S), 0);
    labels.assign(size_t(B * S), -100);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < lengths[size_t(b)]; ++s) {
        const size_t i = size_t(b * S + s);
        ids[i] = int32_t(1 + (b * 7 + s * 3) % 60);
        types[i] = s > lengths[size_t(b)] / 2 ? 1 : 0;
        mask[i] = 1;
        labels[i] = (s % 3 == 1) ? int32_t((s * 5 + b) % 61) : -100;
        s_ids.push_back(ids[i]);
        s_types.push_back(types[i]);
        s_labels.push_back(labels[i]);
        real.push_back(int64_t(i));
        ++T;
      }
  }
  Tensor padded(const std::vector<int32_t>& v) const { return Tensor::from_vector(v, {B, S}); }
  Tensor stream(const std::vector<int32_t>& v) const { return Tensor::from_vector(v, {T}); }
};

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  EXPECT_EQ(va.size(), vb.size());
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

class TokenStreamModel : public ::testing::TestWithParam<std::tuple<PositionEncoding, bool>> {};

TEST_P(TokenStreamModel, UnpaddedEqualsPaddedOnRealTokensWithDropout) {
  const auto [position, rotary_value] = GetParam();
  const ModelConfig config = config_with(position, rotary_value);
  const Batch batch({9, 3, 14, 1}, 16);
  const TokenLayout layout = TokenLayout::of_lengths(batch.lengths);
  RoFormerForMaskedLM model(config, 17);

  DropoutContext padded_ctx{5, 3, 8};
  const MlmOutput padded =
      model.forward_mlm(batch.padded(batch.ids), batch.padded(batch.types),
                        batch.padded(batch.mask), batch.padded(batch.labels), true, padded_ctx);
  padded.loss.backward();
  const std::vector<NamedTensor> params = model.named_parameters();
  std::vector<Tensor> padded_grads;
  for (const auto& p : params) padded_grads.push_back(p.tensor.grad().clone());
  model.zero_grad();

  DropoutContext stream_ctx{5, 3, 8};
  const MlmOutput unpadded =
      model.forward_mlm(batch.stream(batch.s_ids), batch.stream(batch.s_types), layout,
                        batch.stream(batch.s_labels), true, stream_ctx);
  unpadded.loss.backward();
  EXPECT_EQ(unpadded.num_masked, padded.num_masked);
  EXPECT_EQ(stream_ctx.next_site, padded_ctx.next_site);
  EXPECT_NEAR(unpadded.loss.item(), padded.loss.item(), 1e-5 * std::abs(padded.loss.item()));
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LT(max_abs_diff(params[i].tensor.grad(), padded_grads[i]), 2e-5) << params[i].name;

  // The hidden states themselves, without dropout.
  DropoutContext unused;
  const Tensor hp = model.roformer().forward(batch.padded(batch.ids), batch.padded(batch.types),
                                             batch.padded(batch.mask), false, unused);
  const Tensor hs = model.roformer().forward(batch.stream(batch.s_ids), batch.stream(batch.s_types),
                                             layout, false, unused);
  const Tensor real = Tensor::from_vector(batch.real, {batch.T});
  EXPECT_LT(max_abs_diff(hs, index_select(hp.reshape({batch.B * batch.S, -1}), real)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Positions, TokenStreamModel,
                         ::testing::Values(std::make_tuple(PositionEncoding::kRope, false),
                                           std::make_tuple(PositionEncoding::kRope, true),
                                           std::make_tuple(PositionEncoding::kAbsolute, false)));

// With attention_kernel fused_rope (and auto on CUDA) the token stream takes
// q, k and v from one product that the attention op reads in place
// (stacked_linear, varlen_attention_packed); with separate (and auto on the
// CPU), three products and rope ops. The same loss and gradients, dropout
// included, and two products fewer a layer.
TEST(TokenStreamModel, PackedProjectionsEqualSeparateOnes) {
  const Batch batch({9, 3, 14, 1}, 16);
  const TokenLayout layout = TokenLayout::of_lengths(batch.lengths);
  struct Run {
    double loss = 0;
    std::vector<Tensor> grads;
    uint64_t products = 0;  // matmul kernel calls of the forward
  };
  auto run = [&](AttentionKernel kernel) {
    ModelConfig config = config_with(PositionEncoding::kRope, false);
    config.attention_kernel = kernel;
    RoFormerForMaskedLM model(config, 17);
    const auto matmul = size_t(kernels::KernelId::matmul);
    const uint64_t before = kernels::kernel_calls_by_id[matmul];
    DropoutContext ctx{5, 3, 8};
    const MlmOutput out = model.forward_mlm(batch.stream(batch.s_ids), batch.stream(batch.s_types),
                                            layout, batch.stream(batch.s_labels), true, ctx);
    Run r;
    r.products = kernels::kernel_calls_by_id[matmul] - before;
    out.loss.backward();
    r.loss = out.loss.item();
    for (const auto& p : model.named_parameters()) r.grads.push_back(p.tensor.grad().clone());
    return r;
  };
  const Run packed = run(AttentionKernel::kFusedRope), separate = run(AttentionKernel::kSeparate);
  EXPECT_EQ(run(AttentionKernel::kAuto).products, separate.products) << "auto on the CPU";
  EXPECT_NEAR(packed.loss, separate.loss, 1e-6 * std::abs(separate.loss));
  ASSERT_EQ(packed.grads.size(), separate.grads.size());
  for (size_t i = 0; i < packed.grads.size(); ++i)
    EXPECT_LT(max_abs_diff(packed.grads[i], separate.grads[i]), 1e-6) << "parameter " << i;
  EXPECT_EQ(separate.products - packed.products, 2u * 2u) << "two layers, two products fewer each";
}

TEST(TokenStreamClassifier, UnpaddedEqualsPaddedLossAndLogits) {
  const ModelConfig config = config_with(PositionEncoding::kRope, false);
  const Batch batch({5, 12, 2}, 12);
  RoFormerForSequenceClassification model(config, 3, 23);
  const Tensor labels = Tensor::from_vector<int64_t>({2, 0, 1}, {3});
  DropoutContext padded_ctx{1, 0, 4};
  const ClassificationOutput padded =
      model.forward(batch.padded(batch.ids), batch.padded(batch.types), batch.padded(batch.mask),
                    labels, true, padded_ctx);
  DropoutContext stream_ctx{1, 0, 4};
  const ClassificationOutput unpadded =
      model.forward(batch.stream(batch.s_ids), batch.stream(batch.s_types),
                    TokenLayout::of_lengths(batch.lengths), labels, true, stream_ctx);
  EXPECT_LT(max_abs_diff(unpadded.logits, padded.logits), 1e-5);
  EXPECT_NEAR(unpadded.loss.item(), padded.loss.item(), 1e-5);
}

TEST(TokenStreamClassifier, PackedDocumentsEqualDocumentsInRowsOfTheirOwn) {
  // Without dropout and with positions restarting, a document's logits do not
  // depend on what shares its row.
  ModelConfig config = config_with(PositionEncoding::kRope, true);
  const Batch batch({4, 6, 3, 5}, 6);
  RoFormerForSequenceClassification model(config, 2, 29);
  DropoutContext unused;
  const ClassificationOutput alone =
      model.forward(batch.stream(batch.s_ids), batch.stream(batch.s_types),
                    TokenLayout::of_lengths(batch.lengths), Tensor(), false, unused);
  const ClassificationOutput packed =
      model.forward(batch.stream(batch.s_ids), batch.stream(batch.s_types),
                    TokenLayout::of_rows({{4, 6}, {3, 5}}, true), Tensor(), false, unused);
  EXPECT_LT(max_abs_diff(packed.logits, alone.logits), 1e-5);
  // Positions running on through the row rotate the values (rotary_value):
  // the second document of each row then differs.
  const ClassificationOutput running =
      model.forward(batch.stream(batch.s_ids), batch.stream(batch.s_types),
                    TokenLayout::of_rows({{4, 6}, {3, 5}}, false), Tensor(), false, unused);
  EXPECT_GT(max_abs_diff(running.logits, alone.logits), 1e-6);
}

TEST(TokenLayout, OffsetsPositionsAndKeys) {
  const TokenLayout l = TokenLayout::of_rows({{2, 3}, {1}}, false);
  EXPECT_EQ(l.num_tokens, 6);
  EXPECT_EQ(l.row_starts, (std::vector<int64_t>{0, 5, 6}));
  EXPECT_EQ(l.document_starts, (std::vector<int64_t>{0, 2, 5, 6}));
  EXPECT_EQ(l.segments.to_vector<int64_t>(),
            (std::vector<int64_t>{0, 2, 0, 0, 2, 3, 0, 2, 5, 1, 1, 0}));
  EXPECT_EQ(l.positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(TokenLayout::of_rows({{2, 3}, {1}}, true).positions.to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(l.tokens.to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 1, 0}));
  EXPECT_NE(testing::error_of([] {
              TokenLayout::of_rows({{2, 0}});
            }).find("row 0 has a document of length 0"),
            std::string::npos);
}

// with_tensors moves every tensor but keeps the host segment table, whose
// moved copy becomes device_segments (what the attention kernels read).
TEST(TokenLayout, WithTensorsKeepsTheHostSegmentTable) {
  const TokenLayout l = TokenLayout::of_rows({{2, 3}, {1}}, false);
  int moved = 0;
  const TokenLayout m = l.with_tensors([&](const Tensor& t) {
    ++moved;
    return t.to(DType::f64);  // a visible stand-in for an upload
  });
  EXPECT_EQ(moved, 4);
  EXPECT_EQ(m.segments.dtype(), DType::i64);
  EXPECT_EQ(m.segments.to_vector<int64_t>(), l.segments.to_vector<int64_t>());
  EXPECT_EQ(m.device_segments.dtype(), DType::f64);
  for (const Tensor* t : {&m.positions, &m.tokens, &m.document_firsts})
    EXPECT_EQ(t->dtype(), DType::f64);
  EXPECT_FALSE(l.device_segments.defined());
}

// The hidden dropout inside the residual layer norms (dropout_add_layer_norm)
// against the dropout op then add_layer_norm: the same loss and gradients bit
// for bit, padded and token streams, in f32 and in bf16 with bf16
// activations (the layer norm then drops a bf16 x on the f32 residual).
TEST(TokenStreamModel, FusedResidualDropoutChangesNoBit) {
  const Batch batch({9, 3, 14, 1}, 16);
  const TokenLayout layout = TokenLayout::of_lengths(batch.lengths);
  const ModelConfig config = config_with(PositionEncoding::kRope, false);
  RoFormerForMaskedLM model(config, 17);
  const std::vector<NamedTensor> params = model.named_parameters();
  // The loss, every gradient, and the dropout kernels the step called.
  struct Run {
    std::vector<std::vector<double>> values;
    uint64_t dropout_calls = 0;
  };
  const auto dropout_calls = [] {
    using kernels::KernelId;
    return kernels::kernel_calls_by_id[size_t(KernelId::dropout)] +
           kernels::kernel_calls_by_id[size_t(KernelId::dropout_tokens)];
  };
  auto run = [&](bool fused, bool stream) {
    const FusedResidualDropoutScope scope(fused);
    DropoutContext ctx{5, 3, 8};
    Run r;
    const uint64_t before = dropout_calls();
    const MlmOutput out =
        stream ? model.forward_mlm(batch.stream(batch.s_ids), batch.stream(batch.s_types), layout,
                                   batch.stream(batch.s_labels), true, ctx)
               : model.forward_mlm(batch.padded(batch.ids), batch.padded(batch.types),
                                   batch.padded(batch.mask), batch.padded(batch.labels), true, ctx);
    out.loss.backward();
    r.dropout_calls = dropout_calls() - before;
    r.values.push_back({out.loss.item()});
    for (const auto& p : params) r.values.push_back(p.tensor.grad().to_vector<double>());
    model.zero_grad();
    return r;
  };
  for (const bool bf16 : {false, true}) {
    if (bf16 && !cpu_has_native_bf16())
      GTEST_SKIP() << "f32 checked; bf16 needs a CPU with native bf16 (oneDNN would emulate it)";
    const MatmulPrecisionScope precision(bf16 ? DType::bf16 : DType::f32);
    for (const bool stream : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "f32") + (stream ? ", token stream" : ", padded"));
      const Run fused = run(true, stream), pair = run(false, stream);
      EXPECT_EQ(fused.values, pair.values);
      // Two residual blocks a layer, forward and backward, ran no dropout
      // kernel when fused (the embeddings' dropout still does, once each way).
      EXPECT_EQ(pair.dropout_calls - fused.dropout_calls, uint64_t(4 * config.num_hidden_layers));
    }
  }
}

// The op reads the table it is given where the model runs; one that is not
// the host table's twin is refused by name.
TEST(TokenLayout, AttentionChecksTheDeviceSegmentTable) {
  const TokenLayout l = TokenLayout::of_rows({{2, 3}, {1}}, true).to(Device::cpu());
  ASSERT_TRUE(l.device_segments.defined());
  Generator gen{3, 0};
  const Tensor q = Tensor::randn({6, 2, 4}, gen), k = Tensor::randn({6, 2, 4}, gen),
               v = Tensor::randn({6, 2, 4}, gen);
  DropoutContext ctx;
  const Tensor with =
      varlen_attention(q, k, v, l.segments, 0.0, false, ctx, 0.5, l.device_segments);
  const Tensor without = varlen_attention(q, k, v, l.segments, 0.0, false, ctx, 0.5);
  EXPECT_EQ(with.to_vector<double>(), without.to_vector<double>());
  const std::string msg = testing::error_of([&] {
    varlen_attention(q, k, v, l.segments, 0.0, false, ctx, 0.5, l.segments.narrow(0, 0, 2));
  });
  EXPECT_NE(msg.find("segments_on_device"), std::string::npos) << msg;
}

}  // namespace
}  // namespace roformer
