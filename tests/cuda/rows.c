/* test_cuda sections "rows fast", "rows masked" (softmax and norm kernels)
 * and "xent fused" (cross-entropy). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "cuda_test.h"
#include "graph/node.h" /* the autocast cases look for cast nodes */

/* ---- row kernels: softmax / norm fast paths (cuda_softmax.cu, cuda_norm.cu) --------------------
 * Sizes on each side of the register plans: D = 1, 7 and 769 take single-
 * element packs, 768 and 4096 16-byte packs (warp and multi-warp rows),
 * 50304 a 1024-thread row, 70000 the generic kernels. The norm plans also
 * take rows of 3 and 9 warps (1536, 2304: named barriers over groups that
 * are not a power of two), 3 packs per thread without the next-row prefetch
 * (12288), and 8 single-element packs (5000). Non-contiguous and misaligned
 * inputs must fall back and give the same values. */
static nb_tensor *f_ln_plain(nb_tensor *const *x, void *c) { return nb_layer_norm(x[0], 1, NULL, NULL, 1e-5); }
static nb_tensor *f_rms_plain(nb_tensor *const *x, void *c) { return nb_rms_norm(x[0], 1, NULL, 1e-6); }

/* x's values as a (R, D) view whose data starts one element into its
 * storage (contiguous rows, not 16-byte aligned), built with differentiable
 * ops on x's own device. */
static nb_tensor *rows_misaligned(nb_tensor *x) {
  int64_t one = 1, R = nb_size(x, 0), D = nb_size(x, 1), n = R * D;
  nb_tensor *parts[2] = {nb_zeros(1, &one, nb_dtype_of(x), nb_device_of(x)), nb_reshape(x, 1, &n)};
  nb_tensor *flat = nb_cat(2, parts, 0);
  return nb_view(nb_slice(flat, 0, 1, n + 1, 1), 2, (int64_t[]){R, D});
}
static nb_tensor *f_softmax_mis(nb_tensor *const *x, void *c) { return nb_softmax(rows_misaligned(x[0]), -1); }
static nb_tensor *f_ln_mis(nb_tensor *const *x, void *c) {
  return nb_layer_norm(rows_misaligned(x[0]), 1, x[1], x[2], 1e-5);
}
static nb_tensor *f_rms_mis(nb_tensor *const *x, void *c) { return nb_rms_norm(rows_misaligned(x[0]), 1, x[1], 1e-6); }

