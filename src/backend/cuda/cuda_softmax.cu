/* Fused row kernels: softmax and log_softmax, forward and backward.
 *
 * One block per row (rows strided over the grid). A row of up to
 * NB_ROW_CACHE * blockDim elements is read once into registers; longer rows
 * use an online max/sum pass and a second read. Statistics accumulate in
 * f32 (f64 for f64 inputs). Contiguous rows take the packed fast path
 * (cuda_rows.cuh). Layer/RMS norm: cuda_norm.cu; cross-entropy: cuda_xent.cu. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

#include "backend/cuda/cuda_rows.cuh"

/* ---- softmax ----------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(1024) nb_softmax_fwd_kernel(T *y, const T *x, nb_iter rows, int64_t R, int64_t D,
                                      int64_t sy, int64_t sx, int log_) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    int64_t off[2];
    nb_row_offsets<2>(rows, r, off);
    T *yr = y + off[0];
    const T *xr = x + off[1];
    if (D <= (int64_t)NB_ROW_CACHE * bd) {
      A v[NB_ROW_CACHE], m = -INFINITY;
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        v[k] = j < D ? (A)nb_to_f(xr[j * sx]) : (A)-INFINITY;
        m = v[k] > m ? v[k] : m;
      }
      m = nb_block_max(m, smem);
      A s = 0;
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++)
        if (tid + (int64_t)k * bd < D) s += nb_exp_(v[k] - m);
      s = nb_block_sum(s, smem);
      A ls = nb_log_(s), inv = (A)1 / s; /* log: (x - m) - log s, never x - (m + log s) */
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        if (j < D) yr[j * sy] = nb_from_d<T>(log_ ? (v[k] - m) - ls : nb_exp_(v[k] - m) * inv);
      }
    } else {
      A m = -INFINITY, s = 0;
      for (int64_t j = tid; j < D; j += bd) {
        nb_online_add(m, s, (A)nb_to_f(xr[j * sx]));
      }
      nb_online_merge(m, s, smem);
      A ls = nb_log_(s), inv = (A)1 / s;
      for (int64_t j = tid; j < D; j += bd) {
        A v = (A)nb_to_f(xr[j * sx]);
        yr[j * sy] = nb_from_d<T>(log_ ? (v - m) - ls : nb_exp_(v - m) * inv);
      }
    }
  }
}

/* dx = y*(dy - sum(dy*y)), or dy - exp(y)*sum(dy) for log. */
template <typename T>
__global__ void __launch_bounds__(1024) nb_softmax_bwd_kernel(T *dx, const T *dy, const T *y, nb_iter rows, int64_t R,
                                      int64_t D, int64_t sdx, int64_t sdy, int64_t sy, int log_) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    int64_t off[3];
    nb_row_offsets<3>(rows, r, off);
    T *dxr = dx + off[0];
    const T *dyr = dy + off[1], *yr = y + off[2];
    if (D <= (int64_t)NB_ROW_CACHE * bd) {
      A g[NB_ROW_CACHE], v[NB_ROW_CACHE], s = 0;
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        g[k] = j < D ? (A)nb_to_f(dyr[j * sdy]) : (A)0;
        v[k] = j < D ? (A)nb_to_f(yr[j * sy]) : (A)0;
        s += log_ ? g[k] : g[k] * v[k];
      }
      s = nb_block_sum(s, smem);
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        if (j < D) dxr[j * sdx] = nb_from_d<T>(log_ ? g[k] - nb_exp_(v[k]) * s : v[k] * (g[k] - s));
      }
    } else {
      A s = 0;
      for (int64_t j = tid; j < D; j += bd) {
        A g = (A)nb_to_f(dyr[j * sdy]);
        s += log_ ? g : g * (A)nb_to_f(yr[j * sy]);
      }
      s = nb_block_sum(s, smem);
      for (int64_t j = tid; j < D; j += bd) {
        A g = (A)nb_to_f(dyr[j * sdy]), v = (A)nb_to_f(yr[j * sy]);
        dxr[j * sdx] = nb_from_d<T>(log_ ? g - nb_exp_(v) * s : v * (g - s));
      }
    }
  }
}

