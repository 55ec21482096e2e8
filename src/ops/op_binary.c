/* Binary elementwise ops with NumPy broadcasting and type promotion,
 * comparisons, where and clamp. */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

nb_status nb_op_same_device(const char *op, int n, const nb_tensor *const *ts) {
  for (int i = 1; i < n; i++) {
    if (!ts[i] || nb_same_device(nb_device_of(ts[0]), nb_device_of(ts[i]))) continue;
    char b1[200], b2[200];
    return nb_error_set(NB_ERR_DEVICE, "%s: inputs on different devices: %s and %s", op,
                        nb_describe(ts[0], b1, sizeof b1), nb_describe(ts[i], b2, sizeof b2));
  }
  return NB_OK;
}

nb_tensor *nb_op_grad_to(const nb_tensor *g, const nb_tensor *x) {
  nb_tensor *s = nb_sum_to_shape(g, x->ndim, x->shape);
  if (s && s->dtype != x->dtype) s = nb_cast(s, x->dtype);
  return nb_retain(s);
}

/* ---- backward rules, ew_list.h's last three columns (a, b inputs) ---- */

/* d(a^b)/da = b a^(b-1), 0 where b == 0 (also at a == 0, where it would be
 * 0 * inf); d/db = a^b log a, 0 where a == 0 and b >= 0 (PyTorch's
 * conventions; at a == 0, b < 0 it is -inf, as there). The masked elements
 * compute with a replaced by 1 (b 1^(b-1) = 0 at b == 0, 1^b log 1 = 0), so
 * they never form inf or NaN, nor in the gradient's own gradient. */
static nb_tensor *pow_da(nb_tensor *g, const nb_tensor *a, const nb_tensor *b) {
  nb_tensor *sa = nb_where(nb_eq(b, nb_op_scalar_for(a, 0.0)), nb_op_scalar_for(a, 1.0), a);
  return nb_mul(g, nb_mul(b, nb_pow(sa, nb_sub_scalar(b, 1.0))));
}
static nb_tensor *pow_db(nb_tensor *g, const nb_tensor *a, const nb_tensor *b) {
  nb_tensor *zero = nb_op_scalar_for(a, 0.0);
  nb_tensor *sa = nb_where(nb_mul(nb_eq(a, zero), nb_ge(b, zero)), nb_op_scalar_for(a, 1.0), a);
  return nb_mul(g, nb_mul(nb_pow(sa, b), nb_log(sa)));
}

/* maximum/minimum: the weight of a's gradient, 1 where cmp(a, b) picks a,
 * 0.5 on ties (split evenly) */
static nb_tensor *pick_a(nb_tensor *g, const nb_tensor *a, const nb_tensor *b,
                         nb_tensor *(*cmp)(const nb_tensor *, const nb_tensor *)) {
  nb_dtype dt = g->dtype;
  nb_tensor *tie = nb_mul_scalar(nb_cast(nb_eq(a, b), dt), 0.5);
  return nb_add(nb_cast(cmp(a, b), dt), tie);
}

#define RULE(ID, KNAME, NAME, INT, EXPR, IEXPR, W, DA, DB)                         \
  static nb_status bw_##ID(nb_node *n, nb_tensor *g, nb_tensor **gin) {            \
    const nb_tensor *a = n->inputs[0], *b = n->inputs[1];                         \
    nb_tensor *w = W;                                                             \
    (void)a; (void)b; (void)w;                                                    \
    if (nb_node_needs_grad(n, 0)) gin[0] = nb_op_grad_to(DA, a);                   \
    if (nb_node_needs_grad(n, 1)) gin[1] = nb_op_grad_to(DB, b);                   \
    return NB_OK;                                                                 \
  }
NB_BOP_LIST(RULE)

#define DEF(ID, KNAME, NAME, ...) [NB_BOP_##ID] = {NAME, bw_##ID},
#define DEF_CMP(ID, NAME, EXPR) [NB_BOP_##ID] = {NAME, NULL},
static const struct { const char *name; nb_backward_fn bw; } binary_defs[NB_BOP_COUNT] = {
  NB_BOP_LIST(DEF) NB_CMP_LIST(DEF_CMP)};

static int is_compare(nb_bop op) { return op >= NB_BOP_EQ; }

