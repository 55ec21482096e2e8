/* Views: new shape and strides over the same storage, each with a backward
 * rule, plus contiguous/clone (the copies a view cannot avoid). */
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "backend/backend.h"
#include "core/core.h"

#define CHECK_NULL(op, t) \
  if (!(t)) { nb_error_null(op, #t); return NULL; }

static nb_tensor *make_view(const nb_tensor *t, int ndim, const int64_t *shape,
                            const int64_t *strides, int64_t offset) {
  return nb_tensor_view_of(t, ndim, shape, strides, offset);
}

/* ---- reshape -------------------------------------------------------------- */
/* Strides for viewing (ond, oshape, ostr) as (nnd, nshape) without a copy:
 * groups of old axes that are contiguous with each other may be split or
 * merged freely. Returns 0 on success, -1 if a copy is needed. */
static int view_strides(int ond, const int64_t *oshape, const int64_t *ostr, int nnd,
                        const int64_t *nshape, int64_t *nstr) {
  if (nb_shape_numel(ond, oshape) == 0 || ond == 0) {
    nb_contiguous_strides(nnd, nshape, nstr);
    return 0;
  }
  int vd = nnd - 1;
  int64_t base = ostr[ond - 1], tnum = 1, vnum = 1;
  for (int td = ond - 1; td >= 0; td--) {
    tnum *= oshape[td];
    if (td == 0 || (oshape[td - 1] != 1 && ostr[td - 1] != tnum * base)) {
      while (vd >= 0 && (vnum < tnum || nshape[vd] == 1)) {
        nstr[vd] = vnum * base;
        vnum *= nshape[vd];
        vd--;
      }
      if (vnum != tnum) return -1;
      if (td > 0) {
        base = ostr[td - 1];
        tnum = 1;
        vnum = 1;
      }
    }
  }
  return vd == -1 ? 0 : -1;
}

/* Resolves a -1 and checks the element count. */
static int infer_shape(const char *op, const nb_tensor *t, int ndim, const int64_t *shape,
                       int64_t *out) {
  char b1[200], b2[200];
  if (ndim < 0 || ndim > NB_MAX_DIMS || (ndim && !shape)) {
    nb_error_set(NB_ERR_SHAPE, "%s: %d dimensions requested (0..%d allowed)", op, ndim, NB_MAX_DIMS);
    return -1;
  }
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    out[i] = shape[i];
    if (shape[i] == -1 && infer < 0) infer = i;
    else if (shape[i] < 0) goto bad;
    else known *= shape[i];
  }
  int64_t n = nb_numel(t);
  if (infer >= 0) {
    if (known == 0 || n % known) goto bad;
    out[infer] = n / known;
  } else if (known != n) goto bad;
  return 0;
bad:
  nb_error_set(NB_ERR_SHAPE, "%s: cannot view %s as shape %s (%lld elements)", op,
               nb_describe(t, b1, sizeof b1), nb_shape_str(ndim, shape, b2, sizeof b2),
               (long long)nb_numel(t));
  return -1;
}

static nb_status reshape_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0];
  gin[0] = nb_retain(nb_reshape(g, x->ndim, x->shape));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_tensor *reshape_impl(const char *op, const nb_tensor *t, int ndim, const int64_t *shape,
                               int may_copy) {
  CHECK_NULL(op, t);
  int64_t ns[NB_MAX_DIMS], st[NB_MAX_DIMS];
  if (infer_shape(op, t, ndim, shape, ns)) return NULL;
  nb_tensor *out;
  if (!view_strides(t->ndim, t->shape, t->strides, ndim, ns, st)) {
    out = make_view(t, ndim, ns, st, t->offset);
  } else {
    char b[200];
    if (!may_copy) {
      nb_error_set(NB_ERR_SHAPE, "%s: %s with strides %s cannot be viewed as %s without a copy "
                   "(use nb_reshape, or nb_contiguous first)", op, nb_describe(t, b, sizeof b),
                   nb_shape_str(t->ndim, t->strides, (char[200]){0}, 200),
                   nb_shape_str(ndim, ns, (char[200]){0}, 200));
      return NULL;
    }
    nb_scope_begin();
    nb_tensor *c = nb_contiguous(t);
    out = c ? make_view(c, ndim, ns, (nb_contiguous_strides(ndim, ns, st), st), c->offset) : NULL;
    nb_scope_end();
  }
  if (out) nb_record("reshape", reshape_bw, 1, (const nb_tensor *const[]){t}, out);
  return nb_autorelease(out);
}