/* Rows iterator over the leading axes of n views; D and last-axis strides. */
static int64_t rows_setup(int n, const nb_kview *const *v, nb_iter *rows, int64_t *D,
                          int64_t *last) {
  int nd = v[0]->ndim;
  const int64_t *st[NB_CUDA_MAX_OPS];
  for (int k = 0; k < n; k++) {
    st[k] = v[k]->strides;
    last[k] = nd ? v[k]->strides[nd - 1] : 0;
  }
  *D = nd ? v[0]->shape[nd - 1] : 1;
  nb_iter_make(rows, nd ? nd - 1 : 0, v[0]->shape, n, st);
  int64_t R = 1;
  for (int d = 0; d + 1 < nd; d++) R *= v[0]->shape[d];
  return R;
}


/* ---- softmax, contiguous fast path ---------------------------------------
 * Rows contiguous (row stride D) in every operand: each group of tpr threads
 * reads its row once as NCH packs of VEC elements per thread, reduces, and
 * writes. exp is recomputed in the last pass rather than kept, so a thread
 * holds only the packed input (NCH * 16 bytes). */
template <typename T, int VEC, int NCH, int STREAM>
__global__ void __launch_bounds__(1024) nb_softmax_fwd_rows(T *y, const T *x, int64_t R, int D,
                                                            int tpr, int log_) {
  typedef typename nb_acc<T>::type A;
  typedef nb_pack<T, VEC> P;
  __shared__ A red[64];
  const int t = threadIdx.x & (tpr - 1), g = threadIdx.x / tpr, G = blockDim.x / tpr;
  const int nvec = D / VEC, bar = 1 + g;
  A *sm = red + 2 * g * (tpr >> 5);
  for (int64_t r = (int64_t)blockIdx.x * G + g; r < R; r += (int64_t)gridDim.x * G) {
    const P *xr = (const P *)(x + r * D);
    P *yr = (P *)(y + r * D);
    P v[NCH];
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) v[k] = nb_ld_row(xr + t + k * tpr);
    /* (max, sum of exp(x - max)) of the row without an exp per merge: each
     * warp takes its max by shuffles, its lanes sum exp(x - warp max), and
     * the warps' pairs merge once (one exp per warp, one barrier round).
     * Merging per-thread pairs instead costs two exps per merge (16% of the
     * kernel's instructions with the standard expf); a second block-wide
     * reduction for the row max costs a barrier round per row (2% on rows
     * of 50304). */
    A m = -INFINITY, s = 0;
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) {
        A f[VEC];
        nb_unpack(v[k], f);
#pragma unroll
        for (int e = 0; e < VEC; e++) m = fmax(m, f[e]);
      }
    m = nb_warp_max(m);
    /* m = -inf: every element the warp holds is -inf (a masked stretch of
     * an attention row) or it holds none; its sum is 0, not exp(-inf + inf) */
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec && m != (A)-INFINITY) {
        A f[VEC];
        nb_unpack(v[k], f);
#pragma unroll
        for (int e = 0; e < VEC; e++) s += nb_row_exp<nb_row_prec<T>::value>(f[e], m);
      }
    s = nb_warp_sum(s);
    if (tpr > 32) nb_grp_merge_warps<nb_row_prec<T>::value>(m, s, sm, tpr, bar);
    /* log_softmax as (x - m) - log s: m + log s rounded first would cost
     * an ulp of the logits (6e-5 at 1e3) in every output */
    A ls = nb_log_(s), inv = (A)1 / s;
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) {
        A f[VEC];
        nb_unpack(v[k], f);
        P o;
#pragma unroll
        for (int e = 0; e < VEC; e++)
          o.v[e] = nb_from_d<T>(log_ ? (f[e] - m) - ls : nb_row_exp<nb_row_prec<T>::value>(f[e], m) * inv);
        nb_st_row<STREAM>(yr + t + k * tpr, o);
      }
  }
}

