/* The flash attention forward for Hopper (sm_90a): FlashAttention-3's
 * structure on TMA and wgmma. bf16 and f16 with f32 accumulation, head
 * dimensions 64 and 128 (D == Dv), any Lq and Lk, causal (key j for query i
 * when j <= i, aligned top-left for Lq != Lk, as every other kernel). It
 * writes o (any batch and row strides, rows 16-byte aligned) and the f32
 * log-sum-exp lse = m scale + log(l) as the mma.sync forward
 * (cuda_attention_mma.cu) does; that file's backward reads them.
 *
 * Persistent: a CTA of 384 threads per SM (NABLA_ATTENTION_SM90_PERSISTENT=0:
 * one per item) takes work items, (block of 128 query rows, batch index)
 * pairs, from a ticket counter whenever it starts one (fa3_next): a CTA
 * that finishes early takes more, which evens out causal blocks' unequal
 * work; the items come in sections of as many batch indices as have K and
 * V in an eighth of the L2 (NABLA_ATTENTION_SM90_SECTION=n: n, for the
 * tests), the heaviest query blocks of a section first, and causal, a last
 * section large enough to even out the CTAs' ends (nb_fa3_tail,
 * NABLA_ATTENTION_SM90_TAIL):
 *   - warpgroup 0, the producer (24 registers after setmaxnreg; 40 in the
 *     clustered kernel below, where 24 spilled one): one thread
 *     issues the TMA copies, for each item Q's 128 x D tile once into one
 *     of two Q tiles (item n's in tile n % 2, once the consumers' last S
 *     of item n - 2 has completed: an empty Q mbarrier each), then K_j
 *     and V_j (tiles of 128 keys) into the next stage of a ring (ST = 2
 *     stages at D = 128, 3 at D = 64) that runs on across items, so the
 *     next item's loads overlap this one's last products and store. K
 *     and V each have a full mbarrier per stage (the copy engine completes
 *     its bytes there) and an empty one (each consumer warp arrives once
 *     its wgmma reading the stage has completed): K is freed as soon as S
 *     is computed, V after O += P V.
 *   - warpgroups 1 and 2, the consumers (240 registers; 232 clustered): rows
 *     [64c, 64c + 64) of the block each. S = Q K^T is D / 16 wgmma
 *     m64n128k16 with both operands in shared memory (K-major); the online
 *     softmax runs in registers (row max and sum over the quad's lanes,
 *     exp2 with the scale folded into log2(e), the max subtracted first);
 *     P, rounded to the input dtype, is the register A operand of
 *     O += P V (8 wgmma m64nDk16, V from shared memory with the transpose
 *     bit: it is MN-major there). Intra-warpgroup overlap (FA3's): in
 *     iteration j, S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued back to
 *     back; the softmax of S_j runs while the P V product is on the tensor
 *     cores, and O is rescaled (when the reference max moved: fa3_softmax)
 *     and P_j packed once it has completed.
 *     Ping-pong (FA3's warp scheduler barriers; NABLA_ATTENTION_SM90_PINGPONG
 *     =0 turns it off, read at every call): the two consumers take turns
 *     issuing their GEMMs of a tile through two named barriers, so that one
 *     warpgroup's softmax runs while the other's products are on the tensor
 *     cores instead of both softmaxes at once with the tensor cores idle.
 *   - Not causal, two CTAs of a cluster take query blocks 2i and 2i + 1 of
 *     one batch index and share K and V (NABLA_ATTENTION_SM90_CLUSTER=0:
 *     no clusters; the kernel's template parameter CL, 1 or 2, so that the
 *     unclustered kernel carries none of this): each producer loads half
 *     of every K and V tile's rows
 *     into both CTAs by TMA multicast, the empty barriers count both CTAs'
 *     consumer warps, and the clusters take their items in a fixed turn
 *     instead of tickets (fa3_load_kv, fa3_free, fa3_static_seg). Each K/V
 *     tile leaves L2 once per 256 query rows instead of per 128. The last
 *     items' key tiles are cut into equal ranges, one per cluster
 *     (stream-K, fa3_static_seg; NABLA_ATTENTION_SM90_STREAMK=0 off), and
 *     the two parts of a cut item joined by the second to finish
 *     (fa3_combine).
 *   - Items run into each other (fa3_carry): an item's last O += P V is
 *     issued with the next item's first S, and its epilogue follows that
 *     tile's softmax; an item's first P V product overwrites O (wgmma's
 *     scale-d off), so O is not zeroed between items.
 *   - The epilogue: o is rounded into the warpgroup's own 64 rows of a
 *     staging tile laid out as Q's and stored by TMA through a map of o's
 *     view (rows past Lq clipped) while the warpgroup goes on,
 *     or, when o's view does not suit TMA or NABLA_ATTENTION_SM90_TMA_STORE
 *     =0, by each thread's pair stores.
 *   - Shared tiles (Q, K, V) are 64-column blocks of 128-byte rows in the
 *     128-byte swizzle, written by TMA and read by the wgmma descriptors;
 *     rows past Lq or Lk are zero-filled by TMA, key columns past Lk (and,
 *     causal, after the row) get -inf, only on tiles that need it; key
 *     tiles wholly after the block's last row are never loaded.
 * Each element of o is summed by one thread in a fixed order: the same bits
 * every run.
 *
 * Fragment layouts (warp w of a consumer warpgroup, lane l, g = l / 4,
 * t = l % 4):
 *   - wgmma m64nN accumulators (S, O): register i holds row 16w + g +
 *     8 ((i / 2) % 2), column 8 (i / 4) + 2t + i % 2 (per 8-column block
 *     mma.sync's C fragment: c0 c1 row g, c2 c3 row g + 8).
 *   - wgmma register A (16-bit, 64 x 16): warp w holds rows 16w..16w + 15
 *     as mma.sync m16n8k16's A fragment: a0 = (row g, k 2t, 2t + 1),
 *     a1 = (row g + 8, same k), a2 = (row g, k 2t + 8, 2t + 9), a3 = (row
 *     g + 8, k 2t + 8, 2t + 9), low half first. So P's fragment for keys
 *     [16kk, 16kk + 16) packs S's registers of column blocks 2kk, 2kk + 1:
 *     a_r = (s[8kk + 2r], s[8kk + 2r + 1]), r = 0..3.
 *   - Shared tiles: an R x D tile is D / 64 blocks of R rows x 128 bytes,
 *     block x at x R 128 bytes, every block 1024-byte aligned; in a block,
 *     16-byte unit u of row r sits at unit u ^ (r % 8). K-major descriptor
 *     (Q as A, K as B; k = d): start at the first row of the block, + 32
 *     bytes per 16 k inside it, 8-row groups 1024 bytes apart (SBO).
 *     MN-major descriptor (V as B; k = key, n = d): + 2048 bytes per 16
 *     keys, 8-key groups 1024 bytes apart (SBO), 64-column blocks of d
 *     128 x 128 bytes apart (LBO).
 * The device code exists only in the sm_90a pass; other passes compile an
 * empty kernel, which the host never launches (it checks the device and
 * the loaded binary). */
#include <cudaTypedefs.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attention_sm90.h"
#include "backend/cuda/cuda_attention_sm90.cuh"
#include "backend/cuda/gemm_sm90_plan.h"

#define FA3_BM 128     /* query rows per CTA: two consumer warpgroups of 64 */
#define FA3_BN 128     /* keys per K/V tile */
#define FA3_THREADS 384
#define FA3_SCHED_BAR 3 /* named barriers 3, 4: the consumers' GEMM turns (ping-pong) */
#define FA3_EPI_BAR 5   /* named barriers 5, 6: a consumer's staged o before its TMA store */

