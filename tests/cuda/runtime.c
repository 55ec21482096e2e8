/* test_cuda sections "random", "optim", "fast paths", "errors/memory",
 * "pinned" and "amp": Philox draws, optimizers and gradient clipping, the
 * vectorised and multi-tensor paths, device errors, the allocator, pinned
 * uploads, master weights and device-side loss scaling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "backend/backend.h" /* section "fast paths": adamw_multi */
#include "core/core.h"
#include "cuda_test.h"
#include "../amp_cases.h" /* section "amp" */

static nb_tensor *f_gelu_tanh_fast(nb_tensor *const *x, void *c) { (void)c; return nb_gelu_tanh(x[0]); }

/* ---- random ------------------------------------------------------------------- */
void test_random(void) {
  int64_t n = quick ? 1001 : 100003;
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  nb_scope_begin();
  for (int d = 0; d < 4; d++) {
    nb_rng r1 = nb_rng_new(1234), r2 = nb_rng_new(1234);
    r1.offset = r2.offset = 77;
    char name[64];
    snprintf(name, sizeof name, "rand uniform %s bits", nb_dtype_name(dts[d]));
    cmp_bits(name, nb_rand(&r1, 1, &n, -2.0, 3.0, dts[d], NB_DEVICE_CPU),
             nb_rand(&r2, 1, &n, -2.0, 3.0, dts[d], G));
    NBT_CHECK(r1.offset == r2.offset, "rng offsets advance alike");
    snprintf(name, sizeof name, "randn %s (last bits may differ)", nb_dtype_name(dts[d]));
    cmp(name, dts[d] == NB_F64 ? NB_F32 : dts[d], nb_randn(&r1, 1, &n, 0.5, 2.0, dts[d], NB_DEVICE_CPU),
        nb_randn(&r2, 1, &n, 0.5, 2.0, dts[d], G), 1.0);
  }
  nb_rng r1 = nb_rng_new(99), r2 = nb_rng_new(99);
  cmp_bits("randint i64 bits", nb_randint(&r1, 1, &n, -1000000007LL, 5000000000LL, NB_I64, NB_DEVICE_CPU),
           nb_randint(&r2, 1, &n, -1000000007LL, 5000000000LL, NB_I64, G));
  cmp_bits("randint i32 bits", nb_randint(&r1, 1, &n, 3, 17, NB_I32, NB_DEVICE_CPU),
           nb_randint(&r2, 1, &n, 3, 17, NB_I32, G));
  /* rand into a strided (transposed) view keeps row-major element order */
  for (int d = 1; d < 4; d++) {
    nb_tensor *x = randn(130, 2, (int64_t[]){37, 41}, dts[d]);
    nb_tensor *xt = nb_transpose(x, 0, 1);
    nb_rng a = nb_rng_new(5), b = nb_rng_new(5);
    char name[64];
    snprintf(name, sizeof name, "dropout %s mask and values bits", nb_dtype_name(dts[d]));
    cmp_bits(name, nb_contiguous(nb_dropout(xt, 0.3, &a)), nb_contiguous(nb_dropout(gpu(xt), 0.3, &b)));
  }
  nb_scope_end();
}

