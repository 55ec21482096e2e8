/* CUDA events for nb_event_* (src/core/timing.c) and the device's name for
 * benchmark reports. Internal (prefix nb_cuda_); C linkage. */
#ifndef NB_CUDA_TIMING_H
#define NB_CUDA_TIMING_H

#include <stddef.h>

#include "nabla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a cudaEvent_t on the device and records it in nabla's stream;
 * *out receives it (owned by the caller, freed with nb_cuda_event_destroy). */
nb_status nb_cuda_event_record(int device, void **out);
/* Waits for end, then writes the milliseconds between the two events. */
nb_status nb_cuda_event_elapsed_ms(void *start, void *end, double *ms);
void nb_cuda_event_destroy(void *event);
/* The device's marketing name ("NVIDIA H100 80GB HBM3") into buf. */
nb_status nb_cuda_device_name(int device, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_TIMING_H */
