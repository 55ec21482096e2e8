/* Views: new shape and strides over the same storage, each with a backward
 * rule, plus contiguous/clone (the copies a view cannot avoid). */
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#define CHECK_NULL(op, t) \
  if (!(t)) { nb_error_null(op, #t); return NULL; }

static nb_tensor *make_view(const nb_tensor *t, int ndim, const int64_t *shape,
                            const int64_t *strides, int64_t offset) {
  return nb_tensor_view_of(t, ndim, shape, strides, offset);
}

/* A view moves no data and computes nothing. */
static void view_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  (void)c, (void)out;
  *bytes = 0;
  *flops = 0;
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

/* The requested rank and shape pointer, checked before the shape is read. */
static int dims_ok(const char *op, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > NB_MAX_DIMS || (ndim && !shape)) {
    nb_error_set(NB_ERR_SHAPE, "%s: %d dimensions requested (0..%d allowed)", op, ndim, NB_MAX_DIMS);
    return 0;
  }
  return 1;
}

/* Resolves a -1 and checks the element count. */
static int infer_shape(const char *op, const nb_tensor *t, int ndim, const int64_t *shape,
                       int64_t *out) {
  char b1[200], b2[200];
  if (!dims_ok(op, ndim, shape)) return -1;
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

typedef struct {
  int ndim;     /* as requested: one entry of shape may be -1 */
  int may_copy; /* nb_reshape copies when no view exists, nb_view fails */
  int64_t shape[NB_MAX_DIMS];
} reshape_params;

/* The public function a reshape call came from, for messages. */
static const char *reshape_api(const reshape_params *p) {
  return p->may_copy ? "nb_reshape" : "nb_view";
}

static nb_status reshape_infer(const nb_op_call *c, nb_meta *out) {
  const reshape_params *p = c->p;
  const nb_tensor *t = c->in[0];
  const char *op = reshape_api(p);
  int64_t st[NB_MAX_DIMS];
  if (infer_shape(op, t, p->ndim, p->shape, out->shape)) return nb_last_status();
  if (!p->may_copy && view_strides(t->ndim, t->shape, t->strides, p->ndim, out->shape, st)) {
    char b[200];
    return nb_error_set(NB_ERR_SHAPE, "%s: %s with strides %s cannot be viewed as %s without a "
                        "copy (use nb_reshape, or nb_contiguous first)", op,
                        nb_describe(t, b, sizeof b),
                        nb_shape_str(t->ndim, t->strides, (char[200]){0}, 200),
                        nb_shape_str(p->ndim, out->shape, (char[200]){0}, 200));
  }
  out->ndim = p->ndim;
  out->dtype = t->dtype;
  out->device = nb_device_of(t);
  return NB_OK;
}

/* nb_reshape of strides no view can express: a contiguous copy first (the
 * node is recorded on the copy, whose own node leads back to the input). */
static nb_status reshape_prepare(const nb_op_call *c, const nb_tensor **in) {
  const reshape_params *p = c->p;
  const nb_tensor *t = c->in[0];
  int64_t ns[NB_MAX_DIMS], st[NB_MAX_DIMS];
  if (infer_shape(reshape_api(p), t, p->ndim, p->shape, ns)) return nb_last_status();
  if (!view_strides(t->ndim, t->shape, t->strides, p->ndim, ns, st)) return NB_OK;
  in[0] = nb_contiguous(t);
  return in[0] ? NB_OK : nb_last_status();
}

static nb_tensor *reshape_view(const nb_op_call *c, const nb_meta *out) {
  const nb_tensor *t = c->in[0];
  int64_t st[NB_MAX_DIMS];
  if (view_strides(t->ndim, t->shape, t->strides, out->ndim, out->shape, st)) {
    nb_error_set(NB_ERR_SHAPE, "reshape: the prepared input has no view of the requested shape");
    return NULL;
  }
  return make_view(t, out->ndim, out->shape, st, t->offset);
}

static nb_status reshape_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0];
  gin[0] = nb_retain(nb_reshape(g, x->ndim, x->shape));
  return gin[0] ? NB_OK : nb_last_status();
}

