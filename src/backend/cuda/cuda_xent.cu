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
