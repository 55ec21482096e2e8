/* The Hopper flash attention backward (cuda_attention_sm90_bwd.cu): TMA,
 * wgmma, warp-specialised producer and consumer warpgroups; bf16 and f16,
 * head dimensions 64 and 128, compute capability 9.0 only.
 * cuda_attention.cu's backward entry tries it before the mma.sync kernels. */
#ifndef NB_CUDA_ATTENTION_SM90_BWD_H
#define NB_CUDA_ATTENTION_SM90_BWD_H

#include <stdint.h>

#ifdef __cplusplus
#include "backend/cuda/cuda_common.cuh"

/* Returns 0 when the call is not one the kernels take (dtype, head
 * dimension, Dv != D, Lq or Lk = 0, a view TMA cannot describe or an
 * output view of odd strides, batch shapes that differ, more than three
 * batch axes of size > 1, a device other than 9.0, a binary without the
 * sm_90a code, or NABLA_ATTENTION_SM90_BWD=0 in the environment, read at
 * every call), and 1 when it ran the call, with *st its status. Same views and
 * contract as attn_bwd (backend_entries.h) without mask, dropout or grouped
 * heads: lse (.., Lq) f32 contiguous as the forwards write it; dq, dk, dv
 * written (not accumulated), the same bits every run but on the fused
 * path (nb_cuda_attn_sm90_bwd_fused_launches). */
int nb_cuda_attn_sm90_bwd(const nb_cuda_ctx *ctx, const nb_kview *dq, const nb_kview *dk,
                          const nb_kview *dv, const nb_kview *dout, const nb_kview *q,
                          const nb_kview *k, const nb_kview *v, const nb_kview *o,
                          const nb_kview *lse, double scale, int causal, nb_status *st);

extern "C" {
#endif

/* Calls of the sm_90a attention backward that ran so far in this process;
 * -1 when the device is not compute capability 9.0 (it never runs there).
 * For tests that must know which kernels ran. */
int64_t nb_cuda_attn_sm90_bwd_launches(int device);
/* Of those, the calls that took the fused path (one kernel for dK, dV and
 * dQ's partial sums, dQ accumulated by bulk reduce-add: not the same bits
 * every run), taken when nb_deterministic() is 0 or NABLA_ATTN_BWD=fused,
 * never with NABLA_ATTN_BWD=split. */
int64_t nb_cuda_attn_sm90_bwd_fused_launches(int device);
/* Of those, the split path's calls whose dQ kernel computed the statistics
 * itself, without the pre-pass (D 64, o's view by TMA;
 * NABLA_ATTENTION_SM90_BWD_FOLD=0: never). */
int64_t nb_cuda_attn_sm90_bwd_fold_launches(int device);
/* Of the fused calls at D 128, whose kernel zeroes its f32 dQ accumulator
 * and converts it to dq beside its products (the last kernel converting
 * what it did not): *in_kernel the query tiles it converted itself, *all
 * the tiles, summed over the calls made with NABLA_ATTENTION_SM90_BWD_ACC
 * =n, n > 0 (read at every call: each warp converts n tiles at most instead
 * of one per 16 of its CTA's query tiles, and the call waits for the GPU to
 * read the counts back). For tests that must know both converters ran. -1 in both
 * when the device is not compute capability 9.0. */
void nb_cuda_attn_sm90_bwd_acc_units(int device, int64_t *in_kernel, int64_t *all);

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_ATTENTION_SM90_BWD_H */
