/* Gradients at singular points on the CPU, in every float dtype: std of
 * equal values and norms of zero rows give 0 (PyTorch's subgradient), not
 * NaN; sqrt at 0 gives +inf; ties split evenly; pow at 0 and with exponent
 * 0 as PyTorch (singular_cases.h; the conventions are tabled in
 * docs/ARCHITECTURE.md). */
#include "singular_cases.h"
#include "testutil.h"

int main(void) {
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  for (int i = 0; i < 4; i++) sg_run_all(NB_DEVICE_CPU, dts[i]);
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}
