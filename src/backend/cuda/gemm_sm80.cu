/* nabla's portable tensor-core GEMM: C = alpha * A B + beta * C for f16/bf16
 * operands with f32 accumulation, on any device of compute capability 8.0 or
 * later (it uses nothing Hopper-only: no wgmma, TMA or mbarriers).
 *
 * Structure (one CTA per output tile, in a grouped raster for L2 reuse):
 *   - Tile configurations: 128x128x32 with 8 warps (warp tile 64x32, 4
 *     stages, 2 CTAs/SM), split over K when its tiles leave a quarter of the
 *     CTA slots idle over a long K (dW-like shapes: f32 partial sums in
 *     scratch, then a fixed-order reduction); 64x64x32 with 4 warps for small
 *     products. 128x256x32 and 128x256x64 (warp tile 64x64, 1 CTA/SM) exist
 *     for tuning: NABLA_SM80_TILE=small|large|wide|wide64 forces one.
 *   - Loads: each thread moves 16-byte chunks with cp.async.cg (L2 only,
 *     the data is reused from shared memory), committed per k-tile and
 *     waited with cp.async.wait_group STAGES-2, so three k-tiles are in
 *     flight while one is computed. Out-of-range chunks (M, N, K tails) copy
 *     0..14 bytes and zero-fill the rest. An operand whose contiguous axis is
 *     not unit-stride, or whose row stride or base is not 16-byte aligned
 *     (K = 67, a sliced view), is loaded element by element into the same
 *     layout: correct, slower.
 *   - Layout: a K-major operand (row-major A, B given as W (N, K)) is kept as
 *     rows x 32 k, an MN-major one (transposed views) as 32 k x rows, each
 *     row padded by 8 elements (16 bytes), so the 8 rows an ldmatrix phase
 *     reads fall in 8 different 16-byte bank groups: no bank conflicts.
 *   - Fragments: ldmatrix.x4 for K-major tiles and ldmatrix.x4.trans for
 *     MN-major ones give exactly the mma.sync.m16n8k16 operand fragments,
 *     so NN, NT, TN and TT all run without transposed copies.
 *   - Epilogue: alpha/beta in f32, converted to the output's dtype (bf16,
 *     f16 or f32), stored straight from the accumulator fragments with
 *     bounds checks (pairs when the output rows are contiguous).
 * Batched products run on grid.z with one batch stride per operand; other
 * batch axes loop on the host. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/gemm_sm80.h"

namespace {

/* A tile configuration: BM x BN x BK block tile, WARPS_M x WARPS_N warps. */
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct sm80_cfg {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_;
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N; /* warp tile */
  static constexpr int MI = WTM / 16, NI = WTN / 8;             /* mma tiles per warp */
  static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0 && BK % 16 == 0, "tile shape");
};
typedef sm80_cfg<64, 64, 32, 2, 2, 4, 4> sm80_small;
typedef sm80_cfg<128, 128, 32, 2, 4, 4, 2> sm80_large;
typedef sm80_cfg<128, 256, 32, 2, 4, 4, 1> sm80_wide;   /* warp tile 64x64 */
typedef sm80_cfg<128, 256, 64, 2, 4, 3, 1> sm80_wide64; /* same, 64-deep k-tiles */

/* Shared-memory tile of one operand: K-major (rows = M or N, cols = k) or
 * MN-major (rows = k, cols = M or N); rows padded by 8 elements. */
template <int BK, int MN, int KMAJ> struct sm80_tile {
  static constexpr int ROWS = KMAJ ? MN : BK, COLS = KMAJ ? BK : MN;
  static constexpr int PITCH = COLS + 8;
  static constexpr int ELEMS = ROWS * PITCH;
};

/* An operand as its shared-memory tile sees it: element (row, col) at
 * p[row * rs + col * cs]; vec: cs == 1 and 16-byte aligned rows. */
struct sm80_operand {
  const uint16_t *p;
  int64_t rs, cs, bs; /* row, column and batch strides in elements */
  int vec;
};

