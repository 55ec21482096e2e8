/* The flash attention backward for Hopper (sm_90a): FlashAttention-3's
 * structure on TMA and wgmma. bf16 and f16 with f32 accumulation, head
 * dimensions 64 and 128 (D == Dv), any Lq and Lk, causal (key j for query i
 * when j <= i, aligned top-left, as every other kernel). It reads what the
 * forwards write (o, and the f32 lse = m scale + log(l), (B, Lq)
 * contiguous) and writes dq, dk, dv (strided views) as the mma.sync
 * backward (cuda_attention_mma.cu) does: dS = P (dP - delta), dV = P^T dO,
 * dK = scale dS^T Q, dQ = scale dS K, with P = exp(scale S - lse) recomputed.
 * Three kernels, no atomics in the sums (every output element is summed by
 * one thread in a fixed order: the same bits every run; the persistent
 * kernels' work tickets are the only atomics), launched in the order 1, 3,
 * 2 (fa3_launch_ex: each a programmatic dependent of the one before); at
 * D 64, where o's map exists, without 1: the dQ kernel computes the
 * statistics itself (fb_qstats) and writes them for the dK/dV kernel:
 *   1. the pre-pass (fb_prep_kernel: D / 8 lanes per row, 16-byte loads,
 *      where the views allow, else a warp per row; two rows a thread group,
 *      the vector path's loads issued first): delta = rowsum(dO o) in f32,
 *      and lse log2(e) (+inf for lse = -inf: p = 0) into a scratch of two
 *      (B, Lp) f32 arrays, Lp = Lq rounded up to 128, the rows past Lq +inf
 *      and 0 (p = 0, dS = 0 there): a tile's 64 values, one bulk copy.
 *   2. dK, dV: work items (128 keys, batch index), the heaviest key blocks
 *      (causal: the first) first in each section of batch indices
 *      (fa3_section). Persistent: min(SMs, items) CTAs of 384 threads
 *      taking items from a ticket counter as the forward's do (fa3_next;
 *      each item is computed alike whichever CTA takes it: the same bits
 *      as one CTA per item, NABLA_ATTENTION_SM90_BWD_PERSISTENT=0, read at
 *      every call; =n > 1 takes at most n CTAs, for the tests). ncu on the
 *      H100 at GPT-2's shape with a CTA per item
 *      (1536 CTAs, one per SM at a time): 10.4% of the dK/dV kernel's stall
 *      samples on the consumers' first wait (a CTA's first loads), 7.3% on
 *      the producer's exit waiting for the CTA's dK/dV stores to drain,
 *      ~6% on the store epilogue; persistent, the next item's K/V load
 *      and first products overlap them. Warpgroup 0, the
 *      producer (setmaxnreg 24): one thread loads an item's K and V (128 x
 *      D) into one of two K/V buffers (the CTA's k-th item into buffer
 *      k % 2, once the consumers have freed it: an empty mbarrier each,
 *      every consumer thread arriving once the item's products have
 *      completed and, where p.vec_kv but in the fused kernel at D 64, its
 *      dK and dV have gone through its rows of the buffer: fb_store16), then for every
 *      QT-query tile that sees the block (causal: from the block's first
 *      key on; QT = 64, or 128 for the split kernel at D 64: fb_kv_qt) Q,
 *      dO (QT x D; both 64-row halves, zero-filled past Lq) and, by a bulk
 *      copy, the tile's QT lse2 and delta values into the next stage of a
 *      ring that runs on across items (ST = 2, or 3 for the split kernel
 *      at D 64: fb_kv_stages; full mbarrier per stage, completed by the
 *      copy engine's bytes; empty mbarrier, one arrival per consumer
 *      thread once its wgmma reading the stage have completed and it has
 *      read the statistics. They used to be read from global memory after
 *      each S^T product; that L2 latency was 12% of the fused kernel's
 *      stall samples). Warpgroups 1 and 2, the consumers (setmaxnreg 240):
 *      keys [64 c, 64 c + 64) of the block each, computing the transposed
 *      products so that nothing goes through shared memory: S^T = K Q^T
 *      and dP^T = V dO^T (m64nQTk16, both operands from shared memory,
 *      K-major), P^T = exp2(S^T sl2 - lse2[query]) (zero for a query
 *      before the key when causal, only on tiles that reach the diagonal:
 *      at D 64 the other tiles take a path without the compares; queries
 *      past Lq have lse2 = +inf), dV += P^T dO with P^T rounded to the
 *      input dtype as wgmma's register A operand (dO as B, MN-major,
 *      transpose bit), dS^T = P^T (dP^T - delta[query]), dK += dS^T Q the
 *      same way. S^T and dP^T are two commit groups: P^T is computed while
 *      dP^T is on the tensor cores, dS^T while dV's product is (QT 64). QT 128
 *      (the split kernel at D 64: twice the work per wgmma of S^T and dP^T and
 *      per barrier round trip, statistics copy and stage release; ncu on the
 *      H100 at GPT-2's shape, B16 H12 N1024 D64 causal bf16: 188.9 us at 40%
 *      tensor-pipe active against 206.9 us at 36% with 64-query tiles; fwd+bwd
 *      0.4007 to 0.4128 ms against 0.4182 to 0.4221 in three interleaved
 *      rounds): S^T, dP^T, P^T and dK, dV hold 224 registers at once if P^T's
 *      fragments coexist with dP^T's accumulators, so both P^T and dS^T are
 *      packed once dP^T has completed, the dV and dK products are issued
 *      together and run on into the next tile's S^T, and its dP^T is issued
 *      once they have completed (their fragments' registers are then free).
 *   3. dQ: work items (128 queries, batch index), heaviest (causal: the
 *      last) first, persistent as the dK/dV kernel (the same switch): the
 *      producer loads an item's Q and dO (128 x D) into one of two Q/dO
 *      buffers (freed as kernel 2's K/V buffers) and 64-key K, V tiles into
 *      a 3-stage ring running on across items (key tiles after the block's
 *      last row never loaded); consumer c owns query rows [64 c, 64 c + 64): S = Q
 *      K^T, dP = dO V^T (m64n64k16 from shared memory), P = exp2(S sl2 -
 *      lse2[row]) (zero past Lk and, causal, after the row), dS = P (dP -
 *      delta[row]), dQ += dS K (dS as register A, K MN-major), whose
 *      product runs on into the next tile's S and dP (the tile's stage is
 *      freed once the next S has completed, and with it this product; 3
 *      stages: with 2 the next tile's load waited for that and the split
 *      path's fwd+bwd took 8% longer). At D 64 (fb_q_fold) the producer
 *      loads o's tile with Q and dO, and the consumers sum each row's delta
 *      from the shared dO and o tiles once the item's first products are
 *      issued, in the pre-pass's order (the same bits), lse loaded at the
 *      previous item's end (NABLA_ATTENTION_SM90_BWD_FOLD=0: the pre-pass).
 * Rows of a tile past Lq or Lk are zero-filled by TMA; a 64-row half of a
 * tile wholly past them is not loaded at all (its rows' results are never
 * stored, and every product here is row-wise in them), but for the dK/dV
 * kernel's query tiles, whose rows are the k of the dV and dK products.
 * The fused path (nb_set_deterministic(0) at D 128, where it is faster, or
 * NABLA_ATTN_BWD=fused; never with NABLA_ATTN_BWD=split; the kernels above stay the
 * deterministic default): the pre-pass, the f32 dQ accumulator (B, Lp / 64
 * query tiles, D / 64 chunks, 64 x 64) zeroed (at D 128 by the kernel
 * itself: fb_acc_side), then kernel 2 with F = true
 * (persistent at D 64 as the split kernels, the same switch, its K/V
 * buffer 1 after the dQ partials' buffers; at D 128 a CTA per item, K/V
 * buffer 0 only: a second would take its shared memory past 227 KB)
 * computes dQ's partial sums too (five tile products per (key block, query
 * tile) instead of the split path's seven): each consumer writes its dS^T
 * (input dtype, the 128-byte swizzle, rows = keys) into one of two 16 KB
 * buffers (double-buffered: a warpgroup may write the next while the other
 * still reads this one), fence.proxy.async, then D 128: both consumers
 * meet (named barrier 1, 256 threads) and consumer c computes dQ[:, 64 c,
 * + 64) = dS K over the 128 keys (m64n64k16, 8 k-steps, A = dS and B = K
 * both MN-major from shared memory, transpose bits set); D 64: consumer c
 * computes the 64 x 64 dQ over its own 64 keys (4 k-steps, its own barrier
 * 2 + c; no exchange, two reduces into one chunk instead of a 32-column
 * split whose MN-major B would start inside a swizzle atom). The partial
 * (f32, 32 registers, the S^T registers reused) goes to one of the
 * warpgroup's two 16 KB buffers (by the parity of the CTA's running tile
 * count, as the dS^T buffers: across items as within one), row-major
 * with the 8-byte column pairs of row r permuted by u ^ 4 (r % 8) (2
 * stores to a bank pair, the least), then fence.proxy.async, barrier
 * 2 + c and one thread's cp.reduce.async.bulk .add.f32 of the 16 KB into
 * the accumulator chunk; cp.async.bulk.wait_group.read 1 before a tile's
 * barrier keeps a buffer until the reduce of two tiles ago (of this item
 * or the last) has read it, wait_group 0 at the CTA's end (with one
 * buffer, read 0 there, the waiting thread held its warpgroup at the
 * barrier: 5% of the stall samples). Both K halves
 * are loaded (zero-filled past Lk: the dQ product reads every key row). A
 * last kernel writes dq from the accumulator (cuda_attention_sm90_bwd_acc.cuh,
 * which also has how the fused kernel zeroes and converts most of it
 * itself at D 128). The reduce order varies between runs: dq is not the
 * same bits every run (dk, dv are).
 *
 * Fragment layouts (warp w of a consumer warpgroup, lane l, g = l / 4,
 * t = l % 4), as in the forward (cuda_attention_sm90.cu):
 *   - wgmma m64nN accumulators: register i holds row 16 w + g +
 *     8 ((i / 2) % 2), column 8 (i / 4) + 2 t + i % 2.
 *   - wgmma register A (16-bit, 64 x 16 for k-step kk): a_r =
 *     (acc[8 kk + 2 r], acc[8 kk + 2 r + 1]), r = 0..3 (mma.sync's A
 *     fragment: rows g, g + 8; k 2t, 2t + 1, then 2t + 8, 2t + 9).
 *   - Shared tiles: an R x D tile is D / 64 blocks of R rows x 128 bytes,
 *     block x at x R 128 bytes, each 1024-byte aligned, the 128-byte swizzle
 *     (16-byte unit u of row r at unit u ^ (r % 8)); TMA writes 64 x 64
 *     boxes (a 128-row tile takes two per block, the second 64 128 bytes
 *     in). K-major descriptor (the ss products: k = d): first row of the
 *     block (a warpgroup's 64 rows of a 128-row tile start 64 x 128 bytes
 *     in), + 32 bytes per 16 k, 8-row groups 1024 bytes apart (SBO).
 *     MN-major descriptor (B of the rs products: k = the tile's rows, n =
 *     d): + 2048 bytes per 16 rows, 8-row groups 1024 apart (SBO), the
 *     64-column blocks of d R 128 bytes apart (LBO).
 * The device code exists only in the sm_90a pass; other passes compile
 * empty kernels, which the host never launches (it checks the device and
 * the loaded binary). */
