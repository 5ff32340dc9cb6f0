// View: a KernelTensor with the conveniences the CPU kernels' loops want
// (shape and strides as vectors, desc() for messages). Plain data, no
// ownership, no Tensor: the CPU kernel library sits below the tensor core.
// Scratch is the one owning piece: a contiguous host buffer for a kernel's
// temporaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/kernels/kernel_list.h"

namespace roformer::kernels::cpu {

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

inline Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

class View {
 public:
  View() = default;
  View(const KernelTensor& t)  // NOLINT: implicit, kernels take KT and loop on Views
      : defined_(t.defined()), data_(t.data), dtype_(t.dtype) {
    if (defined_) {
      shape_.assign(t.sizes, t.sizes + t.ndim);
      strides_.assign(t.strides, t.strides + t.ndim);
    }
  }
  View(void* data, DType dtype, Shape shape, Shape strides)
      : defined_(true),
        data_(data),
        dtype_(dtype),
        shape_(std::move(shape)),
        strides_(std::move(strides)) {}

  bool defined() const { return defined_; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    RF_CHECK(dtype_of<T>() == dtype_, "kernel: tensor is ", desc(), ", read as ",
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  // As Tensor::is_contiguous: a tensor with no element is contiguous.
  bool is_contiguous() const {
    for (int64_t size : shape_)
      if (size == 0) return true;
    int64_t expected = 1;
    for (size_t d = shape_.size(); d-- > 0;) {
      if (shape_[d] != 1 && strides_[d] != expected) return false;
      expected *= shape_[d];
    }
    return true;
  }
  // Back to plain data, to call another kernel of the list.
  KernelTensor kt() const {
    KernelTensor t;
    if (!defined_) return t;
    RF_CHECK(shape_.size() <= size_t(kMaxDims), "kernel: ", desc(), " has more than ", kMaxDims,
             " dims");
    t.data = data_;
    t.dtype = dtype_;
    t.ndim = int32_t(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) {
      t.sizes[d] = shape_[d];
      t.strides[d] = strides_[d];
    }
    return t;
  }
  // "f32[2, 3]" for messages.
  std::string desc() const {
    if (!defined_) return "undefined";
    std::string s = std::string(dtype_name(dtype_)) + "[";
    for (size_t d = 0; d < shape_.size(); ++d) s += (d ? ", " : "") + std::to_string(shape_[d]);
    return s + "]";
  }

 private:
  bool defined_ = false;
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_, strides_;
};

// A contiguous host buffer (uninitialised) and its View.
class Scratch {
 public:
  Scratch(const Shape& shape, DType dtype)
      : bytes_(new std::byte[size_t(shape_numel(shape)) * dtype_size(dtype)]),
        view_(bytes_.get(), dtype, shape, contiguous_strides(shape)) {}
  const View& view() const { return view_; }

 private:
  std::unique_ptr<std::byte[]> bytes_;
  View view_;
};

// The bytes [first, last) a view can touch (empty for zero elements).
struct ByteRange {
  const std::byte* first = nullptr;
  const std::byte* last = nullptr;
};
inline ByteRange byte_range(const View& v) {
  if (v.numel() == 0) return {};
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < v.dim(); ++d) {
    const int64_t span = (v.shape()[size_t(d)] - 1) * v.strides()[size_t(d)];
    (span < 0 ? lo : hi) += span;
  }
  const auto* base = static_cast<const std::byte*>(v.data());
  const size_t elem = dtype_size(v.dtype());
  return {base + lo * int64_t(elem), base + (hi + 1) * int64_t(elem)};
}
inline bool may_overlap(const View& a, const View& b) {
  const ByteRange ra = byte_range(a), rb = byte_range(b);
  return ra.first && rb.first && ra.first < rb.last && rb.first < ra.last;
}

// Records the first bad index of a kernel call in the stream's error record
// (only the first report since the host last took it is kept).
void report_index_error(const Stream& stream, int32_t site, int64_t position, int64_t value);

}  // namespace roformer::kernels::cpu
