/* Creation, host transfer, device transfer, in-place fill/copy, RNG draws:
 * the ops that fill new storage through a kernel (core allocates it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

/* Ops with no inputs: the output's shape, dtype and device are parameters.
 * nb_op_run takes a non-NULL array even of no inputs. */
static const nb_tensor *const no_inputs[1] = {NULL};

/* The output of a creation op as requested; the allocation checks the rank,
 * dtype, sizes and device (with its messages). */
static void meta_new(nb_meta *m, int ndim, const int64_t *shape, nb_dtype dt, nb_device dev) {
  m->ndim = ndim;
  memset(m->shape, 0, sizeof m->shape);
  if (ndim > 0 && ndim <= NB_MAX_DIMS) memcpy(m->shape, shape, (size_t)ndim * sizeof *shape);
  m->dtype = dt;
  m->device = dev;
}

/* A shape parameter: the requested rank, its sizes (up to NB_MAX_DIMS). */
static void shape_copy(int64_t *dst, int ndim, const int64_t *shape) {
  if (ndim > 0 && shape) memcpy(dst, shape, (size_t)(ndim < NB_MAX_DIMS ? ndim : NB_MAX_DIMS) * sizeof *shape);
}

/* ---- fills ---------------------------------------------------------------- */
typedef struct {
  int ndim;
  int64_t shape[NB_MAX_DIMS];
  double value;
  nb_dtype dtype;
  nb_device device;
} full_params;

static nb_status full_infer(const nb_op_call *c, nb_meta *out) {
  const full_params *p = c->p;
  meta_new(out, p->ndim, p->shape, p->dtype, p->device);
  return NB_OK;
}

/* Also marks the storage as holding one value (the loss's seed gradient
 * and the optimizers read the mark), empty outputs included. */
static nb_status full_forward(const nb_op_call *c, nb_tensor *t, nb_tensor **aux) {
  (void)aux;
  const full_params *p = c->p;
  nb_kview kv;
  nb_kview_of(t, &kv);
  if (nb_numel(t) && nb_backend_for(p->device)->fill(&kv, p->value)) return nb_last_status();
  t->storage->filled = 1;
  t->storage->fill_value = p->value;
  return NB_OK;
}

const nb_op nb_op_full = {
    .name = "full", .kind = NB_OPK_OPAQUE, .psize = sizeof(full_params), .prec = NB_PREC_FOLLOW,
    .infer = full_infer, .forward = full_forward, .always_forward = 1};

static nb_tensor *fill_new(const char *op, int ndim, const int64_t *shape, double v, nb_dtype dt,
                           nb_device dev) {
  if (ndim && !shape) { nb_error_null(op, "shape"); return NULL; }
  full_params p = {ndim, {0}, v, dt, dev};
  shape_copy(p.shape, ndim, shape);
  return nb_op_run(&nb_op_full, 0, no_inputs, &p);
}

nb_tensor *nb_empty(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev) {
  if (ndim && !shape) { nb_error_null("nb_empty", "shape"); return NULL; }
  return nb_autorelease(nb_tensor_alloc(ndim, shape, dt, dev));
}
nb_tensor *nb_zeros(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev) {
  return fill_new("nb_zeros", ndim, shape, 0.0, dt, dev);
}
nb_tensor *nb_ones(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev) {
  return fill_new("nb_ones", ndim, shape, 1.0, dt, dev);
}
nb_tensor *nb_full(int ndim, const int64_t *shape, double value, nb_dtype dt, nb_device dev) {
  return fill_new("nb_full", ndim, shape, value, dt, dev);
}
nb_tensor *nb_scalar(double value, nb_dtype dt, nb_device dev) {
  return fill_new("nb_scalar", 0, NULL, value, dt, dev);
}
nb_tensor *nb_zeros_like(const nb_tensor *t) {
  if (!t) { nb_error_null("nb_zeros_like", "t"); return NULL; }
  return nb_zeros(t->ndim, t->shape, t->dtype, nb_device_of(t));
}
nb_tensor *nb_ones_like(const nb_tensor *t) {
  if (!t) { nb_error_null("nb_ones_like", "t"); return NULL; }
  return nb_ones(t->ndim, t->shape, t->dtype, nb_device_of(t));
}

