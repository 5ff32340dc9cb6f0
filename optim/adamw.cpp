#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "core/precision.h"
#include "optim/device_passes.h"

namespace roformer::optim {

bool decays_by_default(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".bias") || name == "cls.predictions.bias") return false;
  if (name.find("LayerNorm") != std::string::npos) return false;
  return true;
}

namespace {
std::vector<Tensor> tensors_of(const std::vector<NamedParameter>& params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const NamedParameter& p : params) out.push_back(p.tensor);
  return out;
}
}  // namespace

std::vector<int64_t> AdamW::shard_bounds(int64_t padded_numel, int count) {
  RF_CHECK(count > 0 && padded_numel >= 0, "AdamW::shard_bounds: ", count, " shares of ",
           padded_numel);
  const int64_t a = kShardAlignment;
  const int64_t per = ((padded_numel + count - 1) / count + a - 1) / a * a;
  std::vector<int64_t> bounds;
  for (int r = 0; r <= count; ++r) bounds.push_back(std::min(padded_numel, per * r));
  return bounds;
}

AdamW::AdamW(std::vector<NamedParameter> params, AdamWOptions options, MomentShard shard)
    : params_(std::move(params)), options_(options), shard_(shard) {
  RF_CHECK(shard.count > 0 && shard.index >= 0 && shard.index < shard.count, "AdamW: shard ",
           shard.index, " of ", shard.count);
  for (const NamedParameter& p : params_) {
    if (!p.tensor.defined() || p.tensor.dtype() != DType::f32 || !p.tensor.is_contiguous())
      throw Error("AdamW: parameter '" + p.name + "' must be a contiguous f32 tensor, got " +
                  p.tensor.desc());
  }
  const std::vector<Tensor> tensors = tensors_of(params_);
  flat_ = FlatParameters::of(tensors);
  if (!flat_) {
    for (const NamedParameter& p : params_)
      if (FlatParameters::owner_of(p.tensor))
        throw Error("AdamW: parameter '" + p.name +
                    "' is part of a flat set that is not exactly the given parameters in its "
                    "order; pass the flattened module's named_parameters()");
    flat_ = FlatParameters::create(tensors);
  }
  if (sharded() && !flat_->device().is_cpu())
    throw InputError("AdamW: sharded moments (ZeRO-1) need CPU parameters; they are on " +
                     flat_->device().str());
  const std::vector<int64_t> bounds = shard_bounds(flat_->padded_numel(), shard_.count);
  begin_ = bounds[size_t(shard_.index)];
  end_ = bounds[size_t(shard_.index) + 1];
  m_ = Tensor::zeros({end_ - begin_}, DType::f32, flat_->device());
  v_ = Tensor::zeros({end_ - begin_}, DType::f32, flat_->device());
}

const Tensor& AdamW::whole(const Tensor& moment) const {
  if (sharded())
    throw Error(detail::concat("AdamW: the moments are sharded over ", shard_.count,
                               " processes; gather them first (train/distributed/zero.h)"));
  return moment;
}