/* The dtype both operands are converted to before the kernel runs. */
static nb_dtype compute_dtype(nb_bop op, nb_dtype a, nb_dtype b) {
  nb_dtype dt = nb_promote(a, b);
  if (op == NB_BOP_DIV && !nb_dtype_is_float(dt)) return NB_F32; /* true division */
  if (dt == NB_BOOL && !is_compare(op) && op != NB_BOP_MUL && op != NB_BOP_MAX && op != NB_BOP_MIN)
    return NB_I64; /* bool + bool counts */
  return dt;
}

static nb_tensor *binary(nb_bop op, const nb_tensor *a, const nb_tensor *b) {
  const char *name = binary_defs[op].name;
  if (!a) { nb_error_null(name, "a"); return NULL; }
  if (!b) { nb_error_null(name, "b"); return NULL; }
  if (nb_op_same_device(name, 2, (const nb_tensor *const[]){a, b})) return NULL;
  int64_t shape[NB_MAX_DIMS];
  int nd = nb_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, shape);
  if (nd < 0) {
    char b1[200], b2[200];
    nb_error_set(NB_ERR_SHAPE, "%s: shapes %s and %s do not broadcast", name,
                 nb_describe(a, b1, sizeof b1), nb_describe(b, b2, sizeof b2));
    return NULL;
  }
  nb_dtype dt = compute_dtype(op, a->dtype, b->dtype);
  nb_scope_begin();
  const nb_tensor *ca = nb_cast(a, dt), *cb = nb_cast(b, dt);
  nb_tensor *out = ca && cb ? nb_tensor_alloc(nd, shape, is_compare(op) ? NB_BOOL : dt, nb_device_of(a)) : NULL;
  if (out && nb_numel(out)) {
    nb_kview ko, ka, kb;
    nb_kview_of(out, &ko);
    nb_kview_broadcast(ca, nd, shape, &ka);
    nb_kview_broadcast(cb, nd, shape, &kb);
    if (nb_backend_for(nb_device_of(a))->binary(op, &ko, &ka, &kb)) {
      nb_release(out);
      out = NULL;
    }
  }
  if (out && binary_defs[op].bw)
    nb_record(name, binary_defs[op].bw, 2, (const nb_tensor *const[]){ca, cb}, out);
  nb_scope_end();
  return nb_autorelease(out);
}

nb_tensor *nb_add(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_ADD, a, b); }
nb_tensor *nb_sub(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_SUB, a, b); }
nb_tensor *nb_mul(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_MUL, a, b); }
nb_tensor *nb_div(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_DIV, a, b); }
nb_tensor *nb_pow(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_POW, a, b); }
nb_tensor *nb_maximum(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_MAX, a, b); }
nb_tensor *nb_minimum(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_MIN, a, b); }
nb_tensor *nb_eq(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_EQ, a, b); }
nb_tensor *nb_ne(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_NE, a, b); }
nb_tensor *nb_lt(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_LT, a, b); }
nb_tensor *nb_le(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_LE, a, b); }
nb_tensor *nb_gt(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_GT, a, b); }
nb_tensor *nb_ge(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BOP_GE, a, b); }

/* A Python-style scalar: it takes the tensor's dtype unless a float scalar
 * meets an integer tensor (then f32). */
nb_tensor *nb_op_scalar_for(const nb_tensor *t, double s) {
  nb_dtype dt = t->dtype;
  if (!nb_dtype_is_float(dt) && (s != floor(s) || !isfinite(s))) dt = NB_F32;
  else if (dt == NB_BOOL) dt = NB_I64;
  return nb_scalar(s, dt, nb_device_of(t));
}

static nb_tensor *binary_scalar(nb_bop op, const nb_tensor *a, double s, int reversed) {
  if (!a) { nb_error_null(binary_defs[op].name, "a"); return NULL; }
  nb_scope_begin();
  nb_tensor *c = nb_op_scalar_for(a, s);
  nb_tensor *out = c ? nb_keep(reversed ? binary(op, c, a) : binary(op, a, c)) : NULL;
  nb_scope_end();
  return nb_autorelease(out);
}

