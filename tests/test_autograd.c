/* Autograd semantics: accumulation, no-grad, detach, zeroing, retain_graph,
 * gradients from a non-scalar, nb_autograd_grad and second derivatives. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void test_accumulation(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_leaf(1, 1, (int64_t[]){4});
  /* y = x*x + x: used three times, dy/dx = 2x + 1 */
  nb_tensor *y = nb_sum(nb_add(nb_mul(x, x), x), 0, NULL, 0);
  NBT_CHECK(nb_backward(y, NULL) == NB_OK, "backward: %s", nb_last_error());
  double *xv = nbt_f64(x), ref[4];
  for (int i = 0; i < 4; i++) ref[i] = 2 * xv[i] + 1;
  nbt_check_close("multi-use gradient", nb_grad(x), ref, 1e-12, 0);
  /* a second backward accumulates */
  nb_tensor *z = nb_sum(nb_mul_scalar(x, 3), 0, NULL, 0);
  nb_backward(z, NULL);
  for (int i = 0; i < 4; i++) ref[i] += 3;
  nbt_check_close("gradients accumulate across backward calls", nb_grad(x), ref, 1e-12, 0);
  nb_zero_grad(x);
  NBT_CHECK(nb_grad(x) == NULL, "zero_grad drops the gradient");
  free(xv);
  nb_release(x);
  nb_scope_end();
}

/* One gradient tensor reaching two leaves (a + b) must not become a shared
 * buffer: an in-place update of one leaf's .grad leaves the other alone. */
static void test_leaf_grads_not_aliased(void) {
  nb_scope_begin();
  nb_tensor *a = nbt_leaf(21, 1, (int64_t[]){3}), *b = nbt_leaf(22, 1, (int64_t[]){3});
  nb_tensor *w = nbt_randn(23, 1, (int64_t[]){3}, NB_F64);
  NBT_CHECK(nb_backward(nb_sum(nb_mul(nb_add(a, b), w), 0, NULL, 0), NULL) == NB_OK, "backward");
  NBT_CHECK(!nb_shares_storage(nb_grad(a), nb_grad(b)), "leaf gradients have their own buffers");
  nb_fill_(nb_grad(a), 0.0);
  double *wv = nbt_f64(w);
  nbt_check_close("the other leaf's gradient is untouched", nb_grad(b), wv, 0, 0);
  free(wv);
  nb_release(a);
  nb_release(b);
  nb_scope_end();
}

static void test_no_grad_detach(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_leaf(2, 1, (int64_t[]){3});
  nb_no_grad_begin();
  nb_tensor *y = nb_mul(x, x);
  nb_no_grad_end();
  NBT_CHECK(!nb_requires_grad(y) && nb_is_leaf(y), "no-grad scope records nothing");
  nb_tensor *d = nb_detach(x);
  NBT_CHECK(!nb_requires_grad(d) && nb_shares_storage(d, x), "detach shares storage, no history");
  /* gradient of x*detach(x) is detach(x) only */
  nb_tensor *l = nb_sum(nb_mul(x, d), 0, NULL, 0);
  nb_backward(l, NULL);
  double *xv = nbt_f64(x);
  nbt_check_close("detach stops gradient", nb_grad(x), xv, 1e-12, 0);
  NBT_CHECK(!strcmp(nb_grad_fn_name(l), "sum") && !strcmp(nb_grad_fn_name(x), "leaf"), "grad_fn names");
  free(xv);
  nb_release(x);
  nb_scope_end();
}

