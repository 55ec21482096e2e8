/* The fp8 dtypes (NB_F8E4M3, NB_F8E5M2) and nb_scaled_mm on the CPU, against
 * float64 references written here from the formats' definitions:
 *   - every one of the 256 codes of each format decoded (host function and
 *     casts to f64/f32/f16/bf16), and cast back to the same code;
 *   - f32 and f64 to fp8 against a brute-force nearest-code search (ties to
 *     the even code; e4m3 past 464 and e5m2 from 61440 overflow, to NaN and
 *     infinity as PyTorch's casts do): every code, every midpoint between
 *     neighbours and the f32 values next to it, random values, specials;
 *   - an f64 just above a midpoint rounds up (no double rounding via f32);
 *   - integer casts, fill, views and clone of fp8 tensors;
 *   - scaled_mm against a float64 product of the decoded values, odd sizes,
 *     scales other than 1, every format mix, bf16/f16/f32 out, strided views;
 *   - errors: every other op refuses fp8 naming op and dtype, scaled_mm's
 *     checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The value of code c: E4M3 (4 exponent bits, bias 7, no infinities, NaN
 * at S.1111.111) or E5M2 (5 exponent bits, bias 15, IEEE specials). */
static double ref_decode(int e4, unsigned c) {
  int mb = e4 ? 3 : 2, eb = e4 ? 4 : 5, bias = e4 ? 7 : 15;
  unsigned e = (c >> mb) & ((1u << eb) - 1), m = c & ((1u << mb) - 1);
  double s = (c & 0x80) ? -1.0 : 1.0;
  if (e4 && e == 15 && m == 7) return NAN;
  if (!e4 && e == 31) return m ? NAN : s * INFINITY;
  if (e == 0) return s * m * pow(2.0, 1 - bias - mb);
  return s * (1.0 + m / (double)(1u << mb)) * pow(2.0, (double)e - bias);
}

/* Nearest code to x by search over the non-negative finite codes plus the
 * overflow point (the next value past the largest: 480 for e4m3 whose code
 * would be NaN, 65536 for e5m2 whose code is infinity); ties to the even
 * code. */
static unsigned ref_encode(int e4, double x) {
  unsigned sign = signbit(x) ? 0x80 : 0, maxc = e4 ? 0x7e : 0x7b, ovf = e4 ? 0x7f : 0x7c;
  if (x != x) return sign | 0x7f;
  double a = fabs(x), over = e4 ? 480.0 : 65536.0;
  unsigned best = 0;
  double bd = INFINITY;
  for (unsigned c = 0; c <= maxc + 1; c++) {
    double v = c <= maxc ? ref_decode(e4, c) : over, d = fabs(a - v);
    if (d < bd || (d == bd && !(c & 1))) bd = d, best = c;
  }
  if (a > over) best = maxc + 1;
  return sign | (best > maxc ? ovf : best);
}

static int same_code(int e4, unsigned got, unsigned want) {
  double g = ref_decode(e4, got), w = ref_decode(e4, want);
  if (w != w) return g != g; /* any NaN code for NaN */
  return got == want;
}

static unsigned enc32(int e4, float x) { return e4 ? nb_f32_to_f8e4m3(x) : nb_f32_to_f8e5m2(x); }
static float dec32(int e4, unsigned c) { return e4 ? nb_f8e4m3_to_f32((uint8_t)c) : nb_f8e5m2_to_f32((uint8_t)c); }
static nb_dtype f8dt(int e4) { return e4 ? NB_F8E4M3 : NB_F8E5M2; }

