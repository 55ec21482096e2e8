#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "backend/backend.h" /* nb_kview_of */
#include "cuda_test.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_gemm.h"
#endif

/* ==== autotuning of the own sm_90a GEMM (gemm_sm90.cu, backend/autotune.c) =====
 * Every schedule candidate, forced with nb_tune_force, on shapes where they
 * differ: a float64 reference as in "gemm sm90", and candidate 0 (the
 * heuristic, the choice when tuning is off). On the multi-wave shape every
 * candidate but "stream-k" and "dpsk" (whose tail tiles are split over k)
 * keeps each tile's k sum in one CTA, so it must give the bits of the first
 * such candidate that runs the same kernel: the cooperative one (128 x 256
 * tiles) or the ping-pong one (128 x 128 tiles by m64n128 wgmma, another
 * instruction shape; the heuristic's at few k-tiles and a full wave, as on
 * that shape); elsewhere the results may differ by rounding only
 * (relative Frobenius difference below the output dtype's unit roundoff).
 * Fused epilogues run under every candidate too (bias, GELU, residual,
 * pre-activation output; 16-bit and f32 outputs). Then the cache: tuning off
 * writes nothing; NABLA_AUTOTUNE=1 (cache file in a temporary directory)
 * tunes on first use (more than one launch) and writes the key's line; after
 * nb_tune_reset, as in a new process, the choice is read back (one launch,
 * the same bits), a fused call of the same problem shares it, and a fused
 * call of a new problem whose c is its own output (out += a @ b) tunes
 * without adding c twice. */
#include "backend/autotune.h"

static int gt_ncand(void) {
  int n = 1;
#ifdef NABLA_HAVE_CUDA
  while (nb_cuda_gemm_own_candidate(n)) n++;
#endif
  return n;
}

static const char *gt_name(int i) {
#ifdef NABLA_HAVE_CUDA
  return nb_cuda_gemm_own_candidate(i);
#else
  return i ? NULL : "default";
#endif
}

static void gt_backend(int own) {
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(own);
#endif
  (void)own;
}

/* Whether candidate i sums every tile over k in one CTA on a multi-wave
 * shape (the stream-K ones split tiles over k). */
static int gt_whole_tiles(int i) {
  const char *n = gt_name(i);
  return n && strcmp(n, "stream-k") != 0 && strcmp(n, "dpsk") != 0;
}

/* Whether candidate i runs the ping-pong kernel (128-wide tiles) for an M x
 * N x K bf16/f16 product on the test device. */
static int gt_pingpong(int i, int64_t M, int64_t N, int64_t K) {
#ifdef NABLA_HAVE_CUDA
  nb_cuda_info info;
  nb_gemm_own_schedule s;
  if (G.type != NB_CPU && nb_cuda_device_info(G.index, &info) == NB_OK &&
      nb_cuda_gemm_own_schedule(i, M, N, K, info.n_sm, &s))
    return s.tile_n == 128;
#endif
  (void)i, (void)M, (void)N, (void)K;
  return 0;
}

/* Unit roundoff of the output dtype (f32: its accumulation differences). */
static double gt_unit(nb_dtype dt) { return dt == NB_BF16 ? 0x1p-8 : dt == NB_F16 ? 0x1p-11 : 1e-5; }

