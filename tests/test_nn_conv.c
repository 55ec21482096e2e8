/* Neural-network ops, part 3: conv2d (stride, padding, dilation, groups,
 * NHWC, no bias) and max/avg pooling. Forward against a naive float64
 * convolution (f64, f32, bf16), gradients of input, weight and bias against
 * finite differences, double backward through conv2d, and the errors. */
#include "nn_testutil.h"

typedef struct {
  int64_t N, C, H, W, O, kh, kw;
  nb_conv2d_params p;
  int bias;
} conv_ctx;

static int64_t out_size(int64_t in, int64_t k, int s, int pad, int d) {
  return (in + 2 * pad - d * (k - 1) - 1) / s + 1;
}

/* x element (n, c, y, x) of the leaf, NCHW or NHWC; 0 in the padding. */
static double conv_x(const double *x, const conv_ctx *c, int64_t n, int64_t ch, int64_t y, int64_t xx) {
  if (y < 0 || y >= c->H || xx < 0 || xx >= c->W) return 0;
  if (c->p.channels_last) return x[((n * c->H + y) * c->W + xx) * c->C + ch];
  return x[((n * c->C + ch) * c->H + y) * c->W + xx];
}

static void conv_ref(double *const *in, double *out, void *vc) {
  const conv_ctx *c = vc;
  const nb_conv2d_params *p = &c->p;
  int64_t OH = out_size(c->H, c->kh, p->stride[0], p->padding[0], p->dilation[0]);
  int64_t OW = out_size(c->W, c->kw, p->stride[1], p->padding[1], p->dilation[1]);
  int64_t Cg = c->C / p->groups, Og = c->O / p->groups;
  for (int64_t n = 0; n < c->N; n++)
    for (int64_t o = 0; o < c->O; o++)
      for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t ox = 0; ox < OW; ox++) {
          double s = c->bias ? in[2][o] : 0;
          for (int64_t ci = 0; ci < Cg; ci++)
            for (int64_t i = 0; i < c->kh; i++)
              for (int64_t j = 0; j < c->kw; j++)
                s += conv_x(in[0], c, n, (o / Og) * Cg + ci, oy * p->stride[0] - p->padding[0] + i * p->dilation[0],
                            ox * p->stride[1] - p->padding[1] + j * p->dilation[1]) *
                     in[1][((o * Cg + ci) * c->kh + i) * c->kw + j];
          int64_t k = p->channels_last ? ((n * OH + oy) * OW + ox) * c->O + o : ((n * c->O + o) * OH + oy) * OW + ox;
          out[k] = s;
        }
}

static nb_tensor *conv_apply(nb_tensor *const *in, void *vc) {
  const conv_ctx *c = vc;
  return nb_conv2d(in[0], in[1], c->bias ? in[2] : NULL, c->p);
}

static conv_ctx conv_case(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t kh, int64_t kw,
                          int s0, int s1, int p0, int p1, int d0, int d1, int groups, int nhwc, int bias) {
  conv_ctx c = {N, C, H, W, O, kh, kw, nb_conv2d_defaults(), bias};
  c.p.stride[0] = s0; c.p.stride[1] = s1;
  c.p.padding[0] = p0; c.p.padding[1] = p1;
  c.p.dilation[0] = d0; c.p.dilation[1] = d1;
  c.p.groups = groups;
  c.p.channels_last = nhwc;
  return c;
}

