// oneDNN plumbing for the CPU kernels: one engine and stream for the process,
// memory descriptors made from tensor geometry (strides included, so views
// need no copies), and a cache of primitives keyed by (op, shapes, strides,
// dtypes) so a training loop builds each primitive once.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "core/tensor.h"

namespace roformer::cpu {

dnnl::engine& onednn_engine();
dnnl::stream& onednn_stream();

dnnl::memory::data_type onednn_dtype(DType dtype);
// A descriptor with the tensor's dims and strides (stride-0 broadcast dims
// are passed as size 1 when `broadcast_as_one`).
dnnl::memory::desc onednn_desc(const Tensor& t);
dnnl::memory::desc onednn_desc(const Shape& shape, const Shape& strides, DType dtype);
dnnl::memory onednn_memory(const dnnl::memory::desc& desc, const Tensor& t);

// A key describing tensor geometry for the primitive cache.
std::string geometry_key(const Tensor& t);

// Returns the cached object for `key`, building it with `make` the first time.
template <class T>
std::shared_ptr<T> cached_primitive(const std::string& key, const std::function<T()>& make) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<T>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto value = std::make_shared<T>(make());
  cache.emplace(key, value);
  return value;
}

// Number of primitives built (cache misses) since start, for tests.
size_t onednn_primitives_built();
void count_primitive_built();

}  // namespace roformer::cpu
