// The SIMT emulator's scheduler and warp collectives (see simt.h).
#include "tests/simt/simt.h"

#include <sys/mman.h>

#include <algorithm>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/simt/fiber_context.h"

// The linker's bounds of the shared window (every `__shared__` variable and
// the dynamic shared memory).
extern "C" {
extern char __start_simt_shared[] __attribute__((weak));
extern char __stop_simt_shared[] __attribute__((weak));
// AddressSanitizer's, when the binary has it: a stack given back with frames
// still poisoned (fibers abandoned after a fault) must not poison later maps.
void __asan_unpoison_memory_region(void const volatile* addr, size_t size) __attribute__((weak));
}

namespace roformer::simt {
namespace {

__attribute__((section("simt_shared"), aligned(128))) unsigned char g_dynamic[kMaxDynamicShared];

unsigned char* window_begin() {
  return reinterpret_cast<unsigned char*>(__start_simt_shared);
}
size_t window_size() {
  return size_t(__stop_simt_shared - __start_simt_shared);
}

constexpr int kWarp = 32;
constexpr int kWarpGroup = 4 * kWarp;
constexpr size_t kStackBytes = 64 * 1024;  // unpoisoned for every block under AddressSanitizer
constexpr size_t kGuardBytes = 4096;       // an inaccessible page below each stack

// Fiber stacks, each above a guard page (kept from launch to launch: stacks_for).
class Stacks {
 public:
  explicit Stacks(size_t count) : count_(count) {
    bytes_ = count * (kStackBytes + kGuardBytes);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    RF_CHECK(p != MAP_FAILED, "simt: cannot map ", bytes_, " bytes of fiber stacks");
    base_ = static_cast<char*>(p);
    for (size_t i = 0; i < count; ++i)
      mprotect(base_ + i * (kStackBytes + kGuardBytes), kGuardBytes, PROT_NONE);
  }
  ~Stacks() {
    if (&__asan_unpoison_memory_region != nullptr) __asan_unpoison_memory_region(base_, bytes_);
    munmap(base_, bytes_);
  }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  char* stack(size_t i) const { return base_ + i * (kStackBytes + kGuardBytes) + kGuardBytes; }
  size_t count() const { return count_; }

