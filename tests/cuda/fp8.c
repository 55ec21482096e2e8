/* ==== fp8 casts and nb_scaled_mm (src/backend/cuda/gemm_sm90_fp8.cu) ============
 * Casts: all 256 codes of each format decoded on the device into f64/f32/f16/
 * bf16 equal the CPU's values (NaN as NaN: the device's NaN sign may differ);
 * f32 and f64 values at every code, midpoint and neighbour encoded on the
 * device give the CPU's codes. scaled_mm: CUDA against the CPU (float64 sums,
 * tests/test_fp8.c checks it against float64) on odd sizes, every format mix,
 * bf16/f16/f32 out, scales != 1; NT operands (the own sm_90a kernel on a 9.0
 * device, under every schedule candidate, forced one after the other: its
 * launch count must grow by one each) and NN ones (the portable kernel), and
 * the NT ones again under NABLA_SCALED_MM=portable. The device accumulates in
 * f32 (the CPU in f64), so results may differ by the f32 sum's rounding (the
 * bound below). Then exact cases: operands in {-1, 0, 1}, whose f32 sums
 * are exact integers, so every schedule must give s_a s_b sum exactly (to
 * 2^-16 of s_a s_b sum|ab|): a scale applied twice, or to a split tile's
 * partial sum as well as to the total, or missing, is off by 9% of a part;
 * on a multi-wave grid (stream-K ranges across tiles, an odd tile row count
 * for clusters of 2, M/N/K tails) and a split-K one, reference rows sampled;
 * and NABLA_AUTOTUNE=1 on an FP8 product (smm_tune). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "backend/autotune.h"
#include "cuda_test.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_gemm.h"
#endif

static int64_t f8_launches(void) {
#ifdef NABLA_HAVE_CUDA
  if (G.type == NB_CUDA) return nb_cuda_scaled_mm_own_launches(G.index);
#endif
  return -1;
}

/* Schedule candidates of the own kernel (shared with the bf16 GEMM); 1 without CUDA. */
static int f8_ncand(void) {
  int n = 1;
#ifdef NABLA_HAVE_CUDA
  while (nb_cuda_gemm_own_candidate(n)) n++;
#endif
  return n;
}
static const char *f8_cand(int i) {
#ifdef NABLA_HAVE_CUDA
  if (i >= 0) return nb_cuda_gemm_own_candidate(i);
#endif
  return i < 0 ? "unforced" : "default";
}

static int same_val(double a, double b) { return (a != a && b != b) || a == b; }

static void fp8_decode_cmp(nb_dtype f8) {
  uint8_t codes[256];
  for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
  nb_tensor *t = nb_from_buffer(codes, 1, (int64_t[]){256}, f8, NB_DEVICE_CPU);
  const nb_dtype to[4] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  for (int k = 0; k < 4; k++) {
    nb_tensor *c = nb_cast(nb_cast(t, to[k]), NB_F64);
    nb_tensor *g = nb_to_device(nb_cast(nb_cast(gpu(t), to[k]), NB_F64), NB_DEVICE_CPU);
    int bad = 0;
    for (int i = 0; i < 256 && c && g; i++)
      bad += !same_val(((double *)nb_data_ptr(c))[i], ((double *)nb_data_ptr(g))[i]);
    NBT_CHECK(c && g && bad == 0, "%s -> %s on the device: %d of 256 codes differ from the CPU",
              nb_dtype_name(f8), nb_dtype_name(to[k]), bad);
  }
}

