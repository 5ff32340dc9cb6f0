// The prelude of a kernel file of core/cuda/kernels/ compiled by g++ for the
// SIMT emulator (simt.h): a translation unit includes this header, then the
// .cu file, and gets that file's kernel-list functions as
// roformer::kernels::simt_cuda::<name> (emulated_kernels.h declares them),
// running the kernels' own source on host memory.
//
// How: launches run through simt::launch, Scratch is host memory poisoned
// with 0xff bytes, the stream-ordered memory calls are plain host ones
// (simt::memset_bytes, copy_bytes), a shared-memory opt-in is the
// emulator's, CUB's sort is a host one, and the token `cuda` names
// simt_cuda, so the file's namespace roformer::kernels::cuda becomes
// roformer::kernels::simt_cuda: the emulated functions sit beside the real
// ones of roformer_kernels_cuda (same names: sum, max, copy... which no
// function-renaming macro could take), and see the real namespace's shared
// helpers (common.cuh) through a using-directive. Every header that must keep
// the real namespace is included here, before the rename; the emulated
// kernel list is declared here too, so that a kernel file's calls of list
// kernels (copy, in attention_common.cuh) reach the emulated ones. A binary
// links the *_emulated.cpp of every file its kernels call into.
#pragma once

#include "tests/simt/simt.h"
//
#include <algorithm>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda/kernels/common.cuh"
#include "core/philox.h"
#include "tests/simt/emulated_kernels.h"

#undef RF_LAUNCH
#define RF_LAUNCH(kernel, grid, block, shared, stream, ...) \
  ((void)(stream), ::roformer::simt::launch(kernel, grid, block, shared, __VA_ARGS__))
#define Scratch ::roformer::simt::HostScratch

#define cudaMemsetAsync(p, value, nbytes, stream) \
  ((void)(stream), ::roformer::simt::memset_bytes(p, value, nbytes))
#define cudaMemcpyAsync(dst, src, nbytes, kind, stream) \
  ((void)(kind), (void)(stream), ::roformer::simt::copy_bytes(dst, src, nbytes))
#define cudaMemcpy(dst, src, nbytes, kind) \
  ((void)(kind), ::roformer::simt::copy_bytes(dst, src, nbytes))
#define cudaStreamSynchronize(stream) ((void)(stream), cudaSuccess)
#define cudaDeviceGetAttribute ::roformer::simt::device_attribute
// attention_common.cuh's allow_shared: the emulator's opt-in (the shared
// memory carveout, a preference on a GPU, means nothing here).
#define cudaFuncSetAttribute(kernel, attribute, value)                 \
  ((attribute) == cudaFuncAttributeMaxDynamicSharedMemorySize          \
       ? ::roformer::simt::allow_dynamic_shared(kernel, size_t(value)) \
       : (void)0,                                                      \
   cudaSuccess)

// CUB's radix sort of (key, value) pairs (gather.cu), which runs on a device
// only: the same stable order by the key bits [begin_bit, end_bit), by a host
// std::stable_sort. The first call (no temporary storage) asks for 1 byte.
namespace cub {
struct DeviceRadixSort {
  template <class K, class V, class N>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                               const V* values_in, V* values_out, N count, int begin_bit,
                               int end_bit, cudaStream_t = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    const auto bits = [&](K k) {
      using U = std::make_unsigned_t<K>;
      const int width = end_bit - begin_bit;
      const U mask = width >= int(8 * sizeof(U)) ? ~U(0) : (U(1) << width) - 1;
      return (U(k) >> begin_bit) & mask;
    };
    std::vector<std::pair<K, V>> pairs(static_cast<size_t>(count));
    for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = {keys_in[i], values_in[i]};
    std::stable_sort(pairs.begin(), pairs.end(),
                     [&](const auto& a, const auto& b) { return bits(a.first) < bits(b.first); });
    for (size_t i = 0; i < pairs.size(); ++i) {
      keys_out[i] = pairs[i].first;
      values_out[i] = pairs[i].second;
    }
    return cudaSuccess;
  }
};
}  // namespace cub

// What the renamed namespaces see of the real ones: RF_CUDA_CHECK's
// ::roformer::cuda::check_status, common.cuh's helpers.
namespace roformer::simt_cuda {
using namespace ::roformer::cuda;
}  // namespace roformer::simt_cuda
namespace roformer::kernels::simt_cuda {
using namespace ::roformer::kernels::cuda;
}  // namespace roformer::kernels::simt_cuda

#define cuda simt_cuda
#define cuda_kernel_table simt_cuda_kernel_table

namespace roformer::kernels::cuda {
// Declared here so that the kernel files' calls find the emulated one
// (stream_emulated.cpp), not common.cuh's through the using-directive.
void report_first_bad(const Stream& stream, int32_t site, const unsigned long long* first,
                      const KernelTensor& ids);
}  // namespace roformer::kernels::cuda
