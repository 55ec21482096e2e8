/* nn helpers: parameter lists, optimizers against hand-written float64
 * references over several steps, optimizer state and checkpoint restore,
 * gradient clipping, gradient accumulation over micro-batches, LR schedules,
 * and initialiser statistics. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "backend/backend.h"
#include "core/core.h"

#define NP 7 /* elements per test parameter (odd on purpose) */

/* Gradients for the optimizer tests: loss = sum_i 0.5*sum(c_i * p_i^2), so
 * grad_i = c_i * p_i, a gradient that changes as the parameters move. */
static const double coef[2][NP] = {{0.5, -1.0, 2.0, 0.25, 3.0, -0.75, 1.5},
                                   {1.0, 0.1, -2.5, 4.0, 0.3, 0.7, -1.2}};
static const double init[2][NP] = {{1.0, -2.0, 0.5, 3.0, -0.25, 1.5, -1.0},
                                   {0.2, 0.4, -0.6, 0.8, -1.0, 1.2, -1.4}};

static void backward_quadratic(nb_params *ps) {
  nb_params_zero_grad(ps);
  nb_scope_begin();
  nb_tensor *loss = NULL;
  for (int i = 0; i < 2; i++) { /* "a" and "b"; any later parameter gets no gradient */
    nb_tensor *p = nb_params_get(ps, i);
    nb_tensor *c = nb_cast(nb_from_buffer(coef[i], 1, (int64_t[]){NP}, NB_F64, NB_DEVICE_CPU), nb_dtype_of(p));
    nb_tensor *li = nb_mul_scalar(nb_sum(nb_mul(c, nb_square(nb_reshape(p, 1, (int64_t[]){NP}))), 0, NULL, 0), 0.5);
    loss = loss ? nb_add(loss, li) : li;
  }
  NBT_CHECK(nb_backward(loss, NULL) == NB_OK, "backward: %s", nb_last_error());
  nb_scope_end();
}

/* Two f64 (or dt) parameters "a" and "b" with the values of init[]. */
static nb_params *make_params(nb_dtype dt) {
  nb_params *ps = nb_params_new();
  const char *names[2] = {"a", "b"};
  nb_scope_begin(); /* the list keeps its own references */
  for (int i = 0; i < 2; i++)
    nb_params_add(ps, names[i], nb_cast(nb_from_buffer(init[i], 1, (int64_t[]){NP}, NB_F64, NB_DEVICE_CPU), dt));
  nb_scope_end();
  return ps;
}

/* torch.optim.SGD, in float64, on the quadratic above. */
static void ref_sgd(int steps, double lr, double mom, double damp, int nesterov, double wd,
                    double out[2][NP]) {
  double buf[2][NP];
  memcpy(out, init, sizeof init);
  for (int s = 0; s < steps; s++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < NP; j++) {
        double d = coef[i][j] * out[i][j] + wd * out[i][j];
        if (mom != 0) {
          buf[i][j] = s == 0 ? d : mom * buf[i][j] + (1 - damp) * d;
          d = nesterov ? d + mom * buf[i][j] : buf[i][j];
        }
        out[i][j] -= lr * d;
      }
}

/* torch.optim.AdamW, in float64. */
static void ref_adamw(int steps, double lr, double b1, double b2, double eps, double wd,
                      double out[2][NP], double m[2][NP], double v[2][NP]) {
  memcpy(out, init, sizeof init);
  memset(m, 0, sizeof(double) * 2 * NP);
  memset(v, 0, sizeof(double) * 2 * NP);
  for (int s = 1; s <= steps; s++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < NP; j++) {
        double g = coef[i][j] * out[i][j];
        out[i][j] *= 1 - lr * wd;
        m[i][j] = b1 * m[i][j] + (1 - b1) * g;
        v[i][j] = b2 * v[i][j] + (1 - b2) * g * g;
        double mh = m[i][j] / (1 - pow(b1, s)), vh = v[i][j] / (1 - pow(b2, s));
        out[i][j] -= lr * mh / (sqrt(vh) + eps);
      }
}

static void check_params(const char *what, nb_params *ps, double ref[2][NP], double rtol, double atol) {
  for (int i = 0; i < 2; i++) {
    char name[160];
    snprintf(name, sizeof name, "%s: param %s", what, nb_params_name(ps, i));
    nbt_check_close(name, nb_params_get(ps, i), ref[i], rtol, atol);
  }
}