namespace {

/* Everything but the tensor maps, passed by value. The batch axes are those
 * of size > 1 (at least one: a size-1 axis stands in when there is none),
 * nbk of them, innermost first: bdim their sizes, o_bs o's strides there;
 * a CTA's batch index b is the flat index over them. */
struct fa3_params {
  uint16_t *o;
  float *lse; /* (B, Lq) */
  int64_t o_rs, o_bs[FA3_MAXK];
  nb_fastdiv bdim[FA3_MAXK]; /* the batch axes' sizes (.d) */
  int nbk;
  int B, Lq, Lk, nblk; /* nblk: query blocks (with clusters, pairs of them) per batch index */
  float scale, sl2;    /* sl2 = scale * log2(e) */
  int causal;
  int pingpong; /* the consumers take turns issuing their GEMMs (NABLA_ATTENTION_SM90_PINGPONG) */
  int tma_o;    /* o staged in shared memory and stored by TMA (NABLA_ATTENTION_SM90_TMA_STORE) */
  int cluster;  /* 2: clusters of two CTAs on two query blocks share K and V (fa3_load_kv); else 1 */
  int sk_f;     /* clusters: whole rounds of items before the split ones (fa3_static_seg) */
  int kt;       /* clusters: key tiles per item (not causal: all alike) */
  int64_t sk_units; /* clusters: key tiles of the split items, 0: none */
  float *part;  /* clusters: the split items' partial sums (fa3_combine) */
  int items;    /* B nblk (batch index, query block or pair of blocks) items */
  int hg;       /* batch indices per section of the item order (fa3_item) */
  int nfull;    /* sections of hg before the last */
  nb_fastdiv dsec, dhg, dhl; /* the order's divisors (fa3_set_order) */
  unsigned *work; /* the work counters: {ticket, CTAs done}, handover, split words (nb_cuda_work_counters) */
};

template <int D> struct fa3_cfg {
  static constexpr int ST = D == 64 ? 3 : 2;                      /* K/V stages */
  static constexpr int QB = FA3_BM * D * 2, KB = FA3_BN * D * 2; /* bytes: Q (and o's staging); one K or V tile */
  /* full Q 0; full K, full V, empty K, empty V per stage; empty Q 0; full
   * and empty item slot per slot (2); full Q 1, empty Q 1 */
  static constexpr int NBAR = 8 + 4 * ST;
  /* two Q tiles (items n and n + 1), o's staging tile, the K/V ring */
  static constexpr size_t SMEM = 1024 + 3 * QB + 2 * ST * KB + 8 * NBAR;
};

#ifdef NB_SM90A_DEVICE
/* mbarrier addresses after the tiles: full Q 0, then per stage s full K,
 * full V, empty K, empty V, then empty Q 0, the item slots' full and empty
 * barriers (fa3_put), full Q 1, empty Q 1. Q tile s = n % 2 holds item n's
 * Q, so the producer loads the next item's while this one's runs. */
template <int D> struct fa3_bars {
  uint32_t base;
  __device__ __forceinline__ uint32_t q(int s) const { return s ? base + 8 * (6 + 4 * fa3_cfg<D>::ST) : base; }
  __device__ __forceinline__ uint32_t fk(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t fv(int s) const { return base + 8 * (1 + fa3_cfg<D>::ST + s); }
  __device__ __forceinline__ uint32_t ek(int s) const { return base + 8 * (1 + 2 * fa3_cfg<D>::ST + s); }
  __device__ __forceinline__ uint32_t ev(int s) const { return base + 8 * (1 + 3 * fa3_cfg<D>::ST + s); }
  __device__ __forceinline__ uint32_t qe(int s) const { return base + 8 * ((s ? 7 : 1) + 4 * fa3_cfg<D>::ST); }
  __device__ __forceinline__ uint32_t itf(int s) const { return base + 8 * (2 + 4 * fa3_cfg<D>::ST + s); }
  __device__ __forceinline__ uint32_t ite(int s) const { return base + 8 * (4 + 4 * fa3_cfg<D>::ST + s); }
};

/* Work item x (0 <= x < p.items): its batch index *b, first query row
 * *i0 and key tiles *ntiles. The items come in sections of hg batch
 * indices (the last section may have fewer, or causal more: nb_fa3_tail),
 * whose K and V fit in an eighth of the L2 together, so the CTAs at work at any time read K/V
 * tiles that L2 holds; inside a section the heaviest query blocks first,
 * each for all the section's batch indices. */
template <int CL> __device__ __forceinline__ void fa3_item(const fa3_params &p, int x, int *b, int *i0, int *ntiles) {
  int blk;
  fa3_section(p, x, b, &blk);
  /* clusters: item blk is the pair of query blocks 2 r and 2 r + 1, r = nblk - 1 - blk, the CTA's rank's one */
  *i0 = CL > 1 ? (2 * (p.nblk - 1 - blk) + (int)(blockIdx.x & 1)) * FA3_BM : (p.nblk - 1 - blk) * FA3_BM;
  /* keys the block's rows see: [0, kend), at least key 0 (i0 < Lq, Lk >= 1) */
  const int kend = p.causal ? min(p.Lk, min(*i0 + FA3_BM, p.Lq)) : p.Lk;
  *ntiles = (kend + FA3_BN - 1) / FA3_BN;
}

/* A CTA's piece of work: item x's key tiles [j0, j1) (j1 < 0: to the
 * item's last tile; x >= p.items: no more work). */
struct fa3_seg {
  int x, j0, j1;
};

/* The work order (FlashAttention-3's dynamic scheduler): CTA c's first
 * item is c; whenever its producer starts an item it takes the next one
 * from the ticket counter (gridDim.x + atomicAdd), so a CTA that finishes
 * early takes more (the heaviest come first: longest-first scheduling).
 * The producer hands each item to the consumers through two slots (the
 * k-th item in slot k % 2), an mbarrier each to say it is full and one for
 * its 8 consumer warps to say they have read it; a ticket past the last
 * item ends the CTA (fa3_put, fa3_take). The consumers take the next item
 * at their current one's last tile, long after the producer has put it
 * there. With as many CTAs as items (NABLA_ATTENTION_SM90_PERSISTENT=0;
 * fa3_one_each) CTA c takes item c alone: no counter, no slots. The CTA
 * that ends last returns the counters to zero for the next launch (the
 * tickets and the handover: fa3_next, fa3_put, fa3_take, fa3_work_done
 * in cuda_attention_sm90.cuh, which the backward shares).
 * Clusters of two (p.cluster, not causal: every item takes as long) take
 * no tickets but a fixed order (fa3_static_seg), the same in both CTAs,
 * so that both stream the same K and V tiles in the same order
 * (fa3_load_kv). The producer computes its pieces (fa3_produce), the
 * consumers take them (fa3_fwd_take). */
__device__ fa3_seg fa3_static_seg(const fa3_params &p, int n);
template <int D, int CL> __device__ __forceinline__ fa3_seg fa3_fwd_take(const fa3_params &p, fa3_bars<D> bar, int n) {
  return CL > 1 ? fa3_static_seg(p, n) : fa3_seg{fa3_take(p, bar, n), 0, -1};
}

/* Cluster g's n-th piece of work, of G = gridDim.x / 2 clusters: first
 * p.sk_f whole rounds, item g + n G in round n; then (stream-K) the key
 * tiles of the items left, p.sk_units of them, p.kt per item, in G equal
 * ranges, cluster g's [g S / G, (g + 1) S / G), cut where items end: a
 * range may start inside an item (its tail: tiles [j0, kt)) and end inside
 * one (its head: tiles [0, j1)), whose two parts fa3_combine joins. With
 * 15.5 items per cluster at B4 H16 N4096 D128 whole items left half the
 * clusters idle for the last one's time (ncu: the SMs active 96.4% of the
 * kernel's cycles). The ranges are at least kt tiles (the host leaves
 * between G and 2G items to them), so every item is cut at most once. */
__device__ fa3_seg fa3_static_seg(const fa3_params &p, int n) {
  const int g = (int)(blockIdx.x >> 1), G = (int)(gridDim.x >> 1);
  if (n < p.sk_f) return fa3_seg{g + n * G, 0, -1}; /* x >= p.items: done */
  const int64_t S = p.sk_units, T = p.kt, a = g * S / G, b = (g + 1) * S / G, k = n - p.sk_f;
  const int64_t u = k == 0 ? a : (a / T + k) * T; /* the piece's first tile */
  if (u >= b) return fa3_seg{p.items, 0, -1};
  const int64_t xi = u / T, e = min(b, (xi + 1) * T);
  return fa3_seg{p.sk_f * G + (int)xi, (int)(u - xi * T), (int)(e - xi * T)};
}

/* TMA store of the staged box src to (d0, row, batch coordinates c) of a
 * map of rank 2 + nbk, in a bulk group; rows past the map's end are not
 * written. */
__device__ __forceinline__ void fa3_tma_store(const CUtensorMap *m, uint32_t src, int d0, int row, const int *c,
                                              int nbk) {
  const uint64_t mp = (uint64_t)m;
  if (nbk == 1)
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
                 ::"l"(mp), "r"(src), "r"(d0), "r"(row), "r"(c[0]) : "memory");
  else if (nbk == 2)
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
                 ::"l"(mp), "r"(src), "r"(d0), "r"(row), "r"(c[0]), "r"(c[1]) : "memory");
  else
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];"
                 ::"l"(mp), "r"(src), "r"(d0), "r"(row), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
}

