// RF_CUDA_CHECK for cuDNN calls (cuDNN is opened on first use: cudnn_library.h).
#pragma once

#include <cudnn.h>

#include "core/cuda/check.h"
#include "core/cuda/cudnn_library.h"

namespace roformer::cuda {

inline void check_status(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw_call_error("cuDNN", call, cudnn_library().cudnnGetErrorString(status), file, line);
}

}  // namespace roformer::cuda
