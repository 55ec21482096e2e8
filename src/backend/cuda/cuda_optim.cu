/* Optimizer steps, in place on contiguous tensors: one fused pass reads
 * p, g and the state once and writes p and the state once. Arithmetic in
 * f32 (f64 when the parameter is f64); the CPU reference computes in double,
 * so f32 results agree to rounding. Same formulas as the CPU kernels:
 *   AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *          p = p (1 - lr wd) - (lr/c1) m / (sqrt(v) / sqrt(c2) + eps)
 *   SGD:   d = g + wd p; with momentum buf = mom buf + (1-damp) d,
 *          d = nesterov ? d + mom buf : buf; p -= lr d. */
#include <math.h>
#include <stdlib.h>

#include "backend/amp_rule.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

#define NB_GRID_LOOP(i, n)                                                          \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
       i += (int64_t)gridDim.x * blockDim.x)

/* AdamW constants in the compute type C, derived once on the host:
 * omb = 1 - beta, step_size = lr / c1, isc2 = 1 / sqrt(c2) (c1, c2 the bias
 * corrections), decay = 1 - lr wd. */
template <typename C> struct nb_adamw_k {
  C b1, omb1, b2, omb2, eps, decay, step_size, isc2;
};

template <typename C>
static __host__ __device__ nb_adamw_k<C> nb_adamw_consts(double lr, double beta1, double beta2,
                                                         double eps, double weight_decay, double t) {
  double c1 = 1.0 - pow(beta1, t), c2 = 1.0 - pow(beta2, t);
  nb_adamw_k<C> k;
  k.b1 = (C)beta1;
  k.omb1 = (C)(1.0 - beta1);
  k.b2 = (C)beta2;
  k.omb2 = (C)(1.0 - beta2);
  k.eps = (C)eps;
  k.decay = (C)(1.0 - lr * weight_decay);
  k.step_size = (C)(lr / c1);
  k.isc2 = (C)(1.0 / sqrt(c2));
  return k;
}

/* Correctly rounded operations named explicitly, so that neither fast math
 * nor FMA contraction can round the per-tensor and the multi-tensor kernels
 * differently: both call nb_adamw_elem and give the same bits. */