static void test_decode_all(void) {
  for (int e4 = 0; e4 < 2; e4++) {
    uint8_t codes[256];
    for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
    nb_tensor *t = nb_from_buffer(codes, 1, (int64_t[]){256}, f8dt(e4), NB_DEVICE_CPU);
    int bad = 0, bad_cast[4] = {0}, bad_back = 0;
    const nb_dtype to[4] = {NB_F64, NB_F32, NB_F16, NB_BF16};
    for (int c = 0; c < 256; c++) {
      double r = ref_decode(e4, (unsigned)c), g = dec32(e4, (unsigned)c);
      bad += r == r ? !(g == r && signbit(g) == signbit(r)) : g == g;
    }
    for (int k = 0; k < 4; k++) {
      nb_tensor *y = nb_cast(t, to[k]), *back = nb_cast(y, f8dt(e4));
      for (int c = 0; c < 256; c++) {
        double r = ref_decode(e4, (unsigned)c), g = nb_item(nb_slice(y, 0, c, c + 1, 1));
        bad_cast[k] += r == r ? !(g == r) : g == g;
        unsigned b = ((const uint8_t *)nb_data_ptr(back))[c];
        bad_back += !same_code(e4, b, (unsigned)c);
      }
    }
    NBT_CHECK(bad == 0, "%s: %d of 256 codes decoded wrong", nb_dtype_name(f8dt(e4)), bad);
    for (int k = 0; k < 4; k++)
      NBT_CHECK(bad_cast[k] == 0, "%s -> %s: %d of 256 codes wrong", nb_dtype_name(f8dt(e4)),
                nb_dtype_name(to[k]), bad_cast[k]);
    NBT_CHECK(bad_back == 0, "%s round trip through 4 dtypes: %d codes changed", nb_dtype_name(f8dt(e4)), bad_back);
  }
}

/* f32 values: each code's value, each midpoint between neighbours and one
 * f32 step either side, random values over the range, specials. */
static int encode_values(int e4, float *v, int cap) {
  int n = 0;
  unsigned maxc = e4 ? 0x7e : 0x7b;
  for (unsigned c = 0; c <= maxc; c++) {
    double lo = ref_decode(e4, c), hi = c < maxc ? ref_decode(e4, c + 1) : (e4 ? 480.0 : 65536.0);
    float mid = (float)((lo + hi) / 2); /* exact: few bits */
    float vs[5] = {(float)lo, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), (float)(lo * 0.75 + hi * 0.25)};
    for (int k = 0; k < 5 && n + 2 <= cap; k++) v[n++] = vs[k], v[n++] = -vs[k];
  }
  float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, 1e-45f, 3e38f, 1e6f, 500.0f, 464.0f,
                470.0f, 479.9f, 480.0f, 57344.0f, 61439.0f, 61440.0f, 65535.0f, 65536.0f, 1e-7f};
  for (int k = 0; k < (int)(sizeof sp / sizeof *sp) && n < cap; k++) v[n++] = sp[k];
  uint64_t s = 88172645463325252ull;
  while (n < cap) { /* random f32 of random exponent in [2^-20, 2^18) */
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v[n++] = (float)ldexp((double)(s >> 11) / 9007199254740992.0 * ((s & 1) ? 1 : -1), (int)(s % 38) - 20);
  }
  return n;
}