static void rows_case(nb_dtype dt, int64_t R, int64_t D, uint64_t seed) {
  char name[96];
  double sc = 4.0 + D / 500.0;
  int ax = -1;
  nb_tensor *x = randn(seed, 2, (int64_t[]){R, D}, dt);
  nb_tensor *w = nb_add_scalar(randn(seed + 1, 1, &D, dt), 1.0), *b = randn(seed + 2, 1, &D, dt);
  nb_tensor *in[3] = {x, w, b};
  snprintf(name, sizeof name, "rows softmax R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_softmax, &ax, 1, &x, dt, 2.0);
  snprintf(name, sizeof name, "rows log_softmax R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_log_softmax, &ax, 1, &x, dt, 2.0);
  snprintf(name, sizeof name, "rows layer_norm affine D=%lld", (long long)D);
  grad_cmp(name, f_layer_norm, NULL, 3, in, dt, sc);
  snprintf(name, sizeof name, "rows layer_norm plain D=%lld", (long long)D);
  grad_cmp(name, f_ln_plain, NULL, 1, &x, dt, sc);
  snprintf(name, sizeof name, "rows rms_norm weight D=%lld", (long long)D);
  grad_cmp(name, f_rms_norm, NULL, 2, in, dt, sc);
  snprintf(name, sizeof name, "rows rms_norm plain D=%lld", (long long)D);
  grad_cmp(name, f_rms_plain, NULL, 1, &x, dt, sc);
}

/* Norm forward and backward over many rows, so that each row group walks
 * several rows (the next-row prefetch and the per-thread dw/db sums). */
static void rows_norm_many(nb_dtype dt, int64_t R, int64_t D, uint64_t seed) {
  char name[96];
  nb_tensor *x = randn(seed, 2, (int64_t[]){R, D}, dt);
  nb_tensor *w = nb_add_scalar(randn(seed + 1, 1, &D, dt), 1.0), *b = randn(seed + 2, 1, &D, dt);
  nb_tensor *in[3] = {x, w, b};
  snprintf(name, sizeof name, "rows layer_norm R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_layer_norm, NULL, 3, in, dt, 4.0 + D / 500.0);
  snprintf(name, sizeof name, "rows rms_norm R=%lld D=%lld", (long long)R, (long long)D);
  grad_cmp(name, f_rms_norm, NULL, 2, in, dt, 4.0 + D / 500.0);
}

/* ---- rows with -inf entries (causal attention masks) ----------------------
 * Row r of an (R, D) tensor keeps its first r % D + 1 elements and masks the
 * rest with -inf, as a causal attention row does: whole stretches of a row,
 * and every element some threads hold, are -inf. The softmax of such a row
 * is finite (masked entries 0), and cross-entropy over it finite when the
 * target is unmasked. Sizes take each kernel: single-element and 16-byte
 * packs, multi-warp rows, the generic cached and online kernels. */
static nb_tensor *masked_rows(uint64_t seed, int64_t R, int64_t D, nb_dtype dt, int transposed) {
  unsigned char *keep = malloc((size_t)(R * D));
  for (int64_t r = 0; r < R; r++)
    for (int64_t j = 0; j < D; j++) keep[r * D + j] = j <= r % D;
  nb_tensor *m = nb_from_buffer(keep, 2, (int64_t[]){R, D}, NB_BOOL, NB_DEVICE_CPU);
  free(keep);
  nb_tensor *x = transposed ? nb_transpose(randn(seed, 2, (int64_t[]){D, R}, dt), 0, 1)
                            : randn(seed, 2, (int64_t[]){R, D}, dt);
  return nb_where(m, x, nb_scalar(-INFINITY, dt, NB_DEVICE_CPU));
}
static nb_tensor *f_xent_plain(nb_tensor *const *x, void *c) {
  (void)c;
  return nb_cross_entropy(x[0], x[1], NB_REDUCE_MEAN, -1, 0.0);
}

void test_rows_masked(void) {
  const int64_t Ds[] = {7, 11, 64, 768, 769, 5000, 50304, 70000};
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < (int)(sizeof Ds / sizeof *Ds); k++) {
      if (quick && Ds[k] > 5000) continue;
      nb_scope_begin();
      nb_dtype dt = FLOATS[d];
      int64_t D = Ds[k], R = D > 5000 ? 5 : 41;
      int ax = -1;
      char name[96];
      for (int tr = 0; tr < 2; tr++) {
        nb_tensor *x = masked_rows(600 + k, R, D, dt, tr);
        snprintf(name, sizeof name, "masked softmax D=%lld%s", (long long)D, tr ? " transposed" : "");
        grad_cmp(name, f_softmax, &ax, 1, &x, dt, 2.0);
        snprintf(name, sizeof name, "masked log_softmax D=%lld%s", (long long)D, tr ? " transposed" : "");
        grad_cmp(name, f_log_softmax, &ax, 1, &x, dt, 2.0);
      }
      /* targets on unmasked entries (column 0 is never masked) */
      nb_tensor *x = masked_rows(610 + k, R, D, dt, 0);
      nb_tensor *tg = nb_zeros(1, &R, NB_I64, NB_DEVICE_CPU);
      nb_tensor *in[2] = {x, tg};
      snprintf(name, sizeof name, "masked cross_entropy C=%lld", (long long)D);
      grad_cmp(name, f_xent_plain, NULL, 2, in, dt, 4.0);
      nb_tensor *sm = nb_softmax(gpu(x), -1); /* NaN is the one value unequal to itself */
      NBT_CHECK(sm && nb_item(nb_sum(nb_ne(sm, sm), 0, NULL, 0)) == 0,
                "masked softmax D=%lld [%s]: no NaN on the GPU (%s)", (long long)D, nb_dtype_name(dt),
                nb_last_error());
      nb_tensor *l = nb_cross_entropy(gpu(x), gpu(tg), NB_REDUCE_MEAN, -1, 0.0);
      NBT_CHECK(l && isfinite(nb_item(l)), "masked cross_entropy C=%lld [%s]: finite loss on the GPU",
                (long long)D, nb_dtype_name(dt));
      nb_clear_error();
      nb_scope_end();
    }
}

void test_rows_fast(void) {
  const int64_t Ds[] = {1, 7, 768, 769, 1536, 2304, 4096, 5000, 12288, 50304, 70000};
  const int nD = (int)(sizeof Ds / sizeof *Ds);
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < nD; k++) {
      if (quick && Ds[k] > 5000) continue;
      nb_scope_begin();
      int64_t R = Ds[k] > 5000 ? 3 : (Ds[k] > 100 ? 37 : 131);
      rows_case(FLOATS[d], R, Ds[k], 200 + 10 * (uint64_t)k);
      nb_scope_end();
    }
  for (int k = 0; k < 5; k++) { /* f64 computes in f64 */
    nb_scope_begin();
    rows_case(NB_F64, 9, (const int64_t[]){1, 7, 768, 769, 4096}[k], 300 + (uint64_t)k);
    nb_scope_end();
  }
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_scope_begin();
    rows_norm_many(FLOATS[d], 6000, 768, 500 + d);
    if (!quick) rows_norm_many(FLOATS[d], 1500, 4096, 510 + d);
    nb_scope_end();
  }
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_dtype dt = FLOATS[d];
    nb_scope_begin();
    int ax = -1;
    int64_t R = 21, D = 768;
    /* rows strided (every other row of a wider tensor), transposed, and misaligned */
    nb_tensor *wide = randn(400, 2, (int64_t[]){R, 2 * D}, dt);
    nb_tensor *xs = nb_slice(wide, 1, 0, D, 1);
    grad_cmp("rows softmax row-strided", f_softmax, &ax, 1, &xs, dt, 2.0);
    nb_tensor *xt = nb_transpose(randn(401, 2, (int64_t[]){D, R}, dt), 0, 1);
    grad_cmp("rows softmax transposed", f_softmax, &ax, 1, &xt, dt, 2.0);
    grad_cmp("rows log_softmax transposed", f_log_softmax, &ax, 1, &xt, dt, 2.0);
    nb_tensor *xm = randn(402, 2, (int64_t[]){R, D}, dt);
    grad_cmp("rows softmax misaligned", f_softmax_mis, NULL, 1, &xm, dt, 2.0);
    nb_tensor *wm = nb_add_scalar(randn(403, 1, &D, dt), 1.0), *bm = randn(404, 1, &D, dt);
    nb_tensor *in[3] = {xm, wm, bm};
    grad_cmp("rows layer_norm misaligned", f_ln_mis, NULL, 3, in, dt, 6.0);
    grad_cmp("rows rms_norm misaligned", f_rms_mis, NULL, 2, in, dt, 6.0);
    nb_tensor *in2[3] = {xt, wm, bm};
    grad_cmp("rows layer_norm transposed", f_layer_norm, NULL, 3, in2, dt, 6.0);
    nb_scope_end();
  }
  /* the norm forward and the fused backward's dx/dw/db repeat bit for bit
   * (fixed merge and block orders), with row groups walking several rows */
  nb_scope_begin();
  int64_t R = 6000, D = 768;
  nb_tensor *x = gpu(randn(410, 2, (int64_t[]){R, D}, NB_BF16));
  nb_tensor *w = gpu(nb_add_scalar(randn(411, 1, &D, NB_BF16), 1.0)), *b = gpu(randn(412, 1, &D, NB_BF16));
  nb_tensor *gy = gpu(randn(413, 2, (int64_t[]){R, D}, NB_BF16));
  nb_tensor *gr[2][3], *ys[2];
  for (int rep = 0; rep < 2; rep++) {
    nb_tensor *in[3] = {nb_detach(x), nb_detach(w), nb_detach(b)};
    for (int i = 0; i < 3; i++) nb_set_requires_grad(in[i], 1);
    nb_tensor *y = ys[rep] = nb_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    nb_tensor *loss = nb_sum(nb_mul(y, gy), 0, NULL, 0);
    NBT_CHECK(loss && nb_backward(loss, NULL) == NB_OK, "rows layer_norm backward (%s)", nb_last_error());
    for (int i = 0; i < 3; i++) gr[rep][i] = nb_grad(in[i]);
  }
  cmp_bits("rows layer_norm y repeats", ys[0], ys[1]);
  cmp_bits("rows layer_norm dx repeats", gr[0][0], gr[1][0]);
  cmp_bits("rows layer_norm dw repeats", gr[0][1], gr[1][1]);
  cmp_bits("rows layer_norm db repeats", gr[0][2], gr[1][2]);
  nb_scope_end();
}

