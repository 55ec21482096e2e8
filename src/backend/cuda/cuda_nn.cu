/* Fused row kernels: softmax / log_softmax forward and backward, layer norm
 * and RMS norm forward and backward, cross-entropy forward and backward.
 *
 * One block per row (rows strided over the grid). A row of up to
 * NB_ROW_CACHE * blockDim elements is read once into registers; longer rows
 * use an online max/sum pass and a second read. Statistics accumulate in
 * f32 (f64 for f64 inputs).
 *
 * Norm backward computes dx per row, then dw/db deterministically: a column
 * kernel writes per-split partial sums, and a small kernel adds the splits
 * in order. Cross-entropy never stores probabilities; a target outside
 * [0, C) that is not ignore_index sets the device flag, and the host
 * wrapper reads it (one stream sync) to return NB_ERR_INDEX at the failing
 * call (see cuda_api.h for the deferred mode). */
#include <math.h>

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
      A lse = m + nb_log_(s), inv = (A)1 / s;
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        if (j < D) yr[j * sy] = nb_from_d<T>((double)(log_ ? v[k] - lse : nb_exp_(v[k] - m) * inv));
      }
    } else {
      A m = -INFINITY, s = 0;
      for (int64_t j = tid; j < D; j += bd) {
        A v = (A)nb_to_f(xr[j * sx]);
        if (v > m) { s = s * nb_exp_(m - v) + (A)1; m = v; }
        else s += nb_exp_(v - m);
      }
      nb_online_merge(m, s, smem);
      A lse = m + nb_log_(s), inv = (A)1 / s;
      for (int64_t j = tid; j < D; j += bd) {
        A v = (A)nb_to_f(xr[j * sx]);
        yr[j * sy] = nb_from_d<T>((double)(log_ ? v - lse : nb_exp_(v - m) * inv));
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
        if (j < D) dxr[j * sdx] = nb_from_d<T>((double)(log_ ? g[k] - nb_exp_(v[k]) * s : v[k] * (g[k] - s)));
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
        dxr[j * sdx] = nb_from_d<T>((double)(log_ ? g - nb_exp_(v) * s : v * (g - s)));
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


extern "C" nb_status nb_cuda_softmax_fwd(const nb_kview *y, const nb_kview *x, int log_) {
  if (nb_kview_numel(y) == 0) return NB_OK;
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(y->data, "softmax", &ctx);
  if (st) return st;
  const nb_kview *vs[2] = {y, x};
  nb_iter rows;
  int64_t D, last[2];
  int64_t R = rows_setup(2, vs, &rows, &D, last);
  int th = nb_cuda_row_threads(D);
  NB_CUDA_FLOAT_SWITCH(x->dtype, T,
    nb_softmax_fwd_kernel<T><<<row_grid(&ctx, R, th), th, 0, ctx.stream>>>(
        (T *)y->data, (const T *)x->data, rows, R, D, last[0], last[1], log_));
  return nb_cuda_launch_check(log_ ? "log_softmax" : "softmax");
}

extern "C" nb_status nb_cuda_softmax_bwd(const nb_kview *dx, const nb_kview *dy,
                                         const nb_kview *y, int log_) {
  if (nb_kview_numel(dx) == 0) return NB_OK;
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(dx->data, "softmax_bwd", &ctx);
  if (st) return st;
  const nb_kview *vs[3] = {dx, dy, y};
  nb_iter rows;
  int64_t D, last[3];
  int64_t R = rows_setup(3, vs, &rows, &D, last);
  int th = nb_cuda_row_threads(D);
  NB_CUDA_FLOAT_SWITCH(dx->dtype, T,
    nb_softmax_bwd_kernel<T><<<row_grid(&ctx, R, th), th, 0, ctx.stream>>>(
        (T *)dx->data, (const T *)dy->data, (const T *)y->data, rows, R, D, last[0], last[1],
        last[2], log_));
  return nb_cuda_launch_check(log_ ? "log_softmax_bwd" : "softmax_bwd");
}

/* ---- layer norm / RMS norm ---------------------------------------------- */
struct nb_norm_args {
  int64_t R, D;
  const void *w, *b;
  int wdt, bdt;
  float *mean, *rstd; /* f32 (R); mean may be NULL */
  double eps;
  int rms;
};

/* w[j] or b[j] of any float dtype, or dflt when absent. */
__device__ __forceinline__ double nb_opt_load(const void *p, int dt, int64_t j, double dflt) {
  return p ? nb_load_any((const char *)p + j * nb_dt_size(dt), dt) : dflt;
}

/* y = (x - mean) * rstd * w + b (rms: mean 0, no b). */
template <typename A>
__device__ __forceinline__ A nb_norm_out(const nb_norm_args &a, A xv, A mu, A rs, int64_t j) {
  A o = (xv - mu) * rs * (A)nb_opt_load(a.w, a.wdt, j, 1.0);
  if (!a.rms) o += (A)nb_opt_load(a.b, a.bdt, j, 0.0);
  return o;
}

template <typename T>
__global__ void __launch_bounds__(1024) nb_norm_fwd_kernel(T *y, const T *x, nb_norm_args a) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  const int cached = a.D <= (int64_t)NB_ROW_CACHE * bd;
  for (int64_t r = blockIdx.x; r < a.R; r += gridDim.x) {
    const T *xr = x + r * a.D;
    T *yr = y + r * a.D;
    A v[NB_ROW_CACHE];
    A s = 0;
    if (cached) {
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        v[k] = j < a.D ? (A)nb_to_f(xr[j]) : (A)0;
        s += a.rms ? v[k] * v[k] : v[k];
      }
    } else {
      for (int64_t j = tid; j < a.D; j += bd) {
        A t = (A)nb_to_f(xr[j]);
        s += a.rms ? t * t : t;
      }
    }
    s = nb_block_sum(s, smem);
    A mu = a.rms ? (A)0 : s / (A)a.D, var;
    if (a.rms) {
      var = s / (A)a.D;
    } else { /* second pass over the centred values for accuracy */
      A q = 0;
      if (cached) {
#pragma unroll
        for (int k = 0; k < NB_ROW_CACHE; k++)
          if (tid + (int64_t)k * bd < a.D) q += (v[k] - mu) * (v[k] - mu);
      } else {
        for (int64_t j = tid; j < a.D; j += bd) {
          A t = (A)nb_to_f(xr[j]) - mu;
          q += t * t;
        }
      }
      var = nb_block_sum(q, smem) / (A)a.D;
    }
    A rs = (A)1 / sqrt(var + (A)a.eps);
    if (tid == 0) {
      a.rstd[r] = (float)rs;
      if (a.mean) a.mean[r] = (float)mu;
    }
    if (cached) {
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        if (j < a.D) yr[j] = nb_from_d<T>((double)nb_norm_out(a, v[k], mu, rs, j));
      }
    } else {
      for (int64_t j = tid; j < a.D; j += bd)
        yr[j] = nb_from_d<T>((double)nb_norm_out(a, (A)nb_to_f(xr[j]), mu, rs, j));
    }
  }
}

