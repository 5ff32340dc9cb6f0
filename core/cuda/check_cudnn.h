// RF_CUDA_CHECK for cuDNN calls (include where cuDNN is used; links libcudnn).
#pragma once

#include <cudnn.h>

#include "core/cuda/check.h"

namespace roformer::cuda {

inline void check_status(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw_call_error("cuDNN", call, cudnnGetErrorString(status), file, line);
}

}  // namespace roformer::cuda
