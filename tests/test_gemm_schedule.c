/* The own sm_90a GEMM's schedule model (gemm_sm90.cu), on the host: which
 * launch each autotuning candidate makes for a product, through
 * nb_cuda_gemm_own_schedule. Needs the CUDA backend compiled in, not a GPU.
 *
 * Checked against the rules that docs/ARCHITECTURE.md states, recomputed
 * here independently: tiles of 128 x 256; split-K only when the tiles fill
 * fewer than all SMs, with S minimising waves x ceil(ktiles / S) + 3 (S - 1)
 * over 1 <= S <= min(16, ktiles / 8) with (S - 1) tiles within the 2 slots
 * per SM, taking the fewest parts within 5% of the best; the documented
 * cases (768 x 3072 x 16384: 3 parts, 216 CTAs; 2304 x 768 x 16384: 2
 * parts); each candidate's grid; clusters of 2 only with two tile rows. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_gemm.h"

enum { DEFAULT, GROUP4, GROUP16, DATA_PARALLEL, STREAM_K, CTA_PER_TILE, CLUSTER2 };

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The documented split-K cost and choice, written out again. */
static double cost(int64_t tiles, int64_t kt, int n_sm, int64_t s) {
  return (double)(cdiv(tiles * s, n_sm) * cdiv(kt, s)) + 3.0 * (double)(s - 1);
}
static int splits(int64_t tiles, int64_t kt, int n_sm) {
  if (tiles >= n_sm) return 1;
  int64_t top = kt / 8 < 16 ? kt / 8 : 16;
  while (top > 1 && (top - 1) * tiles > 2 * (int64_t)n_sm) top--;
  double best = cost(tiles, kt, n_sm, 1);
  for (int64_t s = 2; s <= top; s++)
    if (cost(tiles, kt, n_sm, s) < best) best = cost(tiles, kt, n_sm, s);
  for (int64_t s = 1; s <= top; s++)
    if (cost(tiles, kt, n_sm, s) <= 1.05 * best) return (int)s;
  return 1;
}

static nb_gemm_own_schedule sched(int cand, int64_t M, int64_t N, int64_t K, int n_sm) {
  nb_gemm_own_schedule s = {0};
  NBT_CHECK(nb_cuda_gemm_own_schedule(cand, M, N, K, n_sm, &s), "schedule %d %lldx%lldx%lld on %d SMs",
            cand, (long long)M, (long long)N, (long long)K, n_sm);
  return s;
}

/* Every candidate on one problem against the rules. */
static void check_rules(int64_t M, int64_t N, int64_t K, int n_sm) {
  int64_t tm = cdiv(M, 128), tn = cdiv(N, 256), tiles = tm * tn, kt = cdiv(K, 64);
  char what[96];
  snprintf(what, sizeof what, "%lldx%lldx%lld on %d SMs", (long long)M, (long long)N, (long long)K, n_sm);
  for (int c = DEFAULT; c <= GROUP16; c++) { /* split-K as the heuristic */
    nb_gemm_own_schedule s = sched(c, M, N, K, n_sm);
    int S = splits(tiles, kt, n_sm);
    NBT_CHECK(s.tiles == tiles && s.splits == S && !s.stream_k && s.cluster == 1,
              "%s cand %d: %lld tiles (want %lld), %d parts (want %d)", what, c, (long long)s.tiles,
              (long long)tiles, s.splits, S);
    int64_t grid = S > 1 ? tiles * S : tiles < n_sm ? tiles : n_sm;
    NBT_CHECK(s.grid == grid, "%s cand %d: grid %lld, want %lld", what, c, (long long)s.grid, (long long)grid);
    int g = c == GROUP4 ? 4 : c == GROUP16 ? 16 : 8;
    NBT_CHECK(s.group == (g < tm ? g : tm), "%s cand %d: group %d", what, c, s.group);
  }
  nb_gemm_own_schedule dp = sched(DATA_PARALLEL, M, N, K, n_sm);
  NBT_CHECK(dp.splits == 1 && dp.grid == (tiles < n_sm ? tiles : n_sm), "%s data-parallel grid %lld", what,
            (long long)dp.grid);
  nb_gemm_own_schedule sk = sched(STREAM_K, M, N, K, n_sm);
  NBT_CHECK(sk.stream_k && sk.splits == 1 && sk.grid == n_sm, "%s stream-k", what);
  nb_gemm_own_schedule pt = sched(CTA_PER_TILE, M, N, K, n_sm);
  NBT_CHECK(pt.grid == tiles, "%s cta-per-tile grid %lld", what, (long long)pt.grid);
  nb_gemm_own_schedule cl = sched(CLUSTER2, M, N, K, n_sm);
  int64_t units = cdiv(tm, 2) * tn;
  if (tm >= 2)
    NBT_CHECK(cl.cluster == 2 && cl.grid % 2 == 0 && cl.grid == 2 * (units < n_sm / 2 ? units : n_sm / 2),
              "%s cluster2: cluster %d grid %lld", what, cl.cluster, (long long)cl.grid);
  else
    NBT_CHECK(cl.cluster == 1 && cl.grid == dp.grid, "%s cluster2 with one tile row: unclustered", what);
}

