// Rotary position embedding (paper eq. 34). A rotation is orthogonal, so the
// backward is the same kernel rotating the gradient by minus the angle; the
// node keeps only the (shared, cached) cos/sin table, no activations.
#include <deque>
#include <memory>
#include <mutex>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/ops/rope_table.h"

namespace roformer {

namespace {

// One entry of the table cache: the cos/sin table [2, S, D/2] of a positions tensor, built on its
// device by a kernel. Every layer asks for the table of the same positions tensor (forward and
// backward), so a few entries keyed by that tensor's storage, offset and version (never its values:
// no host read) serve a whole step.
struct TableEntry {
  std::weak_ptr<StorageImpl> storage;
  int64_t offset, length, stride;
  uint64_t version;
  int64_t dim;
  double base;
  DType dtype;
  Tensor table;
};

}  // namespace

Tensor rope_table(const Tensor& positions, int64_t dim, double base, DType dtype) {
  constexpr size_t kCached = 8;
  static std::mutex mutex;
  static std::deque<TableEntry> cache;
  const std::shared_ptr<StorageImpl>& storage = positions.impl().storage;
  auto same = [&](const TableEntry& e) {
    return e.storage.lock() == storage && e.offset == positions.offset() &&
           e.length == positions.shape()[0] && e.stride == positions.strides()[0] &&
           e.version == positions.version() && e.dim == dim && e.base == base && e.dtype == dtype;
  };
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const TableEntry& e : cache)
      if (same(e)) return e.table;
  }
  const int64_t S = positions.shape()[0];
  Tensor table = Tensor::empty({2, S, dim / 2}, dtype, positions.device());
  launch::rope_table(positions.device(), positions, base, table);
  std::lock_guard<std::mutex> lock(mutex);
  cache.push_front(TableEntry{storage, positions.offset(), S, positions.strides()[0],
                              positions.version(), dim, base, dtype, table});
  if (cache.size() > kCached) cache.pop_back();
  return table;
}

void check_rope_arguments(const char* op, const Tensor& positions, int64_t S, int64_t D,
                          double base, const Tensor& x) {
  if (D % 2 != 0)
    throw Error(detail::concat(op, ": head dimension ", D, " must be even (x is ", x.desc(), ")"));
  dispatch_index(positions.dtype(), "rope positions", [](auto) {});
  if (positions.dim() != 1 || positions.shape()[0] != S)
    throw Error(detail::concat(op, ": positions ", positions.desc(), " do not match x ", x.desc(),
                               " (expected [", S, "] for the sequence dimension)"));
  if (!(base > 0.0)) throw Error(detail::concat(op, ": base must be positive, got ", base));
}

Tensor rope(const Tensor& x, const Tensor& positions, double base, RopeLayout layout) {
  const Device device = kernel_device("rope", {&x, &positions});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat("rope: expected a floating tensor, got ", x.desc()));
  if (x.dim() < 2) throw Error(detail::concat("rope: expected x [..., S, D], got ", x.desc()));
  const int64_t S = x.shape()[size_t(x.dim() - 2)], D = x.shape().back();
  check_rope_arguments("rope", positions, S, D, base, x);

  const Tensor table = rope_table(positions, D, base, rope_table_dtype(x.dtype()));
  const bool interleaved = layout == RopeLayout::interleaved;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  launch::rope(device, x, table, interleaved, /*inverse=*/false, out);
  return record("rope", out, {&x}, [table, interleaved](const Tensor& g) {
    Tensor grad = Tensor::empty(g.shape(), g.dtype(), g.device());
    launch::rope(g.device(), g, table, interleaved, /*inverse=*/true, grad);
    return std::vector<Tensor>{grad};
  });
}

}  // namespace roformer
