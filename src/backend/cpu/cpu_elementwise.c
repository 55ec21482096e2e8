/* CPU elementwise kernels: fill, arange, copy (with dtype conversion),
 * unary and binary maps, where.
 *
 * Every kernel walks its operands with the strided iterator of cpu_iter.h
 * and works on one innermost strip at a time. A strip whose operands are
 * all contiguous f32 (or f64) is computed in place by a plain vectorisable
 * loop; any other strip (strided, broadcast, f16/bf16, integers) is
 * converted tile by tile into a stack buffer of the compute type (f32 for
 * f32/f16/bf16, f64 for f64, i64 for integers), computed there, and
 * converted back. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_vmath.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

#define TILE NB_CPU_TILE

/* ---- the math of each float compute type ------------------------------
 * f32 (and f16/bf16, computed in f32): the vectorisable functions of
 * cpu_vmath.h, each within 1 ulp of the exact value. f64: libm, in forms
 * that avoid cancellation (erfc for 1 + erf of a negative argument, the
 * sigmoid form of 0.5 (1 + tanh u), softplus without a threshold). */
#define MF(name) name##f /* float libm names (exact ops: fabs, sqrt, floor, ...) */
#define MD(name) name       /* double libm names */
#define exp_f nb_vm_expf
#define log_f nb_vm_logf
#define log1p_f nb_vm_log1pf
#define expm1_f nb_vm_expm1f
#define tanh_f nb_vm_tanhf
#define sigmoid_f nb_vm_sigmoidf
#define silu_f nb_vm_siluf
#define silu_d_f nb_vm_silu_df
#define softplus_f nb_vm_softplusf
#define gelu_tanh_f nb_vm_gelu_tanhf
#define gelu_tanh_d_f nb_vm_gelu_tanh_df
#define exp_d exp
#define log_d log
#define log1p_d log1p
#define expm1_d expm1
#define tanh_d tanh

#define GELU_K 0.79788456080286535588 /* sqrt(2 / pi) */
#define GELU_C 0.044715

/* s = 1/(1+e^-x) and 1 - s, exp of a non-positive argument only */
static inline void sigmoid2_d(double x, double *s, double *sc) {
  double a = exp(-fabs(x)), big = 1 / (1 + a), small = a * big;
  *s = x >= 0 ? big : small;
  *sc = x >= 0 ? small : big;
}
static inline double sigmoid_d(double x) {
  double s, sc;
  sigmoid2_d(x, &s, &sc);
  return s;
}
static inline double silu_d(double x) { return x * sigmoid_d(x); }
static inline double silu_d_d(double x) {
  double s, sc;
  sigmoid2_d(x, &s, &sc);
  return s + x * s * sc;
}
/* log(1 + e^x) = log1p(e^-|x|) + max(x, 0): exact everywhere, no threshold */
static inline double softplus_d(double x) { return log1p(exp(-fabs(x))) + (x > 0 ? x : 0); }
/* 0.5 x (1 + tanh u) = x sigmoid(2u), u = k (x + c x^3) */
static inline double gelu_tanh_d(double x) {
  return x * sigmoid_d(2 * GELU_K * x * (1 + GELU_C * x * x));
}
static inline double gelu_tanh_d_d(double x) {
  double s, sc, x2 = x * x;
  sigmoid2_d(2 * GELU_K * x * (1 + GELU_C * x2), &s, &sc);
  return s + x * 2 * GELU_K * (1 + 3 * GELU_C * x2) * s * sc;
}

/* GELU, erf form: x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 (no cancellation
 * for negative x); f32 goes through double (the scaled argument's rounding
 * would cost ulps in the tail) with libm's erfc, not vectorised */
static inline double gelu_erf_d(double x) { return 0.5 * x * erfc(-x * 0.70710678118654752440); }
/* Phi(x) + x phi(x) */
static inline double gelu_erf_d_d(double x) {
  return 0.5 * erfc(-x * 0.70710678118654752440) +
         x * 0.39894228040143267794 * exp(-0.5 * x * x);
}
static inline float gelu_erf_f(float x) { return (float)gelu_erf_d(x); }
static inline float gelu_erf_d_f(float x) {
  double xd = x;
  return (float)(0.5 * erfc(-xd * 0.70710678118654752440) +
                 xd * 0.39894228040143267794 * exp(-0.5 * xd * xd));
}

