/* Helpers shared by the neural-network op tests (test_nn_*.c): forward
 * checks in f64, f32 and bf16 against a float64 reference computed from the
 * same (rounded) inputs. Header-only so each test program stays one file. */
#ifndef NB_NN_TESTUTIL_H
#define NB_NN_TESTUTIL_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* out = reference(inputs) in float64; inputs are row-major copies. */
typedef void (*nnt_ref_fn)(double *const *in, double *out, void *ctx);

/* Runs f on the leaves cast to f64, f32 and bf16 and compares each result
 * with ref applied to the cast values. */
static inline void nnt_check_forward(const char *name, nbt_fn f, nnt_ref_fn ref, void *ctx, int n,
                                     nb_tensor *const *leaves) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_BF16};
  static const double tol[] = {1e-10, 2e-5, 3e-2};
  for (int d = 0; d < 3; d++) {
    nb_scope_begin();
    nb_tensor *ins[8];
    double *vals[8];
    for (int i = 0; i < n; i++) {
      ins[i] = nb_cast(leaves[i], dts[d]);
      vals[i] = nbt_f64(ins[i]);
    }
    nb_no_grad_begin();
    nb_tensor *y = f(ins, ctx);
    nb_no_grad_end();
    char label[160];
    snprintf(label, sizeof label, "%s [%s]", name, nb_dtype_name(dts[d]));
    if (y) {
      NBT_CHECK(nb_dtype_of(y) == dts[d], "%s: result dtype %s", label, nb_dtype_name(nb_dtype_of(y)));
      double *r = malloc((size_t)(nb_numel(y) + 1) * sizeof *r);
      ref(vals, r, ctx);
      nbt_check_close(label, y, r, tol[d], tol[d]);
      free(r);
    } else {
      NBT_CHECK(0, "%s: forward failed: %s", label, nb_last_error());
      nb_clear_error();
    }
    for (int i = 0; i < n; i++) free(vals[i]);
    nb_scope_end();
  }
}

static inline nb_tensor *nnt_f64(const double *v, int ndim, const int64_t *shape) {
  return nb_from_buffer(v, ndim, shape, NB_F64, NB_DEVICE_CPU);
}
static inline nb_tensor *nnt_i64(const int64_t *v, int ndim, const int64_t *shape) {
  return nb_from_buffer(v, ndim, shape, NB_I64, NB_DEVICE_CPU);
}
static inline void nnt_release_all(int n, nb_tensor **ts) {
  for (int i = 0; i < n; i++) nb_release(ts[i]);
}
#endif
