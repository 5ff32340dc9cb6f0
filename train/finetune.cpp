#include "train/finetune.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <sstream>

#include "core/autograd.h"
#include "core/ops.h"
#include "data/token_batch.h"
#include "data/tokenizer.h"
#include "layers/roformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/communicator.h"
#include "train/distributed/batch_split.h"
#include "train/hf_convert.h"
#include "train/metrics.h"
#include "train/run_device.h"
#include "train/run_precision.h"
#include "train/signals.h"
#include "train/task_data.h"
#include "train/trainer.h"

namespace roformer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kCreatedBy = "roformer finetune";

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

// The classifier network of every task: RoFormerForSequenceClassification
// with num_labels outputs, or 1 output (a score) for triplets, whose logits
// are the two pair scores [s_AB, s_AC].
struct TaskNet {
  FinetuneTask task;
  int64_t num_labels;
  int32_t pad_id;
  int64_t max_seq_len;  // rows are padded to a bucketed length up to this
  Device device;        // where the model runs
  std::unique_ptr<RoFormerForSequenceClassification> model;
  // Token-stream batches (data.unpadded, data.packing): set by the caller.
  bool unpadded = false, packing = false, restart_positions = true;

  // The weights are initialised on the host (the same on every device), then moved.
  TaskNet(const ModelConfig& config, FinetuneTask t, int64_t labels, uint64_t seed, int64_t max_len,
          Device on)
      : task(t),
        num_labels(labels),
        pad_id(int32_t(config.pad_token_id)),
        max_seq_len(max_len),
        device(on),
        model(std::make_unique<RoFormerForSequenceClassification>(
            config, t == FinetuneTask::kTriplet ? 1 : labels, seed)) {
    model->to(device);
  }

  void set_stream(const Config& config) {
    unpadded = uses_token_stream(config.data, config.model, config.run);
    packing = config.data.packing;
    restart_positions = config.data.packing_restart_positions;
  }

  // Logits [B, num_labels] of the examples; *slots (if given): the slots of
  // the padded rows (packing efficiency = real tokens / slots).
  Tensor logits(const std::vector<const EncodedExample*>& batch, bool training, DropoutContext& ctx,
                int64_t* slots = nullptr) const {
    std::vector<const data::Encoding*> rows;  // triplets: (A,B), (A,C) interleaved
    for (const EncodedExample* ex : batch)
      for (const auto& part : ex->parts) rows.push_back(&part);
    const Tensor scores = unpadded ? stream_logits(rows, training, ctx, slots)
                                   : padded_logits(rows, training, ctx, slots);
    if (task == FinetuneTask::kTriplet) return triplet_scores(scores);
    return scores;
  }

  // Each part a document of a token stream (rows of their own, or packed).
  Tensor stream_logits(const std::vector<const data::Encoding*>& rows, bool training,
                       DropoutContext& ctx, int64_t* slots) const {
    std::vector<data::TokenSource> docs;
    for (const auto* r : rows) docs.push_back({r->input_ids, r->token_type_ids, {}});
    const data::TokenBatch tb = data::make_token_batch(docs, packing, max_seq_len);
    if (slots) *slots = tb.padded_slots;
    const Shape shape{tb.num_tokens};
    const Tensor logits = model
                              ->forward(Tensor::from_vector(tb.input_ids, shape, device),
                                        Tensor::from_vector(tb.token_type_ids, shape, device),
                                        TokenLayout::of_rows(tb.rows, restart_positions).to(device),
                                        Tensor(), training, ctx)
                              .logits;
    if (!packing) return logits;  // documents in input order
    std::vector<int64_t> stream_index(tb.order.size());
    for (size_t d = 0; d < tb.order.size(); ++d) stream_index[size_t(tb.order[d])] = int64_t(d);
    return index_select(logits,
                        Tensor::from_vector(stream_index, {int64_t(stream_index.size())}, device));
  }

