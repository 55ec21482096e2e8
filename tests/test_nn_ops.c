/* Neural-network ops, part 1: softmax, log_softmax, layer_norm, rms_norm,
 * the losses, dropout, linear, attention, triu/tril. Forward against naive
 * float64 references (f64, f32, bf16), gradients against central finite
 * differences, and one test per error class. */
#include "nn_testutil.h"
#include "core/philox.h"

/* ---- softmax ---------------------------------------------------------------- */
typedef struct { int ndim; int64_t shape[4]; int axis, log, transposed; } sm_ctx;

/* Logical (row-major) values of the input: the leaf, or its transpose. */
static double *sm_logical(const double *base, const sm_ctx *c) {
  int64_t n = 1;
  for (int i = 0; i < c->ndim; i++) n *= c->shape[i];
  double *x = malloc((size_t)n * sizeof *x);
  if (!c->transposed) { memcpy(x, base, (size_t)n * sizeof *x); return x; }
  int64_t R = c->shape[0], C = c->shape[1]; /* the leaf is (C, R) */
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < C; j++) x[i * C + j] = base[j * R + i];
  return x;
}

static void sm_ref(double *const *in, double *out, void *vc) {
  const sm_ctx *c = vc;
  double *x = sm_logical(in[0], c);
  int a = c->axis < 0 ? c->axis + c->ndim : c->axis;
  int64_t outer = 1, n = c->shape[a], inner = 1;
  for (int i = 0; i < a; i++) outer *= c->shape[i];
  for (int i = a + 1; i < c->ndim; i++) inner *= c->shape[i];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t q = 0; q < inner; q++) {
      const double *xr = x + o * n * inner + q;
      double *yr = out + o * n * inner + q, m = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; j++) m = fmax(m, xr[j * inner]);
      for (int64_t j = 0; j < n; j++) s += exp(xr[j * inner] - m);
      for (int64_t j = 0; j < n; j++)
        yr[j * inner] = c->log ? xr[j * inner] - m - log(s) : exp(xr[j * inner] - m) / s;
    }
  free(x);
}

static nb_tensor *sm_apply(nb_tensor *const *in, void *vc) {
  const sm_ctx *c = vc;
  nb_tensor *x = c->transposed ? nb_transpose(in[0], 0, 1) : in[0];
  return c->log ? nb_log_softmax(x, c->axis) : nb_softmax(x, c->axis);
}