static void test_sgd(void) {
  struct { const char *name; double lr, mom, damp; int nest; double wd; } cases[] = {
      {"plain", 0.1, 0, 0, 0, 0},
      {"momentum", 0.1, 0.9, 0, 0, 0},
      {"momentum+dampening", 0.05, 0.9, 0.3, 0, 0},
      {"nesterov", 0.1, 0.8, 0, 1, 0},
      {"weight decay", 0.1, 0, 0, 0, 0.01},
      {"momentum+weight decay", 0.1, 0.9, 0.1, 0, 0.05},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    nb_params *ps = make_params(NB_F64);
    nb_optim *o = nb_sgd_new(ps, cases[c].lr, cases[c].mom, cases[c].damp, cases[c].nest, cases[c].wd);
    for (int s = 0; s < 3; s++) {
      backward_quadratic(ps);
      NBT_CHECK(nb_optim_step(o) == NB_OK, "sgd %s step: %s", cases[c].name, nb_last_error());
    }
    double ref[2][NP];
    ref_sgd(3, cases[c].lr, cases[c].mom, cases[c].damp, cases[c].nest, cases[c].wd, ref);
    char what[100];
    snprintf(what, sizeof what, "sgd %s", cases[c].name);
    check_params(what, ps, ref, 1e-12, 1e-14);
    NBT_CHECK(nb_optim_steps(o) == 3, "sgd step count");
    NBT_CHECK(nb_optim_state_count(o) == (cases[c].mom != 0 ? 2 : 0), "sgd %s state count %d", cases[c].name,
              nb_optim_state_count(o));
    nb_optim_free(o);
    nb_params_free(ps);
  }
  /* f32 parameters: same rule, f32 rounding */
  nb_params *ps = make_params(NB_F32);
  nb_optim *o = nb_sgd_new(ps, 0.1, 0.9, 0, 1, 0.01);
  for (int s = 0; s < 3; s++) {
    backward_quadratic(ps);
    nb_optim_step(o);
  }
  double ref[2][NP];
  ref_sgd(3, 0.1, 0.9, 0, 1, 0.01, ref);
  check_params("sgd nesterov f32", ps, ref, 1e-5, 1e-6);
  nb_optim_free(o);
  nb_params_free(ps);
  /* bad hyper-parameters */
  ps = nb_params_new();
  nbt_check_error("nesterov with dampening", nb_sgd_new(ps, 0.1, 0.9, 0.1, 1, 0) == NULL, NB_ERR_VALUE,
                  "Nesterov", NULL);
  nbt_check_error("negative lr", nb_sgd_new(ps, -1, 0, 0, 0, 0) == NULL, NB_ERR_VALUE, "lr", NULL);
  nbt_check_error("beta1 = 1", nb_adamw_new(ps, 0.1, 1.0, 0.999, 1e-8, 0) == NULL, NB_ERR_VALUE, "betas", NULL);
  nbt_check_error("NULL params", nb_adamw_new(NULL, 0.1, 0.9, 0.999, 1e-8, 0) == NULL, NB_ERR_NULL, "params", NULL);
  nb_params_free(ps);
}

static void test_adamw(void) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  double ref[2][NP], m[2][NP], v[2][NP];
  ref_adamw(3, lr, b1, b2, eps, wd, ref, m, v);
  nb_dtype dts[2] = {NB_F64, NB_F32};
  for (int d = 0; d < 2; d++) {
    nb_params *ps = make_params(dts[d]);
    nb_optim *o = nb_adamw_new(ps, lr, b1, b2, eps, wd);
    for (int s = 0; s < 3; s++) {
      backward_quadratic(ps);
      NBT_CHECK(nb_optim_step(o) == NB_OK, "adamw step: %s", nb_last_error());
    }
    char what[64];
    snprintf(what, sizeof what, "adamw %s", nb_dtype_name(dts[d]));
    /* m and v are stored in f32, so even f64 parameters carry f32 rounding */
    check_params(what, ps, ref, 1e-6, 1e-7);
    NBT_CHECK(nb_optim_state_count(o) == 4, "adamw has m and v per parameter");
    for (int i = 0; i < 4; i++) {
      const char *name = NULL;
      nb_tensor *st = nb_optim_state_get(o, i, &name);
      const char *expect[4] = {"adamw.m.a", "adamw.v.a", "adamw.m.b", "adamw.v.b"};
      NBT_CHECK(st && name && !strcmp(name, expect[i]), "state %d named %s (got %s)", i, expect[i],
                name ? name : "(null)");
      NBT_CHECK(st && nb_dtype_of(st) == NB_F32, "state %s is f32", expect[i]);
      nbt_check_close(expect[i], st, i % 2 ? v[i / 2] : m[i / 2], 1e-6, 1e-9);
    }
    nbt_check_error("state index", nb_optim_state_get(o, 4, NULL) == NULL, NB_ERR_INDEX, "out of range", NULL);
    nb_optim_free(o);
    nb_params_free(ps);
  }
  /* bf16 parameters: the update lands within bf16 rounding of the reference */
  nb_params *ps = make_params(NB_BF16);
  nb_optim *o = nb_adamw_new(ps, lr, b1, b2, eps, wd);
  for (int s = 0; s < 3; s++) {
    backward_quadratic(ps);
    nb_optim_step(o);
  }
  check_params("adamw bf16", ps, ref, 1e-2, 1e-2);
  nb_optim_free(o);
  nb_params_free(ps);
}

