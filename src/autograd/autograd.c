/* The backward engine: topological backward over the recorded nodes
 * (graph/node.c records them), gradient accumulation, and the leaf API. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "graph/node.h"

static _Thread_local int64_t pass_counter;

/* ---- leaf API ------------------------------------------------------------ */
nb_status nb_set_requires_grad(nb_tensor *t, int flag) {
  if (!t) return nb_error_null("nb_set_requires_grad", "t");
  if (flag && !nb_dtype_is_float(t->dtype))
    return nb_error_set(NB_ERR_DTYPE, "nb_set_requires_grad: only float tensors can require grad (got %s)",
                        nb_dtype_name(t->dtype));
  if (t->grad_fn)
    return nb_error_set(NB_ERR_GRAD, "nb_set_requires_grad: tensor is the result of op '%s'; "
                        "only leaves can change requires_grad (detach it first)", t->grad_fn->name);
  t->requires_grad = flag != 0;
  return NB_OK;
}

int nb_requires_grad(const nb_tensor *t) { return t && t->requires_grad; }
int nb_is_leaf(const nb_tensor *t) { return t && !t->grad_fn; }
nb_tensor *nb_grad(const nb_tensor *t) { return t ? t->grad : NULL; }
const char *nb_grad_fn_name(const nb_tensor *t) { return t && t->grad_fn ? t->grad_fn->name : "leaf"; }

nb_status nb_zero_grad(nb_tensor *t) {
  if (!t) return nb_error_null("nb_zero_grad", "t");
  nb_release(t->grad);
  t->grad = NULL;
  return NB_OK;
}

nb_tensor *nb_detach(const nb_tensor *t) {
  if (!t) { nb_error_null("nb_detach", "t"); return NULL; }
  return nb_autorelease(nb_tensor_view_of(t, t->ndim, t->shape, t->strides, t->offset));
}

/* ---- the backward pass ---------------------------------------------------- */
typedef struct { nb_node **v; int len, cap; } node_vec;

static void vec_push(node_vec *s, nb_node *n) {
  if (s->len == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 64;
    s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
    if (!s->v) abort();
  }
  s->v[s->len++] = n;
}

/* Collects the nodes reachable from root and counts, for each, how many
 * edges from other reachable nodes lead into it (its pending consumers). */
static nb_status collect(nb_node *root, int64_t pass, node_vec *all) {
  node_vec stack = {0};
  root->pass = pass;
  root->pending = 0;
  vec_push(&stack, root);
  vec_push(all, root);
  __atomic_add_fetch(&root->refcount, 1, __ATOMIC_RELAXED); /* held until the pass ends */
  while (stack.len) {
    nb_node *n = stack.v[--stack.len];
    if (n->freed) {
      free(stack.v);
      return nb_error_set(NB_ERR_GRAD, "backward: the graph through op '%s' was already used by a "
                          "backward pass and freed (pass retain_graph to backward twice)", n->name);
    }
    for (int i = 0; i < n->n_inputs; i++) {
      nb_tensor *in = n->inputs[i];
      nb_node *m = in && in->requires_grad ? in->grad_fn : NULL;
      if (!m) continue;
      if (m->pass != pass) {
        m->pass = pass;
        m->pending = 0;
        nb_release(m->gacc);
        m->gacc = NULL;
        vec_push(&stack, m);
        vec_push(all, m);
        __atomic_add_fetch(&m->refcount, 1, __ATOMIC_RELAXED);
      }
      m->pending++;
    }
  }
  free(stack.v);
  return NB_OK;
}

/* acc <- acc + g (new references, out of place so aliases stay intact). */
static nb_status accumulate(nb_tensor **acc, nb_tensor *g) {
  if (!*acc) { *acc = nb_retain(g); return NB_OK; }
  nb_tensor *s = nb_add(*acc, g);
  if (!s) return nb_last_status();
  nb_release(*acc);
  *acc = nb_keep(s);
  return NB_OK;
}