static void test_softmax(void) {
  sm_ctx cases[] = {
    {3, {3, 5, 4}, 1, 0, 0}, {3, {3, 5, 4}, -1, 0, 0}, {3, {3, 5, 4}, 0, 0, 0},
    {3, {3, 5, 4}, 1, 1, 0}, {2, {4, 7}, -1, 1, 0}, {2, {4, 7}, -1, 0, 1},
    {2, {4, 7}, 1, 1, 1}, {1, {1}, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sm_ctx *c = &cases[i];
    int64_t leaf_shape[4];
    memcpy(leaf_shape, c->shape, sizeof leaf_shape);
    if (c->transposed) { leaf_shape[0] = c->shape[1]; leaf_shape[1] = c->shape[0]; }
    nb_tensor *x = nbt_leaf(10 + i, c->ndim, leaf_shape);
    char name[96];
    snprintf(name, sizeof name, "%s axis %d%s case %zu", c->log ? "log_softmax" : "softmax", c->axis,
             c->transposed ? " transposed" : "", i);
    nnt_check_forward(name, sm_apply, sm_ref, c, 1, &x);
    nbt_gradcheck(name, sm_apply, c, 1, &x, 1e-6, 1e-5, 1e-8);
    nb_release(x);
  }
  /* a row of -inf entries (masked) keeps finite probabilities elsewhere */
  nb_scope_begin();
  nb_tensor *x = nnt_f64((double[]){0, -INFINITY, 1, -INFINITY}, 1, (int64_t[]){4});
  double e = exp(1.0);
  nbt_check_close("softmax with -inf", nb_softmax(x, 0), (double[]){1 / (1 + e), 0, e / (1 + e), 0}, 1e-12, 1e-12);
  /* create_graph: the gradient is differentiable; check d/dl of |grad|^2
   * against finite differences of the first gradient (computed in f64). */
  nb_tensor *l = nbt_leaf(3, 1, (int64_t[]){5});
  for (int lg = 0; lg < 2; lg++) {
    nb_scope_begin();
    nb_tensor *w = nb_arange(0, 5, 1, NB_F64, NB_DEVICE_CPU), *g = NULL;
    nb_tensor *y = nb_sum(nb_mul(lg ? nb_log_softmax(l, 0) : nb_softmax(l, 0), w), 0, NULL, 0);
    nb_status st = nb_autograd_grad(y, NULL, 1, &l, &g, 1);
    NBT_CHECK(st == NB_OK && g, "softmax create_graph first gradient: %s", nb_last_error());
    nb_zero_grad(l);
    st = g ? nb_backward(nb_sum(nb_square(g), 0, NULL, 0), NULL) : NB_ERR_NULL;
    NBT_CHECK(st == NB_OK && nb_grad(l), "softmax second derivative: %s", nb_last_error());
    double *ana = nb_grad(l) ? nbt_f64(nb_grad(l)) : calloc(5, sizeof(double)), *lv = nb_data_ptr(l);
    for (int j = 0; j < 5; j++) { /* numeric d/dl_j of sum(grad^2) */
      double v0 = lv[j], f[2];
      for (int s = 0; s < 2; s++) {
        lv[j] = v0 + (s ? -1e-6 : 1e-6);
        nb_tensor *g2 = NULL;
        nb_tensor *y2 = nb_sum(nb_mul(lg ? nb_log_softmax(l, 0) : nb_softmax(l, 0), w), 0, NULL, 0);
        nb_autograd_grad(y2, NULL, 1, &l, &g2, 0);
        f[s] = nb_item(nb_sum(nb_square(g2), 0, NULL, 0));
      }
      lv[j] = v0;
      double num = (f[0] - f[1]) / 2e-6;
      NBT_CHECK(fabs(num - ana[j]) <= 1e-5 * fabs(num) + 1e-7, "%s second derivative element %d: "
                "analytic %.10g numeric %.10g", lg ? "log_softmax" : "softmax", j, ana[j], num);
    }
    free(ana);
    nb_zero_grad(l);
    nb_scope_end();
  }
  nb_release(l);
  nb_scope_end();
}

/* ---- layer_norm / rms_norm ------------------------------------------------------ */
typedef struct { int64_t shape[3]; int n_norm, affine, bias, rms; double eps; } norm_ctx;

static void norm_ref(double *const *in, double *out, void *vc) {
  const norm_ctx *c = vc;
  int64_t D = 1, R = 1;
  for (int i = 0; i < 3; i++) *(i >= 3 - c->n_norm ? &D : &R) *= c->shape[i];
  const double *w = c->affine ? in[1] : NULL, *b = c->bias ? in[c->affine ? 2 : 1] : NULL;
  for (int64_t r = 0; r < R; r++) {
    const double *x = in[0] + r * D;
    double mu = 0, var = 0;
    if (!c->rms) {
      for (int64_t j = 0; j < D; j++) mu += x[j];
      mu /= (double)D;
    }
    for (int64_t j = 0; j < D; j++) var += (x[j] - mu) * (x[j] - mu);
    double rs = 1 / sqrt(var / (double)D + c->eps);
    for (int64_t j = 0; j < D; j++)
      out[r * D + j] = (x[j] - mu) * rs * (w ? w[j] : 1) + (b ? b[j] : 0);
  }
}

static nb_tensor *norm_apply(nb_tensor *const *in, void *vc) {
  const norm_ctx *c = vc;
  nb_tensor *w = c->affine ? in[1] : NULL, *b = c->bias ? in[c->affine ? 2 : 1] : NULL;
  return c->rms ? nb_rms_norm(in[0], c->n_norm, w, c->eps) : nb_layer_norm(in[0], c->n_norm, w, b, c->eps);
}

static void test_norms(void) {
  norm_ctx cases[] = {
    {{4, 3, 5}, 1, 1, 1, 0, 1e-5}, {{4, 3, 5}, 2, 1, 1, 0, 1e-5}, {{4, 3, 5}, 1, 0, 0, 0, 1e-5},
    {{4, 3, 5}, 2, 0, 0, 0, 1e-3}, {{2, 3, 7}, 1, 0, 1, 0, 1e-5}, {{4, 3, 5}, 1, 1, 0, 1, 1e-6},
    {{4, 3, 5}, 2, 1, 0, 1, 1e-6}, {{2, 3, 4}, 1, 0, 0, 1, 1e-6}, {{1, 2, 3}, 2, 1, 1, 0, 1e-5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    norm_ctx *c = &cases[i];
    nb_tensor *ins[3];
    int n = 0;
    ins[n++] = nbt_leaf(20 + i, 3, c->shape);
    const int64_t *tail = c->shape + 3 - c->n_norm;
    if (c->affine) ins[n++] = nbt_leaf(40 + i, c->n_norm, tail);
    if (c->bias) ins[n++] = nbt_leaf(60 + i, c->n_norm, tail);
    char name[96];
    snprintf(name, sizeof name, "%s n_norm %d%s%s case %zu", c->rms ? "rms_norm" : "layer_norm",
             c->n_norm, c->affine ? " weight" : "", c->bias ? " bias" : "", i);
    nnt_check_forward(name, norm_apply, norm_ref, c, n, ins);
    nbt_gradcheck(name, norm_apply, c, n, ins, 1e-6, 1e-5, 1e-7);
    nnt_release_all(n, ins);
  }
  /* a non-contiguous input and an f32 weight with f64 x */
  nb_scope_begin();
  nb_tensor *x = nbt_randn(5, 2, (int64_t[]){6, 4}, NB_F64);
  nb_tensor *xt = nb_transpose(x, 0, 1);
  nb_tensor *w = nbt_randn(6, 1, (int64_t[]){6}, NB_F32);
  nb_tensor *y = nb_layer_norm(xt, 1, w, NULL, 1e-5);
  norm_ctx c = {{1, 4, 6}, 1, 1, 0, 0, 1e-5};
  double *xv = nbt_f64(nb_contiguous(xt)), *wv = nbt_f64(w), ref[24];
  norm_ref((double *[]){xv, wv}, ref, &c);
  nbt_check_close("layer_norm transposed input, f32 weight", y, ref, 1e-10, 1e-10);
  free(xv);
  free(wv);
  nb_scope_end();
}

/* ---- cross_entropy / nll_loss / mse_loss ---------------------------------------- */
typedef struct {
  int64_t N, C, d;      /* d > 0: logits (N, C, d) */
  const int64_t *t;     /* targets, N*d (or 1 when N == 0: the (C) case) */
  nb_reduction red;
  int64_t ignore;
  double smooth;
  int nll;              /* nll_loss on log_softmax(x) instead */
} ce_ctx;

static int64_t ce_rows(const ce_ctx *c) { return c->N ? c->N * (c->d ? c->d : 1) : 1; }

/* Logit of row r (flattened over N and d), class j. */
static double ce_logit(const double *x, const ce_ctx *c, int64_t r, int64_t j) {
  if (!c->d) return x[r * c->C + j];
  int64_t n = r / c->d, k = r % c->d;
  return x[(n * c->C + j) * c->d + k];
}

static void ce_ref(double *const *in, double *out, void *vc) {
  const ce_ctx *c = vc;
  int64_t M = ce_rows(c), count = 0;
  double total = 0;
  for (int64_t r = 0; r < M; r++) {
    int64_t t = c->t[r];
    double m = -INFINITY, s = 0, sx = 0, l = 0;
    for (int64_t j = 0; j < c->C; j++) m = fmax(m, ce_logit(in[0], c, r, j));
    for (int64_t j = 0; j < c->C; j++) {
      s += exp(ce_logit(in[0], c, r, j) - m);
      sx += ce_logit(in[0], c, r, j);
    }
    double lse = m + log(s);
    if (t != c->ignore) {
      l = (1 - c->smooth) * (lse - ce_logit(in[0], c, r, t)) + c->smooth * (lse - sx / (double)c->C);
      count++;
    }
    if (c->red == NB_REDUCE_NONE) out[r] = l;
    total += l;
  }
  if (c->red == NB_REDUCE_SUM) out[0] = total;
  if (c->red == NB_REDUCE_MEAN) out[0] = total / (double)count;
}

static nb_tensor *ce_apply(nb_tensor *const *in, void *vc) {
  const ce_ctx *c = vc;
  int64_t tshape[2] = {c->N, c->d};
  nb_tensor *t = nnt_i64(c->t, c->N ? (c->d ? 2 : 1) : 0, tshape);
  if (c->nll) return nb_nll_loss(nb_log_softmax(in[0], c->N ? 1 : 0), t, c->red, c->ignore);
  return nb_cross_entropy(in[0], t, c->red, c->ignore, c->smooth);
}

static void test_cross_entropy(void) {
  static const int64_t t5[] = {1, 3, -100, 0, 2}, t1[] = {2}, t23[] = {0, 3, 1, -100, 2, 2};
  static const nb_reduction reds[] = {NB_REDUCE_MEAN, NB_REDUCE_SUM, NB_REDUCE_NONE};
  static const char *red_names[] = {"mean", "sum", "none"};
  for (int nll = 0; nll < 2; nll++)
    for (int r = 0; r < 3; r++) {
      ce_ctx cases[] = {
        {5, 4, 0, t5, reds[r], -100, 0.0, nll},
        {5, 4, 0, t5, reds[r], -100, 0.1, nll},
        {5, 4, 0, t5, reds[r], 3, 0.0, nll},   /* -100 is then a bad target */
        {0, 4, 0, t1, reds[r], -100, 0.25, nll},
        {2, 4, 3, t23, reds[r], -100, 0.1, nll},
      };
      for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ce_ctx *c = &cases[i];
        if (nll && c->smooth != 0) continue;
        int64_t shape[3] = {c->N, c->C, c->d};
        nb_tensor *x = c->N ? nbt_leaf(80 + i, c->d ? 3 : 2, shape) : nbt_leaf(80 + i, 1, &c->C);
        char name[96];
        snprintf(name, sizeof name, "%s %s ignore %lld smoothing %g case %zu", nll ? "nll_loss" : "cross_entropy",
                 red_names[r], (long long)c->ignore, c->smooth, i);
        if (c->ignore == 3) {
          nb_scope_begin();
          nb_tensor *y = ce_apply(&x, c);
          if (nll) nbt_check_error(name, !y, NB_ERR_INDEX, "nll_loss", "-100", NULL);
          else nbt_check_error(name, !y, NB_ERR_INDEX, "cross_entropy", "target -100", "4 classes", NULL);
          nb_scope_end();
        } else {
          nnt_check_forward(name, ce_apply, ce_ref, c, 1, &x);
          nbt_gradcheck(name, ce_apply, c, 1, &x, 1e-6, 1e-5, 1e-8);
        }
        nb_release(x);
      }
    }
  /* every row ignored: the mean is 0/0 = NaN (like torch), the sum is 0 */
  nb_scope_begin();
  nb_tensor *x = nbt_randn(1, 2, (int64_t[]){2, 3}, NB_F32);
  nb_tensor *t = nnt_i64((int64_t[]){-1, -1}, 1, (int64_t[]){2});
  NBT_CHECK(isnan(nb_item(nb_cross_entropy(x, t, NB_REDUCE_MEAN, -1, 0))), "all-ignored mean is NaN");
  NBT_CHECK(nb_item(nb_cross_entropy(x, t, NB_REDUCE_SUM, -1, 0)) == 0, "all-ignored sum is 0");
  /* i32 targets are accepted */
  nb_tensor *t32 = nb_cast(nnt_i64((int64_t[]){2, 0}, 1, (int64_t[]){2}), NB_I32);
  nb_tensor *t64 = nnt_i64((int64_t[]){2, 0}, 1, (int64_t[]){2});
  NBT_CHECK(nb_item(nb_cross_entropy(x, t32, NB_REDUCE_SUM, -100, 0)) ==
                nb_item(nb_cross_entropy(x, t64, NB_REDUCE_SUM, -100, 0)), "i32 targets");
  nb_scope_end();
}

typedef struct { int64_t sa[2], sb[2]; int nda, ndb; nb_reduction red; } mse_ctx;

static void mse_ref(double *const *in, double *out, void *vc) {
  const mse_ctx *c = vc;
  int64_t R = c->sa[0], C = c->sa[1];
  double s = 0;
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < C; j++) {
      double d = in[0][i * C + j] - in[1][c->ndb == 2 ? i * C + j : j];
      if (c->red == NB_REDUCE_NONE) out[i * C + j] = d * d;
      s += d * d;
    }
  if (c->red != NB_REDUCE_NONE) out[0] = c->red == NB_REDUCE_SUM ? s : s / (double)(R * C);
}