static void test_documented(void) {
  nb_gemm_own_schedule s = sched(DEFAULT, 768, 3072, 16384, 132);
  NBT_CHECK(s.tiles == 72 && s.splits == 3 && s.grid == 216, "768x3072x16384: 72 tiles, 3 parts, 216 CTAs");
  s = sched(DEFAULT, 2304, 768, 16384, 132);
  NBT_CHECK(s.tiles == 54 && s.splits == 2 && s.grid == 108, "2304x768x16384: 54 tiles, 2 parts");
  s = sched(DEFAULT, 1000, 520, 4136, 132);
  NBT_CHECK(s.tiles == 24 && s.splits == 4, "1000x520x4136: 24 tiles, 4 parts (the gemm tune case)");
  s = sched(DEFAULT, 4096, 4096, 4096, 132);
  NBT_CHECK(s.tiles == 512 && s.splits == 1 && s.grid == 132 && s.cluster == 1, "4096^3: persistent, unsplit");
  s = sched(CLUSTER2, 4096, 4096, 4096, 132);
  NBT_CHECK(s.cluster == 2 && s.grid == 132 && s.group == 4, "4096^3 cluster2: 66 pairs, groups of 4 pair rows");
  s = sched(DEFAULT, 16384, 768, 64, 132);
  NBT_CHECK(s.splits == 1, "one k-tile: never split");
}

static void test_bad(void) {
  nb_gemm_own_schedule s;
  NBT_CHECK(!nb_cuda_gemm_own_schedule(-1, 8, 8, 8, 132, &s), "candidate -1");
  NBT_CHECK(!nb_cuda_gemm_own_schedule(1000, 8, 8, 8, 132, &s), "candidate past the last");
  NBT_CHECK(nb_cuda_gemm_own_candidate(CLUSTER2) && !nb_cuda_gemm_own_candidate(CLUSTER2 + 1),
            "the candidates this test knows are all there are");
  NBT_CHECK(!nb_cuda_gemm_own_schedule(0, 0, 8, 8, 132, &s) && !nb_cuda_gemm_own_schedule(0, 8, 8, 8, 0, &s) &&
                !nb_cuda_gemm_own_schedule(0, 8, 8, (int64_t)1 << 40, 132, &s),
            "empty or oversized problems, no SMs");
}

int main(void) {
  test_documented();
  test_bad();
  const int sms[] = {132, 114, 8, 1};
  const int64_t shapes[][3] = {{768, 3072, 16384}, {3072, 768, 16384}, {2304, 768, 16384},
                               {16384, 3072, 768},  {1000, 520, 4136},   {1, 1, 1},
                               {129, 257, 65},      {2176, 2304, 520},   {50304, 768, 16384}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (size_t j = 0; j < sizeof sms / sizeof *sms; j++) check_rules(shapes[i][0], shapes[i][1], shapes[i][2], sms[j]);
  uint64_t x = 7; /* random sizes, primes and tails included */
  for (int r = 0; r < 200; r++) {
    int64_t d[3];
    for (int k = 0; k < 3; k++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      d[k] = 1 + (int64_t)((x >> 33) % (k == 2 ? 40000 : 9000));
    }
    check_rules(d[0], d[1], d[2], r % 2 ? 132 : 78);
  }
  return nbt_finish();
}
#else
int main(void) {
  printf("test_gemm_schedule: no CUDA backend compiled in; nothing to check\n");
  return 0;
}
#endif
