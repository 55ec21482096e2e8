/* The Hopper flash attention forward (cuda_attention_sm90.cu): TMA, wgmma,
 * warp-specialised producer and consumer warpgroups; bf16 and f16, head
 * dimensions 64 and 128, compute capability 9.0 only. cuda_attention.cu's
 * forward entry tries it before the mma.sync kernels. */
#ifndef NB_CUDA_ATTENTION_SM90_H
#define NB_CUDA_ATTENTION_SM90_H

#include <stdint.h>

#ifdef __cplusplus
#include "backend/cuda/cuda_common.cuh"

/* Returns 0 when the call is not one the kernel takes (dtype, head
 * dimension, Dv != D, Lk = 0, a view TMA cannot describe, more than three
 * batch axes of size > 1, a device other than 9.0, a binary without the
 * sm_90a code, NABLA_ATTENTION_SM90=0 in the environment, read at every
 * call), and 1 when it ran the call, with *st its status. Same views and
 * contract as attn_fwd (backend_entries.h): o and lse as the mma forward
 * writes them, which the backward reads. NABLA_ATTENTION_SM90_PINGPONG=0
 * and NABLA_ATTENTION_SM90_TMA_STORE=0 (read at every call) turn off the
 * consumers' turns and o's store through shared memory by TMA: the same
 * bits, other timings; NABLA_ATTENTION_SM90_CLUSTER=0 and
 * NABLA_ATTENTION_SM90_STREAMK=0 the clusters of two and the stream-K
 * tail (not causal). */
int nb_cuda_attn_sm90_fwd(const nb_cuda_ctx *ctx, const nb_kview *o, const nb_kview *lse,
                          const nb_kview *q, const nb_kview *k, const nb_kview *v, double scale,
                          int causal, nb_status *st);

extern "C" {
#endif

/* Launches of the sm_90a attention forward so far in this process; -1 when
 * the device is not compute capability 9.0 (it never runs there). For tests
 * that must know which kernel ran. */
int64_t nb_cuda_attn_sm90_launches(int device);
/* Those of them that cut some items' key tiles between clusters (the
 * stream-K tail: not causal, more items than clusters), whose rows sum
 * in another order than with NABLA_ATTENTION_SM90_STREAMK=0. */
int64_t nb_cuda_attn_sm90_cut_launches(int device);

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_ATTENTION_SM90_H */
