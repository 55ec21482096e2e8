/* In-place initialisers. Values are drawn with nb_rand/nb_randn on the
 * tensor's own device and dtype (so any backend draws the same Philox
 * stream) and written with nb_copy_ under a no-grad scope, which also works
 * for views and parameters that require grad. Fan conventions follow torch:
 * for a weight (out, in, k...) fan_in = in*prod(k), fan_out = out*prod(k). */
#include <math.h>

#include "core/core.h"

static nb_status init_check(const char *op, const nb_tensor *t, const nb_rng *rng) {
  if (!t) return nb_error_null(op, "t");
  if (!rng) return nb_error_null(op, "rng");
  if (!nb_dtype_is_float(nb_dtype_of(t)))
    return nb_error_set(NB_ERR_DTYPE, "%s: dtype %s (expected f64, f32, f16 or bf16)", op,
                        nb_dtype_name(nb_dtype_of(t)));
  return NB_OK;
}

/* Draws uniform (normal = 0) or normal (normal = 1) values into t. */
static nb_status init_draw(nb_tensor *t, nb_rng *rng, int normal, double a, double b) {
  nb_scope_begin();
  nb_no_grad_begin();
  nb_tensor *r = normal ? nb_randn(rng, nb_ndim(t), nb_shape(t), a, b, nb_dtype_of(t), nb_device_of(t))
                        : nb_rand(rng, nb_ndim(t), nb_shape(t), a, b, nb_dtype_of(t), nb_device_of(t));
  nb_status st = r ? nb_copy_(t, r) : nb_last_status();
  nb_no_grad_end();
  nb_scope_end();
  return st;
}

nb_status nb_init_normal_(nb_tensor *t, nb_rng *rng, double mean, double std) {
  nb_status st = init_check("nb_init_normal_", t, rng);
  if (st) return st;
  if (!isfinite(mean) || !isfinite(std) || std < 0)
    return nb_error_set(NB_ERR_VALUE, "nb_init_normal_: mean %g, std %g (expected finite, std >= 0)", mean, std);
  return init_draw(t, rng, 1, mean, std);
}

nb_status nb_init_uniform_(nb_tensor *t, nb_rng *rng, double lo, double hi) {
  nb_status st = init_check("nb_init_uniform_", t, rng);
  if (st) return st;
  if (!isfinite(lo) || !isfinite(hi) || lo > hi)
    return nb_error_set(NB_ERR_VALUE, "nb_init_uniform_: bounds [%g, %g) (expected finite lo <= hi)", lo, hi);
  return init_draw(t, rng, 0, lo, hi);
}

/* torch's _calculate_fan_in_and_fan_out: needs at least 2 dimensions. */
static nb_status init_fans(const char *op, const nb_tensor *t, double *fan_in, double *fan_out) {
  int nd = nb_ndim(t);
  if (nd < 2) {
    char b[200];
    return nb_error_set(NB_ERR_SHAPE, "%s: %s has fewer than 2 dimensions, so fan_in and fan_out are "
                        "undefined (expected a weight (out, in, ...))", op, nb_describe(t, b, sizeof b));
  }
  double field = 1;
  for (int i = 2; i < nd; i++) field *= (double)nb_size(t, i);
  *fan_in = (double)nb_size(t, 1) * field;
  *fan_out = (double)nb_size(t, 0) * field;
  if (*fan_in <= 0 || *fan_out <= 0) {
    char b[200];
    return nb_error_set(NB_ERR_SHAPE, "%s: %s has a zero fan_in or fan_out", op, nb_describe(t, b, sizeof b));
  }
  return NB_OK;
}

/* Shared body of the four fan-based initialisers. */
static nb_status init_fan_based(const char *op, nb_tensor *t, nb_rng *rng, double gain, int xavier,
                                int normal) {
  nb_status st = init_check(op, t, rng);
  if (st) return st;
  if (!isfinite(gain)) return nb_error_set(NB_ERR_VALUE, "%s: gain %g (expected a finite value)", op, gain);
  double fan_in, fan_out;
  if (nb_ndim(t) >= 2 && nb_numel(t) == 0) return NB_OK; /* nothing to draw */
  if ((st = init_fans(op, t, &fan_in, &fan_out))) return st;
  double g = fabs(gain);
  /* std of the target distribution; uniform(-b, b) has std b/sqrt(3). */
  double std = xavier ? g * sqrt(2.0 / (fan_in + fan_out)) : g / sqrt(fan_in);
  if (normal) return init_draw(t, rng, 1, 0.0, std);
  double bound = std * sqrt(3.0);
  return init_draw(t, rng, 0, -bound, bound);
}

nb_status nb_init_kaiming_uniform_(nb_tensor *t, nb_rng *rng, double gain) {
  return init_fan_based("nb_init_kaiming_uniform_", t, rng, gain, 0, 0);
}
nb_status nb_init_kaiming_normal_(nb_tensor *t, nb_rng *rng, double gain) {
  return init_fan_based("nb_init_kaiming_normal_", t, rng, gain, 0, 1);
}
nb_status nb_init_xavier_uniform_(nb_tensor *t, nb_rng *rng, double gain) {
  return init_fan_based("nb_init_xavier_uniform_", t, rng, gain, 1, 0);
}
nb_status nb_init_xavier_normal_(nb_tensor *t, nb_rng *rng, double gain) {
  return init_fan_based("nb_init_xavier_normal_", t, rng, gain, 1, 1);
}
