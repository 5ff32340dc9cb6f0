// AdamW (Loshchilov & Hutter) with decoupled weight decay and bias correction,
// updating every parameter in one fused pass: the moments live in two flat f32
// buffers, and the gradient-clipping scale is folded into the same pass.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace roformer::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
};

struct NamedParameter {
  std::string name;
  Tensor tensor;
  bool decay = true;  // false for biases and LayerNorm parameters by default
};

// The usual rule: no decay for biases and LayerNorm weights.
bool decays_by_default(const std::string& name);

class AdamW {
 public:
  AdamW(std::vector<NamedParameter> params, AdamWOptions options);

  // One update with learning rate `lr`; every gradient is multiplied by
  // `grad_scale` first (global-norm clipping). Parameters without a gradient
  // are left untouched, as torch.optim.AdamW does.
  void step(double lr, double grad_scale = 1.0);
  void zero_grad();

  int64_t step_count() const { return step_; }
  const std::vector<NamedParameter>& parameters() const { return params_; }
  // Flat moment buffers (f32, the parameters' elements in order) and the step,
  // for checkpoints.
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  void load_state(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step);
  int64_t num_elements() const { return total_; }

 private:
  std::vector<NamedParameter> params_;
  std::vector<int64_t> offsets_;  // start of each parameter in the flat buffers
  int64_t total_ = 0;
  AdamWOptions options_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

// sqrt(sum of squares) over all gradients (double accumulation); parameters
// without a gradient count as zero. NaN/inf propagate so callers can skip.
double global_grad_norm(const std::vector<NamedParameter>& params);

// The factor clipping multiplies gradients by: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm <= 0 (clipping off).
double clip_scale(double norm, double max_norm);

}  // namespace roformer::optim
