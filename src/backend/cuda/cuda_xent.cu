/* Cross-entropy forward and backward over (N, C) logits of any strides: one
 * block per row; probabilities are never stored; a target outside [0, C)
 * that is not ignore_index sets the device flag, read by the host wrapper
 * (one stream sync) so the failing call returns NB_ERR_INDEX. */
#include <math.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_rows.cuh"

/* ---- cross-entropy --------------------------------------------------------- */
struct nb_xent_args {
  int64_t N, C;
  int64_t s_row, s_col;   /* logits strides */
  const int64_t *tgt;
  int64_t s_tgt;
  int64_t ignore;
  double smooth;
  int64_t *flag;
};

__device__ __forceinline__ void nb_flag_raise(int64_t *flag, int64_t value) {
  if (atomicCAS((unsigned long long *)flag, 0ull, 1ull) == 0ull) flag[1] = value;
}

/* loss = lse - (1-eps) x[t] - eps/C sum(x); ignored rows give 0. */
template <typename T>
__global__ void __launch_bounds__(1024) nb_xent_fwd_kernel(nb_xent_args a, const T *logits, char *loss, int ldt,
                                   int64_t s_loss, char *lse, int lsdt, int64_t s_lse) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  int el = nb_dt_size(ldt), es = nb_dt_size(lsdt);
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    A m = -INFINITY, s = 0, sx = 0;
    for (int64_t j = tid; j < a.C; j += bd) {
      A v = (A)nb_to_f(xr[j * a.s_col]);
      sx += v;
      if (v > m) { s = s * nb_exp_(m - v) + (A)1; m = v; }
      else s += nb_exp_(v - m);
    }
    nb_online_merge(m, s, smem);
    sx = nb_block_sum(sx, smem);
    if (tid == 0) {
      A l = m + nb_log_(s), out = 0;
      int64_t t = a.tgt[r * a.s_tgt];
      if (t != a.ignore) {
        if (t < 0 || t >= a.C) nb_flag_raise(a.flag, t);
        else out = l - (A)(1.0 - a.smooth) * (A)nb_to_f(xr[t * a.s_col]) - (A)(a.smooth / a.C) * sx;
      }
      if (lse) nb_store_any(lse + r * s_lse * es, lsdt, (double)l);
      nb_store_any(loss + r * s_loss * el, ldt, (double)out);
    }
  }
}

/* dlogits = dloss * (softmax - (1-eps) onehot - eps/C); ignored rows 0. */
template <typename T>
__global__ void __launch_bounds__(1024) nb_xent_bwd_kernel(nb_xent_args a, T *dlog, int64_t sd_row, int64_t sd_col,
                                   const T *logits, const char *dloss, int dldt, int64_t s_dloss,
                                   const char *lse, int lsdt, int64_t s_lse) {
  typedef typename nb_acc<T>::type A;
  const int bd = blockDim.x, tid = threadIdx.x;
  int el = nb_dt_size(dldt), es = nb_dt_size(lsdt);
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    T *dr = dlog + r * sd_row;
    int64_t t = a.tgt[r * a.s_tgt];
    int valid = t != a.ignore && t >= 0 && t < a.C;
    if (t != a.ignore && !valid && tid == 0) nb_flag_raise(a.flag, t);
    A g = valid ? (A)nb_load_any(dloss + r * s_dloss * el, dldt) : (A)0;
    A l = (A)nb_load_any(lse + r * s_lse * es, lsdt);
    A base = (A)(a.smooth / a.C), hit = (A)(1.0 - a.smooth);
    for (int64_t j = tid; j < a.C; j += bd) {
      A p = valid ? nb_exp_((A)nb_to_f(xr[j * a.s_col]) - l) : (A)0;
      A q = valid ? base + (j == t ? hit : (A)0) : (A)0;
      dr[j * sd_col] = nb_from_d<T>((double)(g * (p - q)));
    }
  }
}

static void xent_setup(nb_xent_args *a, const nb_kview *logits, const nb_kview *targets,
                       int64_t ignore, double smooth, int64_t *flag) {
  int nd = logits->ndim;
  a->C = nd ? logits->shape[nd - 1] : 1;
  a->N = nd == 2 ? logits->shape[0] : 1;
  a->s_col = nd ? logits->strides[nd - 1] : 0;
  a->s_row = nd == 2 ? logits->strides[0] : 0;
  a->tgt = (const int64_t *)targets->data;
  a->s_tgt = targets->ndim ? targets->strides[0] : 0;
  a->ignore = ignore;
  a->smooth = smooth;
  a->flag = flag;
}

