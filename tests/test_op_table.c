/* Every op in the op table, checked the same way (the way ggml's
 * test-backend-ops walks its ops): one case per op (or more) built with the
 * public API, and for each case
 *   - the output's node is the table's entry (the op runs through nb_op_run),
 *   - f32, f16 and bf16 results on the CPU against the f64 result,
 *   - gradients in f64 against central finite differences,
 *   - inputs given as strided views against contiguous ones,
 *   - on every other available backend (CUDA), each dtype's forward and the
 *     f32 gradients against the CPU's.
 * An entry with no case fails: a new op is one line of the CASES table below
 * (fused backward and derivative entries, X_backward and X_derivative, are
 * covered by X's gradient case).
 * NABLA_TEST_ONLY=name runs the cases of one op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph/op.h"
#include "testutil.h"

#define MAXIN 4


typedef nb_tensor *(*case_fn)(nb_tensor *const *in);

enum { GRAD = 1, NO16 = 2, NOVIEW = 4, NOCUDA = 8 };

typedef struct {
  const char *op;    /* the table entry the output's node must be */
  case_fn f;
  const char *inputs; /* an input spec (graph/op.h's nb_op_spec): "r:5x37,i21:5" */
  int flags;
  double tol;        /* scales the dtype tolerances (0 = 1) */
} op_case;

