/* CPU reductions: sum, max, min, argmax, argmin over the trailing axes.
 *
 * in has out->ndim kept axes followed by nred reduced axes, any strides.
 * This backend is the reference, so floats accumulate in f64 and integers
 * in i64 (sums wrap). Three schedules, each with a fixed summation order
 * that does not depend on the number of threads:
 *  - rows: one output at a time, its reduced block walked in row-major
 *    order; outputs split across threads. Sums add 256-element tiles (each
 *    tile summed by a vectorised tree) into one f64 accumulator.
 *  - columns: when consecutive outputs lie closer together in memory than
 *    consecutive reduced elements (a sum over axis 0 of a row-major matrix,
 *    after the ops layer moved that axis last), a block of outputs is
 *    accumulated together, one reduced element after another, so the loads
 *    are contiguous.
 *  - split: few outputs and a long reduction (a full sum): each output's
 *    block is cut into fixed chunks of NB_RED_CHUNK elements, chunks are
 *    reduced in parallel and the partial results combined in chunk order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

#define TILE NB_CPU_TILE
#define NB_RED_CHUNK 65536
#define NB_RED_SPLIT_MAX_OUT 64

/* Running state of one reduction: f64 for floats, i64 for integers. */
typedef struct {
  double f;
  int64_t i;
  int64_t arg; /* flat row-major index of the extreme within the block */
} racc;

typedef struct {
  nb_rop op;
  nb_dtype dt, od;
  int isf;
} rspec;

static int is_max(nb_rop op) { return op == NB_ROP_MAX || op == NB_ROP_ARGMAX; }

static racc racc_init(const rspec *r) {
  racc a = {0, 0, 0};
  if (r->op != NB_ROP_SUM) {
    a.f = is_max(r->op) ? -INFINITY : INFINITY;
    a.i = is_max(r->op) ? INT64_MIN : INT64_MAX;
  }
  return a;
}

/* x beats the current extreme f: strictly better, or the first NaN. */
static inline int beats_f(int mx, double x, double f) {
  return (mx ? x > f : x < f) || (x != x && f == f);
}

static void racc_tile_f(const rspec *r, racc *a, int64_t m, const double *x, int64_t lin) {
  const int mx = is_max(r->op);
  if (r->op == NB_ROP_SUM) {
    double t = 0;
#pragma omp simd reduction(+ : t)
    for (int64_t j = 0; j < m; j++) t += x[j];
    a->f += t;
    return;
  }
  for (int64_t j = 0; j < m; j++)
    if (beats_f(mx, x[j], a->f)) {
      a->f = x[j];
      a->arg = lin + j;
    }
}

static void racc_tile_i(const rspec *r, racc *a, int64_t m, const int64_t *x, int64_t lin) {
  const int mx = is_max(r->op);
  if (r->op == NB_ROP_SUM) {
    uint64_t t = 0;
    for (int64_t j = 0; j < m; j++) t += (uint64_t)x[j];
    a->i = (int64_t)((uint64_t)a->i + t);
    return;
  }
  for (int64_t j = 0; j < m; j++)
    if (mx ? x[j] > a->i : x[j] < a->i) {
      a->i = x[j];
      a->arg = lin + j;
    }
}

typedef struct {
  const rspec *r;
  racc *a;
} row_ctx;

/* One strip of a reduced block, converted a tile at a time. */
static void row_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  const row_ctx *c = vc;
  for (int64_t t = 0; t < n; t += TILE) {
    int64_t m = n - t < TILE ? n - t : TILE;
    if (c->r->isf) {
      double x[TILE];
      nb_cpu_load_f64(c->r->dt, m, p[0] + t * s[0], s[0], x);
      racc_tile_f(c->r, c->a, m, x, lin + t);
    } else {
      int64_t x[TILE];
      nb_cpu_load_i64(c->r->dt, m, p[0] + t * s[0], s[0], x);
      racc_tile_i(c->r, c->a, m, x, lin + t);
    }
  }
}

/* Reduces elements [b, e) of the block at base (rit is a private copy). */
static racc reduce_block(const rspec *r, nb_cpu_iter *rit, char *base, int64_t b, int64_t e) {
  racc a = racc_init(r);
  row_ctx c = {r, &a};
  rit->data[0] = base;
  nb_cpu_iter_range(rit, b, e, row_strip, &c);
  return a;
}

