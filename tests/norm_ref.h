/* The f64 accuracy check of layer_norm and rms_norm, shared by the CPU suite
 * (test_norm_accuracy) and the CUDA accuracy program (section "norm f64").
 *
 * The reference is computed in long double from the definitions: row mean
 * and biased variance in two passes, y = (x - mu) rstd w + b, and with
 * xhat = (x - mu) rstd, g = dy w:
 *   dx = rstd (g - mean(g) - xhat mean(g xhat))   (rms: mu = 0, no mean(g))
 *   dw = sum over rows of dy xhat,  db = sum over rows of dy.
 * Each result is checked within 1e-12 of its scale plus 1e-12 relative,
 * the scale being the largest magnitude of the terms it sums (for dx the
 * three terms above, which cancel at tiny D: at D = 1 or 2 the true dx is
 * of the order of eps). f64 rounding is 1.1e-16; statistics saved in f32
 * (the defect this guards against) put about 1e-7 of the scale into every
 * gradient. */
#ifndef NB_TEST_NORM_REF_H
#define NB_TEST_NORM_REF_H
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

#define NORM_REF_TOL 1e-12

static void norm_ref_rows(int64_t R, int64_t D, const double *x, const double *w, const double *b,
                          const double *dy, double eps, int rms, double *y, double *dx, double *dw,
                          double *db, double scale[4]) {
  long double *aw = calloc((size_t)D, sizeof *aw), *ab = calloc((size_t)D, sizeof *ab);
  long double *sw = calloc((size_t)D, sizeof *sw), *sb = calloc((size_t)D, sizeof *sb);
  scale[0] = scale[1] = scale[2] = scale[3] = 0;
  for (int64_t r = 0; r < R; r++) {
    const double *xr = x + r * D, *gr = dy + r * D;
    long double mu = 0, q = 0, sg = 0, sgx = 0;
    if (!rms) {
      for (int64_t j = 0; j < D; j++) mu += xr[j];
      mu /= D;
    }
    for (int64_t j = 0; j < D; j++) q += (xr[j] - mu) * (xr[j] - mu);
    long double rs = 1.0L / sqrtl(q / D + eps);
    for (int64_t j = 0; j < D; j++) {
      long double h = (xr[j] - mu) * rs, g = gr[j] * (w ? (long double)w[j] : 1.0L);
      long double hw = h * (w ? (long double)w[j] : 1.0L), bj = b ? (long double)b[j] : 0.0L;
      y[r * D + j] = (double)(hw + bj);
      scale[0] = fmax(scale[0], (double)(fabsl(hw) + fabsl(bj)));
      sg += g;
      sgx += g * h;
      aw[j] += gr[j] * h;
      ab[j] += gr[j];
      sw[j] += fabsl(gr[j] * h);
      sb[j] += fabsl((long double)gr[j]);
    }
    long double mg = rms ? 0.0L : sg / D, mgx = sgx / D;
    for (int64_t j = 0; j < D; j++) {
      long double h = (xr[j] - mu) * rs, g = gr[j] * (w ? (long double)w[j] : 1.0L);
      dx[r * D + j] = (double)(rs * (g - mg - h * mgx));
      scale[1] = fmax(scale[1], (double)(rs * (fabsl(g) + fabsl(mg) + fabsl(h * mgx))));
    }
  }
  for (int64_t j = 0; j < D; j++) {
    dw[j] = (double)aw[j];
    db[j] = (double)ab[j];
    scale[2] = fmax(scale[2], (double)sw[j]);
    scale[3] = fmax(scale[3], (double)sb[j]);
  }
  free(aw);
  free(ab);
  free(sw);
  free(sb);
}

/* The worst |got - ref| / (tol big + tol |ref|) over n values (<= 1
 * passes), big the larger of scale and max |ref|; and the largest error
 * relative to big seen, for the report. */
static double norm_ref_ratio(const double *got, const double *ref, int64_t n, double scale,
                             double *max_rel) {
  double big = scale, worst = 0;
  for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    double e = fabs(got[i] - ref[i]);
    double r = e / (NORM_REF_TOL * big + NORM_REF_TOL * fabs(ref[i]) + 1e-300);
    if (!(r <= worst)) worst = r;
    if (big > 0 && e / big > *max_rel) *max_rel = e / big;
  }
  return worst;
}

