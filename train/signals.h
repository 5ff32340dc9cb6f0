// SIGINT/SIGTERM handling for training: the first signal asks the trainer to
// finish its current step, write a checkpoint and return; it never kills a
// step halfway (that is what SIGKILL is for, and resume copes with that too).
#pragma once

namespace roformer {

class StopRequest {
 public:
  // Installs handlers for SIGINT and SIGTERM for the object's lifetime and
  // restores the previous ones afterwards.
  StopRequest();
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  bool requested() const;
  int signal_number() const;  // the signal received, 0 if none
};

}  // namespace roformer
