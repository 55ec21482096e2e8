/* The CUDA backend's internal entry points that the rest of the library may
 * call (C-compatible). Only meaningful when built with NABLA_HAVE_CUDA; the
 * public CUDA functions (nb_cuda_available, nb_cuda_memory_stats,
 * nb_cuda_empty_cache) are declared in nabla.h. */
#ifndef NB_CUDA_API_H
#define NB_CUDA_API_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device timing for nb_event_*: an event recorded on the device's stream.
 * Returns NULL + error on failure. */
void *nb_cuda_event_record(int device);
/* Milliseconds between two events (waits for end); < 0 + error on failure. */
double nb_cuda_event_elapsed_ms(void *start, void *end);
void nb_cuda_event_free(void *e);

/* Index kernels report an out-of-range index through a device flag. By
 * default their host wrappers read it at once (one stream sync each), so the
 * failing call itself returns NB_ERR_INDEX. nb_cuda_set_index_check(0)
 * (or NABLA_CUDA_INDEX_CHECK=0 in the environment) defers the read to the
 * next download or synchronize, which then returns the error. */
void nb_cuda_set_index_check(int eager);

/* GEMM backend for f16/bf16 matmul: 1 = nabla's own kernels where they
 * apply (the sm_90a kernel on Hopper with TMA-compatible layouts, the
 * portable sm_80 kernel on other devices), cuBLASLt otherwise; 2 = the
 * portable sm_80 kernel on every device >= 8.0; 0 = always cuBLASLt.
 * Overrides NABLA_GEMM=own|sm80|cublaslt (read at first use). */
void nb_cuda_set_gemm_backend(int own);

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_API_H */
