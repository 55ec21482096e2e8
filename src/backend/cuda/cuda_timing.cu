/* CUDA device facts for benchmark reports (`nabla bench` names the GPU it
 * measured). The timing events themselves are recorded by the runtime
 * (cuda_runtime.cu) on the device's one stream, which is non-blocking: an
 * event on any other stream would not order against nabla's kernels. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_timing.h"
#include "core/core.h"

extern "C" nb_status nb_cuda_device_name(int device, char *buf, size_t n) {
  if (n) buf[0] = '\0';
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess)
    return nb_error_set(NB_ERR_BACKEND, "nb_cuda_device_name: cudaGetDeviceProperties on "
                        "cuda:%d: %s", device, cudaGetErrorString(err));
  if (n) {
    size_t i = 0;
    for (; i + 1 < n && prop.name[i]; i++) buf[i] = prop.name[i];
    buf[i] = '\0';
  }
  return NB_OK;
}
