/* nabla's FP8 GEMM (nb_scaled_mm on CUDA): out (M x N) = s_a s_b (A (M x K) B (K x N)) for
 * e4m3/e5m2 operands (any mix), f32 accumulation, out bf16, f16 or f32.
 *
 * The sm_90a kernel has the own bf16 GEMM's structure (gemm_sm90.cu), data-parallel only:
 *   - a persistent grid of min(tiles, SMs) CTAs, each taking 128 x 256 output tiles in turn
 *     in the grouped raster (8 tile rows walk N together, so their A and B panels stay in L2);
 *   - 384 threads: warpgroup 0 the producer (setmaxnreg.dec 40; one thread issues the TMA
 *     copies), warpgroups 1 and 2 the consumers (setmaxnreg.inc 232), each owning 64 rows x
 *     256 columns of the tile: 128 f32 accumulators per thread;
 *   - a 4-stage ring of 48 KB stages: A 128 rows x 128 k, B 256 rows x 128 k, one byte per
 *     element, so a k-tile is 128 elements = 128 bytes per row, the width of the 128-byte
 *     swizzle (TMA writes it, the wgmma descriptors read it); "full" and "empty" mbarriers
 *     per stage, phases from a running k-tile counter, so the ring flows across tiles;
 *   - both operands K-major, which FP8 wgmma requires (its transpose bits exist only for
 *     16-bit types): A row-major (M, K), B given as (K, N) with its K axis contiguous, i.e.
 *     the transpose of a row-major (N, K) matrix: the NT layout. Byte for byte the stage has
 *     the layout of the bf16 kernel's K-major stages (64 bf16 = 128 bytes per row), so the
 *     descriptors are the same: 128-byte swizzle, 8-row groups 1024 B apart (SBO), LBO
 *     unused, and each k32 step of wgmma advances the start address by 32 bytes;
 *   - wgmma.mma_async.sync.aligned.m64n256k32.f32.{e4m3,e5m2}.{e4m3,e5m2}, four per k-tile,
 *     commit, wait_group 1: one k-tile in flight, the stage before it released;
 *   - the epilogue multiplies the accumulators by s_a s_b (read once from device memory:
 *     no host wait; the scales are applied exactly once, to the full sum) and stores through
 *     the bf16 kernel's staging scheme (stmatrix / st.shared into 128-byte swizzled 8 KB
 *     buffers, fence.proxy.async, a TMA store per 64 x 128-byte chunk) or, when TMA cannot
 *     describe the output, directly.
 * The accumulators are the wgmma's own f32 registers over the whole K (what torch._scaled_mm
 * calls use_fast_accum=True; cuBLAS's default promotes partial sums into a second f32
 * accumulator, which m64n256 tiles have no registers for).
 * Out-of-bounds rows, columns and k are zero-filled by TMA.
 *
 * Everything else (other layouts, other devices, the sm_80 build) takes a portable kernel:
 * 64 x 64 output tiles, both operands decoded into f32 shared-memory tiles, f32 FMA, any
 * strides; NABLA_SCALED_MM=portable forces it (tests compare both paths). */
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sm90.cuh"
#include "backend/cuda/gemm_sm90_plan.h"
#include "backend/cuda/gemm_sm90_store.cuh"

namespace {

constexpr int kBM = 128, kBN = 256, kBK = 128, kStages = 4, kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK; /* one byte per element */
constexpr int kStageBytes = kABytes + kBBytes;          /* 48 KB */
constexpr int kOutBuf = NB_SM90_OUT_BUF;                /* a staging chunk (gemm_sm90_store.cuh) */
constexpr int kOutBytes = kConsumers * 2 * kOutBuf;
constexpr size_t kSmem = (size_t)kStages * kStageBytes + kOutBytes + 1024 + 2 * kStages * sizeof(uint64_t);
struct f8_params {
  int M, N, K, tiles_m, tiles_n, ktiles;
  const float *sa, *sb; /* the scales, one f32 each, on the device */
  void *c;
  int64_t ldc;
  int tma_c, pairs_c;
};

#ifdef NB_SM90A_DEVICE
constexpr int kGroup = 8; /* the raster: this many tile rows walk N together */

/* d (+)= A(desc da) * B(desc db) over k32; scale_d 0 overwrites d. FP8 wgmma has no
 * transpose immediates: both operands K-major. imm-scale-a/b are 1 (no negation). */
#define NB_F8_WGMMA(TA, TB)                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                   \
               "wgmma.mma_async.sync.aligned.m64n256k32.f32." TA "." TB " "     \
               NB_SM90_ACC128 ", %128, %129, p, 1, 1;\n}\n"                     \
               : NB_SM90_OUT128 : "l"(da), "l"(db), "r"(scale_d))