/* Folds b (a later chunk) into a. */
static void racc_merge(const rspec *r, racc *a, const racc *b) {
  const int mx = is_max(r->op);
  if (r->op == NB_ROP_SUM) {
    a->f += b->f;
    a->i = (int64_t)((uint64_t)a->i + (uint64_t)b->i);
  } else if (r->isf ? beats_f(mx, b->f, a->f) : (mx ? b->i > a->i : b->i < a->i)) {
    *a = *b;
  }
}

static void racc_store(const rspec *r, const racc *a, char *p) {
  if (r->op == NB_ROP_ARGMAX || r->op == NB_ROP_ARGMIN) nb_cpu_put_i64(p, r->od, a->arg);
  else if (r->isf) nb_cpu_store_f64(r->od, 1, &a->f, p, 0);
  else nb_cpu_put_i64(p, r->od, a->i);
}

/* ---- rows schedule ------------------------------------------------------ */
typedef struct {
  const rspec *r;
  const nb_cpu_iter *rit;
} out_ctx;

static void rows_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  const out_ctx *c = vc;
  nb_cpu_iter rit = *c->rit; /* private: reduce_block rebases it */
  (void)lin;
  for (int64_t j = 0; j < n; j++) {
    racc a = reduce_block(c->r, &rit, p[1] + j * s[1], 0, rit.numel);
    racc_store(c->r, &a, p[0] + j * s[0]);
  }
}

/* ---- columns schedule --------------------------------------------------- */
typedef struct {
  const rspec *r;
  int64_t m, ks; /* outputs in the block, their input byte stride */
  double *f;
  int64_t *i;
} col_ctx;

/* Every reduced element of the strip: fold m outputs' values into acc. */
static void col_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  const col_ctx *c = vc;
  const int mx = c->r->op == NB_ROP_MAX;
  (void)lin;
  for (int64_t e = 0; e < n; e++) {
    const char *q = p[0] + e * s[0];
    if (c->r->isf) {
      double x[TILE];
      nb_cpu_load_f64(c->r->dt, c->m, q, c->ks, x);
      if (c->r->op == NB_ROP_SUM) {
#pragma omp simd
        for (int64_t j = 0; j < c->m; j++) c->f[j] += x[j];
      } else {
        for (int64_t j = 0; j < c->m; j++)
          if (beats_f(mx, x[j], c->f[j])) c->f[j] = x[j];
      }
    } else {
      int64_t x[TILE];
      nb_cpu_load_i64(c->r->dt, c->m, q, c->ks, x);
      for (int64_t j = 0; j < c->m; j++)
        c->i[j] = c->r->op == NB_ROP_SUM ? (int64_t)((uint64_t)c->i[j] + (uint64_t)x[j])
                  : (mx ? x[j] > c->i[j] : x[j] < c->i[j]) ? x[j] : c->i[j];
    }
  }
}

static void cols_strip(void *vc, int64_t n, char *const *p, const int64_t *s, int64_t lin) {
  const out_ctx *c = vc;
  nb_cpu_iter rit = *c->rit;
  double f[TILE];
  int64_t iv[TILE];
  (void)lin;
  for (int64_t t = 0; t < n; t += TILE) {
    col_ctx cc = {c->r, n - t < TILE ? n - t : TILE, s[1], f, iv};
    racc a0 = racc_init(c->r);
    for (int64_t j = 0; j < cc.m; j++) { f[j] = a0.f; iv[j] = a0.i; }
    rit.data[0] = p[1] + t * s[1];
    nb_cpu_iter_range(&rit, 0, rit.numel, col_strip, &cc);
    for (int64_t j = 0; j < cc.m; j++) {
      racc a = {f[j], iv[j], 0};
      racc_store(c->r, &a, p[0] + (t + j) * s[0]);
    }
  }
}

/* Column schedule pays off when the kept innermost axis is long and steps
 * through memory more finely than the reduced innermost axis. */
static int use_columns(nb_rop op, const nb_cpu_iter *kit, const nb_cpu_iter *rit) {
  int64_t ks = kit->stride[1][kit->ndim - 1], rs = rit->stride[0][rit->ndim - 1];
  if (op != NB_ROP_SUM && op != NB_ROP_MAX && op != NB_ROP_MIN) return 0;
  if (kit->shape[kit->ndim - 1] < 8 || rit->numel < 2) return 0;
  return llabs(ks) < llabs(rs);
}

