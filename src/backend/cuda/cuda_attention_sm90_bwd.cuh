/* The device helpers of the Hopper (sm_90a) flash attention backward
 * (cuda_attention_sm90_bwd.cu, whose opening comment describes the kernels
 * and the fragment and shared-memory layouts): its tile sizes, the kernels'
 * parameters, the TMA loads of a tile, the wgmma products of its tiles, the
 * fused kernel's dS^T and dQ partial in shared memory, the statistics' bulk
 * copy and loads, P^T on a tile without masked elements, the mbarriers,
 * the persistent kernels' work order, the 16-byte epilogue (fb_store16),
 * the statistics (the dQ kernel's own, fb_qstats, and the pre-pass
 * kernel, fb_prep_kernel) and the fused path's last kernel (fb_dq_kernel).
 * Included by that file only. */
#ifndef NB_CUDA_ATTENTION_SM90_BWD_CUH
#define NB_CUDA_ATTENTION_SM90_BWD_CUH

#include "backend/cuda/cuda_attention_sm90.cuh"

#define FB_BK 128 /* keys per dK/dV CTA: two consumer warpgroups of 64 */
#define FB_BQ 64  /* queries per streamed tile (dK/dV; 128 for the split kernel at D 64: fb_kv_qt) */
#define FB_BM 128 /* queries per dQ CTA: two consumer warpgroups of 64 */
#define FB_BN 64  /* keys per streamed tile (dQ) */
#define FB_ST 2   /* ring stages: the dK/dV kernels (fused; split at D 128) */
#define FB_QST 3  /* ring stages: the dQ kernel, and the split dK/dV kernel at D 64 (fb_kv_stages) */
/* mbarriers: the item tiles' full barrier 0, full and empty per stage (the
 * larger ring's count), the item tiles' full barrier 1, their empty
 * barriers 0 and 1, the item slots' full and empty barriers (fb_bars) */
#define FB_NBAR (8 + 2 * FB_QST)
#define FB_MAXK FA3_MAXK /* batch axes of size > 1 (tensor maps of rank 5 at most) */
#define FB_THREADS 384
#define FB_PART (64 * 64 * 4) /* bytes of a fused kernel's dQ partial: 64 x 64 f32 */
#define FB_LOG2E 1.4426950408889634f

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
  float *acc;            /* fused: the f32 dQ accumulator (B, Lp / 64, D / 64, 64 x 64 chunk) */
  int64_t dq_rs, dk_rs, dv_rs, o_rs, g_rs;
  int64_t dq_bs[FB_MAXK], dk_bs[FB_MAXK], dv_bs[FB_MAXK], o_bs[FB_MAXK], g_bs[FB_MAXK];
  nb_fastdiv bdim[FB_MAXK]; /* the batch axes' sizes (.d) */
  int nbk;
  int B, Lq, Lk, Lp, ntq, nblk; /* ntq = Lp / 64 */ /* nblk: key blocks (dK/dV) or query blocks (dQ) per batch index */
  int hg;                  /* batch indices per section of the items' order (fa3_section) */
  int nfull;               /* sections of hg before the last */
  nb_fastdiv dsec, dhg, dhl; /* the order's divisors (fa3_set_order) */
  int items;               /* B nblk (batch index, block) work items (fa3_next) */
  unsigned *work;          /* the work counters {ticket, CTAs done}, then the CTAs' item slots (fa3_next) */
  float scale, sl2;        /* sl2 = scale log2(e) */
  int causal;
  int vec_og, vec_dq;    /* o and dout / dq: rows and batch offsets 16-byte aligned (8-element accesses) */
  int fold;              /* the dQ kernel computes the statistics itself, no pre-pass (fb_qstats) */
  int vec_kv;            /* dk and dv: rows and batch offsets 16-byte aligned (fb_store16) */
  unsigned *cnt;         /* fused at D 128: the sections' accumulator counters (fb_acc_side); NULL: none */
  int cmax;              /* units a warp of fb_acc_side converts at most; -1: its query tiles / 16 */
};

