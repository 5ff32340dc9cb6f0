// oneDNN plumbing for the CPU kernels: one engine and stream for the process,
// memory descriptors made from tensor geometry (strides included, so views
// need no copies), and a bounded LRU cache of primitives keyed by (op,
// shapes, strides, dtypes) so a training loop builds each primitive once while
// a run whose shapes keep changing does not grow without limit.
#pragma once

#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "core/cpu/view.h"

namespace roformer::kernels::cpu {

dnnl::engine& onednn_engine();
dnnl::stream& onednn_stream();

dnnl::memory::data_type onednn_dtype(DType dtype);
dnnl::memory::desc onednn_desc(const View& t);
dnnl::memory::desc onednn_desc(const Shape& shape, const Shape& strides, DType dtype);
dnnl::memory onednn_memory(const dnnl::memory::desc& desc, const View& t);

// Whether oneDNN multiplies bf16 matrices on this CPU (oneDNN 2.6 has no bf16
// matmul below AVX-512, not even a reference one), probed once. Without it the
// kernels multiply f32 copies of the bf16 operands: a product of two bf16
// values is exact in f32 and oneDNN's bf16 kernels sum in f32 too, so the
// results are the same up to the order of the sums, only slower.
bool onednn_has_bf16_matmul();
// Tests: the f32 path as if the CPU had no bf16 matmul, for the guard's
// lifetime.
class Bf16MatmulDisabled {
 public:
  Bf16MatmulDisabled();
  ~Bf16MatmulDisabled();
  Bf16MatmulDisabled(const Bf16MatmulDisabled&) = delete;
  Bf16MatmulDisabled& operator=(const Bf16MatmulDisabled&) = delete;
};

// A key describing tensor geometry for the primitive cache.
std::string geometry_key(const View& t);

// The cache behind cached_primitive: type-erased values, least recently used
// evicted first once `capacity` entries are held.
std::shared_ptr<void> cache_lookup(const std::string& key,
                                   const std::function<std::shared_ptr<void>()>& make);

// Returns the cached object for `key`, building it with `make` the first time.
template <class T>
std::shared_ptr<T> cached_primitive(const std::string& key, const std::function<T()>& make) {
  return std::static_pointer_cast<T>(
      cache_lookup(key, [&]() -> std::shared_ptr<void> { return std::make_shared<T>(make()); }));
}

constexpr size_t kDefaultPrimitiveCacheCapacity = 256;
// Cache size limit (entries); shrinking evicts at once. Default 256.
void set_primitive_cache_capacity(size_t capacity);
size_t primitive_cache_capacity();
size_t primitive_cache_size();
// Entries evicted since start, for tests.
size_t primitive_cache_evictions();

// Number of primitives built (cache misses) since start, for tests.
size_t onednn_primitives_built();
void count_primitive_built();

}  // namespace roformer::kernels::cpu