/* ---- optimizers ----------------------------------------------------------------- */
static void test_clip_multi(void); /* below, with the fast paths */
void test_optim(void) {
  for (int kind = 0; kind < 2; kind++)
    for (int dd = 0; dd < 2; dd++) {
      nb_dtype dt = dd ? NB_BF16 : NB_F32;
      nb_scope_begin();
      nb_tensor *p0 = randn(140, 2, (int64_t[]){37, 19}, dt), *w = randn(141, 2, (int64_t[]){37, 19}, dt);
      nb_tensor *res[2];
      for (int dv = 0; dv < 2; dv++) {
        nb_params *ps = nb_params_new();
        nb_tensor *p = dv ? gpu(p0) : nb_clone(p0);
        nb_params_add(ps, "p", p);
        nb_optim *o = kind ? nb_sgd_new(ps, 0.1, 0.9, 0.1, 1, 0.01)
                           : nb_adamw_new(ps, 0.01, 0.9, 0.999, 1e-8, 0.1);
        nb_tensor *wd = dv ? gpu(w) : w;
        for (int s = 0; s < 3; s++) {
          nb_scope_begin();
          nb_params_zero_grad(ps);
          nb_backward(nb_sum(nb_mul(nb_square(p), wd), 0, NULL, 0), NULL);
          nb_optim_step(o);
          nb_scope_end();
        }
        res[dv] = nb_clone(p);
        nb_optim_free(o);
        nb_params_free(ps);
      }
      cmp(kind ? "sgd nesterov 3 steps" : "adamw 3 steps", dt, res[0], res[1], 2.0);
      nb_scope_end();
    }
  test_clip_multi();
}

/* Gradient clipping over 70 gradients of four dtypes and odd sizes (more
 * tensors than one multi-tensor launch takes, one larger than many blocks):
 * the norm against a float64 sum of the gradients' values on the host, the
 * clipped gradients against the CPU's, and the same bits on a second run
 * (the device's sum has a fixed order). */
static double clip_run(nb_params *ps, nb_tensor *const *w, int n, int dv) {
  for (int i = 0; i < n; i++) {
    nb_tensor *p = nb_params_get(ps, i);
    nb_zero_grad(p);
    nb_scope_begin();
    nb_backward(nb_mul_scalar(p, 1.0), dv ? gpu(w[i]) : w[i]); /* grad = w[i] exactly */
    nb_scope_end();
  }
  return nb_clip_grad_norm(ps, 1.0);
}

static void test_clip_multi(void) {
  enum { N = 70 };
  const nb_dtype dts[] = {NB_F32, NB_BF16, NB_F16, NB_F64};
  nb_scope_begin();
  nb_tensor *w[N];
  nb_params *ps[2] = {nb_params_new(), nb_params_new()};
  double want = 0;
  for (int i = 0; i < N; i++) {
    int64_t len = i == 5 ? 70001 : 1 + (i * 37) % 3001;
    w[i] = randn(300 + i, 1, &len, dts[i % 4]);
    double *h = nbt_f64(w[i]);
    for (int64_t j = 0; j < len; j++) want += h[j] * h[j];
    free(h);
    for (int dv = 0; dv < 2; dv++) {
      nb_tensor *p = nb_zeros(1, &len, dts[i % 4], dv ? G : NB_DEVICE_CPU);
      nb_set_requires_grad(p, 1);
      char name[16];
      snprintf(name, sizeof name, "g%d", i);
      nb_params_add(ps[dv], name, p);
    }
  }
  double nc = clip_run(ps[0], w, N, 0), ng = clip_run(ps[1], w, N, 1);
  NBT_CHECK(fabs(nc - sqrt(want)) <= 1e-12 * sqrt(want), "clip norm cpu %.15g vs float64 %.15g", nc, sqrt(want));
  NBT_CHECK(fabs(ng - sqrt(want)) <= 1e-12 * sqrt(want), "clip norm cuda %.15g vs float64 %.15g (%s)", ng,
            sqrt(want), nb_last_error());
  for (int i = 0; i < N; i += 3) {
    char name[64];
    snprintf(name, sizeof name, "clipped gradient %d (%s)", i, nb_dtype_name(dts[i % 4]));
    cmp(name, dts[i % 4], nb_grad(nb_params_get(ps[0], i)), nb_grad(nb_params_get(ps[1], i)), 1.0);
  }
  double again = clip_run(ps[1], w, N, 1);
  NBT_CHECK(memcmp(&again, &ng, sizeof ng) == 0, "clip norm repeats bit for bit (%.17g, %.17g)", ng, again);
  { /* the backend entries' own checks (the CPU's under NABLA_TEST_SELF) */
    const nb_backend *be = nb_backend_for(G);
    nb_tensor *o32 = nb_zeros(0, NULL, NB_F32, G);
    nb_kview ko, kx;
    nb_kview_of(o32, &ko);
    nb_kview_of(nb_params_get(ps[1], 0), &kx);
    nbt_check_error("sumsq_multi into f32", be->sumsq_multi(1, &kx, &ko) != NB_OK, NB_ERR_DTYPE,
                    "sumsq_multi", "f32", NULL);
    nb_tensor *ints = nb_zeros(1, (int64_t[]){4}, NB_I64, G);
    nb_kview_of(ints, &kx);
    nbt_check_error("scale_multi on i64", be->scale_multi(1, &kx, 2.0) != NB_OK, NB_ERR_DTYPE,
                    "scale_multi", "i64", NULL);
  }
  nb_params_free(ps[0]);
  nb_params_free(ps[1]);
  nb_scope_end();
}

