/* Master weights and device-side loss scaling, on any device (test_scaler
 * runs them on the CPU, test_cuda's section "amp" on the GPU):
 * - the working copy: after an AdamW step under autocast, each cast
 *   parameter's bf16/f16 copy equals its f32 master rounded, bit for bit;
 *   the next step under autocast launches no cast of it (the profiler's
 *   copy kernels, forward phase); a parameter written outside the optimizer
 *   (nb_copy_) is cast again; the gradient still reaches the f32 leaf
 *   through the recorded cast and accumulates there in f32 over two
 *   micro-batches, exactly;
 * - the device path of nb_scaler_step: an injected inf leaves parameters,
 *   m and v bitwise unchanged (the copy still the master rounded), halves
 *   the scale and resets the counter; the scale grows back after the
 *   interval; a good step equals the host's way (gradients unscaled and
 *   clipped in place, then nb_optim_step) bit for bit, and the optimizer's
 *   step count skips the skipped step. Include after testutil.h and
 *   core/core.h; the includer defines AMP_DEV (an nb_device). */
#ifndef NB_TESTS_AMP_CASES_H
#define NB_TESTS_AMP_CASES_H

#include <math.h>
#include <string.h>

#include "nn/grads.h"

#define AMP_IN 64
#define AMP_OUT 48
#define AMP_ROWS 8

/* x (AMP_ROWS, AMP_IN) of small multiples of 1/4 (exact in bf16 and f16),
 * in dtype dt on dev. */
static nb_tensor *amp_input(nb_device dev, nb_dtype dt, int salt) {
  static double x[AMP_ROWS * AMP_IN];
  for (int i = 0; i < AMP_ROWS * AMP_IN; i++) x[i] = ((i * 7 + salt * 3) % 9 - 4) * 0.25;
  nb_tensor *h = nb_from_buffer(x, 2, (int64_t[]){AMP_ROWS, AMP_IN}, NB_F64, NB_DEVICE_CPU);
  return nb_to_device(nb_cast(h, dt), dev);
}

/* A parameter (AMP_IN, AMP_OUT) of f32 values from seed on dev. */
static nb_tensor *amp_param(nb_params *ps, const char *name, nb_device dev, uint64_t seed) {
  nb_scope_begin();
  nb_rng r = nb_rng_new(seed);
  nb_tensor *w = nb_params_add(ps, name, nb_randn(&r, 2, (int64_t[]){AMP_IN, AMP_OUT}, 0, 0.5,
                                                  NB_F32, dev));
  nb_scope_end();
  return w;
}

/* Forward and backward of sum(x @ w) (times scale when s) under autocast low. */
static void amp_backward(nb_tensor *w, nb_dtype low, int salt, const nb_scaler *s, double badv) {
  nb_scope_begin();
  nb_tensor *x = amp_input(nb_device_of(w), low, salt);
  NBT_CHECK(nb_autocast_begin(low) == NB_OK, "autocast: %s", nb_last_error());
  nb_tensor *loss = nb_sum(nb_matmul(x, w), 0, NULL, 0);
  nb_autocast_end();
  if (!isnan(badv)) loss = nb_mul_scalar(loss, badv); /* inf: every gradient inf */
  if (s) loss = nb_scaler_scale(s, loss);
  NBT_CHECK(loss && nb_backward(loss, NULL) == NB_OK, "backward: %s", nb_last_error());
  nb_scope_end();
}

static void amp_host(const nb_tensor *t, void *dst, size_t bytes) {
  NBT_CHECK(nb_to_host(t, dst, bytes) == NB_OK, "to host: %s", nb_last_error());
}

/* Whether w's working copy is its f32 master rounded to low, bit for bit. */
static int amp_copy_exact(const nb_tensor *w, nb_dtype low) {
  enum { N = AMP_IN * AMP_OUT };
  static float m[N];
  static uint16_t c[N];
  if (!w->work || nb_dtype_of(w->work) != low || w->work_stamp != w->storage->stamp) return 0;
  amp_host(w, m, sizeof m);
  amp_host(w->work, c, sizeof c);
  int bad = 0;
  for (int i = 0; i < N; i++) bad += c[i] != (low == NB_BF16 ? nb_f32_to_bf16(m[i]) : nb_f32_to_f16(m[i]));
  return !bad;
}