/* One case: x (R, D) f64 in a layout (0 contiguous, 1 a transposed view,
 * 2 every other column of a wider tensor) on dev, w and b (D) when affine,
 * upstream gradient dy; forward and the gradients of x, w and b through
 * nb_autograd_grad against the reference. */
static void norm_ref_case(nb_device dev, int64_t R, int64_t D, int layout, int rms, int affine,
                          uint64_t seed, double *max_rel) {
  nb_scope_begin();
  const char *op = rms ? "rms_norm" : "layer_norm";
  nb_tensor *base;
  if (layout == 1) base = nbt_randn(seed, 2, (int64_t[]){D, R}, NB_F64);
  else if (layout == 2) base = nbt_randn(seed, 2, (int64_t[]){R, 2 * D + 1}, NB_F64);
  else base = nbt_randn(seed, 2, (int64_t[]){R, D}, NB_F64);
  /* an offset and a spread so the mean matters: x = 3 + 2 n */
  base = nb_to_device(nb_add_scalar(nb_mul_scalar(base, 2.0), 3.0), dev);
  nb_set_requires_grad(base, 1);
  nb_tensor *x = layout == 1 ? nb_transpose(base, 0, 1)
               : layout == 2 ? nb_slice(base, 1, 1, 2 * D + 1, 2) : base;
  nb_tensor *w = affine ? nb_to_device(nbt_randn(seed + 1, 1, &D, NB_F64), dev) : NULL;
  nb_tensor *b = affine && !rms ? nb_to_device(nbt_randn(seed + 2, 1, &D, NB_F64), dev) : NULL;
  nb_tensor *dy = nb_to_device(nbt_randn(seed + 3, 2, (int64_t[]){R, D}, NB_F64), dev);
  nb_tensor *leaves[3] = {x, w, b}, *grads[3] = {NULL, NULL, NULL}; /* autoreleased */
  int n = affine ? (rms ? 2 : 3) : 1;
  /* x may be a view of base: its gradient is asked of it directly */
  for (int i = 1; i < n; i++) nb_set_requires_grad(leaves[i], 1);
  nb_tensor *y = rms ? nb_rms_norm(x, 1, w, 1e-5) : nb_layer_norm(x, 1, w, b, 1e-5);
  nb_status st = y ? nb_autograd_grad(y, dy, n, leaves, grads, 0) : nb_last_status();
  NBT_CHECK(y && st == NB_OK, "%s f64 R=%lld D=%lld layout %d: %s", op, (long long)R, (long long)D,
            layout, nb_last_error());
  if (y && st == NB_OK) {
    double *xv = nbt_f64(x), *dyv = nbt_f64(dy), *wv = w ? nbt_f64(w) : NULL, *bv = b ? nbt_f64(b) : NULL;
    double *ry = malloc((size_t)(R * D) * sizeof *ry), *rdx = malloc((size_t)(R * D) * sizeof *rdx);
    double *rdw = malloc((size_t)D * sizeof *rdw), *rdb = malloc((size_t)D * sizeof *rdb);
    double scale[4];
    norm_ref_rows(R, D, xv, wv, bv, dyv, 1e-5, rms, ry, rdx, rdw, rdb, scale);
    const char *what[4] = {"y", "dx", "dw", "db"};
    const nb_tensor *got[4] = {y, grads[0], grads[1], grads[2]};
    const double *ref[4] = {ry, rdx, rdw, rdb};
    for (int k = 0; k < (affine ? (rms ? 3 : 4) : 2); k++) {
      int64_t m = k < 2 ? R * D : D;
      double *gv = got[k] ? nbt_f64(got[k]) : NULL;
      double r = gv ? norm_ref_ratio(gv, ref[k], m, scale[k], max_rel) : INFINITY;
      NBT_CHECK(r <= 1.0, "%s f64 R=%lld D=%lld layout %d%s: %s off the long double reference "
                "(worst %.3g of the tolerance %g)", op, (long long)R, (long long)D, layout,
                affine ? " affine" : "", what[k], r, NORM_REF_TOL);
      free(gv);
    }
    free(xv); free(dyv); free(wv); free(bv);
    free(ry); free(rdx); free(rdw); free(rdb);
  }
  nb_scope_end();
}

#endif
