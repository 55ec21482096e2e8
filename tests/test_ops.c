/* Every foundation op: forward against a naive float64 reference (f64, f32,
 * bf16), and gradients against central finite differences in float64, on
 * contiguous, transposed, sliced, broadcast, size-1 and odd-sized inputs
 * (the op itself receives the strided or stride-0 view). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- input layouts ------------------------------------------------------ */
typedef enum { L_CONTIG, L_TRANSPOSED, L_SLICED, L_BROADCAST, L_SIZE1, L_ODD, L_COUNT } layout;
static const char *layout_names[] = {"contiguous", "transposed", "sliced", "broadcast", "size-1", "odd"};

/* A view of the given layout over a base tensor made for it. */
static nb_tensor *layout_view(nb_tensor *base, layout l) {
  switch (l) {
  case L_TRANSPOSED: return nb_transpose(base, 0, 1);
  case L_SLICED: return nb_slice(nb_slice(base, 0, 1, 9, 2), 1, 0, 7, 3);
  case L_BROADCAST: return nb_expand(base, 2, (int64_t[]){5, -1}); /* (1, 7) -> (5, 7), stride 0 */
  default: return base;
  }
}

static void layout_base_shape(layout l, int64_t *shape) {
  static const int64_t s[L_COUNT][2] = {{4, 6}, {6, 4}, {9, 7}, {1, 7}, {1, 1}, {13, 7}};
  shape[0] = s[l][0];
  shape[1] = s[l][1];
}

/* ---- unary -------------------------------------------------------------- */
typedef nb_tensor *(*unary_fn)(const nb_tensor *);
static double gelu_ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_tanh_ref(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double sigmoid_ref(double x) { return 1 / (1 + exp(-x)); }
static double relu_ref(double x) { return x > 0 ? x : 0; }
static double silu_ref(double x) { return x * sigmoid_ref(x); }
static double softplus_ref(double x) { return log1p(exp(x)); }
static double sign_ref(double x) { return (x > 0) - (x < 0); }
static double neg_ref(double x) { return -x; }
static double square_ref(double x) { return x * x; }
static double recip_ref(double x) { return 1 / x; }
static double rsqrt_ref(double x) { return 1 / sqrt(x); }
static double round_ref(double x) { return nearbyint(x); }

typedef struct {
  const char *name;
  unary_fn fn;
  double (*ref)(double);
  int positive;    /* domain x > 0 */
  int smooth;      /* has a nonzero gradient */
} unary_case;

static const unary_case unary_cases[] = {
  {"neg", nb_neg, neg_ref, 0, 1}, {"abs", nb_abs, fabs, 0, 1}, {"exp", nb_exp, exp, 0, 1},
  {"log", nb_log, log, 1, 1}, {"log1p", nb_log1p, log1p, 1, 1}, {"expm1", nb_expm1, expm1, 0, 1},
  {"sqrt", nb_sqrt, sqrt, 1, 1}, {"rsqrt", nb_rsqrt, rsqrt_ref, 1, 1},
  {"square", nb_square, square_ref, 0, 1}, {"reciprocal", nb_reciprocal, recip_ref, 1, 1},
  {"sin", nb_sin, sin, 0, 1}, {"cos", nb_cos, cos, 0, 1}, {"tanh", nb_tanh, tanh, 0, 1},
  {"sigmoid", nb_sigmoid, sigmoid_ref, 0, 1}, {"relu", nb_relu, relu_ref, 0, 1},
  {"gelu", nb_gelu, gelu_ref, 0, 1}, {"gelu_tanh", nb_gelu_tanh, gelu_tanh_ref, 0, 1},
  {"silu", nb_silu, silu_ref, 0, 1}, {"softplus", nb_softplus, softplus_ref, 0, 1},
  {"sign", nb_sign, sign_ref, 0, 0}, {"floor", nb_floor, floor, 0, 0}, {"ceil", nb_ceil, ceil, 0, 0},
  {"round", nb_round, round_ref, 0, 0},
};
#define N_UNARY (int)(sizeof unary_cases / sizeof unary_cases[0])

typedef struct { const unary_case *uc; layout l; } unary_ctx;

/* Domain-restricted ops see |x| + 0.5, so every test point is valid. The
 * shift is applied to the base before the layout's view, so that the op
 * itself receives the strided (or stride-0) view. */
static nb_tensor *unary_input(nb_tensor *x, int positive) {
  return positive ? nb_add_scalar(nb_abs(x), 0.5) : x;
}

static nb_tensor *unary_apply(nb_tensor *const *in, void *vctx) {
  unary_ctx *c = vctx;
  return c->uc->fn(layout_view(unary_input(in[0], c->uc->positive), c->l));
}

static void test_unary(void) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_BF16, NB_F16};
  static const double tol[] = {1e-12, 2e-6, 1e-2, 2e-3};
  for (int k = 0; k < N_UNARY; k++) {
    const unary_case *uc = &unary_cases[k];
    for (int l = 0; l < L_COUNT; l++) {
      nb_scope_begin();
      int64_t shape[2];
      layout_base_shape((layout)l, shape);
      for (int d = 0; d < 4; d++) {
        nb_tensor *base = nbt_randn(100 + k * 7 + l, 2, shape, NB_F64);
        nb_tensor *x = layout_view(unary_input(nb_cast(base, dts[d]), uc->positive), (layout)l);
        NBT_CHECK(l == L_CONTIG || l == L_SIZE1 || l == L_ODD || !nb_is_contiguous(x),
                  "%s %s: the op sees a strided view", uc->name, layout_names[l]);
        /* the reference sees the same rounded inputs */
        double *xv = nbt_f64(x);
        int64_t n = nb_numel(x);
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) ref[i] = uc->ref(xv[i]);
        nb_tensor *y = uc->fn(x);
        char name[128];
        snprintf(name, sizeof name, "%s %s %s", uc->name, nb_dtype_name(dts[d]), layout_names[l]);
        nbt_check_close(name, y, ref, tol[d], tol[d]);
        NBT_CHECK(y && nb_dtype_of(y) == dts[d], "%s keeps dtype", name);
        free(xv);
        free(ref);
      }
      nb_tensor *leaf = nbt_leaf(300 + k, 2, shape);
      unary_ctx ctx = {uc, (layout)l};
      char name[128];
      snprintf(name, sizeof name, "grad %s %s", uc->name, layout_names[l]);
      nbt_gradcheck(name, unary_apply, &ctx, 1, &leaf, 1e-6, 1e-5, 1e-7);
      nb_release(leaf);
      nb_scope_end();
    }
  }
}

/* ---- binary ------------------------------------------------------------- */
typedef nb_tensor *(*binary_fn)(const nb_tensor *, const nb_tensor *);
static double add_r(double a, double b) { return a + b; }
static double sub_r(double a, double b) { return a - b; }
static double mul_r(double a, double b) { return a * b; }
static double div_r(double a, double b) { return a / b; }
static double max_r(double a, double b) { return a > b ? a : b; }
static double min_r(double a, double b) { return a < b ? a : b; }

