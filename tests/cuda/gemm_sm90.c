#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "backend/backend.h" /* nb_kview_of */
#include "cuda_test.h"

/* ==== own sm_90a GEMM (src/backend/cuda/gemm_sm90.cu) ==========================
 * The own kernel is forced with nb_cuda_set_gemm_backend(1); where it does not
 * apply (not a 9.0 device, a layout or alignment TMA cannot take) the product
 * goes through cuBLASLt, so these checks pass on any GPU and exercise both the
 * kernel and its fallbacks on Hopper. Shapes include 1x1x1, primes and tails
 * of the 128 x 256 x 64 tile; layouts NT (x @ W^T), NN, TN, TT as strided views
 * on the device (the kernel reads a transposed operand as is). Each result is
 * compared with a float64 reference on sampled rows (all rows when small) and
 * with cuBLASLt's result in full, by the relative Frobenius error. */
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_gemm.h"
#endif
/* Own-kernel launches so far; -1 when it cannot run here (CPU self-test, a
 * device other than compute capability 9.0). */
int64_t gs_launches(void) {
#ifdef NABLA_HAVE_CUDA
  if (G.type == NB_CUDA) return nb_cuda_gemm_own_launches(G.index);
#endif
  return -1;
}

double gs_rel(const double *x, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = x[i] - ref[i];
    if (x[i] != x[i]) return INFINITY;
    num += e * e;
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* f64 reference rows (all, or about 61 and the last) of a @ b: *rows, *nrow. */
double *gs_ref(const double *A, const double *B, int64_t M, int64_t N, int64_t K,
                      int64_t **rows, int64_t *nrow) {
  int64_t step = M * N * K <= ((int64_t)1 << 27) ? 1 : (M + 60) / 61, n = 0;
  int64_t *r = malloc((size_t)(M / step + 2) * sizeof *r);
  for (int64_t i = 0; i < M; i += step) r[n++] = i;
  if ((M - 1) % step) r[n++] = M - 1;
  double *ref = malloc((size_t)(n * N) * sizeof *ref);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += A[r[i] * K + k] * B[k * N + j];
      ref[i * N + j] = s;
    }
  *rows = r;
  *nrow = n;
  return ref;
}

/* Relative error of the sampled rows of O (M x N) against ref. */
double gs_err(const double *O, const double *ref, const int64_t *rows, int64_t nrow, int64_t N) {
  double *got = malloc((size_t)(nrow * N) * sizeof *got);
  for (int64_t i = 0; i < nrow; i++) memcpy(got + i * N, O + rows[i] * N, (size_t)N * sizeof *got);
  double e = gs_rel(got, ref, nrow * N);
  free(got);
  return e;
}

/* (r, c) operand stored row-major, or transposed (stored (c, r)), on the
 * CPU; *dev is the same view of a device copy of the stored tensor.
 * (Uploading the transposed view itself would give a contiguous device
 * tensor, and the kernel would never see the transposed layout.) */
nb_tensor *gs_operand(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int trans,
                             nb_tensor **dev) {
  nb_tensor *st = trans ? randn(seed, 2, (int64_t[]){c, r}, dt) : randn(seed, 2, (int64_t[]){r, c}, dt);
  nb_tensor *g = gpu(st);
  *dev = trans ? nb_transpose(g, 0, 1) : g;
  return trans ? nb_transpose(st, 0, 1) : st;
}

static void gs_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, int ta, int tb, uint64_t seed) {
  nb_scope_begin();
  char name[96];
  snprintf(name, sizeof name, "gemm sm90 %c%c %lldx%lldx%lld [%s]", ta ? 'T' : 'N', tb ? 'T' : 'N',
           (long long)M, (long long)N, (long long)K, nb_dtype_name(dt));
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, dt, ta, &ga), *b = gs_operand(seed + 1, K, N, dt, tb, &gb);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(1);
#endif
  int64_t n0 = gs_launches();
  nb_tensor *own = nb_matmul(ga, gb);
  /* sizes that are multiples of 8 give 16-byte row strides in every layout:
   * such a product must reach the kernel, not the fallback */
  if (n0 >= 0 && M % 8 == 0 && N % 8 == 0 && K % 8 == 0)
    NBT_CHECK(gs_launches() == n0 + 1, "%s: ran the own kernel", name);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(0);