 private:
  size_t count_ = 0, bytes_ = 0;
  char* base_ = nullptr;
};

struct Barrier {
  int arrived = 0;
  uint64_t generation = 0;
};

enum class Op : uint32_t { shfl_xor, shfl, ballot, ldmatrix, ldmatrix_trans, mma };

const char* op_name(Op op) {
  switch (op) {
    case Op::shfl_xor:
      return "__shfl_xor_sync";
    case Op::shfl:
      return "__shfl_sync";
    case Op::ballot:
      return "__ballot_sync";
    case Op::ldmatrix:
      return "ldmatrix.x4";
    case Op::ldmatrix_trans:
      return "ldmatrix.x4.trans";
    case Op::mma:
      return "mma.m16n8k16";
  }
  return "?";
}

struct Warp {
  Barrier barrier;
  Op op[kWarp] = {};
  uint32_t in[kWarp][10] = {};
  uint32_t out[kWarp][4] = {};
};

// A cp.async copy on its way: 16 bytes for a shared address (`landed`: it
// was written when issued, and a wait only retires it).
struct PendingCopy {
  uint32_t address;
  unsigned char bytes[16];
  bool landed = false;
  int size = 16;  // 16 (cp.async.cg) or 4 (cp.async.ca)
};

// A warpgroup product (wgmma) in flight: each thread's part of D, and the
// shared b16 values its operands were read as (checked unchanged once every
// thread has retired it).
struct WgmmaOp {
  float a[64][16], b[16][64];  // A and B as read
  float result[kWarpGroup][32];
  std::vector<std::pair<uint32_t, uint16_t>> reads;
  int retired = 0;
};
struct PendingWgmma {
  std::shared_ptr<WgmmaOp> op;
  float* d;  // the thread's accumulator registers
  int thread;
};

// What each thread of a warpgroup brings to a wgmma.
struct WgmmaArrival {
  bool from_registers = false;  // A: four registers (rs) or a descriptor (ss)
  uint64_t desc_a = 0, desc_b = 0;
  uint32_t a[4] = {};
  bool scale_d = false, trans_a = false, trans_b = false;
  float* d = nullptr;
};
struct WarpGroup {
  Barrier barrier;
  WgmmaArrival in[kWarpGroup];
  std::shared_ptr<WgmmaOp> out;
};

struct Fiber {
  FiberContext context;
  std::vector<PendingWgmma> wgmma_open;                   // since the last wgmma commit
  std::deque<std::vector<PendingWgmma>> wgmma_committed;  // oldest first
  std::vector<PendingCopy> open_group;                    // since the last commit
  std::deque<std::vector<PendingCopy>> committed;         // oldest first
  ThreadState state;
  bool done = false;
  const uint64_t* wait_generation = nullptr;  // runnable once *wait_generation != wait_value
  uint64_t wait_value = 0;
  const char* waiting_at = "";
};

// The block being run.
struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<WarpGroup> warpgroups;
  Barrier barrier;
  int running = 0;
  bool reverse = false;
  // The schedule of this block (run_grid cycles through four): lockstep
  // switches warps at every collective; warp-serial runs a warp until all its
  // threads wait at a barrier (or exit) before another runs (its warpgroup's
  // other warps first). cp.async copies
  // land at the wait that covers them (late) or when issued (early): a GPU
  // may land one anywhere between, so a read before the wait meets stale
  // bytes in one and a write racing the copy meets new bytes in the other.
  bool warp_serial = false;
  bool early_copies = false;
  size_t dynamic_bytes = 0;
  FiberContext main;  // the launch's
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
  std::string fault;
};

Block* g_block = nullptr;
std::map<const void*, size_t> g_opt_in;  // kernel -> its dynamic shared memory limit
std::mutex g_launch_mutex;               // one emulated launch at a time (shared statics)

bool runnable(const Fiber& f) {
  return !f.done && (f.wait_generation == nullptr || *f.wait_generation != f.wait_value);
}

// The next runnable fiber after the running one in the block's order (the
// running one itself last), or -1; warp-serial blocks look in the running
// fiber's warp first, then in its warpgroup (so a warpgroup that a missing
// barrier lets run ahead through its wgmma collectives does).
int next_runnable(const Block& b) {
  const int n = int(b.fibers.size()), step = b.reverse ? n - 1 : 1;
  const int warp = b.running / kWarp, group = b.running / kWarpGroup;
  for (int pass = b.warp_serial ? 0 : 2; pass < 3; ++pass)
    for (int k = 1; k <= n; ++k) {
      const int j = (b.running + k * step) % n;
      const bool near = pass == 2 || (pass == 0 ? j / kWarp == warp : j / kWarpGroup == group);
      if (near && runnable(b.fibers[size_t(j)])) return j;
    }
  return -1;
}

std::string describe_deadlock(const Block& b) {
  std::map<std::string, int> where;
  for (const Fiber& f : b.fibers) {
    const int warp = f.state.linear / kWarp;
    if (f.done)
      ++where["exited"];
    else if (f.wait_generation == &b.barrier.generation)
      ++where["waiting at __syncthreads"];
    else
      ++where["warp " + std::to_string(warp) + " waiting at " + f.waiting_at];
  }
  std::string s = "simt: deadlock in block (" + std::to_string(b.fibers[0].state.block_idx.x) +
                  ", " + std::to_string(b.fibers[0].state.block_idx.y) + ", " +
                  std::to_string(b.fibers[0].state.block_idx.z) + "): threads ";
  for (const auto& [what, count] : where) s += std::to_string(count) + " " + what + "; ";
  return s + "(a barrier or warp collective that not every thread reaches)";
}

// Leaves the running fiber (which waits or has exited) for the next runnable
// one, or for the launch when none is left.
void switch_away(bool exited) {
  Block& b = *g_block;
  const int from = b.running;
  const int to = b.error ? -1 : next_runnable(b);
  if (to == from) {
    b.fibers[size_t(from)].wait_generation = nullptr;
    return;
  }
  if (to < 0) {
    bool all_done = true;
    for (const Fiber& f : b.fibers) all_done = all_done && f.done;
    if (!all_done && !b.error) b.fault = describe_deadlock(b);
    FiberContext::jump(b.fibers[size_t(from)].context, b.main, true);  // never resumed
    return;
  }
  b.running = to;
  current_thread = &b.fibers[size_t(to)].state;
  FiberContext::jump(b.fibers[size_t(from)].context, b.fibers[size_t(to)].context, exited);
  b.fibers[size_t(from)].wait_generation = nullptr;  // resumed: what it waited for happened
}

// A fiber's entry: the kernel's body as one thread; it ends by switching away.
void fiber_main() {
  FiberContext::entered();
  Block& b = *g_block;
  try {
    (*b.body)();
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  Fiber& self = b.fibers[size_t(b.running)];
  size_t pending = self.open_group.size();
  for (const auto& group : self.committed) pending += group.size();
  if (pending > 0 && b.fault.empty())
    b.fault = "simt: thread " + std::to_string(self.state.linear) + " exited with " +
              std::to_string(pending) + " cp.async copies no wait_group covered";
  if ((!self.wgmma_open.empty() || !self.wgmma_committed.empty()) && b.fault.empty())
    b.fault = "simt: thread " + std::to_string(self.state.linear) +
              " exited with wgmma products no wgmma.wait_group retired";
  self.done = true;
  switch_away(true);
  __builtin_unreachable();  // nothing switches back to an exited fiber
}

// The running thread arrives at `bar` of `count` threads; the last to arrive
// runs `on_last` before releasing the others.
template <class OnLast>
void arrive_and_wait(Barrier& bar, int count, const char* what, OnLast&& on_last) {
  Block& b = *g_block;
  if (++bar.arrived == count) {
    on_last();
    bar.arrived = 0;
    ++bar.generation;
    return;
  }
  Fiber& f = b.fibers[size_t(b.running)];
  f.wait_generation = &bar.generation;
  f.wait_value = bar.generation;
  f.waiting_at = what;
  switch_away(false);
}

// --- the collectives, from the PTX ISA ------------------------------------------------

float bf16_bits_to_float(uint32_t bits16) {
  const uint32_t w = bits16 << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

// What is wrong with `size` bytes at a shared address, or "" when they lie
// inside what the launch gave (the shared window, and no further into the
// dynamic shared memory than the launch's size).
std::string shared_range_fault(const Block& b, uint32_t address, int size) {
  if (size_t(address) + size_t(size) > window_size())
    return detail::concat(" shared address ", address, " outside shared memory");
  const size_t dyn = size_t(g_dynamic - window_begin());
  if (address >= dyn && address < dyn + kMaxDynamicShared &&
      address + size_t(size) > dyn + b.dynamic_bytes)
    return detail::concat(" reaches dynamic shared byte ", address + size_t(size) - dyn, " of ",
                          b.dynamic_bytes, " launched");
  return {};
}

// `size` bytes (4 or 16, aligned to their size) at a shared address, inside
// what the launch gave (`what`: the instruction, for the error).
unsigned char* shared_bytes(const Block& b, uint32_t address, int size, const char* what) {
  RF_CHECK(address % uint32_t(size) == 0, "simt: ", what, " shared address ", address, " is not ",
           size, "-byte aligned");
  const std::string fault = shared_range_fault(b, address, size);
  RF_CHECK(fault.empty(), "simt: ", what, fault);
  return window_begin() + address;
}
unsigned char* shared_16(const Block& b, uint32_t address, const char* what) {
  return shared_bytes(b, address, 16, what);
}

// One 16-byte row of an 8x8 b16 matrix at a lane's shared address.
const unsigned char* matrix_row(const Block& b, uint32_t address) {
  return shared_16(b, address, "ldmatrix row");
}

uint32_t b16_at(const unsigned char* row, int i) {
  uint16_t v;
  std::memcpy(&v, row + 2 * i, 2);
  return v;
}

// ldmatrix .m8n8 .x4 .b16: lanes 8m..8m+7 give the row addresses of matrix m;
// lane l receives in register m the elements (l / 4, 2 (l % 4)) and
// (l / 4, 2 (l % 4) + 1) of matrix m (lower column in the lower half); with
// .trans the matrix is read column-major, i.e. those elements of its transpose.
void ldmatrix_all(const Block& b, Warp& w, bool trans) {
  const unsigned char* rows[kWarp];
  for (int i = 0; i < kWarp; ++i) rows[i] = matrix_row(b, w.in[i][0]);
  for (int l = 0; l < kWarp; ++l)
    for (int m = 0; m < 4; ++m) {
      const int r = l / 4, c = 2 * (l % 4);
      uint32_t lo, hi;
      if (!trans) {
        lo = b16_at(rows[8 * m + r], c);
        hi = b16_at(rows[8 * m + r], c + 1);
      } else {
        lo = b16_at(rows[8 * m + c], r);
        hi = b16_at(rows[8 * m + c + 1], r);
      }
      w.out[l][m] = lo | (hi << 16);
    }
}

// mma .m16n8k16 .row.col f32.bf16.bf16.f32: with groupID g = lane >> 2 and
// threadID_in_group t = lane % 4,
//  A element a_i (register i / 2, half i % 2): row g for i in {0, 1, 4, 5}
//    else g + 8; column 2t + (i & 1), + 8 for i >= 4;
//  B element b_i: row 2t + (i & 1), + 8 for i >= 2; column g;
//  C and D element c_i: row g, + 8 for i >= 2; column 2t + (i & 1).
void mma_all(Warp& w) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < kWarp; ++l) {
    const int g = l >> 2, t = l % 4;
    for (int i = 0; i < 8; ++i) {
      const uint32_t reg = w.in[l][i / 2];
      const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = bf16_bits_to_float(i % 2 == 0 ? reg & 0xffffu : reg >> 16);
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t reg = w.in[l][4 + i / 2];
      const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
      B[row][g] = bf16_bits_to_float(i % 2 == 0 ? reg & 0xffffu : reg >> 16);
    }
    for (int i = 0; i < 4; ++i) {
      float c;
      std::memcpy(&c, &w.in[l][6 + i], 4);
      C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)] = c;
    }
  }
  for (int l = 0; l < kWarp; ++l) {
    const int g = l >> 2, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
      double acc = C[row][col];
      for (int k = 0; k < 16; ++k) acc += double(A[row][k]) * double(B[k][col]);
      const float d = float(acc);
      std::memcpy(&w.out[l][i], &d, 4);
    }
  }
}

