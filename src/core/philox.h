/* Philox draws shared by the CPU kernels (the CUDA kernels mirror these
 * formulas exactly; tests compare the bits). */
#ifndef NB_PHILOX_H
#define NB_PHILOX_H
#include <math.h>
#include <stdint.h>

void nb_philox4x32_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
void nb_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4]);

/* Uniform in [0, 1) with 24 random bits. */
static inline float nb_philox_u01(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }
/* Uniform in (0, 1] (safe for log). */
static inline float nb_philox_u01_open0(uint32_t x) { return ((float)(x >> 8) + 1.0f) * (1.0f / 16777216.0f); }
/* Standard normal by Box-Muller from two words (f32 arithmetic, cos branch). */
static inline float nb_philox_normal(uint32_t x0, uint32_t x1) {
  float u1 = nb_philox_u01_open0(x0), u2 = nb_philox_u01(x1);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}
/* Element i of a draw uses block (seed, offset + i):
 *   uniform f32/f16/bf16: lo + (hi-lo) * u01(w0), then rounded to the dtype
 *   uniform f64: lo + (hi-lo) * u53(w0, w1)
 *   normal: mean + std * normal(w0, w1) in f32 (f64 for f64 via u53 words)
 *   randint: lo + ((w0 | (u64)w1 << 32) % (hi - lo))
 *   dropout keeps element i when u01(w0) >= p. */
static inline double nb_philox_u53(uint32_t x0, uint32_t x1) {
  uint64_t u = ((uint64_t)x0 << 32 | x1) >> 11;
  return (double)u * (1.0 / 9007199254740992.0);
}
#endif
