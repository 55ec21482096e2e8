/* layer_norm and rms_norm in f64 on the CPU: forward and the gradients of
 * x, weight and bias within 1e-12 of a long double reference (norm_ref.h),
 * at odd sizes and on strided inputs. With the per-row statistics saved in
 * f32 the gradients were off by about 1e-7 relative. Also: the saved
 * statistics keep f32 for f32 inputs (the kernels' contract). */
#include <stdlib.h>

#include "norm_ref.h"
#include "testutil.h"

static void test_f64_cases(void) {
  static const int64_t sizes[][2] = {{7, 37}, {5, 1}, {3, 2}, {4, 129}, {33, 1031}, {2, 5003}};
  double max_rel = 0;
  uint64_t seed = 100;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (int layout = 0; layout < 3; layout++)
      for (int rms = 0; rms < 2; rms++)
        for (int affine = 0; affine < 2; affine++)
          norm_ref_case(NB_DEVICE_CPU, sizes[s][0], sizes[s][1], layout, rms, affine, seed += 4,
                        &max_rel);
  printf("norm f64 on the cpu: largest error %.3g of the largest reference value\n", max_rel);
}

/* Several trailing axes (n_norm 2) on a 3-D input: the same rows. */
static void test_f64_two_axes(void) {
  nb_scope_begin();
  nb_tensor *x = nb_add_scalar(nbt_randn(7, 3, (int64_t[]){3, 5, 9}, NB_F64), 1.5);
  nb_tensor *w = nbt_randn(8, 2, (int64_t[]){5, 9}, NB_F64), *b = nbt_randn(9, 2, (int64_t[]){5, 9}, NB_F64);
  nb_tensor *dy = nbt_randn(10, 3, (int64_t[]){3, 5, 9}, NB_F64);
  nb_set_requires_grad(x, 1);
  nb_set_requires_grad(w, 1);
  nb_set_requires_grad(b, 1);
  nb_tensor *y = nb_layer_norm(x, 2, w, b, 1e-5), *g[3] = {NULL, NULL, NULL};
  nb_status st = nb_autograd_grad(y, dy, 3, (nb_tensor *[]){x, w, b}, g, 0);
  NBT_CHECK(st == NB_OK, "layer_norm n_norm 2: %s", nb_last_error());
  double *xv = nbt_f64(x), *wv = nbt_f64(w), *bv = nbt_f64(b), *gv = nbt_f64(dy);
  double ry[135], rdx[135], rdw[45], rdb[45], m = 0, scale[4];
  norm_ref_rows(3, 45, xv, wv, bv, gv, 1e-5, 0, ry, rdx, rdw, rdb, scale);
  const nb_tensor *got[4] = {y, g[0], g[1], g[2]};
  const double *ref[4] = {ry, rdx, rdw, rdb};
  for (int k = 0; k < 4 && st == NB_OK; k++) {
    double *v = nbt_f64(got[k]);
    double r = norm_ref_ratio(v, ref[k], k < 2 ? 135 : 45, scale[k], &m);
    NBT_CHECK(r <= 1.0, "layer_norm n_norm 2 f64: result %d off the reference (%.3g)", k, r);
    free(v);
  }
  free(xv); free(wv); free(bv); free(gv);
  nb_scope_end();
}

/* f32 inputs keep f32 statistics: the f32 result is the kernel's f32 path,
 * within f32 rounding of the reference (not f64's). */
static void test_f32_unchanged(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(11, 2, (int64_t[]){6, 50}, NB_F32);
  nb_tensor *y = nb_layer_norm(x, 1, NULL, NULL, 1e-5);
  double *xv = nbt_f64(x), ry[300], dx[300], dw[50], db[50], zero[300] = {0}, scale[4];
  norm_ref_rows(6, 50, xv, NULL, NULL, zero, 1e-5, 0, ry, dx, dw, db, scale);
  nbt_check_close("layer_norm f32 forward", y, ry, 1e-5, 1e-6);
  free(xv);
  nb_scope_end();
}

int main(void) {
  test_f64_cases();
  test_f64_two_axes();
  test_f32_unchanged();
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}