/* ---- arange ---------------------------------------------------------------- */
typedef struct {
  double start, end, step;
  nb_dtype dtype;
  nb_device device;
} arange_params;

static nb_status arange_infer(const nb_op_call *c, nb_meta *out) {
  const arange_params *p = c->p;
  if (p->step == 0 || !isfinite(p->start) || !isfinite(p->end) || !isfinite(p->step))
    return nb_error_set(NB_ERR_VALUE, "nb_arange: start %g, end %g, step %g: expected finite "
                        "values and a non-zero step", p->start, p->end, p->step);
  double span = ceil((p->end - p->start) / p->step);
  int64_t n = span > 0 ? (int64_t)span : 0;
  meta_new(out, 1, &n, p->dtype, p->device);
  return NB_OK;
}

static nb_status arange_forward(const nb_op_call *c, nb_tensor *t, nb_tensor **aux) {
  (void)aux;
  const arange_params *p = c->p;
  nb_kview kv;
  nb_kview_of(t, &kv);
  return nb_backend_for(p->device)->arange(&kv, p->start, p->step);
}

const nb_op nb_op_arange = {
    .name = "arange", .kind = NB_OPK_OPAQUE, .psize = sizeof(arange_params),
    .prec = NB_PREC_FOLLOW, .infer = arange_infer, .forward = arange_forward};

nb_tensor *nb_arange(double start, double end, double step, nb_dtype dt, nb_device dev) {
  arange_params p = {start, end, step, dt, dev};
  return nb_op_run(&nb_op_arange, 0, no_inputs, &p);
}

nb_tensor *nb_from_buffer(const void *data, int ndim, const int64_t *shape, nb_dtype dt,
                          nb_device dev) {
  if (!data) { nb_error_null("nb_from_buffer", "data"); return NULL; }
  if (ndim && !shape) { nb_error_null("nb_from_buffer", "shape"); return NULL; }
  nb_tensor *t = nb_tensor_alloc(ndim, shape, dt, dev);
  if (!t) return NULL;
  size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(dt);
  if (nbytes && nb_backend_for(dev)->upload(dev, t->storage->data, data, nbytes)) {
    nb_release(t);
    return NULL;
  }
  return nb_autorelease(t);
}

nb_status nb_to_host(const nb_tensor *t, void *dst, size_t nbytes) {
  if (!t) return nb_error_null("nb_to_host", "t");
  if (!dst) return nb_error_null("nb_to_host", "dst");
  size_t need = (size_t)nb_numel(t) * nb_dtype_size(t->dtype);
  char b[200];
  if (nbytes != need)
    return nb_error_set(NB_ERR_VALUE, "nb_to_host: buffer of %zu bytes for %s (needs %zu)", nbytes,
                        nb_describe(t, b, sizeof b), need);
  if (!need) return NB_OK;
  nb_scope_begin();
  nb_tensor *c = nb_contiguous(t);
  nb_status st = c ? NB_OK : nb_last_status();
  if (c) {
    const void *src = (char *)c->storage->data + c->offset * (int64_t)nb_dtype_size(c->dtype);
    st = nb_backend_for(nb_device_of(c))->download(nb_device_of(c), dst, src, need);
  }
  nb_scope_end();
  return st;
}

double nb_get(const nb_tensor *t, const int64_t *index) {
  if (!t) { nb_error_null("nb_get", "t"); return NAN; }
  int64_t off = t->offset;
  for (int i = 0; i < t->ndim; i++) {
    if (!index || index[i] < 0 || index[i] >= t->shape[i]) {
      nb_error_set(NB_ERR_INDEX, "nb_get: index out of range for axis %d of size %lld", i,
                   (long long)t->shape[i]);
      return NAN;
    }
    off += index[i] * t->strides[i];
  }
  size_t es = nb_dtype_size(t->dtype);
  unsigned char buf[8];
  const void *src = (char *)t->storage->data + off * (int64_t)es;
  if (nb_backend_for(nb_device_of(t))->download(nb_device_of(t), buf, src, es)) return NAN;
  return nb_load_f64(buf, t->dtype);
}

