// Tensor: a cheap handle to an implementation holding shape, strides, element
// offset, dtype and a shared storage. Views (reshape, transpose, narrow,
// expand, ...) share the storage; they are differentiable like any op.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"

namespace roformer {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

// A block of device memory. The version counter is shared by every view of
// the storage and bumped by each in-place write, so autograd can tell when a
// tensor saved for backward has been modified.
struct StorageImpl {
  StorageImpl(size_t nbytes, Device device);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  uint64_t version = 0;
};

class Node;
struct GradSlot;  // core/autograd.h
struct TensorImpl {
  std::shared_ptr<StorageImpl> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf
  std::shared_ptr<Node> grad_fn;     // the node that produced this tensor, if any
  // A leaf's persistent gradient buffer and "gradient ready" hook, if set.
  std::shared_ptr<GradSlot> grad_slot;
};

// Counter-based random state: values are a pure function of (seed, offset,
// element index); `take(n)` reserves n numbers and advances the offset.
struct Generator {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint64_t take(uint64_t n) {
    const uint64_t start = offset;
    offset += (n + 3) / 4 * 4;
    return start;
  }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- factories -----------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor arange(int64_t start, int64_t end, DType dtype = DType::i64,
                       Device device = Device::cpu());
  // Copies host data to a tensor on `device`; the tensor gets T's dtype.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // Uniform [0, 1) and standard normal numbers from Philox(seed, offset), on
  // `device` by the same rule (the same uniforms; normals up to the device's
  // last-bit rounding of log, sqrt and cos).
  static Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32,
                      Device device = Device::cpu());

  // --- properties ----------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return int64_t(impl().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl().shape); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  bool is_contiguous() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  // Pointer to the first element (storage start + offset).
  void* data() const;
  template <class T>
  T* data_as() const;
  std::string str(int64_t max_per_dim = 6) const;  // readable printing
  std::string desc() const;                        // "f32[2, 3]" for messages
  uint64_t version() const { return impl().storage->version; }
  void bump_version() const { ++impl().storage->version; }
  bool shares_storage_with(const Tensor& other) const {
    return impl().storage == other.impl().storage;
  }

  // --- views (no copies; differentiable) -----------------------------------
  Tensor view(const Shape& shape) const;     // needs compatible strides
  Tensor reshape(const Shape& shape) const;  // view if possible, else copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // narrow + squeeze
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;  // itself if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;
  // A copy on `device` (itself if already there); differentiable. Throws
  // naming the device when this build or machine lacks it.
  Tensor to(Device device) const;

  // --- host read-back --------------------------------------------------------
  template <class T>
  std::vector<T> to_vector() const;  // converts to T from any dtype; waits for the device
  double item() const;               // a one-element tensor as double; waits for the device

  // --- in-place (not differentiable; bump the version counter) --------------
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // same shape (or broadcastable), any dtype, any device
  Tensor& zero_() { return fill_(0.0); }

  // --- autograd --------------------------------------------------------------
  bool requires_grad() const { return impl_ && impl().requires_grad; }
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor grad() const;
  // With a persistent gradient buffer (flat parameters), both write into it:
  // set_grad copies `grad` in, zero_grad zeroes it; grad() is undefined until
  // a gradient arrives either way.
  void set_grad(const Tensor& grad) const;
  void zero_grad() const;
  const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
  // Reverse-mode gradient of this (scalar, unless `gradient` is given).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;  // same storage, no history

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Makes a tensor that views `base`'s storage with another geometry (no history).
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

// Normalises a possibly negative dim against `ndim`; throws naming `op`.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

extern template std::vector<float> Tensor::to_vector<float>() const;
extern template std::vector<double> Tensor::to_vector<double>() const;
extern template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
extern template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
extern template Tensor Tensor::from_vector<float>(const std::vector<float>&, const Shape&, Device);
extern template Tensor Tensor::from_vector<double>(const std::vector<double>&, const Shape&,
                                                   Device);
extern template Tensor Tensor::from_vector<int32_t>(const std::vector<int32_t>&, const Shape&,
                                                    Device);
extern template Tensor Tensor::from_vector<int64_t>(const std::vector<int64_t>&, const Shape&,
                                                    Device);
extern template Tensor Tensor::from_vector<bf16>(const std::vector<bf16>&, const Shape&, Device);

template <class T>
T* Tensor::data_as() const {
  if (dtype_of<T>() != dtype())
    throw Error(
        detail::concat("data_as: tensor is ", desc(), ", asked for ", dtype_name(dtype_of<T>())));
  return static_cast<T*>(data());
}

}  // namespace roformer
