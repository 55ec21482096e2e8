/* CUDA device facts for benchmark reports. Internal (prefix nb_cuda_); C
 * linkage. The events behind nb_event_* are the runtime's own
 * (nb_cuda_event_record in cuda_api.h), recorded on the device's stream. */
#ifndef NB_CUDA_TIMING_H
#define NB_CUDA_TIMING_H

#include <stddef.h>

#include "nabla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device's marketing name ("NVIDIA H100 80GB HBM3") into buf. */
nb_status nb_cuda_device_name(int device, char *buf, size_t n);

/* The device's SM clock now (MHz) and its energy counter (mJ since the
 * driver loaded), read through NVML: the driver's libnvidia-ml, opened at
 * the first call (no build dependency), the device found by its PCI bus id.
 * -1 in each field NVML cannot give (no driver library, a counter the GPU
 * lacks). A GPU at its power limit runs heavy kernels below its boost
 * clock; `nabla bench` reports the clock and power of each case's timed
 * runs, so that two timings taken in different states are seen to be. */
typedef struct {
  int sm_mhz;
  long long energy_mj;
} nb_cuda_gpu_state;
void nb_cuda_gpu_state_read(int device, nb_cuda_gpu_state *s);

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_TIMING_H */
