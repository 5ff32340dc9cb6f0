// core/cuda/kernels/rope_attention.cu for the SIMT emulator
// (kernel_emulation.h); its composed path runs the emulated kernel table.
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/rope_attention.cu"
