#include "core/cpu/onednn.h"

#include <atomic>

namespace roformer::cpu {

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

dnnl::memory::desc onednn_desc(const Tensor& t) {
  return onednn_desc(t.shape(), t.strides(), t.dtype());
}

dnnl::memory onednn_memory(const dnnl::memory::desc& desc, const Tensor& t) {
  return dnnl::memory(desc, onednn_engine(), t.data());
}

std::string geometry_key(const Tensor& t) {
  if (!t.defined()) return "-";
  std::string key = dtype_name(t.dtype());
  for (int64_t s : t.shape()) key += ',' + std::to_string(s);
  key += '/';
  for (int64_t s : t.strides()) key += ',' + std::to_string(s);
  return key;
}

namespace {
std::atomic<size_t> g_built{0};
}
size_t onednn_primitives_built() {
  return g_built.load();
}
void count_primitive_built() {
  ++g_built;
}

}  // namespace roformer::cpu
