/* The flash attention backward for Hopper (sm_90a): FlashAttention-3's
 * structure on TMA and wgmma. bf16 and f16 with f32 accumulation, head
 * dimensions 64 and 128 (D == Dv), any Lq and Lk, causal (key j for query i
 * when j <= i, aligned top-left, as every other kernel). It reads what the
 * forwards write (o, and the f32 lse = m scale + log(l), (B, Lq)
 * contiguous) and writes dq, dk, dv (strided views) as the mma.sync
 * backward (cuda_attention_mma.cu) does: dS = P (dP - delta), dV = P^T dO,
 * dK = scale dS^T Q, dQ = scale dS K, with P = exp(scale S - lse) recomputed.
 * Five tile products per (key block, query tile) pair (FlashAttention-3's
 * count; recomputing S and dP for dQ in a kernel of its own took seven):
 *   1. the pre-pass (a warp per row): delta = rowsum(dO o) as the mma
 *      backward computes it, and lse log2(e) (+inf for lse = -inf: p = 0)
 *      into a scratch of two (B, Lp) f32 arrays, Lp = Lq rounded up to 128,
 *      the rows past Lq +inf and 0 (p = 0, dS = 0 there); it also clears
 *      the dQ order counters and, atomic mode, the f32 dQ accumulator.
 *   2. dK, dV and the dQ parts: a CTA of 384 threads per (128 keys, batch
 *      index), the heaviest key blocks (causal: the first) first: block
 *      kb of batch index b is CTA kb B + b. Warpgroup 0, the producer
 *      (setmaxnreg 24): one thread loads K and V (128 x D) once, then for
 *      every 64-query tile that sees the block (causal: from the block's
 *      first key on), the last tile first, Q and dO (64 x D) into stage it
 *      % 2 of a ring (full mbarrier per stage, completed by the copy
 *      engine's bytes; empty mbarrier, one arrival per consumer warp once
 *      its wgmma reading the stage have completed). Warpgroups 1 and 2, the
 *      consumers (setmaxnreg 240): keys [64 c, 64 c + 64) of the block
 *      each, computing the transposed products so that P and dS stay in
 *      registers: S^T = K Q^T and dP^T = V dO^T (m64n64k16, both operands
 *      from shared memory, K-major), P^T = exp2(S^T sl2 - lse2[query])
 *      (zero for a query before the key when causal and for keys past Lk,
 *      only on tiles that reach the diagonal or the end; queries past Lq
 *      have lse2 = +inf), dV += P^T dO with P^T rounded to the input dtype
 *      as wgmma's register A operand (dO as B, MN-major, transpose bit),
 *      dS^T = P^T (dP^T - delta[query]), dK += dS^T Q the same way. S^T and
 *      dP^T are two commit groups: P^T is computed while dP^T is on the
 *      tensor cores, dS^T while dV's product is. dS^T, rounded, also goes
 *      to shared memory (buffer it % 2: 128 keys x 64 queries), and after
 *      a named barrier of both consumers the tile's dQ part = dS K (64
 *      queries x 64 columns over the block's 128 keys, m64n64k16, A = dS^T
 *      and B = K both MN-major) is computed: D 128: consumer c columns [64
 *      c, 64 c + 64); D 64: consumer it % 2 all 64. A buffer is rewritten
 *      two tiles later, after both consumers have passed the barrier of
 *      the tile between, so after the product that read it has completed.
 *      The part goes to an f32 accumulator of 64 x 64 tiles (B, Lp / 64,
 *      D / 64), each in fragment order (float4 j of consumer thread x at
 *      128 j + x: 16-byte accesses, contiguous across the warpgroup):
 *       - deterministic (the default): the key blocks add to a part in
 *         ascending kb. The warpgroup's thread 0 spins (ld.acquire.gpu) on
 *         the part's counter until it equals kb, the warpgroup adds the
 *         accumulator (kb > 0) to its part, stores the sum (st.cg,
 *         threadfence, st.release.gpu counter = kb + 1), or, for the last
 *         block of the part, writes scale * sum to dq in the output dtype.
 *         No deadlock: block kb waits only on block kb - 1 of the same
 *         batch index, CTA (kb - 1) B + b, launched before it (CTAs start
 *         in index order, so it is running or done), which sees every query
 *         tile block kb sees and waits, in turn, only on CTAs before it.
 *         The descending query loop lets the key blocks of a batch index
 *         that run at the same time take each tile one after the other
 *         right away (causal: all start at the last tile), not after the
 *         earlier ones caught up with a later starting tile. The spin traps
 *         after 30 s (%globaltimer): a broken order fails the launch
 *         instead of hanging the device.
 *       - atomic (nb_set_deterministic(0) and more than one key block):
 *         red.global.add.v4.f32 into the accumulator the pre-pass cleared.
 *   3. atomic mode only: dq = scale acc in the output dtype, a thread per
 *      float4 of the accumulator.
 * With one key block (Lk <= 128) every part has one term: written to dq
 * directly in either mode, without scratch for it.
 * Rows of a tile past Lq or Lk are zero-filled by TMA; the 64-key half of
 * a K, V block wholly past Lk is not loaded, its consumer warpgroup writes
 * zeros there instead (dQ's product sums over all 128 keys; every other
 * product is row-wise in them, and their dK, dV are never stored).
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
 *     MN-major descriptor (B of the rs products and both operands of dQ's:
 *     k = the tile's rows, m or n = d or the queries): + 2048 bytes per 16
 *     rows, 8-row groups 1024 apart (SBO), the 64-column blocks of d R 128
 *     bytes apart (LBO). The dS^T buffer is such a tile of 128 key rows x
 *     64 queries, written by the consumers with 4-byte stores (register a_r
 *     of k-step kk: key row 16 w + g + 8 (r % 2), unit 2 kk + r / 2,
 *     bytes 4 t: no bank conflicts).
 * The device code exists only in the sm_90a pass; other passes compile
 * empty kernels, which the host never launches (it checks the device and
 * the loaded binary). */
