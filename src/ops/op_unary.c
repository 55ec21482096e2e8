/* Unary elementwise ops and cast: one op-table entry per row of
 * ew_list.h's unary list (nb_op_neg, nb_op_exp, ...) and of its fused
 * backward list (nb_op_gelu_tanh_backward, ...), each with its dtype rule,
 * kernel and backward rule. */

#include <string.h>

#include "graph/node.h"
#include "backend/backend.h"
#include "core/core.h"
#include "ops/ops.h"

/* Runs one unary kernel from x into out (of x's shape). */
static nb_status unary_into(nb_uop op, nb_tensor *out, const nb_tensor *x) {
  nb_kview ko, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &ki);
  return nb_numel(x) ? nb_backend_for(nb_device_of(x))->unary(op, &ko, &ki) : NB_OK;
}

/* ---- the shared pieces of every unary entry ----------------------------------
 * The kernel's dtype for input dtype dt and ew_list.h's int column: floats
 * as they are; integers kept by an integer kernel (bool counted in i64) and
 * by the identity (2, bool too), else computed in f32. */
static nb_dtype unary_dtype(nb_dtype dt, int int_ok) {
  if (nb_dtype_is_float(dt) || int_ok == 2) return dt;
  return int_ok && dt != NB_BOOL ? dt : int_ok ? NB_I64 : NB_F32;
}

static nb_status unary_infer(const nb_op_call *c, nb_meta *out, int int_ok) {
  nb_meta_of(c->in[0], out);
  out->dtype = unary_dtype(out->dtype, int_ok);
  return NB_OK;
}

/* The cast to the kernel's dtype is recorded, and the node is on it. */
static nb_status unary_prepare(const nb_op_call *c, const nb_tensor **in, int int_ok) {
  nb_dtype dt = unary_dtype(c->in[0]->dtype, int_ok);
  if (dt != c->in[0]->dtype && !(in[0] = nb_cast(c->in[0], dt))) return nb_last_status();
  return NB_OK;
}

/* floor, ceil and round of an integer: a copy */
static nb_status unary_forward(const nb_op_call *c, nb_tensor *out, nb_uop op, int int_ok) {
  const nb_tensor *x = c->in[0];
  if (int_ok == 2 && !nb_dtype_is_float(x->dtype)) {
    nb_kview ko, ki;
    nb_kview_of(out, &ko);
    nb_kview_of(x, &ki);
    return nb_backend_for(nb_device_of(x))->copy(&ko, &ki);
  }
  return unary_into(op, out, x);
}

/* The inputs read and the output written once (nb_op_cost's default, one
 * flop per output element), times flops_per (ew_list.h's flops column). */
static void ew_cost(const nb_op_call *c, const nb_meta *out, double flops_per, double *bytes,
                    double *flops) {
  static const nb_op plain = {.name = "elementwise"};
  nb_op_cost(&(nb_op_call){&plain, c->n, c->in, c->p}, out, bytes, flops);
  *flops *= flops_per;
}

/* The functions of unary entry ID: ew_list.h's int column INT is its dtype
 * rule, FLOPS its flops per element; and the entry NAME with backward BW. */
#define UNARY_FNS(ID, INT, FLOPS)                                                    \
  static nb_status infer_##ID(const nb_op_call *c, nb_meta *out) {                   \
    return unary_infer(c, out, INT);                                                 \
  }                                                                                  \
  static nb_status prepare_##ID(const nb_op_call *c, const nb_tensor **in) {         \
    return unary_prepare(c, in, INT);                                                \
  }                                                                                  \
  static nb_status forward_##ID(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) { \
    (void)aux;                                                                       \
    return unary_forward(c, out, NB_UOP_##ID, INT);                                  \
  }                                                                                  \
  static void cost_##ID(const nb_op_call *c, const nb_meta *out, double *bytes,      \
                        double *flops) {                                             \
    ew_cost(c, out, FLOPS, bytes, flops);                                            \
  }
#define UNARY_OP(ID, NAME, SAVE, BW)                                                 \
  const nb_op nb_op_##NAME = {                                                       \
      .name = #NAME, .kind = NB_OPK_POINTWISE, .n_in = 1, .in_names = {"x"},         \
      .prec = NB_PREC_FOLLOW, .infer = infer_##ID, .prepare = prepare_##ID,          \
      .forward = forward_##ID, .backward = BW, .save_out = SAVE, .cost = cost_##ID,  \
      .meta_only_in = SAVE || NB_UOP_##ID == NB_UOP_NEG ? 1u : 0u,                   \
      .bench_in = "r:16777216"};

/* ---- the fused backward kernels (ew_list.h's NB_BOP_DERIVATIVE_LIST): entries
 * that backward rules run (NB_EW_BACKWARD), inputs g and x of one shape,
 * out = g * f'(x) in x's dtype (g cast to it), one rounding; no gradient of
 * their own */
static nb_status derivative_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *g = c->in[0], *x = c->in[1];
  char b1[200], b2[200];
  if (!nb_dtype_is_float(x->dtype) || !nb_dtype_is_float(g->dtype) || g->ndim != x->ndim ||
      memcmp(g->shape, x->shape, (size_t)x->ndim * sizeof x->shape[0]))
    return nb_error_set(NB_ERR_SHAPE, "%s: g %s, x %s (expected float tensors of one shape)",
                        c->op->name, nb_describe(g, b1, sizeof b1), nb_describe(x, b2, sizeof b2));
  nb_meta_of(x, out);
  return NB_OK;
}