/* A parameter without a gradient is skipped; a strided (view) parameter is
 * updated through its base. */
static void test_skip_and_strided(void) {
  nb_params *ps = nb_params_new();
  nb_tensor *base = nb_zeros(2, (int64_t[]){3, 4}, NB_F64, NB_DEVICE_CPU);
  nb_scope_begin();
  nb_params_add(ps, "view", nb_detach(nb_transpose(base, 0, 1))); /* (4, 3), a leaf sharing base */
  nb_params_add(ps, "idle", nb_ones(1, (int64_t[]){5}, NB_F64, NB_DEVICE_CPU));
  nb_scope_end();
  nb_tensor *v = nb_params_get(ps, 0);
  NBT_CHECK(!nb_is_contiguous(v), "parameter is a strided view");
  nb_scope_begin();
  /* loss = sum(v * w), w[i][j] = i*3+j, so grad = w */
  nb_tensor *w = nb_reshape(nb_arange(0, 12, 1, NB_F64, NB_DEVICE_CPU), 2, (int64_t[]){4, 3});
  nb_backward(nb_sum(nb_mul(v, w), 0, NULL, 0), NULL);
  nb_scope_end();
  nb_optim *o = nb_sgd_new(ps, 0.5, 0, 0, 0, 0);
  NBT_CHECK(nb_optim_step(o) == NB_OK, "step: %s", nb_last_error());
  int ok = 1;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++)
      ok &= nb_get(base, (int64_t[]){j, i}) == -0.5 * (i * 3 + j);
  NBT_CHECK(ok, "the update reached the view's base");
  NBT_CHECK(nb_get(nb_params_get(ps, 1), (int64_t[]){2}) == 1.0, "a parameter without grad is untouched");
  nb_optim_free(o);
  nb_params_free(ps);
  nb_release(base);
}

/* State saved to a checkpoint and restored into a fresh optimizer continues
 * exactly as the original would have. */
static void test_restore(void) {
  char dir[] = "/tmp/nb_optim_XXXXXX";
  if (!mkdtemp(dir)) return;
  char path[128];
  snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
  for (int kind = 0; kind < 2; kind++) {
    nb_params *ps = make_params(NB_F32);
    nb_optim *o = kind ? nb_adamw_new(ps, 0.01, 0.9, 0.99, 1e-8, 0.1) : nb_sgd_new(ps, 0.05, 0.9, 0.2, 0, 0.01);
    for (int s = 0; s < 2; s++) {
      backward_quadratic(ps);
      nb_optim_step(o);
    }
    /* checkpoint: parameters and optimizer state in one file */
    int n = nb_params_count(ps) + nb_optim_state_count(o);
    const char **names = calloc((size_t)n, sizeof *names);
    nb_tensor **ts = calloc((size_t)n, sizeof *ts);
    for (int i = 0; i < nb_params_count(ps); i++) names[i] = nb_params_name(ps, i), ts[i] = nb_params_get(ps, i);
    for (int i = 0; i < nb_optim_state_count(o); i++)
      ts[nb_params_count(ps) + i] = nb_optim_state_get(o, i, &names[nb_params_count(ps) + i]);
    NBT_CHECK(nb_safetensors_save(path, n, names, ts, 0, NULL, NULL) == NB_OK, "save: %s", nb_last_error());
    /* the original continues one step */
    backward_quadratic(ps);
    nb_optim_step(o);
    /* a fresh run restores and takes the same step */
    nb_params *ps2 = make_params(NB_F32);
    nb_optim *o2 = kind ? nb_adamw_new(ps2, 0.01, 0.9, 0.99, 1e-8, 0.1) : nb_sgd_new(ps2, 0.05, 0.9, 0.2, 0, 0.01);
    nb_st_file *f = nb_safetensors_load(path);
    nb_scope_begin();
    nb_no_grad_begin();
    for (int i = 0; f && i < nb_params_count(ps2); i++)
      nb_copy_(nb_params_get(ps2, i), nb_st_tensor(f, nb_params_name(ps2, i)));
    for (int i = 0; f && i < nb_optim_state_count(o2); i++) {
      const char *name;
      nb_tensor *st = nb_optim_state_get(o2, i, &name);
      NBT_CHECK(nb_copy_(st, nb_st_tensor(f, name)) == NB_OK, "restore %s: %s", name, nb_last_error());
    }
    nb_no_grad_end();
    nb_scope_end();
    nb_st_close(f);
    nb_optim_set_steps(o2, 2);
    backward_quadratic(ps2);
    nb_optim_step(o2);
    int same = 1;
    for (int i = 0; i < 2; i++) {
      double *x = nbt_f64(nb_params_get(ps, i)), *y = nbt_f64(nb_params_get(ps2, i));
      same &= !memcmp(x, y, NP * sizeof(double));
      free(x);
      free(y);
    }
    NBT_CHECK(same, "%s: restored run matches the original bit for bit", kind ? "adamw" : "sgd");
    free(names);
    free(ts);
    nb_optim_free(o);
    nb_optim_free(o2);
    nb_params_free(ps);
    nb_params_free(ps2);
  }
  remove(path);
  rmdir(dir);
}