/* Element offset of batch index b in a view of batch strides bs. */
__device__ __forceinline__ int64_t fb_off(const fb_params &p, int b, const int64_t *bs) {
  int64_t off = 0;
  uint32_t u = (uint32_t)b;
#pragma unroll
  for (int i = 0; i < FB_MAXK; i++)
    if (i < p.nbk) {
      const uint32_t q = nb_fastdiv_div(p.bdim[i], u);
      off += (int64_t)(u - q * p.bdim[i].d) * bs[i];
      u = q;
    }
  return off;
}

/* ---- the fused path's accumulator by sections ------------------------------
 * The sections of the work order (fa3_section: p.nfull of p.hg batch
 * indices, then the last of the rest) each own the accumulator's rows of
 * their batch indices: units of one query tile (64 rows, its D / 64
 * chunks, contiguous), p.ntq per batch index, unit v = b ntq + t. Four
 * counters per section c at p.cnt + 4 c (the pre-pass zeroes them): units
 * claimed for zeroing, units zeroed, consumer warpgroups done (two per
 * item), units claimed for conversion (fb_acc_side). */
enum { FB_ZCLAIM, FB_ZDONE, FB_WGDONE, FB_CCLAIM, FB_NCNT };
__device__ __forceinline__ int fb_sec_of(const fb_params &p, int b) {
  return min((int)nb_fastdiv_div(p.dhg, (uint32_t)b), p.nfull);
}
/* section c's batch indices, and its units (host too: the tests' counts) */
__host__ __device__ __forceinline__ int fb_sec_nb(const fb_params &p, int c) {
  return c < p.nfull ? p.hg : p.B - p.nfull * p.hg;
}
__host__ __device__ __forceinline__ int fb_sec_units(const fb_params &p, int c) { return fb_sec_nb(p, c) * p.ntq; }

/* ---- pre-pass ---------------------------------------------------------- */
/* Row r of the (B, Lp) scratch: delta = dout . o (f32), lse2 = lse log2(e) (+inf for -inf); past Lq +inf and 0.
 * V (p.vec_og): D / 8 lanes per row, each a 16-byte load of 8 elements of
 * dout and of o per row; else a warp per row, 4-byte pairs. A thread group
 * takes R rows G apart (G groups per 256-thread block); the vector path
 * issues every load (and lse's) before the first product: the pass is a
 * stream of dout and o, 2 B Lq D elements (22.7 us at GPT-2's shape, 71%
 * of DRAM peak).
 * Both sum a row's products in a fixed order, whichever group takes it:
 * the same bits for every R. R = 2: on the H100 at GPT-2's shape (ncu)
 * 22.7 us against 26.3 with 4 rows and 33.1 with 8 (more registers, fewer
 * blocks resident), 25.6-26.0 before the loads were issued ahead. */
template <int D, bool V> struct fb_prep_cfg {
  static constexpr int R = 2;                /* rows per thread group */
  static constexpr int LPR = V ? D / 8 : 32; /* lanes per row */
  static constexpr int G = 256 / LPR;        /* row groups per block */
  static constexpr int RPB = R * G;          /* rows per 256-thread block */
};
/* The pre-pass's sum of one 16-byte unit of a row (8 elements of dout and
 * of o, pairs in order, rounding spelt out): the dQ kernel's own delta
 * (fb_qstats_finish) sums the units the same way, so both paths give the
 * same bits. */
template <typename T> __device__ __forceinline__ float fb_dot8(uint4 g, uint4 o) {
  const T *ge = (const T *)&g, *oe = (const T *)&o;
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; e += 2)
    s = __fadd_rn(s, fmaf(nb_to_f(ge[e]), nb_to_f(oe[e]), __fmul_rn(nb_to_f(ge[e + 1]), nb_to_f(oe[e + 1]))));
  return s;
}