#include <cudaTypedefs.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attention_sm90_bwd.h"
#include "backend/cuda/cuda_attention_sm90.cuh"
#include "backend/cuda/gemm_sm90_plan.h"

#define FB_BK 128 /* keys per dK/dV CTA: two consumer warpgroups of 64 */
#define FB_BQ 64  /* queries per streamed tile (dK/dV) */
#define FB_ST 2   /* ring stages */
#define FB_MAXK FA3_MAXK /* batch axes of size > 1 (tensor maps of rank 5 at most) */
#define FB_THREADS 384
#define FB_LOG2E 1.4426950408889634f
#define FB_DS (FB_BK * FB_BQ * 2) /* one dS^T buffer (128 keys x 64 queries, 16-bit) */
#define FB_QT 4096                /* floats of an accumulator part (64 x 64) */

/* How dQ is summed (fb_params.mode; the launch counters' index). */
enum { FB_DET = 0, FB_ATOMIC = 1 };

namespace {

/* Everything but the tensor maps, passed by value. The batch axes are those
 * of size > 1 (a size-1 stand-in when there is none), nbk of them,
 * innermost first: bdim their sizes, *_bs the views' strides there; b is the
 * flat index over them (lse's row-major batch index). */
struct fb_params {
  uint16_t *dq, *dk, *dv;
  const uint16_t *o, *g; /* o, dout: the pre-pass */
  const float *lse;      /* (B, Lq) */
  float *sl, *sd;        /* scratch (B, Lp): lse log2(e), delta */
  float *acc;            /* scratch: the f32 dQ parts, (B, Lp / 64, D / 64) tiles of FB_QT */
  unsigned *cnt;         /* scratch: a counter per part (deterministic order) */
  int64_t dq_rs, dk_rs, dv_rs, o_rs, g_rs;
  int64_t dq_bs[FB_MAXK], dk_bs[FB_MAXK], dv_bs[FB_MAXK], o_bs[FB_MAXK], g_bs[FB_MAXK];
  int bdim[FB_MAXK], nbk;
  int B, Lq, Lk, Lp, nblk; /* nblk: key blocks per batch index */
  int ntq;                 /* Lp / 64: query tiles per batch index */
  float scale, sl2;        /* sl2 = scale log2(e) */
  int causal, mode;        /* mode: FB_DET or FB_ATOMIC */
};

template <int D> struct fb_cfg {
  /* dK/dV: K, V (128 x D), then per stage Q, dO (64 x D) and the stats
   * (lse2 [64], delta [64], padded to 1024 bytes: stages stay aligned) */
  static constexpr int KB = FB_BK * D * 2, QB = FB_BQ * D * 2, STAGE = 2 * QB + 1024;
  /* then the two dS^T buffers, then the barriers */
  static constexpr int TILES_KV = 2 * KB + FB_ST * STAGE + 2 * FB_DS;
  static constexpr size_t SMEM_KV = 1024 + TILES_KV + 8 * (1 + 2 * FB_ST);
};

/* Element offset of batch index b in a view of batch strides bs. */
__device__ __forceinline__ int64_t fb_off(const fb_params &p, int b, const int64_t *bs) {
  int64_t off = 0;
#pragma unroll
  for (int i = 0; i < FB_MAXK; i++)
    if (i < p.nbk) {
      off += (int64_t)(b % p.bdim[i]) * bs[i];
      b /= p.bdim[i];
    }
  return off;
}

/* ---- pre-pass ---------------------------------------------------------- */
/* Row r of the (B, Lp) scratch: delta = dout . o (f32, as the mma
 * backward), lse2 = lse log2(e) (+inf for -inf); past Lq +inf and 0. The
 * first row of a 64-row tile clears the tile's counters; atomic mode: each
 * row clears its D floats of the accumulator (a tile's parts are its rows'
 * 64 D floats). */
template <typename T, int D> __global__ void fb_prep_kernel(const fb_params p) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= (int64_t)p.B * p.Lp) return; /* warp-uniform */
  const int b = (int)(r / p.Lp), i = (int)(r % p.Lp);
  float s = 0.0f, l2 = INFINITY;
  if (i < p.Lq) { /* warp-uniform */
    const T *g = (const T *)(p.g + fb_off(p, b, p.g_bs) + (int64_t)i * p.g_rs);
    const T *o = (const T *)(p.o + fb_off(p, b, p.o_bs) + (int64_t)i * p.o_rs);
    for (int d = 2 * lane; d < D; d += 64)
      s += nb_to_f(g[d]) * nb_to_f(o[d]) + nb_to_f(g[d + 1]) * nb_to_f(o[d + 1]);
    s = nb_warp_sum(s);
    const float L = p.lse[(int64_t)b * p.Lq + i];
    l2 = L != -INFINITY ? L * FB_LOG2E : INFINITY;
  }
  if (lane == 0) p.sl[r] = l2, p.sd[r] = s;
  if (i % 64 == 0 && lane < D / 64) p.cnt[r / 64 * (D / 64) + lane] = 0u;
  if (p.mode == FB_ATOMIC)
    for (int d = 4 * lane; d < D; d += 128) *(float4 *)(p.acc + r * D + d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* Atomic mode, after the dK/dV kernel: dq = scale acc, a thread per float4
 * of the accumulator (fragment order back to rows and columns). */
template <typename T, int D> __global__ void fb_dq_kernel(const fb_params p) {
  const int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= (int64_t)p.B * p.Lp * (D / 4)) return;
  const int64_t tile = f / (16 * D); /* (b, query tile): D / 64 parts of 1024 float4 */
  const int u = (int)(f % (16 * D)), pc = u / 1024, j = u % 1024 / 128, x = u % 128;
  const int b = (int)(tile / p.ntq), r = (int)(tile % p.ntq) * 64 + 16 * (x / 32) + x % 32 / 4;
  const int c = 64 * pc + 8 * j + 2 * (x % 4);
  const float4 v = __ldcs((const float4 *)p.acc + f);
  T *base = (T *)(p.dq + fb_off(p, b, p.dq_bs)) + c;
  if (r < p.Lq) *(uint32_t *)(base + (int64_t)r * p.dq_rs) = nb_mma<T>::pack(v.x * p.scale, v.y * p.scale);
  if (r + 8 < p.Lq) *(uint32_t *)(base + (int64_t)(r + 8) * p.dq_rs) = nb_mma<T>::pack(v.z * p.scale, v.w * p.scale);
}

