/* Accuracy checks against float64 (long double) host references, shared by
 * test_accuracy (the CPU, in ctest) and test_cuda_accuracy (a GPU). Each
 * check runs on the device acc_dev and prints its largest measured error as
 * a Markdown table row, so the "Accuracy" tables of docs/ARCHITECTURE.md can
 * be refreshed from one run.
 *
 * acc_elementwise: every float unary and binary op in f64/f32/f16/bf16 over
 * dense sweeps (sin/cos also near 1e3), forward in ulps of the result and
 * gradient in ulps of the gradient's largest term (|g| for tanh, whose
 * 1 - y^2 cancels: any implementation of the rule has that error), against
 * the exact derivative. Tolerances: CUDA's documented maximum errors (CUDA
 * Programming Guide, "Mathematical Functions": expf 2 ulp, logf/log1pf/
 * expm1f 1, sinf/cosf 2, tanhf 2, rsqrtf 2, powf 4, erfcf 4; f64: exp/log/
 * tanh/rsqrt 1, sin/cos/pow 2, erfc 5) plus 0.5 for the rounding they are
 * measured from; 16-bit types compute in f32 and round once (0.5 ulp).
 * Composite ops (sigmoid, silu, GELU, softplus) get the sum of their parts;
 * GELU also an allowance of kc times its condition number |x f'(x) / f(x)|
 * (|x f''/f'| for the gradient), for the rounding of its scaled argument
 * (x / sqrt 2: kc 2; k (x + 0.044715 x^3), a few roundings: kc 4).
 *
 * acc_rows: log_softmax, softmax and cross_entropy at logits near 1e3 and
 * offset by 500, forward and gradients, in f32 and f64, relative to the
 * float64 result. */
#ifndef NB_TESTS_ACCURACY_H
#define NB_TESTS_ACCURACY_H
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static nb_device acc_dev;

/* ---- ulps -------------------------------------------------------------------- */
static int acc_prec(nb_dtype dt) { return dt == NB_F64 ? 53 : dt == NB_F32 ? 24 : dt == NB_F16 ? 11 : 8; }
static int acc_emin(nb_dtype dt) { return dt == NB_F64 ? -1022 : dt == NB_F16 ? -14 : -126; }
/* The spacing of dt's values at v (subnormal spacing below the normal range). */
static long double acc_ulp(long double v, nb_dtype dt) {
  int e = v == 0 ? acc_emin(dt) : (int)floorl(log2l(fabsl(v)));
  if (e < acc_emin(dt)) e = acc_emin(dt);
  return ldexpl(1.0L, e - acc_prec(dt) + 1);
}
static const char *acc_dname(nb_dtype dt) { return nb_dtype_name(dt); }

/* n values of dt (as exact doubles) from f64 values v: v rounded to dt. */
static nb_tensor *acc_tensor(const double *v, int64_t n, nb_dtype dt, double *exact) {
  nb_tensor *t = nb_cast(nb_from_buffer(v, 1, &n, NB_F64, NB_DEVICE_CPU), dt);
  double *e = nbt_f64(t);
  memcpy(exact, e, (size_t)n * sizeof *e);
  free(e);
  return nb_to_device(t, acc_dev);
}

/* Sweep of n points over [lo, hi] (log-spaced when logsp, lo, hi > 0), the
 * grid shifted off round numbers, then 1/4 of them random in the range. */
static void acc_sweep(double *v, int64_t n, double lo, double hi, int logsp, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    double u;
    if (i % 4 == 3) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      u = (double)(s >> 11) / 9007199254740992.0;
    } else {
      u = ((double)i + 0.3183098861837907) / (double)n;
    }
    v[i] = logsp ? exp(log(lo) + u * (log(hi) - log(lo))) : lo + u * (hi - lo);
  }
}