struct sm80_params {
  sm80_operand a, b;
  void *c;
  int64_t c_rs, c_cs, c_bs;
  int M, N, K, tiles_m, tiles_n;
  float alpha, beta;
  int c_dt;    /* 0 bf16, 1 f16, 2 f32 */
  int c_pairs; /* columns contiguous and pair stores aligned */
  /* split-K: blockIdx.y takes k-tiles [y * kt_split, (y + 1) * kt_split) and
   * writes f32 partial sums to ws + y * M * N (row-major); NULL: no split */
  float *ws;
  int kt_split;
};

/* The tensor-core building blocks (cp.async, ldmatrix, mma.sync) are
 * cuda_mma.cuh's, shared with the flash-attention kernels. */

/* Loads rows [row0, row0 + TILE::ROWS) x cols [col0, col0 + TILE::COLS) of
 * an operand (rows x cols in all) into a shared tile, zero outside. */
template <class TILE, int THREADS>
__device__ __forceinline__ void sm80_load(uint16_t *s, const sm80_operand &o, const uint16_t *base,
                                          int row0, int rows, int col0, int cols) {
  constexpr int CPR = TILE::COLS / 8, CHUNKS = TILE::ROWS * CPR;
  static_assert(CHUNKS % THREADS == 0, "chunks per thread");
#pragma unroll
  for (int j = 0; j < CHUNKS / THREADS; j++) {
    int i = threadIdx.x + j * THREADS, r = i / CPR, c = (i % CPR) * 8;
    int gr = row0 + r, gc = col0 + c;
    uint16_t *dst = s + r * TILE::PITCH + c;
    int n = gr < rows ? min(max(cols - gc, 0), 8) : 0; /* elements in range */
    if (o.vec) {
      const uint16_t *src = n ? base + (int64_t)gr * o.rs + gc : base;
      nb_mma_cp16(nb_mma_smem(dst), src, 2 * n);
    } else { /* element loads: any strides, any alignment */
      uint32_t w[4];
      const uint16_t *src = base + (int64_t)gr * o.rs + (int64_t)gc * o.cs;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        uint32_t lo = 2 * e < n ? src[(int64_t)(2 * e) * o.cs] : 0;
        uint32_t hi = 2 * e + 1 < n ? src[(int64_t)(2 * e + 1) * o.cs] : 0;
        w[e] = lo | hi << 16;
      }
      *(uint4 *)dst = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

/* Output tile t in a raster where 8 tile rows walk N together, so their A
 * rows and B columns stay in L2. */
__device__ __forceinline__ void sm80_tile_of(int t, int tiles_m, int tiles_n, int *tm, int *tn) {
  const int group = 8;
  int per_group = group * tiles_n, first = (t / per_group) * group;
  int gsize = min(tiles_m - first, group);
  *tm = first + (t % per_group) % gsize;
  *tn = (t % per_group) / gsize;
}

/* One k-tile of this warp's MMAs from shared stage (sa, sb). Lane l feeds
 * row l%8 of 8x8 matrix l/8 to ldmatrix; the four matrices of an x4 load
 * are the a0..a3 registers of one m16 tile, or b0, b1 of two n8 tiles. */
template <typename T, class CFG, int TA, int TB>
__device__ __forceinline__ void sm80_compute(float (&acc)[CFG::MI][CFG::NI][4], const uint16_t *sa,
                                             const uint16_t *sb, int wm, int wn, int lane) {
  typedef sm80_tile<CFG::BK, CFG::BM, !TA> SA;
  typedef sm80_tile<CFG::BK, CFG::BN, !TB> SB;
  const int q = lane >> 3, r = lane & 7;
  /* A: K-major rows r + 8(q&1), k 8(q>>1); MN-major k r + 8(q>>1), m 8(q&1) */
  const uint32_t a0 = TA ? nb_mma_smem(sa + (r + 8 * (q >> 1)) * SA::PITCH + wm * CFG::WTM + 8 * (q & 1))
                         : nb_mma_smem(sa + (wm * CFG::WTM + r + 8 * (q & 1)) * SA::PITCH + 8 * (q >> 1));
  /* B: K-major n r + 8(q>>1), k 8(q&1); MN-major k r + 8(q&1), n 8(q>>1) */
  const uint32_t b0 = TB ? nb_mma_smem(sb + (r + 8 * (q & 1)) * SB::PITCH + wn * CFG::WTN + 8 * (q >> 1))
                         : nb_mma_smem(sb + (wn * CFG::WTN + r + 8 * (q >> 1)) * SB::PITCH + 8 * (q & 1));
#pragma unroll
  for (int kk = 0; kk < CFG::BK / 16; kk++) {
    uint32_t af[CFG::MI][4], bf[CFG::NI][2];
#pragma unroll
    for (int mi = 0; mi < CFG::MI; mi++) {
      if (TA) nb_mma_ldsm_t(af[mi], a0 + 2 * (kk * 16 * SA::PITCH + mi * 16));
      else nb_mma_ldsm(af[mi], a0 + 2 * (mi * 16 * SA::PITCH + kk * 16));
    }
#pragma unroll
    for (int nj = 0; nj < CFG::NI / 2; nj++) {
      uint32_t t4[4];
      if (TB) nb_mma_ldsm_t(t4, b0 + 2 * (kk * 16 * SB::PITCH + nj * 16));
      else nb_mma_ldsm(t4, b0 + 2 * (nj * 16 * SB::PITCH + kk * 16));
      bf[2 * nj][0] = t4[0];
      bf[2 * nj][1] = t4[1];
      bf[2 * nj + 1][0] = t4[2];
      bf[2 * nj + 1][1] = t4[3];
    }
#pragma unroll
    for (int mi = 0; mi < CFG::MI; mi++)
#pragma unroll
      for (int ni = 0; ni < CFG::NI; ni++) nb_mma<T>::run(acc[mi][ni], af[mi], bf[ni]);
  }
}

__device__ __forceinline__ float sm80_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float sm80_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ float sm80_ld(const float *p) { return *p; }
__device__ __forceinline__ void sm80_st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void sm80_st(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void sm80_st(float *p, float v) { *p = v; }
/* Two adjacent columns (pointer aligned to two elements). */
__device__ __forceinline__ void sm80_st2(__nv_bfloat16 *p, float a, float b) {
  *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void sm80_st2(__half *p, float a, float b) {
  *(__half2 *)p = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void sm80_st2(float *p, float a, float b) { *(float2 *)p = make_float2(a, b); }

/* Accumulator (mi, ni, j) of lane (g = l/4, t = l%4) is row 16mi + g + 8(j/2),
 * column 8ni + 2t + j%2 of the warp tile. */
template <typename TO, class CFG>
__device__ __forceinline__ void sm80_epilogue(const sm80_params &p, float (&acc)[CFG::MI][CFG::NI][4],
                                              int row0, int col0, int lane) {
  TO *C = (TO *)p.c + (int64_t)blockIdx.z * p.c_bs;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < CFG::MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int row = row0 + mi * 16 + g + 8 * h;
      if (row >= p.M) continue;
      TO *crow = C + (int64_t)row * p.c_rs;
#pragma unroll
      for (int ni = 0; ni < CFG::NI; ni++) {
        int col = col0 + ni * 8 + 2 * t;
        float v0 = p.alpha * acc[mi][ni][2 * h], v1 = p.alpha * acc[mi][ni][2 * h + 1];
        TO *c0 = crow + (int64_t)col * p.c_cs, *c1 = c0 + p.c_cs;
        if (p.c_pairs && col + 1 < p.N) {
          if (p.beta != 0.0f) { /* beta == 0: out is never read (it may hold NaN) */
            v0 += p.beta * sm80_ld(c0);
            v1 += p.beta * sm80_ld(c1);
          }
          sm80_st2(c0, v0, v1);
        } else {
          if (col < p.N) sm80_st(c0, p.beta != 0.0f ? v0 + p.beta * sm80_ld(c0) : v0);
          if (col + 1 < p.N) sm80_st(c1, p.beta != 0.0f ? v1 + p.beta * sm80_ld(c1) : v1);
        }
      }
    }
}

/* TA / TB: 1 when A / B is MN-major in memory (a transposed view). */
template <typename T, class CFG, int TA, int TB>
__global__ void __launch_bounds__(CFG::THREADS, CFG::MIN_BLOCKS) sm80_gemm_kernel(const sm80_params p) {
  typedef sm80_tile<CFG::BK, CFG::BM, !TA> SA;
  typedef sm80_tile<CFG::BK, CFG::BN, !TB> SB;
  constexpr int STAGE = SA::ELEMS + SB::ELEMS, BK = CFG::BK;
  extern __shared__ __align__(16) uint16_t sm80_ring[];
  int tm, tn;
  sm80_tile_of(blockIdx.x, p.tiles_m, p.tiles_n, &tm, &tn);
  const int m0 = tm * CFG::BM, n0 = tn * CFG::BN;
  const uint16_t *A = p.a.p + (int64_t)blockIdx.z * p.a.bs, *B = p.b.p + (int64_t)blockIdx.z * p.b.bs;
  const int kt0 = blockIdx.y * p.kt_split;
  const int ktiles = max(min((p.K + BK - 1) / BK - kt0, p.kt_split), 0);
  /* k-tile kt0 + kt into stage s; a k-tile past the end issues nothing */
  auto load = [&](int kt, int s) {
    if (kt >= ktiles) return;
    uint16_t *sa = sm80_ring + s * STAGE, *sb = sa + SA::ELEMS;
    int k0 = (kt0 + kt) * BK;
    if (TA) sm80_load<SA, CFG::THREADS>(sa, p.a, A, k0, p.K, m0, p.M);
    else sm80_load<SA, CFG::THREADS>(sa, p.a, A, m0, p.M, k0, p.K);
    if (TB) sm80_load<SB, CFG::THREADS>(sb, p.b, B, k0, p.K, n0, p.N);
    else sm80_load<SB, CFG::THREADS>(sb, p.b, B, n0, p.N, k0, p.K);
  };
  float acc[CFG::MI][CFG::NI][4];
#pragma unroll
  for (int mi = 0; mi < CFG::MI; mi++)
#pragma unroll
    for (int ni = 0; ni < CFG::NI; ni++)
#pragma unroll
      for (int j = 0; j < 4; j++) acc[mi][ni][j] = 0.0f;
  /* one commit group per k-tile, empty ones too, so wait_group counts k-tiles */
#pragma unroll
  for (int s = 0; s < CFG::STAGES - 1; s++) {
    load(s, s);
    nb_mma_commit();
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / CFG::WARPS_N, wn = warp % CFG::WARPS_N;
  for (int kt = 0; kt < ktiles; kt++) {
    nb_mma_wait<CFG::STAGES - 2>(); /* this thread's copies of k-tile kt landed */
    __syncthreads();              /* everyone's did; and stage kt-1 is no longer read */
    load(kt + CFG::STAGES - 1, (kt + CFG::STAGES - 1) % CFG::STAGES);
    nb_mma_commit();
    const uint16_t *sa = sm80_ring + (kt % CFG::STAGES) * STAGE;
    sm80_compute<T, CFG, TA, TB>(acc, sa, sa + SA::ELEMS, wm, wn, lane);
  }
  nb_mma_wait<0>(); /* nothing left in flight when the CTA exits */
  const int row0 = m0 + wm * CFG::WTM, col0 = n0 + wn * CFG::WTN;
  if (p.ws) { /* a split-K slice: f32 partial sums, summed by sm80_splitk_reduce */
    sm80_params q = p;
    q.c = p.ws + (int64_t)blockIdx.y * p.M * p.N;
    q.c_rs = p.N;
    q.c_cs = 1;
    q.alpha = 1.0f;
    q.beta = 0.0f;
    q.c_pairs = p.N % 2 == 0;
    sm80_epilogue<float, CFG>(q, acc, row0, col0, lane);
  } else if (p.c_dt == 0) sm80_epilogue<__nv_bfloat16, CFG>(p, acc, row0, col0, lane);
  else if (p.c_dt == 1) sm80_epilogue<__half, CFG>(p, acc, row0, col0, lane);
  else sm80_epilogue<float, CFG>(p, acc, row0, col0, lane);
}

/* out = alpha * (sum of the splits' partial sums) + beta * out, in a fixed
 * order (the same bits on every run). */
template <typename TO>
__global__ void sm80_splitk_reduce(const sm80_params p, int splits) {
  int64_t mn = (int64_t)p.M * p.N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < mn;
       i += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int y = 0; y < splits; y++) s += p.ws[y * mn + i];
    int64_t m = i / p.N, n = i - m * p.N;
    TO *c = (TO *)p.c + m * p.c_rs + n * p.c_cs;
    float v = p.alpha * s;
    if (p.beta != 0.0f) v += p.beta * sm80_ld(c);
    sm80_st(c, v);
  }
}

} /* namespace */

/* ---- host --------------------------------------------------------------- */
template <class CFG, int TA, int TB> static constexpr int sm80_smem_bytes(void) {
  return CFG::STAGES * 2 *
         (sm80_tile<CFG::BK, CFG::BM, !TA>::ELEMS + sm80_tile<CFG::BK, CFG::BN, !TB>::ELEMS);
}

/* Launches batches [0, count) of p, at most 65535 per grid (grid.z), with
 * splits k-slices on grid.y (count 1 only). */
template <typename T, class CFG, int TA, int TB>
static nb_status sm80_launch(const nb_cuda_ctx *ctx, sm80_params p, int64_t count, int splits) {
  auto kern = sm80_gemm_kernel<T, CFG, TA, TB>;
  constexpr int smem = sm80_smem_bytes<CFG, TA, TB>();
  NB_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
              "matmul sm80: shared memory attribute");
  p.tiles_m = (p.M + CFG::BM - 1) / CFG::BM;
  p.tiles_n = (p.N + CFG::BN - 1) / CFG::BN;
  unsigned tiles = (unsigned)((int64_t)p.tiles_m * p.tiles_n);
  const size_t c_es = p.c_dt == 2 ? 4 : 2;
  for (int64_t z = 0; z < count; z += 65535) {
    unsigned nz = (unsigned)(count - z < 65535 ? count - z : 65535);
    kern<<<dim3(tiles, (unsigned)splits, nz), CFG::THREADS, smem, ctx->stream>>>(p);
    nb_status st = nb_cuda_launch_check("sm80_gemm_kernel");
    if (st) return st;
    p.a.p += 65535 * p.a.bs;
    p.b.p += 65535 * p.b.bs;
    p.c = (char *)p.c + 65535 * p.c_bs * (int64_t)c_es;
  }
  return NB_OK;
}

template <typename T, class CFG>
static nb_status sm80_layouts(const nb_cuda_ctx *ctx, int ta, int tb, const sm80_params &p,
                              int64_t count, int splits) {
  if (!ta && !tb) return sm80_launch<T, CFG, 0, 0>(ctx, p, count, splits);
  if (!ta && tb) return sm80_launch<T, CFG, 0, 1>(ctx, p, count, splits);
  if (ta && !tb) return sm80_launch<T, CFG, 1, 0>(ctx, p, count, splits);
  return sm80_launch<T, CFG, 1, 1>(ctx, p, count, splits);
}

/* Tiles of bm x bn over the product, times the batch count. */
static int64_t sm80_tiles(const sm80_params &p, int bm, int bn, int64_t count) {
  return (((int64_t)p.M + bm - 1) / bm) * (((int64_t)p.N + bn - 1) / bn) * count;
}

/* k-slices for a large-tile product that leaves a quarter or more of the
 * CTA slots (2 per SM) idle over a K of 1024 or more: the fewest (>= 2) whose
 * CTAs fill their last wave to 85%, each slice at least 8 k-tiles; 1 when
 * no split pays. */
static int sm80_splits(const sm80_params &p, int64_t tiles, int n_sm) {
  int ktiles = (p.K + 31) / 32, best = 1;
  double best_eff = (double)tiles / (2.0 * n_sm);
  int64_t slots = 2 * (int64_t)n_sm;
  if (4 * tiles > 3 * slots || ktiles < 32) return 1;
  for (int s = 2; s <= 16 && ktiles / s >= 8; s++) {
    double waves = (double)(tiles * s) / slots, eff = waves / ceil(waves);
    if (eff > best_eff + 1e-9) { best_eff = eff; best = s; }
    if (eff >= 0.85) return s;
  }
  return best;
}

/* NABLA_SM80_TILE=small|large|wide|wide64 forces one configuration (for
 * benchmarks; no split-K then); -1 when unset. */
static int sm80_forced_tile(void) {
  static int forced = -2;
  if (forced == -2) {
    const char *e = getenv("NABLA_SM80_TILE");
    static const char *const names[] = {"small", "large", "wide", "wide64"};
    forced = -1;
    for (int i = 0; e && i < 4; i++)
      if (!strcmp(e, names[i])) forced = i;
  }
  return forced;
}

/* The device's opt-in shared memory per block (cached): the 128x256
 * configurations need more than GPUs of compute capability 8.6/8.9 have. */
static int sm80_smem_optin(int dev) {
  static int cache[64];
  if (dev < 0 || dev >= 64) return 0;
  if (!cache[dev]) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) v = -1;
    cudaGetLastError();
    cache[dev] = v;
  }
  return cache[dev];
}

