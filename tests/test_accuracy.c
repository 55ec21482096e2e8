/* Accuracy of the CPU backend against long double references (the checks of
 * tests/accuracy.h, which test_cuda_accuracy runs on a GPU): every float
 * unary and binary op in f64/f32/f16/bf16, forward and gradient, in ulps;
 * log_softmax, softmax and cross_entropy at logits near 1e3 and offset by
 * 500, forward and gradients. Prints the measured tables (the CPU column of
 * docs/ARCHITECTURE.md, "Accuracy"). */
#include "accuracy.h"

int main(void) {
  acc_dev = NB_DEVICE_CPU;
  acc_unary_all(4096);
  acc_binary_all(4096);
  acc_rows_all();
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}