#endif
  nb_tensor *lt = nb_matmul(ga, gb);
  if (!own || !lt) {
    NBT_CHECK(0, "%s: NULL result (%s)", name, nb_last_error());
    nb_clear_error();
    nb_scope_end();
    return;
  }
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(own), *L = nbt_f64(lt);
  int64_t *rows, nrow;
  double *ref = gs_ref(A, B, M, N, K, &rows, &nrow);
  double e_ref = gs_err(O, ref, rows, nrow, N), e_lt = gs_rel(O, L, M * N);
  NBT_CHECK(e_ref <= 1e-2, "%s: relative error vs float64 %g", name, e_ref);
  NBT_CHECK(e_lt <= 1e-2, "%s: relative difference vs cuBLASLt %g", name, e_lt);
  if (getenv("NABLA_TEST_VERBOSE")) printf("  %-44s ref %.2e  lt %.2e\n", name, e_ref, e_lt);
  free(rows); free(ref); free(A); free(B); free(O); free(L);
  nb_scope_end();
}

/* Split-K (few tiles, long K) gives the same bits on every run: the partial
 * tiles are added in a fixed order. */
static void gs_repeat(int64_t M, int64_t N, int64_t K, int ta, uint64_t seed) {
  nb_scope_begin();
  nb_tensor *ga, *gb;
  gs_operand(seed, M, K, NB_BF16, ta, &ga);
  gs_operand(seed + 1, K, N, NB_BF16, 0, &gb);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(1);
#endif
  nb_tensor *x = nb_matmul(ga, gb), *y = nb_matmul(ga, gb);
#ifdef NABLA_HAVE_CUDA
  nb_cuda_set_gemm_backend(0);
#endif
  char name[96];
  snprintf(name, sizeof name, "gemm sm90 repeat %c %lldx%lldx%lld", ta ? 'T' : 'N', (long long)M,
           (long long)N, (long long)K);
  cmp_bits(name, x, y);
  nb_scope_end();
}

#ifdef NABLA_HAVE_CUDA
static double ge_gelu(double x) {
  return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}

/* Runs nb_cuda_gemm_ex into fresh out (and aux) tensors of dtype od. */
static int ge_run(nb_tensor *ga, nb_tensor *gb, nb_tensor *bias, nb_tensor *c, int f, float alpha,
                  float beta, nb_dtype od, nb_tensor **out, nb_tensor **aux) {
  int64_t shape[2] = {nb_size(ga, 0), nb_size(gb, 1)};
  *out = nb_full(2, shape, NAN, od, G); /* poison: every element must be written */
  *aux = f & GE_AUX ? nb_full(2, shape, NAN, od, G) : NULL;
  nb_kview ko, ka, kb, kbias, kc, kaux;
  nb_kview_of(*out, &ko);
  nb_kview_of(ga, &ka);
  nb_kview_of(gb, &kb);
  if (bias) nb_kview_of(bias, &kbias);
  if (c) nb_kview_of(c, &kc);
  if (*aux) nb_kview_of(*aux, &kaux);
  nb_gemm_epilogue ep = {bias ? &kbias : NULL, c ? &kc : NULL, *aux ? &kaux : NULL, alpha, beta,
                         (f & GE_GELU) != 0};
  return nb_cuda_gemm_ex(&ko, &ka, &kb, &ep) == NB_OK;
}

/* One fused-epilogue case against a float64 reference (sampled rows) and
 * against the unfused path (cuBLASLt product + epilogue kernel). */