static nb_tensor *mse_apply(nb_tensor *const *in, void *vc) {
  return nb_mse_loss(in[0], in[1], ((const mse_ctx *)vc)->red);
}

static void test_mse(void) {
  for (int r = 0; r < 3; r++)
    for (int bc = 0; bc < 2; bc++) {
      mse_ctx c = {{3, 4}, {3, 4}, 2, 2, (nb_reduction)r};
      if (bc) { c.sb[0] = 4; c.ndb = 1; }
      nb_tensor *ins[2] = {nbt_leaf(100 + r, 2, c.sa), nbt_leaf(110 + r, c.ndb, c.sb)};
      char name[64];
      snprintf(name, sizeof name, "mse_loss reduction %d%s", r, bc ? " broadcast" : "");
      nnt_check_forward(name, mse_apply, mse_ref, &c, 2, ins);
      nbt_gradcheck(name, mse_apply, &c, 2, ins, 1e-6, 1e-5, 1e-8);
      nnt_release_all(2, ins);
    }
}

/* ---- dropout ------------------------------------------------------------------------ */
typedef struct { double p; uint64_t seed, offset; } drop_ctx;

static nb_tensor *drop_apply(nb_tensor *const *in, void *vc) {
  const drop_ctx *c = vc;
  nb_rng rng = {c->seed, c->offset};
  return nb_dropout(in[0], c->p, &rng);
}