/* ---- fast paths: elementwise vectors, multi-tensor AdamW, embedding rows ------
 * (bench/results/h100-2026-11-22-elementwise-adamw-embedding.md) */
static void fast_same(const char *name, const nb_tensor *a, const nb_tensor *b) {
  cmp_bits(name, a, b);
}

void test_fast_paths(void) {
  nb_scope_begin();
  /* GELU (tanh form) and its derivative over [-30, 30], tails included, on a
   * size with a partial last vector group and a scalar tail */
  int64_t n = 100003;
  nb_tensor *x = nb_mul_scalar(nb_add_scalar(nb_div_scalar(nb_arange(0, (double)n, 1, NB_F32, NB_DEVICE_CPU),
                                                           (double)n), -0.5), 60.0);
  nb_tensor *xs[1] = {x};
  cmp("gelu_tanh [-30, 30]", NB_F32, nb_gelu_tanh(x), nb_gelu_tanh(gpu(x)), 1.0);
  grad_cmp("gelu_tanh grad [-30, 30]", f_gelu_tanh_fast, NULL, 1, xs, NB_F32, 1.0);
  nb_tensor *y = randn(700, 1, &n, NB_F32);
  cmp("add (vector path, odd size)", NB_F32, nb_add(x, y), nb_add(gpu(x), gpu(y)), 1.0);
  cmp("add (unaligned views)", NB_F32, nb_add(nb_narrow(x, 0, 1, n - 2), nb_narrow(y, 0, 1, n - 2)),
      nb_add(nb_narrow(gpu(x), 0, 1, n - 2), nb_narrow(gpu(y), 0, 1, n - 2)), 1.0);
  nb_scope_end();

  /* adamw_multi == adamw_step per tensor, bit for bit, on the device: f32
   * (vector path, odd sizes, an unaligned view), bf16, f16 and f64 params */
  nb_scope_begin();
  const nb_backend *be = nb_backend_for(G);
  enum { N = 7 };
  const int64_t sizes[N] = {7, 1, 40961, 3000, 333, 8193, 65};
  const nb_dtype dts[N] = {NB_F32, NB_F32, NB_F32, NB_F32, NB_BF16, NB_F16, NB_F64};
  nb_tensor *t[2][4][N];
  nb_kview kv[2][4][N];
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 4; k++) {
      nb_dtype dt = k < 2 ? dts[i] : NB_F32;
      int64_t sz = sizes[i] + 1;
      nb_tensor *r = randn(710 + 4 * (uint64_t)i + (uint64_t)k, 1, &sz, dt);
      if (k == 3) r = nb_square(r);
      for (int c = 0; c < 2; c++) {
        t[c][k][i] = gpu(r); /* tensor 3: views at element 1, not 16-byte aligned */
        t[c][k][i] = i == 3 ? nb_narrow(t[c][k][i], 0, 1, sizes[i]) : nb_narrow(t[c][k][i], 0, 0, sizes[i]);
        nb_kview_of(t[c][k][i], &kv[c][k][i]);
      }
    }
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < N; i++)
      NBT_CHECK(!be->adamw_step(&kv[0][0][i], &kv[0][1][i], &kv[0][2][i], &kv[0][3][i], 3e-3, 0.9,
                                0.95, 1e-8, 0.1, step), "adamw_step (%s)", nb_last_error());
    NBT_CHECK(!be->adamw_multi(N, kv[1][0], kv[1][1], kv[1][2], kv[1][3], 3e-3, 0.9, 0.95, 1e-8, 0.1,
                               step), "adamw_multi (%s)", nb_last_error());
  }
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 4; k++)
      if (k != 1) {
        char name[96];
        snprintf(name, sizeof name, "adamw_multi tensor %d (%s, %lld) operand %d equals adamw_step",
                 i, nb_dtype_name(dts[i]), (long long)sizes[i], k);
        fast_same(name, nb_contiguous(t[0][k][i]), nb_contiguous(t[1][k][i]));
      }
  nb_scope_end();

  /* embedding rows: 16-byte rows (D = 64, 768) and rows of odd length, every
   * index repeated; forward bits, and deterministic gradients equal the
   * CPU's bit for bit in f32 */
  nb_set_deterministic(1);
  const int64_t Ds[3] = {64, 768, 37};
  for (int d = 0; d < 3; d++) {
    nb_scope_begin();
    int64_t V = 300, J = quick ? 500 : 4099, D = Ds[d];
    nb_rng rng = nb_rng_new(21 + (uint64_t)d);
    nb_tensor *idx = nb_randint(&rng, 1, &J, 0, V, NB_I64, NB_DEVICE_CPU);
    nb_tensor *w = randn(730 + (uint64_t)d, 2, (int64_t[]){V, D}, NB_F32);
    nb_tensor *src = randn(740 + (uint64_t)d, 2, (int64_t[]){J, D}, NB_F32);
    char name[96];
    snprintf(name, sizeof name, "embedding rows forward D=%lld", (long long)D);
    fast_same(name, nb_embedding(w, idx), nb_embedding(gpu(w), gpu(idx)));
    nb_tensor *wc = nb_clone(w), *wg = gpu(w);
    nb_set_requires_grad(wc, 1);
    nb_set_requires_grad(wg, 1);
    nb_backward(nb_embedding(wc, idx), src);
    nb_backward(nb_embedding(wg, gpu(idx)), gpu(src));
    snprintf(name, sizeof name, "embedding rows deterministic grad D=%lld equals cpu", (long long)D);
    fast_same(name, nb_grad(wc), nb_grad(wg));
    nb_scope_end();
  }
}

