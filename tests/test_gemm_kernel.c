/* nb_cpu_matmul called directly through nb_kview, against a naive float64
 * reference computed from the very values the kernel reads.
 *
 * Covered: shapes with 1s, primes and tails of every blocking level (MR,
 * NR, KC, NC), transposed and strided a, b and out (never copied), batch
 * axes with stride-0 broadcast, every float dtype, K == 0, empty outputs,
 * the batched small products of attention, the row/column splits of the
 * OpenMP path, and bit-identical results on 1 and on all threads.
 *
 * Tolerance: |out - ref| <= rtol * sum_k |a_ik * b_kj| + atol per element,
 * so cancellation in ref does not matter. rtol: f64 1e-12 (f64 accumulate),
 * f32 1e-5 (f32 accumulate), f16 2e-3 (f32 accumulate, one rounding to
 * f16, 2^-11 relative), bf16 1e-2 (one rounding to bf16, 2^-8 relative).
 * atol is 1e-30, except f16: 6e-8, half the spacing of its subnormals.
 * Elements of out's storage outside the view must stay untouched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "testutil.h"
#include "backend/cpu/cpu_gemm.h"

/* The shared checker (testutil.h), under this file's short name. */
#define CHECK NBT_CHECK

/* ---- values of any float dtype ------------------------------------------ */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double rnd(void) { /* uniform in [-1, 1) */
  g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

static double ld(const void *base, nb_dtype dt, int64_t i) {
  switch (dt) {
    case NB_F64: return ((const double *)base)[i];
    case NB_F32: return ((const float *)base)[i];
    case NB_F16: return nb_f16_to_f32(((const uint16_t *)base)[i]);
    default: return nb_bf16_to_f32(((const uint16_t *)base)[i]);
  }
}

static void st(void *base, nb_dtype dt, int64_t i, double v) {
  switch (dt) {
    case NB_F64: ((double *)base)[i] = v; break;
    case NB_F32: ((float *)base)[i] = (float)v; break;
    case NB_F16: ((uint16_t *)base)[i] = nb_f32_to_f16((float)v); break;
    default: ((uint16_t *)base)[i] = nb_f32_to_bf16((float)v); break;
  }
}

/* ---- views -------------------------------------------------------------- */
/* padded: unit column stride, rows further apart than their length. */
enum { L_CONTIG, L_TRANS, L_STRIDED, L_PADDED, L_COUNT };
static const char *lname[] = {"contig", "trans", "strided", "padded"};

/* A view of shape (batch.., r, c) with layout lay for the matrix axes;
 * batch axis d is broadcast (stride 0) when bit d of bmask is set. Storage
 * is filled with random values (sentinel 7 for out). Returns the element
 * count of the storage in *n. */
static nb_kview mkview(int nbd, const int64_t *batch, int64_t r, int64_t c, int lay, int bmask,
                       nb_dtype dt, int fill_random, int64_t *n) {
  nb_kview v = {0};
  v.dtype = dt;
  v.ndim = nbd + 2;
  for (int d = 0; d < nbd; d++) v.shape[d] = batch[d];
  v.shape[nbd] = r;
  v.shape[nbd + 1] = c;
  int64_t span;
  if (lay == L_CONTIG) { v.strides[nbd] = c; v.strides[nbd + 1] = 1; span = r * c; }
  else if (lay == L_TRANS) { v.strides[nbd] = 1; v.strides[nbd + 1] = r; span = r * c; }
  else if (lay == L_STRIDED) { v.strides[nbd] = 2 * c + 3; v.strides[nbd + 1] = 2; span = r * (2 * c + 3); }
  else { v.strides[nbd] = c + 5; v.strides[nbd + 1] = 1; span = r * (c + 5); }
  for (int d = nbd - 1; d >= 0; d--) {
    if (bmask >> d & 1) { v.strides[d] = 0; continue; }
    v.strides[d] = span + 1;
    span = (span + 1) * batch[d];
  }
  *n = span + 1;
  v.data = malloc((size_t)*n * nb_dtype_size(dt));
  for (int64_t i = 0; i < *n; i++) st(v.data, dt, i, fill_random ? rnd() : 7.0);
  return v;
}

/* Element offset of batch entry bi (row-major over the batch axes). */
static int64_t boff(const nb_kview *v, int nbd, int64_t bi) {
  int64_t off = 0;
  for (int d = nbd - 1; d >= 0; d--) {
    off += (bi % v->shape[d]) * v->strides[d];
    bi /= v->shape[d];
  }
  return off;
}

static double rtol_of(nb_dtype dt) {
  return dt == NB_F64 ? 1e-12 : dt == NB_F32 ? 1e-5 : dt == NB_F16 ? 2e-3 : 1e-2;
}

/* Compares every output element with the reference, and checks that the
 * storage outside the view still holds the sentinel. */
static int verify(const nb_kview *o, const nb_kview *a, const nb_kview *b, int nbd,
                  int64_t nbatch, int64_t M, int64_t N, int64_t K, int64_t on, double *worst) {
  nb_dtype dt = o->dtype;
  double rtol = rtol_of(dt), atol = dt == NB_F16 ? 6e-8 : 1e-30;
  char *touched = calloc((size_t)on, 1);
  int ok = 1;
  *worst = 0;
  for (int64_t bi = 0; bi < nbatch; bi++) {
    int64_t oa = boff(a, nbd, bi), ob = boff(b, nbd, bi), oo = boff(o, nbd, bi);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; k++) {
          double x = ld(a->data, dt, oa + i * a->strides[nbd] + k * a->strides[nbd + 1]);
          double y = ld(b->data, dt, ob + k * b->strides[nbd] + j * b->strides[nbd + 1]);
          ref += x * y;
          mag += fabs(x * y);
        }
        int64_t oi = oo + i * o->strides[nbd] + j * o->strides[nbd + 1];
        touched[oi] = 1;
        double err = fabs(ld(o->data, dt, oi) - ref) / (rtol * mag + atol);
        if (!(err <= 1.0)) ok = 0;
        if (err > *worst || err != err) *worst = err;
      }
  }
  for (int64_t i = 0; i < on; i++)
    if (!touched[i] && ld(o->data, dt, i) != 7.0) ok = 0;
  free(touched);
  return ok;
}