/* Sums the split-K partials of p (its ws) into its output. */
static nb_status sm80_reduce(const nb_cuda_ctx *ctx, const sm80_params &p, int splits) {
  int64_t mn = (int64_t)p.M * p.N;
  unsigned blocks = nb_cuda_blocks(ctx, mn, 256);
  if (p.c_dt == 0) sm80_splitk_reduce<__nv_bfloat16><<<blocks, 256, 0, ctx->stream>>>(p, splits);
  else if (p.c_dt == 1) sm80_splitk_reduce<__half><<<blocks, 256, 0, ctx->stream>>>(p, splits);
  else sm80_splitk_reduce<float><<<blocks, 256, 0, ctx->stream>>>(p, splits);
  return nb_cuda_launch_check("sm80_splitk_reduce");
}

/* Picks the configuration: 128x128 split over K when its tiles leave a
 * quarter of the CTA slots idle over a long K (no batch); else 128x128 when
 * it gives a CTA per SM; else 64x64. The 128x256 tiles ran slower on the H100
 * (4096^3 bf16: 243 against 271 TFLOP/s; 8 warps per SM hide less latency
 * than 16), so only NABLA_SM80_TILE selects them. */
template <typename T>
static nb_status sm80_configs(const nb_cuda_ctx *ctx, int ta, int tb, sm80_params p,
                              int64_t count) {
  p.kt_split = INT32_MAX;
  p.ws = NULL;
  int forced = sm80_forced_tile(), optin = sm80_smem_optin(ctx->dev);
  int64_t large = sm80_tiles(p, 128, 128, count);
  /* the K-major layout (0, 0) is the larger one */
  int wide_ok = optin >= sm80_smem_bytes<sm80_wide, 0, 0>();
  int wide64_ok = optin >= sm80_smem_bytes<sm80_wide64, 0, 0>();
  if (forced == 0) return sm80_layouts<T, sm80_small>(ctx, ta, tb, p, count, 1);
  if (forced == 1) return sm80_layouts<T, sm80_large>(ctx, ta, tb, p, count, 1);
  if (forced == 2 && wide_ok) return sm80_layouts<T, sm80_wide>(ctx, ta, tb, p, count, 1);
  if (forced == 3 && wide64_ok) return sm80_layouts<T, sm80_wide64>(ctx, ta, tb, p, count, 1);
  int splits = count == 1 ? sm80_splits(p, large, ctx->n_sm) : 1;
  if (splits > 1) {
    int ktiles = (p.K + 31) / 32;
    p.kt_split = (ktiles + splits - 1) / splits;
    splits = (ktiles + p.kt_split - 1) / p.kt_split; /* no empty slice */
    size_t bytes = (size_t)splits * p.M * p.N * sizeof(float);
    p.ws = (float *)nb_cuda_scratch(ctx, bytes);
    if (!p.ws) return nb_last_status();
    nb_status st = sm80_layouts<T, sm80_large>(ctx, ta, tb, p, 1, splits);
    if (!st) st = sm80_reduce(ctx, p, splits);
    nb_cuda_scratch_free(ctx, p.ws, bytes);
    return st;
  }
  if (large >= ctx->n_sm) return sm80_layouts<T, sm80_large>(ctx, ta, tb, p, count, 1);
  return sm80_layouts<T, sm80_small>(ctx, ta, tb, p, count, 1);
}