/* The benchmark's calls of the views time the eager path's host work (a
 * view moves no data), at GPT-2 attention sizes. */
static const reshape_params reshape_bench = {2, 1, {-1, 64}};
const nb_op nb_op_reshape = {
    .name = "reshape", .kind = NB_OPK_VIEW, .n_in = 1, .in_names = {"t"},
    .psize = sizeof(reshape_params), .prec = NB_PREC_FOLLOW, .infer = reshape_infer,
    .prepare = reshape_prepare, .view = reshape_view, .backward = reshape_bw,
    .cost = view_cost, .bench_in = "r:16x1024x2304", .bench_p = &reshape_bench};

static nb_tensor *reshape_impl(int may_copy, const nb_tensor *t, int ndim, const int64_t *shape) {
  reshape_params p = {ndim, may_copy, {0}};
  CHECK_NULL(reshape_api(&p), t);
  if (!dims_ok(reshape_api(&p), ndim, shape)) return NULL;
  if (ndim) memcpy(p.shape, shape, (size_t)ndim * sizeof *shape);
  return nb_op_run(&nb_op_reshape, 1, (const nb_tensor *const[]){t}, &p);
}

nb_tensor *nb_reshape(const nb_tensor *t, int ndim, const int64_t *shape) {
  return reshape_impl(1, t, ndim, shape);
}
nb_tensor *nb_view(const nb_tensor *t, int ndim, const int64_t *shape) {
  return reshape_impl(0, t, ndim, shape);
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
typedef struct {
  int perm[NB_MAX_DIMS]; /* as given (entries may be negative) */
} permute_params;

static nb_status permute_infer(const nb_op_call *c, nb_meta *out) {
  const permute_params *p = c->p;
  const nb_tensor *t = c->in[0];
  int seen[NB_MAX_DIMS] = {0};
  for (int i = 0; i < t->ndim; i++) {
    int a = p->perm[i] < 0 ? p->perm[i] + t->ndim : p->perm[i];
    if (a < 0 || a >= t->ndim || seen[a]++)
      return nb_error_set(NB_ERR_AXIS, "nb_permute: entry %d (%d) of the permutation is out of "
                          "range or repeated for a tensor of %d dimensions", i, p->perm[i], t->ndim);
    out->shape[i] = t->shape[a];
  }
  out->ndim = t->ndim;
  out->dtype = t->dtype;
  out->device = nb_device_of(t);
  return NB_OK;
}

static nb_tensor *permute_view(const nb_op_call *c, const nb_meta *out) {
  const permute_params *p = c->p;
  const nb_tensor *t = c->in[0];
  int64_t st[NB_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) st[i] = t->strides[p->perm[i] < 0 ? p->perm[i] + t->ndim : p->perm[i]];
  return make_view(t, out->ndim, out->shape, st, t->offset);
}

static nb_status permute_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const permute_params *p = nb_node_params(n);
  int nd = n->inputs[0]->ndim, inv[NB_MAX_DIMS];
  for (int i = 0; i < nd; i++) inv[p->perm[i] < 0 ? p->perm[i] + nd : p->perm[i]] = i;
  gin[0] = nb_retain(nb_permute(g, inv));
  return gin[0] ? NB_OK : nb_last_status();
}

static const permute_params permute_bench = {{2, 0, 3, 1, 4}};
const nb_op nb_op_permute = {
    .name = "permute", .kind = NB_OPK_VIEW, .n_in = 1, .in_names = {"t"},
    .psize = sizeof(permute_params), .prec = NB_PREC_FOLLOW, .infer = permute_infer,
    .view = permute_view, .backward = permute_bw, .cost = view_cost,
    .bench_in = "r:16x1024x3x12x64", .bench_p = &permute_bench};

