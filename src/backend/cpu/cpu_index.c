/* CPU indexing kernels: index_select, index_add, gather, scatter_add, and
 * dropout.
 *
 * The index kernels share one plan. Every axis but the indexed one is either
 * the "vector" axis (the innermost non-indexed axis, walked as a strided run)
 * or a "lane" axis (enumerated as a task index). A task fixes the lane
 * coordinates and a chunk of the vector axis and then walks the indexed axis
 * in order. Since out and its source agree on every non-indexed axis, a task
 * owns a disjoint set of destination elements: the accumulating kernels need
 * no atomics, and each destination element receives its contributions in
 * index order whatever the thread count, so they are deterministic (the
 * non-deterministic flag runs the same code). Indices are checked before any
 * write; a bad one is reported with its value, position and the axis size. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"
#include "core/philox.h"

/* Vector-axis elements per task chunk of the accumulating kernels: enough
 * work per task, and parallelism when there are few lanes (an embedding
 * gradient (V, D) has one lane). */
#define IX_CHUNK 512

typedef struct {
  int ndim, axis, vax;   /* vax: vector axis, -1 when the view is 1-D */
  int64_t shape[NB_MAX_DIMS]; /* of the destination/source pair, axis excluded */
  int64_t vlen, nlanes, nchunks, chunk;
} ix_plan;

static void ix_plan_init(ix_plan *p, const nb_kview *v, int axis, int64_t chunk) {
  p->ndim = v->ndim;
  p->axis = axis;
  p->vax = -1;
  for (int d = v->ndim - 1; d >= 0 && p->vax < 0; d--)
    if (d != axis) p->vax = d;
  memcpy(p->shape, v->shape, sizeof p->shape);
  p->vlen = p->vax >= 0 ? v->shape[p->vax] : 1;
  p->nlanes = 1;
  for (int d = 0; d < v->ndim; d++)
    if (d != axis && d != p->vax) p->nlanes *= v->shape[d];
  p->chunk = chunk < p->vlen ? chunk : p->vlen;
  p->nchunks = p->chunk ? (p->vlen + p->chunk - 1) / p->chunk : 0;
}

/* Element offset in v of lane `lane` (row-major over the lane axes), axis
 * and vector coordinates zero. */
static int64_t ix_lane_off(const ix_plan *p, const nb_kview *v, int64_t lane) {
  int64_t off = 0;
  for (int d = p->ndim - 1; d >= 0; d--) {
    if (d == p->axis || d == p->vax) continue;
    off += (lane % p->shape[d]) * v->strides[d];
    lane /= p->shape[d];
  }
  return off;
}

static int64_t ix_vstride(const ix_plan *p, const nb_kview *v) {
  return p->vax >= 0 ? v->strides[p->vax] : 0;
}

static char *ix_ptr(const nb_kview *v, int64_t off) {
  return (char *)v->data + off * (int64_t)nb_dtype_size(v->dtype);
}

/* ---- index validation ---------------------------------------------------- */

static nb_status ix_range_error(const char *op, int64_t value, const char *pos, int axis,
                                int64_t size) {
  return nb_error_set(NB_ERR_INDEX,
                      "%s: index %lld at position %s is out of range for axis %d of size %lld "
                      "(expected 0 <= index < %lld; negative indices are not wrapped)",
                      op, (long long)value, pos, axis, (long long)size, (long long)size);
}

/* Loads a 1-D index vector into a new array, checking 0 <= idx < size. */
static nb_status ix_load_1d(const char *op, const nb_kview *idx, int axis, int64_t size,
                            int64_t **out) {
  const int64_t n = idx->ndim ? idx->shape[0] : 1, s = idx->ndim ? idx->strides[0] : 0;
  const size_t esz = nb_dtype_size(idx->dtype);
  int64_t *a = malloc((size_t)(n ? n : 1) * sizeof *a);
  if (!a) return nb_error_set(NB_ERR_OOM, "%s: out of memory for %lld indices", op, (long long)n);
  nb_cpu_load_i64(idx->dtype, n, idx->data, s * (int64_t)esz, a);
  for (int64_t j = 0; j < n; j++) {
    if (a[j] >= 0 && a[j] < size) continue;
    char pos[32];
    int64_t bad = a[j];
    snprintf(pos, sizeof pos, "%lld", (long long)j);
    free(a);
    return ix_range_error(op, bad, pos, axis, size);
  }
  *out = a;
  return NB_OK;
}

