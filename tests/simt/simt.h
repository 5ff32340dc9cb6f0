// A small SIMT emulator: CUDA device code, compiled by g++ as host C++ after
// this prelude, runs on the CPU, so a kernel's own source is checked without a
// GPU (tests/simt/). Include it first, with ROFORMER_SIMT_EMULATION defined.
//
// What it emulates:
// - a launch runs the grid's blocks one after another; each thread of a block
//   is a fiber (fiber_context.h) on the calling OS thread, switched only at
//   __syncthreads() and at warp collectives, in lane order (reversed on every
//   other block, so a missing barrier meets both orders); blocks 0 and 1 of
//   every four switch warps at each collective (lockstep), blocks 2 and 3 run
//   a warp until it waits at a barrier, then the other warps of its
//   warpgroup (warp-serial), so a warp or warpgroup that a missing barrier
//   lets run ahead meets the others' unfinished work;
// - `__shared__` variables are function statics (blocks run one at a time, so
//   the running block's threads share them) placed, with the dynamic shared
//   memory, in one section, the shared window: __cvta_generic_to_shared gives
//   offsets into it, and it is filled with 0xff bytes (NaN in bf16 and f32)
//   before each block, so a read before a write shows;
// - __syncthreads() waits for every thread of the block; a warp collective
//   (__shfl_xor_sync, __shfl_sync, __ballot_sync, ldmatrix, mma.sync) waits for the warp's 32
//   lanes, then each lane takes its result; threads that never arrive (a lane
//   skipping a collective, a thread missing a barrier) are reported as a
//   deadlock, and lanes meeting at different collectives as divergence;
// - cp.async (16-byte copies from global to shared memory, commit and wait
//   groups): in lockstep blocks a copy lands at the wait that covers it, not
//   before (a read before the wait sees stale bytes); in warp-serial blocks
//   it lands when issued (a buffer refilled while others still read it
//   shows); a GPU may land it anywhere between;
// - ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 and
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, written from the PTX
//   ISA's fragment layouts (not from any kernel's comments); the product is
//   summed in double and rounded to f32 once (tensor cores keep at least f32);
// - dynamic shared memory above 48 KB needs the kernel's opt-in (allow_shared
//   through simt::allow_dynamic_shared), as cudaFuncSetAttribute on a GPU.
// - atomics (atomicAdd, atomicMin, atomicMax, atomicCAS): a thread runs
//   uninterrupted between switch points, so a plain read-modify-write is atomic;
// - the host side's stream-ordered memory calls (cudaMemsetAsync,
//   cudaMemcpyAsync, cudaMemcpy, cudaStreamSynchronize) on host memory, for
//   kernel files compiled through tests/simt/kernel_emulation.h, and the
//   device's SM count (cudaDeviceGetAttribute: four); a copy between
//   overlapping ranges is a fault (CUDA promises no memmove semantics).
// What it cannot: memory races and the memory model beyond the two fixed
// fiber orders, timing, bank conflicts, register or occupancy limits, partial
// warp masks, and device errors other than the checks above.
#pragma once

#ifndef ROFORMER_SIMT_EMULATION
#define ROFORMER_SIMT_EMULATION 1
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

namespace roformer::simt {

// What a running emulated thread sees as its built-in variables.
struct ThreadState {
  uint3 thread_idx{0, 0, 0}, block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1}, grid_dim{1, 1, 1};
  int linear = 0;  // thread index in the block (x fastest)
};

// The running fiber's state (set by the scheduler before it resumes one).
inline ThreadState* current_thread = nullptr;

// The largest dynamic shared memory a kernel may opt into (H100: 227 KB).
constexpr size_t kMaxDynamicShared = 227 * 1024;
constexpr size_t kDefaultDynamicShared = 48 * 1024;