/* ---- unary ops --------------------------------------------------------------------- */
typedef long double ld;
static ld r_sig(ld x) { return 1.0L / (1.0L + expl(-x)); }
static ld r_neg(ld x) { return -x; }
static ld d_neg(ld x) { return -1; }
static ld r_abs(ld x) { return fabsl(x); }
static ld d_abs(ld x) { return x > 0 ? 1 : x < 0 ? -1 : 0; }
static ld d_one(ld x) { return 1; }
static ld r_exp(ld x) { return expl(x); }
static ld r_log(ld x) { return logl(x); }
static ld d_log(ld x) { return 1 / x; }
static ld r_log1p(ld x) { return log1pl(x); }
static ld d_log1p(ld x) { return 1 / (1 + x); }
static ld r_expm1(ld x) { return expm1l(x); }
static ld s_expm1(ld x) { return expl(x) > 1 ? expl(x) : 1; }
static ld r_sqrt(ld x) { return sqrtl(x); }
static ld d_sqrt(ld x) { return 0.5L / sqrtl(x); }
static ld r_rsqrt(ld x) { return 1 / sqrtl(x); }
static ld d_rsqrt(ld x) { return -0.5L / (x * sqrtl(x)); }
static ld r_square(ld x) { return x * x; }
static ld d_square(ld x) { return 2 * x; }
static ld r_recip(ld x) { return 1 / x; }
static ld d_recip(ld x) { return -1 / (x * x); }
static ld r_sin(ld x) { return sinl(x); }
static ld r_cos(ld x) { return cosl(x); }
static ld d_cos(ld x) { return -sinl(x); }
static ld r_tanh(ld x) { return tanhl(x); }
static ld d_tanh(ld x) { ld t = tanhl(x); return 1 - t * t; }
static ld d_sig(ld x) { ld s = r_sig(x); return s * (1 - s); }
static ld s_sig(ld x) { return r_sig(x); }
static ld r_relu(ld x) { return x > 0 ? x : 0; }
static ld d_relu(ld x) { return x > 0 ? 1 : 0; }
static ld r_gelu(ld x) { return 0.5L * x * erfcl(-x * 0.70710678118654752440L); }
static ld d_gelu(ld x) {
  return 0.5L * erfcl(-x * 0.70710678118654752440L) + x * 0.39894228040143267794L * expl(-0.5L * x * x);
}
static ld s_gelu(ld x) {
  return (0.5L * erfcl(-x * 0.70710678118654752440L) + fabsl(x) * 0.39894228040143267794L * expl(-0.5L * x * x));
}
#define ACC_GK 0.79788456080286535588L
/* 0.5 (1 + tanh u) = s = 1 / (1 + e^(-2u)) and 1 - s = e^(-2u) s: no
 * cancellation in the reference either */
static ld gt_s(ld x, ld *e) {
  *e = expl(-2 * ACC_GK * (x + 0.044715L * x * x * x));
  return 1 / (1 + *e);
}
static ld r_gelu_t(ld x) { ld e; return x * gt_s(x, &e); }
static ld d_gelu_t(ld x) {
  ld e, s = gt_s(x, &e);
  return s + 2 * x * s * (e * s) * ACC_GK * (1 + 0.134145L * x * x);
}
static ld s_gelu_t(ld x) {
  ld e, s = gt_s(x, &e);
  return s + fabsl(2 * x * s * (e * s) * ACC_GK * (1 + 0.134145L * x * x));
}
static ld r_silu(ld x) { return x * r_sig(x); }
static ld d_silu(ld x) { ld s = r_sig(x); return s * (1 + x * (1 - s)); }
static ld s_silu(ld x) { ld s = r_sig(x); return s * (1 + fabsl(x)); }
static ld r_softplus(ld x) { return (x > 0 ? x : 0) + log1pl(expl(-fabsl(x))); }
static ld r_floor(ld x) { return floorl(x); }
static ld r_round(ld x) { return nearbyintl(x); }
static ld d_zero(ld x) { return 0; }

typedef struct {
  const char *name;
  nb_tensor *(*f)(const nb_tensor *);
  ld (*ref)(ld), (*dref)(ld), (*gscale)(ld); /* gscale NULL: |dref| */
  double lo, hi, hlo, hhi; /* sweep; hlo/hhi for f16 (its range is small) */
  int logsp;
  double tol64, tol32, tol16; /* forward, ulps (tol16: f16 and bf16) */
  double gtol64, gtol32, gtol16; /* gradient, ulps of |g| gscale */
  double kc; /* allowance per unit of the relative condition number */
} acc_uop;

static nb_tensor *acc_gelu_t(const nb_tensor *x) { return nb_gelu_tanh(x); }

