/* nabla's own Hopper GEMM (gemm_sm90.cu), called by cuda_gemm.cu when the
 * own backend is selected. C++ (CUDA) only: it takes the backend context. */
#ifndef NB_GEMM_SM90_H
#define NB_GEMM_SM90_H

#include "backend/cuda/cuda_common.cuh"

/* out = a @ b for f16/bf16 on a compute-capability 9.0 device. Returns 1 when
 * the own kernel took the product (its launch status in *st), 0 when the
 * call does not fit it (dtype, device, a layout or alignment TMA cannot
 * take, batches that do not fold into rows): the caller then uses cuBLASLt. */
int nb_sm90_matmul(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                   const nb_kview *b, nb_status *st);

#endif /* NB_GEMM_SM90_H */