  Tensor padded_logits(const std::vector<const data::Encoding*>& rows, bool training,
                       DropoutContext& ctx, int64_t* slots) const {
    int64_t S = 0;
    for (const auto* r : rows) S = std::max<int64_t>(S, int64_t(r->input_ids.size()));
    S = data::bucketed_length(S, max_seq_len);
    const int64_t R = int64_t(rows.size());
    std::vector<int32_t> ids(size_t(R * S), pad_id), types(size_t(R * S), 0),
        mask(size_t(R * S), 0);
    for (int64_t i = 0; i < R; ++i)
      for (size_t j = 0; j < rows[size_t(i)]->input_ids.size(); ++j) {
        ids[size_t(i * S) + j] = rows[size_t(i)]->input_ids[j];
        types[size_t(i * S) + j] = rows[size_t(i)]->token_type_ids[j];
        mask[size_t(i * S) + j] = 1;
      }
    if (slots) *slots = R * S;
    const ClassificationOutput out = model->forward(
        Tensor::from_vector(ids, {R, S}, device), Tensor::from_vector(types, {R, S}, device),
        Tensor::from_vector(mask, {R, S}, device), Tensor(), training, ctx);
    return out.logits;
  }
};

std::vector<int64_t> host_labels(const std::vector<const EncodedExample*>& batch) {
  std::vector<int64_t> l;
  for (const auto* ex : batch) l.push_back(ex->label);
  return l;
}
Tensor labels_of(const std::vector<const EncodedExample*>& batch, Device device) {
  return Tensor::from_vector(host_labels(batch), {int64_t(batch.size())}, device);
}

// Loss and predictions of a whole encoded file, without dropout or history.
struct Scored {
  std::vector<int32_t> truth, predicted;
  std::vector<std::vector<float>> probabilities;
  double loss = 0;
};

Scored score(const TaskNet& net, const EncodedTask& task, int64_t batch_size) {
  NoGradGuard no_grad;
  Scored s;
  DropoutContext unused;
  double loss_sum = 0;
  int64_t labelled = 0;
  for (size_t start = 0; start < task.examples.size(); start += size_t(batch_size)) {
    std::vector<const EncodedExample*> batch;
    for (size_t i = start; i < std::min(task.examples.size(), start + size_t(batch_size)); ++i)
      batch.push_back(&task.examples[i]);
    const Tensor logits = net.logits(batch, false, unused);
    const std::vector<float> p = softmax(logits).to_vector<float>();
    const int64_t C = logits.size(1);
    bool all_labelled = true;
    for (size_t b = 0; b < batch.size(); ++b) {
      std::vector<float> row(p.begin() + int64_t(b) * C, p.begin() + int64_t(b + 1) * C);
      s.predicted.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
      s.truth.push_back(batch[b]->label);
      s.probabilities.push_back(std::move(row));
      all_labelled &= batch[b]->label >= 0;
    }
    if (all_labelled) {
      loss_sum += cross_entropy(logits, labels_of(batch, net.device)).item() * double(batch.size());
      labelled += int64_t(batch.size());
    }
  }
  s.loss = labelled ? loss_sum / double(labelled) : NAN;
  return s;
}

EvalReport evaluate_encoded(const TaskNet& net, const EncodedTask& task, int64_t batch_size,
                            const std::vector<std::string>& labels) {
  const Scored s = score(net, task, batch_size);
  EvalReport r = score_predictions(s.truth, s.predicted, labels);
  r.path = task.path;
  r.loss = s.loss;
  r.truncated = task.truncated;
  return r;
}

// The architecture keys of a model config (dropout and init left out, which
// fine-tuning may change), as config.json writes them.
nlohmann::json architecture(const ModelConfig& c) {
  nlohmann::json j = to_hf_config_json(c);
  for (const char* k : {"hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range",
                        "architectures"})
    j.erase(k);
  return j;
}