#include <cudaTypedefs.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attention_sm90_bwd.h"
#include "backend/cuda/cuda_attention_sm90.cuh"
#include "backend/cuda/cuda_attention_sm90_bwd.cuh"
#include "backend/cuda/cuda_attention_sm90_bwd_acc.cuh"
#include "backend/cuda/cuda_attention_sm90_bwd_q.cuh"
#include "backend/cuda/gemm_sm90_plan.h"

namespace {

#ifdef NB_SM90A_DEVICE
/* ---- dK, dV -------------------------------------------------------------- */

/* Work item x of the dK/dV kernels: its batch index *b, first key *j0,
 * first query *ibeg and query tiles *ntiles (QT rows; 0 when causal and
 * the block starts at or past Lq). */
template <int QT>
__device__ __forceinline__ void fb_kv_item(const fb_params &p, int x, int *b, int *j0, int *ibeg, int *ntiles) {
  int blk; /* in the sections of batch indices (fa3_section); causal: heaviest (first) key blocks first */
  fa3_section(p, x, b, &blk);
  *j0 = blk * FB_BK;
  *ibeg = p.causal ? *j0 : 0; /* queries before the block's first key see none of it */
  *ntiles = *ibeg < p.Lq ? (p.Lq - *ibeg + QT - 1) / QT : 0;
}

/* Producer (one thread), the CTA's k-th item: K, V into
 * K/V buffer k % 2 at sk once the consumers have freed it (their products
 * of item k - 2 reading it have completed), then Q, dO and the stats of
 * query tile it (QT rows) into stage (g + it) % ST (fb_kv_stages) of the
 * ring, which runs on across items (g: the tiles of the CTA's earlier
 * items), once the consumers have freed it. Both 64-row halves of a
 * 128-row tile are loaded, the second zero-filled when it lies wholly past
 * Lq: its rows are the k of the dV and dK products, where stale data (or a
 * NaN) would count. */
template <int D, int QT>
__device__ __forceinline__ void fb_kv_produce(const CUtensorMap *mq, const CUtensorMap *mk, const CUtensorMap *mv,
                                              const CUtensorMap *mg, const fb_params &p, int b, int j0, int ibeg,
                                              int ntiles, uint32_t sk, uint32_t ss0, fb_bars bar, bool fused, int k,
                                              int g) {
  typedef fb_cfg<D, QT> C;
  int c[FB_MAXK];
  fa3_coords(p, b, c);
  /* a half wholly past Lk is not loaded (its rows of S^T, dP^T, dV and dK
   * are row-wise in K's and V's rows and never stored, whatever the buffer
   * holds), but for the fused kernel, whose dQ product reads every key row
   * of K (TMA fills them with zeros) */
  const int nh = fused || j0 + 64 < p.Lk ? 2 : 1;
  sm90_bar_wait(bar.once_empty(k), fb_bars::once_ph(k) ^ 1);
  sm90_bar_expect(bar.once(k), 2 * nh * 64 * D * 2);
  fb_tile<D, FB_BK>(sk, mk, bar.once(k), j0, nh, c, p.nbk);
  fb_tile<D, FB_BK>(sk + C::KB, mv, bar.once(k), j0, nh, c, p.nbk);
  const int ST = fb_kv_stages(fused, D); /* ring stages */
  for (int it = 0; it < ntiles; it++) {
    const int s = (g + it) % ST, i0 = ibeg + it * QT;
    const uint32_t st = ss0 + s * C::STAGE;
    sm90_bar_wait(bar.empty(s), ((uint32_t)((g + it) / ST) & 1) ^ 1); /* fresh barriers pass parity 1 */
    sm90_bar_expect(bar.full(s), 2 * C::QB + C::STATS);
    fb_tile<D, QT>(st, mq, bar.full(s), i0, QT / 64, c, p.nbk);
    fb_tile<D, QT>(st + C::QB, mg, bar.full(s), i0, QT / 64, c, p.nbk);
    /* the tile's QT lse2 and delta values (i0 + QT <= Lp: i0 is a multiple
     * of QT; 16-byte aligned: the scratch is, and the offsets are multiples
     * of 256 bytes) */
    const uint32_t sst = ss0 + ST * C::STAGE + s * C::STATS;
    fb_bulk(sst, p.sl + (int64_t)b * p.Lp + i0, QT * 4, bar.full(s));
    fb_bulk(sst + QT * 4, p.sd + (int64_t)b * p.Lp + i0, QT * 4, bar.full(s));
  }
}

/* Consumer warpgroup wg: keys [j0 + 64 wg, + 64) against every query tile
 * (QT queries: the S^T and dP^T products m64nQT, dV's and dK's QT / 16
 * k-steps); k, g and sk as fb_kv_produce's. K/V buffer k % 2 is freed
 * once the item's last products reading it have completed and (split
 * kernel, 16-byte aligned views) dK and dV have gone through this
 * warpgroup's rows of it (fb_store16); the stores drain while the next
 * item runs. Returns the next item (fa3_take at the last tile). */
template <typename T, int D, bool F, int QT>
__device__ __forceinline__ int fb_kv_consume(const fb_params &p, int b, int j0, int ibeg, int ntiles, int wg,
                                             uint32_t sk, uint32_t ss0, uint32_t sds, fb_bars bar, int k, int g) {
  typedef fb_cfg<D, QT> C;
  constexpr int NQ = QT / 16; /* k-steps of the register-A products */
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, t = lane % 4, x = threadIdx.x % 128;
  const uint32_t pb0 = sds + 2 * C::DS + 2 * wg * C::PART; /* fused: this warpgroup's two dQ partials */
  const int kw = j0 + 64 * wg + 16 * w, kr = kw + lane / 4; /* the warp's first key; this thread's key g */
  const uint32_t ka = sk + wg * 64 * 128, va = ka + C::KB;  /* this warpgroup's rows of K, V */
  float dk[D / 2], dv[D / 2], s[QT / 2], dp[QT / 2];
  uint32_t pa[NQ][4], da[NQ][4];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < QT / 2; i++) s[i] = dp[i] = 0.0f;
  sm90_bar_wait(bar.once(k), fb_bars::once_ph(k));
  constexpr int ST = fb_kv_stages(F, D); /* ring stages */
  /* ZW: the first reduce waits for the section's zeros (fb_fu_side, p.cnt) */
  const bool ZW = fb_fu_side(F, D) && p.cnt;
  /* Q2 (128-query tiles): P^T and dS^T are packed once dP^T has completed
   * (P^T's fragments and dP^T's accumulators are never live at once: 224 of
   * them with dK, dV, S^T made ptxas serialise every wgmma, C7512); dV's
   * and dK's products run on into the next tile's S^T, dP^T is issued once
   * they have completed (their fragments' registers are free) */
  constexpr bool Q2 = QT == 128;
  static_assert(Q2 == (ST == FB_QST), "the 3-stage ring is the 128-query tiles' (their products run on)");
  int nx = p.items; /* the next item */
  for (int it = 0; it < ntiles; it++) {
    if (it == ntiles - 1) nx = fa3_take(p, bar, k + 1);
    const int sg = (g + it) % ST, i0 = ibeg + it * QT;
    const uint32_t qt = ss0 + sg * C::STAGE, gt = qt + C::QB;
    /* the stage's rows i0 .. i0 + QT - 1 of the pre-pass's statistics */
    const uint32_t sl = ss0 + ST * C::STAGE + sg * C::STATS, sd = sl + QT * 4;
    const uint32_t pb = pb0 + ((g + it) & 1) * C::PART; /* fused: by the CTA's running tile count */
    sm90_bar_wait(bar.full(sg), (uint32_t)((g + it) / ST) & 1);
    fa3_fence(s);
    fa3_fence(dp);
    fa3_wg_fence();
    fb_ss<T, D, FB_BK, QT, QT>(s, ka, qt); /* S^T = K Q^T (keys x queries) */
    fa3_commit();
    if constexpr (Q2) { /* the previous tile's dV and dK products complete: its stage is free */
      fa3_wait<1>();
      fa3_fence(dv);
      fa3_fence(dk);
      fa3_fence(pa);
      fa3_fence(da);
      if (it > 0) sm90_bar_arrive(bar.empty((g + it - 1) % ST));
      fa3_fence(dp);
      fa3_wg_fence();
    }
    fb_ss<T, D, FB_BK, QT, QT>(dp, va, gt); /* dP^T = V dO^T */
    fa3_commit();
    /* lse2, then delta, of this thread's columns: loaded before the
     * products are waited for, but for Q2, whose 128-query tiles leave no
     * registers for them (fb_stats) */
    constexpr bool PRE = !Q2;
    const uint32_t la = fb_stat_at(sl, t), da2 = fb_stat_at(sd, t);
    float2 st[QT / 8];
    if constexpr (PRE) fb_stats<QT>(st, la);
    fa3_wait<1>(); /* S^T complete; dP^T may still run */
    fa3_fence(s);
    /* P^T; D 64: the mask's compares and selects (a quarter of the
     * tile's instructions) only on the tiles that reach the diagonal (at
     * D 128 the mask-free loop measured no faster on the H100: 2.5% slower
     * fused, -1.5% to +1.5% split, at the power limit's clock) */
    const bool diag = p.causal && i0 < kw + 16; /* warp-uniform: some query before some key */
    if (D == 64 && !diag) {
      fb_pt<PRE, QT>(s, st, la, p.sl2);
    } else {
#pragma unroll
      for (int n = 0; n < QT / 8; n++) {
        const float2 l2 = fb_stat<PRE, QT>(st, la, n);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float pv = nb_mma_exp2(fmaf(s[4 * n + e], p.sl2, -((e & 1) ? l2.y : l2.x)));
          s[4 * n + e] = diag && i0 + 8 * n + 2 * t + (e & 1) < kr + 8 * (e >> 1) ? 0.0f : pv;
        }
      }
    }
    /* fused: keys past Lk are zero rows of K, whose P^T is exp2(-lse2),
     * infinite for an lse below about -88; dQ's product multiplies their
     * dS^T by those zero rows (inf times 0: NaN), so P^T is 0 there. Only
     * the warps whose keys cross Lk (warp-uniform); the split path never
     * sums over those keys. */
    if (F && kw + 16 > p.Lk) {
#pragma unroll
      for (int n = 0; n < QT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          if (kr + 8 * (e >> 1) >= p.Lk) s[4 * n + e] = 0.0f;
    }
    if constexpr (PRE) fb_stats<QT>(st, da2);
    if constexpr (!Q2) {
      fa3_pack<T>(pa, s);
      fa3_fence(pa);
      fa3_fence(dv);
      fa3_wg_fence();
      fb_rs<T, D, QT, NQ>(dv, pa, gt); /* dV += P^T dO */
      fa3_commit();
      fa3_wait<1>(); /* dP^T complete; dV's product may still run */
    } else {
      fa3_wait<0>(); /* dP^T complete */
    }
    fa3_fence(dp);
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
      const float2 dl = fb_stat<PRE, QT>(st, da2, n);
#pragma unroll
      for (int e = 0; e < 4; e++) dp[4 * n + e] = s[4 * n + e] * (dp[4 * n + e] - ((e & 1) ? dl.y : dl.x));
    }
    if constexpr (Q2) {
      fa3_pack<T>(pa, s);
      fa3_pack<T>(da, dp);
      fa3_fence(pa);
      fa3_fence(da);
      fa3_fence(dv);
      fa3_fence(dk);
      fa3_wg_fence();
      fb_rs<T, D, QT, NQ>(dv, pa, gt); /* dV += P^T dO */
      fb_rs<T, D, QT, NQ>(dk, da, qt); /* dK += dS^T Q */
      fa3_commit();
      continue; /* both run on into the next tile's S^T */
    }
    fa3_pack<T>(da, dp);
    const uint32_t ds = sds + ((g + it) & 1) * C::DS;
    if constexpr (F) { /* dS^T to shared memory, before the dK product reads da */
      fb_put_ds(ds, da, wg, w, lane);
      fb_fence_async(); /* the stores, then the other warpgroup's wgmma reading them */
    }
    /* DQF (fused, D 128): dQ's product first, then dK's, so the partial
     * goes out while dK's product runs (ncu, B4 H16 N4096 D128 causal: the
     * fused kernel 1.81 -> 1.74 ms); at D 64 the other order (dK's product
     * before the barrier, so it runs while the warpgroup waits) measured
     * faster (GPT-2's shape: fused fwd+bwd 0.92x the split path's time,
     * against 1.01x with dQ first). */
    constexpr bool DQF = F && D == 128;
    if (!DQF) {
      fa3_fence(da);
      fa3_fence(dk);
      fa3_wg_fence();
      fb_rs<T, D, QT, NQ>(dk, da, qt); /* dK += dS^T Q */
      fa3_commit();
    }
    if constexpr (F) {
      /* the reduce of two tiles ago (of this item or the last) has read
       * this tile's partial buffer (before the barrier: the warpgroup
       * writes it below; the last reduce may still read the other); D
       * 128: both warpgroups' dS^T are in (and, one iteration ago, both had completed their dQ
       * product reading the other buffer); D 64: this warpgroup's */
      if (x == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      if (D == 128) fb_bar_both();
      else fb_bar_wg(wg);
      fa3_fence(s);
      fa3_fence(da);
      fa3_fence(dk);
      fa3_wg_fence();
      /* D 128: queries x columns [64 wg, + 64) over the 128 keys; D 64:
       * queries x the 64 columns over this warpgroup's 64 keys (no
       * exchange between the warpgroups, two reduces into one chunk) */
      if (D == 128) fb_dq<T, 8>(s, ds, sk, 0, wg);
      else fb_dq<T, 4>(s, ds, sk, 64 * wg, 0);
      fa3_commit();
    }
    if (DQF) {
      fb_rs<T, D, QT, NQ>(dk, da, qt); /* dK += dS^T Q */
      fa3_commit();
    }
    /* DQF: dV and dQ complete, dK's product may still run, the partial
     * goes out, then the stage is freed; else dV and dK complete, the
     * stage is freed, and (fused) the partial waits for dQ's product */
    if constexpr (DQF) {
      fa3_wait<1>();
      fb_send_part<D>(p, s, pb, b, i0, wg, w, lane, x, ZW && it == 0);
    }
    if (F && !DQF) fa3_wait<1>();
    else fa3_wait<0>();
    fa3_fence(dv);
    fa3_fence(dk);
    fa3_fence(pa);
    fa3_fence(da);
    /* the stage is free: every consumer thread arrives (256 arrivals) once
     * its own reads of the statistics are done, so that each read is
     * ordered before the producer's next bulk copy into the stage by the
     * barrier itself (lane 0 arriving for its warp after __syncwarp, with
     * or without a proxy fence, left 288 racecheck hazard reports; the
     * same speed either way) */
    sm90_bar_arrive(bar.empty(sg));
    if constexpr (F && !DQF) {
      fa3_wait<0>();
      fb_send_part<D>(p, s, pb, b, i0, wg, w, lane, x, ZW && it == 0);
    }
  }
  if constexpr (Q2) {
    fa3_wait<0>();
    fa3_fence(dk);
    fa3_fence(da);
    fa3_fence(dv);
    fa3_fence(pa);
    if (ntiles) sm90_bar_arrive(bar.empty((g + ntiles - 1) % ST));
  }
  /* every product of the item has completed (each path waits for all of
   * them above): K/V buffer k % 2 is free (every consumer thread arrives,
   * as for the stages) once dK and dV have gone through this warpgroup's
   * rows of K and V (fb_store16; the fused kernel at D 128 after both
   * warpgroups' dQ products, which read all of K: its 4-byte pair stores
   * took 6.7 us of each CTA's ~100, B4 H16 N4096 D128 causal) */
  if (!ntiles) nx = fa3_take(p, bar, k + 1);
  if ((!F || D == 128) && p.vec_kv) {
    if (F) fb_bar_both();
    fb_store16<T, D>(p.dk + fb_off(p, b, p.dk_bs), p.dk_rs, kw - 16 * w, p.Lk, wg, ka, dk, p.scale);
    fb_store16<T, D>(p.dv + fb_off(p, b, p.dv_bs), p.dv_rs, kw - 16 * w, p.Lk, wg, va, dv, 1.0f);
    fb_fence_async(); /* the generic writes before the copy engine's next ones */
    sm90_bar_arrive(bar.once_empty(k));
  } else {
    sm90_bar_arrive(bar.once_empty(k));
    fb_store<T, D>(p.dk + fb_off(p, b, p.dk_bs), p.dk_rs, kr, p.Lk, t, dk, p.scale);
    fb_store<T, D>(p.dv + fb_off(p, b, p.dv_bs), p.dv_rs, kr, p.Lk, t, dv, 1.0f);
  }
  return nx;
}

