// Every CUDA runtime and cuBLAS(Lt) call goes through RF_CUDA_CHECK, which
// turns a failure into a roformer::Error naming the call, where it was made
// and the library's own message. (cuDNN and NCCL: core/cuda/check_cudnn.h and
// check_nccl.h, so that code not using them needs neither library.)
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime.h>

namespace roformer::cuda {

[[noreturn]] void throw_call_error(const char* library, const char* call, const char* message,
                                   const char* file, int line);

inline void check_status(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw_call_error("CUDA", call, cudaGetErrorString(status), file, line);
}

inline void check_status(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_call_error("cuBLAS", call, cublasLtGetStatusString(status), file, line);
}

// After a kernel launch: launch errors (bad configuration, no kernel image)
// show at once; errors inside the kernel show at the next synchronising call.
inline void check_launch(const char* kernel, const char* file, int line) {
  check_status(cudaGetLastError(), kernel, file, line);
}

}  // namespace roformer::cuda

#define RF_CUDA_CHECK(call) ::roformer::cuda::check_status((call), #call, __FILE__, __LINE__)
#define RF_CUDA_CHECK_LAUNCH(kernel) ::roformer::cuda::check_launch(#kernel, __FILE__, __LINE__)
