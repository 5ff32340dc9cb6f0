#include "train/pretrain.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/batch_upload.h"
#include "core/ops.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/token_batch.h"
#include "data/tokenizer.h"
#include "data/vocab.h"
#include "layers/roformer.h"
#include "train/communicator.h"
#include "train/config_stages.h"
#include "train/distributed/batch_split.h"
#include "train/metrics.h"
#include "train/run_device.h"
#include "train/run_precision.h"
#include "train/telemetry.h"

namespace roformer {

namespace {

struct BatchTensors {
  Tensor ids, types, mask, labels;
};

// A micro-batch cut into a token stream, its inputs on the model's device.
struct StreamTensors {
  data::TokenBatch batch;
  TokenLayout layout;
  Tensor ids, types, labels;  // labels on the host
};

// The model's inputs on its device (through `uploader`: pinned memory and a
// side stream on a GPU); the labels stay on the host, where forward_mlm picks
// the masked rows.
BatchTensors to_tensors(const data::Batch& b, BatchUploader& uploader) {
  const Shape shape{b.batch_size, b.seq_len};
  return {uploader.upload(Tensor::from_vector<int32_t>(b.input_ids, shape)),
          uploader.upload(Tensor::from_vector<int32_t>(b.token_type_ids, shape)),
          uploader.upload(Tensor::from_vector<int32_t>(b.attention_mask, shape)),
          Tensor::from_vector<int32_t>(b.labels, shape)};
}

// The real tokens of a padded batch (rows are [CLS] ... [SEP] then padding),
// one document per row, packed into shared rows when `packing`.
data::TokenBatch unpad(const data::Batch& b, bool packing, int64_t max_seq_len) {
  std::vector<data::TokenSource> docs;
  for (int64_t r = 0; r < b.batch_size; ++r) {
    const size_t first = size_t(r * b.seq_len);
    size_t len = 0;
    while (len < size_t(b.seq_len) && b.attention_mask[first + len] != 0) ++len;
    if (len == 0) continue;
    docs.push_back({std::span(b.input_ids).subspan(first, len),
                    std::span(b.token_type_ids).subspan(first, len),
                    std::span(b.labels).subspan(first, len)});
  }
  return data::make_token_batch(docs, packing, max_seq_len);
}

data::MaskingOptions masking_options(const DataConfig& d, const ResolvedStage& stage) {
  data::MaskingOptions m;
  m.mask_prob = stage.mask_prob;
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

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}
double number_or_nan(const nlohmann::json& row, const char* key) {
  return row.contains(key) && !row.at(key).is_null() ? row.at(key).get<double>() : NAN;
}

// Masked-LM pretraining through the config's stages.
class PretrainTask final : public TrainingTask {
 public:
  PretrainTask(const Config& config, Device device, Communicator& comm)
      : config_(config),
        comm_(comm),
        rank_(comm.rank()),
        world_size_(comm.world_size()),
        token_stream_(uses_token_stream(config.data, config.model, config.run)),
        uploader_(device) {
    vocab_ = std::make_shared<const data::Vocab>(data::Vocab::load(config.data.vocab));
    if (vocab_->size() > config.model.vocab_size)
      throw InputError(detail::concat(config.source, ": model.vocab_size is ",
                                      config.model.vocab_size, " but ", config.data.vocab, " has ",
                                      vocab_->size(), " pieces"));
    identity_ = data::Tokenizer(vocab_, tokenizer_options(config.data)).identity();
    for (size_t i = 0; i < config.stages.size(); ++i) {
      stages_.push_back(resolve_stage(config, i));
      shards(stages_.back().shard_dir);  // every stage's data is checked before training
    }
    // Every stage's cut over ranks and micro-batches, refused before training if it does not
    // divide.
    for (size_t i = 0; i < stages_.size(); ++i) splits_.push_back(split_batch(int64_t(i)));
    model_ = std::make_unique<RoFormerForMaskedLM>(config.model, config.run.seed);
    // Initialised on the host (the same weights on every device), then moved.
    model_->to(device);
  }

