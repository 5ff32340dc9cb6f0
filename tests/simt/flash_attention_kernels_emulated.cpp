// core/cuda/kernels/flash_attention.cu, flash_attention_backward.cu and
// their wgmma counterparts for
// the SIMT emulator as the attention kernels of the list call them
// (kernel_emulation.h: kernels::simt_cuda::flash_forward...);
// flash_attention_emulated.cpp builds them for its own tests under other
// names.
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/flash_attention.cu"
#include "core/cuda/kernels/flash_attention_backward.cu"
#include "core/cuda/kernels/flash_attention_backward_wgmma.cu"
#include "core/cuda/kernels/flash_attention_wgmma.cu"
