// The emulator's fibers: a saved stack and registers to switch to, on one OS
// thread (simt.cpp runs each emulated GPU thread as one).
//
// On x86-64 a switch is a few instructions (the callee-saved registers and
// the floating-point control words pushed on the running stack, the stack
// pointer swapped): glibc's swapcontext makes a sigprocmask system call per
// switch, and AddressSanitizer's interceptor of it clears the target stack's
// shadow, which made switching most of an emulated kernel's time. Elsewhere
// it falls back to ucontext. Under AddressSanitizer every switch is announced
// through its fiber interface, so it knows which stack runs (a throw on a
// fiber unpoisons that fiber's stack, not a guess).
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace roformer::simt {

class FiberContext {
 public:
  // A context that, when first switched to, calls `entry` on the `bytes` of
  // `stack` (lowest address first). `entry` must call entered() first and
  // never return: a fiber ends by a switch with `from_ends`.
  void start_on(char* stack, size_t bytes, void (*entry)());

  // The calling OS thread's own context (the launch's), to switch back to.
  void on_this_thread();

  // Saves the running state in `from` and resumes `to`; returns when
  // something switches back to `from`. `from_ends`: `from` is never resumed.
  static void jump(FiberContext& from, FiberContext& to, bool from_ends = false);

  // The first call of a fiber's entry function (completes the switch into it).
  static void entered();

 private:
#if defined(__x86_64__)
  void* sp_ = nullptr;
#else
  ucontext_t context_{};
#endif
  // AddressSanitizer's bookkeeping: the stack's bounds and its fake stack.
  const void* stack_ = nullptr;
  size_t stack_bytes_ = 0;
  void* fake_stack_ = nullptr;
};

}  // namespace roformer::simt
