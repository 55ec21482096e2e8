/* The CPU backend's transcendental functions: f32 accuracy over a dense
 * sweep of the float range against long double libm (the stated bound of
 * cpu_vmath.h: below 1 ulp of the exact value), the same bits for an
 * element wherever it lies (vector body, scalar remainder, strided tile,
 * any thread count), and softplus in f64 and f32 near its old threshold of
 * 20, forward and gradient. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/cpu/cpu_kernels.h"
#include "testutil.h"

typedef long double LD;

/* ---- long double references: the exact functions, in forms without
 * cancellation ------------------------------------------------------------ */
#define GK 0.797884560802865355879892119868763737L /* sqrt(2 / pi) */
#define GC 0.044715L
#define SQRT1_2 0.707106781186547524400844362104849039L
#define INV_SQRT2PI 0.398942280401432677939946059934381868L

static void sig2(LD x, LD *s, LD *sc) {
  LD a = expl(-fabsl(x)), big = 1 / (1 + a), small = a * big;
  *s = x >= 0 ? big : small;
  *sc = x >= 0 ? small : big;
}
static LD r_exp(LD x) { return expl(x); }
static LD r_expm1(LD x) { return expm1l(x); }
static LD r_log(LD x) { return logl(x); }
static LD r_log1p(LD x) { return log1pl(x); }
static LD r_tanh(LD x) { return tanhl(x); }
static LD r_sigmoid(LD x) { return 1 / (1 + expl(-x)); }
static LD r_silu(LD x) { return x / (1 + expl(-x)); }
static LD r_silu_d(LD x) {
  LD s, sc;
  sig2(x, &s, &sc);
  return s + x * s * sc;
}
static LD r_softplus(LD x) { return log1pl(expl(-fabsl(x))) + (x > 0 ? x : 0); }
static LD r_gelu_tanh(LD x) { return x / (1 + expl(-2 * GK * x * (1 + GC * x * x))); }
static LD r_gelu_tanh_d(LD x) {
  LD s, sc, x2 = x * x;
  sig2(2 * GK * x * (1 + GC * x2), &s, &sc);
  return s + x * 2 * GK * (1 + 3 * GC * x2) * s * sc;
}
static LD r_gelu_erf(LD x) { return 0.5L * x * erfcl(-x * SQRT1_2); }
static LD r_gelu_erf_d(LD x) {
  return 0.5L * erfcl(-x * SQRT1_2) + x * INV_SQRT2PI * expl(-0.5L * x * x);
}

typedef struct {
  const char *name;
  nb_uop op;
  LD (*ref)(LD);
} vm_case;