extern "C" nb_status nb_cuda_xent_fwd(const nb_kview *loss, const nb_kview *lse,
                                      const nb_kview *logits, const nb_kview *targets,
                                      int64_t ignore_index, double smoothing) {
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(logits->data, "cross_entropy", &ctx);
  if (st) return st;
  nb_xent_args a;
  xent_setup(&a, logits, targets, ignore_index, smoothing, nb_cuda_flag(&ctx));
  if (a.N == 0) return NB_OK;
  int th = nb_cuda_row_threads(a.C);
  int64_t s_loss = loss->ndim ? loss->strides[0] : 0, s_lse = lse && lse->ndim ? lse->strides[0] : 0;
  NB_CUDA_FLOAT_SWITCH(logits->dtype, T,
    nb_xent_fwd_kernel<T><<<row_grid(&ctx, a.N, th), th, 0, ctx.stream>>>(
        a, (const T *)logits->data, (char *)loss->data, loss->dtype, s_loss,
        lse ? (char *)lse->data : NULL, lse ? (int)lse->dtype : 0, s_lse));
  if ((st = nb_cuda_launch_check("cross_entropy"))) return st;
  return nb_cuda_flag_check(&ctx, "cross_entropy: target", a.C);
}

extern "C" nb_status nb_cuda_xent_bwd(const nb_kview *dlogits, const nb_kview *dloss,
                                      const nb_kview *logits, const nb_kview *targets,
                                      const nb_kview *lse, int64_t ignore_index,
                                      double smoothing) {
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(logits->data, "cross_entropy_bwd", &ctx);
  if (st) return st;
  nb_xent_args a;
  xent_setup(&a, logits, targets, ignore_index, smoothing, nb_cuda_flag(&ctx));
  if (a.N == 0 || a.C == 0) return NB_OK;
  int nd = dlogits->ndim;
  int64_t sd_col = nd ? dlogits->strides[nd - 1] : 0, sd_row = nd == 2 ? dlogits->strides[0] : 0;
  int64_t s_dl = dloss->ndim ? dloss->strides[0] : 0, s_lse = lse->ndim ? lse->strides[0] : 0;
  int th = nb_cuda_row_threads(a.C);
  NB_CUDA_FLOAT_SWITCH(logits->dtype, T,
    nb_xent_bwd_kernel<T><<<row_grid(&ctx, a.N, th), th, 0, ctx.stream>>>(
        a, (T *)dlogits->data, sd_row, sd_col, (const T *)logits->data,
        (const char *)dloss->data, dloss->dtype, s_dl, (const char *)lse->data, lse->dtype, s_lse));
  if ((st = nb_cuda_launch_check("cross_entropy_bwd"))) return st;
  return nb_cuda_flag_check(&ctx, "cross_entropy_bwd: target", a.C);
}

/* ---- fused forward + backward ------------------------------------------------
 * One pass per row computes the loss, the log-sum-exp and
 * dlogits = dloss[row] * (softmax - onehot_smoothed): the logits are read
 * once (twice from L2 on the streaming path) and dlogits written once, so a
 * training step's cross-entropy costs one read and one write of the logits.
 * Float rows work in the log2 domain (u = x log2 e, exp2f); f64 rows in the
 * natural one with exp/log. */
template <typename A> struct nb_xe;
template <> struct nb_xe<float> {
  static constexpr float L = 1.4426950408889634f; /* log2(e): u = x * L */
  __device__ static float ex(float u) { return exp2f(u); }
  __device__ static float lg(float s) { return log2f(s); }
};
template <> struct nb_xe<double> {
  static constexpr double L = 1.0;
  __device__ static double ex(double u) { return exp(u); }
  __device__ static double lg(double s) { return log(s); }
};

/* Where the fused kernels write loss/lse and read the row gradient. */
struct nb_xent_io {
  char *loss, *lse;
  const char *dloss;
  int ldt, lsdt, dldt;
  int64_t s_loss, s_lse, s_dloss;
};

