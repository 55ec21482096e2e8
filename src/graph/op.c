/* The eager path of every primitive op: check, infer, prepare, allocate,
 * forward, record (graph/op.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/op.h"

void nb_meta_of(const nb_tensor *t, nb_meta *m) {
  m->ndim = t->ndim;
  memcpy(m->shape, t->shape, sizeof m->shape);
  m->dtype = t->dtype;
  m->device = nb_device_of(t);
}

/* NULL inputs: required ones are an error naming the op and the position;
 * present ones must share one device. */
static nb_status check_inputs(const nb_op *op, int n, const nb_tensor *const *in) {
  if (n < op->n_in || (!op->variadic && n > op->n_in))
    return nb_error_set(NB_ERR_VALUE, "%s: %d inputs (expected %s%d)", op->name, n,
                        op->variadic ? "at least " : "", op->n_in);
  const nb_tensor *first = NULL;
  for (int i = 0; i < n; i++) {
    if (!in[i]) {
      if (i >= op->n_in - op->n_opt && i < op->n_in) continue;
      char what[24];
      snprintf(what, sizeof what, "input %d", i);
      return nb_error_null(op->name, i < NB_OP_MAX_IN && op->in_names[i] ? op->in_names[i] : what);
    }
    if (!first) first = in[i];
    else if (!nb_same_device(nb_device_of(first), nb_device_of(in[i]))) {
      char b1[200], b2[200];
      return nb_error_set(NB_ERR_DEVICE, "%s: inputs on different devices: %s and %s", op->name,
                          nb_describe(first, b1, sizeof b1), nb_describe(in[i], b2, sizeof b2));
    }
  }
  return NB_OK;
}

nb_node *nb_op_record(const nb_op_call *c, nb_tensor *out, nb_tensor *const *saved) {
  const nb_op *op = c->op;
  if (!op->backward) return NULL;
  nb_node *n = nb_record(op->name, op->backward, c->n, c->in, out);
  if (!n) return NULL;
  n->op = op;
  if (op->psize) memcpy(n->params, c->p, op->psize);
  int slot = 0;
  if (op->save_out) nb_node_save(n, slot++, out);
  for (int i = 0; saved && slot < NB_NODE_SAVED; i++, slot++) nb_node_save(n, slot, saved[i]);
  return n;
}

#define NB_OP_AUX (NB_OP_MAX_OUT - 1 + NB_NODE_SAVED)

nb_status nb_op_run_outs(const nb_op *op, int n, const nb_tensor *const *in, const void *params,
                         nb_tensor **outs) {
  int n_out = op->n_out ? op->n_out : 1;
  for (int i = 0; i < n_out; i++) outs[i] = NULL;
  nb_status st = check_inputs(op, n, in);
  if (st) return st;
  nb_op_call c = {op, n, in, params};
  nb_meta m;
  if ((st = op->infer(&c, &m))) return st;
  nb_scope_begin();
  /* a variadic op (cat) may have more inputs than the array on the stack */
  const nb_tensor *prep_fixed[NB_OP_MAX_IN], **prep = prep_fixed;
  nb_tensor *out = NULL, *aux[NB_OP_AUX] = {0};
  if (n > NB_OP_MAX_IN && !(prep = malloc((size_t)n * sizeof *prep))) {
    st = nb_error_set(NB_ERR_OOM, "%s: out of host memory for %d inputs", op->name, n);
    goto done;
  }
  if (n) memcpy(prep, in, (size_t)n * sizeof *in);
  if (op->prepare && (st = op->prepare(&c, prep))) goto done;
  c.in = prep;
  if (op->view) {
    out = op->view(&c, &m);
  } else {
    out = nb_tensor_alloc(m.ndim, m.shape, m.dtype, m.device);
    if (out && (nb_numel(out) || op->always_forward) && op->forward(&c, out, aux)) {
      nb_release(out);
      out = NULL;
    }
  }
  if (!out) {
    st = nb_last_status();
    goto done;
  }
  outs[0] = out;
  for (int i = 1; i < n_out; i++) outs[i] = aux[i - 1], aux[i - 1] = NULL;
  for (int i = 0; i < n_out; i++) nb_op_record(&c, outs[i], aux + n_out - 1);
done:
  for (int i = 0; i < NB_OP_AUX; i++) nb_release(aux[i]);
  if (prep && prep != prep_fixed) free(prep);
  nb_scope_end();
  for (int i = 0; i < n_out; i++) outs[i] = nb_autorelease(outs[i]);
  return st;
}

nb_tensor *nb_op_run(const nb_op *op, int n, const nb_tensor *const *in, const void *params) {
  nb_tensor *outs[NB_OP_MAX_OUT];
  return nb_op_run_outs(op, n, in, params, outs) ? NULL : outs[0];
}

void nb_op_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  if (c->op->cost) {
    c->op->cost(c, out, bytes, flops);
    return;
  }
  double nout = (double)nb_shape_numel(out->ndim, out->shape);
  double b = nout * (double)nb_dtype_size(out->dtype);
  for (int i = 0; i < c->n; i++)
    if (c->in[i]) b += (double)nb_numel(c->in[i]) * (double)nb_dtype_size(c->in[i]->dtype);
  *bytes = b;
  *flops = nout;
}

static const char *const kind_names[NB_OPK_COUNT] = {
    "pointwise", "binary", "reduce", "row", "contract", "index", "view", "opaque"};

const char *nb_op_kind_name(nb_op_kind k) {
  return (unsigned)k < NB_OPK_COUNT ? kind_names[k] : "?";
}

const char *nb_prec_class_name(nb_prec_class p) {
  return p == NB_PREC_LOW ? "low" : p == NB_PREC_F32 ? "f32" : "follow";
}