/* ---- the case functions ---------------------------------------------------- */
static int ax_last = -1, ax_0 = 0, ax_01[2] = {0, 1};
static nb_tensor *c_softmax(nb_tensor *const *x) { return nb_softmax(x[0], -1); }
static nb_tensor *c_softmax0(nb_tensor *const *x) { return nb_softmax(x[0], 0); }
static nb_tensor *c_log_softmax(nb_tensor *const *x) { return nb_log_softmax(x[0], -1); }
static nb_tensor *c_layer_norm(nb_tensor *const *x) { return nb_layer_norm(x[0], 1, x[1], x[2], 1e-5); }
static nb_tensor *c_layer_norm2(nb_tensor *const *x) { return nb_layer_norm(x[0], 2, NULL, NULL, 1e-5); }
static nb_tensor *c_rms_norm(nb_tensor *const *x) { return nb_rms_norm(x[0], 1, x[1], 1e-6); }
static nb_tensor *c_sum(nb_tensor *const *x) { return nb_sum(x[0], 1, &ax_last, 0); }
static nb_tensor *c_sum_all(nb_tensor *const *x) { return nb_sum(x[0], 0, NULL, 0); }
static nb_tensor *c_max(nb_tensor *const *x) { return nb_max(x[0], 1, &ax_0, 1); }
static nb_tensor *c_min(nb_tensor *const *x) { return nb_min(x[0], 2, ax_01, 0); }
static nb_tensor *c_argmax(nb_tensor *const *x) { return nb_argmax(x[0], -1, 0); }
static nb_tensor *c_argmin(nb_tensor *const *x) { return nb_argmin(x[0], 0, 1); }
static nb_tensor *c_matmul(nb_tensor *const *x) { return nb_matmul(x[0], x[1]); }
static nb_tensor *c_linear(nb_tensor *const *x) { return nb_linear(x[0], x[1], x[2]); }
/* x (M, K) and w (N, K) rounded to e4m3, b = w^T (the NT layout), f32 out */
static nb_tensor *c_scaled_mm(nb_tensor *const *x) {
  nb_device d = nb_device_of(x[0]);
  return nb_scaled_mm(nb_cast(x[0], NB_F8E4M3), nb_transpose(nb_cast(x[1], NB_F8E4M3), 0, 1),
                      nb_scalar(0.75, NB_F32, d), nb_scalar(1.5, NB_F32, d), NB_F32);
}
static nb_tensor *c_xent(nb_tensor *const *x) {
  return nb_cross_entropy(x[0], x[1], NB_REDUCE_MEAN, -100, 0.0);
}
static nb_tensor *c_xent_smooth(nb_tensor *const *x) {
  return nb_cross_entropy(x[0], x[1], NB_REDUCE_NONE, 2, 0.1);
}
/* elementwise: one function per public unary and binary op */
#define U(name) static nb_tensor *c_##name(nb_tensor *const *x) { return nb_##name(x[0]); }
#define B(name) static nb_tensor *c_##name(nb_tensor *const *x) { return nb_##name(x[0], x[1]); }
U(neg) U(abs) U(exp) U(log) U(log1p) U(expm1) U(sqrt) U(rsqrt) U(square) U(reciprocal) U(sin)
U(cos) U(tanh) U(sigmoid) U(relu) U(gelu) U(gelu_tanh) U(silu) U(softplus) U(sign) U(floor)
U(ceil) U(round)
B(add) B(sub) B(mul) B(div) B(pow) B(maximum) B(minimum) B(eq) B(ne) B(lt) B(le) B(gt) B(ge)
static nb_tensor *c_where(nb_tensor *const *x) { return nb_where(x[0], x[1], x[2]); }
static nb_tensor *c_clamp(nb_tensor *const *x) { return nb_clamp(x[0], -0.5, 0.7); }
static nb_tensor *c_cast(nb_tensor *const *x) { return nb_cast(x[0], NB_F32); }
/* views and copies */
static nb_tensor *c_reshape(nb_tensor *const *x) {
  return nb_reshape(x[0], 3, (const int64_t[]){5, 3, 4});
}
static nb_tensor *c_permute(nb_tensor *const *x) { return nb_permute(x[0], (const int[]){2, 0, 1}); }
static nb_tensor *c_expand(nb_tensor *const *x) {
  return nb_expand(x[0], 3, (const int64_t[]){4, 6, 5});
}
static nb_tensor *c_slice(nb_tensor *const *x) { return nb_slice(x[0], 1, 1, 12, 3); }
static nb_tensor *c_clone(nb_tensor *const *x) { return nb_clone(x[0]); }
static nb_tensor *c_cat(nb_tensor *const *x) { return nb_cat(3, x, 1); }
/* creation: the input only carries the dtype and device */
static nb_tensor *c_full(nb_tensor *const *x) {
  return nb_full(2, (const int64_t[]){4, 7}, -1.5, nb_dtype_of(x[0]), nb_device_of(x[0]));
}
static nb_tensor *c_arange(nb_tensor *const *x) {
  return nb_arange(-2, 3, 0.25, nb_dtype_of(x[0]), nb_device_of(x[0]));
}
static nb_tensor *c_rand(nb_tensor *const *x) {
  return nb_rand(&(nb_rng){7, 3}, 2, (const int64_t[]){5, 9}, -1, 2, nb_dtype_of(x[0]), nb_device_of(x[0]));
}
static nb_tensor *c_randint(nb_tensor *const *x) {
  return nb_randint(&(nb_rng){7, 3}, 2, (const int64_t[]){5, 9}, -4, 1000, NB_I64, nb_device_of(x[0]));
}
/* indexing */
static nb_tensor *c_index_select(nb_tensor *const *x) { return nb_index_select(x[0], 0, x[1]); }
static nb_tensor *c_gather(nb_tensor *const *x) { return nb_gather(x[0], 1, x[1]); }
static nb_tensor *c_scatter_add(nb_tensor *const *x) { return nb_scatter_add(x[0], 1, x[1], x[2]); }
/* convolution and pooling */
static nb_tensor *c_conv2d(nb_tensor *const *x) {
  nb_conv2d_params p = nb_conv2d_defaults();
  p.stride[1] = 2;
  p.padding[0] = 1;
  return nb_conv2d(x[0], x[1], x[2], p);
}
static nb_tensor *c_max_pool(nb_tensor *const *x) { return nb_max_pool2d(x[0], 2, 3, 2, 1, 1, 1); }
static nb_tensor *c_avg_pool(nb_tensor *const *x) { return nb_avg_pool2d(x[0], 3, 2, 1, 2, 1, 0); }
/* attention and dropout */
/* the same (seed, offset) every call: the mask is a function of them */
static nb_tensor *c_dropout(nb_tensor *const *x) { return nb_dropout(x[0], 0.3, &(nb_rng){5, 11}); }
static nb_tensor *c_sdpa(nb_tensor *const *x) {
  return nb_scaled_dot_product_attention(x[0], x[1], x[2], NULL, 1, 0.0, NULL, -1.0);
}
static nb_tensor *c_attention_qkv(nb_tensor *const *x) { return nb_attention_qkv(x[0], 2, 1, -1.0); }