std::vector<uint32_t> permutation(size_t n, uint64_t seed) {
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = uint32_t(i);
  std::mt19937_64 rng(seed);
  for (size_t i = n; i > 1; --i) {  // Fisher-Yates, so the order is the same everywhere
    const size_t j = size_t(rng() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

data::Tokenizer make_tokenizer(const Config& c) {
  return data::Tokenizer(c.data.vocab, tokenizer_options(c.data));
}

struct InitWeights {
  ModelConfig model;
  StateDict encoder;  // roformer.*
  std::string vocab;
  std::optional<bool> lowercase;
  std::string source;
};

InitWeights load_init(const std::string& path) {
  InitWeights w;
  if (fs::is_directory(path) && fs::exists(fs::path(path) / "config.json")) {
    HfFolder hf = read_hf_folder(path, false);
    w.model = hf.config;
    w.encoder = std::move(hf.parameters);
    w.vocab = hf.vocab.string();
    w.lowercase = hf.lowercase;
    w.source = path;
    return w;
  }
  const fs::path p = resolve_checkpoint(path);
  CheckpointData data = load_checkpoint(p, false);
  const Config saved = parse_config_string(data.config_yaml, p.string());
  w.model = saved.model;
  w.vocab = saved.data.vocab;
  w.lowercase = saved.data.lowercase;
  for (auto& t : data.parameters)
    if (starts_with(t.name, "roformer.")) w.encoder.push_back(std::move(t));
  w.source = p.string();
  return w;
}

// to_yaml writes "stages: []" for a config without stages, which the loader
// refuses even when a finetune section makes stages optional; leave it out.
std::string finetune_yaml(const Config& config) {
  if (!config.stages.empty()) return to_yaml(config);
  std::istringstream in(to_yaml(config));
  std::string out, line;
  bool skipping = false;
  while (std::getline(in, line)) {
    if (line.rfind("stages:", 0) == 0) {
      skipping = true;
      continue;
    }
    if (skipping && !line.empty() && (line[0] == ' ' || line[0] == '-')) continue;
    skipping = false;
    out += line + "\n";
  }
  return out;
}

void save_model(const fs::path& path, const TaskNet& net, const Config& config,
                const TrainingState& state, const optim::AdamW* adamw) {
  CheckpointData data;
  data.state = state;
  data.parameters = net.model->named_parameters();
  if (adamw) {
    data.exp_avg = adamw->exp_avg();
    data.exp_avg_sq = adamw->exp_avg_sq();
    data.optimizer_step = adamw->step_count();
  }
  data.config_yaml = finetune_yaml(config);
  data.created_by =
      std::string(kCreatedBy) + " (task: " + std::string(enum_name(config.finetune->task)) + ")";
  save_checkpoint(path, data);
}

fs::path resolve_task_checkpoint(const fs::path& path) {
  if (fs::is_directory(path) && fs::is_regular_file(path / "best.h5")) return path / "best.h5";
  return resolve_checkpoint(path);
}

// Classification, pair or triplet fine-tuning as a Trainer task: one phase
// per epoch, each epoch's order a pure function of (seed, epoch), validation
// and best.h5 at epoch ends, checkpoints only at epoch ends (an interrupted
// epoch is rerun from its start).
class FinetuneTraining final : public TrainingTask {
 public:
  FinetuneTraining(const Config& config, const EncodedTask& train, const EncodedTask* val,
                   TaskNet& net, fs::path best_path, int rank, int world_size)
      : config_(config),
        spec_(*config.finetune),
        train_(train),
        val_(val),
        net_(net),
        best_path_(std::move(best_path)) {
    rank_ = rank;
    world_size_ = world_size;
    const int64_t n = int64_t(train_.examples.size());
    steps_per_epoch_ = (n + spec_.batch_size - 1) / spec_.batch_size;
    // Data parallelism: each rank takes its contiguous share of every batch.
    per_rank_ = distributed::split_batch(spec_.batch_size, spec_.batch_size, world_size_,
                                         config.source + ": finetune")
                    .per_rank;
    warmup_ = std::llround(spec_.warmup_ratio * double(steps_per_epoch_ * spec_.epochs));
  }

  int64_t warmup_steps() const { return warmup_; }
  double best() const { return best_; }

  Module& model() override { return *net_.model; }
  std::string created_by() const override {
    return std::string(kCreatedBy) + " (task: " + std::string(enum_name(spec_.task)) + ")";
  }
  std::string config_yaml() const override { return finetune_yaml(config_); }
  void check_resume(const Config& saved, const std::string& checkpoint,
                    const TrainingState&) const override {
    std::string what;
    if (!saved.finetune) {
      what = "it is not a fine-tuning checkpoint";
    } else if (!(saved.model == config_.model)) {
      const std::vector<std::string> diff = model_differences(saved, config_);
      what = diff.empty() ? std::string("the model section differs") : diff[0];
    } else if (saved.finetune->task != spec_.task) {
      what = detail::concat("finetune.task: ", enum_name(saved.finetune->task),
                            " in the checkpoint, ", enum_name(spec_.task), " now");
    } else if (saved.finetune->labels != spec_.labels) {
      what = "the label set differs";
    }
    if (!what.empty())
      throw InputError(
          detail::concat("cannot resume from ", checkpoint, ": ", what, " (use a new run.dir)"));
  }

  std::string phase_name() const override { return "epoch"; }
  int64_t num_phases() const override { return spec_.epochs; }
  PhasePlan plan(int64_t) const override {
    return {steps_per_epoch_, 1, per_rank_, spec_.batch_size * spec_.max_seq_len};
  }
  CheckpointPolicy checkpoint_policy() const override {
    return {false, false, std::max<int64_t>(config_.checkpoint.keep_last, 1), false};
  }
  std::string accuracy_key() const override { return "accuracy"; }
  optim::LrSchedule lr_schedule() const override {
    const int64_t total = steps_per_epoch_ * spec_.epochs;
    return optim::LrSchedule(optim::DecayKind::linear, spec_.lr, warmup_, 0.0,
                             {optim::StageLr{total, std::nullopt, std::nullopt}});
  }
  std::pair<std::string, double> lr_setting() const override { return {"finetune.lr", spec_.lr}; }

  void begin_phase(const TrainingState& state, MetricsLog&) override {
    // Each epoch's order depends only on the seed and the epoch: a restarted
    // epoch sees the same batches.
    data_seed_ = config_.run.seed * 1000003ull + uint64_t(state.stage);
    order_ = permutation(train_.examples.size(), data_seed_);
    step_ = 0;
    loss_sum_ = 0;
    correct_ = seen_ = 0;
  }

  std::vector<int64_t> fetch() override {
    const int64_t n = int64_t(train_.examples.size());
    batch_.clear();
    const int64_t first = step_ * spec_.batch_size + rank_ * per_rank_;
    for (int64_t i = first; i < std::min(n, first + per_rank_); ++i)
      batch_.push_back(&train_.examples[order_[size_t(i)]]);
    ++step_;
    return {int64_t(batch_.size())};
  }

  StepStats forward_backward(size_t, double inv_global_units, DropoutContext dropout) override {
    if (batch_.empty()) return {};  // the epoch's last batch may not reach this rank
    StepStats s;
    const Tensor logits = net_.logits(batch_, true, dropout, &s.slots);
    const Tensor labels = labels_of(batch_, net_.device);
    const Tensor loss = cross_entropy(logits, labels);
    const double n = double(batch_.size());
    mul(loss, n * inv_global_units).backward();
    s.units = int64_t(batch_.size());
    const double l = loss.item();
    s.loss_sum = l * n;
    const auto pred = argmax(logits.detach(), 1).to_vector<int64_t>();
    const std::vector<int64_t> truth = host_labels(batch_);
    for (size_t i = 0; i < pred.size(); ++i) s.correct += pred[i] == truth[i];
    for (const EncodedExample* ex : batch_)
      for (const auto& part : ex->parts) s.tokens += int64_t(part.input_ids.size());
    loss_sum_ += s.loss_sum;
    correct_ += s.correct;
    seen_ += s.units;
    return s;
  }

  void end_phase(const TrainingState& state, const PhaseTraining&, MetricsLog& metrics) override {
    const int64_t epoch = state.stage;
    const double train_loss = loss_sum_ / double(seen_),
                 train_acc = double(correct_) / double(seen_);
    nlohmann::json row = {{"epoch", epoch + 1},
                          {"train_loss", train_loss},
                          {"train_accuracy", train_acc},
                          {"data_seed", data_seed_}};
    bool improved = !val_;
    if (val_) {
      const EvalReport r = evaluate_encoded(net_, *val_, spec_.batch_size, spec_.labels);
      row["validation_accuracy"] = r.accuracy;
      row["validation_macro_f1"] = r.macro_f1;
      row["validation_loss"] = r.loss;
      improved = r.accuracy > best_;
      metrics.clear_progress();
      spdlog::info(
          "epoch {}/{}: train loss {:.4f} acc {:.2f}% | validation loss {:.4f} acc {:.2f}% "
          "macro-F1 {:.4f}{}",
          epoch + 1, spec_.epochs, train_loss, 100 * train_acc, r.loss, 100 * r.accuracy,
          r.macro_f1, improved ? " (best so far)" : "");
      if (improved) best_ = r.accuracy;
    } else {
      spdlog::info("epoch {}/{}: train loss {:.4f} acc {:.2f}%", epoch + 1, spec_.epochs,
                   train_loss, 100 * train_acc);
    }
    bad_epochs_ = improved ? 0 : bad_epochs_ + 1;
    {
      nlohmann::json rec = row;
      rec["type"] = "epoch";
      metrics.write(rec);
    }
    history_.push_back(row);
    if (spec_.early_stopping_patience > 0 && bad_epochs_ >= spec_.early_stopping_patience &&
        epoch + 1 < spec_.epochs) {
      stopped_early_ = true;
      spdlog::info("early stopping: {} epochs without a better validation accuracy", bad_epochs_);
    }
    if (improved) {
      TrainingState at_end = state;
      at_end.stage = epoch + 1;
      at_end.step_in_stage = 0;
      at_end.stage_results = save_extra();
      if (rank_ == 0) save_model(best_path_, net_, config_, at_end, nullptr);
    }
  }
  bool stop_early() const override { return stopped_early_; }

  std::string save_extra() const override {
    return nlohmann::json{{"best_validation_accuracy", best_},
                          {"epochs_without_improvement", bad_epochs_},
                          {"stopped_early", stopped_early_},
                          {"history", history_}}
        .dump();
  }
  void load_extra(const std::string& json) override {
    const auto extra = nlohmann::json::parse(json);
    best_ = extra.at("best_validation_accuracy").get<double>();
    bad_epochs_ = extra.at("epochs_without_improvement").get<int64_t>();
    stopped_early_ = extra.value("stopped_early", false);
    history_ = extra.at("history");
  }

 private:
  const Config& config_;
  const FinetuneConfig& spec_;
  const EncodedTask& train_;
  const EncodedTask* val_;
  TaskNet& net_;
  fs::path best_path_;
  int rank_ = 0, world_size_ = 1;
  int64_t per_rank_ = 0;
  int64_t steps_per_epoch_ = 0, warmup_ = 0;
  // The epoch in progress.
  uint64_t data_seed_ = 0;
  std::vector<uint32_t> order_;
  int64_t step_ = 0;
  std::vector<const EncodedExample*> batch_;
  double loss_sum_ = 0;
  int64_t correct_ = 0, seen_ = 0;
  // Across epochs (saved in checkpoints).
  double best_ = -1;
  int64_t bad_epochs_ = 0;
  bool stopped_early_ = false;
  nlohmann::json history_ = nlohmann::json::array();
};

}  // namespace

Tensor triplet_scores(const Tensor& pair_scores) {
  if (pair_scores.dim() != 2 || pair_scores.size(1) != 1 || pair_scores.size(0) % 2 != 0)
    throw Error("triplet_scores: expected [2B, 1] pair scores, got " + pair_scores.desc());
  return pair_scores.reshape({pair_scores.size(0) / 2, 2});
}

EvalReport score_predictions(const std::vector<int32_t>& truth,
                             const std::vector<int32_t>& predicted,
                             const std::vector<std::string>& labels) {
  RF_CHECK(truth.size() == predicted.size(), "score_predictions: sizes differ");
  EvalReport r;
  r.labels = labels;
  const size_t C = labels.size();
  r.confusion.assign(C, std::vector<int64_t>(C, 0));
  int64_t correct = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    if (truth[i] < 0) continue;
    ++r.examples;
    correct += truth[i] == predicted[i];
    r.confusion[size_t(truth[i])][size_t(predicted[i])]++;
  }
  r.accuracy = r.examples ? double(correct) / double(r.examples) : 0.0;
  double f1_sum = 0;
  int64_t counted = 0;
  for (size_t c = 0; c < C; ++c) {
    int64_t tp = r.confusion[c][c], fp = 0, fn = 0;
    for (size_t o = 0; o < C; ++o)
      if (o != c) fp += r.confusion[o][c], fn += r.confusion[c][o];
    if (tp + fp + fn == 0) continue;  // label absent from truth and predictions
    f1_sum += 2.0 * double(tp) / double(2 * tp + fp + fn);
    ++counted;
  }
  r.macro_f1 = counted ? f1_sum / double(counted) : 0.0;
  return r;
}

std::string format_eval_report(const EvalReport& r) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%s: %lld examples, accuracy %.2f%%, macro-F1 %.4f, loss %.4f\n",
                r.path.c_str(), (long long)r.examples, 100 * r.accuracy, r.macro_f1, r.loss);
  out << line;
  if (r.truncated) out << "  " << r.truncated << " examples truncated to max_seq_len\n";
  size_t w = 6;
  for (const auto& l : r.labels) w = std::max(w, l.size());
  out << "confusion matrix (rows: true label, columns: predicted)\n";
  std::snprintf(line, sizeof line, "  %*s", int(w), "");
  out << line;
  for (const auto& l : r.labels) {
    std::snprintf(line, sizeof line, " %*s", int(w), l.c_str());
    out << line;
  }
  out << "\n";
  for (size_t i = 0; i < r.labels.size(); ++i) {
    std::snprintf(line, sizeof line, "  %*s", int(w), r.labels[i].c_str());
    out << line;
    for (int64_t v : r.confusion[i]) {
      std::snprintf(line, sizeof line, " %*lld", int(w), (long long)v);
      out << line;
    }
    out << "\n";
  }
  return out.str();
}