/* Copy kernels in the forward phase of one profiled step (forward, backward,
 * AdamW). */
static int64_t amp_profiled_copies(nb_tensor *w, nb_params *ps, nb_optim *o, nb_dtype low) {
  int64_t calls = -1;
  double ms;
  nb_profile_reset();
  if (nb_profile_start()) return -1;
  nb_params_zero_grad(ps);
  amp_backward(w, low, 0, NULL, NAN);
  nb_optim_step(o);
  nb_profile_stop();
  nb_profile_stat("copy", 0, &calls, &ms);
  nb_profile_reset();
  return calls;
}

static void amp_test_master(nb_device dev, nb_dtype low) {
  const char *ln = nb_dtype_name(low);
  nb_params *ps = nb_params_new();
  nb_tensor *w = amp_param(ps, "w", dev, 7);
  nb_optim *o = nb_adamw_new(ps, 1e-2, 0.9, 0.95, 1e-8, 0.1);
  /* two micro-batches: the gradient of sum(x @ w) is x's column sums (exact),
   * accumulated in f32 in the leaf */
  amp_backward(w, low, 0, NULL, NAN);
  amp_backward(w, low, 1, NULL, NAN);
  static float g[AMP_IN * AMP_OUT];
  int bad = 0;
  amp_host(nb_grad(w), g, sizeof g);
  for (int k = 0; k < AMP_IN; k++) {
    double want = 0;
    for (int sa = 0; sa < 2; sa++)
      for (int r = 0; r < AMP_ROWS; r++) want += ((((r * AMP_IN + k) * 7 + sa * 3) % 9) - 4) * 0.25;
    for (int j = 0; j < AMP_OUT; j++) bad += g[k * AMP_OUT + j] != (float)want;
  }
  NBT_CHECK(nb_dtype_of(nb_grad(w)) == NB_F32 && bad == 0, "%s: f32 gradient of w over two "
            "micro-batches through the cast (%d elements off)", ln, bad);
  NBT_CHECK(nb_optim_step(o) == NB_OK, "step: %s", nb_last_error());
  NBT_CHECK(amp_copy_exact(w, low), "%s: after a step, the working copy is the f32 master rounded, "
            "bit for bit", ln);
  int64_t with_copy = amp_profiled_copies(w, ps, o, low);
  NBT_CHECK(amp_copy_exact(w, low), "%s: again after the second step", ln);
  /* written outside the optimizer: the copy no longer stands for w */
  nb_scope_begin();
  nb_no_grad_begin();
  NBT_CHECK(nb_copy_(w, nb_mul_scalar(w, 0.5)) == NB_OK, "copy_: %s", nb_last_error());
  nb_no_grad_end();
  nb_scope_end();
  NBT_CHECK(w->work_stamp != w->storage->stamp, "%s: nb_copy_ into w invalidates its copy", ln);
  int64_t recast = amp_profiled_copies(w, ps, o, low);
  NBT_CHECK(with_copy >= 0 && recast == with_copy + 1, "%s: a step with the copy launches no cast "
            "of w (%lld copy kernels forward), one written outside the optimizer casts it "
            "again (%lld)", ln, (long long)with_copy, (long long)recast);
  NBT_CHECK(amp_copy_exact(w, low), "%s: and the step after that writes the copy again", ln);
  nb_optim_free(o);
  nb_params_free(ps);
}

/* The device path against the host's: a good step bit for bit, an inf step
 * changing nothing, the scale's rules. */