/* EA, EB: 1 for e4m3, 0 for e5m2 */
template <int EA, int EB>
__device__ __forceinline__ void f8_mma(float *d, uint64_t da, uint64_t db, uint32_t scale_d) {
  if (EA && EB) NB_F8_WGMMA("e4m3", "e4m3");
  else if (EA) NB_F8_WGMMA("e4m3", "e5m2");
  else if (EB) NB_F8_WGMMA("e5m2", "e4m3");
  else NB_F8_WGMMA("e5m2", "e5m2");
}

/* Tile t in the grouped raster: kGroup tile rows walk N together. */
__device__ __forceinline__ void f8_tile(int t, const f8_params &p, int *m0, int *n0) {
  int per_group = kGroup * p.tiles_n, first_m = (t / per_group) * kGroup;
  int gsize = min(p.tiles_m - first_m, kGroup);
  *m0 = (first_m + (t % per_group) % gsize) * kBM;
  *n0 = ((t % per_group) / gsize) * kBN;
}

/* Producer (one thread): the k-tiles of this CTA's tiles into the ring. A stage is one
 * A box (128 k x 128 rows) and one B box (128 k x 256 rows); the full barrier expects
 * both boxes' bytes (zero-filled parts count too). */
__device__ __forceinline__ void f8_produce(const CUtensorMap *ma, const CUtensorMap *mb,
                                           const f8_params &p, uint32_t ring, uint32_t full,
                                           uint32_t empty) {
  int it = 0;
  for (int t = blockIdx.x; t < p.tiles_m * p.tiles_n; t += gridDim.x) {
    int m0, n0;
    f8_tile(t, p, &m0, &n0);
    for (int kt = 0; kt < p.ktiles; kt++, it++) {
      int s = it % kStages;
      sm90_bar_wait(empty + 8 * s, (uint32_t)((it / kStages) & 1) ^ 1); /* fresh: parity 1 passes */
      uint32_t fb = full + 8 * s, sa = ring + s * kStageBytes;
      sm90_bar_expect(fb, kStageBytes);
      sm90_tma_load(sa, ma, fb, kt * kBK, m0);
      sm90_tma_load(sa + kABytes, mb, fb, kt * kBK, n0);
    }
  }
}

/* Consumer c: rows [64c, 64c + 64) of a tile, all 256 columns, over the ring's k-tiles
 * it0 .. it0 + ktiles - 1. A consumer's A rows start 64 x 128 B = 8 KB into the stage
 * (1024-aligned: the swizzle pattern repeats every 8 rows of 128 B). */
template <int EA, int EB>
__device__ __forceinline__ void f8_consume(float *d, int c, uint32_t ring, uint32_t full,
                                           uint32_t empty, int it0, int ktiles, int lead) {
  for (int kt = 0; kt < ktiles; kt++) {
    int it = it0 + kt, s = it % kStages;
    sm90_bar_wait(full + 8 * s, (uint32_t)((it / kStages) & 1));
    uint32_t sa = ring + s * kStageBytes + c * (64 * kBK), sb = ring + s * kStageBytes + kABytes;
    sm90_fence_acc(d);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < kBK / 32; k++) /* k32 = 32 bytes along each K-major row */
      f8_mma<EA, EB>(d, sm90_desc(sa + 32 * k, 16), sm90_desc(sb + 32 * k, 16), kt > 0 || k > 0);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    sm90_fence_acc(d);
    /* the group of k-tile kt-1 has finished reading its stage */
    if (kt > 0 && lead) sm90_bar_arrive(empty + 8 * ((it - 1) % kStages));
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  sm90_fence_acc(d);
  if (lead) sm90_bar_arrive(empty + 8 * ((it0 + ktiles - 1) % kStages));
}