static void test_dropout(void) {
  nb_scope_begin();
  int64_t n = 4000;
  nb_tensor *x = nb_add_scalar(nb_abs(nbt_randn(7, 2, (int64_t[]){40, 100}, NB_F64)), 0.5);
  double p = 0.3;
  nb_rng rng = {1234, 77};
  nb_tensor *y = nb_dropout(x, p, &rng);
  NBT_CHECK(rng.offset == 77 + (uint64_t)n, "dropout advances the offset by numel (got %llu)",
            (unsigned long long)rng.offset);
  double *xv = nbt_f64(x), *yv = nbt_f64(y);
  int64_t dropped = 0, bad = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t w[4];
    nb_philox4x32(1234, 77 + (uint64_t)i, w);
    int keep = nb_philox_u01(w[0]) >= p;
    dropped += !keep;
    if (keep ? fabs(yv[i] - xv[i] / (1 - p)) > 1e-12 : yv[i] != 0) bad++;
  }
  NBT_CHECK(bad == 0, "dropout mask follows Philox (seed, offset + i): %lld mismatches", (long long)bad);
  NBT_CHECK(fabs((double)dropped / (double)n - p) < 0.03, "dropout rate %g (expected about %g)",
            (double)dropped / (double)n, p);
  nb_rng again = {1234, 77};
  nbt_check_close("dropout reproducible from (seed, offset)", nb_dropout(x, p, &again), yv, 0, 0);
  /* a transposed input uses the row-major order of its logical elements */
  nb_rng r2 = {1234, 77}, r2c = {1234, 77};
  nb_tensor *yt = nb_dropout(nb_transpose(x, 0, 1), p, &r2);
  double *ytc = nbt_f64(nb_dropout(nb_clone(nb_transpose(x, 0, 1)), p, &r2c));
  nbt_check_close("dropout on a transposed view", yt, ytc, 0, 0);
  free(ytc);
  free(xv);
  free(yv);
  /* grad = mask / (1 - p) * g */
  nb_tensor *l = nbt_leaf(8, 1, (int64_t[]){200});
  nb_tensor *g = nbt_randn(9, 1, (int64_t[]){200}, NB_F64);
  nb_rng r3 = {99, 5};
  nb_tensor *d = nb_dropout(l, 0.4, &r3);
  nb_backward(d, g);
  double *gv = nbt_f64(g), *lv = nbt_f64(l), *dv = nbt_f64(d), *gr = nbt_f64(nb_grad(l));
  int64_t gbad = 0;
  for (int i = 0; i < 200; i++) {
    double mask = dv[i] != 0 ? 1 : 0;
    if (fabs(gr[i] - mask / 0.6 * gv[i]) > 1e-12) gbad++;
  }
  NBT_CHECK(gbad == 0, "dropout gradient is mask/(1-p)*g (%lld mismatches)", (long long)gbad);
  free(gv); free(lv); free(dv); free(gr);
  drop_ctx c = {0.4, 99, 5};
  /* dropout is linear in x, so a wide step is exact up to rounding */
  nbt_gradcheck("dropout", drop_apply, &c, 1, &l, 1e-2, 1e-6, 1e-9);
  /* p = 0 returns x itself; p = 1 zeroes everything */
  NBT_CHECK(nb_dropout(l, 0.0, &r3) == l, "dropout p=0 returns x");
  nb_tensor *z = nb_dropout(l, 1.0, &r3);
  NBT_CHECK(z && nb_item(nb_sum(nb_abs(z), 0, NULL, 0)) == 0, "dropout p=1 gives zeros");
  /* bf16 keeps the same mask */
  nb_rng r4 = {1234, 77}, r5 = {1234, 77};
  nb_tensor *yb = nb_dropout(nb_cast(x, NB_BF16), p, &r4), *yf = nb_dropout(nb_cast(nb_cast(x, NB_BF16), NB_F64), p, &r5);
  double *yfv = nbt_f64(yf);
  nbt_check_close("dropout bf16 against f64", yb, yfv, 1e-2, 1e-2);
  free(yfv);
  nb_release(l);
  nb_scope_end();
}