static void test_conv2d(void) {
  conv_ctx cases[] = {
    conv_case(2, 3, 5, 6, 4, 3, 2, 1, 1, 0, 0, 1, 1, 1, 0, 1),  /* plain */
    conv_case(2, 3, 7, 6, 2, 3, 3, 2, 1, 0, 0, 1, 1, 1, 0, 1),  /* stride */
    conv_case(1, 2, 4, 5, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1, 0, 1),  /* padding */
    conv_case(1, 2, 7, 6, 2, 2, 3, 1, 1, 0, 0, 2, 1, 1, 0, 1),  /* dilation */
    conv_case(2, 4, 5, 5, 6, 3, 2, 1, 1, 1, 0, 1, 1, 2, 0, 1),  /* groups */
    conv_case(1, 3, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 3, 0, 0),  /* depthwise, no bias */
    conv_case(2, 3, 5, 6, 4, 3, 2, 1, 1, 0, 0, 1, 1, 1, 1, 1),  /* NHWC */
    conv_case(1, 4, 7, 6, 4, 3, 2, 2, 1, 1, 2, 2, 1, 2, 1, 1),  /* NHWC, everything */
    conv_case(2, 2, 6, 7, 4, 2, 3, 2, 3, 1, 1, 1, 2, 2, 0, 0),  /* everything, no bias */
    conv_case(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1),  /* 1x1 */
  };
  const char *names[] = {"plain", "stride", "padding", "dilation", "groups", "depthwise no bias",
                         "NHWC", "NHWC all options", "all options no bias", "1x1"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    conv_ctx *c = &cases[i];
    int64_t xs[4] = {c->N, c->C, c->H, c->W};
    if (c->p.channels_last) { xs[1] = c->H; xs[2] = c->W; xs[3] = c->C; }
    nb_tensor *ins[3] = {nbt_leaf(300 + i, 4, xs), nbt_leaf(310 + i, 4, (int64_t[]){c->O, c->C / c->p.groups, c->kh, c->kw}),
                         nbt_leaf(320 + i, 1, &c->O)};
    char name[64];
    snprintf(name, sizeof name, "conv2d %s", names[i]);
    nnt_check_forward(name, conv_apply, conv_ref, c, c->bias ? 3 : 2, ins);
    nbt_gradcheck(name, conv_apply, c, c->bias ? 3 : 2, ins, 1e-6, 1e-5, 1e-8);
    nnt_release_all(3, ins);
  }
}

/* Double backward: d/dW of |dL/dx|^2 through conv2d's differentiable rule,
 * against finite differences of the first gradient. */
static double conv_grad_sq(nb_tensor *x, nb_tensor *w, const conv_ctx *c, nb_tensor **gx, int create) {
  nb_tensor *y = nb_conv2d(x, w, NULL, c->p);
  nb_tensor *loss = nb_sum(nb_mul(y, nb_sin(y)), 0, NULL, 0);
  nb_tensor *g = NULL;
  nb_autograd_grad(loss, NULL, 1, &x, &g, create);
  if (gx) *gx = g;
  return g ? nb_item(nb_sum(nb_square(g), 0, NULL, 0)) : NAN;
}

static void test_conv2d_double_backward(void) {
  conv_ctx c = conv_case(1, 2, 5, 4, 2, 2, 2, 1, 2, 1, 0, 1, 1, 2, 0, 0);
  nb_scope_begin();
  nb_tensor *x = nbt_leaf(340, 4, (int64_t[]){1, 2, 5, 4});
  nb_tensor *w = nbt_leaf(341, 4, (int64_t[]){2, 1, 2, 2});
  nb_tensor *g = NULL;
  conv_grad_sq(x, w, &c, &g, 1);
  nb_status st = g ? nb_backward(nb_sum(nb_square(g), 0, NULL, 0), NULL) : NB_ERR_NULL;
  NBT_CHECK(st == NB_OK && nb_grad(w), "conv2d double backward: %s", nb_last_error());
  double *ana = nb_grad(w) ? nbt_f64(nb_grad(w)) : calloc(8, sizeof(double)), *wv = nb_data_ptr(w);
  for (int j = 0; j < 8; j++) {
    double w0 = wv[j];
    wv[j] = w0 + 1e-6;
    double fp = conv_grad_sq(x, w, &c, NULL, 0);
    wv[j] = w0 - 1e-6;
    double fm = conv_grad_sq(x, w, &c, NULL, 0);
    wv[j] = w0;
    double num = (fp - fm) / 2e-6;
    NBT_CHECK(fabs(num - ana[j]) <= 1e-5 * fabs(num) + 1e-6, "conv2d second derivative dW[%d]: analytic "
              "%.10g numeric %.10g", j, ana[j], num);
  }
  free(ana);
  nb_release(x);
  nb_release(w);
  nb_scope_end();
}

