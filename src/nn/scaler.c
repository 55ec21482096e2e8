/* Dynamic loss scaling with the rules of torch.amp.GradScaler.
 *
 * A step (nb_scaler_step) is GradScaler's unscale_, clip_grad_norm_, step
 * and update in one, decided on the device, so that it never waits for the
 * host: the state (scale, growth counter, counts of good and skipped steps)
 * lives in a small f64 control block on the gradients' device (NB_AMP_* of
 * backend/backend.h, through ops/op_optim.h), and the loss is multiplied by
 * a 0-d f32 tensor there (nb_scaler_scale). A step is three stages, all
 * queued on the device: the gradients' sum of squares in one multi-tensor
 * pass (summed in f64, so it is finite iff every gradient element is: that
 * is the non-finite check) into the block; amp_update, one thread, which
 * derives the skip flag, the norm and the factor the gradients are to be
 * multiplied by (1/scale times the clip coefficient), and updates the scale
 * and counter; and the AdamW passes, which read the flag (a skipped step
 * leaves parameters, moments and the step count with their bits; only the
 * working copies are rewritten, from the unchanged parameters) and multiply
 * each gradient by the factor as they read it (the gradients themselves
 * keep the scale). The host reads the block only when asked: the getters
 * (nb_scaler_get_scale, nb_scaler_growth_tracker, nb_scaler_skipped), a
 * result (nb_scaler_result) and nb_optim_steps.
 *
 * Where the device path cannot be taken (an SGD optimizer, no optimizers,
 * gradients on several devices or on a backend without the entries), the
 * host's: the norm comes to the host (one synchronisation), the gradients
 * are multiplied in place when it is finite, and the optimizers step or
 * not. Both apply one rule (amp_rule.h; nb_op_amp_rule here), torch's
 * _amp_update_scale_: on a step with a non-finite gradient, scale *=
 * backoff and the counter goes to 0; otherwise the counter counts up,
 * and when it reaches the interval, scale *= growth (kept only if finite
 * in f32) and the counter goes to 0. The scale is an f32 value, as
 * torch's scale tensor is. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/core.h"
#include "nn/grads.h"
#include "ops/op_optim.h"

struct nb_scaler {
  nb_amp_args rule; /* growth, backoff, interval (max_norm: the step's) */
  /* The control block (NB_AMP_*): the host's copy. On the device (owned;
   * NULL until the first use there): the block f64[NB_AMP_N] and the scale
   * as a 0-d f32. When ctl is set, it holds the state and c is a copy of
   * its last read. */
  double c[NB_AMP_N];
  nb_tensor *ctl, *scale32;
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
  s->rule = (nb_amp_args){-1.0, growth_factor, backoff_factor, growth_interval};
  s->c[NB_AMP_SCALE] = scaler_f32(init_scale);
  return s;
}

/* The host's copy of the device state (one read: a synchronisation). */
static nb_status scaler_read(nb_scaler *s) {
  return s->ctl ? nb_to_host(s->ctl, s->c, sizeof s->c) : NB_OK;
}

/* The state back on the host only (the device copy dropped). */
static nb_status scaler_to_host(nb_scaler *s) {
  nb_status st = scaler_read(s);
  if (st) return st;
  nb_release(s->ctl);
  nb_release(s->scale32);
  s->ctl = s->scale32 = NULL;
  return NB_OK;
}

/* The state on dev (made there from the host's copy when absent). */
static nb_status scaler_to_device(nb_scaler *s, nb_device dev) {
  if (s->ctl && nb_same_device(nb_device_of(s->ctl), dev)) return NB_OK;
  nb_status st = scaler_to_host(s);
  if (st) return st;
  double c[NB_AMP_N] = {0}; /* the state; no step's results */
  c[NB_AMP_SCALE] = c[NB_AMP_LAST] = s->c[NB_AMP_SCALE];
  c[NB_AMP_TRACKER] = s->c[NB_AMP_TRACKER];
  c[NB_AMP_GSCALE] = 1;
  c[NB_AMP_GOOD] = s->c[NB_AMP_GOOD];
  c[NB_AMP_SKIPS] = s->c[NB_AMP_SKIPS];
  float f = (float)c[NB_AMP_SCALE];
  nb_scope_begin();
  nb_tensor *ctl = nb_to_device(nb_from_buffer(c, 1, (int64_t[]){NB_AMP_N}, NB_F64, NB_DEVICE_CPU), dev);
  nb_tensor *s32 = nb_to_device(nb_from_buffer(&f, 0, NULL, NB_F32, NB_DEVICE_CPU), dev);
  /* copies of their own: to_device returns its input on the same device */
  if (ctl) ctl = nb_clone(ctl);
  if (s32) s32 = nb_clone(s32);
  if (ctl && s32) {
    s->ctl = nb_keep(ctl);
    s->scale32 = nb_keep(s32);
  }
  nb_scope_end();
  return s->ctl ? NB_OK : nb_last_status();
}

void nb_scaler_free(nb_scaler *s) {
  if (!s) return;
  nb_release(s->ctl);
  nb_release(s->scale32);
  free(s);
}

/* The getters read the device's state: logically const. */
double nb_scaler_get_scale(const nb_scaler *s) {
  if (!s) return NAN;
  return scaler_read((nb_scaler *)s) ? NAN : s->c[NB_AMP_SCALE];
}