#endif /* NB_SM90A_DEVICE */

/* Shared setup of both kernels: the tiles' base (1024-aligned: the 128-byte
 * swizzle repeats every 1024 bytes), barrier init by thread 0, NEMPTY the
 * empty barriers' arrival count. */
#define FB_PROLOGUE(SMEM_TILES, NEMPTY)                                                  \
  extern __shared__ uint8_t fb_raw[];                                                    \
  const uint32_t s0 = (sm90_smem(fb_raw) + 1023) & ~1023u;                               \
  const fb_bars bar = {s0 + (SMEM_TILES)};                                               \
  if (threadIdx.x == 0) {                                                                \
    for (int i = 0; i < FB_NBAR; i++)                                                    \
      sm90_bar_init(bar.base + 8 * i, fb_bar_count(i, (NEMPTY)));                         \
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");                   \
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");                         \
  }                                                                                      \
  __syncthreads();                                                                       \
  fa3_grid_wait()

// dk, dv (B, Lk, D), and for F the dQ accumulator: items (128 keys, batch index) from the ticket counter
// (fa3_next; the fused kernel at D 128: a CTA per item), query tiles of QT
template <typename T, int D, bool F, int QT = fb_kv_qt(F, D)>
__global__ void __launch_bounds__(FB_THREADS, 1)
    fb_kv_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                 const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mg,
                 const __grid_constant__ CUtensorMap mo, const __grid_constant__ fb_params p) {
#ifdef NB_SM90A_DEVICE
  typedef fb_cfg<D, QT> C;
  static_assert(QT == fb_kv_qt(F, D), "the query tile is fb_kv_qt's");
  constexpr int ST = fb_kv_stages(F, D); /* ring stages */
  /* K/V buffer 1 after the ring and its statistics (the split kernel),
   * after the dS^T and dQ partial buffers (the fused kernel at D 64; at D
   * 128 it is launched one CTA per item, grid == items in fb_launch_fused,
   * and never takes it: a smaller grid would put two items' K/V in buffer 0) */
  constexpr bool KV2 = !F || fb_fu_persistent(D);
  /* ZC: the accumulator zeroed and converted beside the products
   * (fb_acc_side; p.cnt) by the fused kernel of one item per CTA */
  constexpr bool ZC = fb_fu_side(F, D);
  constexpr uint32_t KV1 = !KV2 ? 0 : F ? C::FU_KV1 : C::kv_tiles(false);
  static_assert(KV1 % 1024 == 0, "K/V buffer 1 must be 1024-byte aligned");
  FB_PROLOGUE(F ? C::FU_KV1 + (KV2 ? 2 * C::KB : 0) : C::kv_tiles(false) + 2 * C::KB, 256);
  (void)mo; /* the dQ kernel's (fb_qstats) */
  /* k: the CTA's items so far (item slot and K/V buffer k % 2; an item
   * without query tiles too, rare: causal, Lk > Lq), g their query tiles
   * (the ring's running count) */
  int k = 0, g = 0, b, j0, ibeg, ntiles;
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (threadIdx.x == 0) {
      int x = (int)blockIdx.x;
      fa3_put(p, bar, 0, x);
      for (; x < p.items; k++, g += ntiles) {
        const int nx = fa3_next(p);
        fb_kv_item<QT>(p, x, &b, &j0, &ibeg, &ntiles);
        fb_kv_produce<D, QT>(&mq, &mk, &mv, &mg, p, b, j0, ibeg, ntiles, s0 + (k & 1) * KV1, s0 + 2 * C::KB, bar,
                             F, k, g);
        fa3_put(p, bar, k + 1, nx);
        x = nx;
      }
      fa3_work_done(p);
    } else if (ZC && threadIdx.x >= 32 && p.cnt) {
      fb_kv_item<QT>(p, (int)blockIdx.x, &b, &j0, &ibeg, &ntiles);
      fb_acc_side<T, D>(p, b, ntiles);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    for (int x = fa3_take(p, bar, 0); x < p.items; k++, g += ntiles) {
      fb_kv_item<QT>(p, x, &b, &j0, &ibeg, &ntiles);
      x = fb_kv_consume<T, D, F, QT>(p, b, j0, ibeg, ntiles, threadIdx.x / 128 - 1, s0 + (k & 1) * KV1,
                                     s0 + 2 * C::KB, s0 + 2 * C::KB + ST * (C::STAGE + C::STATS), bar, k, g);
    }
    /* fused: every dQ partial's reduce has completed (the partial buffers
     * alternate by the CTA's running tile count, across items as within
     * one: cp.async.bulk.wait_group.read 1 before each tile's barrier
     * holds at an item boundary too) */
    if (F && threadIdx.x % 128 == 0) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      if (ZC && p.cnt) fb_wg_done(p, b);
    }
  }