#ifdef NB_SM90A_DEVICE
/* mbarriers after the tiles: the once-loaded tiles' full barrier, then per
 * stage a full and an empty one. */
struct fb_bars {
  uint32_t base;
  __device__ __forceinline__ uint32_t once() const { return base; }
  __device__ __forceinline__ uint32_t full(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t empty(int s) const { return base + 8 * (1 + FB_ST + s); }
};

/* Rows [row, row + 64 nh) of a view into an R-row tile at dst (nh 64-row
 * halves, D / 64 column blocks). */
template <int D, int R>
__device__ __forceinline__ void fb_tile(uint32_t dst, const CUtensorMap *m, uint32_t bar, int row, int nh,
                                        const int *c, int nbk) {
#pragma unroll
  for (int x = 0; x < D / 64; x++)
    for (int h = 0; h < nh; h++) fa3_tma(dst + x * R * 128 + h * 64 * 128, m, bar, 64 * x, row + 64 * h, c, nbk);
}

/* ---- wgmma ------------------------------------------------------------- */
/* d (64 x 64) = A B^T over k = d (D / 16 steps): a the 64 A rows in block
 * 0 of a tile of RA rows, b block 0 of a 64-row tile of RB rows. */
template <typename T, int D, int RA, int RB>
__device__ __forceinline__ void fb_ss(float (&d)[32], uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint32_t x = kk / 4, off = (kk % 4) * 32;
    fa3_mma<T>::ss64(d, sm90_desc(a + x * RA * 128 + off, 16), sm90_desc(b + x * RB * 128 + off, 16), kk > 0);
  }
}

