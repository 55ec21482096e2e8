/* Strided N-d iteration shared by the CPU elementwise, reduction and random
 * kernels, plus tile loaders that convert any dtype to a compute type.
 *
 * An iterator covers one logical shape walked in row-major order by up to
 * NB_CPU_MAXOPS operands, each with its own byte strides. Size-1 axes are
 * dropped and adjacent axes that are contiguous relative to each other in
 * every operand are merged, so a contiguous tensor of any shape becomes one
 * long run. A walk over a range of linear indices hands each innermost run
 * (length, operand pointers, operand strides, linear index of its start) to
 * a callback; the callback does the arithmetic on a 1-D strip. */
#ifndef NB_CPU_ITER_H
#define NB_CPU_ITER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/backend.h"
#include "core/half.h"

#define NB_CPU_MAXOPS 4
/* Below this many elements one thread does the whole walk: starting a
 * parallel region costs more than the work. */
#define NB_CPU_PAR_MIN 32768
/* Elements per stack tile when a strip is converted to a compute type. */
#define NB_CPU_TILE 256

/* A thread's scratch of n doubles (a row, a plane) inside a parallel
 * region: malloc'd, or NULL with *fail set (atomically) so that the caller
 * skips its share and reports NB_ERR_OOM after the region. */
static inline double *nb_cpu_scratch(size_t n, int *fail) {
  double *p = malloc(n * sizeof *p);
  if (!p) {
#pragma omp atomic write
    *fail = 1;
  }
  return p;
}

typedef struct {
  int ndim, nops;
  int64_t numel;
  int64_t shape[NB_MAX_DIMS];
  int64_t stride[NB_CPU_MAXOPS][NB_MAX_DIMS]; /* bytes */
  char *data[NB_CPU_MAXOPS];
} nb_cpu_iter;

/* One innermost strip: n elements, operand k at p[k] + j*s[k] (bytes);
 * lin is the row-major linear index of the strip's first element. */
typedef void (*nb_cpu_strip_fn)(void *ctx, int64_t n, char *const *p, const int64_t *s,
                                int64_t lin);

/* Sets up an iterator over shape (ndim axes); operand k has base data[k],
 * element strides estr[k] and element size esz[k]. */
static inline void nb_cpu_iter_init(nb_cpu_iter *it, int ndim, const int64_t *shape, int nops,
                                    void *const *data, const int64_t *const *estr,
                                    const size_t *esz) {
  int nd = 0;
  it->nops = nops;
  it->numel = 1;
  for (int k = 0; k < nops; k++) it->data[k] = (char *)data[k];
  for (int d = 0; d < ndim; d++) {
    it->numel *= shape[d];
    if (shape[d] == 1) continue; /* contributes nothing to addressing */
    int merge = nd > 0;
    for (int k = 0; k < nops && merge; k++)
      merge = it->stride[k][nd - 1] == estr[k][d] * (int64_t)esz[k] * shape[d];
    if (merge) { /* previous axis steps exactly over this one: fuse them */
      it->shape[nd - 1] *= shape[d];
      for (int k = 0; k < nops; k++) it->stride[k][nd - 1] = estr[k][d] * (int64_t)esz[k];
      continue;
    }
    it->shape[nd] = shape[d];
    for (int k = 0; k < nops; k++) it->stride[k][nd] = estr[k][d] * (int64_t)esz[k];
    nd++;
  }
  if (nd == 0) { /* a scalar (or all size-1 axes): one strip of length 1 */
    it->shape[0] = 1;
    for (int k = 0; k < nops; k++) it->stride[k][0] = 0;
    nd = 1;
  }
  it->ndim = nd;
}

/* An iterator over the views' common shape (that of v[0]). */
static inline void nb_cpu_iter_views(nb_cpu_iter *it, int nops, const nb_kview *const *v) {
  void *data[NB_CPU_MAXOPS];
  const int64_t *estr[NB_CPU_MAXOPS];
  size_t esz[NB_CPU_MAXOPS];
  for (int k = 0; k < nops; k++) {
    data[k] = v[k]->data;
    estr[k] = v[k]->strides;
    esz[k] = nb_dtype_size(v[k]->dtype);
  }
  nb_cpu_iter_init(it, v[0]->ndim, v[0]->shape, nops, data, estr, esz);
}