static const acc_uop ACC_UOPS[] = {
  {"neg", nb_neg, r_neg, d_neg, NULL, -100, 100, -100, 100, 0, 0, 0, 0, 0, 0, 0, 0},
  {"abs", nb_abs, r_abs, d_abs, NULL, -100, 100, -100, 100, 0, 0, 0, 0, 0, 0, 0, 0},
  {"exp", nb_exp, r_exp, r_exp, NULL, -80, 80, -9, 10, 0, 1.5, 2.5, 0.51, 2, 3, 1.5, 0},
  {"log", nb_log, r_log, d_log, NULL, 1e-3, 1e4, 1e-3, 1e4, 1, 1.5, 1.5, 0.51, 1, 1, 1, 0},
  {"log1p", nb_log1p, r_log1p, d_log1p, NULL, -0.99, 100, -0.99, 100, 0, 1.5, 1.5, 0.51, 2, 2, 1.5, 0},
  {"expm1", nb_expm1, r_expm1, r_exp, s_expm1, -20, 20, -9, 10, 0, 1.5, 1.5, 0.51, 2, 2, 2, 0},
  {"sqrt", nb_sqrt, r_sqrt, d_sqrt, NULL, 1e-3, 1e4, 1e-3, 1e4, 1, 0.5, 0.5, 0.51, 1.5, 1.5, 1.5, 0},
  {"rsqrt", nb_rsqrt, r_rsqrt, d_rsqrt, NULL, 1e-3, 1e4, 1e-3, 1e4, 1, 1.5, 2.5, 0.51, 6, 8, 4, 0},
  {"square", nb_square, r_square, d_square, NULL, -100, 100, -100, 100, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0},
  {"reciprocal", nb_reciprocal, r_recip, d_recip, NULL, 1e-2, 1e2, 1e-2, 1e2, 1, 0.5, 0.5, 0.5, 3, 3, 3, 0},
  {"sin", nb_sin, r_sin, r_cos, NULL, -10, 10, -10, 10, 0, 2.5, 2.5, 0.51, 3, 3, 1.5, 0},
  {"sin@1e3", nb_sin, r_sin, r_cos, NULL, 990, 1010, 990, 1010, 0, 2.5, 2.5, 0.51, 3, 3, 1.5, 0},
  {"cos", nb_cos, r_cos, d_cos, NULL, -10, 10, -10, 10, 0, 2.5, 2.5, 0.51, 3, 3, 1.5, 0},
  {"cos@1e3", nb_cos, r_cos, d_cos, NULL, 990, 1010, 990, 1010, 0, 2.5, 2.5, 0.51, 3, 3, 1.5, 0},
  {"tanh", nb_tanh, r_tanh, d_tanh, d_one, -10, 10, -10, 10, 0, 2.5, 2.5, 0.51, 3, 3, 2, 0},
  {"sigmoid", nb_sigmoid, r_sig, d_sig, s_sig, -30, 30, -15, 15, 0, 2.5, 3.5, 0.51, 4, 4, 3, 0},
  {"relu", nb_relu, r_relu, d_relu, d_one, -100, 100, -100, 100, 0, 0, 0, 0, 0, 0, 0, 0},
  {"gelu", nb_gelu, r_gelu, d_gelu, s_gelu, -10, 10, -6, 10, 0, 8, 6, 0.51, 8, 6, 3, 2},
  {"gelu_tanh", acc_gelu_t, r_gelu_t, d_gelu_t, s_gelu_t, -10, 10, -4, 10, 0, 4, 5, 0.51, 6, 6, 3, 4},
  /* silu's f64 gradient: 3.9 ulp measured in the CPU's optimised build, 4.03 in a -O0
   * build (other contraction of the derivative's three terms): bound 5 */
  {"silu", nb_silu, r_silu, d_silu, s_silu, -30, 30, -10, 15, 0, 3, 4, 0.51, 5, 5, 3, 0},
  {"softplus", nb_softplus, r_softplus, r_sig, NULL, -30, 30, -10, 15, 0, 3, 3.5, 0.51, 4, 4, 2, 0},
  {"floor", nb_floor, r_floor, d_zero, d_one, -100, 100, -100, 100, 0, 0, 0, 0, 0, 0, 0, 0},
  {"round", nb_round, r_round, d_zero, d_one, -100, 100, -100, 100, 0, 0, 0, 0, 0, 0, 0, 0},
};

static double acc_tol(nb_dtype dt, double t64, double t32, double t16) {
  return dt == NB_F64 ? t64 : dt == NB_F32 ? t32 : t16;
}

/* |x f'(x) / f(x)|, from the references. */
static ld acc_cond(const acc_uop *o, ld x) {
  ld y = o->ref(x);
  return y == 0 ? 0 : fabsl(x * o->dref(x) / y);
}
/* |x f''(x) / f'(x)|, f'' by a central difference of dref. */
static ld acc_dcond(const acc_uop *o, ld x) {
  ld h = 1e-6L * (fabsl(x) > 1e-3L ? fabsl(x) : 1e-3L), d = o->dref(x);
  return d == 0 ? 0 : fabsl(x * (o->dref(x + h) - o->dref(x - h)) / (2 * h) / d);
}

/* One unary op in one dtype: forward and gradient (upstream g in
 * [0.5, 1.5)), the worst errors in ulps and in multiples of the tolerance. */