static void fp8_encode_cmp(nb_dtype f8) {
  enum { N = 2048 };
  static float v[N];
  int n = 0, e4 = f8 == NB_F8E4M3;
  for (unsigned c = 0; c < 0x7f && n + 8 <= N; c++) {
    float lo = e4 ? nb_f8e4m3_to_f32((uint8_t)c) : nb_f8e5m2_to_f32((uint8_t)c);
    float hi = e4 ? (c == 0x7e ? 480.0f : nb_f8e4m3_to_f32((uint8_t)(c + 1)))
                  : (c >= 0x7b ? 65536.0f : nb_f8e5m2_to_f32((uint8_t)(c + 1)));
    if (lo != lo || isinf(lo)) continue;
    float mid = (lo + hi) / 2;
    float vs[4] = {lo, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
    for (int k = 0; k < 4; k++) v[n++] = vs[k], v[n++] = -vs[k];
  }
  float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, 3e38f, 464.0f, 470.0f, 61440.0f, 1e-45f};
  for (int k = 0; k < (int)(sizeof sp / sizeof *sp); k++) v[n++] = sp[k];
  nb_tensor *x = nb_from_buffer(v, 1, (int64_t[]){n}, NB_F32, NB_DEVICE_CPU);
  const nb_dtype from[4] = {NB_F32, NB_F64, NB_F16, NB_BF16};
  for (int k = 0; k < 4; k++) {
    nb_tensor *xs = nb_cast(x, from[k]);
    nb_tensor *c = nb_cast(nb_cast(xs, f8), NB_F64);
    nb_tensor *g = nb_to_device(nb_cast(nb_cast(gpu(xs), f8), NB_F64), NB_DEVICE_CPU);
    int bad = 0;
    for (int i = 0; i < n && c && g; i++)
      bad += !same_val(((double *)nb_data_ptr(c))[i], ((double *)nb_data_ptr(g))[i]);
    NBT_CHECK(c && g && bad == 0, "%s -> %s on the device: %d of %d values differ from the CPU",
              nb_dtype_name(from[k]), nb_dtype_name(f8), bad, n);
  }
}

/* A random (r, c) operand on the CPU: fp8 codes of normal values (magnitude
 * 2^-3 .. 2^3 so sums keep to f32's range), both signs. */
static nb_tensor *f8_operand(uint64_t seed, int64_t r, int64_t c, nb_dtype f8) {
  nb_tensor *x = randn(seed, 2, (int64_t[]){r, c}, NB_F32);
  return nb_cast(x, f8);
}

/* The candidates a case runs under: every one when the own kernel runs here
 * (forced with nb_tune_force), else one unforced run (-1). */
static int f8_first(int own) { return own ? 0 : -1; }
static int f8_last(int own) { return own ? f8_ncand() - 1 : -1; }
static void f8_force(int i) { nb_tune_force(i); }