/* Walks linear indices [begin, end) of it, one strip at a time. */
static inline void nb_cpu_iter_range(const nb_cpu_iter *it, int64_t begin, int64_t end,
                                     nb_cpu_strip_fn fn, void *ctx) {
  int64_t idx[NB_MAX_DIMS];
  char *p[NB_CPU_MAXOPS];
  int64_t s[NB_CPU_MAXOPS];
  const int last = it->ndim - 1;
  if (begin >= end) return;
  for (int k = 0; k < it->nops; k++) {
    p[k] = it->data[k];
    s[k] = it->stride[k][last];
  }
  int64_t rem = begin;
  for (int d = last; d >= 0; d--) { /* decompose begin into a multi-index */
    idx[d] = rem % it->shape[d];
    rem /= it->shape[d];
    for (int k = 0; k < it->nops; k++) p[k] += idx[d] * it->stride[k][d];
  }
  for (int64_t lin = begin;;) {
    int64_t n = it->shape[last] - idx[last];
    if (n > end - lin) n = end - lin;
    fn(ctx, n, p, s, lin);
    lin += n;
    if (lin >= end) return;
    /* the strip ended at the end of the innermost axis: carry outward */
    for (int k = 0; k < it->nops; k++) p[k] -= idx[last] * s[k];
    idx[last] = 0;
    for (int d = last - 1; d >= 0; d--) {
      for (int k = 0; k < it->nops; k++) p[k] += it->stride[k][d];
      if (++idx[d] < it->shape[d]) break;
      for (int k = 0; k < it->nops; k++) p[k] -= idx[d] * it->stride[k][d];
      idx[d] = 0;
    }
  }
}

/* Walks the whole iterator; with par set, split across OpenMP threads into
 * contiguous ranges of linear indices (for large walks the boundaries
 * fall on multiples of 64 elements, so that threads rarely share a cache
 * line of a contiguous output). */
static inline void nb_cpu_iter_run_par(const nb_cpu_iter *it, nb_cpu_strip_fn fn, void *ctx,
                                       int par) {
  const int64_t total = it->numel;
#ifdef _OPENMP
  if (par && total > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t mask = total >= nt * 4096 ? ~(int64_t)63 : ~(int64_t)0;
      int64_t b = t == 0 ? 0 : (total / nt * t) & mask;
      int64_t e = t == nt - 1 ? total : (total / nt * (t + 1)) & mask;
      nb_cpu_iter_range(it, b, e, fn, ctx);
    }
    return;
  }
#else
  (void)par;
#endif
  nb_cpu_iter_range(it, 0, total, fn, ctx);
}

/* The same, parallel when there are at least NB_CPU_PAR_MIN elements. */
static inline void nb_cpu_iter_run(const nb_cpu_iter *it, nb_cpu_strip_fn fn, void *ctx) {
  nb_cpu_iter_run_par(it, fn, ctx, it->numel >= NB_CPU_PAR_MIN);
}

/* ---- scalar conversions (inline twins of the core's, same results) ------ */
static inline float nb_cpu_bf16_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t nb_cpu_f32_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

static inline float nb_cpu_f16_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  float f;
  if (exp == 0) { /* zero or subnormal: exact as mant * 2^-24 */
    f = (float)mant * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  u = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  memcpy(&f, &u, 4);
  return f;
}

/* Float to integer: truncation with saturation, NaN to 0 (as nb_store_f64). */
static inline int64_t nb_cpu_f64_i64(double v) {
  if (v != v) return 0;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  return (int64_t)v;
}

/* Integer to a narrower integer dtype wraps (two's complement), bool is
 * "nonzero". */