/* Key tile j of K or V (map m; the batch coordinates c) into the tile
 * at t, completing on bar. Clusters of two: each CTA loads half of the
 * tile's rows (rank r rows [64 r, 64 r + 64), the map's box 64 rows) into
 * both CTAs, which so read each K and V tile from L2 once per pair of
 * query blocks: at B4 H16 N4096 D128 the 128-row blocks' K and V reads are
 * 4.1 GB a call, and at the power limit a kernel's clock falls with the
 * energy it spends. Both CTAs' barriers expect the whole tile. */
template <int D, int CL>
__device__ __forceinline__ void fa3_load_kv(uint32_t t, const CUtensorMap *m, uint32_t bar, const fa3_params &p,
                                            const int *c, int j) {
  const int h = CL > 1 ? 64 * (int)(blockIdx.x & 1) : 0;
#pragma unroll
  for (int x = 0; x < D / 64; x++)
    fa3_tma(t + x * FA3_BN * 128 + h * 128, m, bar, 64 * x, j * FA3_BN + h, c, p.nbk, CL > 1 ? 3 : 0);
}

/* K_j and V_j (key tile j of the item whose batch coordinates are c) into
 * the ring's stage it % ST once the consumers have freed it (with
 * clusters, both CTAs' consumers: fa3_free). */
template <int D, int CL>
__device__ __forceinline__ void fa3_produce_kv(const CUtensorMap *mk, const CUtensorMap *mv, const fa3_params &p,
                                               const int *c, int j, int it, uint32_t sk, fa3_bars<D> bar) {
  typedef fa3_cfg<D> C;
  const int s = it % C::ST;
  const uint32_t ph = (uint32_t)(it / C::ST) & 1, kt = sk + s * 2 * C::KB, vt = kt + C::KB;
  sm90_bar_wait(bar.ek(s), ph ^ 1); /* fresh barriers pass parity 1 */
  sm90_bar_expect(bar.fk(s), C::KB);
  fa3_load_kv<D, CL>(kt, mk, bar.fk(s), p, c, j);
  sm90_bar_wait(bar.ev(s), ph ^ 1);
  sm90_bar_expect(bar.fv(s), C::KB);
  fa3_load_kv<D, CL>(vt, mv, bar.fv(s), p, c, j);
}

/* Producer (one thread), for each of the CTA's pieces n (items, or with
 * clusters parts of items: fa3_static_seg): Q into Q tile n % 2
 * once the consumers have freed it (their last S of item n - 2 has
 * completed), then K_j and V_j of every tile j into the ring, whose stage
 * and phase come from the running tile count it: item n + 1's loads start
 * while the consumers finish item n. The ticket of item n + 1 (fa3_next)
 * is taken as item n starts and handed over (fa3_put) once its loads are
 * issued, so the atomic's round trip is off the loads' path and long done
 * when the consumers read it at item n's last tile. */
template <int D, int CL>
__device__ __forceinline__ void fa3_produce(const CUtensorMap *mq, const CUtensorMap *mk, const CUtensorMap *mv,
                                            const fa3_params &p, uint32_t sq, uint32_t sk, fa3_bars<D> bar) {
  typedef fa3_cfg<D> C;
  int it = 0, b, i0, ntiles;
  fa3_seg sg = CL > 1 ? fa3_static_seg(p, 0) : fa3_seg{(int)blockIdx.x, 0, -1};
  if (CL == 1) fa3_put(p, bar, 0, sg.x);
  for (int n = 0; sg.x < p.items; n++) {
    const fa3_seg nx = CL > 1 ? fa3_static_seg(p, n + 1) : fa3_seg{fa3_next(p), 0, -1};
    const int qs = n % 2;
    fa3_item<CL>(p, sg.x, &b, &i0, &ntiles);
    int c[FA3_MAXK];
    fa3_coords(p, b, c);
    sm90_bar_wait(bar.qe(qs), ((uint32_t)(n / 2) & 1) ^ 1); /* fresh barriers pass parity 1 */
    sm90_bar_expect(bar.q(qs), C::QB);                       /* the whole box counts, zero-filled rows too */
#pragma unroll
    for (int xb = 0; xb < D / 64; xb++)
      fa3_tma(sq + qs * C::QB + xb * FA3_BM * 128, mq, bar.q(qs), 64 * xb, i0, c, p.nbk);
    const int j1 = CL > 1 && sg.j1 >= 0 ? sg.j1 : ntiles; /* without clusters whole items */
    for (int j = CL > 1 ? sg.j0 : 0; j < j1; j++, it++) fa3_produce_kv<D, CL>(mk, mv, p, c, j, it, sk, bar);
    if (CL == 1) fa3_put(p, bar, n + 1, nx.x);
    sg = nx;
  }
  if (CL == 1) fa3_work_done(p);
  else asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); /* fa3_work_done without tickets */
}

/* ---- wgmma ------------------------------------------------------------- */
/* S = Q K^T for one consumer: qa its 64 rows of Q's block 0, kb K's block 0. */
template <typename T, int D>
__device__ __forceinline__ void fa3_qk(float (&s)[FA3_BN / 2], uint32_t qa, uint32_t kb) {
  const fa3_desc dq(qa, 16), dk(kb, 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint32_t x = kk / 4, off = (kk % 4) * 32;
    fa3_mma<T>::ss128(s, dq.at(x * FA3_BM * 128 + off), dk.at(x * FA3_BN * 128 + off), kk > 0);
  }
}

