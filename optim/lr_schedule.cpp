#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace roformer::optim {

DecayKind parse_decay_kind(const std::string& name) {
  if (name == "linear") return DecayKind::linear;
  if (name == "cosine") return DecayKind::cosine;
  if (name == "constant") return DecayKind::constant;
  throw InputError("unknown learning-rate schedule '" + name +
                   "' (expected linear, cosine or constant)");
}

LrSchedule::LrSchedule(DecayKind kind, double peak_lr, int64_t warmup_steps, double min_lr_ratio,
                       std::vector<StageLr> stages)
    : kind_(kind),
      peak_(peak_lr),
      warmup_(warmup_steps),
      min_ratio_(min_lr_ratio),
      stages_(std::move(stages)) {
  for (const StageLr& s : stages_) total_ += s.steps;
}

double LrSchedule::at(int64_t step) const {
  // The stage the step falls in (the last stage also takes any step past the end).
  const StageLr* stage = nullptr;
  int64_t stage_start = 0;
  for (const StageLr& s : stages_) {
    stage = &s;
    if (step < stage_start + s.steps) break;
    if (&s != &stages_.back()) stage_start += s.steps;
  }
  const double peak = stage && stage->lr ? *stage->lr : peak_;

  double factor = 1.0;
  if (step < warmup_) {
    factor = double(step + 1) / double(warmup_);
  } else if (kind_ != DecayKind::constant) {
    const double span = double(std::max<int64_t>(total_ - warmup_, 1));
    const double progress = std::clamp(double(step - warmup_) / span, 0.0, 1.0);
    factor = kind_ == DecayKind::linear
                 ? 1.0 - (1.0 - min_ratio_) * progress
                 : min_ratio_ + (1.0 - min_ratio_) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  // A stage's own warm-up ramps its first steps up again.
  const int64_t in_stage = step - stage_start;
  if (stage && stage->warmup_steps && in_stage < *stage->warmup_steps)
    factor *= double(in_stage + 1) / double(*stage->warmup_steps);
  return peak * factor;
}

}  // namespace roformer::optim
