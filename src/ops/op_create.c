/* Creation, host transfer, device transfer, in-place fill/copy, RNG draws:
 * the ops that fill new storage through a kernel (core allocates it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

static nb_tensor *fill_new(const char *op, int ndim, const int64_t *shape, double v, nb_dtype dt,
                           nb_device dev) {
  if (ndim && !shape) { nb_error_null(op, "shape"); return NULL; }
  nb_tensor *t = nb_tensor_alloc(ndim, shape, dt, dev);
  if (!t) return NULL;
  nb_kview kv;
  nb_kview_of(t, &kv);
  if (nb_numel(t) && nb_backend_for(dev)->fill(&kv, v)) { nb_release(t); return NULL; }
  t->storage->filled = 1;
  t->storage->fill_value = v;
  return nb_autorelease(t);
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

nb_tensor *nb_arange(double start, double end, double step, nb_dtype dt, nb_device dev) {
  if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
    nb_error_set(NB_ERR_VALUE, "nb_arange: start %g, end %g, step %g: expected finite values and a "
                 "non-zero step", start, end, step);
    return NULL;
  }
  double span = ceil((end - start) / step);
  int64_t n = span > 0 ? (int64_t)span : 0;
  nb_tensor *t = nb_tensor_alloc(1, &n, dt, dev);
  if (!t) return NULL;
  nb_kview kv;
  nb_kview_of(t, &kv);
  if (n && nb_backend_for(dev)->arange(&kv, start, step)) { nb_release(t); return NULL; }
  return nb_autorelease(t);
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
  t->storage->filled = 0; /* the caller may write through it */
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
static nb_status to_device_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(nb_to_device(g, nb_device_of(n->inputs[0])));
  return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_to_device(const nb_tensor *t, nb_device dev) {
  if (!t) { nb_error_null("nb_to_device", "t"); return NULL; }
  if (!nb_backend_for(dev)) return NULL;
  nb_device from = nb_device_of(t);
  if (nb_same_device(from, dev)) return nb_autorelease(nb_retain((nb_tensor *)t));
  nb_scope_begin();
  nb_tensor *c = nb_contiguous(t), *out = NULL;
  if (c) out = nb_tensor_alloc(t->ndim, t->shape, t->dtype, dev);
  if (out) {
    size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(t->dtype);
    const void *src = (char *)c->storage->data + c->offset * (int64_t)nb_dtype_size(c->dtype);
    nb_status st = NB_OK;
    if (!nbytes) st = NB_OK;
    else if (from.type == NB_CPU && c->storage->pinned && nb_backend_for(dev)->upload_async)
      st = nb_backend_for(dev)->upload_async(dev, out->storage->data, src, nbytes); /* no wait */
    else if (from.type == NB_CPU) st = nb_backend_for(dev)->upload(dev, out->storage->data, src, nbytes);
    else if (dev.type == NB_CPU) st = nb_backend_for(from)->download(from, out->storage->data, src, nbytes);
    else { /* device to device through the host */
      void *tmp = malloc(nbytes);
      st = tmp ? nb_backend_for(from)->download(from, tmp, src, nbytes) : NB_ERR_OOM;
      if (!st) st = nb_backend_for(dev)->upload(dev, out->storage->data, tmp, nbytes);
      free(tmp);
    }
    if (st) { nb_release(out); out = NULL; }
  }
  nb_scope_end();
  if (out) nb_record("to_device", to_device_bw, 1, (const nb_tensor *const[]){t}, out);
  return nb_autorelease(out);
}

/* ---- random ----------------------------------------------------------------- */
static nb_tensor *rand_prepare(const char *op, nb_rng *rng, int ndim, const int64_t *shape,
                               nb_dtype dt, nb_device dev, int want_float) {
  if (!rng) { nb_error_null(op, "rng"); return NULL; }
  if (want_float && !nb_dtype_is_float(dt)) {
    nb_error_set(NB_ERR_DTYPE, "%s: dtype %s (expected f64, f32, f16 or bf16)", op, nb_dtype_name(dt));
    return NULL;
  }
  if (!want_float && (nb_dtype_is_float(dt) || dt == NB_BOOL)) {
    nb_error_set(NB_ERR_DTYPE, "%s: dtype %s (expected i64, i32 or u8)", op, nb_dtype_name(dt));
    return NULL;
  }
  if (ndim && !shape) { nb_error_null(op, "shape"); return NULL; }
  return nb_tensor_alloc(ndim, shape, dt, dev);
}

static nb_tensor *rand_finish(nb_tensor *t, nb_rng *rng, nb_status st) {
  if (st) { nb_release(t); return NULL; }
  rng->offset += (uint64_t)nb_numel(t);
  return nb_autorelease(t);
}

nb_tensor *nb_rand(nb_rng *rng, int ndim, const int64_t *shape, double lo, double hi,
                   nb_dtype dt, nb_device dev) {
  nb_tensor *t = rand_prepare("nb_rand", rng, ndim, shape, dt, dev, 1);
  if (!t) return NULL;
  if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi))
    return rand_finish(t, rng, nb_error_set(NB_ERR_VALUE, "nb_rand: bounds [%g, %g) (expected finite lo <= hi)", lo, hi));
  nb_kview kv;
  nb_kview_of(t, &kv);
  return rand_finish(t, rng, nb_numel(t) ? nb_backend_for(dev)->rand_uniform(&kv, rng->seed, rng->offset, lo, hi) : NB_OK);
}

nb_tensor *nb_randn(nb_rng *rng, int ndim, const int64_t *shape, double mean, double std,
                    nb_dtype dt, nb_device dev) {
  nb_tensor *t = rand_prepare("nb_randn", rng, ndim, shape, dt, dev, 1);
  if (!t) return NULL;
  if (!(std >= 0) || !isfinite(mean) || !isfinite(std))
    return rand_finish(t, rng, nb_error_set(NB_ERR_VALUE, "nb_randn: mean %g, std %g (expected finite values, std >= 0)", mean, std));
  nb_kview kv;
  nb_kview_of(t, &kv);
  return rand_finish(t, rng, nb_numel(t) ? nb_backend_for(dev)->rand_normal(&kv, rng->seed, rng->offset, mean, std) : NB_OK);
}

nb_tensor *nb_randint(nb_rng *rng, int ndim, const int64_t *shape, int64_t lo, int64_t hi,
                      nb_dtype dt, nb_device dev) {
  nb_tensor *t = rand_prepare("nb_randint", rng, ndim, shape, dt, dev, 0);
  if (!t) return NULL;
  if (lo >= hi)
    return rand_finish(t, rng, nb_error_set(NB_ERR_VALUE, "nb_randint: range [%lld, %lld) is empty", (long long)lo, (long long)hi));
  nb_kview kv;
  nb_kview_of(t, &kv);
  return rand_finish(t, rng, nb_numel(t) ? nb_backend_for(dev)->randint(&kv, rng->seed, rng->offset, lo, hi) : NB_OK);
}