void shuffle_all(Warp& w, bool xor_mode) {
  for (int l = 0; l < kWarp; ++l) {
    const int arg = int(w.in[l][1]), width = int(w.in[l][2]);
    RF_CHECK(width > 0 && width <= kWarp && (width & (width - 1)) == 0, "simt: shuffle width ",
             width, " is not a power of two <= 32");
    int src;
    if (xor_mode) {
      src = l ^ arg;
      if (src / width != l / width || src >= kWarp) src = l;
    } else {
      src = (l / width) * width + (arg % width + width) % width;
    }
    w.out[l][0] = w.in[src][0];
  }
}

// Every lane gets the word whose bit l is lane l's predicate.
void ballot_all(Warp& w) {
  uint32_t bits = 0;
  for (int l = 0; l < kWarp; ++l)
    if (w.in[l][0] != 0) bits |= 1u << l;
  for (int l = 0; l < kWarp; ++l) w.out[l][0] = bits;
}

void compute(const Block& b, Warp& w) {
  for (int l = 1; l < kWarp; ++l)
    RF_CHECK(w.op[l] == w.op[0], "simt: warp divergence: lane 0 at ", op_name(w.op[0]), ", lane ",
             l, " at ", op_name(w.op[l]));
  switch (w.op[0]) {
    case Op::shfl_xor:
      return shuffle_all(w, true);
    case Op::shfl:
      return shuffle_all(w, false);
    case Op::ballot:
      return ballot_all(w);
    case Op::ldmatrix:
      return ldmatrix_all(b, w, false);
    case Op::ldmatrix_trans:
      return ldmatrix_all(b, w, true);
    case Op::mma:
      return mma_all(w);
  }
}

