#include "train/config_stages.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "train/config_schema.h"

namespace roformer {

namespace {

double tokens_per_step(const StageConfig& s) {
  return double(s.batch_size) * double(s.max_seq_len);
}

// Steps that hold `tokens` at `per_step` tokens each, rounded up.
int64_t steps_for(double tokens, double per_step) {
  return int64_t(std::ceil(tokens / per_step - 1e-9));
}

// The stage's own decay length in steps, from decay_tokens.
std::optional<int64_t> decay_steps_of(const StageConfig& s) {
  if (!s.decay_tokens) return std::nullopt;
  return steps_for(*s.decay_tokens, tokens_per_step(s));
}

double nominal_tokens(const std::vector<BatchLevel>& levels, int64_t max_seq_len,
                      int64_t batch_size, int64_t step) {
  double tokens = 0;
  int64_t begin = 0;
  for (const BatchLevel& l : levels) {
    if (step <= begin) return tokens;
    tokens += double(std::min(step, l.end_step) - begin) * double(l.batch) * double(max_seq_len);
    begin = l.end_step;
  }
  if (step > begin) tokens += double(step - begin) * double(batch_size) * double(max_seq_len);
  return tokens;
}

std::string short_number(double v) {
  return fmt::format("{:.4g}", v);
}

}  // namespace

std::vector<BatchLevel> batch_warmup_levels(const StageConfig& s) {
  std::vector<BatchLevel> levels;
  if (!s.batch_warmup_start || !s.batch_warmup_tokens || s.micro_batch_size <= 0) return levels;
  const int64_t start = *s.batch_warmup_start, end = s.batch_size, g = s.micro_batch_size;
  if (start >= end) return levels;
  const int64_t increments = (end - start) / g;
  const int64_t inc = g * ((increments + kMaxBatchLevels - 1) / kMaxBatchLevels);
  std::vector<int64_t> batches;
  for (int64_t b = start; b < end; b += inc) batches.push_back(b);
  // Level j runs until the stage has seen (j + 1) / m of the warm-up tokens.
  const double total = *s.batch_warmup_tokens;
  const double m = double(batches.size());
  double consumed = 0;
  int64_t step = 0;
  for (size_t j = 0; j < batches.size(); ++j) {
    const double target = total * double(j + 1) / m;
    const double per_step = double(batches[j]) * double(s.max_seq_len);
    if (target <= consumed) continue;
    const int64_t n = steps_for(target - consumed, per_step);
    if (n <= 0) continue;
    step += n;
    consumed += double(n) * per_step;
    levels.push_back({step, batches[j]});
  }
  return levels;
}

int64_t ResolvedStage::batch_at(int64_t step) const {
  for (const BatchLevel& l : warm_up)
    if (step < l.end_step) return l.batch;
  return batch_size;
}

double ResolvedStage::tokens_through(int64_t step) const {
  return nominal_tokens(warm_up, max_seq_len, batch_size, step);
}

std::optional<ConfigIssue> derive_stage(StageConfig& s, const OptimConfig& optim) {
  using config_schema::kMaxInteger;
  if (s.micro_batch_size == 0) s.micro_batch_size = s.batch_size;
  if (s.batch_size % s.micro_batch_size != 0)
    return ConfigIssue{
        {"micro_batch_size", "batch_size"},
        fmt::format("{} does not divide batch_size {}", s.micro_batch_size, s.batch_size)};

  // Batch-size warm-up.
  if (s.batch_warmup_start.has_value() != s.batch_warmup_tokens.has_value())
    return ConfigIssue{{s.batch_warmup_start ? "batch_warmup_start" : "batch_warmup_tokens"},
                       "a batch-size warm-up needs both batch_warmup_start and "
                       "batch_warmup_tokens"};
  if (s.batch_warmup_start) {
    if (*s.batch_warmup_start >= s.batch_size)
      return ConfigIssue{{"batch_warmup_start"},
                         fmt::format("{} is not below the stage's batch_size {}",
                                     *s.batch_warmup_start, s.batch_size)};
    if (*s.batch_warmup_start % s.micro_batch_size != 0)
      return ConfigIssue{
          {"batch_warmup_start", "micro_batch_size"},
          fmt::format("{} is not a multiple of micro_batch_size {} (the batch grows by whole "
                      "micro-batches)",
                      *s.batch_warmup_start, s.micro_batch_size)};
  }
  const std::vector<BatchLevel> levels = batch_warmup_levels(s);
  const int64_t warmup_end = levels.empty() ? 0 : levels.back().end_step;
  const double warmup_tokens = nominal_tokens(levels, s.max_seq_len, s.batch_size, warmup_end);

  // Duration: steps, or tokens converted with the stage's batch x length.
  if (s.tokens) {
    int64_t steps = 0;
    if (levels.empty()) {
      const double n = std::ceil(*s.tokens / tokens_per_step(s) - 1e-9);
      if (n > double(kMaxInteger))
        return ConfigIssue{{"tokens"},
                           fmt::format("{} tokens at {} per step are {:.3g} steps, more than {}",
                                       *s.tokens, tokens_per_step(s), n, kMaxInteger)};
      steps = std::max<int64_t>(int64_t(n), 1);
    } else {
      if (*s.tokens <= warmup_tokens)
        return ConfigIssue{{"batch_warmup_tokens", "tokens"},
                           fmt::format("the batch-size warm-up ({} tokens, {} steps) is not "
                                       "shorter than the stage ({} tokens)",
                                       warmup_tokens, warmup_end, *s.tokens)};
      const double rest = std::ceil((*s.tokens - warmup_tokens) / tokens_per_step(s) - 1e-9);
      if (double(warmup_end) + rest > double(kMaxInteger))
        return ConfigIssue{{"tokens"},
                           fmt::format("{} tokens are more than {} steps", *s.tokens, kMaxInteger)};
      steps = warmup_end + int64_t(rest);
    }
    if (s.steps != 0 && s.steps != steps)
      return ConfigIssue{{"steps", "tokens"},
                         fmt::format("give steps or tokens, not both: {} tokens make {} steps at "
                                     "this batch and length, steps says {}",
                                     *s.tokens, steps, s.steps)};
    s.steps = steps;
  } else if (s.steps == 0) {
    return ConfigIssue{{"steps"},
                       "required key is missing: a stage lasts `steps` optimizer steps or "
                       "`tokens` tokens"};
  }
  if (warmup_end >= s.steps && !levels.empty())
    return ConfigIssue{{"batch_warmup_tokens"},
                       fmt::format("the batch-size warm-up takes {} steps, longer than the "
                                   "stage ({} steps)",
                                   warmup_end, s.steps)};

  // Learning-rate keys.
  if (s.warmup_steps && *s.warmup_steps > s.steps)
    return ConfigIssue{{"warmup_steps"},
                       fmt::format("a warm-up of {} steps is longer than the stage ({} steps)",
                                   *s.warmup_steps, s.steps)};
  if (!s.schedule) {
    for (const auto& [set, key] : {std::pair{s.decay_shape.has_value(), "decay_shape"},
                                   {s.decay_fraction.has_value(), "decay_fraction"},
                                   {s.decay_tokens.has_value(), "decay_tokens"},
                                   {s.min_lr_ratio.has_value(), "min_lr_ratio"}})
      if (set)
        return ConfigIssue{{key},
                           "only used by a stage's own schedule: set this stage's schedule "
                           "(e.g. schedule: wsd) too"};
  } else {
    const optim::DecayKind kind = *s.schedule;
    if (s.decay_tokens && s.decay_fraction)
      return ConfigIssue{{"decay_tokens", "decay_fraction"},
                         "give decay_fraction or decay_tokens, not both"};
    if (kind != optim::DecayKind::wsd && (s.decay_tokens || s.decay_fraction || s.decay_shape))
      return ConfigIssue{{s.decay_tokens     ? "decay_tokens"
                          : s.decay_fraction ? "decay_fraction"
                                             : "decay_shape",
                          "schedule"},
                         fmt::format("only used by schedule: wsd (this stage's schedule is {})",
                                     optim::decay_kind_name(kind))};
    const int64_t after = s.steps - s.warmup_steps.value_or(0);
    if (auto d = decay_steps_of(s); d && *d > after)
      return ConfigIssue{{"decay_tokens"},
                         fmt::format("{} tokens are {} steps of decay, more than the {} steps the "
                                     "stage has after its warm-up",
                                     *s.decay_tokens, *d, after)};
  }
  (void)optim;
  return std::nullopt;
}

ResolvedStage resolve_stage(const Config& c, size_t index) {
  const StageConfig& s = c.stages.at(index);
  ResolvedStage r;
  r.index = int64_t(index);
  r.max_seq_len = s.max_seq_len;
  r.batch_size = s.batch_size;
  r.micro_batch_size = s.micro_batch_size;
  r.steps = s.steps;
  r.tokens = s.tokens;
  r.warm_up = batch_warmup_levels(s);
  r.batch_warmup_tokens = r.warm_up.empty() ? 0.0 : *s.batch_warmup_tokens;
  r.lr = s.lr.value_or(c.optim.lr);
  if (s.schedule) {
    optim::ScheduleSpec spec;
    spec.kind = *s.schedule;
    spec.warmup_steps = s.warmup_steps.value_or(0);
    spec.min_lr_ratio = s.min_lr_ratio.value_or(c.optim.min_lr_ratio);
    spec.decay_shape = s.decay_shape.value_or(c.optim.decay_shape);
    spec.decay_fraction = s.decay_fraction.value_or(c.optim.decay_fraction);
    spec.decay_steps = decay_steps_of(s);
    r.schedule = spec;
  } else {
    r.rewarmup_steps = s.warmup_steps.value_or(0);
  }
  r.weight_decay = s.weight_decay.value_or(c.optim.weight_decay);
  r.mask_prob = s.mask_prob.value_or(c.data.mask_prob);
  r.rope_base = s.rope_base.value_or(c.model.rope_base);
  r.shard_dir = s.shard_dir.value_or(c.data.shard_dir);
  return r;
}

namespace {
std::string describe_schedule(const optim::ScheduleSpec& s) {
  std::string out = optim::decay_kind_name(s.kind);
  if (s.warmup_steps > 0) out += fmt::format(", {} warm-up steps", s.warmup_steps);
  if (s.kind == optim::DecayKind::wsd) {
    out += fmt::format(", {} decay over ", optim::decay_shape_name(s.decay_shape));
    out += s.decay_steps ? fmt::format("the last {} steps", *s.decay_steps)
                         : fmt::format("the last {}%", short_number(100 * s.decay_fraction));
  }
  if (s.kind != optim::DecayKind::constant) out += fmt::format(", floor {}", s.min_lr_ratio);
  return out;
}
}  // namespace

std::string describe_stage(const ResolvedStage& r) {
  std::string out = fmt::format("max_seq_len {}, batch {} ({} x {})", r.max_seq_len, r.batch_size,
                                r.batch_size / r.micro_batch_size, r.micro_batch_size);
  if (!r.warm_up.empty())
    out += fmt::format(", batch warm-up from {} over {} tokens ({} steps)", r.warm_up.front().batch,
                       short_number(r.batch_warmup_tokens), r.warm_up.back().end_step);
  out += fmt::format(", {} steps", r.steps);
  if (r.tokens) out += fmt::format(" (from {} tokens)", short_number(*r.tokens));
  out += fmt::format(", lr {:g}", r.lr);
  if (r.schedule)
    out += " (own schedule: " + describe_schedule(*r.schedule) + ")";
  else if (r.rewarmup_steps > 0)
    out += fmt::format(" (re-warm-up {} steps)", r.rewarmup_steps);
  out += fmt::format(", weight_decay {:g}, mask_prob {:g}, rope_base {:g}, data {}", r.weight_decay,
                     r.mask_prob, r.rope_base, r.shard_dir);
  return out;
}

optim::ScheduleSpec run_schedule(const Config& c) {
  optim::ScheduleSpec run;
  run.kind = c.optim.schedule;
  run.warmup_steps = c.optim.warmup_steps;
  run.min_lr_ratio = c.optim.min_lr_ratio;
  run.decay_shape = c.optim.decay_shape;
  run.decay_fraction = c.optim.decay_fraction;
  if (c.optim.decay_tokens) run.decay_steps = steps_of_last_tokens(c, *c.optim.decay_tokens);
  return run;
}

std::string describe_stages_as_comments(const Config& c) {
  std::string out = "# Stages as they run (unset keys inherited from the top level):\n";
  const optim::ScheduleSpec run = run_schedule(c);
  out +=
      fmt::format("#   run schedule over {} steps: {}\n", c.total_steps(), describe_schedule(run));
  for (size_t i = 0; i < c.stages.size(); ++i)
    out += fmt::format("#   stage {}: {}\n", i + 1, describe_stage(resolve_stage(c, i)));
  return out;
}

std::optional<int64_t> steps_of_last_tokens(const Config& c, double tokens) {
  double left = tokens;
  int64_t steps = 0;
  for (size_t i = c.stages.size(); i-- > 0;) {
    const ResolvedStage r = resolve_stage(c, i);
    const double stage_tokens = r.tokens_through(r.steps);
    if (left <= stage_tokens)
      return steps + steps_for(left, double(r.batch_size) * double(r.max_seq_len));
    steps += r.steps;
    left -= stage_tokens;
  }
  return std::nullopt;
}

optim::LrSchedule make_lr_schedule(const Config& c) {
  const optim::ScheduleSpec run = run_schedule(c);
  std::vector<optim::StageLr> stages;
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const ResolvedStage r = resolve_stage(c, i);
    stages.emplace_back(
        r.steps, r.lr,
        r.rewarmup_steps > 0 ? std::optional<int64_t>(r.rewarmup_steps) : std::nullopt, r.schedule);
  }
  return optim::LrSchedule(run, c.optim.lr, std::move(stages));
}

}  // namespace roformer