typedef struct {
  const char *name;
  binary_fn fn;
  double (*ref)(double, double);
  int positive_a, away_b; /* pow needs a > 0; div needs |b| away from 0 */
} binary_case;

static const binary_case binary_cases[] = {
  {"add", nb_add, add_r, 0, 0}, {"sub", nb_sub, sub_r, 0, 0}, {"mul", nb_mul, mul_r, 0, 0},
  {"div", nb_div, div_r, 0, 1}, {"pow", nb_pow, pow, 1, 0}, {"maximum", nb_maximum, max_r, 0, 0},
  {"minimum", nb_minimum, min_r, 0, 0},
};

/* shape pairs: same, row broadcast, outer broadcast, transposed b, size-1,
 * odd, sliced a (rows 1:7:2, columns 0:5:2 of a (7, 5) leaf) with a stride-0
 * b expanded from (1, 3) */
typedef struct { int na, nb; int64_t a[3], b[3]; int transpose_b, slice_a, expand_b; } bshape;
static const bshape bshapes[] = {
  {2, 2, {3, 4}, {3, 4}, 0, 0, 0}, {2, 1, {3, 4}, {4}, 0, 0, 0}, {2, 2, {3, 1}, {1, 5}, 0, 0, 0},
  {2, 2, {3, 4}, {4, 3}, 1, 0, 0}, {2, 0, {1, 1}, {0}, 0, 0, 0}, {3, 2, {2, 7, 5}, {7, 1}, 0, 0, 0},
  {2, 2, {7, 5}, {1, 3}, 0, 1, 1},
};

typedef struct { const binary_case *bc; const bshape *bs; } binary_ctx;

/* Domain shifts are applied before the views, so the op sees the views. */
static nb_tensor *prep_a(nb_tensor *a, const binary_case *bc, const bshape *bs) {
  if (bc->positive_a) a = nb_add_scalar(nb_abs(a), 0.5);
  return bs->slice_a ? nb_slice(nb_slice(a, 0, 1, 7, 2), 1, 0, 5, 2) : a;
}
static nb_tensor *prep_b(nb_tensor *b, const binary_case *bc, const bshape *bs) {
  if (bc->away_b) b = nb_add_scalar(nb_abs(b), 0.5); /* keep |b| >= 0.5 */
  if (bs->transpose_b) b = nb_transpose(b, 0, 1);
  return bs->expand_b ? nb_expand(b, 2, (int64_t[]){3, -1}) : b;
}

static nb_tensor *binary_apply(nb_tensor *const *in, void *vctx) {
  binary_ctx *c = vctx;
  return c->bc->fn(prep_a(in[0], c->bc, c->bs), prep_b(in[1], c->bc, c->bs));
}

static void broadcast_index(const int64_t *oshape, int ond, int64_t flat, const int64_t *shape, int nd,
                            int64_t *out_flat) {
  int64_t idx[8], f = flat, r = 0;
  for (int i = ond - 1; i >= 0; i--) { idx[i] = f % oshape[i]; f /= oshape[i]; }
  for (int i = 0; i < nd; i++) {
    int j = i + ond - nd;
    r = r * shape[i] + (shape[i] == 1 ? 0 : idx[j]);
  }
  *out_flat = r;
}

static void test_binary(void) {
  for (size_t k = 0; k < sizeof binary_cases / sizeof binary_cases[0]; k++) {
    const binary_case *bc = &binary_cases[k];
    for (size_t s = 0; s < sizeof bshapes / sizeof bshapes[0]; s++) {
      nb_scope_begin();
      const bshape *bs = &bshapes[s];
      nb_tensor *la = nbt_leaf(500 + k * 13 + s, bs->na, bs->a);
      nb_tensor *lb = nbt_leaf(600 + k * 13 + s, bs->nb, bs->b);
      binary_ctx ctx = {bc, bs};
      /* forward in f64 and f32 against the reference */
      nb_tensor *ins[2] = {la, lb};
      nb_tensor *y = binary_apply(ins, &ctx);
      nb_tensor *a = nb_contiguous(prep_a(la, bc, bs));
      nb_tensor *b = nb_contiguous(prep_b(lb, bc, bs));
      double *av = nbt_f64(a), *bv = nbt_f64(b);
      int64_t n = nb_numel(y);
      double *ref = malloc((size_t)n * sizeof *ref);
      for (int64_t i = 0; i < n; i++) {
        int64_t ia, ib;
        broadcast_index(nb_shape(y), nb_ndim(y), i, nb_shape(a), nb_ndim(a), &ia);
        broadcast_index(nb_shape(y), nb_ndim(y), i, nb_shape(b), nb_ndim(b), &ib);
        ref[i] = bc->ref(av[ia], bv[ib]);
      }
      char name[128];
      snprintf(name, sizeof name, "%s case %zu f64", bc->name, s);
      nbt_check_close(name, y, ref, 1e-12, 1e-12);
      nb_tensor *y32 = bc->fn(prep_a(nb_cast(la, NB_F32), bc, bs), prep_b(nb_cast(lb, NB_F32), bc, bs));
      snprintf(name, sizeof name, "%s case %zu f32", bc->name, s);
      nbt_check_close(name, y32, ref, 1e-5, 1e-5);
      nb_tensor *ybf = bc->fn(prep_a(nb_cast(la, NB_BF16), bc, bs), prep_b(nb_cast(lb, NB_BF16), bc, bs));
      snprintf(name, sizeof name, "%s case %zu bf16", bc->name, s);
      nbt_check_close(name, ybf, ref, 3e-2, 3e-2);
      free(av); free(bv); free(ref);
      snprintf(name, sizeof name, "grad %s case %zu", bc->name, s);
      nbt_gradcheck(name, binary_apply, &ctx, 2, ins, 1e-6, 1e-5, 1e-7);
      nb_release(la);
      nb_release(lb);
      nb_scope_end();
    }
  }
}

/* ---- scalar forms ----------------------------------------------------------- */
typedef nb_tensor *(*scalar_fn)(const nb_tensor *, double);
typedef struct {
  const char *name;
  scalar_fn fn;
  double s;
  double (*ref)(double, double); /* ref(x, s) */
  int positive;                  /* domain x > 0 */
} scalar_case;

static double rsub_r(double a, double b) { return b - a; }

