#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "backend/backend.h" /* nb_kview_of */
#include "cuda_test.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_gemm.h"
#endif

/* ==== portable GEMM (sm80 path) (src/backend/cuda/gemm_sm80.cu) ================
 * nb_sm80_gemm is called directly on views of device tensors: the operand
 * views (transposed, column-sliced, offset by one element) are made on the
 * device, so the kernel sees their strides. Plain outputs are poisoned with
 * NaN first (beta = 0 must neither read nor skip them); with beta != 0 they
 * hold random values that the kernel scales. Each result is checked against
 * a float64 reference (sampled rows for large shapes) and, where it computes
 * the same product, against cuBLASLt, by the relative Frobenius error.
 * The last checks go through nb_matmul with the switch set to the portable
 * path (value 2, NABLA_GEMM=sm80), batched included. */
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/gemm_sm80.h"

/* Operand kinds: 0 row-major, 1 transposed (MN-major), 2 every other column
 * (column stride 2), 3 columns [1, c] of an (r, c + 1) tensor (base and row
 * stride not 16-byte aligned). The view of the same values on the CPU and on
 * the device. */
static const char *const GP_KIND = "NTSO";
static void gp_operand(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int kind, nb_tensor **cpu,
                       nb_tensor **dev) {
  int64_t shape[2] = {r, c};
  if (kind == 1) { shape[0] = c; shape[1] = r; }
  if (kind == 2) shape[1] = 2 * c;
  if (kind == 3) shape[1] = c + 1;
  nb_tensor *base = randn(seed, 2, shape, dt), *views[2] = {base, gpu(base)};
  for (int i = 0; i < 2; i++) {
    nb_tensor *v = views[i];
    if (kind == 1) v = nb_transpose(v, 0, 1);
    if (kind == 2) v = nb_slice(v, 1, 0, 2 * c, 2);
    if (kind == 3) v = nb_slice(v, 1, 1, c + 1, 1);
    views[i] = v;
  }
  *cpu = views[0];
  *dev = views[1];
}

static int64_t gp_nonfinite(const double *x, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += !isfinite(x[i]);
  return bad;
}

/* Relative Frobenius error of O (M x N) against alpha * A B + beta * C0 (C0
 * may be NULL), over every row when the product is small, else about 61
 * spread rows and the last. */