void ge_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, nb_dtype od, int ta, int tb, int f,
                    uint64_t seed) {
  if (G.type == NB_CPU) return;
  nb_scope_begin();
  char name[128];
  snprintf(name, sizeof name, "gemm_ex %c%c %lldx%lldx%lld [%s->%s]%s%s%s%s", ta ? 'T' : 'N',
           tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, nb_dtype_name(dt),
           nb_dtype_name(od), f & GE_BIAS ? " bias" : "", f & GE_RESID ? " alpha,beta,c" : "",
           f & GE_GELU ? " gelu" : "", f & GE_AUX ? " aux" : "");
  nb_tensor *ga, *gb, *a = gs_operand(seed, M, K, dt, ta, &ga), *b = gs_operand(seed + 1, K, N, dt, tb, &gb);
  nb_tensor *bias = f & GE_BIAS ? randn(seed + 2, 1, (int64_t[]){N}, od) : NULL;
  nb_tensor *c = f & GE_RESID ? randn(seed + 3, 2, (int64_t[]){M, N}, od) : NULL;
  float alpha = f & GE_RESID ? 0.75f : 1.0f, beta = f & GE_RESID ? -0.5f : 0.0f;
  nb_tensor *gbias = bias ? gpu(bias) : NULL, *gc = c ? gpu(c) : NULL;
  nb_tensor *out, *aux, *out2, *aux2;
  nb_cuda_set_gemm_backend(1);
  int64_t n0 = gs_launches();
  int ok = ge_run(ga, gb, gbias, gc, f, alpha, beta, od, &out, &aux);
  if (ok && n0 >= 0 && M % 8 == 0 && N % 8 == 0 && K % 8 == 0)
    NBT_CHECK(gs_launches() == n0 + 1, "%s: ran the own kernel", name);
  nb_cuda_set_gemm_backend(0);
  ok = ok && ge_run(ga, gb, gbias, gc, f, alpha, beta, od, &out2, &aux2);
  if (!ok) {
    NBT_CHECK(0, "%s: failed (%s)", name, nb_last_error());
    nb_clear_error();
    nb_scope_end();
    return;
  }
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(out), *O2 = nbt_f64(out2);
  double *BI = bias ? nbt_f64(bias) : NULL, *C = c ? nbt_f64(c) : NULL;
  double *X = aux ? nbt_f64(aux) : NULL, *X2 = aux ? nbt_f64(aux2) : NULL;
  int64_t step = M * N * K <= ((int64_t)1 << 27) ? 1 : (M + 60) / 61, nrow = 0;
  int64_t *rows = malloc((size_t)(M / step + 2) * sizeof *rows);
  for (int64_t r = 0; r < M; r += step) rows[nrow++] = r;
  if ((M - 1) % step) rows[nrow++] = M - 1;
  size_t n = (size_t)(nrow * N);
  double *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
  double *pref = malloc(n * sizeof *pref), *pgot = malloc(n * sizeof *pgot);
  for (int64_t i = 0; i < nrow; i++)
    for (int64_t j = 0; j < N; j++) {
      int64_t r = rows[i];
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += A[r * K + k] * B[k * N + j];
      double pre = alpha * s + (C ? beta * C[r * N + j] : 0.0) + (BI ? BI[j] : 0.0);
      ref[i * N + j] = f & GE_GELU ? ge_gelu(pre) : pre;
      got[i * N + j] = O[r * N + j];
      pref[i * N + j] = pre;
      pgot[i * N + j] = X ? X[r * N + j] : pre;
    }
  double e_ref = gs_rel(got, ref, (int64_t)n), e_un = gs_rel(O, O2, M * N);
  double e_aux = gs_rel(pgot, pref, (int64_t)n), e_aux2 = X ? gs_rel(X, X2, M * N) : 0.0;
  double lim = od == NB_F32 && dt == NB_F16 ? 2e-3 : 1e-2;
  NBT_CHECK(e_ref <= lim, "%s: relative error vs float64 %g", name, e_ref);
  NBT_CHECK(e_un <= lim, "%s: relative difference vs the unfused path %g", name, e_un);
  NBT_CHECK(e_aux <= lim && e_aux2 <= lim, "%s: pre-activation error vs float64 %g, vs unfused %g",
            name, e_aux, e_aux2);
  if (getenv("NABLA_TEST_VERBOSE"))
    printf("  %-64s ref %.2e  unfused %.2e  aux %.2e\n", name, e_ref, e_un, e_aux);
  free(rows); free(ref); free(got); free(pref); free(pgot);
  free(A); free(B); free(O); free(O2); free(BI); free(C); free(X); free(X2);
  nb_scope_end();
}