__device__ __forceinline__ float nb_am_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double nb_am_fma(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ __forceinline__ float nb_am_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double nb_am_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float nb_am_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double nb_am_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float nb_am_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double nb_am_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float nb_am_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double nb_am_sqrt(double a) { return __dsqrt_rn(a); }

/* One element: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p = p decay - step_size m / (sqrt(v) isc2 + eps). */
template <typename C>
__device__ __forceinline__ void nb_adamw_elem(const nb_adamw_k<C> &k, C g, C &p, C &m, C &v) {
  m = nb_am_fma(k.b1, m, nb_am_mul(k.omb1, g));
  v = nb_am_fma(k.b2, v, nb_am_mul(nb_am_mul(k.omb2, g), g));
  C den = nb_am_fma(nb_am_sqrt(v), k.isc2, k.eps);
  p = nb_am_sub(nb_am_mul(p, k.decay), nb_am_div(nb_am_mul(k.step_size, m), den));
}

template <typename T, typename M>
__global__ void nb_adamw_kernel(T *p, const T *g, M *m, M *v, int64_t n,
                                nb_adamw_k<typename nb_acc<T>::type> k) {
  typedef typename nb_acc<T>::type C;
  NB_GRID_LOOP(i, n) {
    C pi = (C)nb_to_f(p[i]), mi = (C)nb_to_f(m[i]), vi = (C)nb_to_f(v[i]);
    nb_adamw_elem<C>(k, (C)nb_to_f(g[i]), pi, mi, vi);
    m[i] = nb_from_d<M>(mi);
    v[i] = nb_from_d<M>(vi);
    p[i] = nb_from_d<T>(pi);
  }
}

/* ---- multi-tensor AdamW ------------------------------------------------------
 * One launch updates up to NB_AM_MAX tensors of one parameter dtype T with
 * f32 state. The table travels in the kernel's parameters (under 4 KB).
 * Each block owns NB_AM_CHUNK consecutive elements of one tensor; blk[t] is
 * the first block of tensor t, found by binary search. A thread handles
 * NB_AM_UNROLL groups of 4 elements, every load issued before any update,
 * with 16-byte loads of f32 data where the tensor's pointers allow. A
 * tensor may have a working copy w (bf16 or f16: wk 1 or 2), written with
 * the new values rounded; under device control (nb_am_dev.ctl) the block's
 * thread 0 reads the skip flag, the gradient multiplier and the step count
 * and derives the constants, which the others take from shared memory. */
#define NB_AM_MAX 64
#define NB_AM_THREADS 256
#define NB_AM_UNROLL 2
#define NB_AM_CHUNK (NB_AM_THREADS * 4 * NB_AM_UNROLL)

template <typename T> struct nb_am_table {
  int n;
  int blk[NB_AM_MAX + 1];
  unsigned char vec[NB_AM_MAX]; /* p, g aligned to 4 elements, m, v to 16 bytes, w to 8 */
  unsigned char wk[NB_AM_MAX];  /* working copy: 0 none, 1 bf16, 2 f16 */
  int64_t numel[NB_AM_MAX];
  T *p[NB_AM_MAX];
  const T *g[NB_AM_MAX];
  float *m[NB_AM_MAX], *v[NB_AM_MAX];
  void *w[NB_AM_MAX];
};

/* Device control (nb_adamw_args): NULL ctl, the host's constants. */
struct nb_am_dev {
  const double *ctl, *base;
  double lr, beta1, beta2, eps, wd;
};

template <typename T> struct alignas(4 * sizeof(T)) nb_am4 { T x[4]; };

/* The tensor that block b of a multi-tensor launch works on: the last t
 * with blk[t] <= b (blk[t]: the first block of tensor t). */
__device__ __forceinline__ int nb_mt_find(const int *blk, int n, int b) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (blk[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* w[i] = x rounded to the working copy's dtype. */
template <typename C>
__device__ __forceinline__ void nb_am_store_w(void *w, int wk, int64_t i, C x) {
  if (wk == 1) ((__nv_bfloat16 *)w)[i] = nb_from_d<__nv_bfloat16>(x);
  else if (wk == 2) ((__half *)w)[i] = nb_from_d<__half>(x);
}

/* Four consecutive values into w + e (8-byte aligned) in one store. */
template <typename C>
__device__ __forceinline__ void nb_am_store_w4(void *w, int wk, int64_t e, const C *x) {
  if (wk == 1) {
    nb_am4<__nv_bfloat16> q;
#pragma unroll
    for (int j = 0; j < 4; j++) q.x[j] = nb_from_d<__nv_bfloat16>(x[j]);
    *(nb_am4<__nv_bfloat16> *)((__nv_bfloat16 *)w + e) = q;
  } else if (wk == 2) {
    nb_am4<__half> q;
#pragma unroll
    for (int j = 0; j < 4; j++) q.x[j] = nb_from_d<__half>(x[j]);
    *(nb_am4<__half> *)((__half *)w + e) = q;
  }
}

/* The gradient as the update reads it: g, or g * gs rounded to T (what
 * scale_multi would have stored) under device control. */
template <typename T, typename C>
__device__ __forceinline__ C nb_am_grad(T g, bool scaled, C gs) {
  C x = (C)nb_to_f(g);
  return scaled ? (C)nb_to_f(nb_from_d<T>(nb_am_mul(x, gs))) : x;
}

/* One element of tensor t, unvectorised: the update (unless skip) and the copy. */
template <typename T, typename C>
__device__ __forceinline__ void nb_am_one(const nb_am_table<T> &tab, int t, int64_t i,
                                          const nb_adamw_k<C> &k, bool skip, bool scaled, C gs) {
  T *p = tab.p[t];
  if (!skip) {
    C pi = (C)nb_to_f(p[i]), mi = (C)tab.m[t][i], vi = (C)tab.v[t][i];
    nb_adamw_elem<C>(k, nb_am_grad<T, C>(tab.g[t][i], scaled, gs), pi, mi, vi);
    tab.m[t][i] = (float)mi;
    tab.v[t][i] = (float)vi;
    p[i] = nb_from_d<T>(pi);
  }
  if (tab.wk[t]) nb_am_store_w<C>(tab.w[t], tab.wk[t], i, (C)nb_to_f(p[i]));
}

template <typename T>
__global__ void __launch_bounds__(NB_AM_THREADS)
nb_adamw_multi_kernel(const __grid_constant__ nb_am_table<T> tab,
                      nb_adamw_k<typename nb_acc<T>::type> k0, nb_am_dev d) {
  typedef typename nb_acc<T>::type C;
  __shared__ nb_adamw_k<C> ksh;
  __shared__ int skip_sh;
  __shared__ C gs_sh;
  const bool scaled = d.ctl != NULL;
  if (scaled) {
    if (threadIdx.x == 0) {
      skip_sh = d.ctl[NB_AMP_FOUND] != 0;
      gs_sh = (C)d.ctl[NB_AMP_GSCALE];
      ksh = nb_adamw_consts<C>(d.lr, d.beta1, d.beta2, d.eps, d.wd, d.ctl[NB_AMP_GOOD] - *d.base);
    }
    __syncthreads();
  }
  const nb_adamw_k<C> k = scaled ? ksh : k0;
  const bool skip = scaled && skip_sh;
  const C gs = scaled ? gs_sh : (C)1;
  const int b = (int)blockIdx.x, t = nb_mt_find(tab.blk, tab.n, b);
  const int64_t n = tab.numel[t], e0 = (int64_t)(b - tab.blk[t]) * NB_AM_CHUNK;
  T *p = tab.p[t];
  const T *g = tab.g[t];
  float *m = tab.m[t], *v = tab.v[t];
  const int wk = tab.wk[t];
  if (tab.vec[t]) {
    nb_am4<T> pp[NB_AM_UNROLL], gg[NB_AM_UNROLL];
    float4 mm[NB_AM_UNROLL], vv[NB_AM_UNROLL];
#pragma unroll
    for (int u = 0; u < NB_AM_UNROLL; u++) {
      int64_t e = e0 + 4 * ((int64_t)u * NB_AM_THREADS + threadIdx.x);
      if (e + 4 <= n) {
        pp[u] = *(const nb_am4<T> *)(p + e);
        if (!skip) {
          gg[u] = *(const nb_am4<T> *)(g + e);
          mm[u] = *(const float4 *)(m + e);
          vv[u] = *(const float4 *)(v + e);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < NB_AM_UNROLL; u++) {
      int64_t e = e0 + 4 * ((int64_t)u * NB_AM_THREADS + threadIdx.x);
      if (e + 4 <= n) {
        C out[4];
        if (!skip) {
          float *mf = &mm[u].x, *vf = &vv[u].x;
#pragma unroll
          for (int j = 0; j < 4; j++) {
            C pj = (C)nb_to_f(pp[u].x[j]), mj = (C)mf[j], vj = (C)vf[j];
            nb_adamw_elem<C>(k, nb_am_grad<T, C>(gg[u].x[j], scaled, gs), pj, mj, vj);
            mf[j] = (float)mj;
            vf[j] = (float)vj;
            pp[u].x[j] = nb_from_d<T>(pj);
          }
          *(nb_am4<T> *)(p + e) = pp[u];
          *(float4 *)(m + e) = mm[u];
          *(float4 *)(v + e) = vv[u];
        }
#pragma unroll
        for (int j = 0; j < 4; j++) out[j] = (C)nb_to_f(pp[u].x[j]);
        if (wk) nb_am_store_w4<C>(tab.w[t], wk, e, out);
      } else {
        for (int64_t i = e; i < n && i < e + 4; i++) /* the tensor's last partial group */
          nb_am_one<T, C>(tab, t, i, k, skip, scaled, gs);
      }
    }
  } else {
    int64_t end = e0 + NB_AM_CHUNK < n ? e0 + NB_AM_CHUNK : n;
    for (int64_t i = e0 + threadIdx.x; i < end; i += NB_AM_THREADS)
      nb_am_one<T, C>(tab, t, i, k, skip, scaled, gs);
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
      buf[i] = nb_from_d<M>(b);
      d = nesterov ? d + (C)mom * b : b;
    }
    p[i] = nb_from_d<T>(pi - (C)lr * d);
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
                           const nb_adamw_k<typename nb_acc<T>::type> &k) {
  unsigned gr = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  if (m->dtype == NB_F64)
    nb_adamw_kernel<T, double><<<gr, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (T *)p->data, (const T *)g->data, (double *)m->data, (double *)v->data, n, k);
  else
    nb_adamw_kernel<T, float><<<gr, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (T *)p->data, (const T *)g->data, (float *)m->data, (float *)v->data, n, k);
  return nb_cuda_launch_check("adamw_step");
}

static nb_status adamw_state_ok(const char *op, const nb_kview *m, const nb_kview *v) {
  nb_status st = state_dtype_ok(op, m);
  if (!st) st = state_dtype_ok(op, v);
  if (!st && m->dtype != v->dtype)
    st = nb_error_set(NB_ERR_DTYPE, "cuda %s: m is %s but v is %s", op, nb_dtype_name(m->dtype),
                      nb_dtype_name(v->dtype));
  return st;
}

extern "C" nb_status nb_cuda_adamw_step(const nb_kview *p, const nb_kview *g, const nb_kview *m,
                                        const nb_kview *v, double lr, double beta1,
                                        double beta2, double eps, double weight_decay,
                                        int64_t step) {
  int64_t n = nb_kview_numel(p);
  if (n == 0) return NB_OK;
  nb_status st = adamw_state_ok("adamw_step", m, v);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(p->data, "adamw_step", &ctx))) return st;
  NB_CUDA_FLOAT_SWITCH(p->dtype, T,
    return adamw_run<T>(&ctx, p, g, m, v, n,
                        nb_adamw_consts<typename nb_acc<T>::type>(lr, beta1, beta2, eps,
                                                                  weight_decay, (double)step)));
  return NB_OK;
}

static int am_aligned(const void *ptr, size_t a) { return ((uintptr_t)ptr & (a - 1)) == 0; }

/* A multi-tensor table's blk[]: the first block of each of its n tensors
 * (chunks of `chunk` elements), blk[n] the total, which it returns. */
static int64_t mt_block_starts(int *blk, const int64_t *numel, int n, int64_t chunk) {
  int64_t blocks = 0;
  for (int t = 0; t < n; t++) {
    blk[t] = (int)blocks;
    blocks += (numel[t] + chunk - 1) / chunk;
  }
  blk[n] = (int)blocks;
  return blocks;
}

/* Launches the table's kernel (blk[] filled here) and empties the table. */
template <typename T>
static nb_status adamw_multi_flush(const nb_cuda_ctx *ctx, nb_am_table<T> *tab,
                                   const nb_adamw_k<typename nb_acc<T>::type> &k,
                                   const nb_am_dev &d) {
  if (!tab->n) return NB_OK;
  int64_t blocks = mt_block_starts(tab->blk, tab->numel, tab->n, NB_AM_CHUNK);
  nb_adamw_multi_kernel<T><<<(unsigned)blocks, NB_AM_THREADS, 0, ctx->stream>>>(*tab, k, d);
  tab->n = 0;
  return nb_cuda_launch_check("adamw_multi");
}

/* Every tensor of parameter dtype T with f32 state, in launches of up to
 * NB_AM_MAX tensors (and fewer than 2^30 blocks); done[i] marks them. */
template <typename T>
static nb_status adamw_multi_dtype(const nb_cuda_ctx *ctx, nb_dtype dt, int n, const nb_kview *p,
                                   const nb_kview *g, const nb_kview *m, const nb_kview *v,
                                   const nb_kview *w, const nb_adamw_k<typename nb_acc<T>::type> &k,
                                   const nb_am_dev &d, char *done) {
  nb_am_table<T> tab;
  tab.n = 0;
  int64_t blocks = 0;
  nb_status st = NB_OK;
  for (int i = 0; i < n && !st; i++) {
    if (done[i] || p[i].dtype != dt || m[i].dtype != NB_F32 || v[i].dtype != NB_F32) continue;
    done[i] = 1;
    int64_t ne = nb_kview_numel(&p[i]), nb = (ne + NB_AM_CHUNK - 1) / NB_AM_CHUNK;
    if (ne == 0) continue;
    if (tab.n == NB_AM_MAX || blocks + nb >= ((int64_t)1 << 30)) {
      st = adamw_multi_flush<T>(ctx, &tab, k, d);
      blocks = 0;
    }
    int t = tab.n++;
    const void *wd = w && w[i].data ? w[i].data : NULL;
    tab.numel[t] = ne;
    tab.p[t] = (T *)p[i].data;
    tab.g[t] = (const T *)g[i].data;
    tab.m[t] = (float *)m[i].data;
    tab.v[t] = (float *)v[i].data;
    tab.w[t] = (void *)wd;
    tab.wk[t] = !wd ? 0 : w[i].dtype == NB_BF16 ? 1 : 2;
    tab.vec[t] = am_aligned(p[i].data, 4 * sizeof(T)) && am_aligned(g[i].data, 4 * sizeof(T)) &&
                 am_aligned(m[i].data, 16) && am_aligned(v[i].data, 16) && (!wd || am_aligned(wd, 8));
    blocks += nb;
  }
  if (!st) st = adamw_multi_flush<T>(ctx, &tab, k, d);
  return st;
}

/* The working copies: bf16 or f16, with their parameter's element count. */
static nb_status adamw_copies_ok(int n, const nb_kview *p, const nb_kview *w) {
  for (int i = 0; w && i < n; i++) {
    if (!w[i].data) continue;
    if ((w[i].dtype != NB_BF16 && w[i].dtype != NB_F16) || nb_kview_numel(&w[i]) != nb_kview_numel(&p[i]))
      return nb_error_set(NB_ERR_DTYPE, "cuda adamw_multi: working copy %d is %s of %lld elements "
                          "(expected bf16 or f16 of %lld)", i, nb_dtype_name(w[i].dtype),
                          (long long)nb_kview_numel(&w[i]), (long long)nb_kview_numel(&p[i]));
  }
  return NB_OK;
}

extern "C" nb_status nb_cuda_adamw_multi_ex(int n, const nb_kview *p, const nb_kview *g,
                                            const nb_kview *m, const nb_kview *v, const nb_kview *w,
                                            const nb_adamw_args *a) {
  if (n <= 0) return NB_OK;
  nb_status st = adamw_copies_ok(n, p, w);
  for (int i = 0; i < n && !st; i++) st = adamw_state_ok("adamw_multi", &m[i], &v[i]);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(p[0].data, "adamw_multi", &ctx))) return st;
  char *done = (char *)calloc((size_t)n, 1);
  if (!done) return nb_error_set(NB_ERR_OOM, "cuda adamw_multi: out of host memory");
  double t = (double)a->step;
  nb_adamw_k<float> kf = nb_adamw_consts<float>(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, t);
  nb_adamw_k<double> kd = nb_adamw_consts<double>(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, t);
  nb_am_dev d = {a->ctl, a->step_base, a->lr, a->beta1, a->beta2, a->eps, a->weight_decay};
  st = adamw_multi_dtype<float>(&ctx, NB_F32, n, p, g, m, v, w, kf, d, done);
  if (!st) st = adamw_multi_dtype<__nv_bfloat16>(&ctx, NB_BF16, n, p, g, m, v, w, kf, d, done);
  if (!st) st = adamw_multi_dtype<__half>(&ctx, NB_F16, n, p, g, m, v, w, kf, d, done);
  if (!st) st = adamw_multi_dtype<double>(&ctx, NB_F64, n, p, g, m, v, w, kd, d, done);
  /* f64 state (not what the optimizer allocates): one kernel per tensor,
   * without device control or copies */
  for (int i = 0; i < n && !st; i++) {
    if (done[i]) continue;
    if (a->ctl || (w && w[i].data))
      st = nb_error_set(NB_ERR_UNSUPPORTED, "cuda adamw_multi: f64 optimizer state with device "
                        "control or a working copy (expected f32 state)");
    else
      st = nb_cuda_adamw_step(&p[i], &g[i], &m[i], &v[i], a->lr, a->beta1, a->beta2, a->eps,
                              a->weight_decay, a->step);
  }
  free(done);
  return st;
}