/* ---- epilogue (the bf16 kernel's stores: gemm_sm90_store.cuh) ----------------------
 * Direct bounds-checked stores of this consumer's 64 x 256, reading the output's
 * pointer, stride and bounds from p (the same code through sm90_store_direct's
 * arguments compiles differently). */
template <typename TO>
__device__ __forceinline__ void f8_store_direct(const float *d, const f8_params &p, int row0, int col0) {
  int t = threadIdx.x % 128, w = t / 32, l = t % 32;
  TO *C = (TO *)p.c;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int r = row0 + 16 * w + l / 4 + 8 * h;
    if (r >= p.M) continue;
    TO *crow = C + (int64_t)r * p.ldc;
#pragma unroll
    for (int j = 0; j < kBN / 8; j++) {
      int col = col0 + 8 * j + 2 * (l % 4);
      float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
      if (p.pairs_c && col + 1 < p.N) {
        sm90_store2(crow + col, v0, v1);
      } else {
        if (col < p.N) crow[col] = nb_from_f<TO>(v0);
        if (col + 1 < p.N) crow[col + 1] = nb_from_f<TO>(v1);
      }
    }
  }
}
#endif /* NB_SM90A_DEVICE */

template <int EA, int EB, typename TO>
__global__ void __launch_bounds__(kThreads, 1)
    f8_gemm_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                   const __grid_constant__ CUtensorMap mc, const __grid_constant__ f8_params p) {
#ifdef NB_SM90A_DEVICE
  extern __shared__ uint8_t f8_raw[];
  uint32_t ring = (sm90_smem(f8_raw) + 1023) & ~1023u; /* the swizzle repeats every 1024 B */
  uint32_t stage = ring + kStages * kStageBytes;
  uint32_t full = stage + kOutBytes, empty = full + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) {
      sm90_bar_init(full + 8 * s, 1);
      sm90_bar_init(empty + 8 * s, kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  int wg = threadIdx.x / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) f8_produce(&ma, &mb, p, ring, full, empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    float d[128];
    int c = wg - 1, it0 = 0, nbuf = 0, lead = threadIdx.x % 128 == 0;
    const float scale = __ldg(p.sa) * __ldg(p.sb);
    for (int t = blockIdx.x; t < p.tiles_m * p.tiles_n; t += gridDim.x) {
      int m0, n0;
      f8_tile(t, p, &m0, &n0);
      /* the first wgmma of each tile (scale-d 0) overwrites the accumulators */
      f8_consume<EA, EB>(d, c, ring, full, empty, it0, p.ktiles, lead);
      it0 += p.ktiles;
#pragma unroll
      for (int i = 0; i < 128; i++) d[i] *= scale; /* the scales, once */
      if (p.tma_c) sm90_store_tma<TO, kBN>(d, &mc, stage, c, &nbuf, p, m0 + 64 * c, n0);
      else f8_store_direct<TO>(d, p, m0 + 64 * c, n0);
    }
    /* the staging buffers must stay until the last stores have read them */
    if (lead) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
#else
  (void)ma; (void)mb; (void)mc; (void)p;
#endif
}

/* ---- portable kernel: any device, any strides ----------------------------------------
 * A 16 x 16 block computes a 64 x 64 output tile, 4 x 4 per thread; each 32-deep k step
 * decodes A (64 x 32) and B (32 x 64) into f32 shared tiles (padded by one column). */
constexpr int kPT = 64, kPK = 32;

template <typename TO>
__global__ void __launch_bounds__(256)
    f8_portable_kernel(TO *out, int64_t os0, int64_t os1, const uint8_t *a, int64_t as0, int64_t as1,
                       int ea, const uint8_t *b, int64_t bs0, int64_t bs1, int eb, int M, int N, int K,
                       const float *sa, const float *sb) {
  __shared__ float As[kPK][kPT + 1], Bs[kPK][kPT + 1];
  int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  int m0 = blockIdx.y * kPT, n0 = blockIdx.x * kPT;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kPK) {
    for (int e = tid; e < kPT * kPK; e += 256) {
      int r = e / kPK, k = e % kPK; /* A: consecutive threads along k */
      int gm = m0 + r, gk = k0 + k;
      uint8_t v = gm < M && gk < K ? a[gm * as0 + gk * as1] : 0;
      As[k][r] = ea ? nb_f8_to_f<1>(v) : nb_f8_to_f<0>(v);
      int kb = e / kPT, n = e % kPT; /* B: consecutive threads along n */
      int gn = n0 + n, gkb = k0 + kb;
      uint8_t u = gn < N && gkb < K ? b[gkb * bs0 + gn * bs1] : 0;
      Bs[kb][n] = eb ? nb_f8_to_f<1>(u) : nb_f8_to_f<0>(u);
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kPK; k++) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; i++) av[i] = As[k][ty + 16 * i], bv[i] = Bs[k][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
  float scale = *sa * *sb;
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;
      if (gm < M && gn < N) out[gm * os0 + gn * os1] = nb_from_f<TO>(acc[i][j] * scale);
    }
}

} /* namespace */