static void test_encode(void) {
  enum { CAP = 4096 };
  static float v[CAP];
  for (int e4 = 0; e4 < 2; e4++) {
    int n = encode_values(e4, v, CAP), bad = 0, bad_t32 = 0, bad_t64 = 0, first = -1;
    nb_tensor *x32 = nb_from_buffer(v, 1, (int64_t[]){n}, NB_F32, NB_DEVICE_CPU);
    nb_tensor *y32 = nb_cast(x32, f8dt(e4)), *y64 = nb_cast(nb_cast(x32, NB_F64), f8dt(e4));
    const uint8_t *p32 = nb_data_ptr(y32), *p64 = nb_data_ptr(y64);
    for (int i = 0; i < n; i++) {
      unsigned want = ref_encode(e4, v[i]);
      if (!same_code(e4, enc32(e4, v[i]), want)) bad++, first = first < 0 ? i : first;
      bad_t32 += !same_code(e4, p32[i], want);
      bad_t64 += !same_code(e4, p64[i], want);
    }
    NBT_CHECK(bad == 0, "%s: %d of %d f32 values encoded wrong (first %.9g: %#x, expected %#x)",
              nb_dtype_name(f8dt(e4)), bad, n, first >= 0 ? v[first] : 0.0,
              first >= 0 ? enc32(e4, v[first]) : 0, first >= 0 ? ref_encode(e4, v[first]) : 0);
    NBT_CHECK(bad_t32 == 0 && bad_t64 == 0, "%s casts: %d (from f32), %d (from f64) of %d wrong",
              nb_dtype_name(f8dt(e4)), bad_t32, bad_t64, n);
    /* PyTorch's overflow rule, spelled out */
    NBT_CHECK(enc32(e4, 448.0f) == (e4 ? 0x7eu : 0x5fu) && enc32(e4, -INFINITY) == (e4 ? 0xffu : 0xfcu),
              "%s: 448 and -inf", nb_dtype_name(f8dt(e4)));
  }
  NBT_CHECK(nb_f32_to_f8e4m3(464.0f) == 0x7e && nb_f32_to_f8e4m3(464.1f) == 0x7f && nb_f32_to_f8e4m3(1e9f) == 0x7f,
            "e4m3: 464 rounds to 448 (even), above it NaN");
  NBT_CHECK(nb_f32_to_f8e5m2(61439.0f) == 0x7b && nb_f32_to_f8e5m2(61440.0f) == 0x7c,
            "e5m2: below 61440 to 57344, 61440 to infinity");
  NBT_CHECK(nb_f32_to_f8e4m3(-0.0f) == 0x80 && nb_f32_to_f8e4m3(ldexpf(1, -10)) == 0 &&
            nb_f32_to_f8e4m3(nextafterf(ldexpf(1, -10), 1)) == 1, "e4m3: -0, half the smallest subnormal to 0");
  /* one rounding from f64: 1 + 2^-4 is e4m3's midpoint between 1 and 1.125 (tie
   * to 1.0); 2^-40 above it must round up, which through f32 it would not */
  double up = 1.0 + ldexp(1, -4) + ldexp(1, -40);
  nb_tensor *d = nb_scalar(up, NB_F64, NB_DEVICE_CPU);
  NBT_CHECK(((uint8_t *)nb_data_ptr(nb_cast(d, NB_F8E4M3)))[0] == 0x39, "f64 1 + 2^-4 + 2^-40 to e4m3 1.125");
  NBT_CHECK(((uint8_t *)nb_data_ptr(nb_cast(nb_scalar(1.0 + ldexp(1, -4), NB_F64, NB_DEVICE_CPU), NB_F8E4M3)))[0] == 0x38,
            "f64 1 + 2^-4 to e4m3 1.0 (tie to even)");
}

static void test_ints_fill_views(void) {
  int64_t iv[6] = {-3, 0, 7, 300, 1000, -100000};
  nb_tensor *i = nb_from_buffer(iv, 1, (int64_t[]){6}, NB_I64, NB_DEVICE_CPU);
  nb_tensor *f = nb_cast(i, NB_F8E4M3);
  const uint8_t *p = nb_data_ptr(f);
  int ok = 1;
  for (int k = 0; k < 6; k++) ok &= same_code(1, p[k], ref_encode(1, (double)iv[k]));
  NBT_CHECK(ok, "i64 -> e4m3 rounds each value once");
  nb_tensor *back = nb_cast(nb_cast(nb_from_buffer((float[]){-2.75f, 3.5f, 448.0f}, 1, (int64_t[]){3}, NB_F32,
                                                  NB_DEVICE_CPU), NB_F8E4M3), NB_I32);
  const int32_t *q = nb_data_ptr(back);
  NBT_CHECK(q[0] == -2 && q[1] == 3 && q[2] == 448, "e4m3 -> i32 truncates (%d %d %d)", q[0], q[1], q[2]);
  nb_tensor *full = nb_full(2, (int64_t[]){2, 3}, 1.1, NB_F8E5M2, NB_DEVICE_CPU);
  NBT_CHECK(full && ((uint8_t *)nb_data_ptr(full))[5] == nb_f32_to_f8e5m2(1.1f), "full in e5m2");
  nb_tensor *tr = nb_transpose(full, 0, 1), *cl = nb_clone(tr), *rs = nb_reshape(cl, 1, (int64_t[]){6});
  NBT_CHECK(tr && cl && rs && nb_dtype_of(rs) == NB_F8E5M2, "views and clone of fp8: %s", nb_last_error());
  char b[200];
  nb_describe(full, b, sizeof b);
  NBT_CHECK(strstr(b, "f8e5m2") != NULL, "describe names the dtype: %s", b);
  NBT_CHECK(nb_dtype_size(NB_F8E4M3) == 1 && !strcmp(nb_dtype_name(NB_F8E4M3), "f8e4m3") &&
            !nb_dtype_is_float(NB_F8E4M3) && nb_dtype_is_fp8(NB_F8E5M2), "dtype table");
  NBT_CHECK(nb_promote(NB_F8E4M3, NB_F8E5M2) == NB_F16 && nb_promote(NB_F8E4M3, NB_BF16) == NB_BF16 &&
            nb_promote(NB_I64, NB_F8E4M3) == NB_F8E4M3, "promotion");
}

