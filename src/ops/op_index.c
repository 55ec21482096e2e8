/* Indexing ops: index_select, gather, scatter_add (each one kernel), and
 * the compositions embedding and one_hot. Indices are i64 (i32 is cast);
 * a negative or out-of-range index is an error, found by the kernels. */
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

static int index_dtype_ok(const char *op, const nb_tensor *idx) {
  if (idx->dtype == NB_I64 || idx->dtype == NB_I32) return 1;
  char b[200];
  nb_error_set(NB_ERR_DTYPE, "%s: indices %s (expected i64 or i32)", op, nb_describe(idx, b, sizeof b));
  return 0;
}

/* Prefixes an index error raised by an inner op with the public op's name. */
static void rename_index_error(const char *op) {
  if (nb_last_status() != NB_ERR_INDEX) return;
  char msg[900];
  snprintf(msg, sizeof msg, "%s", nb_last_error());
  nb_error_set(NB_ERR_INDEX, "%s: %s", op, msg);
}

typedef struct {
  int axis; /* as given (may be negative) */
} index_params;

static int index_axis(const nb_op_call *c, int ndim) {
  return nb_norm_axis(c->op->name, ((const index_params *)c->p)->axis, ndim);
}

/* Common checks (inputs non-NULL and on one device, checked by nb_op_run):
 * index dtype, axis; returns the normalised axis or -1. x must have at
 * least one axis. */
static int index_args(const char *op, const nb_tensor *x, int axis, const nb_tensor *idx) {
  if (!index_dtype_ok(op, idx)) return -1;
  if (x->ndim == 0) {
    nb_error_set(NB_ERR_SHAPE, "%s: input is 0-d (expected at least one axis to index)", op);
    return -1;
  }
  return nb_norm_axis(op, axis, x->ndim);
}

/* The accumulating ops (scatter_add, index_select_backward): the bytes of
 * the inputs and the output, one addition per element of src. */
static void accumulate_cost(const nb_op_call *c, const nb_meta *out, const nb_tensor *src,
                            double *bytes, double *flops) {
  double b = (double)nb_shape_numel(out->ndim, out->shape) * (double)nb_dtype_size(out->dtype);
  for (int i = 0; i < c->n; i++) b += (double)nb_numel(c->in[i]) * (double)nb_dtype_size(c->in[i]->dtype);
  *bytes = b;
  *flops = (double)nb_numel(src);
}

/* ---- index_select -------------------------------------------------------- */
/* index_select_backward: zeros of the input's shape with dy added at idx
 * along axis (index_add). Inputs (dy, idx); its own backward is
 * index_select again. */
typedef struct {
  int axis; /* normalised */
  int ndim;
  int64_t shape[NB_MAX_DIMS]; /* the forward input's shape */
} index_add_params;

static nb_status index_add_infer(const nb_op_call *c, nb_meta *out) {
  const index_add_params *p = c->p;
  const nb_tensor *dy = c->in[0];
  out->ndim = p->ndim;
  memcpy(out->shape, p->shape, sizeof out->shape);
  out->dtype = dy->dtype;
  out->device = nb_device_of(dy);
  return NB_OK;
}

/* Runs even when out is empty, so that bad indices are reported. */
static nb_status index_add_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const index_add_params *p = c->p;
  const nb_tensor *src = c->in[0], *idx = c->in[1];
  const nb_backend *be = nb_backend_for(nb_device_of(out));
  nb_kview ko, ki, ks;
  nb_kview_of(out, &ko);
  nb_kview_of(idx, &ki);
  nb_kview_of(src, &ks);
  if (nb_numel(out) && be->fill(&ko, 0.0)) return nb_last_status();
  if (nb_numel(src) && be->index_add(&ko, p->axis, &ki, &ks, nb_deterministic())) return nb_last_status();
  return NB_OK;
}

static nb_status index_add_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const index_add_params *p = nb_node_params(n);
  gin[0] = nb_retain(nb_index_select(g, p->axis, n->inputs[1]));
  return gin[0] ? NB_OK : nb_last_status();
}

static void index_add_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  accumulate_cost(c, out, c->in[0], bytes, flops);
}

extern const nb_op nb_op_index_select_backward;

