/* cross_entropy on f16 and bf16 logits (precision class wide): the kernels
 * read the 16-bit logits and compute in f32 (f64 on the CPU), so no cast
 * of the logits is made, under autocast or not.
 *
 * Checked against a float64 reference computed from the same (rounded)
 * logits: the loss, and dlogits rounded once to the logits' dtype (within
 * half an ulp of the exact gradient), for the engine's all-ones seed (the
 * forward's fused kernel) and for other upstream gradients (recomputed by
 * cross_entropy_backward), each reduction, label smoothing, ignored rows,
 * transposed logits. The dtypes: outside autocast the loss has the logits'
 * dtype, inside an autocast region f16/bf16 logits give an f32 loss, f32
 * and f64 logits keep theirs; dlogits have the logits' dtype. Under
 * autocast the graph holds no cast node and the node saves 16-bit dlogits.
 * An f16 gradient of a loss scaled by 2^16 is the scaled exact gradient
 * rounded once: a unit gradient rounded to f16 and then scaled would have
 * lost every probability under f16's subnormals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "testutil.h"

/* Spacing of dt's values at |v| (subnormals included). */
static double ulp_of(nb_dtype dt, double v) {
  int e = v == 0 ? -2000 : ilogb(v);
  if (dt == NB_F16) return ldexp(1.0, (e < -14 ? -14 : e) - 10);
  if (dt == NB_BF16) return ldexp(1.0, (e < -126 ? -126 : e) - 7);
  if (dt == NB_F32) return ldexp(1.0, (e < -126 ? -126 : e) - 23);
  return ldexp(1.0, (e < -1022 ? -1022 : e) - 52);
}

/* Every element of got is ref rounded once to got's dtype: within half an
 * ulp, plus slack times |ref| for the computation's own error (f32 steps
 * of the loss, the reference's summation order). */
static void check_rounded(const char *what, const nb_tensor *got, const double *ref, double slack) {
  if (!got) {
    NBT_CHECK(0, "%s: no result (%s)", what, nb_last_error());
    nb_clear_error();
    return;
  }
  nb_dtype dt = nb_dtype_of(got);
  double *v = nbt_f64(got), worst = 0;
  int64_t at = 0, n = nb_numel(got);
  for (int64_t i = 0; i < n; i++) {
    if (v[i] == ref[i]) continue;
    double e = fabs(v[i] - ref[i]) / (0.5 * ulp_of(dt, ref[i]) + slack * fabs(ref[i]));
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, at = i; /* a NaN stays the worst */
  }
  NBT_CHECK(worst <= 1.0, "%s (%s): element %lld is %.9g, reference %.17g (%g times the bound)", what,
            nb_dtype_name(dt), (long long)at, n ? v[at] : 0.0, n ? ref[at] : 0.0, worst);
  free(v);
}

/* float64 cross-entropy of rows x (M, C), targets t (-100 ignored),
 * smoothing eps: loss (M values for none, else 1) and dlogits dx for the
 * upstream gradient dy (M values for none, else dy[0]). */
static void xref(const double *x, const int64_t *t, int64_t M, int64_t C, nb_reduction red, double eps,
                 const double *dy, double *loss, double *dx) {
  int64_t nvalid = 0;
  double total = 0;
  for (int64_t r = 0; r < M; r++) nvalid += t[r] != -100;
  for (int64_t r = 0; r < M; r++) {
    const double *xr = x + r * C;
    double *dr = dx + r * C, m = -INFINITY, s = 0, sx = 0, l = 0;
    for (int64_t j = 0; j < C; j++) m = fmax(m, xr[j]);
    for (int64_t j = 0; j < C; j++) s += exp(xr[j] - m), sx += xr[j];
    double lse = m + log(s);
    double g = red == NB_REDUCE_NONE ? dy[r] : red == NB_REDUCE_MEAN ? dy[0] / (double)nvalid : dy[0];
    for (int64_t j = 0; j < C; j++) dr[j] = 0;
    if (t[r] != -100) {
      l = (1 - eps) * (lse - xr[t[r]]) + eps * (lse - sx / (double)C);
      for (int64_t j = 0; j < C; j++) dr[j] = g * (exp(xr[j] - lse) - eps / (double)C);
      dr[t[r]] -= g * (1 - eps);
    }
    if (red == NB_REDUCE_NONE) loss[r] = l;
    total += l;
  }
  if (red != NB_REDUCE_NONE) loss[0] = red == NB_REDUCE_MEAN ? total / (double)nvalid : total;
}

