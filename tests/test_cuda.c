/* Every op on CUDA against the CPU backend (not in ctest: `make test-cuda`
 * on a GPU machine). Random inputs with odd sizes, transposed, sliced and
 * broadcast views, in f32, f16, bf16 (and f64 where cheap); forward results
 * and gradients through nb_backward are compared with the CPU's within the
 * tolerances of tol() below. Also: casts (f64 to f16/bf16 at and next to
 * ties included), Philox draws and dropout masks bit for bit, an
 * out-of-range index on the GPU is an error, a 1 PB allocation is
 * NB_ERR_OOM and the process goes on, caching-allocator statistics, and
 * deterministic reductions and embedding gradients repeat bit for bit.
 * NABLA_TEST_QUICK=1 shrinks sizes (for compute-sanitizer).
 * NABLA_TEST_ONLY=text runs only the sections whose name contains text.
 * NABLA_TEST_SELF=1 runs the comparisons CPU against CPU (checks the test
 * program itself on a machine without a GPU; device-only checks skipped). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "backend/backend.h" /* section "fast paths": adamw_multi */
#include "core/core.h"

static nb_device G;
static int quick;

/* Tolerances per dtype (relative, absolute): compute is f32 on both sides
 * for the half types, so they differ by about one rounding of the result;
 * f32 differs by the GPU's fast-math transcendental functions and
 * summation order. */
static void tol(nb_dtype dt, double *rtol, double *atol) {
  switch (dt) {
  case NB_F64: *rtol = 1e-10; *atol = 1e-10; break;
  case NB_F32: *rtol = 2e-4; *atol = 2e-5; break;
  case NB_F16: *rtol = 1e-2; *atol = 2e-3; break;
  case NB_BF16: *rtol = 4e-2; *atol = 1e-2; break;
  default: *rtol = 0; *atol = 0; break;
  }
}

static const nb_dtype FLOATS[] = {NB_F32, NB_F16, NB_BF16};

static nb_tensor *gpu(const nb_tensor *t) { return nb_to_device(t, G); }

/* Compares a CUDA result with the CPU's, tolerance scaled by scale. */
static void cmp(const char *name, nb_dtype dt, const nb_tensor *cpu, const nb_tensor *cu,
                double scale) {
  if (!cpu || !cu) {
    NBT_CHECK(0, "%s [%s]: %s result is NULL (%s)", name, nb_dtype_name(dt), cpu ? "cuda" : "cpu",
              nb_last_error());
    nb_clear_error();
    return;
  }
  int same = nb_ndim(cpu) == nb_ndim(cu) && nb_dtype_of(cpu) == nb_dtype_of(cu);
  for (int d = 0; same && d < nb_ndim(cpu); d++) same = nb_size(cpu, d) == nb_size(cu, d);
  if (!same) {
    char b1[200], b2[200];
    NBT_CHECK(0, "%s: cpu %s vs cuda %s", name, nb_describe(cpu, b1, sizeof b1),
              nb_describe(cu, b2, sizeof b2));
    return;
  }
  double rtol, atol;
  tol(dt, &rtol, &atol);
  double *a = nbt_f64(cu), *b = nbt_f64(cpu);
  double r = nbt_close_ratio(a, b, nb_numel(cpu), rtol * scale, atol * scale);
  NBT_CHECK(r <= 1.0, "%s [%s]: cuda differs from cpu (worst ratio %g)", name, nb_dtype_name(dt), r);
  free(a);
  free(b);
}

/* Exact byte equality of two tensors' row-major contents. */
static void cmp_bits(const char *name, const nb_tensor *cpu, const nb_tensor *cu) {
  if (!cpu || !cu) {
    NBT_CHECK(0, "%s: NULL result (%s)", name, nb_last_error());
    nb_clear_error();
    return;
  }
  size_t n = (size_t)nb_numel(cpu) * nb_dtype_size(nb_dtype_of(cpu));
  char *a = malloc(n + 1), *b = malloc(n + 1);
  int ok = !nb_to_host(cpu, a, n) && !nb_to_host(cu, b, n) && !memcmp(a, b, n);
  NBT_CHECK(ok, "%s: cuda bits differ from cpu bits (%s)", name, nb_last_error());
  free(a);
  free(b);
}

static nb_tensor *randn(uint64_t seed, int nd, const int64_t *shape, nb_dtype dt) {
  return nbt_randn(seed, nd, shape, dt);
}

/* Three layouts of one (r, c) operand: contiguous, transposed, sliced. */
static nb_tensor *layout(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int kind) {
  if (kind == 1) return nb_transpose(randn(seed, 2, (int64_t[]){c, r}, dt), 0, 1);
  if (kind == 2) return nb_slice(randn(seed, 2, (int64_t[]){r, 2 * c + 1}, dt), 1, 1, 2 * c + 1, 2);
  return randn(seed, 2, (int64_t[]){r, c}, dt);
}
static const char *const LAYOUT[] = {"contiguous", "transposed", "sliced"};

/* ---- elementwise ---------------------------------------------------------- */
typedef nb_tensor *(*un_fn)(const nb_tensor *);
static const struct { const char *name; un_fn f; int positive; } UNARY[] = {
  {"neg", nb_neg, 0}, {"abs", nb_abs, 0}, {"exp", nb_exp, 0}, {"log", nb_log, 1},
  {"log1p", nb_log1p, 1}, {"expm1", nb_expm1, 0}, {"sqrt", nb_sqrt, 1}, {"rsqrt", nb_rsqrt, 1},
  {"square", nb_square, 0}, {"reciprocal", nb_reciprocal, 1}, {"sin", nb_sin, 0},
  {"cos", nb_cos, 0}, {"tanh", nb_tanh, 0}, {"sigmoid", nb_sigmoid, 0}, {"relu", nb_relu, 0},
  {"gelu", nb_gelu, 0}, {"gelu_tanh", nb_gelu_tanh, 0}, {"silu", nb_silu, 0},
  {"softplus", nb_softplus, 0}, {"sign", nb_sign, 0}, {"floor", nb_floor, 0},
  {"ceil", nb_ceil, 0}, {"round", nb_round, 0},
};

static void test_unary(void) {
  int64_t R = quick ? 7 : 37, C = quick ? 9 : 53;
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < 3; k++)
      for (size_t u = 0; u < sizeof UNARY / sizeof *UNARY; u++) {
        nb_scope_begin();
        nb_tensor *x = layout(10 + u, R, C, FLOATS[d], k);
        if (UNARY[u].positive) x = nb_add_scalar(nb_abs(x), 0.5);
        else x = nb_mul_scalar(x, 2.0);
        char name[64];
        snprintf(name, sizeof name, "%s (%s)", UNARY[u].name, LAYOUT[k]);
        /* floor/ceil/round/sign are exact functions: the inputs match, so must they */
        cmp(name, FLOATS[d], UNARY[u].f(x), UNARY[u].f(gpu(x)), 1.0);
        nb_scope_end();
      }
  nb_scope_begin();
  nb_tensor *xi = nbt_randn(3, 2, (int64_t[]){5, 7}, NB_I64);
  cmp("neg i64", NB_I64, nb_neg(xi), nb_neg(gpu(xi)), 1.0);
  cmp("abs i32", NB_I32, nb_abs(nb_cast(xi, NB_I32)), nb_abs(gpu(nb_cast(xi, NB_I32))), 1.0);
  nb_scope_end();
}

typedef nb_tensor *(*bin_fn)(const nb_tensor *, const nb_tensor *);
static const struct { const char *name; bin_fn f; int positive_a; } BINARY[] = {
  {"add", nb_add, 0}, {"sub", nb_sub, 0}, {"mul", nb_mul, 0}, {"div", nb_div, 0},
  {"pow", nb_pow, 1}, {"maximum", nb_maximum, 0}, {"minimum", nb_minimum, 0},
  {"eq", nb_eq, 0}, {"ne", nb_ne, 0}, {"lt", nb_lt, 0}, {"le", nb_le, 0},
  {"gt", nb_gt, 0}, {"ge", nb_ge, 0},
};

static void test_binary(void) {
  int64_t R = quick ? 5 : 33, C = quick ? 11 : 71;
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < 4; k++)
      for (size_t o = 0; o < sizeof BINARY / sizeof *BINARY; o++) {
        nb_scope_begin();
        nb_dtype dt = FLOATS[d];
        nb_tensor *a = layout(100 + o, R, C, dt, k % 3), *b;
        if (k == 3) b = randn(200 + o, 1, (int64_t[]){C}, dt);          /* row broadcast */
        else if (k == 2) b = randn(200 + o, 2, (int64_t[]){R, 1}, dt);  /* column broadcast */
        else b = layout(300 + o, R, C, dt, (k + 1) % 3);
        if (BINARY[o].positive_a) a = nb_add_scalar(nb_abs(a), 0.25);
        if (!strcmp(BINARY[o].name, "eq")) b = nb_where(nb_gt(b, nb_scalar(0, dt, NB_DEVICE_CPU)), b, nb_broadcast_to(a, 2, (int64_t[]){R, C}));
        char name[64];
        snprintf(name, sizeof name, "%s (case %d)", BINARY[o].name, k);
        cmp(name, dt, BINARY[o].f(a, b), BINARY[o].f(gpu(a), gpu(b)), 1.0);
        nb_scope_end();
      }
  nb_scope_begin();
  nb_tensor *ai = nbt_randn(5, 2, (int64_t[]){9, 13}, NB_I64), *bi = nbt_randn(6, 1, (int64_t[]){13}, NB_I64);
  cmp("add i64", NB_I64, nb_add(ai, bi), nb_add(gpu(ai), gpu(bi)), 1.0);
  cmp("mul i32", NB_I32, nb_mul(nb_cast(ai, NB_I32), nb_cast(bi, NB_I32)),
      nb_mul(gpu(nb_cast(ai, NB_I32)), gpu(nb_cast(bi, NB_I32))), 1.0);
  cmp("maximum i64", NB_I64, nb_maximum(ai, bi), nb_maximum(gpu(ai), gpu(bi)), 1.0);
  cmp("div i64 -> f32", NB_F32, nb_div(ai, nb_add_scalar(nb_abs(bi), 1)),
      nb_div(gpu(ai), gpu(nb_add_scalar(nb_abs(bi), 1))), 1.0);
  nb_tensor *x = randn(7, 2, (int64_t[]){17, 23}, NB_F32);
  nb_tensor *c = nb_gt(randn(8, 2, (int64_t[]){17, 1}, NB_F32), nb_scalar(0, NB_F32, NB_DEVICE_CPU));
  nb_tensor *y = randn(9, 1, (int64_t[]){23}, NB_F32);
  cmp("where", NB_F32, nb_where(c, x, y), nb_where(gpu(c), gpu(x), gpu(y)), 1.0);
  cmp("clamp", NB_F32, nb_clamp(x, -0.5, 0.7), nb_clamp(gpu(x), -0.5, 0.7), 1.0);
  nb_scope_end();
}

