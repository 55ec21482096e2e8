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
 * Shapes: q (.., Lq, D), k (.., Lk, D), v (.., Lk, Dv), o (.., Lq, Dv). */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

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
  int64_t B, Lq, Lk, D, Dv;
} att_dims;

static att_dims att_dims_of(const nb_kview *q, const nb_kview *v) {
  int nd = q->ndim;
  att_dims a = {1, q->shape[nd - 2], v->shape[nd - 2], q->shape[nd - 1], v->shape[nd - 1]};
  for (int d = 0; d < nd - 2; d++) a.B *= q->shape[d];
  return a;
}

/* The keys query i may see: [0, end). */
static int64_t att_end(int64_t i, int64_t Lk, int causal) {
  return causal ? (i + 1 < Lk ? i + 1 : Lk) : Lk;
}

/* One query row of the forward pass; w holds D + Dv + max(D, Dv) + ATT_BLOCK
 * doubles. */
static void att_fwd_row(const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                        const nb_kview *k, const nb_kview *v, double scale, int causal,
                        att_dims a, int64_t b, int64_t i, double *w) {
  double *qr = w, *acc = qr + a.D, *kb = acc + a.Dv, *s = kb + (a.D > a.Dv ? a.D : a.Dv);
  att_load(q, b, i, a.D, qr);
  for (int64_t d = 0; d < a.Dv; d++) acc[d] = 0;
  double m = -INFINITY, l = 0;
  int64_t end = att_end(i, a.Lk, causal);
  for (int64_t j0 = 0; j0 < end; j0 += ATT_BLOCK) {
    int64_t n = end - j0 < ATT_BLOCK ? end - j0 : ATT_BLOCK;
    double bm = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
      att_load(k, b, j0 + t, a.D, kb);
      s[t] = scale * att_dot(qr, kb, a.D);
      if (s[t] > bm) bm = s[t];
    }
    double mn = bm > m ? bm : m;
    double c = m == -INFINITY ? 0 : exp(m - mn);
    l *= c;
    for (int64_t d = 0; d < a.Dv; d++) acc[d] *= c;
    for (int64_t t = 0; t < n; t++) {
      double p = exp(s[t] - mn);
      l += p;
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

nb_status nb_cpu_attn_fwd(const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                          const nb_kview *k, const nb_kview *v, double scale, int causal) {
  att_dims a = att_dims_of(q, v);
  int64_t rows = a.B * a.Lq, wn = a.D + a.Dv + (a.D > a.Dv ? a.D : a.Dv) + ATT_BLOCK;
  int fail = 0;
#pragma omp parallel if (rows * a.Lk * (a.D + a.Dv) >= NB_CPU_PAR_MIN)
  {
    double *w = nb_cpu_scratch((size_t)wn, &fail);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
      if (w) att_fwd_row(o, lse, q, k, v, scale, causal, a, r / a.Lq, r % a.Lq, w);
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
} att_bw;

static double att_lse(const att_bw *c, int64_t b, int64_t i) {
  double L;
  nb_cpu_load_f64(c->lse->dtype, 1,
                  (const char *)c->lse->data + (b * c->a.Lq + i) * nb_dtype_size(c->lse->dtype), 0,
                  &L);
  return L;
}

/* dk and dv of key j: sums over the queries that see it. w: 2 (D + Dv). */
static void att_bwd_key(const att_bw *c, const nb_kview *dk, const nb_kview *dv, int64_t b,
                        int64_t j, double *w) {
  att_dims a = c->a;
  double *kr = w, *vr = kr + a.D, *qr = vr + a.Dv, *gr = qr + a.D;
  double *dkr = gr + a.Dv, *dvr = dkr + a.D;
  att_load(c->k, b, j, a.D, kr);
  att_load(c->v, b, j, a.Dv, vr);
  for (int64_t d = 0; d < a.D; d++) dkr[d] = 0;
  for (int64_t d = 0; d < a.Dv; d++) dvr[d] = 0;
  for (int64_t i = c->causal ? j : 0; i < a.Lq; i++) {
    att_load(c->q, b, i, a.D, qr);
    att_load(c->dout, b, i, a.Dv, gr);
    double p = exp(c->scale * att_dot(qr, kr, a.D) - att_lse(c, b, i));
    double ds = p * (att_dot(gr, vr, a.Dv) - c->delta[b * a.Lq + i]) * c->scale;
    for (int64_t d = 0; d < a.Dv; d++) dvr[d] += p * gr[d];
    for (int64_t d = 0; d < a.D; d++) dkr[d] += ds * qr[d];
  }
  att_store(dk, b, j, a.D, dkr);
  att_store(dv, b, j, a.Dv, dvr);
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
    att_load(c->k, b, j, a.D, kr);
    att_load(c->v, b, j, a.Dv, vr);
    double p = exp(c->scale * att_dot(qr, kr, a.D) - L);
    double ds = p * (att_dot(gr, vr, a.Dv) - delta) * c->scale;
    for (int64_t d = 0; d < a.D; d++) dqr[d] += ds * kr[d];
  }
  att_store(dq, b, i, a.D, dqr);
}

nb_status nb_cpu_attn_bwd(const nb_kview *dq, const nb_kview *dk, const nb_kview *dv,
                          const nb_kview *dout, const nb_kview *q, const nb_kview *k,
                          const nb_kview *v, const nb_kview *o, const nb_kview *lse, double scale,
                          int causal) {
  att_dims a = att_dims_of(q, v);
  int64_t rows = a.B * a.Lq, keys = a.B * a.Lk, wn = 3 * (a.D + a.Dv);
  double *delta = malloc((size_t)(rows ? rows : 1) * sizeof *delta);
  if (!delta) return nb_error_set(NB_ERR_OOM, "attention backward (cpu): out of memory");
  att_bw c = {dout, q, k, v, lse, delta, scale, causal, a};
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