/* acc (64 x D) += A B over k = 64 rows: A the register fragments a, b
 * block 0 of a tile of R rows (MN-major, rows [0, 64) of it). */
template <typename T, int D, int R>
__device__ __forceinline__ void fb_rs(float (&acc)[D / 2], const uint32_t (&a)[4][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    const uint64_t db = sm90_desc(b + kk * 2048, R * 128);
    if (D == 128) fa3_mma<T>::rs128(acc, a[kk], db);
    else fa3_mma<T>::rs64(acc, a[kk], db);
  }
}

/* Rows r0, r0 + 8 (when before L) of a 64 x D accumulator, times mul, to
 * dst (its batch's base) with row stride rs: 4-byte pair stores. */
template <typename T, int D>
__device__ __forceinline__ void fb_store(uint16_t *dst, int64_t rs, int r0, int L, int t, const float (&acc)[D / 2],
                                         float mul) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = r0 + 8 * h;
    if (r >= L) continue;
    T *row = (T *)(dst + (int64_t)r * rs) + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *(uint32_t *)(row + 8 * n) = nb_mma<T>::pack(acc[4 * n + 2 * h] * mul, acc[4 * n + 2 * h + 1] * mul);
  }
}

/* d (64 x 64) = dS B over the block's 128 keys: A (64
 * queries x the keys) the dS^T buffer at a, B (the keys x 64 columns) the
 * K block at b, both MN-major (transpose bits), + 2048 bytes per 16 keys. */
#define FB_MMA_TT(TY)                                                                            \
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db, uint32_t acc) {   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " FA3_ACC32              \
                 ", %32, %33, p, 1, 1, 1, 1;\n}\n"                                                \
                 : FA3_OUT32 : "l"(da), "l"(db), "r"(acc));                                      \
  }
template <typename T> struct fb_mma_tt;
template <> struct fb_mma_tt<__nv_bfloat16> { FB_MMA_TT("bf16") };
template <> struct fb_mma_tt<__half> { FB_MMA_TT("f16") };

template <typename T>
__device__ __forceinline__ void fb_dq_mma(float (&d)[32], uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < FB_BK / 16; kk++)
    fb_mma_tt<T>::run(d, sm90_desc(a + kk * 2048, FB_BK * 128), sm90_desc(b + kk * 2048, FB_BK * 128), kk > 0);
}

/* The register A fragments of a warpgroup's 64 x 64 dS^T (warp w, lane) to
 * its 64 rows of a dS^T buffer at base (see the top comment), then the
 * proxy fence that makes them visible to wgmma. */
__device__ __forceinline__ void fb_ds_put(uint32_t base, const uint32_t (&a)[4][4], int w, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const uint32_t row = 16 * w + g + 8 * (r & 1), u = 2 * kk + (r >> 1);
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(base + row * 128 + ((u ^ g) << 4) + 4 * t), "r"(a[kk][r])
                   : "memory");
    }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Both consumer warpgroups (256 threads; ids 1 and 2 are sm90_wg_sync's). */
__device__ __forceinline__ void fb_consumers_sync() { asm volatile("bar.sync 3, 256;" ::: "memory"); }

/* Thread 0 of a warpgroup: until the counter at c reads want (acquire).
 * Finite by the launch order (top comment); a trap after 30 s. */
__device__ __forceinline__ void fb_wait_count(const unsigned *c, unsigned want) {
  uint64_t t0, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
    if (v == want) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - t0 > 30000000000ull) asm volatile("trap;");
  }
}

/* Key block kb's part pc (columns [64 pc, 64 pc + 64)) of query tile i0 /
 * 64's dQ, a 64 x 64 accumulator dq of consumer warpgroup wg (thread x of
 * it), into the f32 accumulator: atomic, or in ascending kb (the last
 * block writes dq). */