static inline void nb_cpu_put_i64(char *p, nb_dtype dt, int64_t v) {
  switch (dt) {
  case NB_I64: *(int64_t *)p = v; break;
  case NB_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v; break;
  case NB_U8: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
  case NB_BOOL: *(uint8_t *)p = v != 0; break;
  case NB_F64: *(double *)p = (double)v; break;
  case NB_F32: *(float *)p = (float)v; break;
  /* via double: exact below 2^53, then correctly rounded (core/half.h) */
  case NB_F16: *(uint16_t *)p = nb_f64_to_f16((double)v); break;
  case NB_BF16: *(uint16_t *)p = nb_cpu_f32_bf16(nb_f64_to_f32_odd((double)v)); break;
  case NB_F8E4M3: *(uint8_t *)p = nb_f64_to_f8e4m3((double)v); break;
  case NB_F8E5M2: *(uint8_t *)p = nb_f64_to_f8e5m2((double)v); break;
  default: break;
  }
}

/* A float value to an integer (or bool) dtype: truncation toward zero,
 * saturating at the dtype's range, NaN to 0 (bool: nonzero, NaN true). */
static inline void nb_cpu_put_f64(char *p, nb_dtype dt, double v) {
  if (nb_dtype_is_fp8(dt)) { /* an fp8 store: rounded, as nb_store_f64 */
    *(uint8_t *)p = dt == NB_F8E4M3 ? nb_f64_to_f8e4m3(v) : nb_f64_to_f8e5m2(v);
    return;
  }
  int64_t i = nb_cpu_f64_i64(v);
  switch (dt) {
  case NB_I32: i = i < INT32_MIN ? INT32_MIN : i > INT32_MAX ? INT32_MAX : i; break;
  case NB_U8: i = i < 0 ? 0 : i > 255 ? 255 : i; break;
  case NB_BOOL: *(uint8_t *)p = v != 0; return;
  default: break;
  }
  nb_cpu_put_i64(p, dt, i);
}

static inline int64_t nb_cpu_get_i64(const char *p, nb_dtype dt) {
  switch (dt) {
  case NB_I64: return *(const int64_t *)p;
  case NB_I32: return *(const int32_t *)p;
  case NB_U8: return *(const uint8_t *)p;
  case NB_BOOL: return *(const uint8_t *)p != 0;
  case NB_F64: return nb_cpu_f64_i64(*(const double *)p);
  case NB_F32: return nb_cpu_f64_i64(*(const float *)p);
  case NB_F16: return nb_cpu_f64_i64(nb_cpu_f16_f32(*(const uint16_t *)p));
  case NB_BF16: return nb_cpu_f64_i64(nb_cpu_bf16_f32(*(const uint16_t *)p));
  case NB_F8E4M3: return nb_cpu_f64_i64(nb_f8e4m3_to_f32(*(const uint8_t *)p));
  case NB_F8E5M2: return nb_cpu_f64_i64(nb_f8e5m2_to_f32(*(const uint8_t *)p));
  default: return 0;
  }
}

/* ---- tile loaders: n elements at p with byte stride s <-> a dense buffer */
#define NB_CPU_LOOP(T, EXPR)                                   \
  for (int64_t j = 0; j < n; j++) {                            \
    const T v_ = *(const T *)(p + j * s);                      \
    buf[j] = (EXPR);                                           \
  }

static inline void nb_cpu_load_f32(nb_dtype dt, int64_t n, const char *p, int64_t s, float *buf) {
  switch (dt) {
  case NB_F32: NB_CPU_LOOP(float, v_); break;
  case NB_F64: NB_CPU_LOOP(double, (float)v_); break;
  case NB_F16: NB_CPU_LOOP(uint16_t, nb_cpu_f16_f32(v_)); break;
  case NB_BF16: NB_CPU_LOOP(uint16_t, nb_cpu_bf16_f32(v_)); break;
  case NB_F8E4M3: NB_CPU_LOOP(uint8_t, nb_f8e4m3_to_f32(v_)); break;
  case NB_F8E5M2: NB_CPU_LOOP(uint8_t, nb_f8e5m2_to_f32(v_)); break;
  default:
    for (int64_t j = 0; j < n; j++) buf[j] = (float)nb_cpu_get_i64(p + j * s, dt);
  }
}

