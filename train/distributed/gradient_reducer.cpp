#include "train/distributed/gradient_reducer.h"

#include <algorithm>
#include <chrono>

#include "core/autograd.h"
#include "core/error.h"
#include "core/stream.h"

namespace roformer::distributed {

GradientReducer::GradientReducer(std::shared_ptr<FlatParameters> flat, Communicator& comm,
                                 int64_t bucket_bytes, std::vector<int64_t> shard_bounds)
    : flat_(std::move(flat)), comm_(comm), shard_bounds_(std::move(shard_bounds)) {
  RF_CHECK(flat_, "GradientReducer: the parameters are not flat");
  RF_CHECK(shard_bounds_.empty() ||
               (shard_bounds_.size() == size_t(comm_.world_size()) + 1 &&
                shard_bounds_.front() == 0 && shard_bounds_.back() == flat_->padded_numel()),
           "GradientReducer: ", shard_bounds_.size(), " share bounds for ", comm_.world_size(),
           " ranks and ", flat_->padded_numel(), " floats");
  const size_t n = flat_->size();
  bucket_of_.assign(n, 0);
  ready_.assign(n, 0);
  // Reverse parameter order; a bucket closes once it holds bucket_bytes.
  Bucket current;
  current.end = flat_->padded_numel();
  for (size_t k = n; k-- > 0;) {
    current.begin = flat_->offset(k);
    ++current.params;
    bucket_of_[k] = buckets_.size();
    const int64_t bytes = (current.end - current.begin) * int64_t(sizeof(float));
    if (bytes >= bucket_bytes || k == 0) {
      if (k == 0) current.begin = 0;
      buckets_.push_back(current);
      current = Bucket{};
      current.end = flat_->offset(k);
    }
  }
  for (Bucket& b : buckets_) b.pending = b.params;
  flat_->set_grad_ready_hook([this](size_t i) { on_ready(i); });
}

GradientReducer::~GradientReducer() {
  flat_->set_grad_ready_hook({});
}

void GradientReducer::arm() {
  armed_ = true;
}

void GradientReducer::on_ready(size_t index) {
  if (!armed_ || ready_[index]) return;
  ready_[index] = 1;
  --buckets_[bucket_of_[index]].pending;
  start_ready_buckets();
  comm_.progress();
}

void GradientReducer::start_ready_buckets() {
  while (next_ < buckets_.size() && buckets_[next_].pending == 0) start(buckets_[next_++]);
}

std::vector<int64_t> GradientReducer::parts(const Bucket& b) const {
  std::vector<int64_t> counts;
  for (size_t r = 0; r + 1 < shard_bounds_.size(); ++r)
    counts.push_back(std::max<int64_t>(
        0, std::min(b.end, shard_bounds_[r + 1]) - std::max(b.begin, shard_bounds_[r])));
  return counts;
}

void GradientReducer::start(const Bucket& b) {
  const size_t n = size_t(b.end - b.begin);
  const Tensor& grad = flat_->grad();
  // The host path: CPU gradients in place, GPU ones through a staged copy.
  auto on_host = [&](std::span<float> values) {
    if (scatters())
      comm_.start_reduce_scatter_sum(values, parts(b));
    else
      comm_.start_all_reduce_sum(values);
  };
  if (flat_->device().is_cpu()) {
    on_host(std::span<float>(grad.data_as<float>() + b.begin, n));
  } else if (comm_.sums_device_memory()) {
    // NCCL: in place on the GPU, after the backward work queued so far.
    float* values = grad.data_as<float>() + b.begin;
    void* stream = current_stream(flat_->device()).handle;
    if (scatters())
      comm_.start_reduce_scatter_sum_device(values, parts(b), stream);
    else
      comm_.start_all_reduce_sum_device(values, n, stream);
  } else {
    // GPU ranks without NCCL (ranks sharing a GPU): through host memory;
    // the copy waits for the bucket's backward work.
    Tensor host = grad.narrow(0, b.begin, int64_t(n)).to(Device::cpu());
    on_host(std::span<float>(host.data_as<float>(), n));
    staged_.push_back({b.begin, std::move(host)});
  }
}

void GradientReducer::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  comm_.wait_started();
  for (const Staged& st : staged_)
    flat_->grad().narrow(0, st.begin, st.host.numel()).copy_(st.host);
  staged_.clear();
  flat_->grad().bump_version();
  blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Ready for the next step.
  next_ = 0;
  armed_ = false;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) b.pending = b.params;
}

void GradientReducer::append_gradient_flags(std::vector<int64_t>& flags) const {
  for (size_t i = 0; i < flat_->size(); ++i) flags.push_back(flat_->has_grad(i) ? 1 : 0);
}

void GradientReducer::adopt_gradients(std::span<const int64_t> summed_flags) {
  RF_CHECK(summed_flags.size() == flat_->size(), "adopt_gradients: ", summed_flags.size(),
           " flags for ", flat_->size(), " parameters");
  for (size_t i = 0; i < flat_->size(); ++i) {
    if (summed_flags[i] == 0 || flat_->has_grad(i)) continue;
    TensorImpl& impl = flat_->parameters()[i].impl();
    impl.grad = impl.grad_slot->buffer.impl_ptr();
  }
}

}  // namespace roformer::distributed
