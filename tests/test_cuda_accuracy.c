/* Accuracy on CUDA against float64 host references (not in ctest: run on a
 * GPU machine as build/tests/test_cuda_accuracy). Each section checks its
 * ops with stated tolerances (ulps of the dtype or relative error) and
 * prints the largest error it measured, so the tables in ARCHITECTURE.md
 * ("Accuracy") can be refreshed from one run.
 *
 * NABLA_TEST_ONLY=text runs only the sections whose name contains text.
 * NABLA_TEST_SELF=1 runs every section on the CPU backend instead (checks
 * the program on a machine without a GPU and measures the CPU column).
 *
 * Sections (each a block of its own below, with its own helpers):
 *   elementwise  every float unary and binary op, f32/f64/f16/bf16,
 *                forward and gradient, ulps against float64
 *   rows         log_softmax, softmax and cross_entropy at large logits,
 *                forward and gradients, relative error against float64
 *   norm f64     layer_norm and rms_norm in f64, forward and the gradients
 *                of x, weight and bias within 1e-12 of a long double
 *                reference (norm_ref.h), odd sizes, strided inputs, every
 *                kernel path (fast rows, generic rows, generic dw/db)
 *   singular     gradients at singular points (std of equal values, norms
 *                of zero rows, sqrt/pow at 0, ties), PyTorch's conventions,
 *                asserted exactly in f64/f32/f16/bf16 (singular_cases.h) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "norm_ref.h"
#include "accuracy.h"
#include "singular_cases.h"
#include "testutil.h"

static nb_device G; /* the device under test: cuda:0, or the CPU with NABLA_TEST_SELF=1 */

/* ==== section "elementwise" =============================================== */
/* The checks and tables of tests/accuracy.h (shared with test_accuracy, the
 * CPU suite's copy) on G, 8192 inputs per op and dtype. */
static void test_acc_elementwise(void) {
  acc_dev = G;
  acc_unary_all(8192);
  acc_binary_all(8192);
}

/* ==== section "rows" ======================================================== */
static void test_acc_rows(void) {
  acc_dev = G;
  acc_rows_all();
}

/* ==== section "norm f64" ==================================================== */
/* Rows of D <= 4096 take the fused fast kernels in f64 (vec 2 for even D,
 * 1 for odd D); 5003 the fast forward and the generic backward (dx kernel,
 * then the column dw/db partials); 20001 the generic kernels both ways. */
static void test_acc_norm_f64(void) {
  static const int64_t sizes[][2] = {{7, 37}, {5, 1}, {3, 2}, {64, 768}, {33, 1031},
                                     {300, 4096}, {4, 5003}, {3, 20001}};
  double max_rel = 0;
  uint64_t seed = 700;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (int layout = 0; layout < 3; layout++)
      for (int rms = 0; rms < 2; rms++)
        for (int affine = 0; affine < 2; affine++)
          norm_ref_case(G, sizes[s][0], sizes[s][1], layout, rms, affine, seed += 4, &max_rel);
  printf("norm f64: largest error %.3g of the largest reference term\n", max_rel);
}

/* ==== section "singular" ==================================================== */
static void test_acc_singular(void) {
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  for (int i = 0; i < 4; i++) sg_run_all(G, dts[i]);
}

/* ==== driver ================================================================ */
int main(void) {
  const char *self = getenv("NABLA_TEST_SELF");
  int n = nb_cuda_available();
  if (self && self[0] == '1') {
    G = NB_DEVICE_CPU;
  } else if (n == 0) { /* nothing tested: exit 77 (skipped), never 0 */
    printf("test_cuda_accuracy: no CUDA device: skipped (NABLA_TEST_SELF=1 runs it on the CPU)\n");
    printf("0 passed, 0 failed, %d skipped\n", 4); /* the sections below */
    return 77;
  } else {
    G = nb_device_cuda(0);
  }
  printf("device under test: %s\n", G.type == NB_CPU ? "cpu (NABLA_TEST_SELF=1)" : "cuda:0");
  struct { const char *name; void (*f)(void); } sections[] = {
    {"elementwise", test_acc_elementwise},
    {"rows", test_acc_rows},
    {"norm f64", test_acc_norm_f64},
    {"singular", test_acc_singular},
  };
  const char *only = getenv("NABLA_TEST_ONLY");
  for (size_t i = 0; i < sizeof sections / sizeof *sections; i++) {
    if (only && only[0] && !strstr(sections[i].name, only)) continue;
    int f0 = nbt_failed;
    sections[i].f();
    printf("%-14s %s\n", sections[i].name, nbt_failed == f0 ? "ok" : "FAILED");
    nb_clear_error();
  }
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}