nb_tensor *nb_permute(const nb_tensor *t, const int *perm) {
  CHECK_NULL("nb_permute", t);
  if (t->ndim && !perm) { nb_error_null("nb_permute", "perm"); return NULL; }
  permute_params p = {{0}};
  if (t->ndim) memcpy(p.perm, perm, (size_t)t->ndim * sizeof *perm);
  return nb_op_run(&nb_op_permute, 1, (const nb_tensor *const[]){t}, &p);
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
typedef struct {
  int axis;                 /* as given (may be negative) */
  int64_t start, end, step; /* as given: negative start, end count from the end; clamped */
} slice_params;

/* slice_backward: the slice's parameters and the shape of the sliced input. */
typedef struct {
  slice_params s;
  int ndim;
  int64_t shape[NB_MAX_DIMS];
} slice_backward_params;

/* The elements a slice takes from an axis of size n: the first (clamped)
 * and how many. */
static void slice_range(const slice_params *p, int64_t n, int64_t *start, int64_t *len) {
  int64_t s = p->start, e = p->end;
  if (s < 0) s += n;
  if (e < 0) e += n;
  s = s < 0 ? 0 : s > n ? n : s;
  e = e < s ? s : e > n ? n : e;
  *start = s;
  *len = (e - s + p->step - 1) / p->step;
}

static nb_status slice_infer(const nb_op_call *c, nb_meta *out) {
  const slice_params *p = c->p;
  const nb_tensor *t = c->in[0];
  int a = nb_norm_axis("nb_slice", p->axis, t->ndim);
  if (a < 0) return nb_last_status();
  if (t->ndim == 0) return nb_error_set(NB_ERR_AXIS, "nb_slice: cannot slice a 0-d tensor");
  if (p->step <= 0)
    return nb_error_set(NB_ERR_VALUE, "nb_slice: step %lld (expected a positive step)",
                        (long long)p->step);
  int64_t start;
  nb_meta_of(t, out);
  slice_range(p, t->shape[a], &start, &out->shape[a]);
  return NB_OK;
}

static nb_tensor *slice_view(const nb_op_call *c, const nb_meta *out) {
  const nb_tensor *t = c->in[0];
  int a = nb_norm_axis("nb_slice", ((const slice_params *)c->p)->axis, t->ndim);
  int64_t start, len, st[NB_MAX_DIMS];
  slice_range(c->p, t->shape[a], &start, &len);
  memcpy(st, t->strides, sizeof st);
  st[a] = t->strides[a] * ((const slice_params *)c->p)->step;
  return make_view(t, t->ndim, out->shape, st, t->offset + (len ? start * t->strides[a] : 0));
}

extern const nb_op nb_op_slice_backward;

/* Gradient of a slice: zeros of the input's shape with g written into the
 * sliced region (slice_backward). */
static nb_status slice_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0];
  slice_backward_params p = {*(const slice_params *)nb_node_params(n), x->ndim, {0}};
  memcpy(p.shape, x->shape, sizeof p.shape);
  gin[0] = nb_retain(nb_op_run(&nb_op_slice_backward, 1, (const nb_tensor *const[]){g}, &p));
  return gin[0] ? NB_OK : nb_last_status();
}

static const slice_params slice_bench = {0, 0, 1, 1};
const nb_op nb_op_slice = {
    .name = "slice", .kind = NB_OPK_VIEW, .n_in = 1, .in_names = {"t"},
    .psize = sizeof(slice_params), .prec = NB_PREC_FOLLOW, .infer = slice_infer,
    .view = slice_view, .backward = slice_bw, .cost = view_cost,
    .bench_in = "r:3x16x12x1024x64", .bench_p = &slice_bench};

