/* One test per error class: every failing call returns NULL or a status and
 * a message that names the op, the shapes and dtypes, and what was expected;
 * a NULL input propagates and keeps the first message. */
#include <math.h>
#include <string.h>

#include "testutil.h"

static void test_null_propagation(void) {
  nb_scope_begin();
  nb_tensor *a = nb_ones(1, (int64_t[]){3}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *bad = nb_add(a, nb_ones(1, (int64_t[]){4}, NB_F32, NB_DEVICE_CPU));
  /* a chain of calls on the failed result is checked once at its end */
  nb_tensor *r = nb_sum(nb_exp(nb_mul(bad, a)), 0, NULL, 0);
  nbt_check_error("null propagates, first message kept", r == NULL, NB_ERR_SHAPE, "add", "f32[3]", "f32[4]", "broadcast", NULL);
  nbt_check_error("NULL argument", nb_exp(NULL) == NULL, NB_ERR_NULL, "exp", "NULL", NULL);
  nbt_check_error("NULL to_host", nb_to_host(NULL, NULL, 0) != NB_OK, NB_ERR_NULL, "nb_to_host", NULL);
  nb_scope_end();
}

static void test_classes(void) {
  nb_scope_begin();
  nb_tensor *x = nb_ones(2, (int64_t[]){2, 3}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *i = nb_ones(2, (int64_t[]){2, 3}, NB_I64, NB_DEVICE_CPU);
  /* dtype */
  nbt_check_error("matmul of integers", nb_matmul(i, nb_transpose(i, 0, 1)) == NULL, NB_ERR_DTYPE, "matmul", "i64", "float", NULL);
  nbt_check_error("mean of integers", nb_mean(i, 0, NULL, 0) == NULL, NB_ERR_DTYPE, "mean", "i64", NULL);
  nbt_check_error("bad dtype enum", nb_cast(x, (nb_dtype)99) == NULL, NB_ERR_DTYPE, "nb_cast", NULL);
  nbt_check_error("rand with int dtype", nb_rand(&(nb_rng){1, 0}, 1, (int64_t[]){2}, 0, 1, NB_I32, NB_DEVICE_CPU) == NULL,
                  NB_ERR_DTYPE, "nb_rand", "i32", NULL);
  /* shape */
  nbt_check_error("broadcast", nb_mul(x, nb_ones(1, (int64_t[]){2}, NB_F32, NB_DEVICE_CPU)) == NULL, NB_ERR_SHAPE,
                  "mul", "f32[2, 3]", "f32[2]", NULL);
  nbt_check_error("matmul inner dims", nb_matmul(x, x) == NULL, NB_ERR_SHAPE, "matmul", "f32[2, 3]", "(..., K, N)", NULL);
  nbt_check_error("reshape count", nb_reshape(x, 1, (int64_t[]){5}) == NULL, NB_ERR_SHAPE, "nb_reshape", "[5]", NULL);
  nbt_check_error("two -1 in reshape", nb_reshape(x, 2, (int64_t[]){-1, -1}) == NULL, NB_ERR_SHAPE, "nb_reshape", NULL);
  nbt_check_error("impossible view", nb_view(nb_transpose(x, 0, 1), 1, (int64_t[]){6}) == NULL, NB_ERR_SHAPE, "nb_view", "copy", NULL);
  nbt_check_error("expand non-1 axis", nb_expand(x, 2, (int64_t[]){4, 3}) == NULL, NB_ERR_SHAPE, "nb_expand", "[4, 3]", NULL);
  nbt_check_error("negative size", nb_zeros(1, (int64_t[]){-2}, NB_F32, NB_DEVICE_CPU) == NULL, NB_ERR_SHAPE, "negative", NULL);
  nbt_check_error("too many dims", nb_zeros(9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, NB_F32, NB_DEVICE_CPU) == NULL,
                  NB_ERR_SHAPE, "9 dimensions", NULL);
  nb_tensor *parts[2] = {x, nb_ones(2, (int64_t[]){3, 3}, NB_F32, NB_DEVICE_CPU)};
  nbt_check_error("cat mismatch", nb_cat(2, parts, 1) == NULL, NB_ERR_SHAPE, "cat", "f32[3, 3]", NULL);
  nbt_check_error("squeeze non-1", nb_squeeze(x, 0) == NULL, NB_ERR_SHAPE, "nb_squeeze", "size 2", NULL);
  nbt_check_error("max over empty", nb_max(nb_zeros(1, (int64_t[]){0}, NB_F32, NB_DEVICE_CPU), 0, NULL, 0) == NULL,
                  NB_ERR_SHAPE, "max", "empty", NULL);
  nbt_check_error("to_host size", nb_to_host(x, (float[6]){0}, 8) != NB_OK, NB_ERR_VALUE, "nb_to_host", "24", NULL);
  /* axis */
  nbt_check_error("sum axis", nb_sum(x, 1, (int[]){2}, 0) == NULL, NB_ERR_AXIS, "sum", "axis 2", NULL);
  nbt_check_error("duplicate axis", nb_sum(x, 2, (int[]){1, -1}, 0) == NULL, NB_ERR_AXIS, "sum", "twice", NULL);
  nbt_check_error("transpose axis", nb_transpose(x, 0, -3) == NULL, NB_ERR_AXIS, "nb_transpose", "-3", NULL);
  nbt_check_error("permute repeat", nb_permute(x, (int[]){0, 0}) == NULL, NB_ERR_AXIS, "nb_permute", "repeated", NULL);
  nbt_check_error("argmax axis", nb_argmax(x, 5, 0) == NULL, NB_ERR_AXIS, "argmax", NULL);
  /* index and value */
  nbt_check_error("select index", nb_select(x, 1, 3) == NULL, NB_ERR_INDEX, "nb_select", "index 3", NULL);
  nbt_check_error("narrow range", nb_narrow(x, 1, 2, 2) == NULL, NB_ERR_INDEX, "nb_narrow", NULL);
  nbt_check_error("slice step", nb_slice(x, 1, 0, 3, 0) == NULL, NB_ERR_VALUE, "nb_slice", "step", NULL);
  nbt_check_error("arange step 0", nb_arange(0, 1, 0, NB_F32, NB_DEVICE_CPU) == NULL, NB_ERR_VALUE, "nb_arange", NULL);
  nbt_check_error("clamp bounds", nb_clamp(x, 2, 1) == NULL, NB_ERR_VALUE, "clamp", NULL);
  nbt_check_error("norm p", nb_norm(x, -1, 0, NULL, 0) == NULL, NB_ERR_VALUE, "norm", NULL);
  nbt_check_error("item of many", isnan(nb_item(x)), NB_ERR_SHAPE, "nb_item", "6 elements", NULL);
  nbt_check_error("randint empty range", nb_randint(&(nb_rng){1, 0}, 1, (int64_t[]){2}, 3, 3, NB_I64, NB_DEVICE_CPU) == NULL,
                  NB_ERR_VALUE, "nb_randint", NULL);
  /* device */
  nb_device d;
  nbt_check_error("bad device string", nb_device_parse("gpu7", &d) != NB_OK, NB_ERR_DEVICE, "gpu7", NULL);
  if (nb_cuda_available() == 0) {
    nbt_check_error("missing device", nb_to_device(x, nb_device_cuda(0)) == NULL, NB_ERR_DEVICE, "cuda", NULL);
    nbt_check_error("zeros on missing device", nb_zeros(1, (int64_t[]){2}, NB_F32, nb_device_cuda(3)) == NULL,
                    NB_ERR_DEVICE, "cuda", NULL);
  }
  nb_scope_end();
}

/* Inputs on two devices: every op that takes several tensors refuses them
 * with a device error naming both (needs a GPU; skipped without one). */
static void test_device_mismatch(void) {
  if (nb_cuda_available() <= 0) {
    printf("note: no CUDA device; the device-mismatch checks need one\n");
    return;
  }
  nb_scope_begin();
  nb_device gpu = nb_device_cuda(0);
  nb_tensor *x = nb_ones(2, (int64_t[]){2, 3}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *xg = nb_to_device(x, gpu);
  nb_tensor *w = nb_ones(2, (int64_t[]){4, 3}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *t = nb_zeros(1, (int64_t[]){2}, NB_I64, NB_DEVICE_CPU);
  nbt_check_error("add across devices", nb_add(x, xg) == NULL, NB_ERR_DEVICE, "add", "different devices",
                  "f32[2, 3]", "@cuda:0", NULL);
  nbt_check_error("matmul across devices", nb_matmul(xg, nb_transpose(x, 0, 1)) == NULL, NB_ERR_DEVICE,
                  "matmul", "cuda:0", NULL);
  nbt_check_error("where across devices", nb_where(nb_gt(x, x), x, xg) == NULL, NB_ERR_DEVICE, "where", NULL);
  nb_tensor *parts[2] = {x, xg};
  nbt_check_error("cat across devices", nb_cat(2, parts, 0) == NULL, NB_ERR_DEVICE, "cat", NULL);
  nbt_check_error("linear across devices", nb_linear(xg, w, NULL) == NULL, NB_ERR_DEVICE, "linear", NULL);
  nbt_check_error("cross_entropy across devices", nb_cross_entropy(xg, t, NB_REDUCE_MEAN, -100, 0) == NULL,
                  NB_ERR_DEVICE, "cross_entropy", NULL);
  nbt_check_error("embedding across devices", nb_embedding(nb_to_device(w, gpu), t) == NULL, NB_ERR_DEVICE,
                  "embedding", NULL);
  nb_tensor *leaf = nb_ones(1, (int64_t[]){3}, NB_F32, NB_DEVICE_CPU);
  nb_set_requires_grad(leaf, 1);
  nb_tensor *g = nb_ones(1, (int64_t[]){3}, NB_F32, gpu);
  nbt_check_error("backward with a gradient on another device", nb_backward(nb_exp(leaf), g) != NB_OK,
                  NB_ERR_DEVICE, "backward", "another device", NULL);
  nb_scope_end();
}

int main(void) {
  test_null_propagation();
  test_classes();
  test_device_mismatch();
  return nbt_finish();
}