/* ---- pooling ------------------------------------------------------------------------ */
typedef struct { int64_t N, C, H, W; int kh, kw, sh, sw, ph, pw, max, three_d; } pool_ctx;

static void pool_ref(double *const *in, double *out, void *vc) {
  const pool_ctx *c = vc;
  int64_t OH = (c->H + 2 * c->ph - c->kh) / c->sh + 1, OW = (c->W + 2 * c->pw - c->kw) / c->sw + 1, k = 0;
  for (int64_t q = 0; q < c->N * c->C; q++)
    for (int64_t oy = 0; oy < OH; oy++)
      for (int64_t ox = 0; ox < OW; ox++) {
        double m = -INFINITY, s = 0;
        for (int i = 0; i < c->kh; i++)
          for (int j = 0; j < c->kw; j++) {
            int64_t y = oy * c->sh - c->ph + i, x = ox * c->sw - c->pw + j;
            if (y < 0 || y >= c->H || x < 0 || x >= c->W) continue;
            double v = in[0][(q * c->H + y) * c->W + x];
            m = fmax(m, v);
            s += v;
          }
        out[k++] = c->max ? m : s / (c->kh * c->kw);
      }
}

static nb_tensor *pool_apply(nb_tensor *const *in, void *vc) {
  const pool_ctx *c = vc;
  return c->max ? nb_max_pool2d(in[0], c->kh, c->kw, c->sh, c->sw, c->ph, c->pw)
                : nb_avg_pool2d(in[0], c->kh, c->kw, c->sh, c->sw, c->ph, c->pw);
}

static void test_pools(void) {
  pool_ctx base[] = {
    {2, 3, 6, 5, 2, 2, 2, 2, 0, 0, 0, 0}, {1, 2, 7, 6, 3, 3, 2, 2, 1, 1, 0, 0},
    {2, 2, 5, 7, 3, 2, 1, 2, 1, 1, 0, 0}, {1, 3, 4, 5, 2, 3, 1, 1, 0, 1, 0, 1},
  };
  for (int max = 0; max < 2; max++)
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
      pool_ctx c = base[i];
      c.max = max;
      nb_tensor *x = c.three_d ? nbt_leaf(350 + i, 3, (int64_t[]){c.C, c.H, c.W})
                               : nbt_leaf(350 + i, 4, (int64_t[]){c.N, c.C, c.H, c.W});
      char name[64];
      snprintf(name, sizeof name, "%s case %zu", max ? "max_pool2d" : "avg_pool2d", i);
      nnt_check_forward(name, pool_apply, pool_ref, &c, 1, &x);
      nbt_gradcheck(name, pool_apply, &c, 1, &x, 1e-6, 1e-5, 1e-8);
      nb_release(x);
    }
  /* pooling gradients are themselves differentiable (second derivative of
   * a max/avg pool composed with a square) */
  nb_scope_begin();
  nb_tensor *x = nbt_leaf(360, 4, (int64_t[]){1, 1, 4, 4});
  for (int max = 0; max < 2; max++) {
    nb_tensor *y = max ? nb_max_pool2d(x, 2, 2, 2, 2, 0, 0) : nb_avg_pool2d(x, 2, 2, 1, 1, 1, 1);
    nb_tensor *g = NULL;
    nb_autograd_grad(nb_sum(nb_square(y), 0, NULL, 0), NULL, 1, &x, &g, 1);
    nb_zero_grad(x);
    nb_status st = g ? nb_backward(nb_sum(nb_square(g), 0, NULL, 0), NULL) : NB_ERR_NULL;
    NBT_CHECK(st == NB_OK && nb_grad(x), "%s double backward: %s", max ? "max_pool2d" : "avg_pool2d", nb_last_error());
    nb_zero_grad(x);
  }
  nb_release(x);
  nb_scope_end();
}