// The running lane's part of a warp collective: its inputs in, its results out.
void collective(Op op, const uint32_t* in, int n_in, uint32_t* out, int n_out) {
  RF_CHECK(g_block != nullptr, "simt: ", op_name(op), " outside an emulated launch");
  Block& b = *g_block;
  const Fiber& f = b.fibers[size_t(b.running)];
  const int lane = f.state.linear % kWarp;
  Warp& w = b.warps[size_t(f.state.linear / kWarp)];
  w.op[lane] = op;
  std::memcpy(w.in[lane], in, size_t(n_in) * 4);
  arrive_and_wait(w.barrier, kWarp, op_name(op), [&] { compute(b, w); });
  std::memcpy(out, w.out[lane], size_t(n_out) * 4);
}

void make_fiber(Fiber& f, char* stack) {
  // Each block's fibers start on the stacks of the last block's, whose frames
  // never returned (a fiber ends by switching away): their redzones would
  // still be poisoned under AddressSanitizer, and a new frame over them
  // reported as a wild access.
  if (&__asan_unpoison_memory_region != nullptr) __asan_unpoison_memory_region(stack, kStackBytes);
  f.context.start_on(stack, kStackBytes, fiber_main);
}

void run_block(Block& b) {
  b.running = b.reverse ? int(b.fibers.size()) - 1 : 0;
  current_thread = &b.fibers[size_t(b.running)].state;
  FiberContext::jump(b.main, b.fibers[size_t(b.running)].context);
}

// The fiber stacks for a launch of `threads`: kept from launch to launch
// (under g_launch_mutex), so their pages are mapped and touched once.
const Stacks& stacks_for(size_t threads) {
  static std::unique_ptr<Stacks> stacks;
  if (!stacks || stacks->count() < threads) stacks = std::make_unique<Stacks>(threads);
  return *stacks;
}

}  // namespace

void allow_dynamic_shared(const void* kernel, size_t bytes) {
  RF_CHECK(bytes <= kMaxDynamicShared, "simt: ", bytes, " bytes of dynamic shared memory over the ",
           kMaxDynamicShared, " a block can have");
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_opt_in[kernel] = bytes;
}

unsigned char* dynamic_shared() {
  return g_dynamic;
}

