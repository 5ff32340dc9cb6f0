#include "core/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace roformer {

namespace {
std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("ROFORMER_PROFILE");
    return env && *env && std::string(env) != "0";
  }()};
  return flag;
}

std::mutex g_mutex;
std::function<void()> g_sync;  // set_profile_sync
std::map<std::string, ProfileEntry>& table() {
  static std::map<std::string, ProfileEntry> entries;
  return entries;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool profiling_enabled() {
  return enabled_flag().load(std::memory_order_relaxed);
}

void set_profiling(bool on) {
  enabled_flag().store(on);
}

void set_profile_sync(std::function<void()> sync) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sync = std::move(sync);
}

namespace {
std::function<void()> current_sync() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_sync;
}
}  // namespace

ProfileScope::ProfileScope(const char* name, bool backward) : name_(name), backward_(backward) {
  if (!profiling_enabled()) return;
  if (const auto sync = current_sync()) sync();
  start_ns_ = now_ns();
}

ProfileScope::~ProfileScope() {
  if (start_ns_ < 0) return;
  if (const auto sync = current_sync()) {
    try {
      sync();
    } catch (...) {  // a destructor: the error shows at the next host read
    }
  }
  const int64_t elapsed = now_ns() - start_ns_;
  std::lock_guard<std::mutex> lock(g_mutex);
  ProfileEntry& e = table()[name_];
  e.name = name_;
  if (backward_) {
    ++e.backward_calls;
    e.backward_ns += elapsed;
  } else {
    ++e.forward_calls;
    e.forward_ns += elapsed;
  }
}

std::vector<ProfileEntry> profile_entries() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<ProfileEntry> out;
  for (const auto& kv : table()) out.push_back(kv.second);
  std::sort(out.begin(), out.end(), [](const ProfileEntry& a, const ProfileEntry& b) {
    return a.forward_ns + a.backward_ns > b.forward_ns + b.backward_ns;
  });
  return out;
}

std::string profile_report() {
  const auto entries = profile_entries();
  int64_t total = 0;
  for (const auto& e : entries) total += e.forward_ns + e.backward_ns;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %8s %10s %8s %10s %7s\n", "op", "fwd n", "fwd ms",
                "bwd n", "bwd ms", "share");
  out += line;
  for (const auto& e : entries) {
    std::snprintf(line, sizeof line, "%-22s %8lld %10.1f %8lld %10.1f %6.1f%%\n", e.name.c_str(),
                  (long long)e.forward_calls, double(e.forward_ns) * 1e-6,
                  (long long)e.backward_calls, double(e.backward_ns) * 1e-6,
                  total ? 100.0 * double(e.forward_ns + e.backward_ns) / double(total) : 0.0);
    out += line;
  }
  return out;
}

void profile_reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  table().clear();
}

}  // namespace roformer
