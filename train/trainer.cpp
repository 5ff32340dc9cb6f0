#include "train/trainer.h"

#include <omp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/allocator.h"
#include "core/flat_parameters.h"
#include "core/ops.h"
#include "optim/adamw.h"
#include "optim/grad_norm.h"
#include "train/communicator.h"
#include "train/distributed/gradient_reducer.h"
#include "train/distributed/zero.h"
#include "train/metrics.h"
#include "train/run_device.h"
#include "train/run_directory.h"
#include "train/run_gemm_algorithms.h"
#include "train/signals.h"
#include "train/telemetry.h"

namespace roformer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr double kMiB = 1024.0 * 1024.0;

// Sums of a log window or a whole phase.
struct Totals {
  double loss = 0, gnorm = 0, clipped_gnorm = 0, tokens = 0, slots = 0, flops = 0;
  double data_wait_s = 0;
  int64_t finite_steps = 0, units = 0, correct = 0;
  void add(double step_loss, double step_gnorm, double scale, const StepStats& s) {
    if (std::isfinite(step_loss)) {
      loss += step_loss;
      gnorm += step_gnorm;
      clipped_gnorm += step_gnorm * scale;
      ++finite_steps;
    }
    units += s.units;
    correct += s.correct;
    tokens += double(s.tokens);
    slots += double(s.slots);
    flops += s.flops;
  }
  double packing_efficiency() const { return slots > 0 ? tokens / slots : 1.0; }
  double mean_loss() const { return finite_steps ? loss / double(finite_steps) : NAN; }
  double accuracy() const { return units ? double(correct) / double(units) : NAN; }
};

// Where the model's parameters live (all on one device).
Device model_device(const Module& model) {
  const std::vector<NamedTensor> params = model.named_parameters();
  return params.empty() ? Device::cpu() : params.front().tensor.device();
}

// The device allocator's memory in the metrics (a row per log line), so a
// run can show reserved memory flat after a stage's first steps.
void log_device_memory(MetricsLog& metrics, Device device, int64_t global_step) {
  const DeviceMemory m = device_memory(device);
  metrics.write({{"type", "device_memory"},
                 {"device", device.str()},
                 {"global_step", global_step},
                 {"allocated_mb", m.allocated_mb},
                 {"reserved_mb", m.reserved_mb},
                 {"peak_allocated_mb", m.peak_allocated_mb},
                 {"peak_reserved_mb", m.peak_reserved_mb}});
}

}  // namespace

namespace {
// key -> value of the `model:` section of a resolved config.
std::map<std::string, std::string> model_section(const Config& c) {
  std::istringstream in(to_yaml(c));
  std::map<std::string, std::string> out;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != ' ') {
      inside = line.rfind("model:", 0) == 0;
      continue;
    }
    const size_t colon = line.find(':');
    if (!inside || colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(' ');
    std::string value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.erase(0, 1);
    out[line.substr(start, colon - start)] = value;
  }
  return out;
}
}  // namespace

std::vector<std::string> model_differences(const Config& saved, const Config& now) {
  const auto a = model_section(saved), b = model_section(now);
  std::vector<std::string> out;
  for (const auto& [key, value] : b) {
    const auto it = a.find(key);
    const std::string before = it == a.end() ? "(absent)" : it->second;
    if (before != value)
      out.push_back(
          fmt::format("model.{}: {} in the checkpoint, {} in the config", key, before, value));
  }
  for (const auto& [key, value] : a)
    if (!b.count(key))
      out.push_back(
          fmt::format("model.{}: {} in the checkpoint, absent in the config", key, value));
  return out;
}

MemoryUsage memory_usage() {
  const AllocatorStats a = allocator_for(Device::cpu()).stats();
  MemoryUsage m;
  m.allocated_mb = double(a.allocated_bytes) / kMiB;
  m.cached_mb = double(a.cached_bytes) / kMiB;
  m.peak_allocated_mb = double(a.peak_allocated_bytes) / kMiB;
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) m.peak_rss_mb = double(usage.ru_maxrss) / 1024.0;
  return m;
}

Trainer::Trainer(const Config& config, TrainingTask& task, TrainerOptions options)
    : config_(config), task_(task), options_(std::move(options)) {}