static nb_status index_select_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const index_params *ip = nb_node_params(n);
  const nb_tensor *x = n->inputs[0];
  index_add_params p = {nb_norm_axis(n->name, ip->axis, x->ndim), x->ndim, {0}};
  memcpy(p.shape, x->shape, sizeof p.shape);
  gin[0] = nb_retain(nb_op_run(&nb_op_index_select_backward, 2,
                               (const nb_tensor *const[]){g, n->inputs[1]}, &p));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status index_select_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *x = c->in[0], *idx = c->in[1];
  int a = index_args(c->op->name, x, ((const index_params *)c->p)->axis, idx);
  if (a < 0) return nb_last_status();
  if (idx->ndim > 1) {
    char b[200];
    return nb_error_set(NB_ERR_SHAPE, "index_select: indices %s (expected a 1-D or 0-d index tensor)",
                        nb_describe(idx, b, sizeof b));
  }
  nb_meta_of(x, out);
  out->shape[a] = nb_numel(idx);
  return NB_OK;
}

/* The kernels take 1-D i64 indices. */
static nb_status index_select_prepare(const nb_op_call *c, const nb_tensor **in) {
  int64_t len = nb_numel(c->in[1]);
  in[1] = nb_reshape(nb_cast(c->in[1], NB_I64), 1, &len);
  return in[1] ? NB_OK : nb_last_status();
}

/* Runs even when out is empty elsewhere, so that bad indices are reported. */
static nb_status index_select_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const nb_tensor *x = c->in[0], *idx = c->in[1];
  if (!nb_numel(idx)) return NB_OK;
  nb_kview ko, kx, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &kx);
  nb_kview_of(idx, &ki);
  return nb_backend_for(nb_device_of(x))->index_select(&ko, &kx, index_axis(c, x->ndim), &ki);
}

static const index_params index_bench = {0}, index_bench1 = {1};

const nb_op nb_op_index_select = {
    .name = "index_select", .kind = NB_OPK_INDEX, .n_in = 2, .in_names = {"x", "indices"},
    .psize = sizeof(index_params), .prec = NB_PREC_FOLLOW, .infer = index_select_infer,
    .prepare = index_select_prepare, .forward = index_select_forward, .always_forward = 1,
    .backward = index_select_bw, .bench_in = "r:50304x768,i50304:16384", .bench_p = &index_bench};

const nb_op nb_op_index_select_backward = {
    .name = "index_select_backward", .kind = NB_OPK_INDEX, .n_in = 2, .in_names = {"dy", "indices"},
    .psize = sizeof(index_add_params), .prec = NB_PREC_FOLLOW,
    .determinism = "CUDA: atomic accumulation unless nb_set_deterministic(1) (then the CPU's order)",
    .infer = index_add_infer, .forward = index_add_forward, .always_forward = 1,
    .backward = index_add_bw, .cost = index_add_cost};

nb_tensor *nb_index_select(const nb_tensor *x, int axis, const nb_tensor *indices) {
  index_params p = {axis};
  return nb_op_run(&nb_op_index_select, 2, (const nb_tensor *const[]){x, indices}, &p);
}

/* ---- gather / scatter_add ---------------------------------------------------- */
/* idx has x's rank and fits inside x on every axis but a. */
static int gather_shape_ok(const char *op, const nb_tensor *x, int a, const nb_tensor *idx,
                           const char *what) {
  int ok = idx->ndim == x->ndim;
  for (int d = 0; ok && d < x->ndim; d++) ok = d == a || idx->shape[d] <= x->shape[d];
  if (!ok) {
    char b1[200], b2[200];
    nb_error_set(NB_ERR_SHAPE, "%s: indices %s do not fit %s %s along axis %d (expected the same "
                 "number of axes, each no larger than the %s's except the indexed one)", op,
                 nb_describe(idx, b1, sizeof b1), what, nb_describe(x, b2, sizeof b2), a, what);
  }
  return ok;
}

/* gather's backward adds g back at the gathered positions. */
static nb_status gather_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const index_params *p = nb_node_params(n);
  const nb_tensor *x = n->inputs[0];
  nb_tensor *z = nb_zeros(x->ndim, x->shape, g->dtype, nb_device_of(x));
  gin[0] = nb_retain(nb_scatter_add(z, p->axis, n->inputs[1], g));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status gather_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *x = c->in[0], *idx = c->in[1];
  int a = index_args("gather", x, ((const index_params *)c->p)->axis, idx);
  if (a < 0 || !gather_shape_ok("gather", x, a, idx, "input")) return nb_last_status();
  nb_meta_of(idx, out);
  out->dtype = x->dtype;
  return NB_OK;
}

