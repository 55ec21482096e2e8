/* The sm_90a flash attention backward (cuda_attention_sm90_bwd.cu) on a
 * Hopper GPU: each case runs forward and backward with the kernels on,
 * twice (the same bits), then with NABLA_ATTENTION_SM90_BWD=0 (the mma.sync
 * backward; the forward is the same in both), and compares the output and
 * the three gradients, in norm, with the CPU's fused attention in float64
 * from the same rounded inputs, and the two backwards with each other. On
 * a compute capability 9.0 device the launch counter must show that the
 * kernels ran where they apply (bf16, f16; D 64 and 128; views TMA can
 * describe) and not where they do not (D 96, rows of stride D + 1) nor with
 * the switch off. Cases: T in {1, 7, 64, 129, 1000, 4097}, Lq != Lk both
 * ways (causal aligned top-left), causal and not, several (batch, head)
 * pairs, q, k, v as (B, H, T, D) views of a packed (B, T, 3, H, D)
 * projection (their gradients strided views of one buffer), more blocks
 * than SMs. The work order in sections of 3 batch indices
 * (NABLA_ATTENTION_SM90_SECTION=3, forward and backward, with
 * NABLA_ATTENTION_SM90_TAIL=0.05: a causal order's last section of a few
 * batch indices) gives the same bits as the default's L2-sized sections
 * (the forward's stream-K tail, which cuts items where the order puts
 * them, is off here, NABLA_ATTENTION_SM90_STREAMK=0: test_attention_sm90
 * covers it).
 * The fused path (one kernel for dK, dV and dQ's partial sums, dQ by bulk
 * reduce-add) runs every case too,
 * with NABLA_ATTN_BWD=fused: compared with float64 and with the split
 * (default) path's results, its launch counter moved where the kernels
 * apply; on cases under 1000 rows also through nb_set_deterministic(0)
 * (the fused path at D 128, the split one at D 64, where it is faster;
 * compared with float64, and at D 64 bit for bit with the default), and nb_set_deterministic(0) with
 * NABLA_ATTN_BWD=split stays on the split path. At D 64 the split dK/dV
 * kernel takes 128-query tiles (the fused one 64): the cases' Lq around
 * multiples of 64 and 128 cover a last tile with one or both 64-row halves
 * past Lq. The split kernels are persistent (CTAs take items from a
 * ticket counter): every case also runs with NABLA_ATTENTION_SM90_BWD_PERSISTENT
 * =0 (one CTA per item, as before) and =3 (a grid of at most 3 CTAs, so
 * that even small cases take several items per CTA: both item buffers, the
 * ring running on across items; the items without query tiles come last
 * in a section, so none is followed by one with tiles here),
 * each compared with float64 and bit for bit with the default. The split
 * path's dQ kernel computes the statistics (delta, lse log2 e) itself at
 * D 64 (o's tile by TMA with Q and dO; its launch counter says it did);
 * the pre-pass's (NABLA_ATTENTION_SM90_BWD_FOLD=0) give the same bits, as
 * do sections of one batch index on 3 CTAs and ordinary launches instead
 * of programmatic dependent ones (NABLA_ATTENTION_SM90_PDL=0).
 * The fused path runs with the switch at 0 and at 3 too (its kernel is
 * persistent at D 64): its output and dK, dV bit for bit with the fused
 * default, dQ (whose reduce order varies) against float64 and the fused
 * default in norm. At D 128 the fused kernel zeroes and converts its f32
 * dQ accumulator itself: also run with NABLA_ATTENTION_SM90_BWD_ACC=0 (a
 * memset before, a conversion after; with dK and dV by 4-byte pair stores,
 * NABLA_ATTENTION_SM90_BWD_STORE16=0) and, counting the query tiles the
 * kernel converted, =2 in sections of one batch index; against float64,
 * dK and dV bit for bit, and some tile converted in the kernel over all
 * the cases. Before each fused run the allocator's blocks of the
 * gradients' sizes are filled with NaN, so a query tile left unwritten
 * fails the comparison.
 * NABLA_TEST_QUICK=1 (the sanitizers) keeps the cases under 1000 rows.
 * Without a CUDA device: skipped (77). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_sm90_testutil.h"
#include "testutil.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_attention_sm90_bwd.h"
#endif

static int64_t launches(void) { return SM90_COUNT(nb_cuda_attn_sm90_bwd_launches); }
static int64_t fold_launches(void) { return SM90_COUNT(nb_cuda_attn_sm90_bwd_fold_launches); }
/* The query tiles the fused kernel converted itself and all of them (-1: not a 9.0 device). */
static void acc_units(int64_t *in_kernel, int64_t *all) {
#ifdef NABLA_HAVE_CUDA
  nb_cuda_attn_sm90_bwd_acc_units(0, in_kernel, all);
#else
  *in_kernel = *all = -1;
#endif
}
static int64_t fused_launches(void) { return SM90_COUNT(nb_cuda_attn_sm90_bwd_fused_launches); }

