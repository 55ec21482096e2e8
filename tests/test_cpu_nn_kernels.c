/* CPU NN kernels called directly on nb_kview over malloc'd buffers:
 * softmax, norms, cross-entropy, index ops, dropout, im2col/col2im, pools,
 * AdamW/SGD. Each is checked against a naive float64 reference written here
 * (and gradients against central finite differences in double), on f64, f32,
 * f16 and bf16, contiguous and strided layouts, odd sizes. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"
#include "core/philox.h"

/* The shared checker (testutil.h), under this file's short name. */
#define CHECK NBT_CHECK

/* ---- test tensors: a view over a malloc'd buffer in one of three layouts */

enum { LAY_CONTIG, LAY_PADDED, LAY_REVERSED };

typedef struct {
  nb_kview v;
  void *mem;
  int64_t n;
} tt;

static tt tt_new(nb_dtype dt, int ndim, const int64_t *shape, int layout) {
  tt t;
  memset(&t, 0, sizeof t);
  t.v.dtype = dt;
  t.v.ndim = ndim;
  t.n = 1;
  int64_t s = layout == LAY_PADDED ? 2 : 1, span = 1;
  for (int k = 0; k < ndim; k++) {
    int d = layout == LAY_REVERSED ? k : ndim - 1 - k; /* reversed: first axis fastest */
    t.v.shape[d] = shape[d];
    t.v.strides[d] = s;
    s *= shape[d] + (layout == LAY_PADDED ? 1 : 0);
    t.n *= shape[d];
    span += (shape[d] ? shape[d] - 1 : 0) * t.v.strides[d];
  }
  t.mem = calloc((size_t)span + 8, nb_dtype_size(dt));
  t.v.data = t.mem;
  return t;
}

static char *tt_at(const tt *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->v.ndim - 1; d >= 0; d--) {
    off += (i % t->v.shape[d]) * t->v.strides[d];
    i /= t->v.shape[d];
  }
  return (char *)t->v.data + off * (int64_t)nb_dtype_size(t->v.dtype);
}

/* Writes row-major values, then reads them back rounded to the dtype. */
static void tt_set(tt *t, double *vals) {
  for (int64_t i = 0; i < t->n; i++) {
    nb_store_f64(tt_at(t, i), t->v.dtype, vals[i]);
    vals[i] = nb_load_f64(tt_at(t, i), t->v.dtype);
  }
}

static double *tt_get(const tt *t) {
  double *a = malloc((size_t)(t->n ? t->n : 1) * sizeof *a);
  for (int64_t i = 0; i < t->n; i++) a[i] = nb_load_f64(tt_at(t, i), t->v.dtype);
  return a;
}

static void tt_free(tt *t) { free(t->mem); }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* uniform [0, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand(void) { return urand() + urand() + urand() + urand() - 2.0; }

static double *rand_vals(int64_t n, double scale) {
  double *a = malloc((size_t)(n ? n : 1) * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = scale * nrand();
  return a;
}

static double dt_tol(nb_dtype dt) {
  switch (dt) {
  case NB_F64: return 1e-10;
  case NB_F32: return 2e-5;
  case NB_F16: return 3e-3;
  default: return 2e-2;
  }
}

/* max |a-b| / (tol * (1 + |b|)) <= 1, NaNs must match. */
static int close_arr(const char *what, const double *a, const double *b, int64_t n, double tol) {
  double worst = 0.0;
  int64_t at = -1;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(a[i]) || isnan(b[i])) {
      if (isnan(a[i]) != isnan(b[i])) { worst = INFINITY; at = i; break; }
      continue;
    }
    if (isinf(b[i]) && a[i] == b[i]) continue;
    double r = fabs(a[i] - b[i]) / (tol * (1.0 + fabs(b[i])));
    if (!(r <= worst)) { worst = r; at = i; }
  }
  int ok = worst <= 1.0;
  CHECK(ok, "%s: element %lld got %.10g expected %.10g (ratio %.3g)", what, (long long)at,
        at >= 0 ? a[at] : 0.0, at >= 0 ? b[at] : 0.0, worst);
  return ok;
}

static int has_all(const char *msg, ...) {
  va_list ap;
  va_start(ap, msg);
  int ok = 1;
  for (const char *s; (s = va_arg(ap, const char *));) ok &= strstr(msg, s) != NULL;
  va_end(ap);
  return ok;
}

static const nb_dtype float_dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
static const char *lay_name[] = {"contig", "padded", "reversed"};

/* ---- softmax ------------------------------------------------------------- */

static void ref_softmax(const double *x, double *y, int64_t R, int64_t D, int log_) {
  for (int64_t r = 0; r < R; r++) {
    const double *a = x + r * D;
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < D; j++) m = fmax(m, a[j]);
    for (int64_t j = 0; j < D; j++) s += exp(a[j] - m);
    for (int64_t j = 0; j < D; j++)
      y[r * D + j] = log_ ? a[j] - m - log(s) : exp(a[j] - m) / s;
  }
}

static void test_softmax(void) {
  const int64_t shape[3] = {3, 4, 7};
  const int64_t R = 12, D = 7, n = R * D;
  for (int di = 0; di < 4; di++)
    for (int lay = 0; lay < 3; lay++)
      for (int lg = 0; lg < 2; lg++) {
        nb_dtype dt = float_dts[di];
        char name[96];
        snprintf(name, sizeof name, "%s %s %s", lg ? "log_softmax" : "softmax",
                 nb_dtype_name(dt), lay_name[lay]);
        tt x = tt_new(dt, 3, shape, lay), y = tt_new(dt, 3, shape, (lay + 1) % 3);
        tt dy = tt_new(dt, 3, shape, lay), dx = tt_new(dt, 3, shape, (lay + 2) % 3);
        double *xv = rand_vals(n, 3.0), *dyv = rand_vals(n, 1.0), ref[84], gref[84];
        xv[5] = 60.0; /* stability: a large logit must not overflow */
        tt_set(&x, xv);
        tt_set(&dy, dyv);
        CHECK(nb_cpu_softmax_fwd(&y.v, &x.v, lg) == NB_OK, "%s fwd status", name);
        ref_softmax(xv, ref, R, D, lg);
        double *yv = tt_get(&y);
        close_arr(name, yv, ref, n, dt_tol(dt));
        /* backward against the formula on the kernel's own y */
        CHECK(nb_cpu_softmax_bwd(&dx.v, &dy.v, &y.v, lg) == NB_OK, "%s bwd status", name);
        for (int64_t r = 0; r < R; r++) {
          double s = 0.0;
          for (int64_t j = 0; j < D; j++) s += lg ? dyv[r * D + j] : dyv[r * D + j] * yv[r * D + j];
          for (int64_t j = 0; j < D; j++) {
            int64_t i = r * D + j;
            gref[i] = lg ? dyv[i] - exp(yv[i]) * s : yv[i] * (dyv[i] - s);
          }
        }
        double *dxv = tt_get(&dx);
        snprintf(name + strlen(name), sizeof name - strlen(name), " bwd");
        close_arr(name, dxv, gref, n, dt_tol(dt) * 2);
        free(xv); free(dyv); free(yv); free(dxv);
        tt_free(&x); tt_free(&y); tt_free(&dy); tt_free(&dx);
      }
}