static void test_copy_cast(void) {
  nb_scope_begin();
  const nb_dtype all[] = {NB_F64, NB_F32, NB_F16, NB_BF16, NB_I64, NB_I32, NB_U8, NB_BOOL};
  nb_tensor *base = nb_mul_scalar(randn(11, 2, (int64_t[]){13, 29}, NB_F64), 40.0);
  for (int k = 0; k < 2; k++) {
    nb_tensor *src = k ? nb_transpose(base, 0, 1) : base;
    for (int i = 0; i < 8; i++)
      for (int j = 0; j < 8; j++) {
        nb_tensor *s = nb_cast(src, all[i]);
        char name[64];
        snprintf(name, sizeof name, "cast %s->%s%s", nb_dtype_name(all[i]), nb_dtype_name(all[j]),
                 k ? " (transposed)" : "");
        nb_tensor *a = nb_cast(s, all[j]), *b = nb_cast(gpu(s), all[j]);
        cmp_bits(name, nb_contiguous(a), nb_contiguous(b));
      }
  }
  /* copy into a strided view of a GPU tensor, broadcasting the source */
  nb_tensor *dst_c = nb_zeros(2, (int64_t[]){6, 10}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *dst_g = gpu(dst_c);
  nb_tensor *row = randn(12, 1, (int64_t[]){5}, NB_F32);
  nb_copy_(nb_slice(dst_c, 1, 0, 10, 2), row);
  nb_copy_(nb_slice(dst_g, 1, 0, 10, 2), gpu(row));
  cmp_bits("copy_ into slice (broadcast)", dst_c, dst_g);
  nb_fill_(nb_slice(dst_c, 0, 1, 6, 3), 2.5);
  nb_fill_(nb_slice(dst_g, 0, 1, 6, 3), 2.5);
  cmp_bits("fill_ slice", dst_c, dst_g);
  cmp("arange f32", NB_F32, nb_arange(-3, 7, 0.37, NB_F32, NB_DEVICE_CPU), nb_arange(-3, 7, 0.37, NB_F32, G), 1.0);
  cmp_bits("arange i64", nb_arange(5, 100, 3, NB_I64, NB_DEVICE_CPU), nb_arange(5, 100, 3, NB_I64, G));
  cmp_bits("full bf16", nb_full(1, (int64_t[]){33}, 1.2345, NB_BF16, NB_DEVICE_CPU),
           nb_full(1, (int64_t[]){33}, 1.2345, NB_BF16, G));
  nb_tensor *parts_c[2] = {randn(13, 2, (int64_t[]){3, 5}, NB_F32), randn(14, 2, (int64_t[]){3, 7}, NB_F32)};
  nb_tensor *parts_g[2] = {gpu(parts_c[0]), gpu(parts_c[1])};
  cmp_bits("cat", nb_cat(2, parts_c, 1), nb_cat(2, parts_g, 1));
  nb_tensor *z = nb_zeros(2, (int64_t[]){0, 5}, NB_F32, G);
  NBT_CHECK(z && nb_numel(nb_sum(z, 0, NULL, 0)) == 1 && nb_item(nb_sum(z, 0, NULL, 0)) == 0,
            "sum of an empty CUDA tensor is 0 (%s)", nb_last_error());
  nb_scope_end();
}

/* ---- f64 -> f16/bf16 rounds once ------------------------------------------
 * Doubles at and just off the ties (midpoints) of the 16-bit type, cast and
 * copied on the GPU, give the CPU's bits (core/half.h rounds once). Through
 * f32 with two nearest roundings, as CUDA converted before, tie * (1 +- 2^-k),
 * k >= 25, is closer to the tie than f32 resolves: it lands on the tie, which
 * then goes to the even neighbour. That is wrong for tie+ when the even one
 * is below (1 + 2^-11 + 2^-40 gave f16 1.0, not 1 + 2^-10) and for tie- when
 * it is above (65520 - tiny gave inf, not 65504; 3 * 2^-25 - tiny gave
 * 2^-23, not 2^-24): a third of these values. (Fast math also flushed the
 * f32 step below 2^-126, so bf16's smallest ties all gave 0.) */
enum { TIE_N = 1515 }; /* 505 ties; viewed as (15, 101) */

static uint64_t tie_rand(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double tie_val(nb_dtype dt, unsigned h) {
  return dt == NB_F16 ? nb_f16_to_f32((uint16_t)h) : nb_bf16_to_f32((uint16_t)h);
}

/* 3 values per tie (exact, above, below) for n / 3 ties between a and a + 1:
 * first 0, 1, 1.0, its successor and the largest finite (whose tie is the
 * overflow threshold), then random a of either sign. */
static void tie_values(nb_dtype dt, double *v, int64_t n) {
  unsigned inf = dt == NB_F16 ? 0x7c00u : 0x7f80u, one = dt == NB_F16 ? 0x3c00u : 0x3f80u;
  unsigned fixed[] = {0, 1, one, one + 1, inf - 1};
  uint64_t s = 42;
  for (int64_t i = 0; i + 3 <= n; i += 3) {
    int rnd = i / 3 >= 5;
    unsigned a = rnd ? (unsigned)(tie_rand(&s) % inf) : fixed[i / 3];
    double lo = tie_val(dt, a), hi = a + 1 == inf ? 2 * lo - tie_val(dt, a - 1) : tie_val(dt, a + 1);
    double t = (lo + hi) / 2, e = ldexp(1.0, rnd ? -25 - (int)(tie_rand(&s) % 28) : -30);
    if (rnd && (tie_rand(&s) & 1)) t = -t;
    v[i] = t;
    v[i + 1] = t * (1 + e);
    v[i + 2] = t * (1 - e);
  }
}

/* The four GPU paths: cast of a contiguous and of a transposed f64 source
 * (the contiguous and the strided convert kernels), copy_ into a contiguous
 * and into a strided destination. */
static nb_tensor *tie_path(int path, const double *v, nb_dtype dt, nb_device dev) {
  nb_tensor *c = nb_from_buffer(v, 1, (int64_t[]){TIE_N}, NB_F64, dev);
  nb_tensor *t = nb_transpose(nb_view(c, 2, (int64_t[]){15, 101}), 0, 1); /* (101, 15) */
  if (path == 0) return nb_cast(c, dt);
  if (path == 1) return nb_cast(t, dt);
  nb_tensor *d = nb_zeros(2, (int64_t[]){101, path == 2 ? 15 : 31}, dt, dev);
  nb_tensor *dv = path == 2 ? d : nb_slice(d, 1, 1, 31, 2);
  return nb_copy_(dv, path == 2 ? nb_view(c, 2, (int64_t[]){101, 15}) : t) == NB_OK ? d : NULL;
}

static void test_cast_ties(void) {
  nb_scope_begin();
  static const char *const what[] = {"cast", "cast (transposed source)", "copy_",
                                     "copy_ (strided source and destination)"};
  double v[TIE_N];
  for (int d = 0; d < 2; d++) {
    nb_dtype dt = d ? NB_BF16 : NB_F16;
    tie_values(dt, v, TIE_N);
    for (int p = 0; p < 4; p++) {
      char name[96];
      snprintf(name, sizeof name, "f64 ties -> %s %s", nb_dtype_name(dt), what[p]);
      cmp_bits(name, tie_path(p, v, dt, NB_DEVICE_CPU), tie_path(p, v, dt, G));
    }
    /* the values catch a conversion through f32 (the old CUDA path): one of
     * each tie's two neighbours */
    uint16_t got[TIE_N];
    int twice = 0;
    NBT_CHECK(nb_to_host(tie_path(0, v, dt, NB_DEVICE_CPU), got, sizeof got) == NB_OK, "%s", nb_last_error());
    for (int i = 0; i < TIE_N; i++)
      twice += got[i] != (dt == NB_F16 ? nb_f32_to_f16((float)v[i]) : nb_f32_to_bf16((float)v[i]));
    NBT_CHECK(twice == TIE_N / 3, "f64 ties -> %s: %d values round differently through f32, not one a tie",
              nb_dtype_name(dt), twice);
  }
  nb_scope_end();
}

/* ---- reductions ----------------------------------------------------------- */
static void test_reduce(void) {
  int64_t s[3] = {5, quick ? 17 : 37, quick ? 13 : 29};
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_dtype dt = FLOATS[d];
    for (int k = 0; k < 2; k++) {
      nb_scope_begin();
      nb_tensor *x = randn(20 + k, 3, s, dt);
      if (k) x = nb_transpose(x, 0, 2);
      nb_tensor *xg = gpu(x);
      const int ax[][2] = {{0, 0}, {1, 0}, {2, 0}, {0, 2}, {1, 2}};
      const int nax[] = {1, 1, 1, 2, 2};
      for (int a = 0; a < 5; a++) {
        char name[64];
        snprintf(name, sizeof name, "sum axes %d,%d n%d layout %d", ax[a][0], ax[a][1], nax[a], k);
        cmp(name, dt, nb_sum(x, nax[a], ax[a], 0), nb_sum(xg, nax[a], ax[a], 0), 4.0);
        snprintf(name, sizeof name, "max axes %d n%d layout %d", ax[a][0], nax[a], k);
        cmp(name, dt, nb_max(x, nax[a], ax[a], 1), nb_max(xg, nax[a], ax[a], 1), 1.0);
        cmp("min", dt, nb_min(x, nax[a], ax[a], 0), nb_min(xg, nax[a], ax[a], 0), 1.0);
        cmp("mean", dt, nb_mean(x, nax[a], ax[a], 0), nb_mean(xg, nax[a], ax[a], 0), 4.0);
      }
      for (int a = 0; a < 3; a++) {
        cmp("argmax", NB_I64, nb_argmax(x, a, 0), nb_argmax(xg, a, 0), 1.0);
        cmp("argmin", NB_I64, nb_argmin(x, a, 1), nb_argmin(xg, a, 1), 1.0);
      }
      cmp("sum all", dt, nb_sum(x, 0, NULL, 0), nb_sum(xg, 0, NULL, 0), 10.0);
      cmp("var", dt, nb_var(x, 1, (int[]){1}, 1.0, 0), nb_var(xg, 1, (int[]){1}, 1.0, 0), 4.0);
      cmp("logsumexp", dt, nb_logsumexp(x, 1, (int[]){2}, 0), nb_logsumexp(xg, 1, (int[]){2}, 0), 2.0);
      nb_scope_end();
    }
  }
  /* a long full reduction: split path, deterministic and atomic */
  nb_scope_begin();
  int64_t n = quick ? 100003 : 3000017;
  nb_tensor *x = randn(30, 1, &n, NB_F32), *xg = gpu(x);
  nb_tensor *ref = nb_sum(nb_cast(x, NB_F64), 0, NULL, 0);
  double want = nb_item(ref);
  nb_set_deterministic(1);
  double s1 = nb_item(nb_sum(xg, 0, NULL, 0)), s2 = nb_item(nb_sum(xg, 0, NULL, 0));
  NBT_CHECK(fabs(s1 - want) <= 1e-5 * sqrt((double)n) * 10, "long sum: %.9g vs %.9g", s1, want);
  NBT_CHECK(memcmp(&s1, &s2, sizeof s1) == 0, "deterministic long sum repeats bit for bit");
  nb_set_deterministic(0);
  double s3 = nb_item(nb_sum(xg, 0, NULL, 0));
  NBT_CHECK(fabs(s3 - want) <= 1e-5 * sqrt((double)n) * 10, "atomic long sum: %.9g vs %.9g", s3, want);
  nb_set_deterministic(1);
  int64_t shp[2] = {quick ? 3001 : 100001, 7};
  nb_tensor *t = randn(31, 2, shp, NB_F32);
  cmp("column sum (tall)", NB_F32, nb_sum(t, 1, (int[]){0}, 0), nb_sum(gpu(t), 1, (int[]){0}, 0), 40.0);
  cmp("argmax (tall)", NB_I64, nb_argmax(t, 0, 0), nb_argmax(gpu(t), 0, 0), 1.0);
  nb_tensor *ti = nbt_randn(32, 2, (int64_t[]){41, 43}, NB_I64);
  cmp("sum i64", NB_I64, nb_sum(ti, 1, (int[]){1}, 0), nb_sum(gpu(ti), 1, (int[]){1}, 0), 1.0);
  nb_scope_end();
}

/* ---- matmul ----------------------------------------------------------------- */
static void test_matmul(void) {
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  int64_t M = quick ? 9 : 33, K = quick ? 17 : 65, N = quick ? 7 : 47;
  for (int d = 0; d < 4; d++) {
    nb_dtype dt = dts[d];
    double sc = sqrt((double)K) * (dt == NB_F32 ? 5.0 : 2.0);
    for (int ka = 0; ka < 3; ka++)
      for (int kb = 0; kb < 3; kb++) {
        nb_scope_begin();
        nb_tensor *a = layout(40 + ka, M, K, dt, ka), *b = layout(50 + kb, K, N, dt, kb);
        char name[64];
        snprintf(name, sizeof name, "matmul a %s b %s", LAYOUT[ka], LAYOUT[kb]);
        cmp(name, dt, nb_matmul(a, b), nb_matmul(gpu(a), gpu(b)), sc);
        nb_scope_end();
      }
    nb_scope_begin();
    nb_tensor *a = randn(60, 3, (int64_t[]){3, M, K}, dt), *b = randn(61, 2, (int64_t[]){K, N}, dt);
    cmp("matmul batched, b broadcast", dt, nb_matmul(a, b), nb_matmul(gpu(a), gpu(b)), sc);
    nb_tensor *a4 = randn(62, 4, (int64_t[]){2, 1, M, K}, dt), *b4 = randn(63, 3, (int64_t[]){3, K, N}, dt);
    cmp("matmul 4-D broadcast batches", dt, nb_matmul(a4, b4), nb_matmul(gpu(a4), gpu(b4)), sc);
    nb_tensor *at = nb_transpose(randn(64, 3, (int64_t[]){3, K, M}, dt), 1, 2);
    cmp("matmul batched transposed", dt, nb_matmul(at, b), nb_matmul(gpu(at), gpu(b)), sc);
    nb_tensor *v = randn(65, 1, (int64_t[]){K}, dt);
    cmp("matmul matrix-vector", dt, nb_matmul(a, v), nb_matmul(gpu(a), gpu(v)), sc);
    nb_scope_end();
  }
}

/* ---- gradients ------------------------------------------------------------------ */
typedef nb_tensor *(*fwd_fn)(nb_tensor *const *in, void *ctx);

/* Runs f on both devices; compares outputs and the gradients of sum(f*w). */
static void grad_cmp(const char *name, fwd_fn f, void *ctx, int n, nb_tensor *const *in,
                     nb_dtype dt, double scale) {
  nb_tensor *out[2] = {NULL, NULL}, *gr[2][4] = {{NULL}};
  nb_scope_begin();
  for (int dv = 0; dv < 2; dv++) {
    nb_tensor *x[4];
    for (int i = 0; i < n; i++) {
      x[i] = nb_detach(dv ? gpu(in[i]) : nb_clone(in[i])); /* fresh leaves */
      if (x[i] && nb_dtype_is_float(nb_dtype_of(x[i]))) nb_set_requires_grad(x[i], 1);
    }
    nb_tensor *y = f(x, ctx);
    if (!y) break;
    nb_tensor *w = randn(999, nb_ndim(y), nb_shape(y), nb_dtype_of(y));
    if (dv) w = gpu(w);
    nb_tensor *loss = nb_sum(nb_mul(y, w), 0, NULL, 0);
    if (nb_backward(loss, NULL)) break;
    out[dv] = y;
    for (int i = 0; i < n; i++) gr[dv][i] = nb_grad(x[i]);
  }
  char nm[200]; /* room for any case name plus the suffix */
  snprintf(nm, sizeof nm, "%s forward", name);
  cmp(nm, dt, out[0], out[1], scale);
  for (int i = 0; i < n; i++) {
    if (!nb_dtype_is_float(nb_dtype_of(in[i]))) continue;
    snprintf(nm, sizeof nm, "%s grad %d", name, i);
    cmp(nm, dt, gr[0][i], gr[1][i], scale);
  }
  nb_scope_end();
}

static nb_tensor *f_softmax(nb_tensor *const *x, void *c) { return nb_softmax(x[0], *(int *)c); }
static nb_tensor *f_log_softmax(nb_tensor *const *x, void *c) { return nb_log_softmax(x[0], *(int *)c); }
static nb_tensor *f_layer_norm(nb_tensor *const *x, void *c) { return nb_layer_norm(x[0], 1, x[1], x[2], 1e-5); }
static nb_tensor *f_rms_norm(nb_tensor *const *x, void *c) { return nb_rms_norm(x[0], 1, x[1], 1e-6); }
static nb_tensor *f_xent(nb_tensor *const *x, void *c) {
  return nb_cross_entropy(x[0], x[1], NB_REDUCE_MEAN, 3, *(double *)c);
}
static nb_tensor *f_embedding(nb_tensor *const *x, void *c) { return nb_embedding(x[0], x[1]); }
static nb_tensor *f_gelu_tanh_fast(nb_tensor *const *x, void *c) { (void)c; return nb_gelu_tanh(x[0]); }
static nb_tensor *f_index_select(nb_tensor *const *x, void *c) { return nb_index_select(x[0], 1, x[1]); }
static nb_tensor *f_gather(nb_tensor *const *x, void *c) { return nb_gather(x[0], 1, x[1]); }
static nb_tensor *f_scatter_add(nb_tensor *const *x, void *c) { return nb_scatter_add(x[0], 1, x[1], x[2]); }
static nb_tensor *f_conv(nb_tensor *const *x, void *c) {
  nb_conv2d_params p = nb_conv2d_defaults();
  p.stride[0] = 2; p.stride[1] = 1; p.padding[0] = 1; p.padding[1] = 2;
  return nb_conv2d(x[0], x[1], x[2], p);
}
static nb_tensor *f_maxpool(nb_tensor *const *x, void *c) { return nb_max_pool2d(x[0], 3, 2, 2, 2, 1, 1); }
static nb_tensor *f_avgpool(nb_tensor *const *x, void *c) { return nb_avg_pool2d(x[0], 3, 3, 2, 1, 1, 1); }
static nb_tensor *f_mlp(nb_tensor *const *x, void *c) {
  return nb_gelu(nb_linear(nb_tanh(x[0]), x[1], x[2]));
}
/* q k^T and (q k^T) v on (B, H, T, D) views of one (B, T, 3, H, D) tensor, as
 * attention reads its projection: batch axes that do not merge. */
static nb_tensor *f_qkv_views(nb_tensor *const *x, void *c) {
  (void)c;
  nb_tensor *t = nb_permute(x[0], (int[]){2, 0, 3, 1, 4});
  nb_tensor *q = nb_select(t, 0, 0), *k = nb_select(t, 0, 1), *v = nb_select(t, 0, 2);
  return nb_matmul(nb_matmul(q, nb_transpose(k, -1, -2)), v);
}

static void test_nn(void) {
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_dtype dt = FLOATS[d];
    /* B = 9 products of H each: copied and run as one batch (cuda_gemm.cu's
     * mm_flatten_pays); B = 3: one call per b */
    for (int64_t B = 9; B >= 3; B -= 6) {
      nb_scope_begin();
      nb_tensor *qkv = randn(80 + (int)B, 5, (int64_t[]){B, 7, 3, 2, 8}, dt);
      grad_cmp(B > 4 ? "matmul on attention views, copied" : "matmul on attention views, looped",
               f_qkv_views, NULL, 1, &qkv, dt, 8.0);
      nb_scope_end();
    }
    const int64_t Ds[] = {7, 100, quick ? 1500 : 5000, quick ? 9000 : 20000};
    for (int k = 0; k < 4; k++) {
      nb_scope_begin();
      int64_t R = quick ? 3 : (k < 2 ? 67 : 9);
      nb_tensor *x = randn(70 + k, 2, (int64_t[]){R, Ds[k]}, dt);
      int ax = -1, ax0 = 0;
      char name[64];
      snprintf(name, sizeof name, "softmax D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_softmax, &ax, 1, &x, dt, 2.0);
      snprintf(name, sizeof name, "log_softmax D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_log_softmax, &ax, 1, &x, dt, 2.0);
      if (k < 2) grad_cmp("softmax axis 0", f_softmax, &ax0, 1, &x, dt, 2.0);
      nb_tensor *w = nb_add_scalar(randn(80 + k, 1, &Ds[k], dt), 1.0), *b = randn(90 + k, 1, &Ds[k], dt);
      nb_tensor *in[3] = {x, w, b};
      snprintf(name, sizeof name, "layer_norm D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_layer_norm, NULL, 3, in, dt, 4.0 + Ds[k] / 500.0);
      snprintf(name, sizeof name, "rms_norm D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_rms_norm, NULL, 2, in, dt, 4.0 + Ds[k] / 500.0);
      nb_scope_end();
    }
    for (int k = 0; k < 2; k++) {
      nb_scope_begin();
      int64_t N = quick ? 5 : 29, C = k ? (quick ? 3000 : 50257) : 11;
      nb_tensor *logits = randn(100 + k, 2, (int64_t[]){N, C}, dt);
      nb_rng rng = nb_rng_new(7);
      nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
      nb_fill_(nb_slice(tg, 0, 0, 2, 1), 3); /* rows with ignore_index 3 */
      double sm = k ? 0.1 : 0.0;
      nb_tensor *in[2] = {logits, tg};
      grad_cmp(k ? "cross_entropy C=50257 smoothing" : "cross_entropy C=11", f_xent, &sm, 2, in, dt, 4.0);
      nb_tensor *in2[2] = {nb_transpose(randn(102, 2, (int64_t[]){C, N}, dt), 0, 1), tg};
      grad_cmp("cross_entropy transposed logits", f_xent, &sm, 2, in2, dt, 4.0);
      nb_scope_end();
    }
    nb_scope_begin();
    nb_tensor *x4 = randn(110, 4, (int64_t[]){2, 3, quick ? 7 : 13, quick ? 8 : 17}, dt);
    nb_tensor *cw = randn(111, 4, (int64_t[]){4, 3, 3, 3}, dt), *cb = randn(112, 1, (int64_t[]){4}, dt);
    nb_tensor *cin[3] = {x4, cw, cb};
    grad_cmp("conv2d", f_conv, NULL, 3, cin, dt, 8.0);
    grad_cmp("max_pool2d", f_maxpool, NULL, 1, &x4, dt, 1.0);
    grad_cmp("avg_pool2d", f_avgpool, NULL, 1, &x4, dt, 2.0);
    nb_tensor *mx = randn(113, 2, (int64_t[]){9, 31}, dt), *mw = randn(114, 2, (int64_t[]){19, 31}, dt);
    nb_tensor *mb = randn(115, 1, (int64_t[]){19}, dt);
    nb_tensor *min_[3] = {mx, mw, mb};
    grad_cmp("tanh-linear-gelu", f_mlp, NULL, 3, min_, dt, 8.0);
    nb_scope_end();
  }
}

/* ---- row kernels: softmax / norm fast paths (cuda_softmax.cu, cuda_norm.cu) --------------------
 * Sizes on each side of the register plans: D = 1, 7 and 769 take single-
 * element packs, 768 and 4096 16-byte packs (warp and multi-warp rows),
 * 50304 a 1024-thread row, 70000 the generic kernels. The norm plans also
 * take rows of 3 and 9 warps (1536, 2304: named barriers over groups that
 * are not a power of two), 3 packs per thread without the next-row prefetch
 * (12288), and 8 single-element packs (5000). Non-contiguous and misaligned
 * inputs must fall back and give the same values. */
static nb_tensor *f_ln_plain(nb_tensor *const *x, void *c) { return nb_layer_norm(x[0], 1, NULL, NULL, 1e-5); }
static nb_tensor *f_rms_plain(nb_tensor *const *x, void *c) { return nb_rms_norm(x[0], 1, NULL, 1e-6); }

/* x's values as a (R, D) view whose data starts one element into its
 * storage (contiguous rows, not 16-byte aligned), built with differentiable
 * ops on x's own device. */
static nb_tensor *rows_misaligned(nb_tensor *x) {
  int64_t one = 1, R = nb_size(x, 0), D = nb_size(x, 1), n = R * D;
  nb_tensor *parts[2] = {nb_zeros(1, &one, nb_dtype_of(x), nb_device_of(x)), nb_reshape(x, 1, &n)};
  nb_tensor *flat = nb_cat(2, parts, 0);
  return nb_view(nb_slice(flat, 0, 1, n + 1, 1), 2, (int64_t[]){R, D});
}
static nb_tensor *f_softmax_mis(nb_tensor *const *x, void *c) { return nb_softmax(rows_misaligned(x[0]), -1); }
static nb_tensor *f_ln_mis(nb_tensor *const *x, void *c) {
  return nb_layer_norm(rows_misaligned(x[0]), 1, x[1], x[2], 1e-5);
}
static nb_tensor *f_rms_mis(nb_tensor *const *x, void *c) { return nb_rms_norm(rows_misaligned(x[0]), 1, x[1], 1e-6); }

static void rows_case(nb_dtype dt, int64_t R, int64_t D, uint64_t seed) {
  char name[96];
  double sc = 4.0 + D / 500.0;
  int ax = -1;
  nb_tensor *x = randn(seed, 2, (int64_t[]){R, D}, dt);
  nb_tensor *w = nb_add_scalar(randn(seed + 1, 1, &D, dt), 1.0), *b = randn(seed + 2, 1, &D, dt);
  nb_tensor *in[3] = {x, w, b};
  snprintf(name, sizeof name, "rows softmax R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_softmax, &ax, 1, &x, dt, 2.0);
  snprintf(name, sizeof name, "rows log_softmax R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_log_softmax, &ax, 1, &x, dt, 2.0);
  snprintf(name, sizeof name, "rows layer_norm affine D=%lld", (long long)D);
  grad_cmp(name, f_layer_norm, NULL, 3, in, dt, sc);
  snprintf(name, sizeof name, "rows layer_norm plain D=%lld", (long long)D);
  grad_cmp(name, f_ln_plain, NULL, 1, &x, dt, sc);
  snprintf(name, sizeof name, "rows rms_norm weight D=%lld", (long long)D);
  grad_cmp(name, f_rms_norm, NULL, 2, in, dt, sc);
  snprintf(name, sizeof name, "rows rms_norm plain D=%lld", (long long)D);
  grad_cmp(name, f_rms_plain, NULL, 1, &x, dt, sc);
}

/* Norm forward and backward over many rows, so that each row group walks
 * several rows (the next-row prefetch and the per-thread dw/db sums). */
static void rows_norm_many(nb_dtype dt, int64_t R, int64_t D, uint64_t seed) {
  char name[96];
  nb_tensor *x = randn(seed, 2, (int64_t[]){R, D}, dt);
  nb_tensor *w = nb_add_scalar(randn(seed + 1, 1, &D, dt), 1.0), *b = randn(seed + 2, 1, &D, dt);
  nb_tensor *in[3] = {x, w, b};
  snprintf(name, sizeof name, "rows layer_norm R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_layer_norm, NULL, 3, in, dt, 4.0 + D / 500.0);
  snprintf(name, sizeof name, "rows rms_norm R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_rms_norm, NULL, 2, in, dt, 4.0 + D / 500.0);
}

/* ---- rows with -inf entries (causal attention masks) ----------------------
 * Row r of an (R, D) tensor keeps its first r % D + 1 elements and masks the
 * rest with -inf, as a causal attention row does: whole stretches of a row,
 * and every element some threads hold, are -inf. The softmax of such a row
 * is finite (masked entries 0), and cross-entropy over it finite when the
 * target is unmasked. Sizes take each kernel: single-element and 16-byte
 * packs, multi-warp rows, the generic cached and online kernels. */
static nb_tensor *masked_rows(uint64_t seed, int64_t R, int64_t D, nb_dtype dt, int transposed) {
  unsigned char *keep = malloc((size_t)(R * D));
  for (int64_t r = 0; r < R; r++)
    for (int64_t j = 0; j < D; j++) keep[r * D + j] = j <= r % D;
  nb_tensor *m = nb_from_buffer(keep, 2, (int64_t[]){R, D}, NB_BOOL, NB_DEVICE_CPU);
  free(keep);
  nb_tensor *x = transposed ? nb_transpose(randn(seed, 2, (int64_t[]){D, R}, dt), 0, 1)
                            : randn(seed, 2, (int64_t[]){R, D}, dt);
  return nb_where(m, x, nb_scalar(-INFINITY, dt, NB_DEVICE_CPU));
}
static nb_tensor *f_xent_plain(nb_tensor *const *x, void *c) {
  (void)c;
  return nb_cross_entropy(x[0], x[1], NB_REDUCE_MEAN, -1, 0.0);
}

static void test_rows_masked(void) {
  const int64_t Ds[] = {7, 11, 64, 768, 769, 5000, 50304, 70000};
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < (int)(sizeof Ds / sizeof *Ds); k++) {
      if (quick && Ds[k] > 5000) continue;
      nb_scope_begin();
      nb_dtype dt = FLOATS[d];
      int64_t D = Ds[k], R = D > 5000 ? 5 : 41;
      int ax = -1;
      char name[96];
      for (int tr = 0; tr < 2; tr++) {
        nb_tensor *x = masked_rows(600 + k, R, D, dt, tr);
        snprintf(name, sizeof name, "masked softmax D=%lld%s", (long long)D, tr ? " transposed" : "");
        grad_cmp(name, f_softmax, &ax, 1, &x, dt, 2.0);
        snprintf(name, sizeof name, "masked log_softmax D=%lld%s", (long long)D, tr ? " transposed" : "");
        grad_cmp(name, f_log_softmax, &ax, 1, &x, dt, 2.0);
      }
      /* targets on unmasked entries (column 0 is never masked) */
      nb_tensor *x = masked_rows(610 + k, R, D, dt, 0);
      nb_tensor *tg = nb_zeros(1, &R, NB_I64, NB_DEVICE_CPU);
      nb_tensor *in[2] = {x, tg};
      snprintf(name, sizeof name, "masked cross_entropy C=%lld", (long long)D);
      grad_cmp(name, f_xent_plain, NULL, 2, in, dt, 4.0);
      nb_tensor *sm = nb_softmax(gpu(x), -1); /* NaN is the one value unequal to itself */
      NBT_CHECK(sm && nb_item(nb_sum(nb_ne(sm, sm), 0, NULL, 0)) == 0,
                "masked softmax D=%lld [%s]: no NaN on the GPU (%s)", (long long)D, nb_dtype_name(dt),
                nb_last_error());
      nb_tensor *l = nb_cross_entropy(gpu(x), gpu(tg), NB_REDUCE_MEAN, -1, 0.0);
      NBT_CHECK(l && isfinite(nb_item(l)), "masked cross_entropy C=%lld [%s]: finite loss on the GPU",
                (long long)D, nb_dtype_name(dt));
      nb_clear_error();
      nb_scope_end();
    }
}

static void test_rows_fast(void) {
  const int64_t Ds[] = {1, 7, 768, 769, 1536, 2304, 4096, 5000, 12288, 50304, 70000};
  const int nD = (int)(sizeof Ds / sizeof *Ds);
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < nD; k++) {
      if (quick && Ds[k] > 5000) continue;
      nb_scope_begin();
      int64_t R = Ds[k] > 5000 ? 3 : (Ds[k] > 100 ? 37 : 131);
      rows_case(FLOATS[d], R, Ds[k], 200 + 10 * (uint64_t)k);
      nb_scope_end();
    }
  for (int k = 0; k < 5; k++) { /* f64 computes in f64 */
    nb_scope_begin();
    rows_case(NB_F64, 9, (const int64_t[]){1, 7, 768, 769, 4096}[k], 300 + (uint64_t)k);
    nb_scope_end();
  }
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_scope_begin();
    rows_norm_many(FLOATS[d], 6000, 768, 500 + d);
    if (!quick) rows_norm_many(FLOATS[d], 1500, 4096, 510 + d);
    nb_scope_end();
  }
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_dtype dt = FLOATS[d];
    nb_scope_begin();
    int ax = -1;
    int64_t R = 21, D = 768;
    /* rows strided (every other row of a wider tensor), transposed, and misaligned */
    nb_tensor *wide = randn(400, 2, (int64_t[]){R, 2 * D}, dt);
    nb_tensor *xs = nb_slice(wide, 1, 0, D, 1);
    grad_cmp("rows softmax row-strided", f_softmax, &ax, 1, &xs, dt, 2.0);
    nb_tensor *xt = nb_transpose(randn(401, 2, (int64_t[]){D, R}, dt), 0, 1);
    grad_cmp("rows softmax transposed", f_softmax, &ax, 1, &xt, dt, 2.0);
    grad_cmp("rows log_softmax transposed", f_log_softmax, &ax, 1, &xt, dt, 2.0);
    nb_tensor *xm = randn(402, 2, (int64_t[]){R, D}, dt);
    grad_cmp("rows softmax misaligned", f_softmax_mis, NULL, 1, &xm, dt, 2.0);
    nb_tensor *wm = nb_add_scalar(randn(403, 1, &D, dt), 1.0), *bm = randn(404, 1, &D, dt);
    nb_tensor *in[3] = {xm, wm, bm};
    grad_cmp("rows layer_norm misaligned", f_ln_mis, NULL, 3, in, dt, 6.0);
    grad_cmp("rows rms_norm misaligned", f_rms_mis, NULL, 2, in, dt, 6.0);
    nb_tensor *in2[3] = {xt, wm, bm};
    grad_cmp("rows layer_norm transposed", f_layer_norm, NULL, 3, in2, dt, 6.0);
    nb_scope_end();
  }
  /* the norm forward and the fused backward's dx/dw/db repeat bit for bit
   * (fixed merge and block orders), with row groups walking several rows */
  nb_scope_begin();
  int64_t R = 6000, D = 768;
  nb_tensor *x = gpu(randn(410, 2, (int64_t[]){R, D}, NB_BF16));
  nb_tensor *w = gpu(nb_add_scalar(randn(411, 1, &D, NB_BF16), 1.0)), *b = gpu(randn(412, 1, &D, NB_BF16));
  nb_tensor *gy = gpu(randn(413, 2, (int64_t[]){R, D}, NB_BF16));
  nb_tensor *gr[2][3], *ys[2];
  for (int rep = 0; rep < 2; rep++) {
    nb_tensor *in[3] = {nb_detach(x), nb_detach(w), nb_detach(b)};
    for (int i = 0; i < 3; i++) nb_set_requires_grad(in[i], 1);
    nb_tensor *y = ys[rep] = nb_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    nb_tensor *loss = nb_sum(nb_mul(y, gy), 0, NULL, 0);
    NBT_CHECK(loss && nb_backward(loss, NULL) == NB_OK, "rows layer_norm backward (%s)", nb_last_error());
    for (int i = 0; i < 3; i++) gr[rep][i] = nb_grad(in[i]);
  }
  cmp_bits("rows layer_norm y repeats", ys[0], ys[1]);
  cmp_bits("rows layer_norm dx repeats", gr[0][0], gr[1][0]);
  cmp_bits("rows layer_norm dw repeats", gr[0][1], gr[1][1]);
  cmp_bits("rows layer_norm db repeats", gr[0][2], gr[1][2]);
  nb_scope_end();
}

static void test_index(void) {
  for (int det = 1; det >= 0; det--) {
    nb_set_deterministic(det);
    for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
      nb_dtype dt = FLOATS[d];
      nb_scope_begin();
      int64_t V = quick ? 50 : 1000, D = quick ? 9 : 65, J = quick ? 300 : 5000;
      nb_rng rng = nb_rng_new(11);
      nb_tensor *wt = randn(120, 2, (int64_t[]){V, D}, dt);
      nb_tensor *idx = nb_randint(&rng, 1, &J, 0, V / 10, NB_I64, NB_DEVICE_CPU); /* many repeats */
      nb_tensor *in[2] = {wt, idx};
      char name[64];
      snprintf(name, sizeof name, "embedding (det %d)", det);
      /* ~50 repeats per row: the CPU rounds f16/bf16 after each addition,
       * CUDA once after f32 accumulation, so the reference itself drifts */
      double half = dt == NB_F16 || dt == NB_BF16 ? 8.0 : 1.0;
      grad_cmp(name, f_embedding, NULL, 2, in, dt, half * (det ? 1.0 : 4.0));
      nb_tensor *x3 = randn(121, 3, (int64_t[]){3, 17, 5}, dt);
      int64_t j2 = 23;
      nb_tensor *idx2 = nb_randint(&rng, 1, &j2, 0, 17, NB_I64, NB_DEVICE_CPU);
      nb_tensor *in2[2] = {nb_transpose(nb_transpose(x3, 0, 2), 0, 2), idx2};
      snprintf(name, sizeof name, "index_select axis 1 (det %d)", det);
      grad_cmp(name, f_index_select, NULL, 2, in2, dt, det ? 1.0 : 4.0);
      nb_tensor *gi = nb_randint(&rng, 3, (int64_t[]){3, 9, 5}, 0, 17, NB_I64, NB_DEVICE_CPU);
      nb_tensor *in3[2] = {x3, gi};
      snprintf(name, sizeof name, "gather (det %d)", det);
      grad_cmp(name, f_gather, NULL, 2, in3, dt, det ? 1.0 : 4.0);
      nb_tensor *src = randn(122, 3, (int64_t[]){3, 9, 5}, dt);
      nb_tensor *in4[3] = {x3, gi, src};
      snprintf(name, sizeof name, "scatter_add (det %d)", det);
      grad_cmp(name, f_scatter_add, NULL, 3, in4, dt, det ? 1.0 : 4.0);
      nb_scope_end();
    }
  }
  nb_set_deterministic(1);
  /* deterministic embedding gradient repeats bit for bit, and equals the
   * CPU's in f32 (same summation order) */
  nb_scope_begin();
  int64_t V = 64, D = 33, J = quick ? 999 : 20000;
  nb_rng rng = nb_rng_new(5);
  nb_tensor *idx = nb_randint(&rng, 1, &J, 0, 8, NB_I64, NB_DEVICE_CPU);
  nb_tensor *src = randn(123, 2, (int64_t[]){J, D}, NB_F32);
  nb_tensor *z = nb_zeros(2, (int64_t[]){V, D}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *r_cpu = nb_scatter_add(z, 0, nb_expand(nb_unsqueeze(idx, 1), 2, (int64_t[]){J, D}), src);
  nb_tensor *g1 = gpu(z);
  nb_set_requires_grad(g1, 1);
  nb_backward(nb_embedding(g1, gpu(idx)), gpu(src));
  nb_tensor *ga = nb_clone(nb_grad(g1));
  nb_zero_grad(g1);
  nb_backward(nb_embedding(g1, gpu(idx)), gpu(src));
  cmp_bits("deterministic embedding grad repeats", ga, nb_grad(g1));
  cmp_bits("deterministic embedding grad equals cpu (f32)", r_cpu, ga);
  nb_scope_end();
}

/* ---- random ------------------------------------------------------------------- */
static void test_random(void) {
  int64_t n = quick ? 1001 : 100003;
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  nb_scope_begin();
  for (int d = 0; d < 4; d++) {
    nb_rng r1 = nb_rng_new(1234), r2 = nb_rng_new(1234);
    r1.offset = r2.offset = 77;
    char name[64];
    snprintf(name, sizeof name, "rand uniform %s bits", nb_dtype_name(dts[d]));
    cmp_bits(name, nb_rand(&r1, 1, &n, -2.0, 3.0, dts[d], NB_DEVICE_CPU),
             nb_rand(&r2, 1, &n, -2.0, 3.0, dts[d], G));
    NBT_CHECK(r1.offset == r2.offset, "rng offsets advance alike");
    snprintf(name, sizeof name, "randn %s (last bits may differ)", nb_dtype_name(dts[d]));
    cmp(name, dts[d] == NB_F64 ? NB_F32 : dts[d], nb_randn(&r1, 1, &n, 0.5, 2.0, dts[d], NB_DEVICE_CPU),
        nb_randn(&r2, 1, &n, 0.5, 2.0, dts[d], G), 1.0);
  }
  nb_rng r1 = nb_rng_new(99), r2 = nb_rng_new(99);
  cmp_bits("randint i64 bits", nb_randint(&r1, 1, &n, -1000000007LL, 5000000000LL, NB_I64, NB_DEVICE_CPU),
           nb_randint(&r2, 1, &n, -1000000007LL, 5000000000LL, NB_I64, G));
  cmp_bits("randint i32 bits", nb_randint(&r1, 1, &n, 3, 17, NB_I32, NB_DEVICE_CPU),
           nb_randint(&r2, 1, &n, 3, 17, NB_I32, G));
  /* rand into a strided (transposed) view keeps row-major element order */
  for (int d = 1; d < 4; d++) {
    nb_tensor *x = randn(130, 2, (int64_t[]){37, 41}, dts[d]);
    nb_tensor *xt = nb_transpose(x, 0, 1);
    nb_rng a = nb_rng_new(5), b = nb_rng_new(5);
    char name[64];
    snprintf(name, sizeof name, "dropout %s mask and values bits", nb_dtype_name(dts[d]));
    cmp_bits(name, nb_contiguous(nb_dropout(xt, 0.3, &a)), nb_contiguous(nb_dropout(gpu(xt), 0.3, &b)));
  }
  nb_scope_end();
}

/* ---- optimizers ----------------------------------------------------------------- */
static void test_clip_multi(void); /* below, with the fast paths */
static void test_optim(void) {
  for (int kind = 0; kind < 2; kind++)
    for (int dd = 0; dd < 2; dd++) {
      nb_dtype dt = dd ? NB_BF16 : NB_F32;
      nb_scope_begin();
      nb_tensor *p0 = randn(140, 2, (int64_t[]){37, 19}, dt), *w = randn(141, 2, (int64_t[]){37, 19}, dt);
      nb_tensor *res[2];
      for (int dv = 0; dv < 2; dv++) {
        nb_params *ps = nb_params_new();
        nb_tensor *p = dv ? gpu(p0) : nb_clone(p0);
        nb_params_add(ps, "p", p);
        nb_optim *o = kind ? nb_sgd_new(ps, 0.1, 0.9, 0.1, 1, 0.01)
                           : nb_adamw_new(ps, 0.01, 0.9, 0.999, 1e-8, 0.1);
        nb_tensor *wd = dv ? gpu(w) : w;
        for (int s = 0; s < 3; s++) {
          nb_scope_begin();
          nb_params_zero_grad(ps);
          nb_backward(nb_sum(nb_mul(nb_square(p), wd), 0, NULL, 0), NULL);
          nb_optim_step(o);
          nb_scope_end();
        }
        res[dv] = nb_clone(p);
        nb_optim_free(o);
        nb_params_free(ps);
      }
      cmp(kind ? "sgd nesterov 3 steps" : "adamw 3 steps", dt, res[0], res[1], 2.0);
      nb_scope_end();
    }
  test_clip_multi();
}

/* Gradient clipping over 70 gradients of four dtypes and odd sizes (more
 * tensors than one multi-tensor launch takes, one larger than many blocks):
 * the norm against a float64 sum of the gradients' values on the host, the
 * clipped gradients against the CPU's, and the same bits on a second run
 * (the device's sum has a fixed order). */
static double clip_run(nb_params *ps, nb_tensor *const *w, int n, int dv) {
  for (int i = 0; i < n; i++) {
    nb_tensor *p = nb_params_get(ps, i);
    nb_zero_grad(p);
    nb_scope_begin();
    nb_backward(nb_mul_scalar(p, 1.0), dv ? gpu(w[i]) : w[i]); /* grad = w[i] exactly */
    nb_scope_end();
  }
  return nb_clip_grad_norm(ps, 1.0);
}

static void test_clip_multi(void) {
  enum { N = 70 };
  const nb_dtype dts[] = {NB_F32, NB_BF16, NB_F16, NB_F64};
  nb_scope_begin();
  nb_tensor *w[N];
  nb_params *ps[2] = {nb_params_new(), nb_params_new()};
  double want = 0;
  for (int i = 0; i < N; i++) {
    int64_t len = i == 5 ? 70001 : 1 + (i * 37) % 3001;
    w[i] = randn(300 + i, 1, &len, dts[i % 4]);
    double *h = nbt_f64(w[i]);
    for (int64_t j = 0; j < len; j++) want += h[j] * h[j];
    free(h);
    for (int dv = 0; dv < 2; dv++) {
      nb_tensor *p = nb_zeros(1, &len, dts[i % 4], dv ? G : NB_DEVICE_CPU);
      nb_set_requires_grad(p, 1);
      char name[16];
      snprintf(name, sizeof name, "g%d", i);
      nb_params_add(ps[dv], name, p);
    }
  }
  double nc = clip_run(ps[0], w, N, 0), ng = clip_run(ps[1], w, N, 1);
  NBT_CHECK(fabs(nc - sqrt(want)) <= 1e-12 * sqrt(want), "clip norm cpu %.15g vs float64 %.15g", nc, sqrt(want));
  NBT_CHECK(fabs(ng - sqrt(want)) <= 1e-12 * sqrt(want), "clip norm cuda %.15g vs float64 %.15g (%s)", ng,
            sqrt(want), nb_last_error());
  for (int i = 0; i < N; i += 3) {
    char name[64];
    snprintf(name, sizeof name, "clipped gradient %d (%s)", i, nb_dtype_name(dts[i % 4]));
    cmp(name, dts[i % 4], nb_grad(nb_params_get(ps[0], i)), nb_grad(nb_params_get(ps[1], i)), 1.0);
  }
  double again = clip_run(ps[1], w, N, 1);
  NBT_CHECK(memcmp(&again, &ng, sizeof ng) == 0, "clip norm repeats bit for bit (%.17g, %.17g)", ng, again);
  { /* the backend entries' own checks (the CPU's under NABLA_TEST_SELF) */
    const nb_backend *be = nb_backend_for(G);
    nb_tensor *o32 = nb_zeros(0, NULL, NB_F32, G);
    nb_kview ko, kx;
    nb_kview_of(o32, &ko);
    nb_kview_of(nb_params_get(ps[1], 0), &kx);
    nbt_check_error("sumsq_multi into f32", be->sumsq_multi(1, &kx, &ko) != NB_OK, NB_ERR_DTYPE,
                    "sumsq_multi", "f32", NULL);
    nb_tensor *ints = nb_zeros(1, (int64_t[]){4}, NB_I64, G);
    nb_kview_of(ints, &kx);
    nbt_check_error("scale_multi on i64", be->scale_multi(1, &kx, 2.0) != NB_OK, NB_ERR_DTYPE,
                    "scale_multi", "i64", NULL);
  }
  nb_params_free(ps[0]);
  nb_params_free(ps[1]);
  nb_scope_end();
}

/* ---- fast paths: elementwise vectors, multi-tensor AdamW, embedding rows ------
 * (bench/results/h100-2026-11-22-elementwise-adamw-embedding.md) */
static void fast_same(const char *name, const nb_tensor *a, const nb_tensor *b) {
  cmp_bits(name, a, b);
}

static void test_fast_paths(void) {
  nb_scope_begin();
  /* GELU (tanh form) and its derivative over [-30, 30], tails included, on a
   * size with a partial last vector group and a scalar tail */
  int64_t n = 100003;
  nb_tensor *x = nb_mul_scalar(nb_add_scalar(nb_div_scalar(nb_arange(0, (double)n, 1, NB_F32, NB_DEVICE_CPU),
                                                           (double)n), -0.5), 60.0);
  nb_tensor *xs[1] = {x};
  cmp("gelu_tanh [-30, 30]", NB_F32, nb_gelu_tanh(x), nb_gelu_tanh(gpu(x)), 1.0);
  grad_cmp("gelu_tanh grad [-30, 30]", f_gelu_tanh_fast, NULL, 1, xs, NB_F32, 1.0);
  nb_tensor *y = randn(700, 1, &n, NB_F32);
  cmp("add (vector path, odd size)", NB_F32, nb_add(x, y), nb_add(gpu(x), gpu(y)), 1.0);
  cmp("add (unaligned views)", NB_F32, nb_add(nb_narrow(x, 0, 1, n - 2), nb_narrow(y, 0, 1, n - 2)),
      nb_add(nb_narrow(gpu(x), 0, 1, n - 2), nb_narrow(gpu(y), 0, 1, n - 2)), 1.0);
  nb_scope_end();

  /* adamw_multi == adamw_step per tensor, bit for bit, on the device: f32
   * (vector path, odd sizes, an unaligned view), bf16, f16 and f64 params */
  nb_scope_begin();
  const nb_backend *be = nb_backend_for(G);
  enum { N = 7 };
  const int64_t sizes[N] = {7, 1, 40961, 3000, 333, 8193, 65};
  const nb_dtype dts[N] = {NB_F32, NB_F32, NB_F32, NB_F32, NB_BF16, NB_F16, NB_F64};
  nb_tensor *t[2][4][N];
  nb_kview kv[2][4][N];
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 4; k++) {
      nb_dtype dt = k < 2 ? dts[i] : NB_F32;
      int64_t sz = sizes[i] + 1;
      nb_tensor *r = randn(710 + 4 * (uint64_t)i + (uint64_t)k, 1, &sz, dt);
      if (k == 3) r = nb_square(r);
      for (int c = 0; c < 2; c++) {
        t[c][k][i] = gpu(r); /* tensor 3: views at element 1, not 16-byte aligned */
        t[c][k][i] = i == 3 ? nb_narrow(t[c][k][i], 0, 1, sizes[i]) : nb_narrow(t[c][k][i], 0, 0, sizes[i]);
        nb_kview_of(t[c][k][i], &kv[c][k][i]);
      }
    }
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < N; i++)
      NBT_CHECK(!be->adamw_step(&kv[0][0][i], &kv[0][1][i], &kv[0][2][i], &kv[0][3][i], 3e-3, 0.9,
                                0.95, 1e-8, 0.1, step), "adamw_step (%s)", nb_last_error());
    NBT_CHECK(!be->adamw_multi(N, kv[1][0], kv[1][1], kv[1][2], kv[1][3], 3e-3, 0.9, 0.95, 1e-8, 0.1,
                               step), "adamw_multi (%s)", nb_last_error());
  }
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 4; k++)
      if (k != 1) {
        char name[96];
        snprintf(name, sizeof name, "adamw_multi tensor %d (%s, %lld) operand %d equals adamw_step",
                 i, nb_dtype_name(dts[i]), (long long)sizes[i], k);
        fast_same(name, nb_contiguous(t[0][k][i]), nb_contiguous(t[1][k][i]));
      }
  nb_scope_end();

  /* embedding rows: 16-byte rows (D = 64, 768) and rows of odd length, every
   * index repeated; forward bits, and deterministic gradients equal the
   * CPU's bit for bit in f32 */
  nb_set_deterministic(1);
  const int64_t Ds[3] = {64, 768, 37};
  for (int d = 0; d < 3; d++) {
    nb_scope_begin();
    int64_t V = 300, J = quick ? 500 : 4099, D = Ds[d];
    nb_rng rng = nb_rng_new(21 + (uint64_t)d);
    nb_tensor *idx = nb_randint(&rng, 1, &J, 0, V, NB_I64, NB_DEVICE_CPU);
    nb_tensor *w = randn(730 + (uint64_t)d, 2, (int64_t[]){V, D}, NB_F32);
    nb_tensor *src = randn(740 + (uint64_t)d, 2, (int64_t[]){J, D}, NB_F32);
    char name[96];
    snprintf(name, sizeof name, "embedding rows forward D=%lld", (long long)D);
    fast_same(name, nb_embedding(w, idx), nb_embedding(gpu(w), gpu(idx)));
    nb_tensor *wc = nb_clone(w), *wg = gpu(w);
    nb_set_requires_grad(wc, 1);
    nb_set_requires_grad(wg, 1);
    nb_backward(nb_embedding(wc, idx), src);
    nb_backward(nb_embedding(wg, gpu(idx)), gpu(src));
    snprintf(name, sizeof name, "embedding rows deterministic grad D=%lld equals cpu", (long long)D);
    fast_same(name, nb_grad(wc), nb_grad(wg));
    nb_scope_end();
  }
}

