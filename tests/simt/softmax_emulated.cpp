// core/cuda/kernels/softmax.cu for the SIMT emulator (kernel_emulation.h).
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/softmax.cu"