/* One product: layouts la, lb, lo for a, b, out; masks of broadcast batch
 * axes for a and b. */
static void run_case(nb_dtype dt, int nbd, const int64_t *batch, int64_t M, int64_t N, int64_t K,
                     int la, int lb, int lo, int ma, int mb) {
  int64_t an, bn, on, nbatch = 1;
  for (int d = 0; d < nbd; d++) nbatch *= batch[d];
  nb_kview a = mkview(nbd, batch, M, K, la, ma, dt, 1, &an);
  nb_kview b = mkview(nbd, batch, K, N, lb, mb, dt, 1, &bn);
  nb_kview o = mkview(nbd, batch, M, N, lo, 0, dt, 0, &on);
  nb_status s = nb_cpu_matmul(&o, &a, &b);
  double worst = 0;
  int ok = s == NB_OK && verify(&o, &a, &b, nbd, nbatch, M, N, K, on, &worst);
  CHECK(ok, "%s batch %lld (%d axes, bcast a %d b %d) M=%lld N=%lld K=%lld a %s b %s out %s: "
        "status %d, worst error %.3g of tolerance", nb_dtype_name(dt), (long long)nbatch, nbd,
        ma, mb, (long long)M, (long long)N, (long long)K, lname[la], lname[lb], lname[lo], s,
        worst);
  free(a.data);
  free(b.data);
  free(o.data);
}

static const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};

/* Fixed shapes: 1s, primes, tails of the register tile and cache blocks. */
static void test_shapes(void) {
  static const int64_t sh[][3] = {
      {1, 1, 1},     {7, 13, 5},    {13, 7, 5},    {129, 67, 255}, {129, 255, 67},
      {300, 1, 300}, {1, 300, 300}, {300, 300, 1}, {12, 32, 384},  {13, 33, 385},
      {25, 530, 3},  {37, 41, 777}, {2, 3, 4},     {64, 64, 16},   {100, 16, 64},
      {1601, 20, 7}, {23, 1030, 9}, {5, 29, 2},    {29, 45, 31},   {12, 32, 16},
      {100, 70, 100}, {511, 31, 256}, {4, 8, 300}, {600, 500, 17}};
  int n = (int)(sizeof sh / sizeof sh[0]);
  for (int d = 0; d < 4; d++)
    for (int s = 0; s < n; s++) {
      int la = s % L_COUNT, lb = (s / L_COUNT) % L_COUNT, lo = (s + d) % L_COUNT;
      run_case(dts[d], 0, NULL, sh[s][0], sh[s][1], sh[s][2], L_CONTIG, L_CONTIG, L_CONTIG, 0, 0);
      run_case(dts[d], 0, NULL, sh[s][0], sh[s][1], sh[s][2], la, lb, lo, 0, 0);
    }
}

