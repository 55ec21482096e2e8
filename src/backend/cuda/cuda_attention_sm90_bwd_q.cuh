/* The split backward's dQ kernel's device side (cuda_attention_sm90_bwd.cu
 * describes it, kernel 3 of its header; fb_q_kernel there launches it): the
 * work item, the producer (Q and dO per item, K and V tiles through a
 * 3-stage ring) and the consumer warpgroups (S, dP, dS, dQ += dS K).
 * Included by that file only. */
#ifndef NB_CUDA_ATTENTION_SM90_BWD_Q_CUH
#define NB_CUDA_ATTENTION_SM90_BWD_Q_CUH

#include "backend/cuda/cuda_attention_sm90_bwd.cuh"

#ifdef NB_SM90A_DEVICE
namespace {

/* Work item x of the dQ kernel: its batch index *b, first query *i0 and
 * key tiles *ntiles (at least 1). */
__device__ __forceinline__ void fb_q_item(const fb_params &p, int x, int *b, int *i0, int *ntiles) {
  int blk; /* in the sections of batch indices (fa3_section), heaviest (last) query blocks first */
  fa3_section(p, x, b, &blk);
  *i0 = (p.nblk - 1 - blk) * FB_BM;
  /* keys the block's rows see: [0, kend), at least key 0 (i0 < Lq, Lk >= 1) */
  const int kend = p.causal ? min(p.Lk, min(*i0 + FB_BM, p.Lq)) : p.Lk;
  *ntiles = (kend + FB_BN - 1) / FB_BN;
}

/* Producer (one thread), the CTA's k-th item: Q, dO into Q/dO buffer k % 2
 * at sq once the consumers have freed it (their products of item k - 2
 * reading it have completed), then K_j, V_j into stage (g + j) % FB_QST of
 * the ring, which runs on across items (g: the tiles of the CTA's earlier
 * items). */
template <int D>
__device__ __forceinline__ void fb_q_produce(const CUtensorMap *mq, const CUtensorMap *mk, const CUtensorMap *mv,
                                             const CUtensorMap *mg, const CUtensorMap *mo, const fb_params &p, int b,
                                             int i0, int ntiles, uint32_t sq, uint32_t ss0, fb_bars bar, int k,
                                             int g) {
  typedef fb_cfg<D> C;
  int c[FB_MAXK];
  fa3_coords(p, b, c);
  /* a half wholly past Lq is not loaded (its rows' results, row-wise in
   * Q's and dO's rows, are never stored, whatever the buffer holds) */
  const int nh = i0 + 64 < p.Lq ? 2 : 1;
  sm90_bar_wait(bar.once_empty(k), fb_bars::once_ph(k) ^ 1);
  const bool fo = fb_q_fold(D) && p.fold; /* o's tile too (fb_qstats) */
  sm90_bar_expect(bar.once(k), (fo ? 3 : 2) * nh * 64 * D * 2);
  fb_tile<D, FB_BM>(sq, mq, bar.once(k), i0, nh, c, p.nbk);
  fb_tile<D, FB_BM>(sq + C::MB, mg, bar.once(k), i0, nh, c, p.nbk);
  if (fo) fb_tile<D, FB_BM>(sq + 2 * C::MB, mo, bar.once(k), i0, nh, c, p.nbk);
  for (int j = 0; j < ntiles; j++) {
    const int s = (g + j) % FB_QST;
    const uint32_t kt = ss0 + s * 2 * C::NB;
    sm90_bar_wait(bar.empty(s), ((uint32_t)((g + j) / FB_QST) & 1) ^ 1);
    sm90_bar_expect(bar.full(s), 2 * C::NB);
    fb_tile<D, FB_BN>(kt, mk, bar.full(s), j * FB_BN, 1, c, p.nbk);
    fb_tile<D, FB_BN>(kt + C::NB, mv, bar.full(s), j * FB_BN, 1, c, p.nbk);
  }
}

/* Consumer warpgroup wg: query rows [i0 + 64 wg, + 64) over the key tiles;
 * k, g and sq as fb_q_produce's. Q/dO buffer k % 2 is freed once the
 * item's last S and dP have completed and (16-byte aligned views) dQ has
 * gone through this warpgroup's rows of Q (fb_store16); the stores drain
 * while the next item runs. Returns the next item (fa3_take at the last
 * tile). */
template <typename T, int D>
__device__ __forceinline__ int fb_q_consume(const fb_params &p, int b, int i0, int ntiles, int wg, uint32_t sq,
                                            uint32_t ss0, fb_bars bar, int k, int g, fb_qstats &st) {
  typedef fb_cfg<D> C;
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, t = lane % 4;
  const int rw = i0 + 64 * wg + 16 * w, r0 = rw + lane / 4; /* the warp's first row; this thread's row g */
  const uint32_t qa = sq + wg * 64 * 128, ga = qa + C::MB;
  float dq[D / 2], s[32], dp[32];
  uint32_t da[4][4];
  const bool fold = fb_q_fold(D) && p.fold; /* the statistics: this kernel's (fb_qstats) */
  if (fold) {
    if (k == 0) fb_qstats_load(p, b, r0, st); /* else at the previous item's end */
  } else {
#pragma unroll
    for (int h = 0; h < 2; h++) { /* the pre-pass's; rows < nblk 128 <= Lp */
      st.l2[h] = p.sl[(int64_t)b * p.Lp + r0 + 8 * h];
      st.dl[h] = p.sd[(int64_t)b * p.Lp + r0 + 8 * h];
    }
  }
  const float *l2 = st.l2, *dl = st.dl;
#pragma unroll
  for (int i = 0; i < D / 2; i++) dq[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.0f;
  sm90_bar_wait(bar.once(k), fb_bars::once_ph(k));
  int nx = p.items; /* the next item */
  for (int j = 0; j < ntiles; j++) {
    if (j == ntiles - 1) nx = fa3_take(p, bar, k + 1);
    const int sg = (g + j) % FB_QST, j0 = j * FB_BN;
    const uint32_t kt = ss0 + sg * 2 * C::NB, vt = kt + C::NB;
    sm90_bar_wait(bar.full(sg), (uint32_t)((g + j) / FB_QST) & 1);
    fa3_fence(s);
    fa3_fence(dp);
    fa3_wg_fence();
    fb_ss<T, D, FB_BM, FB_BN>(s, qa, kt); /* S = Q K^T */
    fa3_commit();
    fb_ss<T, D, FB_BM, FB_BN>(dp, ga, vt); /* dP = dO V^T */
    fa3_commit();
    if (fold && j == 0) fb_qstats_finish<T, D>(p, t, w, lane, ga, ga + C::MB, st);
    fa3_wait<1>(); /* S complete, and the previous tile's dQ product: its stage is free */
    fa3_fence(s);
    if (j > 0) {
      fa3_fence(dq);
      fa3_fence(da);
      __syncwarp(); /* every lane has passed the wait before lane 0 frees the stage */
      if (lane == 0) sm90_bar_arrive(bar.empty((g + j - 1) % FB_QST));
    }
    /* P: row r0 + 8 (e >> 1), key j0 + 8n + 2t + (e & 1) */
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = nb_mma_exp2(fmaf(s[i], p.sl2, -l2[(i >> 1) & 1]));
    if (j0 + FB_BN > p.Lk || (p.causal && j0 + FB_BN - 1 > rw)) { /* warp-uniform */
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int c = j0 + 8 * (i / 4) + 2 * t + (i & 1), r = r0 + 8 * ((i >> 1) & 1);
        if (c >= p.Lk || (p.causal && c > r)) s[i] = 0.0f;
      }
    }
    fa3_wait<0>();
    fa3_fence(dp);
#pragma unroll
    for (int i = 0; i < 32; i++) dp[i] = s[i] * (dp[i] - dl[(i >> 1) & 1]);
    fa3_pack<T>(da, dp);
    fa3_fence(da);
    fa3_fence(dq);
    fa3_wg_fence();
    fb_rs<T, D, FB_BN>(dq, da, kt); /* dQ += dS K, on into the next tile's S, dP */
    fa3_commit();
  }
  if (fold && nx < p.items) { /* the next item's lse, under this item's last product and store */
    int nb, ni0, nt;
    fb_q_item(p, nx, &nb, &ni0, &nt);
    fb_qstats_load(p, nb, ni0 + 64 * wg + 16 * w + lane / 4, st);
  }
  fa3_wait<0>();
  fa3_fence(dq);
  /* dq through this warpgroup's rows of Q (fb_store16), then the last
   * stage and Q/dO buffer k % 2 are free (every product has completed) */
  if (p.vec_dq) {
    fb_store16<T, D>(p.dq + fb_off(p, b, p.dq_bs), p.dq_rs, rw - 16 * w, p.Lq, wg, qa, dq, p.scale);
    fb_fence_async(); /* the generic writes before the copy engine's next ones */
  }
  __syncwarp();
  if (lane == 0) {
    sm90_bar_arrive(bar.empty((g + ntiles - 1) % FB_QST));
    sm90_bar_arrive(bar.once_empty(k));
  }
  if (!p.vec_dq) fb_store<T, D>(p.dq + fb_off(p, b, p.dq_bs), p.dq_rs, r0, p.Lq, t, dq, p.scale);
  return nx;
}
} /* namespace */
#endif /* NB_SM90A_DEVICE */

#endif /* NB_CUDA_ATTENTION_SM90_BWD_Q_CUH */