/* lse log2(e), +inf for a row without keys (lse = -inf: p = 0) */
__device__ __forceinline__ float fb_lse2(float lse) { return lse != -INFINITY ? lse * FB_LOG2E : INFINITY; }

template <typename T, int D, bool V> __global__ void __launch_bounds__(256) fb_prep_kernel(const fb_params p) {
  if (p.cnt && blockIdx.x == 0) /* the fused kernel's section counters (it waits for this kernel) */
    for (int i = threadIdx.x; i < FB_NCNT * (p.nfull + 1); i += blockDim.x) p.cnt[i] = 0u;
  constexpr int R = fb_prep_cfg<D, V>::R, LPR = fb_prep_cfg<D, V>::LPR, G = fb_prep_cfg<D, V>::G;
  const int lane = threadIdx.x % LPR, nr = p.B * p.Lp; /* B Lp <= INT32_MAX / 2 (the host checks) */
  const int r0 = (int)blockIdx.x * (R * G) + (int)threadIdx.x / LPR;
  uint4 gv[R], ov[R];
  const T *gp[R], *op[R];
  float s[R], L[R];
  bool ok[R];
#pragma unroll
  for (int h = 0; h < R; h++) { /* the loads */
    const int r = r0 + h * G, b = r / p.Lp, i = r % p.Lp;
    ok[h] = r < nr && i < p.Lq;
    int64_t go = (int64_t)i * p.g_rs, oo = (int64_t)i * p.o_rs; /* fb_off of both views, one division */
#pragma unroll
    for (int a = 0, c = b; a < FB_MAXK; a++)
      if (a < p.nbk) {
        const int q = (int)nb_fastdiv_div(p.bdim[a], (uint32_t)c), m = c - q * (int)p.bdim[a].d;
        go += (int64_t)m * p.g_bs[a], oo += (int64_t)m * p.o_bs[a], c = q;
      }
    gp[h] = (const T *)(p.g + go);
    op[h] = (const T *)(p.o + oo);
    gv[h] = ov[h] = make_uint4(0u, 0u, 0u, 0u);
    L[h] = -INFINITY;
    if (ok[h]) {
      if (V) gv[h] = __ldg((const uint4 *)gp[h] + lane), ov[h] = __ldg((const uint4 *)op[h] + lane);
      L[h] = p.lse[(int64_t)b * p.Lq + i];
    }
  }
#pragma unroll
  for (int h = 0; h < R; h++) { /* the products: zero for a row past Lq or the scratch */
    s[h] = 0.0f;
    if (V) {
      s[h] = fb_dot8<T>(gv[h], ov[h]);
    } else if (ok[h]) {
      for (int d = 2 * lane; d < D; d += 64)
        s[h] += nb_to_f(gp[h][d]) * nb_to_f(op[h][d]) + nb_to_f(gp[h][d + 1]) * nb_to_f(op[h][d + 1]);
    }
  }
#pragma unroll
  for (int h = 0; h < R; h++) {
#pragma unroll
    for (int m = LPR / 2; m > 0; m /= 2) s[h] += __shfl_xor_sync(0xffffffffu, s[h], m);
    const int r = r0 + h * G;
    if (lane == 0 && r < nr) p.sl[r] = fb_lse2(L[h]), p.sd[r] = s[h];
  }
}

/* The dK/dV ring's stages: 3 for the split kernel at D 64, whose dV and dK
 * products run on into the next tile's S^T (the stage is freed once they
 * have completed); 2 otherwise: at D 128 keeping dS^T and the
 * accumulators live across tiles leaves ptxas too few registers (it
 * serialises every wgmma, C7512), and the fused kernel sends its dQ
 * partial and frees the stage in the tile itself. */
__host__ __device__ constexpr int fb_kv_stages(bool fused, int D) { return !fused && D == 64 ? FB_QST : FB_ST; }
/* The dK/dV kernel's query tile: 128 rows for the split kernel at D 64
 * (m64n128 S^T and dP^T products, half the per-tile fixed costs per
 * query), 64 otherwise (the fused kernel's dS^T exchange and dQ partials
 * are 64-query tiles; at D 128 the accumulators leave no registers). */