/* ---- cross-entropy: fused forward+backward (cuda_xent.cu) ---------------------
 * The training path writes dlogits in the forward; backward returns them as
 * is for the engine's all-ones seed and scales them otherwise. Class counts
 * reach every kernel variant (general, register-cached vectors with 1/2/4/8
 * vectors per thread, streaming vectors, rows split over a 2-block cluster
 * at 50304 16-bit); ignored rows, smoothing, strided
 * logits, (N, C, d) logits, each reduction, upstream gradient 1 and not 1. */
static const char *const XRED[] = {"mean", "sum", "none"};

/* One run on device dv; *grad receives the logits' gradient. */
static nb_tensor *xent_run(int dv, const nb_tensor *logits, const nb_tensor *tg, nb_reduction red,
                           double sm, int scaled, nb_tensor **grad) {
  nb_tensor *x = nb_detach(dv ? gpu(logits) : nb_clone(logits));
  nb_tensor *t = dv ? gpu(tg) : nb_clone(tg);
  nb_set_requires_grad(x, 1);
  nb_tensor *y = nb_cross_entropy(x, t, red, -100, sm);
  *grad = NULL;
  if (!y) return NULL;
  nb_status st;
  if (red == NB_REDUCE_NONE) {
    nb_tensor *w = scaled ? randn(77, nb_ndim(y), nb_shape(y), nb_dtype_of(y)) : NULL;
    st = nb_backward(y, scaled ? (dv ? gpu(w) : w) : nb_ones_like(y));
  } else {
    st = nb_backward(scaled ? nb_mul_scalar(y, 3.0) : y, NULL);
  }
  if (st) return NULL;
  *grad = nb_grad(x);
  return y;
}