/* Sums two values over the block in one round of barriers (smem >= 64). */
template <typename A>
__device__ __forceinline__ void nb_xent_block_sum2(A &x, A &y, A *smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = nb_warp_sum(x);
  y = nb_warp_sum(y);
  __syncthreads(); /* smem may still be read by the previous reduction */
  if (lane == 0) { smem[warp] = x; smem[32 + warp] = y; }
  __syncthreads();
  x = lane < nw ? smem[lane] : (A)0;
  y = lane < nw ? smem[32 + lane] : (A)0;
  x = nb_warp_sum(x);
  y = nb_warp_sum(y);
}

/* Per-row constants of the gradient once lse2 (log2 domain) is known:
 * dlogits[j] = g * exp(x_j - lse) - gb - (j == t ? gh : 0). Thread 0 also
 * stores loss and lse and raises the flag for a bad target. */
template <typename A> struct nb_xent_row { A lse2, g, gb, gh; int64_t t; int valid; };

template <typename T, typename A>
__device__ __forceinline__ nb_xent_row<A> nb_xent_finish(const nb_xent_args &a, const nb_xent_io &io,
                                                          int64_t r, const T *xr, A M2, A S, A sx) {
  nb_xent_row<A> w;
  w.lse2 = M2 + nb_xe<A>::lg(S);
  w.t = a.tgt[r * a.s_tgt];
  int valid = w.valid = w.t != a.ignore && w.t >= 0 && w.t < a.C;
  if (threadIdx.x == 0) {
    A l = w.lse2 / nb_xe<A>::L, out = 0;
    if (w.t != a.ignore) {
      if (!valid) nb_flag_raise(a.flag, w.t);
      else out = l - (A)(1.0 - a.smooth) * (A)nb_to_f(xr[w.t * a.s_col]) - (A)(a.smooth / a.C) * sx;
    }
    if (io.lse) nb_store_any(io.lse + r * io.s_lse * nb_dt_size(io.lsdt), io.lsdt, (double)l);
    nb_store_any(io.loss + r * io.s_loss * nb_dt_size(io.ldt), io.ldt, (double)out);
  }
  w.g = valid ? (A)nb_load_any(io.dloss + r * io.s_dloss * nb_dt_size(io.dldt), io.dldt) : (A)0;
  w.gb = w.g * (A)(a.smooth / a.C);
  w.gh = w.g * (A)(1.0 - a.smooth);
  return w;
}

/* Stores an accumulator value as T (no double round trip for float). */
template <typename T> __device__ __forceinline__ T nb_xent_to(float x) { return nb_from_f<T>(x); }
template <typename T> __device__ __forceinline__ T nb_xent_to(double x) { return nb_from_d<T>(x); }

/* Ignored rows (and bad targets) get exact zeros, whatever their logits. */
template <typename A>
__device__ __forceinline__ A nb_xent_grad(const nb_xent_row<A> &w, A x, int64_t j) {
  if (!w.valid) return (A)0;
  A d = w.g * nb_xe<A>::ex(x * nb_xe<A>::L - w.lse2) - w.gb;
  return j == w.t ? d - w.gh : d;
}

/* Any strides: online (max, sum) in one read, the gradient in a second. */
template <typename T>
__global__ void __launch_bounds__(1024) nb_xent_fused_kernel(nb_xent_args a, nb_xent_io io, const T *logits,
                                                             T *dlog, int64_t sd_row, int64_t sd_col) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[64];
  const int bd = blockDim.x, tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    A m = -INFINITY, s = 0, sx = 0;
    for (int64_t j = tid; j < a.C; j += bd) {
      A v = (A)nb_to_f(xr[j * a.s_col]), u = v * nb_xe<A>::L;
      sx += v;
      if (u > m) { s = s * nb_xe<A>::ex(m - u) + (A)1; m = u; }
      else s += nb_xe<A>::ex(u - m);
    }
    A M = nb_block_max(m, smem);
    s = s == (A)0 ? (A)0 : s * nb_xe<A>::ex(m - M);
    nb_xent_block_sum2(s, sx, smem);
    nb_xent_row<A> w = nb_xent_finish(a, io, r, xr, M, s, sx);
    T *dr = dlog + r * sd_row;
    for (int64_t j = tid; j < a.C; j += bd)
      dr[j * sd_col] = nb_xent_to<T>(nb_xent_grad(w, (A)nb_to_f(xr[j * a.s_col]), j));
  }
}

