// Memory a command will need, estimated from the config before anything is
// allocated, so an enormous model or batch is refused in a moment with the
// key to blame rather than after minutes of allocation (or a bad_alloc).
// The estimate is a lower bound (f32 weights, gradients, AdamW moments, the
// activations backward keeps for one micro-batch, the loader's batch): a
// config it refuses cannot run; one it accepts may still be tight.
#pragma once

#include <cstdint>
#include <string>

#include "layers/model_config.h"
#include "train/config.h"

namespace roformer {

// Bytes on one rank (one process: the whole run).
struct MemoryEstimate {
  double parameters = 0;   // bytes of f32 weights
  double gradients = 0;    // the f32 gradient buffer: whole on every rank
  double moments = 0;      // AdamW's two moments: this rank's share under ZeRO-1
  double activations = 0;  // kept for backward, one micro-batch (or one forward)
  double batch = 0;        // the loader's token buffers for one global batch
  double total() const { return parameters + gradients + moments + activations + batch; }
};

// How training is spread: `world_size` data-parallel ranks, `zero` 1 when
// they shard the AdamW moments (distributed.zero). ZeRO-1 divides only the
// moments: parameters stay whole, and so do gradients (backward writes the
// whole buffer; the reduce-scatter sums each rank's share in place).
struct DataParallel {
  int64_t world_size = 1;
  int64_t zero = 0;
  bool shards_moments() const { return zero == 1 && world_size > 1; }
};

enum class MemoryUse {
  kTraining,   // weights + gradients + moments + activations + batch
  kInference,  // weights + one forward pass
  kConvert,    // weights held twice (the file's tensors and the model)
};

// Parameters of the masked-LM model `model` describes (embeddings, layers,
// MLM head), computed in double so no size overflows.
double estimate_parameter_count(const ModelConfig& model);

// Bytes for a run of `model` on micro-batches of `micro_batch` sequences of
// `seq_len` tokens (global batch `batch`), per rank of `dp`: a rank's
// micro-batch is at most its share of the batch, and with ZeRO-1 (training)
// the moments are the largest rank's share (AdamW::shard_bounds).
MemoryEstimate estimate_memory(const ModelConfig& model, MemoryUse use, int64_t batch = 1,
                               int64_t micro_batch = 1, int64_t seq_len = 1, DataParallel dp = {});

// Bytes this process can still allocate: MemAvailable + SwapFree from
// /proc/meminfo, capped by a cgroup memory limit when one is set.
double available_memory_bytes();

// "1.5 GiB", "3.2 TiB".
std::string format_bytes(double bytes);

// Throws InputError when `config` (its model and every stage, or its finetune
// section for `finetune`) needs more than the memory available. The message
// names the key whose value drives the estimate, the estimate and the memory
// available. `model_prefix` is how model keys are named ("model." in YAML,
// "config.json: " for a Hugging Face folder).
// `world_size`: the ranks of a data-parallel run (distributed.zero decides
// whether they shard the moments); the estimate and the message are per rank.
void check_memory_for_pretraining(const Config& config, int64_t world_size = 1);
void check_memory_for_finetuning(const Config& config, int64_t world_size = 1);
void check_memory_for_model(const ModelConfig& model, MemoryUse use, const std::string& source,
                            const std::string& model_prefix);

}  // namespace roformer