static void test_nonscalar_and_retain(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_leaf(3, 2, (int64_t[]){2, 3});
  nb_tensor *y = nb_exp(x);
  nb_tensor *g = nb_full(2, (int64_t[]){2, 3}, 2.0, NB_F64, NB_DEVICE_CPU);
  NBT_CHECK(nb_backward_ex(y, g, 1, 0) == NB_OK, "backward with gradient");
  double *yv = nbt_f64(y), ref[6];
  for (int i = 0; i < 6; i++) ref[i] = 2 * yv[i];
  nbt_check_close("backward from non-scalar with gradient", nb_grad(x), ref, 1e-12, 0);
  NBT_CHECK(nb_backward(y, g) == NB_OK, "retain_graph allows a second pass");
  nbt_check_error("third pass after freeing", nb_backward(y, g) != NB_OK, NB_ERR_GRAD, "already", "retain_graph", NULL);
  nbt_check_error("non-scalar without gradient", nb_backward(nb_exp(x), NULL) != NB_OK, NB_ERR_GRAD, "not a scalar", NULL);
  nbt_check_error("gradient of the wrong shape", nb_backward(nb_exp(x), nb_ones(1, (int64_t[]){6}, NB_F64, NB_DEVICE_CPU)) != NB_OK,
                  NB_ERR_SHAPE, "does not match", NULL);
  nb_tensor *c = nb_ones(1, (int64_t[]){2}, NB_F64, NB_DEVICE_CPU);
  nbt_check_error("backward without requires_grad", nb_backward(nb_sum(c, 0, NULL, 0), NULL) != NB_OK, NB_ERR_GRAD,
                  "does not require grad", NULL);
  free(yv);
  nb_release(x);
  nb_scope_end();
}

static void test_second_derivative(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_leaf(4, 1, (int64_t[]){5});
  /* f = sum(sin(x) * x^2); f' = cos x x^2 + 2x sin x; f'' = -sin x x^2 + 4x cos x + 2 sin x */
  nb_tensor *f = nb_sum(nb_mul(nb_sin(x), nb_square(x)), 0, NULL, 0);
  nb_tensor *gx;
  NBT_CHECK(nb_autograd_grad(f, NULL, 1, &x, &gx, 1) == NB_OK, "grad with create_graph: %s", nb_last_error());
  NBT_CHECK(nb_grad(x) == NULL, "nb_autograd_grad leaves .grad alone");
  double *xv = nbt_f64(x), r1[5], r2[5];
  for (int i = 0; i < 5; i++) {
    double v = xv[i];
    r1[i] = cos(v) * v * v + 2 * v * sin(v);
    r2[i] = -sin(v) * v * v + 4 * v * cos(v) + 2 * sin(v);
  }
  nbt_check_close("first derivative", gx, r1, 1e-12, 1e-12);
  NBT_CHECK(nb_backward(nb_sum(gx, 0, NULL, 0), NULL) == NB_OK, "backward of the gradient: %s", nb_last_error());
  nbt_check_close("second derivative", nb_grad(x), r2, 1e-10, 1e-10);
  free(xv);
  nb_release(x);
  nb_scope_end();
}

static void test_requires_grad_rules(void) {
  nb_scope_begin();
  nb_tensor *i = nb_ones(1, (int64_t[]){3}, NB_I64, NB_DEVICE_CPU);
  nbt_check_error("requires_grad on integer", nb_set_requires_grad(i, 1) != NB_OK, NB_ERR_DTYPE, "float", "i64", NULL);
  nb_tensor *x = nbt_leaf(5, 1, (int64_t[]){3});
  nb_tensor *y = nb_mul_scalar(x, 2);
  nbt_check_error("requires_grad on non-leaf", nb_set_requires_grad(y, 0) != NB_OK, NB_ERR_GRAD, "only leaves", NULL);
  nbt_check_error("in-place write to a leaf needing grad", nb_fill_(x, 0) != NB_OK, NB_ERR_GRAD, "nb_fill_", "requires grad", NULL);
  /* integer-valued results carry no gradient */
  NBT_CHECK(!nb_requires_grad(nb_argmax(x, 0, 0)), "argmax has no gradient");
  NBT_CHECK(!nb_requires_grad(nb_gt(x, x)), "comparison has no gradient");
  nb_release(x);
  nb_scope_end();
}

int main(void) {
  test_accumulation();
  test_leaf_grads_not_aliased();
  test_no_grad_detach();
  test_nonscalar_and_retain();
  test_second_derivative();
  test_requires_grad_rules();
  return nbt_finish();
}
