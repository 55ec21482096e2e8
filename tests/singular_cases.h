/* Gradients at singular points, as PyTorch defines them (docs/ARCHITECTURE.md,
 * "Conventions at singular points"), checked on any device and float dtype:
 * shared by test_singular (the CPU, in CI) and test_cuda_accuracy (section
 * "singular", the GPU). Each case is d sum(f(x)) / dx at small inputs that
 * sit on the singular points; the singular values (0, +-inf, NaN, the even
 * split of a tie) are asserted exactly, the others within the dtype's
 * rounding of a float64 formula. */
#ifndef NB_TEST_SINGULAR_CASES_H
#define NB_TEST_SINGULAR_CASES_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef nb_tensor *(*sg_fn)(const nb_tensor *x, double p);

/* Relative tolerance of the non-singular expected values per dtype. */
static double sg_rtol(nb_dtype dt) {
  return dt == NB_F64 ? 1e-13 : dt == NB_F32 ? 2e-6 : dt == NB_F16 ? 4e-3 : 3e-2;
}

/* The value want rounded to dt (what an exact result of dtype dt holds). */
static double sg_in_dtype(double want, nb_dtype dt) {
  if (dt == NB_F64 || !isfinite(want)) return want;
  nb_tensor *t = nb_scalar(want, dt, NB_DEVICE_CPU);
  double v = nb_item(t);
  return v;
}

/* Checks d sum(f(x, p)) / dx on dev in dt against want (n values): exact
 * where want is 0, +-inf, NaN or exact[i] == 'e', else within sg_rtol. */
static void sg_check(const char *name, nb_device dev, nb_dtype dt, sg_fn f, double p, int nd,
                     const int64_t *shape, const double *xv, const double *want, const char *exact) {
  nb_scope_begin();
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  nb_tensor *x = nb_to_device(nb_cast(nb_from_buffer(xv, nd, shape, NB_F64, NB_DEVICE_CPU), dt), dev);
  nb_tensor *g = NULL;
  nb_status st = x ? nb_set_requires_grad(x, 1) : nb_last_status();
  nb_tensor *y = st ? NULL : f(x, p);
  if (y) st = nb_autograd_grad(nb_sum(y, 0, NULL, 0), NULL, 1, &x, &g, 0);
  NBT_CHECK(y && !st && g, "%s [%s]: %s", name, nb_dtype_name(dt), nb_last_error());
  double *gv = y && !st && g ? nbt_f64(g) : NULL;
  for (int64_t i = 0; gv && i < n; i++) {
    double w = want[i], v = gv[i];
    int ok;
    if (isnan(w)) ok = isnan(v);
    else if (w == 0 || isinf(w) || (exact && exact[i] == 'e')) ok = v == sg_in_dtype(w, dt);
    else ok = fabs(v - w) <= sg_rtol(dt) * fabs(w);
    NBT_CHECK(ok, "%s [%s]: d/dx[%lld] = %.17g, expected %.17g%s", name, nb_dtype_name(dt),
              (long long)i, v, w, isnan(w) || w == 0 || isinf(w) || (exact && exact[i] == 'e') ? " exactly" : "");
  }
  free(gv);
  nb_clear_error();
  nb_scope_end();
}

/* The gradient of sum(d sum(f(x)) / dx), through create_graph: finite at
 * the singular points (the masked branches never form inf or NaN). */
static void sg_check_second(const char *name, nb_device dev, nb_dtype dt, sg_fn f, double p,
                            int nd, const int64_t *shape, const double *xv) {
  nb_scope_begin();
  nb_tensor *x = nb_to_device(nb_cast(nb_from_buffer(xv, nd, shape, NB_F64, NB_DEVICE_CPU), dt), dev);
  nb_tensor *g = NULL, *gg = NULL;
  nb_status st = x ? nb_set_requires_grad(x, 1) : nb_last_status();
  nb_tensor *y = st ? NULL : f(x, p);
  if (y) st = nb_autograd_grad(nb_sum(y, 0, NULL, 0), NULL, 1, &x, &g, 1);
  if (y && !st && g) st = nb_autograd_grad(nb_sum(g, 0, NULL, 0), NULL, 1, &x, &gg, 0);
  NBT_CHECK(y && !st && g, "%s second derivative [%s]: %s", name, nb_dtype_name(dt), nb_last_error());
  double *v = gg ? nbt_f64(gg) : NULL;
  int finite = 1;
  for (int64_t i = 0; v && i < nb_numel(x); i++) finite &= isfinite(v[i]) != 0;
  NBT_CHECK(!gg || finite, "%s second derivative [%s]: not finite", name, nb_dtype_name(dt));
  free(v);
  nb_clear_error();
  nb_scope_end();
}