/* ---- host ------------------------------------------------------------------------------ */
/* A K-major fp8 operand: rows of K bytes, ld bytes apart; boxes of 128 k x box_rows rows
 * with the 128-byte swizzle and zero fill. 0 when TMA cannot take it (a base or row
 * stride not 16-byte aligned: K not a multiple of 16; sizes past its limits). */
static int f8_map(CUtensorMap *m, const void *p, int64_t K, int64_t rows, int64_t ld, uint32_t box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = nb_sm90_encode_fn();
  if (!enc || !p || ((uintptr_t)p & 15)) return 0;
  int64_t sb = rows == 1 ? ((K + 15) & ~(int64_t)15) : ld;
  if (sb % 16 || sb < K || sb >= ((int64_t)1 << 40) || K >= ((int64_t)1 << 32) || rows >= ((int64_t)1 << 32))
    return 0;
  cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)sb};
  cuuint32_t box[2] = {(cuuint32_t)kBK, box_rows};
  return nb_sm90_encode(enc, m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p, dims, strides, box);
}

static int64_t f8_launch_count[64];

template <int EA, int EB, typename TO>
static nb_status f8_launch(const nb_cuda_ctx *ctx, const CUtensorMap *ma, const CUtensorMap *mb,
                           const CUtensorMap *mc, const f8_params &p) {
  auto kern = f8_gemm_kernel<EA, EB, TO>;
  static int ready[64];
  if (!ready[ctx->dev & 63]) {
    NB_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem),
                "scaled_mm (shared memory limit)");
    ready[ctx->dev & 63] = 1;
  }
  int64_t tiles = (int64_t)p.tiles_m * p.tiles_n;
  unsigned grid = (unsigned)(tiles < ctx->n_sm ? tiles : ctx->n_sm);
  kern<<<grid, kThreads, kSmem, ctx->stream>>>(*ma, *mb, *mc, p);
  f8_launch_count[ctx->dev & 63]++;
  return nb_cuda_launch_check("scaled_mm (sm90 fp8)");
}

template <typename TO>
static nb_status f8_launch_types(const nb_cuda_ctx *ctx, int ea, int eb, const CUtensorMap *ma,
                                 const CUtensorMap *mb, const CUtensorMap *mc, const f8_params &p) {
  if (ea && eb) return f8_launch<1, 1, TO>(ctx, ma, mb, mc, p);
  if (ea) return f8_launch<1, 0, TO>(ctx, ma, mb, mc, p);
  if (eb) return f8_launch<0, 1, TO>(ctx, ma, mb, mc, p);
  return f8_launch<0, 0, TO>(ctx, ma, mb, mc, p);
}