static void acc_unary_one(const acc_uop *o, nb_dtype dt, int64_t n) {
  double *v = malloc((size_t)n * sizeof *v), *x = malloc((size_t)n * sizeof *x);
  double *gv = malloc((size_t)n * sizeof *gv), *g = malloc((size_t)n * sizeof *g);
  int half = dt == NB_F16;
  acc_sweep(v, n, half ? o->hlo : o->lo, half ? o->hhi : o->hi, o->logsp, 11);
  acc_sweep(gv, n, 0.5, 1.5, 0, 12);
  nb_scope_begin();
  nb_tensor *xt = acc_tensor(v, n, dt, x), *gt = acc_tensor(gv, n, dt, g);
  nb_set_requires_grad(xt, 1);
  nb_tensor *y = o->f(xt);
  nb_status st = y ? nb_backward(y, gt) : nb_last_status();
  double *yh = nbt_f64(y), *dx = nbt_f64(nb_grad(xt));
  double tol = acc_tol(dt, o->tol64, o->tol32, o->tol16), gtol = acc_tol(dt, o->gtol64, o->gtol32, o->gtol16);
  double worst = 0, gworst = 0, ratio = 0, gratio = 0;
  int64_t wi = 0, gi = 0;
  for (int64_t i = 0; i < n; i++) {
    ld r = o->ref(x[i]), dr = g[i] * o->dref(x[i]);
    ld sc = g[i] * (o->gscale ? o->gscale(x[i]) : fabsl(o->dref(x[i])));
    double e = (double)(fabsl(yh[i] - r) / acc_ulp(r, dt));
    double ge = (double)(fabsl(dx[i] - dr) / acc_ulp(sc, dt));
    if (isnan(yh[i]) != isnan((double)r)) e = INFINITY;
    if (isnan(dx[i])) ge = INFINITY;
    double lim = tol + o->kc * (double)acc_cond(o, x[i]) * (dt == NB_F64 || dt == NB_F32 ? 1 : 0);
    double glim = gtol + o->kc * (double)acc_dcond(o, x[i]) * (dt == NB_F64 || dt == NB_F32 ? 1 : 0);
    if (e > worst) worst = e;
    if (ge > gworst) gworst = ge;
    if (e / (lim > 0 ? lim : 1e-300) > ratio) { ratio = e / (lim > 0 ? lim : 1e-300); wi = i; }
    if (ge / (glim > 0 ? glim : 1e-300) > gratio) { gratio = ge / (glim > 0 ? glim : 1e-300); gi = i; }
  }
  printf("| %-10s | %-4s | %8.3g | %8.3g |\n", o->name, acc_dname(dt), worst, gworst);
  NBT_CHECK(st == NB_OK && ratio <= 1, "%s [%s] forward: %.3g ulp at x = %.17g (got %.17g, want %.17Lg; tol %g)",
            o->name, acc_dname(dt), worst, x[wi], yh[wi], o->ref(x[wi]), tol);
  NBT_CHECK(st == NB_OK && gratio <= 1, "%s [%s] gradient: %.3g ulp at x = %.17g (got %.17g, want %.17Lg; tol %g)",
            o->name, acc_dname(dt), gworst, x[gi], dx[gi], g[gi] * o->dref(x[gi]), gtol);
  free(yh);
  free(dx);
  nb_scope_end();
  free(v);
  free(x);
  free(gv);
  free(g);
}

/* Every unary op in every float dtype. */
static void acc_unary_all(int64_t n) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  printf("| unary op   | type | fwd ulp  | grad ulp |\n|---|---|---|---|\n");
  for (size_t k = 0; k < sizeof ACC_UOPS / sizeof *ACC_UOPS; k++)
    for (int d = 0; d < 4; d++) acc_unary_one(&ACC_UOPS[k], dts[d], n);
}

/* ---- binary ops ----------------------------------------------------------------------- */
enum { ACC_ADD, ACC_SUB, ACC_MUL, ACC_DIV, ACC_POW, ACC_MAX, ACC_MIN };
typedef struct {
  const char *name;
  int op;
  nb_tensor *(*f)(const nb_tensor *, const nb_tensor *);
  double tol64, tol32, tol16, gtol64, gtol32, gtol16;
} acc_bop;
static const acc_bop ACC_BOPS[] = {
  {"add", ACC_ADD, nb_add, 0.5, 0.5, 0.5, 0, 0, 0},
  {"sub", ACC_SUB, nb_sub, 0.5, 0.5, 0.5, 0, 0, 0},
  {"mul", ACC_MUL, nb_mul, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5},
  {"div", ACC_DIV, nb_div, 0.5, 0.5, 0.5, 2, 2, 2},
  {"pow", ACC_POW, nb_pow, 2.5, 4.5, 0.51, 4, 7, 3},
  {"maximum", ACC_MAX, nb_maximum, 0, 0, 0, 0, 0, 0},
  {"minimum", ACC_MIN, nb_minimum, 0, 0, 0, 0, 0, 0},
};

