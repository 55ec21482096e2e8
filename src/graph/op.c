/* The op table's shared pieces below the ops: an output's metadata, the
 * recording of a node for an entry, costs and names (graph/op.h). The eager
 * path that runs an entry is src/ops/op_run.c. */
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

nb_node *nb_op_record(const nb_op_call *c, nb_tensor *out, nb_tensor *const *saved) {
  const nb_op *op = c->op;
  if (!op->backward) return NULL;
  nb_node *n = nb_record(op->name, op->backward, c->n, c->in, out);
  if (!n) return NULL;
  n->op = op;
  if (op->psize) memcpy(n->params, c->p, op->psize);
  for (int i = 0; i < c->n && i < 32; i++)
    if (op->meta_only_in & (1u << i)) nb_node_keep_meta(n, i);
  int slot = 0;
  if (op->save_out) nb_node_save(n, slot++, out);
  for (int i = 0; saved && slot < NB_NODE_SAVED; i++, slot++) nb_node_save(n, slot, saved[i]);
  return n;
}

double nb_op_io_bytes(const nb_op_call *c, const nb_meta *out) {
  double b = (double)nb_shape_numel(out->ndim, out->shape) * (double)nb_dtype_size(out->dtype);
  for (int i = 0; i < c->n; i++)
    if (c->in[i]) b += (double)nb_numel(c->in[i]) * (double)nb_dtype_size(c->in[i]->dtype);
  return b;
}

void nb_op_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  if (c->op->cost) {
    c->op->cost(c, out, bytes, flops);
    return;
  }
  *bytes = nb_op_io_bytes(c, out);
  *flops = (double)nb_shape_numel(out->ndim, out->shape);
}

static const char *const kind_names[NB_OPK_COUNT] = {
    "pointwise", "binary", "reduce", "row", "contract", "index", "view", "opaque"};

const char *nb_op_kind_name(nb_op_kind k) {
  return (unsigned)k < NB_OPK_COUNT ? kind_names[k] : "?";
}

const char *nb_prec_class_name(nb_prec_class p) {
  return p == NB_PREC_LOW ? "low" : p == NB_PREC_F32 ? "f32" : p == NB_PREC_WIDE ? "wide" : "follow";
}