/* ---- split schedule ----------------------------------------------------- */
/* Byte offset of output o's block in in, and of o in out. */
static void out_offsets(const nb_kview *out, const nb_kview *in, int64_t o, int64_t *io,
                        int64_t *oo) {
  int64_t ie = 0, oe = 0;
  for (int d = out->ndim - 1; d >= 0; d--) {
    int64_t k = o % out->shape[d];
    o /= out->shape[d];
    ie += k * in->strides[d];
    oe += k * out->strides[d];
  }
  *io = ie * (int64_t)nb_dtype_size(in->dtype);
  *oo = oe * (int64_t)nb_dtype_size(out->dtype);
}

static nb_status reduce_split(const rspec *r, const nb_kview *out, const nb_kview *in,
                              const nb_cpu_iter *rit0, int64_t nout) {
  const int64_t R = rit0->numel, nch = (R + NB_RED_CHUNK - 1) / NB_RED_CHUNK;
  racc *part = malloc((size_t)(nout * nch) * sizeof *part);
  if (!part)
    return nb_error_set(NB_ERR_OOM, "cpu reduce: out of memory for %lld partial results",
                        (long long)(nout * nch));
#pragma omp parallel
  {
    nb_cpu_iter rit = *rit0;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < nout * nch; t++) {
      int64_t o = t / nch, c = t % nch, io, oo;
      int64_t e = (c + 1) * NB_RED_CHUNK < R ? (c + 1) * NB_RED_CHUNK : R;
      out_offsets(out, in, o, &io, &oo);
      part[t] = reduce_block(r, &rit, (char *)in->data + io, c * NB_RED_CHUNK, e);
    }
  }
  for (int64_t o = 0; o < nout; o++) {
    int64_t io, oo;
    for (int64_t c = 1; c < nch; c++) racc_merge(r, &part[o * nch], &part[o * nch + c]);
    out_offsets(out, in, o, &io, &oo);
    racc_store(r, &part[o * nch], (char *)out->data + oo);
  }
  free(part);
  return NB_OK;
}

/* ---- entry -------------------------------------------------------------- */
nb_status nb_cpu_reduce(nb_rop op, const nb_kview *out, const nb_kview *in, int nred) {
  const int nk = out->ndim;
  rspec r = {op, in->dtype, out->dtype, nb_dtype_is_float(in->dtype)};
  if ((unsigned)op >= NB_ROP_COUNT)
    return nb_error_set(NB_ERR_VALUE, "cpu reduce: unknown op %d", (int)op);
  if (nred < 0 || in->ndim != nk + nred)
    return nb_error_set(NB_ERR_SHAPE, "cpu reduce: input has %d axes, output %d, reducing %d",
                        in->ndim, nk, nred);
  nb_cpu_iter kit, rit;
  size_t ies = nb_dtype_size(in->dtype), oes = nb_dtype_size(out->dtype);
  nb_cpu_iter_init(&kit, nk, out->shape, 2, (void *const[]){out->data, in->data},
                   (const int64_t *const[]){out->strides, in->strides},
                   (const size_t[]){oes, ies});
  nb_cpu_iter_init(&rit, nred, in->shape + nk, 1, (void *const[]){in->data},
                   (const int64_t *const[]){in->strides + nk}, &ies);
  if (!kit.numel) return NB_OK;
  if (!rit.numel) {
    if (op == NB_ROP_SUM) return nb_cpu_fill(out, 0);
    return nb_error_set(NB_ERR_SHAPE, "cpu reduce: op %d over zero elements", (int)op);
  }
  if (kit.numel < NB_RED_SPLIT_MAX_OUT && rit.numel >= 2 * NB_RED_CHUNK)
    return reduce_split(&r, out, in, &rit, kit.numel);
  out_ctx c = {&r, &rit};
  int par = kit.numel > 1 && kit.numel * rit.numel >= NB_CPU_PAR_MIN;
  nb_cpu_iter_run_par(&kit, use_columns(op, &kit, &rit) ? cols_strip : rows_strip, &c, par);
  return NB_OK;
}
