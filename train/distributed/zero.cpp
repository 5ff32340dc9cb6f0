#include "train/distributed/zero.h"

#include "core/error.h"

namespace roformer::distributed {

optim::MomentShard zero_shard(int64_t zero, const Communicator& comm, Device device) {
  RF_CHECK(zero == 0 || zero == 1, "distributed.zero: ", zero);
  if (zero == 0) return {};
  if (!device.is_cpu())
    throw InputError(
        "distributed.zero: 1 (ZeRO-1) shards the AdamW moments of CPU ranks only; "
        "this run trains on " +
        device.str() + " (set distributed.zero: 0)");
  return {comm.rank(), comm.world_size()};
}

std::vector<int64_t> shard_sizes(const optim::AdamW& adamw, int world_size) {
  const std::vector<int64_t> bounds =
      optim::AdamW::shard_bounds(adamw.flat().padded_numel(), world_size);
  std::vector<int64_t> sizes;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) sizes.push_back(bounds[r + 1] - bounds[r]);
  return sizes;
}

void all_gather_parameters(const optim::AdamW& adamw, Communicator& comm) {
  if (!adamw.sharded()) return;
  const Tensor& data = adamw.flat().data();
  comm.all_gather_in_place(std::span<float>(data.data_as<float>(), size_t(data.numel())),
                           shard_sizes(adamw, comm.world_size()));
  data.bump_version();
}

Moments gather_moments(const optim::AdamW& adamw, Communicator& comm, int root) {
  const bool here = comm.rank() == root;
  if (!adamw.sharded()) return here ? Moments{adamw.exp_avg(), adamw.exp_avg_sq()} : Moments{};
  const std::vector<int64_t> sizes = shard_sizes(adamw, comm.world_size());
  const FlatParameters& flat = adamw.flat();
  // One whole flat buffer on the root, reused for both moments.
  Tensor whole;
  if (here) whole = Tensor::zeros({flat.padded_numel()}, DType::f32, flat.device());
  Moments out;
  for (auto [shard, packed] : {std::pair{&adamw.exp_avg_shard(), &out.exp_avg},
                               std::pair{&adamw.exp_avg_sq_shard(), &out.exp_avg_sq}}) {
    comm.gather(
        std::span<const float>(shard->data_as<float>(), size_t(shard->numel())),
        here ? std::span<float>(whole.data_as<float>(), size_t(whole.numel())) : std::span<float>(),
        sizes, root);
    if (here) *packed = flat.pack(whole);
  }
  return out;
}

int64_t bytes_sent_per_step(int64_t padded_numel, int world_size, bool zero, bool reduce_scatter) {
  const int64_t one_pass = (world_size - 1) * padded_numel / world_size * int64_t(sizeof(float));
  const int64_t gradients = zero && reduce_scatter ? one_pass : 2 * one_pass;
  return gradients + (zero ? one_pass : 0);
}

MemoryPerRank memory_per_rank(const optim::AdamW& adamw, const Communicator& comm) {
  MemoryPerRank m;
  const int64_t buffer = adamw.flat().padded_numel() * int64_t(sizeof(float));
  m.param_bytes = buffer;
  m.grad_bytes = buffer;
  m.optimizer_state_bytes = adamw.state_bytes();
  if (!adamw.sharded()) {
    m.optimizer_state_bytes_per_rank.assign(size_t(comm.world_size()), adamw.state_bytes());
  } else {
    for (int64_t n : shard_sizes(adamw, comm.world_size()))
      m.optimizer_state_bytes_per_rank.push_back(2 * n * int64_t(sizeof(float)));
  }
  return m;
}

}  // namespace roformer::distributed