double nb_item(const nb_tensor *t) {
  if (!t) { nb_error_null("nb_item", "t"); return NAN; }
  if (nb_numel(t) != 1) {
    char b[200];
    nb_error_set(NB_ERR_SHAPE, "nb_item: %s has %lld elements (expected exactly one)",
                 nb_describe(t, b, sizeof b), (long long)nb_numel(t));
    return NAN;
  }
  int64_t zero[NB_MAX_DIMS] = {0};
  return nb_get(t, zero);
}

void *nb_data_ptr(const nb_tensor *t) {
  if (!t || nb_device_of(t).type != NB_CPU) return NULL;
  t->storage->filled = 0; /* the caller may write through it, at any time: */
  t->storage->stamp = 0;  /* never again known unchanged */
  return (char *)t->storage->data + t->offset * (int64_t)nb_dtype_size(t->dtype);
}

/* ---- in place ------------------------------------------------------------ */
static nb_status check_inplace(const char *op, const nb_tensor *dst) {
  if (dst->requires_grad && nb_grad_enabled())
    return nb_error_set(NB_ERR_GRAD, "%s: cannot write in place into a tensor that requires grad "
                        "(use a no-grad scope, or detach)", op);
  return NB_OK;
}

nb_status nb_fill_(nb_tensor *dst, double value) {
  if (!dst) return nb_error_null("nb_fill_", "dst");
  nb_status st = check_inplace("nb_fill_", dst);
  if (st || !nb_numel(dst)) return st;
  dst->storage->filled = 0;
  nb_storage_touch(dst->storage);
  nb_kview kv;
  nb_kview_of(dst, &kv);
  return nb_backend_for(nb_device_of(dst))->fill(&kv, value);
}

nb_status nb_copy_(nb_tensor *dst, const nb_tensor *src) {
  if (!dst) return nb_error_null("nb_copy_", "dst");
  if (!src) return nb_error_null("nb_copy_", "src");
  nb_status st = check_inplace("nb_copy_", dst);
  if (st) return st;
  dst->storage->filled = 0;
  nb_storage_touch(dst->storage);
  char b1[200], b2[200];
  nb_kview d, s;
  nb_kview_of(dst, &d);
  if (nb_kview_broadcast(src, dst->ndim, dst->shape, &s))
    return nb_error_set(NB_ERR_SHAPE, "nb_copy_: source %s does not broadcast to destination %s",
                        nb_describe(src, b1, sizeof b1), nb_describe(dst, b2, sizeof b2));
  if (!nb_numel(dst)) return NB_OK;
  if (nb_same_device(nb_device_of(src), nb_device_of(dst)))
    return nb_backend_for(nb_device_of(dst))->copy(&d, &s);
  /* across devices: bring src to dst's device first */
  nb_scope_begin();
  nb_tensor *moved = nb_to_device(src, nb_device_of(dst));
  st = moved ? NB_OK : nb_last_status();
  if (moved) {
    nb_kview_broadcast(moved, dst->ndim, dst->shape, &s);
    st = nb_backend_for(nb_device_of(dst))->copy(&d, &s);
  }
  nb_scope_end();
  return st;
}

/* ---- devices -------------------------------------------------------------- */
typedef struct {
  nb_device device; /* the destination */
} to_device_params;

static nb_status to_device_infer(const nb_op_call *c, nb_meta *out) {
  nb_device dev = ((const to_device_params *)c->p)->device;
  if (!nb_backend_for(dev)) return nb_last_status();
  nb_meta_of(c->in[0], out);
  out->device = dev;
  return NB_OK;
}

/* The transfer reads one contiguous block. */
static nb_status to_device_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[0] = nb_contiguous(c->in[0]);
  return in[0] ? NB_OK : nb_last_status();
}

/* An upload, a download, or a download and an upload through the host; from
 * page-locked host memory the upload does not wait. */