#else
  (void)mq; (void)mk; (void)mv; (void)mg; (void)mo; (void)p;
#endif
}

// dq (B, Lq, D): items (128 queries, batch index) from the ticket counter (fa3_next)
template <typename T, int D>
__global__ void __launch_bounds__(FB_THREADS, 1)
    fb_q_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mg,
                const __grid_constant__ CUtensorMap mo, const __grid_constant__ fb_params p) {
#ifdef NB_SM90A_DEVICE
  typedef fb_cfg<D> C;
  static_assert(C::Q_TILES % 1024 == 0, "Q/dO buffer 1 must be 1024-byte aligned");
  FB_PROLOGUE(C::Q_TILES + C::QBUF, 8); /* Q/dO buffer 1 after the ring */
  /* k: the CTA's items so far (item slot and Q/dO buffer k % 2), g their
   * key tiles (the ring's running count) */
  int k = 0, g = 0, b, i0, ntiles;
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (threadIdx.x == 0) {
      int x = (int)blockIdx.x;
      fa3_put(p, bar, 0, x);
      for (; x < p.items; k++, g += ntiles) {
        const int nx = fa3_next(p);
        fb_q_item(p, x, &b, &i0, &ntiles);
        fb_q_produce<D>(&mq, &mk, &mv, &mg, &mo, p, b, i0, ntiles, s0 + (k & 1) * C::Q_TILES, s0 + C::QBUF, bar, k,
                        g);
        fa3_put(p, bar, k + 1, nx);
        x = nx;
      }
      fa3_work_done(p);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    fb_qstats st; /* the statistics of the next item's rows (p.fold) */
    for (int x = fa3_take(p, bar, 0); x < p.items; k++, g += ntiles) {
      fb_q_item(p, x, &b, &i0, &ntiles);
      x = fb_q_consume<T, D>(p, b, i0, ntiles, threadIdx.x / 128 - 1, s0 + (k & 1) * C::Q_TILES, s0 + C::QBUF,
                             bar, k, g, st);
    }
  }
#else
  (void)mq; (void)mk; (void)mv; (void)mg; (void)mo; (void)p;
#endif
}

