/* CPU elementwise, reduction and random kernels called directly on views
 * over malloc'd buffers, checked against naive float64 references. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "testutil.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"
#include "core/philox.h"

#define KT_PI 3.14159265358979323846

/* The shared checker (testutil.h), under this file's short name. */
#define CHECK NBT_CHECK

static const nb_dtype FLOATS[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
static const nb_dtype ALL[] = {NB_F64, NB_F32, NB_F16, NB_BF16, NB_I64, NB_I32, NB_U8, NB_BOOL};

/* ---- helpers ------------------------------------------------------------ */
static nb_kview view(void *data, nb_dtype dt, int ndim, const int64_t *shape,
                     const int64_t *strides) {
  nb_kview v;
  memset(&v, 0, sizeof v);
  v.data = data;
  v.dtype = dt;
  v.ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

static nb_kview contiguous(void *data, nb_dtype dt, int ndim, const int64_t *shape) {
  int64_t st[NB_MAX_DIMS] = {0}, s = 1;
  for (int i = ndim - 1; i >= 0; i--) { st[i] = s; s *= shape[i]; }
  return view(data, dt, ndim, shape, st);
}

/* Element at logical row-major index i of v. */
static void *elem(const nb_kview *v, int64_t i) {
  int64_t off = 0;
  for (int d = v->ndim - 1; d >= 0; d--) {
    off += (i % v->shape[d]) * v->strides[d];
    i /= v->shape[d];
  }
  return (char *)v->data + off * (int64_t)nb_dtype_size(v->dtype);
}

static double get(const nb_kview *v, int64_t i) { return nb_load_f64(elem(v, i), v->dtype); }
static void set(const nb_kview *v, int64_t i, double x) { nb_store_f64(elem(v, i), v->dtype, x); }
static int64_t numel(const nb_kview *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

static int close_to(double got, double ref, double rtol, double atol) {
  if (isnan(ref)) return isnan(got);
  if (isinf(ref)) return got == ref;
  return fabs(got - ref) <= atol + rtol * fabs(ref);
}

static double tol(nb_dtype dt) {
  switch (dt) {
  case NB_F64: return 1e-12;
  case NB_F32: return 2e-6;
  case NB_F16: return 2e-3;
  case NB_BF16: return 1.6e-2;
  default: return 0;
  }
}

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* ---- Philox ------------------------------------------------------------- */
static void test_philox_kat(void) {
  static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                     {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                     {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
  static const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
  static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                      {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                      {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
  for (int t = 0; t < 3; t++) {
    uint32_t out[4];
    nb_philox4x32_raw(ctr[t], key[t], out);
    CHECK(!memcmp(out, want[t], sizeof out), "philox KAT %d: %08x %08x %08x %08x", t, out[0],
          out[1], out[2], out[3]);
  }
}

/* ---- unary -------------------------------------------------------------- */
static double ref_unary(nb_uop op, double x) {
  const double k = sqrt(2.0 / KT_PI), c = 0.044715;
  double s = 1.0 / (1.0 + exp(-x));
  switch (op) {
  case NB_UOP_NEG: return -x;
  case NB_UOP_ABS: return fabs(x);
  case NB_UOP_EXP: return exp(x);
  case NB_UOP_LOG: return log(x);
  case NB_UOP_LOG1P: return log1p(x);
  case NB_UOP_EXPM1: return expm1(x);
  case NB_UOP_SQRT: return sqrt(x);
  case NB_UOP_RSQRT: return 1.0 / sqrt(x);
  case NB_UOP_SQUARE: return x * x;
  case NB_UOP_RECIPROCAL: return 1.0 / x;
  case NB_UOP_SIN: return sin(x);
  case NB_UOP_COS: return cos(x);
  case NB_UOP_TANH: return tanh(x);
  case NB_UOP_SIGMOID: return s;
  case NB_UOP_RELU: return x > 0 ? x : 0;
  case NB_UOP_GELU_ERF: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
  case NB_UOP_GELU_TANH: return 0.5 * x * (1 + tanh(k * (x + c * x * x * x)));
  case NB_UOP_SILU: return x * s;
  case NB_UOP_SOFTPLUS: return log(1 + exp(x));
  case NB_UOP_SIGN: return x > 0 ? 1 : x < 0 ? -1 : 0;
  case NB_UOP_FLOOR: return floor(x);
  case NB_UOP_CEIL: return ceil(x);
  case NB_UOP_ROUND: return nearbyint(x);
  case NB_UOP_GELU_ERF_D: return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-x * x / 2) / sqrt(2 * KT_PI);
  case NB_UOP_GELU_TANH_D: { /* central difference of the tanh form in f64 */
    double h = 1e-5, xp = x + h, xm = x - h;
    double fp = 0.5 * xp * (1 + tanh(k * (xp + c * xp * xp * xp)));
    double fm = 0.5 * xm * (1 + tanh(k * (xm + c * xm * xm * xm)));
    return (fp - fm) / (2 * h);
  }
  case NB_UOP_SILU_D: return s * (1 + x * (1 - s));
  default: return NAN;
  }
}

/* Inputs inside each op's domain, away from rounding cliffs of floor etc. */
static double unary_input(nb_uop op, int64_t i, int64_t n) {
  double x = -3.0 + 6.0 * (double)i / (double)(n - 1) + 0.013;
  if (op == NB_UOP_LOG || op == NB_UOP_SQRT || op == NB_UOP_RSQRT || op == NB_UOP_LOG1P)
    return fabs(x) + 0.1;
  if (op == NB_UOP_RECIPROCAL) return x < 0 ? x - 0.2 : x + 0.2;
  return x;
}

static void check_unary(nb_uop op, nb_dtype dt, const nb_kview *in, const nb_kview *out,
                        const char *layout) {
  int64_t n = numel(out), bad = 0;
  for (int64_t i = 0; i < n; i++) set(in, i, unary_input(op, i, n));
  nb_status st = nb_cpu_unary(op, out, in);
  double r = tol(dt), a = op == NB_UOP_GELU_TANH_D ? 1e-6 + r : r;
  for (int64_t i = 0; i < n && !bad; i++) {
    double x = get(in, i), ref = ref_unary(op, x), got = get(out, i);
    if (!close_to(got, ref, 2 * r, a)) {
      bad = 1;
      printf("  op %d %s %s: x=%.9g got %.9g want %.9g\n", (int)op, nb_dtype_name(dt), layout,
             x, got, ref);
    }
  }
  CHECK(st == NB_OK && !bad, "unary op %d dtype %s %s", (int)op, nb_dtype_name(dt), layout);
}

static void test_unary(void) {
  for (int d = 0; d < 4; d++) {
    nb_dtype dt = FLOATS[d];
    size_t es = nb_dtype_size(dt);
    int64_t shape[2] = {7, 9}, tshape[2] = {9, 7}, tstr[2] = {1, 9};
    void *bi = calloc(63, es), *bo = calloc(63, es);
    for (int op = 0; op < NB_UOP_COUNT; op++) {
      nb_kview in = contiguous(bi, dt, 2, shape), out = contiguous(bo, dt, 2, shape);
      check_unary((nb_uop)op, dt, &in, &out, "contiguous");
      nb_kview tin = view(bi, dt, 2, tshape, tstr); /* transposed input */
      nb_kview tout = contiguous(bo, dt, 2, tshape);
      check_unary((nb_uop)op, dt, &tin, &tout, "transposed");
    }
    free(bi);
    free(bo);
  }
  /* edge values: sigmoid/softplus at large |x|, sign of 0 and NaN, round half even */
  static const double xs[] = {-1000, 1000, -50, 50, 0, NAN, 0.5, 1.5, 2.5, -0.5, -2.5};
  const int n = sizeof xs / sizeof *xs;
  for (int d = 0; d < 2; d++) {
    nb_dtype dt = FLOATS[d];
    int64_t sh = n;
    char bi[11 * 8], bo[11 * 8];
    nb_kview in = contiguous(bi, dt, 1, &sh), out = contiguous(bo, dt, 1, &sh);
    for (int i = 0; i < n; i++) set(&in, i, xs[i]);
    nb_cpu_unary(NB_UOP_SIGMOID, &out, &in);
    CHECK(get(&out, 0) == 0 && get(&out, 1) == 1 && isnan(get(&out, 5)), "sigmoid extremes %s",
          nb_dtype_name(dt));
    nb_cpu_unary(NB_UOP_SOFTPLUS, &out, &in);
    CHECK(get(&out, 1) == 1000 && get(&out, 0) == 0 && close_to(get(&out, 2), exp(-50), 1e-5, 0),
          "softplus extremes %s", nb_dtype_name(dt));
    nb_cpu_unary(NB_UOP_SIGN, &out, &in);
    CHECK(get(&out, 4) == 0 && isnan(get(&out, 5)) && get(&out, 0) == -1, "sign %s",
          nb_dtype_name(dt));
    nb_cpu_unary(NB_UOP_ROUND, &out, &in);
    CHECK(get(&out, 6) == 0 && get(&out, 7) == 2 && get(&out, 8) == 2 && get(&out, 9) == 0 &&
              get(&out, 10) == -2, "round half to even %s", nb_dtype_name(dt));
    nb_cpu_unary(NB_UOP_RELU, &out, &in);
    CHECK(isnan(get(&out, 5)) && get(&out, 0) == 0 && get(&out, 3) == 50, "relu %s",
          nb_dtype_name(dt));
  }
  /* integers: NEG, ABS, SIGN, SQUARE in i64 with wrapping */
  {
    int64_t sh = 5, i64[5] = {INT64_MIN, -7, 0, 3, 5000000000}, o64[5];
    nb_kview in = contiguous(i64, NB_I64, 1, &sh), out = contiguous(o64, NB_I64, 1, &sh);
    nb_cpu_unary(NB_UOP_NEG, &out, &in);
    CHECK(o64[0] == INT64_MIN && o64[1] == 7 && o64[4] == -5000000000, "i64 neg wraps");
    nb_cpu_unary(NB_UOP_ABS, &out, &in);
    CHECK(o64[1] == 7 && o64[3] == 3, "i64 abs");
    nb_cpu_unary(NB_UOP_SIGN, &out, &in);
    CHECK(o64[0] == -1 && o64[2] == 0 && o64[4] == 1, "i64 sign");
    nb_cpu_unary(NB_UOP_SQUARE, &out, &in);
    CHECK(o64[1] == 49 && o64[4] == (int64_t)(5000000000ull * 5000000000ull), "i64 square");
    int32_t i32[5] = {INT32_MIN, -7, 0, 3, 50000}, o32[5];
    nb_kview a = contiguous(i32, NB_I32, 1, &sh), b = contiguous(o32, NB_I32, 1, &sh);
    nb_cpu_unary(NB_UOP_NEG, &b, &a);
    CHECK(o32[0] == INT32_MIN && o32[1] == 7, "i32 neg wraps");
    nb_cpu_unary(NB_UOP_SQUARE, &b, &a);
    CHECK(o32[4] == (int32_t)(uint32_t)(50000ull * 50000ull) && o32[1] == 49, "i32 square wraps");
    uint8_t u8[5] = {0, 1, 2, 200, 255}, ou[5];
    nb_kview c = contiguous(u8, NB_U8, 1, &sh), e = contiguous(ou, NB_U8, 1, &sh);
    nb_cpu_unary(NB_UOP_NEG, &e, &c);
    CHECK(ou[1] == 255 && ou[3] == 56 && ou[0] == 0, "u8 neg wraps");
    nb_clear_error();
    CHECK(nb_cpu_unary(NB_UOP_EXP, &e, &c) == NB_ERR_DTYPE && strstr(nb_last_error(), "u8"),
          "exp on u8 is an error: %s", nb_last_error());
  }
}

/* ---- binary ------------------------------------------------------------- */
static int is_cmp(nb_bop op) { return op >= NB_BOP_EQ; }

static double ref_binary_f(nb_bop op, double x, double z) {
  switch (op) {
  case NB_BOP_ADD: return x + z;
  case NB_BOP_SUB: return x - z;
  case NB_BOP_MUL: return x * z;
  case NB_BOP_DIV: return x / z;
  case NB_BOP_POW: return pow(x, z);
  case NB_BOP_MAX: return isnan(x) || isnan(z) ? NAN : fmax(x, z);
  case NB_BOP_MIN: return isnan(x) || isnan(z) ? NAN : fmin(x, z);
  case NB_BOP_EQ: return x == z;
  case NB_BOP_NE: return x != z;
  case NB_BOP_LT: return x < z;
  case NB_BOP_LE: return x <= z;
  case NB_BOP_GT: return x > z;
  case NB_BOP_GE: return x >= z;
  case NB_BOP_GELU_ERF_BW: return z * ref_unary(NB_UOP_GELU_ERF_D, x);
  case NB_BOP_GELU_TANH_BW: { /* d/dx of 0.5 x (1 + tanh(k (x + c x^3))) */
    const double k = sqrt(2.0 / KT_PI), c = 0.044715, t = tanh(k * (x + c * x * x * x));
    return z * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x));
  }
  case NB_BOP_SILU_BW: return z * ref_unary(NB_UOP_SILU_D, x);
  default: return NAN;
  }
}

static int64_t ref_binary_i(nb_bop op, int64_t x, int64_t z) {
  uint64_t r = 1;
  switch (op) {
  case NB_BOP_ADD: return (int64_t)((uint64_t)x + (uint64_t)z);
  case NB_BOP_SUB: return (int64_t)((uint64_t)x - (uint64_t)z);
  case NB_BOP_MUL: return (int64_t)((uint64_t)x * (uint64_t)z);
  case NB_BOP_POW: for (int64_t k = 0; k < z; k++) r *= (uint64_t)x; return (int64_t)r;
  case NB_BOP_MAX: return x > z ? x : z;
  case NB_BOP_MIN: return x < z ? x : z;
  default: return (int64_t)ref_binary_f(op, (double)x, (double)z);
  }
}

/* The reference's result stored to dtype dt and read back. */
static double to_dtype(nb_dtype dt, int64_t v) {
  char buf[8];
  switch (dt) {
  case NB_I32: return (int32_t)(uint32_t)(uint64_t)v;
  case NB_U8: return (uint8_t)(uint64_t)v;
  case NB_BOOL: return v != 0;
  case NB_I64: return (double)v;
  default: nb_store_f64(buf, dt, (double)v); return nb_load_f64(buf, dt);
  }
}

/* The fused backward kernels g * f'(x) (float only). */
static int is_derivative(nb_bop op) {
  return op == NB_BOP_GELU_ERF_BW || op == NB_BOP_GELU_TANH_BW || op == NB_BOP_SILU_BW;
}

/* g * f'(x) in bf16 and f16 is rounded once: within half an ulp of the
 * float64 value (plus f32's own error), which a derivative rounded to the
 * dtype and then multiplied (two roundings) exceeds. */
static void test_derivative_rounding(void) {
  static const nb_dtype dts[2] = {NB_BF16, NB_F16};
  static const nb_bop ops[3] = {NB_BOP_GELU_ERF_BW, NB_BOP_GELU_TANH_BW, NB_BOP_SILU_BW};
  enum { N = 4096 };
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < 3; k++) {
      int64_t sh = N;
      static uint16_t xb[N], gb[N], ob[N];
      nb_kview x = contiguous(xb, dts[d], 1, &sh), g = contiguous(gb, dts[d], 1, &sh);
      nb_kview o = contiguous(ob, dts[d], 1, &sh);
      for (int64_t i = 0; i < N; i++) {
        set(&x, i, -5.0 + 10.0 * (double)i / N);
        set(&g, i, 0.3 + 1.7 * (double)((i * 37) % 101) / 101);
      }
      nb_status st = nb_cpu_binary(ops[k], &o, &x, &g);
      double worst = 0;
      int p = dts[d] == NB_BF16 ? 8 : 11; /* significand bits */
      for (int64_t i = 0; i < N; i++) {
        double ref = ref_binary_f(ops[k], get(&x, i), get(&g, i)), e;
        int ex;
        frexp(ref, &ex);
        double ulp = ldexp(1.0, (ex - p) > -24 ? ex - p : -24);
        e = fabs(get(&o, i) - ref) / ulp;
        if (e > worst) worst = e;
      }
      CHECK(st == NB_OK && worst <= 0.501, "bop %d %s: %.3f ulp from f64 (one rounding: <= 0.5)",
            (int)ops[k], nb_dtype_name(dts[d]), worst);
    }
}

/* a (5, 6) transposed view of a (6, 5) buffer; b (5, 6) broadcast from (6,). */
static void check_binary(nb_bop op, nb_dtype dt) {
  const int64_t shape[2] = {5, 6}, astr[2] = {1, 5}, bstr[2] = {0, 1};
  const size_t es = nb_dtype_size(dt);
  nb_dtype od = is_cmp(op) ? NB_BOOL : dt;
  char ab[30 * 8], bb[6 * 8], ob[30 * 8];
  nb_kview a = view(ab, dt, 2, shape, astr), b = view(bb, dt, 2, shape, bstr);
  nb_kview o = contiguous(ob, od, 2, shape);
  int fl = nb_dtype_is_float(dt);
  (void)es;
  for (int64_t i = 0; i < 30; i++) {
    double x = fl ? -2.5 + 0.37 * i : (double)((i * 7) % 13) - (dt == NB_U8 || dt == NB_BOOL ? 0 : 6);
    if (dt == NB_BOOL) x = i % 3 == 0;
    if (op == NB_BOP_POW && fl) x = 0.2 + 0.11 * i;
    set(&a, i, x);
  }
  for (int64_t j = 0; j < 6; j++) {
    double z = fl ? 1.25 - 0.5 * j : (double)(j % 4);
    if (dt == NB_BOOL) z = j % 2;
    if (fl && j == 5 && op != NB_BOP_POW) z = -2.5 + 0.37 * 11; /* equals a[1, 5]: a tie */
    nb_store_f64(bb + j * es, dt, z);
  }
  if (fl && op != NB_BOP_POW) nb_store_f64(bb + 3 * es, dt, 0.5); /* nonzero divisor */
  if (fl && (op == NB_BOP_MAX || op == NB_BOP_MIN)) set(&a, 7, NAN);
  nb_status st = nb_cpu_binary(op, &o, &a, &b);
  int bad = 0;
  for (int64_t i = 0; i < 30 && !bad; i++) {
    double x = get(&a, i), z = get(&b, i), got = get(&o, i), ref;
    if (fl) {
      ref = ref_binary_f(op, x, z);
      if (!is_cmp(op)) { char t[8]; nb_store_f64(t, od, ref); ref = nb_load_f64(t, od); }
    } else {
      ref = to_dtype(od, ref_binary_i(op, (int64_t)x, (int64_t)z));
    }
    double r = fl && !is_cmp(op) ? 2 * tol(dt) : 0;
    if (!close_to(got, ref, r, r * 1e-3)) {
      bad = 1;
      printf("  bop %d %s: %g, %g -> %g want %g\n", (int)op, nb_dtype_name(dt), x, z, got, ref);
    }
  }
  CHECK(st == NB_OK && !bad, "binary op %d dtype %s", (int)op, nb_dtype_name(dt));
}

static void test_binary(void) {
  for (int d = 0; d < 8; d++)
    for (int op = 0; op < NB_BOP_COUNT; op++) {
      if ((op == NB_BOP_DIV || is_derivative((nb_bop)op)) && !nb_dtype_is_float(ALL[d])) continue;
      if (ALL[d] == NB_BOOL && op != NB_BOP_MUL && op != NB_BOP_MAX && op != NB_BOP_MIN &&
          !is_cmp((nb_bop)op))
        continue;
      check_binary((nb_bop)op, ALL[d]);
    }
  /* integer wrap-around and negative powers */
  int64_t sh = 3;
  int32_t a[3] = {INT32_MAX, 2, -3}, b[3] = {1, 31, 3}, o[3];
  nb_kview va = contiguous(a, NB_I32, 1, &sh), vb = contiguous(b, NB_I32, 1, &sh);
  nb_kview vo = contiguous(o, NB_I32, 1, &sh);
  nb_cpu_binary(NB_BOP_ADD, &vo, &va, &vb);
  CHECK(o[0] == INT32_MIN, "i32 add wraps: %d", o[0]);
  nb_cpu_binary(NB_BOP_POW, &vo, &va, &vb);
  CHECK(o[1] == INT32_MIN && o[2] == -27, "i32 pow: %d %d", o[1], o[2]);
  b[1] = -1;
  nb_clear_error();
  CHECK(nb_cpu_binary(NB_BOP_POW, &vo, &va, &vb) == NB_ERR_VALUE &&
            strstr(nb_last_error(), "negative"), "int pow negative exponent: %s", nb_last_error());
  /* large contiguous f32 add (parallel dense path) and f16 add with broadcast */
  int64_t n = 100003;
  float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
  for (int64_t i = 0; i < n; i++) { x[i] = (float)i * 0.5f; y[i] = 1.0f - (float)i; }
  nb_kview vx = contiguous(x, NB_F32, 1, &n), vy = contiguous(y, NB_F32, 1, &n);
  nb_kview vz = contiguous(z, NB_F32, 1, &n);
  nb_cpu_binary(NB_BOP_ADD, &vz, &vx, &vy);
  int ok = 1;
  for (int64_t i = 0; i < n; i++) ok &= z[i] == x[i] + y[i];
  CHECK(ok, "large f32 add");
  nb_cpu_binary(NB_BOP_MUL, &vx, &vx, &vy); /* in place */
  ok = 1;
  for (int64_t i = 0; i < n; i++) ok &= x[i] == (float)i * 0.5f * y[i];
  CHECK(ok, "in-place f32 mul");
  free(x); free(y); free(z);
}

static void test_where(void) {
  for (int d = 0; d < 8; d++) {
    nb_dtype dt = ALL[d];
    int64_t shape[2] = {4, 5}, cstr[2] = {1, 0}, bstr[2] = {0, 1};
    uint8_t cb[4] = {1, 0, 0, 1};
    char ab[20 * 8], bb[5 * 8], ob[20 * 8];
    nb_kview c = view(cb, NB_BOOL, 2, shape, cstr), a = contiguous(ab, dt, 2, shape);
    nb_kview b = view(bb, dt, 2, shape, bstr), o = contiguous(ob, dt, 2, shape);
    for (int i = 0; i < 20; i++) set(&a, i, i % 2);
    for (int i = 0; i < 5; i++) nb_store_f64(bb + i * nb_dtype_size(dt), dt, 1 - i % 2);
    nb_cpu_where(&o, &c, &a, &b);
    int ok = 1;
    for (int i = 0; i < 20; i++) ok &= get(&o, i) == (cb[i / 5] ? get(&a, i) : get(&b, i));
    CHECK(ok, "where %s", nb_dtype_name(dt));
  }
}

/* ---- copy, fill, arange ------------------------------------------------- */
static void test_copy_pairs(void) {
  for (int s = 0; s < 8; s++)
    for (int d = 0; d < 8; d++) {
      nb_dtype sd = ALL[s], dd = ALL[d];
      int64_t shape[3] = {3, 4, 5}, istr[3] = {1, 3, 12}; /* axes reversed */
      char ib[60 * 8], ob[60 * 8];
      nb_kview in = view(ib, sd, 3, shape, istr), out = contiguous(ob, dd, 3, shape);
      for (int i = 0; i < 60; i++) {
        double v = sd == NB_BOOL ? i % 2 : nb_dtype_is_float(sd) ? i * 1.75 - 20.5 : i * 3 + 1;
        if (sd == NB_U8) v = i * 4;
        set(&in, i, v);
      }
      nb_cpu_copy(&out, &in);
      int ok = 1;
      for (int i = 0; i < 60 && ok; i++) {
        char t[8];
        nb_store_f64(t, dd, get(&in, i)); /* the core's scalar conversion */
        ok = nb_load_f64(t, dd) == get(&out, i);
        if (!ok) printf("  copy %s->%s [%d]: %g -> %g\n", nb_dtype_name(sd), nb_dtype_name(dd), i, get(&in, i), get(&out, i));
      }
      CHECK(ok, "copy %s -> %s", nb_dtype_name(sd), nb_dtype_name(dd));
    }
}

static void test_half_rounding(void) {
  static const struct { float x; uint16_t h, b; } cases[] = {
    {1.0f, 0x3c00, 0x3f80},
    {65504.0f, 0x7bff, 0x4780},        /* bf16: low half 0xe000 rounds up */
    {65519.0f, 0x7bff, 0x4780},        /* below the f16 halfway point */
    {65520.0f, 0x7c00, 0x4780},        /* rounds past f16 max: inf */
    {1e30f, 0x7c00, 0x714a},
    {-INFINITY, 0xfc00, 0xff80},
    {5.9604644775390625e-08f, 0x0001, 0x3380},   /* 2^-24: f16 min subnormal */
    {2.98023223876953125e-08f, 0x0000, 0x3300},  /* 2^-25: tie -> even (0) */
    {8.94069671630859375e-08f, 0x0002, 0x33c0},  /* 3*2^-25: tie -> even (2) */
    {6.103515625e-05f, 0x0400, 0x3880},          /* 2^-14: f16 min normal */
    {1.00048828125f, 0x3c00, 0x3f80},  /* 1 + 2^-11: tie -> even */
    {1.00146484375f, 0x3c02, 0x3f80},  /* 1 + 3*2^-11: tie -> even (up) */
    {1.01171875f, 0x3c0c, 0x3f82},     /* 1 + 3*2^-8: bf16 tie -> even (up) */
    {1.00390625f, 0x3c04, 0x3f80},     /* 1 + 2^-8: bf16 tie -> even (down) */
    {-0.0f, 0x8000, 0x8000},
  };
  const int n = sizeof cases / sizeof *cases;
  int64_t sh = n + 1, st2 = 2;
  float src[20];
  uint16_t h[40], b[20];
  for (int i = 0; i < n; i++) src[i] = cases[i].x;
  src[n] = bits_f32(0x7fc01234u); /* NaN with payload */
  nb_kview vs = contiguous(src, NB_F32, 1, &sh), vh = view(h, NB_F16, 1, &sh, &st2);
  nb_kview vb = contiguous(b, NB_BF16, 1, &sh);
  nb_cpu_copy(&vh, &vs);
  nb_cpu_copy(&vb, &vs);
  for (int i = 0; i < n; i++) {
    CHECK(h[2 * i] == cases[i].h, "f32 %.9g -> f16 %04x (want %04x)", cases[i].x, h[2 * i], cases[i].h);
    CHECK(b[i] == cases[i].b, "f32 %.9g -> bf16 %04x (want %04x)", cases[i].x, b[i], cases[i].b);
  }
  CHECK((h[2 * n] & 0x7c00) == 0x7c00 && (h[2 * n] & 0x3ff), "NaN -> f16 NaN %04x", h[2 * n]);
  CHECK((b[n] & 0x7f80) == 0x7f80 && (b[n] & 0x7f), "NaN -> bf16 NaN %04x", b[n]);
  /* f32 subnormal to bf16 keeps its (rounded) bits */
  float sub = bits_f32(0x00012345u);
  int64_t one = 1;
  nb_kview v1 = contiguous(&sub, NB_F32, 1, &one), v2 = contiguous(b, NB_BF16, 1, &one);
  nb_cpu_copy(&v2, &v1);
  CHECK(b[0] == 0x0001, "f32 subnormal -> bf16 %04x", b[0]);
  /* every f16 value round-trips through f32 exactly (large, parallel path) */
  int64_t all = 65536;
  uint16_t *hs = malloc(all * 2), *hb = malloc(all * 2);
  float *fs = malloc(all * 4);
  for (int64_t i = 0; i < all; i++) hs[i] = (uint16_t)i;
  nb_kview a1 = contiguous(hs, NB_F16, 1, &all), a2 = contiguous(fs, NB_F32, 1, &all);
  nb_kview a3 = contiguous(hb, NB_F16, 1, &all);
  nb_cpu_copy(&a2, &a1);
  nb_cpu_copy(&a3, &a2);
  int ok = 1, okf = 1;
  for (int64_t i = 0; i < all; i++) {
    int nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
    ok &= nan ? (hb[i] & 0x7fff) > 0x7c00 : hb[i] == hs[i];
    okf &= nan ? isnan(fs[i]) : f32_bits(fs[i]) == f32_bits(nb_f16_to_f32((uint16_t)i));
  }
  CHECK(ok && okf, "all f16 values round-trip through f32");
  /* f32 -> bf16 over many random bit patterns agrees with the core */
  uint32_t *r = malloc(all * 4);
  for (int64_t i = 0; i < all; i++) {
    uint32_t w[4];
    nb_philox4x32(7, (uint64_t)i, w);
    r[i] = w[0];
  }
  nb_kview rv = contiguous(r, NB_F32, 1, &all), bv = contiguous(hb, NB_BF16, 1, &all);
  nb_kview hv = contiguous(hs, NB_F16, 1, &all);
  nb_cpu_copy(&bv, &rv);
  nb_cpu_copy(&hv, &rv);
  ok = 1;
  for (int64_t i = 0; i < all; i++) {
    float f = bits_f32(r[i]);
    ok &= hb[i] == nb_f32_to_bf16(f) && hs[i] == nb_f32_to_f16(f);
  }
  CHECK(ok, "random f32 bit patterns -> bf16/f16 match the core");
  free(hs); free(hb); free(fs); free(r);
}

static void test_int_conversions(void) {
  int64_t sh = 6;
  double src[6] = {1e10, -1e10, 300.7, -3.7, NAN, 2.9};
  int32_t i32[6];
  uint8_t u8[6];
  int64_t i64[6];
  nb_kview vs = contiguous(src, NB_F64, 1, &sh);
  nb_kview v32 = contiguous(i32, NB_I32, 1, &sh), v8 = contiguous(u8, NB_U8, 1, &sh);
  nb_cpu_copy(&v32, &vs);
  nb_cpu_copy(&v8, &vs);
  CHECK(i32[0] == INT32_MAX && i32[1] == INT32_MIN && i32[2] == 300 && i32[3] == -3 &&
            i32[4] == 0 && i32[5] == 2, "f64 -> i32 truncates and saturates");
  CHECK(u8[0] == 255 && u8[1] == 0 && u8[2] == 255 && u8[3] == 0 && u8[4] == 0 && u8[5] == 2,
        "f64 -> u8 truncates and saturates");
  /* large integers never pass through a double */
  i64[0] = (1ll << 53) + 1;
  i64[1] = INT64_MAX;
  int64_t o64[2], two = 2;
  nb_kview a = contiguous(i64, NB_I64, 1, &two), b = contiguous(o64, NB_I64, 1, &two);
  double f64[2];
  nb_kview c = contiguous(f64, NB_F64, 1, &two);
  nb_cpu_copy(&b, &a);
  nb_cpu_copy(&c, &a);
  CHECK(o64[0] == (1ll << 53) + 1 && o64[1] == INT64_MAX, "i64 copy exact");
  CHECK(f64[0] == 9007199254740992.0, "i64 -> f64 rounds to nearest");
  nb_kview d = contiguous(i32, NB_I32, 1, &two);
  nb_cpu_copy(&d, &a);
  CHECK(i32[0] == 1 && i32[1] == -1, "i64 -> i32 wraps: %d %d", i32[0], i32[1]);
}

static void test_fill_arange(void) {
  for (int d = 0; d < 8; d++) {
    nb_dtype dt = ALL[d];
    int64_t shape[2] = {40000, 3}, str[2] = {3, 1}, tsh[2] = {3, 40000}, tst[2] = {1, 3};
    char *buf = malloc(120000 * 8);
    nb_kview v = view(buf, dt, 2, shape, str), t = view(buf, dt, 2, tsh, tst);
    nb_cpu_fill(&v, 2.75);
    double want = nb_dtype_is_float(dt) ? 2.75 : dt == NB_BOOL ? 1 : 2;
    int ok = 1;
    for (int64_t i = 0; i < 120000; i++) ok &= get(&v, i) == want;
    CHECK(ok, "fill %s", nb_dtype_name(dt));
    nb_cpu_fill(&t, -1.0); /* transposed view of the same buffer */
    want = dt == NB_U8 ? 0 : dt == NB_BOOL ? 1 : -1;
    ok = 1;
    for (int64_t i = 0; i < 120000; i++) ok &= get(&v, i) == want;
    CHECK(ok, "fill transposed %s", nb_dtype_name(dt));
    int64_t n = 1000, st = 3;
    nb_kview a = view(buf, dt, 1, &n, &st);
    nb_cpu_arange(&a, 2.0, dt == NB_U8 || dt == NB_BOOL ? 0.25 : 0.5);
    ok = 1;
    for (int64_t i = 0; i < n; i++) {
      char t8[8];
      nb_store_f64(t8, dt, 2.0 + i * (dt == NB_U8 || dt == NB_BOOL ? 0.25 : 0.5));
      ok &= get(&a, i) == nb_load_f64(t8, dt);
    }
    CHECK(ok, "arange strided %s", nb_dtype_name(dt));
    free(buf);
  }
}

/* ---- reductions --------------------------------------------------------- */
/* Reduces x (3-D, contiguous, shape sh) over the axes in mask with op and
 * checks against a naive f64 reference. */
static void check_reduce(nb_rop op, nb_dtype dt, const int64_t *sh, int mask, double *vals) {
  const size_t es = nb_dtype_size(dt);
  int64_t n = sh[0] * sh[1] * sh[2], st[3] = {sh[1] * sh[2], sh[2], 1};
  char *buf = malloc(n * es);
  nb_kview x = contiguous(buf, dt, 3, sh);
  for (int64_t i = 0; i < n; i++) set(&x, i, vals[i]);
  /* kernel view: kept axes first, reduced last */
  nb_kview in = x;
  int k = 0, nred = 0;
  int64_t osh[3];
  for (int d = 0; d < 3; d++)
    if (!(mask >> d & 1)) { in.shape[k] = sh[d]; in.strides[k] = st[d]; osh[k++] = sh[d]; }
  int nk = k;
  for (int d = 0; d < 3; d++)
    if (mask >> d & 1) { in.shape[k] = sh[d]; in.strides[k++] = st[d]; nred++; }
  int arg = op == NB_ROP_ARGMAX || op == NB_ROP_ARGMIN;
  nb_dtype od = arg ? NB_I64 : dt;
  int64_t on = 1;
  for (int d = 0; d < nk; d++) on *= osh[d];
  char *ob = malloc(on * 8);
  nb_kview out = contiguous(ob, od, nk, osh);
  nb_status s = nb_cpu_reduce(op, &out, &in, nred);
  int64_t rn = n / on;
  int bad = 0;
  for (int64_t o = 0; o < on && !bad; o++) {
    double acc = op == NB_ROP_SUM ? 0 : NAN;
    int64_t best = -1;
    for (int64_t r = 0; r < rn; r++) {
      double v = get(&in, o * rn + r);
      if (op == NB_ROP_SUM) acc += v;
      else if (best < 0 || isnan(acc)) { if (best < 0) { acc = v; best = r; } }
      else if (isnan(v) || ((op == NB_ROP_MAX || op == NB_ROP_ARGMAX) ? v > acc : v < acc)) { acc = v; best = r; }
    }
    double ref = arg ? (double)best : acc, got = get(&out, o);
    if (!arg && nb_dtype_is_float(dt)) { char t[8]; nb_store_f64(t, od, ref); ref = nb_load_f64(t, od); }
    else if (!arg) ref = to_dtype(od, (int64_t)ref); /* integer sums wrap */
    double r = nb_dtype_is_float(dt) ? tol(dt) * 4 : 0;
    if (!close_to(got, ref, r, r)) {
      bad = 1;
      printf("  reduce op %d %s mask %d out %lld: got %.9g want %.9g\n", (int)op,
             nb_dtype_name(dt), mask, (long long)o, got, ref);
    }
  }
  CHECK(s == NB_OK && !bad, "reduce op %d %s shape [%lld,%lld,%lld] mask %d", (int)op,
        nb_dtype_name(dt), (long long)sh[0], (long long)sh[1], (long long)sh[2], mask);
  free(buf);
  free(ob);
}

static void test_reduce(void) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16, NB_I64, NB_I32, NB_U8};
  const int64_t shapes[3][3] = {{3, 4, 5}, {1, 7, 1}, {37, 9, 20}};
  for (int si = 0; si < 3; si++) {
    const int64_t *sh = shapes[si];
    int64_t n = sh[0] * sh[1] * sh[2];
    double *vals = malloc(n * sizeof *vals);
    for (int t = 0; t < 7; t++) {
      nb_dtype dt = dts[t];
      for (int64_t i = 0; i < n; i++) /* small integers: ties, exact sums */
        vals[i] = (double)((i * 37 + 11) % 17) - (dt == NB_U8 ? 0 : 8) + (nb_dtype_is_float(dt) ? 0.25 : 0);
      for (int op = 0; op < NB_ROP_COUNT; op++)
        for (int mask = 0; mask < 8; mask++) check_reduce((nb_rop)op, dt, sh, mask, vals);
    }
    /* NaN propagates through max/min and wins argmax/argmin */
    for (int64_t i = 0; i < n; i++) vals[i] = (double)(i % 5);
    vals[n / 2] = NAN;
    vals[n - 1] = NAN;
    for (int op = 0; op < NB_ROP_COUNT; op++)
      for (int mask = 1; mask < 8; mask++) check_reduce((nb_rop)op, NB_F32, sh, mask, vals);
    free(vals);
  }
}

/* Long reductions: split schedule (full sum), column schedule, and bits that
 * do not depend on the number of threads. */
static void test_reduce_large(void) {
  int64_t n = 1 << 20;
  float *x = malloc(n * 4);
  for (int64_t i = 0; i < n; i++) {
    uint32_t w[4];
    nb_philox4x32(3, (uint64_t)i, w);
    x[i] = nb_philox_u01(w[0]) * 2.0f - 1.0f;
  }
  double ref = 0;
  for (int64_t i = 0; i < n; i++) ref += x[i];
  float got1 = 0, got2 = 0, got3 = 0;
  nb_kview in = contiguous(x, NB_F32, 1, &n), out = contiguous(&got1, NB_F32, 0, NULL);
  nb_cpu_reduce(NB_ROP_SUM, &out, &in, 1);
  CHECK(got1 == (float)ref, "full sum of 2^20 f32: %.9g want %.9g", got1, (float)ref);
#ifdef _OPENMP
  int nt = omp_get_max_threads();
  omp_set_num_threads(1);
  out.data = &got2;
  nb_cpu_reduce(NB_ROP_SUM, &out, &in, 1);
  omp_set_num_threads(3);
  out.data = &got3;
  nb_cpu_reduce(NB_ROP_SUM, &out, &in, 1);
  omp_set_num_threads(nt);
  CHECK(f32_bits(got1) == f32_bits(got2) && f32_bits(got1) == f32_bits(got3),
        "full sum bits independent of threads");
#endif
  /* argmax of a long vector with a tie: first one wins */
  x[1000] = 5.0f;
  x[900000] = 5.0f;
  int64_t am = -1;
  nb_kview ao = contiguous(&am, NB_I64, 0, NULL);
  nb_cpu_reduce(NB_ROP_ARGMAX, &ao, &in, 1);
  CHECK(am == 1000, "argmax over 2^20 with a tie: %lld", (long long)am);
  x[950000] = NAN;
  nb_cpu_reduce(NB_ROP_ARGMAX, &ao, &in, 1);
  CHECK(am == 950000, "argmax over 2^20 with NaN: %lld", (long long)am);
  /* column sum: (1024, 1000) summed over axis 0 */
  int64_t rsh[2] = {1000, 1024}, rst[2] = {1, 1000}, m = 1000;
  float col[1000];
  nb_kview cin = view(x, NB_F32, 2, rsh, rst), cout = contiguous(col, NB_F32, 1, &m);
  x[950000] = 0.0f;
  nb_cpu_reduce(NB_ROP_SUM, &cout, &cin, 1);
  int ok = 1;
  for (int64_t j = 0; j < m; j++) {
    double r = 0;
    for (int64_t i = 0; i < 1024; i++) r += x[i * 1000 + j];
    ok &= close_to(col[j], r, 1e-6, 1e-6);
  }
  CHECK(ok, "column sum over axis 0");
  nb_cpu_reduce(NB_ROP_MAX, &cout, &cin, 1);
  ok = 1;
  for (int64_t j = 0; j < m; j++) {
    float r = -INFINITY;
    for (int64_t i = 0; i < 1024; i++) r = x[i * 1000 + j] > r ? x[i * 1000 + j] : r;
    ok &= col[j] == r;
  }
  CHECK(ok, "column max over axis 0");
  free(x);
}

/* ---- random ------------------------------------------------------------- */
static void test_random(void) {
  const uint64_t seed = 1234, off = 77;
  int64_t n = 200000;
  for (int d = 0; d < 4; d++) {
    nb_dtype dt = FLOATS[d];
    char *buf = malloc(n * 8);
    nb_kview v = contiguous(buf, dt, 1, &n);
    nb_cpu_rand_uniform(&v, seed, off, -2.0, 3.0);
    double sum = 0, lo = 1e9, hi = -1e9;
    for (int64_t i = 0; i < n; i++) {
      double x = get(&v, i);
      sum += x;
      lo = fmin(lo, x);
      hi = fmax(hi, x);
    }
    CHECK(lo >= -2.0 && hi <= 3.0 && lo < -1.99 && hi > 2.99 && fabs(sum / n - 0.5) < 0.02,
          "uniform %s: range [%g, %g] mean %g", nb_dtype_name(dt), lo, hi, sum / n);
    /* f32/f64 stay below hi; f16/bf16 rounding may reach it (as documented) */
    if (dt == NB_F32 || dt == NB_F64) CHECK(hi < 3.0, "uniform %s below hi", nb_dtype_name(dt));
    uint32_t w[4];
    nb_philox4x32(seed, off + 5, w);
    double u = dt == NB_F64 ? fma(5.0, nb_philox_u53(w[0], w[1]), -2.0)
                            : (double)(float)fma(5.0, nb_philox_u01(w[0]), -2.0);
    char t[8];
    nb_store_f64(t, dt, u);
    CHECK(get(&v, 5) == nb_load_f64(t, dt), "uniform %s element 5 formula", nb_dtype_name(dt));
    nb_cpu_rand_normal(&v, seed, off, 1.5, 2.0);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) { double x = get(&v, i); s1 += x; s2 += x * x; }
    double mean = s1 / n, sd = sqrt(s2 / n - mean * mean);
    CHECK(fabs(mean - 1.5) < 0.03 && fabs(sd - 2.0) < 0.03, "normal %s: mean %g std %g",
          nb_dtype_name(dt), mean, sd);
    if (dt == NB_F32)
      CHECK(get(&v, 5) == fmaf(2.0f, nb_philox_normal(w[0], w[1]), 1.5f), "normal f32 formula");
    if (dt == NB_F64) {
      double z = sqrt(-2 * log(1 - nb_philox_u53(w[0], w[1]))) *
                 cos(6.283185307179586 * nb_philox_u53(w[2], w[3]));
      CHECK(get(&v, 5) == fma(2.0, z, 1.5), "normal f64 formula");
    }
    /* strided output: same values in row-major logical order */
    int64_t sh2[2] = {300, 200}, tst[2] = {1, 300}, cn = 60000;
    char *b2 = malloc(n * 8);
    nb_kview tv = view(b2, dt, 2, sh2, tst), cv = contiguous(buf, dt, 1, &cn);
    nb_cpu_rand_normal(&cv, seed, off, 0, 1);
    nb_cpu_rand_normal(&tv, seed, off, 0, 1);
    int ok = 1;
    for (int64_t i = 0; i < cn; i++) ok &= memcmp(elem(&tv, i), elem(&cv, i), nb_dtype_size(dt)) == 0;
    CHECK(ok, "normal %s: transposed output in logical order", nb_dtype_name(dt));
    /* offset k continues the stream */
    int64_t sn = 1000;
    nb_kview sv = contiguous(b2, dt, 1, &sn);
    nb_cpu_rand_normal(&sv, seed, off + 500, 0, 1);
    CHECK(!memcmp(b2, buf + 500 * nb_dtype_size(dt), 1000 * nb_dtype_size(dt)),
          "normal %s: offset continues the stream", nb_dtype_name(dt));
    free(b2);
    free(buf);
  }
  /* randint */
  int64_t *iv = malloc(n * 8), cnt[7] = {0};
  nb_kview v = contiguous(iv, NB_I64, 1, &n);
  nb_cpu_randint(&v, seed, 0, -3, 4);
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    ok &= iv[i] >= -3 && iv[i] < 4;
    if (iv[i] >= -3 && iv[i] < 4) cnt[iv[i] + 3]++;
  }
  uint32_t w[4];
  nb_philox4x32(seed, 9, w);
  CHECK(ok && iv[9] == -3 + (int64_t)(((uint64_t)w[0] | (uint64_t)w[1] << 32) % 7),
        "randint range and formula");
  for (int k = 0; k < 7; k++) CHECK(labs(cnt[k] - n / 7) < n / 70, "randint bucket %d: %lld", k, (long long)cnt[k]);
  uint8_t u8[100];
  int64_t h = 100;
  nb_kview uv = contiguous(u8, NB_U8, 1, &h);
  nb_cpu_randint(&uv, seed, 0, 250, 256);
  ok = 1;
  for (int i = 0; i < 100; i++) {
    nb_philox4x32(seed, (uint64_t)i, w);
    ok &= u8[i] >= 250 && u8[i] == 250 + ((uint64_t)w[0] | (uint64_t)w[1] << 32) % 6;
  }
  CHECK(ok, "randint u8 near the top");
  int64_t rep[1000];
  int64_t rn = 1000;
  nb_kview rv = contiguous(rep, NB_I64, 1, &rn);
  nb_cpu_randint(&rv, seed, 0, -3, 4);
  CHECK(!memcmp(rep, iv, sizeof rep), "randint deterministic");
  free(iv);
}