TrainerResult Trainer::run() {
  SingleProcessCommunicator single;
  Communicator& comm = options_.communicator ? *options_.communicator : single;
  const bool writer = comm.rank() == 0;
  RunDirectory run_dir(config_.run.dir, writer);
  if (writer) run_dir.write_file("config.yaml", task_.config_yaml());
  // Before the first product: a resumed run takes its algorithms from here.
  // Kept as long as the trainer (fine-tuning evaluates its best model after
  // run()) and its metrics log, which saves the table before every record.
  gemm_algorithms_ = std::make_shared<RunGemmAlgorithms>(config_, run_dir.dir(), comm.rank());
  RunGemmAlgorithms& gemm_algorithms = *gemm_algorithms_;

  // --- model, optimizer, schedule -------------------------------------------------
  Module& model = task_.model();
  // The task put its model on run.device; the flat buffers, the optimizer
  // state and its passes follow it there.
  const Device device = model_device(model);
  std::vector<optim::NamedParameter> params;
  for (const NamedTensor& p : model.named_parameters())
    params.push_back(
        {p.name, p.tensor, config_.optim.decay_bias_and_norm || optim::decays_by_default(p.name)});
  // ZeRO-1: this rank keeps and updates one share of the moments (distributed/zero.h).
  optim::AdamW adamw(params,
                     {config_.optim.betas[0], config_.optim.betas[1], config_.optim.eps,
                      config_.optim.weight_decay},
                     distributed::zero_shard(config_.distributed.zero, comm, device));
  // Data parallelism: gradients are summed over ranks in buckets during
  // backward; under ZeRO-1 reduce-scattered, each rank summing its share only.
  const bool scatter_grads = adamw.sharded() && config_.distributed.reduce_scatter;
  std::unique_ptr<distributed::GradientReducer> reducer;
  if (options_.communicator) {
    std::vector<Tensor> tensors;
    for (const optim::NamedParameter& p : params) tensors.push_back(p.tensor);
    reducer = std::make_unique<distributed::GradientReducer>(
        FlatParameters::of(tensors), comm, int64_t(config_.distributed.bucket_mb * kMiB),
        scatter_grads ? optim::AdamW::shard_bounds(adamw.flat().padded_numel(), comm.world_size())
                      : std::vector<int64_t>{});
  }
  const distributed::MemoryPerRank memory = distributed::memory_per_rank(adamw, comm);
  spdlog::info(
      "memory per rank: parameters {:.1f} MiB, gradients {:.1f} MiB, AdamW moments {:.1f} "
      "MiB{}",
      double(memory.param_bytes) / kMiB, double(memory.grad_bytes) / kMiB,
      double(memory.optimizer_state_bytes) / kMiB,
      adamw.sharded() ? fmt::format(" (ZeRO-1: 1/{} of them)", comm.world_size()) : "");
  // Modelled traffic (distributed/zero.h), logged once and in every record.
  const int64_t comm_bytes =
      reducer ? distributed::bytes_sent_per_step(adamw.flat().padded_numel(), comm.world_size(),
                                                 adamw.sharded(), scatter_grads)
              : 0;
  if (reducer)
    spdlog::info("gradients: {} in {} bucket(s){}; about {:.1f} MiB sent per rank per step",
                 scatter_grads ? "reduce-scatter" : "all-reduce", reducer->num_buckets(),
                 adamw.sharded() ? ", then an all-gather of the parameters" : "",
                 double(comm_bytes) / kMiB);
  double param_gather_s = 0;  // ZeRO-1's all-gathers of the updated parameters
  const optim::LrSchedule schedule = task_.lr_schedule();
  const CheckpointPolicy policy = task_.checkpoint_policy();
  const std::string phase = task_.phase_name();

  // --- resume -------------------------------------------------------------------------
  TrainerResult result;
  TrainingState& state = result.state;
  // Dropout draws from (seed, step, sequence): nothing of it is saved.
  const uint64_t dropout_seed = config_.run.seed * 0x9E3779B97F4A7C15ull + 1;
  state.rng_seed = dropout_seed;
  // Rank 0 chooses the checkpoint (and renames unreadable ones); every rank loads it.
  std::optional<fs::path> latest;
  if (writer) latest = run_dir.checkpoint_to_resume(options_.restart);
  if (comm.world_size() > 1) {
    const std::string chosen = comm.broadcast(latest ? latest->string() : std::string(), 0);
    if (!chosen.empty()) latest = fs::path(chosen);
  }
  if (latest) {
    CheckpointData ckpt = load_checkpoint(*latest, true);
    const Config saved = parse_config_string(ckpt.config_yaml, latest->string());
    task_.check_resume(saved, latest->string(), ckpt.state);
    model.load_state_dict(ckpt.parameters);
    adamw.load_state(ckpt.exp_avg, ckpt.exp_avg_sq, ckpt.optimizer_step);
    state = ckpt.state;
    state.stage_end = false;
    state.rng_seed = dropout_seed;
    state.rng_offset = 0;
    task_.load_extra(state.stage_results);
    result.last_checkpoint = *latest;
    spdlog::info("resuming from {} (global step {}, {} {} step {})", latest->string(),
                 state.global_step, phase, state.stage + 1, state.step_in_stage);
  } else {
    int64_t total = 0;
    for (int64_t i = 0; i < task_.num_phases(); ++i) total += task_.plan(i).steps;
    spdlog::info("starting {}: {} parameters, {} {}s, {} steps, {} threads, {} rank(s)",
                 config_.run.dir, model.num_parameters(), task_.num_phases(), phase, total,
                 omp_get_max_threads(), comm.world_size());
  }
  auto metrics_log = std::make_unique<MetricsLog>(run_dir.dir() / "metrics.jsonl", writer,
                                                  config_.log.progress != ProgressMode::kNever);
  MetricsLog& metrics = *metrics_log;
  metrics.set_defer_write_errors(true);  // checked after each step, below
  // No figure is logged before the algorithms it ran with are saved.
  metrics.set_before_write([table = gemm_algorithms_] { table->save_if_changed(); });

  auto save = [&](bool phase_end) {
    // What evaluation timed, before the checkpoint exists. A table that
    // cannot be written does not cost the checkpoint: a run resumed from it
    // times those products again.
    try {
      gemm_algorithms.save_if_changed();
    } catch (const Error& e) {
      spdlog::warn("{}: a run resumed from the next checkpoint times those products again",
                   e.what());
    }
    state.stage_end = phase_end;
    state.stage_results = task_.save_extra();
    const fs::path path =
        run_dir.checkpoints() /
        checkpoint_file_name(state.global_step, phase_end && policy.mark_phase_ends
                                                    ? std::optional<int64_t>(state.stage)
                                                    : std::nullopt);
    // Every rank sends its share of the moments (ZeRO-1) before rank 0 writes.
    distributed::Moments moments = distributed::gather_moments(adamw, comm, 0);
    if (!writer) {
      result.last_checkpoint = path;
      return;
    }
    CheckpointData data;
    data.state = state;
    data.parameters = model.named_parameters();
    data.exp_avg = std::move(moments.exp_avg);
    data.exp_avg_sq = std::move(moments.exp_avg_sq);
    data.optimizer_step = adamw.step_count();
    data.config_yaml = task_.config_yaml();
    data.created_by = task_.created_by();
    const auto t0 = Clock::now();
    std::function<void()> hook;
    if (options_.before_checkpoint_commit)
      hook = [&, step = state.global_step] { options_.before_checkpoint_commit(step); };
    save_checkpoint(path, data, hook);
    prune_checkpoints(run_dir.checkpoints(), policy.keep_last, policy.keep_phase_ends);
    result.last_checkpoint = path;
    metrics.clear_progress();
    spdlog::info("checkpoint {} ({:.1f}s)", path.string(), seconds_since(t0));
  };
  // While steps are non-finite nothing is saved or pruned: the newest
  // checkpoint stays the last one written before the streak.
  auto in_streak = [&] { return state.nonfinite_in_a_row > 0; };
  auto resume_advice = [&] {
    return options_.resume_command.empty() ? std::string("rerun the same command")
                                           : "resume with: " + options_.resume_command;
  };

  const auto run_start = Clock::now();
  double tokens_this_run = 0;
  const double peak = peak_tflops(config_, omp_get_max_threads());
  const int64_t n_phases = task_.num_phases();
  for (; state.stage < n_phases && !task_.stop_early(); ++state.stage) {
    const PhasePlan plan = task_.plan(state.stage);
    if (!policy.within_phase) state.step_in_stage = 0;
    allocator_for(Device::cpu()).reset_peak();
    if (!device.is_cpu()) reset_device_peak(device);
    adamw.set_weight_decay(std::isfinite(plan.weight_decay) ? plan.weight_decay
                                                            : config_.optim.weight_decay);
    task_.begin_phase(state, metrics);
    Totals window, whole;
    auto window_start = Clock::now();
    double window_comm_start = reducer ? reducer->blocked_seconds() : 0.0;
    double window_gather_start = param_gather_s;
    // Where the phase stands: in tokens when it was given in tokens.
    auto position = [&](bool aligned) {
      if (plan.token_budget > 0)
        return fmt::format("tokens {}/{}",
                           format_count(task_.phase_tokens(state.stage, state.step_in_stage)),
                           format_count(plan.token_budget));
      return aligned ? fmt::format("step {:>5}/{}", state.step_in_stage, plan.steps)
                     : fmt::format("step {}/{}", state.step_in_stage, plan.steps);
    };
    PhaseTraining training;

    while (state.step_in_stage < plan.steps) {
      if (options_.before_step) options_.before_step(state.global_step);

      // Forward and backward: the loss is the mean over every unit of the
      // global batch, so each micro-batch weighs in by its share of them.
      const auto fetch_start = Clock::now();
      const std::vector<int64_t> units = task_.fetch();
      window.data_wait_s += seconds_since(fetch_start);
      int64_t global_units = 0;
      for (int64_t u : units) global_units += u;
      global_units = comm.sum(global_units);
      const double inv_units = global_units > 0 ? 1.0 / double(global_units) : 0.0;
      StepStats step;
      for (size_t i = 0; i < units.size(); ++i) {
        // The loader's order: micro-batch i of every rank, then i + 1 (distributed/batch_split.h).
        const int64_t row0 = (int64_t(i) * comm.world_size() + comm.rank()) * plan.micro_batch_size;
        if (reducer && i + 1 == units.size()) reducer->arm();
        const StepStats s =
            task_.forward_backward(i, inv_units, {dropout_seed, uint64_t(state.global_step), row0});
        step.loss_sum += s.loss_sum;
        step.correct += s.correct;
        step.tokens += s.tokens;
        step.slots += s.slots > 0 ? s.slots : s.tokens;
        step.flops += s.flops;
      }
      // Before any other collective: a rank without a backward this step starts
      // its buckets here, a rank with one may have started them already.
      if (reducer) reducer->finish();
      if (options_.after_gradients) options_.after_gradients(state.global_step, adamw.flat());
      step.units = global_units;
      // This step's global batch: every rank draws as many micro-batches.
      const int64_t last_batch_rows =
          int64_t(units.size()) * plan.micro_batch_size * comm.world_size();
      // The gradient norm (for clipping and the non-finite check): of the
      // whole summed gradient every rank holds, or, reduce-scattered, the
      // chunk partials of this rank's share, placed among every rank's (zeros
      // elsewhere, so the all-reduce adds them exactly) and added in chunk
      // order: the whole-gradient norm bit for bit (optim/grad_norm.h).
      double gnorm = NAN;
      bool nonfinite_gradient = false;
      {
        // The step's statistics, one reduction per type. The doubles carry
        // the norm's partials when the gradients were scattered, the integers
        // this rank's non-finite flag and the reducer's has-a-gradient flags:
        // none needs a collective of its own.
        std::vector<double> d = {step.loss_sum, step.flops};
        bool nonfinite_here = false;
        if (scatter_grads) {
          const std::vector<double> mine = optim::chunk_sums_of_squares(
              adamw.flat().grad(), adamw.shard_begin(), adamw.shard_end());
          nonfinite_here = !std::isfinite(optim::sum_in_order(mine));
          const int64_t chunks =
              (adamw.flat().padded_numel() + optim::kNormChunk - 1) / optim::kNormChunk;
          d.resize(size_t(2 + chunks), 0.0);
          std::copy(mine.begin(), mine.end(),
                    d.begin() + 2 + adamw.shard_begin() / optim::kNormChunk);
        } else {
          gnorm = optim::global_grad_norm(params);
          nonfinite_here = !std::isfinite(gnorm);
        }
        std::vector<int64_t> n = {step.correct, step.tokens, step.slots, nonfinite_here ? 1 : 0};
        if (reducer) reducer->append_gradient_flags(n);
        // The products this rank timed in the step, saved (the hook) before
        // any rank can log the step (the reduction waits for every rank); a
        // failure stops the run as a failed log write does, after a checkpoint.
        metrics.run_before_write();
        comm.all_reduce_sum(std::span<double>(d));
        comm.all_reduce_sum(std::span<int64_t>(n));
        if (reducer) reducer->adopt_gradients(std::span<const int64_t>(n).subspan(4));
        if (scatter_grads)
          gnorm = std::sqrt(optim::sum_in_order(std::span<const double>(d).subspan(2)));
        step.loss_sum = d[0];
        step.flops = d[1];
        step.correct = n[0];
        step.tokens = n[1];
        step.slots = n[2];
        nonfinite_gradient = n[3] > 0;
      }
      const double loss = global_units > 0 ? step.loss_sum / double(global_units) : 0.0;
      const double lr = schedule.at(state.global_step);
      const double clip = optim::clip_scale(gnorm, config_.optim.clip_grad_norm);
      double update_ratio = NAN;
      // Whether this step ends a log window (the last of every log.every_steps
      // and of the phase): its record carries the update/weight ratio.
      const bool log_step =
          config_.log.every_steps > 0 && ((state.global_step + 1) % config_.log.every_steps == 0 ||
                                          state.step_in_stage + 1 == plan.steps);
      // The loss and the flags are sums every rank holds alike: every rank
      // takes the same decision without a collective of its own.
      if (!std::isfinite(loss) || nonfinite_gradient) {
        ++state.nonfinite_skipped;
        ++state.nonfinite_in_a_row;
        metrics.clear_progress();
        spdlog::warn(
            "step {}: non-finite {} ({}); update skipped ({} in a row){}", state.global_step + 1,
            std::isfinite(loss) ? "gradient" : "loss",
            !std::isfinite(loss)   ? fmt::format("{}", loss)
            : std::isfinite(gnorm) ? std::string("on another rank")
                                   : fmt::format("{}", gnorm),
            state.nonfinite_in_a_row,
            state.nonfinite_in_a_row == 1 ? "; no checkpoints until a step is finite" : "");
        if (state.nonfinite_in_a_row > config_.optim.max_nonfinite_in_a_row) {
          const auto [lr_key, lr_value] = task_.lr_setting();
          const std::string lower = fmt::format("{}={:g}", lr_key, lr_value / 10);
          std::string advice;
          if (result.last_checkpoint.empty())
            advice = fmt::format(
                "no checkpoint was written before them; start again with a lower "
                "learning rate{}",
                options_.resume_command.empty() ? " (" + lower + ")"
                                                : ":\n  " + options_.resume_command + " " + lower);
          else
            advice = fmt::format(
                "nothing was saved during them; the last checkpoint before them is {}: resume "
                "from it with a lower learning rate{}",
                result.last_checkpoint.string(),
                options_.resume_command.empty() ? " (" + lower + ")"
                                                : ":\n  " + options_.resume_command + " " + lower);
          throw Error(
              fmt::format("stopping: {} steps in a row had a non-finite loss or gradient "
                          "(optim.max_nonfinite_in_a_row = {}); {}",
                          state.nonfinite_in_a_row, config_.optim.max_nonfinite_in_a_row, advice));
        }
      } else {
        state.nonfinite_in_a_row = 0;
        // The update/weight ratio is measured on the steps that are logged:
        // the update pass sums its squared changes itself (no copy of the
        // weights), over this rank's share when the moments are sharded.
        double update_sq = adamw.step(lr, clip, log_step);
        if (adamw.sharded()) {
          const auto gather_start = Clock::now();
          distributed::all_gather_parameters(adamw, comm);
          param_gather_s += seconds_since(gather_start);
          // Every rank logs alike, so every rank takes part.
          if (log_step) comm.all_reduce_sum(std::span<double>(&update_sq, 1));
        }
        if (log_step) {
          const double w = optim::l2_norm(adamw.flat().data());
          update_ratio = w > 0 ? std::sqrt(update_sq) / w : NAN;
        }
      }
      adamw.zero_grad();
      ++state.global_step;
      ++state.step_in_stage;
      state.loader = task_.cursor();
      tokens_this_run += double(step.tokens);
      window.add(loss, gnorm, clip, step);
      whole.add(loss, gnorm, clip, step);

      // --- log ------------------------------------------------------------------------
      const bool phase_done = state.step_in_stage == plan.steps;
      if (log_step && window.finite_steps > 0) {
        const double secs = seconds_since(window_start);
        const double elapsed = seconds_since(run_start);
        training.window_loss = window.mean_loss();
        training.window_accuracy = window.units ? window.accuracy() : 0.0;
        // ETA from this run's token rate and the tokens the remaining steps
        // hold (in a phase given in tokens, its budget left).
        double remaining = task_.phase_tokens(state.stage, plan.steps) -
                           task_.phase_tokens(state.stage, state.step_in_stage);
        for (int64_t p = state.stage + 1; p < n_phases; ++p)
          remaining += task_.phase_tokens(p, task_.plan(p).steps);
        const double rate = tokens_this_run / std::max(elapsed, 1e-9);
        const double eta = remaining * 0.8 / std::max(rate, 1e-9);
        const double tok_s = window.tokens / std::max(secs, 1e-9);
        const double mean_gnorm = window.gnorm / double(window.finite_steps);
        const double mean_clipped = window.clipped_gnorm / double(window.finite_steps);
        const double mfu =
            window.flops > 0 ? window.flops / std::max(secs, 1e-9) / (peak * 1e12) : NAN;
        const double wait_share = window.data_wait_s / std::max(secs, 1e-9);
        int64_t total_steps = 0;
        for (int64_t p = 0; p < n_phases; ++p) total_steps += task_.plan(p).steps;
        const MemoryUsage mem = memory_usage();
        // A phase given in tokens counts its progress in tokens.
        const std::string progress = position(true);
        metrics.clear_progress();
        spdlog::info(
            "{} {}/{} {} | global {:>6}/{} | loss {:.4f} | {} {:5.2f}% | lr {:.2e} | "
            "gnorm {:.3f} (clipped {:.3f}) | upd/w {:.1e} | {:.0f} tok/s, fill {:.0f}% | MFU "
            "{:.1f}% | data wait {:.0f}% | {:.0f} MB | {} elapsed, ETA {} ({} tokens left)",
            phase, state.stage + 1, n_phases, progress, state.global_step, total_steps,
            training.window_loss, task_.accuracy_key() == "mlm_accuracy" ? "mlm acc" : "acc",
            100 * training.window_accuracy, lr, mean_gnorm, mean_clipped, update_ratio, tok_s,
            100 * window.packing_efficiency(), 100 * mfu, 100 * wait_share,
            mem.allocated_mb + mem.cached_mb, format_duration(elapsed), format_duration(eta),
            format_count(remaining));
        char loss_exact[64];
        std::snprintf(loss_exact, sizeof loss_exact, "%.9g", loss);
        auto number = [](double v) {
          return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
        };
        nlohmann::json record = {
            {"type", "train"},
            {phase, state.stage + 1},
            {"step_in_" + phase, state.step_in_stage},
            {"global_step", state.global_step},
            {"tokens_in_" + phase, task_.phase_tokens(state.stage, state.step_in_stage)},
            {"loss", training.window_loss},
            {"last_step_loss", loss_exact},
            {task_.accuracy_key(), training.window_accuracy},
            {"lr", lr},
            {"batch_size", last_batch_rows},
            {"grad_norm", mean_gnorm},
            {"grad_norm_clipped", mean_clipped},
            {"update_ratio", number(update_ratio)},
            {"tokens_per_s", tok_s},
            {"packing_efficiency", window.packing_efficiency()},
            {"mfu", number(mfu)},
            {"peak_tflops", peak},
            {"data_wait_s", window.data_wait_s},
            {"elapsed_s", elapsed},
            {"eta_s", eta},
            {"eta_tokens", remaining},
            {"skipped_steps", state.nonfinite_skipped},
            {"allocated_mb", mem.allocated_mb},
            {"cached_mb", mem.cached_mb},
            {"peak_rss_mb", mem.peak_rss_mb},
            {"param_bytes", memory.param_bytes},
            {"grad_bytes", memory.grad_bytes},
            {"optimizer_state_bytes", memory.optimizer_state_bytes}};
        if (comm.world_size() > 1) {
          record["optimizer_state_bytes_per_rank"] = memory.optimizer_state_bytes_per_rank;
          std::vector<float> rss(size_t(comm.world_size()));
          const float mine = float(mem.peak_rss_mb);
          comm.all_gather(std::span<const float>(&mine, 1), rss);
          record["peak_rss_mb_per_rank"] = rss;
        }
        if (reducer) {
          // Communication not hidden behind backward: its share of the window.
          const double blocked = reducer->blocked_seconds() - window_comm_start;
          record["comm_blocked_s"] = blocked;
          record["comm_share"] = blocked / std::max(secs, 1e-9);
          record["comm_bytes_per_step"] = comm_bytes;
          window_comm_start = reducer->blocked_seconds();
        }
        if (adamw.sharded()) {
          record["param_gather_s"] = param_gather_s - window_gather_start;
          window_gather_start = param_gather_s;
        }
        metrics.write(record);
        if (!device.is_cpu()) log_device_memory(metrics, device, state.global_step);
        window = {};
        window_start = Clock::now();
      } else {
        metrics.progress(fmt::format("{} {}/{} {} loss {:.4f}", phase, state.stage + 1, n_phases,
                                     position(false), loss));
      }

      // --- evaluate, checkpoint -------------------------------------------------------
      bool saved = false;
      if (!phase_done && config_.log.eval_every_steps > 0 &&
          state.global_step % config_.log.eval_every_steps == 0)
        task_.evaluate_within_phase(state, metrics);
      if (phase_done) {
        training.loss = whole.mean_loss();
        training.accuracy = whole.accuracy();
        task_.end_phase(state, training, metrics);
        // The checkpoint records where a resumed run starts: the next phase.
        ++state.stage;
        state.step_in_stage = 0;
        if (!in_streak()) {
          save(true);
          saved = true;
        }
        --state.stage;  // the for loop advances it
        state.step_in_stage = plan.steps;
      } else if (policy.within_phase && config_.checkpoint.every_steps > 0 &&
                 state.global_step % config_.checkpoint.every_steps == 0 && !in_streak()) {
        save(false);
        saved = true;
      }

      // --- a log write failed (a full disk): save if still possible, then stop -------
      if (comm.any(!metrics.write_error().empty())) {
        std::string checkpoint_note;
        if (!saved && policy.within_phase && !in_streak()) {
          try {
            save(false);
            saved = true;
          } catch (const Error& e) {
            checkpoint_note =
                fmt::format("the checkpoint could not be written either ({}); ", e.what());
          }
        }
        metrics.clear_progress();
        const std::string last =
            result.last_checkpoint.empty()
                ? std::string("no checkpoint was written yet")
                : (saved ? "saved " : "the last checkpoint is ") + result.last_checkpoint.string();
        throw Error(fmt::format("stopping after global step {}: {}; {}{}; free some space, then {}",
                                state.global_step,
                                writer ? metrics.write_error() : "a log write failed on rank 0",
                                checkpoint_note, last, resume_advice()));
      }

      // --- stop -----------------------------------------------------------------------
      if (comm.any(options_.stop && options_.stop->requested())) {
        if (!saved && policy.within_phase && !in_streak()) save(false);
        metrics.clear_progress();
        const int sig = options_.stop ? options_.stop->signal_number() : 0;
        if (policy.within_phase || phase_done)
          spdlog::warn("stopped by signal {} after global step {}; {} (it continues from {})", sig,
                       state.global_step, resume_advice(),
                       result.last_checkpoint.empty() ? std::string("step 0")
                                                      : result.last_checkpoint.string());
        else
          spdlog::warn("stopped by signal {} in {} {}; {} (it restarts {} {} from {})", sig, phase,
                       state.stage + 1, resume_advice(), phase, state.stage + 1,
                       result.last_checkpoint.empty() ? std::string("the beginning")
                                                      : result.last_checkpoint.string());
        result.interrupted = true;
        return result;
      }
    }
    // The next phase may run at another length: give the cached blocks back
    // to the system (the allocator trims malloc's heap too), on the device too.
    if (state.stage + 1 < n_phases) {
      allocator_for(Device::cpu()).release_cached();
      if (!device.is_cpu()) release_device_cache(device);
    }
    state.step_in_stage = 0;
  }
  result.finished = true;
  metrics.clear_progress();
  metrics.set_defer_write_errors(false);
  result.metrics = std::move(metrics_log);
  spdlog::info("finished {} steps ({} skipped) in {}", state.global_step, state.nonfinite_skipped,
               format_duration(seconds_since(run_start)));
  return result;
}

}  // namespace roformer
