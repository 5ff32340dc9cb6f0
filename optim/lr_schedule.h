// Learning-rate schedules over the whole run (the global step, across
// stages): linear warm-up, then linear, cosine or constant decay, or
// warmup-stable-decay (trapezoidal: hold the peak, then decay over the last
// part with a linear, cosine or 1 - sqrt shape); with an optional per-stage
// peak, per-stage re-warm-up, or a stage's own schedule over its own steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace roformer::optim {

enum class DecayKind { linear, cosine, constant, wsd };
DecayKind parse_decay_kind(const std::string& name);  // throws InputError
std::string decay_kind_name(DecayKind kind);

// The shape of a warmup-stable-decay schedule's decay phase.
enum class DecayShape { linear, cosine, one_minus_sqrt };
DecayShape parse_decay_shape(const std::string& name);  // throws InputError
std::string decay_shape_name(DecayShape shape);

// A schedule's shape, as a multiple of the peak at each step of its span.
struct ScheduleSpec {
  DecayKind kind = DecayKind::linear;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;  // the floor, as a fraction of the peak
  // wsd only: the decay takes the last decay_steps steps of the span if set,
  // else the last decay_fraction of the steps after warm-up.
  DecayShape decay_shape = DecayShape::linear;
  double decay_fraction = 0.2;
  std::optional<int64_t> decay_steps;

  static ScheduleSpec simple(DecayKind kind, int64_t warmup_steps, double min_lr_ratio) {
    ScheduleSpec s;
    s.kind = kind;
    s.warmup_steps = warmup_steps;
    s.min_lr_ratio = min_lr_ratio;
    return s;
  }

  // The factor at `step` of a span of `span` steps (0 <= step; steps past the
  // span keep the final value).
  double factor(int64_t step, int64_t span) const;
};

struct StageLr {
  StageLr(int64_t steps_, std::optional<double> lr_ = {}, std::optional<int64_t> warmup_steps_ = {},
          std::optional<ScheduleSpec> schedule_ = {})
      : steps(steps_), lr(lr_), warmup_steps(warmup_steps_), schedule(schedule_) {}
  int64_t steps = 0;
  std::optional<double> lr;             // this stage's peak, instead of the run's
  std::optional<int64_t> warmup_steps;  // re-warm-up at the stage's start
  // The stage's own schedule over its own steps, instead of its share of the
  // run's schedule (ModernBERT-style stages that each warm up and decay).
  std::optional<ScheduleSpec> schedule;
};

class LrSchedule {
 public:
  LrSchedule(ScheduleSpec run, double peak_lr, std::vector<StageLr> stages);
  // A linear, cosine or constant decay over the whole run.
  LrSchedule(DecayKind kind, double peak_lr, int64_t warmup_steps, double min_lr_ratio,
             std::vector<StageLr> stages);
  // Learning rate for the update at global step `step` (0-based).
  double at(int64_t step) const;
  int64_t total_steps() const { return total_; }

 private:
  ScheduleSpec run_;
  double peak_;
  std::vector<StageLr> stages_;
  int64_t total_ = 0;
};

}  // namespace roformer::optim