/* Every candidate on one problem (test layout flags as in gs_case). */
static void gt_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, int ta, int tb, int bits,
                    uint64_t seed) {
  nb_scope_begin();
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, dt, ta, &ga), *b = gs_operand(seed + 1, K, N, dt, tb, &gb);
  double *A = nbt_f64(a), *B = nbt_f64(b), *O0 = NULL;
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  size_t bytes = (size_t)(M * N) * nb_dtype_size(dt);
  char *bits0 = malloc(bytes), *bitsi = malloc(bytes), *kbits[2] = {malloc(bytes), malloc(bytes)};
  int kseen[2] = {0, 0}; /* the first whole-tile candidate's bits per kernel (cooperative, ping-pong) */
  gt_backend(1);
  for (int i = 0; i < gt_ncand(); i++) {
    char name[128];
    snprintf(name, sizeof name, "gemm tune %c%c %lldx%lldx%lld [%s] candidate %d (%s)", ta ? 'T' : 'N',
             tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, nb_dtype_name(dt), i, gt_name(i));
    nb_tune_force(i);
    int64_t n0 = gs_launches();
    nb_tensor *o = nb_matmul(ga, gb);
    if (n0 >= 0) NBT_CHECK(gs_launches() == n0 + 1, "%s: one launch of the own kernel", name);
    double *O = o ? nbt_f64(o) : NULL;
    if (!O || nb_to_host(o, i ? bitsi : bits0, bytes) != NB_OK) {
      NBT_CHECK(0, "%s: failed (%s)", name, nb_last_error());
      nb_clear_error();
      free(O);
      break;
    }
    double e_ref = gs_err(O, ref, rows, nrow, N), e_0 = i ? gs_rel(O, O0, M * N) : 0;
    NBT_CHECK(e_ref <= 1e-2, "%s: relative error vs float64 %g", name, e_ref);
    int kern = gt_pingpong(i, M, N, K);
    if (bits && gt_whole_tiles(i) && kseen[kern])
      NBT_CHECK(kbits[kern] && memcmp(kbits[kern], i ? bitsi : bits0, bytes) == 0,
                "%s: the bits of the first whole-tile candidate of its kernel (%s)", name,
                kern ? "ping-pong" : "cooperative");
    else if (i)
      NBT_CHECK(e_0 <= gt_unit(dt), "%s: differs from candidate 0 by %g (more than rounding)", name, e_0);
    if (bits && gt_whole_tiles(i) && !kseen[kern] && kbits[kern]) {
      memcpy(kbits[kern], i ? bitsi : bits0, bytes);
      kseen[kern] = 1;
    }
    if (getenv("NABLA_TEST_VERBOSE")) printf("  %-70s ref %.2e  cand0 %.2e\n", name, e_ref, e_0);
    if (i) free(O);
    else O0 = O;
  }
  nb_tune_force(-1);
  gt_backend(0);
  free(A); free(B); free(O0); free(ref); free(rows); free(bits0); free(bitsi); free(kbits[0]); free(kbits[1]);
  nb_scope_end();
}

/* Bytes of out on the host (malloc'd; NULL on failure). */
static char *gt_bytes(const nb_tensor *t) {
  size_t n = t ? (size_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t)) : 0;
  char *p = t ? malloc(n) : NULL;
  if (p && nb_to_host(t, p, n) != NB_OK) {
    free(p);
    p = NULL;
  }
  return p;
}

int tune_lines(const char *path, const char *text) {
  FILE *f = fopen(path, "r");
  char line[512];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += strstr(line, text) != NULL;
  if (f) fclose(f);
  return n;
}

#ifdef NABLA_HAVE_CUDA
/* out = out + a @ b through nb_cuda_gemm_ex with c the output itself, against
 * float64; *launched: own-kernel launches it took. */
static void gt_inplace(int64_t M, int64_t N, int64_t K, uint64_t seed, int64_t *launched) {
  nb_scope_begin();
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, NB_BF16, 0, &ga), *b = gs_operand(seed + 1, K, N, NB_BF16, 1, &gb);
  nb_tensor *c0 = randn(seed + 2, 2, (int64_t[]){M, N}, NB_F32), *out = gpu(c0);
  nb_kview ko, ka, kb;
  nb_kview_of(out, &ko);
  nb_kview_of(ga, &ka);
  nb_kview_of(gb, &kb);
  nb_gemm_epilogue ep = {NULL, &ko, NULL, 1.0f, 1.0f, 0};
  int64_t n0 = gs_launches();
  nb_status st = nb_cuda_gemm_ex(&ko, &ka, &kb, &ep);
  *launched = gs_launches() - n0;
  double *A = nbt_f64(a), *B = nbt_f64(b), *C = nbt_f64(c0), *O = nbt_f64(out);
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  for (int64_t i = 0; i < nrow; i++)
    for (int64_t j = 0; j < N; j++) ref[i * N + j] += C[rows[i] * N + j];
  double e = st == NB_OK ? gs_err(O, ref, rows, nrow, N) : INFINITY;
  NBT_CHECK(e <= 1e-4, "gemm tune: out += a @ b in place (c is out), tuned: relative error %g (%s)", e,
            st ? nb_last_error() : "");
  nb_clear_error();
  free(A); free(B); free(C); free(O); free(ref); free(rows);
  nb_scope_end();
}
#endif

int tune_cache_begin(tune_cache *t, const char *what) {
  const char *e1 = getenv("NABLA_AUTOTUNE"), *e2 = getenv("NABLA_AUTOTUNE_CACHE");
  snprintf(t->dir, sizeof t->dir, "/tmp/nabla-tune-XXXXXX");
  if (!mkdtemp(t->dir)) {
    NBT_CHECK(0, "%s: mkdtemp failed", what);
    return 0;
  }
  t->old_on = e1 ? strdup(e1) : NULL;
  t->old_path = e2 ? strdup(e2) : NULL;
  snprintf(t->path, sizeof t->path, "%s/autotune.txt", t->dir);
  setenv("NABLA_AUTOTUNE_CACHE", t->path, 1);
  unsetenv("NABLA_AUTOTUNE");
  nb_tune_reset();
  return 1;
}

