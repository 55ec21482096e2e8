/* nabla's own Hopper GEMM (gemm_sm90.cu), called by cuda_gemm.cu when the
 * own backend is selected. C++ (CUDA) only: it takes the backend context. */
#ifndef NB_GEMM_SM90_H
#define NB_GEMM_SM90_H

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm.h"

/* out = a @ b for f16/bf16 on a compute-capability 9.0 device. Returns 1 when
 * the own kernel took the product (its launch status in *st), 0 when the
 * call does not fit it (dtype, device, a layout or alignment TMA cannot
 * take, batches that do not fold into rows): the caller then uses cuBLASLt. */
int nb_sm90_matmul(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                   const nb_kview *b, nb_status *st);

/* out = epilogue(a @ b) (see nb_gemm_epilogue) with 2-D out, a, b: f16/bf16
 * operands, out of their dtype or f32; bias, c, aux of out's dtype (the
 * caller has checked shapes and dtypes). Returns 1 when the own kernel took
 * it (status in *st), 0 when it does not fit (as nb_sm90_matmul, or an aux
 * or c whose columns are not contiguous). */
int nb_sm90_gemm_ex(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                    const nb_kview *b, const nb_gemm_epilogue *ep, nb_status *st);

/* The name of schedule candidate i for autotuning (backend/autotune.h),
 * NULL past the last; candidate 0 is the heuristic used when tuning is off. */
const char *nb_sm90_candidate(int i);

/* nb_cuda_gemm_own_schedule (cuda_gemm.h): candidate i's launch for a
 * rows x N x K product on n_sm SMs, without a device. */
int nb_sm90_schedule(int i, int64_t rows, int64_t N, int64_t K, int n_sm, nb_gemm_own_schedule *out);
/* The segments CTA cta runs under candidate i (nb_cuda_gemm_own_walk). */
int nb_sm90_walk(int i, int64_t rows, int64_t N, int64_t K, int n_sm, int cta, nb_gemm_own_segment *seg,
                 int cap);

/* Launches of the own kernel so far in this process; -1 when device is not
 * compute capability 9.0 (the kernel never runs there). */
int64_t nb_sm90_launches(int dev);

#endif /* NB_GEMM_SM90_H */
