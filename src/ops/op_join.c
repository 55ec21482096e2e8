/* Joining and splitting: cat, stack (new tensors) and split, chunk (views). */
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

typedef struct {
  int axis; /* as given (may be negative) */
} cat_params;

/* Each input's gradient is its slice of g along the joined axis. */
static nb_status cat_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  int axis = nb_norm_axis("cat", ((const cat_params *)nb_node_params(n))->axis, g->ndim);
  if (axis < 0) return nb_last_status();
  int64_t off = 0;
  for (int i = 0; i < n->n_inputs; i++) {
    int64_t len = n->inputs[i]->shape[axis];
    if (nb_node_needs_grad(n, i)) {
      gin[i] = nb_retain(nb_narrow(g, axis, off, len));
      if (!gin[i]) return nb_last_status();
    }
    off += len;
  }
  return NB_OK;
}

/* The dtype the inputs are joined in. */
static nb_dtype cat_dtype(const nb_op_call *c) {
  nb_dtype dt = c->in[0]->dtype;
  for (int i = 1; i < c->n; i++) dt = nb_promote(dt, c->in[i]->dtype);
  return dt;
}

static nb_status cat_infer(const nb_op_call *c, nb_meta *out) {
  int axis = ((const cat_params *)c->p)->axis;
  const nb_tensor *t0 = c->in[0];
  if (t0->ndim == 0) return nb_error_set(NB_ERR_SHAPE, "cat: cannot join 0-d tensors (use stack)");
  int a = nb_norm_axis("cat", axis, t0->ndim);
  if (a < 0) return NB_ERR_AXIS;
  nb_meta_of(t0, out);
  for (int i = 1; i < c->n; i++) {
    const nb_tensor *t = c->in[i];
    int same = t->ndim == t0->ndim;
    for (int d = 0; same && d < t0->ndim; d++) same = d == a || t->shape[d] == t0->shape[d];
    if (!same) {
      char b1[200], b2[200];
      return nb_error_set(NB_ERR_SHAPE, "cat: tensor %d %s does not match tensor 0 %s outside axis %d",
                          i, nb_describe(t, b1, sizeof b1), nb_describe(t0, b2, sizeof b2), axis);
    }
    out->shape[a] += t->shape[a];
  }
  out->dtype = cat_dtype(c);
  return NB_OK;
}

/* The inputs in the joined dtype (the node is recorded on these). */
static nb_status cat_prepare(const nb_op_call *c, const nb_tensor **in) {
  nb_dtype dt = cat_dtype(c);
  for (int i = 0; i < c->n; i++)
    if (!(in[i] = nb_cast(c->in[i], dt))) return nb_last_status();
  return NB_OK;
}

/* Each input copied into its region of out along the axis. */
static nb_status cat_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  int a = nb_norm_axis("cat", ((const cat_params *)c->p)->axis, out->ndim);
  const nb_backend *be = nb_backend_for(nb_device_of(out));
  int64_t off = 0;
  for (int i = 0; i < c->n; i++) {
    const nb_tensor *t = c->in[i];
    if (nb_numel(t)) {
      nb_tensor *dst = nb_tensor_view_of(out, out->ndim, t->shape, out->strides,
                                         out->offset + off * out->strides[a]);
      if (!dst) return nb_last_status();
      nb_kview kd, ks;
      nb_kview_of(dst, &kd);
      nb_kview_of(t, &ks);
      nb_status st = be->copy(&kd, &ks);
      nb_release(dst);
      if (st) return st;
    }
    off += t->shape[a];
  }
  return NB_OK;
}

static const cat_params cat_bench = {-1};
const nb_op nb_op_cat = {
    .name = "cat", .kind = NB_OPK_OPAQUE, .n_in = 1, .variadic = 1, .in_names = {"ts[i]"},
    .psize = sizeof(cat_params), .prec = NB_PREC_FOLLOW, .infer = cat_infer,
    .prepare = cat_prepare, .forward = cat_forward, .backward = cat_bw,
    .bench_in = "r:16384x768,r:16384x768,r:16384x768", .bench_p = &cat_bench};

