#include "train/memory_estimate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/adamw.h"

namespace roformer {

namespace {

constexpr double kF32 = 4.0;

// A key the estimate depends on, with a way to set it back to a modest value:
// the key whose reset shrinks the estimate most is the one to blame.
struct Knob {
  std::string key;
  int64_t value;
  std::function<void()> reset;
};

// /proc/meminfo "Name:   123 kB" in bytes, or -1.
double meminfo(const std::string& name) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == name + ":") return value * 1024.0;
  }
  return -1;
}

// A cgroup v2 limit still free, or infinity when there is none.
double cgroup_free() {
  std::ifstream max_file("/sys/fs/cgroup/memory.max"),
      current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  double current = 0;
  if (!(max_file >> max_text) || max_text == "max" || !(current_file >> current))
    return std::numeric_limits<double>::infinity();
  try {
    return std::max(0.0, std::stod(max_text) - current);
  } catch (const std::exception&) {
    return std::numeric_limits<double>::infinity();
  }
}

}  // namespace

double estimate_parameter_count(const ModelConfig& m) {
  const double V = double(m.vocab_size), E = double(m.embedding_dim()), H = double(m.hidden_size),
               L = double(m.num_hidden_layers), I = double(m.intermediate_size),
               P = double(m.max_position_embeddings), T = double(m.type_vocab_size);
  double embeddings = V * E + T * E + 2 * E;
  if (m.position == PositionEncoding::kAbsolute) embeddings += P * E;
  if (E != H) embeddings += E * H + H;
  const double layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H;
  const double head = H * E + E + 2 * E + V;  // transform, LayerNorm, decoder bias (weight tied)
  return embeddings + L * layer + head;
}

MemoryEstimate estimate_memory(const ModelConfig& m, MemoryUse use, int64_t batch,
                               int64_t micro_batch, int64_t seq_len, DataParallel dp) {
  MemoryEstimate e;
  const double params = estimate_parameter_count(m);
  e.parameters = params * kF32;
  const double H = double(m.hidden_size), I = double(m.intermediate_size),
               L = double(m.num_hidden_layers), heads = double(m.num_attention_heads),
               V = double(m.vocab_size), E = double(m.embedding_dim()), S = double(seq_len);
  // A rank's micro-batches come from its share of the global batch.
  const double B = double(std::min(micro_batch, std::max<int64_t>(1, batch / dp.world_size)));
  const double tokens = B * S;
  const bool softmax = m.attention == AttentionKind::kSoftmax;
  switch (use) {
    case MemoryUse::kTraining: {
      e.gradients = e.parameters;
      // exp_avg and exp_avg_sq; with ZeRO-1 the first (largest) share of
      // the flat buffer, whole alignment units (optim/adamw.h).
      double share = params;
      if (dp.shards_moments()) {
        const double unit = double(optim::AdamW::kShardAlignment);
        share = std::min(params, std::ceil(params / double(dp.world_size) / unit) * unit);
      }
      e.moments = 2 * share * kF32;
      // Per layer backward keeps the block inputs, Q/K/V and their rotated
      // copies, the context, the FFN's two activations and dropout masks;
      // softmax attention also keeps a probability matrix per head.
      const double per_layer = tokens * (12 * H + 3 * I) + (softmax ? 2 * B * heads * S * S : 0);
      // Embeddings, and logits over the vocabulary at the ~15% masked tokens.
      const double outside = tokens * 3 * E + 0.15 * tokens * V * 2;
      e.activations = (L * per_layer + outside) * kF32;
      e.batch = double(batch) * S * 16;  // ids, token types, attention mask, labels (int32)
      break;
    }
    case MemoryUse::kInference: {
      const double one_layer = tokens * (4 * H + I) + (softmax ? B * heads * S * S : 0);
      e.activations = (one_layer + tokens * E) * kF32;
      break;
    }
    case MemoryUse::kConvert:
      e.activations = e.parameters;  // the file's tensors next to the model's
      break;
  }
  return e;
}

double available_memory_bytes() {
  double available = meminfo("MemAvailable");
  if (available < 0) {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    available = pages > 0 && page > 0 ? double(pages) * double(page)
                                      : std::numeric_limits<double>::infinity();
  }
  const double swap = meminfo("SwapFree");
  if (swap > 0) available += swap;
  return std::min(available, cgroup_free());
}

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) bytes /= 1024, ++unit;
  if (bytes >= 1024) return fmt::format("{:.3g} {}", bytes, kUnits[unit]);
  return fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

