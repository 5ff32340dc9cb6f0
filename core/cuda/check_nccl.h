// RF_CUDA_CHECK for NCCL calls (include where NCCL is used; links libnccl).
#pragma once

#include <nccl.h>

#include "core/cuda/check.h"

namespace roformer::cuda {

inline void check_status(ncclResult_t status, const char* call, const char* file, int line) {
  if (status != ncclSuccess) throw_call_error("NCCL", call, ncclGetErrorString(status), file, line);
}

}  // namespace roformer::cuda