template <typename T, int D>
__device__ __forceinline__ void fb_dq_put(const fb_params &p, int b, int i0, int kb, int pc, int wg, int x,
                                          float (&dq)[32]) {
  const int qt = i0 / FB_BQ;
  const int64_t part = ((int64_t)b * p.ntq + qt) * (D / 64) + pc;
  float4 *slot = (float4 *)(p.acc + part * FB_QT) + x;
  if (p.mode == FB_ATOMIC) {
#pragma unroll
    for (int j = 0; j < 8; j++) atomicAdd(slot + 128 * j, make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
    return;
  }
  const int last = p.causal ? min(p.nblk - 1, qt / 2) : p.nblk - 1; /* blocks 0..last see the tile */
  unsigned *cnt = p.cnt + part;
  if (kb > 0) {
    if (x == 0) fb_wait_count(cnt, (unsigned)kb);
    sm90_wg_sync(wg);
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const float4 v = __ldcg(slot + 128 * j);
      dq[4 * j] = v.x + dq[4 * j], dq[4 * j + 1] = v.y + dq[4 * j + 1];
      dq[4 * j + 2] = v.z + dq[4 * j + 2], dq[4 * j + 3] = v.w + dq[4 * j + 3];
    }
  }
  if (kb == last) {
    fb_store<T, 64>(p.dq + fb_off(p, b, p.dq_bs) + 64 * pc, p.dq_rs, i0 + 16 * (x / 32) + x % 32 / 4, p.Lq, x % 4,
                    dq, p.scale);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; j++) __stcg(slot + 128 * j, make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
  __threadfence();
  sm90_wg_sync(wg);
  if (x == 0) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(cnt), "r"((unsigned)kb + 1u) : "memory");
}

/* ---- dK, dV -------------------------------------------------------------- */
/* Producer (one thread): K, V once, then Q, dO and the stats of query tile
 * it into stage it % FB_ST once the consumers have freed it. */
template <int D>
__device__ __forceinline__ void fb_kv_produce(const CUtensorMap *mq, const CUtensorMap *mk, const CUtensorMap *mv,
                                              const CUtensorMap *mg, const fb_params &p, int b, int j0, int ibeg,
                                              int ntiles, uint32_t sk, uint32_t ss0, fb_bars bar) {
  typedef fb_cfg<D> C;
  int c[FB_MAXK];
  fa3_coords(p, b, c);
  const int nh = j0 + 64 < p.Lk ? 2 : 1; /* a half wholly past Lk is not loaded */
  sm90_bar_expect(bar.once(), 2 * nh * 64 * D * 2);
  fb_tile<D, FB_BK>(sk, mk, bar.once(), j0, nh, c, p.nbk);
  fb_tile<D, FB_BK>(sk + C::KB, mv, bar.once(), j0, nh, c, p.nbk);
  for (int it = 0; it < ntiles; it++) { /* the last tile first */
    const int s = it % FB_ST, i0 = ibeg + (ntiles - 1 - it) * FB_BQ;
    const uint32_t st = ss0 + s * C::STAGE;
    sm90_bar_wait(bar.empty(s), ((uint32_t)(it / FB_ST) & 1) ^ 1); /* fresh barriers pass parity 1 */
    sm90_bar_expect(bar.full(s), 2 * C::QB);
    fb_tile<D, FB_BQ>(st, mq, bar.full(s), i0, 1, c, p.nbk);
    fb_tile<D, FB_BQ>(st + C::QB, mg, bar.full(s), i0, 1, c, p.nbk);
    /* the tile's lse and delta rows are read by the consumers from global
     * memory (L1/L2), as the dQ kernel reads its rows: a bulk copy of them
     * into the stage drew racecheck hazard reports on the H100 */
  }
}

/* Consumer warpgroup wg: keys [j0 + 64 wg, + 64) against every query tile,
 * and the tiles' dQ parts through the dS^T buffers at sds. */