/* O = (acc ? O : 0) + P V: pa P's A fragments per 16 keys, vb V's block 0
 * (an item's first product overwrites O: no zeroing between items). */
template <typename T, int D>
__device__ __forceinline__ void fa3_pv(float (&o)[D / 2], const uint32_t (&pa)[FA3_BN / 16][4], uint32_t vb,
                                       uint32_t acc) {
  const fa3_desc dv(vb, FA3_BN * 128);
#pragma unroll
  for (int kk = 0; kk < FA3_BN / 16; kk++) {
    if (D == 128) fa3_mma<T>::rs128(o, pa[kk], dv.at(kk * 2048), kk > 0 || acc);
    else fa3_mma<T>::rs64(o, pa[kk], dv.at(kk * 2048), kk > 0 || acc);
  }
}

/* ---- softmax ----------------------------------------------------------- */
/* -inf where key c0 + column is at or past Lk or (causal) after the row
 * (r0: this thread's row g; its row g + 8 is r0 + 8; c0: the key of this
 * thread's first column, j0 + 2t). */
__device__ __forceinline__ void fa3_mask(float (&s)[FA3_BN / 2], int r0, int c0, int Lk, int causal) {
#pragma unroll
  for (int n = 0; n < FA3_BN / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int c = c0 + 8 * n + (e & 1), r = r0 + 8 * (e >> 1);
      if (c >= Lk || (causal && c > r)) s[4 * n + e] = -INFINITY;
    }
}

/* One tile's online softmax for this thread's rows g, g + 8 (h = 0, 1): s
 * becomes p = exp2(s sl2 - m sl2) with m the row's reference max, l is
 * rescaled and gets this thread's sums of p (the quad adds them at the
 * end), corr[h] is the factor O's row must be multiplied by. The reference
 * max moves only when the tile's max exceeds it by more than 8 in log2
 * units (FlashAttention-4's lazy rescaling): otherwise p <= 2^8, exact to
 * the input dtype's precision as before (l, O and the log-sum-exp use the
 * same m), and corr is 1, so that O's rescaling is skipped on most tiles.
 * The formulas of the mma kernel's fa_softmax otherwise. */
__device__ __forceinline__ void fa3_softmax(float (&s)[FA3_BN / 2], float *m, float *l, float *corr, float sl2) {
  static_assert(FA3_BN == 128, "the row max's tree is written for 16 column blocks");
#pragma unroll
  for (int h = 0; h < 2; h++) {
    /* the row max as a tree, 5 deep where a chain was 16: it stands
     * between S and the exponentials */
    float t[FA3_BN / 8];
#pragma unroll
    for (int n = 0; n < FA3_BN / 8; n++) t[n] = fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]);
#pragma unroll
    for (int n = 0; n < 8; n++) t[n] = fmaxf(t[n], t[n + 8]);
#pragma unroll
    for (int n = 0; n < 4; n++) t[n] = fmaxf(t[n], t[n + 4]);
#pragma unroll
    for (int n = 0; n < 2; n++) t[n] = fmaxf(t[n], t[n + 2]);
    float mx = fmaxf(t[0], t[1]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    corr[h] = 1.0f;
    if (mx * sl2 > m[h] * sl2 + 8.0f) {             /* never for a row without keys yet (mx = -inf) */
      corr[h] = nb_mma_exp2(m[h] * sl2 - mx * sl2); /* 0 on the row's first keys */
      m[h] = mx;
    }
    const float ms = m[h] == -INFINITY ? 0.0f : m[h] * sl2; /* a row with no key yet */
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < FA3_BN / 8; n++) {
      s[4 * n + 2 * h] = nb_mma_exp2(fmaf(s[4 * n + 2 * h], sl2, -ms));
      s[4 * n + 2 * h + 1] = nb_mma_exp2(fmaf(s[4 * n + 2 * h + 1], sl2, -ms));
      sum += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
    }
    l[h] = l[h] * corr[h] + sum;
  }
}

template <int D> __device__ __forceinline__ void fa3_rescale(float (&o)[D / 2], const float *corr) {
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    o[4 * n] *= corr[0], o[4 * n + 1] *= corr[0];
    o[4 * n + 2] *= corr[1], o[4 * n + 3] *= corr[1];
  }
}

/* ---- consumer ---------------------------------------------------------- */
/* Tile j's mask (only when it reaches past Lk or, causal, past the warp's
 * first row rw) and online softmax. */
__device__ __forceinline__ void fa3_tile(float (&s)[FA3_BN / 2], const fa3_params &p, int j, int rw, int r0, int t,
                                         float *m, float *l, float *corr) {
  const int j0 = j * FA3_BN;
  if (j0 + FA3_BN > p.Lk || (p.causal && j0 + FA3_BN - 1 > rw)) /* warp-uniform */
    fa3_mask(s, r0, j0 + 2 * t, p.Lk, p.causal);
  fa3_softmax(s, m, l, corr, p.sl2);
}

/* o = O / l (rows r0, r0 + 8 of the batch index b, those before Lq) and
 * lse = m scale + log(l), -inf for a row without keys: as the mma kernel.
 * tma (p.tma_o, but not for an item joined from two parts: fa3_finish):
 * the warpgroup's 64 rows of o go, rounded, into its 64 rows oa
 * of o's staging tile (laid out as Q's: 128-byte swizzle, row r's 16-byte
 * unit u at u ^ (r % 8), so a warp's 8 rows hit distinct banks) once the
 * warpgroup's previous store has read them, and one thread stores them by
 * TMA (rows past Lq are not written) while the warpgroup goes on (this
 * runs in the next item's first tile, after its softmax: fa3_finish);
 * else each thread stores its pairs. The same values either
 * way. */
template <typename T, int D>
__device__ __forceinline__ void fa3_store(const fa3_params &p, const CUtensorMap *mo, int b, int i0, int wg,
                                          uint32_t oa, int r0, const float (&o)[D / 2], const float *m, float *l,
                                          int tma) {
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, t = lane % 4;
  const int64_t lrow = (int64_t)b * p.Lq; /* lse is (B, Lq) */
  int c[FA3_MAXK];
  fa3_coords(p, b, c);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = r0 + 8 * h;
    inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    if (r < p.Lq && t == 0) p.lse[lrow + r] = l[h] > 0.0f ? m[h] * p.scale + logf(l[h]) : -INFINITY;
  }
  if (tma) {
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(FA3_EPI_BAR + wg) : "memory"); /* the staging tile is free */
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t row = oa + (uint32_t)(16 * w + lane / 4 + 8 * h) * 128 + 4 * t; /* row % 8 == lane / 4 */
#pragma unroll
      for (int n = 0; n < D / 8; n++) {
        const uint32_t a = row + (n / 8) * FA3_BM * 128 + (((n % 8) ^ (lane / 4)) << 4);
        const uint32_t v = nb_mma<T>::pack(o[4 * n + 2 * h] * inv[h], o[4 * n + 2 * h + 1] * inv[h]);
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the copy engine reads them next */
    asm volatile("bar.sync %0, 128;" ::"r"(FA3_EPI_BAR + wg) : "memory");
    if (threadIdx.x % 128 == 0 && i0 + 64 * wg < p.Lq) {
#pragma unroll
      for (int x = 0; x < D / 64; x++) fa3_tma_store(mo, oa + x * FA3_BM * 128, 64 * x, i0 + 64 * wg, c, p.nbk);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    return;
  }
  int64_t off = 0;
#pragma unroll
  for (int i = 0; i < FA3_MAXK; i++)
    if (i < p.nbk) off += (int64_t)c[i] * p.o_bs[i];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = r0 + 8 * h;
    if (r >= p.Lq) continue;
    T *row = (T *)(p.o + off + (int64_t)r * p.o_rs) + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *(uint32_t *)(row + 8 * n) = nb_mma<T>::pack(o[4 * n + 2 * h] * inv[h], o[4 * n + 2 * h + 1] * inv[h]);
  }
}

