#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/autograd.h"
#include "core/device_backend.h"
#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/philox.h"

namespace roformer {

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t wrapped = dim < 0 ? dim + ndim : dim;
  // A 0-d tensor has no dimension to name: every caller indexes shape()[dim].
  if (wrapped < 0 || wrapped >= ndim)
    throw Error(detail::concat(op, ": dimension ", dim, " out of range for a tensor with ", ndim,
                               " dimensions"));
  return wrapped;
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string index = text.substr(5);
    if (!index.empty() && std::all_of(index.begin(), index.end(), ::isdigit))
      return Device::cuda(std::stoi(index));
  }
  throw InputError("unknown device '" + text + "' (expected cpu, cuda or cuda:N)");
}

StorageImpl::StorageImpl(size_t bytes, Device dev) : nbytes(bytes), device(dev) {
  data = allocator_for(device).allocate(nbytes);
}

StorageImpl::~StorageImpl() {
  allocator_for(device).deallocate(data, nbytes);
}

TensorImpl& Tensor::impl() const {
  if (!impl_) throw Error("use of an undefined tensor");
  return *impl_;
}

// --- factories ----------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape)
    if (s < 0) throw Error("empty: negative size in shape " + shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<StorageImpl>(size_t(shape_numel(shape)) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::arange(int64_t start, int64_t end, DType dtype, Device device) {
  Tensor t = empty({std::max<int64_t>(end - start, 0)}, dtype);
  dispatch_all(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(double(start + i));
  });
  return t.to(device);
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  if (int64_t(values.size()) != shape_numel(shape))
    throw Error(detail::concat("from_vector: ", values.size(), " values do not fill shape ",
                               shape_str(shape)));
  Tensor t = empty(shape, dtype_of<T>(), device);
  if (values.empty()) return t;
  if (device.is_cpu()) {
    std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
  } else {
    backend_for(device).copy_bytes(t.data(), device, values.data(), Device::cpu(),
                                   values.size() * sizeof(T), current_stream(device));
  }
  return t;
}
template Tensor Tensor::from_vector<float>(const std::vector<float>&, const Shape&, Device);
template Tensor Tensor::from_vector<double>(const std::vector<double>&, const Shape&, Device);
template Tensor Tensor::from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, Device);
template Tensor Tensor::from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, Device);
template Tensor Tensor::from_vector<bf16>(const std::vector<bf16>&, const Shape&, Device);

Tensor Tensor::rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
  Tensor out = empty(shape, dtype, device);
  const uint64_t base = gen.take(uint64_t(out.numel()));
  launch::random_fill(device, out, gen.seed, base, /*normal=*/false);
  return out;
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  Tensor out = empty(shape, dtype, device);
  // Two words per number (Box-Muller).
  const uint64_t base = gen.take(2 * uint64_t(out.numel()));
  launch::random_fill(device, out, gen.seed, base, /*normal=*/true);
  return out;
}

// --- properties -----------------------------------------------------------------

