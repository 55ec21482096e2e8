/* Binary elementwise ops with NumPy broadcasting and type promotion,
 * comparisons, where and clamp. */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

nb_status nb_op_same_device(const char *op, int n, const nb_tensor *const *ts) {
  const nb_tensor *first = NULL; /* NULL entries (absent optional inputs) are skipped */
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (!first) { first = ts[i]; continue; }
    if (nb_same_device(nb_device_of(first), nb_device_of(ts[i]))) continue;
    char b1[200], b2[200];
    return nb_error_set(NB_ERR_DEVICE, "%s: inputs on different devices: %s and %s", op,
                        nb_describe(first, b1, sizeof b1), nb_describe(ts[i], b2, sizeof b2));
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

/* ---- the shared pieces of every binary entry ---------------------------------- */
/* The dtype both operands are converted to before the kernel runs. */
static nb_dtype compute_dtype(nb_bop op, nb_dtype a, nb_dtype b) {
  int compare = op >= NB_BOP_EQ;
  nb_dtype dt = nb_promote(a, b);
  if (op == NB_BOP_DIV && !nb_dtype_is_float(dt)) return NB_F32; /* true division */
  if (dt == NB_BOOL && !compare && op != NB_BOP_MUL && op != NB_BOP_MAX && op != NB_BOP_MIN)
    return NB_I64; /* bool + bool counts */
  return dt;
}

static nb_status binary_infer(const nb_op_call *c, nb_meta *out, nb_bop op) {
  const nb_tensor *a = c->in[0], *b = c->in[1];
  int nd = nb_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, out->shape);
  if (nd < 0) {
    char b1[200], b2[200];
    return nb_error_set(NB_ERR_SHAPE, "%s: shapes %s and %s do not broadcast", c->op->name,
                        nb_describe(a, b1, sizeof b1), nb_describe(b, b2, sizeof b2));
  }
  out->ndim = nd;
  out->dtype = op >= NB_BOP_EQ ? NB_BOOL : compute_dtype(op, a->dtype, b->dtype);
  out->device = nb_device_of(a);
  return NB_OK;
}

/* Both operands cast to the compute dtype (recorded; the node is on the casts). */
static nb_status binary_prepare(const nb_op_call *c, const nb_tensor **in, nb_bop op) {
  nb_dtype dt = compute_dtype(op, c->in[0]->dtype, c->in[1]->dtype);
  for (int i = 0; i < 2; i++)
    if (!(in[i] = nb_cast(c->in[i], dt))) return nb_last_status();
  return NB_OK;
}

/* The kernel on the operands broadcast to the output's shape. */
static nb_status binary_into(nb_bop op, nb_tensor *out, const nb_tensor *a, const nb_tensor *b) {
  nb_kview ko, ka, kb;
  nb_kview_of(out, &ko);
  nb_kview_broadcast(a, out->ndim, out->shape, &ka);
  nb_kview_broadcast(b, out->ndim, out->shape, &kb);
  return nb_backend_for(nb_device_of(out))->binary(op, &ko, &ka, &kb);
}

/* The inputs read and the output written once (nb_op_cost's default, one
 * flop per output element), times flops_per (ew_list.h's flops column). */
static void ew_cost(const nb_op_call *c, const nb_meta *out, double flops_per, double *bytes,
                    double *flops) {
  static const nb_op plain = {.name = "elementwise"};
  nb_op_cost(&(nb_op_call){&plain, c->n, c->in, c->p}, out, bytes, flops);
  *flops *= flops_per;
}

#define BINARY_FNS(ID, FLOPS)                                                                   \
  static nb_status infer_##ID(const nb_op_call *c, nb_meta *out) {                              \
    return binary_infer(c, out, NB_BOP_##ID);                                                   \
  }                                                                                             \
  static nb_status prepare_##ID(const nb_op_call *c, const nb_tensor **in) {                    \
    return binary_prepare(c, in, NB_BOP_##ID);                                                  \
  }                                                                                             \
  static nb_status forward_##ID(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {         \
    (void)aux;                                                                                  \
    return binary_into(NB_BOP_##ID, out, c->in[0], c->in[1]);                                   \
  }                                                                                             \
  static void cost_##ID(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) { \
    ew_cost(c, out, FLOPS, bytes, flops);                                                       \
  }