/* The consumers' turns (p.pingpong, FA3's warp scheduler barriers): a
 * warpgroup waits at its own named barrier (256 threads: its 128 and the
 * other warpgroup's arrival) before issuing a tile's GEMMs and arrives at
 * the other's after issuing them, so one warpgroup's softmax runs while
 * the other's products are on the tensor cores. The turns run on across
 * the CTA's items. Warpgroup 1 hands warpgroup 0 the first turn and skips
 * its arrival after its last turn of the last item: both take as many
 * turns as the items have tiles, every barrier sees as many arrivals as
 * waits. The last item's last P V product, issued after the loop over
 * the items, takes no turn. */
__device__ __forceinline__ void fa3_turn_wait(int on, int wg) {
  if (on) asm volatile("bar.sync %0, 256;" ::"r"(FA3_SCHED_BAR + wg) : "memory");
}
__device__ __forceinline__ void fa3_turn_pass(int on, int wg) {
  if (on) asm volatile("bar.arrive %0, 256;" ::"r"(FA3_SCHED_BAR + (wg ^ 1)) : "memory");
}

/* A compile-time flag for a generic lambda's two copies. */
template <bool B> struct fa3_flag {
  static constexpr bool value = B;
};

/* What a consumer carries from one item to the next: the item's O and
 * its last tile's P (the last P V product is issued with the next item's
 * first S, so the tensor cores do not wait for the store and the next
 * item's first softmax), its row max and sum, and where it goes. */
template <int D> struct fa3_carry {
  float o[D / 2], m[2], l[2];
  uint32_t pa[FA3_BN / 16][4];
  int pend;   /* an item's last P V product is still to be issued */
  int acc;    /* it adds to O (the item had more than one tile) */
  int b, i0;  /* that item's batch index and first row */
  int it;     /* the ring tile of its last V */
  int part;   /* 0: the whole item; 1, 2: its head or tail part (fa3_combine) */
};

/* The two parts of an item cut between clusters g - 1 (its head, tiles
 * [0, j)) and g (its tail, [j, kt): fa3_static_seg), for this consumer
 * warp's rows: each part stores its o, m and l (every thread its own
 * registers, unnormalised, f32) in its half of the slot of the tail's CTA
 * and warp, then counts itself in that slot's word of the work counters
 * (nb_cuda_work_counters: zero between kernels); the second to count
 * reads the other's, joins them into c (the max of the two reference
 * maxima, each part scaled to it, the head's term first: the same bits
 * whichever comes second), returns the word to zero and 1: it stores the
 * rows. 0: the other part will. */
template <int D> __device__ __forceinline__ int fa3_combine(const fa3_params &p, fa3_carry<D> &c) {
  constexpr int W = D / 2 + 4; /* floats per thread: o, m, l */
  const int lane = threadIdx.x % 32, cw = (int)threadIdx.x / 32 - 4; /* the consumer warp, 0..7 */
  const int slot = ((int)blockIdx.x + (c.part == 1 ? 2 : 0)) * 8 + cw, role = c.part - 1;
  float *const base = p.part + (size_t)slot * 2 * W * 32 + lane;
  float *mine = base + role * W * 32, *other = base + (role ^ 1) * W * 32;
#pragma unroll
  for (int i = 0; i < D / 2; i++) __stcg(mine + 32 * i, c.o[i]);
#pragma unroll
  for (int h = 0; h < 2; h++) __stcg(mine + 32 * (D / 2 + h), c.m[h]), __stcg(mine + 32 * (D / 2 + 2 + h), c.l[h]);
  /* release: the warp's stores, then lane 0's fence and count; acquire:
   * lane 0's count, its fence, then the warp's loads */
  __syncwarp();
  unsigned *word = p.work + NB_CUDA_WORK_SPLIT + slot, first = 0;
  if (lane == 0) {
    __threadfence();
    first = atomicAdd(word, 1u) == 0;
    if (!first) {
      __threadfence();
      *word = 0; /* both parts have come: zero for the next kernel */
    }
  }
  if (__shfl_sync(0xffffffffu, first, 0)) return 0;
  __syncwarp();
  float a[2][2]; /* [h][role]: each part's scale to the joint maximum */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const float mo = __ldcg(other + 32 * (D / 2 + h)), lo = __ldcg(other + 32 * (D / 2 + 2 + h));
    const float mh = role ? mo : c.m[h], mt = role ? c.m[h] : mo, lh = role ? lo : c.l[h], lt = role ? c.l[h] : lo;
    const float mx = fmaxf(mh, mt);
    a[h][0] = mh == -INFINITY ? 0.0f : nb_mma_exp2(mh * p.sl2 - mx * p.sl2);
    a[h][1] = mt == -INFINITY ? 0.0f : nb_mma_exp2(mt * p.sl2 - mx * p.sl2);
    c.m[h] = mx;
    c.l[h] = fmaf(a[h][0], lh, a[h][1] * lt);
  }
#pragma unroll
  for (int i = 0; i < D / 2; i++) { /* o[i] is row g + 8 ((i / 2) % 2) */
    const int h = (i / 2) % 2;
    const float oo = __ldcg(other + 32 * i), oh = role ? oo : c.o[i], ot = role ? c.o[i] : oo;
    c.o[i] = fmaf(a[h][0], oh, a[h][1] * ot);
  }
  return 1;
}

/* A consumer warp (lane 0) frees the K or V stage whose empty barrier is
 * bar: in this CTA and, with clusters, in the other one, whose producer
 * writes into this CTA's stage too (fa3_load_kv); each empty barrier then
 * counts both CTAs' 8 consumer warps. */
template <int CL> __device__ __forceinline__ void fa3_free(const fa3_params &p, uint32_t bar) {
  sm90_bar_arrive(bar);
  if (CL > 1) sm90_bar_arrive_remote(sm90_mapa(bar, (blockIdx.x & 1) ^ 1));
}

/* The pending item's last O += P V: issued (V's stage awaited) ... */
template <typename T, int D>
__device__ __forceinline__ void fa3_last_pv(fa3_carry<D> &c, uint32_t sk, fa3_bars<D> bar) {
  typedef fa3_cfg<D> C;
  const int sl = c.it % C::ST;
  sm90_bar_wait(bar.fv(sl), (uint32_t)(c.it / C::ST) & 1);
  fa3_wg_fence();
  fa3_pv<T, D>(c.o, c.pa, sk + sl * 2 * C::KB + C::KB, c.acc);
  fa3_commit();
}
/* ... and, once complete (the caller waits), V's stage freed and o and lse
 * stored. */
template <typename T, int D, int CL>
__device__ __forceinline__ void fa3_finish(const fa3_params &p, const CUtensorMap *mo, fa3_carry<D> &c, int wg,
                                           uint32_t so, fa3_bars<D> bar) {
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4;
  fa3_fence(c.o);
  fa3_fence(c.pa);
  if (lane == 0) fa3_free<CL>(p, bar.ev(c.it % fa3_cfg<D>::ST));
  c.pend = 0;
  if (CL > 1 && c.part && !fa3_combine<D>(p, c)) return; /* the item's other part stores it */
  /* a joined item's rows by each thread's stores: its warps store or not each on their own */
  fa3_store<T, D>(p, mo, c.b, c.i0, wg, so + wg * 64 * 128, c.i0 + 64 * wg + 16 * w + lane / 4, c.o, c.m, c.l,
                  p.tma_o && !c.part);
}

