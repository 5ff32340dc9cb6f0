// What `pretrain` and `finetune` do when a launcher (mpirun, srun) started
// them as one of several ranks: give a GPU rank its own GPU, make the MPI
// (or, on GPUs, NCCL) communicator, tag the log lines
// with the rank (ranks above 0 log warnings and errors only; rank 0 owns the
// console and metrics.jsonl), and when this rank fails, report it under its
// rank and end every rank (the others may be waiting in a collective).
// A process started without a launcher runs exactly as before.
#pragma once

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <memory>

#include "core/error.h"
#include "train/config.h"
#include "train/distributed/communicators.h"
#include "train/distributed/launch.h"

namespace roformer::cli {

class LaunchedRun {
 public:
  explicit LaunchedRun(const Config& config)
      : launch_(distributed::detect_launch()),
        config_(on_rank_device(config, launch_)),
        comm_(distributed::make_communicator(launch_, config.distributed.timeout_s,
                                             config_.run.device)) {
    if (!comm_) return;
    spdlog::default_logger()->set_pattern(
        fmt::format("[%H:%M:%S.%e] [rank {}/{}] [%^%l%$] %v", comm_->rank(), comm_->world_size()));
    if (comm_->rank() != 0 && spdlog::default_logger()->level() < spdlog::level::warn)
      spdlog::default_logger()->set_level(spdlog::level::warn);
    spdlog::info("data parallel: {} ranks started by {}", comm_->world_size(), launch_.launcher);
  }

  Communicator* communicator() const { return comm_.get(); }
  // The config this rank runs: run.device is the rank's GPU (cuda:<local rank>).
  const Config& config() const { return config_; }

  // Runs `body`; on an exception in a run of several ranks, logs it under this
  // rank's number and ends every rank with the CLI's exit code for it.
  template <class F>
  int run(F&& body) {
    try {
      return body();
    } catch (const std::exception& e) {
      if (!comm_) throw;
      const int code = dynamic_cast<const InputError*>(&e) ? 2 : 1;
      spdlog::error("rank {} of {} failed: {}; stopping every rank", comm_->rank(),
                    comm_->world_size(), e.what());
      spdlog::default_logger()->flush();
      comm_->abort(code);
      throw;
    }
  }

 private:
  static Config on_rank_device(Config config, const distributed::LaunchInfo& launch) {
    config.run.device = distributed::rank_device(config.run.device, launch);
    return config;
  }

  distributed::LaunchInfo launch_;
  Config config_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace roformer::cli