/* One operand's shared-tile view from its strides along M-or-N (s_mn) and K
 * (s_k): K-major when k is contiguous, MN-major (*t = 1) when M or N is,
 * else K-major with element loads. */
static sm80_operand sm80_operand_of(const void *p, int64_t mn, int64_t K, int64_t s_mn, int64_t s_k,
                                    int *t) {
  sm80_operand o;
  o.p = (const uint16_t *)p;
  o.bs = 0;
  *t = 0;
  if (s_k == 1 || K == 1) {
    o.rs = mn == 1 ? 0 : s_mn;
    o.cs = 1;
  } else if (s_mn == 1 || mn == 1) {
    *t = 1;
    o.rs = s_k;
    o.cs = 1;
  } else {
    o.rs = s_mn;
    o.cs = s_k;
  }
  o.vec = 0;
  return o;
}

/* cp.async needs 16-byte aligned rows (and batches) of a unit-stride axis. */
static int sm80_vec_ok(const sm80_operand &o, int64_t count) {
  return o.cs == 1 && o.rs % 8 == 0 && ((uintptr_t)o.p & 15) == 0 && (count <= 1 || o.bs % 8 == 0);
}

static int sm80_dt_code(nb_dtype dt) { return dt == NB_BF16 ? 0 : dt == NB_F16 ? 1 : 2; }

