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

/* Common checks: non-NULL, index dtype, same device, axis; returns the
 * normalised axis or -1. x must have at least one axis. */
static int index_args(const char *op, const nb_tensor *x, int axis, const nb_tensor *idx) {
  if (!x) { nb_error_null(op, "x"); return -1; }
  if (!idx) { nb_error_null(op, "indices"); return -1; }
  if (!index_dtype_ok(op, idx)) return -1;
  if (nb_op_same_device(op, 2, (const nb_tensor *const[]){x, idx})) return -1;
  if (x->ndim == 0) {
    nb_error_set(NB_ERR_SHAPE, "%s: input is 0-d (expected at least one axis to index)", op);
    return -1;
  }
  return nb_norm_axis(op, axis, x->ndim);
}

/* ---- index_select -------------------------------------------------------- */
/* zeros(shape of like) with src added at idx along axis a: the backward of
 * index_select. Its own backward is index_select again. */
static nb_status index_add_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(nb_index_select(g, (int)n->ip[0], n->inputs[1]));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_tensor *index_add_zeros(const nb_tensor *like, int a, const nb_tensor *idx,
                                  const nb_tensor *src) {
  nb_device dev = nb_device_of(like);
  const nb_backend *be = nb_backend_for(dev);
  nb_tensor *out = nb_tensor_alloc(like->ndim, like->shape, src->dtype, dev);
  if (!out) return NULL;
  nb_kview ko, ki, ks;
  nb_kview_of(out, &ko);
  nb_kview_of(idx, &ki);
  nb_kview_of(src, &ks);
  if ((nb_numel(out) && be->fill(&ko, 0.0)) ||
      (nb_numel(src) && be->index_add(&ko, a, &ki, &ks, nb_deterministic()))) {
    nb_release(out);
    return NULL;
  }
  nb_node *n = nb_record("index_select_backward", index_add_bw, 2, (const nb_tensor *const[]){src, idx}, out);
  if (n) n->ip[0] = a;
  return nb_autorelease(out);
}

static nb_status index_select_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(index_add_zeros(n->inputs[0], (int)n->ip[0], n->inputs[1], g));
  return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_index_select(const nb_tensor *x, int axis, const nb_tensor *indices) {
  int a = index_args("index_select", x, axis, indices);
  if (a < 0) return NULL;
  if (indices->ndim > 1) {
    char b[200];
    nb_error_set(NB_ERR_SHAPE, "index_select: indices %s (expected a 1-D or 0-d index tensor)",
                 nb_describe(indices, b, sizeof b));
    return NULL;
  }
  nb_scope_begin();
  int64_t len = nb_numel(indices), shape[NB_MAX_DIMS];
  nb_tensor *idx = nb_reshape(nb_cast(indices, NB_I64), 1, &len);
  memcpy(shape, x->shape, sizeof shape);
  shape[a] = len;
  nb_tensor *out = idx ? nb_tensor_alloc(x->ndim, shape, x->dtype, nb_device_of(x)) : NULL;
  if (out && len) { /* run even when out is empty elsewhere, so bad indices are reported */
    nb_kview ko, kx, ki;
    nb_kview_of(out, &ko);
    nb_kview_of(x, &kx);
    nb_kview_of(idx, &ki);
    if (nb_backend_for(nb_device_of(x))->index_select(&ko, &kx, a, &ki)) {
      nb_release(out);
      out = NULL;
    }
  }
  nb_node *n = out ? nb_record("index_select", index_select_bw, 2, (const nb_tensor *const[]){x, idx}, out) : NULL;
  if (n) n->ip[0] = a;
  nb_scope_end();
  return nb_autorelease(out);
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
  const nb_tensor *x = n->inputs[0];
  nb_tensor *z = nb_zeros(x->ndim, x->shape, g->dtype, nb_device_of(x));
  gin[0] = nb_retain(nb_scatter_add(z, (int)n->ip[0], n->inputs[1], g));
  return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_gather(const nb_tensor *x, int axis, const nb_tensor *indices) {
  int a = index_args("gather", x, axis, indices);
  if (a < 0 || !gather_shape_ok("gather", x, a, indices, "input")) return NULL;
  nb_scope_begin();
  nb_tensor *idx = nb_cast(indices, NB_I64);
  nb_tensor *out = idx ? nb_tensor_alloc(idx->ndim, idx->shape, x->dtype, nb_device_of(x)) : NULL;
  if (out && nb_numel(out)) {
    nb_kview ko, kx, ki;
    nb_kview_of(out, &ko);
    nb_kview_of(x, &kx);
    nb_kview_of(idx, &ki);
    if (nb_backend_for(nb_device_of(x))->gather(&ko, &kx, a, &ki)) {
      nb_release(out);
      out = NULL;
    }
  }
  nb_node *n = out ? nb_record("gather", gather_bw, 2, (const nb_tensor *const[]){x, idx}, out) : NULL;
  if (n) n->ip[0] = a;
  nb_scope_end();
  return nb_autorelease(out);
}

/* d/dx = g; d/dsrc = g gathered at the scattered positions. */
static nb_status scatter_add_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  if (nb_node_needs_grad(n, 0)) gin[0] = nb_retain(g);
  if (nb_node_needs_grad(n, 2)) {
    gin[2] = nb_retain(nb_gather(g, (int)n->ip[0], n->inputs[1]));
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

nb_tensor *nb_scatter_add(const nb_tensor *x, int axis, const nb_tensor *indices,
                          const nb_tensor *src) {
  int a = index_args("scatter_add", x, axis, indices);
  if (a < 0) return NULL;
  if (!src) { nb_error_null("scatter_add", "src"); return NULL; }
  if (nb_op_same_device("scatter_add", 2, (const nb_tensor *const[]){x, src})) return NULL;
  if (!scatter_args_ok(x, a, indices, src)) return NULL;
  nb_scope_begin();
  nb_tensor *idx = nb_cast(indices, NB_I64), *s = nb_cast(src, x->dtype);
  nb_tensor *out = idx && s ? nb_tensor_alloc(x->ndim, x->shape, x->dtype, nb_device_of(x)) : NULL;
  if (out) {
    nb_kview ko, kx, ki, ks;
    nb_kview_of(out, &ko);
    nb_kview_of(x, &kx);
    nb_kview_of(idx, &ki);
    nb_kview_of(s, &ks);
    const nb_backend *be = nb_backend_for(nb_device_of(x));
    if ((nb_numel(out) && be->copy(&ko, &kx)) ||
        (nb_numel(idx) && be->scatter_add(&ko, a, &ki, &ks, nb_deterministic()))) {
      nb_release(out);
      out = NULL;
    }
  }
  nb_node *n = out ? nb_record("scatter_add", scatter_add_bw, 3, (const nb_tensor *const[]){x, idx, s}, out) : NULL;
  if (n) n->ip[0] = a;
  nb_scope_end();
  return nb_autorelease(out);
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