/* Bad calls are errors naming the problem, never a crash. */
static void ge_errors(void) {
  if (G.type == NB_CPU) return;
  nb_scope_begin();
  nb_tensor *a = gpu(randn(1, 2, (int64_t[]){8, 16}, NB_BF16)), *b = gpu(randn(2, 2, (int64_t[]){16, 24}, NB_BF16));
  nb_tensor *o = nb_empty(2, (int64_t[]){8, 24}, NB_BF16, G), *bad = gpu(randn(3, 1, (int64_t[]){23}, NB_BF16));
  nb_tensor *o16 = nb_empty(2, (int64_t[]){8, 24}, NB_F16, G);
  nb_kview ko, ka, kb, kbad, ko16;
  nb_kview_of(o, &ko); nb_kview_of(a, &ka); nb_kview_of(b, &kb); nb_kview_of(bad, &kbad);
  nb_kview_of(o16, &ko16);
  nb_gemm_epilogue ep = {&kbad, NULL, NULL, 1.0f, 0.0f, 1};
  NBT_CHECK(nb_cuda_gemm_ex(&ko, &ka, &kb, &ep) == NB_ERR_SHAPE && strstr(nb_last_error(), "bias"),
            "gemm_ex: a (23,) bias for 24 columns is a shape error naming bias (%s)", nb_last_error());
  nb_clear_error();
  NBT_CHECK(nb_cuda_gemm_ex(&ko16, &ka, &kb, NULL) == NB_ERR_DTYPE, "gemm_ex: bf16 operands into an f16 out is a dtype error");
  nb_clear_error();
  NBT_CHECK(nb_cuda_gemm_ex(&ko, &kb, &ka, NULL) == NB_ERR_SHAPE, "gemm_ex: mismatched shapes are a shape error");
  nb_clear_error();
  nb_scope_end();
}
#endif