/* The checks of the arguments that come before the op's own (count, NULL
 * entries; devices are checked by nb_op_run with the same message). */
nb_tensor *nb_cat(int n, nb_tensor *const *ts, int axis) {
  if (n <= 0 || !ts) {
    nb_error_set(NB_ERR_VALUE, "cat: %d tensors given (expected at least one)", n);
    return NULL;
  }
  for (int i = 0; i < n; i++)
    if (!ts[i]) { nb_error_null("cat", "ts[i]"); return NULL; }
  cat_params p = {axis};
  return nb_op_run(&nb_op_cat, n, (const nb_tensor *const *)ts, &p);
}

nb_tensor *nb_stack(int n, nb_tensor *const *ts, int axis) {
  if (n <= 0 || !ts) {
    nb_error_set(NB_ERR_VALUE, "stack: %d tensors given (expected at least one)", n);
    return NULL;
  }
  for (int i = 0; i < n; i++)
    if (!ts[i]) { nb_error_null("stack", "ts[i]"); return NULL; }
  for (int i = 1; i < n; i++)
    if (ts[i]->ndim != ts[0]->ndim || memcmp(ts[i]->shape, ts[0]->shape, (size_t)ts[0]->ndim * 8)) {
      char b1[200], b2[200];
      nb_error_set(NB_ERR_SHAPE, "stack: tensor %d %s differs in shape from tensor 0 %s", i,
                   nb_describe(ts[i], b1, sizeof b1), nb_describe(ts[0], b2, sizeof b2));
      return NULL;
    }
  int a = nb_norm_axis("stack", axis, ts[0]->ndim + 1);
  if (a < 0) return NULL;
  nb_scope_begin();
  nb_tensor **us = calloc((size_t)n, sizeof *us);
  if (!us) {
    nb_error_set(NB_ERR_OOM, "stack: out of host memory for %d inputs", n);
    nb_scope_end();
    return NULL;
  }
  int ok = 1;
  for (int i = 0; i < n && ok; i++) ok = (us[i] = nb_unsqueeze(ts[i], a)) != NULL;
  nb_tensor *out = ok ? nb_keep(nb_cat(n, us, a)) : NULL;
  free(us);
  nb_scope_end();
  return nb_autorelease(out);
}

int nb_split(const nb_tensor *t, int64_t piece, int axis, nb_tensor **out, int max_out) {
  if (!t) return nb_error_null("split", "t");
  if (!out) return nb_error_null("split", "out");
  int a = nb_norm_axis("split", axis, t->ndim);
  if (a < 0) return NB_ERR_AXIS;
  if (t->ndim == 0 || piece <= 0)
    return nb_error_set(NB_ERR_VALUE, "split: piece size %lld (expected > 0, on a tensor with axes)",
                        (long long)piece);
  int64_t n = t->shape[a];
  int64_t count = n ? (n + piece - 1) / piece : 1;
  if (count > max_out)
    return nb_error_set(NB_ERR_VALUE, "split: %lld pieces do not fit in %d outputs", (long long)count, max_out);
  for (int64_t i = 0; i < count; i++) {
    int64_t len = n - i * piece < piece ? n - i * piece : piece;
    out[i] = nb_narrow(t, a, i * piece, len);
    if (!out[i]) return nb_last_status();
  }
  return (int)count;
}

int nb_chunk(const nb_tensor *t, int chunks, int axis, nb_tensor **out, int max_out) {
  if (!t) return nb_error_null("chunk", "t");
  int a = nb_norm_axis("chunk", axis, t->ndim);
  if (a < 0) return NB_ERR_AXIS;
  if (chunks <= 0 || t->ndim == 0)
    return nb_error_set(NB_ERR_VALUE, "chunk: %d chunks (expected > 0, on a tensor with axes)", chunks);
  int64_t n = t->shape[a], piece = (n + chunks - 1) / chunks;
  return nb_split(t, piece ? piece : 1, a, out, max_out);
}
