// cuDNN, opened on first use rather than linked: only model.attention_kernel:
// cudnn_sdpa needs it, so a machine whose cuDNN is missing, or where the
// loader does not look, still runs every other path. (GPU machines bring
// their own CUDA libraries: ../shared/tools/gpu-pack leaves cuDNN to them.)
#pragma once

#include <cudnn.h>

namespace roformer::cuda {

// The functions this project calls, under cuDNN's names.
struct CudnnLibrary {
  decltype(&::cudnnGetVersion) cudnnGetVersion = nullptr;
  decltype(&::cudnnGetErrorString) cudnnGetErrorString = nullptr;
  decltype(&::cudnnGetLastErrorString) cudnnGetLastErrorString = nullptr;
  decltype(&::cudnnCreate) cudnnCreate = nullptr;
  decltype(&::cudnnDestroy) cudnnDestroy = nullptr;
  decltype(&::cudnnSetStream) cudnnSetStream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) cudnnBackendCreateDescriptor = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) cudnnBackendDestroyDescriptor = nullptr;
  decltype(&::cudnnBackendSetAttribute) cudnnBackendSetAttribute = nullptr;
  decltype(&::cudnnBackendGetAttribute) cudnnBackendGetAttribute = nullptr;
  decltype(&::cudnnBackendFinalize) cudnnBackendFinalize = nullptr;
  decltype(&::cudnnBackendExecute) cudnnBackendExecute = nullptr;
};

// libcudnn.so.9 (else libcudnn.so), opened once. Throws an Error naming the
// files tried and the loader's message when neither opens, or the function
// a library lacks.
const CudnnLibrary& cudnn_library();

}  // namespace roformer::cuda
