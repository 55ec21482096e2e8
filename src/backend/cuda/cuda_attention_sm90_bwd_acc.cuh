/* The fused backward's f32 dQ accumulator (cuda_attention_sm90_bwd.cu's
 * fused path; its layout and its sections: fb_params, fb_sec_of in
 * cuda_attention_sm90_bwd.cuh): the conversion of a query tile to dq
 * (fb_conv_unit), the last kernel that converts what the fused kernel left
 * (fb_dq_kernel), and in the sm_90a pass the fused kernel's side of it:
 * the bulk reduce of a consumer's partial (fb_send_part, waiting first for
 * its section's zeros), the count of a finished warpgroup, and the idle
 * producer warps' zeroing and conversion beside the products
 * (fb_acc_side). Included by that file only.
 * The last kernel writes dq = scale acc in the input dtype (62 us at B4
 * H16 N4096 D128 on the H100); at D 128 only the query tiles that the
 * fused kernel's idle producer warps did not convert beside the products,
 * by sections of the work order (fb_acc_side: 18 us, mostly the last
 * section; with the memset gone too, causal fwd+bwd 2.082 -> 2.061 ms, the
 * medians of seven interleaved rounds). The fused kernel converting each
 * query tile itself once its last key block's reduce was in, by a counter
 * per tile, took 140 us longer: each of its 2048 CTAs, one per SM at a
 * time, then waited at its end for the reduces, the counters and the
 * tile's loads. */
#ifndef NB_CUDA_ATTENTION_SM90_BWD_ACC_CUH
#define NB_CUDA_ATTENTION_SM90_BWD_ACC_CUH

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attention_sm90_bwd.cuh"
#include "backend/cuda/cuda_attention_sm90_bwd.h"
#include "backend/cuda/gemm_sm90_plan.h" /* nb_sm90_device_ok */

namespace {

/* dq's W = 8 or 4 columns at row (of T) from W floats of the accumulator
 * at src (16-byte aligned), times scale: one W * 2-byte store (p.vec_dq)
 * or W / 2 4-byte ones. */
template <typename T, int W> __device__ __forceinline__ void fb_dq_put(const fb_params &p, T *row, const float4 *src) {
  uint32_t out[W / 2];
#pragma unroll
  for (int h = 0; h < W / 4; h++) {
    const float4 v = __ldcs(src + h);
    out[2 * h] = nb_mma<T>::pack(v.x * p.scale, v.y * p.scale);
    out[2 * h + 1] = nb_mma<T>::pack(v.z * p.scale, v.w * p.scale);
  }
  if (p.vec_dq) {
    if constexpr (W == 8) *(uint4 *)row = make_uint4(out[0], out[1], out[2], out[3]);
    else *(uint2 *)row = make_uint2(out[0], out[1]);
  } else {
    uint32_t *w = (uint32_t *)row;
#pragma unroll
    for (int h = 0; h < W / 2; h++) w[h] = out[h];
  }
}

/* dq = scale acc in T for query tile t of batch index b by threads tid of
 * NTHR (a multiple of D / W), each taking W = 8 or 4 columns of every NTHR
 * / (D / W)-th row, one row's load at a time (fb_acc_side's warps have 24
 * registers): row r, columns c .. c + W - 1 are pairs (c % 64) / 2 ^ 4 (r
 * % 8) .. (contiguous: the swizzle flips whole groups of four), floats c %
 * 64 ^ 8 (r % 8) .., of row r of the tile's chunk c / 64 (fb_put_part's
 * layout). */
template <typename T, int D, int NTHR, int W>
__device__ __forceinline__ void fb_conv_unit(const fb_params &p, int b, int t, int tid) {
  constexpr int CPR = D / W, R = NTHR / CPR; /* threads per row, rows at a time */
  static_assert(NTHR % CPR == 0 && (W == 8 || W == 4), "whole rows at a time, 8 or 4 columns a thread");
  const int c = (tid % CPR) * W, cm = c % 64, rows = min(64, p.Lq - 64 * t);
  const float *a = p.acc + (((int64_t)b * p.ntq + t) * (D / 64) + c / 64) * 4096;
  T *q = (T *)(p.dq + fb_off(p, b, p.dq_bs)) + (int64_t)64 * t * p.dq_rs + c;
  const int64_t step = R * p.dq_rs;
  q += (tid / CPR) * p.dq_rs;
#pragma unroll 1
  for (int r = tid / CPR; r < rows; r += R, q += step) /* 2 (pair ^ 4 (r % 8)) */
    fb_dq_put<T, W>(p, q, (const float4 *)(a + r * 64 + (cm ^ (8 * (r % 8)))));
}

/* The fused path's last step: dq from the accumulator (fb_conv_unit), a
 * block per query tile unit at a time, those the fused kernel has not
 * converted itself (p.cnt: a section's units below its conversion claims;
 * without it, all). */
template <typename T, int D> __global__ void __launch_bounds__(256) fb_dq_kernel(const fb_params p) {
  const int nv = p.B * p.ntq;
  for (int v = (int)blockIdx.x; v < nv; v += (int)gridDim.x) {
    const int b = v / p.ntq, t = v - b * p.ntq;
    if (p.cnt) {
      const int c = fb_sec_of(p, b), u = v - c * p.hg * p.ntq;
      if ((unsigned)u < min(p.cnt[FB_NCNT * c + FB_CCLAIM], (unsigned)fb_sec_units(p, c))) continue;
    }
    fb_conv_unit<T, D, 256, 8>(p, b, t, (int)threadIdx.x);
  }
}

/* Whether the fused kernel zeroes and converts its accumulator itself
 * (fb_acc_side): where it runs one CTA per item (one_each), unless
 * NABLA_ATTENTION_SM90_BWD_ACC=0 (read at every call: a memset before it and
 * a conversion after); =n, n > 0 (the tests): *cmax = n units a warp at
 * most, whatever the item, and the units counted (fb_count_units); else
 * *cmax = -1. */
int fb_acc_in_kernel(int one_each, int *cmax) {
  const char *e = getenv("NABLA_ATTENTION_SM90_BWD_ACC");
  const int zc = one_each && !(e && !strcmp(e, "0"));
  *cmax = zc && e && atoi(e) > 0 ? atoi(e) : -1;
  return zc;
}

/* The tests' counts (nb_cuda_attn_sm90_bwd_acc_units): query tiles converted in the fused kernel, all of them */
int64_t fb_units_in_kernel, fb_units_all;

/* NABLA_ATTENTION_SM90_BWD_ACC=n (n > 0, p.cmax): the query tiles that the fused
 * kernel converted itself (its sections' conversion claims, at most their
 * units) and all of them, read back after the call, into
 * nb_cuda_attn_sm90_bwd_acc_units's sums. */
nb_status fb_count_units(const nb_cuda_ctx *ctx, const fb_params &p) {
  const int ns = p.nfull + 1;
  unsigned *h = (unsigned *)malloc(FB_NCNT * (size_t)ns * sizeof *h);
  if (!h) return nb_error_set(NB_ERR_OOM, "attention_bwd (sm90): out of host memory");
  cudaError_t ce = cudaMemcpyAsync(h, p.cnt, FB_NCNT * (size_t)ns * sizeof *h, cudaMemcpyDeviceToHost, ctx->stream);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(ctx->stream);
  for (int c = 0; ce == cudaSuccess && c < ns; c++) {
    const unsigned n = (unsigned)fb_sec_units(p, c);
    __atomic_add_fetch(&fb_units_in_kernel, (int64_t)(h[FB_NCNT * c + FB_CCLAIM] < n ? h[FB_NCNT * c + FB_CCLAIM] : n),
                       __ATOMIC_RELAXED);
    __atomic_add_fetch(&fb_units_all, (int64_t)n, __ATOMIC_RELAXED);
  }
  free(h);
  return nb_cuda_status(ce, "attention_bwd (sm90): reading the accumulator's counts");
}

} /* namespace */

