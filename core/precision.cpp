#include "core/precision.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "core/autograd.h"
#include "core/ops.h"

namespace roformer {

namespace {
std::atomic<DType> g_matmul_dtype{DType::f32};
std::atomic<bool> g_bf16_activations{true};
std::atomic<int> g_probe_override{-1};  // -1: real probe, 0/1: pretended
}  // namespace

DType matmul_dtype() {
  return g_matmul_dtype.load();
}

MatmulPrecisionScope::MatmulPrecisionScope(DType dtype, bool bf16_activations)
    : previous_(g_matmul_dtype.load()), previous_activations_(g_bf16_activations.load()) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Error(detail::concat("matrix products run in f32 or bf16, not ", dtype_name(dtype)));
  g_matmul_dtype = dtype;
  g_bf16_activations = bf16_activations;
}

MatmulPrecisionScope::~MatmulPrecisionScope() {
  g_matmul_dtype = previous_;
  g_bf16_activations = previous_activations_;
}

bool autocast_active(Device device) {
  return (device.is_cpu() || device.is_cuda()) && g_matmul_dtype.load() == DType::bf16;
}

bool autocast_bf16(Device device, DType dtype) {
  return dtype == DType::f32 && autocast_active(device);
}

DType activation_dtype(const Tensor& x) {
  const bool low = (x.dtype() == DType::f32 || x.dtype() == DType::bf16) &&
                   autocast_active(x.device()) && g_bf16_activations.load();
  return low ? DType::bf16 : x.dtype();
}

bool cpu_has_native_bf16() {
  const int pretend = g_probe_override.load();
  if (pretend >= 0) return pretend == 1;
#if defined(__x86_64__) && defined(__GNUC__)
  // CPUID leaf 7 read directly (clang 14's __builtin_cpu_supports knows
  // neither feature name): subleaf 1 EAX bit 5 is AVX512-BF16, subleaf 0 EDX
  // bit 22 AMX-BF16. "avx512f" also checks that the OS saves AVX-512 state.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__builtin_cpu_supports("avx512f") && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
      ((a >> 5) & 1u))
    return true;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u);
#else
  return false;
#endif
}

void set_cpu_bf16_probe_override(std::optional<bool> value) {
  g_probe_override = value ? int(*value) : -1;
}

void require_native_bf16(const std::string& key) {
  if (cpu_has_native_bf16()) return;
  throw InputError(key +
                   ": bf16 needs a CPU with bf16 dot-product instructions (AVX512-BF16 or "
                   "AMX-BF16), and this CPU has neither; without them bf16 would run slower "
                   "than f32. Set run.precision: f32");
}

namespace {

struct CachedCast {
  std::weak_ptr<StorageImpl> storage;
  uint64_t version = 0;
  Tensor cast;
};

// The registered bf16 working copy (set_bf16_working_copy).
struct WorkingCopy {
  std::weak_ptr<StorageImpl> storage;
  int64_t offset = 0, numel = 0;  // the source's elements in its storage
  uint64_t version = 0;
  Tensor working;
};

// A stack of parameters, valid while each part's storage keeps its version.
struct CachedStack {
  std::vector<std::weak_ptr<StorageImpl>> storages;
  std::vector<uint64_t> versions;
  Tensor stacked;
};

struct WeightCache {
  std::mutex mutex;
  std::unordered_map<std::string, CachedCast> entries;
  std::unordered_map<std::string, CachedStack> stacks;
  int64_t stack_builds = 0;
  int64_t casts = 0;
  WorkingCopy working;
  int64_t working_hits = 0;
};

WeightCache& weight_cache() {
  static WeightCache cache;
  return cache;
}

// Enough for every weight of a large model; beyond it the cache starts over
// (a program that keeps making new weights must not grow it without limit).
constexpr size_t kMaxCachedWeights = 4096;

std::string cache_key(const Tensor& w) {
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(w.impl().storage.get())) + '@' +
                    std::to_string(w.offset());
  for (int64_t s : w.shape()) key += ',' + std::to_string(s);
  key += '/';
  for (int64_t s : w.strides()) key += ',' + std::to_string(s);
  return key;
}

// `weight` as a view of the working copy, or an undefined tensor when the copy
// does not hold it (another storage, a newer version, elements outside).
Tensor from_working_copy(const WorkingCopy& copy, const Tensor& weight) {
  if (!copy.working.defined() || copy.storage.lock() != weight.impl().storage ||
      copy.version != weight.version() || weight.numel() == 0)
    return Tensor();
  int64_t last = weight.offset();
  for (int64_t d = 0; d < weight.dim(); ++d) {
    if (weight.stride(d) < 0) return Tensor();
    last += (weight.size(d) - 1) * weight.stride(d);
  }
  if (weight.offset() < copy.offset || last >= copy.offset + copy.numel) return Tensor();
  return make_view(copy.working, weight.shape(), weight.strides(),
                   copy.working.offset() + (weight.offset() - copy.offset));
}