extern "C" nb_status nb_cuda_adamw_multi(int n, const nb_kview *p, const nb_kview *g,
                                         const nb_kview *m, const nb_kview *v, double lr,
                                         double beta1, double beta2, double eps,
                                         double weight_decay, int64_t step) {
  nb_adamw_args a = {lr, beta1, beta2, eps, weight_decay, step, NULL, NULL};
  return nb_cuda_adamw_multi_ex(n, p, g, m, v, NULL, &a);
}

/* ---- the loss scaler's decision (amp_update), one thread ------------------ */
__global__ void nb_amp_update_kernel(double *c, float *scale32, nb_amp_args a) {
  double s = nb_amp_rule(c, &a);
  *scale32 = (float)s;
}

extern "C" nb_status nb_cuda_amp_update(const nb_kview *ctl, const nb_kview *scale32,
                                        const nb_amp_args *a) {
  NB_CUDA_ENTER(ctx, st, ctl->data, "amp_update");
  nb_amp_update_kernel<<<1, 1, 0, ctx.stream>>>((double *)ctl->data, (float *)scale32->data, *a);
  return nb_cuda_launch_check("amp_update");
}

/* ---- gradient clipping: multi-tensor sum of squares and scale --------------
 * Tables like multi-tensor AdamW's: up to NB_AM_MAX tensors of one dtype per
 * launch, a block per NB_MT_CHUNK consecutive elements of one tensor. The
 * sum of squares writes one f64 partial per block (each launch's at a
 * running offset) and one finishing block adds them all in order: a fixed
 * order, so the same gradients give the same bits every run. One launch per
 * dtype present replaces clipping's 4 to 6 launches per tensor. */