/* Gradient of sum(w * softmax(x)) by central differences of the kernel,
 * against softmax_bwd, in f64. */
static void test_softmax_fd(void) {
  const int64_t shape[2] = {3, 5}, n = 15;
  for (int lg = 0; lg < 2; lg++) {
    tt x = tt_new(NB_F64, 2, shape, LAY_PADDED), y = tt_new(NB_F64, 2, shape, 0);
    tt w = tt_new(NB_F64, 2, shape, 0), dx = tt_new(NB_F64, 2, shape, LAY_REVERSED);
    double *xv = rand_vals(n, 1.5), *wv = rand_vals(n, 1.0), fd[15];
    tt_set(&x, xv);
    tt_set(&w, wv);
    for (int64_t i = 0; i < n; i++) {
      double f[2];
      for (int s = 0; s < 2; s++) {
        nb_store_f64(tt_at(&x, i), NB_F64, xv[i] + (s ? -1e-6 : 1e-6));
        nb_cpu_softmax_fwd(&y.v, &x.v, lg);
        double *yv = tt_get(&y);
        f[s] = 0.0;
        for (int64_t k = 0; k < n; k++) f[s] += wv[k] * yv[k];
        free(yv);
      }
      nb_store_f64(tt_at(&x, i), NB_F64, xv[i]);
      fd[i] = (f[0] - f[1]) / 2e-6;
    }
    nb_cpu_softmax_fwd(&y.v, &x.v, lg);
    nb_cpu_softmax_bwd(&dx.v, &w.v, &y.v, lg);
    double *g = tt_get(&dx);
    close_arr(lg ? "log_softmax finite differences" : "softmax finite differences", g, fd, n,
              1e-7);
    free(g); free(xv); free(wv);
    tt_free(&x); tt_free(&y); tt_free(&w); tt_free(&dx);
  }
  /* a row of -inf except one entry, and a width-1 row */
  const int64_t s2[2] = {2, 3};
  tt x = tt_new(NB_F32, 2, s2, 0), y = tt_new(NB_F32, 2, s2, 0);
  double xv[6] = {-INFINITY, 2.0, -INFINITY, 1000.0, 1000.0, -1000.0};
  tt_set(&x, xv);
  nb_cpu_softmax_fwd(&y.v, &x.v, 0);
  double *yv = tt_get(&y), want[6] = {0, 1, 0, 0.5, 0.5, 0};
  close_arr("softmax with -inf and huge logits", yv, want, 6, 1e-6);
  free(yv);
  tt_free(&x); tt_free(&y);
}

/* ---- layer norm / rms norm ---------------------------------------------- */

/* Naive forward; returns y (R*D) and fills mean/rstd. */
static void ref_norm(const double *x, const double *w, const double *b, int64_t R, int64_t D,
                     double eps, int rms, double *y, double *mean, double *rstd) {
  for (int64_t r = 0; r < R; r++) {
    const double *a = x + r * D;
    double mu = 0.0, q = 0.0;
    if (!rms) {
      for (int64_t j = 0; j < D; j++) mu += a[j];
      mu /= (double)D;
    }
    for (int64_t j = 0; j < D; j++) q += (a[j] - mu) * (a[j] - mu);
    double rs = 1.0 / sqrt(q / (double)D + eps);
    for (int64_t j = 0; j < D; j++)
      y[r * D + j] = (a[j] - mu) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    if (mean) mean[r] = mu;
    if (rstd) rstd[r] = rs;
  }
}

/* sum(g * norm(x, w, b)), the scalar the finite differences act on. */
static double ref_norm_obj(const double *x, const double *w, const double *b, const double *g,
                           int64_t R, int64_t D, double eps, int rms) {
  double *y = malloc((size_t)(R * D) * sizeof *y), s = 0.0;
  ref_norm(x, w, b, R, D, eps, rms, y, NULL, NULL);
  for (int64_t i = 0; i < R * D; i++) s += g[i] * y[i];
  free(y);
  return s;
}

/* d obj / d v[i] by central differences (v is one of x, w, b). */
static void fd_norm(double *v, int64_t nv, double *out, const double *x, const double *w,
                    const double *b, const double *g, int64_t R, int64_t D, double eps, int rms) {
  for (int64_t i = 0; i < nv; i++) {
    double keep = v[i], h = 1e-6 * (1.0 + fabs(keep));
    v[i] = keep + h;
    double fp = ref_norm_obj(x, w, b, g, R, D, eps, rms);
    v[i] = keep - h;
    double fm = ref_norm_obj(x, w, b, g, R, D, eps, rms);
    v[i] = keep;
    out[i] = (fp - fm) / (2 * h);
  }
}

