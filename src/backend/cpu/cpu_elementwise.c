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

/* ---- the primitives of backend/ew_list.h for each float compute type ----
 * f32 (and f16/bf16, computed in f32): the vectorisable functions of
 * cpu_vmath.h, each within 1 ulp of the exact value. f64: libm, in forms
 * that avoid cancellation (erfc for 1 + erf of a negative argument, the
 * sigmoid form of 0.5 (1 + tanh u), softplus without a threshold). Each
 * primitive picks its function from x's type. */
#define NB_EW_FD(x, F, D) _Generic((x), float: F, default: D)(x)
#define E_ABS(x) NB_EW_FD(x, fabsf, fabs)
#define E_SQRT(x) NB_EW_FD(x, sqrtf, sqrt)
#define E_RSQRT(x) (1 / E_SQRT(x))
#define E_SIN(x) NB_EW_FD(x, sinf, sin)
#define E_COS(x) NB_EW_FD(x, cosf, cos)
#define E_FLOOR(x) NB_EW_FD(x, floorf, floor)
#define E_CEIL(x) NB_EW_FD(x, ceilf, ceil)
#define E_ROUND(x) NB_EW_FD(x, nearbyintf, nearbyint) /* half to even */
#define E_EXP(x) NB_EW_FD(x, nb_vm_expf, exp)
#define E_LOG(x) NB_EW_FD(x, nb_vm_logf, log)
#define E_LOG1P(x) NB_EW_FD(x, nb_vm_log1pf, log1p)
#define E_EXPM1(x) NB_EW_FD(x, nb_vm_expm1f, expm1)
#define E_TANH(x) NB_EW_FD(x, nb_vm_tanhf, tanh)
#define E_SIGMOID(x) NB_EW_FD(x, nb_vm_sigmoidf, sigmoid_d)
#define E_SILU(x) NB_EW_FD(x, nb_vm_siluf, silu_d)
#define E_SILU_D(x) NB_EW_FD(x, nb_vm_silu_df, silu_d_d)
#define E_SOFTPLUS(x) NB_EW_FD(x, nb_vm_softplusf, softplus_d)
#define E_GELU_TANH(x) NB_EW_FD(x, nb_vm_gelu_tanhf, gelu_tanh_d)
#define E_GELU_TANH_D(x) NB_EW_FD(x, nb_vm_gelu_tanh_df, gelu_tanh_d_d)
#define E_GELU_ERF(x) NB_EW_FD(x, gelu_erf_f, gelu_erf_d)
#define E_GELU_ERF_D(x) NB_EW_FD(x, gelu_erf_d_f, gelu_erf_d_d)
#define E_POW(x, z) _Generic((x), float: powf, default: pow)(x, z)
#define E_MAX(x, z) _Generic((x), float: max_f, default: max_d)(x, z)
#define E_MIN(x, z) _Generic((x), float: min_f, default: min_d)(x, z)
/* integers to a negative power: 0, and the kernel reports it (bad) */
#define E_IPOW(x, z) ((z) < 0 ? (bad = 1, 0) : ipow(x, z))

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

/* x ** e for integers by repeated squaring (wrapping); e >= 0. */
static int64_t ipow(int64_t x, int64_t e) {
  uint64_t r = 1, b = (uint64_t)x;
  for (uint64_t k = (uint64_t)e; k; k >>= 1, b *= b)
    if (k & 1) r *= b;
  return (int64_t)r;
}

/* ---- dense array kernels (y may alias an input: same index only) -------
 * One loop per op of ew_list.h, in the function's compute type ew_t. */
#define MAP1(E)                                                                      \
  _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                              \
    const ew_t x = in[i];                                                            \
    y[i] = (E);                                                                      \
  }                                                                                  \
  break
#define UOP_CASE(ID, KNAME, NAME, INT, SAVE, EXPR, ...) case NB_UOP_##ID: MAP1(EXPR);
#define UOP_D_CASE(ID, KNAME, NODE, EXPR) case NB_UOP_##ID: MAP1(EXPR);

#define DEF_UOP(T, SUF)                                                              \
  static void uop_##SUF(nb_uop op, int64_t n, const T *in, T *y) {                   \
    typedef T ew_t;                                                                  \
    switch (op) {                                                                    \
    NB_UOP_LIST(UOP_CASE)                                                            \
    NB_UOP_DERIVATIVE_LIST(UOP_D_CASE)                                               \
    default: break;                                                                  \
    }                                                                                \
  }

/* The f32 functions run in double lanes: where the machine has 512-bit
 * vectors, use them for this loop (GCC otherwise prefers 256 bits). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
__attribute__((target("prefer-vector-width=512")))
#endif
DEF_UOP(float, f)
DEF_UOP(double, d)

/* Integer unary ops in int64, wrapping like two's complement; the rows of
 * ew_list.h with an integer kernel (int 1). */