static void xent_case(const char *what, const nb_tensor *logits, const nb_tensor *tg, nb_dtype dt,
                      nb_reduction red, double sm, int scaled) {
  nb_scope_begin();
  nb_tensor *g0, *g1;
  nb_tensor *y0 = xent_run(0, logits, tg, red, sm, scaled, &g0);
  nb_tensor *y1 = xent_run(1, logits, tg, red, sm, scaled, &g1);
  char nm[160];
  snprintf(nm, sizeof nm, "xent fused %s %s sm=%g %s loss", what, XRED[red == NB_REDUCE_MEAN ? 0 : red == NB_REDUCE_SUM ? 1 : 2],
           sm, scaled ? "scaled" : "seed");
  cmp(nm, dt, y0, y1, 4.0);
  snprintf(nm + strlen(nm) - 4, 8, "grad");
  cmp(nm, dt, g0, g1, 4.0);
  nb_scope_end();
}

/* ---- cross-entropy on f16/bf16 logits under autocast (precision class wide)
 * The logits are read as they are (no cast node, no f32 copy), the loss is
 * f32, dlogits keep the logits' dtype and are the f32 gradient rounded once:
 * within one ulp of the CPU's (which rounds its f64 gradient once;
 * test_xent16 checks it against float64) plus the f32 math's error. For the
 * seed (the forward's fused kernel), a scaled loss (2^16 for f16: loss
 * scaling; its unit gradient would underflow in f16) and per-row weights
 * (both recomputed by cross_entropy_backward). */

/* Spacing of dt's values at |v| (subnormals included). */
static double xa_ulp(nb_dtype dt, double v) {
  int e = v == 0 ? -2000 : ilogb(v);
  if (dt == NB_F16) return ldexp(1.0, (e < -14 ? -14 : e) - 10);
  if (dt == NB_BF16) return ldexp(1.0, (e < -126 ? -126 : e) - 7);
  return ldexp(1.0, (e < -126 ? -126 : e) - 23);
}