/* ---- the functions ---------------------------------------------------------- */
static const int sg_axis1[1] = {1};
static nb_tensor *sg_std(const nb_tensor *x, double c) { return nb_std(x, 1, sg_axis1, c, 0); }
static nb_tensor *sg_std_all(const nb_tensor *x, double c) { return nb_std(x, 0, NULL, c, 0); }
static nb_tensor *sg_var(const nb_tensor *x, double c) { return nb_var(x, 1, sg_axis1, c, 0); }
static nb_tensor *sg_norm(const nb_tensor *x, double p) { return nb_norm(x, p, 1, sg_axis1, 0); }
static nb_tensor *sg_norm_keep(const nb_tensor *x, double p) { return nb_norm(x, p, 1, sg_axis1, 1); }
static nb_tensor *sg_max(const nb_tensor *x, double p) { (void)p; return nb_max(x, 1, sg_axis1, 0); }
static nb_tensor *sg_min(const nb_tensor *x, double p) { (void)p; return nb_min(x, 1, sg_axis1, 0); }
static nb_tensor *sg_max_all(const nb_tensor *x, double p) { (void)p; return nb_max(x, 0, NULL, 0); }
static nb_tensor *sg_maximum(const nb_tensor *x, double s) { return nb_maximum_scalar(x, s); }
static nb_tensor *sg_minimum(const nb_tensor *x, double s) { return nb_minimum_scalar(x, s); }
static nb_tensor *sg_clamp(const nb_tensor *x, double p) { (void)p; return nb_clamp(x, -1, 1); }
static nb_tensor *sg_pow(const nb_tensor *x, double p) { return nb_pow_scalar(x, p); }
/* d/db of a^b at the base a = p (x is the exponent) */
static nb_tensor *sg_pow_exp(const nb_tensor *x, double a) {
  return nb_pow(nb_full(nb_ndim(x), nb_shape(x), a, nb_dtype_of(x), nb_device_of(x)), x);
}
static nb_tensor *sg_lse(const nb_tensor *x, double p) { (void)p; return nb_logsumexp(x, 1, sg_axis1, 0); }
static nb_tensor *sg_pool(const nb_tensor *x, double p) { (void)p; return nb_max_pool2d(x, 2, 2, 2, 2, 0, 0); }
#define SG_UNARY(name, call) \
  static nb_tensor *sg_##name(const nb_tensor *x, double p) { (void)p; return call(x); }
SG_UNARY(sqrt, nb_sqrt)
SG_UNARY(rsqrt, nb_rsqrt)
SG_UNARY(log, nb_log)
SG_UNARY(reciprocal, nb_reciprocal)
SG_UNARY(abs, nb_abs)
SG_UNARY(relu, nb_relu)
SG_UNARY(sign, nb_sign)
SG_UNARY(floor, nb_floor)
SG_UNARY(round, nb_round)

/* ---- the cases ---------------------------------------------------------------- */