/* g must have the shape the slice of the recorded input shape has. */
static nb_status slice_backward_infer(const nb_op_call *c, nb_meta *out) {
  const slice_backward_params *p = c->p;
  const nb_tensor *g = c->in[0];
  int a = p->ndim > 0 && p->ndim <= NB_MAX_DIMS ? nb_norm_axis(c->op->name, p->s.axis, p->ndim) : -1;
  int ok = a >= 0 && p->s.step > 0 && g->ndim == p->ndim;
  int64_t start, len = 0;
  if (ok) slice_range(&p->s, p->shape[a], &start, &len);
  for (int i = 0; ok && i < p->ndim; i++) ok = g->shape[i] == (i == a ? len : p->shape[i]);
  if (!ok) {
    char b1[200], b2[200];
    return nb_error_set(NB_ERR_SHAPE, "%s: gradient %s is not the slice (axis %d, %lld:%lld:%lld) "
                        "of shape %s", c->op->name, nb_describe(g, b1, sizeof b1), p->s.axis,
                        (long long)p->s.start, (long long)p->s.end, (long long)p->s.step,
                        p->ndim >= 0 && p->ndim <= NB_MAX_DIMS
                            ? nb_shape_str(p->ndim, p->shape, b2, sizeof b2) : "?");
  }
  out->ndim = p->ndim;
  memcpy(out->shape, p->shape, sizeof out->shape);
  out->dtype = g->dtype;
  out->device = nb_device_of(g);
  return NB_OK;
}

/* Zeros, then g copied into the sliced region of them. */
static nb_status slice_backward_forward(const nb_op_call *c, nb_tensor *z, nb_tensor **aux) {
  (void)aux;
  const slice_backward_params *p = c->p;
  const nb_tensor *g = c->in[0];
  const nb_backend *be = nb_backend_for(nb_device_of(z));
  int a = nb_norm_axis(c->op->name, p->s.axis, p->ndim);
  int64_t start, len;
  slice_range(&p->s, p->shape[a], &start, &len);
  nb_kview kz;
  nb_kview_of(z, &kz);
  nb_status st = be->fill(&kz, 0.0);
  if (st || !nb_numel(g)) return st;
  nb_tensor *region = nb_tensor_view_of(z, z->ndim, z->shape, z->strides, z->offset + start * z->strides[a]);
  if (!region) return nb_last_status();
  region->shape[a] = len;
  region->strides[a] *= p->s.step;
  nb_kview kr, kg;
  nb_kview_of(region, &kr);
  nb_kview_of(g, &kg);
  st = be->copy(&kr, &kg);
  nb_release(region);
  return st;
}

/* Its gradient slices again, so it is differentiable. */
static nb_status slice_backward_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const slice_params *p = &((const slice_backward_params *)nb_node_params(n))->s;
  gin[0] = nb_retain(nb_slice(g, p->axis, p->start, p->end, p->step));
  return gin[0] ? NB_OK : nb_last_status();
}

const nb_op nb_op_slice_backward = {
    .name = "slice_backward", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"g"},
    .psize = sizeof(slice_backward_params), .prec = NB_PREC_FOLLOW,
    .infer = slice_backward_infer, .forward = slice_backward_forward,
    .backward = slice_backward_bw};

nb_tensor *nb_slice(const nb_tensor *t, int axis, int64_t start, int64_t end, int64_t step) {
  CHECK_NULL("nb_slice", t);
  slice_params p = {axis, start, end, step};
  return nb_op_run(&nb_op_slice, 1, (const nb_tensor *const[]){t}, &p);
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
typedef struct {
  int ndim;
  int broadcast_to; /* called as nb_broadcast_to (for messages) */
  int64_t shape[NB_MAX_DIMS]; /* as given: -1 keeps an axis of the input */
} expand_params;

static nb_tensor *expand_fail(const char *op, const nb_tensor *t, int ndim, const int64_t *shape) {
  char b1[200], b2[200];
  nb_error_set(NB_ERR_SHAPE, "%s: %s cannot be broadcast to %s", op, nb_describe(t, b1, sizeof b1),
               shape ? nb_shape_str(ndim, shape, b2, sizeof b2) : "NULL");
  return NULL;
}

static nb_status expand_infer(const nb_op_call *c, nb_meta *out) {
  const expand_params *p = c->p;
  const nb_tensor *t = c->in[0];
  int ndim = p->ndim;
  nb_kview kv;
  if (ndim < t->ndim || ndim > NB_MAX_DIMS) goto bad;
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - t->ndim);
    out->shape[i] = p->shape[i] == -1 && j >= 0 ? t->shape[j] : p->shape[i];
    if (out->shape[i] < 0) goto bad;
  }
  if (nb_kview_broadcast(t, ndim, out->shape, &kv)) goto bad;
  out->ndim = ndim;
  out->dtype = t->dtype;
  out->device = nb_device_of(t);
  return NB_OK;
