#include "train/run_precision.h"

#include <spdlog/spdlog.h>

namespace roformer {

RunPrecision::RunPrecision(const Config& config) {
  if (config.run.precision != Precision::kBf16) return;
  const std::string key = config.source + ": run.precision";
  // GPUs multiply bf16 natively (cuBLASLt); a CPU must have the instructions.
  if (config.run.device.is_cpu()) require_native_bf16(key);
  scope_.emplace(DType::bf16);
  spdlog::info(
      "run.precision bf16: matrix products in bf16 with f32 accumulation, bf16 activations "
      "between them, an f32 residual stream");
}

}  // namespace roformer
