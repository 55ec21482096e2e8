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
 *                forward and gradients, relative error against float64 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static nb_device G; /* the device under test: cuda:0, or the CPU with NABLA_TEST_SELF=1 */

/* ==== section "elementwise" =============================================== */
static void test_acc_elementwise(void) {}

/* ==== section "rows" ======================================================== */
static void test_acc_rows(void) {}

/* ==== driver ================================================================ */
int main(void) {
  const char *self = getenv("NABLA_TEST_SELF");
  int n = nb_cuda_available();
  if (self && self[0] == '1') {
    G = NB_DEVICE_CPU;
  } else if (n == 0) {
    printf("no CUDA device: nothing to test\n");
    return nbt_finish();
  } else {
    G = nb_device_cuda(0);
  }
  printf("device under test: %s\n", G.type == NB_CPU ? "cpu (NABLA_TEST_SELF=1)" : "cuda:0");
  struct { const char *name; void (*f)(void); } sections[] = {
    {"elementwise", test_acc_elementwise},
    {"rows", test_acc_rows},
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
