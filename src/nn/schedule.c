/* Learning-rate schedules: pure functions of a 0-based step.
 *
 * Warm-up is linear and reaches lr at step warmup-1: step s < warmup uses
 * lr*(s+1)/warmup, so the very first step already moves the weights (a
 * schedule that starts at exactly 0 wastes it). After warm-up the cosine
 * schedule decays from lr to lr_min over steps [warmup, total], and stays
 * at lr_min from total on. */
#include <math.h>

#include "nabla.h"

double nb_lr_constant(int64_t step, double lr) {
  (void)step;
  return lr;
}

double nb_lr_warmup_linear(int64_t step, int64_t warmup, double lr) {
  if (step < 0) step = 0;
  if (warmup <= 0 || step >= warmup) return lr;
  return lr * (double)(step + 1) / (double)warmup;
}

double nb_lr_cosine(int64_t step, int64_t warmup, int64_t total, double lr, double lr_min) {
  if (step < 0) step = 0;
  if (warmup > 0 && step < warmup) return nb_lr_warmup_linear(step, warmup, lr);
  if (warmup < 0) warmup = 0;
  if (step >= total) return lr_min;
  /* here warmup <= step < total, so the span is positive */
  double ratio = (double)(step - warmup) / (double)(total - warmup);
  const double pi = 3.14159265358979323846;
  return lr_min + 0.5 * (1.0 + cos(pi * ratio)) * (lr - lr_min);
}