static const scalar_case scalar_cases[] = {
  {"add_scalar", nb_add_scalar, 1.75, add_r, 0}, {"sub_scalar", nb_sub_scalar, -0.6, sub_r, 0},
  {"rsub_scalar", nb_rsub_scalar, 2.5, rsub_r, 0}, {"mul_scalar", nb_mul_scalar, -1.3, mul_r, 0},
  {"div_scalar", nb_div_scalar, 0.7, div_r, 0}, {"pow_scalar 2.5", nb_pow_scalar, 2.5, pow, 1},
  {"pow_scalar -1.5", nb_pow_scalar, -1.5, pow, 1}, {"pow_scalar 3", nb_pow_scalar, 3, pow, 0},
  {"maximum_scalar", nb_maximum_scalar, 0.2, max_r, 0}, {"minimum_scalar", nb_minimum_scalar, -0.1, min_r, 0},
};

typedef struct { const scalar_case *sc; layout l; } scalar_ctx;

static nb_tensor *scalar_apply(nb_tensor *const *in, void *vctx) {
  scalar_ctx *c = vctx;
  return c->sc->fn(layout_view(unary_input(in[0], c->sc->positive), c->l), c->sc->s);
}

/* Forward on f64/f32/bf16 views against (x op s) in float64, and gradients
 * on every layout. */
static void test_scalar_forms(void) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_BF16};
  static const double tol[] = {1e-12, 2e-6, 1e-2};
  for (size_t k = 0; k < sizeof scalar_cases / sizeof scalar_cases[0]; k++) {
    const scalar_case *sc = &scalar_cases[k];
    for (int l = 0; l < L_COUNT; l++) {
      nb_scope_begin();
      int64_t shape[2];
      layout_base_shape((layout)l, shape);
      for (int d = 0; d < 3; d++) {
        nb_tensor *x = layout_view(unary_input(nbt_randn(1100 + k * 7 + l, 2, shape, dts[d]), sc->positive), (layout)l);
        double *xv = nbt_f64(x);
        int64_t n = nb_numel(x);
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) ref[i] = sc->ref(xv[i], sc->s);
        nb_tensor *y = sc->fn(x, sc->s);
        char name[128];
        snprintf(name, sizeof name, "%s %s %s", sc->name, nb_dtype_name(dts[d]), layout_names[l]);
        nbt_check_close(name, y, ref, tol[d], tol[d]);
        NBT_CHECK(y && nb_dtype_of(y) == dts[d], "%s keeps dtype", name);
        free(xv);
        free(ref);
      }
      nb_tensor *leaf = nbt_leaf(1200 + k * 7 + l, 2, shape);
      scalar_ctx ctx = {sc, (layout)l};
      char name[128];
      snprintf(name, sizeof name, "grad %s %s", sc->name, layout_names[l]);
      nbt_gradcheck(name, scalar_apply, &ctx, 1, &leaf, 1e-6, 1e-5, 1e-7);
      nb_release(leaf);
      nb_scope_end();
    }
  }
  /* an integer tensor with an integral scalar stays integer */
  nb_scope_begin();
  nb_tensor *i = nb_arange(-3, 3, 1, NB_I64, NB_DEVICE_CPU);
  nb_tensor *r = nb_rsub_scalar(i, 2);
  NBT_CHECK(r && nb_dtype_of(r) == NB_I64, "i64 rsub_scalar(2) stays i64");
  nbt_check_close("i64 rsub_scalar", r, (double[]){5, 4, 3, 2, 1, 0}, 0, 0);
  nbt_check_close("i64 maximum_scalar", nb_maximum_scalar(i, 0), (double[]){0, 0, 0, 0, 1, 2}, 0, 0);
  nb_scope_end();
}

/* broadcast_to and sum_to_shape, its adjoint (the backward of broadcasting) */
static nb_tensor *bto_apply(nb_tensor *const *in, void *ctx) {
  return nb_broadcast_to(nb_transpose(in[0], 0, 1), 3, (int64_t[]){2, 3, 4}); /* (4,3)^T -> (2,3,4) */
}
static nb_tensor *sts_apply(nb_tensor *const *in, void *ctx) {
  return nb_sum_to_shape(nb_transpose(in[0], 0, 2), 2, (int64_t[]){3, 1}); /* (4,3,2)^T -> (3,1) */
}

static void test_broadcast_to_sum_to_shape(void) {
  nb_scope_begin();
  nb_tensor *a = nbt_leaf(41, 2, (int64_t[]){4, 3}), *b = nbt_leaf(42, 3, (int64_t[]){4, 3, 2});
  double *av = nbt_f64(a), *bv = nbt_f64(b), ref[24], ref2[3] = {0};
  for (int n = 0; n < 2; n++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 4; j++) ref[(n * 3 + i) * 4 + j] = av[j * 3 + i];
  nb_tensor *y = bto_apply(&a, NULL);
  NBT_CHECK(y && nb_strides(y)[0] == 0 && nb_shares_storage(y, a), "broadcast_to is a stride-0 view");
  nbt_check_close("broadcast_to", y, ref, 0, 0);
  /* the transposed (2,3,4) view summed to (3,1): over axes 0 and 2 */
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 2; k++) ref2[j] += bv[(i * 3 + j) * 2 + k];
  nbt_check_close("sum_to_shape", sts_apply(&b, NULL), ref2, 1e-12, 1e-12);
  nbt_gradcheck("grad broadcast_to", bto_apply, NULL, 1, &a, 1e-6, 1e-5, 1e-7);
  nbt_gradcheck("grad sum_to_shape", sts_apply, NULL, 1, &b, 1e-6, 1e-5, 1e-7);
  nbt_check_error("broadcast_to incompatible", nb_broadcast_to(a, 2, (int64_t[]){4, 5}) == NULL, NB_ERR_SHAPE,
                  "broadcast_to", "[4, 3]", "[4, 5]", NULL);
  nbt_check_error("sum_to_shape incompatible", nb_sum_to_shape(b, 2, (int64_t[]){4, 2}) == NULL, NB_ERR_SHAPE,
                  "sum_to_shape", NULL);
  free(av);
  free(bv);
  nb_release(a);
  nb_release(b);
  nb_scope_end();
}