/* dx = y*(dy - sum(dy*y)), or dy - exp(y)*sum(dy) for log; dy and y cached. */
template <typename T, int VEC, int NCH>
__global__ void __launch_bounds__(1024) nb_softmax_bwd_rows(T *dx, const T *dy, const T *y,
                                                            int64_t R, int D, int tpr, int log_) {
  typedef typename nb_acc<T>::type A;
  typedef nb_pack<T, VEC> P;
  __shared__ A red[32];
  const int t = threadIdx.x & (tpr - 1), g = threadIdx.x / tpr, G = blockDim.x / tpr;
  const int nvec = D / VEC, bar = 1 + g;
  A *sm = red + g * (tpr >> 5);
  for (int64_t r = (int64_t)blockIdx.x * G + g; r < R; r += (int64_t)gridDim.x * G) {
    const P *dyr = (const P *)(dy + r * D), *yr = (const P *)(y + r * D);
    P *dxr = (P *)(dx + r * D);
    P gv[NCH], yv[NCH];
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) {
        gv[k] = dyr[t + k * tpr];
        yv[k] = yr[t + k * tpr];
      }
    A s = 0;
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) {
        A fg[VEC], fy[VEC];
        nb_unpack(gv[k], fg);
        nb_unpack(yv[k], fy);
#pragma unroll
        for (int e = 0; e < VEC; e++) s += log_ ? fg[e] : fg[e] * fy[e];
      }
    s = nb_grp_reduce<0>(s, sm, tpr, bar);
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) {
        A fg[VEC], fy[VEC];
        nb_unpack(gv[k], fg);
        nb_unpack(yv[k], fy);
        P o;
#pragma unroll
        for (int e = 0; e < VEC; e++)
          o.v[e] = nb_from_d<T>(log_ ? fg[e] - nb_row_exp<nb_row_prec<T>::value>(fy[e], (A)0) * s
                                     : fy[e] * (fg[e] - s));
        dxr[t + k * tpr] = o;
      }
  }
}

/* Block size and grid for groups of tpr threads over R rows: blocks of at
 * least 128 threads (4 rows per block for warp groups). */
static void rows_launch_dims(const nb_cuda_ctx *ctx, int64_t R, int tpr, int *threads,
                             unsigned *grid) {
  int th = tpr < 128 ? 128 : tpr;
  int64_t G = th / tpr, want = (R + G - 1) / G;
  int64_t cap = (int64_t)ctx->n_sm * (2048 / th) * 16;
  *threads = th;
  *grid = (unsigned)(want < cap ? want : cap);
}

#define NB_ROWS_NCH_SWITCH(nch, NCH, ...)                  \
  switch (nch) {                                          \
  case 1: { const int NCH = 1; __VA_ARGS__; } break;      \
  case 2: { const int NCH = 2; __VA_ARGS__; } break;      \
  case 4: { const int NCH = 4; __VA_ARGS__; } break;      \
  default: { const int NCH = 8; __VA_ARGS__; } break;     \
  }

template <typename T, int VEC>
static void softmax_rows_run(const nb_cuda_ctx *ctx, T *y, const T *x, int64_t R, int D, int tpr,
                             int nch, int log_) {
  int th;
  unsigned grid;
  rows_launch_dims(ctx, R, tpr, &th, &grid);
  NB_ROWS_NCH_SWITCH(nch, NCH,
    nb_softmax_fwd_rows<T, VEC, NCH, 1><<<grid, th, 0, ctx->stream>>>(y, x, R, D, tpr, log_));
}

template <typename T, int VEC>
static void softmax_bwd_rows_run(const nb_cuda_ctx *ctx, T *dx, const T *dy, const T *y,
                                 int64_t R, int D, int tpr, int nch, int log_) {
  int th;
  unsigned grid;
  rows_launch_dims(ctx, R, tpr, &th, &grid);
  switch (nch) { /* two cached operands: at most 4 packs each */
  case 1: nb_softmax_bwd_rows<T, VEC, 1><<<grid, th, 0, ctx->stream>>>(dx, dy, y, R, D, tpr, log_); break;
  case 2: nb_softmax_bwd_rows<T, VEC, 2><<<grid, th, 0, ctx->stream>>>(dx, dy, y, R, D, tpr, log_); break;
  default: nb_softmax_bwd_rows<T, VEC, 4><<<grid, th, 0, ctx->stream>>>(dx, dy, y, R, D, tpr, log_); break;
  }
}