/* Whether runs a and b have the same output and dK, dV bits (dQ left out:
 * the fused path's reduce order varies): gradients 1 and 2, or for a
 * packed (B, T, 3, H, D) case the elements of gradient 0 at index 1 and 2
 * of its axis of 3. */
static int same_kv_bits(const scase *c, const sresult *a, const sresult *b, int n) {
  if (!a->y || !b->y || memcmp(a->y, b->y, (size_t)a->ny * sizeof(double))) return 0;
  if (n == 3) return !memcmp(a->g[1], b->g[1], (size_t)a->ng[1] * sizeof(double)) &&
                     !memcmp(a->g[2], b->g[2], (size_t)a->ng[2] * sizeof(double));
  for (int64_t e = 0; e < a->ng[0]; e++)
    if ((e / (c->H * c->D)) % 3 && memcmp(&a->g[0][e], &b->g[0][e], sizeof(double))) return 0;
  return 1;
}

/* The CUDA caching allocator hands out the last freed block of a size
 * first: blocks of the gradients' sizes full of NaN, so that a row of dq
 * that no kernel writes shows instead of keeping an earlier run's values. */
static void poison(const scase *c, nb_dtype dt) {
  const int64_t grad[4] = {c->B, c->H, c->Lq, c->D}, packed[5] = {c->B, c->Lq, 3, c->H, c->D};
  nb_tensor *t[16];
  for (int i = 0; i < 16; i++)
    t[i] = c->packed == 1 && i % 2 ? nb_full(5, packed, NAN, dt, GPU) : nb_full(4, grad, NAN, dt, GPU);
  for (int i = 0; i < 16; i++) nb_release(t[i]);
}

/* The fused path's runs of a case: NABLA_ATTN_BWD=fused against float64
 * and the split path's result; with NABLA_ATTENTION_SM90_BWD_PERSISTENT=0
 * and =3 (the fused kernel is persistent at D 64) against float64, against
 * the default's dQ in norm and its dK, dV bit for bit; and (small cases)
 * nb_set_deterministic(0) alone, then with NABLA_ATTN_BWD=split (the split
 * path). */
