// The kernel list's CUDA functions compiled for the SIMT emulator
// (kernel_emulation.h): roformer::kernels::simt_cuda::<name> takes the
// arguments of cuda::<name> with host memory for every operand and a Stream
// whose `error` is a host KernelError. Only the kernel files that have an
// *_emulated.cpp in tests/simt/ are defined; simt_cuda_kernel_table
// (kernel_table_emulated.cpp) holds them all, the rest refusing.
#pragma once

#include "core/kernels/kernel_list.h"

namespace roformer::kernels::simt_cuda {
#define ROFORMER_SIMT_DECLARE_KERNEL(name, ...) signature::name name;
ROFORMER_KERNELS(ROFORMER_SIMT_DECLARE_KERNEL)
#undef ROFORMER_SIMT_DECLARE_KERNEL
}  // namespace roformer::kernels::simt_cuda

namespace roformer::kernels {
// The emulated kernels as a device table: what cuda_kernel_table is to the
// CUDA kernels (rope_attention.cu composes through it).
extern const KernelTable simt_cuda_kernel_table;
}  // namespace roformer::kernels