namespace {

// Refuses when `estimate()` exceeds the memory available, blaming the knob
// whose reset lowers the estimate most.
void check(const std::function<MemoryEstimate()>& estimate, std::vector<Knob> knobs,
           const std::string& what, DataParallel dp = {}) {
  const MemoryEstimate e = estimate();
  const double available = available_memory_bytes();
  if (e.total() <= available) return;
  std::string blame;
  double best = e.total();
  for (Knob& knob : knobs) {
    knob.reset();  // each reset starts again from the user's values
    const double reduced = estimate().total();
    if (reduced < best) {
      best = reduced;
      blame = fmt::format("{}={}", knob.key, knob.value);
    }
  }
  std::string moments = format_bytes(e.moments);
  if (dp.shards_moments()) moments += fmt::format(" (ZeRO-1: this rank's 1/{})", dp.world_size);
  throw InputError(fmt::format(
      "{}{} needs an estimated {} of memory{} (parameters {}, gradients {}, AdamW moments {}, "
      "activations {}, batch buffers {}) but {} is available; reduce {}",
      blame.empty() ? "" : blame + ": ", what, format_bytes(e.total()),
      dp.world_size > 1 ? fmt::format(" per rank of {}", dp.world_size) : "",
      format_bytes(e.parameters), format_bytes(e.gradients), moments, format_bytes(e.activations),
      format_bytes(e.batch), format_bytes(available),
      blame.empty() ? "the model or the batch" : blame.substr(0, blame.find('='))));
}

// Knobs over the model keys; `model` is the copy the estimate reads and
// `original` the user's values.
void add_model_knobs(std::vector<Knob>& knobs, ModelConfig& model, const ModelConfig& original,
                     const std::string& prefix) {
  const ModelConfig defaults;
  auto knob = [&](const char* key, int64_t ModelConfig::*field) {
    if (original.*field <= defaults.*field) return;
    knobs.push_back({prefix + key, original.*field, [&model, &original, field, defaults] {
                       model = original;
                       model.*field = defaults.*field;
                     }});
  };
  knob("vocab_size", &ModelConfig::vocab_size);
  knob("hidden_size", &ModelConfig::hidden_size);
  knob("num_hidden_layers", &ModelConfig::num_hidden_layers);
  knob("num_attention_heads", &ModelConfig::num_attention_heads);
  knob("intermediate_size", &ModelConfig::intermediate_size);
  knob("max_position_embeddings", &ModelConfig::max_position_embeddings);
  knob("type_vocab_size", &ModelConfig::type_vocab_size);
  if (original.embedding_size && *original.embedding_size > defaults.hidden_size)
    knobs.push_back({prefix + "embedding_size", *original.embedding_size, [&model, &original] {
                       model = original;
                       model.embedding_size.reset();
                       model.hidden_size = std::min<int64_t>(model.hidden_size, 768);
                     }});
}

}  // namespace

void check_memory_for_pretraining(const Config& config, int64_t world_size) {
  const DataParallel dp{world_size, config.distributed.zero};
  for (size_t i = 0; i < config.stages.size(); ++i) {
    const StageConfig& original = config.stages[i];
    ModelConfig model = config.model;
    StageConfig stage = original;
    auto estimate = [&] {
      return estimate_memory(model, MemoryUse::kTraining, stage.batch_size, stage.micro_batch_size,
                             stage.max_seq_len, dp);
    };
    std::vector<Knob> knobs;
    add_model_knobs(knobs, model, config.model, "model.");
    const std::string at = fmt::format("stages.{}.", i);
    auto reset_stage = [&](auto edit) {
      return [&, edit] {
        model = config.model;
        stage = original;
        edit(stage);
      };
    };
    knobs.push_back({at + "batch_size", original.batch_size, reset_stage([](StageConfig& s) {
                       s.batch_size = std::min<int64_t>(s.batch_size, 32);
                       s.micro_batch_size = std::min(s.micro_batch_size, s.batch_size);
                     })});
    knobs.push_back(
        {at + "micro_batch_size", original.micro_batch_size, reset_stage([](StageConfig& s) {
           s.micro_batch_size = std::min<int64_t>(s.micro_batch_size, 32);
         })});
    knobs.push_back({at + "max_seq_len", original.max_seq_len, reset_stage([](StageConfig& s) {
                       s.max_seq_len = std::min<int64_t>(s.max_seq_len, 512);
                     })});
    check(estimate, std::move(knobs),
          fmt::format("pretraining stage {} (batch {}, micro-batch {}, {} tokens)", i + 1,
                      original.batch_size, original.micro_batch_size, original.max_seq_len),
          dp);
  }
}

void check_memory_for_finetuning(const Config& config, int64_t world_size) {
  if (!config.finetune) return;
  const DataParallel dp{world_size, config.distributed.zero};
  const FinetuneConfig& original = *config.finetune;
  ModelConfig model = config.model;
  FinetuneConfig f = original;
  auto estimate = [&] {
    return estimate_memory(model, MemoryUse::kTraining, f.batch_size, f.batch_size, f.max_seq_len,
                           dp);
  };
  std::vector<Knob> knobs;
  add_model_knobs(knobs, model, config.model, "model.");
  knobs.push_back({"finetune.batch_size", original.batch_size, [&] {
                     model = config.model;
                     f = original;
                     f.batch_size = std::min<int64_t>(f.batch_size, 32);
                   }});
  knobs.push_back({"finetune.max_seq_len", original.max_seq_len, [&] {
                     model = config.model;
                     f = original;
                     f.max_seq_len = std::min<int64_t>(f.max_seq_len, 512);
                   }});
  check(estimate, std::move(knobs), "fine-tuning", dp);
}

void check_memory_for_model(const ModelConfig& original, MemoryUse use, const std::string& source,
                            const std::string& model_prefix) {
  ModelConfig model = original;
  const int64_t seq = use == MemoryUse::kInference ? model.max_position_embeddings : 1;
  auto estimate = [&] { return estimate_memory(model, use, 1, 1, seq); };
  std::vector<Knob> knobs;
  add_model_knobs(knobs, model, original, model_prefix);
  check(estimate, std::move(knobs), "the model of " + source);
}

}  // namespace roformer