/* What reaches a leaf must have its shape and dtype exactly. */
static nb_tensor *fit_to(nb_tensor *g, const nb_tensor *like) {
  if (g->dtype != like->dtype) g = nb_cast(g, like->dtype);
  return g;
}

/* Whether the pass may keep graph state (retain_graph or create_graph). */
static _Thread_local int pass_keeps_graph;

/* g can become a leaf's .grad without a copy: nothing else can see its
 * memory (one tensor on the storage, covering all of it), it has no
 * history, and the graph (whose saved tensors it might be) is freed after
 * this pass, so later in-place updates of .grad (clipping) touch nothing else. */
static int grad_exclusive(const nb_tensor *g) {
  return !pass_keeps_graph && !g->grad_fn && !g->requires_grad && g->storage->refcount == 1 &&
         g->offset == 0 && nb_is_contiguous(g) &&
         (size_t)nb_numel(g) * nb_dtype_size(g->dtype) == g->storage->nbytes;
}

typedef struct {
  int n_targets;              /* nb_autograd_grad: capture grads of these */
  nb_tensor *const *targets;
  nb_tensor **captured;
} grad_sink;

static nb_status deliver(nb_tensor *in, nb_tensor *g, grad_sink *sink) {
  g = fit_to(g, in);
  if (!g) return nb_last_status();
  if (sink) { /* capture for a target, and keep flowing to targets upstream */
    /* a node may keep a data-less header of an input (nb_node_keep_meta):
     * a result is known by its node too */
    for (int i = 0; i < sink->n_targets; i++)
      if (sink->targets[i] == in || (in->grad_fn && sink->targets[i]->grad_fn == in->grad_fn)) {
        nb_status st = accumulate(&sink->captured[i], g);
        if (st) return st;
      }
    return in->grad_fn ? accumulate(&in->grad_fn->gacc, g) : NB_OK;
  }
  if (in->grad_fn) return accumulate(&in->grad_fn->gacc, g);
  /* a leaf: its .grad is its own contiguous buffer, never an alias */
  if (!in->grad) {
    if (grad_exclusive(g)) { /* a header of its own: the storage count now says "shared" */
      in->grad = nb_tensor_view_of(g, g->ndim, g->shape, g->strides, 0);
      return in->grad ? NB_OK : nb_last_status();
    }
    nb_tensor *c = nb_clone(g);
    if (!c) return nb_last_status();
    in->grad = nb_keep(c);
    return NB_OK;
  }
  return accumulate(&in->grad, g);
}

/* Runs n's rule and delivers its input gradients. The rule's intermediates
 * live in a scope of their own, freed when the node is done (a pass's peak
 * memory is one rule's scratch, not every rule's). */
static nb_status run_node(nb_node *n, grad_sink *sink) {
  nb_tensor *gin_small[8] = {0};
  nb_tensor **gin = n->n_inputs <= 8 ? gin_small : calloc((size_t)n->n_inputs, sizeof *gin);
  if (!gin) abort();
  nb_scope_begin();
  nb_status st = n->backward(n, n->gacc, gin);
  for (int i = 0; i < n->n_inputs; i++) {
    if (st == NB_OK && gin[i] && nb_node_needs_grad(n, i)) st = deliver(n->inputs[i], gin[i], sink);
    nb_release(gin[i]);
  }
  nb_scope_end();
  if (gin != gin_small) free(gin);
  if (st != NB_OK && !nb_error_pending())
    nb_error_set(st, "backward of op '%s' failed", n->name);
  return st;
}

static nb_status check_root(const nb_tensor *t, const nb_tensor *grad) {
  char b1[200], b2[200];
  if (!t->requires_grad)
    return nb_error_set(NB_ERR_GRAD, "backward: tensor %s does not require grad (no input of its "
                        "computation had requires_grad set)", nb_describe(t, b1, sizeof b1));
  if (!grad && nb_numel(t) != 1)
    return nb_error_set(NB_ERR_GRAD, "backward: tensor %s is not a scalar; pass a gradient of its "
                        "shape", nb_describe(t, b1, sizeof b1));
  if (grad && (grad->ndim != t->ndim || memcmp(grad->shape, t->shape, (size_t)t->ndim * 8)))
    return nb_error_set(NB_ERR_SHAPE, "backward: gradient %s does not match tensor %s",
                        nb_describe(grad, b1, sizeof b1), nb_describe(t, b2, sizeof b2));
  if (grad && !nb_same_device(nb_device_of(grad), nb_device_of(t)))
    return nb_error_set(NB_ERR_DEVICE, "backward: gradient %s is on another device than %s",
                        nb_describe(grad, b1, sizeof b1), nb_describe(t, b2, sizeof b2));
  return NB_OK;
}