/* ---- linear ------------------------------------------------------------------------- */
typedef struct { int64_t xs[3]; int xnd, bias; int64_t out; } lin_ctx;

static void lin_ref(double *const *in, double *out, void *vc) {
  const lin_ctx *c = vc;
  int64_t K = c->xs[c->xnd - 1], R = 1;
  for (int i = 0; i < c->xnd - 1; i++) R *= c->xs[i];
  for (int64_t r = 0; r < R; r++)
    for (int64_t o = 0; o < c->out; o++) {
      double s = c->bias ? in[2][o] : 0;
      for (int64_t k = 0; k < K; k++) s += in[0][r * K + k] * in[1][o * K + k];
      out[r * c->out + o] = s;
    }
}

static nb_tensor *lin_apply(nb_tensor *const *in, void *vc) {
  return nb_linear(in[0], in[1], ((const lin_ctx *)vc)->bias ? in[2] : NULL);
}

static void test_linear(void) {
  lin_ctx cases[] = {{{2, 3, 4}, 3, 1, 5}, {{2, 3, 4}, 3, 0, 5}, {{4}, 1, 1, 3}, {{7, 6}, 2, 1, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    lin_ctx *c = &cases[i];
    int64_t K = c->xs[c->xnd - 1];
    nb_tensor *ins[3] = {nbt_leaf(120 + i, c->xnd, c->xs), nbt_leaf(130 + i, 2, (int64_t[]){c->out, K}),
                         nbt_leaf(140 + i, 1, &c->out)};
    char name[64];
    snprintf(name, sizeof name, "linear case %zu%s", i, c->bias ? "" : " no bias");
    nnt_check_forward(name, lin_apply, lin_ref, c, c->bias ? 3 : 2, ins);
    nbt_gradcheck(name, lin_apply, c, c->bias ? 3 : 2, ins, 1e-6, 1e-5, 1e-8);
    nnt_release_all(3, ins);
  }
}

/* ---- triu / tril -------------------------------------------------------------------- */
typedef struct { int64_t k; int upper; } band_ctx;

static void band_ref(double *const *in, double *out, void *vc) {
  const band_ctx *c = vc;
  for (int b = 0; b < 2; b++)
    for (int64_t i = 0; i < 4; i++)
      for (int64_t j = 0; j < 5; j++) {
        int keep = c->upper ? j - i >= c->k : j - i <= c->k;
        int64_t o = (b * 4 + i) * 5 + j;
        out[o] = keep ? in[0][o] : 0;
      }
}

static nb_tensor *band_apply(nb_tensor *const *in, void *vc) {
  const band_ctx *c = vc;
  return c->upper ? nb_triu(in[0], c->k) : nb_tril(in[0], c->k);
}

static void test_triu_tril(void) {
  for (int upper = 0; upper < 2; upper++)
    for (int64_t k = -2; k <= 2; k++) {
      band_ctx c = {k, upper};
      nb_tensor *x = nbt_leaf(150 + k, 3, (int64_t[]){2, 4, 5});
      char name[48];
      snprintf(name, sizeof name, "%s k=%lld", upper ? "triu" : "tril", (long long)k);
      nnt_check_forward(name, band_apply, band_ref, &c, 1, &x);
      nbt_gradcheck(name, band_apply, &c, 1, &x, 1e-6, 1e-6, 1e-9);
      nb_release(x);
    }
  nb_scope_begin();
  nb_tensor *xi = nnt_i64((int64_t[]){1, 2, 3, 4}, 2, (int64_t[]){2, 2});
  nb_tensor *ti = nb_tril(xi, 0);
  NBT_CHECK(ti && nb_dtype_of(ti) == NB_I64, "tril keeps an integer dtype");
  nbt_check_close("tril i64", ti, (double[]){1, 0, 3, 4}, 0, 0);
  nb_scope_end();
}

/* ---- scaled dot-product attention ------------------------------------------------- */
typedef struct { int causal, mask, bool_mask; int64_t B, Lq, Lk, D, Dv; double scale; } at_ctx;

static double at_mask(const at_ctx *c, int64_t i, int64_t j) { return c->mask ? 0.3 * sin((double)(i * 7 + j)) : 0; }
static int at_bool(int64_t i, int64_t j) { return (i + 2 * j) % 3 != 1; }

/* Row i of batch b of the attention weights, softmax(q k^T * scale + mask),
 * into p[0..Lk). */
static void at_probs(const at_ctx *c, double *const *in, int64_t b, int64_t i, double *p) {
  double sc = c->scale > 0 ? c->scale : 1 / sqrt((double)c->D), m = -INFINITY, z = 0;
  for (int64_t j = 0; j < c->Lk; j++) {
    double d = 0;
    for (int64_t e = 0; e < c->D; e++) d += in[0][(b * c->Lq + i) * c->D + e] * in[1][(b * c->Lk + j) * c->D + e];
    p[j] = d * sc + (c->bool_mask ? 0 : at_mask(c, i, j));
    if ((c->causal && j > i) || (c->bool_mask && !at_bool(i, j))) p[j] = -INFINITY;
    m = fmax(m, p[j]);
  }
  for (int64_t j = 0; j < c->Lk; j++) z += (p[j] = exp(p[j] - m));
  for (int64_t j = 0; j < c->Lk; j++) p[j] /= z;
}

/* out row = p @ v */
static void at_out_row(const at_ctx *c, double *const *in, int64_t b, int64_t i, const double *p, double *out) {
  for (int64_t e = 0; e < c->Dv; e++) {
    double acc = 0;
    for (int64_t j = 0; j < c->Lk; j++) acc += p[j] * in[2][(b * c->Lk + j) * c->Dv + e];
    out[(b * c->Lq + i) * c->Dv + e] = acc;
  }
}

static void at_ref(double *const *in, double *out, void *vc) {
  const at_ctx *c = vc;
  double p[16];
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t i = 0; i < c->Lq; i++) {
      at_probs(c, in, b, i, p);
      at_out_row(c, in, b, i, p, out);
    }
}

