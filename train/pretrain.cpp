#include "train/pretrain.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/ops.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "data/vocab.h"
#include "layers/roformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/signals.h"

namespace roformer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct BatchTensors {
  Tensor ids, types, mask, labels;
};

BatchTensors to_tensors(const data::Batch& b) {
  const Shape shape{b.batch_size, b.seq_len};
  return {Tensor::from_vector<int32_t>(b.input_ids, shape),
          Tensor::from_vector<int32_t>(b.token_type_ids, shape),
          Tensor::from_vector<int32_t>(b.attention_mask, shape),
          Tensor::from_vector<int32_t>(b.labels, shape)};
}

data::MaskingOptions masking_options(const DataConfig& d) {
  data::MaskingOptions m;
  m.mask_prob = d.mask_prob;
  m.mask_token_prob = d.mask_token_prob;
  m.random_token_prob = d.random_token_prob;
  m.whole_word_masking = d.whole_word_masking;
  return m;
}

// Lines of the resolved YAML that differ between two configs, for the
// "changed since the checkpoint" report.
std::vector<std::string> changed_lines(const Config& before, const Config& after) {
  std::istringstream a(to_yaml(before)), b(to_yaml(after));
  std::vector<std::string> la, lb, out;
  for (std::string l; std::getline(a, l);) la.push_back(l);
  for (std::string l; std::getline(b, l);) lb.push_back(l);
  for (const std::string& l : lb)
    if (std::find(la.begin(), la.end(), l) == la.end()) out.push_back(l);
  return out;
}

struct EvalResult {
  double loss = NAN, accuracy = NAN;
  int64_t masked = 0;
};

}  // namespace

std::string format_stage_table(const std::vector<StageSummary>& stages) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %8s %6s %7s %10s %9s %9s %8s\n", "stage", "max_len",
                "batch", "steps", "train_loss", "train_acc", "val_loss", "val_acc");
  out << line;
  for (const StageSummary& s : stages) {
    std::snprintf(line, sizeof line, "%-6lld %8lld %6lld %7lld %10.4f %8.2f%% %9.4f %7.2f%%\n",
                  (long long)s.stage + 1, (long long)s.max_seq_len, (long long)s.batch_size,
                  (long long)s.steps, s.train_loss, 100 * s.train_accuracy, s.val_loss,
                  100 * s.val_accuracy);
    out << line;
  }
  return out.str();
}

