// core/cuda/optimizer.cu (the fused AdamW and gradient-norm passes) for the
// SIMT emulator: roformer::simt_cuda::adamw_step... (emulated_optimizer.h).
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/optimizer.cu"
