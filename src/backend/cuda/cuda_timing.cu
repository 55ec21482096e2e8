/* CUDA device facts for benchmark reports (`nabla bench` names the GPU it
 * measured). The timing events themselves are recorded by the runtime
 * (cuda_runtime.cu) on the device's one stream, which is non-blocking: an
 * event on any other stream would not order against nabla's kernels. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>

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

/* NVML's entry points, from the driver's library (nvml.h's signatures; the
 * device handle is opaque). Opened once, never closed. */
namespace {
struct nb_nvml {
  int ok;
  int (*by_pci)(const char *pci, void **dev);
  int (*clock)(void *dev, int type, unsigned *mhz); /* type 1: NVML_CLOCK_SM */
  int (*energy)(void *dev, unsigned long long *mj);
};
nb_nvml g_nvml;
pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;

void nb_nvml_open(void) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
  g_nvml.by_pci = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  g_nvml.clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
  g_nvml.energy = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
  g_nvml.ok = init && g_nvml.by_pci && g_nvml.clock && g_nvml.energy && init() == 0;
}
} /* namespace */

extern "C" void nb_cuda_gpu_state_read(int device, nb_cuda_gpu_state *s) {
  s->sm_mhz = -1;
  s->energy_mj = -1;
  pthread_once(&g_nvml_once, nb_nvml_open);
  char pci[32];
  void *dev = NULL;
  if (!g_nvml.ok) return;
  if (cudaDeviceGetPCIBusId(pci, (int)sizeof pci, device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (g_nvml.by_pci(pci, &dev) != 0) return;
  unsigned mhz;
  unsigned long long mj;
  if (g_nvml.clock(dev, 1, &mhz) == 0) s->sm_mhz = (int)mhz;
  if (g_nvml.energy(dev, &mj) == 0) s->energy_mj = (long long)mj;
}
