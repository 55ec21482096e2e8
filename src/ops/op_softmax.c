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

/* dx from dy and the saved output y, in one kernel pass. An op of its own
 * whose second derivative is unsupported; it is only recorded when grad mode
 * is on, where softmax_bw composes instead (except for 0-d inputs). */
static nb_tensor *softmax_backward(const nb_tensor *g, const nb_tensor *y, int a, int log) {
  nb_scope_begin();
  const nb_tensor *dy = nb_cast(g, y->dtype);
  nb_tensor *dx = dy ? nb_tensor_alloc(y->ndim, y->shape, y->dtype, nb_device_of(y)) : NULL;
  if (dx && nb_numel(dx)) {
    nb_kview kdx, kdy, ky;
    softmax_view(dx, a, &kdx);
    softmax_view(dy, a, &kdy);
    softmax_view(y, a, &ky);
    if (nb_backend_for(nb_device_of(y))->softmax_bwd(&kdx, &kdy, &ky, log)) {
      nb_release(dx);
      dx = NULL;
    }
  }
  if (dx)
    nb_record(log ? "log_softmax_backward" : "softmax_backward", nb_no_double_backward, 2,
              (const nb_tensor *const[]){dy, y}, dx);
  nb_scope_end();
  return nb_autorelease(dx);
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

static nb_status softmax_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  int a = (int)n->ip[0], log = (int)n->ip[1];
  const nb_tensor *x = n->inputs[0];
  if (nb_grad_enabled() && x->ndim > 0)
    gin[0] = nb_retain(softmax_backward_composed(g, x, a, log));
  else
    gin[0] = nb_retain(softmax_backward(g, n->saved[0], a, log));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_tensor *softmax_op(const char *name, const nb_tensor *x, int axis, int log) {
  if (!x) { nb_error_null(name, "x"); return NULL; }
  if (!nb_dtype_is_float(x->dtype)) {
    char b[200];
    nb_error_set(NB_ERR_DTYPE, "%s: input %s (expected a float tensor; cast it first)", name,
                 nb_describe(x, b, sizeof b));
    return NULL;
  }
  int a = nb_norm_axis(name, axis, x->ndim);
  if (a < 0) return NULL;
  nb_tensor *y = nb_tensor_alloc(x->ndim, x->shape, x->dtype, nb_device_of(x));
  if (!y) return NULL;
  if (nb_numel(y)) {
    nb_kview ky, kx;
    softmax_view(y, a, &ky);
    softmax_view(x, a, &kx);
    if (nb_backend_for(nb_device_of(x))->softmax_fwd(&ky, &kx, log)) {
      nb_release(y);
      return NULL;
    }
  }
  nb_node *n = nb_record(name, softmax_bw, 1, (const nb_tensor *const[]){x}, y);
  if (n) {
    nb_node_save(n, 0, y);
    n->ip[0] = a;
    n->ip[1] = log;
  }
  return nb_autorelease(y);
}

nb_tensor *nb_softmax(const nb_tensor *x, int axis) { return softmax_op("softmax", x, axis, 0); }
nb_tensor *nb_log_softmax(const nb_tensor *x, int axis) {
  return softmax_op("log_softmax", x, axis, 1);
}
