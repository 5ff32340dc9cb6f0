#include "train/distributed/launch.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

namespace roformer::distributed {

namespace {

struct Names {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;  // may be null
};

// In order of preference: mpirun under Slurm sets both, and MPI's own view wins.
constexpr Names kLaunchers[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

int parse(const char* name, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < 0 || v > 1'000'000)
    throw InputError(detail::concat("environment variable ", name, "='", value,
                                    "' is not a rank or process count"));
  return int(v);
}

}  // namespace

LaunchInfo detect_launch(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) -> const char* {
    return getenv ? getenv(name) : std::getenv(name);
  };
  auto forced = [&] {
    const char* force = get("ROFORMER_FORCE_COMMUNICATOR");
    return force && std::string_view(force) == "1";
  };
  for (const Names& n : kLaunchers) {
    const char* rank = get(n.rank);
    const char* size = get(n.size);
    if (!rank || !size) continue;
    LaunchInfo info;
    info.launcher = n.launcher;
    info.rank = parse(n.rank, rank);
    info.world_size = parse(n.size, size);
    const char* local = n.local_rank ? get(n.local_rank) : nullptr;
    info.local_rank = local ? parse(n.local_rank, local) : 0;
    if (info.world_size < 1 || info.rank >= info.world_size)
      throw InputError(detail::concat(n.rank, "=", info.rank, " is not a rank of ", n.size, "=",
                                      info.world_size));
    info.forced = forced();
    return info;
  }
  LaunchInfo none;
  none.forced = forced();
  if (none.forced) none.launcher = "ROFORMER_FORCE_COMMUNICATOR";
  return none;
}

}  // namespace roformer::distributed