#define NB_MT_THREADS 256
#define NB_MT_CHUNK (NB_MT_THREADS * 8)

template <typename T> struct nb_mt_table {
  int n;
  int blk[NB_AM_MAX + 1];
  int64_t numel[NB_AM_MAX];
  T *x[NB_AM_MAX];
};

/* Block-wide sum in a fixed order; the result is valid in thread 0. */
__device__ __forceinline__ double nb_mt_block_sum(double v, double *sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < NB_MT_THREADS / 32; w++) s += sh[w];
  return s;
}

template <typename T>
__global__ void __launch_bounds__(NB_MT_THREADS)
nb_sumsq_multi_kernel(const __grid_constant__ nb_mt_table<T> tab, double *part) {
  __shared__ double sh[NB_MT_THREADS / 32];
  const int b = (int)blockIdx.x, t = nb_mt_find(tab.blk, tab.n, b);
  const int64_t e0 = (int64_t)(b - tab.blk[t]) * NB_MT_CHUNK;
  const int64_t end = e0 + NB_MT_CHUNK < tab.numel[t] ? e0 + NB_MT_CHUNK : tab.numel[t];
  const T *x = tab.x[t];
  double acc = 0;
  for (int64_t i = e0 + threadIdx.x; i < end; i += NB_MT_THREADS) {
    double v = (double)nb_to_f(x[i]);
    acc = fma(v, v, acc);
  }
  acc = nb_mt_block_sum(acc, sh);
  if (threadIdx.x == 0) part[b] = acc;
}

