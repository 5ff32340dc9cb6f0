// core/cuda/kernels/flash_attention.cu for the SIMT emulator as the
// attention kernels of the list call it (kernel_emulation.h:
// kernels::simt_cuda::flash_forward...); flash_attention_emulated.cpp
// builds it for its own tests under other names.
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/flash_attention.cu"
