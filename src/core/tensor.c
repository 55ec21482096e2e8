/* Tensors and storage: allocation, reference counts, scopes, accessors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static int64_t live_tensors;                 /* atomically updated */
static int64_t live_bytes[2];                /* per device type */
static int deterministic_flag = 1;

int nb_deterministic(void) { return __atomic_load_n(&deterministic_flag, __ATOMIC_RELAXED); }
void nb_set_deterministic(int on) { __atomic_store_n(&deterministic_flag, on != 0, __ATOMIC_RELAXED); }
int64_t nb_live_tensors(void) { return __atomic_load_n(&live_tensors, __ATOMIC_RELAXED); }
int64_t nb_live_bytes(nb_device dev) { return __atomic_load_n(&live_bytes[dev.type != NB_CPU], __ATOMIC_RELAXED); }

/* ---- shapes ---------------------------------------------------------- */
int64_t nb_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

void nb_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i] > 1 ? shape[i] : 1;
  }
}

const char *nb_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

int nb_same_device(nb_device a, nb_device b) { return a.type == b.type && (a.type == NB_CPU || a.index == b.index); }

const char *nb_device_str(nb_device d, char *buf, size_t n) {
  if (d.type == NB_CPU) snprintf(buf, n, "cpu");
  else snprintf(buf, n, "cuda:%d", d.index);
  return buf;
}

nb_device nb_device_cuda(int index) { return (nb_device){NB_CUDA, index}; }

nb_status nb_device_parse(const char *s, nb_device *out) {
  if (!s || !out) return nb_error_null("nb_device_parse", s ? "out" : "s");
  if (!strcmp(s, "cpu")) { *out = NB_DEVICE_CPU; return NB_OK; }
  if (!strncmp(s, "cuda", 4)) {
    int idx = 0;
    if (s[4] == ':') {
      char *end;
      long v = strtol(s + 5, &end, 10);
      if (end == s + 5 || *end || v < 0 || v > 1024)
        return nb_error_set(NB_ERR_DEVICE, "nb_device_parse: bad device '%s' (expected cpu, cuda or cuda:N)", s);
      idx = (int)v;
    } else if (s[4]) {
      return nb_error_set(NB_ERR_DEVICE, "nb_device_parse: bad device '%s' (expected cpu, cuda or cuda:N)", s);
    }
    *out = nb_device_cuda(idx);
    return NB_OK;
  }
  return nb_error_set(NB_ERR_DEVICE, "nb_device_parse: bad device '%s' (expected cpu, cuda or cuda:N)", s);
}

/* ---- allocators ---------------------------------------------------------- */
static const nb_allocator *installed[2]; /* per device type; NULL: the backend's */

const nb_allocator *nb_allocator_for(nb_device dev) {
  const nb_allocator *a = __atomic_load_n(&installed[dev.type != NB_CPU], __ATOMIC_ACQUIRE);
  return a ? a : nb_backend_allocator(dev);
}

void nb_set_allocator(nb_device_type type, const nb_allocator *a) {
  __atomic_store_n(&installed[type != NB_CPU], a, __ATOMIC_RELEASE);
}

/* ---- storage and tensor lifetime --------------------------------------- */
static uint64_t stamp_last; /* write stamps: each value handed out once */

static uint64_t stamp_next(void) { return __atomic_add_fetch(&stamp_last, 1, __ATOMIC_RELAXED); }

uint64_t nb_storage_touch(nb_storage *s) {
  if (s->stamp) s->stamp = stamp_next();
  return s->stamp;
}

static nb_storage *storage_new(size_t nbytes, nb_device dev) {
  const nb_allocator *al = nb_allocator_for(dev);
  if (!al) return NULL;
  nb_storage *s = calloc(1, sizeof *s);
  if (!s) { nb_error_set(NB_ERR_OOM, "out of host memory for a storage header"); return NULL; }
  s->data = al->alloc(dev, nbytes);
  if (!s->data) { free(s); return NULL; }
  s->allocator = al;
  s->refcount = 1;
  s->nbytes = nbytes;
  s->device = dev;
  s->stamp = stamp_next();
  __atomic_add_fetch(&live_bytes[dev.type != NB_CPU], (int64_t)nbytes, __ATOMIC_RELAXED);
  return s;
}

static void storage_release(nb_storage *s) {
  if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (!s->borrowed) s->allocator->free(s->device, s->data, s->nbytes);
  __atomic_sub_fetch(&live_bytes[s->device.type != NB_CPU], (int64_t)s->nbytes, __ATOMIC_RELAXED);
  free(s);
}

