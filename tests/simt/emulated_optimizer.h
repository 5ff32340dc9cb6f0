// The optimizer's device passes (core/cuda/optimizer.h) as
// optimizer_emulated.cpp compiles them: roformer::simt_cuda::adamw_step,
// grad_norm_stats and their argument types, on host memory. Include it
// before anything that includes core/cuda/optimizer.h itself.
#pragma once

#include <cuda_runtime.h>

#define cuda simt_cuda
#include "core/cuda/optimizer.h"
#undef cuda
