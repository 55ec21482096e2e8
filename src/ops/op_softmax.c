/* softmax and log_softmax along any axis: one fused kernel forward (the
 * axis is moved last in the kernel views, so no data moves), and one fused
 * kernel backward wrapped as its own op. */
#include "ops/ops.h"

/* The kernel view of t with axis a moved last (a 0-d tensor becomes one
 * row of one element). */
static void softmax_view(const nb_tensor *t, int a, nb_kview *v) {
  nb_kview_of(t, v);
  if (v->ndim == 0) {
    v->ndim = 1;
    v->shape[0] = 1;
    v->strides[0] = 1;
    return;
  }
  int64_t sz = v->shape[a], st = v->strides[a];
  for (int i = a; i < v->ndim - 1; i++) {
    v->shape[i] = v->shape[i + 1];
    v->strides[i] = v->strides[i + 1];
  }
  v->shape[v->ndim - 1] = sz;
  v->strides[v->ndim - 1] = st;
}

typedef struct {
  int axis; /* as given (may be negative) */
  int log;
} softmax_params;

/* The axis a call's parameters name, for a tensor of ndim axes (checked). */
static int softmax_axis(const nb_op_call *c, int ndim) {
  return nb_norm_axis(c->op->name, ((const softmax_params *)c->p)->axis, ndim);
}

static nb_status softmax_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *x = c->in[0];
  if (!nb_dtype_is_float(x->dtype)) {
    char b[200];
    return nb_error_set(NB_ERR_DTYPE, "%s: input %s (expected a float tensor; cast it first)",
                        c->op->name, nb_describe(x, b, sizeof b));
  }
  if (nb_norm_axis(c->op->name, ((const softmax_params *)c->p)->axis, x->ndim) < 0)
    return nb_last_status();
  nb_meta_of(x, out);
  return NB_OK;
}

/* dx from dy and the saved output y, in one kernel pass: inputs (dy, y).
 * Recorded only when grad mode is on and y's history is wanted; its second
 * derivative is unsupported (softmax_bw composes under create_graph). */
static nb_status softmax_backward_infer(const nb_op_call *c, nb_meta *out) {
  nb_meta_of(c->in[1], out);
  return NB_OK;
}

static nb_status softmax_backward_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[0] = nb_cast(c->in[0], c->in[1]->dtype);
  return in[0] ? NB_OK : nb_last_status();
}

static nb_status softmax_backward_forward(const nb_op_call *c, nb_tensor *dx, nb_tensor **aux) {
  (void)aux;
  const softmax_params *p = c->p;
  int a = softmax_axis(c, dx->ndim);
  nb_kview kdx, kdy, ky;
  softmax_view(dx, a, &kdx);
  softmax_view(c->in[0], a, &kdy);
  softmax_view(c->in[1], a, &ky);
  return nb_backend_for(nb_device_of(dx))->softmax_bwd(&kdx, &kdy, &ky, p->log);
}

/* Under create_graph the gradient must itself be differentiable through y,
 * which the node saved detached (saving it attached would be a cycle): y is
 * recomputed from x with history and the rule is written with nabla ops.
 *   softmax:     dx = y * (g - sum(g * y))
 *   log_softmax: dx = g - exp(y) * sum(g)                                 */
static nb_tensor *softmax_backward_composed(const nb_tensor *g, const nb_tensor *x, int a, int log) {
  nb_tensor *y = log ? nb_log_softmax(x, a) : nb_softmax(x, a);
  if (log) return nb_sub(g, nb_mul(nb_exp(y), nb_sum(g, 1, &a, 1)));
  return nb_mul(y, nb_sub(g, nb_sum(nb_mul(g, y), 1, &a, 1)));
}

extern const nb_op nb_op_softmax_backward, nb_op_log_softmax_backward;

static nb_status softmax_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const softmax_params *p = nb_node_params(n);
  const nb_tensor *x = n->inputs[0], *y = n->saved[0];
  int a = nb_norm_axis(n->name, p->axis, x->ndim);
  if (nb_grad_enabled() && x->ndim > 0)
    gin[0] = nb_retain(softmax_backward_composed(g, x, a, p->log));
  else
    gin[0] = nb_retain(nb_op_run(p->log ? &nb_op_log_softmax_backward : &nb_op_softmax_backward, 2,
                                 (const nb_tensor *const[]){g, y}, p));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status softmax_forward(const nb_op_call *c, nb_tensor *y, nb_tensor **aux) {
  (void)aux;
  const softmax_params *p = c->p;
  int a = softmax_axis(c, y->ndim);
  nb_kview ky, kx;
  softmax_view(y, a, &ky);
  softmax_view(c->in[0], a, &kx);
  return nb_backend_for(nb_device_of(y))->softmax_fwd(&ky, &kx, p->log);
}

/* x and y read once, written once; a max, an exp, a sum and a scale per element */
static void softmax_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  double n = (double)nb_shape_numel(out->ndim, out->shape);
  *bytes = n * (double)(nb_dtype_size(c->in[0]->dtype) + nb_dtype_size(out->dtype));
  *flops = 5 * n;
}

#define SOFTMAX_OPS(NAME, LOG)                                                         \
  static const softmax_params NAME##_bench = {-1, LOG};                                \
  const nb_op nb_op_##NAME = {                                                         \
      .name = #NAME, .kind = NB_OPK_ROW, .n_in = 1, .in_names = {"x"}, .psize = sizeof(softmax_params),   \
      .prec = NB_PREC_F32, .infer = softmax_infer, .forward = softmax_forward,         \
      .backward = softmax_bw, .save_out = 1, .cost = softmax_cost,                     \
      .bench_in = "r:16384x4096", .bench_p = &NAME##_bench};                           \
  const nb_op nb_op_##NAME##_backward = {                                              \
      .name = #NAME "_backward", .kind = NB_OPK_ROW, .n_in = 2, .in_names = {"dy", "y"}, \
      .psize = sizeof(softmax_params), .prec = NB_PREC_F32,                            \
      .infer = softmax_backward_infer, .prepare = softmax_backward_prepare,            \
      .forward = softmax_backward_forward, .backward = nb_no_double_backward,          \
      .cost = softmax_cost, .bench_in = "r:16384x4096,r:16384x4096",                   \
      .bench_p = &NAME##_bench};                                                       \
  nb_tensor *nb_##NAME(const nb_tensor *x, int axis) {                                 \
    softmax_params p = {axis, LOG};                                                    \
    return nb_op_run(&nb_op_##NAME, 1, (const nb_tensor *const[]){x}, &p);             \
  }

SOFTMAX_OPS(softmax, 0)
SOFTMAX_OPS(log_softmax, 1)
