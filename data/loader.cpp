#include "data/loader.h"

#include <algorithm>

#include "core/error.h"
#include "core/philox.h"

namespace roformer::data {
namespace {
constexpr uint64_t kShuffleTag = 0x53485546464C45ull;  // "SHUFFLE"
}

int64_t bucketed_length(int64_t longest, int64_t max_len, int64_t multiple) {
  if (multiple <= 1) return longest;
  const int64_t rounded = (longest + multiple - 1) / multiple * multiple;
  return std::max(longest, std::min(rounded, max_len));
}

Loader::Loader(ShardSet shards, std::shared_ptr<const Vocab> vocab, LoaderOptions options,
               LoaderState start)
    : shards_(std::move(shards)),
      vocab_(std::move(vocab)),
      options_(options),
      packing_(shards_, options.max_seq_len),
      mask_vocab_(MaskingVocab::from(*vocab_)) {
  RF_INPUT_CHECK(options_.batch_size > 0, "batch size must be positive, not ", options_.batch_size);
  RF_INPUT_CHECK(
      options_.world_size > 0 && options_.rank >= 0 && options_.rank < options_.world_size, "rank ",
      options_.rank, " is not within world size ", options_.world_size);
  RF_INPUT_CHECK(options_.prefetch_batches >= 0, "data.prefetch_batches must be >= 0, not ",
                 options_.prefetch_batches);
  options_.masking.validate();
  RF_INPUT_CHECK(packing_.size() > 0, "the corpus shards hold no tokens");
  RF_INPUT_CHECK(packing_.size() < (int64_t(1) << 32), "more than 2^32 sequences per epoch");
  for (const auto& s : shards_)
    RF_INPUT_CHECK(s->info().tokenizer.vocab_hash == vocab_->hash(), "shard '", s->path(),
                   "' was made with vocab ", s->info().tokenizer.vocab_hash, " (",
                   s->info().tokenizer.vocab_size, " pieces) but the model's vocab '",
                   vocab_->source(), "' is ", vocab_->hash(), " (", vocab_->size(), " pieces)");
  consumed_ = normalize(start);
  start_producer();
}

Loader::~Loader() {
  stop_producer();
}

int64_t Loader::batches_per_epoch() const {
  const int64_t per_call = options_.batch_size * options_.world_size;
  return (packing_.size() + per_call - 1) / per_call;
}

LoaderState Loader::normalize(const LoaderState& s) const {
  LoaderState out = s;
  const uint64_t n = uint64_t(packing_.size());
  if (s.max_seq_len == 0) {  // a fresh start
    out.index = 0;
  } else if (s.max_seq_len != options_.max_seq_len) {
    // Another stage's packing: begin the next epoch of this one.
    out.epoch = s.index > 0 ? s.epoch + 1 : s.epoch;
    out.index = 0;
  } else {
    RF_INPUT_CHECK(s.num_sequences == n, "the saved data cursor refers to ", s.num_sequences,
                   " sequences at max_seq_len ", s.max_seq_len, " but the corpus now packs into ",
                   n, " (did the shards change?)");
    RF_INPUT_CHECK(s.index < n, "the saved data cursor index ", s.index, " is past the epoch of ",
                   n, " sequences");
  }
  out.max_seq_len = options_.max_seq_len;
  out.num_sequences = n;
  return out;
}

std::shared_ptr<const std::vector<uint32_t>> Loader::permutation(uint64_t epoch) const {
  std::lock_guard lock(perm_mutex_);
  auto it = perms_.find(epoch);
  if (it != perms_.end()) return it->second;
  auto perm = std::make_shared<std::vector<uint32_t>>(size_t(packing_.size()));
  for (size_t i = 0; i < perm->size(); ++i) (*perm)[i] = uint32_t(i);
  if (options_.shuffle) {
    PhiloxStream rng(options_.seed,
                     subsequence_of(kShuffleTag, epoch, uint64_t(options_.max_seq_len)));
    for (size_t i = perm->size(); i > 1; --i)
      std::swap((*perm)[i - 1], (*perm)[rng.next_below(uint32_t(i))]);
  }
  // Keep at most two epochs (a batch spans at most two unless it is larger than an epoch).
  while (perms_.size() >= 2) perms_.erase(perms_.begin());
  perms_[epoch] = perm;
  return perm;
}

LoaderState Loader::advance(const LoaderState& at) const {
  const uint64_t n = uint64_t(packing_.size());
  LoaderState s = at;
  s.index += uint64_t(options_.batch_size * options_.world_size);
  s.epoch += s.index / n;
  s.index %= n;
  return s;
}

Batch Loader::batch_at(const LoaderState& at) const {
  const uint64_t n = uint64_t(packing_.size());
  const int64_t rows = options_.batch_size;
  const auto& sp = vocab_->special();
  Batch b;
  b.batch_size = rows;
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(rows)),
      labels(static_cast<size_t>(rows));
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t pos = at.index + uint64_t(options_.rank * rows + r);
    const uint64_t epoch = at.epoch + pos / n;
    const int64_t seq = (*permutation(epoch))[pos % n];
    const auto tokens = packing_.sequence(seq);
    auto& row = ids[size_t(r)];
    row.reserve(tokens.size() + 2);
    row.push_back(sp.cls);
    row.insert(row.end(), tokens.begin(), tokens.end());
    row.push_back(sp.sep);
    auto& lab = labels[size_t(r)];
    lab.assign(row.size(), kIgnoreLabel);
    if (options_.mask) {
      PhiloxStream rng(options_.seed, subsequence_of(epoch, uint64_t(seq)));
      b.num_masked += mask_tokens(row, lab, mask_vocab_, options_.masking, rng);
    }
    longest = std::max<int64_t>(longest, int64_t(row.size()));
    b.epochs.push_back(epoch);
    b.sequence_ids.push_back(seq);
  }
  b.seq_len = bucketed_length(longest, options_.max_seq_len);
  longest = b.seq_len;
  const size_t total = size_t(rows * longest);
  b.input_ids.assign(total, sp.pad);
  b.token_type_ids.assign(total, 0);
  b.attention_mask.assign(total, 0);
  b.labels.assign(total, kIgnoreLabel);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& row = ids[size_t(r)];
    const size_t base = size_t(r * longest);
    std::copy(row.begin(), row.end(), b.input_ids.begin() + std::ptrdiff_t(base));
    std::copy(labels[size_t(r)].begin(), labels[size_t(r)].end(),
              b.labels.begin() + std::ptrdiff_t(base));
    std::fill_n(b.attention_mask.begin() + std::ptrdiff_t(base), row.size(), 1);
    b.num_tokens += int64_t(row.size());
  }
  return b;
}

void Loader::produce() {
  LoaderState s;
  {
    std::lock_guard lock(mutex_);
    s = consumed_;
  }
  try {
    for (;;) {
      Item item{batch_at(s), advance(s)};
      s = item.after;
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || int(queue_.size()) < options_.prefetch_batches; });
      if (stop_) return;
      queue_.push_back(std::move(item));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

void Loader::start_producer() {
  if (options_.prefetch_batches == 0) return;
  stop_ = false;
  thread_ = std::thread([this] { produce(); });
}

void Loader::stop_producer() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  queue_.clear();
  error_ = nullptr;
}

Batch Loader::next() {
  if (options_.prefetch_batches == 0) {
    Batch b = batch_at(consumed_);
    consumed_ = advance(consumed_);
    return b;
  }
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (queue_.empty()) std::rethrow_exception(error_);
  Item item = std::move(queue_.front());
  queue_.pop_front();
  consumed_ = item.after;
  cv_.notify_all();
  return std::move(item.batch);
}

LoaderState Loader::state() const {
  std::lock_guard lock(mutex_);
  return consumed_;
}

void Loader::restore(const LoaderState& state) {
  stop_producer();
  consumed_ = normalize(state);
  start_producer();
}

}  // namespace roformer::data
