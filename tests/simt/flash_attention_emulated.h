// The tensor-core attention (core/cuda/kernels/flash_attention.cu) compiled
// for the SIMT emulator by flash_attention_emulated.cpp: simt_flash_forward,
// simt_flash_backward and simt_flash_supported take the arguments of
// flash_forward, flash_backward and flash_supported with host memory in
// place of device memory, and run the kernel's own source on the CPU. A
// translation unit includes this header or flash_attention.h, not both.
#pragma once

#define flash_forward simt_flash_forward
#define flash_backward simt_flash_backward
#define flash_supported simt_flash_supported
#define flash_forward_rows_per_warp simt_flash_forward_rows_per_warp
#define set_flash_forward_rows_per_warp set_simt_flash_forward_rows_per_warp
#define flash_dq_blocks_per_sm simt_flash_dq_blocks_per_sm
#define set_flash_dq_blocks_per_sm set_simt_flash_dq_blocks_per_sm
#define flash_backward_passes simt_flash_backward_passes
#define set_flash_backward_passes set_simt_flash_backward_passes
#define flash_backward_splits simt_flash_backward_splits
#define set_flash_backward_splits set_simt_flash_backward_splits
#define flash_forward_uses_wgmma simt_flash_forward_uses_wgmma
#define set_flash_forward_uses_wgmma set_simt_flash_forward_uses_wgmma
#define flash_wgmma_available simt_flash_wgmma_available
#define flash_forward_schedule simt_flash_forward_schedule
#define set_flash_forward_schedule set_simt_flash_forward_schedule
#define flash_forward_wgmma simt_flash_forward_wgmma
#define flash_backward_uses_wgmma simt_flash_backward_uses_wgmma
#define set_flash_backward_uses_wgmma set_simt_flash_backward_uses_wgmma
#define launch_key_tiles_wgmma simt_launch_key_tiles_wgmma
#define launch_keep_bits simt_launch_keep_bits
#define flash_keep_bits_ahead simt_flash_keep_bits_ahead
#define set_flash_keep_bits_ahead set_simt_flash_keep_bits_ahead
#include "core/cuda/kernels/flash_attention.h"