nb_tensor *nb_reshape(const nb_tensor *t, int ndim, const int64_t *shape) {
  return reshape_impl("nb_reshape", t, ndim, shape, 1);
}
nb_tensor *nb_view(const nb_tensor *t, int ndim, const int64_t *shape) {
  return reshape_impl("nb_view", t, ndim, shape, 0);
}

nb_tensor *nb_flatten(const nb_tensor *t, int start, int end) {
  CHECK_NULL("nb_flatten", t);
  if (t->ndim == 0) return nb_reshape(t, 1, (int64_t[]){1});
  int s = nb_norm_axis("nb_flatten", start, t->ndim), e = nb_norm_axis("nb_flatten", end, t->ndim);
  if (s < 0 || e < 0) return NULL;
  if (s > e) {
    nb_error_set(NB_ERR_AXIS, "nb_flatten: start axis %d is after end axis %d", start, end);
    return NULL;
  }
  int64_t shape[NB_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < s; i++) shape[k++] = t->shape[i];
  shape[k] = 1;
  for (int i = s; i <= e; i++) shape[k] *= t->shape[i];
  k++;
  for (int i = e + 1; i < t->ndim; i++) shape[k++] = t->shape[i];
  return nb_reshape(t, k, shape);
}

/* ---- permute / transpose ------------------------------------------------------ */
static nb_status permute_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  int inv[NB_MAX_DIMS];
  for (int i = 0; i < n->out_ndim; i++) inv[n->ip[i]] = i;
  gin[0] = nb_retain(nb_permute(g, inv));
  return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_permute(const nb_tensor *t, const int *perm) {
  CHECK_NULL("nb_permute", t);
  if (t->ndim && !perm) { nb_error_null("nb_permute", "perm"); return NULL; }
  int seen[NB_MAX_DIMS] = {0};
  int64_t shape[NB_MAX_DIMS], st[NB_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) {
    int p = perm[i] < 0 ? perm[i] + t->ndim : perm[i];
    if (p < 0 || p >= t->ndim || seen[p]++) {
      nb_error_set(NB_ERR_AXIS, "nb_permute: entry %d (%d) of the permutation is out of range or "
                   "repeated for a tensor of %d dimensions", i, perm[i], t->ndim);
      return NULL;
    }
    shape[i] = t->shape[p];
    st[i] = t->strides[p];
  }
  nb_tensor *out = make_view(t, t->ndim, shape, st, t->offset);
  nb_node *n = out ? nb_record("permute", permute_bw, 1, (const nb_tensor *const[]){t}, out) : NULL;
  if (n)
    for (int i = 0; i < t->ndim; i++) n->ip[i] = perm[i] < 0 ? perm[i] + t->ndim : perm[i];
  return nb_autorelease(out);
}

nb_tensor *nb_transpose(const nb_tensor *t, int a, int b) {
  CHECK_NULL("nb_transpose", t);
  int ia = nb_norm_axis("nb_transpose", a, t->ndim), ib = nb_norm_axis("nb_transpose", b, t->ndim);
  if (ia < 0 || ib < 0) return NULL;
  if (t->ndim == 0) return nb_autorelease(nb_retain((nb_tensor *)t));
  int perm[NB_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) perm[i] = i;
  perm[ia] = ib;
  perm[ib] = ia;
  return nb_permute(t, perm);
}

/* ---- slicing ---------------------------------------------------------------- */
/* Gradient of a slice: zeros of the input's shape with g written into the
 * sliced region. Its own backward slices again, so it is differentiable. */