__global__ void __launch_bounds__(NB_MT_THREADS)
nb_sumsq_finish_kernel(const double *part, int64_t n, double *out) {
  __shared__ double sh[NB_MT_THREADS / 32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += NB_MT_THREADS) acc += part[i];
  acc = nb_mt_block_sum(acc, sh);
  if (threadIdx.x == 0) *out = acc;
}

template <typename T>
__global__ void __launch_bounds__(NB_MT_THREADS)
nb_scale_multi_kernel(const __grid_constant__ nb_mt_table<T> tab, typename nb_acc<T>::type s) {
  typedef typename nb_acc<T>::type C;
  const int b = (int)blockIdx.x, t = nb_mt_find(tab.blk, tab.n, b);
  const int64_t e0 = (int64_t)(b - tab.blk[t]) * NB_MT_CHUNK;
  const int64_t end = e0 + NB_MT_CHUNK < tab.numel[t] ? e0 + NB_MT_CHUNK : tab.numel[t];
  T *x = tab.x[t];
  for (int64_t i = e0 + threadIdx.x; i < end; i += NB_MT_THREADS) x[i] = nb_from_d<T>((C)nb_to_f(x[i]) * s);
}

/* What a multi-tensor launch does: the sum of squares (partials from
 * part + off on) or the scale by s. */