/* NaN in either operand gives NaN (a + b carries it) */
#define DEF_MINMAX(T, SUF)                                                           \
  static inline T max_##SUF(T a, T b) { return a != a || b != b ? a + b : a > b ? a : b; } \
  static inline T min_##SUF(T a, T b) { return a != a || b != b ? a + b : a < b ? a : b; }
DEF_MINMAX(float, f)
DEF_MINMAX(double, d)

/* ---- dense array kernels (y may alias an input: same index only) ------- */
#define MAP1(T, E)                                                                   \
  _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                              \
    const T x = in[i];                                                               \
    y[i] = (E);                                                                      \
  }                                                                                  \
  break

#define DEF_UOP(T, SUF, M)                                                           \
  static void uop_##SUF(nb_uop op, int64_t n, const T *in, T *y) {                   \
    switch (op) {                                                                    \
    case NB_UOP_NEG: MAP1(T, -x);                                                    \
    case NB_UOP_ABS: MAP1(T, M(fabs)(x));                                            \
    case NB_UOP_EXP: MAP1(T, exp_##SUF(x));                                          \
    case NB_UOP_LOG: MAP1(T, log_##SUF(x));                                          \
    case NB_UOP_LOG1P: MAP1(T, log1p_##SUF(x));                                      \
    case NB_UOP_EXPM1: MAP1(T, expm1_##SUF(x));                                      \
    case NB_UOP_SQRT: MAP1(T, M(sqrt)(x));                                           \
    case NB_UOP_RSQRT: MAP1(T, (T)1 / M(sqrt)(x));                                   \
    case NB_UOP_SQUARE: MAP1(T, x * x);                                              \
    case NB_UOP_RECIPROCAL: MAP1(T, (T)1 / x);                                       \
    case NB_UOP_SIN: MAP1(T, M(sin)(x));                                             \
    case NB_UOP_COS: MAP1(T, M(cos)(x));                                             \
    case NB_UOP_TANH: MAP1(T, tanh_##SUF(x));                                        \
    case NB_UOP_SIGMOID: MAP1(T, sigmoid_##SUF(x));                                  \
    case NB_UOP_RELU: MAP1(T, x < 0 ? (T)0 : x); /* NaN passes through */            \
    case NB_UOP_GELU_ERF: MAP1(T, gelu_erf_##SUF(x));                                \
    case NB_UOP_GELU_TANH: MAP1(T, gelu_tanh_##SUF(x));                              \
    case NB_UOP_SILU: MAP1(T, silu_##SUF(x));                                        \
    case NB_UOP_SOFTPLUS: MAP1(T, softplus_##SUF(x));                                \
    case NB_UOP_SIGN: MAP1(T, x > 0 ? (T)1 : x < 0 ? (T)-1 : x); /* 0 and NaN kept */ \
    case NB_UOP_FLOOR: MAP1(T, M(floor)(x));                                         \
    case NB_UOP_CEIL: MAP1(T, M(ceil)(x));                                           \
    case NB_UOP_ROUND: MAP1(T, M(nearbyint)(x)); /* half to even */                  \
    case NB_UOP_GELU_ERF_D: MAP1(T, gelu_erf_d_##SUF(x));                            \
    case NB_UOP_GELU_TANH_D: MAP1(T, gelu_tanh_d_##SUF(x));                          \
    case NB_UOP_SILU_D: MAP1(T, silu_d_##SUF(x));                                    \
    default: break;                                                                  \
    }                                                                                \
  }

/* The f32 functions run in double lanes: where the machine has 512-bit
 * vectors, use them for this loop (GCC otherwise prefers 256 bits). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
__attribute__((target("prefer-vector-width=512")))
#endif
DEF_UOP(float, f, MF)
DEF_UOP(double, d, MD)

/* Integer unary ops in int64, wrapping like two's complement. */
static void uop_i(nb_uop op, int64_t n, const int64_t *in, int64_t *y) {
  for (int64_t i = 0; i < n; i++) {
    uint64_t u = (uint64_t)in[i];
    switch (op) {
    case NB_UOP_NEG: y[i] = (int64_t)(0 - u); break;
    case NB_UOP_ABS: y[i] = in[i] < 0 ? (int64_t)(0 - u) : in[i]; break;
    case NB_UOP_SIGN: y[i] = (in[i] > 0) - (in[i] < 0); break;
    case NB_UOP_SQUARE: y[i] = (int64_t)(u * u); break;
    default: y[i] = 0; break;
    }
  }
}

static int uop_int_ok(nb_uop op) {
  return op == NB_UOP_NEG || op == NB_UOP_ABS || op == NB_UOP_SIGN || op == NB_UOP_SQUARE;
}

#define MAP2(T, E)                                                                   \
  _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                              \
    const T x = a[i], z = b[i];                                                      \
    y[i] = (E);                                                                      \
  }                                                                                  \
  break

#define DEF_BOP(T, SUF, M)                                                           \
  static void bop_##SUF(nb_bop op, int64_t n, const T *a, const T *b, T *y) {        \
    switch (op) {                                                                    \
    case NB_BOP_ADD: MAP2(T, x + z);                                                 \
    case NB_BOP_SUB: MAP2(T, x - z);                                                 \
    case NB_BOP_MUL: MAP2(T, x * z);                                                 \
    case NB_BOP_DIV: MAP2(T, x / z);                                                 \
    case NB_BOP_POW: MAP2(T, M(pow)(x, z));                                          \
    case NB_BOP_MAX: MAP2(T, max_##SUF(x, z));                                       \
    case NB_BOP_MIN: MAP2(T, min_##SUF(x, z));                                       \
    default: break;                                                                  \
    }                                                                                \
  }

/* comparisons write bool (0/1); IEEE rules for floats: NaN compares unequal */
#define DEF_CMP(T, SUF)                                                              \
  static void cmp_##SUF(nb_bop op, int64_t n, const T *a, const T *b, uint8_t *y) {  \
    switch (op) {                                                                    \
    case NB_BOP_EQ: MAP2(T, x == z);                                                 \
    case NB_BOP_NE: MAP2(T, x != z);                                                 \
    case NB_BOP_LT: MAP2(T, x < z);                                                  \
    case NB_BOP_LE: MAP2(T, x <= z);                                                 \
    case NB_BOP_GT: MAP2(T, x > z);                                                  \
    case NB_BOP_GE: MAP2(T, x >= z);                                                 \
    default: break;                                                                  \
    }                                                                                \
  }

DEF_BOP(float, f, MF)
DEF_BOP(double, d, MD)
DEF_CMP(float, f)
DEF_CMP(double, d)
DEF_CMP(int64_t, i)

#if defined(__AVX__)
/* Strips this long write far more than any cache holds: streaming stores
 * skip reading each output line before overwriting it, a quarter of the
 * memory traffic of an add. */
#define NB_STREAM_MIN (1 << 20)
#define STREAM_LOOP(INSTR)                                                           \
  for (; i + 8 <= n; i += 8)                                                         \
    _mm256_stream_ps(y + i, INSTR(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));  \
  break

/* Returns 0 (nothing done) unless the strip qualifies. */
static int bop_f_stream(nb_bop op, int64_t n, const float *a, const float *b, float *y) {
  if (n < NB_STREAM_MIN || op > NB_BOP_DIV || ((uintptr_t)y & 3)) return 0;
  int64_t i = (int64_t)(((32 - ((uintptr_t)y & 31)) & 31) / 4); /* to 32-byte alignment */
  bop_f(op, i, a, b, y);
  switch (op) {
  case NB_BOP_ADD: STREAM_LOOP(_mm256_add_ps);
  case NB_BOP_SUB: STREAM_LOOP(_mm256_sub_ps);
  case NB_BOP_MUL: STREAM_LOOP(_mm256_mul_ps);
  default: STREAM_LOOP(_mm256_div_ps);
  }
  _mm_sfence(); /* order the streaming stores before later reads */
  bop_f(op, n - i, a + i, b + i, y + i);
  return 1;
}
#else
static int bop_f_stream(nb_bop op, int64_t n, const float *a, const float *b, float *y) {
  (void)op; (void)n; (void)a; (void)b; (void)y;
  return 0;
}
#endif

/* x ** e for integers by repeated squaring (wrapping); e >= 0. */
static int64_t ipow(int64_t x, int64_t e) {
  uint64_t r = 1, b = (uint64_t)x;
  for (uint64_t k = (uint64_t)e; k; k >>= 1, b *= b)
    if (k & 1) r *= b;
  return (int64_t)r;
}

/* Integer arithmetic in uint64 so that overflow wraps instead of being
 * undefined; returns 1 if a negative exponent was met. */
static int bop_int(nb_bop op, int64_t n, const int64_t *a, const int64_t *b, int64_t *y) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    uint64_t x = (uint64_t)a[i], z = (uint64_t)b[i];
    switch (op) {
    case NB_BOP_ADD: y[i] = (int64_t)(x + z); break;
    case NB_BOP_SUB: y[i] = (int64_t)(x - z); break;
    case NB_BOP_MUL: y[i] = (int64_t)(x * z); break;
    case NB_BOP_MAX: y[i] = a[i] > b[i] ? a[i] : b[i]; break;
    case NB_BOP_MIN: y[i] = a[i] < b[i] ? a[i] : b[i]; break;
    case NB_BOP_POW:
      if (b[i] < 0) bad = 1;
      y[i] = b[i] < 0 ? 0 : ipow(a[i], b[i]);
      break;
    default: y[i] = 0; break;
    }
  }
  return bad;
}

/* ---- strip helpers ------------------------------------------------------ */
static int all_dense(int nops, const int64_t *s, const size_t *esz) {
  for (int k = 0; k < nops; k++)
    if (s[k] != (int64_t)esz[k]) return 0;
  return 1;
}

/* Copies n elements of size es between strided places. */
static void copy_strip(size_t es, int64_t n, char *d, int64_t ds, const char *s, int64_t ss) {
  if (ds == (int64_t)es && ss == (int64_t)es) {
    memcpy(d, s, (size_t)n * es);
    return;
  }
  switch (es) {
  case 1: for (int64_t j = 0; j < n; j++) d[j * ds] = s[j * ss]; break;
  case 2: for (int64_t j = 0; j < n; j++) *(uint16_t *)(d + j * ds) = *(const uint16_t *)(s + j * ss); break;
  case 4: for (int64_t j = 0; j < n; j++) *(uint32_t *)(d + j * ds) = *(const uint32_t *)(s + j * ss); break;
  default: for (int64_t j = 0; j < n; j++) memcpy(d + j * ds, s + j * ss, es); break;
  }
}

/* ---- fill and arange ---------------------------------------------------- */
typedef struct { size_t es; unsigned char val[8]; int bytewise; } fill_ctx;

static void fill_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  (void)lin;
  const fill_ctx *c = vc;
  if (c->bytewise && s[0] == (int64_t)c->es) { /* all bytes equal: memset */
    memset(p[0], c->val[0], (size_t)n * c->es);
    return;
  }
  for (int64_t j = 0; j < n; j++) memcpy(p[0] + j * s[0], c->val, c->es);
}

/* One element of dtype dt holding v (floats rounded, integers truncated
 * with saturation). */
static void encode_scalar(nb_dtype dt, double v, unsigned char *out) {
  if (nb_dtype_is_float(dt)) nb_store_f64(out, dt, v);
  else nb_cpu_put_f64((char *)out, dt, v);
}

nb_status nb_cpu_fill(const nb_kview *out, double value) {
  fill_ctx c = {nb_dtype_size(out->dtype), {0}, 1};
  nb_cpu_iter it;
  encode_scalar(out->dtype, value, c.val);
  for (size_t k = 1; k < c.es; k++) c.bytewise &= c.val[k] == c.val[0];
  nb_cpu_iter_views(&it, 1, (const nb_kview *const[]){out});
  if (it.numel) nb_cpu_iter_run(&it, fill_strip, &c);
  return NB_OK;
}

typedef struct { nb_dtype dt; double start, step; } arange_ctx;

static void arange_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  const arange_ctx *c = vc;
  double buf[TILE];
  for (int64_t t = 0; t < n; t += TILE) {
    int64_t m = n - t < TILE ? n - t : TILE;
    for (int64_t j = 0; j < m; j++) buf[j] = c->start + (double)(lin + t + j) * c->step;
    nb_cpu_store_f64(c->dt, m, buf, p[0] + t * s[0], s[0]);
  }
}

nb_status nb_cpu_arange(const nb_kview *out, double start, double step) {
  arange_ctx c = {out->dtype, start, step};
  nb_cpu_iter it;
  nb_cpu_iter_views(&it, 1, (const nb_kview *const[]){out});
  if (it.numel) nb_cpu_iter_run(&it, arange_strip, &c);
  return NB_OK;
}

/* ---- copy --------------------------------------------------------------- */
typedef struct { nb_dtype od, id; size_t oes, ies; } copy_ctx;

static int is_half(nb_dtype dt) { return dt == NB_F16 || dt == NB_BF16; }

/* Converts one tile. f32/f16/bf16 among themselves go through f32 (exact);
 * other float sources through f64 (exact); integer sources through i64, so
 * large integers never pass through a double. */
static void convert_tile(const copy_ctx *c, int64_t m, char *d, int64_t ds, const char *s,
                         int64_t ss) {
  if ((c->id == NB_F32 || is_half(c->id)) && (c->od == NB_F32 || is_half(c->od))) {
    float buf[TILE];
    nb_cpu_load_f32(c->id, m, s, ss, buf);
    nb_cpu_store_f32(c->od, m, buf, d, ds);
  } else if (nb_dtype_is_float(c->id)) {
    double buf[TILE];
    nb_cpu_load_f64(c->id, m, s, ss, buf);
    nb_cpu_store_f64(c->od, m, buf, d, ds);
  } else {
    int64_t buf[TILE];
    nb_cpu_load_i64(c->id, m, s, ss, buf);
    nb_cpu_store_i64(c->od, m, buf, d, ds);
  }
}

static void copy_conv_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  (void)lin;
  const copy_ctx *c = vc;
  for (int64_t t = 0; t < n; t += TILE) {
    int64_t m = n - t < TILE ? n - t : TILE;
    convert_tile(c, m, p[0] + t * s[0], s[0], p[1] + t * s[1], s[1]);
  }
}

static void copy_same_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  (void)lin;
  const copy_ctx *c = vc;
  copy_strip(c->oes, n, p[0], s[0], p[1], s[1]);
}

nb_status nb_cpu_copy(const nb_kview *out, const nb_kview *in) {
  copy_ctx c = {out->dtype, in->dtype, nb_dtype_size(out->dtype), nb_dtype_size(in->dtype)};
  nb_cpu_iter it;
  nb_cpu_iter_views(&it, 2, (const nb_kview *const[]){out, in});
  if (!it.numel) return NB_OK;
  /* same dtype: bytes move unchanged (memcpy per strip; one strip, split
   * across threads, when both sides are contiguous) */
  nb_cpu_iter_run(&it, c.od == c.id ? copy_same_strip : copy_conv_strip, &c);
  return NB_OK;
}

/* ---- unary -------------------------------------------------------------- */
typedef struct { nb_uop op; nb_dtype od, id; } unary_ctx;

static void unary_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  (void)lin;
  const unary_ctx *c = vc;
  if (c->od == c->id && (c->od == NB_F32 || c->od == NB_F64) &&
      all_dense(2, s, (const size_t[]){nb_dtype_size(c->od), nb_dtype_size(c->od)})) {
    if (c->od == NB_F32) uop_f(c->op, n, (const float *)p[1], (float *)p[0]);
    else uop_d(c->op, n, (const double *)p[1], (double *)p[0]);
    return;
  }
  for (int64_t t = 0; t < n; t += TILE) {
    int64_t m = n - t < TILE ? n - t : TILE;
    char *o = p[0] + t * s[0];
    const char *x = p[1] + t * s[1];
    if (!nb_dtype_is_float(c->id)) {
      int64_t buf[TILE];
      nb_cpu_load_i64(c->id, m, x, s[1], buf);
      uop_i(c->op, m, buf, buf);
      nb_cpu_store_i64(c->od, m, buf, o, s[0]);
    } else if (c->id == NB_F64) {
      double buf[TILE];
      nb_cpu_load_f64(c->id, m, x, s[1], buf);
      uop_d(c->op, m, buf, buf);
      nb_cpu_store_f64(c->od, m, buf, o, s[0]);
    } else {
      float buf[TILE];
      nb_cpu_load_f32(c->id, m, x, s[1], buf);
      uop_f(c->op, m, buf, buf);
      nb_cpu_store_f32(c->od, m, buf, o, s[0]);
    }
  }
}

nb_status nb_cpu_unary(nb_uop op, const nb_kview *out, const nb_kview *in) {
  if ((unsigned)op >= NB_UOP_COUNT)
    return nb_error_set(NB_ERR_VALUE, "cpu unary: unknown op %d", (int)op);
  if (!nb_dtype_is_float(in->dtype) && !uop_int_ok(op))
    return nb_error_set(NB_ERR_DTYPE, "cpu unary: op %d on dtype %s (expected a float dtype)",
                        (int)op, nb_dtype_name(in->dtype));
  unary_ctx c = {op, out->dtype, in->dtype};
  nb_cpu_iter it;
  nb_cpu_iter_views(&it, 2, (const nb_kview *const[]){out, in});
  if (it.numel) nb_cpu_iter_run(&it, unary_strip, &c);
  return NB_OK;
}

/* ---- binary ------------------------------------------------------------- */
typedef struct { nb_bop op; nb_dtype od, dt; int bad; } binary_ctx;

static int is_cmp(nb_bop op) { return op >= NB_BOP_EQ; }

/* Contiguous f32/f64 operands: computed where they lie. Returns 0 if the
 * strip does not qualify. */
static int binary_dense(const binary_ctx *c, int64_t n, char *const *p, const int64_t *s) {
  if (c->dt != NB_F32 && c->dt != NB_F64) return 0;
  size_t es = nb_dtype_size(c->dt);
  if (!all_dense(3, s, (const size_t[]){nb_dtype_size(c->od), es, es})) return 0;
  if (c->dt == NB_F32) {
    if (is_cmp(c->op)) cmp_f(c->op, n, (const float *)p[1], (const float *)p[2], (uint8_t *)p[0]);
    else if (!bop_f_stream(c->op, n, (const float *)p[1], (const float *)p[2], (float *)p[0]))
      bop_f(c->op, n, (const float *)p[1], (const float *)p[2], (float *)p[0]);
  } else {
    if (is_cmp(c->op)) cmp_d(c->op, n, (const double *)p[1], (const double *)p[2], (uint8_t *)p[0]);
    else bop_d(c->op, n, (const double *)p[1], (const double *)p[2], (double *)p[0]);
  }
  return 1;
}

static void binary_tile_f(const binary_ctx *c, int64_t m, char *o, int64_t os, const char *a,
                          int64_t as, const char *b, int64_t bs) {
  float x[TILE], z[TILE];
  nb_cpu_load_f32(c->dt, m, a, as, x);
  nb_cpu_load_f32(c->dt, m, b, bs, z);
  if (is_cmp(c->op)) {
    uint8_t y[TILE];
    cmp_f(c->op, m, x, z, y);
    for (int64_t j = 0; j < m; j++) o[j * os] = (char)y[j];
  } else {
    bop_f(c->op, m, x, z, x);
    nb_cpu_store_f32(c->od, m, x, o, os);
  }
}

static void binary_tile_d(const binary_ctx *c, int64_t m, char *o, int64_t os, const char *a,
                          int64_t as, const char *b, int64_t bs) {
  double x[TILE], z[TILE];
  nb_cpu_load_f64(c->dt, m, a, as, x);
  nb_cpu_load_f64(c->dt, m, b, bs, z);
  if (is_cmp(c->op)) {
    uint8_t y[TILE];
    cmp_d(c->op, m, x, z, y);
    for (int64_t j = 0; j < m; j++) o[j * os] = (char)y[j];
  } else {
    bop_d(c->op, m, x, z, x);
    nb_cpu_store_f64(c->od, m, x, o, os);
  }
}

/* Returns 1 on a negative integer exponent. */
static int binary_tile_i(const binary_ctx *c, int64_t m, char *o, int64_t os, const char *a,
                         int64_t as, const char *b, int64_t bs) {
  int64_t x[TILE], z[TILE];
  int bad = 0;
  nb_cpu_load_i64(c->dt, m, a, as, x);
  nb_cpu_load_i64(c->dt, m, b, bs, z);
  if (is_cmp(c->op)) {
    uint8_t y[TILE];
    cmp_i(c->op, m, x, z, y);
    for (int64_t j = 0; j < m; j++) o[j * os] = (char)y[j];
  } else {
    bad = bop_int(c->op, m, x, z, x);
    nb_cpu_store_i64(c->od, m, x, o, os);
  }
  return bad;
}

static void binary_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  (void)lin;
  binary_ctx *c = vc;
  if (binary_dense(c, n, p, s)) return;
  for (int64_t t = 0; t < n; t += TILE) {
    int64_t m = n - t < TILE ? n - t : TILE;
    char *o = p[0] + t * s[0];
    const char *a = p[1] + t * s[1], *b = p[2] + t * s[2];
    if (c->dt == NB_F64) binary_tile_d(c, m, o, s[0], a, s[1], b, s[2]);
    else if (nb_dtype_is_float(c->dt)) binary_tile_f(c, m, o, s[0], a, s[1], b, s[2]);
    else if (binary_tile_i(c, m, o, s[0], a, s[1], b, s[2])) {
#pragma omp atomic write
      c->bad = 1;
    }
  }
}

nb_status nb_cpu_binary(nb_bop op, const nb_kview *out, const nb_kview *a, const nb_kview *b) {
  if ((unsigned)op >= NB_BOP_COUNT)
    return nb_error_set(NB_ERR_VALUE, "cpu binary: unknown op %d", (int)op);
  if (op == NB_BOP_DIV && !nb_dtype_is_float(a->dtype))
    return nb_error_set(NB_ERR_DTYPE, "cpu binary: div on dtype %s (expected a float dtype)",
                        nb_dtype_name(a->dtype));
  binary_ctx c = {op, out->dtype, a->dtype, 0};
  nb_cpu_iter it;
  nb_cpu_iter_views(&it, 3, (const nb_kview *const[]){out, a, b});
  if (it.numel) nb_cpu_iter_run(&it, binary_strip, &c);
  if (c.bad)
    return nb_error_set(NB_ERR_VALUE,
                        "pow: integers to negative integer powers are not allowed (dtype %s)",
                        nb_dtype_name(a->dtype));
  return NB_OK;
}

/* ---- where -------------------------------------------------------------- */
static void where_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  (void)lin;
  size_t es = *(const size_t *)vc;
  for (int64_t j = 0; j < n; j++) {
    const char *src = p[1][j * s[1]] ? p[2] + j * s[2] : p[3] + j * s[3];
    char *d = p[0] + j * s[0];
    switch (es) {
    case 1: *d = *src; break;
    case 2: *(uint16_t *)d = *(const uint16_t *)src; break;
    case 4: *(uint32_t *)d = *(const uint32_t *)src; break;
    default: *(uint64_t *)d = *(const uint64_t *)src; break;
    }
  }
}

nb_status nb_cpu_where(const nb_kview *out, const nb_kview *cond, const nb_kview *a,
                       const nb_kview *b) {
  size_t es = nb_dtype_size(out->dtype);
  nb_cpu_iter it;
  if (cond->dtype != NB_BOOL && cond->dtype != NB_U8)
    return nb_error_set(NB_ERR_DTYPE, "cpu where: condition dtype %s (expected bool)",
                        nb_dtype_name(cond->dtype));
  if (a->dtype != out->dtype || b->dtype != out->dtype)
    return nb_error_set(NB_ERR_DTYPE, "cpu where: a %s, b %s, out %s (expected one dtype)",
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype),
                        nb_dtype_name(out->dtype));
  nb_cpu_iter_views(&it, 4, (const nb_kview *const[]){out, cond, a, b});
  if (it.numel) nb_cpu_iter_run(&it, where_strip, &es);
  return NB_OK;
}
