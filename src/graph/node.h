/* The graph layer: nodes and their recording, used by ops (below them;
 * the backward engine that runs the nodes is autograd, above them).
 *
 * Every differentiable op has exactly one output. When grad mode is on and
 * an input requires grad, the op records a node on its output: the node holds
 * references to the inputs (so backward rules may use them and so the graph
 * stays alive as long as its output does), up to NB_NODE_SAVED saved tensors
 * (detached, so an op saving its own output makes no reference cycle), and a
 * copy of the op's parameter struct (graph/op.h: the node points to its
 * op-table entry). A backward rule computes input gradients with
 * nabla's own ops, so under create_graph the rules are themselves recorded. */
#ifndef NB_GRAPH_NODE_H
#define NB_GRAPH_NODE_H

#include "core/core.h"

#define NB_NODE_SAVED 4
/* The largest parameter struct an op may have (graph/op.h). */
#define NB_OP_PARAMS_MAX 160

typedef struct nb_node nb_node;
typedef struct nb_op nb_op;
/* Sets gin[i] to a new reference (or leaves it NULL for "no gradient") for
 * every input i with nb_node_needs_grad(n, i). Returns NB_OK or an error. */
typedef nb_status (*nb_backward_fn)(nb_node *n, nb_tensor *gout, nb_tensor **gin);

struct nb_node {
  int64_t refcount;
  const nb_op *op;                 /* the op's description (graph/op.h) */
  const char *name;                /* op->name */
  nb_backward_fn backward;
  int n_inputs;
  nb_tensor **inputs;              /* owned references */
  nb_tensor *saved[NB_NODE_SAVED]; /* owned references, detached */
  _Alignas(16) unsigned char params[NB_OP_PARAMS_MAX]; /* the op's parameter struct */
  int out_ndim;                    /* the output's shape, dtype and device */
  int64_t out_shape[NB_MAX_DIMS];
  nb_dtype out_dtype;
  nb_device out_device;
  int freed;                       /* saved tensors dropped after backward */
  /* backward-pass scratch */
  int64_t pass;
  int pending;
  nb_tensor *gacc;
};

/* Grad mode (nb_no_grad_begin/end, nb_grad_enabled in nabla.h) is
 * recording's switch and lives here, in graph/node.c, with it. */

void nb_node_release(nb_node *n);
/* The node's parameter struct (the type its op declares). */
static inline const void *nb_node_params(const nb_node *n) { return n->params; }
/* Drops the node's inputs and saved tensors (a backward pass that does not
 * retain the graph frees it this way). */
void nb_node_drop_refs(nb_node *n);
/* Records a node on out if grad mode is on and any input requires grad.
 * Returns the node (so the caller can save tensors and parameters) or NULL
 * when nothing was recorded. NULL entries in inputs are allowed. */
nb_node *nb_record(const char *name, nb_backward_fn fn, int n_inputs,
                   const nb_tensor *const *inputs, nb_tensor *out);
/* Replaces input i by a data-less header with its shape, dtype, device and
 * history (nb_tensor_meta_of), so the input's memory can be freed while the
 * graph lives; for inputs whose data the backward rule never reads. Leaves
 * that require grad stay (gradients are delivered to them). */
void nb_node_keep_meta(nb_node *n, int i);
/* Saves a detached alias of t in slot i. */
void nb_node_save(nb_node *n, int i, const nb_tensor *t);
int nb_node_needs_grad(const nb_node *n, int i);
/* The backward rule of an op whose output is itself a gradient computed by
 * a fused kernel (norm, softmax, cross-entropy, attention backward): a
 * second derivative through it reports NB_ERR_UNSUPPORTED, naming the node. */
nb_status nb_no_double_backward(nb_node *n, nb_tensor *g, nb_tensor **gin);
int nb_any_requires_grad(int n, const nb_tensor *const *ts);

#endif