struct nb_mt_job {
  double *part;
  int64_t off;
  double s;
};

static int64_t mt_tensor_blocks(const nb_kview *v) {
  return (nb_kview_numel(v) + NB_MT_CHUNK - 1) / NB_MT_CHUNK;
}

/* Launches the table's kernel (blk[] filled here) and empties the table. */
template <typename T>
static nb_status mt_flush(const nb_cuda_ctx *ctx, nb_mt_table<T> *tab, nb_mt_job *job) {
  if (!tab->n) return NB_OK;
  int64_t blocks = mt_block_starts(tab->blk, tab->numel, tab->n, NB_MT_CHUNK);
  if (job->part) {
    nb_sumsq_multi_kernel<T><<<(unsigned)blocks, NB_MT_THREADS, 0, ctx->stream>>>(*tab, job->part + job->off);
    job->off += blocks;
  } else {
    nb_scale_multi_kernel<T><<<(unsigned)blocks, NB_MT_THREADS, 0, ctx->stream>>>(
        *tab, (typename nb_acc<T>::type)job->s);
  }
  tab->n = 0; /* after the launch: the kernel got the filled table */
  return nb_cuda_launch_check(job->part ? "sumsq_multi" : "scale_multi");
}

/* Every tensor of dtype dt, in launches of up to NB_AM_MAX tensors (and
 * fewer than 2^30 blocks). */