static const vm_case CASES[] = {
  {"exp", NB_UOP_EXP, r_exp},
  {"expm1", NB_UOP_EXPM1, r_expm1},
  {"log", NB_UOP_LOG, r_log},
  {"log1p", NB_UOP_LOG1P, r_log1p},
  {"tanh", NB_UOP_TANH, r_tanh},
  {"sigmoid", NB_UOP_SIGMOID, r_sigmoid},
  {"silu", NB_UOP_SILU, r_silu},
  {"silu_d", NB_UOP_SILU_D, r_silu_d},
  {"softplus", NB_UOP_SOFTPLUS, r_softplus},
  {"gelu_tanh", NB_UOP_GELU_TANH, r_gelu_tanh},
  {"gelu_tanh_d", NB_UOP_GELU_TANH_D, r_gelu_tanh_d},
  {"gelu_erf", NB_UOP_GELU_ERF, r_gelu_erf},
  {"gelu_erf_d", NB_UOP_GELU_ERF_D, r_gelu_erf_d},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

/* Error of got in ulps of a binary format with p significand bits and
 * smallest normal exponent emin, at the exact value ref (rounded: ref in
 * that format); 0 when both are the same NaN/inf, 1e9 for a wrong NaN or
 * inf. */
static double ulp_err(LD got, LD ref, LD rounded, int p, int emin) {
  if (isnan(ref)) return isnan(got) ? 0 : 1e9;
  if (isinf(rounded)) return got == rounded ? 0 : 1e9;
  if (isnan(got) || isinf(got)) return 1e9;
  LD a = fabsl(ref), u = ldexpl(1, emin - p + 1);
  if (a >= ldexpl(1, emin)) {
    int e;
    frexpl(a, &e);
    u = ldexpl(1, e - p);
  }
  return (double)(fabsl(got - ref) / u);
}
static double ulp_err_f(float got, LD ref) { return ulp_err(got, ref, (float)ref, 24, -126); }
static double ulp_err_d(double got, LD ref) { return ulp_err(got, ref, (double)ref, 53, -1022); }

static nb_kview vec_view(void *data, nb_dtype dt, int64_t n, int64_t stride) {
  nb_kview v;
  memset(&v, 0, sizeof v);
  v.data = data;
  v.dtype = dt;
  v.ndim = 1;
  v.shape[0] = n;
  v.strides[0] = stride;
  return v;
}

static float f_of_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The inputs: every 4099th float bit pattern (both signs, denormals, huge,
 * inf, NaN), 2^19 + 1 evenly spaced points of [-16, 16] (where the
 * functions bend), and
 * the edges: zeros, the smallest and largest denormal and normal, the
 * overflow and underflow thresholds of exp and expm1, tanh's saturation,
 * softplus's old threshold, log1p's pole and GELU's minimum. */
static float *make_inputs(int64_t *n_out) {
  static const float edges[] = {
    0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1.fffffcp-127f, 0x1p-126f, -0x1p-126f, FLT_MAX,
    -FLT_MAX, INFINITY, -INFINITY, NAN, 88.72283f, 88.72284f, 88.7229f, 89.0f, -87.33654f,
    -87.33655f, -103.27893f, -103.97208f, -103.972084f, -104.0f, 9.010913f, -9.010913f, 20.0f,
    19.999998f, 20.000002f, -20.0f, -1.0f, -0.99999994f, -1.0000001f, 1e-30f, -1e-30f,
    -0.7517916f, 0.5f, -0.5f, 1.0f, 2.0f, 0.34657359f, -0.34657359f, 1e10f, -1e10f, 16777216.0f,
  };
  int64_t cap = (((int64_t)1 << 32) / 4099 + 1) + (1 << 19) + 1 + 64 + 3 * 65600, n = 0;
  float *x = malloc((size_t)cap * sizeof *x);
  for (uint64_t b = 0; b < ((uint64_t)1 << 32); b += 4099) x[n++] = f_of_bits((uint32_t)b);
  for (int64_t i = 0; i <= (1 << 19); i++) x[n++] = (float)(-16.0 + 32.0 * (double)i / (1 << 19));
  for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++) x[n++] = edges[k];
  /* every float within 2^-9 of the derivatives' zeros (silu_d, gelu_*_d),
   * where their terms cancel */
  static const float zeros[] = {-1.2784645f, -0.7524614f, -0.7517915f};
  for (int z = 0; z < 3; z++)
    for (float v = zeros[z] - 0x1p-9f; v <= zeros[z] + 0x1p-9f; v = nextafterf(v, 1.0f)) x[n++] = v;
  *n_out = n;
  return x;
}

/* Max ulp error of each f32 function through the dense kernel path. */
static void test_f32_accuracy(const float *x, int64_t n) {
  float *y = malloc((size_t)n * sizeof *y);
  nb_kview vx = vec_view((void *)x, NB_F32, n, 1), vy = vec_view(y, NB_F32, n, 1);
  for (int c = 0; c < N_CASES; c++) {
    nb_status st = nb_cpu_unary(CASES[c].op, &vy, &vx);
    NBT_CHECK(st == NB_OK, "%s: status %d", CASES[c].name, (int)st);
    double worst = 0;
    float at = 0;
    int64_t not_cr = 0;
    for (int64_t i = 0; i < n; i++) {
      LD ref = CASES[c].ref((LD)x[i]);
      double e = ulp_err_f(y[i], ref);
      if (e > worst) worst = e, at = x[i];
      if (y[i] != (float)ref && !(isnan(y[i]) && isnan(ref))) not_cr++;
    }
    printf("f32 %-12s max error %.3f ulp (at %a), %lld of %lld not correctly rounded\n",
           CASES[c].name, worst, (double)at, (long long)not_cr, (long long)n);
    NBT_CHECK(worst <= 1.0, "f32 %s: %.3f ulp at x = %a (bound: 1 ulp)", CASES[c].name, worst,
              (double)at);
  }
  free(y);
}

/* An element's bits do not depend on its place: runs of every length 1..40
 * at every offset mod 16 (vector body, masked or scalar remainder), a
 * strided view (the tile path), in place, and 1 against 3 threads. */