/* A random (r, c) fp8 tensor of finite codes of moderate size (|v| <= 2^6
 * for e5m2, so f64 sums of products stay exact), and their values. */
static nb_tensor *rand_f8(int e4, int64_t r, int64_t c, uint64_t seed, double *val) {
  uint8_t *b = malloc((size_t)(r * c));
  for (int64_t i = 0; i < r * c; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    unsigned code = (unsigned)(seed >> 56);
    while (!(fabs(ref_decode(e4, code)) <= (e4 ? 448.0 : 64.0))) code = (code * 7 + 3) & 0xff;
    b[i] = (uint8_t)code;
    val[i] = ref_decode(e4, code);
  }
  nb_tensor *t = nb_from_buffer(b, 2, (int64_t[]){r, c}, f8dt(e4), NB_DEVICE_CPU);
  free(b);
  return t;
}

static void smm_case(int64_t M, int64_t N, int64_t K, int ea, int eb, nb_dtype od, int bt, int aview) {
  nb_scope_begin();
  double *A = malloc(sizeof(double) * M * K * 2), *B = malloc(sizeof(double) * K * N);
  /* a: (M, K), or the even columns of (M, 2K) as a strided view */
  nb_tensor *a = rand_f8(ea, M, aview ? 2 * K : K, 11 + M, A);
  if (aview) a = nb_slice(a, 1, 0, 2 * K, 2);
  /* b: (K, N) row-major, or the transpose of a row-major (N, K) (NT) */
  nb_tensor *b = bt ? nb_transpose(rand_f8(eb, N, K, 5 + N, B), 0, 1) : rand_f8(eb, K, N, 5 + N, B);
  float sa = od == NB_F16 ? 0.375f / 4096 : 0.375f, sb = 2.5f; /* f16: no overflow past 65504 */
  nb_tensor *y = nb_scaled_mm(a, b, nb_scalar(sa, NB_F32, NB_DEVICE_CPU), nb_scalar(sb, NB_F32, NB_DEVICE_CPU), od);
  int bad = 0;
  double worst = 0;
  if (y) {
    nb_tensor *y64 = nb_cast(y, NB_F64);
    const double *o = nb_data_ptr(y64);
    double half = od == NB_F32 ? ldexp(1, -24) : od == NB_F16 ? ldexp(1, -11) : ldexp(1, -8);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
          s += A[i * (aview ? 2 * K : K) + (aview ? 2 * k : k)] * (bt ? B[j * K + k] : B[k * N + j]);
        double ref = (double)sa * sb * s, e = fabs(o[i * N + j] - ref);
        /* rounded once: within half an ulp (relative), subnormals of f16 aside */
        double lim = half * fabs(ref) * 1.0000001 + (od == NB_F16 ? ldexp(1, -25) : 0);
        if (e > lim) bad++;
        if (e / (fabs(ref) + 1e-300) > worst && ref != 0) worst = e / fabs(ref);
      }
  }
  NBT_CHECK(y && bad == 0, "scaled_mm %lldx%lldx%lld %s x %s -> %s%s%s: %d outside half an ulp (worst rel %.3g) %s",
            (long long)M, (long long)N, (long long)K, nb_dtype_name(f8dt(ea)), nb_dtype_name(f8dt(eb)),
            nb_dtype_name(od), bt ? " NT" : "", aview ? " strided a" : "", bad, worst, y ? "" : nb_last_error());
  free(A);
  free(B);
  nb_scope_end();
}

static void test_scaled_mm(void) {
  const nb_dtype OD[3] = {NB_BF16, NB_F32, NB_F16};
  const int64_t S[][3] = {{1, 1, 1}, {7, 5, 33}, {65, 130, 48}, {3, 257, 200}};
  int k = 0;
  for (int s = 0; s < 4; s++)
    for (int ea = 0; ea < 2; ea++)
      for (int eb = 0; eb < 2; eb++, k++) smm_case(S[s][0], S[s][1], S[s][2], ea, eb, OD[k % 3], k % 2, k % 4 == 3);
  smm_case(17, 9, 0, 1, 1, NB_F32, 1, 0); /* K = 0: zeros */
  nb_scope_begin();
  nb_tensor *z = nb_scaled_mm(nb_empty(2, (int64_t[]){3, 0}, NB_F8E4M3, NB_DEVICE_CPU),
                              nb_empty(2, (int64_t[]){0, 4}, NB_F8E4M3, NB_DEVICE_CPU),
                              nb_scalar(1, NB_F32, NB_DEVICE_CPU), nb_scalar(1, NB_F32, NB_DEVICE_CPU), NB_F32);
  NBT_CHECK(z && nb_item(nb_sum(nb_abs(z), 0, NULL, 0)) == 0.0, "K = 0 gives zeros");
  nb_scope_end();
}