/* ---- errors and memory ------------------------------------------------------------ */
void test_errors_memory(void) {
  nb_scope_begin();
  nb_clear_error();
  nb_tensor *x = gpu(randn(150, 2, (int64_t[]){10, 4}, NB_F32));
  int64_t three = 3;
  nb_tensor *idx = gpu(nb_from_buffer((int64_t[]){1, 12, 2}, 1, &three, NB_I64, NB_DEVICE_CPU));
  nb_tensor *r = nb_index_select(x, 0, idx);
  nbt_check_error("index_select out of range on cuda", r == NULL, NB_ERR_INDEX, "12", NULL);
  nb_clear_error();
  nb_tensor *ok = nb_index_select(x, 0, gpu(nb_arange(0, 10, 3, NB_I64, NB_DEVICE_CPU)));
  NBT_CHECK(ok != NULL, "the device works after an index error (%s)", nb_last_error());
  nb_tensor *tg = gpu(nb_from_buffer((int64_t[]){0, 5, 1}, 1, &three, NB_I64, NB_DEVICE_CPU));
  nb_tensor *lg = gpu(randn(151, 2, (int64_t[]){3, 4}, NB_F32));
  nb_tensor *l = nb_cross_entropy(lg, tg, NB_REDUCE_MEAN, -100, 0.0);
  nbt_check_error("cross_entropy target out of range on cuda", l == NULL, NB_ERR_INDEX, "5", NULL);
  nb_clear_error();
  nb_tensor *gi = gpu(nb_full(2, (int64_t[]){10, 4}, -1, NB_I64, NB_DEVICE_CPU));
  nb_tensor *gr = nb_gather(x, 1, gi);
  nbt_check_error("gather negative index on cuda", gr == NULL, NB_ERR_INDEX, "-1", NULL);
  nb_clear_error();

  int64_t huge = (int64_t)1 << 48; /* 1 PiB of f32 */
  nb_tensor *h = nb_empty(1, &huge, NB_F32, G);
  nbt_check_error("1 PiB allocation on cuda", h == NULL, NB_ERR_OOM, "out of memory", NULL);
  nb_clear_error();
  nb_tensor *after = nb_ones(1, (int64_t[]){1000}, NB_F32, G);
  NBT_CHECK(after && nb_item(nb_sum(after, 0, NULL, 0)) == 1000.0,
            "allocation works after OOM (%s)", nb_last_error());
  nb_scope_end();

  if (G.type == NB_CPU) return; /* the rest is about the CUDA allocator */
  nb_memory_stats s0, s1;
  NBT_CHECK(nb_cuda_memory_stats(G.index, &s0) == NB_OK, "memory stats (%s)", nb_last_error());
  for (int i = 0; i < 10; i++) {
    nb_scope_begin();
    nb_ones(1, (int64_t[]){12345}, NB_F32, G);
    nb_scope_end();
  }
  nb_cuda_memory_stats(G.index, &s1);
  NBT_CHECK(s1.n_cache_hits >= s0.n_cache_hits + 9, "cache hits counted (%lld -> %lld)",
            (long long)s0.n_cache_hits, (long long)s1.n_cache_hits);
  NBT_CHECK(s1.n_cuda_malloc <= s0.n_cuda_malloc + 1, "steady state needs no cudaMalloc");
  NBT_CHECK(s1.reserved >= s1.allocated && s1.peak >= s1.allocated, "reserved >= allocated, peak");
  NBT_CHECK(nb_cuda_empty_cache(G.index) == NB_OK, "empty_cache (%s)", nb_last_error());
  nb_cuda_memory_stats(G.index, &s1);
  NBT_CHECK(s1.reserved == s1.allocated, "empty_cache returns every cached block (%lld vs %lld)",
            (long long)s1.reserved, (long long)s1.allocated);
  NBT_CHECK(nb_device_synchronize(G) == NB_OK, "synchronize (%s)", nb_last_error());
}

/* ---- pinned host memory: asynchronous uploads ------------------------------ */
void test_pinned(void) {
  nb_scope_begin();
  int64_t n = 1 << 20;
  nb_tensor *pin = nb_empty_pinned(1, &n, NB_F32);
  NBT_CHECK(pin && (G.type == NB_CPU || nb_is_pinned(pin)), "empty_pinned is page-locked with a GPU present");
  nb_tensor *src = randn(77, 1, &n, NB_F32);
  nb_copy_(pin, src);
  nb_tensor *d = gpu(pin); /* queued without waiting */
  NBT_CHECK(d != NULL, "upload from pinned memory: %s", nb_last_error());
  nb_device_synchronize(G);
  nb_tensor *back = nb_to_device(d, NB_DEVICE_CPU);
  NBT_CHECK(back && nb_item(nb_sum(nb_ne(back, src), 0, NULL, 0)) == 0, "pinned upload arrives intact");
  nb_scope_end();
}

/* ---- master weights and device-side loss scaling (tests/amp_cases.h) ----- */
void test_amp(void) { amp_cases(G); }