static nb_status to_device_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const nb_tensor *t = c->in[0];
  nb_device from = nb_device_of(t), dev = ((const to_device_params *)c->p)->device;
  size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(t->dtype);
  const void *src = (char *)t->storage->data + t->offset * (int64_t)nb_dtype_size(t->dtype);
  if (from.type == NB_CPU && t->storage->pinned && nb_backend_for(dev)->upload_async)
    return nb_backend_for(dev)->upload_async(dev, out->storage->data, src, nbytes); /* no wait */
  if (from.type == NB_CPU) return nb_backend_for(dev)->upload(dev, out->storage->data, src, nbytes);
  if (dev.type == NB_CPU) return nb_backend_for(from)->download(from, out->storage->data, src, nbytes);
  void *tmp = malloc(nbytes); /* device to device through the host */
  nb_status st = tmp ? nb_backend_for(from)->download(from, tmp, src, nbytes) : NB_ERR_OOM;
  if (!st) st = nb_backend_for(dev)->upload(dev, out->storage->data, tmp, nbytes);
  free(tmp);
  return st;
}

static nb_status to_device_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(nb_to_device(g, nb_device_of(n->inputs[0])));
  return gin[0] ? NB_OK : nb_last_status();
}

const nb_op nb_op_to_device = {
    .name = "to_device", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"t"},
    .psize = sizeof(to_device_params), .prec = NB_PREC_FOLLOW, .infer = to_device_infer,
    .prepare = to_device_prepare, .forward = to_device_forward, .backward = to_device_bw,
    .meta_only_in = 1u, .fp8 = 1};

nb_tensor *nb_to_device(const nb_tensor *t, nb_device dev) {
  if (!t) { nb_error_null("nb_to_device", "t"); return NULL; }
  if (!nb_backend_for(dev)) return NULL;
  if (nb_same_device(nb_device_of(t), dev)) return nb_autorelease(nb_retain((nb_tensor *)t));
  to_device_params p = {dev};
  return nb_op_run(&nb_op_to_device, 1, (const nb_tensor *const[]){t}, &p);
}

/* ---- random ----------------------------------------------------------------- */
/* A draw of (seed, offset): element i uses Philox block offset + i. The
 * caller's generator advances by the element count after a draw. */
typedef struct {
  int ndim;
  int64_t shape[NB_MAX_DIMS];
  nb_dtype dtype;
  nb_device device;
  uint64_t seed, offset;
  double a, b;    /* rand: [lo, hi); randn: mean, std */
  int64_t lo, hi; /* randint: [lo, hi) */
} rand_params;

_Static_assert(sizeof(rand_params) <= NB_OP_PARAMS_MAX, "rand_params too large for a node");

/* The dtype of a draw: a float one for rand and randn, an integer one for
 * randint. The message names the public function (nb_<op>). */
static int rand_dtype_ok(const char *name, nb_dtype dt, int want_float) {
  if (want_float && !nb_dtype_is_float(dt)) {
    nb_error_set(NB_ERR_DTYPE, "nb_%s: dtype %s (expected f64, f32, f16 or bf16)", name, nb_dtype_name(dt));
    return 0;
  }
  if (!want_float && (nb_dtype_is_float(dt) || nb_dtype_is_fp8(dt) || dt == NB_BOOL)) {
    nb_error_set(NB_ERR_DTYPE, "nb_%s: dtype %s (expected i64, i32 or u8)", name, nb_dtype_name(dt));
    return 0;
  }
  return 1;
}

static nb_status rand_infer(const nb_op_call *c, nb_meta *out) {
  const rand_params *p = c->p;
  if (!rand_dtype_ok(c->op->name, p->dtype, 1)) return nb_last_status();
  if (!(p->a <= p->b) || !isfinite(p->a) || !isfinite(p->b))
    return nb_error_set(NB_ERR_VALUE, "nb_rand: bounds [%g, %g) (expected finite lo <= hi)", p->a, p->b);
  meta_new(out, p->ndim, p->shape, p->dtype, p->device);
  return NB_OK;
}

static nb_status randn_infer(const nb_op_call *c, nb_meta *out) {
  const rand_params *p = c->p;
  if (!rand_dtype_ok(c->op->name, p->dtype, 1)) return nb_last_status();
  if (!(p->b >= 0) || !isfinite(p->a) || !isfinite(p->b))
    return nb_error_set(NB_ERR_VALUE, "nb_randn: mean %g, std %g (expected finite values, std >= 0)",
                        p->a, p->b);
  meta_new(out, p->ndim, p->shape, p->dtype, p->device);
  return NB_OK;
}

