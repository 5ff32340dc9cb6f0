// Opt-in per-op timing. Off unless ROFORMER_PROFILE=1 is in the environment
// (or set_profiling(true)); when off a scope costs one branch. Forward scopes
// are placed by callers around op calls; autograd times each node's backward
// under the node's op name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace roformer {

bool profiling_enabled();
void set_profiling(bool on);

// While set, every scope calls `sync` (a device synchronisation) at its start
// and end, so a scope's time is the wall time of its work with the device
// drained before and after (its device time plus the host's launch work,
// launches serialised): how the GPU benchmark splits a step among ops.
// Nested scopes count in each. An empty function turns it off.
void set_profile_sync(std::function<void()> sync);

// Adds the wall time of its lifetime to `name` (forward or backward column).
class ProfileScope {
 public:
  explicit ProfileScope(const char* name, bool backward = false);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  bool backward_;
  int64_t start_ns_ = -1;
};

struct ProfileEntry {
  std::string name;
  int64_t forward_calls = 0, forward_ns = 0;
  int64_t backward_calls = 0, backward_ns = 0;
};

// Entries sorted by total time, largest first.
std::vector<ProfileEntry> profile_entries();
// A table of the entries with milliseconds and shares of the total.
std::string profile_report();
void profile_reset();

}  // namespace roformer

#define RF_PROFILE_CAT2(a, b) a##b
#define RF_PROFILE_CAT(a, b) RF_PROFILE_CAT2(a, b)
// Times the rest of the enclosing scope as forward work of `name`.
#define RF_PROFILE(name) ::roformer::ProfileScope RF_PROFILE_CAT(rf_profile_, __LINE__)(name)
