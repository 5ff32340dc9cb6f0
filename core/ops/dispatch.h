// The one dispatch point from ops to kernels. launch::<name>(device, args...)
// finds the device's KernelTable (core/kernels/kernel_list.h), its current
// Stream, turns Tensor arguments into KernelTensor and calls the kernel. Ops
// include this header, never a device's kernel header.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "core/kernels/kernel_list.h"
#include "core/tensor.h"

namespace roformer {

namespace kernels {

// The table of `device`'s type; throws naming the device when this build has
// no kernels for it.
const KernelTable& table(Device device);
// The device's current stream (CPU: a stream whose error record is host memory).
Stream stream(Device device);
// Tests: the CPU device runs `table`'s kernels (tests/simt: the CUDA kernels'
// own source emulated over host memory) until called again with nullptr.
void set_cpu_kernel_table_for_tests(const KernelTable* table);

// A tensor as a kernel sees it; an undefined tensor gives KernelTensor{}.
KernelTensor kernel_tensor(const Tensor& t);

// Tensor -> KernelTensor; everything else passes through.
inline KernelTensor to_kernel_arg(const Tensor& t) {
  return kernel_tensor(t);
}
template <class T>
requires(!std::is_same_v<std::remove_cvref_t<T>, Tensor>) T && to_kernel_arg(T&& value) {
  return std::forward<T>(value);
}

// The describer of an index check: the message for a bad `value` at flat
// `position` of the index tensor. Kept on the host until the check is read.
using IndexErrorMessage = std::function<std::string(int64_t value, int64_t position)>;
// Registers the description of one op call that checks indices on `device`;
// the returned site goes to the kernel, which reports the first bad index
// with it. Marks the device as having checks to read.
int32_t index_check_site(Device device, IndexErrorMessage message);

// Kernel calls made through launch:: on every device since the start, per
// kernel of the list in its order (one relaxed increment a call): the
// benchmarks report calls per training step, which bounds the launch
// overhead a GPU step pays, and which passes it makes (mlm_step_bench
// --kernel-calls).
enum class KernelId : uint16_t {
#define ROFORMER_KERNEL_ID(name, ...) name,
  ROFORMER_KERNELS(ROFORMER_KERNEL_ID)
#undef ROFORMER_KERNEL_ID
      count
};
extern std::atomic<uint64_t> kernel_calls_by_id[size_t(KernelId::count)];
const char* kernel_name(KernelId id);
// All kernels' calls: the sum of kernel_calls_by_id.
uint64_t kernel_calls();

}  // namespace kernels

// launch::<name>(device, args...) for every kernel in the list.
namespace launch {
#define ROFORMER_LAUNCHER(name, ...)                                                              \
  template <class... Args>                                                                        \
  decltype(auto) name(Device device, Args&&... args) {                                            \
    kernels::kernel_calls_by_id[size_t(kernels::KernelId::name)].fetch_add(                       \
        1, std::memory_order_relaxed);                                                            \
    return kernels::table(device).name(kernels::stream(device), kernels::to_kernel_arg(args)...); \
  }
ROFORMER_KERNELS(ROFORMER_LAUNCHER)
#undef ROFORMER_LAUNCHER
}  // namespace launch

}  // namespace roformer
