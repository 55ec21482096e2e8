/* nabla's portable tensor-core GEMM (gemm_sm80.cu): mma.sync + ldmatrix +
 * cp.async, for every device of compute capability 8.0 or later (Ampere, Ada,
 * and Hopper, where it is a fallback to the sm_90a kernel). */
#ifndef NB_GEMM_SM80_H
#define NB_GEMM_SM80_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = alpha * (a @ b) + beta * out, a (B.., M, K) and b (B.., K, N) f16 or
 * bf16 (one dtype), out (B.., M, N) in that dtype or f32, f32 accumulation.
 * Any strides (batch axes of stride 0 broadcast); with beta == 0 out is not
 * read. Errors (dtype, shapes, a device older than 8.0) name the op. */
nb_status nb_sm80_gemm(const nb_kview *out, const nb_kview *a, const nb_kview *b, float alpha,
                       float beta);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include "backend/cuda/cuda_common.cuh"

/* The matmul hook of cuda_gemm.cu: out = a @ b through the portable kernel.
 * backend is the GEMM switch's value: 2 (NABLA_GEMM=sm80) takes every f16/bf16
 * product on a device of compute capability >= 8.0; 1 (NABLA_GEMM=own) only
 * off compute capability 9.x, where the sm_90a kernel serves. Returns 1 when
 * it took the product (launch status in *st), 0 when cuBLASLt should. */
int nb_sm80_matmul(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                   const nb_kview *b, int backend, nb_status *st);
#endif

#endif /* NB_GEMM_SM80_H */
