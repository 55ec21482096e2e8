/* Correctly rounded float64 -> f16/bf16 (round to nearest, ties to even).
 * Converting through f32 with two ordinary roundings is not: a double just
 * above a tie of the narrow type can round to the tie in f32, which then
 * rounds to even, the wrong way (1 + 2^-11 + 2^-40 would become f16 1.0).
 * Rounding the first step to odd instead (truncate, then set the last bit
 * when inexact) keeps that information, and since f32 has more than two bits
 * beyond f16's 11 and bf16's 8, the second rounding is then exact. */
#ifndef NB_CORE_HALF_H
#define NB_CORE_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "nabla.h"

static inline float nb_f64_to_f32_odd(double v) {
  float f = (float)v;
  if ((double)f == v || v != v) return f; /* exact, or NaN */
  if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f); /* truncate toward zero */
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  b |= 1u;
  memcpy(&f, &b, sizeof f);
  return f;
}

static inline uint16_t nb_f64_to_f16(double v) { return nb_f32_to_f16(nb_f64_to_f32_odd(v)); }
static inline uint16_t nb_f64_to_bf16(double v) { return nb_f32_to_bf16(nb_f64_to_f32_odd(v)); }
/* fp8 the same way (f32 has 20 bits beyond e4m3's 4 and e5m2's 3). An f64
 * beyond f32's range rounds to odd onto FLT_MAX, which overflows fp8 as the
 * value itself does. */
static inline uint8_t nb_f64_to_f8e4m3(double v) { return nb_f32_to_f8e4m3(nb_f64_to_f32_odd(v)); }
static inline uint8_t nb_f64_to_f8e5m2(double v) { return nb_f32_to_f8e5m2(nb_f64_to_f32_odd(v)); }

#endif