// Runs `body` as every thread of every block of the grid, with
// `dynamic_shared` bytes of dynamic shared memory; rethrows what a thread
// throws, and throws on deadlock, divergence or a shared-memory fault.
// `kernel` identifies the kernel for the shared-memory opt-in.
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared,
              const std::function<void()>& body);

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
void allow_dynamic_shared(const void* kernel, size_t bytes);
template <class Kernel>
void allow_dynamic_shared(Kernel* kernel, size_t bytes) {
  allow_dynamic_shared(reinterpret_cast<const void*>(kernel), bytes);
}

// kernel<<<grid, block, shared>>>(args...): each thread gets its own copy of
// the arguments, as kernel parameters are.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, Args&&... args) {
  run_grid(reinterpret_cast<const void*>(kernel), grid, block, shared, [&] { kernel(args...); });
}

// The block's dynamic shared memory.
unsigned char* dynamic_shared();

// Offset of p in the shared window (throws when p is not shared memory).
uint32_t shared_address(const void* p);

void syncthreads();

// Warp collectives over the calling lane's warp (mask must be 0xffffffff).
// A shuffle of one word: from lane ^ arg (xor_mode) or from lane arg, within
// segments of `width` lanes.
uint32_t shfl_word(unsigned mask, uint32_t value, int arg, int width, bool xor_mode);

// __ballot_sync: bit l of the result is lane l's predicate.
uint32_t ballot(unsigned mask, bool predicate);

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 r, [address].
void ldmatrix_x4(uint32_t (&r)[4], uint32_t address, bool trans);

// cp.async.cg.shared.global [address], [source], 16: the 16 bytes are read
// now (by the caller, so AddressSanitizer checks the source in the kernel's
// translation unit; it must be 16-byte aligned) but land in shared memory only when a
// cp.async.wait_group lets them, so a read before the wait sees the poison
// (in warp-serial blocks they land now: see the schedules above).
void cp_async_16(uint32_t address, const void* source, const unsigned char (&bytes)[16]);
// cp.async.ca.shared.global [address], [source], 4: the same for 4 bytes
// (source and address 4-byte aligned).
void cp_async_4(uint32_t address, const void* source, const unsigned char (&bytes)[4]);
// cp.async.commit_group: the thread's copies since the last commit become a
// group.
void cp_async_commit();
// cp.async.wait_group n: every committed group of the thread but the n
// newest has landed. A thread that exits with copies that never landed is a
// fault (a load nobody waits for).
void cp_async_wait(int n);

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c.
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                       const float (&c)[4]);

// Hopper's warpgroup products (sm_90a), collectives of the calling thread's
// warpgroup (four consecutive warps, 128 threads), from the PTX ISA:
// wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 d, a, b-desc,
// scale-d, 1, 1, [trans-a,] trans-b with A from a shared-memory descriptor
// (_ss; K-major, or M-major by trans-a) or from four registers a thread
// (_rs); B K-major, or N-major by trans-b. Descriptors: start address, leading
// and stride byte offsets in 16-byte units, base offset (must be 0 here),
// swizzle mode (only the 128-byte swizzle is emulated); an operand's
// element is read at its canonical-layout address with bits [4:6] XORed
// with bits [7:9] of the shared address. Every thread of the warpgroup must
// pass the same descriptors and flags. The products are computed when the
// last thread arrives (from the shared bytes then), but land in d only at
// the wgmma_wait that retires them, so a read of d before the wait sees the
// old values; shared bytes an operation read that change before all 128
// threads have retired it are a fault, as is a thread exiting with products
// in flight. With scale_d, D = A B + the accumulator (the newest in-flight
// product's result for the same d, else d); without, D = A B.
// wgmma.fence and fence.proxy.async.shared::cta order nothing here (each
// operation reads shared memory when issued).
void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool scale_d,
                        bool trans_a, bool trans_b);
void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool scale_d,
                        bool trans_b);
// wgmma.commit_group: the thread's products since the last commit become a group.
void wgmma_commit();
// wgmma.wait_group n: every committed group of the thread but the n newest
// has landed in its accumulators.
void wgmma_wait(int n);