void test_gemm_sm90(void) {
  static const int64_t small[][3] = {{1, 1, 1}, {127, 129, 67}, {8, 8, 8}, {127, 136, 72},
                                     {131, 264, 200}, {256, 512, 64}, {1000, 1000, 64}};
  /* the last three take the split schedule for few tiles: the GPT-2 qkv
   * weight gradient; 24 tiles of 65 k-tiles with tails in M, N and K; 4
   * tiles of 1024 k-tiles. Their sizes are multiples of 8, so every layout
   * reaches the own kernel (a row stride must be a multiple of 16 bytes) */
  static const int64_t big[][3] = {{4096, 4096, 4096}, {16384, 768, 2304}, {16384, 2304, 768},
                                   {2304, 768, 16384}, {1000, 520, 4136}, {136, 264, 65536}};
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  uint64_t seed = 9000;
  for (int d = 0; d < 2; d++)
    for (int lay = 0; lay < 4; lay++) {
      int ta = lay & 1, tb = lay >> 1;
      for (size_t s = 0; s < sizeof small / sizeof *small; s++, seed += 2)
        gs_case(small[s][0], small[s][1], small[s][2], dts[d], ta, tb, seed);
      for (size_t s = 0; !quick && s < sizeof big / sizeof *big; s++, seed += 2)
        if (d == 0 || s == 0 || s == 4) gs_case(big[s][0], big[s][1], big[s][2], dts[d], ta, tb, seed);
    }
  if (quick) gs_case(1000, 520, 4136, NB_BF16, 1, 0, seed++); /* split schedule under the sanitizer */
  gs_repeat(1000, 520, 4136, 1, seed++);
  gs_repeat(136, 264, 65536, 0, seed++);
  gs_repeat(760, 3000, 3950, 1, seed++); /* split-sync: 72 tiles, 12 rests in pieces (132 SMs) */
#ifdef NABLA_HAVE_CUDA
  { /* ... which is what the heuristic runs there on a 132-SM device (the H100) */
    nb_cuda_info info;
    nb_gemm_own_schedule sc;
    if (G.type != NB_CPU && nb_cuda_device_info(G.index, &info) == NB_OK && info.n_sm == 132 &&
        nb_cuda_gemm_own_schedule(0, 760, 3000, 3950, info.n_sm, &sc))
      NBT_CHECK(sc.sync_q == 1 && sc.grid == 132, "gemm sm90 760x3000x3950 on 132 SMs: split-sync (q %d)", sc.sync_q);
  }
#endif
  /* batched rows folded into M: (3, M, K) @ (K, N) with b broadcast, NT and NN */
  for (int tb = 0; tb < 2; tb++) {
    nb_scope_begin();
    int64_t M = 100, K = 136, N = 264;
    nb_tensor *a = randn(seed++, 3, (int64_t[]){3, M, K}, NB_BF16);
    nb_tensor *gb, *b = gs_operand(seed++, K, N, NB_BF16, tb, &gb);
#ifdef NABLA_HAVE_CUDA
    nb_cuda_set_gemm_backend(1);
#endif
    cmp(tb ? "gemm sm90 batched NT" : "gemm sm90 batched NN", NB_BF16, nb_matmul(a, b),
        nb_matmul(gpu(a), gb), sqrt((double)K) * 2.0);
#ifdef NABLA_HAVE_CUDA
    nb_cuda_set_gemm_backend(0);
#endif
    nb_scope_end();
  }
#ifdef NABLA_HAVE_CUDA
  /* fused epilogues: every variant on a tail shape in every layout, both
   * operand dtypes, both output dtypes; prime sizes (direct stores: N odd
   * rows are not 16-byte aligned) and aligned tails (TMA stores) */
  static const int64_t eshape[][3] = {{131, 264, 200}, {264, 1000, 136}, {67, 131, 136}};
  static const int flags[] = {GE_BIAS, GE_BIAS | GE_GELU, GE_BIAS | GE_GELU | GE_AUX, GE_RESID,
                              GE_RESID | GE_BIAS | GE_GELU | GE_AUX, GE_GELU};
  for (int lay = 0; lay < 4; lay++)
    for (size_t s = 0; s < sizeof eshape / sizeof *eshape; s++)
      for (size_t fi = 0; fi < sizeof flags / sizeof *flags; fi++)
        for (int d = 0; d < 2; d++) {
          nb_dtype od = fi % 2 ? dts[d] : NB_F32;
          ge_case(eshape[s][0], eshape[s][1], eshape[s][2], dts[d], od, lay & 1, lay >> 1, flags[fi], seed++);
        }
  if (!quick) { /* GPT-2 mlp fc forward with bias + GELU + pre-activation; a split-K dW shape */
    ge_case(16384, 3072, 768, NB_BF16, NB_BF16, 0, 1, GE_BIAS | GE_GELU | GE_AUX, seed++);
    ge_case(2304, 768, 16384, NB_BF16, NB_F32, 1, 0, GE_RESID, seed++);
  }
  ge_case(1000, 520, 4136, NB_BF16, NB_BF16, 1, 0, GE_BIAS | GE_GELU, seed++);
  ge_errors();
#endif
}
