/* Vectorisable f32 transcendental functions for the CPU kernels.
 *
 * Each nb_vm_*f function takes and returns a float and is written so that
 * GCC vectorises a loop calling it (-O3, with or without -march=native;
 * checked with -fopt-info-vec): no branches, calls or tables, only
 * arithmetic, selects (nb_vm_sel) and bit operations on the IEEE
 * representation. Inside, every function works in double: the argument is
 * reduced and a polynomial evaluated with a relative error of a few 1e-16,
 * and the float result is the double rounded once. The error is therefore below 1 ulp of the exact
 * value (faithful rounding; almost all results are the correctly rounded
 * float), over the whole float range, denormals included, with IEEE/PyTorch
 * values at the special points (exp(-inf) = 0, log(0) = -inf, log(-1) = NaN,
 * log1p(-1) = -inf, tanh(+-inf) = +-1, NaN in, NaN out). tests/test_vmath.c
 * checks the bound on a dense sweep of every function against long double
 * libm, and that each element's bits do not depend on where it lies in an
 * array (vector body or scalar remainder).
 *
 * The double helpers (nb_vm_exp_d, ...) are accurate to a few 1e-16 but
 * are made for the float functions: nb_vm_expm1_d stops at 709, and none
 * is checked to double's ulps. f64 kernels keep libm.
 *
 * Cost, one thread of a Xeon (AVX-512), ns per element: exp 0.8 (glibc's
 * expf 1.7), tanh 1.2 (8.0), gelu_tanh 1.1 (9.8); the other rows in
 * bench/results/cpu-2026-11-24-vmath.md. */
#ifndef NB_CPU_VMATH_H
#define NB_CPU_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* fma only where the target has the instruction (a libm call otherwise);
 * the reductions below are exact either way (split constants). */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__aarch64__)
#define NB_VM_FMA(a, b, c) fma((a), (b), (c))
#else
#define NB_VM_FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline uint64_t nb_vm_bits(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline double nb_vm_double(uint64_t u) {
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* c ? a : b without a branch: written as ?: several selects on one value
 * become control flow that GCC's vectoriser then refuses */
static inline double nb_vm_sel(int c, double a, double b) {
  uint64_t m = (uint64_t)0 - (uint64_t)c;
  return nb_vm_double((nb_vm_bits(a) & m) | (nb_vm_bits(b) & ~m));
}

#define NB_VM_LN2_HI 6.93147180369123816490e-01 /* 32 bits: k * HI exact */
#define NB_VM_LN2_LO 1.90821492927058770002e-10
#define NB_VM_LOG2E 1.44269504088896338700
#define NB_VM_SHIFT 0x1.8p52 /* x + SHIFT rounds x to an integer in the low bits */

/* x = n ln2 + r, |r| <= ln2/2 (x clamped to [-1100, 1100]; NaN kept).
 * Returns expm1(r) (Taylor to degree 12: relative error < 2e-16, so that
 * derivatives near their zeros, s + x s (1 - s), keep their ulps) and sets
 * 2^n = *s1 * *s2 (two factors: n may be outside the exponent range; their
 * product overflows to inf or underflows to 0 as e^x does). */