static void test_compare_where_clamp(void) {
  nb_scope_begin();
  nb_tensor *a = nb_arange(0, 6, 1, NB_F32, NB_DEVICE_CPU);
  nb_tensor *b = nb_full(1, (int64_t[]){6}, 3, NB_I64, NB_DEVICE_CPU);
  double lt[] = {1, 1, 1, 0, 0, 0}, eq[] = {0, 0, 0, 1, 0, 0}, ge[] = {0, 0, 0, 1, 1, 1};
  nbt_check_close("lt", nb_lt(a, b), lt, 0, 0);
  nbt_check_close("eq", nb_eq(a, b), eq, 0, 0);
  nbt_check_close("ge", nb_ge(a, b), ge, 0, 0);
  nbt_check_close("ne", nb_ne(a, b), (double[]){1, 1, 1, 0, 1, 1}, 0, 0);
  nbt_check_close("le", nb_le(a, b), (double[]){1, 1, 1, 1, 0, 0}, 0, 0);
  nbt_check_close("gt", nb_gt(a, b), (double[]){0, 0, 0, 0, 1, 1}, 0, 0);
  NBT_CHECK(nb_dtype_of(nb_lt(a, b)) == NB_BOOL, "comparison gives bool");
  nb_tensor *w = nb_where(nb_lt(a, b), a, nb_neg(a));
  nbt_check_close("where", w, (double[]){0, 1, 2, -3, -4, -5}, 0, 0);
  nbt_check_close("clamp", nb_clamp(a, 1, 3.5), (double[]){1, 1, 2, 3, 3.5, 3.5}, 0, 0);
  nb_tensor *c = nb_cast(nb_arange(-2, 2, 0.75, NB_F64, NB_DEVICE_CPU), NB_I32);
  nbt_check_close("cast truncates", c, (double[]){-2, -1, 0, 0, 1, 1}, 0, 0);
  nbt_check_close("int add", nb_add(b, b), (double[]){6, 6, 6, 6, 6, 6}, 0, 0);
  NBT_CHECK(nb_dtype_of(nb_add(b, b)) == NB_I64, "int add keeps i64");
  nb_scope_end();
}

/* where: gradient flows to the chosen branch; clamp passes inside [lo, hi] */
static nb_tensor *where_apply(nb_tensor *const *in, void *ctx) {
  return nb_where(nb_gt(in[0], in[1]), nb_mul(in[0], in[1]), nb_sin(nb_transpose(in[2], 0, 1)));
}
static nb_tensor *clamp_apply(nb_tensor *const *in, void *ctx) { return nb_clamp(in[0], -0.5, 0.7); }
static nb_tensor *cast_apply(nb_tensor *const *in, void *ctx) {
  return nb_cast(nb_mul(nb_cast(in[0], NB_F32), nb_cast(in[0], NB_F32)), NB_F64);
}

static void test_where_clamp_grads(void) {
  nb_scope_begin();
  nb_tensor *ins[3] = {nbt_leaf(1, 2, (int64_t[]){4, 5}), nbt_leaf(2, 1, (int64_t[]){5}),
                       nbt_leaf(3, 2, (int64_t[]){5, 4})};
  nbt_gradcheck("grad where", where_apply, NULL, 3, ins, 1e-6, 1e-5, 1e-7);
  nbt_gradcheck("grad clamp", clamp_apply, NULL, 1, ins, 1e-6, 1e-5, 1e-7);
  nbt_gradcheck("grad cast", cast_apply, NULL, 1, ins, 1e-4, 1e-3, 1e-4);
  for (int i = 0; i < 3; i++) nb_release(ins[i]);
  nb_scope_end();
}

/* Comparisons, where, clamp, argmax/argmin and split on strided, sliced and
 * broadcast views, against references computed from the row-major values. */
static nb_tensor *clamp_views_apply(nb_tensor *const *in, void *ctx) {
  nb_tensor *t = nb_transpose(nb_slice(in[0], 0, 1, 9, 2), 0, 1); /* (9,7) -> rows 1,3,5,7 -> (7,4) */
  return nb_clamp(t, -0.4, 0.6);
}

static void test_views_misc(void) {
  nb_scope_begin();
  nb_tensor *base = nbt_randn(61, 2, (int64_t[]){5, 4}, NB_F64);
  nb_tensor *x = nb_transpose(base, 0, 1);                                    /* (4, 5) strided */
  nb_tensor *row = nb_expand(nbt_randn(62, 2, (int64_t[]){1, 5}, NB_F64), 2, (int64_t[]){4, 5});
  double *xv = nbt_f64(x), *rv = nbt_f64(row), ref[20];
  struct { const char *name; binary_fn fn; } cmps[] = {
    {"lt", nb_lt}, {"le", nb_le}, {"gt", nb_gt}, {"ge", nb_ge}, {"eq", nb_eq}, {"ne", nb_ne},
  };
  for (size_t c = 0; c < sizeof cmps / sizeof cmps[0]; c++) {
    for (int i = 0; i < 20; i++) {
      double a = xv[i], b = rv[i];
      const char *n = cmps[c].name;
      ref[i] = !strcmp(n, "lt") ? a < b : !strcmp(n, "le") ? a <= b : !strcmp(n, "gt") ? a > b
             : !strcmp(n, "ge") ? a >= b : !strcmp(n, "eq") ? a == b : a != b;
    }
    char name[64];
    snprintf(name, sizeof name, "%s on transposed vs expanded", cmps[c].name);
    nbt_check_close(name, cmps[c].fn(x, row), ref, 0, 0);
  }
  /* eq/ne need equal values: x against itself through another view */
  nb_tensor *xc = nb_contiguous(x);
  nbt_check_close("eq of a view and its copy", nb_sum(nb_cast(nb_eq(x, xc), NB_I64), 0, NULL, 0), (double[]){20}, 0, 0);
  /* where: condition broadcast over rows, branches transposed and sliced */
  nb_tensor *cond = nb_gt(nbt_randn(63, 1, (int64_t[]){5}, NB_F64), nb_scalar(0, NB_F64, NB_DEVICE_CPU));
  nb_tensor *other = nb_slice(nbt_randn(64, 2, (int64_t[]){8, 5}, NB_F64), 0, 0, 8, 2); /* (4, 5) */
  double *cv = nbt_f64(cond), *ov = nbt_f64(other);
  for (int i = 0; i < 20; i++) ref[i] = cv[i % 5] != 0 ? xv[i] : ov[i];
  nbt_check_close("where on views", nb_where(cond, x, other), ref, 0, 0);
  nbt_check_close("where on f32 views", nb_where(cond, nb_transpose(nb_cast(base, NB_F32), 0, 1), other), ref, 1e-6, 1e-6);
  /* clamp forward on a view */
  for (int i = 0; i < 20; i++) ref[i] = xv[i] < -0.3 ? -0.3 : xv[i] > 0.2 ? 0.2 : xv[i];
  nbt_check_close("clamp on a transposed view", nb_clamp(x, -0.3, 0.2), ref, 0, 0);
  /* argmax / argmin along each axis of the transposed view */
  for (int axis = 0; axis < 2; axis++)
    for (int mx = 0; mx < 2; mx++) {
      int64_t n_out = axis ? 4 : 5, n_red = axis ? 5 : 4;
      double aref[5];
      for (int64_t o = 0; o < n_out; o++) {
        int64_t best = 0;
        for (int64_t j = 1; j < n_red; j++) {
          double v = axis ? xv[o * 5 + j] : xv[j * 5 + o], bv = axis ? xv[o * 5 + best] : xv[best * 5 + o];
          if (mx ? v > bv : v < bv) best = j;
        }
        aref[o] = (double)best;
      }
      char name[64];
      snprintf(name, sizeof name, "%s axis %d of a transposed view", mx ? "argmax" : "argmin", axis);
      nbt_check_close(name, mx ? nb_argmax(x, axis, 0) : nb_argmin(x, axis, 0), aref, 0, 0);
    }
  /* split and chunk of a transposed view: the parts hold the right values */
  nb_tensor *parts[4];
  int np = nb_split(x, 2, 1, parts, 4); /* widths 2, 2, 1 */
  NBT_CHECK(np == 3, "split of a view into 3 parts (got %d)", np);
  for (int p = 0; p < np && np == 3; p++) {
    int64_t w = p < 2 ? 2 : 1;
    double pref[8];
    for (int i = 0; i < 4; i++)
      for (int64_t j = 0; j < w; j++) pref[i * w + j] = xv[i * 5 + 2 * p + j];
    char name[64];
    snprintf(name, sizeof name, "split part %d of a transposed view", p);
    nbt_check_close(name, parts[p], pref, 0, 0);
  }
  np = nb_chunk(x, 3, 0, parts, 4); /* 4 rows into chunks of 2, 2 */
  NBT_CHECK(np == 2, "chunk of a view (got %d)", np);
  if (np == 2) nbt_check_close("chunk 1 of a transposed view", parts[1], xv + 10, 0, 0);
  free(xv); free(rv); free(cv); free(ov);
  nb_tensor *leaf = nbt_leaf(65, 2, (int64_t[]){9, 7});
  nbt_gradcheck("grad clamp on a sliced transposed view", clamp_views_apply, NULL, 1, &leaf, 1e-6, 1e-5, 1e-7);
  nb_release(leaf);
  nb_scope_end();
}