__host__ __device__ constexpr int fb_kv_qt(bool fused, int D) { return !fused && D == 64 ? 128 : FB_BQ; }
/* Whether the fused kernel is persistent (a second K/V buffer: D 64; at D
 * 128 its shared memory would exceed 227 KB, fb_cfg: a CTA per item). */
__host__ __device__ constexpr bool fb_fu_persistent(int D) { return D == 64; }
/* Whether the dK/dV kernel is the fused one of a CTA per item (D 128),
 * whose idle producer warps zero and convert the dQ accumulator beside
 * the products (fb_acc_side; with p.cnt set, fb_acc_in_kernel). */
__host__ __device__ constexpr bool fb_fu_side(bool fused, int D) { return fused && !fb_fu_persistent(D); }

/* Whether the dQ kernel computes the statistics itself, without the
 * pre-pass (fb_qstats): at D 64, where o's tile fits in its Q/dO buffers
 * (at D 128 they and the K/V ring take 224 KB). */
__host__ __device__ constexpr bool fb_q_fold(int D) { return D == 64; }

template <int D, int QT = FB_BQ> struct fb_cfg {
  /* dK/dV: K, V (128 x D), then per stage Q, dO (QT x D: the query tile,
   * 64 rows, or 128 for the split kernel at D 64: fb_kv_qt), then per stage
   * the query tile's statistics (lse2 [QT], delta [QT]) */
  static constexpr int KB = FB_BK * D * 2, QB = QT * D * 2, STAGE = 2 * QB, STATS = 2 * QT * 4;
  /* the tiles of the dK/dV kernels before the fused kernel's buffers */
  __host__ __device__ static constexpr int kv_tiles(bool fused) {
    return 2 * KB + fb_kv_stages(fused, D) * (STAGE + STATS);
  }
  /* the split kernel: then K, V of the next item (K/V buffer 1: fb_kv_kernel) */
  static constexpr size_t SMEM_KV = 1024 + kv_tiles(false) + 2 * KB + 8 * FB_NBAR;
  /* fused: then two dS^T buffers (128 keys x 64 queries; 128-byte swizzle,
   * so 1024-byte aligned) and two dQ partials (64 x 64 f32) per consumer */
  static constexpr int DS = FB_BK * FB_BQ * 2, PART = FB_PART;
  /* then, persistent (D 64: fb_fu_persistent), K, V of the next item (K/V
   * buffer 1); at D 128 it would not fit (asserted below) */
  static constexpr int FU_KV1 = kv_tiles(true) + 2 * DS + 4 * PART;
  static constexpr size_t SMEM_FU = 1024 + FU_KV1 + (fb_fu_persistent(D) ? 2 * KB : 0) + 8 * FB_NBAR;
  static_assert(kv_tiles(true) % 1024 == 0 && FU_KV1 % 1024 == 0,
                "the fused kernel's dS^T buffers and K/V buffer 1 must be 1024-byte aligned");
  static_assert(QT != FB_BQ || fb_fu_persistent(D) == (1024 + FU_KV1 + 2 * KB + 8 * FB_NBAR <= 232448),
                "the fused kernel is persistent exactly where its second K/V buffer fits");
  /* dQ: Q, dO (128 x D) and at D 64 o (fb_q_fold: the kernel's own
   * statistics), then per stage K, V (64 x D), then Q, dO (, o) of the
   * next item (Q/dO buffer 1: fb_q_kernel) */
  static constexpr int MB = FB_BM * D * 2, NB = FB_BN * D * 2, QBUF = (fb_q_fold(D) ? 3 : 2) * MB;
  static constexpr int Q_TILES = QBUF + FB_QST * 2 * NB; /* buffer 1's offset */
  static constexpr size_t SMEM_Q = 1024 + Q_TILES + QBUF + 8 * FB_NBAR;
  static_assert(SMEM_KV <= 232448 && (QT != FB_BQ || SMEM_FU <= 232448) && SMEM_Q <= 232448,
                "a backward kernel's shared memory exceeds the H100's 227 KB");
};

} /* namespace */