static void test_norm_case(nb_dtype dt, int rms, int affine, int64_t R, int64_t D) {
  const int64_t sh[2] = {R, D}, n = R * D;
  const double eps = 1e-5;
  nb_dtype sdt = dt == NB_F64 ? NB_F64 : NB_F32;
  char name[96];
  snprintf(name, sizeof name, "%s %s%s R=%lld D=%lld", rms ? "rms_norm" : "layer_norm",
           nb_dtype_name(dt), affine ? " affine" : "", (long long)R, (long long)D);
  tt x = tt_new(dt, 2, sh, 0), y = tt_new(dt, 2, sh, 0), dy = tt_new(dt, 2, sh, 0);
  tt dx = tt_new(dt, 2, sh, 0), mean = tt_new(sdt, 1, &R, 0), rstd = tt_new(sdt, 1, &R, 0);
  tt w = tt_new(dt, 1, &D, 0), b = tt_new(dt, 1, &D, 0), dw = tt_new(dt, 1, &D, 0),
     db = tt_new(dt, 1, &D, 0);
  double *xv = rand_vals(n, 2.0), *gv = rand_vals(n, 1.0), *wv = rand_vals(D, 1.0),
         *bv = rand_vals(D, 1.0);
  for (int64_t i = 0; i < n; i++) xv[i] += 0.7; /* a nonzero mean */
  tt_set(&x, xv);
  tt_set(&dy, gv);
  tt_set(&w, wv);
  tt_set(&b, bv);
  const nb_kview *kw = affine ? &w.v : NULL, *kb = affine && !rms ? &b.v : NULL;
  const double *rw = affine ? wv : NULL, *rb = affine && !rms ? bv : NULL;
  CHECK(nb_cpu_norm_fwd(&y.v, rms ? NULL : &mean.v, &rstd.v, &x.v, kw, kb, eps, rms) == NB_OK,
        "%s fwd status", name);
  double *ry = malloc((size_t)n * sizeof *ry), *rm = malloc((size_t)R * sizeof *rm),
         *rr = malloc((size_t)R * sizeof *rr);
  ref_norm(xv, rw, rb, R, D, eps, rms, ry, rm, rr);
  double *yv = tt_get(&y), *rv = tt_get(&rstd);
  close_arr(name, yv, ry, n, dt_tol(dt));
  close_arr("norm rstd", rv, rr, R, sdt == NB_F64 ? 1e-12 : 1e-6);
  if (!rms) {
    double *mv = tt_get(&mean);
    close_arr("norm mean", mv, rm, R, sdt == NB_F64 ? 1e-12 : 1e-6);
    free(mv);
  }
  /* backward against finite differences of the naive forward */
  CHECK(nb_cpu_norm_bwd(&dx.v, affine ? &dw.v : NULL, affine && !rms ? &db.v : NULL, &dy.v,
                        &x.v, rms ? NULL : &mean.v, &rstd.v, kw, rms) == NB_OK,
        "%s bwd status", name);
  double *fx = malloc((size_t)n * sizeof *fx), *fw = malloc((size_t)D * sizeof *fw),
         *fb = malloc((size_t)D * sizeof *fb);
  double tol = dt == NB_F64 ? 1e-6 : dt_tol(dt) * 2;
  fd_norm(xv, n, fx, xv, rw, rb, gv, R, D, eps, rms);
  double *dxv = tt_get(&dx);
  snprintf(name + strlen(name), sizeof name - strlen(name), " dx");
  close_arr(name, dxv, fx, n, tol);
  if (affine) {
    fd_norm(wv, D, fw, xv, wv, rb, gv, R, D, eps, rms);
    double *dwv = tt_get(&dw);
    close_arr("norm dw", dwv, fw, D, tol);
    free(dwv);
    if (!rms) {
      fd_norm(bv, D, fb, xv, wv, bv, gv, R, D, eps, rms);
      double *dbv = tt_get(&db);
      close_arr("norm db", dbv, fb, D, tol);
      free(dbv);
    }
  }
  free(xv); free(gv); free(wv); free(bv); free(ry); free(rm); free(rr); free(yv); free(rv);
  free(fx); free(fw); free(fb); free(dxv);
  tt_free(&x); tt_free(&y); tt_free(&dy); tt_free(&dx); tt_free(&mean); tt_free(&rstd);
  tt_free(&w); tt_free(&b); tt_free(&dw); tt_free(&db);
}

static void test_norm(void) {
  for (int di = 0; di < 4; di++)
    for (int rms = 0; rms < 2; rms++)
      for (int aff = 0; aff < 2; aff++) test_norm_case(float_dts[di], rms, aff, 5, 9);
  test_norm_case(NB_F64, 0, 1, 131, 3);  /* more rows than reduction chunks */
  test_norm_case(NB_F32, 1, 1, 70, 33);
}

/* dw must not depend on the thread count: the same call twice, bit for bit,
 * with a size that runs in parallel. */
static void test_norm_deterministic(void) {
  const int64_t R = 600, D = 96, sh[2] = {R, D}, n = R * D;
  tt x = tt_new(NB_F32, 2, sh, 0), dy = tt_new(NB_F32, 2, sh, 0), dx = tt_new(NB_F32, 2, sh, 0);
  tt y = tt_new(NB_F32, 2, sh, 0), m = tt_new(NB_F32, 1, &R, 0), r = tt_new(NB_F32, 1, &R, 0);
  tt w = tt_new(NB_F32, 1, &D, 0), dw1 = tt_new(NB_F32, 1, &D, 0), dw2 = tt_new(NB_F32, 1, &D, 0);
  tt db = tt_new(NB_F32, 1, &D, 0);
  double *xv = rand_vals(n, 1.0), *gv = rand_vals(n, 1.0), *wv = rand_vals(D, 1.0);
  tt_set(&x, xv); tt_set(&dy, gv); tt_set(&w, wv);
  nb_cpu_norm_fwd(&y.v, &m.v, &r.v, &x.v, &w.v, NULL, 1e-5, 0);
  nb_cpu_norm_bwd(&dx.v, &dw1.v, &db.v, &dy.v, &x.v, &m.v, &r.v, &w.v, 0);
  nb_cpu_norm_bwd(&dx.v, &dw2.v, NULL, &dy.v, &x.v, &m.v, &r.v, &w.v, 0);
  CHECK(memcmp(dw1.mem, dw2.mem, (size_t)D * 4) == 0, "layer_norm dw bitwise reproducible");
  double *dbv = tt_get(&db), s0 = 0.0;
  for (int64_t i = 0; i < R; i++) s0 += gv[i * D];
  CHECK(fabs(dbv[0] - s0) <= 1e-4 * (1 + fabs(s0)), "db[0] = column sum of dy (%g vs %g)",
        dbv[0], s0);
  free(xv); free(gv); free(wv); free(dbv);
  tt_free(&x); tt_free(&dy); tt_free(&dx); tt_free(&y); tt_free(&m); tt_free(&r);
  tt_free(&w); tt_free(&dw1); tt_free(&dw2); tt_free(&db);
}

/* ---- cross-entropy ------------------------------------------------------- */

static double ref_xent_row(const double *x, int64_t C, int64_t t, double s, double *lse) {
  double m = -INFINITY, z = 0.0, mx = 0.0;
  for (int64_t j = 0; j < C; j++) m = fmax(m, x[j]);
  for (int64_t j = 0; j < C; j++) z += exp(x[j] - m), mx += x[j];
  z = m + log(z);
  *lse = z;
  return (1 - s) * (z - x[t]) + s * (z - mx / (double)C);
}