static int64_t ix_idx_at(const nb_kview *idx, int64_t i, int64_t *coord) {
  int64_t off = 0;
  for (int d = idx->ndim - 1; d >= 0; d--) {
    coord[d] = i % idx->shape[d];
    off += coord[d] * idx->strides[d];
    i /= idx->shape[d];
  }
  return nb_cpu_get_i64(ix_ptr(idx, off), idx->dtype);
}

/* Checks every element of an N-d index view; reports the first bad one in
 * row-major order with its multi-index. */
static nb_status ix_check_nd(const char *op, const nb_kview *idx, int axis, int64_t size) {
  int64_t n = 1, first = INT64_MAX, coord[NB_MAX_DIMS];
  for (int d = 0; d < idx->ndim; d++) n *= idx->shape[d];
#pragma omp parallel for schedule(static) reduction(min : first) if (n >= NB_CPU_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    int64_t c[NB_MAX_DIMS], v = ix_idx_at(idx, i, c);
    if ((v < 0 || v >= size) && i < first) first = i;
  }
  if (first == INT64_MAX) return NB_OK;
  int64_t v = ix_idx_at(idx, first, coord);
  char pos[NB_MAX_DIMS * 22 + 4];
  int len = snprintf(pos, sizeof pos, "[");
  for (int d = 0; d < idx->ndim; d++)
    len += snprintf(pos + len, sizeof pos - (size_t)len, "%s%lld", d ? ", " : "",
                    (long long)coord[d]);
  snprintf(pos + len, sizeof pos - (size_t)len, "]");
  return ix_range_error(op, v, pos, axis, size);
}

/* ---- element runs -------------------------------------------------------- */

/* Copies n elements of esz bytes between byte-strided runs. */
static void ix_copy_run(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, size_t esz) {
#define IX_COPY(T) \
  for (int64_t k = 0; k < n; k++) *(T *)(d + k * ds) = *(const T *)(s + k * ss)
  switch (esz) {
  case 8: IX_COPY(uint64_t); break;
  case 4: IX_COPY(uint32_t); break;
  case 2: IX_COPY(uint16_t); break;
  default:
    for (int64_t k = 0; k < n; k++) memcpy(d + k * ds, s + k * ss, esz);
  }
#undef IX_COPY
}

static int ix_addable(nb_dtype dt) { return dt != NB_BOOL && (unsigned)dt < NB_DTYPE_COUNT; }

/* d[k] += s[k] for n elements of dtype dt (byte strides); f16/bf16 add in
 * f32 and round once per addition. */
static void ix_add_run(nb_dtype dt, char *d, int64_t ds, const char *s, int64_t ss, int64_t n) {
#define IX_ADD(T) \
  for (int64_t k = 0; k < n; k++) *(T *)(d + k * ds) += *(const T *)(s + k * ss)
  switch (dt) {
  case NB_F64: IX_ADD(double); break;
  case NB_F32: IX_ADD(float); break;
  case NB_I64: IX_ADD(int64_t); break;
  case NB_I32: /* wraps like the elementwise integer add */
    for (int64_t k = 0; k < n; k++) {
      int32_t *p = (int32_t *)(d + k * ds);
      *p = (int32_t)((uint32_t)*p + (uint32_t) * (const int32_t *)(s + k * ss));
    }
    break;
  case NB_U8: IX_ADD(uint8_t); break;
  case NB_F16:
    for (int64_t k = 0; k < n; k++) {
      uint16_t *p = (uint16_t *)(d + k * ds);
      *p = nb_f32_to_f16(nb_cpu_f16_f32(*p) + nb_cpu_f16_f32(*(const uint16_t *)(s + k * ss)));
    }
    break;
  case NB_BF16:
    for (int64_t k = 0; k < n; k++) {
      uint16_t *p = (uint16_t *)(d + k * ds);
      *p = nb_cpu_f32_bf16(nb_cpu_bf16_f32(*p) + nb_cpu_bf16_f32(*(const uint16_t *)(s + k * ss)));
    }
    break;
  default: break;
  }
#undef IX_ADD
}

static nb_status ix_dtype_error(const char *op, nb_dtype dt) {
  return nb_error_set(NB_ERR_DTYPE, "%s: dtype %s cannot be accumulated (expected a float or "
                      "integer dtype)", op, nb_dtype_name(dt));
}

/* ---- index_select / index_add ------------------------------------------- */