static nb_status derivative_prepare(const nb_op_call *c, const nb_tensor **in) {
  return (in[0] = nb_cast(c->in[0], c->in[1]->dtype)) ? NB_OK : nb_last_status();
}

static nb_status derivative_forward(const nb_op_call *c, nb_tensor *out, nb_bop op) {
  nb_kview ko, kx, kg;
  nb_kview_of(out, &ko);
  nb_kview_of(c->in[1], &kx);
  nb_kview_of(c->in[0], &kg);
  return nb_backend_for(nb_device_of(out))->binary(op, &ko, &kx, &kg); /* x, z = g */
}

#define DERIVATIVE_ENTRY(ID, KNAME, NAME, INT, EXPR, FLOPS)                          \
  static nb_status forward_##ID(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) { \
    (void)aux;                                                                       \
    return derivative_forward(c, out, NB_BOP_##ID);                                  \
  }                                                                                  \
  static void cost_##ID(const nb_op_call *c, const nb_meta *out, double *bytes,      \
                        double *flops) {                                             \
    ew_cost(c, out, FLOPS, bytes, flops);                                            \
  }                                                                                  \
  const nb_op nb_op_##NAME = {                                                       \
      .name = #NAME, .kind = NB_OPK_BINARY, .n_in = 2, .in_names = {"g", "x"},       \
      .prec = NB_PREC_FOLLOW, .infer = derivative_infer, .prepare = derivative_prepare, \
      .forward = forward_##ID, .backward = nb_no_double_backward, .cost = cost_##ID, \
      .bench_in = "r:16777216,r:16777216"};
NB_BOP_DERIVATIVE_LIST(DERIVATIVE_ENTRY)

#define DERIVATIVE_OP(ID, KNAME, NAME, ...) [NB_BOP_##ID] = &nb_op_##NAME,
static const nb_op *const derivative_ops[NB_BOP_COUNT] = {NB_BOP_DERIVATIVE_LIST(DERIVATIVE_OP)};
#define NB_EW_BACKWARD(ID, g, x)                                                     \
  nb_op_run(derivative_ops[NB_BOP_##ID], 2, (const nb_tensor *const[]){g, x}, NULL)

/* ---- the unary ops (ew_list.h's NB_UOP_LIST): its backward column is the
 * rule (g the output's gradient, x the input, y the output, saved when
 * save_y); the public function runs the entry */
#define UNARY_ENTRY(ID, KNAME, NAME, INT, SAVE, EXPR, IEXPR, BACKWARD, FLOPS)        \
  UNARY_FNS(ID, INT, FLOPS)                                                          \
  static nb_status bw_##ID(nb_node *n, nb_tensor *g, nb_tensor **gin) {              \
    const nb_tensor *x = n->inputs[0], *y = n->saved[0];                             \
    (void)x; (void)y;                                                                \
    gin[0] = nb_retain(BACKWARD);                                                    \
    return gin[0] ? NB_OK : nb_last_status();                                        \
  }                                                                                  \
  UNARY_OP(ID, NAME, SAVE, bw_##ID)                                                  \
  nb_tensor *nb_##NAME(const nb_tensor *x) {                                         \
    return nb_op_run(&nb_op_##NAME, 1, (const nb_tensor *const[]){x}, NULL);         \
  }
NB_UOP_LIST(UNARY_ENTRY)

/* ---- cast ------------------------------------------------------------------- */
typedef struct {
  nb_dtype dtype;
} cast_params;

static nb_status cast_infer(const nb_op_call *c, nb_meta *out) {
  const cast_params *p = c->p;
  if ((unsigned)p->dtype >= NB_DTYPE_COUNT)
    return nb_error_set(NB_ERR_DTYPE, "nb_cast: invalid dtype %d", (int)p->dtype);
  nb_meta_of(c->in[0], out);
  out->dtype = p->dtype;
  return NB_OK;
}

static nb_status cast_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  nb_kview ko, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(c->in[0], &ki);
  return nb_backend_for(nb_device_of(out))->copy(&ko, &ki);
}

/* a conversion: no arithmetic */
static void cast_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  ew_cost(c, out, 0, bytes, flops);
}

/* an integer input has no gradient (nothing integer requires grad), so
 * only casts of floats are recorded */
static nb_status cast_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(nb_cast(g, n->inputs[0]->dtype));
  return gin[0] ? NB_OK : nb_last_status();
}

static const cast_params cast_bench = {NB_BF16}; /* autocast's f32 -> bf16 */
const nb_op nb_op_cast = {
    .name = "cast", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"x"},
    .psize = sizeof(cast_params), .prec = NB_PREC_FOLLOW, .infer = cast_infer,
    .forward = cast_forward, .backward = cast_bw, .cost = cast_cost, .meta_only_in = 1u, .fp8 = 1,
    .bench_in = "r:16777216", .bench_p = &cast_bench};

nb_tensor *nb_cast(const nb_tensor *x, nb_dtype dt) {
  if (!x) { nb_error_null("nb_cast", "x"); return NULL; }
  if (x->dtype == dt) return nb_autorelease(nb_retain((nb_tensor *)x));
  cast_params p = {dt};
  return nb_op_run(&nb_op_cast, 1, (const nb_tensor *const[]){x}, &p);
}
