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

/* A launch counter of the sm_90a attention kernels, f(device 0) (-1 where
 * it never runs); -1 in a build without CUDA, where f does not exist. */
#ifdef NABLA_HAVE_CUDA
#define SM90_COUNT(f) f(0)
#else
#define SM90_COUNT(f) ((int64_t)-1)
#endif

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

/* One check's inputs: the case's name (prefix, dtype, shape, causal,
 * layout), its f64 leaves in, the same rounded to dt (in f64, for the
 * float64 reference) and the norm tolerance of dt. */
typedef struct {
  char name[160];
  nb_tensor *in[3], *rounded[3];
  int n;
  double tol;
} sinputs;

static void sm90_inputs(sinputs *s, const char *prefix, const scase *c, int causal, nb_dtype dt, uint64_t seed) {
  snprintf(s->name, sizeof s->name, "%s %s B%lld H%lld Lq%lld Lk%lld D%lld%s%s", prefix, nb_dtype_name(dt),
           (long long)c->B, (long long)c->H, (long long)c->Lq, (long long)c->Lk, (long long)c->D,
           causal ? " causal" : "", c->packed == 1 ? " packed" : c->packed == 2 ? " padded rows" : "");
  s->n = make_leaves(c, seed, s->in);
  nb_scope_begin();
  for (int i = 0; i < s->n; i++) s->rounded[i] = nb_keep(nb_cast(nb_cast(s->in[i], dt), NB_F64));
  nb_scope_end();
  s->tol = dt == NB_F16 ? 2e-3 : 1.5e-2;
}

static void sm90_inputs_free(sinputs *s) {
  for (int i = 0; i < s->n; i++) nb_release(s->in[i]), nb_release(s->rounded[i]);
}

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

/* got against other (float64, or another kernel), each output's error in
 * norm relative to the float64 result f64's norm (absolute where that is
 * zero): a gradient that is exactly zero in exact arithmetic (Lq = Lk = 1:
 * dS = P (dP - delta) = 0) is rounding noise in every kernel, and two
 * kernels' noise compared with each other's size says nothing. gtol:
 * each gradient's tolerance (NULL: tol, as the output's). */
static void compare_at(const char *name, const char *what, const sresult *got, const sresult *other,
                       const sresult *f64, int n, double tol, const double *gtol) {
  if (!got->y || !other->y || !f64->y) {
    NBT_CHECK(0, "%s: a run failed", name);
    return;
  }
  double e = atest_norm_err_to(got->y, other->y, f64->y, got->ny);
  NBT_CHECK(e <= tol, "%s: output against %s, norm error %.3g (tolerance %g)", name, what, e, tol);
  for (int i = 0; i < n; i++) {
    const double t = gtol ? gtol[i] : tol;
    e = atest_norm_err_to(got->g[i], other->g[i], f64->g[i], got->ng[i]);
    NBT_CHECK(e <= t, "%s: gradient %d against %s, norm error %.3g (tolerance %g)", name, i, what, e, t);
  }
}

/* compare_at with one tolerance for the output and every gradient */
static void compare(const char *name, const char *what, const sresult *got, const sresult *other,
                    const sresult *f64, int n, double tol) {
  compare_at(name, what, got, other, f64, n, tol, NULL);
}

static int same_bits(const sresult *a, const sresult *b, int n) {
  int same = a->y && b->y && !memcmp(a->y, b->y, (size_t)a->ny * sizeof(double));
  for (int i = 0; i < n && same; i++) same = !memcmp(a->g[i], b->g[i], (size_t)a->ng[i] * sizeof(double));
  return same;
}

/* The cases both programs run (each causal and not, in bf16 and f16;
 * NABLA_TEST_QUICK leaves out the long ones): check(case, causal, dtype,
 * seed) for each after the common set-up, then after() (when not NULL). prog names the program,
 * launches reads its kernel's launch counter (negative: not a 9.0 device). */
static int sm90_run_cases(const char *prog, int64_t (*launches)(void),
                          void (*check)(const scase *, int, nb_dtype, uint64_t), void (*after)(void)) {
  if (nb_cuda_available() <= 0) {
    printf("%s: no CUDA device, skipped\n", prog);
    return 77;
  }
  setenv("NABLA_ATTENTION", "fused", 1); /* whatever the size (small calls would compose) */
  if (launches() < 0) printf("%s: not a 9.0 device, the mma.sync path is compared\n", prog);
  const scase cases[] = {
    {2, 3, 1, 1, 64, 0, 1},       {2, 3, 7, 7, 128, 0, 1},       {2, 2, 64, 64, 64, 0, 1},
    {1, 2, 129, 129, 128, 1, 1},  {2, 2, 129, 64, 64, 0, 1},     {2, 1, 64, 129, 128, 0, 1},
    {1, 3, 7, 129, 64, 0, 1},     {1, 1, 129, 7, 128, 0, 1},     {3, 1, 257, 257, 64, 1, 1},
    {1, 2, 1000, 1000, 64, 1, 1}, {1, 1, 1000, 700, 128, 0, 1},  {1, 1, 300, 1000, 64, 0, 1},
    {1, 1, 4097, 4097, 128, 0, 1}, {1, 2, 4097, 4097, 64, 1, 1},
    /* more query blocks than an H100 has SMs: a persistent CTA takes several;
     * not causal, more pairs of blocks than it has clusters of two: the
     * forward's stream-K tail cuts items (140 pairs of 2 key tiles, 70 of 8,
     * 350 of 3 with an odd block count) */
    {2, 70, 129, 129, 64, 1, 1},  {1, 140, 200, 150, 128, 0, 1}, {1, 70, 256, 900, 128, 0, 1},
    {1, 70, 1100, 300, 64, 0, 1},
    {1, 2, 100, 100, 96, 0, 0},   {1, 2, 100, 100, 64, 2, 0}, /* D 96; rows of stride 65: not taken */
  };
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  const int quick = getenv("NABLA_TEST_QUICK") != NULL;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int causal = 0; causal < 2; causal++)
      for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
        const scase *c = &cases[i];
        if (quick && (c->Lq >= 1000 || c->Lk >= 1000)) continue;
        if (c->Lq > 4000 && dts[t] != NB_BF16) continue; /* 4097: bf16 only (the f64 reference's time) */
        check(c, causal, dts[t], 700 + 10 * i + 2 * causal + t);
      }
  if (after) after();
  return nbt_finish();
}

#endif
