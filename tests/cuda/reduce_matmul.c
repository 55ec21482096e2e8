/* test_cuda sections "reduce" and "matmul" (with the backend's gemm_ex). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "testutil.h"
#include "cuda_test.h"

/* Column sums (kept axes contiguous, reduced axes strided: a bias
 * gradient) take cuda_reduce.cu's column kernel: 16-byte loads where the
 * pointer, the row strides and the column count allow, one element a
 * thread otherwise, split over rows with a second pass. Odd and even
 * column counts, 1 to 16384 rows, a misaligned start, reduced axes that do
 * not merge, every float dtype; against the CPU, and the same bits on a
 * second run. */
static void col_sums(void) {
  const nb_dtype dts[4] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  const int64_t rows[4] = {1, 7, 1001, quick ? 4099 : 16384}, cols[4] = {37, 776, 3072, 2};
  const int ax0[1] = {0}, ax01[2] = {0, 1};
  for (int d = 0; d < 4; d++)
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 4; c++) {
        nb_scope_begin();
        nb_dtype dt = dts[d];
        int64_t R = rows[r], O = cols[c];
        nb_tensor *x = randn(70 + 4 * r + c, 2, (int64_t[]){R, O}, dt), *xg = gpu(x);
        double sc = 2.0 + (double)R / 1024.0;
        char name[96];
        snprintf(name, sizeof name, "column sum %lldx%lld", (long long)R, (long long)O);
        nb_tensor *y = nb_sum(xg, 1, ax0, 0);
        cmp(name, dt, nb_sum(x, 1, ax0, 0), y, sc);
        snprintf(name, sizeof name, "column sum %lldx%lld repeats", (long long)R, (long long)O);
        cmp_bits(name, y, nb_sum(xg, 1, ax0, 0));
        if (r == 2 && c < 3) { /* a start one element in: no 16-byte loads */
          nb_tensor *w = randn(90 + c, 2, (int64_t[]){R, O + 1}, dt);
          snprintf(name, sizeof name, "column sum %lldx%lld misaligned", (long long)R, (long long)O);
          cmp(name, dt, nb_sum(nb_slice(w, 1, 1, O + 1, 1), 1, ax0, 1),
              nb_sum(nb_slice(gpu(w), 1, 1, O + 1, 1), 1, ax0, 1), sc);
        }
        if (r == 2 && c > 0) { /* (4, 37 of 40, O) over (0, 1): the rows do not merge */
          nb_tensor *v = nb_slice(randn(95 + c, 3, (int64_t[]){4, 40, O}, dt), 1, 2, 39, 1);
          nb_tensor *vg = nb_slice(gpu(randn(95 + c, 3, (int64_t[]){4, 40, O}, dt)), 1, 2, 39, 1);
          snprintf(name, sizeof name, "column sum (4, 37 of 40, %lld) over 2 axes", (long long)O);
          cmp(name, dt, nb_sum(v, 2, ax01, 0), nb_sum(vg, 2, ax01, 0), 2.0);
        }
        nb_scope_end();
      }
}

