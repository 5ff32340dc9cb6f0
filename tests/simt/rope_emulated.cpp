// core/cuda/kernels/rope.cu for the SIMT emulator (kernel_emulation.h).
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/rope.cu"