/* Runs the product over the batch axes (validated views, a and b with out's
 * ndim): the innermost coalesced batch axis goes to grid.z, the rest loop. */
static nb_status sm80_run(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                          const nb_kview *b, float alpha, float beta) {
  int od = out->ndim, nbd = od - 2;
  int64_t M = out->shape[od - 2], N = out->shape[od - 1], K = a->shape[od - 1];
  if (M == 0 || N == 0) return NB_OK;
  sm80_params p;
  memset(&p, 0, sizeof p);
  int ta, tb;
  p.a = sm80_operand_of(a->data, M, K, a->strides[od - 2], a->strides[od - 1], &ta);
  p.b = sm80_operand_of(b->data, N, K, b->strides[od - 1], b->strides[od - 2], &tb);
  p.M = (int)M;
  p.N = (int)N;
  p.K = (int)K;
  p.c_rs = out->strides[od - 2];
  p.c_cs = N == 1 ? 1 : out->strides[od - 1];
  p.alpha = alpha;
  p.beta = beta;
  p.c_dt = sm80_dt_code(out->dtype);
  const int64_t *st[3] = {out->strides, a->strides, b->strides};
  nb_iter it;
  nb_iter_make(&it, nbd, out->shape, 3, st);
  int inner = it.ndim - 1;
  int64_t count = it.size[inner], outer = 1;
  for (int d = 0; d < inner; d++) outer *= it.size[d];
  p.c_bs = it.stride[0][inner];
  p.a.bs = it.stride[1][inner];
  p.b.bs = it.stride[2][inner];
  const size_t es = 2, c_es = nb_dtype_size(out->dtype);
  for (int64_t o = 0; o < outer; o++) {
    int64_t off[3] = {0, 0, 0}, r = o;
    for (int d = inner - 1; d >= 0; d--) {
      int64_t q = r / it.size[d], c = r - q * it.size[d];
      for (int k = 0; k < 3; k++) off[k] += c * it.stride[k][d];
      r = q;
    }
    sm80_params q = p;
    q.c = (char *)out->data + off[0] * (int64_t)c_es;
    q.a.p = (const uint16_t *)((const char *)a->data + off[1] * (int64_t)es);
    q.b.p = (const uint16_t *)((const char *)b->data + off[2] * (int64_t)es);
    q.a.vec = sm80_vec_ok(q.a, count);
    q.b.vec = sm80_vec_ok(q.b, count);
    q.c_pairs = p.c_cs == 1 && ((uintptr_t)q.c % (2 * c_es)) == 0 && (M == 1 || p.c_rs % 2 == 0) &&
                (count <= 1 || p.c_bs % 2 == 0);
    nb_status s = a->dtype == NB_BF16 ? sm80_configs<__nv_bfloat16>(ctx, ta, tb, q, count)
                                      : sm80_configs<__half>(ctx, ta, tb, q, count);
    if (s) return s;
  }
  return NB_OK;
}