static int xa_has_cast(const nb_tensor *t, int depth) {
  const nb_node *n = t ? t->grad_fn : NULL;
  if (!n || depth > 100) return 0;
  if (!strcmp(n->name, "cast")) return 1;
  for (int i = 0; i < n->n_inputs; i++)
    if (xa_has_cast(n->inputs[i], depth + 1)) return 1;
  return 0;
}

/* |cu - cpu| <= ulps ulps of the dtype at cpu's value + 4e-6 |cpu|. */
static void xa_cmp_ulp(const char *name, const nb_tensor *cpu, const nb_tensor *cu, double ulps) {
  if (!cpu || !cu || nb_numel(cpu) != nb_numel(cu) || nb_dtype_of(cpu) != nb_dtype_of(cu)) {
    NBT_CHECK(0, "%s: results missing or of other shapes/dtypes (%s)", name, nb_last_error());
    nb_clear_error();
    return;
  }
  double *a = nbt_f64(cpu), *b = nbt_f64(cu), worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < nb_numel(cpu); i++) {
    if (b[i] == a[i]) continue; /* infinities included */
    double e = fabs(b[i] - a[i]) / (ulps * xa_ulp(nb_dtype_of(cpu), a[i]) + 4e-6 * fabs(a[i]));
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, at = i; /* a NaN stays the worst */
  }
  NBT_CHECK(worst <= 1.0, "%s [%s]: element %lld cuda %.9g cpu %.9g (%g times %g ulps)", name,
            nb_dtype_name(nb_dtype_of(cpu)), (long long)at, b[at], a[at], worst, ulps);
  free(a);
  free(b);
}

/* One run on device dv under autocast of dt; *grad gets the logits' gradient. */
static nb_tensor *xa_run(int dv, const nb_tensor *logits, const nb_tensor *tg, nb_dtype dt,
                         nb_reduction red, double sm, double scale, nb_tensor **grad, const char *what) {
  nb_tensor *x = nb_detach(dv ? gpu(logits) : nb_clone(logits));
  nb_tensor *t = dv ? gpu(tg) : nb_clone(tg);
  nb_set_requires_grad(x, 1);
  nb_autocast_begin(dt);
  nb_tensor *y = nb_cross_entropy(x, t, red, -100, sm);
  nb_autocast_end();
  *grad = NULL;
  NBT_CHECK(y && nb_dtype_of(y) == NB_F32, "%s dev %d: loss %s under autocast (expected f32)", what, dv,
            y ? nb_dtype_name(nb_dtype_of(y)) : "NULL");
  NBT_CHECK(!xa_has_cast(y, 0), "%s dev %d: a cast is recorded", what, dv);
  if (!y) return NULL;
  const nb_node *n = y->grad_fn;
  NBT_CHECK(n && n->saved[0] && nb_dtype_of(n->saved[0]) == dt, "%s dev %d: saved dlogits not %s", what, dv,
            nb_dtype_name(dt));
  nb_status st;
  if (red == NB_REDUCE_NONE) {
    nb_tensor *w = nb_ones_like(y); /* the seed, filled on y's device */
    if (scale) { /* row weights scale * [0.5, 1.5), the same on both devices */
      nb_rng wr = nb_rng_new(99);
      w = nb_mul_scalar(nb_rand(&wr, nb_ndim(y), nb_shape(y), 0.5, 1.5, NB_F32, NB_DEVICE_CPU), scale);
      if (dv) w = gpu(w);
    }
    st = nb_backward(y, w);
  } else {
    st = nb_backward(scale ? nb_mul_scalar(y, scale) : y, NULL);
  }
  NBT_CHECK(st == NB_OK, "%s dev %d: backward: %s", what, dv, nb_last_error());
  if (st) return NULL;
  *grad = nb_grad(x);
  return y;
}

