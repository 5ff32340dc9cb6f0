// The kernel list's CUDA functions compiled for the SIMT emulator
// (kernel_emulation.h): roformer::kernels::simt_cuda::<name> takes the
// arguments of cuda::<name> with host memory for every operand and a Stream
// whose `error` is a host KernelError. Only the kernel files that have an
// *_emulated.cpp in tests/simt/ are defined.
#pragma once

#include "core/kernels/kernel_list.h"

namespace roformer::kernels::simt_cuda {
#define ROFORMER_SIMT_DECLARE_KERNEL(name, ...) signature::name name;
ROFORMER_KERNELS(ROFORMER_SIMT_DECLARE_KERNEL)
#undef ROFORMER_SIMT_DECLARE_KERNEL
}  // namespace roformer::kernels::simt_cuda