template <typename T, int D>
__device__ __forceinline__ void fb_kv_consume(const fb_params &p, int b, int j0, int ibeg, int ntiles, int wg,
                                              uint32_t sk, uint32_t ss0, uint32_t sds, fb_bars bar) {
  typedef fb_cfg<D> C;
  const int x = threadIdx.x % 128, lane = x % 32, w = x / 32, t = lane % 4;
  const int kw = j0 + 64 * wg + 16 * w, kr = kw + lane / 4; /* the warp's first key; this thread's key g */
  const uint32_t ka = sk + wg * 64 * 128, va = ka + C::KB;  /* this warpgroup's rows of K, V */
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.0f;
  if (wg == 1 && j0 + 64 >= p.Lk) {
    /* the producer leaves this half of K and V unloaded: zeros, so that S^T
     * and dP^T are 0 there (dS^T = 0) and dQ's product, over all 128 keys,
     * adds nothing from them (visible to the other warpgroup's wgmma after
     * the first tile's barrier) */
#pragma unroll
    for (int c = 0; c < 2 * (D / 64); c++) {
      const uint32_t base = sk + (c / (D / 64)) * C::KB + (c % (D / 64)) * FB_BK * 128 + 64 * 128;
      for (int u = x; u < 64 * 128 / 16; u += 128)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(base + 16 * u), "r"(0u) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  if (ntiles) sm90_bar_wait(bar.once(), 0);
  for (int it = 0; it < ntiles; it++) {
    const int sg = it % FB_ST, i0 = ibeg + (ntiles - 1 - it) * FB_BQ; /* the last tile first */
    const uint32_t qt = ss0 + sg * C::STAGE, gt = qt + C::QB, ds = sds + (it & 1) * FB_DS;
    /* rows i0 .. i0 + 63 of the pre-pass's statistics (i0 + 64 <= Lp) */
    const float *sl = p.sl + (int64_t)b * p.Lp + i0, *sd = p.sd + (int64_t)b * p.Lp + i0;
    /* the products' first k-step does not read its accumulator (scale-d
     * 0): declared here, not set, s, dp and dq hold no value across tiles
     * (registers for dK, dV, the tile's products and dQ's at once) */
    float s[32], dp[32], dq[32];
    uint32_t pa[4][4], da[4][4];
    sm90_bar_wait(bar.full(sg), (uint32_t)(it / FB_ST) & 1);
    fa3_wg_fence();
    fb_ss<T, D, FB_BK, FB_BQ>(s, ka, qt); /* S^T = K Q^T (keys x queries) */
    fa3_commit();
    fb_ss<T, D, FB_BK, FB_BQ>(dp, va, gt); /* dP^T = V dO^T */
    fa3_commit();
    fa3_wait<1>(); /* S^T complete; dP^T may still run */
    fa3_fence(s);
    /* P^T: column (query) i0 + 8n + 2t + (e & 1), row (key) kr + 8 (e >> 1) */
#pragma unroll
    for (int n = 0; n < 8; n++) {
      const float2 l2 = *(const float2 *)(sl + 8 * n + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; e++) s[4 * n + e] = nb_mma_exp2(fmaf(s[4 * n + e], p.sl2, -((e & 1) ? l2.y : l2.x)));
    }
    /* warp-uniform: some query before some key (causal), or keys past Lk
     * (zero-filled or not loaded: P = 0 keeps them out of dQ) */
    if ((p.causal && i0 < kw + 16) || kw + 16 > p.Lk) {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int qi = i0 + 8 * (i / 4) + 2 * t + (i & 1), kj = kr + 8 * ((i >> 1) & 1);
        if (kj >= p.Lk || (p.causal && qi < kj)) s[i] = 0.0f;
      }
    }
    fa3_pack<T>(pa, s);
    fa3_fence(pa);
    fa3_fence(dv);
    fa3_wg_fence();
    fb_rs<T, D, FB_BQ>(dv, pa, gt); /* dV += P^T dO */
    fa3_commit();
    fa3_wait<1>(); /* dP^T complete; dV's product may still run */
    fa3_fence(dp);
#pragma unroll
    for (int n = 0; n < 8; n++) {
      const float2 dl = *(const float2 *)(sd + 8 * n + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; e++) dp[4 * n + e] = s[4 * n + e] * (dp[4 * n + e] - ((e & 1) ? dl.y : dl.x));
    }
    fa3_pack<T>(da, dp);
    /* buffer it % 2 was last read by tile it - 2's dQ product, complete
     * before either warpgroup passed tile it - 1's barrier */
    fb_ds_put(ds + wg * 64 * 128, da, w, lane);
    fa3_fence(da);
    fa3_fence(dk);
    fa3_wg_fence();
    fb_rs<T, D, FB_BQ>(dk, da, qt); /* dK += dS^T Q */
    fa3_commit();
    /* D 128: consumer wg the columns [64 wg, + 64); D 64: consumer it % 2 */
    const bool mine = D == 128 || (it & 1) == wg;
    fb_consumers_sync(); /* both halves of dS^T are in the buffer */
    if (mine) {
      fa3_wg_fence();
      fb_dq_mma<T>(dq, ds, sk + (D == 128 ? wg : 0) * FB_BK * 128); /* dQ part = dS K */
      fa3_commit();
    }
    fa3_wait<0>();
    fa3_fence(dv);
    fa3_fence(dk);
    if (mine) fa3_fence(dq);
    fa3_fence(pa);
    fa3_fence(da);
    /* every lane's reads of the stage (the statistics above) come before
     * lane 0 releases it: racecheck reported the producer's next bulk copy
     * against them without this ordering */
    __syncwarp();
    if (lane == 0) sm90_bar_arrive(bar.empty(sg)); /* the stage (stats read above) is free */
    if (mine) fb_dq_put<T, D>(p, b, i0, j0 / FB_BK, D == 128 ? wg : 0, wg, x, dq);
  }
  fb_store<T, D>(p.dk + fb_off(p, b, p.dk_bs), p.dk_rs, kr, p.Lk, t, dk, p.scale);
  fb_store<T, D>(p.dv + fb_off(p, b, p.dv_bs), p.dv_rs, kr, p.Lk, t, dv, 1.0f);
}

#endif /* NB_SM90A_DEVICE */

/* Shared setup of both kernels: the tiles' base (1024-aligned: the 128-byte
 * swizzle repeats every 1024 bytes), barrier init by thread 0. */
#define FB_PROLOGUE(SMEM_TILES)                                                          \
  extern __shared__ uint8_t fb_raw[];                                                    \
  const uint32_t s0 = (sm90_smem(fb_raw) + 1023) & ~1023u;                               \
  const fb_bars bar = {s0 + (SMEM_TILES)};                                               \
  if (threadIdx.x == 0) {                                                                \
    for (int i = 0; i < 1 + 2 * FB_ST; i++) sm90_bar_init(bar.base + 8 * i, i < 1 + FB_ST ? 1 : 8); \
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");                   \
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");                         \
  }                                                                                      \
  __syncthreads()