/* Every layout combination on a shape that takes the packed path. */
static void test_layouts(void) {
  for (int d = 0; d < 4; d++)
    for (int la = 0; la < L_COUNT; la++)
      for (int lb = 0; lb < L_COUNT; lb++)
        for (int lo = 0; lo < L_COUNT; lo++)
          run_case(dts[d], 0, NULL, 45, 70, 33, la, lb, lo, 0, 0);
}

/* Random shapes in [1, 90]. */
static void test_random(void) {
  for (int t = 0; t < 60; t++) {
    int64_t M = 1 + (int64_t)((rnd() + 1) * 45), N = 1 + (int64_t)((rnd() + 1) * 45);
    int64_t K = 1 + (int64_t)((rnd() + 1) * 45);
    run_case(dts[t % 4], 0, NULL, M, N, K, t % 4, (t / 4) % 4, (t / 16) % 4, 0, 0);
  }
}

/* Batch axes, broadcast ones included; counts that take the per-batch
 * parallel path and ones that split each matrix. */
static void test_batch(void) {
  int64_t b2[2] = {3, 2}, b1[1] = {5}, b64[1] = {64}, b2s[1] = {2}, b1s[1] = {1};
  for (int d = 0; d < 4; d++) {
    run_case(dts[d], 2, b2, 9, 17, 11, L_CONTIG, L_CONTIG, L_CONTIG, 1, 2);
    run_case(dts[d], 2, b2, 40, 50, 30, L_TRANS, L_STRIDED, L_CONTIG, 2, 1);
    run_case(dts[d], 1, b1, 97, 45, 20, L_CONTIG, L_TRANS, L_STRIDED, 0, 1);
    run_case(dts[d], 1, b1, 3, 200, 20, L_STRIDED, L_CONTIG, L_TRANS, 1, 0);
    run_case(dts[d], 1, b64, 64, 64, 16, L_CONTIG, L_TRANS, L_CONTIG, 0, 0);
    run_case(dts[d], 1, b2s, 130, 70, 50, L_CONTIG, L_CONTIG, L_CONTIG, 0, 1);
    run_case(dts[d], 1, b1s, 150, 90, 40, L_TRANS, L_TRANS, L_TRANS, 0, 0);
    run_case(dts[d], 1, b64, 64, 64, 16, L_PADDED, L_PADDED, L_PADDED, 0, 1);
    run_case(dts[d], 2, b2, 33, 47, 24, L_PADDED, L_CONTIG, L_CONTIG, 1, 0);
  }
}

/* Larger products crossing every cache block, multi-threaded. */
static void test_large(void) {
  run_case(NB_F32, 0, NULL, 1600, 600, 800, L_CONTIG, L_CONTIG, L_CONTIG, 0, 0);
  run_case(NB_F32, 0, NULL, 257, 1100, 400, L_TRANS, L_TRANS, L_CONTIG, 0, 0);
  run_case(NB_F64, 0, NULL, 800, 300, 600, L_CONTIG, L_TRANS, L_CONTIG, 0, 0);
  run_case(NB_BF16, 0, NULL, 300, 530, 700, L_CONTIG, L_CONTIG, L_STRIDED, 0, 0);
  run_case(NB_F16, 0, NULL, 200, 600, 500, L_TRANS, L_CONTIG, L_CONTIG, 0, 0);
}

/* The same product on 1 and on all threads (whose split of each matrix
 * differs) gives the same bits. */