/* Runs the contiguous path when every view is row-contiguous and the row
 * fits the register plan; 0 when the generic kernel must run instead. */
template <typename T>
static int softmax_fast(const nb_cuda_ctx *ctx, const nb_kview *const *v, int n, int64_t R,
                        int64_t D, int log_) {
  for (int i = 0; i < n; i++)
    if (!nb_view_rows_contig(v[i])) return 0;
  const void *ptrs[3] = {v[0]->data, v[1]->data, n > 2 ? v[2]->data : NULL};
  int vec = rows_vec(nb_vec_width<T>::value, D, ptrs, n), tpr, nch;
  /* forward: about 8 packs per thread (more bytes in flight per thread and
   * half the reduction work per row of 4 packs; 16384x4096 bf16 went from
   * 2.33 to 2.80 TB/s); backward: 4, two rows cached */
  if (!nb_rows_plan(D / vec, 1024, n == 2 ? 8 : 4, n == 2 ? 8 : 4, &tpr, &nch)) return 0;
  if (n == 2) {
    if (vec > 1) softmax_rows_run<T, nb_vec_width<T>::value>(ctx, (T *)v[0]->data, (const T *)v[1]->data, R, (int)D, tpr, nch, log_);
    else softmax_rows_run<T, 1>(ctx, (T *)v[0]->data, (const T *)v[1]->data, R, (int)D, tpr, nch, log_);
  } else {
    if (vec > 1) softmax_bwd_rows_run<T, nb_vec_width<T>::value>(ctx, (T *)v[0]->data, (const T *)v[1]->data, (const T *)v[2]->data, R, (int)D, tpr, nch, log_);
    else softmax_bwd_rows_run<T, 1>(ctx, (T *)v[0]->data, (const T *)v[1]->data, (const T *)v[2]->data, R, (int)D, tpr, nch, log_);
  }
  return 1;
}

extern "C" nb_status nb_cuda_softmax_fwd(const nb_kview *y, const nb_kview *x, int log_) {
  if (nb_kview_numel(y) == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, y->data, "softmax");
  const nb_kview *vs[2] = {y, x};
  nb_iter rows;
  int64_t D, last[2];
  int64_t R = rows_setup(2, vs, &rows, &D, last);
  int fast = 0;
  NB_CUDA_FLOAT_SWITCH(x->dtype, T, fast = softmax_fast<T>(&ctx, vs, 2, R, D, log_));
  if (fast) return nb_cuda_launch_check(log_ ? "log_softmax" : "softmax");
  int th = nb_cuda_row_threads(D);
  NB_CUDA_FLOAT_SWITCH(x->dtype, T,
    nb_softmax_fwd_kernel<T><<<row_grid(&ctx, R, th), th, 0, ctx.stream>>>(
        (T *)y->data, (const T *)x->data, rows, R, D, last[0], last[1], log_));
  return nb_cuda_launch_check(log_ ? "log_softmax" : "softmax");
}

extern "C" nb_status nb_cuda_softmax_bwd(const nb_kview *dx, const nb_kview *dy,
                                         const nb_kview *y, int log_) {
  if (nb_kview_numel(dx) == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, dx->data, "softmax_bwd");
  const nb_kview *vs[3] = {dx, dy, y};
  nb_iter rows;
  int64_t D, last[3];
  int64_t R = rows_setup(3, vs, &rows, &D, last);
  int fast = 0;
  NB_CUDA_FLOAT_SWITCH(dx->dtype, T, fast = softmax_fast<T>(&ctx, vs, 3, R, D, log_));
  if (fast) return nb_cuda_launch_check(log_ ? "log_softmax_bwd" : "softmax_bwd");
  int th = nb_cuda_row_threads(D);
  NB_CUDA_FLOAT_SWITCH(dx->dtype, T,
    nb_softmax_bwd_kernel<T><<<row_grid(&ctx, R, th), th, 0, ctx.stream>>>(
        (T *)dx->data, (const T *)dy->data, (const T *)y->data, rows, R, D, last[0], last[1],
        last[2], log_));
  return nb_cuda_launch_check(log_ ? "log_softmax_bwd" : "softmax_bwd");
}