/* ---- errors and memory ------------------------------------------------------------ */
static void test_errors_memory(void) {
  nb_scope_begin();
  nb_clear_error();
  nb_tensor *x = gpu(randn(150, 2, (int64_t[]){10, 4}, NB_F32));
  int64_t three = 3;
  nb_tensor *idx = gpu(nb_from_buffer((int64_t[]){1, 12, 2}, 1, &three, NB_I64, NB_DEVICE_CPU));
  nb_tensor *r = nb_index_select(x, 0, idx);
  nbt_check_error("index_select out of range on cuda", r == NULL, NB_ERR_INDEX, "12", NULL);
  nb_clear_error();
  nb_tensor *ok = nb_index_select(x, 0, gpu(nb_arange(0, 10, 3, NB_I64, NB_DEVICE_CPU)));
  NBT_CHECK(ok != NULL, "the device works after an index error (%s)", nb_last_error());
  nb_tensor *tg = gpu(nb_from_buffer((int64_t[]){0, 5, 1}, 1, &three, NB_I64, NB_DEVICE_CPU));
  nb_tensor *lg = gpu(randn(151, 2, (int64_t[]){3, 4}, NB_F32));
  nb_tensor *l = nb_cross_entropy(lg, tg, NB_REDUCE_MEAN, -100, 0.0);
  nbt_check_error("cross_entropy target out of range on cuda", l == NULL, NB_ERR_INDEX, "5", NULL);
  nb_clear_error();
  nb_tensor *gi = gpu(nb_full(2, (int64_t[]){10, 4}, -1, NB_I64, NB_DEVICE_CPU));
  nb_tensor *gr = nb_gather(x, 1, gi);
  nbt_check_error("gather negative index on cuda", gr == NULL, NB_ERR_INDEX, "-1", NULL);
  nb_clear_error();

  int64_t huge = (int64_t)1 << 48; /* 1 PiB of f32 */
  nb_tensor *h = nb_empty(1, &huge, NB_F32, G);
  nbt_check_error("1 PiB allocation on cuda", h == NULL, NB_ERR_OOM, "out of memory", NULL);
  nb_clear_error();
  nb_tensor *after = nb_ones(1, (int64_t[]){1000}, NB_F32, G);
  NBT_CHECK(after && nb_item(nb_sum(after, 0, NULL, 0)) == 1000.0,
            "allocation works after OOM (%s)", nb_last_error());
  nb_scope_end();

  if (G.type == NB_CPU) return; /* the rest is about the CUDA allocator */
  nb_memory_stats s0, s1;
  NBT_CHECK(nb_cuda_memory_stats(G.index, &s0) == NB_OK, "memory stats (%s)", nb_last_error());
  for (int i = 0; i < 10; i++) {
    nb_scope_begin();
    nb_ones(1, (int64_t[]){12345}, NB_F32, G);
    nb_scope_end();
  }
  nb_cuda_memory_stats(G.index, &s1);
  NBT_CHECK(s1.n_cache_hits >= s0.n_cache_hits + 9, "cache hits counted (%lld -> %lld)",
            (long long)s0.n_cache_hits, (long long)s1.n_cache_hits);
  NBT_CHECK(s1.n_cuda_malloc <= s0.n_cuda_malloc + 1, "steady state needs no cudaMalloc");
  NBT_CHECK(s1.reserved >= s1.allocated && s1.peak >= s1.allocated, "reserved >= allocated, peak");
  NBT_CHECK(nb_cuda_empty_cache(G.index) == NB_OK, "empty_cache (%s)", nb_last_error());
  nb_cuda_memory_stats(G.index, &s1);
  NBT_CHECK(s1.reserved == s1.allocated, "empty_cache returns every cached block (%lld vs %lld)",
            (long long)s1.reserved, (long long)s1.allocated);
  NBT_CHECK(nb_device_synchronize(G) == NB_OK, "synchronize (%s)", nb_last_error());
}


