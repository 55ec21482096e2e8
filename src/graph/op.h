/* The op table's types: an op as data.
 *
 * Every primitive op (one that runs a kernel or makes a view, and that a
 * graph records) is described once by an nb_op in its src/ops/op_*.c file
 * and listed in src/ops/op_list.h. The description says what the op reads
 * and writes, how it is checked and how its output's shape and dtype follow
 * from its inputs, how it runs forward (a backend dispatch), its backward
 * rule (written with nabla ops), what it saves, its typed parameters, its
 * kind, its mixed-precision class, its determinism and its cost. The eager
 * path (nb_op_run) is one function over the description: check and infer,
 * prepare, allocate, forward, record. A recorded node points back to the
 * description and holds a copy of the parameters, so a captured graph has
 * everything needed to replay, fuse or plan it.
 *
 * Compositions (mean, var, std, mse_loss, ...) are not entries:
 * they are functions written with the primitives, so a graph contains only
 * primitives. */
#ifndef NB_GRAPH_OP_H
#define NB_GRAPH_OP_H

#include <stddef.h>

#include "graph/node.h"

typedef enum {
  NB_OPK_POINTWISE, /* one input, out[i] = f(in[i]) */
  NB_OPK_BINARY,    /* two (or three) inputs broadcast against each other */
  NB_OPK_REDUCE,    /* a reduction over a set of axes */
  NB_OPK_ROW,       /* an op along one axis or over rows: softmax, norms, cross-entropy */
  NB_OPK_CONTRACT,  /* matrix products, convolution, attention */
  NB_OPK_INDEX,     /* gather, scatter, index_select, embedding lookups */
  NB_OPK_VIEW,      /* an alias of input 0 with other shape or strides: no kernel */
  NB_OPK_OPAQUE,    /* anything else: copies, casts, pools, random, fused backward ops */
  NB_OPK_COUNT
} nb_op_kind;

/* The mixed-precision class: what an autocast region does with the op. */
typedef enum {
  NB_PREC_FOLLOW, /* runs in its inputs' dtype */
  NB_PREC_LOW,    /* contractions: run in the low dtype, accumulate in f32 */
  NB_PREC_F32,    /* statistics (norms, softmax, losses, reductions): compute in f32 */
  NB_PREC_WIDE,   /* kernels that read bf16/f16 and compute in f32 themselves: inputs
                   * taken as they come (no cast); the entry chooses its outputs'
                   * dtypes (a loss f32, a gradient in its input's dtype) */
} nb_prec_class;

/* A call: the op, its inputs (NULL entries for absent optional inputs) and
 * its parameter struct (the op's own type, op->psize bytes). */
typedef struct nb_op nb_op;
typedef struct {
  const nb_op *op;
  int n;
  const nb_tensor *const *in;
  const void *p;
} nb_op_call;

/* The output's metadata, as infer computes it. */
typedef struct {
  int ndim;
  int64_t shape[NB_MAX_DIMS];
  nb_dtype dtype;
  nb_device device;
} nb_meta;

#define NB_OP_MAX_IN 8
#define NB_OP_MAX_OUT 4