int64_t Tensor::size(int64_t d) const {
  return shape()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  return strides()[wrap_dim(d, dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to be out of place
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

void* Tensor::data() const {
  return static_cast<char*>(impl().storage->data) + impl().offset * int64_t(dtype_size(dtype()));
}

std::string Tensor::desc() const {
  if (!defined()) return "undefined";
  std::string s = std::string(dtype_name(dtype())) + shape_str(shape());
  // append() rather than "@" + str: g++ 12 warns falsely (-Wrestrict) on the latter.
  if (!device().is_cpu()) s.append("@").append(device().str());
  return s;
}

std::string Tensor::str(int64_t max_per_dim) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(" << desc();
  if (requires_grad()) out << ", requires_grad";
  out << ")\n";
  const Tensor host = to(Device::cpu()).to(DType::f64).contiguous();
  const std::vector<double> values = host.to_vector<double>();
  const Shape& s = shape();
  // Recursive printing over dims with elision past max_per_dim entries.
  std::vector<int64_t> index(s.size(), 0);
  std::function<void(size_t, int64_t)> print = [&](size_t d, int64_t base) {
    if (d == s.size()) {
      out << values[size_t(base)];
      return;
    }
    out << '[';
    const int64_t stride = contiguous_strides(s)[d];
    for (int64_t i = 0; i < s[d]; ++i) {
      if (s[d] > max_per_dim && i == max_per_dim / 2) {
        out << "..., ";
        i = s[d] - max_per_dim / 2;
      }
      print(d + 1, base + i * stride);
      if (i + 1 < s[d]) out << (d + 1 == s.size() ? ", " : ",\n ");
    }
    out << ']';
  };
  out.precision(5);
  print(0, 0);
  return out.str();
}

// --- views ------------------------------------------------------------------------

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl().storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

namespace {
// Strides for viewing a tensor as `shape` without copying, if possible.
bool view_strides(const Tensor& t, const Shape& shape, Shape& out) {
  if (t.is_contiguous()) {
    out = contiguous_strides(shape);
    return true;
  }
  // General case (as in PyTorch's computeStride): match chunks of old dims
  // that are contiguous among themselves against new dims.
  const Shape& old_shape = t.shape();
  const Shape& old_strides = t.strides();
  out.assign(shape.size(), 0);
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = int64_t(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                          old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Shape infer_shape(Shape shape, int64_t numel, const char* op, const Tensor& t) {
  int64_t known = 1, infer_at = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (infer_at >= 0) throw Error(detail::concat(op, ": only one dimension can be -1"));
      infer_at = int64_t(d);
    } else if (shape[d] < 0) {
      // {-2, -3} multiplies to 6 too: only a single -1 is ever inferred.
      throw Error(detail::concat(op, ": size ", shape[d], " at dimension ", d, " of ",
                                 shape_str(shape),
                                 " is negative (only one -1 may be inferred) for ", t.desc()));
    } else {
      known *= shape[d];
    }
  }
  if (infer_at >= 0 && known > 0 && numel % known == 0) shape[infer_at] = numel / known;
  // An unresolved -1 (other dims multiply to 0) must not survive as a size.
  if ((infer_at >= 0 && shape[infer_at] == -1) || shape_numel(shape) != numel)
    throw Error(detail::concat(op, ": shape ", shape_str(shape), " is invalid for ", t.desc(), " (",
                               numel, " elements)"));
  return shape;
}
}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  const Shape shape = infer_shape(requested, numel(), "view", *this);
  Shape strides;
  if (!view_strides(*this, shape, strides))
    throw Error(detail::concat("view: cannot view ", desc(), " with strides ",
                               shape_str(this->strides()), " as ", shape_str(shape),
                               " without a copy; use reshape()"));
  const Shape in_shape = this->shape();
  return record("view", make_view(*this, shape, strides, offset()), {this},
                [in_shape](const Tensor& g) { return std::vector<Tensor>{g.reshape(in_shape)}; });
}

Tensor Tensor::reshape(const Shape& requested) const {
  const Shape shape = infer_shape(requested, numel(), "reshape", *this);
  Shape strides;
  if (view_strides(*this, shape, strides)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> dims(static_cast<size_t>(dim()));
  for (int64_t i = 0; i < dim(); ++i) dims[i] = i;
  std::swap(dims[wrap_dim(d0, dim(), "transpose")], dims[wrap_dim(d1, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  if (int64_t(dims.size()) != dim())
    throw Error(detail::concat("permute: ", dims.size(), " dims given for ", desc()));
  Shape shape(dims.size()), strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    if (inverse[d] != -1) throw Error("permute: repeated dimension in permutation");
    inverse[d] = int64_t(i);
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  return record("permute", make_view(*this, shape, strides, offset()), {this},
                [inverse](const Tensor& g) { return std::vector<Tensor>{g.permute(inverse)}; });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  if (start < 0) start += shape()[d];
  if (start < 0 || length < 0 || start + length > shape()[d])
    throw Error(detail::concat("narrow: range [", start, ", ", start + length,
                               ") out of bounds for dimension ", d, " of ", desc()));
  Shape shape = this->shape();
  shape[d] = length;
  const Shape in_shape = this->shape();
  const DType dt = dtype();
  return record("narrow", make_view(*this, shape, strides(), offset() + start * strides()[d]),
                {this}, [in_shape, dt, d, start, length](const Tensor& g) {
                  Tensor full = Tensor::zeros(in_shape, dt, g.device());
                  NoGradGuard no_grad;
                  full.narrow(d, start, length).copy_(g);
                  return std::vector<Tensor>{full};
                });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape shape = this->shape(), strides = this->strides();
  const int64_t stride = d < dim() ? strides[d] * shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return record("unsqueeze", make_view(*this, shape, strides, offset()), {this},
                [d](const Tensor& g) { return std::vector<Tensor>{g.squeeze(d)}; });
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[d] != 1)
    throw Error(detail::concat("squeeze: dimension ", d, " of ", desc(), " is not 1"));
  Shape shape = this->shape(), strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return record("squeeze", make_view(*this, shape, strides, offset()), {this},
                [d](const Tensor& g) { return std::vector<Tensor>{g.unsqueeze(d)}; });
}

Tensor Tensor::expand(const Shape& shape) const {
  if (int64_t(shape.size()) < dim())
    throw Error(detail::concat("expand: cannot expand ", desc(), " to ", shape_str(shape)));
  const size_t lead = shape.size() - size_t(dim());
  Shape out_shape(shape.size()), out_strides(shape.size(), 0);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d < lead) {
      out_shape[d] = shape[d];
      continue;
    }
    const int64_t own = this->shape()[d - lead];
    const int64_t want = shape[d] == -1 ? own : shape[d];
    if (own != want && own != 1)
      throw Error(detail::concat("expand: cannot expand ", desc(), " to ", shape_str(shape)));
    out_shape[d] = want;
    out_strides[d] = own == want ? strides()[d - lead] : 0;
  }
  const Shape in_shape = this->shape();
  return record("expand", make_view(*this, out_shape, out_strides, offset()), {this},
                [in_shape](const Tensor& g) { return std::vector<Tensor>{sum_to(g, in_shape)}; });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  Shape shape;
  for (int64_t d = 0; d < start_dim; ++d) shape.push_back(this->shape()[d]);
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged *= this->shape()[d];
  shape.push_back(merged);
  for (int64_t d = end_dim + 1; d < dim(); ++d) shape.push_back(this->shape()[d]);
  return reshape(shape);
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  const Device device = kernel_device("clone", {this});
  Tensor out = empty(shape(), dtype(), device);
  launch::copy(device, *this, out);
  return record("clone", out, {this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor Tensor::to(DType target) const {
  return target == dtype() ? *this : cast(*this, target);
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(shape(), dtype(), target);
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  const Device source = device();
  return record("to", out, {this},
                [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
}

// --- host read-back ----------------------------------------------------------------

template <class T>
std::vector<T> Tensor::to_vector() const {
  // The one host read: raise what kernels reported since the last one.
  check_kernel_errors();
  if (!device().is_cpu()) return to(Device::cpu()).to_vector<T>();
  Tensor host = Tensor::empty(shape(), dtype_of<T>());
  launch::copy(Device::cpu(), *this, host);
  const T* p = static_cast<const T*>(host.data());
  return std::vector<T>(p, p + numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

double Tensor::item() const {
  if (numel() != 1) throw Error("item: expected one element, got " + desc());
  return to_vector<double>()[0];
}

// --- in-place ------------------------------------------------------------------------

Tensor& Tensor::fill_(double value) {
  launch::fill(kernel_device("fill_", {this}), *this, value);
  bump_version();
  return *this;
}

namespace {
// copy_ between devices: the source side makes the bytes match (broadcast,
// dtype, contiguity), the backend moves them, the destination side scatters
// them into a strided destination. Not differentiable, like every copy_.
void copy_across_devices(Tensor& dst, const Tensor& src) {
  NoGradGuard no_grad;
  Tensor staged = src;
  if (staged.shape() != dst.shape())
    staged = staged.numel() == dst.numel() && staged.is_contiguous() ? staged.view(dst.shape())
                                                                     : staged.expand(dst.shape());
  staged = staged.to(dst.dtype()).contiguous();
  const bool direct = dst.is_contiguous();
  Tensor landing = direct ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  // The side that is not the host moves the bytes (between two GPUs: the destination).
  const Device mover = dst.device().is_cpu() ? src.device() : dst.device();
  backend_for(mover).copy_bytes(landing.data(), dst.device(), staged.data(), src.device(),
                                dst.nbytes(), current_stream(mover));
  if (!direct) dst.copy_(landing);
}
}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  if (src.defined() && defined() && src.device() != this->device()) {
    copy_across_devices(*this, src);
    bump_version();
    return *this;
  }
  const Device device = kernel_device("copy_", {this, &src});
  if (src.shape() != shape()) {
    if (src.numel() == numel() && src.is_contiguous() && is_contiguous()) {
      launch::copy(device, src.view(shape()), *this);
    } else {
      launch::copy(device, src.expand(shape()), *this);
    }
  } else {
    launch::copy(device, src, *this);
  }
  bump_version();
  return *this;
}

// --- autograd ------------------------------------------------------------------------

Tensor& Tensor::set_requires_grad(bool value) {
  if (value && !is_floating(dtype()))
    throw Error("set_requires_grad: only floating tensors can require gradients, got " + desc());
  if (!is_leaf()) throw Error("set_requires_grad: only leaf tensors (no history) can be changed");
  impl().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  return impl().grad ? Tensor(impl().grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined() && g.shape() != shape())
    throw Error(detail::concat("set_grad: gradient ", g.desc(), " does not match ", desc()));
  const GradSlot* slot = impl().grad_slot.get();
  if (!slot || !slot->buffer.defined()) {
    impl().grad = g.defined() ? g.impl_ptr() : nullptr;
    return;
  }
  if (!g.defined()) {
    zero_grad();
    return;
  }
  Tensor buffer = slot->buffer;
  if (g.impl_ptr() != buffer.impl_ptr()) buffer.copy_(g);
  impl().grad = buffer.impl_ptr();
}

void Tensor::zero_grad() const {
  const GradSlot* slot = impl().grad_slot.get();
  if (slot && slot->buffer.defined() && impl().grad) {
    Tensor buffer = slot->buffer;
    buffer.zero_();
  }
  impl().grad.reset();
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor g = gradient;
  if (!g.defined()) {
    if (numel() != 1)
      throw Error("backward: an explicit gradient is needed for non-scalar " + desc());
    g = Tensor::ones(shape(), dtype(), device());
  } else if (g.shape() != shape()) {
    throw Error(detail::concat("backward: gradient ", g.desc(), " does not match ", desc()));
  }
  run_backward(*this, g, retain_graph);
}

Tensor Tensor::detach() const {
  return make_view(*this, shape(), strides(), offset());
}

}  // namespace roformer
