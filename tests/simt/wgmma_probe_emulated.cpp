// tests/cuda/wgmma_probe.cu as it is, compiled by g++ for the SIMT emulator
// (its launch runs through simt::launch, on host memory).
#include "tests/simt/simt.h"
//
#include "core/cuda/kernels/attention_common.cuh"

#undef RF_LAUNCH
#define RF_LAUNCH(kernel, grid, block, shared, stream, ...) \
  ((void)(stream), ::roformer::simt::launch(kernel, grid, block, shared, __VA_ARGS__))
#define allow_shared ::roformer::simt::allow_dynamic_shared

#include "tests/cuda/wgmma_probe.cu"