int64_t nb_scaler_growth_tracker(const nb_scaler *s) {
  if (!s) return -1;
  return scaler_read((nb_scaler *)s) ? -1 : (int64_t)s->c[NB_AMP_TRACKER];
}

int64_t nb_scaler_skipped(const nb_scaler *s) {
  if (!s) return -1;
  return scaler_read((nb_scaler *)s) ? -1 : (int64_t)s->c[NB_AMP_SKIPS];
}

nb_status nb_scaler_set_state(nb_scaler *s, double scale, int64_t growth_tracker) {
  if (!s) return nb_error_null("nb_scaler_set_state", "s");
  if (!(scale > 0) || !isfinite(scaler_f32(scale)) || growth_tracker < 0 ||
      growth_tracker >= s->rule.interval)
    return nb_error_set(NB_ERR_VALUE, "nb_scaler_set_state: scale %g, growth tracker %lld (expected "
                        "scale > 0 and finite in f32, tracker in [0, %lld))", scale,
                        (long long)growth_tracker, (long long)s->rule.interval);
  nb_status st = scaler_to_host(s); /* the device's copy is made again from these */
  if (st) return st;
  s->c[NB_AMP_SCALE] = scaler_f32(scale);
  s->c[NB_AMP_TRACKER] = (double)growth_tracker;
  return NB_OK;
}

nb_tensor *nb_scaler_scale(const nb_scaler *s, nb_tensor *loss) {
  if (!s) {
    nb_error_null("nb_scaler_scale", "s");
    return NULL;
  }
  if (!loss) {
    nb_error_null("nb_scaler_scale", "loss");
    return NULL;
  }
  /* the device's scale, so that no step waits for the host: the state is
   * logically const (moved, not changed) */
  if (scaler_to_device((nb_scaler *)s, nb_device_of(loss))) return NULL;
  nb_dtype dt = nb_dtype_is_float(nb_dtype_of(loss)) ? nb_dtype_of(loss) : NB_F32;
  return nb_mul(loss, nb_cast(s->scale32, dt));
}

/* The device's way: the sum of squares into the block, amp_update, the
 * optimizers under the block. *done = 0 when it does not apply. */
static nb_status scaler_step_device(nb_scaler *s, nb_params *params, double max_norm, int n_optims,
                                    nb_optim *const *optims, int *done) {
  *done = 0;
  nb_device dev = NB_DEVICE_CPU;
  int have = 0;
  for (int i = 0; i < nb_params_count(params) && !have; i++) {
    nb_tensor *g = nb_grad(nb_params_get(params, i));
    if (g) dev = nb_device_of(g), have = 1;
  }
  int ok = have && n_optims > 0;
  for (int i = 0; i < n_optims && ok; i++) ok = nb_nn_optim_device_ctl(optims[i]);
  if (!ok) return NB_OK;
  int caps = nb_op_optim_caps(dev);
  if (caps < 0 || !(caps & NB_OPTIM_DEVICE_CTL)) {
    nb_clear_error();
    return NB_OK;
  }
  nb_status st = scaler_to_device(s, dev);
  if (st) return st;
  nb_scope_begin();
  nb_tensor *sumsq = nb_select(s->ctl, 0, NB_AMP_SUMSQ);
  st = sumsq ? nb_nn_grad_sumsq_device(params, sumsq, done) : nb_last_status();
  if (!st && *done)
    st = nb_op_amp_update(s->ctl, s->scale32, max_norm >= 0 ? max_norm : -1.0, s->rule.growth,
                          s->rule.backoff, s->rule.interval);
  for (int i = 0; i < n_optims && !st && *done; i++) st = nb_nn_optim_step_ctl(optims[i], s->ctl);
  nb_scope_end();
  return st;
}

/* The host's way (see the top of the file). */
static nb_status scaler_step_host(nb_scaler *s, nb_params *params, double max_norm, int n_optims,
                                  nb_optim *const *optims, nb_scaler_result *r) {
  nb_status st = scaler_to_host(s);
  if (st) return st;
  r->scale = s->c[NB_AMP_SCALE];
  st = nb_nn_grad_unscale_clip(params, 1.0 / r->scale, max_norm, 1, &r->norm);
  if (st) return st;
  r->stepped = isfinite(r->norm);
  for (int i = 0; i < n_optims && r->stepped && !st; i++) st = nb_optim_step(optims[i]);
  if (st) return st;
  /* the device's rule (nb_op_amp_rule), told only whether a gradient was not
   * finite: the counters and the next scale */
  s->c[NB_AMP_SUMSQ] = r->stepped ? 0.0 : INFINITY;
  r->new_scale = nb_op_amp_rule(s->c, &s->rule);
  return NB_OK;
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
  int done = 0;
  nb_status st = scaler_step_device(s, params, max_norm, n_optims, optims, &done);
  if (st) return st;
  if (!done) {
    st = scaler_step_host(s, params, max_norm, n_optims, optims, &r);
    if (!st && res) *res = r;
    return st;
  }
  if (!res) return NB_OK; /* nothing read back: no wait */
  if ((st = scaler_read(s))) return st;
  res->stepped = s->c[NB_AMP_FOUND] == 0;
  res->norm = s->c[NB_AMP_NORM];
  res->scale = s->c[NB_AMP_LAST];
  res->new_scale = s->c[NB_AMP_SCALE];
  return NB_OK;
}