nb_status nb_cpu_index_select(const nb_kview *out, const nb_kview *x, int axis,
                              const nb_kview *idx) {
  int64_t *ix = NULL;
  ix_plan p;
  nb_status st = ix_load_1d("index_select", idx, axis, x->shape[axis], &ix);
  if (st) return st;
  ix_plan_init(&p, out, axis, INT64_MAX); /* whole vector runs: copies need no chunks */
  const int64_t n = out->shape[axis], nl = p.nlanes;
  const size_t esz = nb_dtype_size(out->dtype);
  const int64_t ovs = ix_vstride(&p, out) * (int64_t)esz, xvs = ix_vstride(&p, x) * (int64_t)esz;
#pragma omp parallel for collapse(2) schedule(static) if (nl * n * p.vlen >= NB_CPU_PAR_MIN)
  for (int64_t l = 0; l < nl; l++)
    for (int64_t j = 0; j < n; j++) {
      char *d = ix_ptr(out, ix_lane_off(&p, out, l) + j * out->strides[axis]);
      const char *s = ix_ptr(x, ix_lane_off(&p, x, l) + ix[j] * x->strides[axis]);
      ix_copy_run(d, ovs, s, xvs, p.vlen, esz);
    }
  free(ix);
  return NB_OK;
}

nb_status nb_cpu_index_add(const nb_kview *out, int axis, const nb_kview *idx,
                           const nb_kview *src, int deterministic) {
  int64_t *ix = NULL;
  ix_plan p;
  (void)deterministic; /* the task plan is deterministic and has no atomics */
  if (!ix_addable(out->dtype)) return ix_dtype_error("index_add", out->dtype);
  nb_status st = ix_load_1d("index_add", idx, axis, out->shape[axis], &ix);
  if (st) return st;
  ix_plan_init(&p, src, axis, IX_CHUNK);
  const int64_t n = src->shape[axis], ntask = p.nlanes * p.nchunks;
  const size_t esz = nb_dtype_size(out->dtype);
  const int64_t ovs = ix_vstride(&p, out) * (int64_t)esz, svs = ix_vstride(&p, src) * (int64_t)esz;
#pragma omp parallel for schedule(static) if (ntask > 1 && n * p.nlanes * p.vlen >= NB_CPU_PAR_MIN)
  for (int64_t t = 0; t < ntask; t++) {
    const int64_t l = t / p.nchunks, k0 = t % p.nchunks * p.chunk;
    const int64_t len = p.vlen - k0 < p.chunk ? p.vlen - k0 : p.chunk;
    const int64_t ob = ix_lane_off(&p, out, l), sb = ix_lane_off(&p, src, l);
    for (int64_t j = 0; j < n; j++) /* index order: the summation order */
      ix_add_run(out->dtype, ix_ptr(out, ob + ix[j] * out->strides[axis]) + k0 * ovs, ovs,
                 ix_ptr(src, sb + j * src->strides[axis]) + k0 * svs, svs, len);
  }
  free(ix);
  return NB_OK;
}

/* ---- gather / scatter_add ------------------------------------------------ */

/* Both walk idx's shape with the plan; along the vector axis each element
 * has its own index, so the inner loop reads idx element by element. */

nb_status nb_cpu_gather(const nb_kview *out, const nb_kview *x, int axis, const nb_kview *idx) {
  ix_plan p;
  nb_status st = ix_check_nd("gather", idx, axis, x->shape[axis]);
  if (st) return st;
  ix_plan_init(&p, out, axis, INT64_MAX);
  const int64_t n = out->ndim ? out->shape[axis] : 1, nl = p.nlanes;
  const size_t esz = nb_dtype_size(out->dtype);
  const int64_t ovs = ix_vstride(&p, out), xvs = ix_vstride(&p, x), ivs = ix_vstride(&p, idx);
#pragma omp parallel for collapse(2) schedule(static) if (nl * n * p.vlen >= NB_CPU_PAR_MIN)
  for (int64_t l = 0; l < nl; l++)
    for (int64_t j = 0; j < n; j++) {
      const int64_t ob = ix_lane_off(&p, out, l) + j * out->strides[axis];
      const int64_t ib = ix_lane_off(&p, idx, l) + j * idx->strides[axis];
      const int64_t xb = ix_lane_off(&p, x, l);
      for (int64_t k = 0; k < p.vlen; k++) {
        int64_t t = nb_cpu_get_i64(ix_ptr(idx, ib + k * ivs), idx->dtype);
        memcpy(ix_ptr(out, ob + k * ovs), ix_ptr(x, xb + k * xvs + t * x->strides[axis]), esz);
      }
    }
  return NB_OK;
}