#ifdef NB_SM90A_DEVICE
namespace {

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
/* d (64 x N, N = 64 or 128) = A B^T over k = d (D / 16 steps): a the 64 A
 * rows in block 0 of a tile of RA rows, b block 0 of an N-row tile of RB
 * rows. */
template <typename T, int D, int RA, int RB, int N = 64>
__device__ __forceinline__ void fb_ss(float (&d)[N / 2], uint32_t a, uint32_t b) {
  const fa3_desc da(a, 16), db(b, 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint32_t x = kk / 4, off = (kk % 4) * 32;
    if (N == 128) fa3_mma<T>::ss128(d, da.at(x * RA * 128 + off), db.at(x * RB * 128 + off), kk > 0);
    else fa3_mma<T>::ss64(d, da.at(x * RA * 128 + off), db.at(x * RB * 128 + off), kk > 0);
  }
}

/* acc (64 x D) += A B over k = 16 NK rows: A the register fragments a, b
 * block 0 of a tile of R rows (MN-major, rows [0, 16 NK) of it). */
template <typename T, int D, int R, int NK = 4>
__device__ __forceinline__ void fb_rs(float (&acc)[D / 2], const uint32_t (&a)[NK][4], uint32_t b) {
  const fa3_desc db(b, R * 128);
#pragma unroll
  for (int kk = 0; kk < NK; kk++) {
    if (D == 128) fa3_mma<T>::rs128(acc, a[kk], db.at(kk * 2048));
    else fa3_mma<T>::rs64(acc, a[kk], db.at(kk * 2048));
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

/* ---- the fused kernel's dQ ---------------------------------------------- */
/* Named barriers: 1 the two consumer warpgroups (256 threads), 2 + wg one
 * consumer warpgroup (0 is __syncthreads'). */
__device__ __forceinline__ void fb_bar_both() { asm volatile("bar.sync 1, 256;" ::: "memory"); }
__device__ __forceinline__ void fb_bar_wg(int wg) {
  if (wg) asm volatile("bar.sync 3, 128;" ::: "memory");
  else asm volatile("bar.sync 2, 128;" ::: "memory");
}
__device__ __forceinline__ void fb_fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* This warpgroup's 64 rows of a 64 x D accumulator (rows rw0 .. rw0 + 63,
 * those before L), times mul, to dst (its batch's base; row stride rs,
 * rows 16-byte aligned) through shared memory: each thread's pairs go
 * into the warpgroup's rows of a 128-row tile whose products have all
 * completed (st: its 64 rows of block 0; the tile's 128-byte swizzle, so
 * a warp's 32 pairs hit 32 banks), the warpgroup meets, and each thread
 * stores 16-byte units, 8 lanes to a 128-byte row. fb_store's 4-byte
 * pairs (a warp's store touching 8 rows) drained slowly: ncu put ~10% of
 * the dK/dV kernel's stall samples at GPT-2's shape on instructions
 * waiting for them. The caller releases the tile after this returns. */
template <typename T, int D>
__device__ __forceinline__ void fb_store16(uint16_t *dst, int64_t rs, int rw0, int L, int wg, uint32_t st,
                                           const float (&acc)[D / 2], float mul) {
  const int x = threadIdx.x % 128, lane = x % 32, w = x / 32, t = lane % 4, g = lane / 4;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t row = st + (uint32_t)(16 * w + g + 8 * h) * 128 + 4 * t; /* row % 8 == g */
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      const uint32_t a = row + (n / 8) * 128 * 128 + (((n % 8) ^ g) << 4);
      const uint32_t v = nb_mma<T>::pack(acc[4 * n + 2 * h] * mul, acc[4 * n + 2 * h + 1] * mul);
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
    }
  }
  fb_bar_wg(wg);
  constexpr int U = D / 8; /* 16-byte units a row */
#pragma unroll
  for (int q = x; q < 64 * U; q += 128) {
    const int rr = q / U, u = q % U;
    const uint32_t a = st + (u / 8) * 128 * 128 + rr * 128 + (((u % 8) ^ (rr % 8)) << 4);
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
                 : "memory");
    if (rw0 + rr < L) *(uint4 *)(dst + (int64_t)(rw0 + rr) * rs + 8 * u) = v;
  }
}

/* dS^T (this warpgroup's 64 keys, the register A fragments da) into rows
 * [64 wg, + 64) of the 128 x 64 tile at ds, 128 bytes a row, the 128-byte
 * swizzle: da[kk][r] is key row 16 w + g + 8 (r % 2), queries
 * 8 (2 kk + r / 2) + 2 t + {0, 1}, 4 bytes at unit 2 kk + r / 2. For a
 * given (kk, r) a warp's 8 rows g land in 8 different units: no bank
 * conflicts. */
__device__ __forceinline__ void fb_put_ds(uint32_t ds, const uint32_t (&da)[4][4], int wg, int w, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int row = 64 * wg + 16 * w + g + 8 * (r & 1), u = 2 * kk + (r >> 1);
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(ds + row * 128 + ((u ^ (row & 7)) << 4) + 4 * t), "r"(da[kk][r])
                   : "memory");
    }
}