static void test_xent_case(nb_dtype dt, int lay, double s) {
  const int64_t N = 6, C = 11, sh[2] = {N, C}, n = N * C, ign = -100;
  char name[96];
  snprintf(name, sizeof name, "cross_entropy %s %s smoothing %.2f", nb_dtype_name(dt),
           lay_name[lay], s);
  tt x = tt_new(dt, 2, sh, lay), dx = tt_new(dt, 2, sh, (lay + 1) % 3);
  tt t = tt_new(NB_I64, 1, &N, 0), loss = tt_new(NB_F32, 1, &N, 0), lse = tt_new(NB_F32, 1, &N, 0);
  tt dl = tt_new(NB_F32, 1, &N, 0);
  double *xv = rand_vals(n, 3.0), tv[6] = {3, 0, ign, 10, 5, 3}, dlv[6] = {1, -0.5, 2, 0.25, 1.5, 3};
  xv[1] = 80.0; /* a dominant logit */
  tt_set(&x, xv);
  tt_set(&t, tv);
  tt_set(&dl, dlv);
  CHECK(nb_cpu_xent_fwd(&loss.v, &lse.v, &x.v, &t.v, ign, s) == NB_OK, "%s status", name);
  double rl[6], rz[6], rg[66];
  for (int64_t i = 0; i < N; i++) {
    int64_t ti = (int64_t)tv[i];
    rl[i] = ti == ign ? 0.0 : ref_xent_row(xv + i * C, C, ti, s, &rz[i]);
    for (int64_t j = 0; j < C; j++) {
      double p = ti == ign ? 0 : exp(xv[i * C + j] - rz[i]);
      rg[i * C + j] = ti == ign ? 0.0 : dlv[i] * (p - (1 - s) * (j == ti) - s / (double)C);
    }
  }
  double *lv = tt_get(&loss), *zv = tt_get(&lse);
  close_arr(name, lv, rl, N, 1e-6);
  for (int64_t i = 0; i < N; i++)
    if ((int64_t)tv[i] == ign) zv[i] = rz[i] = 0.0; /* lse of ignored rows is unspecified */
  close_arr("cross_entropy lse", zv, rz, N, 1e-6);
  CHECK(nb_cpu_xent_bwd(&dx.v, &dl.v, &x.v, &t.v, &lse.v, ign, s) == NB_OK, "%s bwd", name);
  double *gv = tt_get(&dx);
  snprintf(name + strlen(name), sizeof name - strlen(name), " bwd");
  close_arr(name, gv, rg, n, dt == NB_F64 ? 1e-6 : dt_tol(dt) * 2);
  if (dt == NB_F64) { /* finite differences of sum(dloss * loss) in double */
    double fd[66], zz;
    for (int64_t k = 0; k < n; k++) {
      int64_t i = k / C, ti = (int64_t)tv[i];
      if (ti == ign) { fd[k] = 0.0; continue; }
      double keep = xv[k], h = 1e-6;
      xv[k] = keep + h;
      double fp = ref_xent_row(xv + i * C, C, ti, s, &zz);
      xv[k] = keep - h;
      double fm = ref_xent_row(xv + i * C, C, ti, s, &zz);
      xv[k] = keep;
      fd[k] = dlv[i] * (fp - fm) / (2 * h);
    }
    /* the kernel's lse is f32: its rounding bounds the agreement */
    close_arr("cross_entropy finite differences", gv, fd, n, 2e-6);
  }
  free(xv); free(lv); free(zv); free(gv);
  tt_free(&x); tt_free(&dx); tt_free(&t); tt_free(&loss); tt_free(&lse); tt_free(&dl);
}

static void test_xent(void) {
  for (int di = 0; di < 4; di++)
    for (int lay = 0; lay < 3; lay += 2) {
      test_xent_case(float_dts[di], lay, 0.0);
      test_xent_case(float_dts[di], lay, 0.1);
    }
  /* a target outside [0, C) that is not ignore_index */
  const int64_t N = 3, C = 5, sh[2] = {N, C};
  tt x = tt_new(NB_F32, 2, sh, 0), t = tt_new(NB_I64, 1, &N, 0);
  tt loss = tt_new(NB_F32, 1, &N, 0), lse = tt_new(NB_F32, 1, &N, 0);
  double tv[3] = {1, 4, 7};
  tt_set(&t, tv);
  nb_clear_error();
  nb_status st = nb_cpu_xent_fwd(&loss.v, &lse.v, &x.v, &t.v, -100, 0.0);
  CHECK(st == NB_ERR_INDEX && has_all(nb_last_error(), "cross_entropy", "row 2", "7", "5", NULL),
        "cross_entropy bad target: status %d, message '%s'", st, nb_last_error());
  double tv2[3] = {-1, 0, 0};
  tt_set(&t, tv2);
  st = nb_cpu_xent_fwd(&loss.v, &lse.v, &x.v, &t.v, -100, 0.0);
  CHECK(st == NB_ERR_INDEX && has_all(nb_last_error(), "cross_entropy", "-1", "row 0", NULL),
        "cross_entropy negative target: '%s'", nb_last_error());
  nb_clear_error();
  tt_free(&x); tt_free(&t); tt_free(&loss); tt_free(&lse);
}

/* ---- index_select / index_add ------------------------------------------- */

/* Row-major index of multi-index c in shape sh. */
static int64_t lin_of(const int64_t *c, const int64_t *sh, int nd) {
  int64_t i = 0;
  for (int d = 0; d < nd; d++) i = i * sh[d] + c[d];
  return i;
}
static void unlin(int64_t i, const int64_t *sh, int nd, int64_t *c) {
  for (int d = nd - 1; d >= 0; d--) {
    c[d] = i % sh[d];
    i /= sh[d];
  }
}

static void test_index_select_add(void) {
  const int64_t xs[3] = {4, 5, 3};
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_BF16, NB_I64};
  for (int di = 0; di < 4; di++)
    for (int axis = 0; axis < 3; axis++) {
      nb_dtype dt = dts[di];
      const int64_t ni = 6, iv[6] = {1, 0, 2, 2, 1, 0};
      int64_t os[3] = {xs[0], xs[1], xs[2]};
      os[axis] = ni;
      char name[80];
      snprintf(name, sizeof name, "index_select %s axis %d", nb_dtype_name(dt), axis);
      tt x = tt_new(dt, 3, xs, LAY_PADDED), out = tt_new(dt, 3, os, LAY_REVERSED);
      tt idx = tt_new(NB_I64, 1, &ni, LAY_PADDED);
      double ivd[6];
      for (int k = 0; k < 6; k++) ivd[k] = (double)iv[k];
      tt_set(&idx, ivd);
      double *xv = rand_vals(60, 4.0);
      for (int k = 0; k < 60; k++) xv[k] = dt == NB_I64 ? round(xv[k]) : xv[k];
      tt_set(&x, xv);
      CHECK(nb_cpu_index_select(&out.v, &x.v, axis, &idx.v) == NB_OK, "%s status", name);
      int64_t on = os[0] * os[1] * os[2];
      double *ref = malloc((size_t)on * sizeof *ref), *ov = tt_get(&out);
      for (int64_t i = 0; i < on; i++) {
        int64_t c[3];
        unlin(i, os, 3, c);
        c[axis] = iv[c[axis]];
        ref[i] = xv[lin_of(c, xs, 3)];
      }
      close_arr(name, ov, ref, on, 0.0 + 1e-300);
      /* index_add: x (as out) += src scattered back by the same indices */
      snprintf(name, sizeof name, "index_add %s axis %d", nb_dtype_name(dt), axis);
      double *sv = rand_vals(on, 2.0);
      for (int64_t k = 0; k < on; k++) sv[k] = dt == NB_I64 ? round(sv[k]) : sv[k];
      tt_set(&out, sv);
      double *want = malloc(60 * sizeof *want);
      memcpy(want, xv, 60 * sizeof *want);
      for (int64_t i = 0; i < on; i++) {
        int64_t c[3];
        unlin(i, os, 3, c);
        c[axis] = iv[c[axis]];
        want[lin_of(c, xs, 3)] += sv[i];
      }
      CHECK(nb_cpu_index_add(&x.v, axis, &idx.v, &out.v, 1) == NB_OK, "%s status", name);
      double *got = tt_get(&x);
      close_arr(name, got, want, 60, dt == NB_I64 ? 1e-300 : dt_tol(dt));
      free(xv); free(ref); free(ov); free(sv); free(want); free(got);
      tt_free(&x); tt_free(&out); tt_free(&idx);
    }
  /* errors: a negative index is not wrapped; one past the end */
  const int64_t xs2[2] = {5, 4}, ni = 4, os2[2] = {4, 4};
  tt x = tt_new(NB_F32, 2, xs2, 0), out = tt_new(NB_F32, 2, os2, 0), idx = tt_new(NB_I64, 1, &ni, 0);
  double bad[4] = {0, 4, -1, 2};
  tt_set(&idx, bad);
  nb_clear_error();
  nb_status st = nb_cpu_index_select(&out.v, &x.v, 0, &idx.v);
  CHECK(st == NB_ERR_INDEX &&
            has_all(nb_last_error(), "index_select", "-1", "position 2", "size 5", NULL),
        "index_select error: '%s'", nb_last_error());
  double bad2[4] = {0, 5, 1, 2};
  tt_set(&idx, bad2);
  st = nb_cpu_index_add(&x.v, 0, &idx.v, &out.v, 1);
  CHECK(st == NB_ERR_INDEX &&
            has_all(nb_last_error(), "index_add", "index 5", "position 1", "axis 0", "size 5", NULL),
        "index_add error: '%s'", nb_last_error());
  nb_clear_error();
  tt_free(&x); tt_free(&out); tt_free(&idx);
}

