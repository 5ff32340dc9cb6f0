#include "optim/adamw.h"

#include <cmath>

#include "core/autograd.h"

namespace roformer::optim {

bool decays_by_default(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".bias") || name == "cls.predictions.bias") return false;
  if (name.find("LayerNorm") != std::string::npos) return false;
  return true;
}

AdamW::AdamW(std::vector<NamedParameter> params, AdamWOptions options)
    : params_(std::move(params)), options_(options) {
  for (const NamedParameter& p : params_) {
    if (p.tensor.dtype() != DType::f32 || !p.tensor.is_contiguous())
      throw Error("AdamW: parameter '" + p.name + "' must be a contiguous f32 tensor, got " +
                  p.tensor.desc());
    offsets_.push_back(total_);
    total_ += p.tensor.numel();
  }
  m_ = Tensor::zeros({total_}, DType::f32);
  v_ = Tensor::zeros({total_}, DType::f32);
}

void AdamW::step(double lr, double grad_scale) {
  ++step_;
  const double bc1 = 1.0 - std::pow(options_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(options_.beta2, double(step_));
  const float b1 = float(options_.beta1), b2 = float(options_.beta2);
  const float step_size = float(lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float eps = float(options_.eps), scale = float(grad_scale);
  float* m = m_.data_as<float>();
  float* v = v_.data_as<float>();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& param = params_[i].tensor;
    const Tensor grad_tensor = param.grad();
    if (!grad_tensor.defined()) continue;
    const Tensor g_c = grad_tensor.dtype() == DType::f32 ? grad_tensor.contiguous()
                                                         : grad_tensor.to(DType::f32).contiguous();
    const float* g = g_c.data_as<float>();
    float* p = param.data_as<float>();
    float* mi = m + offsets_[i];
    float* vi = v + offsets_[i];
    const float decay = params_[i].decay ? float(1.0 - lr * options_.weight_decay) : 1.0f;
    const int64_t n = param.numel();
    // The same order of operations as torch.optim.AdamW (decay, moments, update).
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) {
      const float gj = g[j] * scale;
      p[j] *= decay;
      mi[j] = b1 * mi[j] + (1.0f - b1) * gj;
      vi[j] = b2 * vi[j] + (1.0f - b2) * gj * gj;
      p[j] -= step_size * mi[j] / (std::sqrt(vi[j]) / bc2_sqrt + eps);
    }
    param.bump_version();
  }
}

void AdamW::zero_grad() {
  for (NamedParameter& p : params_) p.tensor.zero_grad();
}

void AdamW::load_state(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step) {
  if (exp_avg.numel() != total_ || exp_avg_sq.numel() != total_)
    throw InputError(detail::concat("AdamW: saved moments have ", exp_avg.numel(), " and ",
                                    exp_avg_sq.numel(), " elements, the model has ", total_));
  m_.copy_(exp_avg.to(DType::f32).reshape({total_}));
  v_.copy_(exp_avg_sq.to(DType::f32).reshape({total_}));
  step_ = step;
}

double global_grad_norm(const std::vector<NamedParameter>& params) {
  double total = 0.0;
  for (const NamedParameter& p : params) {
    const Tensor g = p.tensor.grad();
    if (!g.defined()) continue;
    const Tensor gc = g.dtype() == DType::f32 ? g.contiguous() : g.to(DType::f32).contiguous();
    const float* d = gc.data_as<float>();
    const int64_t n = gc.numel();
    double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) sum += double(d[j]) * double(d[j]);
    total += sum;
  }
  return std::sqrt(total);
}

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0;
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace roformer::optim
