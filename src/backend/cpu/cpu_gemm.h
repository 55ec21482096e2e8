/* Internal interface of the CPU GEMM (cpu_gemm.c), for benchmarks and
 * tests that want to know which code path nb_cpu_matmul runs. */
#ifndef NB_CPU_GEMM_H
#define NB_CPU_GEMM_H

#include "backend/cpu/cpu_kernels.h"

/* "avx512", "avx2" or "scalar": the vector ISA the micro-kernels were
 * compiled for. */
const char *nb_cpu_gemm_isa(void);

/* Register tile (MR rows x NR columns) of the packed path for f32 or f64. */
void nb_cpu_gemm_tile(nb_dtype dt, int *mr, int *nr);

#endif