nlohmann::json eval_report_json(const EvalReport& r) {
  return {{"file", r.path},
          {"examples", r.examples},
          {"accuracy", r.accuracy},
          {"macro_f1", r.macro_f1},
          {"loss", std::isfinite(r.loss) ? nlohmann::json(r.loss) : nlohmann::json()},
          {"truncated", r.truncated},
          {"labels", r.labels},
          {"confusion", r.confusion}};
}

FinetuneResult run_finetune(const Config& input_config, const FinetuneOptions& options) {
  require_for(input_config, ConfigUse::kFinetune);
  const Device device = run_device(input_config);  // fails here, before any data is read
  if (input_config.run.threads > 0) omp_set_num_threads(int(input_config.run.threads));
  const RunPrecision precision(input_config);
  Config config = input_config;
  FinetuneConfig& spec = *config.finetune;

  // --- encoder weights and vocabulary -----------------------------------------------
  std::optional<InitWeights> init;
  if (!spec.init_checkpoint.empty()) {
    init = load_init(spec.init_checkpoint);
    const nlohmann::json a = architecture(init->model), b = architecture(config.model);
    if (a != b) {
      std::string diff;
      for (auto it = a.begin(); it != a.end(); ++it)
        if (!b.contains(it.key()) || b[it.key()] != it.value())
          diff += detail::concat("\n  model.", it.key(), ": checkpoint ", it.value().dump(),
                                 ", config ", b.contains(it.key()) ? b[it.key()].dump() : "unset");
      for (auto it = b.begin(); it != b.end(); ++it)
        if (!a.contains(it.key()))
          diff += detail::concat("\n  model.", it.key(), ": checkpoint unset, config ",
                                 it.value().dump());
      throw InputError(detail::concat("finetune.init_checkpoint ", init->source,
                                      " holds a different model than the model section of ",
                                      config.source,
                                      " (copy the checkpoint's model section):", diff));
    }
    if (config.data.vocab.empty()) {
      config.data.vocab = init->vocab;
      if (init->lowercase) config.data.lowercase = *init->lowercase;
    }
  }
  if (config.data.vocab.empty())
    throw InputError(config.source +
                     ": data.vocab: fine-tuning needs a vocab.txt (set data.vocab "
                     "or finetune.init_checkpoint)");
  const data::Tokenizer tokenizer = make_tokenizer(config);
  if (tokenizer.vocab().size() > config.model.vocab_size)
    throw InputError(detail::concat(config.source, ": model.vocab_size is ",
                                    config.model.vocab_size, " but ", config.data.vocab, " has ",
                                    tokenizer.vocab().size(), " pieces"));

  // --- task data --------------------------------------------------------------------
  const TaskFile train_file = read_task_file(spec.train_file, spec, LabelUse::kRequired);
  spec.labels = resolve_labels(spec, train_file);
  const EncodedTask train = encode_task(train_file, tokenizer, spec, spec.labels);
  std::optional<EncodedTask> val;
  if (!spec.validation_file.empty())
    val = encode_task(read_task_file(spec.validation_file, spec, LabelUse::kRequired), tokenizer,
                      spec, spec.labels);
  std::string label_list;
  for (const auto& l : spec.labels) label_list += (label_list.empty() ? "" : ", ") + l;
  spdlog::info(
      "task {}: {} training examples ({} truncated to {} tokens){}, labels: {}",
      std::string(enum_name(spec.task)), train.examples.size(), train.truncated, spec.max_seq_len,
      val ? fmt::format(", {} validation ({} truncated)", val->examples.size(), val->truncated)
          : std::string(", no validation file"),
      label_list);

  // --- model, optimizer, schedule ---------------------------------------------------
  TaskNet net(config.model, spec.task, int64_t(spec.labels.size()), config.run.seed,
              spec.max_seq_len, device);
  net.set_stream(config);
  if (init) {
    std::vector<std::string> missing;
    std::set<std::string> have;
    for (const auto& t : init->encoder) have.insert(t.name);
    for (const auto& p : net.model->named_parameters())
      if (starts_with(p.name, "roformer.") && !have.count(p.name)) missing.push_back(p.name);
    if (!missing.empty())
      throw InputError(detail::concat(init->source, ": ", missing.size(),
                                      " encoder tensors missing, e.g. '", missing[0], "'"));
    try {
      net.model->load_state_dict(init->encoder, /*strict=*/false);
    } catch (const InputError& e) {
      throw InputError(init->source + ": cannot load the encoder: " + e.what());
    }
    spdlog::info("encoder (roformer.*, {} tensors) from {}; fresh classifier head",
                 init->encoder.size(), init->source);
  } else {
    spdlog::info("no finetune.init_checkpoint: training from random weights (no pretraining)");
  }
  const fs::path best_path = fs::path(config.run.dir) / "best.h5";
  const int rank = options.communicator ? options.communicator->rank() : 0;
  FinetuneTraining task(config, train, val ? &*val : nullptr, net, best_path, rank,
                        options.communicator ? options.communicator->world_size() : 1);
  const int64_t total_steps = task.plan(0).steps * spec.epochs;
  spdlog::info("fine-tuning {} parameters for {} epochs ({} steps, {} warm-up) in {}",
               net.model->num_parameters(), spec.epochs, total_steps, task.warmup_steps(),
               config.run.dir);
  Trainer trainer(config, task, options);
  const TrainerResult run = trainer.run();
  FinetuneResult result;
  if (run.interrupted) {
    result.interrupted = true;
    result.epochs_done = run.state.stage;
    return result;
  }
  // Rank 0 evaluates the best model and reports; the other ranks are done.
  if (rank != 0) {
    result.finished = true;
    result.epochs_done = run.state.stage;
    return result;
  }
  const TrainingState& state = run.state;
  const double best = task.best();

  // --- the best model on the validation and test files ----------------------------------
  result.finished = true;
  result.epochs_done = state.stage;
  result.best_checkpoint = best_path;
  result.best_validation_accuracy = best;
  CheckpointData best_ckpt = load_checkpoint(best_path, false);
  net.model->load_state_dict(best_ckpt.parameters);
  if (val) {
    result.validation = evaluate_encoded(net, *val, spec.batch_size, spec.labels);
    spdlog::info("best model ({}) on validation:\n{}", best_path.string(),
                 format_eval_report(*result.validation));
  }
  if (!spec.test_file.empty()) {
    const EncodedTask test = encode_task(read_task_file(spec.test_file, spec, LabelUse::kRequired),
                                         tokenizer, spec, spec.labels);
    result.test = evaluate_encoded(net, test, spec.batch_size, spec.labels);
    spdlog::info("best model on test:\n{}", format_eval_report(*result.test));
    nlohmann::json rec = eval_report_json(*result.test);
    rec["type"] = "test";
    run.metrics->write(rec);  // the run's log: its TensorBoard file too
  }
  return result;
}

