#include "train/signals.h"

#include <csignal>

namespace roformer {

namespace {
volatile std::sig_atomic_t g_signal = 0;
using Handler = void (*)(int);
Handler g_previous_int = SIG_DFL;
Handler g_previous_term = SIG_DFL;

extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
}
}  // namespace

StopRequest::StopRequest() {
  g_signal = 0;
  g_previous_int = std::signal(SIGINT, on_stop_signal);
  g_previous_term = std::signal(SIGTERM, on_stop_signal);
}

StopRequest::~StopRequest() {
  std::signal(SIGINT, g_previous_int);
  std::signal(SIGTERM, g_previous_term);
}

bool StopRequest::requested() const {
  return g_signal != 0;
}
int StopRequest::signal_number() const {
  return int(g_signal);
}

}  // namespace roformer