  Module& model() override { return *model_; }
  std::string created_by() const override { return "roformer pretrain"; }
  std::string config_yaml() const override { return to_yaml(config_); }

  void check_resume(const Config& saved, const std::string& checkpoint,
                    const TrainingState& state) const override {
    if (!(saved.model == config_.model)) {
      const std::vector<std::string> diff = model_differences(saved, config_);
      std::string what = diff.empty() ? std::string("the model section differs") : diff[0];
      if (diff.size() > 1) what += detail::concat(" (and ", diff.size() - 1, " more)");
      throw InputError(detail::concat("cannot resume ", checkpoint, ": ", what, " (",
                                      config_.source,
                                      "); a checkpoint only continues the model it was made with "
                                      "(use another run.dir for a new model)"));
    }
    const int64_t cur = state.stage;
    if (cur < int64_t(config_.stages.size()) && cur < int64_t(saved.stages.size()) &&
        state.step_in_stage > 0 &&
        saved.stages[size_t(cur)].max_seq_len != config_.stages[size_t(cur)].max_seq_len)
      throw InputError(
          detail::concat("cannot resume ", checkpoint, ": stage ", cur + 1,
                         " is in progress at max_seq_len ", saved.stages[size_t(cur)].max_seq_len,
                         ", the config now says ", config_.stages[size_t(cur)].max_seq_len));
    for (const std::string& line : changed_lines(saved, config_))
      spdlog::info("config changed since the checkpoint: {}", line);
  }

  std::string phase_name() const override { return "stage"; }
  int64_t num_phases() const override { return int64_t(config_.stages.size()); }
  PhasePlan plan(int64_t phase) const override {
    const ResolvedStage& s = stages_[size_t(phase)];
    const distributed::BatchSplit& split = splits_[size_t(phase)];
    PhasePlan p;
    p.steps = s.steps;
    p.micro_batch_size = split.micro_batch_size;
    p.micro_batches = split.micro_batches;
    p.tokens_per_step = s.batch_size * s.max_seq_len;
    p.weight_decay = s.weight_decay;
    p.token_budget = s.tokens.value_or(0.0);
    return p;
  }
  double phase_tokens(int64_t phase, int64_t steps) const override {
    return stages_[size_t(phase)].tokens_through(steps);
  }
  CheckpointPolicy checkpoint_policy() const override {
    return {true, true, config_.checkpoint.keep_last, config_.checkpoint.keep_stage_ends};
  }
  std::string accuracy_key() const override { return "mlm_accuracy"; }
  optim::LrSchedule lr_schedule() const override { return make_lr_schedule(config_); }
  std::pair<std::string, double> lr_setting() const override {
    const StageConfig& s = config_.stages[size_t(current_stage_)];
    if (s.lr) return {detail::concat("stages.", current_stage_, ".lr"), *s.lr};
    return {"optim.lr", config_.optim.lr};
  }