uint32_t shared_address(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  RF_CHECK(c >= window_begin() && c < window_begin() + window_size(),
           "simt: __cvta_generic_to_shared of an address outside shared memory");
  return uint32_t(c - window_begin());
}

void syncthreads() {
  RF_CHECK(g_block != nullptr, "simt: __syncthreads outside an emulated launch");
  Block& b = *g_block;
  arrive_and_wait(b.barrier, int(b.fibers.size()), "__syncthreads", [] {});
}

uint32_t ballot(unsigned mask, bool predicate) {
  RF_CHECK(mask == 0xffffffffu, "simt: only full-warp ballots are emulated");
  const uint32_t in = predicate ? 1u : 0u;
  uint32_t out;
  collective(Op::ballot, &in, 1, &out, 1);
  return out;
}

uint32_t shfl_word(unsigned mask, uint32_t value, int arg, int width, bool xor_mode) {
  RF_CHECK(mask == 0xffffffffu, "simt: only full-warp shuffles are emulated");
  const uint32_t in[3] = {value, uint32_t(arg), uint32_t(width)};
  uint32_t out;
  collective(xor_mode ? Op::shfl_xor : Op::shfl, in, 3, &out, 1);
  return out;
}

void ldmatrix_x4(uint32_t (&r)[4], uint32_t address, bool trans) {
  collective(trans ? Op::ldmatrix_trans : Op::ldmatrix, &address, 1, r, 4);
}

namespace {
void cp_async_bytes(uint32_t address, const void* source, const unsigned char* bytes, int size) {
  RF_CHECK(g_block != nullptr, "simt: cp.async outside an emulated launch");
  RF_CHECK(reinterpret_cast<uintptr_t>(source) % uintptr_t(size) == 0, "simt: cp.async source ",
           source, " is not ", size, "-byte aligned");
  Block& b = *g_block;
  unsigned char* destination = shared_bytes(b, address, size, "cp.async destination");
  PendingCopy copy{address, {}, b.early_copies, size};
  std::memcpy(copy.bytes, bytes, size_t(size));
  if (copy.landed) std::memcpy(destination, bytes, size_t(size));
  b.fibers[size_t(b.running)].open_group.push_back(copy);
}
}  // namespace

void cp_async_16(uint32_t address, const void* source, const unsigned char (&bytes)[16]) {
  cp_async_bytes(address, source, bytes, 16);
}

void cp_async_4(uint32_t address, const void* source, const unsigned char (&bytes)[4]) {
  cp_async_bytes(address, source, bytes, 4);
}

void cp_async_commit() {
  RF_CHECK(g_block != nullptr, "simt: cp.async.commit_group outside an emulated launch");
  Fiber& f = g_block->fibers[size_t(g_block->running)];
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}

void cp_async_wait(int n) {
  RF_CHECK(g_block != nullptr, "simt: cp.async.wait_group outside an emulated launch");
  Block& b = *g_block;
  Fiber& f = b.fibers[size_t(b.running)];
  while (f.committed.size() > size_t(std::max(n, 0))) {
    for (const PendingCopy& c : f.committed.front())
      if (!c.landed)
        std::memcpy(shared_bytes(b, c.address, c.size, "cp.async destination"), c.bytes,
                    size_t(c.size));
    f.committed.pop_front();
  }
}

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                       const float (&c)[4]) {
  uint32_t in[10];
  std::memcpy(in, a, 16);
  std::memcpy(in + 4, b, 8);
  std::memcpy(in + 6, c, 16);
  uint32_t out[4];
  collective(Op::mma, in, 10, out, 4);
  std::memcpy(d, out, 16);
}

// --- wgmma (sm_90a) ---------------------------------------------------------------------

