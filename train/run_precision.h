// run.precision for one command: f32, or bf16 mixed precision (the matrix
// products of linear, matmul and attention in bf16 with f32 accumulation;
// parameters, gradients, optimizer state, layer norm, softmax and the loss in
// f32; see core/precision.h and docs/performance/cpu.md). Checkpoints hold f32
// parameters whatever the precision, so a run may resume in the other one.
#pragma once

#include <optional>

#include "core/precision.h"
#include "train/config.h"

namespace roformer {

// Sets the matrix-product precision of `config.run.precision` for its
// lifetime. bf16 on the CPU needs bf16 dot products (AVX512-BF16 or
// AMX-BF16): otherwise it throws InputError naming run.precision and what is
// missing (no silent fallback to f32). CUDA devices always take bf16.
class RunPrecision {
 public:
  explicit RunPrecision(const Config& config);

 private:
  std::optional<MatmulPrecisionScope> scope_;
};

}  // namespace roformer
