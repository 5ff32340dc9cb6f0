// core/cuda/kernels/cross_entropy.cu for the SIMT emulator (kernel_emulation.h).
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/cross_entropy.cu"