static void xa_case(nb_dtype dt, const nb_tensor *x, const nb_tensor *tg, nb_reduction red, double sm,
                    double scale, const char *lay) {
  nb_scope_begin();
  char nm[200];
  snprintf(nm, sizeof nm, "xent autocast %s C=%lld %s %s sm=%g %s%g", nb_dtype_name(dt),
           (long long)nb_size(x, 1), lay, XRED[red == NB_REDUCE_MEAN ? 0 : red == NB_REDUCE_SUM ? 1 : 2], sm,
           scale ? "scale " : "seed", scale);
  nb_tensor *g0, *g1;
  nb_tensor *y0 = xa_run(0, x, tg, dt, red, sm, scale, &g0, nm);
  nb_tensor *y1 = xa_run(1, x, tg, dt, red, sm, scale, &g1, nm);
  size_t l = strlen(nm);
  snprintf(nm + l, sizeof nm - l, " loss");
  cmp(nm, NB_F32, y0, y1, 1.0);
  snprintf(nm + l, sizeof nm - l, " dlogits");
  xa_cmp_ulp(nm, g0, g1, 1.0);
  nb_scope_end();
}

static void xent_autocast_cases(void) {
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  const nb_reduction reds[] = {NB_REDUCE_MEAN, NB_REDUCE_SUM, NB_REDUCE_NONE};
  const int64_t Cs[] = {1001, 50304};
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < 2; k++) {
      nb_scope_begin();
      int64_t C = Cs[k], N = k ? (quick ? 3 : 9) : 33;
      nb_rng rng = nb_rng_new(70 + k);
      nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
      nb_fill_(nb_slice(tg, 0, 1, N, 4), -100);
      for (int lay = 0; lay < 2; lay++) { /* contiguous (vector kernels) and transposed (general) */
        if (lay && k) continue;
        nb_tensor *x = nb_mul_scalar(layout(340 + k, N, C, dts[d], lay), 3.0);
        for (int r = 0; r < 3; r++) {
          /* f16: the loss scale 2^16 on a mean (a sum's target entries, ~ -2^16, overflow f16) */
          double scale = dts[d] != NB_F16 ? 3.0 : reds[r] == NB_REDUCE_MEAN ? 65536.0 : 16.0;
          xa_case(dts[d], x, tg, reds[r], r == 1 ? 0.1 : 0.0, 0.0, LAYOUT[lay]);
          xa_case(dts[d], x, tg, reds[r], r == 2 ? 0.1 : 0.0, r == 2 ? 1.0 : scale, LAYOUT[lay]);
        }
      }
      nb_scope_end();
    }
  /* GPT-2's row length with many rows: every block counts N_valid, the last one reduces */
  nb_scope_begin();
  int64_t N = quick ? 400 : 1500, C = 50304;
  nb_rng rng = nb_rng_new(77);
  nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
  nb_fill_(nb_slice(tg, 0, 0, N, 9), -100);
  nb_tensor *x = nb_mul_scalar(randn(348, 2, (int64_t[]){N, C}, NB_BF16), 3.0);
  xa_case(NB_BF16, x, tg, NB_REDUCE_MEAN, 0.0, 0.0, "many rows");
  xa_case(NB_BF16, x, tg, NB_REDUCE_MEAN, 0.0, 0.25, "many rows");
  nb_scope_end();
}