/* Compute capability major of dev (cached; 0 when unknown). */
static int sm80_cc_major(int dev) {
  static int cache[64];
  if (dev < 0 || dev >= 64) return 0;
  if (!cache[dev]) {
    int ma = 0;
    if (cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) ma = -1;
    cudaGetLastError();
    cache[dev] = ma;
  }
  return cache[dev];
}

/* 1 when the views fit a product the kernel takes (sizes within int, tile
 * counts within a grid). */
static int sm80_fits(const nb_kview *out, const nb_kview *a, const nb_kview *b) {
  int od = out->ndim;
  if (od < 2 || a->ndim != od || b->ndim != od) return 0;
  int64_t M = out->shape[od - 2], N = out->shape[od - 1], K = a->shape[od - 1];
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return 0;
  return ((M + 63) / 64) * ((N + 63) / 64) <= INT32_MAX;
}

int nb_sm80_matmul(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                   const nb_kview *b, int backend, nb_status *st) {
  *st = NB_OK;
  nb_dtype dt = a->dtype;
  if ((dt != NB_F16 && dt != NB_BF16) || b->dtype != dt) return 0;
  if (out->dtype != dt && out->dtype != NB_F32) return 0;
  int cc = sm80_cc_major(ctx->dev);
  if (cc < 8 || (backend == 1 && cc == 9)) return 0;
  if (!sm80_fits(out, a, b)) return 0;
  *st = sm80_run(ctx, out, a, b, 1.0f, 0.0f);
  return 1;
}

