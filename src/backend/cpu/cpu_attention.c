/* CPU attention without a (Lq, Lk) matrix: the flash-attention algorithm,
 * the reference the device kernels are checked against.
 *
 * Forward, per query row: keys stream through in blocks of ATT_BLOCK; the
 * row keeps its running max m, the sum l of exp(s - m) and the unnormalised
 * output, rescaled when the max grows; o = acc / l and lse = m + log(l) are
 * written at the end. Backward recomputes each probability from lse:
 * p = exp(scale q.k - lse), dp = dout.v, ds = p (dp - delta) with delta =
 * dout.o per row; dk and dv are summed per key over the queries (one pass
 * over keys), dq per query over the keys (a second pass), so no two threads
 * write one element and the bits do not depend on the thread count.
 * Everything is computed in double; memory is O(L) per thread.
 * Shapes: q (.., Lq, D), k (.., Lk, D), v (.., Lk, Dv), o (.., Lq, Dv).
 *
 * The optional parts (nb_attn_extra): the mask's value at (b, i, j) is
 * added to the scaled score (bool: 0 or -inf); a row whose every score is
 * -inf gets o = 0, lse = -inf and zero gradients (p = 0 for it, never
 * exp(-inf + inf)). Dropout multiplies p(b, i, j) by z = keep / (1 - p)
 * after the softmax (the row sums l are dropout's input, so lse is
 * unchanged): o = sum_j p z v; backward dv += p z dout, dp = z dout.v,
 * ds = p (dp - delta), delta = dout.o as without dropout. Grouped-query
 * attention runs on the split views of attn_group.h; dk and dv of kv batch
 * bk sum over its G query heads in order. */
#include <math.h>
#include <stdlib.h>

#include "backend/attn_group.h"
#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"
#include "core/philox.h"

#define ATT_BLOCK 64

/* Address of row i of batch index b of a rank nb+2 view (b unravelled over
 * the leading nb axes). */
static const char *att_row(const nb_kview *v, int64_t b, int64_t i) {
  int nd = v->ndim;
  int64_t off = i * v->strides[nd - 2];
  for (int d = nd - 3; d >= 0; d--) {
    off += (b % v->shape[d]) * v->strides[d];
    b /= v->shape[d];
  }
  return (const char *)v->data + off * (int64_t)nb_dtype_size(v->dtype);
}

static void att_load(const nb_kview *v, int64_t b, int64_t i, int64_t n, double *buf) {
  nb_cpu_load_f64(v->dtype, n, att_row(v, b, i), (int64_t)nb_dtype_size(v->dtype), buf);
}

static void att_store(const nb_kview *v, int64_t b, int64_t i, int64_t n, const double *buf) {
  nb_cpu_store_f64(v->dtype, n, buf, (char *)att_row(v, b, i), (int64_t)nb_dtype_size(v->dtype));
}