/* An embedding-gradient-sized index_add (one lane, chunked vector axis),
 * large enough to run in parallel: exact against a serial f64 sum, and
 * bitwise reproducible in f32. */
static void test_index_add_large(void) {
  const int64_t V = 17, D = 1500, n = 400, os[2] = {V, D}, ss[2] = {n, D};
  tt out1 = tt_new(NB_F32, 2, os, 0), out2 = tt_new(NB_F32, 2, os, 0), o64 = tt_new(NB_F64, 2, os, 0);
  tt src = tt_new(NB_F32, 2, ss, 0), s64 = tt_new(NB_F64, 2, ss, 0), idx = tt_new(NB_I64, 1, &n, 0);
  double *sv = rand_vals(n * D, 1.0), *iv = malloc((size_t)n * sizeof *iv);
  for (int64_t j = 0; j < n; j++) iv[j] = (double)((j * 7 + j / 3) % V);
  tt_set(&src, sv);
  tt_set(&s64, sv);
  tt_set(&idx, iv);
  nb_cpu_index_add(&out1.v, 0, &idx.v, &src.v, 1);
  nb_cpu_index_add(&out2.v, 0, &idx.v, &src.v, 0);
  nb_cpu_index_add(&o64.v, 0, &idx.v, &s64.v, 1);
  CHECK(memcmp(out1.mem, out2.mem, (size_t)(V * D) * 4) == 0, "index_add f32 reproducible");
  double *want = calloc((size_t)(V * D), sizeof *want);
  for (int64_t j = 0; j < n; j++)
    for (int64_t k = 0; k < D; k++) want[(int64_t)iv[j] * D + k] += sv[j * D + k];
  double *g64 = tt_get(&o64), *g32 = tt_get(&out1);
  close_arr("index_add large f64", g64, want, V * D, 1e-12);
  close_arr("index_add large f32", g32, want, V * D, 1e-5);
  free(sv); free(iv); free(want); free(g64); free(g32);
  tt_free(&out1); tt_free(&out2); tt_free(&o64); tt_free(&src); tt_free(&s64); tt_free(&idx);
}

/* ---- gather / scatter_add ------------------------------------------------ */

static void test_gather_scatter(void) {
  const int64_t xs[3] = {3, 4, 5};
  for (int di = 0; di < 3; di++)
    for (int axis = 0; axis < 3; axis++) {
      nb_dtype dt = float_dts[di == 2 ? 3 : di];
      int64_t is[3] = {3, 4, 5};
      is[axis] = 2 + axis; /* idx differs from x along axis only */
      const int64_t ni = is[0] * is[1] * is[2];
      char name[80];
      snprintf(name, sizeof name, "gather %s axis %d", nb_dtype_name(dt), axis);
      tt x = tt_new(dt, 3, xs, LAY_REVERSED), out = tt_new(dt, 3, is, LAY_PADDED);
      tt idx = tt_new(NB_I64, 3, is, LAY_PADDED);
      double *xv = rand_vals(60, 3.0), *iv = malloc((size_t)ni * sizeof *iv);
      for (int64_t i = 0; i < ni; i++) iv[i] = (double)(int64_t)(urand() * xs[axis]);
      tt_set(&x, xv);
      tt_set(&idx, iv);
      CHECK(nb_cpu_gather(&out.v, &x.v, axis, &idx.v) == NB_OK, "%s status", name);
      double *ref = malloc((size_t)ni * sizeof *ref), *ov = tt_get(&out);
      for (int64_t i = 0; i < ni; i++) {
        int64_t c[3];
        unlin(i, is, 3, c);
        c[axis] = (int64_t)iv[i];
        ref[i] = xv[lin_of(c, xs, 3)];
      }
      close_arr(name, ov, ref, ni, 1e-300);
      /* scatter_add of src (idx's shape) into x */
      snprintf(name, sizeof name, "scatter_add %s axis %d", nb_dtype_name(dt), axis);
      double *sv = rand_vals(ni, 1.0), *want = malloc(60 * sizeof *want);
      tt_set(&out, sv);
      memcpy(want, xv, 60 * sizeof *want);
      for (int64_t i = 0; i < ni; i++) {
        int64_t c[3];
        unlin(i, is, 3, c);
        c[axis] = (int64_t)iv[i];
        want[lin_of(c, xs, 3)] += sv[i];
      }
      CHECK(nb_cpu_scatter_add(&x.v, axis, &idx.v, &out.v, 1) == NB_OK, "%s status", name);
      double *got = tt_get(&x);
      close_arr(name, got, want, 60, dt_tol(dt));
      free(xv); free(iv); free(ref); free(ov); free(sv); free(want); free(got);
      tt_free(&x); tt_free(&out); tt_free(&idx);
    }
  const int64_t xs2[2] = {2, 3}, is2[2] = {2, 2};
  tt x = tt_new(NB_F32, 2, xs2, 0), out = tt_new(NB_F32, 2, is2, 0), idx = tt_new(NB_I64, 2, is2, 0);
  double iv[4] = {0, 2, 1, 3};
  tt_set(&idx, iv);
  nb_clear_error();
  nb_status st = nb_cpu_gather(&out.v, &x.v, 1, &idx.v);
  CHECK(st == NB_ERR_INDEX && has_all(nb_last_error(), "gather", "index 3", "[1, 1]", "size 3", NULL),
        "gather error: '%s'", nb_last_error());
  double iv2[4] = {0, -2, 1, 1};
  tt_set(&idx, iv2);
  st = nb_cpu_scatter_add(&x.v, 1, &idx.v, &out.v, 1);
  CHECK(st == NB_ERR_INDEX && has_all(nb_last_error(), "scatter_add", "-2", "[0, 1]", NULL),
        "scatter_add error: '%s'", nb_last_error());
  nb_clear_error();
  tt_free(&x); tt_free(&out); tt_free(&idx);
}

