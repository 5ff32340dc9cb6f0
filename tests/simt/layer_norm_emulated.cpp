// core/cuda/kernels/layer_norm.cu for the SIMT emulator (kernel_emulation.h).
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/layer_norm.cu"