  void begin_phase(const TrainingState& state, MetricsLog& metrics) override {
    const ResolvedStage& stage = stages_[size_t(state.stage)];
    current_stage_ = state.stage;
    step_in_stage_ = state.step_in_stage;
    // The RoPE base only changes the rotation tables, never a parameter.
    model_->set_rope_base(stage.rope_base);
    loader_.reset();  // its buffers go before the next stage's are made
    data::LoaderOptions lo;
    lo.max_seq_len = stage.max_seq_len;
    lo.batch_size = splits_[size_t(state.stage)].micro_batch_size;
    lo.seed = config_.run.seed;
    lo.rank = rank_;
    lo.world_size = world_size_;
    lo.masking = masking_options(config_.data, stage);
    lo.prefetch_batches = int(config_.data.prefetch_batches);
    loader_ =
        std::make_unique<data::Loader>(shards(stage.shard_dir).train, vocab_, lo, state.loader);
    metrics.clear_progress();
    const distributed::BatchSplit& split = splits_[size_t(state.stage)];
    // With several ranks, how the global batch is cut (one rank: the stage line says it).
    const std::string ranks = world_size_ > 1
                                  ? fmt::format(", {} rank(s) x {} x {} sequences", world_size_,
                                                split.micro_batches, split.micro_batch_size)
                                  : std::string();
    spdlog::info("stage {}/{}{}: {}{}, {} sequences per epoch", state.stage + 1, stages_.size(),
                 state.step_in_stage > 0 ? fmt::format(" (resumed at step {})", state.step_in_stage)
                                         : std::string(),
                 describe_stage(stage), ranks, loader_->num_sequences());
    if (state.step_in_stage == 0) {
      nlohmann::json record = {{"type", "stage"},
                               {"stage", state.stage + 1},
                               {"global_step", state.global_step},
                               {"max_seq_len", stage.max_seq_len},
                               {"batch_size", stage.batch_size},
                               {"steps", stage.steps},
                               {"lr", stage.lr},
                               {"weight_decay", stage.weight_decay},
                               {"mask_prob", stage.mask_prob},
                               {"rope_base", stage.rope_base}};
      if (stage.tokens) record["tokens"] = *stage.tokens;
      if (!stage.warm_up.empty()) {
        record["batch_warmup_start"] = stage.warm_up.front().batch;
        record["batch_warmup_steps"] = stage.warm_up.back().end_step;
        // (end step, batch) levels, so `roformer plot` counts tokens exactly.
        nlohmann::json levels = nlohmann::json::array();
        for (const BatchLevel& l : stage.warm_up) levels.push_back({l.end_step, l.batch});
        record["batch_warmup"] = levels;
      }
      metrics.write(record);
    }
  }

  // A padded micro-batch cut into its token stream, the ids, types and
  // layout sent through the uploader (pinned memory, side stream on a GPU);
  // the labels stay on the host, where forward_mlm picks the masked rows.
  StreamTensors to_stream(const data::Batch& b) {
    StreamTensors t;
    t.batch = unpad(b, config_.data.packing, config_.stages[size_t(current_stage_)].max_seq_len);
    const data::TokenBatch& tb = t.batch;
    const Shape shape{tb.num_tokens};
    t.layout = TokenLayout::of_rows(tb.rows, config_.data.packing_restart_positions)
                   .with_tensors([this](const Tensor& x) { return uploader_.upload(x); });
    t.ids = uploader_.upload(Tensor::from_vector(tb.input_ids, shape));
    t.types = uploader_.upload(Tensor::from_vector(tb.token_type_ids, shape));
    t.labels = Tensor::from_vector(tb.labels, shape);
    return t;
  }

  std::vector<int64_t> fetch() override {
    const ResolvedStage& stage = stages_[size_t(current_stage_)];
    // The batch-size warm-up draws fewer micro-batches of the same shape: no
    // new kernels, and the loader cursor stays exact for resume.
    const int64_t micro_batches = stage.batch_at(step_in_stage_) / world_size_ /
                                  splits_[size_t(current_stage_)].micro_batch_size;
    ++step_in_stage_;
    batches_.clear();
    inputs_.clear();
    streams_.clear();
    std::vector<int64_t> units;
    for (int64_t i = 0; i < micro_batches; ++i) {
      batches_.push_back(loader_->next());
      units.push_back(batches_.back().num_masked);
      // Queued on the side stream: the copies overlap the previous step's tail.
      if (token_stream_)
        streams_.push_back(to_stream(batches_.back()));
      else
        inputs_.push_back(to_tensors(batches_.back(), uploader_));
    }
    uploader_.publish();
    return units;
  }