namespace {

// A fault the wgmma emulation finds on a fiber's stack becomes the launch's
// error (the first one wins) without a C++ throw there: the block then ends
// at its next switch point (switch_away leaves for the launch once there is
// an error) and run_grid rethrows it. (An exception thrown on a fiber stack
// this deep made AddressSanitizer's no-return handling report its own
// sigaltstack probe as an overflow.)
void record_fault(Block& b, const std::string& message) {
  if (!b.error) b.error = std::make_exception_ptr(Error(message));
}

// A wgmma operand's descriptor, decoded (PTX ISA, "Matrix Descriptor Format").
struct MatrixDescriptor {
  uint32_t start, leading, stride;  // bytes
};

// The decoded descriptor, or false (a fault recorded) for a base offset or
// swizzle mode the emulator does not model.
bool decode_descriptor(Block& b, uint64_t desc, const char* which, MatrixDescriptor& out) {
  const uint32_t base_offset = uint32_t(desc >> 49) & 7u, swizzle = uint32_t(desc >> 62);
  if (base_offset != 0) {
    record_fault(b,
                 detail::concat("simt: wgmma ", which, " descriptor with base offset ", base_offset,
                                " (only 0 is emulated: swizzle atoms on 1024-byte boundaries)"));
    return false;
  }
  if (swizzle != 1) {
    record_fault(b, detail::concat("simt: wgmma ", which, " descriptor with swizzle mode ", swizzle,
                                   " (only 1, the 128-byte swizzle, is emulated)"));
    return false;
  }
  out = {uint32_t(desc & 0x3FFFu) << 4, uint32_t((desc >> 16) & 0x3FFFu) << 4,
         uint32_t((desc >> 32) & 0x3FFFu) << 4};
  return true;
}

// The 128-byte swizzle on a shared address: its 16-byte chunk within each
// 128-byte row XORed with the row's index within its 1024-byte atom.
uint32_t swizzle_128(uint32_t address) {
  return address ^ (((address >> 7) & 7u) << 4);
}

// Reads the b16 element at an operand's unswizzled address (and notes it);
// NaN and a fault recorded outside the launch's shared memory.
float read_operand(Block& b, uint32_t linear, WgmmaOp& op) {
  const uint32_t address = swizzle_128(linear);
  const std::string fault = shared_range_fault(b, address, 2);
  if (!fault.empty()) {
    record_fault(b, "simt: wgmma operand" + fault);
    return NAN;
  }
  uint16_t v;
  std::memcpy(&v, window_begin() + address, 2);
  op.reads.emplace_back(address, v);
  return bf16_bits_to_float(v);
}

// Element (row r, k) of a K-major operand (A: r = m; B: r = n) in the
// 128-byte-swizzle canonical layout ((8, m), (T, 2)) : ((8T, SBO), (1, T)):
// rows of 128 bytes in 8-row atoms, the atoms SBO apart.
uint32_t k_major_address(const MatrixDescriptor& d, int r, int k) {
  return d.start + uint32_t(r % 8) * 128u + uint32_t(r / 8) * d.stride + 2u * uint32_t(k);
}

// Element (k, n) of an N-major B (trans-b; or (k, m) of an M-major A,
// trans-a) in ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO)): 64
// consecutive n in a 128-byte row per k, 8-k atoms SBO apart, 64-wide n
// blocks LBO apart.
uint32_t n_major_address(const MatrixDescriptor& d, int k, int n) {
  return d.start + 2u * uint32_t(n % 64) + uint32_t(n / 64) * d.leading + uint32_t(k % 8) * 128u +
         uint32_t(k / 8) * d.stride;
}

// The newest in-flight product of fiber f for the accumulator d, or null.
const PendingWgmma* newest_for(const Fiber& f, const float* d) {
  for (auto it = f.wgmma_open.rbegin(); it != f.wgmma_open.rend(); ++it)
    if (it->d == d) return &*it;
  for (auto g = f.wgmma_committed.rbegin(); g != f.wgmma_committed.rend(); ++g)
    for (auto it = g->rbegin(); it != g->rend(); ++it)
      if (it->d == d) return &*it;
  return nullptr;
}

// m64n64k16, f32 += bf16 x bf16: thread T of the warpgroup, in warp w = T / 32
// with g = lane / 4 and t = lane % 4, holds
//  D register i: row 16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 t + (i & 1)
//  (mma.m16n8k16's C layout per warp, repeated over the eight 8-wide column tiles);
//  A register j (from registers): elements v = 2 j (low half) and 2 j + 1,
//  row 16 w + g + 8 ((v >> 1) & 1), k 2 t + (v & 1) + 8 (v >> 2).
void wgmma_all(Block& b, WarpGroup& w, int group) {
  const WgmmaArrival& first = w.in[0];
  auto op = std::make_shared<WgmmaOp>();
  w.out = op;
  // A fault: the results are NaN (the block ends at its next switch point).
  auto faulted = [&] {
    for (auto& row : op->result)
      for (float& x : row) x = NAN;
  };
  for (int i = 1; i < kWarpGroup; ++i) {
    const WgmmaArrival& x = w.in[i];
    if (!(x.from_registers == first.from_registers && x.desc_b == first.desc_b &&
          (x.from_registers || x.desc_a == first.desc_a) && x.scale_d == first.scale_d &&
          x.trans_a == first.trans_a && x.trans_b == first.trans_b)) {
      record_fault(b, detail::concat("simt: wgmma operands differ across the warpgroup (thread ", i,
                                     " against thread 0): descriptors and flags must be the same"));
      return faulted();
    }
  }
  // The operands, off the fiber's stack (64 KB; AddressSanitizer's frames grow).
  auto& A = op->a;
  auto& B = op->b;
  if (first.from_registers) {
    for (int T = 0; T < kWarpGroup; ++T) {
      const int warp = T / kWarp, lane = T % kWarp, g = lane >> 2, t = lane & 3;
      for (int v = 0; v < 8; ++v) {
        const uint32_t reg = w.in[T].a[v / 2];
        const int row = 16 * warp + g + 8 * ((v >> 1) & 1), k = 2 * t + (v & 1) + 8 * (v >> 2);
        A[row][k] = bf16_bits_to_float(v % 2 == 0 ? reg & 0xffffu : reg >> 16);
      }
    }
  } else {
    MatrixDescriptor da;
    if (!decode_descriptor(b, first.desc_a, "A", da)) return faulted();
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k)
        A[m][k] = read_operand(
            b, first.trans_a ? n_major_address(da, k, m) : k_major_address(da, m, k), *op);
  }
  MatrixDescriptor db;
  if (!decode_descriptor(b, first.desc_b, "B", db)) return faulted();
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 64; ++n)
      B[k][n] = read_operand(
          b, first.trans_b ? n_major_address(db, k, n) : k_major_address(db, n, k), *op);
  for (int T = 0; T < kWarpGroup; ++T) {
    const int warp = T / kWarp, lane = T % kWarp, g = lane >> 2, t = lane & 3;
    const WgmmaArrival& x = w.in[T];
    const Fiber& f = b.fibers[size_t(group * kWarpGroup + T)];
    const PendingWgmma* before = first.scale_d ? newest_for(f, x.d) : nullptr;
    const float* c = before ? before->op->result[before->thread] : x.d;
    for (int i = 0; i < 32; ++i) {
      const int row = 16 * warp + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
      double acc = first.scale_d ? double(c[i]) : 0.0;
      for (int k = 0; k < 16; ++k) acc += double(A[row][k]) * double(B[k][col]);
      op->result[T][i] = float(acc);
    }
  }
}

