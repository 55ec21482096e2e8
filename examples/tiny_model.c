/* The README's example: a tiny model, backward, printed gradients. */
#include <stdio.h>
#include "nabla.h"

int main(void) {
  nb_rng rng = nb_rng_new(0);
  nb_device cpu = NB_DEVICE_CPU;
  nb_tensor *w = nb_randn(&rng, 2, (int64_t[]){3, 1}, 0, 0.5, NB_F32, cpu);
  nb_set_requires_grad(w, 1);
  nb_scope_begin();                        /* frees every intermediate at the end */
  nb_tensor *x = nb_randn(&rng, 2, (int64_t[]){4, 3}, 0, 1, NB_F32, cpu);
  nb_tensor *y = nb_tanh(nb_matmul(x, w));
  nb_tensor *loss = nb_mean(nb_square(y), 0, NULL, 0);
  if (!loss || nb_backward(loss, NULL)) { fprintf(stderr, "%s\n", nb_last_error()); return 1; }
  for (int i = 0; i < 3; i++)
    printf("dloss/dw[%d] = %g\n", i, nb_get(nb_grad(w), (int64_t[]){i, 0}));
  nb_scope_end();
  nb_release(w);
  return 0;
}