  StepStats forward_backward(size_t i, double inv_global_units, DropoutContext dropout) override {
    const data::Batch& b = batches_[i];
    // A token stream's slots and attention FLOPs are those of its rows, not
    // of the padded batch.
    const data::TokenBatch* stream = token_stream_ ? &streams_[i].batch : nullptr;
    StepStats s;
    s.tokens = b.num_tokens;
    s.slots = stream ? stream->padded_slots : b.batch_size * b.seq_len;
    s.flops = mlm_training_flops(config_.model,
                                 stream ? token_stream_keys(stream->rows) : double(b.seq_len),
                                 b.num_tokens, b.num_masked);
    if (b.num_masked == 0) return s;
    MlmOutput out;
    if (stream) {
      const StreamTensors& t = streams_[i];
      out = model_->forward_mlm(t.ids, t.types, t.layout, t.labels, true, dropout);
    } else {
      const BatchTensors& t = inputs_[i];
      out = model_->forward_mlm(t.ids, t.types, t.mask, t.labels, true, dropout);
    }
    mul(out.loss, double(out.num_masked) * inv_global_units).backward();
    s.units = out.num_masked;
    const auto [loss, correct] = out.read();
    s.loss_sum = loss * double(out.num_masked);
    s.correct = correct;
    return s;
  }

  data::LoaderState cursor() const override { return loader_->state(); }

  void evaluate_within_phase(const TrainingState& state, MetricsLog& metrics) override {
    evaluate_and_log(state, metrics);
  }

  void end_phase(const TrainingState& state, const PhaseTraining& training,
                 MetricsLog& metrics) override {
    const StageConfig& stage = config_.stages[size_t(state.stage)];
    const Eval ev = evaluate_and_log(state, metrics);
    if (config_.log.eval_every_length) {
      // Every other length once, at the first stage that runs it.
      std::vector<int64_t> done = {stage.max_seq_len};
      for (const ResolvedStage& other : stages_) {
        if (std::find(done.begin(), done.end(), other.max_seq_len) != done.end()) continue;
        done.push_back(other.max_seq_len);
        model_->set_rope_base(other.rope_base);
        evaluate_and_log(state, metrics, &other);
      }
      model_->set_rope_base(stages_[size_t(state.stage)].rope_base);
    }
    const MemoryUsage mem = memory_usage();
    summaries_.push_back({state.stage, stage.max_seq_len, stage.batch_size, stage.steps,
                          training.window_loss, training.window_accuracy, ev.loss, ev.accuracy,
                          mem.peak_allocated_mb, mem.peak_rss_mb});
    metrics.write({{"type", "stage_end"},
                   {"stage", state.stage + 1},
                   {"global_step", state.global_step},
                   {"peak_allocated_mb", mem.peak_allocated_mb},
                   {"cached_mb", mem.cached_mb},
                   {"peak_rss_mb", mem.peak_rss_mb}});
  }

  std::string save_extra() const override {
    nlohmann::json rows = nlohmann::json::array();
    for (const StageSummary& s : summaries_)
      rows.push_back({{"stage", s.stage},
                      {"max_seq_len", s.max_seq_len},
                      {"batch_size", s.batch_size},
                      {"steps", s.steps},
                      {"train_loss", number_or_null(s.train_loss)},
                      {"train_accuracy", number_or_null(s.train_accuracy)},
                      {"val_loss", number_or_null(s.val_loss)},
                      {"val_accuracy", number_or_null(s.val_accuracy)},
                      {"peak_allocated_mb", number_or_null(s.peak_allocated_mb)},
                      {"peak_rss_mb", number_or_null(s.peak_rss_mb)}});
    return rows.dump();
  }
  void load_extra(const std::string& json) override {
    summaries_.clear();
    for (const auto& row : nlohmann::json::parse(json.empty() ? "[]" : json)) {
      StageSummary s;
      s.stage = row.at("stage");
      s.max_seq_len = row.at("max_seq_len");
      s.batch_size = row.at("batch_size");
      s.steps = row.at("steps");
      s.train_loss = number_or_nan(row, "train_loss");
      s.train_accuracy = number_or_nan(row, "train_accuracy");
      s.val_loss = number_or_nan(row, "val_loss");
      s.val_accuracy = number_or_nan(row, "val_accuracy");
      s.peak_allocated_mb = number_or_nan(row, "peak_allocated_mb");
      s.peak_rss_mb = number_or_nan(row, "peak_rss_mb");
      summaries_.push_back(s);
    }
  }