static void test_clip(void) {
  nb_params *ps = make_params(NB_F64);
  nb_tensor *extra = nb_ones(1, (int64_t[]){3}, NB_F64, NB_DEVICE_CPU);
  nb_params_add(ps, "no_grad", extra); /* has no gradient: ignored */
  nb_release(extra);
  backward_quadratic(ps);
  double total = 0, g0[2][NP];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < NP; j++) g0[i][j] = coef[i][j] * init[i][j], total += g0[i][j] * g0[i][j];
  double norm = sqrt(total);
  double r = nb_clip_grad_norm(ps, 1e9);
  NBT_CHECK(fabs(r - norm) < 1e-12 * norm, "norm %.15g (expected %.15g)", r, norm);
  for (int i = 0; i < 2; i++) nbt_check_close("unclipped grad", nb_grad(nb_params_get(ps, i)), g0[i], 0, 0);
  double max_norm = 1.0;
  r = nb_clip_grad_norm(ps, max_norm);
  NBT_CHECK(fabs(r - norm) < 1e-12 * norm, "clip returns the norm before clipping");
  double scale = max_norm / (norm + 1e-6), after = 0;
  for (int i = 0; i < 2; i++) {
    double g1[NP];
    for (int j = 0; j < NP; j++) g1[j] = g0[i][j] * scale, after += g1[j] * g1[j];
    nbt_check_close("clipped grad", nb_grad(nb_params_get(ps, i)), g1, 1e-14, 0);
  }
  NBT_CHECK(fabs(sqrt(after) - max_norm) < 1e-5, "clipped norm %.9g is max_norm", sqrt(after));
  /* f32 and bf16 gradients go through f32 sums */
  nb_params *p32 = make_params(NB_BF16);
  backward_quadratic(p32);
  double r32 = nb_clip_grad_norm(p32, 0.5);
  NBT_CHECK(fabs(r32 - norm) < 2e-2 * norm, "bf16 norm %.6g ~ %.6g", r32, norm);
  nbt_check_error("negative max_norm", nb_clip_grad_norm(ps, -1) < 0, NB_ERR_VALUE, "max_norm", NULL);
  nbt_check_error("NULL params", nb_clip_grad_norm(NULL, 1) < 0, NB_ERR_NULL, "params", NULL);
  nb_params_free(p32);
  nb_params_free(ps);
}

static void test_schedules(void) {
  NBT_CHECK(nb_lr_constant(123, 0.5) == 0.5, "constant");
  NBT_CHECK(nb_lr_warmup_linear(0, 10, 1.0) == 0.1, "warm-up step 0 is lr/warmup");
  NBT_CHECK(fabs(nb_lr_warmup_linear(4, 10, 2.0) - 1.0) < 1e-15, "warm-up step 4");
  NBT_CHECK(nb_lr_warmup_linear(9, 10, 2.0) == 2.0, "warm-up reaches lr at warmup-1");
  NBT_CHECK(nb_lr_warmup_linear(50, 10, 2.0) == 2.0, "after warm-up");
  NBT_CHECK(nb_lr_warmup_linear(3, 0, 2.0) == 2.0, "no warm-up");
  const double lr = 1e-3, lo = 1e-4;
  NBT_CHECK(fabs(nb_lr_cosine(0, 10, 110, lr, lo) - lr / 10) < 1e-18, "cosine warm-up");
  NBT_CHECK(fabs(nb_lr_cosine(10, 10, 110, lr, lo) - lr) < 1e-18, "cosine starts at lr");
  NBT_CHECK(fabs(nb_lr_cosine(60, 10, 110, lr, lo) - (lr + lo) / 2) < 1e-15, "cosine midpoint");
  double q = lo + 0.5 * (1 + cos(3.14159265358979323846 * 0.25)) * (lr - lo);
  NBT_CHECK(fabs(nb_lr_cosine(35, 10, 110, lr, lo) - q) < 1e-15, "cosine quarter");
  NBT_CHECK(nb_lr_cosine(110, 10, 110, lr, lo) == lo, "cosine ends at lr_min");
  NBT_CHECK(nb_lr_cosine(500, 10, 110, lr, lo) == lo, "cosine stays at lr_min");
  NBT_CHECK(fabs(nb_lr_cosine(0, 0, 100, lr, 0) - lr) < 1e-18, "cosine without warm-up");
  int mono = 1;
  for (int64_t s = 10; s < 110; s++) mono &= nb_lr_cosine(s + 1, 10, 110, lr, lo) <= nb_lr_cosine(s, 10, 110, lr, lo);
  NBT_CHECK(mono, "cosine decays monotonically");
}

