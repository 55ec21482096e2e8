/* Mixed precision regions (nb_autocast_begin/end): each op's precision
 * class decides its inputs' dtype; gradients reach the f32 leaves; a
 * parameter is cast once per region; f64 and integer tensors are never
 * cast; bad use is an error. */
#include <math.h>
#include <stdlib.h>

#include "graph/node.h"
#include "testutil.h"

static nb_tensor *randn32(uint64_t seed, int64_t r, int64_t c) {
  return nbt_randn(seed, 2, (const int64_t[]){r, c}, NB_F32);
}

/* Max |a - b| over elements, both read as f64. */
static double max_diff(const nb_tensor *a, const nb_tensor *b) {
  double *x = nbt_f64(a), *y = nbt_f64(b), m = 0;
  for (int64_t i = 0; i < nb_numel(a); i++) m = fmax(m, fabs(x[i] - y[i]));
  free(x), free(y);
  return m;
}

static void test_classes(void) {
  nb_scope_begin();
  nb_tensor *a = randn32(1, 9, 17), *b = randn32(2, 17, 5), *x16 = nb_cast(randn32(3, 4, 33), NB_BF16);
  NBT_CHECK(nb_autocast_dtype() == NB_F32, "outside a region: %s", nb_dtype_name(nb_autocast_dtype()));
  NBT_CHECK(nb_autocast_begin(NB_BF16) == NB_OK, "begin: %s", nb_last_error());
  NBT_CHECK(nb_autocast_dtype() == NB_BF16, "inside: %s", nb_dtype_name(nb_autocast_dtype()));
  nb_tensor *p = nb_matmul(a, b);          /* low */
  nb_tensor *s = nb_softmax(x16, -1);      /* f32 */
  nb_tensor *e = nb_exp(a);                /* follows */
  nb_tensor *d = nb_matmul(nb_cast(a, NB_F64), nb_cast(b, NB_F64)); /* f64 is never cast */
  nb_autocast_end();
  NBT_CHECK(p && nb_dtype_of(p) == NB_BF16, "matmul under bf16 autocast gives %s", p ? nb_dtype_name(nb_dtype_of(p)) : "NULL");
  NBT_CHECK(s && nb_dtype_of(s) == NB_F32, "softmax of bf16 under autocast gives %s", s ? nb_dtype_name(nb_dtype_of(s)) : "NULL");
  NBT_CHECK(e && nb_dtype_of(e) == NB_F32, "exp follows its f32 input: %s", e ? nb_dtype_name(nb_dtype_of(e)) : "NULL");
  NBT_CHECK(d && nb_dtype_of(d) == NB_F64, "f64 matmul stays f64: %s", d ? nb_dtype_name(nb_dtype_of(d)) : "NULL");
  /* the same values as the explicit casts */
  nb_tensor *pr = nb_matmul(nb_cast(a, NB_BF16), nb_cast(b, NB_BF16));
  nb_tensor *sr = nb_softmax(nb_cast(x16, NB_F32), -1);
  NBT_CHECK(p && max_diff(p, pr) == 0, "autocast matmul differs from matmul of bf16 casts by %g", max_diff(p, pr));
  NBT_CHECK(s && max_diff(s, sr) == 0, "autocast softmax differs from softmax of the f32 cast by %g", max_diff(s, sr));
  NBT_CHECK(nb_autocast_dtype() == NB_F32, "after the region: %s", nb_dtype_name(nb_autocast_dtype()));
  nb_scope_end();
}

/* A linear layer's loss under bf16 autocast: the f32 weight gets an f32
 * gradient within bf16 rounding of the f32 run's, and its two uses share
 * one cast. */
static void test_grads_and_cache(void) {
  nb_scope_begin();
  nb_tensor *x = randn32(4, 8, 32), *w = nb_keep(randn32(5, 32, 16));
  nb_set_requires_grad(w, 1);
  nb_autocast_begin(NB_BF16);
  nb_tensor *h1 = nb_matmul(x, w), *h2 = nb_matmul(nb_mul_scalar(x, 0.5), w);
  nb_tensor *loss = nb_sum(nb_cast(nb_add(h1, h2), NB_F32), 0, NULL, 0);
  nb_autocast_end();
  const nb_tensor *w1 = h1 && h1->grad_fn ? h1->grad_fn->inputs[1] : NULL;
  const nb_tensor *w2 = h2 && h2->grad_fn ? h2->grad_fn->inputs[1] : NULL;
  NBT_CHECK(w1 && w1 == w2, "the weight's two uses in one region share one cast (%p, %p)", (void *)w1, (void *)w2);
  NBT_CHECK(nb_backward(loss, NULL) == NB_OK, "backward: %s", nb_last_error());
  nb_tensor *g = nb_grad(w);
  NBT_CHECK(g && nb_dtype_of(g) == NB_F32, "the f32 weight's gradient is %s", g ? nb_dtype_name(nb_dtype_of(g)) : "NULL");
  /* f32 reference: d/dw sum((x + x/2) @ w) = 1.5 x^T 1 */
  nb_tensor *ref = nb_matmul(nb_transpose(nb_mul_scalar(x, 1.5), 0, 1), nb_ones(2, (const int64_t[]){8, 16}, NB_F32, NB_DEVICE_CPU));
  double err = g ? max_diff(g, ref) : INFINITY, scale = 0;
  double *r = nbt_f64(ref);
  for (int64_t i = 0; i < nb_numel(ref); i++) scale = fmax(scale, fabs(r[i]));
  free(r);
  NBT_CHECK(err <= 0.02 * scale, "weight gradient off by %g (scale %g; bf16 allows ~1%%)", err, scale);
  nb_release(w);
  nb_scope_end();
}

static void test_errors(void) {
  nb_status st = nb_autocast_begin(NB_F32);
  nbt_check_error("autocast f32", st != NB_OK, st, "nb_autocast_begin", "f32", "bf16 or f16", NULL);
  nb_autocast_begin(NB_BF16);
  st = nb_autocast_begin(NB_F16);
  nbt_check_error("nested other dtype", st != NB_OK, st, "f16", "inside an autocast region of bf16", NULL);
  NBT_CHECK(nb_autocast_begin(NB_BF16) == NB_OK, "nesting the same dtype: %s", nb_last_error());
  nb_autocast_end();
  NBT_CHECK(nb_autocast_dtype() == NB_BF16, "still inside the outer region");
  nb_autocast_end();
  nb_autocast_end(); /* an extra end is harmless */
  NBT_CHECK(nb_autocast_dtype() == NB_F32, "closed");
}

int main(void) {
  test_classes();
  test_grads_and_cache();
  test_errors();
  return nbt_finish();
}