/* dQ partial (64 queries x 64 columns) = dS K over the keys [k0, k0 + 16 nk)
 * of the dS^T tile at ds and of the K tile (128 rows) at sk, columns
 * [64 x, + 64) of K; both operands MN-major (A = dS stored as dS^T, B = K). */
template <typename T, int NK>
__device__ __forceinline__ void fb_dq(float (&d)[32], uint32_t ds, uint32_t sk, int k0, int x) {
  const fa3_desc da(ds + k0 * 128, 64 * 128), db(sk + x * FB_BK * 128 + k0 * 128, FB_BK * 128);
#pragma unroll
  for (int kk = 0; kk < NK; kk++)
    fa3_mma<T>::template ss64<1, 1>(d, da.at(16 * kk * 128), db.at(16 * kk * 128), kk > 0);
}

/* The partial to the buffer at pb (16 KB): row-major (row r at 256 r
 * bytes), the 8-byte column pair u of row r at pair u ^ 4 (r % 8) (a warp's
 * 8-byte stores of rows g, pairs 4 j + t, land 2 to a bank pair: the least
 * for 256 bytes). fb_dq_kernel reads a row's pairs back in order. */
__device__ __forceinline__ void fb_put_part(uint32_t pb, const float (&d)[32], int w, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = 16 * w + 8 * h + g, u = (4 * j + t) ^ (4 * g);
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(pb + r * 256 + u * 8), "f"(d[4 * j + 2 * h]),
                   "f"(d[4 * j + 2 * h + 1])
                   : "memory");
    }
}

/* Bulk copy of n bytes (16-byte aligned both sides) from global src to
 * shared dst, completing on bar. */
__device__ __forceinline__ void fb_bulk(uint32_t dst, const float *src, int n, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(n), "r"(bar) : "memory");
}
/* Two f32 from shared memory. */
__device__ __forceinline__ float2 fb_lds2(uint32_t a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}

/* This thread's columns' values (query 8n + 2t + {0, 1} in v[n]) of a
 * tile's statistics (lse2 or delta, QT of them in the stage at sl):
 * fb_stat_at(sl, t) is where they start, fb_stats loads them all before
 * the product they go with is waited for (PRE; loaded after it, the wait
 * for them stood on the path from the product to the exponentials: ncu,
 * the fused kernel at D 128, ~11% of the stall samples on the first FFMA
 * using lse2, ~3% on delta's), fb_stat gives one, from v (PRE) or loaded
 * where it is used (no registers to hold them all: ptxas spilled). */
