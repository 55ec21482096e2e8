/* Graph nodes: recording on an op's output, saved tensors, release; and
 * grad mode, recording's switch. */
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"

static _Thread_local int no_grad_depth;

void nb_no_grad_begin(void) { no_grad_depth++; }
void nb_no_grad_end(void) { if (no_grad_depth > 0) no_grad_depth--; }
int nb_grad_enabled(void) { return no_grad_depth == 0; }

/* ---- nodes ------------------------------------------------------------- */
void nb_node_drop_refs(nb_node *n) {
  for (int i = 0; i < NB_NODE_SAVED; i++) {
    nb_release(n->saved[i]);
    n->saved[i] = NULL;
  }
  for (int i = 0; i < n->n_inputs; i++) {
    nb_release(n->inputs[i]);
    n->inputs[i] = NULL;
  }
}

void nb_node_release(nb_node *n) {
  if (!n || __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  nb_node_drop_refs(n);
  nb_release(n->gacc);
  free(n->inputs);
  free(n);
}

int nb_any_requires_grad(int n, const nb_tensor *const *ts) {
  for (int i = 0; i < n; i++)
    if (ts[i] && ts[i]->requires_grad) return 1;
  return 0;
}

nb_node *nb_record(const char *name, nb_backward_fn fn, int n_inputs,
                   const nb_tensor *const *inputs, nb_tensor *out) {
  if (!out || !nb_grad_enabled() || !nb_any_requires_grad(n_inputs, inputs)) return NULL;
  if (!nb_dtype_is_float(out->dtype)) return NULL; /* integer results carry no gradient */
  nb_node *n = calloc(1, sizeof *n);
  nb_tensor **in = calloc((size_t)(n_inputs ? n_inputs : 1), sizeof *in);
  if (!n || !in) abort(); /* host out of memory while recording: no safe recovery */
  n->refcount = 1;
  n->name = name;
  n->backward = fn;
  n->n_inputs = n_inputs;
  n->inputs = in;
  for (int i = 0; i < n_inputs; i++) in[i] = nb_retain((nb_tensor *)inputs[i]);
  n->out_ndim = out->ndim;
  memcpy(n->out_shape, out->shape, sizeof out->shape);
  n->out_dtype = out->dtype;
  n->out_device = out->storage->device;
  out->grad_fn = n;
  out->requires_grad = 1;
  return n;
}

void nb_node_keep_meta(nb_node *n, int i) {
  nb_tensor *t = n->inputs[i];
  if (!t || (t->requires_grad && !t->grad_fn)) return; /* leaves requiring grad: the real one */
  nb_tensor *m = nb_tensor_meta_of(t);
  if (!m) { nb_clear_error(); return; } /* keeping the input is always correct */
  m->grad_fn = t->grad_fn;
  if (m->grad_fn) __atomic_add_fetch(&m->grad_fn->refcount, 1, __ATOMIC_RELAXED);
  n->inputs[i] = m;
  nb_release(t);
}

void nb_node_save(nb_node *n, int i, const nb_tensor *t) {
  if (!n || !t) return;
  nb_release(n->saved[i]);
  n->saved[i] = nb_tensor_view_of(t, t->ndim, t->shape, t->strides, t->offset);
}

int nb_node_needs_grad(const nb_node *n, int i) {
  return n->inputs[i] && n->inputs[i]->requires_grad;
}

nb_status nb_no_double_backward(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  (void)g; (void)gin;
  return nb_error_set(NB_ERR_UNSUPPORTED, "backward: second derivative of '%s' is not supported",
                      n->name);
}