// --- TaskModel ---------------------------------------------------------------------------

struct TaskModel::Impl {
  Config config;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<TaskNet> net;
};

TaskModel::TaskModel(const fs::path& checkpoint, Device device) : impl_(std::make_unique<Impl>()) {
  const fs::path path = resolve_task_checkpoint(checkpoint);
  CheckpointData data = load_checkpoint(path, false);
  impl_->config = parse_config_string(data.config_yaml, path.string());
  const bool has_head =
      std::any_of(data.parameters.begin(), data.parameters.end(),
                  [](const NamedTensor& t) { return starts_with(t.name, "classifier."); });
  if (!impl_->config.finetune || impl_->config.finetune->labels.empty() || !has_head)
    throw InputError(path.string() +
                     ": not a fine-tuned checkpoint (no classifier head or task labels); "
                     "`roformer predict --text` does fill-mask with pretraining checkpoints");
  const FinetuneConfig& spec = *impl_->config.finetune;
  impl_->tokenizer = std::make_unique<data::Tokenizer>(make_tokenizer(impl_->config));
  impl_->net = std::make_unique<TaskNet>(impl_->config.model, spec.task,
                                         int64_t(spec.labels.size()), 0, spec.max_seq_len, device);
  impl_->net->model->load_state_dict(data.parameters);
  impl_->net->set_stream(impl_->config);
  impl_->net->model->eval();
}