/* Whether the graph behind t records a cast. */
static int has_cast(const nb_tensor *t, int depth) {
  const nb_node *n = t ? t->grad_fn : NULL;
  if (!n || depth > 100) return 0;
  if (!strcmp(n->name, "cast")) return 1;
  for (int i = 0; i < n->n_inputs; i++)
    if (has_cast(n->inputs[i], depth + 1)) return 1;
  return 0;
}

typedef struct {
  nb_dtype dt;      /* the logits' */
  int64_t M, C;
  nb_reduction red;
  double eps;
  int trans;        /* logits a transposed view */
  int autocast;     /* the call inside nb_autocast_begin(dt) */
  double scale;     /* 0: the all-ones seed; else backward of loss * scale (mean, sum) or
                     * of the rows weighted by scale * w (none) */
} x16_case;

static const char *const RED[] = {"mean", "sum", "none"};

static void run_case(const x16_case *k, uint64_t seed) {
  char what[200];
  snprintf(what, sizeof what, "xent %s M=%lld C=%lld %s eps=%g%s%s %s%g", nb_dtype_name(k->dt),
           (long long)k->M, (long long)k->C, RED[k->red], k->eps, k->trans ? " transposed" : "",
           k->autocast ? " autocast" : "", k->scale ? "dy scale " : "seed", k->scale);
  nb_scope_begin();
  int64_t M = k->M, C = k->C;
  /* logits of spread ~3 rounded to dt; the reference reads the rounded values */
  int64_t shape[2] = {k->trans ? C : M, k->trans ? M : C};
  nb_tensor *leaf = nb_keep(nb_cast(nb_mul_scalar(nbt_randn(seed, 2, shape, NB_F32), 3.0), k->dt));
  nb_set_requires_grad(leaf, 1);
  nb_tensor *x = k->trans ? nb_transpose(leaf, 0, 1) : leaf;
  double *xv = nbt_f64(x);
  int64_t *tv = malloc((size_t)M * sizeof *tv);
  nb_rng rng = nb_rng_new(seed + 1);
  nb_tensor *tt = nb_randint(&rng, 1, &M, 0, C, NB_I64, NB_DEVICE_CPU);
  nb_fill_(nb_slice(tt, 0, 2, M, 5), -100); /* rows 2, 7, ... ignored */
  nb_to_host(tt, tv, (size_t)M * sizeof *tv);
  if (k->autocast) nb_autocast_begin(k->dt == NB_F16 ? NB_F16 : NB_BF16);
  nb_tensor *y = nb_cross_entropy(x, tt, k->red, -100, k->eps);
  if (k->autocast) nb_autocast_end();
  nb_dtype want = k->autocast && (k->dt == NB_F16 || k->dt == NB_BF16) ? NB_F32 : k->dt;
  NBT_CHECK(y && nb_dtype_of(y) == want, "%s: loss dtype %s (expected %s)", what,
            y ? nb_dtype_name(nb_dtype_of(y)) : "NULL", nb_dtype_name(want));
  NBT_CHECK(!has_cast(y, 0), "%s: the graph records a cast", what);
  const nb_node *n = y ? y->grad_fn : NULL;
  NBT_CHECK(n && n->saved[0] && nb_dtype_of(n->saved[0]) == k->dt, "%s: the node saves %s dlogits", what,
            n && n->saved[0] ? nb_dtype_name(nb_dtype_of(n->saved[0])) : "no");
  /* the upstream gradient and the reference */
  double *dy = malloc((size_t)M * sizeof *dy), *lref = malloc((size_t)M * sizeof *lref);
  double *gref = malloc((size_t)(M * C) * sizeof *gref);
  nb_tensor *seed_t = NULL, *root = y;
  for (int64_t i = 0; i < M; i++) dy[i] = k->scale ? k->scale : 1.0;
  if (y && k->red == NB_REDUCE_NONE) {
    if (k->scale) { /* rows weighted by scale * (0.5 .. 1.5), representable in the loss dtype */
      for (int64_t i = 0; i < M; i++) dy[i] = k->scale * (0.5 + (double)((i * 37) % 17) / 16.0);
      seed_t = nb_from_buffer(dy, 1, &M, NB_F64, NB_DEVICE_CPU);
      seed_t = nb_cast(seed_t, nb_dtype_of(y));
      double *back = nbt_f64(seed_t);
      memcpy(dy, back, (size_t)M * sizeof *dy);
      free(back);
    } else {
      seed_t = nb_ones_like(y);
    }
  } else if (y && k->scale) {
    root = nb_mul_scalar(y, k->scale);
  }
  xref(xv, tv, M, C, k->red, k->eps, dy, lref, gref);
  char sub[240];
  snprintf(sub, sizeof sub, "%s loss", what);
  if (y) check_rounded(sub, y, lref, 1e-6); /* row losses pass through f32 */
  nb_status st = y ? nb_backward(root, seed_t) : NB_ERR_VALUE;
  NBT_CHECK(st == NB_OK, "%s: backward: %s", what, nb_last_error());
  nb_tensor *g = st == NB_OK ? nb_grad(leaf) : NULL;
  NBT_CHECK(g && nb_dtype_of(g) == k->dt, "%s: dlogits dtype %s", what,
            g ? nb_dtype_name(nb_dtype_of(g)) : "NULL");
  snprintf(sub, sizeof sub, "%s dlogits", what);
  if (g) check_rounded(sub, k->trans ? nb_transpose(g, 0, 1) : g, gref, 1e-12);
  free(dy), free(lref), free(gref), free(xv), free(tv);
  nb_release(leaf);
  nb_scope_end();
}

