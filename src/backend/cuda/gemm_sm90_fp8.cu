/* nabla's FP8 GEMM (nb_scaled_mm on CUDA): out (M x N) = s_a s_b (A (M x K) B (K x N)) for
 * e4m3/e5m2 operands (any mix), f32 accumulation, out bf16, f16 or f32.
 *
 * On a compute capability 9.0 device, with A row-major and B's K axis contiguous (B = W^T
 * for a row-major W (N, K): the NT layout; FP8 wgmma reads K-major operands only), 16-byte
 * aligned rows (K a multiple of 16) and an output whose columns are contiguous, the
 * product runs on the own sm_90a kernel (gemm_sm90_kernel.cuh) instantiated for FP8
 * operands: the bf16 GEMM's tiles, pipeline, stores and every schedule it has (grouped
 * raster, split-K, stream-K, clusters of 2 with multicast, one CTA per tile), chosen as for
 * bf16 by nb_sm90_run (gemm_sm90.cu): the heuristic, or a cached, forced
 * (NABLA_AUTOTUNE_FORCE=NAME) or tuned (NABLA_AUTOTUNE=1) candidate. A k-tile is 128 e4m3 /
 * e5m2 = 128 bytes per row, byte for byte the bf16 kernel's stage; four
 * wgmma.mma_async m64n256k32.f32.{e4m3,e5m2}.{e4m3,e5m2} per k-tile. The scales are read on
 * the device (no host wait) and multiply the full sum once, after split tiles' partials are
 * added. The accumulators are the wgmma's own f32 registers over the whole K (what
 * torch._scaled_mm calls use_fast_accum=True; cuBLAS's default promotes partial sums into a
 * second f32 accumulator, which m64n256 tiles have no registers for). This file holds the
 * FP8 instantiations, their TMA maps and launch count; the portable kernel; the entry.
 *
 * Everything else (other layouts, other devices, the sm_80 build) takes a portable kernel:
 * 64 x 64 output tiles, both operands decoded into f32 shared-memory tiles, f32 FMA, any
 * strides; NABLA_SCALED_MM=portable forces it (tests compare both paths). */
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/gemm_sm90_kernel.cuh"
#include "backend/cuda/gemm_sm90_plan.h"

namespace {

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

/* ---- host: the sm_90a kernel's FP8 instantiations ---------------------------------------- */
/* A K-major fp8 operand: rows of K bytes, ld bytes apart; boxes of 128 k (128 bytes, a
 * k-tile) x box_rows rows with the 128-byte swizzle and zero fill. 0 when TMA cannot take
 * it (a base or row stride not 16-byte aligned: K not a multiple of 16; sizes past its
 * limits). */
static int f8_map(CUtensorMap *m, const void *p, int64_t K, int64_t rows, int64_t ld, uint32_t box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = nb_sm90_encode_fn();
  if (!enc || !p || ((uintptr_t)p & 15)) return 0;
  int64_t sb = rows == 1 ? ((K + 15) & ~(int64_t)15) : ld;
  if (sb % 16 || sb < K || sb >= ((int64_t)1 << 40) || K >= ((int64_t)1 << 32) || rows >= ((int64_t)1 << 32))
    return 0;
  cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)sb};
  cuuint32_t box[2] = {(cuuint32_t)(2 * kBK), box_rows};
  return nb_sm90_encode(enc, m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p, dims, strides, box);
}

/* Launches of the FP8 instantiations on device dev so far (tests). */
static int64_t f8_launch_count[64];

template <int EA, int EB>
static nb_status f8_go(const nb_cuda_ctx *ctx, nb_dtype out, const nb_sm90_maps &m, const nb_sm90_params &p,
                       int64_t grid) {
  int64_t *n = &f8_launch_count[ctx->dev & 63];
  switch (out) {
  case NB_BF16: return sm90_launch<sm90_f8<EA, EB>, __nv_bfloat16, 0, 0>(ctx, m, p, grid, n);
  case NB_F16: return sm90_launch<sm90_f8<EA, EB>, __half, 0, 0>(ctx, m, p, grid, n);
  default: return sm90_launch<sm90_f8<EA, EB>, float, 0, 0>(ctx, m, p, grid, n);
  }
}

nb_status nb_sm90_go_f8(const nb_cuda_ctx *ctx, nb_dtype fa, nb_dtype fb, nb_dtype out, const nb_sm90_maps &m,
                        const nb_sm90_params &p, int64_t grid) {
  int ea = fa == NB_F8E4M3, eb = fb == NB_F8E4M3;
  if (ea && eb) return f8_go<1, 1>(ctx, out, m, p, grid);
  if (ea) return f8_go<1, 0>(ctx, out, m, p, grid);
  if (eb) return f8_go<0, 1>(ctx, out, m, p, grid);
  return f8_go<0, 0>(ctx, out, m, p, grid);
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
  nb_sm90_problem pr;
  memset(&pr, 0, sizeof pr);
  /* A in boxes of 128 rows, B in two halves of 128 rows (one per CTA of a cluster) */
  if (!f8_map(&pr.m.a, a->data, K, M, a->strides[0], kBM) ||
      !f8_map(&pr.m.b, b->data, K, N, b->strides[1], kBN / 2))
    return 0;
  pr.in = a->dtype;
  pr.in_b = b->dtype;
  pr.rows = M;
  pr.N = N;
  pr.K = K;
  pr.ldc = M > 1 ? out->strides[0] : N;
  pr.scale_a = (const float *)sa->data;
  pr.scale_b = (const float *)sb->data;
  *st = nb_sm90_run(ctx, &pr, out, NULL, 0, 0);
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

/* -1 off a 9.0 device (the sm_90a kernel never runs there). */
extern "C" int64_t nb_cuda_scaled_mm_own_launches(int dev) {
  return nb_sm90_device_ok(dev) ? __atomic_load_n(&f8_launch_count[dev & 63], __ATOMIC_RELAXED) : -1;
}

/* FP8 k-tiles are 128 elements deep. */
extern "C" int nb_cuda_scaled_mm_own_schedule(int i, int64_t rows, int64_t N, int64_t K, int n_sm,
                                              nb_gemm_own_schedule *out) {
  return nb_sm90_schedule_bk(i, rows, N, K, 2 * NB_SM90_BK, n_sm, out);
}