static nb_status randint_infer(const nb_op_call *c, nb_meta *out) {
  const rand_params *p = c->p;
  if (!rand_dtype_ok(c->op->name, p->dtype, 0)) return nb_last_status();
  if (p->lo >= p->hi)
    return nb_error_set(NB_ERR_VALUE, "nb_randint: range [%lld, %lld) is empty", (long long)p->lo,
                        (long long)p->hi);
  meta_new(out, p->ndim, p->shape, p->dtype, p->device);
  return NB_OK;
}

static nb_status rand_forward(const nb_op_call *c, nb_tensor *t, nb_tensor **aux) {
  (void)aux;
  const rand_params *p = c->p;
  nb_kview kv;
  nb_kview_of(t, &kv);
  return nb_backend_for(p->device)->rand_uniform(&kv, p->seed, p->offset, p->a, p->b);
}

static nb_status randn_forward(const nb_op_call *c, nb_tensor *t, nb_tensor **aux) {
  (void)aux;
  const rand_params *p = c->p;
  nb_kview kv;
  nb_kview_of(t, &kv);
  return nb_backend_for(p->device)->rand_normal(&kv, p->seed, p->offset, p->a, p->b);
}

static nb_status randint_forward(const nb_op_call *c, nb_tensor *t, nb_tensor **aux) {
  (void)aux;
  const rand_params *p = c->p;
  nb_kview kv;
  nb_kview_of(t, &kv);
  return nb_backend_for(p->device)->randint(&kv, p->seed, p->offset, p->lo, p->hi);
}

const nb_op nb_op_rand = {
    .name = "rand", .kind = NB_OPK_OPAQUE, .psize = sizeof(rand_params), .prec = NB_PREC_FOLLOW,
    .infer = rand_infer, .forward = rand_forward};
const nb_op nb_op_randn = {
    .name = "randn", .kind = NB_OPK_OPAQUE, .psize = sizeof(rand_params), .prec = NB_PREC_FOLLOW,
    .determinism = "the same bits on one backend; CPU and CUDA normals may differ in the last "
                   "bits (logf, cosf)",
    .infer = randn_infer, .forward = randn_forward};
const nb_op nb_op_randint = {
    .name = "randint", .kind = NB_OPK_OPAQUE, .psize = sizeof(rand_params), .prec = NB_PREC_FOLLOW,
    .infer = randint_infer, .forward = randint_forward};

/* The checks of the C arguments in their order (generator, dtype, shape),
 * then the draw; the generator advances by the element count when it
 * succeeds. */
static nb_tensor *rand_run(const nb_op *op, int want_float, nb_rng *rng, int ndim,
                           const int64_t *shape, rand_params *p) {
  char api[32];
  snprintf(api, sizeof api, "nb_%s", op->name);
  if (!rng) { nb_error_null(api, "rng"); return NULL; }
  if (!rand_dtype_ok(op->name, p->dtype, want_float)) return NULL;
  if (ndim && !shape) { nb_error_null(api, "shape"); return NULL; }
  p->ndim = ndim;
  shape_copy(p->shape, ndim, shape);
  p->seed = rng->seed;
  p->offset = rng->offset;
  nb_tensor *t = nb_op_run(op, 0, no_inputs, p);
  if (t) rng->offset += (uint64_t)nb_numel(t);
  return t;
}

nb_tensor *nb_rand(nb_rng *rng, int ndim, const int64_t *shape, double lo, double hi,
                   nb_dtype dt, nb_device dev) {
  rand_params p = {.dtype = dt, .device = dev, .a = lo, .b = hi};
  return rand_run(&nb_op_rand, 1, rng, ndim, shape, &p);
}

nb_tensor *nb_randn(nb_rng *rng, int ndim, const int64_t *shape, double mean, double std,
                    nb_dtype dt, nb_device dev) {
  rand_params p = {.dtype = dt, .device = dev, .a = mean, .b = std};
  return rand_run(&nb_op_randn, 1, rng, ndim, shape, &p);
}

nb_tensor *nb_randint(nb_rng *rng, int ndim, const int64_t *shape, int64_t lo, int64_t hi,
                      nb_dtype dt, nb_device dev) {
  rand_params p = {.dtype = dt, .device = dev, .lo = lo, .hi = hi};
  return rand_run(&nb_op_randint, 0, rng, ndim, shape, &p);
}
