// The emulator's fiber switch (see fiber_context.h).
#include "tests/simt/fiber_context.h"

#include <pthread.h>

#include <cstdint>

#include "core/error.h"

// AddressSanitizer's fiber interface, when the binary has it (null otherwise).
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size)
    __attribute__((weak));
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                     size_t* size_old) __attribute__((weak));
}

#if defined(__x86_64__)
// roformer_simt_swap_stacks(save, load): pushes the System V callee-saved
// registers and MXCSR and the x87 control word, stores the stack pointer in
// *save, loads `load` and pops the same from there. A new fiber's stack holds
// that frame with its entry function as the return address (start_on).
extern "C" void roformer_simt_swap_stacks(void** save, void* load);
asm(R"(
  .text
  .p2align 4
  .globl roformer_simt_swap_stacks
  .type roformer_simt_swap_stacks, @function
roformer_simt_swap_stacks:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size roformer_simt_swap_stacks, .-roformer_simt_swap_stacks
)");
#endif

namespace roformer::simt {

void FiberContext::start_on(char* stack, size_t bytes, void (*entry)()) {
  stack_ = stack;
  stack_bytes_ = bytes;
  fake_stack_ = nullptr;
#if defined(__x86_64__)
  // From the 16-byte aligned top down: no return address for `entry` (it
  // never returns), `entry` for the swap's ret (so it starts as if called,
  // its stack pointer 8 below a 16-byte boundary), zeroed rbp, rbx and
  // r12-r15, and this thread's floating-point control words.
  auto* slot =
      reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15));
  *--slot = 0;
  *--slot = reinterpret_cast<uint64_t>(entry);
  for (int i = 0; i < 6; ++i) *--slot = 0;
  uint32_t mxcsr = 0;
  uint16_t x87 = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87));
  *--slot = uint64_t(mxcsr) | uint64_t(x87) << 32;
  sp_ = slot;
#else
  RF_CHECK(getcontext(&context_) == 0, "simt: getcontext failed");
  context_.uc_stack.ss_sp = stack;
  context_.uc_stack.ss_size = bytes;
  context_.uc_link = nullptr;
  makecontext(&context_, entry, 0);
#endif
}

void FiberContext::on_this_thread() {
  // The OS thread's stack bounds, read once a thread (AddressSanitizer must
  // be told them when a fiber switches back).
  thread_local const void* bottom = nullptr;
  thread_local size_t size = 0;
  if (bottom == nullptr) {
    pthread_attr_t attr;
    RF_CHECK(pthread_getattr_np(pthread_self(), &attr) == 0, "simt: pthread_getattr_np failed");
    void* addr = nullptr;
    const int got = pthread_attr_getstack(&attr, &addr, &size);
    pthread_attr_destroy(&attr);
    RF_CHECK(got == 0, "simt: pthread_attr_getstack failed");
    bottom = addr;
  }
  stack_ = bottom;
  stack_bytes_ = size;
  fake_stack_ = nullptr;
}

void FiberContext::jump(FiberContext& from, FiberContext& to, bool from_ends) {
  if (&__sanitizer_start_switch_fiber != nullptr)
    __sanitizer_start_switch_fiber(from_ends ? nullptr : &from.fake_stack_, to.stack_,
                                   to.stack_bytes_);
#if defined(__x86_64__)
  roformer_simt_swap_stacks(&from.sp_, to.sp_);
#else
  swapcontext(&from.context_, &to.context_);
#endif
  if (&__sanitizer_finish_switch_fiber != nullptr)
    __sanitizer_finish_switch_fiber(from.fake_stack_, nullptr, nullptr);
}

void FiberContext::entered() {
  if (&__sanitizer_finish_switch_fiber != nullptr)
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
}

}  // namespace roformer::simt