static inline void nb_cpu_load_f64(nb_dtype dt, int64_t n, const char *p, int64_t s, double *buf) {
  switch (dt) {
  case NB_F64: NB_CPU_LOOP(double, v_); break;
  case NB_F32: NB_CPU_LOOP(float, v_); break;
  case NB_F16: NB_CPU_LOOP(uint16_t, nb_cpu_f16_f32(v_)); break;
  case NB_BF16: NB_CPU_LOOP(uint16_t, nb_cpu_bf16_f32(v_)); break;
  case NB_F8E4M3: NB_CPU_LOOP(uint8_t, nb_f8e4m3_to_f32(v_)); break;
  case NB_F8E5M2: NB_CPU_LOOP(uint8_t, nb_f8e5m2_to_f32(v_)); break;
  default:
    for (int64_t j = 0; j < n; j++) buf[j] = (double)nb_cpu_get_i64(p + j * s, dt);
  }
}

static inline void nb_cpu_load_i64(nb_dtype dt, int64_t n, const char *p, int64_t s, int64_t *buf) {
  switch (dt) {
  case NB_I64: NB_CPU_LOOP(int64_t, v_); break;
  case NB_I32: NB_CPU_LOOP(int32_t, v_); break;
  case NB_U8: NB_CPU_LOOP(uint8_t, v_); break;
  case NB_BOOL: NB_CPU_LOOP(uint8_t, v_ != 0); break;
  default:
    for (int64_t j = 0; j < n; j++) buf[j] = nb_cpu_get_i64(p + j * s, dt);
  }
}
#undef NB_CPU_LOOP

#define NB_CPU_SLOOP(T, EXPR)                                  \
  for (int64_t j = 0; j < n; j++) {                            \
    const double v_ = buf[j];                                  \
    *(T *)(p + j * s) = (EXPR);                                \
  }

/* Stores float values; to integer dtypes they truncate with saturation. */
static inline void nb_cpu_store_f32(nb_dtype dt, int64_t n, const float *buf, char *p, int64_t s) {
  switch (dt) {
  case NB_F32:
    for (int64_t j = 0; j < n; j++) *(float *)(p + j * s) = buf[j];
    break;
  case NB_F64: NB_CPU_SLOOP(double, v_); break;
  case NB_F16: NB_CPU_SLOOP(uint16_t, nb_f32_to_f16((float)v_)); break;
  case NB_BF16: NB_CPU_SLOOP(uint16_t, nb_cpu_f32_bf16((float)v_)); break;
  case NB_F8E4M3: NB_CPU_SLOOP(uint8_t, nb_f32_to_f8e4m3((float)v_)); break;
  case NB_F8E5M2: NB_CPU_SLOOP(uint8_t, nb_f32_to_f8e5m2((float)v_)); break;
  default:
    for (int64_t j = 0; j < n; j++) nb_cpu_put_f64(p + j * s, dt, buf[j]);
  }
}

static inline void nb_cpu_store_f64(nb_dtype dt, int64_t n, const double *buf, char *p, int64_t s) {
  switch (dt) {
  case NB_F64: NB_CPU_SLOOP(double, v_); break;
  case NB_F32: NB_CPU_SLOOP(float, (float)v_); break;
  case NB_F16: NB_CPU_SLOOP(uint16_t, nb_f64_to_f16(v_)); break;
  case NB_BF16: NB_CPU_SLOOP(uint16_t, nb_cpu_f32_bf16(nb_f64_to_f32_odd(v_))); break;
  case NB_F8E4M3: NB_CPU_SLOOP(uint8_t, nb_f64_to_f8e4m3(v_)); break;
  case NB_F8E5M2: NB_CPU_SLOOP(uint8_t, nb_f64_to_f8e5m2(v_)); break;
  default:
    for (int64_t j = 0; j < n; j++) nb_cpu_put_f64(p + j * s, dt, buf[j]);
  }
}
#undef NB_CPU_SLOOP

/* Stores integers; to narrower integer dtypes they wrap. */
static inline void nb_cpu_store_i64(nb_dtype dt, int64_t n, const int64_t *buf, char *p, int64_t s) {
  if (dt == NB_I64) {
    for (int64_t j = 0; j < n; j++) *(int64_t *)(p + j * s) = buf[j];
    return;
  }
  for (int64_t j = 0; j < n; j++) nb_cpu_put_i64(p + j * s, dt, buf[j]);
}

#endif /* NB_CPU_ITER_H */