// dk, dv (B, Lk, D): a CTA per (128 keys, batch index)
template <typename T, int D>
__global__ void __launch_bounds__(FB_THREADS, 1)
    fb_kv_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                 const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mg,
                 const __grid_constant__ fb_params p) {
#ifdef NB_SM90A_DEVICE
  typedef fb_cfg<D> C;
  FB_PROLOGUE(C::TILES_KV);
  const int b = blockIdx.x % p.B, j0 = (int)(blockIdx.x / p.B) * FB_BK; /* causal: heaviest first */
  const int ibeg = p.causal ? j0 : 0; /* queries before the block's first key see none of it */
  const int ntiles = ibeg < p.Lq ? (p.Lq - ibeg + FB_BQ - 1) / FB_BQ : 0;
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (threadIdx.x == 0 && ntiles) fb_kv_produce<D>(&mq, &mk, &mv, &mg, p, b, j0, ibeg, ntiles, s0, s0 + 2 * C::KB, bar);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    fb_kv_consume<T, D>(p, b, j0, ibeg, ntiles, threadIdx.x / 128 - 1, s0, s0 + 2 * C::KB,
                        s0 + 2 * C::KB + FB_ST * C::STAGE, bar);
  }
#else
  (void)mq; (void)mk; (void)mv; (void)mg; (void)p;
#endif
}

/* ---- host -------------------------------------------------------------- */
/* 1 when the loaded image of the dK/dV kernel is the 9.0 one (a binary
 * built without that target would run the sm_80 image's empty kernel). */
template <typename T, int D> int fb_ready(void) {
  static int cache = 0;
  if (!cache) {
    cudaFuncAttributes a;
    cache = cudaFuncGetAttributes(&a, fb_kv_kernel<T, D>) == cudaSuccess && a.binaryVersion >= 90 ? 1 : -1;
    cudaGetLastError();
  }
  return cache == 1;
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

int64_t fb_launches[2]; /* per mode */

template <typename T, int D>
nb_status fb_launch(const nb_cuda_ctx *ctx, const CUtensorMap *m, fb_params p, int nkb) {
  static_assert(fb_cfg<D>::SMEM_KV <= 227 * 1024, "shared memory");
  const int64_t rows = (int64_t)p.B * p.Lp;
  fb_prep_kernel<T, D><<<(unsigned)((rows + 7) / 8), 256, 0, ctx->stream>>>(p);
  nb_status st = nb_cuda_launch_check("attention_bwd (sm90 delta)");
  if (st) return st;
  auto kv = fb_kv_kernel<T, D>;
  const size_t skv = fb_cfg<D>::SMEM_KV;
  NB_CUDA_TRY(cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv),
              "attention_bwd (sm90): shared memory attribute");
  p.nblk = nkb;
  kv<<<(unsigned)((int64_t)p.B * nkb), FB_THREADS, skv, ctx->stream>>>(m[0], m[1], m[2], m[3], p);
  st = nb_cuda_launch_check("attention_bwd (sm90 dk, dv)");
  if (st) return st;
  if (p.mode == FB_ATOMIC) {
    const int64_t n4 = rows * (D / 4);
    fb_dq_kernel<T, D><<<(unsigned)((n4 + 255) / 256), 256, 0, ctx->stream>>>(p);
    st = nb_cuda_launch_check("attention_bwd (sm90 dq)");
  }
  if (!st) __atomic_add_fetch(&fb_launches[p.mode], 1, __ATOMIC_RELAXED);
  return st;
}

} /* namespace */

