/* Optimizer steps, in place on contiguous tensors: one fused pass reads
 * p, g and the state once and writes p and the state once. Arithmetic in
 * f32 (f64 when the parameter is f64); the CPU reference computes in double,
 * so f32 results agree to rounding. Same formulas as the CPU kernels:
 *   AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *          p = p (1 - lr wd) - lr (m/c1) / (sqrt(v/c2) + eps)
 *   SGD:   d = g + wd p; with momentum buf = mom buf + (1-damp) d,
 *          d = nesterov ? d + mom buf : buf; p -= lr d. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

#define NB_GRID_LOOP(i, n)                                                          \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
       i += (int64_t)gridDim.x * blockDim.x)

struct nb_adamw_args {
  double lr, b1, b2, eps, decay, c1, c2;
};

template <typename T, typename M>
__global__ void nb_adamw_kernel(T *p, const T *g, M *m, M *v, int64_t n, nb_adamw_args a) {
  typedef typename nb_acc<T>::type C;
  const C b1 = (C)a.b1, b2 = (C)a.b2, lr = (C)a.lr, eps = (C)a.eps, decay = (C)a.decay;
  const C ic1 = (C)(1.0 / a.c1), ic2 = (C)(1.0 / a.c2);
  NB_GRID_LOOP(i, n) {
    C gi = (C)nb_to_f(g[i]);
    C mi = b1 * (C)nb_to_f(m[i]) + ((C)1 - b1) * gi;
    C vi = b2 * (C)nb_to_f(v[i]) + ((C)1 - b2) * gi * gi;
    C pi = (C)nb_to_f(p[i]) * decay - lr * (mi * ic1) / (sqrt(vi * ic2) + eps);
    m[i] = nb_from_d<M>((double)mi);
    v[i] = nb_from_d<M>((double)vi);
    p[i] = nb_from_d<T>((double)pi);
  }
}

template <typename T, typename M>
__global__ void nb_sgd_kernel(T *p, const T *g, M *buf, int64_t n, double lr, double mom,
                              double damp, int nesterov, double wd) {
  typedef typename nb_acc<T>::type C;
  NB_GRID_LOOP(i, n) {
    C pi = (C)nb_to_f(p[i]);
    C d = (C)nb_to_f(g[i]) + (C)wd * pi;
    if (buf) {
      C b = (C)mom * (C)nb_to_f(buf[i]) + ((C)1 - (C)damp) * d;
      buf[i] = nb_from_d<M>((double)b);
      d = nesterov ? d + (C)mom * b : b;
    }
    p[i] = nb_from_d<T>((double)(pi - (C)lr * d));
  }
}

static nb_status state_dtype_ok(const char *op, const nb_kview *s) {
  if (!s || s->dtype == NB_F32 || s->dtype == NB_F64) return NB_OK;
  return nb_error_set(NB_ERR_DTYPE, "cuda %s: state dtype %s (expected f32 or f64)", op,
                      nb_dtype_name(s->dtype));
}

template <typename T>
static nb_status adamw_run(const nb_cuda_ctx *ctx, const nb_kview *p, const nb_kview *g,
                           const nb_kview *m, const nb_kview *v, int64_t n,
                           const nb_adamw_args *a) {
  unsigned gr = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  if (m->dtype == NB_F64)
    nb_adamw_kernel<T, double><<<gr, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (T *)p->data, (const T *)g->data, (double *)m->data, (double *)v->data, n, *a);
  else
    nb_adamw_kernel<T, float><<<gr, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (T *)p->data, (const T *)g->data, (float *)m->data, (float *)v->data, n, *a);
  return nb_cuda_launch_check("adamw_step");
}

extern "C" nb_status nb_cuda_adamw_step(const nb_kview *p, const nb_kview *g, const nb_kview *m,
                                        const nb_kview *v, double lr, double beta1,
                                        double beta2, double eps, double weight_decay,
                                        int64_t step) {
  int64_t n = nb_kview_numel(p);
  if (n == 0) return NB_OK;
  nb_status st = state_dtype_ok("adamw_step", m);
  if (!st) st = state_dtype_ok("adamw_step", v);
  if (!st && m->dtype != v->dtype)
    st = nb_error_set(NB_ERR_DTYPE, "cuda adamw_step: m is %s but v is %s", nb_dtype_name(m->dtype),
                      nb_dtype_name(v->dtype));
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(p->data, "adamw_step", &ctx))) return st;
  nb_adamw_args a;
  a.lr = lr;
  a.b1 = beta1;
  a.b2 = beta2;
  a.eps = eps;
  a.decay = 1.0 - lr * weight_decay;
  a.c1 = 1.0 - pow(beta1, (double)step);
  a.c2 = 1.0 - pow(beta2, (double)step);
  NB_CUDA_FLOAT_SWITCH(p->dtype, T, return adamw_run<T>(&ctx, p, g, m, v, n, &a));
  return NB_OK;
}

extern "C" nb_status nb_cuda_sgd_step(const nb_kview *p, const nb_kview *g, const nb_kview *buf,
                                      double lr, double momentum, double dampening, int nesterov,
                                      double weight_decay) {
  int64_t n = nb_kview_numel(p);
  if (n == 0) return NB_OK;
  const nb_kview *b = momentum != 0.0 && buf ? buf : NULL;
  nb_status st = state_dtype_ok("sgd_step", b);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(p->data, "sgd_step", &ctx))) return st;
  unsigned gr = nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS);
  if (b && b->dtype == NB_F64) {
    NB_CUDA_FLOAT_SWITCH(p->dtype, T,
      nb_sgd_kernel<T, double><<<gr, NB_CUDA_THREADS, 0, ctx.stream>>>(
          (T *)p->data, (const T *)g->data, (double *)b->data, n, lr, momentum, dampening,
          nesterov, weight_decay));
  } else {
    NB_CUDA_FLOAT_SWITCH(p->dtype, T,
      nb_sgd_kernel<T, float><<<gr, NB_CUDA_THREADS, 0, ctx.stream>>>(
          (T *)p->data, (const T *)g->data, b ? (float *)b->data : NULL, n, lr, momentum,
          dampening, nesterov, weight_decay));
  }
  return nb_cuda_launch_check("sgd_step");
}