void tune_cache_end(tune_cache *t) {
  if (t->old_on) setenv("NABLA_AUTOTUNE", t->old_on, 1);
  else unsetenv("NABLA_AUTOTUNE");
  if (t->old_path) setenv("NABLA_AUTOTUNE_CACHE", t->old_path, 1);
  else unsetenv("NABLA_AUTOTUNE_CACHE");
  free(t->old_on);
  free(t->old_path);
  nb_tune_reset();
  remove(t->path);
  rmdir(t->dir);
}

/* NABLA_AUTOTUNE with the cache in a temporary directory. */
static void gt_cache(uint64_t seed) {
  tune_cache tc;
  if (!tune_cache_begin(&tc, "gemm tune")) return;
  nb_scope_begin();
  /* the split-K shape, A transposed: key .../gemm_sm90/bf16/TN/1024x1024x8192 */
  int64_t M = 1000, N = 520, K = 4136;
  const char *key = "/gemm_sm90/bf16/TN/1024x1024x8192\t";
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, NB_BF16, 1, &ga), *b = gs_operand(seed + 1, K, N, NB_BF16, 0, &gb);
  double *A = nbt_f64(a), *B = nbt_f64(b);
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  gt_backend(1);
  int64_t n0 = gs_launches(), dev = n0 >= 0; /* the own kernel runs here */
  nb_tensor *off = nb_matmul(ga, gb);
  if (dev) NBT_CHECK(gs_launches() == n0 + 1, "gemm tune: tuning off: one launch, no timing");
  NBT_CHECK(access(tc.path, F_OK) != 0, "gemm tune: tuning off writes no cache file");
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  n0 = gs_launches();
  nb_tensor *tuned = nb_matmul(ga, gb);
  int64_t tuning = gs_launches() - n0;
  if (dev) {
    NBT_CHECK(tuning > 1, "gemm tune: NABLA_AUTOTUNE=1 times the candidates (%lld launches)", (long long)tuning);
    NBT_CHECK(tune_lines(tc.path, key) == 1, "gemm tune: one cache line for %s in %s", key, tc.path);
  }
  double *O = tuned ? nbt_f64(tuned) : NULL, *F = off ? nbt_f64(off) : NULL;
  double e_ref = O ? gs_err(O, ref, rows, nrow, N) : INFINITY, e_off = O && F ? gs_rel(O, F, M * N) : INFINITY;
  NBT_CHECK(e_ref <= 1e-2, "gemm tune: tuned product vs float64 %g (%s)", e_ref, O ? "" : nb_last_error());
  NBT_CHECK(e_off <= gt_unit(NB_BF16), "gemm tune: tuned vs untuned differ by %g (more than rounding)", e_off);
  nb_clear_error();
  /* as a new process would: the table is forgotten, the file read back */
  char *tb = gt_bytes(tuned);
  for (int on = 1; on >= 0; on--) {
    if (on) setenv("NABLA_AUTOTUNE", "1", 1);
    else unsetenv("NABLA_AUTOTUNE");
    nb_tune_reset();
    n0 = gs_launches();
    char *rb = gt_bytes(nb_matmul(ga, gb));
    if (dev) {
      NBT_CHECK(gs_launches() == n0 + 1, "gemm tune: reloaded choice (tuning %s): one launch, no timing",
                on ? "on" : "off");
      NBT_CHECK(tb && rb && !memcmp(tb, rb, (size_t)(M * N) * 2),
                "gemm tune: reloaded choice (tuning %s): the tuned call's bits", on ? "on" : "off");
    }
    free(rb);
  }
  free(tb);
#ifdef NABLA_HAVE_CUDA
  if (dev) {
    /* a fused call of the same problem shares the plain product's choice */
    setenv("NABLA_AUTOTUNE", "1", 1);
    nb_tune_reset();
    nb_tensor *fo = nb_empty(2, (int64_t[]){M, N}, NB_BF16, G);
    nb_kview ko, ka, kb;
    nb_kview_of(fo, &ko);
    nb_kview_of(ga, &ka);
    nb_kview_of(gb, &kb);
    nb_gemm_epilogue ep = {NULL, NULL, NULL, 0.5f, 0.0f, 1};
    n0 = gs_launches();
    NBT_CHECK(nb_cuda_gemm_ex(&ko, &ka, &kb, &ep) == NB_OK && gs_launches() == n0 + 1 &&
                  tune_lines(tc.path, "/gemm_sm90/") == 1,
              "gemm tune: a fused call shares the plain product's cached choice (%s)", nb_last_error());
    nb_clear_error();
    /* a new problem, fused, its c its own output (f32): tuned into scratch */
    int64_t launched = 0;
    gt_inplace(520, 1032, 776, seed + 7, &launched);
    NBT_CHECK(launched > 1 && tune_lines(tc.path, "/gemm_sm90/bf16-f32/NT/1024x2048x1024\t") == 1,
              "gemm tune: the fused f32 call tuned (%lld launches) and wrote its line", (long long)launched);
  }