/* ---- reductions ----------------------------------------------------------- */
void test_reduce(void) {
  col_sums();
  int64_t s[3] = {5, quick ? 17 : 37, quick ? 13 : 29};
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_dtype dt = FLOATS[d];
    for (int k = 0; k < 2; k++) {
      nb_scope_begin();
      nb_tensor *x = randn(20 + k, 3, s, dt);
      if (k) x = nb_transpose(x, 0, 2);
      nb_tensor *xg = gpu(x);
      const int ax[][2] = {{0, 0}, {1, 0}, {2, 0}, {0, 2}, {1, 2}};
      const int nax[] = {1, 1, 1, 2, 2};
      for (int a = 0; a < 5; a++) {
        char name[64];
        snprintf(name, sizeof name, "sum axes %d,%d n%d layout %d", ax[a][0], ax[a][1], nax[a], k);
        cmp(name, dt, nb_sum(x, nax[a], ax[a], 0), nb_sum(xg, nax[a], ax[a], 0), 4.0);
        snprintf(name, sizeof name, "max axes %d n%d layout %d", ax[a][0], nax[a], k);
        cmp(name, dt, nb_max(x, nax[a], ax[a], 1), nb_max(xg, nax[a], ax[a], 1), 1.0);
        cmp("min", dt, nb_min(x, nax[a], ax[a], 0), nb_min(xg, nax[a], ax[a], 0), 1.0);
        cmp("mean", dt, nb_mean(x, nax[a], ax[a], 0), nb_mean(xg, nax[a], ax[a], 0), 4.0);
      }
      for (int a = 0; a < 3; a++) {
        cmp("argmax", NB_I64, nb_argmax(x, a, 0), nb_argmax(xg, a, 0), 1.0);
        cmp("argmin", NB_I64, nb_argmin(x, a, 1), nb_argmin(xg, a, 1), 1.0);
      }
      cmp("sum all", dt, nb_sum(x, 0, NULL, 0), nb_sum(xg, 0, NULL, 0), 10.0);
      cmp("var", dt, nb_var(x, 1, (int[]){1}, 1.0, 0), nb_var(xg, 1, (int[]){1}, 1.0, 0), 4.0);
      cmp("logsumexp", dt, nb_logsumexp(x, 1, (int[]){2}, 0), nb_logsumexp(xg, 1, (int[]){2}, 0), 2.0);
      nb_scope_end();
    }
  }
  /* a long full reduction: split path, deterministic and atomic */
  nb_scope_begin();
  int64_t n = quick ? 100003 : 3000017;
  nb_tensor *x = randn(30, 1, &n, NB_F32), *xg = gpu(x);
  nb_tensor *ref = nb_sum(nb_cast(x, NB_F64), 0, NULL, 0);
  double want = nb_item(ref);
  nb_set_deterministic(1);
  double s1 = nb_item(nb_sum(xg, 0, NULL, 0)), s2 = nb_item(nb_sum(xg, 0, NULL, 0));
  NBT_CHECK(fabs(s1 - want) <= 1e-5 * sqrt((double)n) * 10, "long sum: %.9g vs %.9g", s1, want);
  NBT_CHECK(memcmp(&s1, &s2, sizeof s1) == 0, "deterministic long sum repeats bit for bit");
  nb_set_deterministic(0);
  double s3 = nb_item(nb_sum(xg, 0, NULL, 0));
  NBT_CHECK(fabs(s3 - want) <= 1e-5 * sqrt((double)n) * 10, "atomic long sum: %.9g vs %.9g", s3, want);
  nb_set_deterministic(1);
  int64_t shp[2] = {quick ? 3001 : 100001, 7};
  nb_tensor *t = randn(31, 2, shp, NB_F32);
  cmp("column sum (tall)", NB_F32, nb_sum(t, 1, (int[]){0}, 0), nb_sum(gpu(t), 1, (int[]){0}, 0), 40.0);
  cmp("argmax (tall)", NB_I64, nb_argmax(t, 0, 0), nb_argmax(gpu(t), 0, 0), 1.0);
  nb_tensor *ti = nbt_randn(32, 2, (int64_t[]){41, 43}, NB_I64);
  cmp("sum i64", NB_I64, nb_sum(ti, 1, (int[]){1}, 0), nb_sum(gpu(ti), 1, (int[]){1}, 0), 1.0);
  nb_scope_end();
}

/* The backend table's gemm_ex (linear's forward) against the CPU's entry:
 * every float dtype (f64 through the cuBLASLt product and a double
 * epilogue), plain, bias, alpha/beta with c, bias with aux and gelu;
 * operands contiguous, transposed and sliced. */