struct nb_op {
  const char *name;
  nb_op_kind kind;
  int n_in;           /* inputs; the last n_opt of them optional (NULL allowed) */
  int n_opt;
  int variadic;       /* any number >= n_in of inputs (cat, stack) */
  int n_out;          /* outputs (0 means 1): forward's out, then aux[0 .. n_out - 2] */
  const char *in_names[NB_OP_MAX_IN]; /* for messages: "x", "weight", ... */
  size_t psize;       /* sizeof the parameter struct (<= NB_OP_PARAMS_MAX) */
  nb_prec_class prec;
  const char *determinism; /* NULL: the same bits every run on every backend */
  /* Validates the call (dtypes, shapes, parameters, devices) and computes
   * the output's metadata; on failure sets the error naming the op. */
  nb_status (*infer)(const nb_op_call *c, nb_meta *out);
  /* Optional: replaces the inputs by the ones the kernel takes (contiguous
   * copies, casts), written with nabla ops so they are recorded too; the
   * node is recorded on the prepared inputs. in[] starts as the call's. */
  nb_status (*prepare)(const nb_op_call *c, const nb_tensor **in);
  /* Runs the kernels into out (allocated from the inferred metadata; not
   * called when out is empty unless always_forward). Creates the op's
   * further outputs in aux[0 .. n_out - 2], then up to NB_NODE_SAVED tensors
   * for the backward (statistics) in the aux slots after them; the caller
   * owns all of them. */
  nb_status (*forward)(const nb_op_call *c, nb_tensor *out, nb_tensor **aux);
  /* For views instead of allocate + forward: the output aliasing in[0]. */
  nb_tensor *(*view)(const nb_op_call *c, const nb_meta *out);
  int always_forward;
  /* Takes fp8 inputs (NB_F8E4M3, NB_F8E5M2: storage-only dtypes): casts,
   * clone, transfers and scaled_mm. Views take them too (kind VIEW); every
   * other op refuses them in nb_op_run with a message naming op and dtype. */
  int fp8;
  /* The backward rule (NULL: no gradient flows through the op). It reads
   * n->inputs, n->saved and nb_node_params(n). */
  nb_backward_fn backward;
  /* Bit i: the backward rule reads only input i's shape, dtype and history,
   * never its data, so the node keeps a data-less header of it and the
   * input's memory goes when nothing else holds it (0: keep every input). */
  unsigned meta_only_in;
  /* The node keeps its inputs; it also saves (detached) the output in
   * slot 0 when save_out, and forward's saved aux tensors in the slots
   * after (a NULL aux leaves its slot empty). */
  int save_out;
  /* Bytes moved and floating-point operations of a call (the profiler's
   * and the benchmark's roofline); NULL: inputs + output bytes, one flop per
   * output element. */
  void (*cost)(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops);
  /* The benchmark's call (nabla bench --ops): the inputs as an input spec
   * (see nb_op_spec below) at the size training uses on a GPU, and the
   * parameter struct. NULL: the op has no benchmark entry, and the bench
   * lists it as such. */
  const char *bench_in;
  const void *bench_p;
};

/* An input spec: comma-separated inputs, each a kind, ':' and a shape
 * ("16384x768"; empty for 0-d): r normal values, p positive (0.5 .. 2),
 * s positive statistics (f32, or f64 for f64 reals: saved mean/rstd),
 * i<k> int64 indices in [0, k), b bool, - an absent optional input.
 * "r:16384x768,r:768,r:768" is layer_norm's. */
typedef struct {
  char kind;
  int64_t bound;
  int nd;
  int64_t shape[NB_MAX_DIMS];
} nb_op_spec;

/* The eager path of every primitive: NULL inputs and devices checked, infer,
 * prepare, allocate (or view), forward, record. Returns the output
 * (autoreleased) or NULL with the error set. */
nb_tensor *nb_op_run(const nb_op *op, int n, const nb_tensor *const *in, const void *params);
/* The same for an op of several outputs: fills outs[0 .. n_out - 1]
 * (autoreleased; all NULL on failure) and returns the status. Each output
 * gets its own node. */
nb_status nb_op_run_outs(const nb_op *op, int n, const nb_tensor *const *in, const void *params,
                         nb_tensor **outs);
/* Records a node for op on out (already computed) when a gradient is
 * needed: a copy of the parameters, the output if save_out and the saved
 * tensors (NULL entries skipped). */
nb_node *nb_op_record(const nb_op_call *c, nb_tensor *out, nb_tensor *const *saved);
/* Bytes of a call's inputs read once and its (first) output written once. */
double nb_op_io_bytes(const nb_op_call *c, const nb_meta *out);
/* The cost of a call, with the default when the op has none. */
void nb_op_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops);
/* meta of a tensor */
void nb_meta_of(const nb_tensor *t, nb_meta *m);

/* The table (src/ops/op_table.c): every primitive, in op_list.h's order. */
extern const nb_op *const nb_op_table[];
extern const int nb_op_count;
const nb_op *nb_op_find(const char *name);
const char *nb_op_kind_name(nb_op_kind k);
/* Parses an input spec into spec[0 .. max-1]; returns the count, or -1
 * (error set) for a malformed spec. div > 1 divides every dimension and
 * bound above 64 by div (the CPU's smaller benchmark shapes; equal sizes
 * stay equal, so operands keep matching). */
int nb_op_spec_parse(const char *s, nb_op_spec *spec, int max, int div);
/* A new tensor for one input of a spec on dev, reals of dtype dt, values
 * from rng; NULL for an absent input ("-"). The caller owns it. */
nb_tensor *nb_op_spec_input(const nb_op_spec *spec, nb_rng *rng, nb_dtype dt, nb_device dev);
const char *nb_prec_class_name(nb_prec_class p);

#endif