static void amp_test_scaler(nb_device dev, nb_dtype low) {
  const char *ln = nb_dtype_name(low);
  nb_params *pa = nb_params_new(), *pb = nb_params_new();
  nb_tensor *wa = amp_param(pa, "w", dev, 11), *wb = amp_param(pb, "w", dev, 11);
  nb_optim *oa = nb_adamw_new(pa, 1e-2, 0.9, 0.95, 1e-8, 0.1);
  nb_optim *ob = nb_adamw_new(pb, 1e-2, 0.9, 0.95, 1e-8, 0.1);
  nb_scaler *sa = nb_scaler_new(1024.0, 2.0, 0.5, 3), *sb = nb_scaler_new(1024.0, 2.0, 0.5, 3);
  enum { N = AMP_IN * AMP_OUT };
  static float before[3][N], after[3][N];
  const char *pattern = "ggigggg";
  int64_t good = 0;
  for (int k = 0; pattern[k]; k++) {
    int inf = pattern[k] == 'i';
    nb_params_zero_grad(pa);
    nb_params_zero_grad(pb);
    amp_backward(wa, low, k, sa, inf ? INFINITY : NAN);
    amp_backward(wb, low, k, sb, inf ? INFINITY : NAN);
    for (int t = 0; t < 3 && k; t++)
      amp_host(t ? nb_optim_state_get(oa, t - 1, NULL) : wa, before[t], sizeof before[t]);
    double scale = nb_scaler_get_scale(sa);
    NBT_CHECK(nb_scaler_step(sa, pa, 0.5, 1, &oa, NULL) == NB_OK, "device step: %s", nb_last_error());
    /* the host's way: unscale and clip in place, then the plain step */
    double norm;
    NBT_CHECK(nb_nn_grad_unscale_clip(pb, 1.0 / nb_scaler_get_scale(sb), 0.5, 1, &norm) == NB_OK,
              "host unscale: %s", nb_last_error());
    if (isfinite(norm)) nb_optim_step(ob);
    nb_scaler_set_state(sb, nb_scaler_get_scale(sa), nb_scaler_growth_tracker(sa));
    good += !inf;
    for (int t = 0; t < 3; t++)
      amp_host(t ? nb_optim_state_get(oa, t - 1, NULL) : wa, after[t], sizeof after[t]);
    static float other[N];
    int same = 1;
    for (int t = 0; t < 3; t++) {
      amp_host(t ? nb_optim_state_get(ob, t - 1, NULL) : wb, other, sizeof other);
      same &= !memcmp(after[t], other, sizeof other);
    }
    NBT_CHECK(same, "%s step %d (%s): parameter, m and v equal the host's way bit for bit", ln, k,
              inf ? "inf" : "good");
    if (inf && k) {
      int unchanged = 1;
      for (int t = 0; t < 3; t++) unchanged &= !memcmp(after[t], before[t], sizeof after[t]);
      NBT_CHECK(unchanged && nb_scaler_get_scale(sa) == scale / 2 && nb_scaler_growth_tracker(sa) == 0,
                "%s: an inf leaves w, m, v bitwise unchanged (%d), halves the scale (%g -> %g) and "
                "resets the counter (%lld)", ln, unchanged, scale, nb_scaler_get_scale(sa),
                (long long)nb_scaler_growth_tracker(sa));
    }
    NBT_CHECK(amp_copy_exact(wa, low), "%s step %d: the copy is the master rounded", ln, k);
    NBT_CHECK(nb_optim_steps(oa) == good, "%s step %d: optimizer steps %lld (expected %lld)", ln, k,
              (long long)nb_optim_steps(oa), (long long)good);
  }
  /* 1024, inf at step 2 (512, counter 0), 3 good (1024), 1 more good */
  NBT_CHECK(nb_scaler_get_scale(sa) == 1024.0 && nb_scaler_growth_tracker(sa) == 1 &&
            nb_scaler_skipped(sa) == 1, "%s: the scale grew back after the interval: %g (expected "
            "1024), counter %lld (1), skipped %lld (1)", ln, nb_scaler_get_scale(sa),
            (long long)nb_scaler_growth_tracker(sa), (long long)nb_scaler_skipped(sa));
  nb_scaler_free(sa), nb_scaler_free(sb);
  nb_optim_free(oa), nb_optim_free(ob);
  nb_params_free(pa), nb_params_free(pb);
}

static void amp_cases(nb_device dev) {
  /* the profiler's counts are of this thread's kernels: one profile at a time */
  amp_test_master(dev, NB_BF16);
  amp_test_master(dev, NB_F16);
  amp_test_scaler(dev, NB_BF16);
  amp_test_scaler(dev, NB_F16);
}

#endif