/* ---- dropout ------------------------------------------------------------- */

static int ref_keep(uint64_t seed, uint64_t offset, int64_t i, double p) {
  uint32_t w[4];
  nb_philox4x32(seed, offset + (uint64_t)i, w);
  return nb_philox_u01(w[0]) >= p;
}

static void test_dropout(void) {
  const int64_t sh[2] = {37, 41}, n = 37 * 41;
  const double p = 0.3;
  for (int di = 0; di < 4; di++) {
    nb_dtype dt = float_dts[di];
    tt x = tt_new(dt, 2, sh, LAY_REVERSED), y = tt_new(dt, 2, sh, 0), y2 = tt_new(dt, 2, sh, LAY_PADDED);
    double *xv = rand_vals(n, 1.0), *ref = malloc((size_t)n * sizeof *ref);
    tt_set(&x, xv);
    CHECK(nb_cpu_dropout(&y.v, &x.v, p, 1234, 77) == NB_OK, "dropout status");
    for (int64_t i = 0; i < n; i++) ref[i] = ref_keep(1234, 77, i, p) ? xv[i] / (1 - p) : 0.0;
    double *yv = tt_get(&y);
    char name[64];
    snprintf(name, sizeof name, "dropout %s", nb_dtype_name(dt));
    close_arr(name, yv, ref, n, dt_tol(dt));
    nb_cpu_dropout(&y2.v, &x.v, p, 1234, 77); /* other layout, same logical result */
    double *y2v = tt_get(&y2);
    CHECK(memcmp(yv, y2v, (size_t)n * sizeof *yv) == 0, "dropout %s same bits in any layout",
          nb_dtype_name(dt));
    free(xv); free(ref); free(yv); free(y2v);
    tt_free(&x); tt_free(&y); tt_free(&y2);
  }
  /* keep rate, offset shift, p = 0 and p = 1 */
  const int64_t big = 200000;
  tt x = tt_new(NB_F32, 1, &big, 0), y = tt_new(NB_F32, 1, &big, 0), z = tt_new(NB_F32, 1, &big, 0);
  double *ones = malloc((size_t)big * sizeof *ones);
  for (int64_t i = 0; i < big; i++) ones[i] = 1.0;
  tt_set(&x, ones);
  nb_cpu_dropout(&y.v, &x.v, p, 99, 0);
  double *yv = tt_get(&y);
  int64_t kept = 0;
  for (int64_t i = 0; i < big; i++) kept += yv[i] != 0.0;
  double rate = (double)kept / (double)big;
  CHECK(fabs(rate - (1 - p)) < 0.005, "dropout keep rate %.4f for p=%.2f", rate, p);
  nb_cpu_dropout(&z.v, &x.v, p, 99, 1000); /* offset 1000 = the first draw shifted */
  double *zv = tt_get(&z);
  int same = 1;
  for (int64_t i = 0; i + 1000 < big; i++) same &= zv[i] == yv[i + 1000];
  CHECK(same, "dropout offset shifts the stream");
  nb_cpu_dropout(&z.v, &x.v, 0.0, 99, 0);
  free(zv);
  zv = tt_get(&z);
  same = 1;
  for (int64_t i = 0; i < big; i++) same &= zv[i] == 1.0;
  CHECK(same, "dropout p=0 is the identity");
  ones[3] = NAN;
  tt_set(&x, ones);
  nb_cpu_dropout(&z.v, &x.v, 1.0, 99, 0);
  free(zv);
  zv = tt_get(&z);
  same = 1;
  for (int64_t i = 0; i < big; i++) same &= zv[i] == 0.0;
  CHECK(same, "dropout p=1 gives zeros");
  free(ones); free(yv); free(zv);
  tt_free(&x); tt_free(&y); tt_free(&z);
}

/* ---- im2col / col2im ----------------------------------------------------- */

static nb_im2col_params conv_params(int n, int c, int h, int w, int kh, int kw, int s, int pad,
                                    int dil) {
  nb_im2col_params p = {n, c, h, w, kh, kw, s, s, pad, pad, dil, dil, 0, 0};
  p.oh = (h + 2 * pad - dil * (kh - 1) - 1) / s + 1;
  p.ow = (w + 2 * pad - dil * (kw - 1) - 1) / s + 1;
  return p;
}

/* x value at (n, c, iy, ix) with zero padding */
static double xpad(const double *x, const nb_im2col_params *p, int64_t n, int64_t c, int64_t iy,
                   int64_t ix) {
  if (iy < 0 || iy >= p->h || ix < 0 || ix >= p->w) return 0.0;
  return x[((n * p->c + c) * p->h + iy) * p->w + ix];
}

static void test_im2col_case(nb_dtype dt, nb_im2col_params p) {
  const int64_t xs[4] = {p.n, p.c, p.h, p.w}, K = (int64_t)p.c * p.kh * p.kw, L = (int64_t)p.oh * p.ow;
  const int64_t cs[3] = {p.n, K, L}, nx = xs[0] * xs[1] * xs[2] * xs[3], nc = p.n * K * L;
  char name[128];
  snprintf(name, sizeof name, "im2col %s k%dx%d s%d p%d d%d", nb_dtype_name(dt), p.kh, p.kw, p.sh,
           p.ph, p.dh);
  tt x = tt_new(dt, 4, xs, 0), cols = tt_new(dt, 3, cs, 0), x2 = tt_new(dt, 4, xs, 0),
     c2 = tt_new(dt, 3, cs, 0);
  double *xv = rand_vals(nx, 1.0), *cv = rand_vals(nc, 1.0);
  tt_set(&x, xv);
  tt_set(&c2, cv);
  CHECK(nb_cpu_im2col(&cols.v, &x.v, &p) == NB_OK, "%s status", name);
  double *got = tt_get(&cols), *ref = malloc((size_t)nc * sizeof *ref);
  for (int64_t i = 0; i < nc; i++) {
    int64_t n = i / (K * L), r = i / L % K, l = i % L;
    int64_t c = r / (p.kh * p.kw), ki = r / p.kw % p.kh, kj = r % p.kw;
    ref[i] = xpad(xv, &p, n, c, l / p.ow * p.sh - p.ph + ki * p.dh, l % p.ow * p.sw - p.pw + kj * p.dw);
  }
  close_arr(name, got, ref, nc, 1e-300);
  /* adjoint: <col2im(c), x> == <c, im2col(x)> */
  CHECK(nb_cpu_col2im(&x2.v, &c2.v, &p) == NB_OK, "col2im status");
  double *x2v = tt_get(&x2), lhs = 0.0, rhs = 0.0, scale = 0.0;
  for (int64_t i = 0; i < nx; i++) lhs += x2v[i] * xv[i], scale += fabs(x2v[i] * xv[i]);
  for (int64_t i = 0; i < nc; i++) rhs += cv[i] * got[i];
  CHECK(fabs(lhs - rhs) <= dt_tol(dt) * (1 + scale), "col2im adjoint of im2col %s: %.12g vs %.12g",
        name, lhs, rhs);
  /* a convolution through im2col against the direct formula (f64 weights) */
  const int O = 3;
  double *wv = rand_vals(O * K, 1.0);
  double maxerr = 0.0;
  for (int64_t n = 0; n < p.n; n++)
    for (int o = 0; o < O; o++)
      for (int64_t l = 0; l < L; l++) {
        double viacols = 0.0, direct = 0.0;
        for (int64_t r = 0; r < K; r++) viacols += wv[o * K + r] * got[(n * K + r) * L + l];
        for (int64_t c = 0; c < p.c; c++)
          for (int i = 0; i < p.kh; i++)
            for (int j = 0; j < p.kw; j++)
              direct += wv[o * K + (c * p.kh + i) * p.kw + j] *
                        xpad(xv, &p, n, c, l / p.ow * p.sh - p.ph + i * p.dh,
                             l % p.ow * p.sw - p.pw + j * p.dw);
        maxerr = fmax(maxerr, fabs(viacols - direct));
      }
  CHECK(maxerr < 1e-10, "conv via im2col matches direct conv (%s): err %g", name, maxerr);
  free(xv); free(cv); free(got); free(ref); free(x2v); free(wv);
  tt_free(&x); tt_free(&cols); tt_free(&x2); tt_free(&c2);
}