/* Forward value and both partial derivatives (times g) of one binary op;
 * bm1 is b - 1 as the pow rule forms it (rounded to the dtype). */
static void acc_bref(int op, ld a, ld b, ld bm1, ld g, ld *y, ld *ga, ld *gb, ld *sa, ld *sb) {
  switch (op) {
  case ACC_ADD: *y = a + b; *ga = g; *gb = g; break;
  case ACC_SUB: *y = a - b; *ga = g; *gb = -g; break;
  case ACC_MUL: *y = a * b; *ga = g * b; *gb = g * a; break;
  case ACC_DIV: *y = a / b; *ga = g / b; *gb = -g * a / (b * b); break;
  case ACC_POW: *y = powl(a, b); *ga = g * b * powl(a, bm1); *gb = g * powl(a, b) * logl(a); break;
  case ACC_MAX: *y = a > b ? a : b; *ga = a > b ? g : a == b ? g / 2 : 0; *gb = g - *ga; break;
  default: *y = a < b ? a : b; *ga = a < b ? g : a == b ? g / 2 : 0; *gb = g - *ga; break;
  }
  *sa = fabsl(*ga);
  *sb = fabsl(*gb);
}

static void acc_binary_one(const acc_bop *o, nb_dtype dt, int64_t n) {
  double *va = malloc((size_t)n * sizeof(double)), *vb = malloc((size_t)n * sizeof(double));
  double *vg = malloc((size_t)n * sizeof(double)), *a = malloc((size_t)n * sizeof(double));
  double *b = malloc((size_t)n * sizeof(double)), *g = malloc((size_t)n * sizeof(double));
  int half = dt == NB_F16;
  if (o->op == ACC_POW) {
    acc_sweep(va, n, half ? 0.1 : 0.01, half ? 10 : 100, 1, 21);
    acc_sweep(vb, n, half ? -3 : -4, half ? 3 : 4, 0, 22);
  } else if (o->op == ACC_DIV) {
    acc_sweep(va, n, -100, 100, 0, 23);
    acc_sweep(vb, n, half ? 0.1 : 0.01, 100, 1, 24);
    for (int64_t i = 0; i < n; i += 2) vb[i] = -vb[i];
  } else {
    acc_sweep(va, n, -100, 100, 0, 25);
    acc_sweep(vb, n, -100, 100, 0, 26);
    for (int64_t i = 0; i < n; i += 7) vb[i] = va[i]; /* ties for maximum/minimum */
  }
  for (int64_t i = 0; i < n; i++) vb[i] = i % 13 == 5 ? vb[i] : vb[(i * 7919) % n]; /* unsorted pairs */
  acc_sweep(vg, n, 0.5, 1.5, 0, 27);
  nb_scope_begin();
  nb_tensor *at = acc_tensor(va, n, dt, a), *bt = acc_tensor(vb, n, dt, b), *gt = acc_tensor(vg, n, dt, g);
  nb_set_requires_grad(at, 1);
  nb_set_requires_grad(bt, 1);
  nb_tensor *y = o->f(at, bt);
  nb_status st = y ? nb_backward(y, gt) : nb_last_status();
  double *yh = nbt_f64(y), *da = nbt_f64(nb_grad(at)), *db = nbt_f64(nb_grad(bt));
  double tol = acc_tol(dt, o->tol64, o->tol32, o->tol16), gtol = acc_tol(dt, o->gtol64, o->gtol32, o->gtol16);
  double worst = 0, gworst = 0;
  int64_t wi = 0, gi = 0;
  double *bm1 = malloc((size_t)n * sizeof(double)); /* b - 1 rounded to dt, as pow's rule forms it */
  for (int64_t i = 0; i < n; i++) bm1[i] = b[i] - 1.0;
  double *bm1r = nbt_f64(nb_cast(nb_from_buffer(bm1, 1, &n, NB_F64, NB_DEVICE_CPU), dt));
  for (int64_t i = 0; i < n; i++) {
    ld y, ga, gb, sa, sb;
    acc_bref(o->op, a[i], b[i], bm1r[i], g[i], &y, &ga, &gb, &sa, &sb);
    double e = (double)(fabsl(yh[i] - y) / acc_ulp(y, dt));
    double ge = (double)fmaxl(fabsl(da[i] - ga) / acc_ulp(sa, dt), fabsl(db[i] - gb) / acc_ulp(sb, dt));
    if (isnan(yh[i])) e = INFINITY;
    if (isnan(da[i]) || isnan(db[i])) ge = INFINITY;
    if (e > worst) { worst = e; wi = i; }
    if (ge > gworst) { gworst = ge; gi = i; }
  }
  printf("| %-10s | %-4s | %8.3g | %8.3g |\n", o->name, acc_dname(dt), worst, gworst);
  NBT_CHECK(st == NB_OK && worst <= tol, "%s [%s] forward: %.3g ulp at (%.17g, %.17g) (got %.17g; tol %g)",
            o->name, acc_dname(dt), worst, a[wi], b[wi], yh[wi], tol);
  NBT_CHECK(st == NB_OK && gworst <= gtol, "%s [%s] gradient: %.3g ulp at (%.17g, %.17g) (got %.17g, %.17g; tol %g)",
            o->name, acc_dname(dt), gworst, a[gi], b[gi], da[gi], db[gi], gtol);
  free(yh);
  free(da);
  free(db);
  free(bm1);
  free(bm1r);
  nb_scope_end();
  free(va);
  free(vb);
  free(vg);
  free(a);
  free(b);
  free(g);
}

