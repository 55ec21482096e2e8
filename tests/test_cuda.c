/* Every op on CUDA against the CPU backend (not in ctest: `make test-cuda`
 * on a GPU machine). Random inputs with odd sizes, transposed, sliced and
 * broadcast views, in f32, f16, bf16 (and f64 where cheap); forward results
 * and gradients through nb_backward are compared with the CPU's within the
 * tolerances of tol() below. Also: casts (f64 to f16/bf16 at and next to
 * ties included), Philox draws and dropout masks bit for bit, an
 * out-of-range index on the GPU is an error, a 1 PB allocation is
 * NB_ERR_OOM and the process goes on, caching-allocator statistics, and
 * deterministic reductions and embedding gradients repeat bit for bit.
 * NABLA_TEST_QUICK=1 shrinks sizes (for compute-sanitizer).
 * NABLA_TEST_ONLY=text runs only the sections whose name contains text.
 * NABLA_TEST_SELF=1 runs the comparisons CPU against CPU (checks the test
 * program itself on a machine without a GPU; device-only checks skipped).
 *
 * The sections' cases are in tests/cuda/, one file per family; the helpers
 * they share (tolerances, comparisons, gradient runs) are here and in
 * tests/cuda/cuda_test.h. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "core/core.h" /* nb_error_pending */
#include "cuda/cuda_test.h"

nb_device G;
int quick;

/* Tolerances per dtype (relative, absolute): compute is f32 on both sides
 * for the half types, so they differ by about one rounding of the result;
 * f32 differs by summation order and by the standard functions' few ulps
 * (their accuracy against float64 is test_cuda_accuracy's job). */
void tol(nb_dtype dt, double *rtol, double *atol) {
  switch (dt) {
  case NB_F64: *rtol = 1e-10; *atol = 1e-10; break;
  case NB_F32: *rtol = 2e-4; *atol = 2e-5; break;
  case NB_F16: *rtol = 1e-2; *atol = 2e-3; break;
  case NB_BF16: *rtol = 4e-2; *atol = 1e-2; break;
  default: *rtol = 0; *atol = 0; break;
  }
}

const nb_dtype FLOATS[] = {NB_F32, NB_F16, NB_BF16};

nb_tensor *gpu(const nb_tensor *t) { return nb_to_device(t, G); }

/* Compares a CUDA result with the CPU's, tolerance scaled by scale. */
void cmp(const char *name, nb_dtype dt, const nb_tensor *cpu, const nb_tensor *cu,
                double scale) {
  if (!cpu || !cu) {
    NBT_CHECK(0, "%s [%s]: %s result is NULL (%s)", name, nb_dtype_name(dt), cpu ? "cuda" : "cpu",
              nb_last_error());
    nb_clear_error();
    return;
  }
  int same = nb_ndim(cpu) == nb_ndim(cu) && nb_dtype_of(cpu) == nb_dtype_of(cu);
  for (int d = 0; same && d < nb_ndim(cpu); d++) same = nb_size(cpu, d) == nb_size(cu, d);
  if (!same) {
    char b1[200], b2[200];
    NBT_CHECK(0, "%s: cpu %s vs cuda %s", name, nb_describe(cpu, b1, sizeof b1),
              nb_describe(cu, b2, sizeof b2));
    return;
  }
  double rtol, atol;
  tol(dt, &rtol, &atol);
  double *a = nbt_f64(cu), *b = nbt_f64(cpu);
  double r = nbt_close_ratio(a, b, nb_numel(cpu), rtol * scale, atol * scale);
  NBT_CHECK(r <= 1.0, "%s [%s]: cuda differs from cpu (worst ratio %g)", name, nb_dtype_name(dt), r);
  free(a);
  free(b);
}

/* Exact byte equality of two tensors' row-major contents. */
void cmp_bits(const char *name, const nb_tensor *cpu, const nb_tensor *cu) {
  if (!cpu || !cu) {
    NBT_CHECK(0, "%s: NULL result (%s)", name, nb_last_error());
    nb_clear_error();
    return;
  }
  size_t n = (size_t)nb_numel(cpu) * nb_dtype_size(nb_dtype_of(cpu));
  char *a = malloc(n + 1), *b = malloc(n + 1);
  int ok = !nb_to_host(cpu, a, n) && !nb_to_host(cu, b, n) && !memcmp(a, b, n);
  NBT_CHECK(ok, "%s: cuda bits differ from cpu bits (%s)", name, nb_last_error());
  free(a);
  free(b);
}

nb_tensor *randn(uint64_t seed, int nd, const int64_t *shape, nb_dtype dt) {
  return nbt_randn(seed, nd, shape, dt);
}