bad:
  expand_fail(p->broadcast_to ? "nb_broadcast_to" : "nb_expand", t, ndim, p->shape);
  return nb_last_status();
}

static nb_tensor *expand_view(const nb_op_call *c, const nb_meta *out) {
  const nb_tensor *t = c->in[0];
  nb_kview kv;
  nb_kview_broadcast(t, out->ndim, out->shape, &kv);
  return make_view(t, out->ndim, out->shape, kv.strides, t->offset);
}

static nb_status expand_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0];
  gin[0] = nb_retain(nb_sum_to_shape(g, x->ndim, x->shape));
  return gin[0] ? NB_OK : nb_last_status();
}

static const expand_params expand_bench = {2, 0, {16384, -1}};
const nb_op nb_op_expand = {
    .name = "expand", .kind = NB_OPK_VIEW, .n_in = 1, .in_names = {"t"},
    .psize = sizeof(expand_params), .prec = NB_PREC_FOLLOW, .infer = expand_infer,
    .view = expand_view, .backward = expand_bw, .cost = view_cost, .bench_in = "r:1x768",
    .bench_p = &expand_bench};

/* expand under the public name `op`, so that errors name the call made. */
static nb_tensor *expand_as(int broadcast_to, const nb_tensor *t, int ndim, const int64_t *shape) {
  const char *op = broadcast_to ? "nb_broadcast_to" : "nb_expand";
  CHECK_NULL(op, t);
  if (ndim < 0 || ndim > NB_MAX_DIMS || (ndim && !shape)) return expand_fail(op, t, ndim, shape);
  expand_params p = {ndim, broadcast_to, {0}};
  if (ndim) memcpy(p.shape, shape, (size_t)ndim * sizeof *shape);
  return nb_op_run(&nb_op_expand, 1, (const nb_tensor *const[]){t}, &p);
}

nb_tensor *nb_expand(const nb_tensor *t, int ndim, const int64_t *shape) {
  return expand_as(0, t, ndim, shape);
}

nb_tensor *nb_broadcast_to(const nb_tensor *t, int ndim, const int64_t *shape) {
  return expand_as(1, t, ndim, shape);
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
static nb_status clone_infer(const nb_op_call *c, nb_meta *out) {
  nb_meta_of(c->in[0], out);
  return NB_OK;
}

static nb_status clone_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  nb_kview ko, ki;
  nb_kview_of(out, &ko);
  nb_kview_of(c->in[0], &ki);
  return nb_backend_for(nb_device_of(out))->copy(&ko, &ki);
}

static nb_status identity_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  (void)n;
  gin[0] = nb_retain(g);
  return NB_OK;
}

const nb_op nb_op_clone = {
    .name = "clone", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"t"},
    .prec = NB_PREC_FOLLOW, .infer = clone_infer, .forward = clone_forward,
    .backward = identity_bw, .meta_only_in = 1u, .fp8 = 1, .bench_in = "r:16777216"};

nb_tensor *nb_clone(const nb_tensor *t) {
  CHECK_NULL("nb_clone", t);
  return nb_op_run(&nb_op_clone, 1, (const nb_tensor *const[]){t}, NULL);
}

nb_tensor *nb_contiguous(const nb_tensor *t) {
  CHECK_NULL("nb_contiguous", t);
  if (nb_is_contiguous(t)) return nb_autorelease(nb_retain((nb_tensor *)t));
  return nb_clone(t);
}
