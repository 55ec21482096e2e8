/* CUDA events for benchmark timing: nb_event_record on a CUDA device lands
 * here. Events are created with timing enabled and recorded in the stream
 * nabla's kernels run on, so the elapsed time covers exactly the kernels
 * queued between two records (plus any gap where the device waited for the
 * host to launch them). */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_timing.h"
#include "core/core.h"

/* The stream nabla's CUDA kernels are queued on.
 * TODO(cuda backend): the backend does not expose its stream yet; until it
 * does, events go to the legacy default stream (0). That is correct while
 * the backend's stream is the legacy default stream or a blocking stream
 * (created without cudaStreamNonBlocking), since the legacy stream then
 * waits for, and is waited on by, every blocking stream of the device. */
static cudaStream_t cuda_timing_stream(int device) {
  (void)device;
  return (cudaStream_t)0;
}

static nb_status cuda_timing_check(cudaError_t err, const char *what, int device) {
  if (err == cudaSuccess) return NB_OK;
  return nb_error_set(NB_ERR_BACKEND, "%s on cuda:%d: %s (%s)", what, device,
                      cudaGetErrorString(err), cudaGetErrorName(err));
}

extern "C" nb_status nb_cuda_event_record(int device, void **out) {
  *out = NULL;
  int prev = 0;
  nb_status st = cuda_timing_check(cudaGetDevice(&prev), "nb_event_record: cudaGetDevice", device);
  if (st) return st;
  st = cuda_timing_check(cudaSetDevice(device), "nb_event_record: cudaSetDevice", device);
  if (st) return st;
  cudaEvent_t ev = NULL;
  st = cuda_timing_check(cudaEventCreate(&ev), "nb_event_record: cudaEventCreate", device);
  if (!st) {
    st = cuda_timing_check(cudaEventRecord(ev, cuda_timing_stream(device)),
                           "nb_event_record: cudaEventRecord", device);
    if (st) cudaEventDestroy(ev);
    else *out = (void *)ev;
  }
  cudaSetDevice(prev);
  return st;
}

extern "C" nb_status nb_cuda_event_elapsed_ms(void *start, void *end, double *ms) {
  *ms = -1.0;
  cudaEvent_t a = (cudaEvent_t)start, b = (cudaEvent_t)end;
  nb_status st = cuda_timing_check(cudaEventSynchronize(b),
                                   "nb_event_elapsed_ms: cudaEventSynchronize", -1);
  if (st) return st;
  float f = 0.0f;
  st = cuda_timing_check(cudaEventElapsedTime(&f, a, b), "nb_event_elapsed_ms: "
                         "cudaEventElapsedTime", -1);
  if (!st) *ms = (double)f;
  return st;
}

extern "C" void nb_cuda_event_destroy(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

extern "C" nb_status nb_cuda_device_name(int device, char *buf, size_t n) {
  if (n) buf[0] = '\0';
  cudaDeviceProp prop;
  nb_status st = cuda_timing_check(cudaGetDeviceProperties(&prop, device),
                                   "nb_cuda_device_name: cudaGetDeviceProperties", device);
  if (st) return st;
  if (n) {
    size_t i = 0;
    for (; i + 1 < n && prop.name[i]; i++) buf[i] = prop.name[i];
    buf[i] = '\0';
  }
  return NB_OK;
}