/* ---- cross-entropy: fused forward+backward (cuda_xent.cu) ---------------------
 * The training path writes dlogits in the forward; backward returns them as
 * is for the engine's all-ones seed and scales them otherwise. Class counts
 * reach every kernel variant (general, register-cached vectors with 1/2/4/8
 * vectors per thread, streaming vectors, rows split over a 2-block cluster
 * at 50304 16-bit); ignored rows, smoothing, strided
 * logits, (N, C, d) logits, each reduction, upstream gradient 1 and not 1. */
static const char *const XRED[] = {"mean", "sum", "none"};

/* One run on device dv; *grad receives the logits' gradient. */
static nb_tensor *xent_run(int dv, const nb_tensor *logits, const nb_tensor *tg, nb_reduction red,
                           double sm, int scaled, nb_tensor **grad) {
  nb_tensor *x = nb_detach(dv ? gpu(logits) : nb_clone(logits));
  nb_tensor *t = dv ? gpu(tg) : nb_clone(tg);
  nb_set_requires_grad(x, 1);
  nb_tensor *y = nb_cross_entropy(x, t, red, -100, sm);
  *grad = NULL;
  if (!y) return NULL;
  nb_status st;
  if (red == NB_REDUCE_NONE) {
    nb_tensor *w = scaled ? randn(77, nb_ndim(y), nb_shape(y), nb_dtype_of(y)) : NULL;
    st = nb_backward(y, scaled ? (dv ? gpu(w) : w) : nb_ones_like(y));
  } else {
    st = nb_backward(scaled ? nb_mul_scalar(y, 3.0) : y, NULL);
  }
  if (st) return NULL;
  *grad = nb_grad(x);
  return y;
}