/* 16-byte vectors of E = 16 / sizeof(T) elements. */
template <typename T> union nb_xvec {
  uint4 u;
  T e[16 / sizeof(T)];
};

template <typename T, typename A>
__device__ __forceinline__ void nb_xent_store_vec(const nb_xent_row<A> &w, const nb_xvec<T> &q,
                                                  uint4 *dv, int i) {
  constexpr int E = 16 / sizeof(T);
  nb_xvec<T> o;
#pragma unroll
  for (int e = 0; e < E; e++) o.e[e] = nb_xent_to<T>(nb_xent_grad(w, (A)nb_to_f(q.e[e]), (int64_t)(i * E + e)));
  __stcs(dv + i, o.u);
}

/* Contiguous, 16-byte aligned rows of at most NV vectors per thread: the row
 * stays in registers between the statistics and the gradient (one HBM read);
 * NV == 0 streams the row twice (the second read mostly hits L2). */
template <typename T, int NV>
__global__ void __launch_bounds__(1024) nb_xent_fused_vec_kernel(nb_xent_args a, nb_xent_io io,
                                                                 const T *logits, T *dlog, int64_t sd_row) {
  typedef typename nb_acc<T>::type A;
  constexpr int E = 16 / sizeof(T);
  __shared__ A smem[64];
  const int bd = blockDim.x, tid = threadIdx.x;
  const int nvec = (int)(a.C / E); /* the host checks C < 2^31 */
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    const uint4 *xv = (const uint4 *)xr;
    uint4 *dv = (uint4 *)(dlog + r * sd_row);
    nb_xvec<T> c[NV > 0 ? NV : 1];
    A m = -INFINITY, s = 0, sx = 0, M;
    if (NV > 0) {
#pragma unroll
      for (int k = 0; k < NV; k++) {
        int i = tid + k * bd;
        if (i < nvec) c[k].u = __ldcs(xv + i);
      }
      /* Only ~2 rows fit in an SM's registers: pull this block's next row
       * into L2 now (one 128-byte line per thread and step), so HBM stays
       * busy while this row is reduced and written. */
      if (r + gridDim.x < a.N) {
        const char *nx = (const char *)(logits + (r + gridDim.x) * a.s_row);
        for (int64_t off = (int64_t)tid * 128; off < a.C * (int64_t)sizeof(T); off += (int64_t)bd * 128)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(nx + off));
      }
#pragma unroll
      for (int k = 0; k < NV; k++)
        if (tid + k * bd < nvec)
#pragma unroll
          for (int e = 0; e < E; e++) m = fmax(m, (A)nb_to_f(c[k].e[e]));
      M = nb_block_max(m * nb_xe<A>::L, smem);
#pragma unroll
      for (int k = 0; k < NV; k++)
        if (tid + k * bd < nvec)
#pragma unroll
          for (int e = 0; e < E; e++) {
            A v = (A)nb_to_f(c[k].e[e]);
            sx += v;
            s += nb_xe<A>::ex(v * nb_xe<A>::L - M);
          }
    } else {
      for (int i = tid; i < nvec; i += bd) { /* online: rescale when the max grows */
        nb_xvec<T> q;
        q.u = xv[i];
        A vm = -INFINITY;
#pragma unroll
        for (int e = 0; e < E; e++) vm = fmax(vm, (A)nb_to_f(q.e[e]) * nb_xe<A>::L);
        if (vm > m) { s = s == (A)0 ? (A)0 : s * nb_xe<A>::ex(m - vm); m = vm; }
#pragma unroll
        for (int e = 0; e < E; e++) {
          A v = (A)nb_to_f(q.e[e]);
          sx += v;
          s += nb_xe<A>::ex(v * nb_xe<A>::L - m);
        }
      }
      M = nb_block_max(m, smem);
      s = s == (A)0 ? (A)0 : s * nb_xe<A>::ex(m - M);
    }
    nb_xent_block_sum2(s, sx, smem);
    nb_xent_row<A> w = nb_xent_finish(a, io, r, xr, M, s, sx);
    if (NV > 0) {
#pragma unroll
      for (int k = 0; k < NV; k++) {
        int i = tid + k * bd;
        if (i < nvec) nb_xent_store_vec<T, A>(w, c[k], dv, i);
      }
    } else {
      for (int i = tid; i < nvec; i += bd) {
        nb_xvec<T> q;
        q.u = __ldcs(xv + i); /* last use of the row */
        nb_xent_store_vec<T, A>(w, q, dv, i);
      }
    }
  }
}