/* The kernels take i64 indices. */
static nb_status cast_indices_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[1] = nb_cast(c->in[1], NB_I64);
  return in[1] ? NB_OK : nb_last_status();
}

static nb_status gather_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const nb_tensor *x = c->in[0];
  nb_kview ko, kx, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &kx);
  nb_kview_of(c->in[1], &ki);
  return nb_backend_for(nb_device_of(x))->gather(&ko, &kx, index_axis(c, x->ndim), &ki);
}

const nb_op nb_op_gather = {
    .name = "gather", .kind = NB_OPK_INDEX, .n_in = 2, .in_names = {"x", "indices"},
    .psize = sizeof(index_params), .prec = NB_PREC_FOLLOW, .infer = gather_infer,
    .prepare = cast_indices_prepare, .forward = gather_forward, .backward = gather_bw,
    .bench_in = "r:16384x4096,i4096:16384x64", .bench_p = &index_bench1};

nb_tensor *nb_gather(const nb_tensor *x, int axis, const nb_tensor *indices) {
  index_params p = {axis};
  return nb_op_run(&nb_op_gather, 2, (const nb_tensor *const[]){x, indices}, &p);
}

/* d/dx = g; d/dsrc = g gathered at the scattered positions. */
static nb_status scatter_add_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const index_params *p = nb_node_params(n);
  if (nb_node_needs_grad(n, 0)) gin[0] = nb_retain(g);
  if (nb_node_needs_grad(n, 2)) {
    gin[2] = nb_retain(nb_gather(g, p->axis, n->inputs[1]));
    if (!gin[2]) return nb_last_status();
  }
  return NB_OK;
}

static int scatter_args_ok(const nb_tensor *x, int a, const nb_tensor *idx, const nb_tensor *src) {
  char b1[200], b2[200];
  if (idx->ndim != src->ndim || memcmp(idx->shape, src->shape, (size_t)idx->ndim * 8)) {
    nb_error_set(NB_ERR_SHAPE, "scatter_add: indices %s and src %s (expected the same shape)",
                 nb_describe(idx, b1, sizeof b1), nb_describe(src, b2, sizeof b2));
    return 0;
  }
  if (x->dtype == NB_BOOL || nb_dtype_is_float(x->dtype) != nb_dtype_is_float(src->dtype)) {
    nb_error_set(NB_ERR_DTYPE, "scatter_add: input %s and src %s (expected both float or both "
                 "integer, not bool)", nb_describe(x, b1, sizeof b1), nb_describe(src, b2, sizeof b2));
    return 0;
  }
  return gather_shape_ok("scatter_add", x, a, idx, "input");
}

static nb_status scatter_add_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *x = c->in[0], *idx = c->in[1];
  int a = index_args("scatter_add", x, ((const index_params *)c->p)->axis, idx);
  if (a < 0 || !scatter_args_ok(x, a, idx, c->in[2])) return nb_last_status();
  nb_meta_of(x, out);
  return NB_OK;
}

/* i64 indices, src in x's dtype. */
static nb_status scatter_add_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[1] = nb_cast(c->in[1], NB_I64);
  in[2] = nb_cast(c->in[2], c->in[0]->dtype);
  return in[1] && in[2] ? NB_OK : nb_last_status();
}

/* out = x, then src added at idx. Runs even when out is empty, so that bad
 * indices are reported. */
static nb_status scatter_add_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const nb_tensor *x = c->in[0], *idx = c->in[1];
  nb_kview ko, kx, ki, ks;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &kx);
  nb_kview_of(idx, &ki);
  nb_kview_of(c->in[2], &ks);
  const nb_backend *be = nb_backend_for(nb_device_of(x));
  if (nb_numel(out) && be->copy(&ko, &kx)) return nb_last_status();
  if (nb_numel(idx) && be->scatter_add(&ko, index_axis(c, x->ndim), &ki, &ks, nb_deterministic()))
    return nb_last_status();
  return NB_OK;
}

static void scatter_add_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  accumulate_cost(c, out, c->in[2], bytes, flops);
}