template <class T>
T shfl_generic(unsigned mask, T value, int arg, int width, bool xor_mode) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                "emulated shuffles move 4- or 8-byte values");
  uint32_t w[2] = {0, 0};
  std::memcpy(w, &value, sizeof(T));
  for (size_t i = 0; i < sizeof(T) / 4; ++i) w[i] = shfl_word(mask, w[i], arg, width, xor_mode);
  std::memcpy(&value, w, sizeof(T));
  return value;
}

// The host launchers' stream-ordered memory calls on host memory (emulated
// launches run at once, so every call is already ordered): cudaMemsetAsync,
// and cudaMemcpy(Async) of any kind, which throws on overlapping ranges.
cudaError_t memset_bytes(void* p, int value, size_t nbytes);
cudaError_t copy_bytes(void* dst, const void* src, size_t nbytes);

// cudaDeviceGetAttribute on the emulated device: four SMs (host code that
// sizes a grid from the SM count meets a small count) and compute
// capability 9.0 (an H100's); other attributes throw.
constexpr int kEmulatedMultiprocessors = 4;
cudaError_t device_attribute(int* value, cudaDeviceAttr attribute, int device);

// Device memory of one call (the kernels' Scratch), here host memory filled
// with 0xff bytes so an element read before it is written shows as NaN.
class HostScratch {
 public:
  template <class Stream>
  HostScratch(const Stream&, size_t nbytes) : bytes_(nbytes > 0 ? nbytes : 1, 0xff) {}
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(bytes_.data());
  }

 private:
  mutable std::vector<unsigned char> bytes_;
};

}  // namespace roformer::simt

// --- the CUDA built-ins, for g++ ---------------------------------------------------
// cuda_runtime.h outside nvcc already makes __device__, __global__, __host__
// empty and __forceinline__ an always-inline hint.
#undef __shared__
#define __shared__ static __attribute__((section("simt_shared")))
#undef __launch_bounds__
#define __launch_bounds__(...)
#define RF_DYNAMIC_SHARED(name) unsigned char* const name = ::roformer::simt::dynamic_shared()

#define threadIdx (::roformer::simt::current_thread->thread_idx)
#define blockIdx (::roformer::simt::current_thread->block_idx)
#define blockDim (::roformer::simt::current_thread->block_dim)
#define gridDim (::roformer::simt::current_thread->grid_dim)

inline void __syncthreads() {
  ::roformer::simt::syncthreads();
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return ::roformer::simt::shfl_generic(mask, value, lane_mask, width, true);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::roformer::simt::ballot(mask, predicate != 0);
}
template <class T>
inline T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32) {
  return ::roformer::simt::shfl_generic(mask, value, src_lane, width, false);
}
// Atomics: no other thread runs between the read and the write.
template <class T>
inline T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <class T>
inline T atomicMin(T* address, T value) {
  const T old = *address;
  if (value < old) *address = value;
  return old;
}
template <class T>
inline T atomicMax(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}
template <class T>
inline T atomicCAS(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}
// Arithmetic with a named rounding (round to nearest even): single operations,
// never contracted into fused multiply-adds (the emulated kernel files are
// built with -ffp-contract=off).
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
// PRMT: byte n of the result is byte (s >> 4 n) & 7 of the eight bytes of y:x.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t bytes = uint64_t(y) << 32 | x;
  unsigned result = 0u;
  for (int n = 0; n < 4; ++n)
    result |= unsigned(bytes >> (8 * ((s >> (4 * n)) & 7u)) & 0xFFu) << (8 * n);
  return result;
}
// cp.async of kBytes (16 or 4): the source is read here, in the kernel's
// translation unit (see cp_async_16).
template <int kBytes>
inline void simt_cp_async(uint32_t address, const void* source) {
  static_assert(kBytes == 16 || kBytes == 4, "cp.async copies 16 or 4 bytes here");
  unsigned char bytes[kBytes];
  std::memcpy(bytes, source, kBytes);
  if constexpr (kBytes == 16)
    ::roformer::simt::cp_async_16(address, source, bytes);
  else
    ::roformer::simt::cp_async_4(address, source, bytes);
}
inline size_t __cvta_generic_to_shared(const void* p) {
  return ::roformer::simt::shared_address(p);
}