/* The vector kernel applies to contiguous, 16-byte aligned rows of whole
 * vectors in logits and dlogits. */
static int xent_vec_ok(const nb_xent_args *a, const void *x, const void *d, int64_t sd_row,
                       int64_t sd_col, int es) {
  int E = 16 / es;
  return a->C < INT32_MAX && a->s_col == 1 && sd_col == 1 && a->C % E == 0 && (a->N == 1 || (a->s_row % E == 0 && sd_row % E == 0)) &&
         nb_cuda_aligned16(x) && nb_cuda_aligned16(d);
}

template <typename T>
static void xent_fused_launch(const nb_cuda_ctx *ctx, const nb_xent_args &a, const nb_xent_io &io,
                              const T *x, T *d, int64_t sd_row, int64_t sd_col) {
  const int E = 16 / (int)sizeof(T);
  if (!xent_vec_ok(&a, x, d, sd_row, sd_col, (int)sizeof(T))) {
    int th = nb_cuda_row_threads(a.C);
    nb_xent_fused_kernel<T><<<row_grid(ctx, a.N, th), th, 0, ctx->stream>>>(a, io, x, d, sd_row, sd_col);
    return;
  }
  int64_t nvec = a.C / E;
  int th = nb_cuda_row_threads(nvec * 2); /* about 2 vectors per thread, up to 1024 threads */
  int64_t nv = (nvec + th - 1) / th;
  unsigned grid = row_grid(ctx, a.N, th);
  if (nv <= 1) nb_xent_fused_vec_kernel<T, 1><<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row);
  else if (nv <= 2) nb_xent_fused_vec_kernel<T, 2><<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row);
  else if (nv <= 4) nb_xent_fused_vec_kernel<T, 4><<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row);
  else if (nv <= 8) nb_xent_fused_vec_kernel<T, 8><<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row);
  else nb_xent_fused_vec_kernel<T, 0><<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row);
}

/* f64 (the checking dtype) always takes the general kernel. */
static void xent_fused_launch(const nb_cuda_ctx *ctx, const nb_xent_args &a, const nb_xent_io &io,
                              const double *x, double *d, int64_t sd_row, int64_t sd_col) {
  int th = nb_cuda_row_threads(a.C);
  nb_xent_fused_kernel<double><<<row_grid(ctx, a.N, th), th, 0, ctx->stream>>>(a, io, x, d, sd_row, sd_col);
}

extern "C" nb_status nb_cuda_xent_fused(const nb_kview *loss, const nb_kview *lse,
                                        const nb_kview *dlogits, const nb_kview *dloss,
                                        const nb_kview *logits, const nb_kview *targets,
                                        int64_t ignore_index, double smoothing) {
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(logits->data, "cross_entropy", &ctx);
  if (st) return st;
  nb_xent_args a;
  xent_setup(&a, logits, targets, ignore_index, smoothing, nb_cuda_flag(&ctx));
  if (a.N == 0) return NB_OK;
  int nd = dlogits->ndim;
  int64_t sd_col = nd ? dlogits->strides[nd - 1] : 0, sd_row = nd == 2 ? dlogits->strides[0] : 0;
  nb_xent_io io;
  io.loss = (char *)loss->data;
  io.ldt = loss->dtype;
  io.s_loss = loss->ndim ? loss->strides[0] : 0;
  io.lse = lse ? (char *)lse->data : NULL;
  io.lsdt = lse ? (int)lse->dtype : 0;
  io.s_lse = lse && lse->ndim ? lse->strides[0] : 0;
  io.dloss = (const char *)dloss->data;
  io.dldt = dloss->dtype;
  io.s_dloss = dloss->ndim ? dloss->strides[0] : 0;
  NB_CUDA_FLOAT_SWITCH(logits->dtype, T,
    xent_fused_launch(&ctx, a, io, (const T *)logits->data, (T *)dlogits->data, sd_row, sd_col));
  if ((st = nb_cuda_launch_check("cross_entropy"))) return st;
  return nb_cuda_flag_check(&ctx, "cross_entropy: target", a.C);
}