static void test_cases(void) {
  static const nb_dtype dts[] = {NB_BF16, NB_F16};
  static const nb_reduction reds[] = {NB_REDUCE_MEAN, NB_REDUCE_SUM, NB_REDUCE_NONE};
  uint64_t seed = 100;
  for (int d = 0; d < 2; d++)
    for (int r = 0; r < 3; r++)
      for (int v = 0; v < 4; v++) { /* seed / scaled, plain / autocast, layouts and smoothing vary */
        x16_case k = {dts[d], 23, 301, reds[r], v & 1 ? 0.1 : 0.0, v == 2, v >= 2, v & 1 ? 3.0 : 0.0};
        run_case(&k, seed++);
        k.autocast = !k.autocast;
        k.scale = k.scale ? 0.0 : 0.25;
        run_case(&k, seed++);
      }
  /* f32 and f64 logits keep their dtype under autocast */
  x16_case k32 = {NB_F32, 9, 40, NB_REDUCE_MEAN, 0.0, 0, 1, 0.0};
  run_case(&k32, seed++);
  x16_case k64 = {NB_F64, 9, 40, NB_REDUCE_SUM, 0.05, 1, 1, 2.0};
  run_case(&k64, seed++);
}

/* f16 loss scaling: the mean loss of 64 rows of 4096 classes under f16
 * autocast, backward from loss * 2^16. Most unit-gradient entries (p / 64,
 * p ~ 1e-5) are under f16's subnormals; the scaled ones are normal. */
static void test_scaled_f16(void) {
  x16_case k = {NB_F16, 64, 4096, NB_REDUCE_MEAN, 0.0, 0, 1, 65536.0};
  run_case(&k, 900);
  k.trans = 1, k.eps = 0.1;
  run_case(&k, 901);
  /* outside autocast the loss is f16 (2^16 overflows it): a scale of 2^10 */
  x16_case k2 = {NB_F16, 64, 4096, NB_REDUCE_SUM, 0.0, 0, 0, 1024.0 / 64};
  run_case(&k2, 902);
}

int main(void) {
  test_cases();
  test_scaled_f16();
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}
