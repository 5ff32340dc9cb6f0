// The CUDA device layer: device discovery, an allocator for cuda:N storage,
// and CUDA errors turned into exceptions that name the call.
#pragma once

#include <string>

namespace roformer::cuda {

// Number of visible GPUs (0 when there is no driver or no device).
int device_count();

// Installs the CUDA allocator; returns false (with `why`) without a GPU.
bool init_backend(std::string* why = nullptr);

}  // namespace roformer::cuda