/* Mean, std, min, max of a tensor's elements. */
static void stats(const nb_tensor *t, double *mean, double *sd, double *mn, double *mx) {
  int64_t n = nb_numel(t);
  double *x = nbt_f64(t), s = 0, s2 = 0;
  *mn = INFINITY, *mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    s += x[i];
    *mn = fmin(*mn, x[i]);
    *mx = fmax(*mx, x[i]);
  }
  *mean = s / n;
  for (int64_t i = 0; i < n; i++) s2 += (x[i] - *mean) * (x[i] - *mean);
  *sd = sqrt(s2 / (n - 1));
  free(x);
}

static void check_uniform(const char *what, const nb_tensor *t, double lo, double hi) {
  double mean, sd, mn, mx, n = (double)nb_numel(t);
  stats(t, &mean, &sd, &mn, &mx);
  double w = hi - lo, want_sd = w / sqrt(12.0);
  NBT_CHECK(mn >= lo && mx <= hi, "%s: values in [%g, %g] (got [%g, %g])", what, lo, hi, mn, mx);
  NBT_CHECK(mn < lo + 0.01 * w && mx > hi - 0.01 * w, "%s: values reach the bounds", what);
  NBT_CHECK(fabs(mean - (lo + hi) / 2) < 5 * want_sd / sqrt(n), "%s: mean %g", what, mean);
  NBT_CHECK(fabs(sd / want_sd - 1) < 0.02, "%s: std %g (expected %g)", what, sd, want_sd);
}

static void check_normal(const char *what, const nb_tensor *t, double mu, double sigma) {
  double mean, sd, mn, mx, n = (double)nb_numel(t);
  stats(t, &mean, &sd, &mn, &mx);
  NBT_CHECK(fabs(mean - mu) < 5 * sigma / sqrt(n), "%s: mean %g (expected %g)", what, mean, mu);
  NBT_CHECK(fabs(sd / sigma - 1) < 0.02, "%s: std %g (expected %g)", what, sd, sigma);
  NBT_CHECK(mx - mu > 2.5 * sigma && mu - mn > 2.5 * sigma, "%s: normal tails present", what);
}