#endif
  gt_backend(0);
  free(A); free(B); free(ref); free(rows); free(O); free(F);
  nb_scope_end();
  tune_cache_end(&tc);
}

void test_gemm_tune(void) {
  uint64_t seed = 15000;
  /* 17 x 9 = 153 tiles, more than any H100's SMs, 9 k-tiles: the heuristic runs the ping-pong
   * kernel (17 x 18 = 306 tiles of 128 x 128); the cooperative candidates share their bits */
  gt_case(2176, 2304, 520, NB_BF16, 0, 1, 1, seed += 2);
  /* 8 x 3 tiles over 65 k-tiles: split-K (4 parts) by default; TN, tails in M, N, K */
  gt_case(1000, 520, 4136, NB_BF16, 1, 0, 0, seed += 2);
  /* 8 x 18 = 144 tiles over 16 k-tiles (M, N, K tails): one full wave on 132 SMs, then dpsk
   * splits the 12 tail tiles (the first two tile columns, the partial last tile row among
   * them) over 48 CTAs */
  gt_case(1000, 4400, 1000, NB_BF16, 1, 0, 0, seed += 2);
  /* 6 x 12 = 72 tiles of 62 k-tiles, as many tiles as the MLP weight gradients (tails in M, N,
   * K): split-sync runs one main per tile, 60 spares with one whole rest each and the last 12
   * tiles' rests in 5 pieces (on 132 SMs) */
  gt_case(760, 3000, 3950, NB_BF16, 1, 0, 0, seed += 2);
#ifdef NABLA_HAVE_CUDA
  { /* the split-sync candidate ran split-sync there (not its data-parallel fallback) */
    nb_cuda_info info;
    nb_gemm_own_schedule sc;
    int sy = -1;
    for (int i = 0; i < gt_ncand(); i++)
      if (strcmp(gt_name(i), "split-sync") == 0) sy = i;
    if (G.type != NB_CPU && nb_cuda_device_info(G.index, &info) == NB_OK && info.n_sm == 132)
      NBT_CHECK(sy > 0 && nb_cuda_gemm_own_schedule(sy, 760, 3000, 3950, info.n_sm, &sc) && sc.sync_q == 1,
                "gemm tune 760x3000x3950 on 132 SMs: split-sync's layout (q 1)");
  }
#endif
  if (!quick) {
    gt_case(1000, 1000, 64, NB_F16, 0, 0, 0, seed += 2); /* one k-tile: forced stream-K has empty ranges */
    gt_case(2304, 768, 4096, NB_F16, 1, 1, 0, seed += 2); /* TT, 18 tile rows: every raster group differs */
  }
#ifdef NABLA_HAVE_CUDA
  /* fused epilogues under every candidate (own path against cuBLASLt + epilogue kernel) */
  for (int i = 0; G.type != NB_CPU && i < gt_ncand(); i++) {
    nb_tune_force(i);
    ge_case(1000, 520, 4136, NB_BF16, NB_BF16, 1, 0, GE_BIAS | GE_GELU | GE_RESID, seed++);
    ge_case(2176, 2304, 520, NB_BF16, NB_F32, 0, 1, GE_BIAS | GE_AUX, seed++);
    /* every epilogue at once, f16, NN, M and N tails (3 x 8 tiles of 128 x 128) */
    ge_case(264, 1000, 136, NB_F16, NB_F16, 0, 0, GE_BIAS | GE_GELU | GE_RESID | GE_AUX, seed++);
  }
  nb_tune_force(-1);
  /* the heuristic (nothing forced) on a product it gives the ping-pong kernel: 12 x 12 = 144
   * tiles of 128 x 128 (M, N tails) over 11 k-tiles (K tail), every epilogue, bf16 out */
  if (G.type != NB_CPU && gs_launches() >= 0) {
    NBT_CHECK(gt_pingpong(0, 1500, 1480, 700), "gemm tune: 1500x1480x700 takes the ping-pong kernel by default");
    ge_case(1500, 1480, 700, NB_BF16, NB_BF16, 0, 0, GE_BIAS | GE_GELU | GE_RESID | GE_AUX, seed++);
    ge_case(1500, 1480, 700, NB_BF16, NB_F32, 1, 1, GE_BIAS | GE_GELU, seed++);
  }
#endif
  nb_tune_reset();
  gt_cache(seed + 10);
}
