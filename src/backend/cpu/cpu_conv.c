/* CPU convolution helpers and pooling on NCHW contiguous tensors.
 *
 * im2col copies bytes (dtype-agnostic; padding is all-zero bits, which is
 * +0 in every float dtype). The kernels that sum (col2im and the pooling
 * backwards) work one (n, c) plane at a time in a per-thread double buffer:
 * planes are disjoint, so threads never share a destination, each plane's
 * sums run in a fixed order (deterministic), and f16/bf16 are rounded once
 * per element instead of once per addition. They add into their output,
 * which the caller has zeroed. The forward pools also stage a plane in
 * double, so one code path serves every float dtype. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

/* The output columns ox in [*lo, *hi) whose input column
 * ox*s - pad + off lies inside [0, size). */
static void cv_range(int64_t size, int64_t s, int64_t pad, int64_t off, int64_t nout,
                     int64_t *lo, int64_t *hi) {
  int64_t a = pad - off;                        /* need ox*s >= a */
  int64_t b = size - 1 + pad - off;             /* need ox*s <= b */
  int64_t l = a <= 0 ? 0 : (a + s - 1) / s;
  int64_t h = b < 0 ? 0 : b / s + 1;
  *lo = l < nout ? l : nout;
  *hi = h < nout ? h : nout;
  if (*hi < *lo) *hi = *lo;
}

static nb_status cv_oom(const char *op) {
  return nb_error_set(NB_ERR_OOM, "%s: out of memory for a plane buffer", op);
}

/* ---- im2col / col2im ----------------------------------------------------- */

/* One row of cols: channel c, kernel tap (i, j), all output positions. */
static void cv_im2col_row(char *dst, const char *plane, const nb_im2col_params *p, int i, int j,
                          size_t esz) {
  int64_t lo, hi;
  cv_range(p->w, p->sw, p->pw, (int64_t)j * p->dw, p->ow, &lo, &hi);
  for (int64_t oy = 0; oy < p->oh; oy++, dst += (size_t)p->ow * esz) {
    int64_t iy = oy * p->sh - p->ph + (int64_t)i * p->dh;
    if (iy < 0 || iy >= p->h || lo == hi) {
      memset(dst, 0, (size_t)p->ow * esz);
      continue;
    }
    const char *src = plane + ((size_t)iy * p->w + lo * p->sw - p->pw + (int64_t)j * p->dw) * esz;
    memset(dst, 0, (size_t)lo * esz);
    if (p->sw == 1)
      memcpy(dst + lo * esz, src, (size_t)(hi - lo) * esz);
    else
      for (int64_t k = 0; k < hi - lo; k++)
        memcpy(dst + (lo + k) * esz, src + (size_t)k * p->sw * esz, esz);
    memset(dst + hi * esz, 0, (size_t)(p->ow - hi) * esz);
  }
}

nb_status nb_cpu_im2col(const nb_kview *cols, const nb_kview *x, const nb_im2col_params *p) {
  const size_t esz = nb_dtype_size(x->dtype);
  const int64_t K = (int64_t)p->kh * p->kw, rows = (int64_t)p->n * p->c * K;
  const int64_t plane = (int64_t)p->h * p->w, ncol = (int64_t)p->oh * p->ow;
#pragma omp parallel for schedule(static) if (rows * ncol >= NB_CPU_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t q = r / K, t = r % K; /* q = n*C + c: the input plane */
    cv_im2col_row((char *)cols->data + (size_t)(r * ncol) * esz,
                  (const char *)x->data + (size_t)(q * plane) * esz, p, (int)(t / p->kw),
                  (int)(t % p->kw), esz);
  }
  return NB_OK;
}

/* Adds the cols rows of one plane (K rows of oh*ow) into acc (h*w). */
static void cv_col2im_plane(double *acc, double *tmp, const char *crow, nb_dtype dt,
                            const nb_im2col_params *p) {
  const size_t esz = nb_dtype_size(dt);
  for (int i = 0; i < p->kh; i++)
    for (int j = 0; j < p->kw; j++, crow += (size_t)p->oh * p->ow * esz) {
      int64_t lo, hi;
      cv_range(p->w, p->sw, p->pw, (int64_t)j * p->dw, p->ow, &lo, &hi);
      for (int64_t oy = 0; oy < p->oh && lo < hi; oy++) {
        int64_t iy = oy * p->sh - p->ph + (int64_t)i * p->dh;
        if (iy < 0 || iy >= p->h) continue;
        nb_cpu_load_f64(dt, hi - lo, crow + (size_t)(oy * p->ow + lo) * esz, (int64_t)esz, tmp);
        double *a = acc + iy * p->w + lo * p->sw - p->pw + (int64_t)j * p->dw;
        for (int64_t k = 0; k < hi - lo; k++) a[k * p->sw] += tmp[k];
      }
    }
}

