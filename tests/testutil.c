/* Shared test helpers (see testutil.h). */
#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int nbt_passed, nbt_failed;

int nbt_finish(void) {
  printf("%d passed, %d failed\n", nbt_passed, nbt_failed);
  return nbt_failed ? 1 : 0;
}

nb_tensor *nbt_randn(uint64_t seed, int ndim, const int64_t *shape, nb_dtype dt) {
  nb_rng rng = nb_rng_new(seed);
  if (nb_dtype_is_float(dt)) return nb_randn(&rng, ndim, shape, 0.0, 1.0, dt, NB_DEVICE_CPU);
  nb_tensor *r = nb_randint(&rng, ndim, shape, -5, 6, NB_I64, NB_DEVICE_CPU);
  return nb_cast(r, dt);
}

double *nbt_f64(const nb_tensor *t) {
  int64_t n = nb_numel(t);
  double *out = malloc((size_t)(n ? n : 1) * sizeof *out);
  nb_tensor *c = nb_cast(t, NB_F64);
  if (!c || nb_to_host(c, out, (size_t)n * sizeof *out)) {
    for (int64_t i = 0; i < n; i++) out[i] = NAN;
  }
  if (!nb_scope_depth()) nb_release(c);
  return out;
}

double nbt_close_ratio(const double *a, const double *b, int64_t n, double rtol, double atol) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(a[i]) || isnan(b[i])) {
      if (isnan(a[i]) != isnan(b[i])) return INFINITY;
      continue;
    }
    if (isinf(a[i]) || isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    double r = fabs(a[i] - b[i]) / (atol + rtol * fabs(b[i]));
    if (r > worst) worst = r;
  }
  return worst;
}

int nbt_check_close(const char *name, const nb_tensor *t, const double *ref, double rtol, double atol) {
  if (!t) {
    NBT_CHECK(0, "%s: result is NULL (%s)", name, nb_last_error());
    return 0;
  }
  double *v = nbt_f64(t);
  double r = nbt_close_ratio(v, ref, nb_numel(t), rtol, atol);
  free(v);
  NBT_CHECK(r <= 1.0, "%s: not close to reference (worst ratio %g, rtol %g, atol %g)", name, r, rtol, atol);
  return r <= 1.0;
}

int nbt_check_error(const char *name, int failed, nb_status st, ...) {
  int ok = failed && nb_last_status() == st;
  va_list ap;
  va_start(ap, st);
  for (const char *s; ok && (s = va_arg(ap, const char *));) ok = strstr(nb_last_error(), s) != NULL;
  va_end(ap);
  NBT_CHECK(ok, "%s: expected failure with status %s and a message naming the problem; got "
            "failed=%d status=%s message '%s'", name, nb_status_name(st), failed,
            nb_status_name(nb_last_status()), nb_last_error());
  nb_clear_error();
  return ok;
}

nb_tensor *nbt_leaf(uint64_t seed, int ndim, const int64_t *shape) {
  nb_rng rng = nb_rng_new(seed);
  nb_tensor *t = nb_randn(&rng, ndim, shape, 0.0, 1.0, NB_F64, NB_DEVICE_CPU);
  nb_set_requires_grad(t, 1);
  if (nb_scope_depth()) nb_keep(t); /* the caller owns it either way */
  return t;
}

/* sum(f(inputs) * w) as a double, with no graph. */
static double weighted(nbt_fn f, void *ctx, nb_tensor *const *inputs, const double *w) {
  nb_no_grad_begin();
  nb_scope_begin();
  nb_tensor *y = f(inputs, ctx);
  double s = NAN;
  if (y) {
    double *v = nbt_f64(y);
    s = 0;
    for (int64_t i = 0; i < nb_numel(y); i++) s += v[i] * w[i];
    free(v);
  }
  nb_scope_end();
  nb_no_grad_end();
  return s;
}

int nbt_gradcheck(const char *name, nbt_fn f, void *ctx, int n, nb_tensor *const *inputs,
                  double eps, double rtol, double atol) {
  nb_scope_begin();
  for (int i = 0; i < n; i++) nb_zero_grad(inputs[i]);
  nb_tensor *y = f(inputs, ctx);
  if (!y) {
    NBT_CHECK(0, "%s: forward failed: %s", name, nb_last_error());
    nb_scope_end();
    return 0;
  }
  nb_tensor *w = nbt_randn(977, nb_ndim(y), nb_shape(y), NB_F64);
  double *wv = nbt_f64(w);
  nb_tensor *loss = nb_sum(nb_mul(y, nb_cast(w, nb_dtype_of(y))), 0, NULL, 0);
  nb_status st = nb_backward(loss, NULL);
  int ok = st == NB_OK;
  NBT_CHECK(ok, "%s: backward failed: %s", name, nb_last_error());
  for (int i = 0; ok && i < n; i++) {
    double *x = nb_data_ptr(inputs[i]);
    int64_t m = nb_numel(inputs[i]);
    double *ana = nb_grad(inputs[i]) ? nbt_f64(nb_grad(inputs[i])) : calloc((size_t)m + 1, sizeof(double));
    double worst = 0;
    int64_t worst_j = -1;
    double wnum = 0, wana = 0;
    for (int64_t j = 0; j < m; j++) {
      double x0 = x[j];
      x[j] = x0 + eps;
      double lp = weighted(f, ctx, inputs, wv);
      x[j] = x0 - eps;
      double lm = weighted(f, ctx, inputs, wv);
      x[j] = x0;
      double num = (lp - lm) / (2 * eps);
      double r = fabs(num - ana[j]) / (atol + rtol * fabs(num));
      if (!(r <= worst)) { worst = r; worst_j = j; wnum = num; wana = ana[j]; }
    }
    NBT_CHECK(worst <= 1.0, "%s: gradient of input %d differs from finite differences at element "
              "%lld: analytic %.10g numeric %.10g", name, i, (long long)worst_j, wana, wnum);
    ok = worst <= 1.0;
    free(ana);
  }
  free(wv);
  nb_scope_end();
  return ok;
}

int nbt_run(const char *bin, const char *args, const char *dir, char *out, size_t out_size) {
  char cmd[4096], log[300];
  snprintf(log, sizeof log, "%s/out.txt", dir);
  snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>&1", bin, args, log);
  int st = system(cmd);
  FILE *f = fopen(log, "rb");
  size_t n = f ? fread(out, 1, out_size - 1, f) : 0;
  out[n] = 0;
  if (f) fclose(f);
  return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int nbt_tmpdir(char *dir, size_t size, const char *name) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, size, "%s/nabla-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
  if (mkdtemp(dir)) return 1;
  printf("FAIL: cannot create a temporary directory\n");
  return 0;
}

void nbt_rmtree(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", dir, dir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
}