/* ---- errors ------------------------------------------------------------------------- */
static void test_errors(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(1, 4, (int64_t[]){2, 4, 5, 5}, NB_F32);
  nb_tensor *w = nbt_randn(2, 4, (int64_t[]){6, 2, 3, 3}, NB_F32);
  nb_conv2d_params p = nb_conv2d_defaults();
  nb_clear_error();
  nbt_check_error("conv2d NULL", !nb_conv2d(NULL, w, NULL, p), NB_ERR_NULL, "conv2d", NULL);
  nbt_check_error("conv2d groups mismatch", !nb_conv2d(x, w, NULL, p), NB_ERR_SHAPE, "conv2d", "groups 1",
                  "f32[6, 2, 3, 3]", NULL);
  p.groups = 3;
  nbt_check_error("conv2d channels not divisible", !nb_conv2d(x, w, NULL, p), NB_ERR_SHAPE, "conv2d", "groups 3", NULL);
  p.groups = 2;
  NBT_CHECK(nb_conv2d(x, w, NULL, p) != NULL, "conv2d groups 2 accepted: %s", nb_last_error());
  nbt_check_error("conv2d bias shape", !nb_conv2d(x, w, nbt_randn(3, 1, (int64_t[]){4}, NB_F32), p), NB_ERR_SHAPE,
                  "conv2d", "bias", "[6]", NULL);
  p.dilation[0] = 3;
  nbt_check_error("conv2d kernel too large", !nb_conv2d(x, w, NULL, p), NB_ERR_SHAPE, "conv2d", "larger than the padded input", NULL);
  p.dilation[0] = 1;
  p.stride[1] = 0;
  nbt_check_error("conv2d stride", !nb_conv2d(x, w, NULL, p), NB_ERR_VALUE, "conv2d", "stride (1, 0)", NULL);
  p.stride[1] = 1;
  p.padding[0] = -1;
  nbt_check_error("conv2d padding", !nb_conv2d(x, w, NULL, p), NB_ERR_VALUE, "conv2d", "padding (-1, 0)", NULL);
  p.padding[0] = 0;
  nbt_check_error("conv2d 3-D input", !nb_conv2d(nb_select(x, 0, 0), w, NULL, p), NB_ERR_SHAPE, "conv2d", "4-D", NULL);
  nbt_check_error("conv2d int input", !nb_conv2d(nb_cast(x, NB_I32), w, NULL, p), NB_ERR_DTYPE, "conv2d", "float", NULL);
  p.channels_last = 1; /* (N, H, W, C) = (2, 4, 5, 5): 5 channels, not 4 */
  nbt_check_error("conv2d NHWC channels", !nb_conv2d(x, w, NULL, p), NB_ERR_SHAPE, "conv2d", "5 input channels", NULL);
  nbt_check_error("max_pool2d padding", !nb_max_pool2d(x, 2, 2, 2, 2, 2, 0), NB_ERR_VALUE, "max_pool2d", "padding (2, 0)", NULL);
  nbt_check_error("avg_pool2d stride", !nb_avg_pool2d(x, 2, 2, 0, 1, 0, 0), NB_ERR_VALUE, "avg_pool2d", NULL);
  nbt_check_error("max_pool2d kernel too large", !nb_max_pool2d(x, 7, 2, 1, 1, 0, 0), NB_ERR_SHAPE, "max_pool2d", NULL);
  nbt_check_error("avg_pool2d 2-D", !nb_avg_pool2d(nb_select(nb_select(x, 0, 0), 0, 0), 2, 2, 1, 1, 0, 0), NB_ERR_SHAPE,
                  "avg_pool2d", NULL);
  nbt_check_error("max_pool2d int", !nb_max_pool2d(nb_cast(x, NB_I64), 2, 2, 1, 1, 0, 0), NB_ERR_DTYPE, "max_pool2d", NULL);
  nbt_check_error("max_pool2d NULL", !nb_max_pool2d(NULL, 2, 2, 1, 1, 0, 0), NB_ERR_NULL, "max_pool2d", NULL);
  nb_scope_end();
}

int main(void) {
  test_conv2d();
  test_conv2d_double_backward();
  test_pools();
  test_errors();
  return nbt_finish();
}