static nb_status slice_scatter_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(nb_slice(g, (int)n->ip[0], n->ip[1], n->ip[2], n->ip[3]));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_tensor *slice_scatter(const nb_tensor *g, const nb_node *fwd) {
  nb_tensor *z = nb_tensor_alloc(fwd->ip[4], (const int64_t *)&fwd->ip[5], g->dtype, nb_device_of(g));
  if (!z) return NULL;
  nb_kview kz;
  nb_kview_of(z, &kz);
  const nb_backend *be = nb_backend_for(nb_device_of(z));
  nb_status st = nb_numel(z) ? be->fill(&kz, 0.0) : NB_OK;
  int axis = (int)fwd->ip[0];
  int64_t start = fwd->ip[1], step = fwd->ip[3];
  if (!st) {
    nb_tensor *region = nb_tensor_view_of(z, z->ndim, z->shape, z->strides, z->offset + start * z->strides[axis]);
    region->shape[axis] = g->shape[axis];
    region->strides[axis] *= step;
    nb_kview kr, kg;
    nb_kview_of(region, &kr);
    nb_kview_of(g, &kg);
    st = nb_numel(region) ? be->copy(&kr, &kg) : NB_OK;
    nb_release(region);
  }
  if (st) { nb_release(z); return NULL; }
  nb_node *n = nb_record("slice_backward", slice_scatter_bw, 1, (const nb_tensor *const[]){g}, z);
  if (n) memcpy(n->ip, fwd->ip, 4 * sizeof n->ip[0]);
  return nb_autorelease(z);
}

static nb_status slice_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(slice_scatter(g, n));
  return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_slice(const nb_tensor *t, int axis, int64_t start, int64_t end, int64_t step) {
  CHECK_NULL("nb_slice", t);
  int a = nb_norm_axis("nb_slice", axis, t->ndim);
  if (a < 0) return NULL;
  if (t->ndim == 0) {
    nb_error_set(NB_ERR_AXIS, "nb_slice: cannot slice a 0-d tensor");
    return NULL;
  }
  if (step <= 0) {
    nb_error_set(NB_ERR_VALUE, "nb_slice: step %lld (expected a positive step)", (long long)step);
    return NULL;
  }
  int64_t n = t->shape[a];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = start < 0 ? 0 : start > n ? n : start;
  end = end < start ? start : end > n ? n : end;
  int64_t len = (end - start + step - 1) / step;
  int64_t shape[NB_MAX_DIMS], st[NB_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  memcpy(st, t->strides, sizeof st);
  shape[a] = len;
  st[a] = t->strides[a] * step;
  nb_tensor *out = make_view(t, t->ndim, shape, st, t->offset + (len ? start * t->strides[a] : 0));
  nb_node *nd = out ? nb_record("slice", slice_bw, 1, (const nb_tensor *const[]){t}, out) : NULL;
  if (nd) {
    nd->ip[0] = a; nd->ip[1] = start; nd->ip[2] = end; nd->ip[3] = step;
    nd->ip[4] = t->ndim;
    memcpy(&nd->ip[5], t->shape, (size_t)t->ndim * sizeof t->shape[0]);
  }
  return nb_autorelease(out);
}

nb_tensor *nb_narrow(const nb_tensor *t, int axis, int64_t start, int64_t length) {
  CHECK_NULL("nb_narrow", t);
  int a = nb_norm_axis("nb_narrow", axis, t->ndim);
  if (a < 0) return NULL;
  int64_t n = t->ndim ? t->shape[a] : 0;
  if (start < 0) start += n;
  if (start < 0 || length < 0 || start + length > n) {
    nb_error_set(NB_ERR_INDEX, "nb_narrow: start %lld length %lld exceeds axis %d of size %lld",
                 (long long)start, (long long)length, axis, (long long)n);
    return NULL;
  }
  return nb_slice(t, a, start, start + length, 1);
}

nb_tensor *nb_select(const nb_tensor *t, int axis, int64_t index) {
  CHECK_NULL("nb_select", t);
  int a = nb_norm_axis("nb_select", axis, t->ndim);
  if (a < 0) return NULL;
  int64_t n = t->ndim ? t->shape[a] : 0;
  if (index < -n || index >= n) {
    nb_error_set(NB_ERR_INDEX, "nb_select: index %lld out of range for axis %d of size %lld",
                 (long long)index, axis, (long long)n);
    return NULL;
  }
  if (index < 0) index += n;
  nb_scope_begin();
  nb_tensor *s = nb_slice(t, a, index, index + 1, 1);
  nb_tensor *out = s ? nb_keep(nb_squeeze(s, a)) : NULL;
  nb_scope_end();
  return nb_autorelease(out);
}

/* ---- expand / squeeze / unsqueeze ------------------------------------------------ */
static nb_status expand_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0];
  gin[0] = nb_retain(nb_sum_to_shape(g, x->ndim, x->shape));
  return gin[0] ? NB_OK : nb_last_status();
}

