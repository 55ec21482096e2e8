/* Joining and splitting: cat, stack (new tensors) and split, chunk (views). */
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

/* Each input's gradient is its slice of g along the joined axis. */
static nb_status cat_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  int axis = (int)n->ip[0];
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

static nb_status cat_check(int n, nb_tensor *const *ts, int axis, int *a, nb_dtype *dt) {
  if (n <= 0 || !ts) return nb_error_set(NB_ERR_VALUE, "cat: %d tensors given (expected at least one)", n);
  for (int i = 0; i < n; i++)
    if (!ts[i]) return nb_error_null("cat", "ts[i]");
  if (nb_op_same_device("cat", n, (const nb_tensor *const *)ts)) return NB_ERR_DEVICE;
  const nb_tensor *t0 = ts[0];
  if (t0->ndim == 0) return nb_error_set(NB_ERR_SHAPE, "cat: cannot join 0-d tensors (use stack)");
  *a = nb_norm_axis("cat", axis, t0->ndim);
  if (*a < 0) return NB_ERR_AXIS;
  *dt = t0->dtype;
  for (int i = 1; i < n; i++) {
    *dt = nb_promote(*dt, ts[i]->dtype);
    int same = ts[i]->ndim == t0->ndim;
    for (int d = 0; same && d < t0->ndim; d++) same = d == *a || ts[i]->shape[d] == t0->shape[d];
    if (!same) {
      char b1[200], b2[200];
      return nb_error_set(NB_ERR_SHAPE, "cat: tensor %d %s does not match tensor 0 %s outside axis %d",
                          i, nb_describe(ts[i], b1, sizeof b1), nb_describe(t0, b2, sizeof b2), axis);
    }
  }
  return NB_OK;
}

nb_tensor *nb_cat(int n, nb_tensor *const *ts, int axis) {
  int a = 0;
  nb_dtype dt = NB_F32;
  if (cat_check(n, ts, axis, &a, &dt)) return NULL;
  int64_t shape[NB_MAX_DIMS];
  memcpy(shape, ts[0]->shape, sizeof shape);
  shape[a] = 0;
  for (int i = 0; i < n; i++) shape[a] += ts[i]->shape[a];
  nb_scope_begin();
  nb_tensor *out = nb_tensor_alloc(ts[0]->ndim, shape, dt, nb_device_of(ts[0]));
  const nb_tensor **cs = calloc((size_t)n, sizeof *cs);
  if (!cs) {
    nb_error_set(NB_ERR_OOM, "cat: out of host memory for %d inputs", n);
    nb_scope_end();
    return NULL;
  }
  int64_t off = 0;
  for (int i = 0; i < n && out; i++) {
    cs[i] = nb_cast(ts[i], dt);
    nb_tensor *dst = cs[i] ? nb_tensor_view_of(out, out->ndim, ts[i]->shape, out->strides,
                                               out->offset + off * out->strides[a]) : NULL;
    nb_kview kd, ks;
    if (dst && nb_numel(dst)) {
      nb_kview_of(dst, &kd);
      nb_kview_of(cs[i], &ks);
      if (nb_backend_for(nb_device_of(out))->copy(&kd, &ks)) { nb_release(dst); dst = NULL; }
    }
    if (!dst) { nb_release(out); out = NULL; }
    nb_release(dst);
    off += ts[i]->shape[a];
  }
  nb_node *nd = out ? nb_record("cat", cat_bw, n, cs, out) : NULL;
  if (nd) nd->ip[0] = a;
  free(cs);
  nb_scope_end();
  return nb_autorelease(out);
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