  const std::vector<StageSummary>& summaries() const { return summaries_; }

 private:
  // The stage's global batch over this run's ranks; throws naming the stage.
  distributed::BatchSplit split_batch(int64_t stage) const {
    const StageConfig& s = config_.stages[size_t(stage)];
    const std::string where = detail::concat(config_.source, ": stages[", stage, "]");
    const distributed::BatchSplit split =
        distributed::split_batch(s.batch_size, s.micro_batch_size, world_size_, where);
    // A warm-up level runs fewer micro-batches of the same shape on every rank.
    for (const BatchLevel& level : stages_[size_t(stage)].warm_up)
      if (level.batch % (int64_t(world_size_) * split.micro_batch_size) != 0)
        throw InputError(detail::concat(
            where, ": batch_warmup level of ", level.batch, " sequences does not split into ",
            world_size_, " rank(s) x whole micro-batches of ", split.micro_batch_size,
            " (make batch_warmup_start a multiple of ",
            int64_t(world_size_) * split.micro_batch_size, ")"));
    return split;
  }

  struct Eval {
    double loss = NAN, accuracy = NAN;
    int64_t masked = 0;
  };

  // Validation at the stage's length over a fixed, unshuffled set of batches,
  // shared out over the ranks (batch i on rank i mod world size) and summed.
  Eval evaluate(const ResolvedStage& stage) const {
    Eval r;
    const data::ShardSet& val_shards = shards(stage.shard_dir).validation;
    if (val_shards.empty() || config_.log.eval_batches <= 0) return r;
    data::LoaderOptions o;
    o.max_seq_len = stage.max_seq_len;
    o.batch_size = stage.micro_batch_size;
    o.seed = config_.run.seed + 7;  // fixed masks: every evaluation sees the same task
    o.shuffle = false;
    o.masking = masking_options(config_.data, stage);
    o.prefetch_batches = 0;
    data::Loader val(val_shards, vocab_, o);
    NoGradGuard no_grad;
    double loss_sum = 0;
    int64_t correct = 0;
    data::LoaderState at;
    const int64_t n = std::min<int64_t>(config_.log.eval_batches, val.batches_per_epoch());
    for (int64_t i = 0; i < n; ++i) {
      const data::LoaderState here = at;
      at = val.advance(at);
      if (i % world_size_ != rank_) continue;
      const data::Batch b = val.batch_at(here);
      if (b.num_masked == 0) continue;
      const BatchTensors t = to_tensors(b, uploader_);
      uploader_.publish();
      DropoutContext unused;
      const MlmOutput out = model_->forward_mlm(t.ids, t.types, t.mask, t.labels, false, unused);
      const auto [loss, right] = out.read();
      loss_sum += loss * double(out.num_masked);
      correct += right;
      r.masked += out.num_masked;
    }
    if (world_size_ > 1) {
      double d[1] = {loss_sum};
      int64_t c[2] = {correct, r.masked};
      comm_.all_reduce_sum(d);
      comm_.all_reduce_sum(c);
      loss_sum = d[0];
      correct = c[0];
      r.masked = c[1];
    }
    if (r.masked > 0) {
      r.loss = loss_sum / double(r.masked);
      r.accuracy = double(correct) / double(r.masked);
    }
    return r;
  }

  // Validation at the current stage's settings, or at `other` stage's.
  Eval evaluate_and_log(const TrainingState& state, MetricsLog& metrics,
                        const ResolvedStage* other = nullptr) const {
    const ResolvedStage& stage = other ? *other : stages_[size_t(state.stage)];
    const Eval ev = evaluate(stage);
    if (ev.masked > 0) {
      metrics.clear_progress();
      spdlog::info(
          "validation at step {} (max_seq_len {}): loss {:.4f} | mlm acc {:.2f}% | perplexity "
          "{:.1f}",
          state.global_step, stage.max_seq_len, ev.loss, 100 * ev.accuracy, std::exp(ev.loss));
      metrics.write({{"type", "validation"},
                     {"stage", state.stage + 1},
                     {"global_step", state.global_step},
                     {"max_seq_len", stage.max_seq_len},
                     {"loss", ev.loss},
                     {"mlm_accuracy", ev.accuracy},
                     {"perplexity", std::exp(ev.loss)}});
    }
    return ev;
  }

