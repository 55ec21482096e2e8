/* What the attention tests share: one run's output and gradients in f64
 * (test_attention.c, the sm_90a tests through attention_sm90_testutil.h)
 * and the relative error in norm. Include after testutil.h. */
#ifndef NB_ATTENTION_TESTUTIL_H
#define NB_ATTENTION_TESTUTIL_H

#include <math.h>
#include <stdlib.h>

#include "testutil.h"

typedef struct {
  double *y, *g[3];
  int64_t ny, ng[3];
} atest_result;

/* r's output from y and gradients from leaf[0..n), after the backward. */
static void atest_read(atest_result *r, nb_tensor *y, nb_tensor *const *leaf, int n) {
  r->y = nbt_f64(y);
  r->ny = nb_numel(y);
  for (int i = 0; i < n; i++) {
    r->g[i] = nbt_f64(nb_grad(leaf[i]));
    r->ng[i] = nb_numel(leaf[i]);
  }
}

static void atest_free(atest_result *r) {
  free(r->y);
  for (int i = 0; i < 3; i++) free(r->g[i]);
}

/* ||a - b|| / ||r|| (||a - b|| when r is zero): a and b's difference on the
 * scale of the reference r. */
static inline double atest_norm_err_to(const double *a, const double *b, const double *r, int64_t n) {
  double e = 0, s = 0;
  for (int64_t i = 0; i < n; i++) e += (a[i] - b[i]) * (a[i] - b[i]), s += r[i] * r[i];
  return s > 0 ? sqrt(e / s) : sqrt(e);
}

/* ||a - b|| / ||b|| over n elements. */
static inline double atest_norm_err(const double *a, const double *b, int64_t n) {
  return atest_norm_err_to(a, b, b, n);
}

#endif