void wgmma(const WgmmaArrival& arrival) {
  RF_CHECK(g_block != nullptr, "simt: wgmma outside an emulated launch");
  Block& b = *g_block;
  Fiber& f = b.fibers[size_t(b.running)];
  const int group = f.state.linear / kWarpGroup, thread = f.state.linear % kWarpGroup;
  if (size_t(group) >= b.warpgroups.size()) {
    record_fault(
        b, detail::concat("simt: wgmma by thread ", f.state.linear,
                          " outside a whole warpgroup (a block of ", b.fibers.size(), " threads)"));
    return;
  }
  WarpGroup& w = b.warpgroups[size_t(group)];
  w.in[thread] = arrival;
  arrive_and_wait(w.barrier, kWarpGroup, "wgmma.mma_async", [&] { wgmma_all(b, w, group); });
  b.fibers[size_t(b.running)].wgmma_open.push_back({w.out, arrival.d, thread});
}

}  // namespace

void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool scale_d,
                        bool trans_a, bool trans_b) {
  WgmmaArrival x;
  x.desc_a = desc_a;
  x.desc_b = desc_b;
  x.scale_d = scale_d;
  x.trans_a = trans_a;
  x.trans_b = trans_b;
  x.d = d;
  wgmma(x);
}

void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool scale_d,
                        bool trans_b) {
  WgmmaArrival x;
  x.from_registers = true;
  std::memcpy(x.a, a, sizeof(x.a));
  x.desc_b = desc_b;
  x.scale_d = scale_d;
  x.trans_b = trans_b;
  x.d = d;
  wgmma(x);
}

void wgmma_commit() {
  RF_CHECK(g_block != nullptr, "simt: wgmma.commit_group outside an emulated launch");
  Fiber& f = g_block->fibers[size_t(g_block->running)];
  f.wgmma_committed.push_back(std::move(f.wgmma_open));
  f.wgmma_open.clear();
}

void wgmma_wait(int n) {
  RF_CHECK(g_block != nullptr, "simt: wgmma.wait_group outside an emulated launch");
  Block& b = *g_block;
  Fiber& f = b.fibers[size_t(b.running)];
  while (f.wgmma_committed.size() > size_t(std::max(n, 0))) {
    for (const PendingWgmma& p : f.wgmma_committed.front()) {
      std::memcpy(p.d, p.op->result[p.thread], sizeof(p.op->result[0]));
      if (++p.op->retired < kWarpGroup) continue;
      for (const auto& [address, value] : p.op->reads) {  // in bounds: they were read
        uint16_t now;
        std::memcpy(&now, window_begin() + address, 2);
        if (now != value) {
          record_fault(b, detail::concat("simt: shared address ", address,
                                         " was written while a wgmma that read it was in flight "
                                         "(before every thread of the warpgroup retired it by "
                                         "wgmma.wait_group)"));
          break;
        }
      }
    }
    f.wgmma_committed.pop_front();
  }
}