static void test_init(void) {
  nb_scope_begin();
  nb_rng rng = nb_rng_new(42);
  nb_tensor *lin = nb_zeros(2, (int64_t[]){256, 128}, NB_F32, NB_DEVICE_CPU); /* fan_in 128, fan_out 256 */
  nb_tensor *conv = nb_zeros(4, (int64_t[]){64, 16, 3, 3}, NB_F32, NB_DEVICE_CPU); /* 144, 576 */
  nb_set_requires_grad(lin, 1); /* initialising a parameter that requires grad works */
  const double g = sqrt(2.0);
  NBT_CHECK(nb_init_kaiming_uniform_(lin, &rng, g) == NB_OK, "kaiming_uniform: %s", nb_last_error());
  check_uniform("kaiming_uniform", lin, -g * sqrt(3.0 / 128), g * sqrt(3.0 / 128));
  NBT_CHECK(nb_init_kaiming_normal_(conv, &rng, g) == NB_OK, "kaiming_normal");
  check_normal("kaiming_normal", conv, 0, g / sqrt(144.0));
  NBT_CHECK(nb_init_xavier_uniform_(conv, &rng, 1.0) == NB_OK, "xavier_uniform");
  double xb = sqrt(6.0 / (144 + 576));
  check_uniform("xavier_uniform", conv, -xb, xb);
  NBT_CHECK(nb_init_xavier_normal_(lin, &rng, 0.5) == NB_OK, "xavier_normal");
  check_normal("xavier_normal", lin, 0, 0.5 * sqrt(2.0 / (128 + 256)));
  NBT_CHECK(nb_init_normal_(lin, &rng, 3.0, 0.02) == NB_OK, "normal");
  check_normal("normal", lin, 3.0, 0.02);
  NBT_CHECK(nb_init_uniform_(conv, &rng, -0.5, 2.0) == NB_OK, "uniform");
  check_uniform("uniform", conv, -0.5, 2.0);
  nb_tensor *h = nb_zeros(2, (int64_t[]){200, 100}, NB_BF16, NB_DEVICE_CPU);
  NBT_CHECK(nb_init_kaiming_normal_(h, &rng, 1.0) == NB_OK, "bf16 init");
  check_normal("kaiming_normal bf16", h, 0, 0.1);
  /* same seed, same values */
  nb_rng r1 = nb_rng_new(7), r2 = nb_rng_new(7);
  nb_tensor *a = nb_zeros(2, (int64_t[]){5, 6}, NB_F32, NB_DEVICE_CPU), *b = nb_zeros_like(a);
  nb_init_xavier_uniform_(a, &r1, 1.0);
  nb_init_xavier_uniform_(b, &r2, 1.0);
  double *xa = nbt_f64(a);
  nbt_check_close("same seed gives the same values", b, xa, 0, 0);
  free(xa);
  NBT_CHECK(r1.offset == 30, "the rng advanced by numel (offset %llu)", (unsigned long long)r1.offset);
  /* a strided view is written through, the rest of its base untouched */
  nb_tensor *base = nb_zeros(2, (int64_t[]){6, 4}, NB_F64, NB_DEVICE_CPU);
  nb_tensor *cols = nb_slice(base, 1, 1, 4, 2); /* (6, 2) */
  NBT_CHECK(nb_init_uniform_(cols, &rng, 1.0, 2.0) == NB_OK, "init a view");
  int ok = 1;
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 4; j++) {
      double x = nb_get(base, (int64_t[]){i, j});
      ok &= (j == 1 || j == 3) ? (x >= 1.0 && x <= 2.0) : x == 0.0;
    }
  NBT_CHECK(ok, "only the view's elements were written");
  /* errors */
  nb_tensor *vec = nb_zeros(1, (int64_t[]){8}, NB_F32, NB_DEVICE_CPU);
  nbt_check_error("kaiming on 1-D", nb_init_kaiming_uniform_(vec, &rng, 1) != NB_OK, NB_ERR_SHAPE,
                  "fewer than 2 dimensions", NULL);
  nb_tensor *ints = nb_zeros(2, (int64_t[]){2, 2}, NB_I32, NB_DEVICE_CPU);
  nbt_check_error("int tensor", nb_init_normal_(ints, &rng, 0, 1) != NB_OK, NB_ERR_DTYPE, "i32", NULL);
  nbt_check_error("negative std", nb_init_normal_(vec, &rng, 0, -1) != NB_OK, NB_ERR_VALUE, "std", NULL);
  nbt_check_error("NULL rng", nb_init_uniform_(vec, NULL, 0, 1) != NB_OK, NB_ERR_NULL, "rng", NULL);
  NBT_CHECK(nb_init_normal_(vec, &rng, 0, 1) == NB_OK, "normal init on 1-D is fine");
  nb_scope_end();
}