nb_status nb_cpu_col2im(const nb_kview *x, const nb_kview *cols, const nb_im2col_params *p) {
  const size_t esz = nb_dtype_size(x->dtype), csz = nb_dtype_size(cols->dtype);
  const int64_t planes = (int64_t)p->n * p->c, hw = (int64_t)p->h * p->w;
  const int64_t crows = (int64_t)p->kh * p->kw * p->oh * p->ow;
  int oom = 0;
#pragma omp parallel if (planes * crows >= NB_CPU_PAR_MIN)
  {
    double *acc = nb_cpu_scratch((size_t)(hw + p->ow + 1), &oom);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < planes; q++) {
      if (!acc) continue;
      char *xp = (char *)x->data + (size_t)(q * hw) * esz;
      nb_cpu_load_f64(x->dtype, hw, xp, (int64_t)esz, acc);
      cv_col2im_plane(acc, acc + hw, (const char *)cols->data + (size_t)(q * crows) * csz,
                      cols->dtype, p);
      nb_cpu_store_f64(x->dtype, hw, acc, xp, (int64_t)esz);
    }
    free(acc);
  }
  return oom ? cv_oom("col2im") : NB_OK;
}

/* ---- pooling ------------------------------------------------------------- */

/* Runs fn on every (n, c) plane with a per-thread buffer of nbuf doubles. */
typedef void (*cv_plane_fn)(int64_t q, double *buf, const void *ctx);

static nb_status cv_planes(const char *op, const nb_im2col_params *p, int64_t nbuf,
                           cv_plane_fn fn, const void *ctx) {
  const int64_t planes = (int64_t)p->n * p->c;
  const int64_t work = planes * p->oh * p->ow * p->kh * p->kw;
  int oom = 0;
#pragma omp parallel if (work >= NB_CPU_PAR_MIN)
  {
    double *buf = nb_cpu_scratch((size_t)(nbuf ? nbuf : 1), &oom);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < planes; q++)
      if (buf) fn(q, buf, ctx);
    free(buf);
  }
  return oom ? cv_oom(op) : NB_OK;
}

typedef struct {
  const nb_kview *out, *in, *arg; /* fwd: out=y in=x; bwd: out=dx in=dy */
  const nb_im2col_params *p;
} cv_pool_ctx;

static char *cv_plane_ptr(const nb_kview *v, int64_t q, int64_t plane) {
  return (char *)v->data + (size_t)(q * plane) * nb_dtype_size(v->dtype);
}

/* Max over the window of output (oy, ox); padding cells never win, NaN does.
 * A window entirely in padding gives -inf and argmax -1. */
static double cv_max_window(const double *a, const nb_im2col_params *p, int64_t oy, int64_t ox,
                            int64_t *arg) {
  double best = -INFINITY;
  *arg = -1;
  for (int i = 0; i < p->kh; i++) {
    int64_t iy = oy * p->sh - p->ph + (int64_t)i * p->dh;
    if (iy < 0 || iy >= p->h) continue;
    for (int j = 0; j < p->kw; j++) {
      int64_t ix = ox * p->sw - p->pw + (int64_t)j * p->dw;
      if (ix < 0 || ix >= p->w) continue;
      double v = a[iy * p->w + ix];
      if (*arg < 0 || v > best || (v != v && best == best)) {
        best = v;
        *arg = iy * p->w + ix;
      }
    }
  }
  return best;
}

static void cv_maxpool_fwd_plane(int64_t q, double *buf, const void *vc) {
  const cv_pool_ctx *c = vc;
  const nb_im2col_params *p = c->p;
  const int64_t hw = (int64_t)p->h * p->w, ohw = (int64_t)p->oh * p->ow;
  double *y = buf + hw;
  int64_t *arg = (int64_t *)c->arg->data + q * ohw;
  nb_cpu_load_f64(c->in->dtype, hw, cv_plane_ptr(c->in, q, hw),
                  (int64_t)nb_dtype_size(c->in->dtype), buf);
  for (int64_t oy = 0; oy < p->oh; oy++)
    for (int64_t ox = 0; ox < p->ow; ox++)
      y[oy * p->ow + ox] = cv_max_window(buf, p, oy, ox, &arg[oy * p->ow + ox]);
  nb_cpu_store_f64(c->out->dtype, ohw, y, cv_plane_ptr(c->out, q, ohw),
                   (int64_t)nb_dtype_size(c->out->dtype));
}

nb_status nb_cpu_maxpool2d_fwd(const nb_kview *y, const nb_kview *argmax, const nb_kview *x,
                               const nb_im2col_params *p) {
  cv_pool_ctx c = {y, x, argmax, p};
  return cv_planes("maxpool2d", p, (int64_t)p->h * p->w + (int64_t)p->oh * p->ow,
                   cv_maxpool_fwd_plane, &c);
}