/* 1 when every row of view v (row stride rs, batch strides bs over nbk
 * axes) starts 16 bytes aligned: 8-element vector accesses. */
static int fb_vec_ok(const void *data, int64_t rs, const int64_t *bs, int nbk) {
  if (!nb_cuda_aligned16(data) || rs % 8) return 0;
  for (int i = 0; i < nbk; i++)
    if (bs[i] % 8) return 0;
  return 1;
}

/* ---- host -------------------------------------------------------------- */
/* 1 when the loaded images of the three kernels are the 9.0 ones (a binary built
 * without that target would run the sm_80 image's empty kernels). */
template <typename T, int D> int fb_ready(void) {
  static int kv = 0, q = 0, fused = 0;
  return fa3_binary_ok(fb_kv_kernel<T, D, false>, &kv) && fa3_binary_ok(fb_q_kernel<T, D>, &q) &&
         fa3_binary_ok(fb_kv_kernel<T, D, true>, &fused);
}

/* A (.., L, D) view of dtype dt whose rows the kernels address directly: D
 * columns of unit stride, even strides (4-byte pair accesses), 4-byte
 * aligned data. */
int fb_rows_ok(const nb_kview *o, nb_dtype dt, int64_t L, int64_t D) {
  const int nd = o->ndim;
  if (o->dtype != dt || o->shape[nd - 1] != D || o->shape[nd - 2] != L || o->strides[nd - 1] != 1 ||
      ((uintptr_t)o->data & 3))
    return 0;
  for (int d = 0; d < nd - 1; d++)
    if (o->shape[d] > 1 && o->strides[d] % 2) return 0;
  return 1;
}

