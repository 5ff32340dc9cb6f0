// A synthetic MLM micro-batch for the model benchmarks (model_bench,
// bench/gpu/mlm_step_bench): random token ids, two segments per row, and
// exactly round(mask_prob x tokens) labelled rows picked by a Philox shuffle,
// so a benchmark's head always works on the same number of rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace roformer::bench {

struct MlmBatch {
  Tensor ids, types, mask, labels;  // [B, S] i32 on the host; labels -100 where not predicted
  int64_t masked = 0;               // labelled rows
};

inline MlmBatch synthetic_mlm_batch(int64_t B, int64_t S, int64_t vocab, double mask_prob,
                                    uint64_t seed = 42) {
  const int64_t N = B * S;
  Generator data{seed, 0};
  std::vector<int32_t> ids(static_cast<size_t>(N)), types(static_cast<size_t>(N));
  std::vector<int32_t> labels(static_cast<size_t>(N), -100);
  const auto u = Tensor::rand({N, 3}, data, DType::f64).to_vector<double>();
  for (int64_t i = 0; i < N; ++i) {
    ids[size_t(i)] = int32_t(1 + int64_t(u[size_t(3 * i)] * double(vocab - 1)));
    types[size_t(i)] = (i % S) >= S / 2;
  }
  std::vector<int64_t> order(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return u[size_t(3 * a + 1)] < u[size_t(3 * b + 1)]; });
  MlmBatch batch;
  batch.masked = std::max<int64_t>(1, int64_t(mask_prob * double(N) + 0.5));
  for (int64_t i = 0; i < batch.masked; ++i)
    labels[size_t(order[size_t(i)])] =
        int32_t(1 + int64_t(u[size_t(3 * order[size_t(i)] + 2)] * double(vocab - 1)));
  batch.ids = Tensor::from_vector(ids, {B, S});
  batch.types = Tensor::from_vector(types, {B, S});
  batch.mask = Tensor::ones({B, S}, DType::i32);
  batch.labels = Tensor::from_vector(labels, {B, S});
  return batch;
}

}  // namespace roformer::bench