/* ---- the binary ops (ew_list.h's NB_BOP_LIST): w computed once from g, then
 * each operand's gradient (da, db) summed to its shape; its flops column the
 * cost */
#define BINARY_ENTRY(ID, KNAME, NAME, INT, EXPR, IEXPR, W, DA, DB, FLOPS)                       \
  BINARY_FNS(ID, FLOPS)                                                                         \
  static nb_status bw_##ID(nb_node *n, nb_tensor *g, nb_tensor **gin) {                         \
    const nb_tensor *a = n->inputs[0], *b = n->inputs[1];                                       \
    nb_tensor *w = W;                                                                           \
    (void)a; (void)b; (void)w;                                                                  \
    if (nb_node_needs_grad(n, 0)) gin[0] = nb_op_grad_to(DA, a);                                 \
    if (nb_node_needs_grad(n, 1)) gin[1] = nb_op_grad_to(DB, b);                                 \
    return NB_OK;                                                                               \
  }                                                                                             \
  const nb_op nb_op_##NAME = {                                                                  \
      .name = #NAME, .kind = NB_OPK_BINARY, .n_in = 2, .in_names = {"a", "b"},                  \
      .prec = NB_PREC_FOLLOW, .infer = infer_##ID, .prepare = prepare_##ID,                     \
      .forward = forward_##ID, .backward = bw_##ID, .cost = cost_##ID,                          \
      /* add and sub: the rule reads only the operands' shapes */                               \
      .meta_only_in = NB_BOP_##ID == NB_BOP_ADD || NB_BOP_##ID == NB_BOP_SUB ? 3u : 0u,         \
      .bench_in = "r:4096x4096,r:4096x4096"};                                                   \
  nb_tensor *nb_##NAME(const nb_tensor *a, const nb_tensor *b) {                                \
    return nb_op_run(&nb_op_##NAME, 2, (const nb_tensor *const[]){a, b}, NULL);                 \
  }
NB_BOP_LIST(BINARY_ENTRY)

/* ---- comparisons (ew_list.h's NB_CMP_LIST): bool results, no gradient ------- */
#define COMPARE_ENTRY(ID, NAME, EXPR)                                                           \
  BINARY_FNS(ID, 1)                                                                             \
  const nb_op nb_op_##NAME = {                                                                  \
      .name = #NAME, .kind = NB_OPK_BINARY, .n_in = 2, .in_names = {"a", "b"},                  \
      .prec = NB_PREC_FOLLOW, .infer = infer_##ID, .prepare = prepare_##ID,                     \
      .forward = forward_##ID, .cost = cost_##ID, .bench_in = "r:4096x4096,r:4096x4096"};       \
  nb_tensor *nb_##NAME(const nb_tensor *a, const nb_tensor *b) {                                \
    return nb_op_run(&nb_op_##NAME, 2, (const nb_tensor *const[]){a, b}, NULL);                 \
  }
NB_CMP_LIST(COMPARE_ENTRY)

/* A Python-style scalar: it takes the tensor's dtype unless a float scalar
 * meets an integer tensor (then f32). */
nb_tensor *nb_op_scalar_for(const nb_tensor *t, double s) {
  nb_dtype dt = t->dtype;
  if (!nb_dtype_is_float(dt) && (s != floor(s) || !isfinite(s))) dt = NB_F32;
  else if (dt == NB_BOOL) dt = NB_I64;
  return nb_scalar(s, dt, nb_device_of(t));
}

