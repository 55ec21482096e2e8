/* ==== fp8 casts and nb_scaled_mm (src/backend/cuda/gemm_sm90_fp8.cu) ============
 * Casts: all 256 codes of each format decoded on the device into f64/f32/f16/
 * bf16 equal the CPU's values (NaN as NaN: the device's NaN sign may differ);
 * f32 and f64 values at every code, midpoint and neighbour encoded on the
 * device give the CPU's codes. scaled_mm: CUDA against the CPU (float64 sums,
 * tests/test_fp8.c checks it against float64) on odd sizes, every format mix,
 * bf16/f16/f32 out, scales != 1; NT operands (the sm_90a kernel on a 9.0
 * device: its launch count must grow) and NN ones (the portable kernel), and
 * the NT ones again under NABLA_SCALED_MM=portable. The device accumulates in
 * f32 (the CPU in f64), so results may differ by the f32 sum's rounding:
 * within 2^-16 of sum |a b| s_a s_b per element, plus the output's half ulp. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
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

static void smm_cmp(int64_t M, int64_t N, int64_t K, nb_dtype fa, nb_dtype fb, nb_dtype od, int nt) {
  nb_scope_begin();
  nb_tensor *a = f8_operand(M * 31 + K, M, K, fa);
  nb_tensor *w = nt ? f8_operand(N * 17 + K, N, K, fb) : f8_operand(N * 17 + K, K, N, fb);
  nb_tensor *b = nt ? nb_transpose(w, 0, 1) : w;
  nb_tensor *sa = nb_scalar(0.625, NB_F32, NB_DEVICE_CPU), *sb = nb_scalar(1.75, NB_F32, NB_DEVICE_CPU);
  nb_tensor *ref = nb_scaled_mm(a, b, sa, sb, od);
  nb_tensor *ga = gpu(a), *gw = gpu(w), *gb = nt ? nb_transpose(gw, 0, 1) : gw;
  int64_t before = f8_launches();
  nb_tensor *out = nb_scaled_mm(ga, gb, gpu(sa), gpu(sb), od);
  int64_t after = f8_launches();
  char name[160];
  snprintf(name, sizeof name, "scaled_mm %lldx%lldx%lld %s x %s -> %s %s", (long long)M, (long long)N,
           (long long)K, nb_dtype_name(fa), nb_dtype_name(fb), nb_dtype_name(od), nt ? "NT" : "NN");
  /* bound per element: the tensor core's fp8 sums keep about 14 bits (the
   * H100's FP8 wgmma accumulates each k32 step's products into the f32
   * accumulator at reduced precision, as torch._scaled_mm's use_fast_accum
   * does; the H100 showed errors past 2^-16 of s_a s_b sum |a b| even at
   * K = 16, and up to 4.7 x 2^-14 at K = 128 with f32 out): 2^-13 of that
   * per k32 step, plus the output's ulp */
  nb_tensor *abs_ref = nb_scaled_mm(nb_cast(nb_abs(nb_cast(a, NB_F32)), fa),
                                    nb_cast(nb_abs(nb_cast(b, NB_F32)), fb), sa, sb, NB_F32);
  nb_tensor *o = out ? nb_cast(nb_to_device(out, NB_DEVICE_CPU), NB_F64) : NULL;
  nb_tensor *r = nb_cast(ref, NB_F64), *ar = nb_cast(abs_ref, NB_F64);
  int bad = 0;
  double half = od == NB_F32 ? ldexp(1, -24) : od == NB_F16 ? ldexp(1, -11) : ldexp(1, -8);
  double steps = (double)((K + 31) / 32), worst = 0; /* worst: error / (2^-14 s_a s_b sum|ab|) */
  for (int64_t i = 0; o && i < M * N; i++) {
    double x = ((double *)nb_data_ptr(o))[i], y = ((double *)nb_data_ptr(r))[i];
    double acc = ldexp(((double *)nb_data_ptr(ar))[i], -14);
    double lim = 2 * steps * acc + 2 * half * fabs(y) + 1e-30; /* 2^-13 a step */
    bad += !(fabs(x - y) <= lim);
    if (acc > 0 && fabs(x - y) / acc > worst) worst = fabs(x - y) / acc;
  }
  printf("%s: largest error %.3g x 2^-14 s_a s_b sum|ab| (bound %.0f k32 steps)\n", name, worst, steps);
  NBT_CHECK(o && bad == 0, "%s: %d of %lld outside the bound %s", name, bad, (long long)(M * N),
            o ? "" : nb_last_error());
  if (nt && before >= 0 && K % 16 == 0 && !getenv("NABLA_SCALED_MM"))
    NBT_CHECK(after == before + 1, "%s: the sm_90a kernel ran (%lld launches)", name, (long long)(after - before));
  nb_scope_end();
}

void test_fp8_section(void) {
  nb_scope_begin();
  fp8_decode_cmp(NB_F8E4M3);
  fp8_decode_cmp(NB_F8E5M2);
  fp8_encode_cmp(NB_F8E4M3);
  fp8_encode_cmp(NB_F8E5M2);
  nb_scope_end();
  const int64_t S[][3] = {{1, 1, 16}, {7, 5, 48}, {128, 256, 128}, {129, 257, 144}, {300, 700, 1040}, {517, 263, 2048}};
  const nb_dtype OD[3] = {NB_BF16, NB_F32, NB_F16};
  int ns = quick ? 4 : 6, k = 0;
  for (int s = 0; s < ns; s++)
    for (int fa = 0; fa < 2; fa++)
      for (int fb = 0; fb < 2; fb++, k++) {
        nb_dtype da = fa ? NB_F8E4M3 : NB_F8E5M2, db = fb ? NB_F8E4M3 : NB_F8E5M2;
        smm_cmp(S[s][0], S[s][1], S[s][2], da, db, OD[k % 3], 1);
        if (k % 4 == 0) smm_cmp(S[s][0], S[s][1], S[s][2], da, db, OD[(k + 1) % 3], 0);
      }
  smm_cmp(9, 33, 40, NB_F8E4M3, NB_F8E4M3, NB_BF16, 1); /* K % 16 != 0: portable */
  setenv("NABLA_SCALED_MM", "portable", 1);
  smm_cmp(129, 257, 144, NB_F8E4M3, NB_F8E5M2, NB_BF16, 1);
  smm_cmp(300, 700, 1040, NB_F8E4M3, NB_F8E4M3, NB_F32, 1);
  unsetenv("NABLA_SCALED_MM");
}
