/* The own sm_90a GEMM kernel's output stores (gemm_sm90_kernel.cuh, for
 * bf16/f16 and FP8 operands alike), for one consumer warpgroup's 64 x BN
 * accumulator fragment of m64nBN (f32): register i of thread (warp w, lane
 * l) is row 16w + l/4 + 8((i/2)%2), column 8(i/4) + 2(l%4) + i%2.
 *
 * Either direct bounds-checked stores, or through the consumer's two
 * staging buffers of NB_SM90_OUT_BUF bytes and TMA stores. */
#ifndef NB_GEMM_SM90_STORE_CUH
#define NB_GEMM_SM90_STORE_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sm90.cuh"

#define NB_SM90_OUT_BUF (64 * 128) /* one staging chunk: 64 rows x 128 bytes */

#ifdef NB_SM90A_DEVICE

__device__ __forceinline__ void sm90_store2(__nv_bfloat16 *p, float a, float b) {
  *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void sm90_store2(__half *p, float a, float b) {
  *(__half2 *)p = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void sm90_store2(float *p, float a, float b) { *(float2 *)p = make_float2(a, b); }

/* Direct bounds-checked stores of this consumer's 64 x BN (the fallback
 * for outputs TMA cannot describe); pairs: two columns at once where
 * C + col is aligned for it. */
template <typename TO, int BN>
__device__ __forceinline__ void sm90_store_direct(const float *d, TO *C, int64_t ldc, int pairs,
                                                  int M, int N, int row0, int col0) {
  int t = threadIdx.x % 128, w = t / 32, l = t % 32;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int r = row0 + 16 * w + l / 4 + 8 * h;
    if (r >= M) continue;
    TO *crow = C + (int64_t)r * ldc;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
      int col = col0 + 8 * j + 2 * (l % 4);
      float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
      if (pairs && col + 1 < N) {
        sm90_store2(crow + col, v0, v1);
      } else {
        if (col < N) crow[col] = nb_from_f<TO>(v0);
        if (col + 1 < N) crow[col + 1] = nb_from_f<TO>(v1);
      }
    }
  }
}

__device__ __forceinline__ uint32_t sm90_pack(__nv_bfloat16 *, float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *(uint32_t *)&v;
}
__device__ __forceinline__ uint32_t sm90_pack(__half *, float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *(uint32_t *)&v;
}

/* Writes chunk ch of this consumer's fragment into the staging buffer buf
 * (64 rows x 128 bytes, 128-byte swizzle: 16-byte unit u of row r at unit
 * u ^ (r % 8)). 16-bit: 64 columns, four stmatrix.x4 per thread, each
 * storing the 8x8 matrices (j, rows +0..7), (j, +8..15), (j+1, ...) of
 * column blocks j = 8ch + 2pp, j + 1; lane i gives the address of row i % 8
 * of matrix i / 8. */
template <typename TO>
__device__ __forceinline__ void sm90_stage(const float *d, uint32_t buf, int ch) {
  int t = threadIdx.x % 128, w = t / 32, l = t % 32;
  int q = l / 8, rr = l % 8, row = 16 * w + 8 * (q % 2) + rr;
#pragma unroll
  for (int pp = 0; pp < 4; pp++) {
    const float *v = d + 4 * (8 * ch + 2 * pp);
    uint32_t r0 = sm90_pack((TO *)0, v[0], v[1]), r1 = sm90_pack((TO *)0, v[2], v[3]);
    uint32_t r2 = sm90_pack((TO *)0, v[4], v[5]), r3 = sm90_pack((TO *)0, v[6], v[7]);
    uint32_t u = 2 * pp + q / 2;
    uint32_t addr = buf + row * 128 + ((u ^ rr) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
  }
}
/* f32: 32 columns (column blocks j = 4ch .. 4ch + 3), one 8-byte store per
 * block and row half; a warp's 32 stores cover each bank twice. */
template <>
__device__ __forceinline__ void sm90_stage<float>(const float *d, uint32_t buf, int ch) {
  int t = threadIdx.x % 128, w = t / 32, l = t % 32;
#pragma unroll
  for (int jj = 0; jj < 4; jj++) {
    int j = 4 * ch + jj;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int r = 16 * w + l / 4 + 8 * h;
      uint32_t u = 2 * jj + (l % 4) / 2;
      uint32_t addr = buf + r * 128 + ((u ^ (uint32_t)(r % 8)) << 4) + 8 * (l % 2);
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(d[4 * j + 2 * h]),
                   "f"(d[4 * j + 2 * h + 1]) : "memory");
    }
  }
}

/* Stores this consumer's (consumer c's) 64 x BN through its two staging
 * buffers at stage + 2c NB_SM90_OUT_BUF and TMA (map): per chunk, wait
 * until the store two chunks back has read the buffer, stage, fence (the
 * copy engine reads what ordinary stores wrote), and one thread issues the
 * store. *nbuf counts chunks staged (buffer parity); p: the kernel's
 * parameters (its M and N). */
template <typename TO, int BN, typename P>
__device__ __forceinline__ void sm90_store_tma(const float *d, const CUtensorMap *map, uint32_t stage,
                                               int c, int *nbuf, const P &p, int row0, int col0) {
  constexpr int cols = 128 / (int)sizeof(TO), chunks = BN / cols;
  int t = threadIdx.x % 128;
  if (row0 >= p.M) return;
#pragma unroll
  for (int ch = 0; ch < chunks; ch++) {
    if (col0 + ch * cols >= p.N) break;
    uint32_t buf = stage + (2 * c + (*nbuf & 1)) * NB_SM90_OUT_BUF;
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    sm90_wg_sync(c);
    sm90_stage<TO>(d, buf, ch);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    sm90_wg_sync(c);
    if (t == 0) sm90_tma_store(map, buf, col0 + ch * cols, row0);
    (*nbuf)++;
  }
}
#endif /* NB_SM90A_DEVICE */

#endif /* NB_GEMM_SM90_STORE_CUH */