static nb_tensor *at_apply(nb_tensor *const *in, void *vc) {
  const at_ctx *c = vc;
  nb_tensor *mask = NULL;
  if (c->mask || c->bool_mask) {
    double mv[16 * 16];
    for (int64_t i = 0; i < c->Lq; i++)
      for (int64_t j = 0; j < c->Lk; j++) mv[i * c->Lk + j] = c->bool_mask ? at_bool(i, j) : at_mask(c, i, j);
    mask = nnt_f64(mv, 2, (int64_t[]){c->Lq, c->Lk});
    if (c->bool_mask) mask = nb_cast(mask, NB_BOOL);
  }
  return nb_scaled_dot_product_attention(in[0], in[1], in[2], mask, c->causal, 0.0, NULL, c->scale);
}

#define AT_DROP_P 0.3
#define AT_DROP_SEED 4242
#define AT_DROP_OFFSET 17

static nb_tensor *at_drop_apply(nb_tensor *const *in, void *vc) {
  const at_ctx *c = vc;
  nb_rng rng = {AT_DROP_SEED, AT_DROP_OFFSET};
  return nb_scaled_dot_product_attention(in[0], in[1], in[2], NULL, c->causal, AT_DROP_P, &rng, c->scale);
}

static void at_drop_ref(double *const *in, double *out, void *vc) {
  const at_ctx *c = vc;
  double p[16];
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t i = 0; i < c->Lq; i++) {
      at_probs(c, in, b, i, p);
      for (int64_t j = 0; j < c->Lk; j++) {
        uint32_t w[4];
        nb_philox4x32(AT_DROP_SEED, AT_DROP_OFFSET + (uint64_t)((b * c->Lq + i) * c->Lk + j), w);
        p[j] = nb_philox_u01(w[0]) >= AT_DROP_P ? p[j] / (1 - AT_DROP_P) : 0;
      }
      at_out_row(c, in, b, i, p, out);
    }
}