static void acc_binary_all(int64_t n) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  printf("| binary op  | type | fwd ulp  | grad ulp |\n|---|---|---|---|\n");
  for (size_t k = 0; k < sizeof ACC_BOPS / sizeof *ACC_BOPS; k++)
    for (int d = 0; d < 4; d++) acc_binary_one(&ACC_BOPS[k], dts[d], n);
}

/* ---- row ops at large logits --------------------------------------------------------------- */
static double acc_eps(nb_dtype dt) { return ldexp(1.0, 1 - acc_prec(dt)); }

/* Normal draws (Box-Muller on a fixed LCG). */
static double acc_randn(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  double u1 = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  double u2 = (double)(*s >> 11) / 9007199254740992.0;
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* log_softmax (log_ = 1) or softmax of x = z + b over rows of D, z (R, D)
 * ~ N(0, sd) (stored transposed when tr: the strided kernels), b (R, 1) =
 * base broadcast along the row; upstream w ~ N(0, 1). Checks y, dz and db
 * (exactly 0 for log_softmax: sum_j (w_j - p_j sum w)) against long double. */
static void acc_softmax_case(const char *what, int log_, nb_dtype dt, int64_t R, int64_t D,
                             double base, double sd, int tr) {
  int64_t n = R * D, shz[2] = {tr ? D : R, tr ? R : D}, shb[2] = {R, 1}, sh[2] = {R, D};
  double *vz = malloc((size_t)n * sizeof(double)), *z = malloc((size_t)n * sizeof(double));
  double *vw = malloc((size_t)n * sizeof(double)), *w = malloc((size_t)n * sizeof(double));
  double *vb = malloc((size_t)R * sizeof(double)), *b = malloc((size_t)R * sizeof(double));
  uint64_t s = 1234 + (uint64_t)D;
  for (int64_t i = 0; i < n; i++) vz[i] = sd * acc_randn(&s);
  for (int64_t i = 0; i < n; i++) vw[i] = acc_randn(&s);
  for (int64_t r = 0; r < R; r++) vb[r] = base * (r % 3 == 2 ? -1 : 1);
  nb_scope_begin();
  nb_tensor *zt = acc_tensor(vz, n, dt, z), *wt = acc_tensor(vw, n, dt, w), *bt = acc_tensor(vb, R, dt, b);
  zt = nb_reshape(zt, 2, shz);
  bt = nb_reshape(bt, 2, shb);
  nb_tensor *zl = nb_to_device(zt, acc_dev), *bl = nb_to_device(bt, acc_dev); /* fresh leaves */
  nb_set_requires_grad(zl, 1);
  nb_set_requires_grad(bl, 1);
  nb_tensor *x = nb_add(tr ? nb_transpose(zl, 0, 1) : zl, bl);
  nb_tensor *y = log_ ? nb_log_softmax(x, 1) : nb_softmax(x, 1);
  nb_status st = y ? nb_backward(y, nb_reshape(wt, 2, sh)) : nb_last_status();
  double *yh = nbt_f64(y), *dz = nbt_f64(nb_grad(zl)), *db = nbt_f64(nb_grad(bl));
  double eps = acc_eps(dt), ey = 0, eg = 0, eb = 0;
  ld *xr = malloc((size_t)D * sizeof(ld));
  for (int64_t r = 0; r < R; r++) {
    ld m = -INFINITY, S = 0, W = 0, WP = 0, AW = 0, absg = 0, gsum = 0, q = sqrtl((ld)D);
    for (int64_t j = 0; j < D; j++) { /* x as the device forms it: z + b rounded to dt */
      int64_t iz = tr ? j * R + r : r * D + j;
      double xv = z[iz] + b[r];
      xv = dt == NB_F32 ? (double)(float)xv : xv;
      xr[j] = xv;
      if (xr[j] > m) m = xr[j];
    }
    for (int64_t j = 0; j < D; j++) S += expl(xr[j] - m);
    for (int64_t j = 0; j < D; j++) {
      ld p = expl(xr[j] - m) / S;
      W += w[r * D + j];
      AW += fabsl(w[r * D + j]);
      WP += w[r * D + j] * p;
    }
    for (int64_t j = 0; j < D; j++) {
      int64_t iz = tr ? j * R + r : r * D + j;
      ld lp = (xr[j] - m) - logl(S), p = expl(lp), yr = log_ ? lp : p, wj = w[r * D + j];
      /* scales: each element's own terms (p |sum w| |log p| for log_softmax's
       * exp of a rounded log-probability), plus sqrt(D) times the terms that
       * go into the row's sums, for their rounding */
      ld g = log_ ? wj - p * W : p * (wj - WP);
      ld sc = log_ ? fabsl(wj) + p * (fabsl(W) * (fabsl(lp) > 1 ? fabsl(lp) : 1) + q * AW)
                   : p * (fabsl(wj) + fabsl(WP) + q * AW);
      ld ys = log_ ? (fabsl(yr) > 1 ? fabsl(yr) : 1) + q : yr * (1 + q);
      double e1 = (double)(fabsl(yh[r * D + j] - yr) / (eps * ys));
      double e2 = (double)(fabsl(dz[iz] - g) / (eps * sc));
      if (!(e1 <= ey)) ey = e1;
      if (!(e2 <= eg)) eg = e2;
      absg += sc;
      gsum += g;
    }
    double e3 = (double)(fabsl(db[r] - gsum) / (eps * absg));
    if (!(e3 <= eb)) eb = e3;
  }
  printf("| %-24s | %-4s | %8.3g | %8.3g | %8.3g |\n", what, acc_dname(dt), ey, eg, eb);
  /* bounds in units of the dtype's epsilon: y relative to max(|y|, 1) (log)
   * or |y| (softmax), dz relative to the terms of its formula, db relative
   * to the sum of those over the row; each with sqrt(D) times the terms
   * summed over the row (the sums' rounding) */
  NBT_CHECK(st == NB_OK && ey <= 4, "%s [%s] forward: error %.3g eps (bound 4)", what, acc_dname(dt), ey);
  NBT_CHECK(st == NB_OK && eg <= 8, "%s [%s] gradient: error %.3g eps (bound 8)", what, acc_dname(dt), eg);
  NBT_CHECK(st == NB_OK && eb <= 2, "%s [%s] broadcast gradient: error %.3g eps (bound 2)", what, acc_dname(dt), eb);
  free(xr);
  free(yh);
  free(dz);
  free(db);
  nb_scope_end();
  free(vz);
  free(z);
  free(vw);
  free(w);
  free(vb);
  free(b);
}

/* cross_entropy (mean, ignore_index -100 on every 9th row) of logits base +
 * N(0, 2) over C classes, label smoothing eps_s; with grad the fused
 * training kernel runs (loss and dlogits), without it the forward-only one. */
static void acc_xent_case(const char *what, nb_dtype dt, int64_t N, int64_t C, double base,
                          double eps_s, int grad) {
  int64_t n = N * C, sh[2] = {N, C};
  double *vx = malloc((size_t)n * sizeof(double)), *x = malloc((size_t)n * sizeof(double));
  int64_t *t = malloc((size_t)N * sizeof *t);
  uint64_t s = 99 + (uint64_t)C;
  for (int64_t i = 0; i < n; i++) vx[i] = base + 2 * acc_randn(&s);
  for (int64_t r = 0; r < N; r++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[r] = r % 9 == 4 ? -100 : (int64_t)((s >> 33) % (uint64_t)C);
  }
  nb_scope_begin();
  nb_tensor *xt = nb_reshape(acc_tensor(vx, n, dt, x), 2, sh);
  nb_tensor *xl = nb_to_device(xt, acc_dev), *tt = nb_from_buffer(t, 1, &N, NB_I64, acc_dev);
  if (grad) nb_set_requires_grad(xl, 1);
  nb_tensor *loss = nb_cross_entropy(xl, tt, NB_REDUCE_MEAN, -100, eps_s);
  nb_status st = loss ? (grad ? nb_backward(loss, NULL) : NB_OK) : nb_last_status();
  double l = loss ? nb_item(loss) : NAN, *dx = grad ? nbt_f64(nb_grad(xl)) : NULL;
  ld lref = 0;
  int64_t nv = 0;
  for (int64_t r = 0; r < N; r++) nv += t[r] != -100;
  double eps = acc_eps(dt), eg = 0, num = 0, den = 0;
  for (int64_t r = 0; r < N; r++) {
    const double *xr = x + r * C;
    ld m = -INFINITY, S = 0, sd = 0;
    for (int64_t j = 0; j < C; j++) if (xr[j] > m) m = xr[j];
    for (int64_t j = 0; j < C; j++) { S += expl(xr[j] - m); sd += xr[j] - m; }
    int valid = t[r] != -100;
    if (valid) lref += (1 - eps_s) * ((m - xr[t[r]]) + logl(S)) + eps_s * (logl(S) - sd / C);
    for (int64_t j = 0; grad && j < C; j++) {
      ld p = expl(xr[j] - m) / S, q = (j == t[r] ? 1 - eps_s : 0) + eps_s / C;
      ld g = valid ? (p - q) / nv : 0, sc = valid ? (p * (1 + 2 * sqrtl((ld)C)) + q) / nv : 0;
      double e = sc > 0 ? (double)(fabsl(dx[r * C + j] - g) / (eps * sc)) : dx[r * C + j] != 0 ? INFINITY : 0;
      if (!(e <= eg)) eg = e;
      num += (double)((dx[r * C + j] - g) * (dx[r * C + j] - g));
      den += (double)(g * g);
    }
  }
  lref /= nv;
  double el = (double)(fabsl(l - lref) / (eps * fabsl(lref))), rel = grad ? sqrt(num / den) : 0;
  printf("| %-24s | %-4s | %8.3g | %8.3g | %8.3g |\n", what, acc_dname(dt), el, eg, rel / eps);
  /* loss relative to itself; dlogits per element relative to (p (1 + 2
   * sqrt(C)) + q) / N_valid (q the smoothed target; sqrt(C) for the row
   * sum's rounding), and as a whole (Frobenius), in eps of the dtype */
  NBT_CHECK(st == NB_OK && el <= 4, "%s [%s] loss %.17g, want %.17Lg: error %.3g eps (bound 4)",
            what, acc_dname(dt), l, lref, el);
  NBT_CHECK(st == NB_OK && eg <= 8, "%s [%s] dlogits: error %.3g eps (bound 8)", what, acc_dname(dt), eg);
  NBT_CHECK(st == NB_OK && rel <= 8 * eps, "%s [%s] dlogits: relative error %.3g (bound 8 eps)",
            what, acc_dname(dt), rel);
  free(dx);
  nb_scope_end();
  free(vx);
  free(x);
  free(t);
}

/* The row-op cases: logits near 1e3 and offset by 500 (and a control at
 * 0), every kernel path: strided rows, contiguous rows (fast path), and for
 * cross_entropy the general, register-resident and streaming fused kernels
 * and the forward-only one. */
static void acc_rows_all(void) {
  static const nb_dtype dts[] = {NB_F64, NB_F32};
  printf("| log_softmax / softmax    | type | y (eps)  | dx (eps) | db (eps) |\n|---|---|---|---|---|\n");
  for (int d = 0; d < 2; d++)
    for (int log_ = 1; log_ >= 0; log_--) {
      nb_dtype dt = dts[d];
      const char *nm = log_ ? "log_softmax" : "softmax";
      char w[64];
      snprintf(w, sizeof w, "%s 1e3 D=257", nm);
      acc_softmax_case(w, log_, dt, 24, 257, 1000, 1, 0);
      snprintf(w, sizeof w, "%s 1e3 D=1024", nm);
      acc_softmax_case(w, log_, dt, 24, 1024, 1000, 1, 0);
      snprintf(w, sizeof w, "%s +500 D=1000 strided", nm);
      acc_softmax_case(w, log_, dt, 24, 1000, 500, 2, 1);
      snprintf(w, sizeof w, "%s 0 D=1024", nm);
      acc_softmax_case(w, log_, dt, 24, 1024, 0, 2, 0);
    }
  printf("| cross_entropy            | type | loss     | dx (eps) | dx Frob  |\n|---|---|---|---|---|\n");
  static const struct { const char *w; int64_t N, C; double base, sm; int grad; } xc[] = {
    {"xent 1e3 C=257", 40, 257, 1000, 0, 1}, {"xent 1e3 C=1024 ls=0.1", 40, 1024, 1000, 0.1, 1},
    {"xent +500 C=4000", 20, 4000, 500, 0, 1}, {"xent 1e3 C=50304", 6, 50304, 1000, 0, 1},
    {"xent 1e3 C=1024 fwd", 40, 1024, 1000, 0.1, 0}, {"xent +500 C=257 fwd", 40, 257, 500, 0, 0},
    {"xent 0 C=1024", 40, 1024, 0, 0.1, 1},
  };
  for (int d = 0; d < 2; d++)
    for (size_t k = 0; k < sizeof xc / sizeof *xc; k++)
      acc_xent_case(xc[k].w, dts[d], xc[k].N, xc[k].C, xc[k].base, xc[k].sm, xc[k].grad);
}
#endif