double AdamW::step(double lr, double grad_scale, bool measure_update) {
  const FlatParameters& flat = *flat_;
  ++step_;
  const double bc1 = 1.0 - std::pow(options_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(options_.beta2, double(step_));
  const float b1 = float(options_.beta1), b2 = float(options_.beta2);
  const float step_size = float(lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float eps = float(options_.eps), scale = float(grad_scale);
  const float decay_factor = float(1.0 - lr * options_.weight_decay);

  // The parameters that have a gradient, as runs of one decay setting. A run
  // may cross the zero padding between slices: zeros stay zero there.
  std::vector<device_passes::Run> spans;
  for (size_t i = 0; i < flat.size(); ++i) {
    if (!flat.has_grad(i)) continue;
    const int64_t begin = flat.offset(i), end = begin + flat.numel(i);
    const bool decay = params_[i].decay;
    if (!spans.empty() && spans.back().decay == decay &&
        (spans.back().end + FlatParameters::kAlignment - 1) / FlatParameters::kAlignment *
                FlatParameters::kAlignment ==
            begin) {
      spans.back().end = end;
    } else {
      spans.push_back({begin, end, decay});
    }
  }

  if (!flat.device().is_cpu()) {
    // The same pass as one fused kernel on the device (optim/device_passes.h).
    // Under bf16 products the same pass writes the bf16 weights the next
    // forward reads (core/precision.h): no separate cast per weight.
    if (matmul_dtype() != DType::bf16)
      working_bf16_ = Tensor();
    else if (!working_bf16_.defined())
      working_bf16_ = Tensor::empty({flat.padded_numel()}, DType::bf16, flat.device());
    double update_sq = std::numeric_limits<double>::quiet_NaN();
    device_passes::adamw(flat.data(), flat.grad(), m_, v_, spans,
                         {b1, b2, eps, step_size, bc2_sqrt, scale, decay_factor}, working_bf16_,
                         measure_update ? &update_sq : nullptr);
    if (working_bf16_.defined()) set_bf16_working_copy(flat.data(), working_bf16_);
    return update_sq;
  }

  float* p = flat.data().data_as<float>();
  const float* g = flat.grad().data_as<float>();
  // Indexed in flat coordinates: element j's moments are m[j], v[j].
  float* m = m_.data_as<float>() - begin_;
  float* v = v_.data_as<float>() - begin_;
  // Fixed-size chunks of this shard of the flat buffers in parallel, each
  // walking the runs it overlaps: one pass, balanced whatever the parameter sizes.
  constexpr int64_t kChunk = 32768;
  const int64_t chunks = (end_ - begin_ + kChunk - 1) / kChunk;
  // With measure_update: each chunk's sum of squared changes, summed in chunk
  // order afterwards (the same for any thread count).
  std::vector<double> chunk_update_sq(measure_update ? size_t(chunks) : 0, 0.0);
  auto update_range = [&](auto measure, int64_t begin, int64_t end, float decay) {
    double sq = 0.0;
    // The same order of operations as torch.optim.AdamW (decay, moments, update).
#pragma omp simd reduction(+ : sq)
    for (int64_t j = begin; j < end; ++j) {
      const float before = p[j];
      const float gj = g[j] * scale;
      float pj = before * decay;
      m[j] = b1 * m[j] + (1.0f - b1) * gj;
      v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
      pj -= step_size * m[j] / (std::sqrt(v[j]) / bc2_sqrt + eps);
      p[j] = pj;
      if constexpr (decltype(measure)::value) {
        const double change = double(pj - before);
        sq += change * change;
      }
    }
    return sq;
  };
#pragma omp parallel for schedule(static) if (chunks > 2)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = begin_ + c * kChunk, hi = std::min(end_, lo + kChunk);
    auto it = std::partition_point(spans.begin(), spans.end(),
                                   [lo](const device_passes::Run& s) { return s.end <= lo; });
    for (; it != spans.end() && it->begin < hi; ++it) {
      const int64_t begin = std::max(lo, it->begin), end = std::min(hi, it->end);
      const float decay = it->decay ? decay_factor : 1.0f;
      if (measure_update)
        chunk_update_sq[size_t(c)] += update_range(std::true_type{}, begin, end, decay);
      else
        update_range(std::false_type{}, begin, end, decay);
    }
  }
  flat.data().bump_version();
  if (!measure_update) return std::numeric_limits<double>::quiet_NaN();
  double total = 0.0;
  for (const double sq : chunk_update_sq) total += sq;
  return total;
}

void AdamW::zero_grad() {
  flat_->zero_grad();
}

void AdamW::load_state(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step) {
  const int64_t total = flat_->num_elements();
  if (exp_avg.numel() != total || exp_avg_sq.numel() != total)
    throw InputError(detail::concat("AdamW: saved moments have ", exp_avg.numel(), " and ",
                                    exp_avg_sq.numel(), " elements, the model has ", total));
  if (!sharded()) {
    flat_->unpack(exp_avg.to(DType::f32), m_);
    flat_->unpack(exp_avg_sq.to(DType::f32), v_);
  } else {
    // Through one whole flat buffer, kept only while this share is copied out.
    Tensor whole = Tensor::zeros({flat_->padded_numel()}, DType::f32, flat_->device());
    for (auto [packed, mine] : {std::pair{&exp_avg, &m_}, std::pair{&exp_avg_sq, &v_}}) {
      flat_->unpack(packed->to(DType::f32), whole);
      std::copy_n(whole.data_as<float>() + begin_, end_ - begin_, mine->data_as<float>());
    }
  }
  step_ = step;
}

double global_grad_norm(const std::vector<NamedParameter>& params) {
  if (const auto flat = FlatParameters::of(tensors_of(params))) return grad_norm(*flat);
  double total = 0.0;
  for (const NamedParameter& p : params) {
    const Tensor g = p.tensor.grad();
    if (!g.defined()) continue;
    total += sum_of_squares(g.to(DType::f32).contiguous());
  }
  return std::sqrt(total);
}

}  // namespace roformer::optim