static void xent_case(const char *what, const nb_tensor *logits, const nb_tensor *tg, nb_dtype dt,
                      nb_reduction red, double sm, int scaled) {
  nb_scope_begin();
  nb_tensor *g0, *g1;
  nb_tensor *y0 = xent_run(0, logits, tg, red, sm, scaled, &g0);
  nb_tensor *y1 = xent_run(1, logits, tg, red, sm, scaled, &g1);
  char nm[160];
  snprintf(nm, sizeof nm, "xent fused %s %s sm=%g %s loss", what, XRED[red == NB_REDUCE_MEAN ? 0 : red == NB_REDUCE_SUM ? 1 : 2],
           sm, scaled ? "scaled" : "seed");
  cmp(nm, dt, y0, y1, 4.0);
  snprintf(nm + strlen(nm) - 4, 8, "grad");
  cmp(nm, dt, g0, g1, 4.0);
  nb_scope_end();
}

static void test_xent_fused(void) {
  const int64_t Cs[] = {1, 7, 64, 1001, 4096, 16384, 50304, 70000};
  const nb_dtype dts[] = {NB_BF16, NB_F32, NB_F16};
  const nb_reduction reds[] = {NB_REDUCE_MEAN, NB_REDUCE_SUM, NB_REDUCE_NONE};
  for (size_t d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof Cs / sizeof *Cs; k++) {
      int64_t C = Cs[k], N = C >= 16384 ? (quick ? 3 : 5) : (quick ? 5 : 33);
      if (d == 2 && C != 1001 && C != 50304) continue; /* f16: a general and a vector case */
      nb_scope_begin();
      nb_dtype dt = dts[d];
      nb_rng rng = nb_rng_new(11 + k);
      nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
      nb_fill_(nb_slice(tg, 0, 1, N, 3), -100); /* every third row ignored */
      char what[64];
      for (int lay = 0; lay < 3; lay++) {
        if (lay && C > 4096 && d) continue;
        nb_tensor *x = layout(300 + k, N, C, dt, lay);
        for (int r = 0; r < 3; r++)
          for (int sc = 0; sc < 2; sc++) {
            double sm = (r + sc + lay) % 2 ? 0.1 : 0.0;
            snprintf(what, sizeof what, "C=%lld %s", (long long)C, LAYOUT[lay]);
            xent_case(what, x, tg, dt, reds[r], sm, sc);
          }
      }
      nb_scope_end();
    }
  /* many rows (more than one resident wave of blocks, or of block pairs
   * at 50304): each block counts N_valid itself and the last to finish
   * reduces the loss; the same bits on every run, and the CPU's values */
  for (int k = 0; k < 3; k++) {
    nb_scope_begin();
    int64_t N = k == 2 ? (quick ? 400 : 1500) : 3000, C = k == 2 ? 50304 : k ? 1001 : 4096;
    nb_dtype dt = k == 1 ? NB_F32 : NB_BF16;
    nb_rng rng = nb_rng_new(40 + k);
    nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
    nb_fill_(nb_slice(tg, 0, 0, N, 7), -100);
    nb_tensor *x = randn(330 + k, 2, (int64_t[]){N, C}, dt);
    for (int r = 0; r < 2; r++) {
      nb_tensor *g0, *g1, *g2;
      nb_reduction red = r ? NB_REDUCE_SUM : NB_REDUCE_MEAN;
      nb_tensor *y0 = xent_run(0, x, tg, red, 0.0, 0, &g0);
      nb_tensor *y1 = xent_run(1, x, tg, red, 0.0, 0, &g1);
      nb_tensor *y2 = xent_run(1, x, tg, red, 0.0, 0, &g2);
      char nm[96];
      snprintf(nm, sizeof nm, "xent fused N=%lld C=%lld %s loss", (long long)N, (long long)C, XRED[r]);
      cmp(nm, dt, y0, y1, 4.0);
      snprintf(nm, sizeof nm, "xent fused N=%lld C=%lld %s grad", (long long)N, (long long)C, XRED[r]);
      cmp(nm, dt, g0, g1, 4.0);
      snprintf(nm, sizeof nm, "xent fused N=%lld C=%lld %s repeats", (long long)N, (long long)C, XRED[r]);
      cmp_bits(nm, y1, y2);
      cmp_bits(nm, g1, g2);
    }
    nb_scope_end();
  }
  /* (N, C, d) logits: rows gathered through a permuted view */
  nb_scope_begin();
  nb_tensor *x3 = randn(320, 3, (int64_t[]){3, 7, 5}, NB_BF16);
  nb_rng rng = nb_rng_new(5);
  nb_tensor *t3 = nb_randint(&rng, 2, (int64_t[]){3, 5}, 0, 7, NB_I64, NB_DEVICE_CPU);
  nb_fill_(nb_slice(t3, 1, 0, 2, 1), -100);
  for (int r = 0; r < 3; r++) xent_case("(3,7,5)", x3, t3, NB_BF16, reds[r], 0.05, r == 1);
  /* every row ignored: mean is NaN on both devices, the gradient zero */
  nb_tensor *xa = randn(321, 2, (int64_t[]){4, 50304}, NB_BF16);
  nb_tensor *ta = nb_full(1, (int64_t[]){4}, -100, NB_I64, NB_DEVICE_CPU);
  nb_tensor *ga;
  nb_tensor *ya = xent_run(1, xa, ta, NB_REDUCE_MEAN, 0.0, 0, &ga);
  NBT_CHECK(ya && isnan(nb_item(ya)), "xent fused all ignored: mean is NaN");
  NBT_CHECK(ga && nb_item(nb_sum(nb_abs(nb_to_device(ga, NB_DEVICE_CPU)), 0, NULL, 0)) == 0.0,
            "xent fused all ignored: zero gradient (%s)", nb_last_error());
  /* an out-of-range target on the training path is NB_ERR_INDEX */
  nb_tensor *tb = nb_full(1, (int64_t[]){4}, 50304, NB_I64, NB_DEVICE_CPU);
  nb_tensor *xb = nb_detach(gpu(xa));
  nb_set_requires_grad(xb, 1);
  NBT_CHECK(!nb_cross_entropy(xb, gpu(tb), NB_REDUCE_MEAN, -100, 0.0) && nb_last_status() == NB_ERR_INDEX,
            "xent fused: target out of range is NB_ERR_INDEX");
  nb_clear_error();
  nb_scope_end();
}

static void test_gemm_sm90(void); /* section "own sm_90a GEMM", at the end */
static void test_gemm_sm80(void); /* section "portable GEMM (sm80 path)", at the end */
static void test_gemm_tune(void); /* section "gemm tune", at the end */
static void test_gpt_step(void);  /* section "gpt step", at the end */

/* ---- pinned host memory: asynchronous uploads ------------------------------ */
static void test_pinned(void) {
  nb_scope_begin();
  int64_t n = 1 << 20;
  nb_tensor *pin = nb_empty_pinned(1, &n, NB_F32);
  NBT_CHECK(pin && (G.type == NB_CPU || nb_is_pinned(pin)), "empty_pinned is page-locked with a GPU present");
  nb_tensor *src = randn(77, 1, &n, NB_F32);
  nb_copy_(pin, src);
  nb_tensor *d = gpu(pin); /* queued without waiting */
  NBT_CHECK(d != NULL, "upload from pinned memory: %s", nb_last_error());
  nb_device_synchronize(G);
  nb_tensor *back = nb_to_device(d, NB_DEVICE_CPU);
  NBT_CHECK(back && nb_item(nb_sum(nb_ne(back, src), 0, NULL, 0)) == 0, "pinned upload arrives intact");
  nb_scope_end();
}

/* Without a device (and without NABLA_TEST_SELF=1) nothing is tested: the
 * program says so, counts the selected sections as skipped and exits 77 (the
 * usual "skipped" status), never 0 as if it had passed. */
#define NBT_SKIPPED 77

int main(void) {
  const char *q = getenv("NABLA_TEST_QUICK");
  quick = q && q[0] && q[0] != '0';
  struct { const char *name; void (*f)(void); } tests[] = {
    {"unary", test_unary}, {"binary", test_binary}, {"copy/cast", test_copy_cast},
    {"cast ties", test_cast_ties},
    {"reduce", test_reduce}, {"matmul", test_matmul}, {"nn", test_nn}, {"index", test_index},
    {"random", test_random}, {"optim", test_optim}, {"errors/memory", test_errors_memory},
    {"fast paths", test_fast_paths},
    {"rows fast", test_rows_fast},
    {"rows masked", test_rows_masked},
    {"xent fused", test_xent_fused},
    {"gemm sm90", test_gemm_sm90},
    {"gemm sm80", test_gemm_sm80},
    {"gemm tune", test_gemm_tune},
    {"pinned", test_pinned},
    {"gpt step", test_gpt_step},
  };
  const char *only = getenv("NABLA_TEST_ONLY"); /* run the sections whose name contains it */
  const char *self = getenv("NABLA_TEST_SELF");
  int n = nb_cuda_available();
  if (self && self[0] == '1') {
    G = NB_DEVICE_CPU;
  } else if (n == 0) {
    int selected = 0;
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
      selected += !(only && only[0] && !strstr(tests[i].name, only));
    printf("test_cuda: no CUDA device%s%s: skipped (NABLA_TEST_SELF=1 checks the program on "
           "the CPU)\n", nb_error_pending() ? ": " : "", nb_error_pending() ? nb_last_error() : "");
    printf("0 passed, 0 failed, %d skipped\n", selected);
    return NBT_SKIPPED;
  } else {
    G = nb_device_cuda(0);
  }
  printf("%d CUDA device(s)%s\n", n, quick ? ", quick sizes" : "");
  for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
    if (only && only[0] && !strstr(tests[i].name, only)) continue;
    int f0 = nbt_failed;
    tests[i].f();
    printf("%-14s %s\n", tests[i].name, nbt_failed == f0 ? "ok" : "FAILED");
    nb_clear_error();
  }
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}

/* ==== own sm_90a GEMM (src/backend/cuda/gemm_sm90.cu) ==========================
 * The own kernel is forced with nb_cuda_set_gemm_backend(1); where it does not
 * apply (not a 9.0 device, a layout or alignment TMA cannot take) the product
 * goes through cuBLASLt, so these checks pass on any GPU and exercise both the
 * kernel and its fallbacks on Hopper. Shapes include 1x1x1, primes and tails
 * of the 128 x 256 x 64 tile; layouts NT (x @ W^T), NN, TN, TT as strided views
 * on the device (the kernel reads a transposed operand as is). Each result is
 * compared with a float64 reference on sampled rows (all rows when small) and
 * with cuBLASLt's result in full, by the relative Frobenius error. */
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_gemm.h"
#endif
/* Own-kernel launches so far; -1 when it cannot run here (CPU self-test, a
 * device other than compute capability 9.0). */
static int64_t gs_launches(void) {
#ifdef NABLA_HAVE_CUDA
  if (G.type == NB_CUDA) return nb_cuda_gemm_own_launches(G.index);
#endif
  return -1;
}

static double gs_rel(const double *x, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = x[i] - ref[i];
    if (x[i] != x[i]) return INFINITY;
    num += e * e;
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* f64 reference rows (all, or about 61 and the last) of a @ b: *rows, *nrow. */
static double *gs_ref(const double *A, const double *B, int64_t M, int64_t N, int64_t K,
                      int64_t **rows, int64_t *nrow) {
  int64_t step = M * N * K <= ((int64_t)1 << 27) ? 1 : (M + 60) / 61, n = 0;
  int64_t *r = malloc((size_t)(M / step + 2) * sizeof *r);
  for (int64_t i = 0; i < M; i += step) r[n++] = i;
  if ((M - 1) % step) r[n++] = M - 1;
  double *ref = malloc((size_t)(n * N) * sizeof *ref);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += A[r[i] * K + k] * B[k * N + j];
      ref[i * N + j] = s;
    }
  *rows = r;
  *nrow = n;
  return ref;
}