static nb_tensor *header_new(int ndim, const int64_t *shape, nb_dtype dt) {
  nb_tensor *t = calloc(1, sizeof *t);
  if (!t) { nb_error_set(NB_ERR_OOM, "out of host memory for a tensor header"); return NULL; }
  t->refcount = 1;
  t->ndim = ndim;
  if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  t->dtype = dt;
  __atomic_add_fetch(&live_tensors, 1, __ATOMIC_RELAXED);
  return t;
}

nb_tensor *nb_tensor_alloc(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev) {
  if (ndim < 0 || ndim > NB_MAX_DIMS) {
    nb_error_set(NB_ERR_SHAPE, "tensor: %d dimensions (at most %d are supported)", ndim, NB_MAX_DIMS);
    return NULL;
  }
  if ((unsigned)dt >= NB_DTYPE_COUNT) { nb_error_set(NB_ERR_DTYPE, "tensor: invalid dtype %d", (int)dt); return NULL; }
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      char b[160];
      nb_error_set(NB_ERR_SHAPE, "tensor: negative size in shape %s", nb_shape_str(ndim, shape, b, sizeof b));
      return NULL;
    }
    if (shape[i] && n > INT64_MAX / 16 / shape[i]) {
      nb_error_set(NB_ERR_SHAPE, "tensor: shape too large");
      return NULL;
    }
    n *= shape[i];
  }
  nb_tensor *t = header_new(ndim, shape, dt);
  if (!t) return NULL;
  nb_contiguous_strides(ndim, shape, t->strides);
  t->storage = storage_new((size_t)n * nb_dtype_size(dt), dev);
  if (!t->storage) { nb_release(t); return NULL; }
  return t;
}

/* A CPU tensor in page-locked memory where a GPU backend provides it, else
 * in ordinary memory: copies from it to a GPU can then run asynchronously. */
nb_tensor *nb_empty_pinned(int ndim, const int64_t *shape, nb_dtype dt) {
  const nb_allocator *pa = nb_pinned_allocator();
  nb_tensor *t = nb_tensor_alloc(ndim, shape, dt, NB_DEVICE_CPU);
  if (!t || !pa) return nb_autorelease(t);
  nb_storage *s = t->storage;
  void *p = pa->alloc(NB_DEVICE_CPU, s->nbytes);
  if (!p) { nb_release(t); return NULL; }
  s->allocator->free(NB_DEVICE_CPU, s->data, s->nbytes);
  s->data = p;
  s->allocator = pa;
  s->pinned = 1;
  return nb_autorelease(t);
}

int nb_is_pinned(const nb_tensor *t) { return t && t->storage->pinned; }

nb_tensor *nb_tensor_meta_of(const nb_tensor *t) {
  nb_tensor *m = header_new(t->ndim, t->shape, t->dtype);
  nb_storage *s = m ? calloc(1, sizeof *s) : NULL;
  if (!s) {
    if (m) nb_error_set(NB_ERR_OOM, "out of host memory for a storage header");
    nb_release(m);
    return NULL;
  }
  s->refcount = 1;
  s->device = t->storage->device;
  s->borrowed = 1; /* no data to free */
  s->allocator = nb_allocator_for(s->device);
  memcpy(m->strides, t->strides, sizeof m->strides);
  m->offset = t->offset;
  m->storage = s;
  m->requires_grad = t->requires_grad;
  return m;
}