static void test_attention(void) {
  at_ctx cases[] = {
    {0, 0, 0, 2, 3, 5, 4, 6, 0}, {1, 0, 0, 2, 3, 5, 4, 6, 0}, {0, 1, 0, 2, 3, 5, 4, 6, 0},
    {1, 1, 0, 2, 4, 4, 3, 2, 0.7}, {0, 0, 1, 1, 3, 4, 2, 3, 0},
  };
  const char *names[] = {"plain", "causal", "additive mask", "causal + mask", "bool mask"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    at_ctx *c = &cases[i];
    nb_tensor *ins[3] = {nbt_leaf(160 + i, 3, (int64_t[]){c->B, c->Lq, c->D}),
                         nbt_leaf(170 + i, 3, (int64_t[]){c->B, c->Lk, c->D}),
                         nbt_leaf(180 + i, 3, (int64_t[]){c->B, c->Lk, c->Dv})};
    char name[64];
    snprintf(name, sizeof name, "attention %s", names[i]);
    nnt_check_forward(name, at_apply, at_ref, c, 3, ins);
    nbt_gradcheck(name, at_apply, c, 3, ins, 1e-6, 1e-5, 1e-8);
    nnt_release_all(3, ins);
  }
  /* dropout inside attention, causal: against a reference that drops the
   * attention weights with the Philox mask of (seed, offset + i), i the
   * row-major index into (B, Lq, Lk), and gradients (the mask is fixed by
   * the rng state, so the function is deterministic) */
  {
    at_ctx c = {1, 0, 0, 2, 4, 5, 3, 2, 0};
    nb_tensor *ins[3] = {nbt_leaf(190, 3, (int64_t[]){2, 4, 3}), nbt_leaf(191, 3, (int64_t[]){2, 5, 3}),
                         nbt_leaf(192, 3, (int64_t[]){2, 5, 2})};
    nnt_check_forward("attention causal dropout", at_drop_apply, at_drop_ref, &c, 3, ins);
    nbt_gradcheck("attention causal dropout", at_drop_apply, &c, 3, ins, 1e-6, 1e-5, 1e-8);
    nnt_release_all(3, ins);
  }
  /* dropout inside attention: reproducible, and p = 1 gives zeros */
  nb_scope_begin();
  nb_tensor *q = nbt_randn(1, 3, (int64_t[]){2, 3, 4}, NB_F32);
  nb_rng r1 = {5, 0}, r2 = {5, 0};
  nb_tensor *a1 = nb_scaled_dot_product_attention(q, q, q, NULL, 1, 0.5, &r1, 0);
  nb_tensor *a2 = nb_scaled_dot_product_attention(q, q, q, NULL, 1, 0.5, &r2, 0);
  double *v1 = nbt_f64(a1);
  nbt_check_close("attention dropout reproducible", a2, v1, 0, 0);
  NBT_CHECK(r1.offset == 2 * 3 * 3, "attention dropout advanced the rng by the scores' size");
  free(v1);
  nb_scope_end();
}

