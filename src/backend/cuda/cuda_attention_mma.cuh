/* The tensor-core flash attention (cuda_attention_mma.cu): bf16 and f16
 * inputs, head dimensions 64, 96 and 128, any sm_80+ GPU. cuda_attention.cu's
 * entries try it first and fall back to the SIMT kernels. */
#ifndef NB_CUDA_ATTENTION_MMA_CUH
#define NB_CUDA_ATTENTION_MMA_CUH

#include "backend/cuda/cuda_attention_extra.cuh"
#include "backend/cuda/cuda_common.cuh"

/* Each returns 0 when the call is not one the kernels take (dtype, head
 * dimension, a layout that is not 16-byte aligned rows, a device older than
 * 8.0, NABLA_ATTN_MMA=0), and 1 when it ran the call, with *st its status.
 * Same views and contracts as attn_fwd / attn_bwd (backend_entries.h), the
 * grouped-query heads already split (attn_group.h: k, v, dk, dv with a
 * stride-0 group axis, G query heads per kv head); x the mask and dropout
 * in device form (NULL: none). */
int nb_cuda_attn_mma_fwd(const nb_cuda_ctx *ctx, const nb_kview *o, const nb_kview *lse,
                         const nb_kview *q, const nb_kview *k, const nb_kview *v, double scale,
                         int causal, const nb_attx *x, nb_status *st);
int nb_cuda_attn_mma_bwd(const nb_cuda_ctx *ctx, const nb_kview *dq, const nb_kview *dk,
                         const nb_kview *dv, const nb_kview *dout, const nb_kview *q,
                         const nb_kview *k, const nb_kview *v, const nb_kview *o,
                         const nb_kview *lse, double scale, int causal, const nb_attx *x, int G,
                         nb_status *st);

#endif /* NB_CUDA_ATTENTION_MMA_CUH */