#define C(op, f, in, flags) {op, f, in, flags, 0}
#define CT(op, f, in, flags, tol) {op, f, in, flags, tol}

static const op_case CASES[] = {
  /* row ops */
  C("softmax", c_softmax, "r:5x37", GRAD),
  C("softmax", c_softmax0, "r:7x3x5", GRAD),
  C("log_softmax", c_log_softmax, "r:5x37", GRAD),
  C("layer_norm", c_layer_norm, "r:6x33,r:33,r:33", GRAD),
  C("layer_norm", c_layer_norm2, "r:3x4x9", GRAD),
  C("rms_norm", c_rms_norm, "r:6x33,r:33", GRAD),
  /* reductions */
  C("sum", c_sum, "r:6x35", GRAD),
  C("sum", c_sum_all, "r:3x4x5", GRAD),
  C("max", c_max, "r:6x35", GRAD),
  C("min", c_min, "r:4x5x6", GRAD),
  C("argmax", c_argmax, "r:6x35", 0),
  C("argmin", c_argmin, "r:6x35", 0),
  /* contractions */
  CT("matmul", c_matmul, "r:7x33,r:33x5", GRAD, 4),
  CT("matmul", c_matmul, "r:2x3x17x9,r:9x6", GRAD, 4),
  CT("linear", c_linear, "r:3x5x33,r:6x33,r:6", GRAD, 4),
  CT("linear", c_linear, "r:9,r:7x9,-", GRAD, 4),
  /* f16/bf16 inputs round twice; CUDA: its fp8 tensor-core sums carry about
   * 14 bits (not f32's 24), checked with that bound in test_cuda's fp8 section */
  C("scaled_mm", c_scaled_mm, "r:7x48,r:5x48", NO16 | NOCUDA),
  /* losses */
  C("cross_entropy", c_xent, "r:9x21,i21:9", GRAD),
  C("cross_entropy", c_xent_smooth, "r:9x21,i21:9", GRAD),
  /* elementwise (the elementwise list) */
  C("neg", c_neg, "r:4x37", GRAD), C("abs", c_abs, "r:4x37", GRAD),
  C("exp", c_exp, "r:4x37", GRAD), C("log", c_log, "p:4x37", GRAD),
  C("log1p", c_log1p, "p:4x37", GRAD), C("expm1", c_expm1, "r:4x37", GRAD),
  C("sqrt", c_sqrt, "p:4x37", GRAD), C("rsqrt", c_rsqrt, "p:4x37", GRAD),
  C("square", c_square, "r:4x37", GRAD), C("reciprocal", c_reciprocal, "p:4x37", GRAD),
  C("sin", c_sin, "r:4x37", GRAD), C("cos", c_cos, "r:4x37", GRAD),
  C("tanh", c_tanh, "r:4x37", GRAD), C("sigmoid", c_sigmoid, "r:4x37", GRAD),
  C("relu", c_relu, "r:4x37", GRAD), C("gelu", c_gelu, "r:4x37", GRAD),
  C("gelu_tanh", c_gelu_tanh, "r:4x37", GRAD), C("silu", c_silu, "r:4x37", GRAD),
  C("softplus", c_softplus, "r:4x37", GRAD), C("sign", c_sign, "r:4x37", 0),
  C("floor", c_floor, "r:4x37", 0), C("ceil", c_ceil, "r:4x37", 0), C("round", c_round, "r:4x37", 0),
  C("add", c_add, "r:4x37,r:37", GRAD), C("sub", c_sub, "r:4x1,r:4x37", GRAD),
  C("mul", c_mul, "r:4x37,r:4x37", GRAD), C("div", c_div, "r:4x37,p:37", GRAD),
  C("pow", c_pow, "p:4x37,r:4x37", GRAD), C("maximum", c_maximum, "r:4x37,r:4x37", GRAD),
  C("minimum", c_minimum, "r:4x37,r:37", GRAD),
  C("eq", c_eq, "r:4x37,r:4x37", 0), C("ne", c_ne, "r:4x37,r:4x37", 0),
  C("lt", c_lt, "r:4x37,r:37", 0), C("le", c_le, "r:4x37,r:4x37", 0),
  C("gt", c_gt, "r:4x37,r:4x37", 0), C("ge", c_ge, "r:4x1,r:4x37", 0),
  C("where", c_where, "b:4x37,r:4x37,r:37", GRAD), C("clamp", c_clamp, "r:4x37", GRAD),
  C("cast", c_cast, "r:4x37", 0), /* its gradient: test_autograd (f64 differences see f32 rounding) */
  /* views and copies */
  C("reshape", c_reshape, "r:6x10", GRAD), C("permute", c_permute, "r:3x4x5", GRAD),
  C("expand", c_expand, "r:1x6x5", GRAD), C("slice", c_slice, "r:4x13", GRAD),
  C("clone", c_clone, "r:4x13", GRAD), C("cat", c_cat, "r:3x4,r:3x1,r:3x7", GRAD),
  /* creation */
  C("full", c_full, "r:1", 0), C("arange", c_arange, "r:1", 0), C("rand", c_rand, "r:1", 0),
  C("randint", c_randint, "i3:1", 0),
  /* indexing */
  C("index_select", c_index_select, "r:7x5,i7:9", GRAD),
  C("gather", c_gather, "r:4x9,i9:4x6", GRAD),
  C("scatter_add", c_scatter_add, "r:4x9,i9:4x6,r:4x6", GRAD),
  /* convolution and pooling */
  CT("conv2d", c_conv2d, "r:2x3x7x6,r:4x3x3x2,-", GRAD, 4), /* a bias is a following add */
  C("max_pool2d", c_max_pool, "r:2x3x7x6", GRAD),
  C("avg_pool2d", c_avg_pool, "r:2x3x7x6", GRAD),
  /* attention and dropout */
  C("dropout", c_dropout, "r:6x37", GRAD),
  CT("scaled_dot_product_attention", c_sdpa, "r:2x3x9x8,r:2x3x11x8,r:2x3x11x8", GRAD, 4),
  CT("attention_qkv", c_attention_qkv, "r:2x9x48", GRAD, 4), /* 2 heads of 8 */
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

/* Entries tested by other programs, with where. */
static const char *const ELSEWHERE[][2] = {
  {"randn", "random: test_core (moments, reproducibility); f64 draws use other words than f32"},
  {"to_device", "needs a second device: test_cuda (runtime), test_errors"},
  {"im2col", "conv2d's forward and weight gradient: test_nn_conv"},
  {"col2im", "conv2d's input gradient and double backward: test_nn_conv"},
};

/* ---- inputs --------------------------------------------------------------- */
/* Input i of a case on device dev: reals in dtype dt; a strided view of
 * the same values when view (the last axis taken with step 2 from a wider
 * tensor). The same seed gives the same values on every device. The caller
 * owns it. */
static nb_tensor *make_input(const nb_op_spec *p, uint64_t seed, nb_dtype dt, int view, nb_device dev) {
  if (p->kind == '-') return NULL;
  nb_scope_begin(); /* every intermediate is autoreleased; the result is kept */
  nb_tensor *t;
  if (p->kind == 'i' || p->kind == 'b') {
    nb_tensor *u = nbt_randn(seed, p->nd, p->shape, NB_F64);
    double *v = nb_data_ptr(u);
    int64_t n = nb_numel(u);
    t = nb_empty(p->nd, p->shape, p->kind == 'b' ? NB_BOOL : NB_I64, NB_DEVICE_CPU);
    for (int64_t j = 0; j < n; j++) {
      double f = 0.5 + 0.5 * erf(v[j] / sqrt(2.0)); /* uniform in (0, 1) */
      if (p->kind == 'b') ((uint8_t *)nb_data_ptr(t))[j] = f < 0.5;
      else ((int64_t *)nb_data_ptr(t))[j] = (int64_t)(f * (double)p->bound) % p->bound;
    }
    t = nb_to_device(t, dev);
  } else {
    t = nbt_randn(seed, p->nd, p->shape, NB_F64);
    if (p->kind == 'p') {
      double *v = nb_data_ptr(t);
      for (int64_t j = 0; j < nb_numel(t); j++) v[j] = 0.5 + 1.5 / (1 + exp(-v[j]));
    }
    t = nb_to_device(nb_cast(t, dt), dev);
    if (view && p->nd > 0) { /* the same values at stride 2 along the last axis */
      int64_t wide[NB_MAX_DIMS];
      memcpy(wide, p->shape, sizeof wide);
      wide[p->nd - 1] *= 2;
      nb_tensor *s = nb_slice(nb_zeros(p->nd, wide, dt, dev), p->nd - 1, 0, wide[p->nd - 1], 2);
      nb_copy_(s, t);
      t = s;
    }
  }
  t = nb_keep(t);
  nb_scope_end();
  return t;
}

static void tol_of(nb_dtype dt, double scale, double *rtol, double *atol) {
  double r = dt == NB_F64 ? 1e-12 : dt == NB_F32 ? 2e-5 : dt == NB_F16 ? 4e-3 : 3e-2;
  *rtol = r * scale;
  *atol = r * scale;
}

/* ---- checks --------------------------------------------------------------- */
static const op_case *cur;
static int n_in;
static nb_op_spec spec[MAXIN];
static nb_tensor *all_in[MAXIN];
static int grad_map[MAXIN]; /* positions of the differentiable inputs */
static int n_grad;

/* The case function with the differentiable inputs replaced (gradcheck). */
static nb_tensor *with_grads(nb_tensor *const *g, void *ctx) {
  (void)ctx;
  nb_tensor *in[MAXIN];
  memcpy(in, all_in, sizeof in);
  for (int i = 0; i < n_grad; i++) in[grad_map[i]] = g[i];
  return cur->f(in);
}

static void free_inputs(nb_tensor **in) {
  for (int i = 0; i < n_in; i++) nb_release(in[i]), in[i] = NULL;
}

static void make_inputs(nb_tensor **in, uint64_t seed, nb_dtype dt, int view, nb_device d) {
  for (int i = 0; i < n_in; i++)
    in[i] = make_input(&spec[i], seed + 101 * (uint64_t)i, dt, view, d);
}

static void require_grads(nb_tensor **in) {
  for (int i = 0; i < n_in; i++)
    if (spec[i].kind == 'r' || spec[i].kind == 'p') nb_set_requires_grad(in[i], 1);
}

/* The node of the output is the entry the case names. */
static void check_route(const char *name, nb_tensor *const *in) {
  const nb_op *op = nb_op_find(cur->op);
  if (!op || !op->backward) return;
  nb_scope_begin();
  nb_tensor *y = cur->f(in);
  const nb_node *n = y ? y->grad_fn : NULL;
  NBT_CHECK(n && n->op == op, "%s: output node is %s, expected the table entry '%s'", name,
            n ? n->name : "none", op->name);
  nb_scope_end();
}

static void check_dtypes(const char *name, const double *ref) {
  static const nb_dtype DT[3] = {NB_F32, NB_F16, NB_BF16};
  for (int k = 0; k < 3; k++) {
    if (k && (cur->flags & NO16)) break;
    nb_tensor *in[MAXIN] = {0};
    make_inputs(in, 7, DT[k], 0, NB_DEVICE_CPU);
    nb_scope_begin();
    nb_tensor *y = cur->f(in);
    char what[160];
    snprintf(what, sizeof what, "%s %s vs f64", name, nb_dtype_name(DT[k]));
    double rt, at;
    tol_of(DT[k], cur->tol ? cur->tol : 1, &rt, &at);
    if (y) nbt_check_close(what, y, ref, rt, at);
    else NBT_CHECK(0, "%s: %s", what, nb_last_error());
    nb_scope_end();
    free_inputs(in);
  }
}

static void check_views(const char *name, const double *ref) {
  if (cur->flags & NOVIEW) return;
  nb_tensor *in[MAXIN] = {0};
  make_inputs(in, 7, NB_F64, 1, NB_DEVICE_CPU);
  nb_scope_begin();
  nb_tensor *y = cur->f(in);
  char what[160];
  snprintf(what, sizeof what, "%s strided inputs", name);
  if (y) nbt_check_close(what, y, ref, 1e-12, 1e-12);
  else NBT_CHECK(0, "%s: %s", what, nb_last_error());
  nb_scope_end();
  free_inputs(in);
}

static void check_grads(const char *name) {
  if (!(cur->flags & GRAD)) return;
  make_inputs(all_in, 7, NB_F64, 0, NB_DEVICE_CPU);
  nb_tensor *g[MAXIN];
  n_grad = 0;
  for (int i = 0; i < n_in; i++)
    if (spec[i].kind == 'r' || spec[i].kind == 'p') {
      nb_set_requires_grad(all_in[i], 1);
      grad_map[n_grad] = i;
      g[n_grad++] = all_in[i];
    }
  check_route(name, all_in);
  char what[160];
  snprintf(what, sizeof what, "%s gradients", name);
  nbt_gradcheck(what, with_grads, NULL, n_grad, g, 1e-6, 1e-6 * (cur->tol ? cur->tol : 1), 1e-7);
  free_inputs(all_in);
}

/* Forward per dtype and f32 gradients on device d against the CPU. */
static void check_device(const char *name, nb_device d) {
  static const nb_dtype DT[4] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  char dn[32];
  nb_device_str(d, dn, sizeof dn);
  for (int k = 0; k < 4; k++) {
    if (k >= 2 && (cur->flags & NO16)) break;
    nb_tensor *in[MAXIN] = {0}, *din[MAXIN] = {0};
    int grads = k == 1 && (cur->flags & GRAD);
    make_inputs(in, 11, DT[k], 0, NB_DEVICE_CPU);
    make_inputs(din, 11, DT[k], k == 1 && !(cur->flags & NOVIEW), d);
    if (grads) require_grads(in), require_grads(din);
    nb_scope_begin();
    nb_tensor *yc = cur->f(in), *yd = cur->f(din);
    char what[160];
    snprintf(what, sizeof what, "%s %s %s vs cpu", name, dn, nb_dtype_name(DT[k]));
    NBT_CHECK(yc && yd, "%s: %s", what, nb_last_error());
    if (yc && yd) {
      double rt, at, *r = nbt_f64(yc);
      tol_of(DT[k], cur->tol ? cur->tol : 1, &rt, &at);
      nbt_check_close(what, yd, r, rt, at);
      free(r);
    }
    if (grads && yc && yd) {
      nb_tensor *y[2] = {yc, yd};
      nb_tensor *w = nbt_randn(5, nb_ndim(yc), nb_shape(yc), NB_F32);
      for (int s = 0; s < 2; s++) {
        const nb_tensor *wd = s ? nb_to_device(w, d) : w;
        nb_backward(nb_sum(nb_mul(y[s], wd), 0, NULL, 0), NULL);
      }
      for (int i = 0; i < n_in; i++) {
        if (!in[i] || !nb_grad(in[i])) continue;
        double *r = nbt_f64(nb_grad(in[i]));
        snprintf(what, sizeof what, "%s %s f32 gradient %d vs cpu", name, dn, i);
        NBT_CHECK(nb_grad(din[i]) != NULL, "%s: missing", what);
        if (nb_grad(din[i])) nbt_check_close(what, nb_grad(din[i]), r, 1e-4, 1e-4);
        free(r);
      }
    }
    nb_scope_end();
    free_inputs(in);
    free_inputs(din);
  }
}

static void run_case(int ci, int have_cuda) {
  cur = &CASES[ci];
  n_in = nb_op_spec_parse(cur->inputs, spec, MAXIN, 1);
  char name[96];
  snprintf(name, sizeof name, "%s #%d (%s)", cur->op, ci, cur->inputs);
  NBT_CHECK(nb_op_find(cur->op) != NULL, "%s: '%s' is not an entry of the op table", name, cur->op);
  /* f64 reference forward */
  nb_tensor *in[MAXIN] = {0};
  make_inputs(in, 7, NB_F64, 0, NB_DEVICE_CPU);
  nb_scope_begin();
  nb_tensor *y = cur->f(in);
  NBT_CHECK(y != NULL, "%s: f64 forward failed: %s", name, nb_last_error());
  double *ref = y ? nbt_f64(y) : NULL;
  nb_scope_end();
  if (ref) {
    check_dtypes(name, ref);
    check_views(name, ref);
  }
  free(ref);
  free_inputs(in);
  check_grads(name);
  if (have_cuda && !(cur->flags & NOCUDA)) check_device(name, nb_device_cuda(0));
}

/* Every entry has a case: its own, its forward op's gradient case for a
 * fused backward entry, or a note of where it is tested. */
static void check_coverage(void) {
  for (int i = 0; i < nb_op_count; i++) {
    const char *nm = nb_op_table[i]->name;
    int found = 0;
    for (int c = 0; c < N_CASES && !found; c++) {
      size_t l = strlen(CASES[c].op);
      found = !strcmp(CASES[c].op, nm) ||
              ((CASES[c].flags & GRAD) && !strncmp(CASES[c].op, nm, l) &&
               (!strcmp(nm + l, "_backward") || !strcmp(nm + l, "_derivative")));
    }
    for (size_t e = 0; e < sizeof ELSEWHERE / sizeof ELSEWHERE[0] && !found; e++)
      found = !strcmp(ELSEWHERE[e][0], nm);
    NBT_CHECK(found, "op table entry '%s' (%s) has no case in test_op_table", nm,
              nb_op_kind_name(nb_op_table[i]->kind));
    NBT_CHECK(nb_op_table[i]->psize <= NB_OP_PARAMS_MAX, "'%s': parameters of %zu bytes (a node holds %d)",
              nm, nb_op_table[i]->psize, NB_OP_PARAMS_MAX);
  }
}

/* Whether a table row lists name as a whole name: delimited by ", " or
 * "| " before and ", " or " |" after. */
static int row_lists(const char *row, const char *name) {
  size_t l = strlen(name);
  for (const char *p = row; (p = strstr(p, name)) != NULL; p++) {
    int start = p - row >= 2 && p[-1] == ' ' && (p[-2] == ',' || p[-2] == '|');
    int end = p[l] == ',' || (p[l] == ' ' && p[l + 1] == '|');
    if (start && end) return 1;
  }
  return 0;
}

/* docs/ARCHITECTURE.md's "Mixed precision" table names every entry under
 * its class, and under no other: the table stays true to the code. The
 * docs directory is NABLA_DOCS (set by ctest); without it the check is
 * skipped. */
static void check_docs(void) {
  const char *docs = getenv("NABLA_DOCS");
  if (!docs || !*docs) {
    printf("note: NABLA_DOCS unset; the docs' precision table is not checked\n");
    return;
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/ARCHITECTURE.md", docs);
  FILE *f = fopen(path, "r");
  NBT_CHECK(f != NULL, "cannot read %s", path);
  if (!f) return;
  enum { NCLS = 4 };
  static char line[16384], rows[NCLS][16384];
  static const char *const CLS[NCLS] = {"low", "f32", "wide", "follow"};
  int in_section = 0;
  for (int c = 0; c < NCLS; c++) rows[c][0] = '\0';
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "## ", 3)) in_section = !strncmp(line, "## Mixed precision", 18);
    for (int c = 0; in_section && c < NCLS; c++) {
      char head[32];
      snprintf(head, sizeof head, "| %s |", CLS[c]);
      if (!strncmp(line, head, strlen(head))) snprintf(rows[c], sizeof rows[c], "%s", line);
    }
  }
  fclose(f);
  for (int c = 0; c < NCLS; c++)
    NBT_CHECK(rows[c][0], "docs/ARCHITECTURE.md, Mixed precision: no row for class %s", CLS[c]);
  for (int i = 0; i < nb_op_count; i++) {
    const nb_op *op = nb_op_table[i];
    const char *cls = nb_prec_class_name(op->prec);
    int known = 0;
    for (int c = 0; c < NCLS; c++) {
      int mine = !strcmp(CLS[c], cls), listed = row_lists(rows[c], op->name);
      known |= mine;
      NBT_CHECK(listed == mine, "docs/ARCHITECTURE.md, Mixed precision: '%s' (class %s) is %s under "
                "class %s", op->name, cls, listed ? "listed" : "not listed", CLS[c]);
    }
    NBT_CHECK(known, "'%s': precision class %s is not one this check knows", op->name, cls);
  }
}

int main(void) {
  const char *only = getenv("NABLA_TEST_ONLY");
  int have_cuda = nb_cuda_available() > 0;
  for (int c = 0; c < N_CASES; c++) {
    if (only && strcmp(only, CASES[c].op)) continue;
    run_case(c, have_cuda);
  }
  if (!only) check_coverage(), check_docs();
  printf("%d ops in the table, %d cases%s\n", nb_op_count, N_CASES,
         have_cuda ? ", CPU and CUDA" : ", CPU only");
  return nbt_finish();
}