// The last cast is remembered: a layer's query, key and value projections
// read the same hidden states, which are then cast once, not three times.
struct LastCast {
  std::weak_ptr<StorageImpl> storage;
  int64_t offset = 0;
  Shape shape, strides;
  uint64_t version = 0;
  Tensor cast;
};
LastCast& last_cast() {
  thread_local LastCast last;
  return last;
}
}  // namespace

void remember_bf16_cast(const Tensor& t, const Tensor& cast) {
  last_cast() = LastCast{t.impl().storage, t.offset(), t.shape(), t.strides(), t.version(), cast};
}

Tensor to_bf16(const Tensor& t) {
  if (t.dtype() == DType::bf16 && t.is_contiguous()) return t.detach();
  const LastCast& last = last_cast();
  if (last.cast.defined() && last.storage.lock() == t.impl().storage && last.offset == t.offset() &&
      last.shape == t.shape() && last.strides == t.strides() && last.version == t.version())
    return last.cast;
  NoGradGuard no_grad;
  Tensor out = Tensor::empty(t.shape(), DType::bf16, t.device());
  out.copy_(t.detach());
  remember_bf16_cast(t, out);
  return out;
}

Tensor bf16_weight(const Tensor& weight) {
  WeightCache& cache = weight_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (Tensor view = from_working_copy(cache.working, weight); view.defined()) {
    ++cache.working_hits;
    return view;
  }
  const std::string key = cache_key(weight);
  auto it = cache.entries.find(key);
  if (it != cache.entries.end() && it->second.storage.lock() == weight.impl().storage &&
      it->second.version == weight.version())
    return it->second.cast;
  if (cache.entries.size() >= kMaxCachedWeights) cache.entries.clear();
  CachedCast entry{weight.impl().storage, weight.version(), to_bf16(weight)};
  ++cache.casts;
  cache.entries[key] = entry;
  return entry.cast;
}

int64_t bf16_weight_casts() {
  std::lock_guard<std::mutex> lock(weight_cache().mutex);
  return weight_cache().casts;
}

Tensor stacked_weight(const std::vector<Tensor>& parts, bool bf16) {
  if (parts.empty()) throw Error("stacked_weight: no parts");
  NoGradGuard no_grad;
  if (parts.size() == 1) return bf16 ? bf16_weight(parts.front()) : parts.front().detach();
  // As is: stacked anew each call, as a weight used as is is read anew (a
  // write through a raw pointer, as finite differences make, bumps no version).
  if (!bf16) {
    std::vector<Tensor> as_is;
    for (const Tensor& p : parts) as_is.push_back(p.detach());
    return concat(as_is, 0);
  }
  std::string key;
  for (const Tensor& p : parts) key += '|' + cache_key(p);
  WeightCache& cache = weight_cache();
  auto current = [&](const CachedStack& entry) {
    for (size_t i = 0; i < parts.size(); ++i)
      if (entry.storages[i].lock() != parts[i].impl().storage ||
          entry.versions[i] != parts[i].version())
        return false;
    return true;
  };
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.stacks.find(key);
    if (it != cache.stacks.end() && current(it->second)) return it->second.stacked;
  }
  // Built outside the lock: bf16_weight takes it too.
  CachedStack entry;
  std::vector<Tensor> ready;
  for (const Tensor& p : parts) {
    entry.storages.push_back(p.impl().storage);
    entry.versions.push_back(p.version());
    ready.push_back(bf16_weight(p));
  }
  entry.stacked = concat(ready, 0);
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (cache.stacks.size() >= kMaxCachedWeights) cache.stacks.clear();
  ++cache.stack_builds;
  cache.stacks[key] = entry;
  return entry.stacked;
}

int64_t stacked_weight_builds() {
  std::lock_guard<std::mutex> lock(weight_cache().mutex);
  return weight_cache().stack_builds;
}

void clear_bf16_weights() {
  std::lock_guard<std::mutex> lock(weight_cache().mutex);
  weight_cache().entries.clear();
  weight_cache().stacks.clear();
  weight_cache().working = WorkingCopy{};
}

void set_bf16_working_copy(const Tensor& source, const Tensor& working) {
  if (!source.is_contiguous() || source.dtype() != DType::f32 || !working.is_contiguous() ||
      working.dtype() != DType::bf16 || working.numel() != source.numel() ||
      working.device() != source.device())
    throw Error(detail::concat("bf16 working copy: expected a contiguous bf16 copy of ",
                               source.desc(), " on ", source.device().str(), ", got ",
                               working.desc(), " on ", working.device().str()));
  std::lock_guard<std::mutex> lock(weight_cache().mutex);
  weight_cache().working = WorkingCopy{source.impl().storage, source.offset(), source.numel(),
                                       source.version(), working};
}

int64_t bf16_working_copy_hits() {
  std::lock_guard<std::mutex> lock(weight_cache().mutex);
  return weight_cache().working_hits;
}

}  // namespace roformer