void test_xent_fused(void) {
  const int64_t Cs[] = {1, 7, 64, 1001, 4096, 16384, 50304, 70000};
  const nb_dtype dts[] = {NB_BF16, NB_F32, NB_F16};
  const nb_reduction reds[] = {NB_REDUCE_MEAN, NB_REDUCE_SUM, NB_REDUCE_NONE};
  for (size_t d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof Cs / sizeof *Cs; k++) {
      int64_t C = Cs[k], N = C >= 16384 ? (quick ? 3 : 5) : (quick ? 5 : 33);
      if (d == 2 && C != 1001 && C != 50304) continue; /* f16: a general and a vector case */
      nb_scope_begin();
      nb_dtype dt = dts[d];
      nb_rng rng = nb_rng_new(11 + k);
      nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
      nb_fill_(nb_slice(tg, 0, 1, N, 3), -100); /* every third row ignored */
      char what[64];
      for (int lay = 0; lay < 3; lay++) {
        if (lay && C > 4096 && d) continue;
        nb_tensor *x = layout(300 + k, N, C, dt, lay);
        for (int r = 0; r < 3; r++)
          for (int sc = 0; sc < 2; sc++) {
            double sm = (r + sc + lay) % 2 ? 0.1 : 0.0;
            snprintf(what, sizeof what, "C=%lld %s", (long long)C, LAYOUT[lay]);
            xent_case(what, x, tg, dt, reds[r], sm, sc);
          }
      }
      nb_scope_end();
    }
  /* many rows (more than one resident wave of blocks, or of block pairs
   * at 50304): each block counts N_valid itself and the last to finish
   * reduces the loss; the same bits on every run, and the CPU's values */
  for (int k = 0; k < 3; k++) {
    nb_scope_begin();
    int64_t N = k == 2 ? (quick ? 400 : 1500) : 3000, C = k == 2 ? 50304 : k ? 1001 : 4096;
    nb_dtype dt = k == 1 ? NB_F32 : NB_BF16;
    nb_rng rng = nb_rng_new(40 + k);
    nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
    nb_fill_(nb_slice(tg, 0, 0, N, 7), -100);
    nb_tensor *x = randn(330 + k, 2, (int64_t[]){N, C}, dt);
    for (int r = 0; r < 2; r++) {
      nb_tensor *g0, *g1, *g2;
      nb_reduction red = r ? NB_REDUCE_SUM : NB_REDUCE_MEAN;
      nb_tensor *y0 = xent_run(0, x, tg, red, 0.0, 0, &g0);
      nb_tensor *y1 = xent_run(1, x, tg, red, 0.0, 0, &g1);
      nb_tensor *y2 = xent_run(1, x, tg, red, 0.0, 0, &g2);
      char nm[96];
      snprintf(nm, sizeof nm, "xent fused N=%lld C=%lld %s loss", (long long)N, (long long)C, XRED[r]);
      cmp(nm, dt, y0, y1, 4.0);
      snprintf(nm, sizeof nm, "xent fused N=%lld C=%lld %s grad", (long long)N, (long long)C, XRED[r]);
      cmp(nm, dt, g0, g1, 4.0);
      snprintf(nm, sizeof nm, "xent fused N=%lld C=%lld %s repeats", (long long)N, (long long)C, XRED[r]);
      cmp_bits(nm, y1, y2);
      cmp_bits(nm, g1, g2);
    }
    nb_scope_end();
  }
  /* (N, C, d) logits: rows gathered through a permuted view */
  nb_scope_begin();
  nb_tensor *x3 = randn(320, 3, (int64_t[]){3, 7, 5}, NB_BF16);
  nb_rng rng = nb_rng_new(5);
  nb_tensor *t3 = nb_randint(&rng, 2, (int64_t[]){3, 5}, 0, 7, NB_I64, NB_DEVICE_CPU);
  nb_fill_(nb_slice(t3, 1, 0, 2, 1), -100);
  for (int r = 0; r < 3; r++) xent_case("(3,7,5)", x3, t3, NB_BF16, reds[r], 0.05, r == 1);
  /* every row ignored: mean is NaN on both devices, the gradient zero */
  nb_tensor *xa = randn(321, 2, (int64_t[]){4, 50304}, NB_BF16);
  nb_tensor *ta = nb_full(1, (int64_t[]){4}, -100, NB_I64, NB_DEVICE_CPU);
  nb_tensor *ga;
  nb_tensor *ya = xent_run(1, xa, ta, NB_REDUCE_MEAN, 0.0, 0, &ga);
  NBT_CHECK(ya && isnan(nb_item(ya)), "xent fused all ignored: mean is NaN");
  NBT_CHECK(ga && nb_item(nb_sum(nb_abs(nb_to_device(ga, NB_DEVICE_CPU)), 0, NULL, 0)) == 0.0,
            "xent fused all ignored: zero gradient (%s)", nb_last_error());
  /* an out-of-range target on the training path is NB_ERR_INDEX */
  nb_tensor *tb = nb_full(1, (int64_t[]){4}, 50304, NB_I64, NB_DEVICE_CPU);
  nb_tensor *xb = nb_detach(gpu(xa));
  nb_set_requires_grad(xb, 1);
  NBT_CHECK(!nb_cross_entropy(xb, gpu(tb), NB_REDUCE_MEAN, -100, 0.0) && nb_last_status() == NB_ERR_INDEX,
            "xent fused: target out of range is NB_ERR_INDEX");
  nb_clear_error();
  nb_scope_end();
  xent_autocast_cases();
}