static void test_errors(void) {
  nb_scope_begin();
  nb_tensor *a = nb_cast(nb_ones(2, (int64_t[]){4, 8}, NB_F32, NB_DEVICE_CPU), NB_F8E4M3);
  nb_tensor *b = nb_cast(nb_ones(2, (int64_t[]){8, 3}, NB_F32, NB_DEVICE_CPU), NB_F8E5M2);
  nb_tensor *s = nb_scalar(1, NB_F32, NB_DEVICE_CPU), *bf = nb_ones(2, (int64_t[]){8, 3}, NB_BF16, NB_DEVICE_CPU);
  nbt_check_error("add of fp8", nb_add(a, a) == NULL, NB_ERR_DTYPE, "add", "f8e4m3", "storage-only", NULL);
  nbt_check_error("exp of fp8", nb_exp(b) == NULL, NB_ERR_DTYPE, "exp", "f8e5m2", NULL);
  nbt_check_error("matmul of fp8", nb_matmul(a, b) == NULL, NB_ERR_DTYPE, "matmul", "f8e4m3", NULL);
  nbt_check_error("sum of fp8", nb_sum(a, 0, NULL, 0) == NULL, NB_ERR_DTYPE, "sum", "f8e4m3", NULL);
  nbt_check_error("requires_grad on fp8", nb_set_requires_grad(a, 1) != NB_OK, NB_ERR_DTYPE, "f8e4m3", NULL);
  nbt_check_error("randint into fp8", nb_randint(&(nb_rng){1, 0}, 1, (int64_t[]){2}, 0, 3, NB_F8E4M3,
                                                  NB_DEVICE_CPU) == NULL, NB_ERR_DTYPE, "randint", "f8e4m3", NULL);
  nbt_check_error("scaled_mm of bf16", nb_scaled_mm(a, bf, s, s, NB_BF16) == NULL, NB_ERR_DTYPE, "scaled_mm",
                  "bf16", "f8e4m3 or f8e5m2", NULL);
  nbt_check_error("scaled_mm K mismatch", nb_scaled_mm(a, nb_transpose(b, 0, 1), s, s, NB_BF16) == NULL,
                  NB_ERR_SHAPE, "scaled_mm", "[4, 8]", "[3, 8]", NULL);
  nbt_check_error("scaled_mm f64 scale", nb_scaled_mm(a, b, nb_scalar(1, NB_F64, NB_DEVICE_CPU), s, NB_BF16) == NULL,
                  NB_ERR_DTYPE, "scaled_mm", "scale_a", "one-element f32", NULL);
  nbt_check_error("scaled_mm 2-element scale",
                  nb_scaled_mm(a, b, s, nb_ones(1, (int64_t[]){2}, NB_F32, NB_DEVICE_CPU), NB_BF16) == NULL,
                  NB_ERR_DTYPE, "scaled_mm", "scale_b", NULL);
  nbt_check_error("scaled_mm f64 out", nb_scaled_mm(a, b, s, s, NB_F64) == NULL, NB_ERR_DTYPE, "scaled_mm",
                  "out_dtype f64", NULL);
  nbt_check_error("scaled_mm NULL", nb_scaled_mm(a, NULL, s, s, NB_F32) == NULL, NB_ERR_NULL, "scaled_mm", "b", NULL);
  nb_scope_end();
}

int main(void) {
  int64_t live = nb_live_tensors();
  nb_scope_begin();
  test_decode_all();
  test_encode();
  test_ints_fill_views();
  test_scaled_mm();
  test_errors();
  nb_scope_end();
  NBT_CHECK(nb_live_tensors() == live, "no tensors leaked (%lld live)", (long long)(nb_live_tensors() - live));
  return nbt_finish();
}