/* std, var and norm: rows on their singular points next to ordinary rows. */
static void sg_reductions(nb_device dev, nb_dtype dt) {
  const int64_t s24[2] = {2, 4}, s23[2] = {2, 3}, s3[1] = {3}, s14[2] = {1, 4};
  /* std of equal values: 0 (PyTorch masks grad / (2 std) where std == 0) */
  const double xs[8] = {2, 2, 2, 2, 1, 2, 3, 4};
  double sd = sqrt(5.0 / 3.0), ws[8] = {0, 0, 0, 0};
  for (int j = 0; j < 4; j++) ws[4 + j] = (xs[4 + j] - 2.5) / (3 * sd);
  sg_check("std of an equal row", dev, dt, sg_std, 1.0, 2, s24, xs, ws, NULL);
  const double xe[3] = {-3, -3, -3}, z3[3] = {0, 0, 0};
  sg_check("std of equal values, all axes, correction 0", dev, dt, sg_std_all, 0.0, 1, s3, xe, z3, NULL);
  double wv[8] = {0, 0, 0, 0};
  for (int j = 0; j < 4; j++) wv[4 + j] = 2 * (xs[4 + j] - 2.5) / 3;
  sg_check("var of an equal row", dev, dt, sg_var, 1.0, 2, s24, xs, wv, NULL);
  /* norm p = 2 of a zero row: 0; of (3, 4, 0): x / 5 */
  const double xn[6] = {0, 0, 0, 3, 4, 0}, wn[6] = {0, 0, 0, 0.6, 0.8, 0};
  sg_check("norm p=2 of a zero row", dev, dt, sg_norm, 2.0, 2, s23, xn, wn, NULL);
  sg_check("norm p=2 keepdim of a zero row", dev, dt, sg_norm_keep, 2.0, 2, s23, xn, wn, NULL);
  /* p = 1: sign(x), sign(0) = 0 */
  const double x1[4] = {0, -2, 3, 0}, w1[4] = {0, -1, 1, 0};
  sg_check("norm p=1 at 0", dev, dt, sg_norm, 1.0, 2, s14, x1, w1, "eeee");
  /* p = inf: sign(x) g split evenly among the |x| at the max; 0 in a zero row */
  const double xi[8] = {3, -3, 1, 0, 0, 0, 0, 0}, wi[8] = {0.5, -0.5, 0, 0, 0, 0, 0, 0};
  sg_check("norm p=inf ties and a zero row", dev, dt, sg_norm, INFINITY, 2, s24, xi, wi, "eeeeeeee");
  /* other p: 0 where x == 0 and in a zero row; sign(x) |x|^(p-1) / norm^(p-1) elsewhere */
  const double ps[3] = {3.0, 0.5, 1.5}, xp[6] = {0, 0, 0, 0, 1, -2};
  for (int k = 0; k < 3; k++) {
    double p = ps[k], nrm = pow(1 + pow(2, p), 1 / p), wp[6] = {0, 0, 0, 0, 0, 0};
    for (int j = 4; j < 6; j++) wp[j] = (xp[j] > 0 ? 1 : -1) * pow(fabs(xp[j]), p - 1) / pow(nrm, p - 1);
    char name[64];
    snprintf(name, sizeof name, "norm p=%g at 0 and of a zero row", p);
    sg_check(name, dev, dt, sg_norm, p, 2, s23, xp, wp, NULL);
  }
  /* the gradients of these gradients stay finite there */
  sg_check_second("std of an equal row", dev, dt, sg_std, 1.0, 2, s24, xs);
  sg_check_second("norm p=2 of a zero row", dev, dt, sg_norm, 2.0, 2, s23, xn);
  sg_check_second("norm p=0.5 at 0", dev, dt, sg_norm, 0.5, 2, s23, xp);
}