/* dx plane += dy at each output's argmax (skipping -1: all-padding windows). */
static void cv_maxpool_bwd_plane(int64_t q, double *buf, const void *vc) {
  const cv_pool_ctx *c = vc;
  const nb_im2col_params *p = c->p;
  const int64_t hw = (int64_t)p->h * p->w, ohw = (int64_t)p->oh * p->ow;
  const size_t osz = nb_dtype_size(c->out->dtype), isz = nb_dtype_size(c->in->dtype);
  const int64_t *arg = (const int64_t *)c->arg->data + q * ohw;
  double *g = buf + hw;
  nb_cpu_load_f64(c->out->dtype, hw, cv_plane_ptr(c->out, q, hw), (int64_t)osz, buf);
  nb_cpu_load_f64(c->in->dtype, ohw, cv_plane_ptr(c->in, q, ohw), (int64_t)isz, g);
  for (int64_t o = 0; o < ohw; o++)
    if (arg[o] >= 0 && arg[o] < hw) buf[arg[o]] += g[o];
  nb_cpu_store_f64(c->out->dtype, hw, buf, cv_plane_ptr(c->out, q, hw), (int64_t)osz);
}

nb_status nb_cpu_maxpool2d_bwd(const nb_kview *dx, const nb_kview *dy, const nb_kview *argmax,
                               const nb_im2col_params *p) {
  cv_pool_ctx c = {dx, dy, argmax, p};
  return cv_planes("maxpool2d backward", p, (int64_t)p->h * p->w + (int64_t)p->oh * p->ow,
                   cv_maxpool_bwd_plane, &c);
}

/* Average pooling, count_include_pad: every window divides by kh*kw.
 * bwd=0: buf[out] = sum of the window / K. bwd=1: each window cell += g/K. */
static void cv_avg_plane(double *a, double *o, const nb_im2col_params *p, int bwd) {
  const double inv = 1.0 / ((double)p->kh * p->kw);
  for (int64_t oy = 0; oy < p->oh; oy++)
    for (int64_t ox = 0; ox < p->ow; ox++) {
      double s = 0.0, g = bwd ? o[oy * p->ow + ox] * inv : 0.0;
      for (int i = 0; i < p->kh; i++) {
        int64_t iy = oy * p->sh - p->ph + (int64_t)i * p->dh;
        if (iy < 0 || iy >= p->h) continue;
        for (int j = 0; j < p->kw; j++) {
          int64_t ix = ox * p->sw - p->pw + (int64_t)j * p->dw;
          if (ix < 0 || ix >= p->w) continue;
          if (bwd) a[iy * p->w + ix] += g;
          else s += a[iy * p->w + ix];
        }
      }
      if (!bwd) o[oy * p->ow + ox] = s * inv;
    }
}

/* fwd: in = x (h*w planes), out = y; bwd: in = dy (oh*ow), out = dx. */
static void cv_avgpool_plane(int64_t q, double *buf, const void *vc, int bwd) {
  const cv_pool_ctx *c = vc;
  const nb_im2col_params *p = c->p;
  const int64_t hw = (int64_t)p->h * p->w, ohw = (int64_t)p->oh * p->ow;
  const nb_kview *big = bwd ? c->out : c->in, *small = bwd ? c->in : c->out;
  const int64_t bsz = (int64_t)nb_dtype_size(big->dtype), ssz = (int64_t)nb_dtype_size(small->dtype);
  nb_cpu_load_f64(big->dtype, hw, cv_plane_ptr(big, q, hw), bsz, buf);
  if (bwd) nb_cpu_load_f64(small->dtype, ohw, cv_plane_ptr(small, q, ohw), ssz, buf + hw);
  cv_avg_plane(buf, buf + hw, p, bwd);
  if (bwd) nb_cpu_store_f64(big->dtype, hw, buf, cv_plane_ptr(big, q, hw), bsz);
  else nb_cpu_store_f64(small->dtype, ohw, buf + hw, cv_plane_ptr(small, q, ohw), ssz);
}

static void cv_avgpool_fwd_plane(int64_t q, double *buf, const void *c) {
  cv_avgpool_plane(q, buf, c, 0);
}
static void cv_avgpool_bwd_plane(int64_t q, double *buf, const void *c) {
  cv_avgpool_plane(q, buf, c, 1);
}

nb_status nb_cpu_avgpool2d_fwd(const nb_kview *y, const nb_kview *x, const nb_im2col_params *p) {
  cv_pool_ctx c = {y, x, NULL, p};
  return cv_planes("avgpool2d", p, (int64_t)p->h * p->w + (int64_t)p->oh * p->ow,
                   cv_avgpool_fwd_plane, &c);
}

nb_status nb_cpu_avgpool2d_bwd(const nb_kview *dx, const nb_kview *dy,
                               const nb_im2col_params *p) {
  cv_pool_ctx c = {dx, dy, NULL, p};
  return cv_planes("avgpool2d backward", p, (int64_t)p->h * p->w + (int64_t)p->oh * p->ow,
                   cv_avgpool_bwd_plane, &c);
}