nb_tensor *nb_add_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_ADD, a, s, 0); }
nb_tensor *nb_sub_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_SUB, a, s, 0); }
nb_tensor *nb_rsub_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_SUB, a, s, 1); }
nb_tensor *nb_mul_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_MUL, a, s, 0); }
nb_tensor *nb_div_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_DIV, a, s, 0); }
nb_tensor *nb_pow_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_POW, a, s, 0); }
nb_tensor *nb_maximum_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_MAX, a, s, 0); }
nb_tensor *nb_minimum_scalar(const nb_tensor *a, double s) { return binary_scalar(NB_BOP_MIN, a, s, 0); }

/* ---- where ------------------------------------------------------------------ */
static nb_status where_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *c = n->inputs[0], *a = n->inputs[1], *b = n->inputs[2];
  nb_tensor *zero = nb_scalar(0.0, g->dtype, nb_device_of(g));
  if (nb_node_needs_grad(n, 1)) gin[1] = nb_op_grad_to(nb_where(c, g, zero), a);
  if (nb_node_needs_grad(n, 2)) gin[2] = nb_op_grad_to(nb_where(c, zero, g), b);
  return NB_OK;
}

nb_tensor *nb_where(const nb_tensor *cond, const nb_tensor *a, const nb_tensor *b) {
  if (!cond) { nb_error_null("where", "cond"); return NULL; }
  if (!a) { nb_error_null("where", "a"); return NULL; }
  if (!b) { nb_error_null("where", "b"); return NULL; }
  if (nb_op_same_device("where", 3, (const nb_tensor *const[]){cond, a, b})) return NULL;
  char b1[200], b2[200], b3[200];
  int64_t s1[NB_MAX_DIMS], shape[NB_MAX_DIMS];
  int n1 = nb_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, s1);
  int nd = n1 < 0 ? -1 : nb_broadcast_shapes(cond->ndim, cond->shape, n1, s1, shape);
  if (nd < 0) {
    nb_error_set(NB_ERR_SHAPE, "where: shapes of cond %s, a %s and b %s do not broadcast",
                 nb_describe(cond, b1, sizeof b1), nb_describe(a, b2, sizeof b2), nb_describe(b, b3, sizeof b3));
    return NULL;
  }
  nb_dtype dt = nb_promote(a->dtype, b->dtype);
  nb_scope_begin();
  const nb_tensor *cc = nb_cast(cond, NB_BOOL), *ca = nb_cast(a, dt), *cb = nb_cast(b, dt);
  nb_tensor *out = cc && ca && cb ? nb_tensor_alloc(nd, shape, dt, nb_device_of(a)) : NULL;
  if (out && nb_numel(out)) {
    nb_kview ko, kc, ka, kb;
    nb_kview_of(out, &ko);
    nb_kview_broadcast(cc, nd, shape, &kc);
    nb_kview_broadcast(ca, nd, shape, &ka);
    nb_kview_broadcast(cb, nd, shape, &kb);
    if (nb_backend_for(nb_device_of(a))->where(&ko, &kc, &ka, &kb)) {
      nb_release(out);
      out = NULL;
    }
  }
  if (out) nb_record("where", where_bw, 3, (const nb_tensor *const[]){cc, ca, cb}, out);
  nb_scope_end();
  return nb_autorelease(out);
}

/* ---- clamp: the gradient passes where lo <= x <= hi ------------------------------ */
static nb_status clamp_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0];
  nb_tensor *in = nb_mul(nb_ge(x, nb_op_scalar_for(x, n->dp[0])), nb_le(x, nb_op_scalar_for(x, n->dp[1])));
  gin[0] = nb_retain(nb_mul(g, nb_cast(in, g->dtype)));
  return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_clamp(const nb_tensor *x, double lo, double hi) {
  if (!x) { nb_error_null("clamp", "x"); return NULL; }
  if (lo > hi || lo != lo || hi != hi) {
    nb_error_set(NB_ERR_VALUE, "clamp: bounds lo %g > hi %g (expected lo <= hi)", lo, hi);
    return NULL;
  }
  nb_no_grad_begin();
  nb_scope_begin();
  nb_tensor *out = nb_keep(nb_minimum_scalar(nb_maximum_scalar(x, lo), hi));
  nb_scope_end();
  nb_no_grad_end();
  nb_node *n = out ? nb_record("clamp", clamp_bw, 1, (const nb_tensor *const[]){x}, out) : NULL;
  if (n) { n->dp[0] = lo; n->dp[1] = hi; }
  return nb_autorelease(out);
}