static inline double nb_vm_expm1_reduced(double x, double *s1, double *s2) {
  x = nb_vm_sel(x < -1100.0, -1100.0, x);
  x = nb_vm_sel(x > 1100.0, 1100.0, x);
  double k = NB_VM_FMA(x, NB_VM_LOG2E, NB_VM_SHIFT) - NB_VM_SHIFT;
  double r = NB_VM_FMA(k, -NB_VM_LN2_HI, x);
  r = NB_VM_FMA(k, -NB_VM_LN2_LO, r);
  /* k = k1 + k2, |k1|, |k2| <= 794; bits(k + SHIFT) = bits(SHIFT) + k, so
   * 2^k from the biased exponent k + 1023 */
  double k1 = (0.5 * k + NB_VM_SHIFT) - NB_VM_SHIFT, k2 = k - k1;
  *s1 = nb_vm_double((nb_vm_bits(k1 + NB_VM_SHIFT) - nb_vm_bits(NB_VM_SHIFT) + 1023u) << 52);
  *s2 = nb_vm_double((nb_vm_bits(k2 + NB_VM_SHIFT) - nb_vm_bits(NB_VM_SHIFT) + 1023u) << 52);
  double p = 1.0 / 479001600;
  p = NB_VM_FMA(p, r, 1.0 / 39916800);
  p = NB_VM_FMA(p, r, 1.0 / 3628800);
  p = NB_VM_FMA(p, r, 1.0 / 362880);
  p = NB_VM_FMA(p, r, 1.0 / 40320);
  p = NB_VM_FMA(p, r, 1.0 / 5040);
  p = NB_VM_FMA(p, r, 1.0 / 720);
  p = NB_VM_FMA(p, r, 1.0 / 120);
  p = NB_VM_FMA(p, r, 1.0 / 24);
  p = NB_VM_FMA(p, r, 1.0 / 6);
  p = NB_VM_FMA(p, r, 0.5);
  return NB_VM_FMA(p * r, r, r);
}

/* e^x over the whole double range (inf above 709.8, 0 below -745), NaN kept */
static inline double nb_vm_exp_d(double x) {
  double s1, s2, q = nb_vm_expm1_reduced(x, &s1, &s2);
  return NB_VM_FMA(s1, q, s1) * s2;
}

/* e^x - 1 = 2^n q + (2^n - 1), relative error near 0 as small as elsewhere;
 * x clamped to 709 (2^n finite), which float results do not see */
static inline double nb_vm_expm1_d(double x) {
  double s1, s2, q = nb_vm_expm1_reduced(nb_vm_sel(x > 709.0, 709.0, x), &s1, &s2);
  double s = s1 * s2;
  return NB_VM_FMA(s, q, s - 1.0);
}

/* log x for x > 0 finite normal: x = m 2^k, m in [sqrt(1/2), sqrt(2)),
 * log m = 2 atanh(f / (2 + f)), f = m - 1, series to z^8 (z = s^2 <= 0.0295:
 * relative error < 4e-14). 0, negatives, inf and NaN by select. */
static inline double nb_vm_log_d(double x) {
  /* bits(x) + (bits(1) - bits(sqrt(1/2))): the exponent field is k + 1023 */
  uint64_t u = nb_vm_bits(x) + (0x3ff0000000000000u - 0x3fe6a09e667f3bcdu);
  uint64_t kb = u >> 52;
  double m = nb_vm_double(nb_vm_bits(x) - ((kb - 1023u) << 52));
  double k = nb_vm_double(0x4330000000000000u | kb) - (0x1p52 + 1023.0);
  double f = m - 1.0, s = f / (2.0 + f), z = s * s;
  double p = 1.0 / 17;
  p = NB_VM_FMA(p, z, 1.0 / 15);
  p = NB_VM_FMA(p, z, 1.0 / 13);
  p = NB_VM_FMA(p, z, 1.0 / 11);
  p = NB_VM_FMA(p, z, 1.0 / 9);
  p = NB_VM_FMA(p, z, 1.0 / 7);
  p = NB_VM_FMA(p, z, 1.0 / 5);
  p = NB_VM_FMA(p, z, 1.0 / 3);
  double lm = NB_VM_FMA(2.0 * s * z, p, 2.0 * s);
  double y = NB_VM_FMA(k, NB_VM_LN2_HI, NB_VM_FMA(k, NB_VM_LN2_LO, lm));
  y = nb_vm_sel(x == (double)INFINITY, x, y);
  y = nb_vm_sel(x == 0.0, -(double)INFINITY, y);
  return nb_vm_sel((x < 0.0) | (x != x), (double)NAN, y);
}