/* Relative error of the sampled rows of O (M x N) against ref. */
static double gs_err(const double *O, const double *ref, const int64_t *rows, int64_t nrow, int64_t N) {
  double *got = malloc((size_t)(nrow * N) * sizeof *got);
  for (int64_t i = 0; i < nrow; i++) memcpy(got + i * N, O + rows[i] * N, (size_t)N * sizeof *got);
  double e = gs_rel(got, ref, nrow * N);
  free(got);
  return e;
}

/* (r, c) operand stored row-major, or transposed (stored (c, r)), on the
 * CPU; *dev is the same view of a device copy of the stored tensor.
 * (Uploading the transposed view itself would give a contiguous device
 * tensor, and the kernel would never see the transposed layout.) */
static nb_tensor *gs_operand(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int trans,
                             nb_tensor **dev) {
  nb_tensor *st = trans ? randn(seed, 2, (int64_t[]){c, r}, dt) : randn(seed, 2, (int64_t[]){r, c}, dt);
  nb_tensor *g = gpu(st);
  *dev = trans ? nb_transpose(g, 0, 1) : g;
  return trans ? nb_transpose(st, 0, 1) : st;
}

static void gs_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, int ta, int tb, uint64_t seed) {
  nb_scope_begin();
  char name[96];
  snprintf(name, sizeof name, "gemm sm90 %c%c %lldx%lldx%lld [%s]", ta ? 'T' : 'N', tb ? 'T' : 'N',
           (long long)M, (long long)N, (long long)K, nb_dtype_name(dt));
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, dt, ta, &ga), *b = gs_operand(seed + 1, K, N, dt, tb, &gb);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(1);
#endif
  int64_t n0 = gs_launches();
  nb_tensor *own = nb_matmul(ga, gb);
  /* sizes that are multiples of 8 give 16-byte row strides in every layout:
   * such a product must reach the kernel, not the fallback */
  if (n0 >= 0 && M % 8 == 0 && N % 8 == 0 && K % 8 == 0)
    NBT_CHECK(gs_launches() == n0 + 1, "%s: ran the own kernel", name);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(0);
#endif
  nb_tensor *lt = nb_matmul(ga, gb);
  if (!own || !lt) {
    NBT_CHECK(0, "%s: NULL result (%s)", name, nb_last_error());
    nb_clear_error();
    nb_scope_end();
    return;
  }
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(own), *L = nbt_f64(lt);
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  double e_ref = gs_err(O, ref, rows, nrow, N), e_lt = gs_rel(O, L, M * N);
  NBT_CHECK(e_ref <= 1e-2, "%s: relative error vs float64 %g", name, e_ref);
  NBT_CHECK(e_lt <= 1e-2, "%s: relative difference vs cuBLASLt %g", name, e_lt);
  if (getenv("NABLA_TEST_VERBOSE")) printf("  %-44s ref %.2e  lt %.2e\n", name, e_ref, e_lt);
  free(rows); free(ref); free(A); free(B); free(O); free(L);
  nb_scope_end();
}

/* Split-K (few tiles, long K) gives the same bits on every run: the partial
 * tiles are added in a fixed order. */
static void gs_repeat(int64_t M, int64_t N, int64_t K, int ta, uint64_t seed) {
  nb_scope_begin();
  nb_tensor *ga, *gb;
  gs_operand(seed, M, K, NB_BF16, ta, &ga);
  gs_operand(seed + 1, K, N, NB_BF16, 0, &gb);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(1);
#endif
  nb_tensor *x = nb_matmul(ga, gb), *y = nb_matmul(ga, gb);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(0);
#endif
  char name[96];
  snprintf(name, sizeof name, "gemm sm90 repeat %c %lldx%lldx%lld", ta ? 'T' : 'N', (long long)M,
           (long long)N, (long long)K);
  cmp_bits(name, x, y);
  nb_scope_end();
}

#ifdef NABLA_HAVE_CUDA
/* Epilogue variants of nb_cuda_gemm_ex. */
enum { GE_BIAS = 1, GE_GELU = 2, GE_AUX = 4, GE_RESID = 8 };

static double ge_gelu(double x) {
  return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}

/* Runs nb_cuda_gemm_ex into fresh out (and aux) tensors of dtype od. */
static int ge_run(nb_tensor *ga, nb_tensor *gb, nb_tensor *bias, nb_tensor *c, int f, float alpha,
                  float beta, nb_dtype od, nb_tensor **out, nb_tensor **aux) {
  int64_t shape[2] = {nb_size(ga, 0), nb_size(gb, 1)};
  *out = nb_full(2, shape, NAN, od, G); /* poison: every element must be written */
  *aux = f & GE_AUX ? nb_full(2, shape, NAN, od, G) : NULL;
  nb_kview ko, ka, kb, kbias, kc, kaux;
  nb_kview_of(*out, &ko);
  nb_kview_of(ga, &ka);
  nb_kview_of(gb, &kb);
  if (bias) nb_kview_of(bias, &kbias);
  if (c) nb_kview_of(c, &kc);
  if (*aux) nb_kview_of(*aux, &kaux);
  nb_gemm_epilogue ep = {bias ? &kbias : NULL, c ? &kc : NULL, *aux ? &kaux : NULL, alpha, beta,
                         (f & GE_GELU) != 0};
  return nb_cuda_gemm_ex(&ko, &ka, &kb, &ep) == NB_OK;
}

/* One fused-epilogue case against a float64 reference (sampled rows) and
 * against the unfused path (cuBLASLt product + epilogue kernel). */
static void ge_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, nb_dtype od, int ta, int tb, int f,
                    uint64_t seed) {
  if (G.type == NB_CPU) return;
  nb_scope_begin();
  char name[128];
  snprintf(name, sizeof name, "gemm_ex %c%c %lldx%lldx%lld [%s->%s]%s%s%s%s", ta ? 'T' : 'N',
           tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, nb_dtype_name(dt),
           nb_dtype_name(od), f & GE_BIAS ? " bias" : "", f & GE_RESID ? " alpha,beta,c" : "",
           f & GE_GELU ? " gelu" : "", f & GE_AUX ? " aux" : "");
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, dt, ta, &ga), *b = gs_operand(seed + 1, K, N, dt, tb, &gb);
  nb_tensor *bias = f & GE_BIAS ? randn(seed + 2, 1, (int64_t[]){N}, od) : NULL;
  nb_tensor *c = f & GE_RESID ? randn(seed + 3, 2, (int64_t[]){M, N}, od) : NULL;
  float alpha = f & GE_RESID ? 0.75f : 1.0f, beta = f & GE_RESID ? -0.5f : 0.0f;
  nb_tensor *gbias = bias ? gpu(bias) : NULL, *gc = c ? gpu(c) : NULL;
  nb_tensor *out, *aux, *out2, *aux2;
  nb_cuda_set_gemm_backend(1);
  int64_t n0 = gs_launches();
  int ok = ge_run(ga, gb, gbias, gc, f, alpha, beta, od, &out, &aux);
  if (ok && n0 >= 0 && M % 8 == 0 && N % 8 == 0 && K % 8 == 0)
    NBT_CHECK(gs_launches() == n0 + 1, "%s: ran the own kernel", name);
  nb_cuda_set_gemm_backend(0);
  ok = ok && ge_run(ga, gb, gbias, gc, f, alpha, beta, od, &out2, &aux2);
  if (!ok) {
    NBT_CHECK(0, "%s: failed (%s)", name, nb_last_error());
    nb_clear_error();
    nb_scope_end();
    return;
  }
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(out), *O2 = nbt_f64(out2);
  double *BI = bias ? nbt_f64(bias) : NULL, *C = c ? nbt_f64(c) : NULL;
  double *X = aux ? nbt_f64(aux) : NULL, *X2 = aux ? nbt_f64(aux2) : NULL;
  int64_t step = M * N * K <= ((int64_t)1 << 27) ? 1 : (M + 60) / 61, nrow = 0;
  int64_t *rows = malloc((size_t)(M / step + 2) * sizeof *rows);
  for (int64_t r = 0; r < M; r += step) rows[nrow++] = r;
  if ((M - 1) % step) rows[nrow++] = M - 1;
  size_t n = (size_t)(nrow * N);
  double *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
  double *pref = malloc(n * sizeof *pref), *pgot = malloc(n * sizeof *pgot);
  for (int64_t i = 0; i < nrow; i++)
    for (int64_t j = 0; j < N; j++) {
      int64_t r = rows[i];
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += A[r * K + k] * B[k * N + j];
      double pre = alpha * s + (C ? beta * C[r * N + j] : 0.0) + (BI ? BI[j] : 0.0);
      ref[i * N + j] = f & GE_GELU ? ge_gelu(pre) : pre;
      got[i * N + j] = O[r * N + j];
      pref[i * N + j] = pre;
      pgot[i * N + j] = X ? X[r * N + j] : pre;
    }
  double e_ref = gs_rel(got, ref, (int64_t)n), e_un = gs_rel(O, O2, M * N);
  double e_aux = gs_rel(pgot, pref, (int64_t)n), e_aux2 = X ? gs_rel(X, X2, M * N) : 0.0;
  double lim = od == NB_F32 && dt == NB_F16 ? 2e-3 : 1e-2;
  NBT_CHECK(e_ref <= lim, "%s: relative error vs float64 %g", name, e_ref);
  NBT_CHECK(e_un <= lim, "%s: relative difference vs the unfused path %g", name, e_un);
  NBT_CHECK(e_aux <= lim && e_aux2 <= lim, "%s: pre-activation error vs float64 %g, vs unfused %g",
            name, e_aux, e_aux2);
  if (getenv("NABLA_TEST_VERBOSE"))
    printf("  %-64s ref %.2e  unfused %.2e  aux %.2e\n", name, e_ref, e_un, e_aux);
  free(rows); free(ref); free(got); free(pref); free(pgot);
  free(A); free(B); free(O); free(O2); free(BI); free(C); free(X); free(X2);
  nb_scope_end();
}

/* Bad calls are errors naming the problem, never a crash. */
static void ge_errors(void) {
  if (G.type == NB_CPU) return;
  nb_scope_begin();
  nb_tensor *a = gpu(randn(1, 2, (int64_t[]){8, 16}, NB_BF16)), *b = gpu(randn(2, 2, (int64_t[]){16, 24}, NB_BF16));
  nb_tensor *o = nb_empty(2, (int64_t[]){8, 24}, NB_BF16, G), *bad = gpu(randn(3, 1, (int64_t[]){23}, NB_BF16));
  nb_tensor *o16 = nb_empty(2, (int64_t[]){8, 24}, NB_F16, G);
  nb_kview ko, ka, kb, kbad, ko16;
  nb_kview_of(o, &ko); nb_kview_of(a, &ka); nb_kview_of(b, &kb); nb_kview_of(bad, &kbad);
  nb_kview_of(o16, &ko16);
  nb_gemm_epilogue ep = {&kbad, NULL, NULL, 1.0f, 0.0f, 1};
  NBT_CHECK(nb_cuda_gemm_ex(&ko, &ka, &kb, &ep) == NB_ERR_SHAPE && strstr(nb_last_error(), "bias"),
            "gemm_ex: a (23,) bias for 24 columns is a shape error naming bias (%s)", nb_last_error());
  nb_clear_error();
  NBT_CHECK(nb_cuda_gemm_ex(&ko16, &ka, &kb, NULL) == NB_ERR_DTYPE, "gemm_ex: bf16 operands into an f16 out is a dtype error");
  nb_clear_error();
  NBT_CHECK(nb_cuda_gemm_ex(&ko, &kb, &ka, NULL) == NB_ERR_SHAPE, "gemm_ex: mismatched shapes are a shape error");
  nb_clear_error();
  nb_scope_end();
}
#endif

static void test_gemm_sm90(void) {
  static const int64_t small[][3] = {{1, 1, 1}, {127, 129, 67}, {8, 8, 8}, {127, 136, 72},
                                     {131, 264, 200}, {256, 512, 64}, {1000, 1000, 64}};
  /* the last three take the split schedule for few tiles: the GPT-2 qkv
   * weight gradient; 24 tiles of 65 k-tiles with tails in M, N and K; 4
   * tiles of 1024 k-tiles. Their sizes are multiples of 8, so every layout
   * reaches the own kernel (a row stride must be a multiple of 16 bytes) */
  static const int64_t big[][3] = {{4096, 4096, 4096}, {16384, 768, 2304}, {16384, 2304, 768},
                                   {2304, 768, 16384}, {1000, 520, 4136}, {136, 264, 65536}};
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  uint64_t seed = 9000;
  for (int d = 0; d < 2; d++)
    for (int lay = 0; lay < 4; lay++) {
      int ta = lay & 1, tb = lay >> 1;
      for (size_t s = 0; s < sizeof small / sizeof *small; s++, seed += 2)
        gs_case(small[s][0], small[s][1], small[s][2], dts[d], ta, tb, seed);
      for (size_t s = 0; !quick && s < sizeof big / sizeof *big; s++, seed += 2)
        if (d == 0 || s == 0 || s == 4) gs_case(big[s][0], big[s][1], big[s][2], dts[d], ta, tb, seed);
    }
  if (quick) gs_case(1000, 520, 4136, NB_BF16, 1, 0, seed++); /* split schedule under the sanitizer */
  gs_repeat(1000, 520, 4136, 1, seed++);
  gs_repeat(136, 264, 65536, 0, seed++);
  /* batched rows folded into M: (3, M, K) @ (K, N) with b broadcast, NT and NN */
  for (int tb = 0; tb < 2; tb++) {
    nb_scope_begin();
    int64_t M = 100, K = 136, N = 264;
    nb_tensor *a = randn(seed++, 3, (int64_t[]){3, M, K}, NB_BF16);
    nb_tensor *gb, *b = gs_operand(seed++, K, N, NB_BF16, tb, &gb);
#ifdef NABLA_HAVE_CUDA
    nb_cuda_set_gemm_backend(1);
#endif
    cmp(tb ? "gemm sm90 batched NT" : "gemm sm90 batched NN", NB_BF16, nb_matmul(a, b),
        nb_matmul(gpu(a), gb), sqrt((double)K) * 2.0);
#ifdef NABLA_HAVE_CUDA
    nb_cuda_set_gemm_backend(0);
#endif
    nb_scope_end();
  }
#ifdef NABLA_HAVE_CUDA
  /* fused epilogues: every variant on a tail shape in every layout, both
   * operand dtypes, both output dtypes; prime sizes (direct stores: N odd
   * rows are not 16-byte aligned) and aligned tails (TMA stores) */
  static const int64_t eshape[][3] = {{131, 264, 200}, {264, 1000, 136}, {67, 131, 136}};
  static const int flags[] = {GE_BIAS, GE_BIAS | GE_GELU, GE_BIAS | GE_GELU | GE_AUX, GE_RESID,
                              GE_RESID | GE_BIAS | GE_GELU | GE_AUX, GE_GELU};
  for (int lay = 0; lay < 4; lay++)
    for (size_t s = 0; s < sizeof eshape / sizeof *eshape; s++)
      for (size_t fi = 0; fi < sizeof flags / sizeof *flags; fi++)
        for (int d = 0; d < 2; d++) {
          nb_dtype od = fi % 2 ? dts[d] : NB_F32;
          ge_case(eshape[s][0], eshape[s][1], eshape[s][2], dts[d], od, lay & 1, lay >> 1, flags[fi], seed++);
        }
  if (!quick) { /* GPT-2 mlp fc forward with bias + GELU + pre-activation; a split-K dW shape */
    ge_case(16384, 3072, 768, NB_BF16, NB_BF16, 0, 1, GE_BIAS | GE_GELU | GE_AUX, seed++);
    ge_case(2304, 768, 16384, NB_BF16, NB_F32, 1, 0, GE_RESID, seed++);
  }
  ge_case(1000, 520, 4136, NB_BF16, NB_BF16, 1, 0, GE_BIAS | GE_GELU, seed++);
  ge_errors();
#endif
}