static void smm_cmp(int64_t M, int64_t N, int64_t K, nb_dtype fa, nb_dtype fb, nb_dtype od, int nt) {
  nb_scope_begin();
  nb_tensor *a = f8_operand(M * 31 + K, M, K, fa);
  nb_tensor *w = nt ? f8_operand(N * 17 + K, N, K, fb) : f8_operand(N * 17 + K, K, N, fb);
  nb_tensor *b = nt ? nb_transpose(w, 0, 1) : w;
  nb_tensor *sa = nb_scalar(0.625, NB_F32, NB_DEVICE_CPU), *sb = nb_scalar(1.75, NB_F32, NB_DEVICE_CPU);
  nb_tensor *ref = nb_scaled_mm(a, b, sa, sb, od);
  nb_tensor *ga = gpu(a), *gw = gpu(w), *gb = nt ? nb_transpose(gw, 0, 1) : gw, *gsa = gpu(sa), *gsb = gpu(sb);
  /* bound per element: the tensor core's fp8 sums keep about 14 bits (the
   * H100's FP8 wgmma accumulates each k32 step's products into the f32
   * accumulator at reduced precision, as torch._scaled_mm's use_fast_accum
   * does; the H100 showed errors past 2^-16 of s_a s_b sum |a b| even at
   * K = 16, and up to 4.7 x 2^-14 at K = 128 with f32 out): 2^-13 of that
   * per k32 step, plus the output's ulp */
  nb_tensor *abs_ref = nb_scaled_mm(nb_cast(nb_abs(nb_cast(a, NB_F32)), fa),
                                    nb_cast(nb_abs(nb_cast(b, NB_F32)), fb), sa, sb, NB_F32);
  nb_tensor *r = nb_cast(ref, NB_F64), *ar = nb_cast(abs_ref, NB_F64);
  double half = od == NB_F32 ? ldexp(1, -24) : od == NB_F16 ? ldexp(1, -11) : ldexp(1, -8);
  double steps = (double)((K + 31) / 32);
  /* the own kernel takes NT operands with 16-byte rows on a 9.0 device */
  int own = nt && f8_launches() >= 0 && K % 16 == 0 && !getenv("NABLA_SCALED_MM");
  for (int c = f8_first(own); c <= f8_last(own); c++) {
    nb_scope_begin();
    f8_force(c);
    int64_t before = f8_launches();
    nb_tensor *out = nb_scaled_mm(ga, gb, gsa, gsb, od);
    int64_t after = f8_launches();
    f8_force(-1);
    char name[192];
    snprintf(name, sizeof name, "scaled_mm %lldx%lldx%lld %s x %s -> %s %s [%s]", (long long)M, (long long)N,
             (long long)K, nb_dtype_name(fa), nb_dtype_name(fb), nb_dtype_name(od), nt ? "NT" : "NN",
             f8_cand(c));
    nb_tensor *o = out ? nb_cast(nb_to_device(out, NB_DEVICE_CPU), NB_F64) : NULL;
    int bad = 0;
    double worst = 0; /* worst: error / (2^-14 s_a s_b sum|ab|) */
    for (int64_t i = 0; o && r && ar && i < M * N; i++) {
      double x = ((double *)nb_data_ptr(o))[i], y = ((double *)nb_data_ptr(r))[i];
      double acc = ldexp(((double *)nb_data_ptr(ar))[i], -14);
      double lim = 2 * steps * acc + 2 * half * fabs(y) + 1e-30; /* 2^-13 a step */
      bad += !(fabs(x - y) <= lim);
      if (acc > 0 && fabs(x - y) / acc > worst) worst = fabs(x - y) / acc;
    }
    if (getenv("NABLA_TEST_VERBOSE") || bad)
      printf("%s: largest error %.3g x 2^-14 s_a s_b sum|ab| (bound %.0f k32 steps)\n", name, worst, steps);
    NBT_CHECK(o && r && ar && bad == 0, "%s: %d of %lld outside the bound %s", name, bad, (long long)(M * N),
              o ? "" : nb_last_error());
    if (own)
      NBT_CHECK(after == before + 1, "%s: the sm_90a kernel ran (%lld launches)", name,
                (long long)(after - before));
    nb_scope_end();
  }
  nb_scope_end();
}

/* Operand values in {-1, 0, 1} (exact in both formats), from a seed. */
static int8_t *smm_unit(uint64_t seed, int64_t n) {
  int8_t *v = malloc((size_t)n);
  for (int64_t i = 0; v && i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = (int8_t)((int)((seed >> 33) % 3) - 1);
  }
  return v;
}

static nb_tensor *smm_f8(const int8_t *v, int64_t r, int64_t c, nb_dtype f8) {
  float *f = malloc((size_t)(r * c) * sizeof *f);
  for (int64_t i = 0; f && i < r * c; i++) f[i] = v[i];
  nb_tensor *t = f ? nb_cast(nb_from_buffer(f, 2, (int64_t[]){r, c}, NB_F32, NB_DEVICE_CPU), f8) : NULL;
  free(f);
  return t;
}

/* The exact case (see the header): a (M, K) @ w (N, K)^T with f32 out, under every
 * candidate; reference rows every M / 40 and the last, in integers. */
