/* The loss scaler's decision and update (amp_update, backend_entries.h) on
 * the control block c (NB_AMP_*, backend.h): found-inf, clip coefficient
 * over the scale, norm, counters and the next scale (f32 values); returns
 * the next scale. One definition for the CPU backend (cpu_optim.c) and the
 * CUDA kernel (cuda_optim.cu, a host/device function under nvcc), so both
 * decide alike. */
#ifndef NB_AMP_RULE_H
#define NB_AMP_RULE_H

#include <math.h>

#include "backend/backend.h"

#ifdef __CUDACC__
#define NB_AMP_RULE_FN static __host__ __device__ __forceinline__
#else
#define NB_AMP_RULE_FN static inline
#endif

NB_AMP_RULE_FN double nb_amp_rule(double *c, const nb_amp_args *a) {
  const double scale = c[NB_AMP_SCALE], inv = 1.0 / scale, sumsq = c[NB_AMP_SUMSQ];
  const int found = !isfinite(sumsq);
  const double norm = sqrt(sumsq) * inv;
  double coef = a->max_norm >= 0 && isfinite(a->max_norm) ? a->max_norm / (norm + 1e-6) : 1.0;
  if (!(coef < 1.0) && !isnan(coef)) coef = 1.0;
  c[NB_AMP_FOUND] = found;
  c[NB_AMP_GSCALE] = coef * inv;
  c[NB_AMP_NORM] = norm;
  c[NB_AMP_LAST] = scale;
  double s = scale, tracker = c[NB_AMP_TRACKER];
  if (found) {
    s = (double)(float)(scale * a->backoff);
    tracker = 0;
    c[NB_AMP_SKIPS] += 1;
  } else {
    c[NB_AMP_GOOD] += 1;
    if (++tracker >= (double)a->interval) {
      double grown = (double)(float)(scale * a->growth);
      if (isfinite(grown)) s = grown;
      tracker = 0;
    }
  }
  c[NB_AMP_SCALE] = s;
  c[NB_AMP_TRACKER] = tracker;
  return s;
}

#undef NB_AMP_RULE_FN
#endif