static void check_fused(const scase *c, int causal, const sinputs *s, nb_dtype dt, const sresult *split,
                        const sresult *ref) {
  const char *name = s->name;
  const int n = s->n, small = c->Lq < 1000 && c->Lk < 1000;
  const int64_t f0 = fused_launches(), l0 = launches();
  setenv("NABLA_ATTN_BWD", "fused", 1);
  poison(c, dt);
  sresult fus = run(c, causal, s->in, n, dt, GPU);
  unsetenv("NABLA_ATTN_BWD");
  const int64_t f1 = fused_launches(), l1 = launches();
  if (f0 >= 0) {
    NBT_CHECK(f1 == f0 + (c->runs ? 1 : 0) && l1 == l0 + (c->runs ? 1 : 0),
              "%s: NABLA_ATTN_BWD=fused ran the fused backward %lld times of %lld (%d expected)", name,
              (long long)(f1 - f0), (long long)(l1 - l0), c->runs ? 1 : 0);
  }
  compare(name, "float64 (fused)", &fus, ref, ref, n, s->tol);
  compare(name, "the split backward (fused)", &fus, split, ref, n, s->tol);
  static const char *const grids[2] = {"0", "3"}; /* one CTA per item; at most 3 CTAs */
  for (int i = 0; i < 2; i++) {
    setenv("NABLA_ATTN_BWD", "fused", 1);
    setenv("NABLA_ATTENTION_SM90_BWD_PERSISTENT", grids[i], 1);
    sresult gr = run(c, causal, s->in, n, dt, GPU);
    unsetenv("NABLA_ATTENTION_SM90_BWD_PERSISTENT");
    unsetenv("NABLA_ATTN_BWD");
    char what[96];
    snprintf(what, sizeof what, "float64 (fused, NABLA_ATTENTION_SM90_BWD_PERSISTENT=%s)", grids[i]);
    compare(name, what, &gr, ref, ref, n, s->tol);
    snprintf(what, sizeof what, "the fused default (NABLA_ATTENTION_SM90_BWD_PERSISTENT=%s)", grids[i]);
    compare(name, what, &gr, &fus, ref, n, s->tol);
    NBT_CHECK(same_kv_bits(c, &fus, &gr, n), "%s: fused, NABLA_ATTENTION_SM90_BWD_PERSISTENT=%s: the output or dK, "
              "dV differ from the fused default", name, grids[i]);
    atest_free(&gr);
  }
  /* D 128: the accumulator zeroed before the kernel and converted after
   * it (NABLA_ATTENTION_SM90_BWD_ACC=0), with dK and dV by 4-byte pair
   * stores (NABLA_ATTENTION_SM90_BWD_STORE16=0), then by the kernel itself
   * in sections of one batch index, 2 query tiles a warp at most, counted */
  setenv("NABLA_ATTN_BWD", "fused", 1);
  setenv("NABLA_ATTENTION_SM90_BWD_ACC", "0", 1);
  setenv("NABLA_ATTENTION_SM90_BWD_STORE16", "0", 1);
  poison(c, dt);
  sresult sep = run(c, causal, s->in, n, dt, GPU);
  unsetenv("NABLA_ATTENTION_SM90_BWD_STORE16");
  setenv("NABLA_ATTENTION_SM90_BWD_ACC", "2", 1);
  setenv("NABLA_ATTENTION_SM90_SECTION", "1", 1);
  setenv("NABLA_ATTENTION_SM90_TAIL", "0", 1);
  int64_t u0, a0, u1, a1;
  acc_units(&u0, &a0);
  poison(c, dt);
  sresult sec1 = run(c, causal, s->in, n, dt, GPU);
  acc_units(&u1, &a1);
  unsetenv("NABLA_ATTENTION_SM90_SECTION");
  unsetenv("NABLA_ATTENTION_SM90_TAIL");
  unsetenv("NABLA_ATTENTION_SM90_BWD_ACC");
  unsetenv("NABLA_ATTN_BWD");
  compare(name, "float64 (fused, NABLA_ATTENTION_SM90_BWD_ACC=0, STORE16=0)", &sep, ref, ref, n, s->tol);
  compare(name, "float64 (fused, sections of one batch index)", &sec1, ref, ref, n, s->tol);
  NBT_CHECK(same_kv_bits(c, &fus, &sep, n) && same_kv_bits(c, &fus, &sec1, n),
            "%s: fused, the accumulator zeroed and converted outside the kernel (and pair stores) or in "
            "sections of one batch index: the output or dK, dV differ from the fused default", name);
  if (u0 >= 0) {
    const int64_t tiles = c->runs && c->D == 128 ? c->B * c->H * ((c->Lq + 127) / 128 * 2) : 0;
    NBT_CHECK(a1 - a0 == tiles, "%s: the fused kernel converted %lld of %lld query tiles (%lld expected in all)",
              name, (long long)(u1 - u0), (long long)(a1 - a0), (long long)tiles);
  }
  atest_free(&sep);
  atest_free(&sec1);
  if (f0 >= 0) {
    const int64_t f4 = fused_launches();
    NBT_CHECK(f4 == f1 + (c->runs ? 4 : 0), "%s: the fused backward ran %lld times in four calls", name,
              (long long)(f4 - f1));
  }
  atest_free(&fus);
  if (!small) return;
  const int64_t f5 = fused_launches();
  nb_set_deterministic(0);
  sresult nd = run(c, causal, s->in, n, dt, GPU);
  const int64_t f2 = fused_launches();
  setenv("NABLA_ATTN_BWD", "split", 1);
  sresult sp = run(c, causal, s->in, n, dt, GPU);
  unsetenv("NABLA_ATTN_BWD");
  nb_set_deterministic(1);
  const int64_t f3 = fused_launches();
  if (f0 >= 0) {
    /* the faster path: fused at D 128, split at D 64 */
    NBT_CHECK(f2 == f5 + (c->runs && c->D == 128 ? 1 : 0), "%s: nb_set_deterministic(0) took the fused backward "
              "%lld times (%d expected: D %lld)", name, (long long)(f2 - f5), c->runs && c->D == 128 ? 1 : 0,
              (long long)c->D);
    NBT_CHECK(f3 == f2, "%s: NABLA_ATTN_BWD=split still took the fused backward", name);
  }
  compare(name, "float64 (nondeterministic)", &nd, ref, ref, n, s->tol);
  if (c->D == 64) /* the split path, which gives the same bits every run */
    NBT_CHECK(same_bits(split, &nd, n), "%s: nb_set_deterministic(0) at D 64 differs from the default", name);
  NBT_CHECK(same_bits(split, &sp, n), "%s: NABLA_ATTN_BWD=split differs from the default", name);
  atest_free(&nd);
  atest_free(&sp);
}

