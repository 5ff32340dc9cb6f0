// AdamW (Loshchilov & Hutter) with decoupled weight decay and bias correction,
// as one pass over flat buffers: the parameters and gradients are a
// FlatParameters set (core/flat_parameters.h) and the two moments are flat
// buffers of the same layout; the gradient-clipping scale is folded into the
// same pass.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/flat_parameters.h"
#include "core/tensor.h"
#include "optim/grad_norm.h"

namespace roformer::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
};

struct NamedParameter {
  std::string name;
  Tensor tensor;
  bool decay = true;  // false for biases and LayerNorm parameters by default
};

// ZeRO-1: this process keeps and updates only share `index` of `count`
// contiguous shares of the flat buffers (AdamW::shard_bounds). {0, 1}: all.
struct MomentShard {
  int index = 0;
  int count = 1;
};

// The usual rule: no decay for biases and LayerNorm weights.
bool decays_by_default(const std::string& name);

class AdamW {
 public:
  // `params` must be exactly a flat set, in its order (a flattened model's
  // named_parameters()), or not flat at all: then AdamW flattens them itself.
  // With a shard, the moments cover only that share of the flat buffers
  // (CPU parameters only).
  AdamW(std::vector<NamedParameter> params, AdamWOptions options, MomentShard shard = {});

  // One update with learning rate `lr`; every gradient is multiplied by
  // `grad_scale` first (global-norm clipping). Parameters without a gradient
  // are left untouched, as torch.optim.AdamW does. Sharded: only the
  // parameters' elements in [shard_begin(), shard_end()) change (the caller
  // gathers the rest from the other shards). With `measure_update` it returns
  // sum((new - old)^2) over this process's share of the flat buffers (f64, in
  // an order that depends only on the sizes: the update/weight ratio without
  // a copy of the weights); NaN otherwise.
  double step(double lr, double grad_scale = 1.0, bool measure_update = false);

  // `count` + 1 boundaries splitting a flat buffer of `padded_numel` floats
  // into contiguous shares: each starts on a multiple of kShardAlignment and
  // none is larger than the first (the last may be shorter, or empty).
  static std::vector<int64_t> shard_bounds(int64_t padded_numel, int count);
  // Whole chunks of the gradient norm's deterministic sum (grad_norm.h): a
  // rank's share of the summed gradient then gives that norm's partials bit
  // for bit (64 KiB, a multiple of FlatParameters::kAlignment).
  static constexpr int64_t kShardAlignment = kNormChunk;
  static_assert(kShardAlignment % FlatParameters::kAlignment == 0);
  bool sharded() const { return shard_.count > 1; }
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  // This process's share of the moments, in the flat layout of
  // [shard_begin(), shard_end()) (no copy).
  const Tensor& exp_avg_shard() const { return m_; }
  const Tensor& exp_avg_sq_shard() const { return v_; }
  // Bytes this process holds for the moments.
  int64_t state_bytes() const { return 2 * (end_ - begin_) * int64_t(sizeof(float)); }
  // One fill of the flat gradient buffer.
  void zero_grad();

  int64_t step_count() const { return step_; }
  // Stages may set their own decay; the moments are untouched.
  void set_weight_decay(double weight_decay) { options_.weight_decay = weight_decay; }
  const std::vector<NamedParameter>& parameters() const { return params_; }
  const FlatParameters& flat() const { return *flat_; }
  // The moments packed to the parameters' elements in order (f32
  // [num_elements()], a copy), and the step, for checkpoints. Not sharded
  // only (train/distributed/zero.h gathers the shards).
  Tensor exp_avg() const { return flat_->pack(whole(m_)); }
  Tensor exp_avg_sq() const { return flat_->pack(whole(v_)); }
  // Whole packed moments (a checkpoint's, whatever sharding wrote it); a
  // sharded optimizer keeps its share.
  void load_state(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step);
  int64_t num_elements() const { return flat_->num_elements(); }

 private:
  const Tensor& whole(const Tensor& moment) const;

  std::vector<NamedParameter> params_;
  std::shared_ptr<FlatParameters> flat_;
  AdamWOptions options_;
  MomentShard shard_;
  int64_t begin_ = 0, end_ = 0;  // the flat range the moments cover
  Tensor m_, v_;                 // flat layout of [begin_, end_), padding included
  // On a GPU under bf16 products: the parameters rounded to bf16, written by
  // the update kernel (flat layout).
  Tensor working_bf16_;
  int64_t step_ = 0;
};

// sqrt(sum of squares) over all gradients (double accumulation, independent of
// the thread count); parameters without a gradient count as zero. One pass
// over the flat gradient buffer when `params` are a flat set. NaN/inf
// propagate so callers can skip.
double global_grad_norm(const std::vector<NamedParameter>& params);

}  // namespace roformer::optim
