#include "core/cuda/cudnn_library.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace roformer::cuda {

namespace {

CudnnLibrary open_cudnn() {
  std::string tried;
  void* handle = nullptr;
  for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle) break;
    const char* why = dlerror();
    tried += detail::concat(tried.empty() ? "" : "; ", why ? why : name);
  }
  if (!handle)
    throw Error(detail::concat("cuDNN could not be loaded (", tried,
                               "); model.attention_kernel: cudnn_sdpa needs cuDNN 9 where the "
                               "loader finds it (LD_LIBRARY_PATH)"));
  // Kept open for the life of the process: plans and handles made from it
  // live in static caches.
  CudnnLibrary lib;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (!fn) throw Error(detail::concat("cuDNN: the loaded library has no ", name));
  };
#define RF_RESOLVE(name) resolve(lib.name, #name)
  RF_RESOLVE(cudnnGetVersion);
  RF_RESOLVE(cudnnGetErrorString);
  RF_RESOLVE(cudnnGetLastErrorString);
  RF_RESOLVE(cudnnCreate);
  RF_RESOLVE(cudnnDestroy);
  RF_RESOLVE(cudnnSetStream);
  RF_RESOLVE(cudnnBackendCreateDescriptor);
  RF_RESOLVE(cudnnBackendDestroyDescriptor);
  RF_RESOLVE(cudnnBackendSetAttribute);
  RF_RESOLVE(cudnnBackendGetAttribute);
  RF_RESOLVE(cudnnBackendFinalize);
  RF_RESOLVE(cudnnBackendExecute);
#undef RF_RESOLVE
  return lib;
}

}  // namespace

const CudnnLibrary& cudnn_library() {
  static const CudnnLibrary lib = open_cudnn();  // a throw leaves it to the next call
  return lib;
}

}  // namespace roformer::cuda
