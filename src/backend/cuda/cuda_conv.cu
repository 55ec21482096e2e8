/* im2col / col2im and 2-D pooling on NCHW contiguous tensors.
 *
 * One thread per destination element. The summing kernels (col2im and the
 * pooling backwards) gather: a thread owns one input cell and visits the
 * kernel taps whose window covers it, so no atomics are needed, the order
 * is fixed (deterministic) and the sum is added once into the destination
 * (the caller has zeroed it, as for the CPU kernels). Max pooling: padding
 * never wins, NaN does, ties keep the first tap; an all-padding window gives
 * -inf with argmax -1 (skipped by the backward). Average pooling divides by
 * kh*kw (count_include_pad). */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

#define NB_GRID_LOOP(i, n)                                                          \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
       i += (int64_t)gridDim.x * blockDim.x)

/* The output coordinate of input coordinate in for tap i, or -1. */
__device__ __forceinline__ int64_t nb_conv_out(int64_t in, int tap, int s, int pad, int dil,
                                               int n_out) {
  int64_t t = in + pad - (int64_t)tap * dil;
  if (t < 0 || t % s) return -1;
  t /= s;
  return t < n_out ? t : -1;
}

/* cols (N, C*kh*kw, oh*ow): element (n, (c, i, j), (oy, ox)). */
template <typename E>
__global__ void nb_im2col_kernel(E *cols, const E *x, nb_im2col_params p, int64_t total) {
  const int64_t L = (int64_t)p.oh * p.ow, K = (int64_t)p.kh * p.kw;
  NB_GRID_LOOP(e, total) {
    int64_t l = e % L, row = e / L; /* row = (n*C + c)*K + tap */
    int64_t tap = row % K, q = row / K;
    int i = (int)(tap / p.kw), j = (int)(tap % p.kw);
    int64_t oy = l / p.ow, ox = l % p.ow;
    int64_t iy = oy * p.sh - p.ph + (int64_t)i * p.dh, ix = ox * p.sw - p.pw + (int64_t)j * p.dw;
    E v = (E)0;
    if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w) v = x[(q * p.h + iy) * p.w + ix];
    cols[e] = v;
  }
}

template <typename T>
__global__ void nb_col2im_kernel(T *x, const T *cols, nb_im2col_params p, int64_t total) {
  typedef typename nb_acc<T>::type A;
  const int64_t L = (int64_t)p.oh * p.ow, K = (int64_t)p.kh * p.kw;
  NB_GRID_LOOP(e, total) {
    int64_t ix = e % p.w, iy = (e / p.w) % p.h, q = e / ((int64_t)p.h * p.w);
    A s = 0;
    for (int i = 0; i < p.kh; i++) {
      int64_t oy = nb_conv_out(iy, i, p.sh, p.ph, p.dh, p.oh);
      if (oy < 0) continue;
      for (int j = 0; j < p.kw; j++) {
        int64_t ox = nb_conv_out(ix, j, p.sw, p.pw, p.dw, p.ow);
        if (ox < 0) continue;
        s += (A)nb_to_f(cols[(q * K + (int64_t)i * p.kw + j) * L + oy * p.ow + ox]);
      }
    }
    x[e] = nb_from_d<T>((A)nb_to_f(x[e]) + s);
  }
}

template <typename T>
__global__ void nb_maxpool_fwd_kernel(T *y, int64_t *arg, const T *x, nb_im2col_params p,
                                      int64_t total) {
  typedef typename nb_acc<T>::type A;
  NB_GRID_LOOP(e, total) {
    int64_t ox = e % p.ow, oy = (e / p.ow) % p.oh, q = e / ((int64_t)p.oh * p.ow);
    const T *plane = x + q * p.h * p.w;
    A best = -INFINITY;
    int64_t bi = -1;
    for (int i = 0; i < p.kh; i++) {
      int64_t iy = oy * p.sh - p.ph + (int64_t)i * p.dh;
      if (iy < 0 || iy >= p.h) continue;
      for (int j = 0; j < p.kw; j++) {
        int64_t ix = ox * p.sw - p.pw + (int64_t)j * p.dw;
        if (ix < 0 || ix >= p.w) continue;
        A v = (A)nb_to_f(plane[iy * p.w + ix]);
        if (bi < 0 || v > best || (v != v && best == best)) {
          best = v;
          bi = iy * p.w + ix;
        }
      }
    }
    y[e] = nb_from_d<T>(best);
    arg[e] = bi;
  }
}