int64_t fb_launches, fb_fused_launches, fb_fold_launches;

/* The pre-pass over rows rows of the scratch. */
template <typename T, int D> nb_status fb_prep(const nb_cuda_ctx *ctx, const fb_params &p, int64_t rows) {
  const int64_t per = p.vec_og ? fb_prep_cfg<D, true>::RPB : fb_prep_cfg<D, false>::RPB; /* rows per block */
  if (p.vec_og) fb_prep_kernel<T, D, true><<<(unsigned)((rows + per - 1) / per), 256, 0, ctx->stream>>>(p);
  else fb_prep_kernel<T, D, false><<<(unsigned)((rows + per - 1) / per), 256, 0, ctx->stream>>>(p);
  return nb_cuda_launch_check("attention_bwd (sm90 delta)");
}

/* Whether this call takes the fused path: NABLA_ATTN_BWD=fused or split
 * (read at every call) decide, otherwise the faster of the two where
 * nb_deterministic() is off: the fused path at D 128, the split one at D
 * 64 (its dQ kernel computes the statistics itself; H100, GPT-2's shape
 * fwd+bwd 0.338 ms split against 0.401 fused), which is deterministic too. */
int fb_use_fused(int64_t D) {
  const char *e = getenv("NABLA_ATTN_BWD");
  if (e && !strcmp(e, "fused")) return 1;
  if (e && !strcmp(e, "split")) return 0;
  return !nb_deterministic() && D == 128;
}

/* The persistent kernels' grid for items work items: min(SMs, items), the CTAs
 * taking items from the ticket counter (persistent: fa3_next); one CTA per
 * item with NABLA_ATTENTION_SM90_BWD_PERSISTENT=0, min(n, items) with n > 1
 * (the tests: several items per CTA at small sizes); read at every call.
 * Each item is computed alike either way: the same bits. */
int fb_grid(const nb_cuda_ctx *ctx, int items) {
  const char *e = getenv("NABLA_ATTENTION_SM90_BWD_PERSISTENT");
  if (e && !strcmp(e, "0")) return items;
  const int n = e && atoi(e) > 1 ? atoi(e) : ctx->n_sm;
  return n >= 1 && n < items && n <= NB_CUDA_WORK_CTAS ? n : items;
}

/* Launches kern (smem bytes of shared memory) over p's work order (the B
 * nblk items of nblk blocks per batch index, in sections of batch indices
 * whose streamed operands take per_b bytes each, set by the caller:
 * fa3_set_order; causal, a larger last one: nb_fa3_tail), on fb_grid's
 * CTAs (persistent) or one per item. */