static void smm_exact(int64_t M, int64_t N, int64_t K, nb_dtype fa, nb_dtype fb, uint64_t seed) {
  if (f8_launches() < 0) return; /* the own kernel's schedules: a 9.0 device */
  nb_scope_begin();
  const double s = 0.625 * 1.75; /* exact in f32, as is s times an integer below 2^13 */
  int64_t step = M / 40 > 1 ? M / 40 : 1, nrow = (M - 1) / step + 1 + ((M - 1) % step != 0);
  int8_t *A = smm_unit(seed, M * K), *W = smm_unit(seed + 1, N * K);
  float *O = malloc((size_t)(M * N) * sizeof *O);
  int64_t *rows = malloc((size_t)nrow * sizeof *rows), *sum = malloc((size_t)(nrow * N) * sizeof *sum);
  int64_t *mag = malloc((size_t)(nrow * N) * sizeof *mag);
  int ready = A && W && O && rows && sum && mag;
  for (int64_t r = 0; ready && r < nrow; r++) {
    rows[r] = r == nrow - 1 ? M - 1 : r * step;
    for (int64_t j = 0; j < N; j++) {
      int64_t t = 0, m = 0;
      for (int64_t k = 0; k < K; k++) {
        int p = A[rows[r] * K + k] * W[j * K + k];
        t += p;
        m += p != 0;
      }
      sum[r * N + j] = t;
      mag[r * N + j] = m;
    }
  }
  nb_tensor *ga = ready ? gpu(smm_f8(A, M, K, fa)) : NULL, *gw = ready ? gpu(smm_f8(W, N, K, fb)) : NULL;
  nb_tensor *gsa = gpu(nb_scalar(0.625, NB_F32, NB_DEVICE_CPU)), *gsb = gpu(nb_scalar(1.75, NB_F32, NB_DEVICE_CPU));
  NBT_CHECK(ga && gw, "scaled_mm exact %lldx%lldx%lld: operands", (long long)M, (long long)N, (long long)K);
  for (int c = 0; c < f8_ncand() && ga && gw; c++) {
    nb_scope_begin();
    f8_force(c);
    int64_t before = f8_launches();
    nb_tensor *out = nb_scaled_mm(ga, nb_transpose(gw, 0, 1), gsa, gsb, NB_F32);
    int64_t after = f8_launches();
    f8_force(-1);
    char name[160];
    snprintf(name, sizeof name, "scaled_mm exact %lldx%lldx%lld %s x %s -> f32 [%s]", (long long)M,
             (long long)N, (long long)K, nb_dtype_name(fa), nb_dtype_name(fb), f8_cand(c));
    int ok = out && nb_to_host(out, O, (size_t)(M * N) * sizeof *O) == NB_OK;
    int64_t bad = 0, first = -1;
    for (int64_t r = 0; ok && r < nrow; r++)
      for (int64_t j = 0; j < N; j++) {
        double want = s * (double)sum[r * N + j], got = O[rows[r] * N + j];
        if (!(fabs(got - want) <= ldexp(s * (double)mag[r * N + j], -16))) {
          if (first < 0) first = rows[r] * N + j;
          bad++;
        }
      }
    NBT_CHECK(ok && bad == 0, "%s: %lld sampled elements wrong (first (%lld, %lld)) %s", name, (long long)bad,
              (long long)(first < 0 ? 0 : first / N), (long long)(first < 0 ? 0 : first % N),
              ok ? "" : nb_last_error());
    NBT_CHECK(after == before + 1, "%s: one launch of the sm_90a kernel (%lld)", name, (long long)(after - before));
    nb_scope_end();
  }
  free(A); free(W); free(O); free(rows); free(sum); free(mag);
  nb_scope_end();
}

/* NABLA_AUTOTUNE=1 on an FP8 product (a cache file in a temporary directory):
 * the first call times the candidates (more than one launch) and writes one
 * line under its own key (both formats and the output dtype); read back as
 * a new process would, the choice takes one launch; the tuned result equals
 * the heuristic's (exact sums: {-1, 0, 1} operands). */