/* ---- errors ------------------------------------------------------------------------- */
static void test_errors(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(1, 2, (int64_t[]){3, 4}, NB_F32);
  nb_tensor *xi = nnt_i64((int64_t[]){1, 2, 3}, 1, (int64_t[]){3});
  nb_tensor *t = nnt_i64((int64_t[]){0, 1, 3}, 1, (int64_t[]){3});
  nb_rng rng = nb_rng_new(1);
  /* NULL propagation keeps the first message */
  nb_clear_error();
  nbt_check_error("softmax NULL", !nb_softmax(NULL, 0), NB_ERR_NULL, "softmax", NULL);
  nbt_check_error("layer_norm NULL chain", !nb_layer_norm(nb_softmax(x, 5), 1, NULL, NULL, 1e-5),
                  NB_ERR_AXIS, "softmax", "axis 5", NULL);
  nbt_check_error("cross_entropy NULL targets", !nb_cross_entropy(x, NULL, NB_REDUCE_MEAN, -100, 0),
                  NB_ERR_NULL, "cross_entropy", "targets", NULL);
  nbt_check_error("linear NULL", !nb_linear(x, NULL, NULL), NB_ERR_NULL, "linear", NULL);
  nbt_check_error("attention NULL", !nb_scaled_dot_product_attention(x, x, NULL, NULL, 0, 0, NULL, 0),
                  NB_ERR_NULL, "scaled_dot_product_attention", NULL);
  nbt_check_error("dropout NULL rng", !nb_dropout(x, 0.5, NULL), NB_ERR_NULL, "dropout", "rng", NULL);
  /* dtypes */
  nbt_check_error("softmax int", !nb_softmax(xi, 0), NB_ERR_DTYPE, "softmax", "i64", NULL);
  nbt_check_error("log_softmax int", !nb_log_softmax(xi, 0), NB_ERR_DTYPE, "log_softmax", NULL);
  nbt_check_error("layer_norm int", !nb_layer_norm(xi, 1, NULL, NULL, 1e-5), NB_ERR_DTYPE, "layer_norm", NULL);
  nbt_check_error("cross_entropy f32 targets", !nb_cross_entropy(x, nb_cast(t, NB_F32), NB_REDUCE_MEAN, -100, 0),
                  NB_ERR_DTYPE, "cross_entropy", "targets", "i64", NULL);
  nbt_check_error("mse int", !nb_mse_loss(xi, xi, NB_REDUCE_MEAN), NB_ERR_DTYPE, "mse_loss", NULL);
  nbt_check_error("dropout int", !nb_dropout(xi, 0.5, &rng), NB_ERR_DTYPE, "dropout", NULL);
  nbt_check_error("linear int weight", !nb_linear(x, nb_cast(x, NB_I32), NULL), NB_ERR_DTYPE, "linear", NULL);
  /* shapes */
  nb_tensor *w5 = nbt_randn(2, 1, (int64_t[]){5}, NB_F32);
  nbt_check_error("layer_norm weight shape", !nb_layer_norm(x, 1, w5, NULL, 1e-5), NB_ERR_SHAPE,
                  "layer_norm", "weight f32[5]", "[4]", NULL);
  nbt_check_error("rms_norm weight shape", !nb_rms_norm(x, 2, w5, 1e-5), NB_ERR_SHAPE, "rms_norm", NULL);
  nbt_check_error("cross_entropy target shape", !nb_cross_entropy(x, nb_slice(t, 0, 0, 2, 1), NB_REDUCE_MEAN, -100, 0),
                  NB_ERR_SHAPE, "cross_entropy", "f32[3, 4]", "i64[2]", NULL);
  nbt_check_error("nll target shape", !nb_nll_loss(x, nb_reshape(t, 2, (int64_t[]){3, 1}), NB_REDUCE_MEAN, -100),
                  NB_ERR_SHAPE, "nll_loss", NULL);
  nbt_check_error("mse shapes", !nb_mse_loss(x, w5, NB_REDUCE_MEAN), NB_ERR_SHAPE, "mse_loss", "[3, 4]", "[5]", NULL);
  nbt_check_error("linear shapes", !nb_linear(x, nbt_randn(3, 2, (int64_t[]){2, 5}, NB_F32), NULL),
                  NB_ERR_SHAPE, "linear", "f32[3, 4]", "f32[2, 5]", NULL);
  nbt_check_error("linear bias", !nb_linear(x, nbt_randn(3, 2, (int64_t[]){2, 4}, NB_F32), w5),
                  NB_ERR_SHAPE, "linear", "bias", NULL);
  nbt_check_error("attention shapes", !nb_scaled_dot_product_attention(x, w5, x, NULL, 0, 0, NULL, 0),
                  NB_ERR_SHAPE, "scaled_dot_product_attention", NULL);
  nbt_check_error("attention mask", !nb_scaled_dot_product_attention(x, x, x, w5, 0, 0, NULL, 0),
                  NB_ERR_SHAPE, "scaled_dot_product_attention", "mask", NULL);
  nbt_check_error("triu 1-D", !nb_triu(w5, 0), NB_ERR_SHAPE, "triu", NULL);
  /* axes */
  nbt_check_error("softmax axis", !nb_softmax(x, -3), NB_ERR_AXIS, "softmax", "axis -3", NULL);
  nbt_check_error("layer_norm n_norm", !nb_layer_norm(x, 3, NULL, NULL, 1e-5), NB_ERR_AXIS, "layer_norm", "n_norm 3", NULL);
  nbt_check_error("rms_norm n_norm 0", !nb_rms_norm(x, 0, NULL, 1e-5), NB_ERR_AXIS, "rms_norm", NULL);
  /* values and indices */
  nbt_check_error("dropout p<0", !nb_dropout(x, -0.1, &rng), NB_ERR_VALUE, "dropout", "-0.1", NULL);
  nbt_check_error("dropout p>1", !nb_dropout(x, 1.5, &rng), NB_ERR_VALUE, "dropout", "1.5", NULL);
  nbt_check_error("dropout p NaN", !nb_dropout(x, NAN, &rng), NB_ERR_VALUE, "dropout", NULL);
  nbt_check_error("attention dropout p", !nb_scaled_dot_product_attention(x, x, x, NULL, 0, 2, &rng, 0),
                  NB_ERR_VALUE, "scaled_dot_product_attention", NULL);
  nbt_check_error("layer_norm eps", !nb_layer_norm(x, 1, NULL, NULL, -1), NB_ERR_VALUE, "layer_norm", "eps", NULL);
  nbt_check_error("smoothing", !nb_cross_entropy(x, t, NB_REDUCE_MEAN, -100, 1.5), NB_ERR_VALUE,
                  "cross_entropy", "label_smoothing 1.5", NULL);
  nbt_check_error("reduction", !nb_cross_entropy(x, t, (nb_reduction)7, -100, 0), NB_ERR_VALUE,
                  "cross_entropy", "reduction 7", NULL);
  nb_tensor *tbad = nnt_i64((int64_t[]){0, 4, 1}, 1, (int64_t[]){3});
  nbt_check_error("cross_entropy target range", !nb_cross_entropy(x, tbad, NB_REDUCE_MEAN, -100, 0),
                  NB_ERR_INDEX, "cross_entropy", "target 4", "4 classes", NULL);
  nb_tensor *tneg = nnt_i64((int64_t[]){0, -2, 1}, 1, (int64_t[]){3});
  nbt_check_error("cross_entropy negative target", !nb_cross_entropy(x, tneg, NB_REDUCE_SUM, -100, 0),
                  NB_ERR_INDEX, "cross_entropy", "target -2", NULL);
  nbt_check_error("nll target range", !nb_nll_loss(x, tbad, NB_REDUCE_MEAN, -100), NB_ERR_INDEX,
                  "nll_loss", "4", NULL);
  nb_scope_end();
}

int main(void) {
  test_softmax();
  test_norms();
  test_cross_entropy();
  test_mse();
  test_dropout();
  test_linear();
  test_triu_tril();
  test_attention();
  test_errors();
  return nbt_finish();
}