static void test_im2col(void) {
  for (int di = 0; di < 4; di++) {
    test_im2col_case(float_dts[di], conv_params(2, 3, 7, 6, 3, 3, 1, 1, 1));
    test_im2col_case(float_dts[di], conv_params(1, 2, 9, 8, 3, 2, 2, 1, 2));
  }
  test_im2col_case(NB_F64, conv_params(2, 2, 5, 5, 1, 1, 2, 0, 1));
  test_im2col_case(NB_F32, conv_params(1, 1, 4, 5, 5, 5, 1, 2, 1)); /* kernel larger than x */
  test_im2col_case(NB_F32, conv_params(3, 8, 20, 20, 3, 3, 1, 1, 1)); /* parallel */
}

/* ---- pools --------------------------------------------------------------- */

static void test_pool_case(nb_dtype dt, nb_im2col_params p) {
  const int64_t xs[4] = {p.n, p.c, p.h, p.w}, ys[4] = {p.n, p.c, p.oh, p.ow};
  const int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], ny = ys[0] * ys[1] * ys[2] * ys[3];
  const int64_t hw = (int64_t)p.h * p.w, ohw = (int64_t)p.oh * p.ow;
  char name[96];
  snprintf(name, sizeof name, "%s k%dx%d s%d p%d", nb_dtype_name(dt), p.kh, p.kw, p.sh, p.ph);
  tt x = tt_new(dt, 4, xs, 0), y = tt_new(dt, 4, ys, 0), am = tt_new(NB_I64, 4, ys, 0);
  tt dy = tt_new(dt, 4, ys, 0), dx = tt_new(dt, 4, xs, 0);
  double *xv = rand_vals(nx, 2.0), *gv = rand_vals(ny, 1.0);
  double *rmax = malloc((size_t)ny * sizeof *rmax), *ravg = malloc((size_t)ny * sizeof *ravg);
  double *rarg = malloc((size_t)ny * sizeof *rarg), *rdx = calloc((size_t)nx, sizeof *rdx),
         *radx = calloc((size_t)nx, sizeof *radx);
  tt_set(&x, xv);
  tt_set(&dy, gv);
  for (int64_t i = 0; i < ny; i++) {
    int64_t q = i / ohw, oy = i % ohw / p.ow, ox = i % p.ow;
    double best = -INFINITY, sum = 0.0;
    int64_t arg = -1;
    for (int a = 0; a < p.kh; a++)
      for (int b = 0; b < p.kw; b++) {
        int64_t iy = oy * p.sh - p.ph + a * p.dh, ix = ox * p.sw - p.pw + b * p.dw;
        if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
        double v = xv[q * hw + iy * p.w + ix];
        sum += v;
        radx[q * hw + iy * p.w + ix] += gv[i] / (p.kh * p.kw);
        if (arg < 0 || v > best) best = v, arg = iy * p.w + ix;
      }
    rmax[i] = best;
    rarg[i] = (double)arg;
    ravg[i] = sum / (p.kh * p.kw);
    if (arg >= 0) rdx[q * hw + arg] += gv[i];
  }
  char nm[128];
  CHECK(nb_cpu_maxpool2d_fwd(&y.v, &am.v, &x.v, &p) == NB_OK, "maxpool status");
  double *yv = tt_get(&y), *av = tt_get(&am);
  snprintf(nm, sizeof nm, "maxpool2d %s", name);
  close_arr(nm, yv, rmax, ny, dt_tol(dt));
  close_arr("maxpool2d argmax", av, rarg, ny, 1e-300);
  CHECK(nb_cpu_maxpool2d_bwd(&dx.v, &dy.v, &am.v, &p) == NB_OK, "maxpool bwd status");
  double *dxv = tt_get(&dx);
  snprintf(nm, sizeof nm, "maxpool2d bwd %s", name);
  close_arr(nm, dxv, rdx, nx, dt_tol(dt) * 2);
  free(yv); free(dxv);
  CHECK(nb_cpu_avgpool2d_fwd(&y.v, &x.v, &p) == NB_OK, "avgpool status");
  yv = tt_get(&y);
  snprintf(nm, sizeof nm, "avgpool2d %s", name);
  close_arr(nm, yv, ravg, ny, dt_tol(dt));
  memset(dx.mem, 0, (size_t)nx * nb_dtype_size(dt)); /* the caller zeroes dx */
  CHECK(nb_cpu_avgpool2d_bwd(&dx.v, &dy.v, &p) == NB_OK, "avgpool bwd status");
  dxv = tt_get(&dx);
  snprintf(nm, sizeof nm, "avgpool2d bwd %s", name);
  close_arr(nm, dxv, radx, nx, dt_tol(dt) * 2);
  free(xv); free(gv); free(rmax); free(ravg); free(rarg); free(rdx); free(radx);
  free(yv); free(av); free(dxv);
  tt_free(&x); tt_free(&y); tt_free(&am); tt_free(&dy); tt_free(&dx);
}