void run_grid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  const size_t threads = size_t(block.x) * block.y * block.z;
  RF_CHECK(threads > 0 && threads <= 1024 && threads % kWarp == 0, "simt: block of ", threads,
           " threads (the emulator runs 32 to 1024 threads, whole warps)");
  RF_CHECK(grid.x > 0 && grid.y > 0 && grid.z > 0, "simt: empty grid");
  const auto opt_in = g_opt_in.find(kernel);
  const size_t limit = opt_in == g_opt_in.end() ? kDefaultDynamicShared : opt_in->second;
  RF_CHECK(dynamic_shared_bytes <= limit, "simt: launch with ", dynamic_shared_bytes,
           " bytes of dynamic shared memory, over the kernel's limit of ", limit,
           " (cudaFuncSetAttribute raises it)");
  // Every kernel's static shared memory counts: an upper bound of this one's.
  const size_t static_bytes = window_size() - kMaxDynamicShared;
  RF_CHECK(static_bytes + dynamic_shared_bytes <= kMaxDynamicShared, "simt: ", static_bytes,
           " bytes of static and ", dynamic_shared_bytes, " of dynamic shared memory");

  const Stacks& stacks = stacks_for(threads);
  Block b;
  b.fibers.resize(threads);
  b.warps.resize(threads / kWarp);
  b.warpgroups.resize(threads / kWarpGroup);
  b.body = &body;
  b.dynamic_bytes = dynamic_shared_bytes;
  b.main.on_this_thread();
  g_block = &b;
  struct Reset {
    ~Reset() {
      g_block = nullptr;
      current_thread = nullptr;
    }
  } reset;
  uint64_t index = 0;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x, ++index) {
        std::memset(window_begin(), 0xff, window_size());
        b.barrier.arrived = 0;
        for (Warp& w : b.warps) w.barrier.arrived = 0;
        for (WarpGroup& w : b.warpgroups) {
          w.barrier.arrived = 0;
          w.out.reset();
        }
        for (size_t i = 0; i < threads; ++i) {
          Fiber& f = b.fibers[i];
          f.done = false;
          f.wait_generation = nullptr;
          f.open_group.clear();
          f.committed.clear();
          f.wgmma_open.clear();
          f.wgmma_committed.clear();
          f.state.linear = int(i);
          f.state.thread_idx = uint3{unsigned(i % block.x), unsigned(i / block.x % block.y),
                                     unsigned(i / (size_t(block.x) * block.y))};
          f.state.block_idx = uint3{x, y, z};
          f.state.block_dim = block;
          f.state.grid_dim = grid;
          make_fiber(f, stacks.stack(i));
        }
        // Blocks 0, 1, 2, 3, 4...: lockstep with late copies, forward and
        // reversed; warp-serial with early copies, forward and reversed; ...
        b.reverse = index % 2 == 1;
        b.warp_serial = b.early_copies = index % 4 >= 2;
        run_block(b);
        if (b.error) std::rethrow_exception(b.error);
        RF_CHECK(b.fault.empty(), b.fault);
        for (size_t i = dynamic_shared_bytes; i < kMaxDynamicShared; ++i)
          RF_CHECK(g_dynamic[i] == 0xff, "simt: block (", x, ", ", y, ", ", z,
                   ") wrote dynamic shared byte ", i, " past the ", dynamic_shared_bytes,
                   " launched");
      }
}

cudaError_t memset_bytes(void* p, int value, size_t nbytes) {
  if (nbytes > 0) std::memset(p, value, nbytes);
  return cudaSuccess;
}

cudaError_t copy_bytes(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return cudaSuccess;
  const auto* d = static_cast<const unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  RF_CHECK(d + nbytes <= s || s + nbytes <= d, "simt: cudaMemcpy between overlapping ranges (",
           nbytes, " bytes, ", s - d, " apart): CUDA promises no memmove");
  std::memcpy(dst, src, nbytes);
  return cudaSuccess;
}

cudaError_t device_attribute(int* value, cudaDeviceAttr attribute, int device) {
  RF_CHECK(device == 0, "simt: the emulated device is device 0, asked for ", device);
  switch (attribute) {
    case cudaDevAttrMultiProcessorCount:
      *value = kEmulatedMultiprocessors;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:  // an H100's: the wgmma kernels run
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    default:
      RF_CHECK(false, "simt: the emulated device has no attribute ", int(attribute),
               " (only the SM count and the compute capability)");
      return cudaErrorInvalidValue;
  }
}

}  // namespace roformer::simt
