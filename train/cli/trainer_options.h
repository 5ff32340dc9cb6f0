// What `pretrain` and `finetune` hand the Trainer from the command line: the
// stop request, --restart, the command that resumes the run (with every
// override, quoted for a shell), and the kill points of the fault-injection
// tests. The library reads no environment variable; the CLI translates
// ROFORMER_TEST_KILL_AT_STEP=N (SIGKILL before global step N) and
// ROFORMER_TEST_KILL_DURING_CHECKPOINT=N (SIGKILL inside the step-N
// checkpoint write, before its rename) into the options' callbacks, for
// tests/train/resume_test.sh; ROFORMER_TEST_CPU_BF16=0|1 into the CPU
// bf16 probe's override (a CPU without or with bf16 dot products, for
// tests/train/precision_test.sh); and, for tests/distributed/, the failures
// of one rank: ROFORMER_TEST_FAIL_AT_STEP=N (throws before global step N)
// and ROFORMER_TEST_HANG_AT_STEP=N (SIGSTOP: a rank that neither dies nor
// answers), and ROFORMER_TEST_NAN_GRADIENT_AT_STEP=N (the last gradient
// element of this rank's summed gradient made NaN in global step N + 1: a
// non-finite step that only this rank sees).
#pragma once

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/flat_parameters.h"
#include "core/precision.h"
#include "train/cli/command.h"
#include "train/trainer.h"

namespace roformer::cli {

// `arg` quoted for a POSIX shell when it holds anything but safe characters.
inline std::string shell_quote(const std::string& arg) {
  if (!arg.empty() &&
      arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                            "_-./=:,+@%") == std::string::npos)
    return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline TrainerOptions trainer_options(const Invocation& inv, const std::string& command,
                                      const StopRequest* stop, bool restart) {
  TrainerOptions o;
  o.stop = stop;
  o.restart = restart;
  o.resume_command = "roformer " + command + " --config " + shell_quote(inv.config_path.string());
  for (const std::string& kv : inv.overrides) o.resume_command += " " + shell_quote(kv);
  if (const char* bf16 = std::getenv("ROFORMER_TEST_CPU_BF16"))
    set_cpu_bf16_probe_override(std::string(bf16) != "0");
  const char* kill_at = std::getenv("ROFORMER_TEST_KILL_AT_STEP");
  const char* fail_at = std::getenv("ROFORMER_TEST_FAIL_AT_STEP");
  const char* hang_at = std::getenv("ROFORMER_TEST_HANG_AT_STEP");
  if (kill_at || fail_at || hang_at) {
    const long long kill = kill_at ? std::atoll(kill_at) : -1;
    const long long fail = fail_at ? std::atoll(fail_at) : -1;
    const long long hang = hang_at ? std::atoll(hang_at) : -1;
    o.before_step = [kill, fail, hang](int64_t global_step) {
      if (global_step == kill) std::raise(SIGKILL);
      if (global_step == hang) std::raise(SIGSTOP);
      if (global_step == fail)
        throw Error(detail::concat("injected failure before global step ", global_step,
                                   " (ROFORMER_TEST_FAIL_AT_STEP)"));
    };
  }
  if (const char* at = std::getenv("ROFORMER_TEST_NAN_GRADIENT_AT_STEP")) {
    const long long step = std::atoll(at);
    o.after_gradients = [step](int64_t global_step, const FlatParameters& flat) {
      if (global_step != step || flat.size() == 0) return;
      const size_t last = flat.size() - 1;
      flat.grad().narrow(0, flat.offset(last) + flat.numel(last) - 1, 1).fill_(std::nan(""));
    };
  }
  if (const char* at = std::getenv("ROFORMER_TEST_KILL_DURING_CHECKPOINT")) {
    const long long step = std::atoll(at);
    o.before_checkpoint_commit = [step](int64_t global_step) {
      if (global_step == step) std::raise(SIGKILL);
    };
  }
  return o;
}

}  // namespace roformer::cli