/* ---- reductions ------------------------------------------------------------ */
/* Input views of a reduction: the leaf itself, a permuted leaf, a strided
 * slice of a larger leaf, or a (d0, 1, d2) leaf expanded along axis 1. */
enum { RV_PLAIN, RV_PERMUTED, RV_SLICED, RV_BROADCAST };
typedef struct { int n; int axes[3]; int keep; int view; int64_t shape[3]; } rcase;
static const rcase rcases[] = {
  {0, {0}, 0, RV_PLAIN, {3, 4, 5}}, {1, {0}, 0, RV_PLAIN, {3, 4, 5}}, {1, {-1}, 1, RV_PLAIN, {3, 4, 5}},
  {2, {0, 2}, 0, RV_PLAIN, {3, 4, 5}}, {2, {2, 0}, 1, RV_PERMUTED, {3, 4, 5}}, {1, {1}, 0, RV_PERMUTED, {3, 4, 5}},
  {1, {2}, 0, RV_SLICED, {3, 4, 5}}, {2, {0, 1}, 1, RV_SLICED, {3, 4, 5}}, {0, {0}, 0, RV_SLICED, {3, 4, 5}},
  {1, {1}, 0, RV_BROADCAST, {3, 4, 5}}, {1, {2}, 1, RV_BROADCAST, {3, 4, 5}}, {0, {0}, 0, RV_BROADCAST, {3, 4, 5}},
  {1, {0}, 0, RV_PLAIN, {1, 4, 1}}, {2, {0, 2}, 1, RV_PLAIN, {1, 4, 1}}, {1, {1}, 0, RV_PLAIN, {7, 13, 3}},
  {2, {1, 2}, 0, RV_PERMUTED, {5, 9, 11}},
};

/* Reference: reduce a (3,4,5) float64 array over the axes. */
static void ref_reduce(const char *op, const double *x, const int64_t *shape, const rcase *rc,
                       double corr, double *out, int64_t *nout) {
  int mask[3] = {rc->n == 0, rc->n == 0, rc->n == 0};
  for (int i = 0; i < rc->n; i++) mask[(rc->axes[i] + 3) % 3] = 1;
  int64_t osz[3];
  for (int i = 0; i < 3; i++) osz[i] = mask[i] ? 1 : shape[i];
  *nout = osz[0] * osz[1] * osz[2];
  for (int64_t o = 0; o < *nout; o++) {
    int64_t oi[3] = {o / (osz[1] * osz[2]), (o / osz[2]) % osz[1], o % osz[2]};
    double acc = 0, sq = 0, mx = -INFINITY, mn = INFINITY;
    int64_t cnt = 0;
    for (int64_t i = 0; i < shape[0]; i++)
      for (int64_t j = 0; j < shape[1]; j++)
        for (int64_t k = 0; k < shape[2]; k++) {
          int64_t id[3] = {i, j, k};
          int in = 1;
          for (int d = 0; d < 3; d++) in &= mask[d] || id[d] == oi[d];
          if (!in) continue;
          double v = x[(i * shape[1] + j) * shape[2] + k];
          acc += v; sq += v * v; cnt++;
          mx = v > mx ? v : mx; mn = v < mn ? v : mn;
        }
    double mean = acc / cnt, var = 0;
    for (int64_t i = 0; i < shape[0]; i++)
      for (int64_t j = 0; j < shape[1]; j++)
        for (int64_t k = 0; k < shape[2]; k++) {
          int64_t id[3] = {i, j, k};
          int in = 1;
          for (int d = 0; d < 3; d++) in &= mask[d] || id[d] == oi[d];
          if (in) { double v = x[(i * shape[1] + j) * shape[2] + k] - mean; var += v * v; }
        }
    double lse = 0;
    for (int64_t i = 0; i < shape[0]; i++)
      for (int64_t j = 0; j < shape[1]; j++)
        for (int64_t k = 0; k < shape[2]; k++) {
          int64_t id[3] = {i, j, k};
          int in = 1;
          for (int d = 0; d < 3; d++) in &= mask[d] || id[d] == oi[d];
          if (in) lse += exp(x[(i * shape[1] + j) * shape[2] + k] - mx);
        }
    if (!strcmp(op, "sum")) out[o] = acc;
    else if (!strcmp(op, "mean")) out[o] = mean;
    else if (!strcmp(op, "max")) out[o] = mx;
    else if (!strcmp(op, "min")) out[o] = mn;
    else if (!strcmp(op, "var") || !strcmp(op, "var0")) out[o] = var / (cnt - corr);
    else if (!strcmp(op, "std") || !strcmp(op, "std0")) out[o] = sqrt(var / (cnt - corr));
    else if (!strcmp(op, "logsumexp")) out[o] = mx + log(lse);
    else if (!strcmp(op, "norm")) out[o] = sqrt(sq);
  }
}

static const char *rops[] = {"sum", "mean", "max", "min", "var", "std", "var0", "std0", "logsumexp", "norm"};