void nb_cuda_attn_sm90_bwd_acc_units(int device, int64_t *in_kernel, int64_t *all) {
  const int ok = nb_sm90_device_ok(device);
  *in_kernel = ok ? __atomic_load_n(&fb_units_in_kernel, __ATOMIC_RELAXED) : -1;
  *all = ok ? __atomic_load_n(&fb_units_all, __ATOMIC_RELAXED) : -1;
}

#ifdef NB_SM90A_DEVICE
namespace {

__device__ __forceinline__ unsigned fb_ld_acquire(const unsigned *a) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}

/* The fused kernel's section counters (p.cnt; the sections and their
 * units: fb_sec_of). Before its first reduce a consumer waits until its
 * section's units are zeroed (the async proxy's reduce after the generic
 * zeros); after its last it counts its warpgroup done. */
__device__ __forceinline__ void fb_zero_wait(const fb_params &p, int b) {
  const int c = fb_sec_of(p, b);
  const unsigned n = (unsigned)fb_sec_units(p, c);
  while (fb_ld_acquire(p.cnt + FB_NCNT * c + FB_ZDONE) < n) __nanosleep(64);
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
__device__ __forceinline__ void fb_wg_done(const fb_params &p, int b) {
  asm volatile("fence.proxy.async.global;" ::: "memory"); /* the completed reduces, then the count */
  __threadfence();
  atomicAdd(p.cnt + FB_NCNT * fb_sec_of(p, b) + FB_WGDONE, 1u);
}

/* A warp's claim of the next unit of counter *c (below n), -1 when none is
 * left. */
__device__ __forceinline__ int fb_claim(unsigned *c, int n) {
  int u = n;
  if (threadIdx.x % 32 == 0 && *(volatile unsigned *)c < (unsigned)n) u = (int)atomicAdd(c, 1u);
  u = __shfl_sync(0xffffffffu, u, 0);
  return u < n ? u : -1;
}

/* The accumulator's work beside the products, for warps 1-3 of the fused
 * kernel's producer warpgroup (p.cnt; the CTA's item of batch index b and
 * ntiles query tiles), so that neither a memset before the kernel nor a
 * conversion after it holds the GPU (at B4 H16 N4096 D128 they took 45
 * and 62 us of DRAM time each):
 *   - zeroing: the units of the CTA's own section, then of the next two,
 *     until their claims run out. A consumer waits for its own section's
 *     (fb_zero_wait), and every unit of it is claimed by the time the
 *     CTA's own warps are done here, by CTAs that zero without waiting
 *     on anything: no wait can be circular.
 *   - conversion: units of the eight sections before the CTA's own whose
 *     warpgroups have all counted themselves done (fb_wg_done), at most
 *     ntiles / 16 a warp (a unit, one row's loads at a time, takes about
 *     as long as 8 query tiles' products), so the products still take
 *     longer; fb_dq_kernel converts what is left unclaimed (the last
 *     sections).
 * The warps keep the producer's 24 registers: the launch holds 168 x 384,
 * so 32 here left the consumers' setmaxnreg.inc to 240 waiting forever.
 * ptxas spills in this kernel for it, in an 8-byte frame (4 bytes; 16
 * since the consumers' fb_store16 epilogue; two rows' loads at a time
 * spilled 8-48). H100, B4 H16 N4096 D128 causal
 * (ncu): the fused kernel 1254 -> 1316 us (the zeros are written back
 * before the reduces reach them, and the conversion reads from DRAM: the
 * sections' accumulator does not stay in L2), the memset and 47 of the
 * last kernel's 65 us gone; fwd+bwd 1.0% faster (either half alone: no
 * gain). */
template <typename T, int D>
__device__ __forceinline__ void fb_acc_side(const fb_params &p, int b, int ntiles) {
  constexpr int UF = D / 64 * 4096; /* floats per unit */
  const int s = fb_sec_of(p, b);
  for (int c = s; c < s + 3 && c <= p.nfull; c++)
    for (int u; (u = fb_claim(p.cnt + FB_NCNT * c + FB_ZCLAIM, fb_sec_units(p, c))) >= 0;) {
      float4 *a = (float4 *)(p.acc + ((int64_t)c * p.hg * p.ntq + u) * UF) + threadIdx.x % 32;
#pragma unroll 4
      for (int i = 0; i < UF / 128; i++) a[32 * i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      asm volatile("fence.proxy.async.global;" ::: "memory");
      __syncwarp(); /* the warp's zeros, then lane 0's release */
      if (threadIdx.x % 32 == 0) {
        __threadfence();
        atomicAdd(p.cnt + FB_NCNT * c + FB_ZDONE, 1u);
      }
    }
  for (int c = max(s - 8, 0), n = p.cmax >= 0 ? p.cmax : ntiles / 16; c < s && n > 0; c++) {
    /* lane 0 decides for the warp (fb_claim's shuffle needs every lane), the others acquire after it */
    int done = 0;
    if (threadIdx.x % 32 == 0)
      done = fb_ld_acquire(p.cnt + FB_NCNT * c + FB_WGDONE) >= 2u * (unsigned)(fb_sec_nb(p, c) * p.nblk);
    if (!__shfl_sync(0xffffffffu, done, 0)) continue;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    for (int u; n > 0 && (u = fb_claim(p.cnt + FB_NCNT * c + FB_CCLAIM, fb_sec_units(p, c))) >= 0; n--) {
      const int v = c * p.hg * p.ntq + u, bb = v / p.ntq;
      fb_conv_unit<T, D, 32, 4>(p, bb, v - bb * p.ntq, threadIdx.x % 32);
    }
  }
}

/* A consumer's dQ partial s (its fragments) into its buffer pb, then one
 * thread adds the buffer into the accumulator's chunk of query tile i0 (D
 * 128: columns [64 wg, + 64); D 64: all, both warpgroups into one chunk) by
 * a bulk reduce-add. */
template <int D>
__device__ __forceinline__ void fb_send_part(const fb_params &p, float (&s)[32], uint32_t pb, int b, int i0, int wg,
                                             int w, int lane, int x, bool zw) {
  fa3_fence(s);
  fb_put_part(pb, s, w, lane);
  fb_fence_async();
  fb_bar_wg(wg);
  if (x == 0) {
    if (zw) fb_zero_wait(p, b); /* the CTA's first reduce (p.cnt) */
    float *g = p.acc + (((int64_t)b * p.ntq + i0 / 64) * (D / 64) + (D == 128 ? wg : 0)) * 4096;
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 "cp.async.bulk.commit_group;" ::"l"(g), "r"(pb), "n"(FB_PART) : "memory");
  }
}

} /* namespace */
#endif /* NB_SM90A_DEVICE */

#endif /* NB_CUDA_ATTENTION_SM90_BWD_ACC_CUH */