/* Elementwise ops at 0 and at ties. */
static void sg_elementwise(nb_device dev, nb_dtype dt) {
  const int64_t s1[1] = {1}, s2[1] = {2}, s3[1] = {3}, s5[1] = {5};
  const double x0[1] = {0}, inf1[1] = {INFINITY}, ninf1[1] = {-INFINITY};
  const double x04[2] = {0, 4}, wsq[2] = {INFINITY, 0.25};
  sg_check("sqrt at 0: +inf", dev, dt, sg_sqrt, 0, 1, s2, x04, wsq, NULL);
  sg_check("rsqrt at 0: -inf", dev, dt, sg_rsqrt, 0, 1, s1, x0, ninf1, NULL);
  sg_check("log at 0: +inf", dev, dt, sg_log, 0, 1, s1, x0, inf1, NULL);
  sg_check("reciprocal at 0: -inf", dev, dt, sg_reciprocal, 0, 1, s1, x0, ninf1, NULL);
  const double xa[3] = {0, -1, 2}, wa[3] = {0, -1, 1}, wr[3] = {0, 0, 1}, z3[3] = {0, 0, 0};
  sg_check("abs at 0: 0", dev, dt, sg_abs, 0, 1, s3, xa, wa, "eee");
  sg_check("relu at 0: 0", dev, dt, sg_relu, 0, 1, s3, xa, wr, "eee");
  sg_check("sign: 0", dev, dt, sg_sign, 0, 1, s3, xa, z3, NULL);
  sg_check("floor: 0", dev, dt, sg_floor, 0, 1, s3, xa, z3, NULL);
  sg_check("round: 0", dev, dt, sg_round, 0, 1, s3, xa, z3, NULL);
  /* maximum / minimum with a tie: half each */
  const double xm[3] = {1, 2, 3}, wmax[3] = {0, 0.5, 1}, wmin[3] = {1, 0.5, 0};
  sg_check("maximum tie: 1/2", dev, dt, sg_maximum, 2.0, 1, s3, xm, wmax, "eee");
  sg_check("minimum tie: 1/2", dev, dt, sg_minimum, 2.0, 1, s3, xm, wmin, "eee");
  /* clamp passes the gradient at its bounds */
  const double xc[5] = {-1, 0, 1, 2, -2}, wc[5] = {1, 1, 1, 0, 0};
  sg_check("clamp at its bounds: 1", dev, dt, sg_clamp, 0, 1, s5, xc, wc, "eeeee");
  /* pow(x, p) at x = 0: p 0 gives 0 (not 0 * inf), 0.5 +inf, 1 one, 2 zero, -1 -inf */
  const double wp0[2] = {0, 0}, wph[2] = {INFINITY, 0.25}, x02[2] = {0, 2}, wm1[2] = {-INFINITY, -0.25};
  const double one1[1] = {1}, zero1[1] = {0};
  sg_check("pow(x, 0) at 0: 0", dev, dt, sg_pow, 0.0, 1, s2, x04, wp0, NULL);
  sg_check("pow(x, 0.5) at 0: +inf", dev, dt, sg_pow, 0.5, 1, s2, x04, wph, NULL);
  sg_check("pow(x, 1) at 0: 1", dev, dt, sg_pow, 1.0, 1, s1, x0, one1, "e");
  sg_check("pow(x, 2) at 0: 0", dev, dt, sg_pow, 2.0, 1, s1, x0, zero1, NULL);
  sg_check("pow(x, -1) at 0: -inf", dev, dt, sg_pow, -1.0, 1, s2, x02, wm1, "ee");
  /* d(0^b)/db: 0 for b >= 0, -inf for b < 0 (a^b log a) */
  const double xb[3] = {0, 2, -1}, wb[3] = {0, 0, -INFINITY};
  sg_check("pow(0, b) in b", dev, dt, sg_pow_exp, 0.0, 1, s3, xb, wb, NULL);
  double w2[3];
  for (int j = 0; j < 3; j++) w2[j] = pow(2, xb[j]) * log(2);
  sg_check("pow(2, b) in b", dev, dt, sg_pow_exp, 2.0, 1, s3, xb, w2, NULL);
  sg_check_second("pow(x, 0) at 0", dev, dt, sg_pow, 0.0, 1, s2, x04);
}

/* Reductions with ties: max/min split evenly (PyTorch's amax/amin);
 * max_pool2d gives the window's first maximum; logsumexp of a row of -inf
 * is NaN, as in PyTorch. */
static void sg_ties(nb_device dev, nb_dtype dt) {
  const int64_t s24[2] = {2, 4}, s22[2] = {2, 2}, sp[4] = {1, 1, 2, 4};
  const double xt[8] = {1, 3, 3, 2, 5, 5, 5, 5}, wt[8] = {0, 0.5, 0.5, 0, 0.25, 0.25, 0.25, 0.25};
  sg_check("max ties: even split", dev, dt, sg_max, 0, 2, s24, xt, wt, "eeeeeeee");
  const double xn[8] = {2, 1, 1, 3, 5, 5, 5, 5};
  sg_check("min ties: even split", dev, dt, sg_min, 0, 2, s24, xn, wt, "eeeeeeee");
  const double wa[8] = {0, 0, 0, 0, 0.25, 0.25, 0.25, 0.25};
  sg_check("max over all axes: even split", dev, dt, sg_max_all, 0, 2, s24, xt, wa, "eeeeeeee");
  const double xq[8] = {1, 1, 2, 0, 1, 1, 2, 2}, wq[8] = {1, 0, 1, 0, 0, 0, 0, 0};
  sg_check("max_pool2d ties: the first maximum", dev, dt, sg_pool, 0, 4, sp, xq, wq, "eeeeeeee");
  const double xl[4] = {-INFINITY, -INFINITY, 0, 0}, wl[4] = {NAN, NAN, 0.5, 0.5};
  sg_check("logsumexp of a row of -inf: NaN", dev, dt, sg_lse, 0, 2, s22, xl, wl, "eeee");
}

static void sg_run_all(nb_device dev, nb_dtype dt) {
  sg_reductions(dev, dt);
  sg_elementwise(dev, dt);
  sg_ties(dev, dt);
}

#endif
