/* Core: dtype conversions and promotion, creation, views and aliasing,
 * scopes and reference counts, RNG reproducibility. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void test_f16_bf16(void) {
  /* exact values, rounding to nearest even, overflow, NaN/inf, subnormals */
  NBT_CHECK(nb_f32_to_f16(1.0f) == 0x3c00, "f16(1)");
  NBT_CHECK(nb_f32_to_f16(-2.0f) == 0xc000, "f16(-2)");
  NBT_CHECK(nb_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
  NBT_CHECK(nb_f32_to_f16(65520.0f) == 0x7c00, "f16 rounds to inf at 65520");
  NBT_CHECK(nb_f32_to_f16(65519.0f) == 0x7bff, "f16 65519 rounds down");
  NBT_CHECK(nb_f32_to_f16(INFINITY) == 0x7c00 && nb_f32_to_f16(-INFINITY) == 0xfc00, "f16 inf");
  NBT_CHECK((nb_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (nb_f32_to_f16(NAN) & 0x3ff), "f16 NaN");
  NBT_CHECK(nb_f32_to_f16(5.9604644775390625e-08f) == 0x0001, "f16 smallest subnormal");
  NBT_CHECK(nb_f32_to_f16(2.98023223876953125e-08f) == 0x0000, "f16 half of smallest ties to even 0");
  NBT_CHECK(nb_f32_to_f16(8.940696716308594e-08f) == 0x0002, "f16 1.5 ulp ties to even 2");
  /* 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even (1) */
  NBT_CHECK(nb_f32_to_f16(1.00048828125f) == 0x3c00, "f16 tie to even down");
  NBT_CHECK(nb_f32_to_f16(1.00146484375f) == 0x3c02, "f16 tie to even up");
  int exact = 1;
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaNs */
    exact &= nb_f32_to_f16(nb_f16_to_f32((uint16_t)h)) == h;
  }
  NBT_CHECK(exact, "every finite f16 round-trips through f32");
  NBT_CHECK(nb_f32_to_bf16(1.0f) == 0x3f80, "bf16(1)");
  NBT_CHECK(nb_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie to even down");
  NBT_CHECK(nb_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 tie to even up");
  NBT_CHECK(nb_f32_to_bf16(3.4e38f) == 0x7f80, "bf16 overflow to inf");
  NBT_CHECK(isnan(nb_bf16_to_f32(nb_f32_to_bf16(NAN))), "bf16 NaN kept");
  NBT_CHECK(nb_bf16_to_f32(nb_f32_to_bf16(-INFINITY)) == -INFINITY, "bf16 -inf kept");
}

/* float64 to f16/bf16 rounds once: values just off a tie of the narrow type
 * must not be rounded to the tie in f32 first (double rounding). */
static void test_f64_to_half(void) {
  nb_scope_begin();
  const double u = ldexp(1.0, -40); /* far below f32's precision at 1 */
  const double h = ldexp(1.0, -11), b = ldexp(1.0, -8); /* half an ulp at 1 of f16, bf16 */
  double v[] = {1 + h + u, -(1 + h + u), 1 + h - u, 1 + h, 1 + 3 * h, 1 + 3 * h - u, 65519.99, 1e300, ldexp(1.0, -25) + u};
  uint16_t f16[] = {0x3c01, 0xbc01, 0x3c00, 0x3c00, 0x3c02, 0x3c01, 0x7bff, 0x7c00, 0x0001};
  double w[] = {1 + b + u, -(1 + b + u), 1 + b - u, 1 + b, 1 + 3 * b, 1 + 3 * b - u, 1e300, 1e-300};
  uint16_t bf16[] = {0x3f81, 0xbf81, 0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80, 0x0000};
  int n16 = (int)(sizeof v / sizeof v[0]), nbf = (int)(sizeof w / sizeof w[0]);
  uint16_t got[16];
  nb_tensor *t = nb_cast(nb_from_buffer(v, 1, (int64_t[]){n16}, NB_F64, NB_DEVICE_CPU), NB_F16);
  NBT_CHECK(t && nb_to_host(t, got, sizeof(uint16_t) * (size_t)n16) == NB_OK, "f64 -> f16 cast");
  for (int i = 0; t && i < n16; i++)
    NBT_CHECK(got[i] == f16[i], "f64 %.17g -> f16 0x%04x (expected 0x%04x)", v[i], got[i], f16[i]);
  /* a strided f64 view goes through the iterator's store, not the flat cast */
  nb_tensor *vs = nb_slice(nb_from_buffer(v, 1, (int64_t[]){n16}, NB_F64, NB_DEVICE_CPU), 0, 0, n16, 2);
  nb_tensor *ts = nb_cast(vs, NB_F16);
  NBT_CHECK(ts && nb_to_host(ts, got, sizeof(uint16_t) * (size_t)nb_numel(ts)) == NB_OK, "strided f64 -> f16");
  for (int i = 0; ts && i < nb_numel(ts); i++)
    NBT_CHECK(got[i] == f16[2 * i], "strided f64 %.17g -> f16 0x%04x (expected 0x%04x)", v[2 * i], got[i], f16[2 * i]);
  nb_tensor *tb = nb_cast(nb_from_buffer(w, 1, (int64_t[]){nbf}, NB_F64, NB_DEVICE_CPU), NB_BF16);
  NBT_CHECK(tb && nb_to_host(tb, got, sizeof(uint16_t) * (size_t)nbf) == NB_OK, "f64 -> bf16 cast");
  for (int i = 0; tb && i < nbf; i++)
    NBT_CHECK(got[i] == bf16[i], "f64 %.17g -> bf16 0x%04x (expected 0x%04x)", w[i], got[i], bf16[i]);
  /* an f64 result stored into an f16 output: the sum 1 + (2^-11 + 2^-40) */
  nb_tensor *s = nb_add(nb_full(1, (int64_t[]){1}, 1.0, NB_F16, NB_DEVICE_CPU),
                        nb_full(1, (int64_t[]){1}, h + u, NB_F64, NB_DEVICE_CPU));
  NBT_CHECK(s && nb_dtype_of(s) == NB_F64, "f16 + f64 is f64");
  NBT_CHECK(nb_copy_(t, nb_expand(s, 1, (int64_t[]){n16})) == NB_OK && nb_get(t, (int64_t[]){0}) == 1 + 2 * h,
            "copy_ of an f64 value into f16 rounds once (got %.10g)", nb_get(t, (int64_t[]){0}));
  nb_scope_end();
}

static void test_promotion(void) {
  NBT_CHECK(nb_promote(NB_F32, NB_F64) == NB_F64, "f32+f64");
  NBT_CHECK(nb_promote(NB_F16, NB_BF16) == NB_F32, "f16+bf16");
  NBT_CHECK(nb_promote(NB_I64, NB_F16) == NB_F16, "i64+f16");
  NBT_CHECK(nb_promote(NB_U8, NB_I32) == NB_I32, "u8+i32");
  NBT_CHECK(nb_promote(NB_BOOL, NB_U8) == NB_U8, "bool+u8");
  NBT_CHECK(nb_promote(NB_BOOL, NB_BOOL) == NB_BOOL, "bool+bool");
  nb_scope_begin();
  nb_tensor *a = nb_full(1, (int64_t[]){3}, 2, NB_I32, NB_DEVICE_CPU);
  nb_tensor *b = nb_full(1, (int64_t[]){3}, 0.5, NB_F16, NB_DEVICE_CPU);
  nb_tensor *c = nb_add(a, b);
  NBT_CHECK(nb_dtype_of(c) == NB_F16 && nb_get(c, (int64_t[]){1}) == 2.5, "i32 + f16 is f16");
  nb_tensor *d = nb_div(a, a);
  NBT_CHECK(nb_dtype_of(d) == NB_F32 && nb_get(d, (int64_t[]){0}) == 1.0, "int / int is f32");
  nb_tensor *e = nb_mul_scalar(a, 1.5);
  NBT_CHECK(nb_dtype_of(e) == NB_F32 && nb_get(e, (int64_t[]){0}) == 3.0, "int * 1.5 is f32");
  nb_tensor *f = nb_mul_scalar(b, 3);
  NBT_CHECK(nb_dtype_of(f) == NB_F16, "f16 * scalar stays f16");
  nb_scope_end();
}

static void test_creation(void) {
  nb_scope_begin();
  nb_tensor *r = nb_arange(0, 5, 1, NB_I64, NB_DEVICE_CPU);
  double ref[] = {0, 1, 2, 3, 4};
  nbt_check_close("arange", r, ref, 0, 0);
  nb_tensor *r2 = nb_arange(1, 0, -0.25, NB_F32, NB_DEVICE_CPU);
  double ref2[] = {1, 0.75, 0.5, 0.25};
  NBT_CHECK(nb_numel(r2) == 4, "arange negative step count");
  nbt_check_close("arange negative step", r2, ref2, 0, 0);
  float buf[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = nb_from_buffer(buf, 2, (int64_t[]){2, 3}, NB_F32, NB_DEVICE_CPU);
  float back[6];
  NBT_CHECK(nb_to_host(t, back, sizeof back) == NB_OK && !memcmp(buf, back, sizeof buf), "from_buffer/to_host");
  nb_tensor *tt = nb_transpose(t, 0, 1);
  float backt[6];
  nb_to_host(tt, backt, sizeof backt);
  NBT_CHECK(backt[0] == 1 && backt[1] == 4 && backt[2] == 2 && backt[5] == 6, "to_host of a transposed view is row-major");
  NBT_CHECK(nb_item(nb_full(0, NULL, 7.5, NB_BF16, NB_DEVICE_CPU)) == 7.5, "0-d full item");
  /* pinned memory: page-locked with a GPU, ordinary memory without one */
  nb_tensor *pin = nb_empty_pinned(2, (int64_t[]){2, 3}, NB_F32);
  NBT_CHECK(pin && nb_is_pinned(pin) == (nb_cuda_available() > 0), "empty_pinned");
  NBT_CHECK(nb_copy_(pin, t) == NB_OK && nb_get(pin, (int64_t[]){1, 2}) == 6, "a pinned tensor is an ordinary CPU tensor");
  nb_tensor *z = nb_zeros(3, (int64_t[]){2, 0, 3}, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(z && nb_numel(z) == 0, "empty tensor");
  nb_scope_end();
}

static void test_views(void) {
  nb_scope_begin();
  nb_tensor *base = nb_arange(0, 24, 1, NB_F32, NB_DEVICE_CPU);
  nb_tensor *x = nb_reshape(base, 3, (int64_t[]){2, 3, 4});
  NBT_CHECK(nb_shares_storage(x, base), "reshape of contiguous is a view");
  nb_tensor *p = nb_permute(x, (int[]){2, 0, 1});
  NBT_CHECK(nb_size(p, 0) == 4 && nb_get(p, (int64_t[]){3, 1, 2}) == 1 * 12 + 2 * 4 + 3, "permute element");
  nb_tensor *s = nb_slice(x, 2, 1, 4, 2); /* columns 1, 3 */
  NBT_CHECK(nb_size(s, 2) == 2 && nb_get(s, (int64_t[]){1, 2, 1}) == 12 + 8 + 3, "slice with step");
  nb_tensor *n = nb_narrow(x, 1, 1, 2);
  NBT_CHECK(nb_get(n, (int64_t[]){0, 0, 0}) == 4, "narrow");
  nb_tensor *sel = nb_select(x, 0, -1);
  NBT_CHECK(nb_ndim(sel) == 2 && nb_get(sel, (int64_t[]){0, 0}) == 12, "select negative index");
  nb_tensor *e = nb_expand(nb_reshape(base, 2, (int64_t[]){24, 1}), 2, (int64_t[]){24, 5});
  NBT_CHECK(nb_strides(e)[1] == 0 && nb_get(e, (int64_t[]){7, 4}) == 7, "expand stride 0");
  nb_tensor *u = nb_unsqueeze(x, -1);
  NBT_CHECK(nb_ndim(u) == 4 && nb_size(u, 3) == 1, "unsqueeze");
  NBT_CHECK(nb_ndim(nb_squeeze(u, 3)) == 3, "squeeze");
  NBT_CHECK(nb_ndim(nb_squeeze_all(nb_zeros(4, (int64_t[]){1, 2, 1, 3}, NB_F32, NB_DEVICE_CPU))) == 2, "squeeze_all");
  nb_tensor *f = nb_flatten(x, 1, 2);
  NBT_CHECK(nb_size(f, 1) == 12 && nb_shares_storage(f, base), "flatten");
  /* reshape of a transposed view needs a copy; view refuses */
  nb_tensor *xt = nb_transpose(x, 1, 2);
  nb_tensor *rt = nb_reshape(xt, 1, (int64_t[]){-1});
  NBT_CHECK(rt && !nb_shares_storage(rt, base) && nb_get(rt, (int64_t[]){1}) == 4, "reshape copies when needed");
  nbt_check_error("view impossible", nb_view(xt, 1, (int64_t[]){24}) == NULL, NB_ERR_SHAPE, "nb_view", "without a copy", NULL);
  /* splitting a contiguous group of a permuted tensor is still a view */
  nb_tensor *v2 = nb_view(nb_transpose(x, 0, 2), 4, (int64_t[]){2, 2, 3, 2});
  NBT_CHECK(v2 && nb_shares_storage(v2, base), "view splits an axis of a permuted tensor");
  /* aliasing: a write through a view is visible through the base */
  nb_tensor *col = nb_select(nb_transpose(x, 0, 2), 0, 3);  /* x[:, :, 3]^T */
  NBT_CHECK(nb_fill_(col, -1) == NB_OK, "fill through a view");
  NBT_CHECK(nb_get(base, (int64_t[]){3}) == -1 && nb_get(base, (int64_t[]){23}) == -1 &&
            nb_get(base, (int64_t[]){2}) == 2, "write through view visible in base");
  nb_tensor *src = nb_full(2, (int64_t[]){1, 2}, 9, NB_F64, NB_DEVICE_CPU);
  NBT_CHECK(nb_copy_(nb_slice(x, 2, 0, 4, 2), src) == NB_OK && nb_get(base, (int64_t[]){22}) == 9 &&
            nb_get(base, (int64_t[]){21}) == 21, "copy_ broadcasts and converts into a strided view");
  nb_tensor *c = nb_contiguous(xt);
  NBT_CHECK(nb_is_contiguous(c) && !nb_is_contiguous(xt), "contiguous");
  nb_tensor *chunks[4];
  NBT_CHECK(nb_chunk(x, 3, 2, chunks, 4) == 2 && nb_size(chunks[1], 2) == 2, "chunk 4 into 3 gives sizes 2,2");
  NBT_CHECK(nb_split(x, 3, -1, chunks, 4) == 2 && nb_size(chunks[1], 2) == 1, "split by 3 gives 3,1");
  nb_scope_end();
}

static void test_refcounts(void) {
  int64_t before = nb_live_tensors();
  nb_tensor *a = nb_ones(2, (int64_t[]){3, 3}, NB_F32, NB_DEVICE_CPU); /* no scope: caller owns */
  nb_scope_begin();
  nb_tensor *b = nb_add(a, a);
  nb_tensor *kept = nb_keep(nb_mul(b, a));
  nb_scope_end();
  NBT_CHECK(nb_get(kept, (int64_t[]){1, 1}) == 2.0, "kept tensor survives scope");
  nb_release(kept);
  nb_release(a);
  NBT_CHECK(nb_live_tensors() == before, "no tensors leak (before %lld, after %lld)", (long long)before,
            (long long)nb_live_tensors());
}

static void test_rng(void) {
  nb_scope_begin();
  nb_rng r1 = nb_rng_new(42), r2 = nb_rng_new(42);
  nb_tensor *a = nb_rand(&r1, 1, (int64_t[]){1000}, 0, 1, NB_F32, NB_DEVICE_CPU);
  nb_tensor *b = nb_rand(&r2, 1, (int64_t[]){1000}, 0, 1, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(nb_item(nb_sum(nb_ne(a, b), 0, NULL, 0)) == 0, "same seed same draws");
  NBT_CHECK(r1.offset == 1000, "offset advances by numel");
  /* the stream is a function of (seed, offset): a second draw of 500 equals
   * the tail of one draw of 1500 */
  nb_rng r3 = nb_rng_new(42);
  nb_tensor *big = nb_rand(&r3, 1, (int64_t[]){1500}, 0, 1, NB_F32, NB_DEVICE_CPU);
  nb_tensor *c = nb_rand(&r1, 1, (int64_t[]){500}, 0, 1, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(nb_item(nb_sum(nb_ne(nb_narrow(big, 0, 1000, 500), c), 0, NULL, 0)) == 0, "stream defined by offset");
  double mean = nb_item(nb_mean(big, 0, NULL, 0));
  NBT_CHECK(fabs(mean - 0.5) < 0.03, "uniform mean %g", mean);
  nb_tensor *n = nb_randn(&r1, 1, (int64_t[]){20000}, 1.0, 2.0, NB_F64, NB_DEVICE_CPU);
  double m = nb_item(nb_mean(n, 0, NULL, 0)), s = nb_item(nb_std(n, 0, NULL, 1, 0));
  NBT_CHECK(fabs(m - 1.0) < 0.05 && fabs(s - 2.0) < 0.05, "normal mean %g std %g", m, s);
  nb_tensor *ri = nb_randint(&r1, 1, (int64_t[]){5000}, -3, 4, NB_I64, NB_DEVICE_CPU);
  NBT_CHECK(nb_item(nb_min(ri, 0, NULL, 0)) == -3 && nb_item(nb_max(ri, 0, NULL, 0)) == 3, "randint range");
  uint32_t w[4];
  nb_philox4x32(0, 0, w);
  NBT_CHECK(w[0] == 0x6627e8d5u && w[3] == 0x9b00dbd8u, "Philox known answer");
  nb_scope_end();
}

int main(void) {
  test_f16_bf16();
  test_f64_to_half();
  test_promotion();
  test_creation();
  test_views();
  test_refcounts();
  test_rng();
  return nbt_finish();
}