static nb_tensor *run_rop(const char *op, const nb_tensor *x, const rcase *rc) {
  if (!strcmp(op, "sum")) return nb_sum(x, rc->n, rc->axes, rc->keep);
  if (!strcmp(op, "mean")) return nb_mean(x, rc->n, rc->axes, rc->keep);
  if (!strcmp(op, "max")) return nb_max(x, rc->n, rc->axes, rc->keep);
  if (!strcmp(op, "min")) return nb_min(x, rc->n, rc->axes, rc->keep);
  if (!strcmp(op, "var")) return nb_var(x, rc->n, rc->axes, 1.0, rc->keep);
  if (!strcmp(op, "std")) return nb_std(x, rc->n, rc->axes, 1.0, rc->keep);
  if (!strcmp(op, "var0")) return nb_var(x, rc->n, rc->axes, 0.0, rc->keep);
  if (!strcmp(op, "std0")) return nb_std(x, rc->n, rc->axes, 0.0, rc->keep);
  if (!strcmp(op, "logsumexp")) return nb_logsumexp(x, rc->n, rc->axes, rc->keep);
  return nb_norm(x, 2.0, rc->n, rc->axes, rc->keep);
}

typedef struct { const char *op; const rcase *rc; } rctx;

/* The leaf's shape for a case whose logical input has shape rc->shape. */
static void rleaf_shape(const rcase *rc, int64_t *ls) {
  const int64_t *s = rc->shape;
  switch (rc->view) {
  case RV_PERMUTED: ls[0] = s[2], ls[1] = s[1], ls[2] = s[0]; break;
  case RV_SLICED: ls[0] = 2 * s[0] + 1, ls[1] = s[1], ls[2] = 3 * s[2]; break;
  case RV_BROADCAST: ls[0] = s[0], ls[1] = 1, ls[2] = s[2]; break;
  default: ls[0] = s[0], ls[1] = s[1], ls[2] = s[2];
  }
}
static nb_tensor *rview(nb_tensor *leaf, const rcase *rc) {
  switch (rc->view) {
  case RV_PERMUTED: return nb_permute(leaf, (int[]){2, 1, 0});
  case RV_SLICED: return nb_slice(nb_slice(leaf, 0, 1, 2 * rc->shape[0] + 1, 2), 2, 2, 3 * rc->shape[2], 3);
  case RV_BROADCAST: return nb_expand(leaf, 3, rc->shape);
  default: return leaf;
  }
}
static nb_tensor *reduce_apply(nb_tensor *const *in, void *vctx) {
  rctx *c = vctx;
  return run_rop(c->op, rview(in[0], c->rc), c->rc);
}