TaskModel::~TaskModel() = default;

const Config& TaskModel::config() const {
  return impl_->config;
}
const std::vector<std::string>& TaskModel::labels() const {
  return impl_->config.finetune->labels;
}

EvalReport TaskModel::evaluate(const std::string& path, const FinetuneConfig& file_spec) const {
  FinetuneConfig spec = file_spec;
  const FinetuneConfig& model_spec = *impl_->config.finetune;
  if (spec.task != model_spec.task)
    throw InputError(detail::concat("the checkpoint was fine-tuned for task ",
                                    enum_name(model_spec.task), ", the config says ",
                                    enum_name(spec.task)));
  spec.max_seq_len = std::min(spec.max_seq_len, impl_->config.model.max_position_embeddings);
  const EncodedTask task = encode_task(read_task_file(path, spec, LabelUse::kRequired),
                                       *impl_->tokenizer, spec, labels());
  return evaluate_encoded(*impl_->net, task, spec.batch_size, labels());
}

int64_t TaskModel::predict(const std::string& path, std::ostream& out) const {
  const FinetuneConfig& spec = *impl_->config.finetune;
  const EncodedTask task = encode_task(read_task_file(path, spec, LabelUse::kIgnored),
                                       *impl_->tokenizer, spec, labels());
  const Scored s = score(*impl_->net, task, spec.batch_size);
  for (size_t i = 0; i < task.examples.size(); ++i) {
    nlohmann::ordered_json row;
    row["line"] = task.examples[i].line;
    row["label"] = labels()[size_t(s.predicted[i])];
    nlohmann::ordered_json probs;
    for (size_t c = 0; c < labels().size(); ++c) probs[labels()[c]] = s.probabilities[i][c];
    row["probabilities"] = probs;
    out << row.dump() << "\n";
  }
  if (task.truncated)
    spdlog::warn("{}: {} examples truncated to {} tokens", path, task.truncated, spec.max_seq_len);
  return int64_t(task.examples.size());
}

bool is_finetuned_checkpoint(const fs::path& checkpoint) {
  const fs::path path = resolve_task_checkpoint(checkpoint);
  const CheckpointData data = load_checkpoint(path, false);
  return data.created_by.rfind(kCreatedBy, 0) == 0;
}

}  // namespace roformer