  struct Shards {
    data::ShardSet train, validation;
  };
  // The shards of a stage's shard_dir, opened once.
  const Shards& shards(const std::string& dir) const {
    if (auto it = shards_.find(dir); it != shards_.end()) return it->second;
    const std::vector<std::string> train_paths = data::list_shards(dir, "train");
    if (train_paths.empty())
      throw InputError(
          "no training shards in " + dir + " (run `roformer prepare --config " + config_.source +
          "` first" + (dir == config_.data.shard_dir ? ")" : ", with data.shard_dir=" + dir + ")"));
    Shards s;
    s.train = data::open_shards(train_paths, &identity_);
    const std::vector<std::string> val_paths = data::list_shards(dir, "validation");
    if (!val_paths.empty()) s.validation = data::open_shards(val_paths, &identity_);
    return shards_.emplace(dir, std::move(s)).first->second;
  }

  const Config& config_;
  Communicator& comm_;
  int rank_, world_size_;
  const bool token_stream_;  // micro-batches run as token streams (data.unpadded)
  std::shared_ptr<const data::Vocab> vocab_;
  data::TokenizerIdentity identity_;
  std::vector<ResolvedStage> stages_;
  std::vector<distributed::BatchSplit> splits_;  // per stage, from split_batch
  mutable std::map<std::string, Shards> shards_;
  std::unique_ptr<RoFormerForMaskedLM> model_;
  std::unique_ptr<data::Loader> loader_;
  int64_t current_stage_ = 0;
  int64_t step_in_stage_ = 0;  // of the next fetch()
  std::vector<data::Batch> batches_;
  std::vector<BatchTensors> inputs_;    // batches_ on the model's device (padded)
  std::vector<StreamTensors> streams_;  // or cut into token streams
  // Mutable: evaluate() is const but uploads its batches too.
  mutable BatchUploader uploader_;
  std::vector<StageSummary> summaries_;
};

}  // namespace

std::string format_stage_table(const std::vector<StageSummary>& stages) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %8s %6s %7s %10s %9s %9s %8s %10s %9s\n", "stage",
                "max_len", "batch", "steps", "train_loss", "train_acc", "val_loss", "val_acc",
                "peak_alloc", "peak_rss");
  out << line;
  for (const StageSummary& s : stages) {
    std::snprintf(line, sizeof line,
                  "%-6lld %8lld %6lld %7lld %10.4f %8.2f%% %9.4f %7.2f%% %8.0fMB %7.0fMB\n",
                  (long long)s.stage + 1, (long long)s.max_seq_len, (long long)s.batch_size,
                  (long long)s.steps, s.train_loss, 100 * s.train_accuracy, s.val_loss,
                  100 * s.val_accuracy, s.peak_allocated_mb, s.peak_rss_mb);
    out << line;
  }
  return out.str();
}

PretrainResult run_pretrain(const Config& config, const PretrainOptions& options) {
  require_for(config, ConfigUse::kPretrain);
  const Device device = run_device(config);  // fails here, before any data is read
  const RunPrecision precision(config);
  SingleProcessCommunicator single;
  Communicator& comm = options.communicator ? *options.communicator : single;
  if (config.run.threads > 0) omp_set_num_threads(int(config.run.threads));

  PretrainTask task(config, device, comm);
  Trainer trainer(config, task, options);
  const TrainerResult r = trainer.run();
  PretrainResult result;
  result.global_step = r.state.global_step;
  result.finished = r.finished;
  result.interrupted = r.interrupted;
  result.last_checkpoint = r.last_checkpoint;
  result.stages = task.summaries();
  return result;
}

}  // namespace roformer