static void test_thread_invariance(void) {
#ifdef _OPENMP
  static const int64_t sh[][4] = {{1, 600, 40, 30}, {5, 97, 45, 20}, {1, 300, 530, 700},
                                  {3, 7, 200, 20}, {1, 40, 600, 100}};
  int nthr = omp_get_max_threads();
  for (int d = 0; d < 4; d++)
    for (int s = 0; s < 5; s++) {
      int64_t an, bn, on, batch[1] = {sh[s][0]};
      nb_kview a = mkview(1, batch, sh[s][1], sh[s][3], s % 2 ? L_TRANS : L_CONTIG, 0, dts[d], 1, &an);
      nb_kview b = mkview(1, batch, sh[s][3], sh[s][2], s % 3 ? L_CONTIG : L_TRANS, 0, dts[d], 1, &bn);
      nb_kview o1 = mkview(1, batch, sh[s][1], sh[s][2], L_CONTIG, 0, dts[d], 0, &on);
      nb_kview o2 = mkview(1, batch, sh[s][1], sh[s][2], L_CONTIG, 0, dts[d], 0, &on);
      omp_set_num_threads(1);
      nb_status s1 = nb_cpu_matmul(&o1, &a, &b);
      omp_set_num_threads(nthr);
      nb_status s2 = nb_cpu_matmul(&o2, &a, &b);
      CHECK(s1 == NB_OK && s2 == NB_OK &&
                !memcmp(o1.data, o2.data, (size_t)on * nb_dtype_size(dts[d])),
            "%s batch %lld M=%lld N=%lld K=%lld: 1 and %d threads give different bits",
            nb_dtype_name(dts[d]), (long long)sh[s][0], (long long)sh[s][1],
            (long long)sh[s][2], (long long)sh[s][3], nthr);
      free(a.data); free(b.data); free(o1.data); free(o2.data);
    }
#endif
}

/* K == 0 writes zeros; empty outputs write nothing; bad dtypes are errors. */
static void test_edges(void) {
  for (int d = 0; d < 4; d++) {
    int64_t an, bn, on;
    nb_kview a = mkview(0, NULL, 4, 0, L_CONTIG, 0, dts[d], 1, &an);
    nb_kview b = mkview(0, NULL, 0, 6, L_CONTIG, 0, dts[d], 1, &bn);
    nb_kview o = mkview(0, NULL, 4, 6, L_STRIDED, 0, dts[d], 0, &on);
    nb_status s = nb_cpu_matmul(&o, &a, &b);
    int zeros = 0;
    for (int64_t i = 0; i < 4; i++)
      for (int64_t j = 0; j < 6; j++) zeros += ld(o.data, dts[d], i * o.strides[0] + j * o.strides[1]) == 0.0;
    CHECK(s == NB_OK && zeros == 24, "%s K=0: status %d, %d of 24 zeros", nb_dtype_name(dts[d]), s, zeros);
    free(a.data); free(b.data); free(o.data);
  }
  int64_t an, bn, on;
  nb_kview a = mkview(0, NULL, 0, 5, L_CONTIG, 0, NB_F32, 1, &an);
  nb_kview b = mkview(0, NULL, 5, 3, L_CONTIG, 0, NB_F32, 1, &bn);
  nb_kview o = mkview(0, NULL, 0, 3, L_CONTIG, 0, NB_F32, 0, &on);
  CHECK(nb_cpu_matmul(&o, &a, &b) == NB_OK && ld(o.data, NB_F32, 0) == 7.0, "M=0 writes nothing");
  a.dtype = NB_I32;
  CHECK(nb_cpu_matmul(&o, &a, &b) == NB_ERR_DTYPE, "mixed dtypes rejected");
  free(a.data); free(b.data); free(o.data);
}

/* ---- gemm_ex: the product with an epilogue ---------------------------------
 * pre = alpha P + beta c + bias, aux = pre, out = gelu_tanh(pre) or pre,
 * against float64 from the values read; per element the tolerance is
 * rtol(out) * (|alpha| sum|a b| + |beta c| + |bias| + |pre|). */
static double gelu_ref(double x) { return 0.5 * x * (1 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))); }

