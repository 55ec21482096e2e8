/* Unary elementwise ops: definition, dtype rule, backward rule. */
#include <math.h>

#include "graph/node.h"
#include "backend/backend.h"
#include "core/core.h"
#include "ops/ops.h"

/* Runs one unary kernel into a new tensor of x's shape and dtype dt. */
nb_tensor *nb_op_unary_kernel(nb_uop op, const nb_tensor *x, nb_dtype dt) {
  nb_tensor *out = nb_tensor_alloc(x->ndim, x->shape, dt, nb_device_of(x));
  if (!out) return NULL;
  nb_kview ko, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &ki);
  if (nb_numel(x) && nb_backend_for(nb_device_of(x))->unary(op, &ko, &ki)) {
    nb_release(out);
    return NULL;
  }
  return out;
}

/* A derivative kernel of ew_list.h (NB_UOP_DERIVATIVE_LIST) as a node that
 * has no gradient of its own. */
#define NB_EW_NODE_NAME(ID, KNAME, NODE, EXPR) [NB_UOP_##ID] = NODE,
static const char *const derivative_names[NB_UOP_COUNT] = {
    NB_UOP_DERIVATIVE_LIST(NB_EW_NODE_NAME)};
static nb_tensor *derivative(nb_uop op, const nb_tensor *x) {
  nb_tensor *d = nb_op_unary_kernel(op, x, x->dtype);
  if (d) nb_record(derivative_names[op], nb_no_double_backward, 1, (const nb_tensor *const[]){x}, d);
  return nb_autorelease(d);
}
#define NB_EW_DERIVATIVE(ID, x) derivative(NB_UOP_##ID, x)

/* ---- backward rules, ew_list.h's last column: g is the output's gradient,
 * x the input, y the output */
#define RULE(ID, KNAME, NAME, INT, SAVE, EXPR, IEXPR, BACKWARD)                    \
  static nb_status bw_##ID(nb_node *n, nb_tensor *g, nb_tensor **gin) {            \
    const nb_tensor *x = n->inputs[0], *y = n->saved[0];                          \
    (void)x; (void)y;                                                             \
    gin[0] = nb_retain(BACKWARD);                                                 \
    return gin[0] ? NB_OK : nb_last_status();                                     \
  }
NB_UOP_LIST(RULE)

typedef struct {
  const char *name;
  nb_backward_fn bw;
  int int_ok;      /* ew_list.h's int column: 1 integer kernel, 2 identity, 0 none */
  int save_output; /* the rule reads y */
} unary_def;

#define DEF(ID, KNAME, NAME, INT, SAVE, ...) [NB_UOP_##ID] = {NAME, bw_##ID, INT, SAVE},
static const unary_def unary_defs[NB_UOP_COUNT] = {NB_UOP_LIST(DEF)};

static nb_tensor *unary(nb_uop op, const nb_tensor *x) {
  const unary_def *d = &unary_defs[op];
  if (!x) { nb_error_null(d->name, "x"); return NULL; }
  int is_int = !nb_dtype_is_float(x->dtype);
  if (is_int && d->int_ok == 2) return nb_clone(x); /* floor of an integer is itself */
  nb_scope_begin();
  const nb_tensor *in = x;
  if (is_int && (!d->int_ok || x->dtype == NB_BOOL)) in = nb_cast(x, is_int && d->int_ok ? NB_I64 : NB_F32);
  nb_tensor *out = in ? nb_op_unary_kernel(op, in, in->dtype) : NULL;
  nb_node *n = out ? nb_record(d->name, d->bw, 1, (const nb_tensor *const[]){in}, out) : NULL;
  if (n && d->save_output) nb_node_save(n, 0, out);
  nb_scope_end();
  return nb_autorelease(out);
}

nb_tensor *nb_neg(const nb_tensor *x) { return unary(NB_UOP_NEG, x); }
nb_tensor *nb_abs(const nb_tensor *x) { return unary(NB_UOP_ABS, x); }
nb_tensor *nb_exp(const nb_tensor *x) { return unary(NB_UOP_EXP, x); }
nb_tensor *nb_log(const nb_tensor *x) { return unary(NB_UOP_LOG, x); }
nb_tensor *nb_log1p(const nb_tensor *x) { return unary(NB_UOP_LOG1P, x); }
nb_tensor *nb_expm1(const nb_tensor *x) { return unary(NB_UOP_EXPM1, x); }
nb_tensor *nb_sqrt(const nb_tensor *x) { return unary(NB_UOP_SQRT, x); }
nb_tensor *nb_rsqrt(const nb_tensor *x) { return unary(NB_UOP_RSQRT, x); }
nb_tensor *nb_square(const nb_tensor *x) { return unary(NB_UOP_SQUARE, x); }
nb_tensor *nb_reciprocal(const nb_tensor *x) { return unary(NB_UOP_RECIPROCAL, x); }
nb_tensor *nb_sin(const nb_tensor *x) { return unary(NB_UOP_SIN, x); }
nb_tensor *nb_cos(const nb_tensor *x) { return unary(NB_UOP_COS, x); }
nb_tensor *nb_tanh(const nb_tensor *x) { return unary(NB_UOP_TANH, x); }
nb_tensor *nb_sigmoid(const nb_tensor *x) { return unary(NB_UOP_SIGMOID, x); }
nb_tensor *nb_relu(const nb_tensor *x) { return unary(NB_UOP_RELU, x); }
nb_tensor *nb_gelu(const nb_tensor *x) { return unary(NB_UOP_GELU_ERF, x); }
nb_tensor *nb_gelu_tanh(const nb_tensor *x) { return unary(NB_UOP_GELU_TANH, x); }
nb_tensor *nb_silu(const nb_tensor *x) { return unary(NB_UOP_SILU, x); }
nb_tensor *nb_softplus(const nb_tensor *x) { return unary(NB_UOP_SOFTPLUS, x); }
nb_tensor *nb_sign(const nb_tensor *x) { return unary(NB_UOP_SIGN, x); }
nb_tensor *nb_floor(const nb_tensor *x) { return unary(NB_UOP_FLOOR, x); }
nb_tensor *nb_ceil(const nb_tensor *x) { return unary(NB_UOP_CEIL, x); }
nb_tensor *nb_round(const nb_tensor *x) { return unary(NB_UOP_ROUND, x); }

/* ---- cast ---------------------------------------------------------------- */
static nb_status cast_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(nb_cast(g, n->inputs[0]->dtype));
  return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_cast(const nb_tensor *x, nb_dtype dt) {
  if (!x) { nb_error_null("nb_cast", "x"); return NULL; }
  if ((unsigned)dt >= NB_DTYPE_COUNT) {
    nb_error_set(NB_ERR_DTYPE, "nb_cast: invalid dtype %d", (int)dt);
    return NULL;
  }
  if (x->dtype == dt) return nb_autorelease(nb_retain((nb_tensor *)x));
  nb_tensor *out = nb_tensor_alloc(x->ndim, x->shape, dt, nb_device_of(x));
  if (!out) return NULL;
  nb_kview ko, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &ki);
  if (nb_numel(x) && nb_backend_for(nb_device_of(x))->copy(&ko, &ki)) {
    nb_release(out);
    return NULL;
  }
  if (nb_dtype_is_float(x->dtype)) nb_record("cast", cast_bw, 1, (const nb_tensor *const[]){x}, out);
  return nb_autorelease(out);
}
