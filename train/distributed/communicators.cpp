#include "train/distributed/communicators.h"

#include "core/error.h"
#ifdef ROFORMER_HAVE_MPI
#include "train/distributed/mpi_communicator.h"
#endif

namespace roformer::distributed {

bool built_with_mpi() {
#ifdef ROFORMER_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s) {
  if (!launch.distributed()) return nullptr;
#ifdef ROFORMER_HAVE_MPI
  auto comm = std::make_unique<MpiCommunicator>(timeout_s);
  if (comm->rank() != launch.rank || comm->world_size() != launch.world_size)
    throw InputError(detail::concat("the launcher (", launch.launcher, ") says rank ", launch.rank,
                                    " of ", launch.world_size, " but MPI says rank ", comm->rank(),
                                    " of ", comm->world_size(),
                                    " (was this process started by srun without MPI support? "
                                    "try mpirun, or srun --mpi=pmix)"));
  return comm;
#else
  (void)timeout_s;
  throw InputError(detail::concat("started by ", launch.launcher, " as rank ", launch.rank, " of ",
                                  launch.world_size,
                                  ", but this build has no MPI (configure with OpenMPI installed "
                                  "and ROFORMER_WITH_MPI=ON, or run one process)"));
#endif
}

void abort_all_ranks(Communicator* comm, int exit_code) {
#ifdef ROFORMER_HAVE_MPI
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(comm)) mpi->abort(exit_code);
#else
  (void)comm;
  (void)exit_code;
#endif
}

}  // namespace roformer::distributed