__device__ __forceinline__ uint32_t fb_stat_at(uint32_t sl, int t) {
  uint32_t a; /* opaque to the compiler, which otherwise ORs each offset in (its bits are free) */
  asm("mov.b32 %0, %1;" : "=r"(a) : "r"(sl + 8 * t)); /* instead of adding it in the load */
  return a;
}
template <int QT> __device__ __forceinline__ void fb_stats(float2 (&v)[QT / 8], uint32_t a) {
#pragma unroll
  for (int n = 0; n < QT / 8; n++) v[n] = fb_lds2(a + 32 * n);
}
template <bool PRE, int QT> __device__ __forceinline__ float2 fb_stat(const float2 (&v)[QT / 8], uint32_t a, int n) {
  return PRE ? v[n] : fb_lds2(a + 32 * n);
}

/* P^T = exp2(S^T sl2 - lse2[query]) in place (the tile's lse2: fb_stat's
 * v, a) on a tile without masked elements: column (query) 8n + 2t + (e & 1). */
template <bool PRE, int QT>
__device__ __forceinline__ void fb_pt(float (&s)[QT / 2], const float2 (&v)[QT / 8], uint32_t a, float sl2) {
#pragma unroll
  for (int n = 0; n < QT / 8; n++) {
    const float2 l2 = fb_stat<PRE, QT>(v, a, n);
#pragma unroll
    for (int e = 0; e < 4; e++) s[4 * n + e] = nb_mma_exp2(fmaf(s[4 * n + e], sl2, -((e & 1) ? l2.y : l2.x)));
  }
}

/* mbarriers after the tiles: the item tiles' (K, V of a dK/dV item; Q, dO
 * of a dQ item) full barrier for buffer 0, then per stage of the ring a
 * full and an empty one, then buffer 1's full barrier and both buffers'
 * empty barriers. Item k of a CTA (counting every item, those without
 * query tiles too: the buffer and the item slot share the count) takes
 * buffer k % 2. */