template <typename K>
nb_status fb_go(const nb_cuda_ctx *ctx, K kern, size_t smem, const CUtensorMap *m, const fb_params &p,
                int persistent, const char *what) {
  NB_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "attention_bwd (sm90): shared memory attribute");
  const int grid = persistent ? fb_grid(ctx, p.items) : p.items;
  NB_CUDA_TRY(fa3_launch_ex(kern, (unsigned)grid, FB_THREADS, smem, ctx, m[0], m[1], m[2], m[3], m[4], p),
              "attention_bwd (sm90): launch");
  return nb_cuda_launch_check(what);
}

/* The fused path: the pre-pass, dK, dV and dQ's partial sums in one
 * kernel, then dq from the accumulator. With p.cnt (D 128) the fused
 * kernel zeroes the accumulator and converts most of it itself
 * (fb_acc_side; the pre-pass zeroes the counters) and the last kernel
 * converts the rest; else the accumulator is zeroed before and converted
 * after. */
template <typename T, int D>
nb_status fb_launch_fused(const nb_cuda_ctx *ctx, const CUtensorMap *m, fb_params p, int nkb) {
  const int64_t rows = (int64_t)p.B * p.Lp;
  const int64_t per_b = 4 * (int64_t)p.Lq * D + 4 * (int64_t)p.Lp * D; /* streamed: Q, dO, the accumulator */
  fa3_set_order(p, ctx, nkb, per_b, p.causal);                          /* the pre-pass zeroes its sections' counters */
  nb_status st = fb_prep<T, D>(ctx, p, rows);
  if (st) return st;
  if (!p.cnt)
    NB_CUDA_TRY(cudaMemsetAsync(p.acc, 0, (size_t)rows * D * sizeof(float), ctx->stream),
                "attention_bwd (sm90): zeroing the dq accumulator");
  /* D 128: one CTA per item */
  st = fb_go(ctx, fb_kv_kernel<T, D, true>, fb_cfg<D>::SMEM_FU, m, p, fb_fu_persistent(D),
             "attention_bwd (sm90 fused dk, dv, dq)");
  if (st) return st;
  const int64_t nv = (int64_t)p.B * p.ntq;
  fb_dq_kernel<T, D><<<(unsigned)(nv < 8 * ctx->n_sm ? nv : 8 * ctx->n_sm), 256, 0, ctx->stream>>>(p);
  st = nb_cuda_launch_check("attention_bwd (sm90 dq from the accumulator)");
  if (!st && p.cnt && p.cmax >= 0) st = fb_count_units(ctx, p);
  if (!st) {
    __atomic_add_fetch(&fb_launches, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&fb_fused_launches, 1, __ATOMIC_RELAXED);
  }
  return st;
}

/* fused: fb_launch_fused; else the pre-pass, dK and dV, then dQ. */
template <typename T, int D>
nb_status fb_launch(const nb_cuda_ctx *ctx, const CUtensorMap *m, fb_params p, int nkb, int nqb, int fused) {
  if (fused) return fb_launch_fused<T, D>(ctx, m, p, nkb);
  nb_status st = p.fold ? NB_OK : fb_prep<T, D>(ctx, p, (int64_t)p.B * p.Lp);
  if (st) return st;
  /* streamed: K and V of a batch index, then Q and dO */
  fa3_set_order(p, ctx, nqb, 4 * (int64_t)p.Lk * D, p.causal);
  st = fb_go(ctx, fb_q_kernel<T, D>, fb_cfg<D>::SMEM_Q, m, p, 1, "attention_bwd (sm90 dq)");
  if (st) return st;
  fa3_set_order(p, ctx, nkb, 4 * (int64_t)p.Lq * D, p.causal);
  st = fb_go(ctx, fb_kv_kernel<T, D, false>, fb_cfg<D, fb_kv_qt(false, D)>::SMEM_KV, m, p, 1,
             "attention_bwd (sm90 dk, dv)");
  if (!st) __atomic_add_fetch(&fb_launches, 1, __ATOMIC_RELAXED);
  if (!st && p.fold) __atomic_add_fetch(&fb_fold_launches, 1, __ATOMIC_RELAXED);
  return st;
}

} /* namespace */

int64_t nb_cuda_attn_sm90_bwd_launches(int device) {
  return nb_sm90_device_ok(device) ? __atomic_load_n(&fb_launches, __ATOMIC_RELAXED) : -1;
}

int64_t nb_cuda_attn_sm90_bwd_fused_launches(int device) {
  return nb_sm90_device_ok(device) ? __atomic_load_n(&fb_fused_launches, __ATOMIC_RELAXED) : -1;
}

int64_t nb_cuda_attn_sm90_bwd_fold_launches(int device) {
  return nb_sm90_device_ok(device) ? __atomic_load_n(&fb_fold_launches, __ATOMIC_RELAXED) : -1;
}