/* The sm_90a kernel, when the device and the layout allow it: 1 (status in *st) or 0. */
static int f8_sm90(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a, const nb_kview *b,
                   const nb_kview *sa, const nb_kview *sb, nb_status *st) {
  int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
  const char *env = getenv("NABLA_SCALED_MM");
  if ((env && !strcmp(env, "portable")) || !nb_sm90_device_ok(ctx->dev)) return 0;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return 0;
  /* K-major operands: a's k stride 1, b's k stride 1; out's columns contiguous */
  if ((K > 1 && (a->strides[1] != 1 || b->strides[0] != 1)) || (N > 1 && out->strides[1] != 1)) return 0;
  CUtensorMap ma, mb, mc;
  memset(&mc, 0, sizeof mc);
  if (!f8_map(&ma, a->data, K, M, a->strides[0], kBM) || !f8_map(&mb, b->data, K, N, b->strides[1], kBN))
    return 0;
  f8_params p;
  memset(&p, 0, sizeof p);
  p.M = (int)M; p.N = (int)N; p.K = (int)K;
  p.tiles_m = (int)((M + kBM - 1) / kBM);
  p.tiles_n = (int)((N + kBN - 1) / kBN);
  p.ktiles = (int)((K + kBK - 1) / kBK);
  p.sa = (const float *)sa->data;
  p.sb = (const float *)sb->data;
  p.c = out->data;
  p.ldc = M > 1 ? out->strides[0] : N;
  nb_sm90_out_map(&mc, &p.tma_c, &p.pairs_c, out->dtype, out->data, M, N, p.ldc);
  int ea = a->dtype == NB_F8E4M3, eb = b->dtype == NB_F8E4M3;
  switch (out->dtype) {
  case NB_BF16: *st = f8_launch_types<__nv_bfloat16>(ctx, ea, eb, &ma, &mb, &mc, p); break;
  case NB_F16: *st = f8_launch_types<__half>(ctx, ea, eb, &ma, &mb, &mc, p); break;
  default: *st = f8_launch_types<float>(ctx, ea, eb, &ma, &mb, &mc, p); break;
  }
  return 1;
}

template <typename TO>
static nb_status f8_portable(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                             const nb_kview *b, const nb_kview *sa, const nb_kview *sb) {
  int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
  dim3 grid((unsigned)((N + kPT - 1) / kPT), (unsigned)((M + kPT - 1) / kPT)), block(16, 16);
  f8_portable_kernel<TO><<<grid, block, 0, ctx->stream>>>(
      (TO *)out->data, out->strides[0], out->strides[1], (const uint8_t *)a->data, a->strides[0],
      a->strides[1], a->dtype == NB_F8E4M3, (const uint8_t *)b->data, b->strides[0], b->strides[1],
      b->dtype == NB_F8E4M3, (int)M, (int)N, (int)K, (const float *)sa->data, (const float *)sb->data);
  return nb_cuda_launch_check("scaled_mm (portable)");
}

extern "C" nb_status nb_cuda_scaled_mm(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                                       const nb_kview *scale_a, const nb_kview *scale_b) {
  int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
  if (M == 0 || N == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "scaled_mm");
  if (f8_sm90(&ctx, out, a, b, scale_a, scale_b, &st)) return st;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || (M + kPT - 1) / kPT > 65535)
    return nb_error_set(NB_ERR_UNSUPPORTED, "scaled_mm: %lld x %lld x %lld is past the portable "
                        "kernel's sizes (M up to %d rows) on device %d", (long long)M, (long long)N,
                        (long long)K, 65535 * kPT, ctx.dev);
  switch (out->dtype) {
  case NB_BF16: return f8_portable<__nv_bfloat16>(&ctx, out, a, b, scale_a, scale_b);
  case NB_F16: return f8_portable<__half>(&ctx, out, a, b, scale_a, scale_b);
  default: return f8_portable<float>(&ctx, out, a, b, scale_a, scale_b);
  }
}

/* Launches of the sm_90a FP8 kernel on device dev so far (tests). */
extern "C" int64_t nb_cuda_scaled_mm_own_launches(int dev) { return f8_launch_count[dev & 63]; }
