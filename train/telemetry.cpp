#include "train/telemetry.h"

namespace roformer {

double mlm_training_flops(const ModelConfig& m, double keys, int64_t tokens, int64_t masked) {
  const double d = double(m.hidden_size), ff = double(m.intermediate_size);
  const double e = double(m.embedding_dim()), layers = double(m.num_hidden_layers);
  double p_layers = layers * (4 * d * d + 2 * d * ff);
  if (m.embedding_dim() != m.hidden_size) p_layers += e * d;  // embeddings_project
  const double p_head = d * e + e * double(m.vocab_size);
  const double attention = 12 * layers * d * keys;
  return double(tokens) * (6 * p_layers + attention) + double(masked) * 6 * p_head;
}

double token_stream_keys(const std::vector<std::vector<int64_t>>& rows) {
  double pairs = 0, tokens = 0;
  for (const auto& row : rows)
    for (const int64_t len : row) {
      pairs += double(len) * double(len);
      tokens += double(len);
    }
  return tokens > 0 ? pairs / tokens : 0.0;
}

double peak_tflops(const Config& c, int threads) {
  if (c.log.peak_tflops > 0) return c.log.peak_tflops;
  if (c.run.device.is_cuda()) return c.run.precision == Precision::kBf16 ? 989.0 : 67.0;
  double per_cycle = 32;  // 2 FMA units x 8 f32 lanes x 2
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx512f")) per_cycle = 64;
#endif
  // bf16 dot products (AVX512-BF16) do twice the f32 multiply-adds a cycle.
  if (c.run.precision == Precision::kBf16) per_cycle *= 2;
  return double(threads) * per_cycle * 2.5e9 / 1e12;
}

}  // namespace roformer
