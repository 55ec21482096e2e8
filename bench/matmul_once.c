/* One product for a profiler: matmul_once LAYOUT M N K REPS runs REPS bf16
 * products out (M x N) = a (M x K) @ b (K x N) on the first GPU, a given as
 * the transpose of a (K x M) tensor when LAYOUT[0] is 'T', b of an (N x K)
 * one when LAYOUT[1] is 'T' (the weight gradient X^T dY is "TN"). The
 * schedule follows the usual switches (NABLA_AUTOTUNE_FORCE, NABLA_GEMM).
 * Built with the project (build/matmul_once); e.g.
 *   ncu --kernel-name regex:"sm90_|nvjet" --launch-skip 2 --launch-count 1 \
 *       build/matmul_once TN 3072 768 16384 3 */
#include <stdio.h>
#include <stdlib.h>

#include "nabla.h"

int main(int argc, char **argv) {
  if (argc != 6 || (argv[1][0] != 'N' && argv[1][0] != 'T') || (argv[1][1] != 'N' && argv[1][1] != 'T')) {
    fprintf(stderr, "usage: matmul_once NN|NT|TN|TT M N K REPS\n");
    return 2;
  }
  int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
  int reps = atoi(argv[5]), ta = argv[1][0] == 'T', tb = argv[1][1] == 'T';
  if (M < 1 || N < 1 || K < 1 || reps < 1) {
    fprintf(stderr, "matmul_once: sizes and REPS must be positive\n");
    return 2;
  }
  nb_device d = nb_device_cuda(0);
  nb_rng r = nb_rng_new(1);
  int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {tb ? N : K, tb ? K : N};
  nb_tensor *a = nb_randn(&r, 2, sa, 0, 1, NB_BF16, d), *b = nb_randn(&r, 2, sb, 0, 1, NB_BF16, d);
  if (a && ta) a = nb_transpose(a, 0, 1);
  if (b && tb) b = nb_transpose(b, 0, 1);
  for (int i = 0; a && b && i < reps; i++) {
    nb_scope_begin();
    int ok = nb_matmul(a, b) != NULL;
    nb_scope_end();
    if (!ok) break;
    if (i == reps - 1) {
      nb_device_synchronize(d);
      printf("matmul_once: %d products %c%c %lldx%lldx%lld\n", reps, argv[1][0], argv[1][1], (long long)M,
             (long long)N, (long long)K);
      return 0;
    }
  }
  fprintf(stderr, "matmul_once: %s\n", nb_last_error());
  return 1;
}