struct fb_bars {
  uint32_t base;
  __device__ __forceinline__ uint32_t once(int k) const { return base + ((k & 1) ? 8 * (1 + 2 * FB_QST) : 0); }
  __device__ __forceinline__ uint32_t full(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t empty(int s) const { return base + 8 * (1 + FB_QST + s); }
  __device__ __forceinline__ uint32_t once_empty(int k) const { return base + 8 * (2 + 2 * FB_QST + (k & 1)); }
  /* the item slots (fa3_put) */
  __device__ __forceinline__ uint32_t itf(int n) const { return base + 8 * (4 + 2 * FB_QST + (n & 1)); }
  __device__ __forceinline__ uint32_t ite(int n) const { return base + 8 * (6 + 2 * FB_QST + (n & 1)); }
  /* parities of item k's waits: the consumers' on its full barrier, the
   * producer's on its empty one (fresh barriers pass parity 1) */
  __device__ static __forceinline__ uint32_t once_ph(int k) { return (uint32_t)(k >> 1) & 1; }
};

/* The work order of the persistent kernels (the split ones; the fused one
 * at D 64) is the forward's (cuda_attention_sm90.cu; the tickets fa3_next
 * and fa3_work_done in cuda_attention_sm90.cuh): the producer hands the
 * CTA's n-th item to the consumers through slot n % 2 of fb_bars, the
 * consumers take the next item at their current one's last tile. Counting
 * an item's tiles, plus half a tile for its start, a static round-robin
 * (c + k gridDim.x) would leave the slowest CTA 17% over the mean at GPT-2's
 * shape, the tickets 8% (a model, not a measurement). One CTA per item
 * (NABLA_ATTENTION_SM90_BWD_PERSISTENT=0, the fused kernel at D 128): CTA c
 * takes item c alone. The handover: fa3_put, fa3_take. */

/* The statistics of this thread's rows r0, r0 + 8 of a dQ item when the
 * dQ kernel computes them itself (p.fold: fb_q_fold's D 64, TMA maps of o
 * and dout; no pre-pass): l2 = lse log2(e) and dl = delta = dout . o, from
 * the item's dout and o tiles in shared memory (the producer loads o with
 * Q and dO) once the item's first S and dP products are issued
 * (fb_qstats_finish), and lse, loaded once the previous item's last dQ
 * product is issued (the CTA's first item: as it starts). */
struct fb_qstats {
  float lse[2], l2[2], dl[2];
  int b, r0; /* whose rows */
};

__device__ __forceinline__ void fb_qstats_load(const fb_params &p, int b, int r0, fb_qstats &x) {
  x.b = b, x.r0 = r0;
#pragma unroll
  for (int h = 0; h < 2; h++) x.lse[h] = r0 + 8 * h < p.Lq ? __ldg(p.lse + (int64_t)b * p.Lq + r0 + 8 * h) : -INFINITY;
}

/* x.l2 and x.dl, written to the scratch too (by lane t = 0) for the dK/dV
 * kernel, which runs next: the pre-pass's values, bit for bit. ga, oa: the
 * warpgroup's 64 rows of dout's and o's tiles (row rr = 16 w + g + 8 h of
 * them is x's row r0 + 8 h; rows past Lq count as zeros: TMA fills them,
 * or a half wholly past Lq is not loaded). The pre-pass sums a row's D / 8
 * 16-byte units on as many lanes, a butterfly over them (partners u ^ m, m
 * = D / 16 .. 1); here thread t takes units t D / 32 + i, so the levels m
 * = D / 16 and D / 32 pair the quad's lanes t ^ 2 and t ^ 1, and the rest
 * its own units: every addition the same, in the same order. */
template <typename T, int D>
__device__ __forceinline__ void fb_qstats_finish(const fb_params &p, int t, int w, int lane, uint32_t ga,
                                                 uint32_t oa, fb_qstats &x) {
  constexpr int NV = D / 32;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int rr = 16 * w + lane / 4 + 8 * h; /* rr % 8 == lane / 4 */
    const bool ok = x.r0 + 8 * h < p.Lq;
    float v[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int u = t * NV + i; /* 16-byte unit u of the row: block u / 8, swizzled */
      const uint32_t off = (u / 8) * FB_BM * 128 + rr * 128 + (((u % 8) ^ (lane / 4)) << 4);
      uint4 g = make_uint4(0u, 0u, 0u, 0u), o = g;
      if (ok) {
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(g.x), "=r"(g.y), "=r"(g.z), "=r"(g.w) : "r"(ga + off));
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(o.x), "=r"(o.y), "=r"(o.z), "=r"(o.w) : "r"(oa + off));
      }
      v[i] = fb_dot8<T>(g, o);
    }
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], 2);
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], 1);
#pragma unroll
    for (int m = NV / 2; m >= 1; m /= 2)
#pragma unroll
      for (int i = 0; i < m; i++) v[i] += v[i + m];
    x.l2[h] = fb_lse2(x.lse[h]);
    x.dl[h] = v[0];
    if (t == 0) { /* rows < nblk 128 <= Lp */
      const int64_t r = (int64_t)x.b * p.Lp + x.r0 + 8 * h;
      p.sl[r] = x.l2[h];
      p.sd[r] = x.dl[h];
    }
  }
}

/* Arrivals of mbarrier i (fb_bars): 1 for the full barriers (the
 * producer's, with the copy engine's bytes), nempty for the empty ones of
 * the ring and the item tiles, the 8 consumer warps for the item slots'
 * empty ones (fa3_take). */
__device__ constexpr int fb_bar_count(int i, int nempty) {
  return i < 1 + FB_QST || i == 1 + 2 * FB_QST || i == 4 + 2 * FB_QST || i == 5 + 2 * FB_QST ? 1
         : i >= 6 + 2 * FB_QST                                                            ? 8
                                                                                          : nempty;
}
} /* namespace */
#endif /* NB_SM90A_DEVICE */

#endif /* NB_CUDA_ATTENTION_SM90_BWD_CUH */