static void ex_case(nb_dtype dt, nb_dtype od, int la, int lb, int lo, int variant) {
  const int64_t M = 13, N = 22, K = 37;
  int64_t an, bn, on, cn, xn, bsn;
  nb_kview a = mkview(0, NULL, M, K, la, 0, dt, 1, &an), b = mkview(0, NULL, K, N, lb, 0, dt, 1, &bn);
  nb_kview o = mkview(0, NULL, M, N, lo, 0, od, variant == 4, &on);
  nb_kview c = mkview(0, NULL, M, N, (lo + 1) % L_COUNT, 0, od, 1, &cn);
  nb_kview x = mkview(0, NULL, M, N, (lo + 2) % L_COUNT, 0, od, 0, &xn);
  nb_kview bias = mkview(0, NULL, 1, N, lb, 0, od, 1, &bsn);
  bias.ndim = 1;
  bias.strides[0] = bias.strides[1];
  bias.shape[0] = N;
  /* 0 plain, 1 bias, 2 alpha beta c bias, 3 bias aux gelu, 4 c = out in place */
  nb_gemm_epilogue ep = {variant ? &bias : NULL, variant == 2 ? &c : variant == 4 ? &o : NULL,
                         variant == 3 ? &x : NULL, variant == 2 ? 1.5f : 1.0f,
                         variant == 2 ? -0.5f : variant == 4 ? 1.0f : 0.0f, variant == 3};
  double *c0 = malloc((size_t)(M * N) * sizeof *c0);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++)
      c0[i * N + j] = ep.c ? ld(ep.c->data, od, i * ep.c->strides[0] + j * ep.c->strides[1]) : 0;
  nb_status s = nb_cpu_gemm_ex(&o, &a, &b, variant ? &ep : NULL);
  double rtol = rtol_of(od) * 2, worst = 0;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double p = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) {
        double u = ld(a.data, dt, i * a.strides[0] + k * a.strides[1]);
        double v = ld(b.data, dt, k * b.strides[0] + j * b.strides[1]);
        p += u * v;
        mag += fabs(u * v);
      }
      double bj = ep.bias ? ld(bias.data, od, j * bias.strides[0]) : 0;
      double pre = ep.alpha * p + ep.beta * c0[i * N + j] + bj;
      double tol = rtol * (fabs(ep.alpha) * mag + fabs(ep.beta * c0[i * N + j]) + fabs(bj) + fabs(pre)) + 1e-6;
      double got = ld(o.data, od, i * o.strides[0] + j * o.strides[1]);
      double e = fabs(got - (ep.gelu ? gelu_ref(pre) : pre)) / tol;
      if (ep.aux) e = fmax(e, fabs(ld(x.data, od, i * x.strides[0] + j * x.strides[1]) - pre) / tol);
      if (!(e <= worst)) worst = e;
    }
  CHECK(s == NB_OK && worst <= 1.0, "gemm_ex %s -> %s variant %d a %s b %s out %s: status %d, worst "
        "error %.3g of tolerance", nb_dtype_name(dt), nb_dtype_name(od), variant, lname[la],
        lname[lb], lname[lo], s, worst);
  free(c0); free(a.data); free(b.data); free(o.data); free(c.data); free(x.data); free(bias.data);
}

static void test_gemm_ex(void) {
  for (int d = 0; d < 4; d++)
    for (int v = 0; v < 5; v++) {
      ex_case(dts[d], dts[d], v % L_COUNT, (v + 1) % L_COUNT, (v + 2) % L_COUNT, v);
      if (dts[d] == NB_F16 || dts[d] == NB_BF16) ex_case(dts[d], NB_F32, L_TRANS, L_CONTIG, L_CONTIG, v);
    }
  int64_t an, bn, on;
  nb_kview a = mkview(0, NULL, 4, 5, L_CONTIG, 0, NB_BF16, 1, &an);
  nb_kview b = mkview(0, NULL, 5, 6, L_CONTIG, 0, NB_BF16, 1, &bn);
  nb_kview o = mkview(0, NULL, 4, 6, L_CONTIG, 0, NB_F16, 0, &on);
  CHECK(nb_cpu_gemm_ex(&o, &a, &b, NULL) == NB_ERR_DTYPE && strstr(nb_last_error(), "gemm_ex"),
        "gemm_ex: bf16 operands into an f16 out is a dtype error (%s)", nb_last_error());
  o.dtype = NB_BF16;
  nb_kview bias = a;
  bias.ndim = 1;
  bias.shape[0] = 5;
  nb_gemm_epilogue ep = {&bias, NULL, NULL, 1.0f, 0.0f, 0};
  CHECK(nb_cpu_gemm_ex(&o, &a, &b, &ep) == NB_ERR_SHAPE && strstr(nb_last_error(), "bias"),
        "gemm_ex: a (5,) bias for 6 columns is a shape error naming bias (%s)", nb_last_error());
  free(a.data); free(b.data); free(o.data);
}

int main(void) {
  printf("gemm kernel: isa %s\n", nb_cpu_gemm_isa());
  test_shapes();
  test_layouts();
  test_random();
  test_batch();
  test_large();
  test_thread_invariance();
  test_edges();
  test_gemm_ex();
  return nbt_finish();
}