nb_tensor *nb_tensor_view_of(const nb_tensor *base, int ndim, const int64_t *shape,
                             const int64_t *strides, int64_t offset) {
  nb_tensor *t = header_new(ndim, shape, base->dtype);
  if (!t) return NULL;
  if (ndim) memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
  t->offset = offset;
  t->storage = base->storage;
  __atomic_add_fetch(&base->storage->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

nb_tensor *nb_retain(nb_tensor *t) {
  if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

nb_tensor *nb_keep(nb_tensor *t) { return nb_retain(t); }

/* Freeing a tensor can free its graph node, whose inputs can free their
 * nodes, and so on down a long chain: a worklist keeps the C stack flat. */
void nb_release(nb_tensor *t) {
  static _Thread_local nb_tensor **work;
  static _Thread_local size_t cap, len;
  static _Thread_local int active;
  if (!t || __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (len == cap) {
    size_t ncap = cap ? cap * 2 : 64;
    nb_tensor **w = realloc(work, ncap * sizeof *w);
    if (!w) abort(); /* cannot continue safely without memory for bookkeeping */
    work = w;
    cap = ncap;
  }
  work[len++] = t;
  if (active) return;
  active = 1;
  while (len) {
    nb_tensor *x = work[--len];
    storage_release(x->storage);
    struct nb_node *fn = x->grad_fn;
    nb_tensor *g = x->grad, *w = x->work;
    free(x);
    __atomic_sub_fetch(&live_tensors, 1, __ATOMIC_RELAXED);
    nb_release(g);
    nb_release(w);
    nb_node_release(fn);
  }
  active = 0;
}

/* ---- scopes ------------------------------------------------------------ */
typedef struct {
  nb_tensor **items;
  size_t len, cap;
  size_t *marks;
  int depth, mcap;
} scope_stack;
static _Thread_local scope_stack scopes;

void nb_scope_begin(void) {
  if (scopes.depth == scopes.mcap) {
    int ncap = scopes.mcap ? scopes.mcap * 2 : 16;
    size_t *m = realloc(scopes.marks, (size_t)ncap * sizeof *m);
    if (!m) abort();
    scopes.marks = m;
    scopes.mcap = ncap;
  }
  scopes.marks[scopes.depth++] = scopes.len;
}

void nb_scope_end(void) {
  if (!scopes.depth) return;
  size_t mark = scopes.marks[--scopes.depth];
  while (scopes.len > mark) nb_release(scopes.items[--scopes.len]);
  if (!scopes.depth) { /* give memory back between training steps */
    free(scopes.items);
    free(scopes.marks);
    memset(&scopes, 0, sizeof scopes);
  }
}

int nb_scope_depth(void) { return scopes.depth; }

nb_tensor *nb_scope_return(nb_tensor *t) {
  nb_retain(t);
  nb_scope_end();
  return nb_autorelease(t);
}

nb_tensor *nb_autorelease(nb_tensor *t) {
  if (!t || !scopes.depth) return t;
  if (scopes.len == scopes.cap) {
    size_t ncap = scopes.cap ? scopes.cap * 2 : 256;
    nb_tensor **it = realloc(scopes.items, ncap * sizeof *it);
    if (!it) abort();
    scopes.items = it;
    scopes.cap = ncap;
  }
  scopes.items[scopes.len++] = t;
  return t;
}

/* ---- accessors ----------------------------------------------------------- */
int nb_ndim(const nb_tensor *t) { return t ? t->ndim : -1; }
const int64_t *nb_shape(const nb_tensor *t) { return t ? t->shape : NULL; }
const int64_t *nb_strides(const nb_tensor *t) { return t ? t->strides : NULL; }
int64_t nb_numel(const nb_tensor *t) { return t ? nb_shape_numel(t->ndim, t->shape) : 0; }
nb_dtype nb_dtype_of(const nb_tensor *t) { return t ? t->dtype : NB_DTYPE_COUNT; }
nb_device nb_device_of(const nb_tensor *t) { return t ? t->storage->device : NB_DEVICE_CPU; }

int64_t nb_size(const nb_tensor *t, int axis) {
  if (!t) return -1;
  int a = axis < 0 ? axis + t->ndim : axis;
  if (a < 0 || a >= t->ndim) {
    nb_error_set(NB_ERR_AXIS, "nb_size: axis %d out of range for %d dimensions", axis, t->ndim);
    return -1;
  }
  return t->shape[a];
}

int nb_is_contiguous(const nb_tensor *t) {
  if (!t) return 0;
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

int nb_shares_storage(const nb_tensor *a, const nb_tensor *b) {
  return a && b && a->storage == b->storage;
}

const char *nb_describe(const nb_tensor *t, char *buf, size_t n) {
  if (!t) { snprintf(buf, n, "NULL"); return buf; }
  char s[160], d[32];
  nb_shape_str(t->ndim, t->shape, s, sizeof s);
  if (t->storage->device.type == NB_CPU) snprintf(buf, n, "%s%s", nb_dtype_name(t->dtype), s);
  else snprintf(buf, n, "%s%s@%s", nb_dtype_name(t->dtype), s, nb_device_str(t->storage->device, d, sizeof d));
  return buf;
}

int nb_norm_axis(const char *op, int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= (ndim ? ndim : 1)) {
    nb_error_set(NB_ERR_AXIS, "%s: axis %d out of range for a tensor of %d dimensions (expected %d..%d)",
                 op, axis, ndim, -(ndim ? ndim : 1), (ndim ? ndim : 1) - 1);
    return -1;
  }
  return a;
}