template <typename T>
__global__ void nb_maxpool_bwd_kernel(T *dx, const T *dy, const int64_t *arg, nb_im2col_params p,
                                      int64_t total) {
  typedef typename nb_acc<T>::type A;
  const int64_t L = (int64_t)p.oh * p.ow;
  NB_GRID_LOOP(e, total) {
    int64_t ix = e % p.w, iy = (e / p.w) % p.h, q = e / ((int64_t)p.h * p.w);
    int64_t me = iy * p.w + ix;
    A s = 0;
    for (int i = 0; i < p.kh; i++) {
      int64_t oy = nb_conv_out(iy, i, p.sh, p.ph, p.dh, p.oh);
      if (oy < 0) continue;
      for (int j = 0; j < p.kw; j++) {
        int64_t ox = nb_conv_out(ix, j, p.sw, p.pw, p.dw, p.ow);
        if (ox < 0) continue;
        int64_t o = q * L + oy * p.ow + ox;
        if (arg[o] == me) s += (A)nb_to_f(dy[o]);
      }
    }
    if (s != (A)0) dx[e] = nb_from_d<T>((A)nb_to_f(dx[e]) + s);
  }
}

template <typename T>
__global__ void nb_avgpool_fwd_kernel(T *y, const T *x, nb_im2col_params p, int64_t total) {
  typedef typename nb_acc<T>::type A;
  const A inv = (A)1 / ((A)p.kh * (A)p.kw);
  NB_GRID_LOOP(e, total) {
    int64_t ox = e % p.ow, oy = (e / p.ow) % p.oh, q = e / ((int64_t)p.oh * p.ow);
    const T *plane = x + q * p.h * p.w;
    A s = 0;
    for (int i = 0; i < p.kh; i++) {
      int64_t iy = oy * p.sh - p.ph + (int64_t)i * p.dh;
      if (iy < 0 || iy >= p.h) continue;
      for (int j = 0; j < p.kw; j++) {
        int64_t ix = ox * p.sw - p.pw + (int64_t)j * p.dw;
        if (ix >= 0 && ix < p.w) s += (A)nb_to_f(plane[iy * p.w + ix]);
      }
    }
    y[e] = nb_from_d<T>(s * inv);
  }
}

template <typename T>
__global__ void nb_avgpool_bwd_kernel(T *dx, const T *dy, nb_im2col_params p, int64_t total) {
  typedef typename nb_acc<T>::type A;
  const A inv = (A)1 / ((A)p.kh * (A)p.kw);
  const int64_t L = (int64_t)p.oh * p.ow;
  NB_GRID_LOOP(e, total) {
    int64_t ix = e % p.w, iy = (e / p.w) % p.h, q = e / ((int64_t)p.h * p.w);
    A s = 0;
    for (int i = 0; i < p.kh; i++) {
      int64_t oy = nb_conv_out(iy, i, p.sh, p.ph, p.dh, p.oh);
      if (oy < 0) continue;
      for (int j = 0; j < p.kw; j++) {
        int64_t ox = nb_conv_out(ix, j, p.sw, p.pw, p.dw, p.ow);
        if (ox >= 0) s += (A)nb_to_f(dy[q * L + oy * p.ow + ox]) * inv;
      }
    }
    dx[e] = nb_from_d<T>((A)nb_to_f(dx[e]) + s);
  }
}

static nb_status conv_params_ok(const char *op, const nb_im2col_params *p) {
  if (p->sh > 0 && p->sw > 0 && p->dh > 0 && p->dw > 0 && p->kh > 0 && p->kw > 0) return NB_OK;
  return nb_error_set(NB_ERR_VALUE, "cuda %s: strides, dilations and kernel sizes must be "
                      "positive", op);
}