static void smm_tune(void) {
  if (f8_launches() < 0) return;
  tune_cache tc;
  if (!tune_cache_begin(&tc, "scaled_mm tune")) return;
  nb_scope_begin();
  int64_t M = 1000, N = 520, K = 4096;
  const char *key = "/gemm_sm90/f8e4m3xf8e5m2-bf16/NT/1024x1024x4096\t";
  int8_t *A = smm_unit(91, M * K), *W = smm_unit(92, N * K);
  nb_tensor *ga = A && W ? gpu(smm_f8(A, M, K, NB_F8E4M3)) : NULL;
  nb_tensor *gb = A && W ? nb_transpose(gpu(smm_f8(W, N, K, NB_F8E5M2)), 0, 1) : NULL;
  nb_tensor *gsa = gpu(nb_scalar(0.625, NB_F32, NB_DEVICE_CPU)), *gsb = gpu(nb_scalar(1.75, NB_F32, NB_DEVICE_CPU));
  size_t bytes = (size_t)(M * N) * 2;
  char *b0 = malloc(bytes), *b1 = malloc(bytes), *b2 = malloc(bytes);
  int64_t n0 = f8_launches();
  nb_tensor *off = ga && gb ? nb_scaled_mm(ga, gb, gsa, gsb, NB_BF16) : NULL;
  NBT_CHECK(off && f8_launches() == n0 + 1 && access(tc.path, F_OK) != 0,
            "scaled_mm tune: tuning off: one launch, no cache file (%s)", off ? "" : nb_last_error());
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  n0 = f8_launches();
  nb_tensor *tuned = ga && gb ? nb_scaled_mm(ga, gb, gsa, gsb, NB_BF16) : NULL;
  int64_t tuning = f8_launches() - n0;
  NBT_CHECK(tuned && tuning > 1, "scaled_mm tune: NABLA_AUTOTUNE=1 times the candidates (%lld launches)",
            (long long)tuning);
  NBT_CHECK(tune_lines(tc.path, key) == 1, "scaled_mm tune: one cache line for %s in %s", key, tc.path);
  nb_tune_reset(); /* as a new process would: the file read back */
  n0 = f8_launches();
  nb_tensor *again = ga && gb ? nb_scaled_mm(ga, gb, gsa, gsb, NB_BF16) : NULL;
  NBT_CHECK(again && f8_launches() == n0 + 1, "scaled_mm tune: the cached choice: one launch, no timing");
  int same = b0 && b1 && b2 && off && tuned && again && nb_to_host(off, b0, bytes) == NB_OK &&
             nb_to_host(tuned, b1, bytes) == NB_OK && nb_to_host(again, b2, bytes) == NB_OK &&
             !memcmp(b0, b1, bytes) && !memcmp(b0, b2, bytes);
  NBT_CHECK(same, "scaled_mm tune: tuned and cached runs give the heuristic's (exact) bits");
  nb_clear_error();
  free(A); free(W); free(b0); free(b1); free(b2);
  nb_scope_end();
  tune_cache_end(&tc);
}

void test_fp8_section(void) {
  nb_scope_begin();
  fp8_decode_cmp(NB_F8E4M3);
  fp8_decode_cmp(NB_F8E5M2);
  fp8_encode_cmp(NB_F8E4M3);
  fp8_encode_cmp(NB_F8E5M2);
  nb_scope_end();
  /* 260 x 520 x 2048: 9 tiles of 16 k-tiles, split-K in 2 parts by default */
  const int64_t S[][3] = {{1, 1, 16}, {7, 5, 48}, {128, 256, 128}, {129, 257, 144}, {260, 520, 2048},
                          {300, 700, 1040}, {517, 263, 2048}};
  const nb_dtype OD[3] = {NB_BF16, NB_F32, NB_F16};
  int ns = quick ? 5 : 7, k = 0;
  for (int s = 0; s < ns; s++)
    for (int fa = 0; fa < 2; fa++)
      for (int fb = 0; fb < 2; fb++, k++) {
        nb_dtype da = fa ? NB_F8E4M3 : NB_F8E5M2, db = fb ? NB_F8E4M3 : NB_F8E5M2;
        smm_cmp(S[s][0], S[s][1], S[s][2], da, db, OD[k % 3], 1);
        if (k % 4 == 0) smm_cmp(S[s][0], S[s][1], S[s][2], da, db, OD[(k + 1) % 3], 0);
      }
  smm_cmp(9, 33, 40, NB_F8E4M3, NB_F8E4M3, NB_BF16, 1); /* K % 16 != 0: portable */
  /* 15 x 18 = 270 tiles (over two waves on 132 SMs, an odd tile row count) of 9
   * k-tiles, tails in M, N and K; and 9 tiles of 16 k-tiles (split-K) */
  smm_exact(1900, 4400, 1040, NB_F8E4M3, NB_F8E5M2, 81);
  smm_exact(260, 520, 2048, NB_F8E5M2, NB_F8E4M3, 83);
  smm_tune();
  setenv("NABLA_SCALED_MM", "portable", 1);
  smm_cmp(129, 257, 144, NB_F8E4M3, NB_F8E5M2, NB_BF16, 1);
  smm_cmp(300, 700, 1040, NB_F8E4M3, NB_F8E4M3, NB_F32, 1);
  unsetenv("NABLA_SCALED_MM");
}