extern "C" nb_status nb_cuda_norm_fwd(const nb_kview *y, const nb_kview *mean,
                                      const nb_kview *rstd, const nb_kview *x, const nb_kview *w,
                                      const nb_kview *b, double eps, int rms) {
  int nd = x->ndim;
  nb_norm_args a;
  a.D = nd ? x->shape[nd - 1] : 1;
  a.R = a.D ? nb_kview_numel(x) / a.D : 0;
  if (a.R == 0 || a.D == 0) return NB_OK;
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(y->data, rms ? "rms_norm" : "layer_norm", &ctx);
  if (st) return st;
  a.w = w ? w->data : NULL;
  a.b = b && !rms ? b->data : NULL;
  a.wdt = w ? (int)w->dtype : 0;
  a.bdt = b ? (int)b->dtype : 0;
  a.mean = mean && !rms ? (float *)mean->data : NULL;
  a.rstd = (float *)rstd->data;
  a.eps = eps;
  a.rms = rms;
  int th = nb_cuda_row_threads(a.D);
  NB_CUDA_FLOAT_SWITCH(x->dtype, T,
    nb_norm_fwd_kernel<T><<<row_grid(&ctx, a.R, th), th, 0, ctx.stream>>>((T *)y->data,
                                                                       (const T *)x->data, a));
  return nb_cuda_launch_check(rms ? "rms_norm" : "layer_norm");
}

/* dx = rstd * (g - mean(g) - xhat * mean(g*xhat)), g = dy*w; rms drops mean(g). */
template <typename T>
__global__ void __launch_bounds__(1024) nb_norm_bwd_dx_kernel(T *dx, const T *dy, const T *x, nb_norm_args a) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < a.R; r += gridDim.x) {
    const T *xr = x + r * a.D, *dyr = dy + r * a.D;
    T *dxr = dx + r * a.D;
    A mu = a.mean && !a.rms ? (A)a.mean[r] : (A)0, rs = (A)a.rstd[r];
    A sg = 0, sgx = 0;
    for (int64_t j = tid; j < a.D; j += bd) {
      A g = (A)nb_to_f(dyr[j]) * (A)nb_opt_load(a.w, a.wdt, j, 1.0);
      A xh = ((A)nb_to_f(xr[j]) - mu) * rs;
      sg += g;
      sgx += g * xh;
    }
    sg = nb_block_sum(sg, smem) / (A)a.D;
    sgx = nb_block_sum(sgx, smem) / (A)a.D;
    if (a.rms) sg = 0;
    for (int64_t j = tid; j < a.D; j += bd) {
      A g = (A)nb_to_f(dyr[j]) * (A)nb_opt_load(a.w, a.wdt, j, 1.0);
      A xh = ((A)nb_to_f(xr[j]) - mu) * rs;
      dxr[j] = nb_from_d<T>((double)(rs * (g - sg - xh * sgx)));
    }
  }
}

