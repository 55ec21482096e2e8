/* Shared pieces of the one-block-per-row kernels (softmax, norms,
 * cross-entropy): the register row cache size, online max/sum merging, row
 * offsets, and the grid size for R rows. */
#ifndef NB_CUDA_ROWS_CUH
#define NB_CUDA_ROWS_CUH
#include "backend/cuda/cuda_common.cuh"

#define NB_ROW_CACHE 8

/* Element size of a runtime dtype, on the device. */
__device__ __forceinline__ int nb_dt_size(int dt) {
  return dt == NB_F64 || dt == NB_I64 ? 8 : dt == NB_F32 || dt == NB_I32 ? 4 : dt == NB_U8 || dt == NB_BOOL ? 1 : 2;
}


template <typename A> __device__ __forceinline__ A nb_exp_(A x) { return exp(x); }
template <typename A> __device__ __forceinline__ A nb_log_(A x) { return log(x); }

/* Merges a thread's online (max, sum of exp(x - max)) into the block's. */
template <typename A>
__device__ __forceinline__ void nb_online_merge(A &m, A &s, A *smem) {
  A M = nb_block_max(m, smem);
  A scaled = s == (A)0 ? (A)0 : s * nb_exp_(m - M);
  s = nb_block_sum(scaled, smem);
  m = M;
}

/* Row offsets of row r for the ops of a rows iterator. */
template <int N>
__device__ __forceinline__ void nb_row_offsets(const nb_iter &rows, int64_t r, int64_t *off) {
  nb_iter_offsets<N>(rows, r, off);
}

static inline unsigned row_grid(const nb_cuda_ctx *ctx, int64_t R, int threads) {
  int64_t per_sm = 2048 / threads;
  int64_t cap = (int64_t)ctx->n_sm * (per_sm < 1 ? 1 : per_sm) * 4;
  return (unsigned)(R < cap ? R : cap);
}
#endif