template <typename T>
static nb_status mt_dtype(const nb_cuda_ctx *ctx, nb_dtype dt, int n, const nb_kview *x, nb_mt_job *job) {
  nb_mt_table<T> tab;
  tab.n = 0;
  int64_t blocks = 0;
  nb_status st = NB_OK;
  for (int i = 0; i < n && !st; i++) {
    int64_t ne = nb_kview_numel(&x[i]), nb = mt_tensor_blocks(&x[i]);
    if (x[i].dtype != dt || ne == 0) continue;
    if (tab.n == NB_AM_MAX || blocks + nb >= ((int64_t)1 << 30)) {
      st = mt_flush<T>(ctx, &tab, job);
      blocks = 0;
    }
    tab.numel[tab.n] = ne;
    tab.x[tab.n++] = (T *)x[i].data;
    blocks += nb;
  }
  if (!st) st = mt_flush<T>(ctx, &tab, job);
  return st;
}

/* Checks the views' dtypes and runs job over every dtype present. */
static nb_status mt_run(const char *op, int n, const nb_kview *x, nb_mt_job *job) {
  for (int i = 0; i < n; i++)
    if (!nb_dtype_is_float(x[i].dtype))
      return nb_error_set(NB_ERR_DTYPE, "cuda %s: tensor %d is %s (expected a float dtype)", op, i,
                          nb_dtype_name(x[i].dtype));
  nb_cuda_ctx ctx;
  nb_status st = nb_cuda_enter(x[0].data, op, &ctx);
  if (!st) st = mt_dtype<float>(&ctx, NB_F32, n, x, job);
  if (!st) st = mt_dtype<__nv_bfloat16>(&ctx, NB_BF16, n, x, job);
  if (!st) st = mt_dtype<__half>(&ctx, NB_F16, n, x, job);
  if (!st) st = mt_dtype<double>(&ctx, NB_F64, n, x, job);
  return st;
}

extern "C" nb_status nb_cuda_sumsq_multi(int n, const nb_kview *x, const nb_kview *out) {
  if (out->dtype != NB_F64 || nb_kview_numel(out) != 1)
    return nb_error_set(NB_ERR_DTYPE, "cuda sumsq_multi: out is %s with %lld elements (expected one f64)",
                        nb_dtype_name(out->dtype), (long long)nb_kview_numel(out));
  NB_CUDA_ENTER(ctx, st, out->data, "sumsq_multi");
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += mt_tensor_blocks(&x[i]);
  if (total == 0) return nb_cuda_fill(out, 0.0);
  size_t bytes = (size_t)total * sizeof(double);
  nb_mt_job job = {(double *)nb_cuda_scratch(&ctx, bytes), 0, 0.0};
  if (!job.part) return nb_last_status();
  st = mt_run("sumsq_multi", n, x, &job);
  if (!st) {
    nb_sumsq_finish_kernel<<<1, NB_MT_THREADS, 0, ctx.stream>>>(job.part, job.off, (double *)out->data);
    st = nb_cuda_launch_check("sumsq_multi (finish)");
  }
  nb_cuda_scratch_free(&ctx, job.part, bytes);
  return st;
}

extern "C" nb_status nb_cuda_scale_multi(int n, const nb_kview *x, double s) {
  if (n <= 0) return NB_OK;
  nb_mt_job job = {NULL, 0, s};
  return mt_run("scale_multi", n, x, &job);
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
