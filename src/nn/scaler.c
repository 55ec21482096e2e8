/* Dynamic loss scaling with the rules of torch.amp.GradScaler.
 *
 * A step (nb_scaler_step) is GradScaler's unscale_, clip_grad_norm_, step
 * and update in one: the global norm of the scaled gradients is one
 * multi-tensor pass (squares summed in f64, so the sum is finite iff every
 * gradient element is: that is the non-finite check); when it is finite,
 * one more pass multiplies the gradients by 1/scale times the clip
 * coefficient and the optimizers step; when it is not, nothing is written
 * (parameters, optimizer state and step counts keep their bits) and the
 * scale backs off.
 *
 * The scale follows torch's _amp_update_scale_: on a step with a
 * non-finite gradient, scale *= backoff and the growth counter goes to 0;
 * otherwise the counter counts up, and when it reaches the interval,
 * scale *= growth (kept only if finite in f32) and the counter goes to 0.
 * The scale is an f32 value, as torch's scale tensor is.
 *
 * Where the decision is made: the norm pass already brings its sum to the
 * host (one value, one synchronisation per step, as nb_clip_grad_norm
 * does), so the skip is decided there. What remains for a step without a
 * host wait: the sum and a found-inf flag kept on the device, read by the
 * AdamW kernel, which would leave its tensors alone when it is set, and the
 * scale updated by a one-thread kernel. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/core.h"
#include "nn/grads.h"

struct nb_scaler {
  double scale, growth_factor, backoff_factor;
  int64_t growth_interval, growth_tracker;
};

/* The value torch's f32 scale tensor would hold. */
static double scaler_f32(double x) { return (double)(float)x; }

nb_scaler *nb_scaler_new(double init_scale, double growth_factor, double backoff_factor,
                         int64_t growth_interval) {
  if (!(init_scale > 0) || !isfinite(scaler_f32(init_scale)) || !(growth_factor >= 1) ||
      !isfinite(growth_factor) || !(backoff_factor > 0 && backoff_factor <= 1) ||
      growth_interval < 1) {
    nb_error_set(NB_ERR_VALUE, "nb_scaler_new: init_scale %g, growth_factor %g, backoff_factor %g, "
                 "growth_interval %lld (expected init_scale > 0 and finite in f32, growth_factor "
                 ">= 1 and finite, backoff_factor in (0, 1], growth_interval >= 1)", init_scale,
                 growth_factor, backoff_factor, (long long)growth_interval);
    return NULL;
  }
  nb_scaler *s = calloc(1, sizeof *s);
  if (!s) {
    nb_error_set(NB_ERR_OOM, "nb_scaler_new: out of memory");
    return NULL;
  }
  s->scale = scaler_f32(init_scale);
  s->growth_factor = growth_factor;
  s->backoff_factor = backoff_factor;
  s->growth_interval = growth_interval;
  return s;
}

void nb_scaler_free(nb_scaler *s) { free(s); }

double nb_scaler_get_scale(const nb_scaler *s) { return s ? s->scale : NAN; }

int64_t nb_scaler_growth_tracker(const nb_scaler *s) { return s ? s->growth_tracker : -1; }

nb_status nb_scaler_set_state(nb_scaler *s, double scale, int64_t growth_tracker) {
  if (!s) return nb_error_null("nb_scaler_set_state", "s");
  if (!(scale > 0) || !isfinite(scaler_f32(scale)) || growth_tracker < 0 ||
      growth_tracker >= s->growth_interval)
    return nb_error_set(NB_ERR_VALUE, "nb_scaler_set_state: scale %g, growth tracker %lld (expected "
                        "scale > 0 and finite in f32, tracker in [0, %lld))", scale,
                        (long long)growth_tracker, (long long)s->growth_interval);
  s->scale = scaler_f32(scale);
  s->growth_tracker = growth_tracker;
  return NB_OK;
}

nb_tensor *nb_scaler_scale(const nb_scaler *s, nb_tensor *loss) {
  if (!s) {
    nb_error_null("nb_scaler_scale", "s");
    return NULL;
  }
  return nb_mul_scalar(loss, s->scale);
}

/* torch's update rule after a step that found (or did not find) a
 * non-finite gradient. */
static void scaler_update(nb_scaler *s, int found_inf) {
  if (found_inf) {
    s->scale = scaler_f32(s->scale * s->backoff_factor);
    s->growth_tracker = 0;
    return;
  }
  if (++s->growth_tracker < s->growth_interval) return;
  double grown = scaler_f32(s->scale * s->growth_factor);
  if (isfinite(grown)) s->scale = grown;
  s->growth_tracker = 0;
}

nb_status nb_scaler_step(nb_scaler *s, nb_params *params, double max_norm, int n_optims,
                         nb_optim *const *optims, nb_scaler_result *res) {
  nb_scaler_result r = {0, NAN, NAN, NAN};
  if (res) *res = r;
  if (!s) return nb_error_null("nb_scaler_step", "s");
  if (!params) return nb_error_null("nb_scaler_step", "params");
  if (isnan(max_norm) || n_optims < 0 || (n_optims && !optims))
    return nb_error_set(NB_ERR_VALUE, "nb_scaler_step: max_norm %g, %d optimizers%s (expected "
                        "max_norm not NaN (< 0: no clipping), n_optims >= 0 with their array)",
                        max_norm, n_optims, n_optims && !optims ? " and no array" : "");
  for (int i = 0; i < n_optims; i++)
    if (!optims[i]) return nb_error_null("nb_scaler_step", "optims[i]");
  r.scale = s->scale;
  nb_status st = nb_nn_grad_unscale_clip(params, 1.0 / s->scale, max_norm, 1, &r.norm);
  if (st) return st;
  r.stepped = isfinite(r.norm);
  for (int i = 0; i < n_optims && r.stepped && !st; i++) st = nb_optim_step(optims[i]);
  if (st) return st;
  scaler_update(s, !r.stepped);
  r.new_scale = s->scale;
  if (res) *res = r;
  return NB_OK;
}