static void test_params(void) {
  int64_t live = nb_live_tensors();
  nb_params *ps = nb_params_new();
  nb_tensor *w = nb_zeros(2, (int64_t[]){3, 4}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *b = nb_zeros(1, (int64_t[]){3}, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(nb_params_add(ps, "fc.weight", w) == w, "add returns the tensor");
  NBT_CHECK(nb_params_add(ps, "fc.bias", b) == b, "add bias");
  NBT_CHECK(nb_requires_grad(w) && nb_requires_grad(b), "parameters require grad");
  nb_release(w); /* the list keeps them alive */
  nb_release(b);
  NBT_CHECK(nb_params_count(ps) == 2, "count");
  NBT_CHECK(nb_params_get(ps, 0) == w && nb_params_get(ps, 1) == b, "get in insertion order");
  NBT_CHECK(!strcmp(nb_params_name(ps, 0), "fc.weight") && !strcmp(nb_params_name(ps, 1), "fc.bias"), "names");
  NBT_CHECK(nb_params_find(ps, "fc.bias") == b && nb_params_find(ps, "nope") == NULL, "find");
  NBT_CHECK(nb_params_numel(ps) == 15, "numel");
  NBT_CHECK(nb_params_name(ps, 2) == NULL, "name out of range");
  nbt_check_error("get out of range", nb_params_get(ps, 5) == NULL, NB_ERR_INDEX, "5", NULL);
  nb_tensor *dup = nb_zeros(1, (int64_t[]){1}, NB_F32, NB_DEVICE_CPU);
  nbt_check_error("duplicate name", nb_params_add(ps, "fc.bias", dup) == NULL, NB_ERR_VALUE, "fc.bias", NULL);
  nb_tensor *ints = nb_zeros(1, (int64_t[]){1}, NB_I64, NB_DEVICE_CPU);
  nbt_check_error("int parameter", nb_params_add(ps, "ints", ints) == NULL, NB_ERR_DTYPE, NULL);
  NBT_CHECK(nb_params_count(ps) == 2, "failed adds leave the list unchanged");
  nb_release(dup);
  nb_release(ints);
  nb_scope_begin();
  nb_backward(nb_sum(nb_mul_scalar(w, 2.0), 0, NULL, 0), NULL);
  nb_scope_end();
  NBT_CHECK(nb_grad(w) != NULL, "w has a gradient");
  nb_params_zero_grad(ps);
  NBT_CHECK(nb_grad(w) == NULL && nb_grad(b) == NULL, "zero_grad drops gradients");
  nb_params_free(ps);
  NBT_CHECK(nb_live_tensors() == live, "params_free drops its references (%lld live, %lld before)",
            (long long)nb_live_tensors(), (long long)live);
}


/* ---- multi-tensor AdamW ------------------------------------------------------
 * The backend's adamw_multi against one adamw_step per tensor, bit for bit:
 * odd sizes, f32, bf16 and f64 parameters with f32 state; then the
 * optimizer with a parameter listed twice (overlapping updates, which must
 * run one after another) against two per-tensor kernel calls. */
static int same_bytes(const nb_tensor *a, const nb_tensor *b) {
  size_t n = (size_t)nb_numel(a) * nb_dtype_size(nb_dtype_of(a));
  char *x = malloc(n + 1), *y = malloc(n + 1);
  int ok = x && y && !nb_to_host(a, x, n) && !nb_to_host(b, y, n) && !memcmp(x, y, n);
  free(x);
  free(y);
  return ok;
}

static void test_adamw_multi(void) {
  const nb_backend *be = nb_backend_for(NB_DEVICE_CPU);
  NBT_CHECK(be && be->adamw_multi, "cpu backend has adamw_multi");
  if (!be || !be->adamw_multi) return;
  enum { N = 5 };
  const int64_t sizes[N] = {7, 1, 1029, 64, 333};
  const nb_dtype dts[N] = {NB_F32, NB_F32, NB_F32, NB_BF16, NB_F64};
  nb_scope_begin();
  nb_tensor *t[2][4][N];
  nb_kview kv[2][4][N];
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 4; k++) {
      nb_dtype dt = k < 2 ? dts[i] : NB_F32; /* p, g in the parameter's dtype; m, v f32 */
      nb_tensor *r = nbt_randn(900 + 4 * (uint64_t)i + (uint64_t)k, 1, &sizes[i], dt);
      if (k == 3) r = nb_square(r); /* v >= 0 */
      for (int c = 0; c < 2; c++) {
        t[c][k][i] = nb_clone(r);
        nb_kview_of(t[c][k][i], &kv[c][k][i]);
      }
    }
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < N; i++)
      NBT_CHECK(!be->adamw_step(&kv[0][0][i], &kv[0][1][i], &kv[0][2][i], &kv[0][3][i], 1e-2, 0.9,
                                0.95, 1e-8, 0.1, step), "adamw_step (%s)", nb_last_error());
    NBT_CHECK(!be->adamw_multi(N, kv[1][0], kv[1][1], kv[1][2], kv[1][3], 1e-2, 0.9, 0.95, 1e-8, 0.1,
                               step), "adamw_multi (%s)", nb_last_error());
  }
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 4; k++)
      if (k != 1)
        NBT_CHECK(same_bytes(t[0][k][i], t[1][k][i]), "adamw_multi tensor %d (%s) state %d equals "
                  "per-tensor steps bit for bit", i, nb_dtype_name(dts[i]), k);
  nb_scope_end();

  /* a parameter listed twice: two sequential updates per step */
  nb_scope_begin();
  int64_t n = 37;
  nb_tensor *p = nb_keep(nbt_randn(950, 1, &n, NB_F32)), *g = nbt_randn(951, 1, &n, NB_F32);
  nb_tensor *q = nb_clone(p), *m = nb_zeros(1, &n, NB_F32, NB_DEVICE_CPU);
  nb_tensor *w = nb_zeros(1, &n, NB_F32, NB_DEVICE_CPU);
  nb_params *ps = nb_params_new();
  nb_params_add(ps, "p", p);
  nb_params_add(ps, "p again", p);
  nb_optim *o = nb_adamw_new(ps, 1e-2, 0.9, 0.95, 1e-8, 0.1);
  nb_tensor *m2 = nb_zeros(1, &n, NB_F32, NB_DEVICE_CPU), *w2 = nb_zeros(1, &n, NB_F32, NB_DEVICE_CPU);
  nb_kview kq, kg, km, kw, km2, kw2;
  nb_kview_of(q, &kq);
  nb_kview_of(g, &kg);
  nb_kview_of(m, &km);
  nb_kview_of(w, &kw);
  nb_kview_of(m2, &km2);
  nb_kview_of(w2, &kw2);
  nb_backward(nb_mul_scalar(p, 1.0), g); /* p's gradient is g, kept across the steps */
  for (int step = 1; step <= 2; step++) {
    NBT_CHECK(nb_optim_step(o) == NB_OK, "adamw step with a repeated parameter (%s)", nb_last_error());
    be->adamw_step(&kq, &kg, &km, &kw, 1e-2, 0.9, 0.95, 1e-8, 0.1, step);
    be->adamw_step(&kq, &kg, &km2, &kw2, 1e-2, 0.9, 0.95, 1e-8, 0.1, step);
  }
  NBT_CHECK(same_bytes(p, q), "repeated parameter: updated twice per step, in order");
  nb_optim_free(o);
  nb_params_free(ps);
  nb_release(p);
  nb_scope_end();
}