static void gemm_ex_vs_cpu(void) {
  const nb_dtype dts[4] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  int64_t M = quick ? 17 : 129, N = quick ? 24 : 136, K = quick ? 33 : 200;
  for (int d = 0; d < 4; d++)
    for (int v = 0; v < 4; v++) {
      nb_scope_begin();
      nb_dtype dt = dts[d];
      nb_tensor *in[4] = {layout(100 + v, M, K, dt, v % 3), layout(110 + v, K, N, dt, (v + 1) % 3),
                          randn(120 + v, 1, (int64_t[]){N}, dt), randn(130 + v, 2, (int64_t[]){M, N}, dt)};
      nb_tensor *out[2], *aux[2];
      for (int g = 0; g < 2; g++) {
        nb_device dev = g ? G : NB_DEVICE_CPU;
        nb_kview k[4], ko, kx;
        for (int i = 0; i < 4; i++) nb_kview_of(g ? gpu(in[i]) : in[i], &k[i]);
        out[g] = nb_empty(2, (int64_t[]){M, N}, dt, dev);
        aux[g] = nb_zeros(2, (int64_t[]){M, N}, dt, dev);
        nb_kview_of(out[g], &ko);
        nb_kview_of(aux[g], &kx);
        nb_gemm_epilogue ep = {v ? &k[2] : NULL, v == 2 ? &k[3] : NULL, v == 3 ? &kx : NULL,
                               v == 2 ? 0.75f : 1.0f, v == 2 ? -1.25f : 0.0f, v == 3};
        nb_status st = nb_backend_for(dev)->gemm_ex(&ko, &k[0], &k[1], v ? &ep : NULL);
        NBT_CHECK(st == NB_OK, "gemm_ex %s variant %d on %s: %s", nb_dtype_name(dt), v,
                  g ? "the device" : "the cpu", nb_last_error());
      }
      char name[64];
      snprintf(name, sizeof name, "gemm_ex variant %d (a %s, b %s)", v, LAYOUT[v % 3], LAYOUT[(v + 1) % 3]);
      cmp(name, dt, out[0], out[1], sqrt((double)K) * (dt == NB_F32 ? 5.0 : 2.0));
      if (v == 3) cmp("gemm_ex aux", dt, aux[0], aux[1], sqrt((double)K) * (dt == NB_F32 ? 5.0 : 2.0));
      nb_scope_end();
    }
}

/* ---- matmul ----------------------------------------------------------------- */
void test_matmul(void) {
  gemm_ex_vs_cpu();
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  int64_t M = quick ? 9 : 33, K = quick ? 17 : 65, N = quick ? 7 : 47;
  for (int d = 0; d < 4; d++) {
    nb_dtype dt = dts[d];
    double sc = sqrt((double)K) * (dt == NB_F32 ? 5.0 : 2.0);
    for (int ka = 0; ka < 3; ka++)
      for (int kb = 0; kb < 3; kb++) {
        nb_scope_begin();
        nb_tensor *a = layout(40 + ka, M, K, dt, ka), *b = layout(50 + kb, K, N, dt, kb);
        char name[64];
        snprintf(name, sizeof name, "matmul a %s b %s", LAYOUT[ka], LAYOUT[kb]);
        cmp(name, dt, nb_matmul(a, b), nb_matmul(gpu(a), gpu(b)), sc);
        nb_scope_end();
      }
    nb_scope_begin();
    nb_tensor *a = randn(60, 3, (int64_t[]){3, M, K}, dt), *b = randn(61, 2, (int64_t[]){K, N}, dt);
    cmp("matmul batched, b broadcast", dt, nb_matmul(a, b), nb_matmul(gpu(a), gpu(b)), sc);
    nb_tensor *a4 = randn(62, 4, (int64_t[]){2, 1, M, K}, dt), *b4 = randn(63, 3, (int64_t[]){3, K, N}, dt);
    cmp("matmul 4-D broadcast batches", dt, nb_matmul(a4, b4), nb_matmul(gpu(a4), gpu(b4)), sc);
    nb_tensor *at = nb_transpose(randn(64, 3, (int64_t[]){3, K, M}, dt), 1, 2);
    cmp("matmul batched transposed", dt, nb_matmul(at, b), nb_matmul(gpu(at), gpu(b)), sc);
    nb_tensor *v = randn(65, 1, (int64_t[]){K}, dt);
    cmp("matmul matrix-vector", dt, nb_matmul(a, v), nb_matmul(gpu(a), gpu(v)), sc);
    nb_scope_end();
  }
}