static double gp_error(const double *A, const double *B, const double *C0, const double *O,
                       int64_t M, int64_t N, int64_t K, double alpha, double beta) {
  int64_t step = M * N * K <= ((int64_t)1 << 27) ? 1 : (M + 60) / 61;
  double num = 0, den = 0;
  /* rows 0, step, 2 step, ... and then M - 1 */
  for (int64_t r = 0; r < M; r = (r + step < M || r == M - 1) ? r + step : M - 1) {
    for (int64_t n = 0; n < N; n++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += A[r * K + k] * B[k * N + n];
      s = alpha * s + (C0 ? beta * C0[r * N + n] : 0.0);
      double e = O[r * N + n] - s;
      if (O[r * N + n] != O[r * N + n]) return INFINITY;
      num += e * e;
      den += s * s;
    }
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* bf16 operands and output: a few roundings of 2^-8; f16: of 2^-11; an f32
 * output keeps only the f32 accumulation error. */
static double gp_limit(nb_dtype dt, nb_dtype odt) {
  return odt == NB_F32 ? 1e-4 : dt == NB_F16 ? 1e-3 : 1e-2;
}

/* out (M, N, dtype odt) = alpha * a @ b + beta * out through nb_sm80_gemm. */
static void gp_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, int ka, int kb, nb_dtype odt,
                    double alpha, double beta, uint64_t seed) {
  nb_scope_begin();
  char name[128];
  snprintf(name, sizeof name, "gemm sm80 %c%c %lldx%lldx%lld [%s -> %s] alpha %g beta %g",
           GP_KIND[ka], GP_KIND[kb], (long long)M, (long long)N, (long long)K, nb_dtype_name(dt),
           nb_dtype_name(odt), alpha, beta);
  nb_tensor *a, *ga, *b, *gb;
  gp_operand(seed, M, K, dt, ka, &a, &ga);
  gp_operand(seed + 1, K, N, dt, kb, &b, &gb);
  int64_t os[2] = {M, N};
  nb_tensor *c0 = beta != 0 ? randn(seed + 2, 2, os, odt) : NULL;
  nb_tensor *out = c0 ? gpu(c0) : nb_empty(2, os, odt, G); /* the upload is a copy */
  if (!c0) nb_fill_(out, NAN);
  nb_kview vo, va, vb;
  nb_kview_of(out, &vo);
  nb_kview_of(ga, &va);
  nb_kview_of(gb, &vb);
  nb_status st = nb_sm80_gemm(&vo, &va, &vb, (float)alpha, (float)beta);
  NBT_CHECK(st == NB_OK, "%s: status %s (%s)", name, nb_status_name(st), nb_last_error());
  nb_clear_error();
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(out), *C0 = c0 ? nbt_f64(c0) : NULL;
  int64_t bad = gp_nonfinite(O, M * N);
  NBT_CHECK(bad == 0, "%s: %lld outputs unwritten (still NaN) or not finite", name, (long long)bad);
  double lim = gp_limit(dt, odt), e_ref = gp_error(A, B, C0, O, M, N, K, alpha, beta), e_lt = 0;
  NBT_CHECK(e_ref <= lim, "%s: relative error vs float64 %g (limit %g)", name, e_ref, lim);
  if (odt == dt && alpha == 1 && beta == 0) { /* the same product through cuBLASLt */
    nb_cuda_set_gemm_backend(0);
    double *L = nbt_f64(nb_matmul(ga, gb));
    e_lt = L ? gs_rel(O, L, M * N) : INFINITY;
    NBT_CHECK(e_lt <= lim, "%s: relative difference vs cuBLASLt %g (limit %g)", name, e_lt, lim);
    free(L);
  }
  if (getenv("NABLA_TEST_VERBOSE")) printf("  %-60s ref %.2e  lt %.2e\n", name, e_ref, e_lt); /* lt 0: not compared */
  free(A); free(B); free(O); free(C0);
  nb_scope_end();
}

/* Batched: out (2, 3, M, N) poisoned; a (2, 3, M, K) taken from a (2, 4, K, M)
 * tensor (MN-major, batch axes that do not merge: a host loop over grid.z
 * launches); b (K, N) broadcast over the batch (batch stride 0). */
static void gp_batched(nb_dtype dt, int64_t M, int64_t N, int64_t K, uint64_t seed) {
  nb_scope_begin();
  char name[96];
  snprintf(name, sizeof name, "gemm sm80 batched (2, 3) x %lldx%lldx%lld [%s]", (long long)M,
           (long long)N, (long long)K, nb_dtype_name(dt));
  nb_tensor *base = randn(seed, 4, (int64_t[]){2, 4, K, M}, dt);
  nb_tensor *a = nb_transpose(nb_slice(base, 1, 0, 3, 1), 2, 3);
  nb_tensor *ga = nb_transpose(nb_slice(gpu(base), 1, 0, 3, 1), 2, 3);
  nb_tensor *b = randn(seed + 1, 2, (int64_t[]){K, N}, dt), *gb = gpu(b);
  int64_t os[4] = {2, 3, M, N}, bs[4] = {2, 3, K, N};
  nb_tensor *out = nb_empty(4, os, dt, G);
  nb_fill_(out, NAN);
  nb_kview vo, va, vb;
  nb_kview_of(out, &vo);
  nb_kview_of(ga, &va);
  NBT_CHECK(nb_kview_broadcast(gb, 4, bs, &vb) == 0, "%s: broadcast view of b", name);
  nb_status st = nb_sm80_gemm(&vo, &va, &vb, 1.0f, 0.0f);
  NBT_CHECK(st == NB_OK, "%s: status %s (%s)", name, nb_status_name(st), nb_last_error());
  nb_clear_error();
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = nbt_f64(out), worst = 0;
  int64_t bad = gp_nonfinite(O, 6 * M * N);
  NBT_CHECK(bad == 0, "%s: %lld outputs unwritten (still NaN) or not finite", name, (long long)bad);
  for (int64_t i = 0; i < 6; i++) {
    double e = gp_error(A + i * M * K, B, NULL, O + i * M * N, M, N, K, 1.0, 0.0);
    worst = e > worst ? e : worst;
  }
  NBT_CHECK(worst <= gp_limit(dt, dt), "%s: worst batch relative error vs float64 %g", name, worst);
  free(A); free(B); free(O);
  nb_scope_end();
}

/* nb_matmul with the switch on the portable path: (3, M, K) @ (K, N) and a
 * transposed batched a, against float64. */
static void gp_switch(nb_dtype dt, int tb, uint64_t seed) {
  nb_scope_begin();
  int64_t M = 100, K = 72, N = 136;
  nb_tensor *a = randn(seed, 3, (int64_t[]){3, M, K}, dt), *b, *gb;
  gp_operand(seed + 1, K, N, dt, tb, &b, &gb);
  nb_cuda_set_gemm_backend(2);
  nb_tensor *o = nb_matmul(gpu(a), gb);
  nb_cuda_set_gemm_backend(0);
  double *A = nbt_f64(a), *B = nbt_f64(b), *O = o ? nbt_f64(o) : NULL, worst = O ? 0 : INFINITY;
  for (int64_t i = 0; O && i < 3; i++) {
    double e = gp_error(A + i * M * K, B, NULL, O + i * M * N, M, N, K, 1.0, 0.0);
    worst = e > worst ? e : worst;
  }
  NBT_CHECK(worst <= gp_limit(dt, dt), "gemm sm80 via NABLA_GEMM=sm80 switch, batched, b %s [%s]: "
            "relative error %g (%s)", tb ? "transposed" : "row-major", nb_dtype_name(dt), worst,
            o ? "" : nb_last_error());
  nb_clear_error();
  free(A); free(B); free(O);
  nb_scope_end();
}

void test_gemm_sm80(void) {
  if (G.type == NB_CPU) return; /* device-only: calls the kernel entry directly */
  static const int64_t shapes[][3] = {
      {1, 1, 1},      {8, 8, 8},       {127, 131, 67},  {131, 127, 128},  {129, 136, 72},
      {64, 64, 32},   {128, 128, 32},  {200, 264, 136}, {255, 257, 129},  {17, 1000, 40},
      {1000, 24, 200}, {384, 384, 384}, {1000, 1000, 64}};
  const int nquick = 9; /* compute-sanitizer: the first shapes only */
  const int nshapes = quick ? nquick : (int)(sizeof shapes / sizeof *shapes);
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  uint64_t seed = 12000;
  for (int d = 0; d < 2; d++)
    for (int lay = 0; lay < 4; lay++)
      for (int s = 0; s < nshapes; s++, seed += 3)
        gp_case(shapes[s][0], shapes[s][1], shapes[s][2], dts[d], lay & 1, lay >> 1, dts[d], 1, 0, seed);
  /* element-load path: strided and misaligned operands, with either partner */
  static const int64_t odd[][3] = {{127, 131, 67}, {200, 264, 136}, {64, 72, 40}};
  for (int k = 2; k < 4; k++)
    for (int s = 0; s < 3; s++, seed += 6) {
      gp_case(odd[s][0], odd[s][1], odd[s][2], NB_BF16, k, s % 2, NB_BF16, 1, 0, seed);
      gp_case(odd[s][0], odd[s][1], odd[s][2], NB_F16, s % 2, k, NB_F16, 1, 0, seed + 3);
    }
  /* f32 output, alpha and beta (beta reads the output's random values) */
  gp_case(127, 131, 67, NB_BF16, 0, 1, NB_F32, 1, 0, seed++);
  gp_case(256, 264, 136, NB_F16, 1, 0, NB_F32, 0.5, -1.25, seed++);
  gp_case(129, 136, 72, NB_BF16, 0, 0, NB_BF16, -2, 0.5, seed++);
  gp_case(200, 130, 96, NB_F16, 1, 1, NB_F16, 0.75, 1, seed++);
  gp_case(64, 64, 0, NB_BF16, 0, 0, NB_F32, 1, 0.5, seed++); /* K = 0: out = beta * out */
  gp_case(256, 264, 4096, NB_BF16, 1, 0, NB_F32, 0.5, -1.25, seed++); /* split-K into 16 */
  /* large shapes (sampled rows): 128x128 (4096^3, GPT-2 qkv forward; tails
   * with K = 67: element loads), split-K 128x128 (dW = dY^T @ X; TT).
   * NABLA_SM80_TILE=small|large|wide|wide64 runs every case on one tile. */
  if (!quick) {
    gp_case(4096, 4096, 4096, NB_BF16, 0, 0, NB_BF16, 1, 0, seed++);
    gp_case(16384, 2304, 768, NB_BF16, 0, 1, NB_BF16, 1, 0, seed++);
    gp_case(768, 2304, 16384, NB_BF16, 1, 0, NB_BF16, 1, 0, seed++);
    gp_case(2048, 1024, 1024, NB_F16, 1, 1, NB_F16, 1, 0, seed++);
    gp_case(2049, 1153, 67, NB_BF16, 0, 0, NB_BF16, 1, 0, seed++);
    gp_case(2049, 1153, 200, NB_F16, 1, 1, NB_F16, 1, 0, seed++);
  }
  for (int d = 0; d < 2; d++) {
    gp_batched(dts[d], 100, 72, 40, seed++);
    gp_batched(dts[d], 33, 17, 9, seed++);
    gp_switch(dts[d], d, seed++);
  }
  /* bad input: an error naming the op and the dtypes, no launch */
  nb_scope_begin();
  nb_tensor *x = gpu(randn(seed, 2, (int64_t[]){4, 4}, NB_F32));
  nb_kview v;
  nb_kview_of(x, &v);
  nbt_check_error("gemm sm80 f32 operands", nb_sm80_gemm(&v, &v, &v, 1.0f, 0.0f) != NB_OK,
                  NB_ERR_DTYPE, "matmul sm80", "f32", NULL);
  nb_tensor *y = gpu(randn(seed, 2, (int64_t[]){4, 5}, NB_BF16)), *z = gpu(randn(seed, 2, (int64_t[]){4, 4}, NB_BF16));
  nb_kview vy, vz;
  nb_kview_of(y, &vy);
  nb_kview_of(z, &vz);
  nbt_check_error("gemm sm80 shapes", nb_sm80_gemm(&vz, &vy, &vz, 1.0f, 0.0f) != NB_OK,
                  NB_ERR_SHAPE, "matmul sm80", "[4, 5]", NULL);
  nb_scope_end();
}
#else
void test_gemm_sm80(void) {}
#endif
