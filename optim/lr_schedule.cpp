#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace roformer::optim {

DecayKind parse_decay_kind(const std::string& name) {
  if (name == "linear") return DecayKind::linear;
  if (name == "cosine") return DecayKind::cosine;
  if (name == "constant") return DecayKind::constant;
  if (name == "wsd") return DecayKind::wsd;
  throw InputError("unknown learning-rate schedule '" + name +
                   "' (expected linear, cosine, constant or wsd)");
}

std::string decay_kind_name(DecayKind kind) {
  switch (kind) {
    case DecayKind::linear:
      return "linear";
    case DecayKind::cosine:
      return "cosine";
    case DecayKind::constant:
      return "constant";
    case DecayKind::wsd:
      return "wsd";
  }
  return "?";
}

DecayShape parse_decay_shape(const std::string& name) {
  if (name == "linear") return DecayShape::linear;
  if (name == "cosine") return DecayShape::cosine;
  if (name == "1-sqrt") return DecayShape::one_minus_sqrt;
  throw InputError("unknown decay shape '" + name + "' (expected linear, cosine or 1-sqrt)");
}

std::string decay_shape_name(DecayShape shape) {
  switch (shape) {
    case DecayShape::linear:
      return "linear";
    case DecayShape::cosine:
      return "cosine";
    case DecayShape::one_minus_sqrt:
      return "1-sqrt";
  }
  return "?";
}

namespace {
// 1 -> floor as progress goes 0 -> 1.
double decayed(DecayShape shape, double progress, double floor) {
  progress = std::clamp(progress, 0.0, 1.0);
  switch (shape) {
    case DecayShape::linear:
      return 1.0 - (1.0 - floor) * progress;
    case DecayShape::cosine:
      return floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
    case DecayShape::one_minus_sqrt:
      return 1.0 - (1.0 - floor) * std::sqrt(progress);
  }
  return 1.0;
}
}  // namespace

double ScheduleSpec::factor(int64_t step, int64_t span) const {
  if (step < warmup_steps) return double(step + 1) / double(warmup_steps);
  const int64_t after = std::max<int64_t>(span - warmup_steps, 1);
  const double t = double(step - warmup_steps);
  switch (kind) {
    case DecayKind::constant:
      return 1.0;
    case DecayKind::linear:
      return decayed(DecayShape::linear, t / double(after), min_lr_ratio);
    case DecayKind::cosine:
      return decayed(DecayShape::cosine, t / double(after), min_lr_ratio);
    case DecayKind::wsd: {
      const int64_t decay = std::clamp<int64_t>(
          decay_steps ? *decay_steps : int64_t(std::llround(decay_fraction * double(after))), 1,
          after);
      const double stable = double(after - decay);
      if (t < stable) return 1.0;
      // The first decay step is already below the peak; the last reaches the floor.
      return decayed(decay_shape, (t - stable + 1.0) / double(decay), min_lr_ratio);
    }
  }
  return 1.0;
}

LrSchedule::LrSchedule(ScheduleSpec run, double peak_lr, std::vector<StageLr> stages)
    : run_(run), peak_(peak_lr), stages_(std::move(stages)) {
  for (const StageLr& s : stages_) total_ += s.steps;
}

LrSchedule::LrSchedule(DecayKind kind, double peak_lr, int64_t warmup_steps, double min_lr_ratio,
                       std::vector<StageLr> stages)
    : LrSchedule(ScheduleSpec::simple(kind, warmup_steps, min_lr_ratio), peak_lr,
                 std::move(stages)) {}

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
  const int64_t in_stage = step - stage_start;
  // A stage with its own schedule runs it over its own steps.
  if (stage && stage->schedule) return peak * stage->schedule->factor(in_stage, stage->steps);
  double factor = run_.factor(step, total_);
  // A stage's own warm-up ramps its first steps up again.
  if (stage && stage->warmup_steps && in_stage < *stage->warmup_steps)
    factor *= double(in_stage + 1) / double(*stage->warmup_steps);
  return peak * factor;
}

}  // namespace roformer::optim