static void test_reductions(void) {
  for (size_t k = 0; k < sizeof rops / sizeof rops[0]; k++) {
    for (size_t r = 0; r < sizeof rcases / sizeof rcases[0]; r++) {
      nb_scope_begin();
      const rcase *rc = &rcases[r];
      int64_t ls[3];
      rleaf_shape(rc, ls);
      nb_tensor *leaf = nbt_leaf(700 + k * 20 + r, 3, ls);
      nb_tensor *x = rview(leaf, rc);
      NBT_CHECK(nb_size(x, 0) == rc->shape[0] && nb_size(x, 1) == rc->shape[1] && nb_size(x, 2) == rc->shape[2],
                "reduction case %zu: view shape", r);
      double *xv = nbt_f64(x), ref[512];
      int64_t nref;
      ref_reduce(rops[k], xv, rc->shape, rc, rops[k][3] == '0' ? 0.0 : 1.0, ref, &nref);
      char name[128];
      snprintf(name, sizeof name, "%s case %zu", rops[k], r);
      nb_tensor *y = run_rop(rops[k], x, rc);
      NBT_CHECK(y && nb_numel(y) == nref, "%s: %lld elements (expected %lld)", name, (long long)nb_numel(y), (long long)nref);
      nbt_check_close(name, y, ref, 1e-12, 1e-12);
      /* f32 and bf16 through the same view of a cast leaf */
      nb_tensor *y32 = run_rop(rops[k], rview(nb_cast(leaf, NB_F32), rc), rc);
      snprintf(name, sizeof name, "%s case %zu f32", rops[k], r);
      nbt_check_close(name, y32, ref, 1e-5, 1e-5);
      nb_tensor *ybf = run_rop(rops[k], rview(nb_cast(leaf, NB_BF16), rc), rc);
      snprintf(name, sizeof name, "%s case %zu bf16", rops[k], r);
      nbt_check_close(name, ybf, ref, 4e-2, 4e-2);
      free(xv);
      /* no derivative where the value is NaN (var of one element with
       * correction 1) or where std is 0 (a reduction along the broadcast
       * axis, or over one element) */
      int smooth = 1;
      for (int64_t i = 0; i < nref; i++)
        smooth &= isfinite(ref[i]) && !(rops[k][0] == 's' && rops[k][1] == 't' && ref[i] < 1e-9);
      rctx ctx = {rops[k], rc};
      snprintf(name, sizeof name, "grad %s case %zu", rops[k], r);
      if (smooth) nbt_gradcheck(name, reduce_apply, &ctx, 1, &leaf, 1e-6, 1e-5, 1e-7);
      nb_release(leaf);
      nb_scope_end();
    }
  }
  nb_scope_begin();
  /* argmax/argmin: first index of the extreme, ties included */
  double v[] = {1, 5, 5, 0, -2, 7, 7, -2};
  nb_tensor *t = nb_from_buffer(v, 2, (int64_t[]){2, 4}, NB_F64, NB_DEVICE_CPU);
  nbt_check_close("argmax rows", nb_argmax(t, 1, 0), (double[]){1, 1}, 0, 0);
  nbt_check_close("argmin rows", nb_argmin(t, -1, 0), (double[]){3, 0}, 0, 0);
  nbt_check_close("argmax cols", nb_argmax(t, 0, 1), (double[]){0, 1, 1, 0}, 0, 0);
  NBT_CHECK(nb_dtype_of(nb_argmax(t, 1, 0)) == NB_I64, "argmax gives i64");
  nbt_check_close("int sum to i64", nb_sum(nb_cast(t, NB_I32), 0, NULL, 0), (double[]){21}, 0, 0);
  nbt_check_close("norm p=1", nb_norm(t, 1, 0, NULL, 0), (double[]){29}, 1e-12, 0);
  nbt_check_close("norm p=inf", nb_norm(t, INFINITY, 0, NULL, 0), (double[]){7}, 0, 0);
  nbt_check_close("norm p=3", nb_norm(t, 3, 0, NULL, 0), (double[]){cbrt(1 + 125 + 125 + 8 + 343 + 343 + 8)}, 1e-12, 0);
  nb_tensor *ninf = nb_full(2, (int64_t[]){2, 3}, -INFINITY, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(nb_get(nb_logsumexp(ninf, 1, (int[]){1}, 0), (int64_t[]){0}) == -INFINITY, "logsumexp of -inf row");
  nb_tensor *big = nb_full(1, (int64_t[]){3}, 1000, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(fabs(nb_item(nb_logsumexp(big, 0, NULL, 0)) - (1000 + log(3.0))) < 1e-3, "logsumexp stable");
  nb_tensor *e = nb_zeros(2, (int64_t[]){3, 0}, NB_F32, NB_DEVICE_CPU);
  nbt_check_close("empty sum", nb_sum(e, 1, (int[]){1}, 0), (double[]){0, 0, 0}, 0, 0);
  nb_scope_end();
}

/* ---- matmul ------------------------------------------------------------------- */
/* Operand views (ta, tb): 0 the leaf, 1 its last two axes transposed, 2 every
 * other column (inner stride 2), 3 rows 1..n-2 (a storage offset), 4 the
 * leaf expanded to a batch of 4 (batch stride 0). */
typedef struct { int na, nb; int64_t a[4], b[4]; int ta, tb; } mcase;
static const mcase mcases[] = {
  {2, 2, {5, 14}, {9, 3}, 2, 3},         /* column-strided a, offset b */
  {3, 2, {4, 5, 7}, {7, 3}, 0, 4},       /* b expanded over the batch */
  {2, 2, {7, 5}, {7, 6}, 1, 2},          /* transposed a, column-strided b */
  {2, 3, {6, 5}, {2, 5, 8}, 3, 2},       /* offset a, strided batched b */
  {2, 2, {5, 7}, {7, 3}, 0, 0},          /* plain, odd */
  {2, 2, {7, 5}, {3, 7}, 1, 1},          /* both transposed views */
  {4, 3, {2, 1, 5, 7}, {3, 7, 4}, 0, 0}, /* batch broadcast */
  {1, 2, {7}, {7, 3}, 0, 0},             /* vector @ matrix */
  {3, 1, {2, 5, 7}, {7}, 0, 0},          /* batch @ vector */
  {1, 1, {6}, {6}, 0, 0},                /* dot */
  {2, 2, {1, 1}, {1, 1}, 0, 0},          /* size 1 */
  {3, 3, {3, 9, 4}, {1, 4, 6}, 0, 0},
};

static nb_tensor *mview(nb_tensor *t, int mode) {
  int nd = nb_ndim(t);
  switch (mode) {
  case 1: return nb_transpose(t, -1, -2);
  case 2: return nb_slice(t, nd - 1, 0, nb_size(t, nd - 1), 2);
  case 3: return nb_slice(t, nd - 2, 1, nb_size(t, nd - 2) - 1, 1);
  case 4: {
    int64_t shape[8] = {4};
    for (int i = 0; i < nd; i++) shape[i + 1] = nb_size(t, i);
    return nb_expand(t, nd + 1, shape);
  }
  default: return t;
  }
}
static nb_tensor *matmul_apply(nb_tensor *const *in, void *vctx) {
  const mcase *mc = vctx;
  return nb_matmul(mview(in[0], mc->ta), mview(in[1], mc->tb));
}

static void test_matmul(void) {
  for (size_t c = 0; c < sizeof mcases / sizeof mcases[0]; c++) {
    nb_scope_begin();
    const mcase *mc = &mcases[c];
    nb_tensor *ins[2] = {nbt_leaf(900 + c, mc->na, mc->a), nbt_leaf(950 + c, mc->nb, mc->b)};
    nb_tensor *a = nb_contiguous(mview(ins[0], mc->ta)), *b = nb_contiguous(mview(ins[1], mc->tb));
    /* reference: promote to >= 2-D, broadcast batches, naive triple loop */
    int na = nb_ndim(a), nbd = nb_ndim(b);
    int64_t as[4], bs[4];
    int an = 0, bn = 0;
    if (na == 1) { as[0] = 1; as[1] = nb_shape(a)[0]; an = 2; }
    else { memcpy(as, nb_shape(a), (size_t)na * 8); an = na; }
    if (nbd == 1) { bs[0] = nb_shape(b)[0]; bs[1] = 1; bn = 2; }
    else { memcpy(bs, nb_shape(b), (size_t)nbd * 8); bn = nbd; }
    int64_t M = as[an - 2], K = as[an - 1], N = bs[bn - 1], batch[4];
    int nbat = nb_broadcast_shapes(an - 2, as, bn - 2, bs, batch);
    int64_t nb_ = 1;
    for (int i = 0; i < nbat; i++) nb_ *= batch[i];
    double *av = nbt_f64(a), *bv = nbt_f64(b), *ref = calloc((size_t)(nb_ * M * N), sizeof(double));
    for (int64_t bi = 0; bi < nb_; bi++) {
      int64_t ia, ib;
      broadcast_index(batch, nbat, bi, as, an - 2, &ia);
      broadcast_index(batch, nbat, bi, bs, bn - 2, &ib);
      if (an == 2) ia = 0;
      if (bn == 2) ib = 0;
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
          double s = 0;
          for (int64_t k = 0; k < K; k++) s += av[ia * M * K + i * K + k] * bv[ib * K * N + k * N + j];
          ref[(bi * M + i) * N + j] = s;
        }
    }
    char name[64];
    snprintf(name, sizeof name, "matmul case %zu", c);
    nb_tensor *y = matmul_apply(ins, (void *)mc);
    nbt_check_close(name, y, ref, 1e-12, 1e-12);
    snprintf(name, sizeof name, "matmul case %zu f32", c);
    nbt_check_close(name, nb_matmul(mview(nb_cast(ins[0], NB_F32), mc->ta), mview(nb_cast(ins[1], NB_F32), mc->tb)), ref, 1e-5, 1e-5);
    snprintf(name, sizeof name, "matmul case %zu bf16", c);
    nbt_check_close(name, nb_matmul(mview(nb_cast(ins[0], NB_BF16), mc->ta), mview(nb_cast(ins[1], NB_BF16), mc->tb)), ref, 5e-2, 5e-2);
    snprintf(name, sizeof name, "grad matmul case %zu", c);
    nbt_gradcheck(name, matmul_apply, (void *)mc, 2, ins, 1e-6, 1e-5, 1e-7);
    free(av); free(bv); free(ref);
    nb_release(ins[0]);
    nb_release(ins[1]);
    nb_scope_end();
  }
}

/* ---- joining and view gradients ------------------------------------------------- */
static nb_tensor *cat_apply(nb_tensor *const *in, void *ctx) {
  nb_tensor *parts[3] = {in[0], nb_transpose(in[1], 0, 1), nb_mul_scalar(in[2], 3)};
  return nb_mul(nb_cat(3, parts, 1), nb_cat(3, parts, 1));
}
static nb_tensor *stack_apply(nb_tensor *const *in, void *ctx) {
  nb_tensor *parts[2] = {in[0], nb_sin(in[0])};
  return nb_stack(2, parts, 1);
}
static nb_tensor *split_apply(nb_tensor *const *in, void *ctx) {
  nb_tensor *p[4];
  int n = nb_split(in[0], 2, 1, p, 4);
  return n == 3 ? nb_add(nb_mul(p[0], p[1]), nb_exp(p[2])) : NULL; /* widths 2, 2, 1 */
}
static nb_tensor *chunk_apply(nb_tensor *const *in, void *ctx) {
  nb_tensor *p[4];
  return nb_chunk(in[0], 2, 0, p, 4) == 2 ? nb_mul(p[0], nb_sub(p[1], p[0])) : NULL;
}
/* a transposed, strided slice of an expanded tensor, then a reshape */
static nb_tensor *views_apply(nb_tensor *const *in, void *ctx) {
  nb_tensor *e = nb_expand(nb_unsqueeze(in[0], 0), 3, (int64_t[]){4, 3, 5});
  nb_tensor *s = nb_slice(nb_transpose(e, 0, 2), 0, 1, 5, 2); /* (2, 3, 4) */
  nb_tensor *r = nb_reshape(s, 2, (int64_t[]){6, 4});
  return nb_mul(r, nb_select(nb_permute(in[1], (int[]){1, 0, 2}), 2, 2));
}

static void test_join_and_view_grads(void) {
  nb_scope_begin();
  nb_tensor *a = nbt_leaf(11, 2, (int64_t[]){3, 2}), *b = nbt_leaf(12, 2, (int64_t[]){4, 3}),
            *c = nbt_leaf(13, 2, (int64_t[]){3, 1});
  nb_tensor *ins[3] = {a, b, c};
  nbt_gradcheck("grad cat", cat_apply, NULL, 3, ins, 1e-6, 1e-5, 1e-7);
  nbt_gradcheck("grad stack", stack_apply, NULL, 1, ins, 1e-6, 1e-5, 1e-7);
  nb_tensor *d = nbt_leaf(14, 2, (int64_t[]){3, 5});
  nbt_gradcheck("grad split", split_apply, NULL, 1, &d, 1e-6, 1e-5, 1e-7);
  nb_tensor *e = nbt_leaf(15, 2, (int64_t[]){4, 3});
  nbt_gradcheck("grad chunk", chunk_apply, NULL, 1, &e, 1e-6, 1e-5, 1e-7);
  nb_tensor *v[2] = {nbt_leaf(16, 2, (int64_t[]){3, 5}), nbt_leaf(17, 3, (int64_t[]){4, 6, 3})};
  nbt_gradcheck("grad through expand/transpose/slice/reshape/select", views_apply, NULL, 2, v, 1e-6, 1e-5, 1e-7);
  /* forward of cat and stack */
  nb_tensor *p[2] = {nb_arange(0, 4, 1, NB_F32, NB_DEVICE_CPU), nb_arange(4, 6, 1, NB_I64, NB_DEVICE_CPU)};
  nbt_check_close("cat promotes", nb_cat(2, p, 0), (double[]){0, 1, 2, 3, 4, 5}, 0, 0);
  nb_tensor *q[2] = {nb_arange(0, 2, 1, NB_F32, NB_DEVICE_CPU), nb_arange(2, 4, 1, NB_F32, NB_DEVICE_CPU)};
  nbt_check_close("stack axis 1", nb_stack(2, q, 1), (double[]){0, 2, 1, 3}, 0, 0);
  nb_release(a); nb_release(b); nb_release(c); nb_release(d); nb_release(e);
  nb_release(v[0]); nb_release(v[1]);
  nb_scope_end();
}

/* An operand broadcast along every batch axis gets its gradient from one
 * GEMM over the folded batch (op_matmul.c): equal to the batched products
 * summed over the batch, the reference computed here with those ops, in
 * f64 and in f32. Cases: b broadcast with a permuted a (its batch axes do
 * not merge, so the fold copies), b with a leading 1, a broadcast (folded:
 * its copies are smaller than the batched result), a broadcast not folded. */
static void test_matmul_folded_grads(void) {
  static const struct { int na, nb; int64_t a[4], b[4]; int perm_a; } fc[] = {
    {4, 2, {2, 3, 5, 4}, {4, 6}, 1}, {3, 3, {3, 5, 4}, {1, 4, 6}, 0},
    {2, 3, {8, 7}, {3, 7, 2}, 0},    {3, 4, {1, 8, 7}, {2, 3, 7, 2}, 0},
    {2, 3, {5, 4}, {3, 4, 6}, 0}};
  const nb_dtype dts[2] = {NB_F64, NB_F32};
  for (size_t c = 0; c < sizeof fc / sizeof fc[0]; c++)
    for (int d = 0; d < 2; d++) {
      nb_scope_begin();
      nb_tensor *a = nb_cast(nbt_randn(970 + c, fc[c].na, fc[c].a, NB_F64), dts[d]);
      nb_tensor *b = nb_cast(nbt_randn(980 + c, fc[c].nb, fc[c].b, NB_F64), dts[d]);
      if (fc[c].perm_a) a = nb_permute(a, (const int[]){1, 0, 2, 3}); /* (3, 2, 5, 4) */
      nb_tensor *la = nb_detach(a), *lb = nb_detach(b);
      nb_set_requires_grad(la, 1);
      nb_set_requires_grad(lb, 1);
      nb_tensor *y = nb_matmul(la, lb);
      nb_tensor *w = nb_cast(nbt_randn(990 + c, nb_ndim(y), nb_shape(y), NB_F64), dts[d]);
      nb_backward(nb_sum(nb_mul(y, w), 0, NULL, 0), NULL);
      /* the batched reference: per-batch products, summed to each shape */
      nb_tensor *ra = nb_sum_to_shape(nb_matmul(w, nb_transpose(b, -1, -2)), nb_ndim(a), nb_shape(a));
      nb_tensor *rb = nb_sum_to_shape(nb_matmul(nb_transpose(a, -1, -2), w), nb_ndim(b), nb_shape(b));
      double tol = dts[d] == NB_F64 ? 1e-12 : 2e-5, *va = nbt_f64(ra), *vb = nbt_f64(rb);
      char name[96];
      snprintf(name, sizeof name, "folded matmul grad case %zu %s: da", c, nb_dtype_name(dts[d]));
      NBT_CHECK(nb_grad(la) != NULL, "%s: missing", name);
      if (nb_grad(la)) nbt_check_close(name, nb_grad(la), va, tol, tol);
      snprintf(name, sizeof name, "folded matmul grad case %zu %s: db", c, nb_dtype_name(dts[d]));
      NBT_CHECK(nb_grad(lb) != NULL, "%s: missing", name);
      if (nb_grad(lb)) nbt_check_close(name, nb_grad(lb), vb, tol, tol);
      free(va);
      free(vb);
      nb_scope_end();
    }
}

int main(void) {
  test_unary();
  test_binary();
  test_scalar_forms();
  test_broadcast_to_sum_to_shape();
  test_compare_where_clamp();
  test_where_clamp_grads();
  test_views_misc();
  test_reductions();
  test_matmul();
  test_matmul_folded_grads();
  test_join_and_view_grads();
  return nbt_finish();
}
