// The bf16 tensor-core attention (flash_attention.cu), called by the list's
// attention kernels when their operands fit it; the others keep the simple
// kernel of attention.cu.
#pragma once

#include "core/cuda/kernels/forward_schedule.h"
#include "core/kernels/kernel_list.h"

namespace roformer::kernels::cuda {

// RoPE applied while tiles load: table [2, P, D/2] f32 (cos, sin) of the
// positions of q's sequence dimension (padded) or of its tokens (token
// stream). table == nullptr: q and k are used as they are. inputs_rotated
// (the backward only): q and k are the rotated copies the forward attended
// with, so only the gradients are rotated back, as they are written.
struct FlashRope {
  const KernelTensor* table = nullptr;
  bool interleaved = true;
  bool inputs_rotated = false;
};

// True when the tensor-core path takes these operands: bf16, head dim 64 for
// q, k and v, unit last stride, rows 16-byte aligned. Outputs (out, grads)
// may be f32 or bf16; lse is f32.
bool flash_supported(const KernelTensor& q, const KernelTensor& k, const KernelTensor& v);
bool flash_supported(const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                     const KernelTensor& grad_out);

// Query rows each warp of the forward kernel owns: 16 (8 warps a block) or
// 32 (4 warps; each K and V fragment read from shared memory serves two
// 16-row tiles, for more registers a thread). Every row is computed the same
// way in both, so the results are the same bits; attention_bench measures
// both. Process-wide, 16 until set; other values throw.
int flash_forward_rows_per_warp();
void set_flash_forward_rows_per_warp(int rows);

// The forward's products: Hopper's warpgroup products (true, the default:
// wgmma, flash_attention_wgmma.cu, built for sm_90a) or mma.sync (false).
// The wgmma forward runs where the operands' device is compute capability
// 9.0 (flash_wgmma_available) and the mma.sync one elsewhere, whatever this
// says. The keep bits are the same either way, the outputs and lse agree to
// f32 rounding. On an H100 (2026-11-27) wgmma ran the forward 1.13x (S=512)
// to 1.24x (S=16384) faster with RoPE inside, 1.23x to 1.34x without;
// attention_bench measures both. Process-wide.
bool flash_forward_uses_wgmma();
void set_flash_forward_uses_wgmma(bool on);
bool flash_wgmma_available(int device);

// The wgmma forward's schedule of the key tiles: pipelined (the next tile's
// scores are issued with this tile's P V and its softmax runs while P V does,
// one barrier a tile; FlashAttention-3's overlap within a warpgroup) or in
// step (each tile's products waited for in turn, two barriers a tile). The
// same bits either way; attention_bench measures both. `automatic`, the
// default, pipelines the forwards without RoPE inside (the model's, since q
// and k are rotated once: set_rotate_once) and runs those with RoPE inside in
// step: on an H200 (2026-11-27) pipelining ran the plain forward 1.03x
// (S=512) to 1.07x (S=16384) faster, 1.02x with dropout (S=1536, 4096), and
// the ones with RoPE inside 0.91x to 0.97x (docs/performance/attention.md).
// Process-wide.
ForwardSchedule flash_forward_schedule();
void set_flash_forward_schedule(ForwardSchedule schedule);

// Where the wgmma forward's dropout keep bits are drawn: ahead of it (true,
// the default: a kernel of their own draws every row's words at full
// occupancy, and the forward reads its tiles' words as the backward does)
// or inside it (false: each key tile's Philox rounds beside its products).
// The same bits and outputs either way. The mma.sync forward always draws
// its own. On an H200 (2026-11-28) drawing ahead ran the pipelined forward
// with dropout 1.09x (S=512) to 1.15x (S=16384) faster, and the step at
// 1536 1.02x, within the spread (docs/performance/attention.md).
// attention_bench and mlm_step_bench time both. Process-wide.
bool flash_keep_bits_ahead();
void set_flash_keep_bits_ahead(bool on);

// The fused backward's key-tile kernel on wgmma (true, the default;
// flash_attention_backward_wgmma.cu, sm_90a) or on mma.sync (false), under
// the same rule: where the device is compute capability 9.0. The two-pass
// backward stays on mma.sync. dk, dv and dq agree with the mma.sync
// kernel's to f32 rounding. On an H100 (2026-11-27): 1.24x (S=512) to 1.31x
// faster with RoPE inside. Process-wide.
bool flash_backward_uses_wgmma();
void set_flash_backward_uses_wgmma(bool on);

// The order the fused wgmma backward's blocks sweep their query tiles in,
// each key tile: upwards every time (false, the default) or alternating
// (true: every other sweep downwards, starting on the rows the sweep before
// left in L2; at S = 1536 a sweep of all SMs covers about twice the L2).
// dq is the same bits either way (each row still adds the key tiles in
// order), dk and dv agree to f32 rounding (they sum the query tiles in the
// sweep's order). attention_bench and mlm_step_bench time both.
// Process-wide.
bool flash_backward_alternates_sweeps();
void set_flash_backward_alternates_sweeps(bool on);

// The backward's scheme: 1 pass (fused: a block streams the query tiles
// past 128 keys and computes S and dP once for dV, dK and dQ, five products;
// dQ summed in f32 per split of the key tiles; the default) or 2 passes (dq
// per query tile, then dk/dv per key tile: S and dP twice, seven products).
// dk and dv are the same bits either way; dq differs in f32 summation order.
// On an H100 (2026-11-27, mma.sync) the fused pass was faster with RoPE
// inside up to S=1536 (1.17x at 512), the two passes from 4096 (1.18x), and
// the wgmma fused backward beat both at every length; attention_bench
// measures all. Process-wide; other values throw.
int flash_backward_passes();
void set_flash_backward_passes(int passes);

// The fused backward's splits of each sequence's key tiles (each split sums
// its dq into its own f32 slice, then one kernel adds the slices in order):
// 0 (the default) chooses from the SM count and the grid (at most 16, by
// the time model of flash_backward_splits.h), n >= 1 takes n (at most the
// key tiles). The bits of dq follow the split count.
// Process-wide; values outside 0..64 throw.
int flash_backward_splits();
void set_flash_backward_splits(int splits);

// Blocks an SM the two-pass backward's dq pass is compiled for: 2 (Q's and
// dO's fragments read from shared memory each key tile, 128 registers: 16
// warps an SM; the default, 1.05x to 1.09x faster on an H100) or 1 (they
// stay in registers: 8 warps). The same bits either way; attention_bench
// measures both. Process-wide; other values throw.
int flash_dq_blocks_per_sm();
void set_flash_dq_blocks_per_sm(int blocks);

// q, k, v [B, H, S, D] with key_mask [B, Sk] (or undefined), or a token
// stream [T, H, D] with segments [N, 4] i64 on the device (then
// params.longest_segment is the longest length). Layouts as the list's
// attention and attention_varlen kernels.
void flash_forward(Stream stream, const AttentionParams& params, const FlashRope& rope,
                   const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                   const KernelTensor& key_mask, const KernelTensor& segments,
                   const KernelTensor& out, const KernelTensor& lse, const KernelTensor& keep_bits);
// The wgmma forward itself (flash_forward calls it when chosen and available).
void flash_forward_wgmma(Stream stream, const AttentionParams& params, const FlashRope& rope,
                         const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                         const KernelTensor& key_mask, const KernelTensor& segments,
                         const KernelTensor& out, const KernelTensor& lse,
                         const KernelTensor& keep_bits);
void flash_backward(Stream stream, const AttentionParams& params, const FlashRope& rope,
                    const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                    const KernelTensor& key_mask, const KernelTensor& segments,
                    const KernelTensor& out, const KernelTensor& lse, const KernelTensor& keep_bits,
                    const KernelTensor& grad_out, const KernelTensor& grad_q,
                    const KernelTensor& grad_k, const KernelTensor& grad_v);

}  // namespace roformer::kernels::cuda