const nb_op nb_op_scatter_add = {
    .name = "scatter_add", .kind = NB_OPK_INDEX, .n_in = 3, .in_names = {"x", "indices", "src"},
    .psize = sizeof(index_params), .prec = NB_PREC_FOLLOW,
    .determinism = "CUDA: atomic accumulation unless nb_set_deterministic(1) (then the CPU's order)",
    .infer = scatter_add_infer, .prepare = scatter_add_prepare, .forward = scatter_add_forward,
    .always_forward = 1, .backward = scatter_add_bw, .cost = scatter_add_cost,
    .bench_in = "r:16384x4096,i4096:16384x64,r:16384x64", .bench_p = &index_bench1};

nb_tensor *nb_scatter_add(const nb_tensor *x, int axis, const nb_tensor *indices,
                          const nb_tensor *src) {
  index_params p = {axis};
  return nb_op_run(&nb_op_scatter_add, 3, (const nb_tensor *const[]){x, indices, src}, &p);
}

/* ---- embedding: rows of weight, shaped like the indices plus (D) ----------- */
nb_tensor *nb_embedding(const nb_tensor *weight, const nb_tensor *indices) {
  if (!weight) { nb_error_null("embedding", "weight"); return NULL; }
  if (!indices) { nb_error_null("embedding", "indices"); return NULL; }
  char b[200];
  if (weight->ndim != 2) {
    nb_error_set(NB_ERR_SHAPE, "embedding: weight %s (expected a 2-D table (V, D))",
                 nb_describe(weight, b, sizeof b));
    return NULL;
  }
  if (!index_dtype_ok("embedding", indices)) return NULL;
  if (nb_op_same_device("embedding", 2, (const nb_tensor *const[]){weight, indices})) return NULL;
  if (indices->ndim >= NB_MAX_DIMS) {
    nb_error_set(NB_ERR_SHAPE, "embedding: indices %s have too many axes (at most %d)",
                 nb_describe(indices, b, sizeof b), NB_MAX_DIMS - 1);
    return NULL;
  }
  int64_t n = nb_numel(indices), shape[NB_MAX_DIMS];
  memcpy(shape, indices->shape, (size_t)indices->ndim * sizeof shape[0]);
  shape[indices->ndim] = weight->shape[1];
  nb_scope_begin();
  nb_tensor *rows = nb_index_select(weight, 0, nb_reshape(indices, 1, &n));
  if (!rows) rename_index_error("embedding");
  nb_tensor *out = nb_keep(nb_reshape(rows, indices->ndim + 1, shape));
  nb_scope_end();
  return nb_autorelease(out);
}

/* ---- one_hot (i64, no gradient) ---------------------------------------------- */
/* Checks 0 <= indices < C on the host (a synchronisation, as in torch);
 * C < 0 takes max + 1. Returns the class count or -1. */
static int64_t one_hot_classes(const nb_tensor *idx, int64_t C) {
  if (!nb_numel(idx)) {
    if (C >= 0) return C;
    nb_error_set(NB_ERR_VALUE, "one_hot: cannot infer num_classes from empty indices");
    return -1;
  }
  double lo = nb_item(nb_min(idx, 0, NULL, 0)), hi = nb_item(nb_max(idx, 0, NULL, 0));
  if (lo != lo || hi != hi) return -1;
  if (C < 0) C = (int64_t)hi + 1;
  if (lo < 0 || hi >= (double)C) {
    nb_error_set(NB_ERR_INDEX, "one_hot: index %lld out of range for %lld classes (expected 0 <= "
                 "index < %lld)", (long long)(lo < 0 ? lo : hi), (long long)C, (long long)C);
    return -1;
  }
  return C;
}

nb_tensor *nb_one_hot(const nb_tensor *indices, int64_t num_classes) {
  if (!indices) { nb_error_null("one_hot", "indices"); return NULL; }
  if (!index_dtype_ok("one_hot", indices)) return NULL;
  if (num_classes < -1 || indices->ndim >= NB_MAX_DIMS) {
    nb_error_set(NB_ERR_VALUE, "one_hot: num_classes %lld with %d index axes (expected "
                 "num_classes >= 0, or -1 to infer, and fewer than %d axes)",
                 (long long)num_classes, indices->ndim, NB_MAX_DIMS);
    return NULL;
  }
  nb_scope_begin();
  int64_t C = one_hot_classes(indices, num_classes);
  nb_tensor *out = NULL;
  if (C >= 0) {
    nb_tensor *classes = nb_arange(0, (double)C, 1, NB_I64, nb_device_of(indices));
    out = nb_keep(nb_cast(nb_eq(nb_unsqueeze(indices, -1), classes), NB_I64));
  }
  nb_scope_end();
  return nb_autorelease(out);
}