extern "C" nb_status nb_sm80_gemm(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                                  float alpha, float beta) {
  nb_dtype dt = a->dtype;
  if ((dt != NB_F16 && dt != NB_BF16) || b->dtype != dt || (out->dtype != dt && out->dtype != NB_F32))
    return nb_error_set(NB_ERR_DTYPE, "matmul sm80: dtypes a %s, b %s, out %s (expected f16 or "
                        "bf16 operands of one dtype, out in that dtype or f32)",
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype), nb_dtype_name(out->dtype));
  int od = out->ndim;
  int ok = od >= 2 && a->ndim == od && b->ndim == od;
  for (int d = 0; ok && d < od - 2; d++)
    ok = a->shape[d] == out->shape[d] && b->shape[d] == out->shape[d];
  if (ok)
    ok = a->shape[od - 2] == out->shape[od - 2] && b->shape[od - 1] == out->shape[od - 1] &&
         a->shape[od - 1] == b->shape[od - 2];
  if (!ok || !sm80_fits(out, a, b)) {
    char sa[96], sb[96], so[96];
    return nb_error_set(NB_ERR_SHAPE, "matmul sm80: shapes a %s @ b %s -> out %s do not form "
                        "(B.., M, K) @ (B.., K, N) -> (B.., M, N) within 32-bit sizes",
                        nb_shape_str(a->ndim, a->shape, sa, sizeof sa),
                        nb_shape_str(b->ndim, b->shape, sb, sizeof sb),
                        nb_shape_str(od, out->shape, so, sizeof so));
  }
  NB_CUDA_ENTER(ctx, st, out->data, "matmul sm80");
  int cc = sm80_cc_major(ctx.dev);
  if (cc < 8)
    return nb_error_set(NB_ERR_UNSUPPORTED, "matmul sm80: device %d has compute capability %d.x "
                        "(needs 8.0 or later)", ctx.dev, cc);
  return sm80_run(&ctx, out, a, b, alpha, beta);
}