#define UOP_INT_CASE(ID, KNAME, NAME, INT, SAVE, EXPR, IEXPR, ...)                   \
  case NB_UOP_##ID:                                                                  \
    if (INT == 1) {                                                                  \
      for (int64_t i = 0; i < n; i++) {                                              \
        const int64_t x = in[i];                                                     \
        (void)x;                                                                     \
        y[i] = (IEXPR);                                                              \
      }                                                                              \
      return;                                                                        \
    }                                                                                \
    break;
static void uop_i(nb_uop op, int64_t n, const int64_t *in, int64_t *y) {
  switch (op) {
  NB_UOP_LIST(UOP_INT_CASE)
  default: break;
  }
  for (int64_t i = 0; i < n; i++) y[i] = 0;
}

#define UOP_INT_OK(ID, KNAME, NAME, INT, ...) [NB_UOP_##ID] = INT == 1,
static const unsigned char uop_int_ok[NB_UOP_COUNT] = {NB_UOP_LIST(UOP_INT_OK)};

#define MAP2(E)                                                                      \
  _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                              \
    const ew_t x = a[i], z = b[i];                                                   \
    y[i] = (E);                                                                      \
  }                                                                                  \
  break
#define BOP_CASE(ID, KNAME, NAME, INT, EXPR, ...) case NB_BOP_##ID: MAP2(EXPR);
#define CMP_CASE(ID, NAME, EXPR) case NB_BOP_##ID: MAP2(EXPR);

#define DEF_BOP(T, SUF)                                                              \
  static void bop_##SUF(nb_bop op, int64_t n, const T *a, const T *b, T *y) {        \
    typedef T ew_t;                                                                  \
    switch (op) {                                                                    \
    NB_BOP_LIST(BOP_CASE)                                                            \
    NB_BOP_DERIVATIVE_LIST(BOP_CASE)                                                 \
    default: break;                                                                  \
    }                                                                                \
  }

/* comparisons write bool (0/1) */
#define DEF_CMP(T, SUF)                                                              \
  static void cmp_##SUF(nb_bop op, int64_t n, const T *a, const T *b, uint8_t *y) {  \
    typedef T ew_t;                                                                  \
    switch (op) {                                                                    \
    NB_CMP_LIST(CMP_CASE)                                                            \
    default: break;                                                                  \
    }                                                                                \
  }

DEF_BOP(float, f)
DEF_BOP(double, d)
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

/* Integer arithmetic in uint64 so that overflow wraps instead of being
 * undefined (the rows of ew_list.h with an integer kernel); returns 1 if a
 * negative exponent was met. */
#define BOP_INT_CASE(ID, KNAME, NAME, INT, EXPR, IEXPR, ...)                         \
  case NB_BOP_##ID:                                                                  \
    if (INT == 1) {                                                                  \
      for (int64_t i = 0; i < n; i++) {                                              \
        const int64_t x = a[i], z = b[i];                                            \
        (void)x; (void)z;                                                            \
        y[i] = (IEXPR);                                                              \
      }                                                                              \
      return bad;                                                                    \
    }                                                                                \
    break;
static int bop_int(nb_bop op, int64_t n, const int64_t *a, const int64_t *b, int64_t *y) {
  int bad = 0;
  switch (op) {
  NB_BOP_LIST(BOP_INT_CASE)
  default: break;
  }
  for (int64_t i = 0; i < n; i++) y[i] = 0;
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
  if (nb_dtype_is_float(dt) || nb_dtype_is_fp8(dt)) nb_store_f64(out, dt, v);
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

/* f16, bf16 and the fp8 types: every value an f32 */
static int is_half(nb_dtype dt) { return dt == NB_F16 || dt == NB_BF16 || nb_dtype_is_fp8(dt); }

/* Converts one tile. f32/f16/bf16/fp8 among themselves go through f32
 * (exact; one rounding into the narrower type); other float sources
 * through f64 (exact; f64 to f16/bf16/fp8 rounds once, core/half.h);
 * integer sources through i64, so large integers never pass through a
 * double (an integer to fp8 through a double: exact below 2^53). */
static void convert_tile(const copy_ctx *c, int64_t m, char *d, int64_t ds, const char *s,
                         int64_t ss) {
  if ((c->id == NB_F32 || is_half(c->id)) && (c->od == NB_F32 || is_half(c->od))) {
    float buf[TILE];
    nb_cpu_load_f32(c->id, m, s, ss, buf);
    nb_cpu_store_f32(c->od, m, buf, d, ds);
  } else if (nb_dtype_is_float(c->id) || nb_dtype_is_fp8(c->id)) {
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
  if (!nb_dtype_is_float(in->dtype) && !uop_int_ok[op])
    return nb_error_set(NB_ERR_DTYPE, "cpu unary: op %s on dtype %s (expected a float dtype)",
                        nb_uop_names[op], nb_dtype_name(in->dtype));
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
