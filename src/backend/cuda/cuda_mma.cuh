/* Tensor-core building blocks of sm_80 and later (no Hopper-only
 * instructions): 16-byte cp.async with zero fill, ldmatrix (plain and
 * transposed), mma.sync.m16n8k16 with f32 accumulators for bf16 and f16,
 * packing of two floats into one 16-bit pair, exp2.
 *
 * Fragment layout of m16n8k16 (lane l, g = l / 4, t = l % 4):
 *   A (16 x 16, row): a0 row g, k 2t..2t+1; a1 row g + 8; a2 row g, k + 8;
 *                     a3 row g + 8, k + 8
 *   B (16 x 8, col):  b0 k 2t..2t+1, column g; b1 k + 8
 *   C (16 x 8):       c0 c1 row g, columns 2t, 2t + 1; c2 c3 row g + 8
 * ldmatrix.x4 reads four 8x8 matrices, lane l giving the address of row
 * l % 8 of matrix l / 8; nb_mma_frag_* below name the addresses that make
 * the four registers an A fragment or the B fragments of two n8 tiles. */
#ifndef NB_CUDA_MMA_CUH
#define NB_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t nb_mma_smem(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy (L2 only) reading src_bytes (0..16), zero-filling the rest. */
__device__ __forceinline__ void nb_mma_cp16(uint32_t dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void nb_mma_commit(void) {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void nb_mma_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void nb_mma_ldsm(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void nb_mma_ldsm_t(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Element offsets (row * pitch + column) for lane's ldmatrix address:
 *   a:  A fragment of rows [0, 16) x k [0, 16) of a row-major (K-major) tile
 *   bn: B fragments of n [0, 16) x k [0, 16) stored n-major (k contiguous):
 *       registers 0, 1 for n8 tile 0, 2, 3 for n8 tile 1 (plain ldmatrix)
 *   bk: the same stored k-major (n contiguous), for ldmatrix.trans */
__device__ __forceinline__ int nb_mma_frag_a(int lane, int pitch) {
  return ((lane & 7) + 8 * ((lane >> 3) & 1)) * pitch + 8 * (lane >> 4);
}
__device__ __forceinline__ int nb_mma_frag_bn(int lane, int pitch) {
  return ((lane & 7) + 8 * (lane >> 4)) * pitch + 8 * ((lane >> 3) & 1);
}
__device__ __forceinline__ int nb_mma_frag_bk(int lane, int pitch) {
  return ((lane & 7) + 8 * ((lane >> 3) & 1)) * pitch + 8 * (lane >> 4);
}

/* d += a (16x16, row) * b (16x8, col), f32 accumulators. */
template <typename T> struct nb_mma;
template <> struct nb_mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  /* lo in the low half, round to nearest even */
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
  }
};
template <> struct nb_mma<__half> {
  static __device__ __forceinline__ void run(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
  }
};

/* 2^x (ex2.approx: relative error under 2^-22; -inf gives 0). */
__device__ __forceinline__ float nb_mma_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#endif /* NB_CUDA_MMA_CUH */
