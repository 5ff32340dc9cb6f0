// core/cuda/kernels/token_stream.cu for the SIMT emulator (kernel_emulation.h).
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/token_stream.cu"