/* ---- bandwidth (informational; the bench harness measures 2^25) --------- */
static void bench_add(void) {
#ifdef _OPENMP
  int64_t n = 1 << 23;
  float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
  if (!a || !b || !c) { free(a); free(b); free(c); return; }
  nb_kview va = contiguous(a, NB_F32, 1, &n), vb = contiguous(b, NB_F32, 1, &n);
  nb_kview vc = contiguous(c, NB_F32, 1, &n);
  nb_cpu_fill(&va, 1.0);
  nb_cpu_fill(&vb, 2.0);
  nb_cpu_fill(&vc, 0.0);
  double best = 1e9;
  for (int r = 0; r < 5; r++) {
    double t0 = omp_get_wtime();
    nb_cpu_binary(NB_BOP_ADD, &vc, &va, &vb);
    double t = omp_get_wtime() - t0;
    best = t < best ? t : best;
  }
  printf("f32 add of 2^23 elements: %.2f ms, %.1f GB/s\n", best * 1e3, 12.0 * n / best / 1e9);
  CHECK(c[n - 1] == 3.0f && c[0] == 3.0f, "bench add result");
  free(a); free(b); free(c);
#endif
}

/* Gradient clipping's multi-tensor passes: the sum of squares over an f32
 * tensor larger than the parallel threshold, an f64 one and an empty one
 * against a float64 sum (and the same bits under 1 and 3 threads); the
 * scale in place; bad dtypes refused with the op named. */