nb_status nb_cpu_scatter_add(const nb_kview *out, int axis, const nb_kview *idx,
                             const nb_kview *src, int deterministic) {
  ix_plan p;
  (void)deterministic; /* tasks own disjoint destinations: deterministic */
  if (!ix_addable(out->dtype)) return ix_dtype_error("scatter_add", out->dtype);
  nb_status st = ix_check_nd("scatter_add", idx, axis, out->shape[axis]);
  if (st) return st;
  ix_plan_init(&p, idx, axis, IX_CHUNK);
  const int64_t n = idx->ndim ? idx->shape[axis] : 1, ntask = p.nlanes * p.nchunks;
  const int64_t ovs = ix_vstride(&p, out), svs = ix_vstride(&p, src), ivs = ix_vstride(&p, idx);
#pragma omp parallel for schedule(static) if (ntask > 1 && n * p.nlanes * p.vlen >= NB_CPU_PAR_MIN)
  for (int64_t t = 0; t < ntask; t++) {
    const int64_t l = t / p.nchunks, k0 = t % p.nchunks * p.chunk;
    const int64_t k1 = p.vlen - k0 < p.chunk ? p.vlen : k0 + p.chunk;
    const int64_t ob = ix_lane_off(&p, out, l), sb = ix_lane_off(&p, src, l);
    const int64_t ib = ix_lane_off(&p, idx, l);
    for (int64_t j = 0; j < n; j++) /* position order along axis: the summation order */
      for (int64_t k = k0; k < k1; k++) {
        int64_t d = nb_cpu_get_i64(ix_ptr(idx, ib + j * idx->strides[axis] + k * ivs), idx->dtype);
        ix_add_run(out->dtype, ix_ptr(out, ob + d * out->strides[axis] + k * ovs), 0,
                   ix_ptr(src, sb + j * src->strides[axis] + k * svs), 0, 1);
      }
  }
  return NB_OK;
}

/* ---- dropout ------------------------------------------------------------- */

typedef struct {
  double p;
  uint64_t seed, offset;
  nb_dtype dt, xdt; /* out's and x's */
} ix_dropout_ctx;

/* keep = u01(w0) >= p with w0 word 0 of block (seed, offset + i). Comparing
 * the f32 uniform with p in double gives the same answer as comparing with
 * (float)p: the uniforms are floats on a 2^-24 grid, and no grid point lies
 * strictly between p and its nearest float. */
static int ix_keep(const ix_dropout_ctx *c, int64_t i) {
  uint32_t w[4];
  nb_philox4x32(c->seed, c->offset + (uint64_t)i, w);
  return nb_philox_u01(w[0]) >= c->p;
}

/* One strip: operand 0 is out, 1 is x. f64 computes in double, the other
 * float dtypes in f32; dropped elements are exactly 0 (even for inf/NaN). */
static void ix_dropout_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  const ix_dropout_ctx *c = vc;
  const double scale = c->p < 1.0 ? 1.0 / (1.0 - c->p) : 0.0;
  for (int64_t j0 = 0; j0 < n; j0 += NB_CPU_TILE) {
    const int64_t m = n - j0 < NB_CPU_TILE ? n - j0 : NB_CPU_TILE;
    if (c->dt == NB_F64) {
      double t[NB_CPU_TILE];
      nb_cpu_load_f64(c->xdt, m, p[1] + j0 * s[1], s[1], t);
      for (int64_t j = 0; j < m; j++) t[j] = ix_keep(c, lin + j0 + j) ? t[j] * scale : 0.0;
      nb_cpu_store_f64(c->dt, m, t, p[0] + j0 * s[0], s[0]);
    } else {
      float t[NB_CPU_TILE], fs = (float)scale;
      nb_cpu_load_f32(c->xdt, m, p[1] + j0 * s[1], s[1], t);
      for (int64_t j = 0; j < m; j++) t[j] = ix_keep(c, lin + j0 + j) ? t[j] * fs : 0.0f;
      nb_cpu_store_f32(c->dt, m, t, p[0] + j0 * s[0], s[0]);
    }
  }
}

nb_status nb_cpu_dropout(const nb_kview *out, const nb_kview *x, double p, uint64_t seed,
                         uint64_t offset) {
  ix_dropout_ctx c = {p, seed, offset, out->dtype, x->dtype};
  nb_cpu_iter it;
  nb_cpu_iter_views(&it, 2, (const nb_kview *const[]){out, x});
  nb_cpu_iter_run(&it, ix_dropout_strip, &c);
  return NB_OK;
}
