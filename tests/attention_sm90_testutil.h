/* What the sm_90a attention tests (test_attention_sm90.c: the forward,
 * test_attention_sm90_bwd.c: the backward) share: the case, its f64
 * leaves, one forward and backward run on a device in a dtype, and the
 * comparisons of two runs' output and gradients (in norm, and bit for
 * bit). Include after testutil.h. */
#ifndef NB_ATTENTION_SM90_TESTUTIL_H
#define NB_ATTENTION_SM90_TESTUTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_testutil.h"
#include "testutil.h"

typedef struct {
  int64_t B, H, Lq, Lk, D;
  int packed; /* 1: views of one (B, T, 3, H, D) tensor (Lq == Lk); 2: rows of stride D + 1 */
  int runs;   /* whether the sm_90a kernel under test takes the case (on a 9.0 device) */
} scase;

static const nb_device CPU = {NB_CPU, 0};
static const nb_device GPU = {NB_CUDA, 0};

/* Leaves in f64 (packed: one; else q, k, v; padded: D + 1 columns each). */
static int make_leaves(const scase *c, uint64_t seed, nb_tensor **leaf) {
  const int64_t e = c->packed == 2 ? c->D + 1 : c->D;
  if (c->packed == 1) {
    leaf[0] = nbt_randn(seed, 5, (int64_t[]){c->B, c->Lq, 3, c->H, c->D}, NB_F64);
    return 1;
  }
  leaf[0] = nbt_randn(seed, 4, (int64_t[]){c->B, c->H, c->Lq, e}, NB_F64);
  leaf[1] = nbt_randn(seed + 1, 4, (int64_t[]){c->B, c->H, c->Lk, e}, NB_F64);
  leaf[2] = nbt_randn(seed + 2, 4, (int64_t[]){c->B, c->H, c->Lk, e}, NB_F64);
  return 3;
}

typedef atest_result sresult;

/* Attention on dev in dtype dt from the leaves (cast, copied, made leaves
 * that require gradients): the output and the gradients of sum(y * w). */
static sresult run(const scase *c, int causal, nb_tensor *const *in, int n, nb_dtype dt, nb_device dev) {
  sresult r;
  memset(&r, 0, sizeof r);
  nb_scope_begin();
  nb_tensor *leaf[3] = {NULL, NULL, NULL}, *q, *k, *v;
  for (int i = 0; i < n; i++) {
    leaf[i] = nb_detach(nb_contiguous(nb_to_device(nb_cast(in[i], dt), dev)));
    nb_set_requires_grad(leaf[i], 1);
  }
  if (c->packed == 1) {
    const int perm[4] = {0, 2, 1, 3}; /* (B, T, H, D) -> (B, H, T, D) */
    q = nb_permute(nb_select(leaf[0], 2, 0), perm);
    k = nb_permute(nb_select(leaf[0], 2, 1), perm);
    v = nb_permute(nb_select(leaf[0], 2, 2), perm);
  } else if (c->packed == 2) {
    q = nb_narrow(leaf[0], 3, 0, c->D);
    k = nb_narrow(leaf[1], 3, 0, c->D);
    v = nb_narrow(leaf[2], 3, 0, c->D);
  } else {
    q = leaf[0], k = leaf[1], v = leaf[2];
  }
  nb_tensor *y = nb_scaled_dot_product_attention(q, k, v, NULL, causal, 0, NULL, 0);
  nb_tensor *w = y ? nb_to_device(nbt_randn(99, nb_ndim(y), nb_shape(y), NB_F64), dev) : NULL;
  nb_tensor *loss = y ? nb_sum(nb_mul(nb_cast(y, NB_F64), w), 0, NULL, 0) : NULL;
  if (!loss || nb_backward(loss, NULL)) {
    printf("attention run failed: %s\n", nb_last_error());
  } else {
    atest_read(&r, y, leaf, n);
  }
  nb_scope_end();
  return r;
}

static void compare(const char *name, const char *what, const sresult *got, const sresult *ref, int n,
                    double tol) {
  if (!got->y || !ref->y) {
    NBT_CHECK(0, "%s: a run failed", name);
    return;
  }
  double e = atest_norm_err(got->y, ref->y, got->ny);
  NBT_CHECK(e <= tol, "%s: output against %s, norm error %.3g (tolerance %g)", name, what, e, tol);
  for (int i = 0; i < n; i++) {
    e = atest_norm_err(got->g[i], ref->g[i], got->ng[i]);
    NBT_CHECK(e <= tol, "%s: gradient %d against %s, norm error %.3g (tolerance %g)", name, i, what, e, tol);
  }
}

static int same_bits(const sresult *a, const sresult *b, int n) {
  int same = a->y && b->y && !memcmp(a->y, b->y, (size_t)a->ny * sizeof(double));
  for (int i = 0; i < n && same; i++) same = !memcmp(a->g[i], b->g[i], (size_t)a->ng[i] * sizeof(double));
  return same;
}

#endif