PretrainResult run_pretrain(const Config& config, const PretrainOptions& options) {
  require_for(config, ConfigUse::kPretrain);
  if (config.run.device != DeviceType::cpu)
    throw InputError(config.source +
                     ": run.device: this build trains on the CPU only; the CUDA kernels are "
                     "not written yet (set run.device: cpu)");
  if (config.run.precision != Precision::kF32)
    throw InputError(config.source + ": run.precision: only f32 is implemented for training");
  if (options.world_size != 1)
    throw InputError("data-parallel training (world size > 1) is not available in this build");
  if (config.run.threads > 0) omp_set_num_threads(int(config.run.threads));
  const bool writer = options.rank == 0;

  // --- data ---------------------------------------------------------------------
  auto vocab = std::make_shared<const data::Vocab>(data::Vocab::load(config.data.vocab));
  if (vocab->size() > config.model.vocab_size)
    throw InputError(detail::concat(config.source, ": model.vocab_size is ",
                                    config.model.vocab_size, " but ", config.data.vocab, " has ",
                                    vocab->size(), " pieces"));
  data::TokenizerOptions tok_options;
  tok_options.lowercase = config.data.lowercase;
  const data::TokenizerIdentity identity = data::Tokenizer(vocab, tok_options).identity();
  const std::vector<std::string> train_paths = data::list_shards(config.data.shard_dir, "train");
  if (train_paths.empty())
    throw InputError("no training shards in " + config.data.shard_dir +
                     " (run `roformer prepare --config " + config.source + "` first)");
  const data::ShardSet train_shards = data::open_shards(train_paths, &identity);
  const std::vector<std::string> val_paths = data::list_shards(config.data.shard_dir, "validation");
  const data::ShardSet val_shards =
      val_paths.empty() ? data::ShardSet{} : data::open_shards(val_paths, &identity);

  // --- model, optimizer, schedule -------------------------------------------------
  RoFormerForMaskedLM model(config.model, config.run.seed);
  std::vector<optim::NamedParameter> params;
  for (const NamedTensor& p : model.named_parameters())
    params.push_back(
        {p.name, p.tensor, config.optim.decay_bias_and_norm || optim::decays_by_default(p.name)});
  optim::AdamW adamw(params, {config.optim.betas[0], config.optim.betas[1], config.optim.eps,
                              config.optim.weight_decay});
  std::vector<optim::StageLr> stage_lrs;
  for (const StageConfig& s : config.stages) stage_lrs.push_back({s.steps, s.lr, s.warmup_steps});
  const optim::LrSchedule schedule(config.optim.schedule, config.optim.lr,
                                   config.optim.warmup_steps, config.optim.min_lr_ratio, stage_lrs);

  // --- run directory and resume -----------------------------------------------------
  const fs::path run_dir = config.run.dir;
  const fs::path ckpt_dir = run_dir / "checkpoints";
  if (writer) {
    fs::create_directories(ckpt_dir);
    save_config(config, run_dir / "config.yaml");
  }
  TrainingState state;
  state.rng_seed = config.run.seed * 0x9E3779B97F4A7C15ull + 1;  // dropout stream
  std::vector<StageSummary> summaries;
  std::vector<std::string> problems;
  PretrainResult result;
  if (auto latest = latest_valid_checkpoint(ckpt_dir, &problems)) {
    for (const std::string& p : problems)
      spdlog::warn("skipping a checkpoint that does not load: {}", p);
    CheckpointData ckpt = load_checkpoint(*latest, true);
    const Config saved = parse_config_string(ckpt.config_yaml, latest->string());
    if (!(saved.model == config.model))
      throw InputError(detail::concat(
          "cannot resume ", latest->string(), ": the model section differs from ", config.source,
          " (", changed_lines(saved, config).empty() ? "" : changed_lines(saved, config)[0],
          " ...); a checkpoint only continues the model it was made with"));
    const int64_t cur = ckpt.state.stage;
    if (cur < int64_t(config.stages.size()) && cur < int64_t(saved.stages.size()) &&
        ckpt.state.step_in_stage > 0 &&
        saved.stages[size_t(cur)].max_seq_len != config.stages[size_t(cur)].max_seq_len)
      throw InputError(
          detail::concat("cannot resume ", latest->string(), ": stage ", cur + 1,
                         " is in progress at max_seq_len ", saved.stages[size_t(cur)].max_seq_len,
                         ", the config now says ", config.stages[size_t(cur)].max_seq_len));
    for (const std::string& line : changed_lines(saved, config))
      spdlog::info("config changed since the checkpoint: {}", line);
    model.load_state_dict(ckpt.parameters);
    adamw.load_state(ckpt.exp_avg, ckpt.exp_avg_sq, ckpt.optimizer_step);
    state = ckpt.state;
    state.stage_end = false;
    for (const auto& row : nlohmann::json::parse(state.stage_results)) {
      StageSummary s;
      s.stage = row.at("stage");
      s.max_seq_len = row.at("max_seq_len");
      s.batch_size = row.at("batch_size");
      s.steps = row.at("steps");
      s.train_loss = row.at("train_loss").is_null() ? NAN : row.at("train_loss").get<double>();
      s.train_accuracy =
          row.at("train_accuracy").is_null() ? NAN : row.at("train_accuracy").get<double>();
      s.val_loss = row.at("val_loss").is_null() ? NAN : row.at("val_loss").get<double>();
      s.val_accuracy =
          row.at("val_accuracy").is_null() ? NAN : row.at("val_accuracy").get<double>();
      summaries.push_back(s);
    }
    result.last_checkpoint = *latest;
    spdlog::info("resuming from {} (global step {}, stage {} step {})", latest->string(),
                 state.global_step, state.stage + 1, state.step_in_stage);
  } else {
    for (const std::string& p : problems) spdlog::warn("no usable checkpoint: {}", p);
    spdlog::info("starting {}: {} parameters, {} stages, {} steps, {} threads", run_dir.string(),
                 model.num_parameters(), config.stages.size(), config.total_steps(),
                 omp_get_max_threads());
  }

  MetricsLog metrics(run_dir / "metrics.jsonl", writer,
                     config.log.progress != ProgressMode::kNever);

  auto save = [&](bool stage_end) {
    state.stage_end = stage_end;
    nlohmann::json rows = nlohmann::json::array();
    for (const StageSummary& s : summaries)
      rows.push_back({{"stage", s.stage},
                      {"max_seq_len", s.max_seq_len},
                      {"batch_size", s.batch_size},
                      {"steps", s.steps},
                      {"train_loss", s.train_loss},
                      {"train_accuracy", s.train_accuracy},
                      {"val_loss", s.val_loss},
                      {"val_accuracy", s.val_accuracy}});
    state.stage_results = rows.dump();
    if (!writer) return;
    CheckpointData data;
    data.state = state;
    data.parameters = model.named_parameters();
    data.exp_avg = adamw.exp_avg();
    data.exp_avg_sq = adamw.exp_avg_sq();
    data.optimizer_step = adamw.step_count();
    data.config_yaml = to_yaml(config);
    data.created_by = "roformer pretrain";
    const fs::path path =
        ckpt_dir / checkpoint_file_name(state.global_step, stage_end
                                                               ? std::optional<int64_t>(state.stage)
                                                               : std::nullopt);
    const auto t0 = Clock::now();
    save_checkpoint(path, data);
    prune_checkpoints(ckpt_dir, config.checkpoint.keep_last, config.checkpoint.keep_stage_ends);
    result.last_checkpoint = path;
    metrics.clear_progress();
    spdlog::info("checkpoint {} ({:.1f}s)", path.string(), seconds_since(t0));
  };

  // Validation at the stage's length over a fixed, unshuffled set of batches.
  auto evaluate = [&](const StageConfig& stage) {
    EvalResult r;
    if (val_shards.empty() || config.log.eval_batches <= 0) return r;
    data::LoaderOptions o;
    o.max_seq_len = stage.max_seq_len;
    o.batch_size = stage.micro_batch_size;
    o.seed = config.run.seed + 7;  // fixed masks: every evaluation sees the same task
    o.shuffle = false;
    o.masking = masking_options(config.data);
    o.prefetch_batches = 0;
    data::Loader val(val_shards, vocab, o);
    NoGradGuard no_grad;
    double loss_sum = 0;
    int64_t correct = 0;
    data::LoaderState at;
    const int64_t n = std::min<int64_t>(config.log.eval_batches, val.batches_per_epoch());
    for (int64_t i = 0; i < n; ++i) {
      const data::Batch b = val.batch_at(at);
      at = val.advance(at);
      if (b.num_masked == 0) continue;
      const BatchTensors t = to_tensors(b);
      DropoutContext unused;
      const MlmOutput out = model.forward_mlm(t.ids, t.types, t.mask, t.labels, false, unused);
      loss_sum += out.loss.item() * double(out.num_masked);
      correct += out.num_correct;
      r.masked += out.num_masked;
    }
    if (r.masked > 0) {
      r.loss = loss_sum / double(r.masked);
      r.accuracy = double(correct) / double(r.masked);
    }
    return r;
  };

  // Test hook for the kill-and-resume test: die without warning at a step.
  const char* kill_at_env = std::getenv("ROFORMER_TEST_KILL_AT_STEP");
  const int64_t kill_at = kill_at_env ? std::atoll(kill_at_env) : -1;

  const auto run_start = Clock::now();
  int64_t steps_this_run = 0;
  double tokens_this_run = 0;
  const int64_t total_steps = config.total_steps();
  for (; state.stage < int64_t(config.stages.size()); ++state.stage) {
    const StageConfig& stage = config.stages[size_t(state.stage)];
    const int64_t n_micro = stage.batch_size / stage.micro_batch_size;
    data::LoaderOptions lo;
    lo.max_seq_len = stage.max_seq_len;
    lo.batch_size = stage.micro_batch_size;
    lo.seed = config.run.seed;
    lo.rank = options.rank;
    lo.world_size = options.world_size;
    lo.masking = masking_options(config.data);
    lo.prefetch_batches = int(config.data.prefetch_batches);
    data::Loader loader(train_shards, vocab, lo, state.loader);
    if (state.step_in_stage == 0) {
      metrics.clear_progress();
      spdlog::info(
          "stage {}/{}: max_seq_len {}, batch {} ({} x {}), {} steps, {} sequences per epoch",
          state.stage + 1, config.stages.size(), stage.max_seq_len, stage.batch_size, n_micro,
          stage.micro_batch_size, stage.steps, loader.num_sequences());
      metrics.write({{"type", "stage"},
                     {"stage", state.stage + 1},
                     {"global_step", state.global_step},
                     {"max_seq_len", stage.max_seq_len},
                     {"batch_size", stage.batch_size},
                     {"steps", stage.steps}});
    }
    double window_loss = 0, window_gnorm = 0;
    int64_t window_steps = 0, window_masked = 0, window_correct = 0;
    double window_tokens = 0;
    auto window_start = Clock::now();
    double last_loss = NAN, last_acc = NAN;

    while (state.step_in_stage < stage.steps) {
      if (state.global_step == kill_at) std::raise(SIGKILL);
      std::vector<data::Batch> batches;
      int64_t masked = 0, tokens = 0;
      for (int64_t i = 0; i < n_micro; ++i) {
        batches.push_back(loader.next());
        masked += batches.back().num_masked;
        tokens += batches.back().num_tokens;
      }
      // Mean loss over every masked token of the global batch: each
      // micro-batch's mean is weighted by its share of the masked tokens.
      double loss = 0;
      int64_t correct = 0;
      for (size_t i = 0; i < batches.size(); ++i) {
        const data::Batch& b = batches[i];
        if (b.num_masked == 0) continue;
        const BatchTensors t = to_tensors(b);
        // Dropout depends on (seed, step, the sequence's place in the global
        // batch) only, so the micro-batch split does not change the run.
        DropoutContext dropout{state.rng_seed, uint64_t(state.global_step),
                               int64_t(i) * stage.micro_batch_size};
        const MlmOutput out = model.forward_mlm(t.ids, t.types, t.mask, t.labels, true, dropout);
        const double weight = double(out.num_masked) / double(masked);
        mul(out.loss, weight).backward();
        loss += out.loss.item() * weight;
        correct += out.num_correct;
      }
      const double gnorm = optim::global_grad_norm(params);
      const double lr = schedule.at(state.global_step);
      if (!std::isfinite(loss) || !std::isfinite(gnorm)) {
        ++state.nonfinite_skipped;
        ++state.nonfinite_in_a_row;
        metrics.clear_progress();
        spdlog::warn("step {}: non-finite {} ({}); update skipped ({} in a row)",
                     state.global_step + 1, std::isfinite(loss) ? "gradient" : "loss",
                     std::isfinite(loss) ? gnorm : loss, state.nonfinite_in_a_row);
        if (state.nonfinite_in_a_row > config.optim.max_nonfinite_in_a_row)
          throw Error(detail::concat(
              "stopping: ", state.nonfinite_in_a_row,
              " steps in a row had a non-finite loss or gradient (optim.max_nonfinite_in_a_row = ",
              config.optim.max_nonfinite_in_a_row,
              "); lower optim.lr or raise optim.warmup_steps, then resume from the last "
              "checkpoint"));
      } else {
        state.nonfinite_in_a_row = 0;
        adamw.step(lr, optim::clip_scale(gnorm, config.optim.clip_grad_norm));
      }
      adamw.zero_grad();
      ++state.global_step;
      ++state.step_in_stage;
      ++steps_this_run;
      state.loader = loader.state();
      tokens_this_run += double(tokens);
      if (std::isfinite(loss)) {
        window_loss += loss;
        window_gnorm += gnorm;
        ++window_steps;
      }
      window_masked += masked;
      window_correct += correct;
      window_tokens += double(tokens);

      const bool stage_done = state.step_in_stage == stage.steps;
      if (config.log.every_steps > 0 &&
          (state.global_step % config.log.every_steps == 0 || stage_done) && window_steps > 0) {
        const double secs = seconds_since(window_start);
        const double elapsed = seconds_since(run_start);
        const double acc = window_masked ? double(window_correct) / double(window_masked) : 0.0;
        last_loss = window_loss / double(window_steps);
        last_acc = acc;
        // ETA from this run's token rate and the tokens the remaining steps hold.
        double remaining_tokens = double(stage.steps - state.step_in_stage) *
                                  double(stage.batch_size * stage.max_seq_len);
        for (size_t s = size_t(state.stage) + 1; s < config.stages.size(); ++s)
          remaining_tokens += double(config.stages[s].steps) *
                              double(config.stages[s].batch_size * config.stages[s].max_seq_len);
        const double rate = tokens_this_run / std::max(elapsed, 1e-9);
        const double eta = remaining_tokens * 0.8 / std::max(rate, 1e-9);
        metrics.clear_progress();
        spdlog::info(
            "stage {}/{} step {:>5}/{} | global {:>6}/{} | loss {:.4f} | mlm acc {:5.2f}% | lr "
            "{:.2e} | gnorm {:.3f} | {:.0f} tok/s | {} elapsed, ETA {}",
            state.stage + 1, config.stages.size(), state.step_in_stage, stage.steps,
            state.global_step, total_steps, last_loss, 100 * acc, lr,
            window_gnorm / double(window_steps), window_tokens / std::max(secs, 1e-9),
            format_duration(elapsed), format_duration(eta));
        char loss_exact[64];
        std::snprintf(loss_exact, sizeof loss_exact, "%.9g", loss);
        metrics.write({{"type", "train"},
                       {"stage", state.stage + 1},
                       {"step_in_stage", state.step_in_stage},
                       {"global_step", state.global_step},
                       {"loss", last_loss},
                       {"last_step_loss", loss_exact},
                       {"mlm_accuracy", acc},
                       {"lr", lr},
                       {"grad_norm", window_gnorm / double(window_steps)},
                       {"tokens_per_s", window_tokens / std::max(secs, 1e-9)},
                       {"elapsed_s", elapsed},
                       {"eta_s", eta},
                       {"skipped_steps", state.nonfinite_skipped}});
        window_loss = window_gnorm = window_tokens = 0;
        window_steps = window_masked = window_correct = 0;
        window_start = Clock::now();
      } else {
        metrics.progress(fmt::format("stage {}/{} step {}/{} loss {:.4f}", state.stage + 1,
                                     config.stages.size(), state.step_in_stage, stage.steps, loss));
      }

      const bool eval_now = config.log.eval_every_steps > 0 &&
                            state.global_step % config.log.eval_every_steps == 0 && !stage_done;
      if (eval_now || stage_done) {
        const EvalResult ev = evaluate(stage);
        if (ev.masked > 0) {
          metrics.clear_progress();
          spdlog::info(
              "validation at step {} (max_seq_len {}): loss {:.4f} | mlm acc {:.2f}% | "
              "perplexity {:.1f}",
              state.global_step, stage.max_seq_len, ev.loss, 100 * ev.accuracy, std::exp(ev.loss));
          metrics.write({{"type", "validation"},
                         {"stage", state.stage + 1},
                         {"global_step", state.global_step},
                         {"max_seq_len", stage.max_seq_len},
                         {"loss", ev.loss},
                         {"mlm_accuracy", ev.accuracy},
                         {"perplexity", std::exp(ev.loss)}});
        }
        if (stage_done) {
          summaries.push_back({state.stage, stage.max_seq_len, stage.batch_size, stage.steps,
                               last_loss, last_acc, ev.loss, ev.accuracy});
        }
      }

      if (stage_done) {
        // The checkpoint records where a resumed run starts: the next stage.
        ++state.stage;
        state.step_in_stage = 0;
        save(true);
        --state.stage;  // the for loop advances it
        state.step_in_stage = stage.steps;
      } else if (config.checkpoint.every_steps > 0 &&
                 state.global_step % config.checkpoint.every_steps == 0) {
        save(false);
      }
      if (options.stop && options.stop->requested()) {
        if (!stage_done && !(config.checkpoint.every_steps > 0 &&
                             state.global_step % config.checkpoint.every_steps == 0))
          save(false);
        metrics.clear_progress();
        spdlog::warn(
            "stopped by signal {} after global step {}; resume with the same command "
            "(it continues from {})",
            options.stop->signal_number(), state.global_step, result.last_checkpoint.string());
        result.interrupted = true;
        result.global_step = state.global_step;
        result.stages = summaries;
        return result;
      }
    }
    state.step_in_stage = 0;
  }
  result.finished = true;
  result.global_step = state.global_step;
  result.stages = summaries;
  metrics.clear_progress();
  spdlog::info("finished {} steps ({} skipped) in {}; stage summary:\n{}", state.global_step,
               state.nonfinite_skipped, format_duration(seconds_since(run_start)),
               format_stage_table(summaries));
  (void)steps_this_run;
  return result;
}

}  // namespace roformer