int64_t nb_cuda_attn_sm90_bwd_launches(int device) {
  if (!nb_sm90_device_ok(device)) return -1;
  int64_t n = 0;
  for (int i = 0; i < 2; i++) n += __atomic_load_n(&fb_launches[i], __ATOMIC_RELAXED);
  return n;
}

int64_t nb_cuda_attn_sm90_bwd_mode_launches(int device, int mode) {
  if (!nb_sm90_device_ok(device)) return -1;
  return mode >= 0 && mode < 2 ? __atomic_load_n(&fb_launches[mode], __ATOMIC_RELAXED) : 0;
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
    p.bdim[nbk] = (int)(q->shape[d] < INT32_MAX ? q->shape[d] : INT32_MAX); /* B checked below */
    p.dq_bs[nbk] = dq->strides[d], p.dk_bs[nbk] = dk->strides[d], p.dv_bs[nbk] = dv->strides[d];
    p.o_bs[nbk] = o->strides[d], p.g_bs[nbk] = dout->strides[d];
    nbk++;
  }
  if (!nbk) { /* one batch index: a size-1 stand-in axis */
    axes[0] = -1;
    p.bdim[0] = 1;
    nbk = 1;
  }
  const int64_t nkb = (Lk + FB_BK - 1) / FB_BK, Lp = (Lq + 127) / 128 * 128;
  if (B < 1 || B > INT32_MAX || B * nkb > INT32_MAX || B * Lp > INT32_MAX / 2) return 0;
  CUtensorMap maps[4];
  if (!nb_fa3_map(&maps[0], q, Lq, D, axes, nbk, 64) || !nb_fa3_map(&maps[1], k, Lk, D, axes, nbk, 64) ||
      !nb_fa3_map(&maps[2], v, Lk, D, axes, nbk, 64) || !nb_fa3_map(&maps[3], dout, Lq, D, axes, nbk, 64))
    return 0;
  /* one key block: each dQ part has one term, written directly (no
   * accumulator, no atomics) */
  p.mode = !nb_deterministic() && nkb > 1 ? FB_ATOMIC : FB_DET;
  /* scratch: the accumulator (nkb > 1), lse2, delta, counters */
  const size_t nacc = nkb > 1 ? (size_t)(B * Lp) * (size_t)D : 0, nrow = (size_t)(B * Lp);
  const size_t bytes = (nacc + 2 * nrow) * sizeof(float) + nrow / 32 * sizeof(unsigned);
  float *scratch = (float *)nb_cuda_scratch(ctx, bytes);
  if (!scratch) {
    *st = nb_last_status();
    return 1;
  }
  if ((uintptr_t)scratch & 15) { /* float4 accesses of the accumulator */
    nb_cuda_scratch_free(ctx, scratch, bytes);
    return 0;
  }
  p.acc = nacc ? scratch : NULL;
  p.sl = scratch + nacc, p.sd = p.sl + nrow;
  p.cnt = (unsigned *)(p.sd + nrow);
  p.ntq = (int)(Lp / FB_BQ);
  p.dq = (uint16_t *)dq->data, p.dk = (uint16_t *)dk->data, p.dv = (uint16_t *)dv->data;
  p.o = (const uint16_t *)o->data, p.g = (const uint16_t *)dout->data;
  p.lse = (const float *)lse->data;
  p.dq_rs = dq->strides[nd - 2], p.dk_rs = dk->strides[nd - 2], p.dv_rs = dv->strides[nd - 2];
  p.o_rs = o->strides[nd - 2], p.g_rs = dout->strides[nd - 2];
  p.nbk = nbk;
  p.B = (int)B;
  p.Lq = (int)Lq;
  p.Lk = (int)Lk;
  p.Lp = (int)Lp;
  p.scale = (float)scale;
  p.sl2 = (float)(scale * 1.4426950408889634);
  p.causal = causal;
  if (D == 64)
    *st = dt == NB_BF16 ? fb_launch<__nv_bfloat16, 64>(ctx, maps, p, (int)nkb)
                        : fb_launch<__half, 64>(ctx, maps, p, (int)nkb);
  else
    *st = dt == NB_BF16 ? fb_launch<__nv_bfloat16, 128>(ctx, maps, p, (int)nkb)
                        : fb_launch<__half, 128>(ctx, maps, p, (int)nkb);
  nb_cuda_scratch_free(ctx, scratch, bytes);
  return 1;
}