/* ==== autotuning of the own sm_90a GEMM (gemm_sm90.cu, backend/autotune.c) =====
 * Every schedule candidate, forced with nb_tune_force, on shapes where they
 * differ: a float64 reference as in "gemm sm90", and candidate 0 (the
 * heuristic, the choice when tuning is off). On the multi-wave shape every
 * candidate but "stream-k" keeps each tile's k sum in one CTA, so it must
 * give candidate 0's bits; elsewhere the results may differ by rounding only
 * (relative Frobenius difference below the output dtype's unit roundoff).
 * Fused epilogues run under every candidate too. Then the cache: tuning off
 * writes nothing; NABLA_AUTOTUNE=1 (cache file in a temporary directory)
 * tunes on first use (more than one launch) and writes the key's line; after
 * nb_tune_reset, as in a new process, the choice is read back (one launch,
 * the same bits), a fused call of the same problem shares it, and a fused
 * call of a new problem whose c is its own output (out += a @ b) tunes
 * without adding c twice. */
#include "backend/autotune.h"

static int gt_ncand(void) {
  int n = 1;
#ifdef NABLA_HAVE_CUDA
  while (nb_cuda_gemm_own_candidate(n)) n++;
#endif
  return n;
}

static const char *gt_name(int i) {
#ifdef NABLA_HAVE_CUDA
  return nb_cuda_gemm_own_candidate(i);
#else
  return i ? NULL : "default";
#endif
}

static void gt_backend(int own) {
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(own);
#endif
  (void)own;
}

/* Unit roundoff of the output dtype (f32: its accumulation differences). */
static double gt_unit(nb_dtype dt) { return dt == NB_BF16 ? 0x1p-8 : dt == NB_F16 ? 0x1p-11 : 1e-5; }

/* Every candidate on one problem (test layout flags as in gs_case). */
static void gt_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, int ta, int tb, int bits,
                    uint64_t seed) {
  nb_scope_begin();
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, dt, ta, &ga), *b = gs_operand(seed + 1, K, N, dt, tb, &gb);
  double *A = nbt_f64(a), *B = nbt_f64(b), *O0 = NULL;
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  size_t bytes = (size_t)(M * N) * nb_dtype_size(dt);
  char *bits0 = malloc(bytes), *bitsi = malloc(bytes);
  gt_backend(1);
  for (int i = 0; i < gt_ncand(); i++) {
    char name[128];
    snprintf(name, sizeof name, "gemm tune %c%c %lldx%lldx%lld [%s] candidate %d (%s)", ta ? 'T' : 'N',
             tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, nb_dtype_name(dt), i, gt_name(i));
    nb_tune_force(i);
    int64_t n0 = gs_launches();
    nb_tensor *o = nb_matmul(ga, gb);
    if (n0 >= 0) NBT_CHECK(gs_launches() == n0 + 1, "%s: one launch of the own kernel", name);
    double *O = o ? nbt_f64(o) : NULL;
    if (!O || nb_to_host(o, i ? bitsi : bits0, bytes) != NB_OK) {
      NBT_CHECK(0, "%s: failed (%s)", name, nb_last_error());
      nb_clear_error();
      free(O);
      break;
    }
    double e_ref = gs_err(O, ref, rows, nrow, N), e_0 = i ? gs_rel(O, O0, M * N) : 0;
    NBT_CHECK(e_ref <= 1e-2, "%s: relative error vs float64 %g", name, e_ref);
    if (i && bits && strcmp(gt_name(i), "stream-k") != 0)
      NBT_CHECK(memcmp(bits0, bitsi, bytes) == 0, "%s: the bits of candidate 0", name);
    else
      NBT_CHECK(e_0 <= gt_unit(dt), "%s: differs from candidate 0 by %g (more than rounding)", name, e_0);
    if (getenv("NABLA_TEST_VERBOSE")) printf("  %-70s ref %.2e  cand0 %.2e\n", name, e_ref, e_0);
    if (i) free(O);
    else O0 = O;
  }
  nb_tune_force(-1);
  gt_backend(0);
  free(A); free(B); free(O0); free(ref); free(rows); free(bits0); free(bitsi);
  nb_scope_end();
}

/* Bytes of out on the host (malloc'd; NULL on failure). */
static char *gt_bytes(const nb_tensor *t) {
  size_t n = t ? (size_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t)) : 0;
  char *p = t ? malloc(n) : NULL;
  if (p && nb_to_host(t, p, n) != NB_OK) {
    free(p);
    p = NULL;
  }
  return p;
}

/* Lines of the cache file containing text. */
static int gt_lines(const char *path, const char *text) {
  FILE *f = fopen(path, "r");
  char line[512];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += strstr(line, text) != NULL;
  if (f) fclose(f);
  return n;
}

#ifdef NABLA_HAVE_CUDA
/* out = out + a @ b through nb_cuda_gemm_ex with c the output itself, against
 * float64; *launched: own-kernel launches it took. */
static void gt_inplace(int64_t M, int64_t N, int64_t K, uint64_t seed, int64_t *launched) {
  nb_scope_begin();
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, NB_BF16, 0, &ga), *b = gs_operand(seed + 1, K, N, NB_BF16, 1, &gb);
  nb_tensor *c0 = randn(seed + 2, 2, (int64_t[]){M, N}, NB_F32), *out = gpu(c0);
  nb_kview ko, ka, kb;
  nb_kview_of(out, &ko);
  nb_kview_of(ga, &ka);
  nb_kview_of(gb, &kb);
  nb_gemm_epilogue ep = {NULL, &ko, NULL, 1.0f, 1.0f, 0};
  int64_t n0 = gs_launches();
  nb_status st = nb_cuda_gemm_ex(&ko, &ka, &kb, &ep);
  *launched = gs_launches() - n0;
  double *A = nbt_f64(a), *B = nbt_f64(b), *C = nbt_f64(c0), *O = nbt_f64(out);
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  for (int64_t i = 0; i < nrow; i++)
    for (int64_t j = 0; j < N; j++) ref[i * N + j] += C[rows[i] * N + j];
  double e = st == NB_OK ? gs_err(O, ref, rows, nrow, N) : INFINITY;
  NBT_CHECK(e <= 1e-4, "gemm tune: out += a @ b in place (c is out), tuned: relative error %g (%s)", e,
            st ? nb_last_error() : "");
  nb_clear_error();
  free(A); free(B); free(C); free(O); free(ref); free(rows);
  nb_scope_end();
}
#endif

/* NABLA_AUTOTUNE with the cache in a temporary directory. */
static void gt_cache(uint64_t seed) {
  const char *e1 = getenv("NABLA_AUTOTUNE"), *e2 = getenv("NABLA_AUTOTUNE_CACHE");
  char *old_on = e1 ? strdup(e1) : NULL, *old_path = e2 ? strdup(e2) : NULL;
  char dir[] = "/tmp/nabla-tune-XXXXXX", path[64];
  if (!mkdtemp(dir)) {
    NBT_CHECK(0, "gemm tune: mkdtemp failed");
    free(old_on);
    free(old_path);
    return;
  }
  snprintf(path, sizeof path, "%s/autotune.txt", dir);
  setenv("NABLA_AUTOTUNE_CACHE", path, 1);
  unsetenv("NABLA_AUTOTUNE");
  nb_tune_reset();
  nb_scope_begin();
  /* the split-K shape, A transposed: key .../gemm_sm90/bf16/TN/1024x1024x8192 */
  int64_t M = 1000, N = 520, K = 4136;
  const char *key = "/gemm_sm90/bf16/TN/1024x1024x8192\t";
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, NB_BF16, 1, &ga), *b = gs_operand(seed + 1, K, N, NB_BF16, 0, &gb);
  double *A = nbt_f64(a), *B = nbt_f64(b);
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  gt_backend(1);
  int64_t n0 = gs_launches(), dev = n0 >= 0; /* the own kernel runs here */
  nb_tensor *off = nb_matmul(ga, gb);
  if (dev) NBT_CHECK(gs_launches() == n0 + 1, "gemm tune: tuning off: one launch, no timing");
  NBT_CHECK(access(path, F_OK) != 0, "gemm tune: tuning off writes no cache file");
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  n0 = gs_launches();
  nb_tensor *tuned = nb_matmul(ga, gb);
  int64_t tuning = gs_launches() - n0;
  if (dev) {
    NBT_CHECK(tuning > 1, "gemm tune: NABLA_AUTOTUNE=1 times the candidates (%lld launches)", (long long)tuning);
    NBT_CHECK(gt_lines(path, key) == 1, "gemm tune: one cache line for %s in %s", key, path);
  }
  double *O = tuned ? nbt_f64(tuned) : NULL, *F = off ? nbt_f64(off) : NULL;
  double e_ref = O ? gs_err(O, ref, rows, nrow, N) : INFINITY, e_off = O && F ? gs_rel(O, F, M * N) : INFINITY;
  NBT_CHECK(e_ref <= 1e-2, "gemm tune: tuned product vs float64 %g (%s)", e_ref, O ? "" : nb_last_error());
  NBT_CHECK(e_off <= gt_unit(NB_BF16), "gemm tune: tuned vs untuned differ by %g (more than rounding)", e_off);
  nb_clear_error();
  /* as a new process would: the table is forgotten, the file read back */
  char *tb = gt_bytes(tuned);
  for (int on = 1; on >= 0; on--) {
    if (on) setenv("NABLA_AUTOTUNE", "1", 1);
    else unsetenv("NABLA_AUTOTUNE");
    nb_tune_reset();
    n0 = gs_launches();
    char *rb = gt_bytes(nb_matmul(ga, gb));
    if (dev) {
      NBT_CHECK(gs_launches() == n0 + 1, "gemm tune: reloaded choice (tuning %s): one launch, no timing",
                on ? "on" : "off");
      NBT_CHECK(tb && rb && !memcmp(tb, rb, (size_t)(M * N) * 2),
                "gemm tune: reloaded choice (tuning %s): the tuned call's bits", on ? "on" : "off");
    }
    free(rb);
  }
  free(tb);
#ifdef NABLA_HAVE_CUDA
  if (dev) {
    /* a fused call of the same problem shares the plain product's choice */
    setenv("NABLA_AUTOTUNE", "1", 1);
    nb_tune_reset();
    nb_tensor *fo = nb_empty(2, (int64_t[]){M, N}, NB_BF16, G);
    nb_kview ko, ka, kb;
    nb_kview_of(fo, &ko);
    nb_kview_of(ga, &ka);
    nb_kview_of(gb, &kb);
    nb_gemm_epilogue ep = {NULL, NULL, NULL, 0.5f, 0.0f, 1};
    n0 = gs_launches();
    NBT_CHECK(nb_cuda_gemm_ex(&ko, &ka, &kb, &ep) == NB_OK && gs_launches() == n0 + 1 &&
                  gt_lines(path, "/gemm_sm90/") == 1,
              "gemm tune: a fused call shares the plain product's cached choice (%s)", nb_last_error());
    nb_clear_error();
    /* a new problem, fused, its c its own output (f32): tuned into scratch */
    int64_t launched = 0;
    gt_inplace(520, 1032, 776, seed + 7, &launched);
    NBT_CHECK(launched > 1 && gt_lines(path, "/gemm_sm90/bf16-f32/NT/1024x2048x1024\t") == 1,
              "gemm tune: the fused f32 call tuned (%lld launches) and wrote its line", (long long)launched);
  }
#endif
  gt_backend(0);
  free(A); free(B); free(ref); free(rows); free(O); free(F);
  nb_scope_end();
  if (old_on) setenv("NABLA_AUTOTUNE", old_on, 1);
  else unsetenv("NABLA_AUTOTUNE");
  if (old_path) setenv("NABLA_AUTOTUNE_CACHE", old_path, 1);
  else unsetenv("NABLA_AUTOTUNE_CACHE");
  free(old_on);
  free(old_path);
  nb_tune_reset();
  remove(path);
  rmdir(dir);
}

static void test_gemm_tune(void) {
  uint64_t seed = 15000;
  /* 17 x 9 = 153 tiles, more than any H100's SMs: data-parallel by default */
  gt_case(2176, 2304, 520, NB_BF16, 0, 1, 1, seed += 2);
  /* 8 x 3 tiles over 65 k-tiles: split-K (4 parts) by default; TN, tails in M, N, K */
  gt_case(1000, 520, 4136, NB_BF16, 1, 0, 0, seed += 2);
  if (!quick) {
    gt_case(1000, 1000, 64, NB_F16, 0, 0, 0, seed += 2); /* one k-tile: forced stream-K has empty ranges */
    gt_case(2304, 768, 4096, NB_F16, 1, 1, 0, seed += 2); /* TT, 18 tile rows: every raster group differs */
  }
#ifdef NABLA_HAVE_CUDA
  /* fused epilogues under every candidate (own path against cuBLASLt + epilogue kernel) */
  for (int i = 0; G.type != NB_CPU && i < gt_ncand(); i++) {
    nb_tune_force(i);
    ge_case(1000, 520, 4136, NB_BF16, NB_BF16, 1, 0, GE_BIAS | GE_GELU | GE_RESID, seed++);
    ge_case(2176, 2304, 520, NB_BF16, NB_F32, 0, 1, GE_BIAS | GE_AUX, seed++);
  }
  nb_tune_force(-1);
#endif
  nb_tune_reset();
  gt_cache(seed + 10);
}

/* ==== portable GEMM (sm80 path) (src/backend/cuda/gemm_sm80.cu) ================
 * nb_sm80_gemm is called directly on views of device tensors: the operand
 * views (transposed, column-sliced, offset by one element) are made on the
 * device, so the kernel sees their strides. Plain outputs are poisoned with
 * NaN first (beta = 0 must neither read nor skip them); with beta != 0 they
 * hold random values that the kernel scales. Each result is checked against
 * a float64 reference (sampled rows for large shapes) and, where it computes
 * the same product, against cuBLASLt, by the relative Frobenius error.
 * The last checks go through nb_matmul with the switch set to the portable
 * path (value 2, NABLA_GEMM=sm80), batched included. */
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/gemm_sm80.h"

/* Operand kinds: 0 row-major, 1 transposed (MN-major), 2 every other column
 * (column stride 2), 3 columns [1, c] of an (r, c + 1) tensor (base and row
 * stride not 16-byte aligned). The view of the same values on the CPU and on
 * the device. */
static const char *const GP_KIND = "NTSO";
static void gp_operand(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int kind, nb_tensor **cpu,
                       nb_tensor **dev) {
  int64_t shape[2] = {r, c};
  if (kind == 1) { shape[0] = c; shape[1] = r; }
  if (kind == 2) shape[1] = 2 * c;
  if (kind == 3) shape[1] = c + 1;
  nb_tensor *base = randn(seed, 2, shape, dt), *views[2] = {base, gpu(base)};
  for (int i = 0; i < 2; i++) {
    nb_tensor *v = views[i];
    if (kind == 1) v = nb_transpose(v, 0, 1);
    if (kind == 2) v = nb_slice(v, 1, 0, 2 * c, 2);
    if (kind == 3) v = nb_slice(v, 1, 1, c + 1, 1);
    views[i] = v;
  }
  *cpu = views[0];
  *dev = views[1];
}

static int64_t gp_nonfinite(const double *x, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += !isfinite(x[i]);
  return bad;
}

/* Relative Frobenius error of O (M x N) against alpha * A B + beta * C0 (C0
 * may be NULL), over every row when the product is small, else about 61
 * spread rows and the last. */