/* ---- gradient accumulation over micro-batches ------------------------------
 * Backward adds into the leaves' gradients, so k micro-batches, each with its
 * mean loss scaled by 1/k, leave the full batch's mean-loss gradient; clipping
 * and an AdamW step then act as on the full batch. A linear classifier on a
 * batch of 12 rows, in 1, 3 and 4 micro-batches. */
static nb_params *accum_params(void) {
  nb_params *ps = nb_params_new();
  nb_scope_begin();
  nb_params_add(ps, "w", nbt_randn(81, 2, (int64_t[]){5, 6}, NB_F64));
  nb_params_add(ps, "b", nbt_randn(82, 1, (int64_t[]){5}, NB_F64));
  nb_scope_end();
  return ps;
}

static void accum_backward(nb_params *ps, const nb_tensor *x, const nb_tensor *t, int k) {
  int64_t rows = nb_size(x, 0) / k;
  for (int m = 0; m < k; m++) {
    nb_scope_begin();
    nb_tensor *xm = nb_narrow(x, 0, m * rows, rows), *tm = nb_narrow(t, 0, m * rows, rows);
    nb_tensor *logits = nb_linear(xm, nb_params_get(ps, 0), nb_params_get(ps, 1));
    nb_tensor *loss = nb_mul_scalar(nb_cross_entropy(logits, tm, NB_REDUCE_MEAN, -100, 0), 1.0 / k);
    NBT_CHECK(nb_backward(loss, NULL) == NB_OK, "micro-batch backward: %s", nb_last_error());
    nb_scope_end();
  }
}

static void test_grad_accumulation(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(83, 2, (int64_t[]){12, 6}, NB_F64);
  nb_rng rng = nb_rng_new(84);
  nb_tensor *t = nb_randint(&rng, 1, (int64_t[]){12}, 0, 5, NB_I64, NB_DEVICE_CPU);
  nb_params *full = accum_params();
  accum_backward(full, x, t, 1);
  double *gw = nbt_f64(nb_grad(nb_params_get(full, 0))), *gb = nbt_f64(nb_grad(nb_params_get(full, 1)));
  nb_optim *of = nb_adamw_new(full, 0.05, 0.9, 0.99, 1e-8, 0.1);
  NBT_CHECK(nb_clip_grad_norm(full, 0.1) > 0 && nb_optim_step(of) == NB_OK, "full-batch step");
  for (int k = 3; k <= 4; k++) {
    nb_params *ps = accum_params();
    accum_backward(ps, x, t, k);
    char name[96];
    snprintf(name, sizeof name, "weight gradient accumulated over %d micro-batches", k);
    nbt_check_close(name, nb_grad(nb_params_get(ps, 0)), gw, 1e-12, 1e-14);
    snprintf(name, sizeof name, "bias gradient accumulated over %d micro-batches", k);
    nbt_check_close(name, nb_grad(nb_params_get(ps, 1)), gb, 1e-12, 1e-14);
    nb_optim *o = nb_adamw_new(ps, 0.05, 0.9, 0.99, 1e-8, 0.1);
    NBT_CHECK(nb_clip_grad_norm(ps, 0.1) > 0 && nb_optim_step(o) == NB_OK, "accumulated step");
    for (int i = 0; i < 2; i++) {
      double *want = nbt_f64(nb_params_get(full, i));
      snprintf(name, sizeof name, "%s after clip + AdamW, %d micro-batches", nb_params_name(ps, i), k);
      nbt_check_close(name, nb_params_get(ps, i), want, 1e-10, 1e-12);
      free(want);
    }
    nb_optim_free(o);
    nb_params_free(ps);
  }
  free(gw);
  free(gb);
  nb_optim_free(of);
  nb_params_free(full);
  nb_scope_end();
}

int main(void) {
  int64_t live = nb_live_tensors();
  test_params();
  test_sgd();
  test_adamw();
  test_adamw_multi();
  test_skip_and_strided();
  test_restore();
  test_clip();
  test_grad_accumulation();
  test_schedules();
  test_init();
  NBT_CHECK(nb_live_tensors() == live, "no tensors leaked overall (%lld live, %lld at start)",
            (long long)nb_live_tensors(), (long long)live);
  return nbt_finish();
}