/* The scalar variants: the binary entry with a 0-d operand. */
static nb_tensor *binary_scalar(const nb_op *op, const nb_tensor *a, double s, int reversed) {
  if (!a) { nb_error_null(op->name, "a"); return NULL; }
  nb_scope_begin();
  nb_tensor *c = nb_op_scalar_for(a, s);
  const nb_tensor *in[2] = {reversed ? c : a, reversed ? a : c};
  nb_tensor *out = c ? nb_keep(nb_op_run(op, 2, in, NULL)) : NULL;
  nb_scope_end();
  return nb_autorelease(out);
}

nb_tensor *nb_add_scalar(const nb_tensor *a, double s) { return binary_scalar(&nb_op_add, a, s, 0); }
nb_tensor *nb_sub_scalar(const nb_tensor *a, double s) { return binary_scalar(&nb_op_sub, a, s, 0); }
nb_tensor *nb_rsub_scalar(const nb_tensor *a, double s) { return binary_scalar(&nb_op_sub, a, s, 1); }
nb_tensor *nb_mul_scalar(const nb_tensor *a, double s) { return binary_scalar(&nb_op_mul, a, s, 0); }
nb_tensor *nb_div_scalar(const nb_tensor *a, double s) { return binary_scalar(&nb_op_div, a, s, 0); }
nb_tensor *nb_pow_scalar(const nb_tensor *a, double s) { return binary_scalar(&nb_op_pow, a, s, 0); }
nb_tensor *nb_maximum_scalar(const nb_tensor *a, double s) {
  return binary_scalar(&nb_op_maximum, a, s, 0);
}
nb_tensor *nb_minimum_scalar(const nb_tensor *a, double s) {
  return binary_scalar(&nb_op_minimum, a, s, 0);
}

/* ---- where --------------------------------------------------------------------- */
static nb_status where_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *cond = c->in[0], *a = c->in[1], *b = c->in[2];
  char b1[200], b2[200], b3[200];
  int64_t s1[NB_MAX_DIMS];
  int n1 = nb_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, s1);
  int nd = n1 < 0 ? -1 : nb_broadcast_shapes(cond->ndim, cond->shape, n1, s1, out->shape);
  if (nd < 0)
    return nb_error_set(NB_ERR_SHAPE, "where: shapes of cond %s, a %s and b %s do not broadcast",
                        nb_describe(cond, b1, sizeof b1), nb_describe(a, b2, sizeof b2),
                        nb_describe(b, b3, sizeof b3));
  out->ndim = nd;
  out->dtype = nb_promote(a->dtype, b->dtype);
  out->device = nb_device_of(a);
  return NB_OK;
}

/* cond as bool, a and b in their promoted dtype (recorded casts) */
static nb_status where_prepare(const nb_op_call *c, const nb_tensor **in) {
  nb_dtype dt = nb_promote(c->in[1]->dtype, c->in[2]->dtype);
  for (int i = 0; i < 3; i++)
    if (!(in[i] = nb_cast(c->in[i], i ? dt : NB_BOOL))) return nb_last_status();
  return NB_OK;
}

static nb_status where_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  nb_kview ko, kc, ka, kb;
  nb_kview_of(out, &ko);
  nb_kview_broadcast(c->in[0], out->ndim, out->shape, &kc);
  nb_kview_broadcast(c->in[1], out->ndim, out->shape, &ka);
  nb_kview_broadcast(c->in[2], out->ndim, out->shape, &kb);
  return nb_backend_for(nb_device_of(out))->where(&ko, &kc, &ka, &kb);
}

static void where_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  ew_cost(c, out, 1, bytes, flops);
}

static nb_status where_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *c = n->inputs[0], *a = n->inputs[1], *b = n->inputs[2];
  nb_tensor *zero = nb_scalar(0.0, g->dtype, nb_device_of(g));
  if (nb_node_needs_grad(n, 1)) gin[1] = nb_op_grad_to(nb_where(c, g, zero), a);
  if (nb_node_needs_grad(n, 2)) gin[2] = nb_op_grad_to(nb_where(c, zero, g), b);
  return NB_OK;
}