static double gp_error(const double *A, const double *B, const double *C0, const double *O,
                       int64_t M, int64_t N, int64_t K, double alpha, double beta) {
  int64_t step = M * N * K <= ((int64_t)1 << 27) ? 1 : (M + 60) / 61;
  double num = 0, den = 0;
  /* rows 0, step, 2 step, ... and then M - 1 */
  for (int64_t r = 0; r < M; r = (r + step < M || r == M - 1) ? r + step : M - 1) {
    for (int64_t n = 0; n < N; n++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += A[r * K + k] * B[k * N + n];
      s = alpha * s + (C0 ? beta * C0[r * N + n] : 0.0);
      double e = O[r * N + n] - s;
      if (O[r * N + n] != O[r * N + n]) return INFINITY;
      num += e * e;
      den += s * s;
    }
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* bf16 operands and output: a few roundings of 2^-8; f16: of 2^-11; an f32
 * output keeps only the f32 accumulation error. */
static double gp_limit(nb_dtype dt, nb_dtype odt) {
  return odt == NB_F32 ? 1e-4 : dt == NB_F16 ? 1e-3 : 1e-2;
}

/* out (M, N, dtype odt) = alpha * a @ b + beta * out through nb_sm80_gemm. */
static void gp_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, int ka, int kb, nb_dtype odt,
                    double alpha, double beta, uint64_t seed) {
  nb_scope_begin();
  char name[128];
  snprintf(name, sizeof name, "gemm sm80 %c%c %lldx%lldx%lld [%s -> %s] alpha %g beta %g",
           GP_KIND[ka], GP_KIND[kb], (long long)M, (long long)N, (long long)K, nb_dtype_name(dt),
           nb_dtype_name(odt), alpha, beta);
  nb_tensor *a, *ga, *b, *gb;
  gp_operand(seed, M, K, dt, ka, &a, &ga);
  gp_operand(seed + 1, K, N, dt, kb, &b, &gb);
  int64_t os[2] = {M, N};
  nb_tensor *c0 = beta != 0 ? randn(seed + 2, 2, os, odt) : NULL;
  nb_tensor *out = c0 ? gpu(c0) : nb_empty(2, os, odt, G); /* the upload is a copy */
  if (!c0) nb_fill_(out, NAN);
  nb_kview vo, va, vb;
  nb_kview_of(out, &vo);
  nb_kview_of(ga, &va);
  nb_kview_of(gb, &vb);
  nb_status st = nb_sm80_gemm(&vo, &va, &vb, (float)alpha, (float)beta);
  NBT_CHECK(st == NB_OK, "%s: status %s (%s)", name, nb_status_name(st), nb_last_error());
  nb_clear_error();
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(out), *C0 = c0 ? nbt_f64(c0) : NULL;
  int64_t bad = gp_nonfinite(O, M * N);
  NBT_CHECK(bad == 0, "%s: %lld outputs unwritten (still NaN) or not finite", name, (long long)bad);
  double lim = gp_limit(dt, odt), e_ref = gp_error(A, B, C0, O, M, N, K, alpha, beta), e_lt = 0;
  NBT_CHECK(e_ref <= lim, "%s: relative error vs float64 %g (limit %g)", name, e_ref, lim);
  if (odt == dt && alpha == 1 && beta == 0) { /* the same product through cuBLASLt */
    nb_cuda_set_gemm_backend(0);
    double *L = nbt_f64(nb_matmul(ga, gb));
    e_lt = L ? gs_rel(O, L, M * N) : INFINITY;
    NBT_CHECK(e_lt <= lim, "%s: relative difference vs cuBLASLt %g (limit %g)", name, e_lt, lim);
    free(L);
  }
  if (getenv("NABLA_TEST_VERBOSE")) printf("  %-60s ref %.2e  lt %.2e\n", name, e_ref, e_lt); /* lt 0: not compared */
  free(A); free(B); free(O); free(C0);
  nb_scope_end();
}

/* Batched: out (2, 3, M, N) poisoned; a (2, 3, M, K) taken from a (2, 4, K, M)
 * tensor (MN-major, batch axes that do not merge: a host loop over grid.z
 * launches); b (K, N) broadcast over the batch (batch stride 0). */
static void gp_batched(nb_dtype dt, int64_t M, int64_t N, int64_t K, uint64_t seed) {
  nb_scope_begin();
  char name[96];
  snprintf(name, sizeof name, "gemm sm80 batched (2, 3) x %lldx%lldx%lld [%s]", (long long)M,
           (long long)N, (long long)K, nb_dtype_name(dt));
  nb_tensor *base = randn(seed, 4, (int64_t[]){2, 4, K, M}, dt);
  nb_tensor *a = nb_transpose(nb_slice(base, 1, 0, 3, 1), 2, 3);
  nb_tensor *ga = nb_transpose(nb_slice(gpu(base), 1, 0, 3, 1), 2, 3);
  nb_tensor *b = randn(seed + 1, 2, (int64_t[]){K, N}, dt), *gb = gpu(b);
  int64_t os[4] = {2, 3, M, N}, bs[4] = {2, 3, K, N};
  nb_tensor *out = nb_empty(4, os, dt, G);
  nb_fill_(out, NAN);
  nb_kview vo, va, vb;
  nb_kview_of(out, &vo);
  nb_kview_of(ga, &va);
  NBT_CHECK(nb_kview_broadcast(gb, 4, bs, &vb) == 0, "%s: broadcast view of b", name);
  nb_status st = nb_sm80_gemm(&vo, &va, &vb, 1.0f, 0.0f);
  NBT_CHECK(st == NB_OK, "%s: status %s (%s)", name, nb_status_name(st), nb_last_error());
  nb_clear_error();
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(out), worst = 0;
  int64_t bad = gp_nonfinite(O, 6 * M * N);
  NBT_CHECK(bad == 0, "%s: %lld outputs unwritten (still NaN) or not finite", name, (long long)bad);
  for (int64_t i = 0; i < 6; i++) {
    double e = gp_error(A + i * M * K, B, NULL, O + i * M * N, M, N, K, 1.0, 0.0);
    worst = e > worst ? e : worst;
  }
  NBT_CHECK(worst <= gp_limit(dt, dt), "%s: worst batch relative error vs float64 %g", name, worst);
  free(A); free(B); free(O);
  nb_scope_end();
}

/* nb_matmul with the switch on the portable path: (3, M, K) @ (K, N) and a
 * transposed batched a, against float64. */
static void gp_switch(nb_dtype dt, int tb, uint64_t seed) {
  nb_scope_begin();
  int64_t M = 100, K = 72, N = 136;
  nb_tensor *a = randn(seed, 3, (int64_t[]){3, M, K}, dt), *b, *gb;
  gp_operand(seed + 1, K, N, dt, tb, &b, &gb);
  nb_cuda_set_gemm_backend(2);
  nb_tensor *o = nb_matmul(gpu(a), gb);
  nb_cuda_set_gemm_backend(0);
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = o ? nbt_f64(o) : NULL, worst = O ? 0 : INFINITY;
  for (int64_t i = 0; O && i < 3; i++) {
    double e = gp_error(A + i * M * K, B, NULL, O + i * M * N, M, N, K, 1.0, 0.0);
    worst = e > worst ? e : worst;
  }
  NBT_CHECK(worst <= gp_limit(dt, dt), "gemm sm80 via NABLA_GEMM=sm80 switch, batched, b %s [%s]: "
            "relative error %g (%s)", tb ? "transposed" : "row-major", nb_dtype_name(dt), worst,
            o ? "" : nb_last_error());
  nb_clear_error();
  free(A); free(B); free(O);
  nb_scope_end();
}

static void test_gemm_sm80(void) {
  if (G.type == NB_CPU) return; /* device-only: calls the kernel entry directly */
  static const int64_t shapes[][3] = {
      {1, 1, 1},      {8, 8, 8},       {127, 131, 67},  {131, 127, 128},  {129, 136, 72},
      {64, 64, 32},   {128, 128, 32},  {200, 264, 136}, {255, 257, 129},  {17, 1000, 40},
      {1000, 24, 200}, {384, 384, 384}, {1000, 1000, 64}};
  const int nquick = 9; /* compute-sanitizer: the first shapes only */
  const int nshapes = quick ? nquick : (int)(sizeof shapes / sizeof *shapes);
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  uint64_t seed = 12000;
  for (int d = 0; d < 2; d++)
    for (int lay = 0; lay < 4; lay++)
      for (int s = 0; s < nshapes; s++, seed += 3)
        gp_case(shapes[s][0], shapes[s][1], shapes[s][2], dts[d], lay & 1, lay >> 1, dts[d], 1, 0, seed);
  /* element-load path: strided and misaligned operands, with either partner */
  static const int64_t odd[][3] = {{127, 131, 67}, {200, 264, 136}, {64, 72, 40}};
  for (int k = 2; k < 4; k++)
    for (int s = 0; s < 3; s++, seed += 6) {
      gp_case(odd[s][0], odd[s][1], odd[s][2], NB_BF16, k, s % 2, NB_BF16, 1, 0, seed);
      gp_case(odd[s][0], odd[s][1], odd[s][2], NB_F16, s % 2, k, NB_F16, 1, 0, seed + 3);
    }
  /* f32 output, alpha and beta (beta reads the output's random values) */
  gp_case(127, 131, 67, NB_BF16, 0, 1, NB_F32, 1, 0, seed++);
  gp_case(256, 264, 136, NB_F16, 1, 0, NB_F32, 0.5, -1.25, seed++);
  gp_case(129, 136, 72, NB_BF16, 0, 0, NB_BF16, -2, 0.5, seed++);
  gp_case(200, 130, 96, NB_F16, 1, 1, NB_F16, 0.75, 1, seed++);
  gp_case(64, 64, 0, NB_BF16, 0, 0, NB_F32, 1, 0.5, seed++); /* K = 0: out = beta * out */
  gp_case(256, 264, 4096, NB_BF16, 1, 0, NB_F32, 0.5, -1.25, seed++); /* split-K into 16 */
  /* large shapes (sampled rows): 128x128 (4096^3, GPT-2 qkv forward; tails
   * with K = 67: element loads), split-K 128x128 (dW = dY^T @ X; TT).
   * NABLA_SM80_TILE=small|large|wide|wide64 runs every case on one tile. */
  if (!quick) {
    gp_case(4096, 4096, 4096, NB_BF16, 0, 0, NB_BF16, 1, 0, seed++);
    gp_case(16384, 2304, 768, NB_BF16, 0, 1, NB_BF16, 1, 0, seed++);
    gp_case(768, 2304, 16384, NB_BF16, 1, 0, NB_BF16, 1, 0, seed++);
    gp_case(2048, 1024, 1024, NB_F16, 1, 1, NB_F16, 1, 0, seed++);
    gp_case(2049, 1153, 67, NB_BF16, 0, 0, NB_BF16, 1, 0, seed++);
    gp_case(2049, 1153, 200, NB_F16, 1, 1, NB_F16, 1, 0, seed++);
  }
  for (int d = 0; d < 2; d++) {
    gp_batched(dts[d], 100, 72, 40, seed++);
    gp_batched(dts[d], 33, 17, 9, seed++);
    gp_switch(dts[d], d, seed++);
  }
  /* bad input: an error naming the op and the dtypes, no launch */
  nb_scope_begin();
  nb_tensor *x = gpu(randn(seed, 2, (int64_t[]){4, 4}, NB_F32));
  nb_kview v;
  nb_kview_of(x, &v);
  nbt_check_error("gemm sm80 f32 operands", nb_sm80_gemm(&v, &v, &v, 1.0f, 0.0f) != NB_OK,
                  NB_ERR_DTYPE, "matmul sm80", "f32", NULL);
  nb_tensor *y = gpu(randn(seed, 2, (int64_t[]){4, 5}, NB_BF16)), *z = gpu(randn(seed, 2, (int64_t[]){4, 4}, NB_BF16));
  nb_kview vy, vz;
  nb_kview_of(y, &vy);
  nb_kview_of(z, &vz);
  nbt_check_error("gemm sm80 shapes", nb_sm80_gemm(&vz, &vy, &vz, 1.0f, 0.0f) != NB_OK,
                  NB_ERR_SHAPE, "matmul sm80", "[4, 5]", NULL);
  nb_scope_end();
}
#else
static void test_gemm_sm80(void) {}
#endif

/* ==== a whole training step (tools/gpt.c) ====================================
 * The main job's model, small: the same weights on the CPU and the GPU, one
 * forward, backward, gradient clipping and AdamW step on each, every loss,
 * gradient and updated parameter compared. Ops that pass alone can still
 * fail together (a view the op tests never make, a shape such as vocab 12, the
 * ignored targets of the addition task); this is where that shows. */
#include "gpt.h"

static void gpt_copy_weights(const gpt_model *dst, const gpt_model *src) {
  nb_no_grad_begin();
  for (int i = 0; i < nb_params_count(src->all); i++)
    NBT_CHECK(nb_copy_(nb_params_get(dst->all, i), nb_params_get(src->all, i)) == NB_OK,
              "gpt: copying %s: %s", nb_params_name(src->all, i), nb_last_error());
  nb_no_grad_end();
}

/* Loss and gradients of one batch (NAN on error). */
static double gpt_grads(gpt_model *m, const int64_t *x, const int64_t *y, int B, int T) {
  nb_scope_begin();
  nb_tensor *idx = nb_from_buffer(x, 2, (int64_t[]){B, T}, NB_I64, m->device);
  nb_tensor *tgt = nb_from_buffer(y, 2, (int64_t[]){B, T}, NB_I64, m->device);
  nb_tensor *loss = gpt_loss(m, idx, tgt);
  double value = loss && nb_backward(loss, NULL) == NB_OK ? nb_item(loss) : NAN;
  nb_scope_end();
  return value;
}

/* Clipping and one AdamW step; returns the norm before clipping (NAN on error). */
static double gpt_update(gpt_model *m) {
  double norm = nb_clip_grad_norm(m->all, 1.0);
  nb_optim *opt = nb_adamw_new(m->all, 1e-3, 0.9, 0.95, 1e-8, 0.1);
  if (!opt || nb_optim_step(opt) != NB_OK) norm = NAN;
  nb_optim_free(opt);
  return norm;
}

/* Every parameter's gradient (grads) or value, CUDA against CPU. */
static void gpt_cmp_params(const gpt_model *mc, const gpt_model *mg, int grads, const char *what) {
  for (int i = 0; i < nb_params_count(mc->all); i++) {
    char name[128];
    snprintf(name, sizeof name, "gpt step (vocab %d): %s of %s", mc->cfg.vocab, what,
             nb_params_name(mc->all, i));
    nb_tensor *c = nb_params_get(mc->all, i), *g = nb_params_get(mg->all, i);
    /* summed over many rows in another order (and through tensor cores) */
    cmp(name, NB_F32, grads ? nb_grad(c) : c, grads ? nb_grad(g) : g, 5.0);
  }
}

static void gpt_step_case(gpt_config cfg, int B, int ignored, uint64_t seed) {
  nb_rng r1 = nb_rng_new(seed), r2 = nb_rng_new(seed);
  gpt_model *mc = gpt_new(cfg, NB_DEVICE_CPU, &r1), *mg = gpt_new(cfg, G, &r2);
  NBT_CHECK(mc && mg, "gpt (vocab %d, dim %d): model: %s", cfg.vocab, cfg.dim, nb_last_error());
  if (!mc || !mg) {
    gpt_free(mc);
    gpt_free(mg);
    nb_clear_error();
    return;
  }
  gpt_copy_weights(mg, mc);
  int T = cfg.context;
  int64_t *x = malloc(sizeof *x * (size_t)(B * T)), *y = malloc(sizeof *y * (size_t)(B * T));
  uint64_t s = seed * 2654435761u + 1;
  for (int i = 0; i < B * T; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (int64_t)((s >> 33) % (uint64_t)cfg.vocab);
    y[i] = i % T < ignored ? -1 : (int64_t)((s >> 17) % (uint64_t)cfg.vocab);
  }
  double lc = gpt_grads(mc, x, y, B, T), lg = gpt_grads(mg, x, y, B, T);
  NBT_CHECK(isfinite(lg) && fabs(lg - lc) <= 1e-3 * fabs(lc),
            "gpt (vocab %d, dim %d): loss cuda %.7g vs cpu %.7g (%s)", cfg.vocab, cfg.dim, lg, lc,
            nb_last_error());
  nb_clear_error();
  gpt_cmp_params(mc, mg, 1, "gradient");
  double nc = gpt_update(mc), ng = gpt_update(mg);
  NBT_CHECK(isfinite(ng) && fabs(ng - nc) <= 1e-2 * fabs(nc),
            "gpt (vocab %d, dim %d): gradient norm cuda %.7g vs cpu %.7g (%s)", cfg.vocab, cfg.dim,
            ng, nc, nb_last_error());
  nb_clear_error();
  gpt_cmp_params(mc, mg, 0, "updated value");
  free(x);
  free(y);
  gpt_free(mc);
  gpt_free(mg);
}

static void test_gpt_step(void) {
  /* the addition task's shape (vocab 12, context 11, prompt targets ignored) */
  gpt_step_case((gpt_config){12, 11, 2, 4, 64}, quick ? 4 : 32, 5, 901);
  /* the text task's (vocab 95, no ignored targets), odd batch */
  gpt_step_case((gpt_config){95, 32, 2, 6, 96}, quick ? 3 : 9, 0, 902);
}
