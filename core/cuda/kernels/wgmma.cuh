// Hopper's warpgroup products (wgmma.mma_async, sm_90a only) as the flash
// kernels use them: m64n64k16, bf16 in, f32 accumulate, B (and A, or A from
// registers) read from shared tiles in the 128-byte swizzle (SwizzledTile)
// through 64-bit matrix descriptors. A warpgroup is four consecutive warps;
// warp w of it holds rows 16 w..16 w + 15 of the 64-row accumulator in the
// layout of mma.sync's 16 x 8 C fragments, repeated over the eight 8-wide
// column tiles, so an accumulator float[8][4] is c[nt][e] of mma.sync's code.
// Under ROFORMER_SIMT_EMULATION each instruction is the emulator's
// (tests/simt/simt.h), written from the PTX ISA.
#pragma once

#include "core/cuda/kernels/flash_attention_mma.cuh"

namespace roformer::kernels::cuda {

namespace {

// The 128-byte swizzle repeats every 1024 bytes of shared address; the
// descriptors below assume its atoms start there (base offset 0). A
// kernel's dynamic shared memory may start anywhere after its static
// variables, so the tiles are placed from the first such boundary in it
// (kSwizzleAtom bytes more than they take).
constexpr size_t kSwizzleAtom = 1024;
__device__ __forceinline__ unsigned char* swizzle_aligned(unsigned char* dynamic_shared) {
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(dynamic_shared)) % kSwizzleAtom;
  return dynamic_shared + (kSwizzleAtom - misalign) % kSwizzleAtom;
}

// The descriptor of a SwizzledTile operand read K-major (rows of the tile
// are A's rows or B's columns, the product's k along each row; Q and K) or
// N-major (B[k][n] = tile[k][n]; V): bits 0-13 the start address, 16-29 the
// leading byte offset, 32-45 the stride byte offset (all in 16-byte units),
// 62-63 the swizzle (1: 128 bytes). The stride is 1024 bytes, from one 8-row
// atom to the next; the leading offset is unused by these layouts (K-major
// swizzled: assumed 1; N-major with 64 columns: one 64-wide block). `tile`
// points at the product's first row (or k) and must lie on a 1024-byte
// boundary, where the swizzle pattern starts (base offset 0); `byte_offset`
// moves along the k of a K-major tile (32 bytes a 16-wide step) or the k
// rows of an N-major one (2,048 bytes a 16-row step) inside it. The offset
// is added last, to the low word with the start field and the leading
// offset already in it (shared addresses stay under 256 KB, so the sum
// never carries out of the start field), and the high word is a constant:
// ptxas then computes a tile's low word once and each step's with one add,
// in uniform registers where the tile's address is uniform.
__device__ __forceinline__ uint64_t swizzled_descriptor(const bf16_t* tile, uint32_t byte_offset) {
  constexpr uint32_t kLeading = 1, kStride = 1024 >> 4, kSwizzle128 = 1;
  const uint32_t low =
      (((uint32_t(__cvta_generic_to_shared(tile)) & 0x3FFFFu) >> 4) | (kLeading << 16)) +
      (byte_offset >> 4);
  return uint64_t(kStride | (kSwizzle128 << 30)) << 32 | low;
}

// Descriptor of k step ks (k = 16 ks...) of a 64-row K-major tile (A or B).
__device__ __forceinline__ uint64_t k_major_step(const bf16_t* tile, int ks) {
  return swizzled_descriptor(tile, uint32_t(ks) * 32u);
}
// Descriptor of k step ks (rows 16 ks...) of an N-major B tile of 64 columns.
__device__ __forceinline__ uint64_t n_major_step(const bf16_t* tile, int ks) {
  return swizzled_descriptor(tile, uint32_t(ks) * 16u * kD * uint32_t(sizeof(bf16_t)));
}

// This thread's warpgroup in its block (four consecutive warps), as a value
// ptxas knows to be the same across the warp: a shuffle from lane 0 (as
// CUTLASS's canonical_warp_group_idx). Tile addresses built from it stay in
// uniform registers, so those products' descriptors are not moved there one
// register at a time (the model's wgmma backward: about 93 of the 163
// instructions a query tile that this and the descriptors above save).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
}

// Orders this thread's earlier register accesses before the warpgroup's next
// wgmma reads or writes those registers (accumulators, A fragments).
__device__ __forceinline__ void wgmma_fence() {
#if !defined(ROFORMER_SIMT_EMULATION)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::wgmma_commit();
#else
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// A register copy that stays after the wgmma wait before it in the PTX. A
// plain assignment need not: as a loop-carried value's copy it may be
// placed at the loop's latch, writing the A fragments of a product still
// in flight (undefined in the PTX ISA until the wait).
__device__ __forceinline__ uint32_t copy_after_wait(uint32_t x) {
#if defined(ROFORMER_SIMT_EMULATION)
  return x;
#else
  uint32_t y;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
#endif
}

// Waits until at most kPending of the thread's newest wgmma groups are in
// flight; the accumulators of the others hold their results.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::wgmma_wait(kPending);
#else
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

#if !defined(ROFORMER_SIMT_EMULATION)
// The 32 accumulator registers of an m64n64 product as asm operands 0..31.
#define RF_WGMMA_D(d)                                                                           \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
#define RF_WGMMA_D_LIST                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#endif

// d (64 x 64, this thread's part) = A B (+ d when accumulate), A and B both
// tiles in shared memory: K-major (S = Q K^T), or A M-major by kTransA (its
// k along the tile's rows: dQ = dS K from dS^T) and B N-major by kTransB.
template <bool kTransA = false, bool kTransB = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                         bool accumulate) {
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::wgmma_m64n64k16_ss(reinterpret_cast<float(&)[32]>(d), desc_a, desc_b,
                                       accumulate, kTransA, kTransB);
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " RF_WGMMA_D_LIST
      ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : RF_WGMMA_D(d)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(kTransA)), "n"(int(kTransB)));
#endif
}

// d += A B with A (64 x 16) from registers (this thread's four bf16 pairs in
// mma.sync's A layout, per warp) and B an N-major tile (trans-b): O += P V.
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const uint32_t (&a)[4],
                                         uint64_t desc_b) {
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::wgmma_m64n64k16_rs(reinterpret_cast<float(&)[32]>(d), a, desc_b, true, true);
#else
  // scale-d is a predicate operand, set true (the PTX ISA takes no immediate there).
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " RF_WGMMA_D_LIST
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : RF_WGMMA_D(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
#endif
}

// After a wait (and before the products that add into them, when other code
// has written them): the accumulator's registers are redefined at this point
// of the program, so the compiler moves no read or write of them across the
// wait. To nvcc, an asm's "+f" outputs are final when the asm ends, while a
// wgmma's land only at its wait_group (CUTLASS's warpgroup_fence_operand).
__device__ __forceinline__ void fence_accumulator(float (&d)[8][4]) {
#if !defined(ROFORMER_SIMT_EMULATION)
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[nt][e])::"memory");
#else
  (void)d;
#endif
}

// The same for the A fragments (k steps of four registers) an in-flight
// wgmma_rs reads, after its wait: they stay live and unchanged until here,
// so the compiler cannot give their registers to other values before.
__device__ __forceinline__ void fence_fragments(uint32_t (&p)[4][4]) {
#if !defined(ROFORMER_SIMT_EMULATION)
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p[kk][e])::"memory");
#else
  (void)p;
#endif
}

}  // namespace

}  // namespace roformer::kernels::cuda
