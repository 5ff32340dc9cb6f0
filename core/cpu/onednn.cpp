#include "core/cpu/onednn.h"

#include <atomic>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace roformer::kernels::cpu {

dnnl::engine& onednn_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& onednn_stream() {
  static dnnl::stream stream(onednn_engine());
  return stream;
}

dnnl::memory::data_type onednn_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return dnnl::memory::data_type::f32;
    case DType::bf16:
      return dnnl::memory::data_type::bf16;
    case DType::i32:
      return dnnl::memory::data_type::s32;
    default:
      break;
  }
  throw Error(std::string("oneDNN: no data type for ") + dtype_name(dtype));
}

dnnl::memory::desc onednn_desc(const Shape& shape, const Shape& strides, DType dtype) {
  dnnl::memory::dims dims(shape.begin(), shape.end());
  dnnl::memory::dims st(strides.begin(), strides.end());
  if (dims.empty()) {
    dims = {1};
    st = {1};
  }
  return dnnl::memory::desc(dims, onednn_dtype(dtype), st);
}

dnnl::memory::desc onednn_desc(const View& t) {
  return onednn_desc(t.shape(), t.strides(), t.dtype());
}

dnnl::memory onednn_memory(const dnnl::memory::desc& desc, const View& t) {
  return dnnl::memory(desc, onednn_engine(), t.data());
}

namespace {
std::atomic<bool> g_bf16_matmul_disabled{false};

bool probe_bf16_matmul() {
  const dnnl::memory::desc bf16_2x2({2, 2}, dnnl::memory::data_type::bf16, {2, 1});
  const dnnl::memory::desc f32_2x2({2, 2}, dnnl::memory::data_type::f32, {2, 1});
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(bf16_2x2, bf16_2x2, f32_2x2),
                                    onednn_engine());
    return true;
  } catch (const dnnl::error&) {  // dnnl_unimplemented: no kernel for this ISA
    return false;
  }
}
}  // namespace

bool onednn_has_bf16_matmul() {
  static const bool available = probe_bf16_matmul();
  return available && !g_bf16_matmul_disabled.load();
}

Bf16MatmulDisabled::Bf16MatmulDisabled() {
  g_bf16_matmul_disabled = true;
}
Bf16MatmulDisabled::~Bf16MatmulDisabled() {
  g_bf16_matmul_disabled = false;
}

std::string geometry_key(const View& t) {
  if (!t.defined()) return "-";
  std::string key = dtype_name(t.dtype());
  for (int64_t s : t.shape()) key += ',' + std::to_string(s);
  key += '/';
  for (int64_t s : t.strides()) key += ',' + std::to_string(s);
  return key;
}

namespace {

// Most recently used at the front of `order`; `index` finds a key's node.
struct PrimitiveCache {
  std::mutex mutex;
  size_t capacity = kDefaultPrimitiveCacheCapacity;
  size_t evictions = 0;
  std::list<std::pair<std::string, std::shared_ptr<void>>> order;
  std::unordered_map<std::string, decltype(order)::iterator> index;

  void trim() {  // caller holds the mutex
    while (order.size() > capacity) {
      index.erase(order.back().first);
      order.pop_back();  // users of the primitive keep it alive via shared_ptr
      ++evictions;
    }
  }
};

PrimitiveCache& cache() {
  static PrimitiveCache c;
  return c;
}

std::atomic<size_t> g_built{0};

}  // namespace

std::shared_ptr<void> cache_lookup(const std::string& key,
                                   const std::function<std::shared_ptr<void>()>& make) {
  PrimitiveCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.index.find(key);
  if (it != c.index.end()) {
    c.order.splice(c.order.begin(), c.order, it->second);
    return it->second->second;
  }
  std::shared_ptr<void> value = make();
  c.order.emplace_front(key, value);
  c.index.emplace(key, c.order.begin());
  c.trim();
  return value;
}

void set_primitive_cache_capacity(size_t capacity) {
  PrimitiveCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.capacity = std::max<size_t>(capacity, 1);
  c.trim();
}

size_t primitive_cache_capacity() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().capacity;
}

size_t primitive_cache_size() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().order.size();
}

size_t primitive_cache_evictions() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().evictions;
}

size_t onednn_primitives_built() {
  return g_built.load();
}
void count_primitive_built() {
  ++g_built;
}

}  // namespace roformer::kernels::cpu