/* Column partials: part_w/part_b[s * D + d] = sums over the rows of split s. */
template <typename T>
__global__ void nb_norm_bwd_dw_kernel(const T *dy, const T *x, nb_norm_args a, int64_t rows_per,
                                      double *part_w, double *part_b) {
  typedef typename nb_acc<T>::type A;
  int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t s = blockIdx.y;
  if (d >= a.D) return;
  int64_t r0 = s * rows_per, r1 = r0 + rows_per < a.R ? r0 + rows_per : a.R;
  A aw = 0, ab = 0;
  for (int64_t r = r0; r < r1; r++) {
    A g = (A)nb_to_f(dy[r * a.D + d]);
    A mu = a.mean && !a.rms ? (A)a.mean[r] : (A)0;
    aw += g * (((A)nb_to_f(x[r * a.D + d]) - mu) * (A)a.rstd[r]);
    ab += g;
  }
  part_w[s * a.D + d] = aw;
  part_b[s * a.D + d] = ab;
}

__global__ void nb_norm_bwd_finish_kernel(int64_t D, int64_t S, const double *part_w,
                                          const double *part_b, void *dw, int dwdt, void *db,
                                          int dbdt) {
  int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  double sw = 0, sb = 0;
  for (int64_t s = 0; s < S; s++) {
    sw += part_w[s * D + d];
    sb += part_b[s * D + d];
  }
  if (dw) nb_store_any((char *)dw + d * nb_dt_size(dwdt), dwdt, sw);
  if (db) nb_store_any((char *)db + d * nb_dt_size(dbdt), dbdt, sb);
}

template <typename T>
static nb_status norm_dw_run(const nb_cuda_ctx *ctx, const nb_kview *dw, const nb_kview *db,
                             const nb_kview *dy, const nb_kview *x, const nb_norm_args *a) {
  int64_t cols = (a->D + 127) / 128;
  int64_t S = ((int64_t)ctx->n_sm * 8 + cols - 1) / cols;
  int64_t maxS = (a->R + 15) / 16;
  if (S > maxS) S = maxS;
  if (S > 65535) S = 65535;
  if (S < 1) S = 1;
  int64_t rows_per = (a->R + S - 1) / S;
  size_t bytes = (size_t)(S * a->D) * sizeof(double);
  double *pw = (double *)nb_cuda_scratch(ctx, 2 * bytes);
  if (!pw) return nb_last_status();
  double *pb = pw + S * a->D;
  nb_norm_bwd_dw_kernel<T><<<dim3((unsigned)cols, (unsigned)S), 128, 0, ctx->stream>>>(
      (const T *)dy->data, (const T *)x->data, *a, rows_per, pw, pb);
  nb_status st = nb_cuda_launch_check("norm_bwd (dw partials)");
  if (!st) {
    nb_norm_bwd_finish_kernel<<<(unsigned)cols, 128, 0, ctx->stream>>>(
        a->D, S, pw, pb, dw ? dw->data : NULL, dw ? (int)dw->dtype : 0, db ? db->data : NULL,
        db ? (int)db->dtype : 0);
    st = nb_cuda_launch_check("norm_bwd (dw finish)");
  }
  nb_cuda_scratch_free(ctx, pw, 2 * bytes);
  return st;
}

extern "C" nb_status nb_cuda_norm_bwd(const nb_kview *dx, const nb_kview *dw, const nb_kview *db,
                                      const nb_kview *dy, const nb_kview *x,
                                      const nb_kview *mean, const nb_kview *rstd,
                                      const nb_kview *w, int rms) {
  int nd = x->ndim;
  nb_norm_args a;
  a.D = nd ? x->shape[nd - 1] : 1;
  a.R = a.D ? nb_kview_numel(x) / a.D : 0;
  if (a.D == 0) return NB_OK;
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(x->data, rms ? "rms_norm_bwd" : "layer_norm_bwd", &ctx);
  if (st) return st;
  if (a.R == 0) { /* no rows: the parameter gradients are zero */
    if (dw && (st = nb_cuda_fill(dw, 0.0))) return st;
    if (db && (st = nb_cuda_fill(db, 0.0))) return st;
    return NB_OK;
  }
  a.w = w ? w->data : NULL;
  a.b = NULL;
  a.wdt = w ? (int)w->dtype : 0;
  a.bdt = 0;
  a.mean = mean && !rms ? (float *)mean->data : NULL;
  a.rstd = (float *)rstd->data;
  a.eps = 0;
  a.rms = rms;
  int th = nb_cuda_row_threads(a.D);
  if (dx) {
    NB_CUDA_FLOAT_SWITCH(x->dtype, T,
      nb_norm_bwd_dx_kernel<T><<<row_grid(&ctx, a.R, th), th, 0, ctx.stream>>>(
          (T *)dx->data, (const T *)dy->data, (const T *)x->data, a));
    if ((st = nb_cuda_launch_check("norm_bwd (dx)"))) return st;
  }
  if (!dw && !db) return NB_OK;
  NB_CUDA_FLOAT_SWITCH(x->dtype, T, return norm_dw_run<T>(&ctx, dw, db, dy, x, &a));
  return NB_OK;
}