int nb_cuda_attn_sm90_bwd(const nb_cuda_ctx *ctx, const nb_kview *dq, const nb_kview *dk, const nb_kview *dv,
                          const nb_kview *dout, const nb_kview *q, const nb_kview *k, const nb_kview *v,
                          const nb_kview *o, const nb_kview *lse, double scale, int causal, nb_status *st) {
  /* NABLA_ATTENTION_SM90_BWD=0 leaves the call to the mma.sync backward */
  const char *env = getenv("NABLA_ATTENTION_SM90_BWD");
  if (env && !strcmp(env, "0")) return 0;
  const int nd = q->ndim, nb = nd - 2;
  const nb_dtype dt = q->dtype;
  if (nd < 2 || (dt != NB_BF16 && dt != NB_F16) || !nb_sm90_device_ok(ctx->dev)) return 0;
  const int64_t D = q->shape[nd - 1], Lq = q->shape[nd - 2], Lk = k->shape[nd - 2];
  if ((D != 64 && D != 128) || Lq < 1 || Lk < 1 || Lq > INT32_MAX / 4 || Lk > INT32_MAX / 4) return 0;
  const nb_kview *all[8] = {q, k, v, o, dout, dq, dk, dv};
  for (int i = 0; i < 8; i++) {
    if (all[i]->ndim != nd) return 0;
    for (int d = 0; d < nb; d++) /* one batch shape (no grouped heads, no broadcasting) */
      if (all[i]->shape[d] != q->shape[d]) return 0;
  }
  if (lse->dtype != NB_F32 || !fb_rows_ok(k, dt, Lk, D) || !fb_rows_ok(v, dt, Lk, D) ||
      !fb_rows_ok(o, dt, Lq, D) || !fb_rows_ok(dout, dt, Lq, D) || !fb_rows_ok(dq, dt, Lq, D) ||
      !fb_rows_ok(dk, dt, Lk, D) || !fb_rows_ok(dv, dt, Lk, D))
    return 0;
  if (!(D == 64 ? (dt == NB_BF16 ? fb_ready<__nv_bfloat16, 64>() : fb_ready<__half, 64>())
                : (dt == NB_BF16 ? fb_ready<__nv_bfloat16, 128>() : fb_ready<__half, 128>())))
    return 0;
  /* the batch axes of size > 1, innermost first (all the views share them) */
  fb_params p;
  memset(&p, 0, sizeof p);
  int axes[FB_MAXK], nbk = 0;
  int64_t B = 1;
  for (int d = nb - 1; d >= 0; d--) {
    B *= q->shape[d];
    if (q->shape[d] == 1) continue;
    if (nbk == FB_MAXK) return 0;
    axes[nbk] = d;
    p.bdim[nbk] = nb_fastdiv_make((uint32_t)(q->shape[d] < INT32_MAX ? q->shape[d] : INT32_MAX)); /* B checked below */
    p.dq_bs[nbk] = dq->strides[d], p.dk_bs[nbk] = dk->strides[d], p.dv_bs[nbk] = dv->strides[d];
    p.o_bs[nbk] = o->strides[d], p.g_bs[nbk] = dout->strides[d];
    nbk++;
  }
  if (!nbk) { /* one batch index: a size-1 stand-in axis */
    axes[0] = -1;
    p.bdim[0] = nb_fastdiv_make(1);
    nbk = 1;
  }
  const int64_t nqb = (Lq + FB_BM - 1) / FB_BM, nkb = (Lk + FB_BK - 1) / FB_BK, Lp = nqb * FB_BM;
  /* items, and the tickets past them (gridDim.x + the counter: fa3_next), fit in an int */
  const int64_t imax = INT32_MAX - NB_CUDA_WORK_CTAS;
  if (B < 1 || B > INT32_MAX || B * nqb > imax || B * nkb > imax || B * Lp > INT32_MAX / 2) return 0;
  CUtensorMap maps[5]; /* q, k, v, dout, o (the dQ kernel's own statistics: p.fold) */
  if (!nb_fa3_map(&maps[0], q, Lq, D, axes, nbk, 64) || !nb_fa3_map(&maps[1], k, Lk, D, axes, nbk, 64) ||
      !nb_fa3_map(&maps[2], v, Lk, D, axes, nbk, 64) || !nb_fa3_map(&maps[3], dout, Lq, D, axes, nbk, 64))
    return 0;
  const int fused = fb_use_fused(D);
  /* the split path's dQ kernel computes the statistics itself, no pre-pass
   * (fb_q_fold's D 64; o by TMA: its map implies the pre-pass's 16-byte
   * path, whose bits it gives); NABLA_ATTENTION_SM90_BWD_FOLD=0 (read at
   * every call): the pre-pass */
  memset(&maps[4], 0, sizeof maps[4]);
  p.fold = !fused && fb_q_fold((int)D) && fa3_switch("NABLA_ATTENTION_SM90_BWD_FOLD") &&
           nb_fa3_map(&maps[4], o, Lq, D, axes, nbk, 64);
  const int zc = fb_acc_in_kernel(fb_fu_side(fused, (int)D), &p.cmax); /* D 128: one CTA per item */
  const size_t half = (size_t)B * Lp * sizeof(float);
  const size_t bytes = 2 * half + (fused ? half * (size_t)D : 0) + (zc ? FB_NCNT * (size_t)(B + 1) * 4 : 0);
  float *scratch = (float *)nb_cuda_scratch(ctx, bytes);
  if (!scratch) {
    *st = nb_last_status();
    return 1;
  }
  if ((uintptr_t)scratch & 15) { /* the bulk copies need 16-byte alignment */
    nb_cuda_scratch_free(ctx, scratch, bytes);
    return 0;
  }
  p.dq = (uint16_t *)dq->data, p.dk = (uint16_t *)dk->data, p.dv = (uint16_t *)dv->data;
  p.o = (const uint16_t *)o->data, p.g = (const uint16_t *)dout->data;
  p.lse = (const float *)lse->data;
  p.sl = scratch, p.sd = scratch + B * Lp;
  p.acc = fused ? scratch + 2 * B * Lp : NULL; /* 16-byte aligned: Lp is a multiple of 128 */
  p.cnt = zc ? (unsigned *)(p.acc + B * Lp * D) : NULL; /* a section per batch index at most */
  p.ntq = (int)(Lp / 64);
  p.dq_rs = dq->strides[nd - 2], p.dk_rs = dk->strides[nd - 2], p.dv_rs = dv->strides[nd - 2];
  p.o_rs = o->strides[nd - 2], p.g_rs = dout->strides[nd - 2];
  p.nbk = nbk;
  p.vec_og = fb_vec_ok(o->data, p.o_rs, p.o_bs, nbk) && fb_vec_ok(dout->data, p.g_rs, p.g_bs, nbk);
  p.vec_dq = fb_vec_ok(dq->data, p.dq_rs, p.dq_bs, nbk);
  p.vec_kv = fb_vec_ok(dk->data, p.dk_rs, p.dk_bs, nbk) && fb_vec_ok(dv->data, p.dv_rs, p.dv_bs, nbk) &&
             fa3_switch("NABLA_ATTENTION_SM90_BWD_STORE16"); /* =0 (read at every call): pair stores, fb_store */
  p.B = (int)B;
  p.Lq = (int)Lq;
  p.Lk = (int)Lk;
  p.Lp = (int)Lp;
  p.scale = (float)scale;
  p.sl2 = (float)(scale * 1.4426950408889634);
  p.causal = causal;
  p.work = nb_cuda_work_counters(ctx);
  if (D == 64)
    *st = dt == NB_BF16 ? fb_launch<__nv_bfloat16, 64>(ctx, maps, p, (int)nkb, (int)nqb, fused)
                        : fb_launch<__half, 64>(ctx, maps, p, (int)nkb, (int)nqb, fused);
  else
    *st = dt == NB_BF16 ? fb_launch<__nv_bfloat16, 128>(ctx, maps, p, (int)nkb, (int)nqb, fused)
                        : fb_launch<__half, 128>(ctx, maps, p, (int)nkb, (int)nqb, fused);
  nb_cuda_scratch_free(ctx, scratch, bytes);
  return 1;
}
