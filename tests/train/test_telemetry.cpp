// Telemetry arithmetic (issue 16): the model FLOPs behind MFU against a
// count worked out by hand, the default device peaks, and token counts as
// the log prints them.
#include <gtest/gtest.h>

#include "train/config.h"
#include "train/metrics.h"
#include "train/telemetry.h"

namespace roformer {
namespace {

TEST(Telemetry, MlmFlopsByHand) {
  ModelConfig m;
  m.vocab_size = 100;
  m.hidden_size = 8;
  m.num_hidden_layers = 2;
  m.intermediate_size = 16;
  m.num_attention_heads = 2;
  // Per layer: Q, K, V, output 4 x 8 x 8 = 256, feed-forward 2 x 8 x 16 = 256.
  // P_layers = 2 x 512 = 1024; attention 12 x 2 x 8 x 32 = 6144 per token.
  // P_head = 8 x 8 + 8 x 100 = 864.
  // 10 tokens, 3 masked: 10 x (6 x 1024 + 6144) + 3 x 6 x 864 = 122880 + 15552.
  EXPECT_DOUBLE_EQ(mlm_training_flops(m, 32, 10, 3), 122880.0 + 15552.0);
  // A factorised embedding adds its projection to the encoder's products.
  m.embedding_size = 4;
  // P_layers = 1024 + 4 x 8 = 1056; P_head = 8 x 4 + 4 x 100 = 432.
  EXPECT_DOUBLE_EQ(mlm_training_flops(m, 32, 10, 3), 10 * (6 * 1056.0 + 6144) + 3 * 6 * 432.0);
}

TEST(Telemetry, TokenStreamsAreCreditedTheirDocumentsKeysOnly) {
  // Two rows: one document of 6 tokens; documents of 2 and 4 packed in one.
  // sum(len^2) / tokens = (36 + 4 + 16) / 12.
  EXPECT_DOUBLE_EQ(token_stream_keys({{6}, {2, 4}}), 56.0 / 12.0);
  EXPECT_DOUBLE_EQ(token_stream_keys({{5}, {5}}), 5.0);  // full rows: the row length
  EXPECT_EQ(token_stream_keys({}), 0.0);
  ModelConfig m;
  m.hidden_size = 8;
  m.num_hidden_layers = 2;
  m.intermediate_size = 16;
  // The attention term shrinks with the keys; the rest does not.
  const double padded = mlm_training_flops(m, 8, 12, 3);
  const double stream = mlm_training_flops(m, token_stream_keys({{6}, {2, 4}}), 12, 3);
  EXPECT_DOUBLE_EQ(padded - stream, 12 * 12 * 2 * 8 * (8 - 56.0 / 12.0));
}

TEST(Telemetry, PeakIsTheConfigValueOrADeviceDefault) {
  Config c;
  c.log.peak_tflops = 123.5;
  EXPECT_EQ(peak_tflops(c, 8), 123.5);
  c.log.peak_tflops = 0;
  c.run.device = Device::cuda();
  c.run.precision = Precision::kBf16;
  EXPECT_EQ(peak_tflops(c, 8), 989.0);
  c.run.precision = Precision::kF32;
  EXPECT_EQ(peak_tflops(c, 8), 67.0);
  c.run.device = Device::cpu();
  // 2 cores x (32 or 64) FLOPs a cycle x 2.5 GHz.
  const double cpu = peak_tflops(c, 2);
  EXPECT_TRUE(cpu == 2 * 32 * 2.5e-3 || cpu == 2 * 64 * 2.5e-3) << cpu;
  c.run.precision = Precision::kBf16;
  EXPECT_DOUBLE_EQ(peak_tflops(c, 2), 2 * cpu);
}

TEST(Telemetry, TokenCountsReadShort) {
  EXPECT_EQ(format_count(950), "950");
  EXPECT_EQ(format_count(1024), "1.02k");
  EXPECT_EQ(format_count(2.5e9), "2.5G");
  EXPECT_EQ(format_count(123456789), "123M");
  EXPECT_EQ(format_count(1.7e12), "1.7T");
}

}  // namespace
}  // namespace roformer