static double att_dot(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

/* Batch count and the three lengths of the problem. */
typedef struct {
  int64_t B, Lq, Lk, D, Dv, G; /* G: query heads per kv head (1 without grouping) */
} att_dims;

static att_dims att_dims_of(const nb_kview *q, const nb_kview *v, int64_t G) {
  int nd = q->ndim;
  att_dims a = {1, q->shape[nd - 2], v->shape[nd - 2], q->shape[nd - 1], v->shape[nd - 1], G};
  for (int d = 0; d < nd - 2; d++) a.B *= q->shape[d];
  return a;
}

/* The optional parts as the rows read them. */
typedef struct {
  const nb_kview *mask; /* NULL or (.., Lq, Lk) */
  double p, zs;         /* dropout probability (0: none) and 1 / (1 - p) */
  uint64_t seed, offset;
} att_ext;

static att_ext att_ext_of(const nb_attn_extra *x) {
  att_ext e = {NULL, 0, 1, 0, 0};
  if (!x) return e;
  e.mask = x->mask;
  if (x->dropout_p > 0) {
    e.p = x->dropout_p;
    e.zs = x->dropout_p < 1 ? 1.0 / (1.0 - x->dropout_p) : 0.0;
    e.seed = x->seed;
    e.offset = x->offset;
  }
  return e;
}

/* Mask values of keys [j0, j0 + n) of row (b, i), n <= ATT_BLOCK, added
 * into s (bool: 0 where true, -inf where false). */
static void att_mask_add(const att_ext *e, int64_t b, int64_t i, int64_t j0, int64_t n, double *s) {
  const nb_kview *m = e->mask;
  if (!m) return;
  int64_t cs = m->strides[m->ndim - 1] * (int64_t)nb_dtype_size(m->dtype);
  const char *r = att_row(m, b, i) + j0 * cs;
  if (m->dtype == NB_BOOL) {
    for (int64_t t = 0; t < n; t++) s[t] += *(const uint8_t *)(r + t * cs) ? 0.0 : -INFINITY;
    return;
  }
  double mv[ATT_BLOCK];
  nb_cpu_load_f64(m->dtype, n, r, cs, mv); /* the row's values at once, not one switch each */
  for (int64_t t = 0; t < n; t++) s[t] += mv[t];
}

/* The dropout factor of element (b, i, j): z = keep / (1 - p), 1 without
 * dropout; keep as nb_dropout decides it for that element's index. */
static double att_drop(const att_ext *e, const att_dims *a, int64_t b, int64_t i, int64_t j) {
  if (!(e->p > 0)) return 1.0;
  uint32_t w[4];
  nb_philox4x32(e->seed, e->offset + (uint64_t)((b * a->Lq + i) * a->Lk + j), w);
  return nb_philox_u01(w[0]) >= e->p ? e->zs : 0.0;
}

/* exp(s - L), 0 for a row with no allowed key (L = -inf) or a masked s. */
static double att_prob(double s, double L) { return L == -INFINITY || s == -INFINITY ? 0.0 : exp(s - L); }

/* The keys query i may see: [0, end). */
static int64_t att_end(int64_t i, int64_t Lk, int causal) {
  return causal ? (i + 1 < Lk ? i + 1 : Lk) : Lk;
}

/* One query row of the forward pass; w holds D + Dv + max(D, Dv) + ATT_BLOCK
 * doubles. */
static void att_fwd_row(const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                        const nb_kview *k, const nb_kview *v, double scale, int causal,
                        const att_ext *e, att_dims a, int64_t b, int64_t i, double *w) {
  double *qr = w, *acc = qr + a.D, *kb = acc + a.Dv, *s = kb + (a.D > a.Dv ? a.D : a.Dv);
  att_load(q, b, i, a.D, qr);
  for (int64_t d = 0; d < a.Dv; d++) acc[d] = 0;
  double m = -INFINITY, l = 0;
  int64_t end = att_end(i, a.Lk, causal);
  for (int64_t j0 = 0; j0 < end; j0 += ATT_BLOCK) {
    int64_t n = end - j0 < ATT_BLOCK ? end - j0 : ATT_BLOCK;
    for (int64_t t = 0; t < n; t++) {
      att_load(k, b, j0 + t, a.D, kb);
      s[t] = scale * att_dot(qr, kb, a.D);
    }
    att_mask_add(e, b, i, j0, n, s);
    double bm = -INFINITY;
    for (int64_t t = 0; t < n; t++)
      if (s[t] > bm) bm = s[t];
    double mn = bm > m ? bm : m;
    if (mn == -INFINITY) continue; /* every key so far masked */
    double c = m == -INFINITY ? 0 : exp(m - mn);
    l *= c;
    for (int64_t d = 0; d < a.Dv; d++) acc[d] *= c;
    for (int64_t t = 0; t < n; t++) {
      double p = att_prob(s[t], mn);
      l += p;
      p *= att_drop(e, &a, b, i, j0 + t);
      if (p == 0) continue;
      att_load(v, b, j0 + t, a.Dv, kb);
      for (int64_t d = 0; d < a.Dv; d++) acc[d] += p * kb[d];
    }
    m = mn;
  }
  for (int64_t d = 0; d < a.Dv; d++) acc[d] = l > 0 ? acc[d] / l : 0;
  att_store(o, b, i, a.Dv, acc);
  double L = l > 0 ? m + log(l) : -INFINITY;
  nb_cpu_store_f64(lse->dtype, 1, &L, (char *)lse->data + (b * a.Lq + i) * nb_dtype_size(lse->dtype), 0);
}

nb_status nb_cpu_attn_fwd(const nb_kview *o0, const nb_kview *lse, const nb_kview *q0,
                          const nb_kview *k0, const nb_kview *v0, double scale, int causal,
                          const nb_attn_extra *x) {
  nb_kview qv[3] = {*q0, *o0}, kv[2] = {*k0, *v0};
  if (x && x->mask) qv[2] = *x->mask;
  int64_t G = nb_attn_group_views(q0, k0, qv, x && x->mask ? 3 : 2, kv, 2);
  if (!G) return nb_error_set(NB_ERR_UNSUPPORTED, "attention (cpu): grouped heads need one more axis");
  const nb_kview *q = &qv[0], *o = &qv[1], *k = &kv[0], *v = &kv[1];
  att_ext e = att_ext_of(x);
  if (e.mask) e.mask = &qv[2];
  att_dims a = att_dims_of(q, v, G);
  int64_t rows = a.B * a.Lq, wn = a.D + a.Dv + (a.D > a.Dv ? a.D : a.Dv) + ATT_BLOCK;
  int fail = 0;
#pragma omp parallel if (rows * a.Lk * (a.D + a.Dv) >= NB_CPU_PAR_MIN)
  {
    double *w = nb_cpu_scratch((size_t)wn, &fail);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
      if (w) att_fwd_row(o, lse, q, k, v, scale, causal, &e, a, r / a.Lq, r % a.Lq, w);
    free(w);
  }
  return fail ? nb_error_set(NB_ERR_OOM, "attention (cpu): out of memory for row scratch") : NB_OK;
}

/* The backward's shared inputs. */
typedef struct {
  const nb_kview *dout, *q, *k, *v, *lse;
  const double *delta; /* dout.o per (b, i) */
  double scale;
  int causal;
  att_dims a;
  att_ext e;
} att_bw;

static double att_lse(const att_bw *c, int64_t b, int64_t i) {
  double L;
  nb_cpu_load_f64(c->lse->dtype, 1,
                  (const char *)c->lse->data + (b * c->a.Lq + i) * nb_dtype_size(c->lse->dtype), 0,
                  &L);
  return L;
}

/* The probability of (b, i, j) recomputed from lse, and its dropout factor
 * in *z; qr, kr: q's row i and k's row j. */
static double att_bw_prob(const att_bw *c, int64_t b, int64_t i, int64_t j, const double *qr,
                          const double *kr, double L, double *z) {
  double s = c->scale * att_dot(qr, kr, c->a.D);
  att_mask_add(&c->e, b, i, j, 1, &s);
  *z = att_drop(&c->e, &c->a, b, i, j);
  return att_prob(s, L);
}

/* dk and dv of key j of kv batch bk: sums over the queries that see it, of
 * the G query heads bk G + g in order. w: 3 (D + Dv). */
static void att_bwd_key(const att_bw *c, const nb_kview *dk, const nb_kview *dv, int64_t bk,
                        int64_t j, double *w) {
  att_dims a = c->a;
  double *kr = w, *vr = kr + a.D, *qr = vr + a.Dv, *gr = qr + a.D;
  double *dkr = gr + a.Dv, *dvr = dkr + a.D;
  att_load(c->k, bk * a.G, j, a.D, kr);
  att_load(c->v, bk * a.G, j, a.Dv, vr);
  for (int64_t d = 0; d < a.D; d++) dkr[d] = 0;
  for (int64_t d = 0; d < a.Dv; d++) dvr[d] = 0;
  for (int64_t b = bk * a.G; b < (bk + 1) * a.G; b++)
    for (int64_t i = c->causal ? j : 0; i < a.Lq; i++) {
      double z, L = att_lse(c, b, i);
      att_load(c->q, b, i, a.D, qr);
      double p = att_bw_prob(c, b, i, j, qr, kr, L, &z);
      if (p == 0) continue;
      att_load(c->dout, b, i, a.Dv, gr);
      double ds = p * (z * att_dot(gr, vr, a.Dv) - c->delta[b * a.Lq + i]) * c->scale;
      for (int64_t d = 0; d < a.Dv; d++) dvr[d] += p * z * gr[d];
      for (int64_t d = 0; d < a.D; d++) dkr[d] += ds * qr[d];
    }
  att_store(dk, bk * a.G, j, a.D, dkr);
  att_store(dv, bk * a.G, j, a.Dv, dvr);
}

/* dq of query i: a sum over the keys it sees. w: 2 D + 2 Dv. */
static void att_bwd_query(const att_bw *c, const nb_kview *dq, int64_t b, int64_t i, double *w) {
  att_dims a = c->a;
  double *qr = w, *gr = qr + a.D, *kr = gr + a.Dv, *vr = kr + a.D, *dqr = vr + a.Dv;
  att_load(c->q, b, i, a.D, qr);
  att_load(c->dout, b, i, a.Dv, gr);
  double L = att_lse(c, b, i), delta = c->delta[b * a.Lq + i];
  for (int64_t d = 0; d < a.D; d++) dqr[d] = 0;
  int64_t end = att_end(i, a.Lk, c->causal);
  for (int64_t j = 0; j < end; j++) {
    double z;
    att_load(c->k, b, j, a.D, kr);
    double p = att_bw_prob(c, b, i, j, qr, kr, L, &z);
    if (p == 0) continue;
    att_load(c->v, b, j, a.Dv, vr);
    double ds = p * (z * att_dot(gr, vr, a.Dv) - delta) * c->scale;
    for (int64_t d = 0; d < a.D; d++) dqr[d] += ds * kr[d];
  }
  att_store(dq, b, i, a.D, dqr);
}

nb_status nb_cpu_attn_bwd(const nb_kview *dq0, const nb_kview *dk0, const nb_kview *dv0,
                          const nb_kview *dout0, const nb_kview *q0, const nb_kview *k0,
                          const nb_kview *v0, const nb_kview *o0, const nb_kview *lse, double scale,
                          int causal, const nb_attn_extra *x) {
  nb_kview qv[5] = {*q0, *o0, *dout0, *dq0}, kv[4] = {*k0, *v0, *dk0, *dv0};
  if (x && x->mask) qv[4] = *x->mask;
  int64_t G = nb_attn_group_views(q0, k0, qv, x && x->mask ? 5 : 4, kv, 4);
  if (!G)
    return nb_error_set(NB_ERR_UNSUPPORTED, "attention backward (cpu): grouped heads need one more axis");
  const nb_kview *q = &qv[0], *o = &qv[1], *dout = &qv[2], *dq = &qv[3];
  const nb_kview *k = &kv[0], *v = &kv[1], *dk = &kv[2], *dv = &kv[3];
  att_dims a = att_dims_of(q, v, G);
  int64_t rows = a.B * a.Lq, keys = a.B / G * a.Lk, wn = 3 * (a.D + a.Dv);
  double *delta = malloc((size_t)(rows ? rows : 1) * sizeof *delta);
  if (!delta) return nb_error_set(NB_ERR_OOM, "attention backward (cpu): out of memory");
  att_bw c = {dout, q, k, v, lse, delta, scale, causal, a, att_ext_of(x)};
  if (c.e.mask) c.e.mask = &qv[4];
  int par = rows * a.Lk * (a.D + a.Dv) >= NB_CPU_PAR_MIN, fail = 0;
#pragma omp parallel if (par)
  {
    double *w = nb_cpu_scratch((size_t)wn, &fail);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      if (!w) continue;
      att_load(dout, r / a.Lq, r % a.Lq, a.Dv, w);
      att_load(o, r / a.Lq, r % a.Lq, a.Dv, w + a.Dv);
      delta[r] = att_dot(w, w + a.Dv, a.Dv);
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < keys; r++)
      if (w) att_bwd_key(&c, dk, dv, r / a.Lk, r % a.Lk, w);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
      if (w) att_bwd_query(&c, dq, r / a.Lq, r % a.Lq, w);
    free(w);
  }
  free(delta);
  return fail ? nb_error_set(NB_ERR_OOM, "attention backward (cpu): out of memory") : NB_OK;
}