/* Consumer warpgroup wg (0, 1) on piece n of the CTA (*nx: the next one,
 * taken at this one's last tile): rows [i0 + 64 wg, + 64) over the ntiles
 * key tiles from tile jb on (part: the whole item, 0, or its head or tail
 * part, fa3_combine), which are the ring's tiles it0 .. it0 + ntiles - 1, with
 * the overlap described at the top; sq: the Q tiles, so: o's staging
 * tile. Tile 0's S goes with the previous item's last P V product (c),
 * whose store follows tile 0's softmax; this item's last P V product is
 * left in c for the next item (or the kernel's end). */
template <typename T, int D, int CL>
__device__ __forceinline__ void fa3_consume(const fa3_params &p, const CUtensorMap *mo, int b, int i0, int jb,
                                            int ntiles, int part, int it0, int n, fa3_seg *nx, int wg, uint32_t sq,
                                            uint32_t sk,
                                            uint32_t so, fa3_bars<D> bar, fa3_carry<D> &c) {
  typedef fa3_cfg<D> C;
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, t = lane % 4;
  const int rw = i0 + 64 * wg + 16 * w, r0 = rw + lane / 4; /* the warp's first row; this thread's row g */
  const int qs = n % 2;
  const uint32_t qa = sq + qs * C::QB + wg * 64 * 128;
  float s[FA3_BN / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
  float(&o)[D / 2] = c.o;
  uint32_t(&pa)[FA3_BN / 16][4] = c.pa;
#pragma unroll
  for (int i = 0; i < FA3_BN / 2; i++) s[i] = 0.0f;
  const int pp = p.pingpong;
  /* tile 0: S_0 (with the previous item's last P V), its softmax, P_0;
   * two copies of its rest (first), so that each has its wgmma waits in
   * straight-line code (ptxas serialises wgmma it cannot follow through a
   * branch) */
  sm90_bar_wait(bar.q(qs), (uint32_t)(n / 2) & 1);
  sm90_bar_wait(bar.fk(it0 % C::ST), (uint32_t)(it0 / C::ST) & 1);
  fa3_turn_wait(pp, wg);
  fa3_fence(s);
  fa3_fence(o);
  fa3_fence(pa);
  fa3_wg_fence();
  fa3_qk<T, D>(s, qa, sk + (it0 % C::ST) * 2 * C::KB);
  fa3_commit();
  auto first = [&](auto pend) { /* pend: fa3_flag<c.pend> */
    if (pend.value) fa3_last_pv<T, D>(c, sk, bar);
    if (ntiles == 1) *nx = fa3_fwd_take<D, CL>(p, bar, n + 1); /* the next item (fa3_next) */
    if (wg == 0 || ntiles > 1 || nx->x < p.items) fa3_turn_pass(pp, wg);
    if (pend.value) fa3_wait<1>();
    else fa3_wait<0>();
    fa3_fence(s);
    if (lane == 0) {
      fa3_free<CL>(p, bar.ek(it0 % C::ST));
      if (ntiles == 1) sm90_bar_arrive(bar.qe(qs)); /* the item's last read of Q has completed */
    }
    fa3_tile(s, p, jb, rw, r0, t, m, l, corr);
    if (pend.value) {
      fa3_wait<0>();
      fa3_finish<T, D, CL>(p, mo, c, wg, so, bar);
    }
  };
  if (c.pend) first(fa3_flag<true>());
  else first(fa3_flag<false>());
  fa3_pack<T>(pa, s);
  for (int j = 1; j < ntiles; j++) {
    const int sj = (it0 + j) % C::ST, sp = (it0 + j - 1) % C::ST;
    sm90_bar_wait(bar.fk(sj), (uint32_t)((it0 + j) / C::ST) & 1);
    fa3_turn_wait(pp, wg);
    fa3_fence(s);
    fa3_fence(o);
    fa3_fence(pa);
    fa3_wg_fence();
    fa3_qk<T, D>(s, qa, sk + sj * 2 * C::KB); /* S_j = Q K_j^T */
    fa3_commit();
    sm90_bar_wait(bar.fv(sp), (uint32_t)((it0 + j - 1) / C::ST) & 1);
    fa3_wg_fence();
    fa3_pv<T, D>(o, pa, sk + sp * 2 * C::KB + C::KB, j > 1); /* O += P_{j-1} V_{j-1} */
    fa3_commit();
    if (j == ntiles - 1) *nx = fa3_fwd_take<D, CL>(p, bar, n + 1);
    if (wg == 0 || j < ntiles - 1 || nx->x < p.items) fa3_turn_pass(pp, wg);
    fa3_wait<1>(); /* S_j complete; the P V product may still run */
    fa3_fence(s);
    if (lane == 0) {
      fa3_free<CL>(p, bar.ek(sj));
      if (j == ntiles - 1) sm90_bar_arrive(bar.qe(qs));
    }
    fa3_tile(s, p, jb + j, rw, r0, t, m, l, corr);
    fa3_wait<0>();
    fa3_fence(o);
    fa3_fence(pa);
    if (lane == 0) fa3_free<CL>(p, bar.ev(sp));
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) fa3_rescale<D>(o, corr);
    fa3_pack<T>(pa, s);
  }
  c.pend = 1;
  c.acc = ntiles > 1;
  c.b = b;
  c.i0 = i0;
  c.it = it0 + ntiles - 1;
  c.part = part;
#pragma unroll
  for (int h = 0; h < 2; h++) c.m[h] = m[h], c.l[h] = l[h];
}
#endif /* NB_SM90A_DEVICE */

