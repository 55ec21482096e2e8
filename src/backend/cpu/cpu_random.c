/* CPU random kernels on the counter-based Philox4x32-10 generator.
 *
 * Element i of out, counted in row-major order of out's shape whatever its
 * strides, uses the block w[0..3] = nb_philox4x32(seed, offset + i). The
 * value of element i is a pure function of (seed, offset + i), so the
 * result does not depend on threads, strides or the backend. Exact formulas
 * (the CUDA backend computes the same ones; fma is the fused multiply-add,
 * written out so that no compiler contraction can change a bit):
 *
 *   uniform, f32/f16/bf16:  u = nb_philox_u01(w0)                (f32, 24 bits)
 *                           v = fma(hi - lo, (double)u, lo)      (f64)
 *                           then v rounded to f32, and from that f32 to f16/bf16
 *                           (f32/f64 stay below hi; rounding to f16/bf16 can
 *                           reach hi itself, e.g. 1 - 2^-24 -> 1.0 in bf16)
 *   uniform, f64:           u = nb_philox_u53(w0, w1)
 *                           v = fma(hi - lo, u, lo)              (f64)
 *   normal, f32/f16/bf16:   z = nb_philox_normal(w0, w1)         (f32 Box-Muller)
 *                           v = fmaf((float)std, z, (float)mean) (f32)
 *                           then rounded to f16/bf16
 *   normal, f64:            u1 = 1 - nb_philox_u53(w0, w1)       (in (0, 1], exact)
 *                           u2 = nb_philox_u53(w2, w3)
 *                           z = sqrt(-2 log(u1)) * cos(2 pi u2)  (f64; 2 pi as
 *                                                                 the nearest double)
 *                           v = fma(std, z, mean)
 *   randint:                r = (w0 | (u64)w1 << 32) % (u64)(hi - lo)
 *                           v = lo + r (in u64, so no signed overflow), stored
 *                           to the integer dtype.
 *
 * The transcendental functions (logf, cosf, log, cos) are the platform's;
 * a backend whose functions differ in the last place gives normals that
 * differ in the last place too. */
#include <math.h>
#include <stdint.h>

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"
#include "core/philox.h"

#define TILE NB_CPU_TILE
#define NB_TWO_PI 6.283185307179586476925286766559

typedef enum { RK_UNIFORM, RK_NORMAL, RK_INT } rand_kind;

typedef struct {
  rand_kind kind;
  nb_dtype dt;
  uint64_t seed, offset;
  double a, b;      /* uniform: lo, hi; normal: mean, std */
  int64_t lo, hi;   /* randint */
} rand_ctx;

static double normal_f64(const uint32_t w[4]) {
  double u1 = 1.0 - nb_philox_u53(w[0], w[1]), u2 = nb_philox_u53(w[2], w[3]);
  return sqrt(-2.0 * log(u1)) * cos(NB_TWO_PI * u2);
}

/* Element values as f64 (exact for every f32 result, so storing them to the
 * dtype rounds exactly once more, from f32 to f16/bf16, as documented). */
static double draw_float(const rand_ctx *c, uint64_t i) {
  uint32_t w[4];
  nb_philox4x32(c->seed, c->offset + i, w);
  if (c->kind == RK_UNIFORM) {
    double u = c->dt == NB_F64 ? nb_philox_u53(w[0], w[1]) : (double)nb_philox_u01(w[0]);
    double v = fma(c->b - c->a, u, c->a);
    return c->dt == NB_F64 ? v : (double)(float)v;
  }
  if (c->dt == NB_F64) return fma(c->b, normal_f64(w), c->a);
  return fmaf((float)c->b, nb_philox_normal(w[0], w[1]), (float)c->a);
}

static int64_t draw_int(const rand_ctx *c, uint64_t i) {
  uint32_t w[4];
  uint64_t span = (uint64_t)c->hi - (uint64_t)c->lo;
  nb_philox4x32(c->seed, c->offset + i, w);
  uint64_t r = ((uint64_t)w[0] | (uint64_t)w[1] << 32) % span;
  return (int64_t)((uint64_t)c->lo + r);
}

static void rand_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  const rand_ctx *c = vc;
  for (int64_t t = 0; t < n; t += TILE) {
    int64_t m = n - t < TILE ? n - t : TILE;
    if (c->kind == RK_INT) {
      int64_t buf[TILE];
      for (int64_t j = 0; j < m; j++) buf[j] = draw_int(c, (uint64_t)(lin + t + j));
      nb_cpu_store_i64(c->dt, m, buf, p[0] + t * s[0], s[0]);
    } else {
      double buf[TILE];
      for (int64_t j = 0; j < m; j++) buf[j] = draw_float(c, (uint64_t)(lin + t + j));
      nb_cpu_store_f64(c->dt, m, buf, p[0] + t * s[0], s[0]);
    }
  }
}

static nb_status rand_run(const nb_kview *out, const rand_ctx *c) {
  nb_cpu_iter it;
  nb_cpu_iter_views(&it, 1, (const nb_kview *const[]){out});
  /* drawing costs ~10x a load: parallel from a smaller size */
  if (it.numel) nb_cpu_iter_run_par(&it, rand_strip, (void *)c, it.numel >= 4096);
  return NB_OK;
}

nb_status nb_cpu_rand_uniform(const nb_kview *out, uint64_t seed, uint64_t offset, double lo,
                              double hi) {
  if (!nb_dtype_is_float(out->dtype))
    return nb_error_set(NB_ERR_DTYPE, "cpu rand_uniform: dtype %s (expected a float dtype)",
                        nb_dtype_name(out->dtype));
  rand_ctx c = {RK_UNIFORM, out->dtype, seed, offset, lo, hi, 0, 0};
  return rand_run(out, &c);
}

nb_status nb_cpu_rand_normal(const nb_kview *out, uint64_t seed, uint64_t offset, double mean,
                             double std) {
  if (!nb_dtype_is_float(out->dtype))
    return nb_error_set(NB_ERR_DTYPE, "cpu rand_normal: dtype %s (expected a float dtype)",
                        nb_dtype_name(out->dtype));
  rand_ctx c = {RK_NORMAL, out->dtype, seed, offset, mean, std, 0, 0};
  return rand_run(out, &c);
}

nb_status nb_cpu_randint(const nb_kview *out, uint64_t seed, uint64_t offset, int64_t lo,
                         int64_t hi) {
  if (lo >= hi)
    return nb_error_set(NB_ERR_VALUE, "cpu randint: empty range [%lld, %lld)", (long long)lo,
                        (long long)hi);
  rand_ctx c = {RK_INT, out->dtype, seed, offset, 0, 0, lo, hi};
  return rand_run(out, &c);
}