static void test_pools(void) {
  for (int di = 0; di < 4; di++) {
    test_pool_case(float_dts[di], conv_params(2, 3, 7, 6, 2, 2, 2, 0, 1));
    test_pool_case(float_dts[di], conv_params(1, 2, 7, 7, 3, 3, 2, 1, 1));
  }
  test_pool_case(NB_F64, conv_params(1, 1, 5, 4, 3, 3, 1, 1, 1)); /* overlapping windows */
  test_pool_case(NB_F32, conv_params(4, 16, 16, 16, 3, 3, 1, 1, 1)); /* parallel */
  /* NaN propagates through max; padding never wins over negative inputs */
  nb_im2col_params p = conv_params(1, 1, 2, 2, 2, 2, 1, 1, 1);
  const int64_t xs[4] = {1, 1, 2, 2}, ys[4] = {1, 1, 3, 3};
  tt x = tt_new(NB_F32, 4, xs, 0), y = tt_new(NB_F32, 4, ys, 0), am = tt_new(NB_I64, 4, ys, 0);
  double xv[4] = {-5, -6, -7, NAN};
  tt_set(&x, xv);
  nb_cpu_maxpool2d_fwd(&y.v, &am.v, &x.v, &p);
  double *yv = tt_get(&y), *av = tt_get(&am);
  CHECK(yv[0] == -5 && av[0] == 0 && yv[1] == -5 && yv[2] == -6 && isnan(yv[4]) && av[4] == 3,
        "maxpool2d: padding never wins, NaN wins (%g %g %g %g)", yv[0], yv[1], yv[2], yv[4]);
  free(yv); free(av);
  tt_free(&x); tt_free(&y); tt_free(&am);
}

/* ---- optimizers ---------------------------------------------------------- */

static void test_adamw(void) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  const int64_t n = 3;
  double p0[3] = {1.0, -2.0, 0.5}, g[3][3] = {{0.1, -0.3, 2.0}, {0.2, 0.1, -1.0}, {-0.4, 0.0, 0.5}};
  for (int di = 0; di < 4; di++) {
    nb_dtype dt = float_dts[di];
    tt p = tt_new(dt, 1, &n, 0), gr = tt_new(dt, 1, &n, 0), m = tt_new(NB_F32, 1, &n, 0),
       v = tt_new(NB_F32, 1, &n, 0);
    double rp[3], rm[3] = {0}, rv[3] = {0}, pv[3];
    memcpy(pv, p0, sizeof pv);
    tt_set(&p, pv);
    memcpy(rp, pv, sizeof rp);
    for (int step = 1; step <= 3; step++) {
      double gv[3];
      memcpy(gv, g[step - 1], sizeof gv);
      tt_set(&gr, gv);
      CHECK(nb_cpu_adamw_step(&p.v, &gr.v, &m.v, &v.v, lr, b1, b2, eps, wd, step) == NB_OK,
            "adamw status");
      for (int i = 0; i < 3; i++) {
        rm[i] = b1 * rm[i] + (1 - b1) * gv[i];
        rv[i] = b2 * rv[i] + (1 - b2) * gv[i] * gv[i];
        rp[i] -= lr * wd * rp[i];
        rp[i] -= lr * (rm[i] / (1 - pow(b1, step))) / (sqrt(rv[i] / (1 - pow(b2, step))) + eps);
      }
      if (step == 1 && dt == NB_F64) { /* by hand: p*(1-lr*wd) - lr*g/(|g|+eps) */
        double *pp = tt_get(&p);
        CHECK(fabs(pp[0] - (1.0 * 0.999 - 0.01 * 0.1 / (0.1 + 1e-8))) < 1e-12 &&
                  fabs(pp[1] - (-2.0 * 0.999 + 0.01 * 0.3 / (0.3 + 1e-8))) < 1e-12 &&
                  fabs(pp[2] - (0.5 * 0.999 - 0.01 * 2.0 / (2.0 + 1e-8))) < 1e-12,
              "adamw first step by hand: %.12f %.12f %.12f", pp[0], pp[1], pp[2]);
        free(pp);
      }
      /* low-precision params are rounded after every step: follow them */
      double *pp = tt_get(&p), *mm = tt_get(&m), *vv = tt_get(&v);
      char name[64];
      snprintf(name, sizeof name, "adamw %s step %d", nb_dtype_name(dt), step);
      close_arr(name, pp, rp, 3, dt_tol(dt));
      close_arr("adamw m", mm, rm, 3, 1e-6);
      close_arr("adamw v", vv, rv, 3, 1e-6);
      memcpy(rp, pp, sizeof rp);
      memcpy(rm, mm, sizeof rm);
      memcpy(rv, vv, sizeof rv);
      free(pp); free(mm); free(vv);
    }
    tt_free(&p); tt_free(&gr); tt_free(&m); tt_free(&v);
  }
}

static void test_sgd(void) {
  const int64_t n = 4;
  const double lr = 0.1, wd = 0.01;
  for (int nest = 0; nest < 2; nest++)
    for (int mo = 0; mo < 2; mo++) {
      const double mom = mo ? 0.9 : 0.0, damp = 0.0;
      tt p = tt_new(NB_F64, 1, &n, 0), g = tt_new(NB_F64, 1, &n, 0), b = tt_new(NB_F32, 1, &n, 0);
      double pv[4] = {1, -1, 0.5, 2}, rp[4], rb[4] = {0};
      tt_set(&p, pv);
      memcpy(rp, pv, sizeof rp);
      for (int step = 0; step < 3; step++) {
        double gv[4] = {0.5 - step, 0.25, -1.0, 0.125 * step};
        tt_set(&g, gv);
        CHECK(nb_cpu_sgd_step(&p.v, &g.v, mo ? &b.v : NULL, lr, mom, damp, nest, wd) == NB_OK,
              "sgd status");
        for (int i = 0; i < 4; i++) {
          double d = gv[i] + wd * rp[i];
          if (mo) {
            rb[i] = mom * rb[i] + (1 - damp) * d;
            d = nest ? d + mom * rb[i] : rb[i];
          }
          rp[i] -= lr * d;
          rb[i] = (float)rb[i]; /* buf is f32 */
        }
      }
      double *got = tt_get(&p);
      char name[64];
      snprintf(name, sizeof name, "sgd momentum %.1f nesterov %d", mom, nest);
      close_arr(name, got, rp, 4, 1e-7);
      free(got);
      tt_free(&p); tt_free(&g); tt_free(&b);
    }
  /* by hand: one plain step p -= lr*(g + wd*p) */
  const int64_t one = 1;
  tt p = tt_new(NB_F32, 1, &one, 0), g = tt_new(NB_F32, 1, &one, 0);
  double pv = 2.0, gv = 0.5;
  tt_set(&p, &pv);
  tt_set(&g, &gv);
  nb_cpu_sgd_step(&p.v, &g.v, NULL, 0.1, 0.0, 0.0, 0, 0.5);
  double *got = tt_get(&p);
  CHECK(fabs(got[0] - (2.0 - 0.1 * (0.5 + 1.0))) < 1e-6, "sgd by hand: %g", got[0]);
  free(got);
  tt_free(&p); tt_free(&g);
}

int main(void) {
  test_softmax();
  test_softmax_fd();
  test_norm();
  test_norm_deterministic();
  test_xent();
  test_index_select_add();
  test_index_add_large();
  test_gather_scatter();
  test_dropout();
  test_im2col();
  test_pools();
  test_adamw();
  test_sgd();
  return nbt_finish();
}