static void test_clip_multi(void) {
  int64_t n0 = 100003, n1 = 7, n2 = 0;
  float *a = malloc((size_t)n0 * sizeof *a);
  double b[7], want = 0;
  for (int64_t i = 0; i < n0; i++) {
    uint32_t w[4];
    nb_philox4x32(11, (uint64_t)i, w);
    a[i] = nb_philox_u01(w[0]) * 2.0f - 1.0f;
    want += (double)a[i] * a[i];
  }
  for (int i = 0; i < 7; i++) b[i] = i - 3.5, want += b[i] * b[i];
  nb_kview x[3] = {contiguous(a, NB_F32, 1, &n0), contiguous(b, NB_F64, 1, &n1),
                   contiguous(NULL, NB_F32, 1, &n2)};
  double got = -1, got1 = -2, got3 = -3;
  nb_kview out = contiguous(&got, NB_F64, 0, NULL);
  CHECK(nb_cpu_sumsq_multi(3, x, &out) == NB_OK && fabs(got - want) <= 1e-12 * want,
        "sumsq_multi %.17g want %.17g", got, want);
#ifdef _OPENMP
  int nt = omp_get_max_threads();
  omp_set_num_threads(1);
  out.data = &got1;
  nb_cpu_sumsq_multi(3, x, &out);
  omp_set_num_threads(3);
  out.data = &got3;
  nb_cpu_sumsq_multi(3, x, &out);
  omp_set_num_threads(nt);
  CHECK(memcmp(&got, &got1, sizeof got) == 0 && memcmp(&got, &got3, sizeof got) == 0,
        "sumsq_multi bits independent of threads (%.17g %.17g %.17g)", got, got1, got3);
#endif
  float a5 = a[5];
  CHECK(nb_cpu_scale_multi(3, x, 0.5) == NB_OK && a[5] == a5 * 0.5f && b[0] == -1.75,
        "scale_multi halves in place");
  int64_t ints[2] = {1, 2}, n = 2;
  nb_kview bad = contiguous(ints, NB_I64, 1, &n);
  out.data = &got;
  CHECK(nb_cpu_sumsq_multi(1, &bad, &out) == NB_ERR_DTYPE && strstr(nb_last_error(), "sumsq_multi"),
        "sumsq_multi on i64: %s", nb_last_error());
  CHECK(nb_cpu_scale_multi(1, &bad, 2.0) == NB_ERR_DTYPE && strstr(nb_last_error(), "scale_multi") &&
            ints[1] == 2, "scale_multi on i64 refused, untouched: %s", nb_last_error());
  float f = 0;
  nb_kview fout = contiguous(&f, NB_F32, 0, NULL);
  CHECK(nb_cpu_sumsq_multi(1, x, &fout) == NB_ERR_DTYPE && strstr(nb_last_error(), "f64"),
        "sumsq_multi into f32: %s", nb_last_error());
  nb_clear_error();
  free(a);
}

int main(void) {
  test_philox_kat();
  test_unary();
  test_binary();
  test_derivative_rounding();
  test_where();
  test_copy_pairs();
  test_half_rounding();
  test_int_conversions();
  test_fill_arange();
  test_reduce();
  test_reduce_large();
  test_random();
  test_clip_multi();
  bench_add();
  return nbt_finish();
}