static void check_case(const scase *c, int causal, nb_dtype dt, uint64_t seed) {
  sinputs s;
  sm90_inputs(&s, "sm90 bwd", c, causal, dt, seed);
  const char *name = s.name;
  nb_tensor **in = s.in, **rounded = s.rounded;
  const int n = s.n;
  const int64_t l0 = launches(), d0 = fold_launches();
  unsetenv("NABLA_ATTENTION_SM90_BWD"); /* the default */
  sresult got = run(c, causal, in, n, dt, GPU), again = run(c, causal, in, n, dt, GPU);
  const int64_t d1 = fold_launches();
  setenv("NABLA_ATTENTION_SM90_SECTION", "3", 1);
  setenv("NABLA_ATTENTION_SM90_TAIL", "0.05", 1); /* causal: a last section of a few batch indices */
  sresult sec = run(c, causal, in, n, dt, GPU);
  unsetenv("NABLA_ATTENTION_SM90_SECTION");
  unsetenv("NABLA_ATTENTION_SM90_TAIL");
  setenv("NABLA_ATTENTION_SM90_BWD_PERSISTENT", "0", 1); /* one CTA per item */
  sresult each = run(c, causal, in, n, dt, GPU);
  setenv("NABLA_ATTENTION_SM90_BWD_PERSISTENT", "3", 1); /* at most 3 CTAs */
  sresult three = run(c, causal, in, n, dt, GPU);
  /* on 3 CTAs with sections of one batch index (an item with query tiles
   * follows one without, where causal Lk > Lq gives those) */
  setenv("NABLA_ATTENTION_SM90_SECTION", "1", 1);
  setenv("NABLA_ATTENTION_SM90_TAIL", "0", 1); /* every section one batch index */
  sresult one = run(c, causal, in, n, dt, GPU);
  unsetenv("NABLA_ATTENTION_SM90_SECTION");
  unsetenv("NABLA_ATTENTION_SM90_TAIL");
  unsetenv("NABLA_ATTENTION_SM90_BWD_PERSISTENT");
  /* the pre-pass's statistics instead of the dQ kernel's own */
  const int64_t d2 = fold_launches();
  setenv("NABLA_ATTENTION_SM90_BWD_FOLD", "0", 1);
  sresult pre = run(c, causal, in, n, dt, GPU);
  unsetenv("NABLA_ATTENTION_SM90_BWD_FOLD");
  const int64_t d3 = fold_launches();
  setenv("NABLA_ATTENTION_SM90_PDL", "0", 1); /* ordinary launches, forward and backward */
  sresult pdl = run(c, causal, in, n, dt, GPU);
  unsetenv("NABLA_ATTENTION_SM90_PDL");
  const int64_t l1 = launches();
  setenv("NABLA_ATTENTION_SM90_BWD", "0", 1);
  sresult mma = run(c, causal, in, n, dt, GPU);
  const int64_t l2 = launches();
  unsetenv("NABLA_ATTENTION_SM90_BWD");
  sresult ref = run(c, causal, rounded, n, NB_F64, CPU);
  if (l0 >= 0) {
    NBT_CHECK(c->runs ? l1 == l0 + 8 : l1 == l0, "%s: the sm_90a backward ran %lld times in eight calls (%d "
              "expected)", name, (long long)(l1 - l0), c->runs ? 8 : 0);
    /* the dQ kernel's own statistics: at D 64 (o, the forward's output, is
     * contiguous: its TMA map exists), never with the switch at 0 */
    const int fold = c->runs && c->D == 64;
    NBT_CHECK(d1 == d0 + (fold ? 2 : 0), "%s: the dQ kernel computed the statistics in %lld of two calls (%d "
              "expected: D %lld)", name, (long long)(d1 - d0), fold ? 2 : 0, (long long)c->D);
    NBT_CHECK(d3 == d2, "%s: NABLA_ATTENTION_SM90_BWD_FOLD=0 still skipped the pre-pass", name);
    NBT_CHECK(l2 == l1, "%s: NABLA_ATTENTION_SM90_BWD=0 still ran it", name);
  }
  const double tol = s.tol;
  compare(name, "float64", &got, &ref, &ref, n, tol);
  compare(name, "the mma.sync backward", &got, &mma, &ref, n, tol);
  NBT_CHECK(same_bits(&got, &again, n), "%s: two runs differ", name);
  NBT_CHECK(same_bits(&got, &sec, n), "%s: sections of 3 batch indices differ from the default order", name);
  compare(name, "float64 (a CTA per item)", &each, &ref, &ref, n, tol);
  compare(name, "float64 (3 CTAs)", &three, &ref, &ref, n, tol);
  NBT_CHECK(same_bits(&got, &each, n), "%s: NABLA_ATTENTION_SM90_BWD_PERSISTENT=0 differs from the default", name);
  NBT_CHECK(same_bits(&got, &three, n), "%s: NABLA_ATTENTION_SM90_BWD_PERSISTENT=3 differs from the default", name);
  NBT_CHECK(same_bits(&got, &one, n), "%s: NABLA_ATTENTION_SM90_SECTION=1 on 3 CTAs differs from the default",
            name);
  NBT_CHECK(same_bits(&got, &pre, n), "%s: the pre-pass's statistics (NABLA_ATTENTION_SM90_BWD_FOLD=0) differ "
            "from the default", name);
  NBT_CHECK(same_bits(&got, &pdl, n), "%s: ordinary launches (NABLA_ATTENTION_SM90_PDL=0) differ from the "
            "default", name);
  check_fused(c, causal, &s, dt, &got, &ref);
  atest_free(&sec);
  atest_free(&each);
  atest_free(&three);
  atest_free(&pre);
  atest_free(&one);
  atest_free(&pdl);
  atest_free(&got);
  atest_free(&again);
  atest_free(&mma);
  atest_free(&ref);
  sm90_inputs_free(&s);
}