// q (B, Lq, D), k, v (B, Lk, D) -> o (B, Lq, D), lse (B, Lq) f32
template <typename T, int D, int CL>
__global__ void __launch_bounds__(FA3_THREADS, 1)
    fa3_fwd_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                   const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mo,
                   const __grid_constant__ fa3_params p) {
#ifdef NB_SM90A_DEVICE
  typedef fa3_cfg<D> C;
  extern __shared__ uint8_t fa3_raw[];
  /* the 128-byte swizzle repeats every 1024 bytes: align the tiles to it */
  const uint32_t sq = (sm90_smem(fa3_raw) + 1023) & ~1023u, sk = sq + 2 * C::QB, so = sk + 2 * C::ST * C::KB;
  const fa3_bars<D> bar = {so + C::QB};
  if (threadIdx.x == 0) {
    for (int i = 0; i < C::NBAR; i++) { /* full: the producer; empty: the consumer warps (K, V: of the cluster) */
      const int full = i < 1 + 2 * C::ST || (i >= 2 + 4 * C::ST && i < 4 + 4 * C::ST) || i == 6 + 4 * C::ST;
      sm90_bar_init(bar.base + 8 * i, full ? 1 : i < 1 + 4 * C::ST ? 8 * CL : 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  /* the other CTA's barriers must exist before its copies and arrivals land in them */
  if (CL > 1) sm90_cluster_sync();
  fa3_grid_wait();
  if (threadIdx.x < 128) {
    /* the clustered kernel: 24 spilled a register (its multicast loads and
     * the cluster barrier at the end) */
    if (CL > 1) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (threadIdx.x == 0) fa3_produce<D, CL>(&mq, &mk, &mv, p, sq, sk, bar);
  } else {
    if (CL > 1) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    /* the warpgroup by a shuffle from lane 0, which ptxas knows is the same
     * in the whole warp, so that what depends on it (Q's wgmma descriptors)
     * lives in uniform registers: no per-wgmma moves into them */
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1;
    if (wg == 1) fa3_turn_pass(p.pingpong, 1); /* warpgroup 0 goes first */
    int it = 0; /* the ring's tiles consumed so far */
    fa3_seg sg = fa3_fwd_take<D, CL>(p, bar, 0);
    fa3_carry<D> c;
    c.pend = 0;
    c.part = 0;
    /* defined values for the first tile's register fences (every item's
     * first P V product overwrites O) */
#pragma unroll
    for (int i = 0; i < D / 2; i++) c.o[i] = 0.0f;
    for (int n = 0; sg.x < p.items; n++) {
      fa3_seg nx;
      int b, i0, ntiles;
      fa3_item<CL>(p, sg.x, &b, &i0, &ntiles);
      const int j1 = sg.j1 < 0 ? ntiles : sg.j1, part = sg.j0 > 0 ? 2 : j1 < ntiles ? 1 : 0;
      fa3_consume<T, D, CL>(p, &mo, b, i0, sg.j0, j1 - sg.j0, part, it, n, &nx, wg, sq, sk, so, bar, c);
      it += j1 - sg.j0;
      sg = nx;
    }
    if (c.pend) { /* the last item's last P V product and store */
      fa3_fence(c.o);
      fa3_fence(c.pa);
      fa3_last_pv<T, D>(c, sk, bar);
      fa3_wait<0>();
      fa3_finish<T, D, CL>(p, &mo, c, wg, so, bar);
    }
    /* the staging tile must stay until the last store has read it */
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
  /* a CTA leaves only after the other one's last arrivals on its barriers
   * (without clusters the producer's warps just end: waiting here held
   * their registers, and at 24 the producer spilled one) */
  if (CL > 1) {
    __syncwarp();
    sm90_cluster_sync();
  }
#else
  (void)mq; (void)mk; (void)mv; (void)mo; (void)p;
#endif
}

/* ---- host -------------------------------------------------------------- */
/* o as the kernel writes it: the dtype, D columns of unit stride, even
 * strides (4-byte pair stores), 4-byte aligned data. */
int fa3_out_ok(const nb_kview *o, nb_dtype dt, int64_t D) {
  const int nd = o->ndim;
  if (o->dtype != dt || o->shape[nd - 1] != D || o->strides[nd - 1] != 1 || ((uintptr_t)o->data & 3)) return 0;
  for (int d = 0; d < nd - 1; d++)
    if (o->shape[d] > 1 && o->strides[d] % 2) return 0;
  return 1;
}

int64_t fa3_launches, fa3_cut_launches;

/* Clusters: the stream-K tail (fa3_static_seg) of a grid of G clusters,
 * and the scratch of its partial sums (*part, *bytes; fa3_combine), when
 * whole rounds would leave clusters idle at the end, G < items, an item
 * has 2 key tiles or more and NABLA_ATTENTION_SM90_STREAMK is not "0"
 * (then some items are cut: their G to 2G - 1 are not a multiple of G);
 * else whole items in turn. */
template <int D> static void fa3_plan_tail(const nb_cuda_ctx *ctx, fa3_params &p, int G, size_t *bytes) {
  p.sk_f = p.items;
  p.sk_units = 0;
  p.part = NULL;
  *bytes = 0;
  if (G >= p.items || p.items % G == 0 || p.kt < 2 || 16 * G > NB_CUDA_WORK_SPLITS ||
      !fa3_switch("NABLA_ATTENTION_SM90_STREAMK"))
    return; /* whole rounds fill the clusters, or an item is a tile (no cuts) */
  const size_t need = (size_t)2 * G * 8 * 2 * (D / 2 + 4) * 32 * sizeof(float); /* per CTA and warp, both parts */
  if (!(p.part = (float *)nb_cuda_scratch(ctx, need))) return;
  *bytes = need;
  p.sk_f = p.items / G - 1; /* the last G to 2G - 1 items are cut into ranges of at least kt tiles */
  p.sk_units = (int64_t)(p.items - p.sk_f * G) * p.kt;
}

template <typename T, int D>
nb_status fa3_launch(const nb_cuda_ctx *ctx, const CUtensorMap *m, fa3_params p) {
  /* the kernel for p's cluster size: with clusters of two it carries the
   * multicast loads, the stream-K tail and their registers; without, none */
  auto kern = p.cluster > 1 ? fa3_fwd_kernel<T, D, 2> : fa3_fwd_kernel<T, D, 1>;
  const size_t smem = fa3_cfg<D>::SMEM;
  NB_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "attention (sm90): shared memory attribute");
  /* persistent: one CTA per SM takes items from the ticket counter
   * (fa3_next), or with clusters as many clusters as fit at once take
   * theirs in turn (fa3_static_seg); NABLA_ATTENTION_SM90_PERSISTENT=0 launches
   * a CTA (a cluster) per item */
  const int persistent = fa3_switch("NABLA_ATTENTION_SM90_PERSISTENT");
  int grid = persistent && ctx->n_sm < p.items && ctx->n_sm <= NB_CUDA_WORK_CTAS ? ctx->n_sm : p.items;
  size_t part_bytes = 0;
  if (p.cluster > 1) {
    fa3_launch_cfg l((unsigned)(2 * p.items), FA3_THREADS, smem, 2, ctx);
    const int most = nb_sm90_max_clusters(ctx, (const void *)kern, &l.cfg);
    grid = 2 * (persistent && most < p.items ? most : p.items);
    fa3_plan_tail<D>(ctx, p, grid / 2, &part_bytes);
  }
  fa3_launch_cfg l((unsigned)grid, FA3_THREADS, smem, (unsigned)p.cluster, ctx);
  const cudaError_t e = cudaLaunchKernelEx(&l.cfg, kern, m[0], m[1], m[2], m[3], p);
  if (part_bytes) nb_cuda_scratch_free(ctx, p.part, part_bytes); /* stream-ordered: after the kernel */
  NB_CUDA_TRY(e, "attention (sm90): launch");
  __atomic_add_fetch(&fa3_launches, 1, __ATOMIC_RELAXED);
  if (part_bytes) __atomic_add_fetch(&fa3_cut_launches, 1, __ATOMIC_RELAXED);
  return nb_cuda_launch_check("attention (sm90)");
}

template <typename T, int D> int fa3_ready(void) {
  static int cache = 0;
  return fa3_binary_ok(fa3_fwd_kernel<T, D, 1>, &cache);
}

} /* namespace */

/* The map of a (.., L, D) view (cuda_attention_sm90.cuh), for the forward
 * and the backward. */
int nb_fa3_map(CUtensorMap *m, const nb_kview *v, int64_t L, int64_t D, const int *axes, int nbk, int rows) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = nb_sm90_encode_fn();
  const int nd = v->ndim;
  if (!enc || !v->data || ((uintptr_t)v->data & 15) || v->strides[nd - 1] != 1) return 0;
  cuuint64_t dims[5] = {(cuuint64_t)D, (cuuint64_t)L, 1, 1, 1}, strides[4];
  cuuint32_t box[5] = {64, (cuuint32_t)rows, 1, 1, 1};
  int64_t st[4] = {v->strides[nd - 2] * 2, 0, 0, 0};
  for (int i = 0; i < nbk; i++) {
    dims[2 + i] = axes[i] < 0 ? 1 : (cuuint64_t)v->shape[axes[i]];
    st[1 + i] = axes[i] < 0 ? st[0] * (L > 0 ? L : 1) : v->strides[axes[i]] * 2;
  }
  for (int i = 0; i < 1 + nbk; i++) {
    if (st[i] <= 0 || st[i] % 16 || st[i] >= ((int64_t)1 << 40)) return 0;
    strides[i] = (cuuint64_t)st[i];
  }
  if (L < 1 || L >= ((int64_t)1 << 31)) return 0;
  return nb_sm90_encode(enc, m,
                        v->dtype == NB_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                        (cuuint32_t)(2 + nbk), v->data, dims, strides, box);
}

int nb_fa3_section(const nb_cuda_ctx *ctx, int64_t B, int64_t per_b) {
  int64_t hg = per_b > 0 ? ctx->l2_bytes / 8 / per_b : B;
  const char *e = getenv("NABLA_ATTENTION_SM90_SECTION");
  if (e && atoi(e) > 0) hg = atoi(e);
  return (int)(hg < 1 ? 1 : hg > B ? B : hg);
}

int nb_fa3_tail(const nb_cuda_ctx *ctx, int B, int nblk, int hg, int causal) {
  const int hl = B - (B - 1) / hg * hg;
  const char *e = getenv("NABLA_ATTENTION_SM90_TAIL");
  const double f = e ? atof(e) : 2.0;
  if (!causal || !(f > 0.0) || ctx->n_sm < 1) return hl;
  const double need = ceil(f * 2.0 * ctx->n_sm / (nblk + 1.0));
  if (need <= hl) return hl;
  return need >= B ? B : B - (B - (int)need) / hg * hg;
}

int64_t nb_cuda_attn_sm90_launches(int device) {
  return nb_sm90_device_ok(device) ? __atomic_load_n(&fa3_launches, __ATOMIC_RELAXED) : -1;
}

int64_t nb_cuda_attn_sm90_cut_launches(int device) {
  return nb_sm90_device_ok(device) ? __atomic_load_n(&fa3_cut_launches, __ATOMIC_RELAXED) : -1;
}

int nb_cuda_attn_sm90_fwd(const nb_cuda_ctx *ctx, const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                          const nb_kview *k, const nb_kview *v, double scale, int causal, nb_status *st) {
  const char *env = getenv("NABLA_ATTENTION_SM90");
  if (env && !strcmp(env, "0")) return 0;
  const int nd = q->ndim, nb = nd - 2;
  const nb_dtype dt = q->dtype;
  if (nd < 2 || (dt != NB_BF16 && dt != NB_F16) || !nb_sm90_device_ok(ctx->dev)) return 0;
  const int64_t D = q->shape[nd - 1], Lq = q->shape[nd - 2], Lk = k->shape[nd - 2];
  if ((D != 64 && D != 128) || k->shape[nd - 1] != D || v->shape[nd - 1] != D || v->shape[nd - 2] != Lk) return 0;
  if (k->dtype != dt || v->dtype != dt || lse->dtype != NB_F32 || !fa3_out_ok(o, dt, D)) return 0;
  if (k->ndim != nd || v->ndim != nd || o->ndim != nd || o->shape[nd - 2] != Lq) return 0;
  for (int d = 0; d < nb; d++) /* one batch shape (no grouped heads, no broadcasting) */
    if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d] || o->shape[d] != q->shape[d]) return 0;
  if (Lq < 1 || Lk < 1 || Lq > INT32_MAX / 2 || Lk > INT32_MAX / 2) return 0;
  if (!(D == 64 ? (dt == NB_BF16 ? fa3_ready<__nv_bfloat16, 64>() : fa3_ready<__half, 64>())
                : (dt == NB_BF16 ? fa3_ready<__nv_bfloat16, 128>() : fa3_ready<__half, 128>())))
    return 0;
  /* the batch axes of size > 1, innermost first (q, k, v, o share them) */
  fa3_params p;
  memset(&p, 0, sizeof p);
  int axes[FA3_MAXK], nbk = 0;
  int64_t B = 1;
  for (int d = nb - 1; d >= 0; d--) {
    B *= q->shape[d];
    if (q->shape[d] == 1) continue;
    if (nbk == FA3_MAXK) return 0;
    axes[nbk] = d;
    p.bdim[nbk] = nb_fastdiv_make((uint32_t)(q->shape[d] < INT32_MAX ? q->shape[d] : INT32_MAX)); /* B checked below */
    p.o_bs[nbk] = o->strides[d];
    nbk++;
  }
  if (!nbk) { /* one batch index: a size-1 stand-in axis */
    axes[0] = -1;
    p.bdim[0] = nb_fastdiv_make(1);
    nbk = 1;
  }
  const int64_t nblk = (Lq + FA3_BM - 1) / FA3_BM;
  /* items, and the tickets past them (gridDim.x + the counter: fa3_next), fit in an int */
  if (B < 1 || B > INT32_MAX || B * nblk > INT32_MAX - NB_CUDA_WORK_CTAS) return 0;
  /* clusters of two CTAs on query blocks 2i, 2i + 1 share K and V
   * (fa3_load_kv) when not causal (the pair's blocks take as long) and
   * the blocks pair up (an odd count's last pair has a block past Lq,
   * computed on zero rows and not stored: for 9 or more blocks at most a
   * ninth more work); NABLA_ATTENTION_SM90_CLUSTER=0: none */
  p.cluster = !causal && (nblk % 2 == 0 || nblk > 8) && B * nblk <= INT32_MAX / 2 && /* 2 items CTAs */
                      fa3_switch("NABLA_ATTENTION_SM90_CLUSTER")
                  ? 2
                  : 1;
  p.kt = (int)((Lk + FA3_BN - 1) / FA3_BN); /* not causal: every block's key tiles */
  CUtensorMap maps[4];
  const int kv_rows = FA3_BN / p.cluster;
  if (!nb_fa3_map(&maps[0], q, Lq, D, axes, nbk, FA3_BM) || !nb_fa3_map(&maps[1], k, Lk, D, axes, nbk, kv_rows) ||
      !nb_fa3_map(&maps[2], v, Lk, D, axes, nbk, kv_rows))
    return 0;
  /* o by TMA (boxes of a warpgroup's 64 rows) when its view allows; else
   * (or NABLA_ATTENTION_SM90_TMA_STORE=0) each thread's pair stores */
  memset(&maps[3], 0, sizeof maps[3]);
  p.tma_o = fa3_switch("NABLA_ATTENTION_SM90_TMA_STORE") && nb_fa3_map(&maps[3], o, Lq, D, axes, nbk, 64);
  p.pingpong = fa3_switch("NABLA_ATTENTION_SM90_PINGPONG");
  p.o = (uint16_t *)o->data;
  p.o_rs = o->strides[nd - 2];
  p.lse = (float *)lse->data;
  p.nbk = nbk;
  p.B = (int)B;
  p.Lq = (int)Lq;
  p.Lk = (int)Lk;
  /* K and V of a batch index; with clusters an item is a pair of blocks */
  fa3_set_order(p, ctx, (int)(nblk + p.cluster - 1) / p.cluster, 4 * Lk * D, causal);
  p.work = nb_cuda_work_counters(ctx);
  p.scale = (float)scale;
  p.sl2 = (float)(scale * 1.4426950408889634);
  p.causal = causal;
  if (D == 64)
    *st = dt == NB_BF16 ? fa3_launch<__nv_bfloat16, 64>(ctx, maps, p) : fa3_launch<__half, 64>(ctx, maps, p);
  else
    *st = dt == NB_BF16 ? fa3_launch<__nv_bfloat16, 128>(ctx, maps, p) : fa3_launch<__half, 128>(ctx, maps, p);
  return 1;
}