/* Enters the device of ptr and sizes the launch for total elements. */
#define NB_CONV_PROLOGUE(name, ptr, total)                              \
  if ((total) <= 0) return NB_OK;                                      \
  nb_status st = conv_params_ok(name, p);                              \
  if (st) return st;                                                   \
  nb_cuda_ctx ctx;                                                     \
  if ((st = nb_cuda_enter((ptr), name, &ctx))) return st;              \
  unsigned g = nb_cuda_blocks(&ctx, (total), NB_CUDA_THREADS)

extern "C" nb_status nb_cuda_im2col(const nb_kview *cols, const nb_kview *x,
                                    const nb_im2col_params *p) {
  int64_t total = (int64_t)p->n * p->c * p->kh * p->kw * p->oh * p->ow;
  NB_CONV_PROLOGUE("im2col", cols->data, total);
  switch (nb_dtype_size(x->dtype)) {
  case 2: nb_im2col_kernel<uint16_t><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((uint16_t *)cols->data, (const uint16_t *)x->data, *p, total); break;
  case 4: nb_im2col_kernel<uint32_t><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((uint32_t *)cols->data, (const uint32_t *)x->data, *p, total); break;
  case 8: nb_im2col_kernel<uint64_t><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((uint64_t *)cols->data, (const uint64_t *)x->data, *p, total); break;
  default: nb_im2col_kernel<uint8_t><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((uint8_t *)cols->data, (const uint8_t *)x->data, *p, total); break;
  }
  return nb_cuda_launch_check("im2col");
}

extern "C" nb_status nb_cuda_col2im(const nb_kview *x, const nb_kview *cols,
                                    const nb_im2col_params *p) {
  int64_t total = (int64_t)p->n * p->c * p->h * p->w;
  NB_CONV_PROLOGUE("col2im", x->data, total);
  NB_CUDA_FLOAT_SWITCH(x->dtype, T,
    nb_col2im_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((T *)x->data, (const T *)cols->data, *p, total));
  return nb_cuda_launch_check("col2im");
}

extern "C" nb_status nb_cuda_maxpool2d_fwd(const nb_kview *y, const nb_kview *argmax,
                                           const nb_kview *x, const nb_im2col_params *p) {
  int64_t total = (int64_t)p->n * p->c * p->oh * p->ow;
  NB_CONV_PROLOGUE("maxpool2d", y->data, total);
  NB_CUDA_FLOAT_SWITCH(x->dtype, T,
    nb_maxpool_fwd_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>(
        (T *)y->data, (int64_t *)argmax->data, (const T *)x->data, *p, total));
  return nb_cuda_launch_check("maxpool2d");
}

extern "C" nb_status nb_cuda_maxpool2d_bwd(const nb_kview *dx, const nb_kview *dy,
                                           const nb_kview *argmax, const nb_im2col_params *p) {
  int64_t total = (int64_t)p->n * p->c * p->h * p->w;
  NB_CONV_PROLOGUE("maxpool2d backward", dx->data, total);
  NB_CUDA_FLOAT_SWITCH(dx->dtype, T,
    nb_maxpool_bwd_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>(
        (T *)dx->data, (const T *)dy->data, (const int64_t *)argmax->data, *p, total));
  return nb_cuda_launch_check("maxpool2d backward");
}

extern "C" nb_status nb_cuda_avgpool2d_fwd(const nb_kview *y, const nb_kview *x,
                                           const nb_im2col_params *p) {
  int64_t total = (int64_t)p->n * p->c * p->oh * p->ow;
  NB_CONV_PROLOGUE("avgpool2d", y->data, total);
  NB_CUDA_FLOAT_SWITCH(x->dtype, T,
    nb_avgpool_fwd_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((T *)y->data, (const T *)x->data, *p, total));
  return nb_cuda_launch_check("avgpool2d");
}

extern "C" nb_status nb_cuda_avgpool2d_bwd(const nb_kview *dx, const nb_kview *dy,
                                           const nb_im2col_params *p) {
  int64_t total = (int64_t)p->n * p->c * p->h * p->w;
  NB_CONV_PROLOGUE("avgpool2d backward", dx->data, total);
  NB_CUDA_FLOAT_SWITCH(dx->dtype, T,
    nb_avgpool_bwd_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((T *)dx->data, (const T *)dy->data, *p, total));
  return nb_cuda_launch_check("avgpool2d backward");
}