static void test_f32_bits(const float *x, int64_t n) {
  int64_t m = n < 200000 ? n : 200000;
  float *ref = malloc((size_t)m * sizeof *ref), *y = malloc((size_t)m * sizeof *y);
  float *strided = malloc((size_t)m * 2 * sizeof *strided);
  nb_kview vx = vec_view((void *)x, NB_F32, m, 1), vr = vec_view(ref, NB_F32, m, 1);
  for (int c = 0; c < N_CASES; c++) {
    const char *nm = CASES[c].name;
    int bad_runs = 0, bad_strided = 0, bad_inplace = 0, bad_threads = 0;
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    nb_cpu_unary(CASES[c].op, &vr, &vx);
    for (int64_t off = 0; off < 16; off++)
      for (int64_t len = 1; len <= 40; len++) {
        int64_t o = off + 997 * len;
        nb_kview a = vec_view((void *)(x + o), NB_F32, len, 1), b = vec_view(y, NB_F32, len, 1);
        nb_cpu_unary(CASES[c].op, &b, &a);
        bad_runs += memcmp(y, ref + o, (size_t)len * sizeof *y) != 0;
      }
    for (int64_t i = 0; i < m; i++) strided[2 * i] = x[i];
    nb_kview sx = vec_view(strided, NB_F32, m, 2), vy = vec_view(y, NB_F32, m, 1);
    nb_cpu_unary(CASES[c].op, &vy, &sx);
    bad_strided = memcmp(y, ref, (size_t)m * sizeof *y) != 0;
    memcpy(y, x, (size_t)m * sizeof *y);
    nb_cpu_unary(CASES[c].op, &vy, &vy);
    bad_inplace = memcmp(y, ref, (size_t)m * sizeof *y) != 0;
#ifdef _OPENMP
    omp_set_num_threads(3);
    nb_cpu_unary(CASES[c].op, &vy, &vx);
    bad_threads = memcmp(y, ref, (size_t)m * sizeof *y) != 0;
    omp_set_num_threads(threads);
#endif
    NBT_CHECK(!bad_runs, "%s: %d short runs differ from the long run's bits", nm, bad_runs);
    NBT_CHECK(!bad_strided, "%s: the strided path's bits differ", nm);
    NBT_CHECK(!bad_inplace, "%s: in place, the bits differ", nm);
    NBT_CHECK(!bad_threads, "%s: 3 threads give other bits than 1", nm);
  }
  free(ref);
  free(y);
  free(strided);
}

/* ---- softplus near 20 and elsewhere, f64 and f32, forward and gradient -- */
static LD r_sigmoid_l(LD x) { return 1 / (1 + expl(-x)); }

static void softplus_points(double *x, int n) {
  for (int i = 0; i < n; i++) {
    if (i < n / 2) x[i] = 20.0 + (i - n / 4) * 1e-3; /* 19.75 .. 20.25 */
    else x[i] = -40.0 + (i - n / 2) * (80.0 / (n - n / 2)); /* -40 .. 40 */
  }
}

static void test_softplus(void) {
  enum { N = 1000 };
  double xs[N];
  softplus_points(xs, N);
  static const nb_dtype dts[] = {NB_F64, NB_F32};
  for (int d = 0; d < 2; d++) {
    nb_dtype dt = dts[d];
    int64_t shape[1] = {N};
    float xf[N];
    for (int i = 0; i < N; i++) xf[i] = (float)xs[i];
    nb_tensor *x = nb_from_buffer(dt == NB_F64 ? (const void *)xs : (const void *)xf, 1, shape,
                                  dt, NB_DEVICE_CPU);
    nb_set_requires_grad(x, 1);
    nb_tensor *y = nb_softplus(x);
    nb_tensor *g = nb_ones(1, shape, dt, NB_DEVICE_CPU);
    nb_status st = nb_backward(y, g);
    NBT_CHECK(y && st == NB_OK, "softplus %s: forward and backward run", nb_dtype_name(dt));
    if (!y || st != NB_OK) continue;
    double *yv = nbt_f64(y), *gv = nbt_f64(nb_grad(x));
    double wf = 0, wg = 0, atf = 0, atg = 0;
    for (int i = 0; i < N; i++) {
      LD xi = dt == NB_F64 ? (LD)xs[i] : (LD)xf[i];
      double ef = dt == NB_F64 ? ulp_err_d(yv[i], r_softplus(xi))
                               : ulp_err_f((float)yv[i], r_softplus(xi));
      double eg = dt == NB_F64 ? ulp_err_d(gv[i], r_sigmoid_l(xi))
                               : ulp_err_f((float)gv[i], r_sigmoid_l(xi));
      if (ef > wf) wf = ef, atf = (double)xi;
      if (eg > wg) wg = eg, atg = (double)xi;
    }
    printf("softplus %s: forward max %.3f ulp (at %.17g), gradient max %.3f ulp (at %.17g)\n",
           nb_dtype_name(dt), wf, atf, wg, atg);
    /* f64: libm's exp and log1p (about 1 ulp each) and one addition */
    double bound = dt == NB_F64 ? 4.0 : 1.0;
    NBT_CHECK(wf <= bound, "softplus %s forward: %.3f ulp at x = %.17g (bound %g)",
              nb_dtype_name(dt), wf, atf, bound);
    NBT_CHECK(wg <= bound, "softplus %s gradient: %.3f ulp at x = %.17g (bound %g)",
              nb_dtype_name(dt), wg, atg, bound);
    free(yv);
    free(gv);
    nb_release(g);
    nb_release(y);
    nb_release(x);
  }
}

int main(void) {
  int64_t n;
  float *x = make_inputs(&n);
  test_f32_accuracy(x, n);
  test_f32_bits(x, n);
  test_softplus();
  free(x);
  return nbt_finish();
}
