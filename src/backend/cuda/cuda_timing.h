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

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_TIMING_H */