/* On a 9.0 device the fused kernel must have converted some query tiles
 * itself (sections of one batch index complete while later ones run in
 * the cases of 70 and 140 batch indices). */
static void some_in_kernel(void) {
  int64_t u, a;
  acc_units(&u, &a);
  if (u >= 0) NBT_CHECK(u > 0, "the fused kernel converted %lld of %lld query tiles itself", (long long)u, (long long)a);
}

/* Rows whose every score is far below zero: q = 4 + noise, k = -4 + noise
 * (unit normal noise) in every column, so that scale q.k is about -128 at
 * D 64 (-181 at D 128), spread 6, and lse below -100. Lk = 200 leaves the
 * last 128-key block 56 keys past Lk, zero rows of K in the fused kernel,
 * where exp(-lse) overflows: their P must be 0 or dS K gives NaN in dq.
 * Fused and split paths, causal and not, against the float64 CPU run.
 * dq = scale dS K where each row of dS sums to 0, so K's common -4 cancels
 * in exact arithmetic but not once dS is rounded to bf16 for the product:
 * the error grows with the common part over the noise (0.1 at 35 to 1, in
 * any kernel that rounds dS, as FlashAttention's do), about 0.012 here;
 * dq gets three times the tolerance, the rest the usual one. */
static void check_far_scores(void) {
  for (int64_t D = 64; D <= 128; D += 64)
    for (int causal = 0; causal < 2; causal++)
      for (int fused = 0; fused < 2; fused++) {
        const scase c = {1, 2, 200, 200, D, 0, 1};
        sinputs s;
        sm90_inputs(&s, fused ? "sm90 bwd far scores (fused)" : "sm90 bwd far scores", &c, causal, NB_BF16,
                    4242 + (uint64_t)D);
        nb_scope_begin();
        for (int i = 0; i < 2; i++) { /* q and k: +-4 plus the noise, rounded again */
          nb_tensor *x = nb_keep(nb_add_scalar(s.in[i], i ? -4.0 : 4.0));
          nb_release(s.in[i]);
          nb_release(s.rounded[i]);
          s.in[i] = x;
          s.rounded[i] = nb_keep(nb_cast(nb_cast(x, NB_BF16), NB_F64));
        }
        nb_scope_end();
        if (fused) setenv("NABLA_ATTN_BWD", "fused", 1);
        sresult got = run(&c, causal, s.in, s.n, NB_BF16, GPU);
        unsetenv("NABLA_ATTN_BWD");
        sresult ref = run(&c, causal, s.rounded, s.n, NB_F64, CPU);
        int finite = got.y != NULL;
        for (int i = 0; i < s.n && finite; i++)
          for (int64_t e = 0; e < got.ng[i] && finite; e++) finite = isfinite(got.g[i][e]);
        NBT_CHECK(finite, "%s: a gradient element is not finite", s.name);
        const double gtol[3] = {3 * s.tol, s.tol, s.tol}; /* dq, dk, dv */
        compare_at(s.name, "float64", &got, &ref, &ref, s.n, s.tol, gtol);
        atest_free(&got);
        atest_free(&ref);
        sm90_inputs_free(&s);
      }
}

static void after_cases(void) {
  some_in_kernel();
  check_far_scores();
}

int main(void) {
  setenv("NABLA_ATTENTION_SM90_STREAMK", "0", 1); /* the forward's items whole, whatever the section */
  return sm90_run_cases("test_attention_sm90_bwd", launches, check_case, after_cases);
}