/* log(1 + x): u = 1 + x rounded, c its rounding error, log u + c / u */
static inline double nb_vm_log1p_d(double x) {
  double u = 1.0 + x;
  double c = x - (u - 1.0);
  double y = nb_vm_log_d(u) + c / u;
  /* u = 0 (x = -1) or inf: c / u is NaN */
  return nb_vm_sel((u == 0.0) | (u == (double)INFINITY), nb_vm_log_d(u), y);
}

/* ---- the float functions ------------------------------------------------ */
static inline float nb_vm_expf(float x) { return (float)nb_vm_exp_d(x); }
static inline float nb_vm_expm1f(float x) { return (float)nb_vm_expm1_d(x); }
static inline float nb_vm_logf(float x) { return (float)nb_vm_log_d(x); }
static inline float nb_vm_log1pf(float x) { return (float)nb_vm_log1p_d(x); }

/* tanh |x| = -t / (t + 2), t = expm1(-2|x|) in (-1, 0]: no cancellation */
static inline float nb_vm_tanhf(float x) {
  double t = nb_vm_expm1_d(-2.0 * fabs((double)x));
  return copysignf((float)(-t / (t + 2.0)), x);
}

/* s = 1 / (1 + e^-x) and sc = 1 - s, both without cancellation or
 * overflow: a = e^-|x| <= 1 */
static inline void nb_vm_sigmoid2_d(double x, double *s, double *sc) {
  double a = nb_vm_exp_d(-fabs(x)), big = 1.0 / (1.0 + a), small = a * big;
  *s = nb_vm_sel(x >= 0.0, big, small);
  *sc = nb_vm_sel(x >= 0.0, small, big);
}

/* sigmoid(-inf) = 0, sigmoid(inf) = 1 */
static inline float nb_vm_sigmoidf(float x) {
  return (float)(1.0 / (1.0 + nb_vm_exp_d(-(double)x)));
}

/* x sigmoid(x) = x / (1 + e^-x); silu(-inf) = -inf / inf = NaN, as PyTorch */
static inline float nb_vm_siluf(float x) {
  return (float)((double)x / (1.0 + nb_vm_exp_d(-(double)x)));
}

/* d/dx x sigmoid(x) = s + x s (1 - s) */
static inline float nb_vm_silu_df(float x) {
  double xd = x, s, sc;
  nb_vm_sigmoid2_d(xd, &s, &sc);
  return (float)NB_VM_FMA(xd * s, sc, s);
}

/* log(1 + e^x) = log1p(e^-|x|) + max(x, 0), exact at every x (PyTorch's
 * threshold of 20 gives the same floats) */
static inline float nb_vm_softplusf(float x) {
  double xd = x, e = nb_vm_exp_d(-fabs(xd));
  return (float)(nb_vm_log1p_d(e) + nb_vm_sel(xd > 0.0, xd, 0.0));
}

/* GELU, tanh form: 0.5 x (1 + tanh u) = x sigmoid(2u), u = k (x + c x^3),
 * accurate for negative x too, where 1 + tanh u cancels */
#define NB_VM_GELU_K 0.79788456080286535588 /* sqrt(2 / pi) */
#define NB_VM_GELU_C 0.044715

static inline float nb_vm_gelu_tanhf(float x) {
  double xd = x, u2 = 2.0 * NB_VM_GELU_K * xd * NB_VM_FMA(NB_VM_GELU_C * xd, xd, 1.0);
  return (float)(xd / (1.0 + nb_vm_exp_d(-u2)));
}

/* d/dx x s(2u) = s + x (2u)' s (1 - s) */
static inline float nb_vm_gelu_tanh_df(float x) {
  double xd = x, x2 = xd * xd, s, sc;
  double u2 = 2.0 * NB_VM_GELU_K * xd * NB_VM_FMA(NB_VM_GELU_C, x2, 1.0);
  double du2 = 2.0 * NB_VM_GELU_K * NB_VM_FMA(3.0 * NB_VM_GELU_C, x2, 1.0);
  nb_vm_sigmoid2_d(u2, &s, &sc);
  return (float)NB_VM_FMA(xd * du2 * s, sc, s);
}
#endif