static nb_status run_backward(nb_tensor *t, const nb_tensor *grad, int retain, int create,
                              grad_sink *sink) {
  if (!t) return nb_error_null("backward", "t");
  nb_status st = check_root(t, grad);
  if (st) return st;
  if (!create) nb_no_grad_begin();
  pass_keeps_graph = retain || create;
  nb_profile_backward(1);
  nb_scope_begin();
  nb_tensor *g0 = grad ? (nb_tensor *)grad : nb_ones_like(t);
  if (grad && grad->dtype != t->dtype) g0 = nb_cast(grad, t->dtype);
  node_vec all = {0};
  if (!g0) st = nb_last_status();
  else if (!t->grad_fn) st = deliver(t, g0, sink);
  else {
    int64_t pass = ++pass_counter;
    st = collect(t->grad_fn, pass, &all);
    if (!st) {
      t->grad_fn->gacc = nb_retain(g0);
      /* Kahn's algorithm: a node runs once all its consumers have. */
      node_vec ready = {0};
      vec_push(&ready, t->grad_fn);
      while (ready.len && !st) {
        nb_node *n = ready.v[--ready.len];
        if (n->gacc) st = run_node(n, sink);
        nb_release(n->gacc);
        n->gacc = NULL;
        for (int i = 0; i < n->n_inputs && !st; i++) {
          nb_tensor *in = n->inputs[i];
          nb_node *m = in && in->requires_grad ? in->grad_fn : NULL;
          if (m && m->pass == pass && --m->pending == 0) vec_push(&ready, m);
        }
        /* its consumers have all run: what it saved for backward goes now,
         * as in PyTorch, not when the pass ends */
        if (!retain && !st) { nb_node_drop_refs(n); n->freed = 1; }
      }
      free(ready.v);
    }
  }
  for (int i = 0; i < all.len; i++) {
    nb_release(all.v[i]->gacc);
    all.v[i]->gacc = NULL;
    if (!retain && !st) { nb_node_drop_refs(all.v[i]); all.v[i]->freed = 1; }
  }
  for (int i = 0; i < all.len; i++) nb_node_release(all.v[i]);
  free(all.v);
  nb_scope_end();
  nb_profile_backward(0);
  if (!create) nb_no_grad_end();
  return st;
}

nb_status nb_backward_ex(nb_tensor *t, const nb_tensor *grad, int retain_graph, int create_graph) {
  return run_backward(t, grad, retain_graph || create_graph, create_graph, NULL);
}

nb_status nb_backward(nb_tensor *t, const nb_tensor *grad) { return nb_backward_ex(t, grad, 0, 0); }

nb_status nb_autograd_grad(nb_tensor *output, const nb_tensor *grad_output, int n_inputs,
                           nb_tensor *const *inputs, nb_tensor **grads_out, int create_graph) {
  if (!grads_out || (n_inputs && !inputs)) return nb_error_null("nb_autograd_grad", "inputs");
  for (int i = 0; i < n_inputs; i++) {
    grads_out[i] = NULL;
    if (!inputs[i]) return nb_error_null("nb_autograd_grad", "inputs[i]");
  }
  grad_sink sink = {n_inputs, inputs, grads_out};
  nb_status st = run_backward(output, grad_output, 1, create_graph, &sink);
  for (int i = 0; i < n_inputs; i++) {
    if (st) { nb_release(grads_out[i]); grads_out[i] = NULL; }
    else nb_autorelease(grads_out[i]);
  }
  return st;
}
