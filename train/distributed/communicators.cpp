#include "train/distributed/communicators.h"

#include <spdlog/spdlog.h>

#include "core/device_backend.h"
#include "core/error.h"
#ifdef ROFORMER_HAVE_MPI
#include "train/distributed/mpi_communicator.h"
#endif
#ifdef ROFORMER_HAVE_NCCL
#include "train/distributed/nccl_communicator.h"
#endif

namespace roformer::distributed {

bool built_with_mpi() {
#ifdef ROFORMER_HAVE_MPI
  return true;
#else
  return false;
#endif
}

Device rank_device(Device configured, const LaunchInfo& launch) {
  if (!configured.is_cuda() || !launch.distributed()) return configured;
  const int gpus = device_count(DeviceType::cuda);
  // No GPU visible: keep it, so run.device's check names the problem.
  if (gpus <= 0) return configured;
  return Device::cuda(launch.local_rank % gpus);
}

std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s,
                                                Device device) {
  if (!launch.needs_communicator()) return nullptr;
#ifdef ROFORMER_HAVE_MPI
  auto comm = std::make_unique<MpiCommunicator>(timeout_s);
  if (comm->rank() != launch.rank || comm->world_size() != launch.world_size)
    throw InputError(detail::concat("the launcher (", launch.launcher, ") says rank ", launch.rank,
                                    " of ", launch.world_size, " but MPI says rank ", comm->rank(),
                                    " of ", comm->world_size(),
                                    " (was this process started by srun without MPI support? "
                                    "try mpirun, or srun --mpi=pmix)"));
  if (!device.is_cuda()) return comm;
  // GPU ranks: NCCL needs a GPU per rank; every rank must agree on the path.
  const bool own_gpu = launch.local_rank < device_count(DeviceType::cuda);
  const bool all_own = !comm->any(!own_gpu);
#ifdef ROFORMER_HAVE_NCCL
  if (all_own) {
    spdlog::info("GPU ranks: NCCL on {} (one GPU per rank)", device.str());
    return std::make_unique<NcclCommunicator>(std::move(comm), device.index, timeout_s);
  }
  spdlog::warn(
      "GPU ranks share GPUs ({} on this machine, local rank {}): NCCL needs one GPU "
      "per rank, so gradients are summed by MPI through host memory (slower)",
      device_count(DeviceType::cuda), launch.local_rank);
#else
  spdlog::warn(
      "GPU ranks: this build has no NCCL{}; gradients are summed by MPI through host "
      "memory (slower)",
      all_own ? "" : " and ranks share GPUs");
#endif
  return comm;
#else
  (void)timeout_s;
  (void)device;
  throw InputError(detail::concat("started by ", launch.launcher, " as rank ", launch.rank, " of ",
                                  launch.world_size,
                                  ", but this build has no MPI (configure with OpenMPI installed "
                                  "and ROFORMER_WITH_MPI=ON, or run one process)"));
#endif
}

}  // namespace roformer::distributed
