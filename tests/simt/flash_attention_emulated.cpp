// core/cuda/kernels/flash_attention.cu, flash_attention_backward.cu and
// their wgmma counterparts as
// they are, compiled by g++ for the SIMT emulator: their launches run
// through simt::launch, their scratch memory and shared-memory opt-in are the
// emulator's, their public functions are renamed (flash_attention_emulated.h)
// so they sit beside the real ones.
#include "tests/simt/simt.h"
//
#include "core/cuda/kernels/attention_common.cuh"

#undef RF_LAUNCH
#define RF_LAUNCH(kernel, grid, block, shared, stream, ...) \
  ((void)(stream), ::roformer::simt::launch(kernel, grid, block, shared, __VA_ARGS__))
#define allow_shared ::roformer::simt::allow_dynamic_shared
#define Scratch ::roformer::simt::HostScratch
#define cudaDeviceGetAttribute ::roformer::simt::device_attribute

#include "tests/simt/flash_attention_emulated.h"
//
#include "core/cuda/kernels/flash_attention.cu"
#include "core/cuda/kernels/flash_attention_backward.cu"
#include "core/cuda/kernels/flash_attention_backward_wgmma.cu"
#include "core/cuda/kernels/flash_attention_wgmma.cu"