/* expand under the public name `op`, so that errors name the call made. */
static nb_tensor *expand_as(const char *op, const nb_tensor *t, int ndim, const int64_t *shape) {
  CHECK_NULL(op, t);
  if (ndim < t->ndim || ndim > NB_MAX_DIMS || (ndim && !shape)) goto bad;
  int64_t sh[NB_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - t->ndim);
    sh[i] = shape[i] == -1 && j >= 0 ? t->shape[j] : shape[i];
    if (sh[i] < 0) goto bad;
  }
  nb_kview kv;
  if (nb_kview_broadcast(t, ndim, sh, &kv)) goto bad;
  nb_tensor *out = make_view(t, ndim, sh, kv.strides, t->offset);
  if (out) nb_record("expand", expand_bw, 1, (const nb_tensor *const[]){t}, out);
  return nb_autorelease(out);
bad:;
  char b1[200], b2[200];
  nb_error_set(NB_ERR_SHAPE, "%s: %s cannot be broadcast to %s", op, nb_describe(t, b1, sizeof b1),
               shape ? nb_shape_str(ndim, shape, b2, sizeof b2) : "NULL");
  return NULL;
}

nb_tensor *nb_expand(const nb_tensor *t, int ndim, const int64_t *shape) {
  return expand_as("nb_expand", t, ndim, shape);
}

nb_tensor *nb_broadcast_to(const nb_tensor *t, int ndim, const int64_t *shape) {
  return expand_as("nb_broadcast_to", t, ndim, shape);
}

nb_tensor *nb_squeeze(const nb_tensor *t, int axis) {
  CHECK_NULL("nb_squeeze", t);
  int a = nb_norm_axis("nb_squeeze", axis, t->ndim);
  if (a < 0) return NULL;
  if (t->ndim == 0) return nb_autorelease(nb_retain((nb_tensor *)t));
  if (t->shape[a] != 1) {
    char b[200];
    nb_error_set(NB_ERR_SHAPE, "nb_squeeze: axis %d of %s has size %lld (expected 1)", axis,
                 nb_describe(t, b, sizeof b), (long long)t->shape[a]);
    return NULL;
  }
  int64_t sh[NB_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < t->ndim; i++)
    if (i != a) sh[k++] = t->shape[i];
  return nb_reshape(t, k, sh);
}

nb_tensor *nb_squeeze_all(const nb_tensor *t) {
  CHECK_NULL("nb_squeeze_all", t);
  int64_t sh[NB_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != 1) sh[k++] = t->shape[i];
  return nb_reshape(t, k, sh);
}

nb_tensor *nb_unsqueeze(const nb_tensor *t, int axis) {
  CHECK_NULL("nb_unsqueeze", t);
  int a = nb_norm_axis("nb_unsqueeze", axis, t->ndim + 1);
  if (a < 0) return NULL;
  if (t->ndim >= NB_MAX_DIMS) {
    nb_error_set(NB_ERR_SHAPE, "nb_unsqueeze: tensor already has %d dimensions", NB_MAX_DIMS);
    return NULL;
  }
  int64_t sh[NB_MAX_DIMS];
  for (int i = 0, k = 0; i <= t->ndim; i++) sh[i] = i == a ? 1 : t->shape[k++];
  return nb_reshape(t, t->ndim + 1, sh);
}

int nb_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int ia = i - (n - na), ib = i - (n - nb);
    int64_t x = ia >= 0 ? a[ia] : 1, y = ib >= 0 ? b[ib] : 1;
    if (x != y && x != 1 && y != 1) return -1;
    out[i] = x == 1 ? y : x;
  }
  return n;
}

/* ---- copies ------------------------------------------------------------------- */
static nb_status identity_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(g);
  return NB_OK;
}

nb_tensor *nb_clone(const nb_tensor *t) {
  CHECK_NULL("nb_clone", t);
  nb_tensor *out = nb_tensor_alloc(t->ndim, t->shape, t->dtype, nb_device_of(t));
  if (!out) return NULL;
  nb_kview ko, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(t, &ki);
  if (nb_numel(t) && nb_backend_for(nb_device_of(t))->copy(&ko, &ki)) {
    nb_release(out);
    return NULL;
  }
  nb_record("clone", identity_bw, 1, (const nb_tensor *const[]){t}, out);
  return nb_autorelease(out);
}

nb_tensor *nb_contiguous(const nb_tensor *t) {
  CHECK_NULL("nb_contiguous", t);
  if (nb_is_contiguous(t)) return nb_autorelease(nb_retain((nb_tensor *)t));
  return nb_clone(t);
}
