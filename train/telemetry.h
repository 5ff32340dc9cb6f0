// What the training log reports besides loss and accuracy: model FLOPs (for
// MFU, model FLOPs utilisation) and the device peak they are measured
// against. docs/pretraining.md, "Telemetry", gives the formula.
#pragma once

#include <cstdint>
#include <vector>

#include "layers/model_config.h"
#include "train/config.h"

namespace roformer {

// FLOPs of one MLM forward + backward (3x the forward's multiply-adds x 2) on
// a micro-batch holding `tokens` real tokens of which `masked` are predicted:
//   tokens x (6 x P_layers + 12 x layers x hidden x keys) + masked x 6 x P_head
// P_layers: the weights of the encoder's matrix products (Q, K, V, output,
// the two feed-forward matrices, and the embedding projection if any);
// P_head: the LM head's transform and decoder. Embedding lookups, norms,
// softmax and element-wise work are left out, as is usual for MFU.
// keys: the keys each token's query attends, on average: the row length for
// padded rows; for a token stream sum(len^2) / tokens over its documents
// (token_stream_keys), so unpadded steps are not credited with padding.
double mlm_training_flops(const ModelConfig& model, double keys, int64_t tokens, int64_t masked);

// The mean keys per token of documents of these lengths: sum(len^2) / sum(len).
double token_stream_keys(const std::vector<std::vector<int64_t>>& rows);

// The device's peak in TFLOP/s: log.peak_tflops when set, else a default for
// run.device and run.precision (CPU: cores x FLOPs/cycle x 2.5 GHz with
// FLOPs/cycle 64 with AVX-512, 32 with AVX2 FMA, twice that in bf16; CUDA:
// an H100 SXM's dense 989 TFLOP/s in bf16, 67 in f32).
double peak_tflops(const Config& config, int threads);

}  // namespace roformer