const nb_op nb_op_where = {
    .name = "where", .kind = NB_OPK_BINARY, .n_in = 3, .in_names = {"cond", "a", "b"},
    .prec = NB_PREC_FOLLOW, .infer = where_infer, .prepare = where_prepare,
    .forward = where_forward, .backward = where_bw, .cost = where_cost,
    .bench_in = "b:4096x4096,r:4096x4096,r:4096x4096"};

nb_tensor *nb_where(const nb_tensor *cond, const nb_tensor *a, const nb_tensor *b) {
  return nb_op_run(&nb_op_where, 3, (const nb_tensor *const[]){cond, a, b}, NULL);
}

/* ---- clamp: maximum with lo, then minimum with hi; the gradient passes where
 * lo <= x <= hi ---------------------------------------------------------------- */
typedef struct {
  double lo, hi;
} clamp_params;

/* nb_op_scalar_for's dtype for a scalar s meeting a tensor of dtype dt */
static nb_dtype scalar_dtype(nb_dtype dt, double s) {
  if (!nb_dtype_is_float(dt) && (s != floor(s) || !isfinite(s))) return NB_F32;
  return dt == NB_BOOL ? NB_I64 : dt;
}

/* the dtype of maximum(x, lo), then of minimum(that, hi) */
static nb_dtype clamp_dtype(nb_dtype x, const clamp_params *p) {
  nb_dtype t = compute_dtype(NB_BOP_MAX, x, scalar_dtype(x, p->lo));
  return compute_dtype(NB_BOP_MIN, t, scalar_dtype(t, p->hi));
}

static nb_status clamp_infer(const nb_op_call *c, nb_meta *out) {
  const clamp_params *p = c->p;
  if (p->lo > p->hi || p->lo != p->lo || p->hi != p->hi)
    return nb_error_set(NB_ERR_VALUE, "clamp: bounds lo %g > hi %g (expected lo <= hi)", p->lo,
                        p->hi);
  nb_meta_of(c->in[0], out);
  out->dtype = clamp_dtype(out->dtype, p);
  return NB_OK;
}

/* The kernels of nb_minimum_scalar(nb_maximum_scalar(x, lo), hi), the last
 * one into out; not recorded (the node is clamp's). */
static nb_status clamp_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const clamp_params *p = c->p;
  nb_no_grad_begin();
  nb_scope_begin();
  const nb_tensor *t = nb_maximum_scalar(c->in[0], p->lo);
  const nb_tensor *hi = t ? nb_op_scalar_for(t, p->hi) : NULL;
  if (hi) t = nb_cast(t, out->dtype), hi = nb_cast(hi, out->dtype);
  nb_status st = t && hi ? binary_into(NB_BOP_MIN, out, t, hi) : nb_last_status();
  nb_scope_end();
  nb_no_grad_end();
  return st;
}

static void clamp_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  ew_cost(c, out, 2, bytes, flops);
}

static nb_status clamp_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const clamp_params *p = nb_node_params(n);
  const nb_tensor *x = n->inputs[0];
  nb_tensor *in =
      nb_mul(nb_ge(x, nb_op_scalar_for(x, p->lo)), nb_le(x, nb_op_scalar_for(x, p->hi)));
  gin[0] = nb_retain(nb_mul(g, nb_cast(in, g->dtype)));
  return gin[0] ? NB_OK : nb_last_status();
}

static const clamp_params clamp_bench = {-0.5, 0.5};
const nb_op nb_op_clamp = {
    .name = "clamp", .kind = NB_OPK_POINTWISE, .n_in = 1, .in_names = {"x"},
    .psize = sizeof(clamp_params), .prec = NB_PREC_FOLLOW, .infer = clamp_infer,
    .forward = clamp_forward, .backward = clamp_bw, .cost = clamp_cost,
    .bench_in = "r:16777216", .bench_p = &clamp_bench};

nb_tensor *nb_clamp(const nb_tensor *x, double lo, double hi) {
  clamp_params p = {lo, hi};
  return nb_op_run(&nb_op_clamp, 1, (const nb_tensor *const[]){x}, &p);
}
