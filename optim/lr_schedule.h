// Learning-rate schedules over the whole run (the global step, across
// stages): linear warm-up, then linear, cosine or constant decay, with an
// optional per-stage peak learning rate and per-stage re-warm-up.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace roformer::optim {

enum class DecayKind { linear, cosine, constant };
DecayKind parse_decay_kind(const std::string& name);  // throws InputError

struct StageLr {
  int64_t steps = 0;
  std::optional<double> lr;             // this stage's peak, instead of the run's
  std::optional<int64_t> warmup_steps;  // re-warm-up at the stage's start
};

class LrSchedule {
 public:
  LrSchedule(DecayKind kind, double peak_lr, int64_t warmup_steps, double min_lr_ratio,
             std::vector<StageLr> stages);
  // Learning rate for the update at global step `step` (0-based).
  double at(int64_t step) const;
  int64_t total_steps() const { return total_; }

 private:
  DecayKind kind_;
  double peak_;
  int64_t warmup_;
  double min_ratio_;
  std::vector<StageLr> stages_;
  int64_t total_ = 0;
};

}  // namespace roformer::optim