/* Three layouts of one (r, c) operand: contiguous, transposed, sliced. */
nb_tensor *layout(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int kind) {
  if (kind == 1) return nb_transpose(randn(seed, 2, (int64_t[]){c, r}, dt), 0, 1);
  if (kind == 2) return nb_slice(randn(seed, 2, (int64_t[]){r, 2 * c + 1}, dt), 1, 1, 2 * c + 1, 2);
  return randn(seed, 2, (int64_t[]){r, c}, dt);
}
const char *const LAYOUT[] = {"contiguous", "transposed", "sliced"};

/* ---- gradients ------------------------------------------------------------------ */

/* Runs f on both devices; compares outputs and the gradients of sum(f*w). */
void grad_cmp(const char *name, fwd_fn f, void *ctx, int n, nb_tensor *const *in,
                     nb_dtype dt, double scale) {
  nb_tensor *out[2] = {NULL, NULL}, *gr[2][4] = {{NULL}};
  nb_scope_begin();
  for (int dv = 0; dv < 2; dv++) {
    nb_tensor *x[4];
    for (int i = 0; i < n; i++) {
      x[i] = nb_detach(dv ? gpu(in[i]) : nb_clone(in[i])); /* fresh leaves */
      if (x[i] && nb_dtype_is_float(nb_dtype_of(x[i]))) nb_set_requires_grad(x[i], 1);
    }
    nb_tensor *y = f(x, ctx);
    if (!y) break;
    nb_tensor *w = randn(999, nb_ndim(y), nb_shape(y), nb_dtype_of(y));
    if (dv) w = gpu(w);
    nb_tensor *loss = nb_sum(nb_mul(y, w), 0, NULL, 0);
    if (nb_backward(loss, NULL)) break;
    out[dv] = y;
    for (int i = 0; i < n; i++) gr[dv][i] = nb_grad(x[i]);
  }
  char nm[200]; /* room for any case name plus the suffix */
  snprintf(nm, sizeof nm, "%s forward", name);
  cmp(nm, dt, out[0], out[1], scale);
  for (int i = 0; i < n; i++) {
    if (!nb_dtype_is_float(nb_dtype_of(in[i]))) continue;
    snprintf(nm, sizeof nm, "%s grad %d", name, i);
    cmp(nm, dt, gr[0][i], gr[1][i], scale);
  }
  nb_scope_end();
}

/* Without a device (and without NABLA_TEST_SELF=1) nothing is tested: the
 * program says so, counts the selected sections as skipped and exits 77 (the
 * usual "skipped" status), never 0 as if it had passed. */
#define NBT_SKIPPED 77

int main(void) {
  const char *q = getenv("NABLA_TEST_QUICK");
  quick = q && q[0] && q[0] != '0';
  struct { const char *name; void (*f)(void); } tests[] = {
    {"unary", test_unary}, {"binary", test_binary}, {"copy/cast", test_copy_cast},
    {"cast ties", test_cast_ties},
    {"reduce", test_reduce}, {"matmul", test_matmul}, {"nn", test_nn}, {"index", test_index},
    {"random", test_random}, {"optim", test_optim}, {"errors/memory", test_errors_memory},
    {"fast paths", test_fast_paths},
    {"rows fast", test_rows_fast},
    {"rows masked", test_rows_masked},
    {"xent fused", test_xent_fused},
    {"gemm sm90", test_gemm_sm90},
    {"gemm sm80", test_gemm_sm80},
    {"gemm tune", test_gemm_tune},
    {"pinned", test_pinned}, {"amp", test_amp},
    {"gpt step", test_gpt_step},
    {"fp8", test_fp8_section},
  };
  const char *only = getenv("NABLA_TEST_ONLY"); /* run the sections whose name contains it */
  const char *self = getenv("NABLA_TEST_SELF");
  int n = nb_cuda_available();
  if (self && self[0] == '1') {
    G = NB_DEVICE_CPU;
  } else if (n == 0) {
    int selected = 0;
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
      selected += !(only && only[0] && !strstr(tests[i].name, only));
    printf("test_cuda: no CUDA device%s%s: skipped (NABLA_TEST_SELF=1 checks the program on "
           "the CPU)\n", nb_error_pending() ? ": " : "", nb_error_pending() ? nb_last_error() : "");
    printf("0 passed, 0 failed, %d skipped\n", selected);
    return NBT_SKIPPED;
  } else {
    G = nb_device_cuda(0);
  }
  printf("%d CUDA device(s)%s\n", n, quick ? ", quick sizes" : "");
  for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
    if (only && only[0] && !strstr(tests[i].name, only)) continue;
    int f0 = nbt_failed;
    tests[i].f();
    printf("%-14s %s\n", tests[i].name, nbt_failed == f0 ? "ok" : "FAILED");
    nb_clear_error();
  }
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}
