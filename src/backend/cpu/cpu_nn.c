/* CPU row kernels: softmax and log_softmax, layer and RMS norm, cross-entropy.
 *
 * Every kernel works on rows: all leading axes of a view are flattened into a
 * row index, the last axis is the reduced one. A row is converted into a
 * per-thread double buffer, computed there and converted back, so one code
 * path serves f64, f32, f16 and bf16 and any strides. The CPU backend is the
 * reference the device backends are checked against, so it computes and
 * accumulates in double for every dtype (more precise than the f32 the
 * contract asks for). Rows are independent and split across OpenMP threads;
 * the reductions over rows (norm dw/db) use fixed chunks combined in a fixed
 * order, so results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

/* ---- row addressing ------------------------------------------------------ */

static int64_t nn_numel(const nb_kview *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

/* Length of the last axis (1 for a 0-d view). */
static int64_t nn_cols(const nb_kview *v) { return v->ndim ? v->shape[v->ndim - 1] : 1; }

/* Byte stride along the last axis. */
static int64_t nn_col_stride(const nb_kview *v) {
  return v->ndim ? v->strides[v->ndim - 1] * (int64_t)nb_dtype_size(v->dtype) : 0;
}

/* Address of row r: r unravelled over every axis but the last. */
static char *nn_row(const nb_kview *v, int64_t r) {
  int64_t off = 0;
  for (int d = v->ndim - 2; d >= 0; d--) {
    off += (r % v->shape[d]) * v->strides[d];
    r /= v->shape[d];
  }
  return (char *)v->data + off * (int64_t)nb_dtype_size(v->dtype);
}

/* Address of element i (row-major) of a view of any rank: per-row vectors
 * such as mean, rstd, loss and targets. */
static char *nn_at(const nb_kview *v, int64_t i) {
  int64_t off = 0;
  for (int d = v->ndim - 1; d >= 0; d--) {
    off += (i % v->shape[d]) * v->strides[d];
    i /= v->shape[d];
  }
  return (char *)v->data + off * (int64_t)nb_dtype_size(v->dtype);
}

static double nn_get(const nb_kview *v, int64_t i) {
  double x;
  nb_cpu_load_f64(v->dtype, 1, nn_at(v, i), 0, &x);
  return x;
}

static void nn_put(const nb_kview *v, int64_t i, double x) {
  nb_cpu_store_f64(v->dtype, 1, &x, nn_at(v, i), 0);
}

static void nn_load_row(const nb_kview *v, int64_t r, int64_t n, double *buf) {
  nb_cpu_load_f64(v->dtype, n, nn_row(v, r), nn_col_stride(v), buf);
}

static void nn_store_row(const nb_kview *v, int64_t r, int64_t n, const double *buf) {
  nb_cpu_store_f64(v->dtype, n, buf, nn_row(v, r), nn_col_stride(v));
}

static nb_status nn_oom(const char *op, int64_t n) {
  return nb_error_set(NB_ERR_OOM, "%s: out of memory for a %lld-element row buffer", op,
                      (long long)n);
}

/* Row max; a row of -inf reports 0 so that x - max stays -inf (not NaN). */
static double nn_row_max(const double *a, int64_t n) {
  double m = -INFINITY;
  for (int64_t j = 0; j < n; j++) m = a[j] > m || a[j] != a[j] ? a[j] : m;
  return m == -INFINITY ? 0.0 : m;
}

/* ---- softmax ------------------------------------------------------------- */

/* In place on one row: exp(a - max) / sum, or (a - max) - log(sum): the
 * max is subtracted first, since max + log(sum) would round to an ulp of
 * the logits' size (1e-13 at 1e3) in every f64 output. */
static void nn_softmax_row(double *a, int64_t n, int log_) {
  double m = nn_row_max(a, n), s = 0.0;
  if (log_) {
    for (int64_t j = 0; j < n; j++) s += exp(a[j] - m);
    double ls = log(s);
    for (int64_t j = 0; j < n; j++) a[j] = (a[j] - m) - ls;
    return;
  }
  for (int64_t j = 0; j < n; j++) {
    a[j] = exp(a[j] - m);
    s += a[j];
  }
  double inv = 1.0 / s;
  for (int64_t j = 0; j < n; j++) a[j] *= inv;
}

nb_status nb_cpu_softmax_fwd(const nb_kview *y, const nb_kview *x, int log) {
  const int64_t D = nn_cols(x), R = D ? nn_numel(x) / D : 0;
  int oom = 0;
  if (R == 0) return NB_OK;
#pragma omp parallel if (R * D >= NB_CPU_PAR_MIN)
  {
    double *a = nb_cpu_scratch((size_t)D, &oom);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; r++) {
      if (!a) continue;
      nn_load_row(x, r, D, a);
      nn_softmax_row(a, D, log);
      nn_store_row(y, r, D, a);
    }
    free(a);
  }
  return oom ? nn_oom("softmax", D) : NB_OK;
}

/* softmax: dx = y*(dy - sum(dy*y)); log_softmax: dx = dy - exp(y)*sum(dy).
 * a holds dy on entry and dx on exit; b holds y. */
static void nn_softmax_bwd_row(double *a, const double *b, int64_t n, int log_) {
  double s = 0.0;
  if (log_) {
    for (int64_t j = 0; j < n; j++) s += a[j];
    for (int64_t j = 0; j < n; j++) a[j] -= exp(b[j]) * s;
    return;
  }
  for (int64_t j = 0; j < n; j++) s += a[j] * b[j];
  for (int64_t j = 0; j < n; j++) a[j] = b[j] * (a[j] - s);
}

nb_status nb_cpu_softmax_bwd(const nb_kview *dx, const nb_kview *dy, const nb_kview *y, int log) {
  const int64_t D = nn_cols(y), R = D ? nn_numel(y) / D : 0;
  int oom = 0;
  if (R == 0) return NB_OK;
#pragma omp parallel if (R * D >= NB_CPU_PAR_MIN)
  {
    double *a = nb_cpu_scratch(2 * (size_t)D, &oom);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; r++) {
      if (!a) continue;
      nn_load_row(dy, r, D, a);
      nn_load_row(y, r, D, a + D);
      nn_softmax_bwd_row(a, a + D, D, log);
      nn_store_row(dx, r, D, a);
    }
    free(a);
  }
  return oom ? nn_oom("softmax backward", D) : NB_OK;
}

/* ---- layer norm and RMS norm ------------------------------------------- */

/* A (D) parameter vector as doubles, or NULL when absent. *fail is set when
 * the vector was wanted but could not be allocated. */
static double *nn_param(const nb_kview *v, int64_t D, int *fail) {
  if (!v) return NULL;
  double *a = malloc((size_t)D * sizeof *a);
  if (!a) { *fail = 1; return NULL; }
  for (int64_t j = 0; j < D; j++) a[j] = nn_get(v, j);
  return a;
}

/* Statistics of one row: mean (0 for rms) and rstd. Layer norm uses the
 * two-pass biased variance (no cancellation from E[x^2] - E[x]^2). */
static void nn_norm_stats(const double *a, int64_t D, double eps, int rms, double *mu,
                          double *rstd) {
  double s = 0.0, q = 0.0;
  if (!rms)
    for (int64_t j = 0; j < D; j++) s += a[j];
  *mu = rms ? 0.0 : s / (double)D;
  for (int64_t j = 0; j < D; j++) q += (a[j] - *mu) * (a[j] - *mu);
  *rstd = 1.0 / sqrt(q / (double)D + eps);
}

nb_status nb_cpu_norm_fwd(const nb_kview *y, const nb_kview *mean, const nb_kview *rstd,
                          const nb_kview *x, const nb_kview *w, const nb_kview *b, double eps,
                          int rms) {
  const int64_t D = nn_cols(x), R = D ? nn_numel(x) / D : 0;
  int oom = 0;
  if (R == 0) return NB_OK;
  double *wv = nn_param(w, D, &oom), *bv = nn_param(b, D, &oom);
#pragma omp parallel if (R * D >= NB_CPU_PAR_MIN && !oom)
  {
    double *a = oom ? NULL : nb_cpu_scratch((size_t)D, &oom);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; r++) {
      if (!a) continue;
      double mu, rs;
      nn_load_row(x, r, D, a);
      nn_norm_stats(a, D, eps, rms, &mu, &rs);
      for (int64_t j = 0; j < D; j++) {
        double h = (a[j] - mu) * rs;
        a[j] = (wv ? h * wv[j] : h) + (bv ? bv[j] : 0.0);
      }
      nn_store_row(y, r, D, a);
      if (mean) nn_put(mean, r, mu);
      nn_put(rstd, r, rs);
    }
    free(a);
  }
  free(wv);
  free(bv);
  return oom ? nn_oom(rms ? "rms_norm" : "layer_norm", D) : NB_OK;
}

/* Row chunks for the dw/db reduction: a function of R only, so the sums are
 * the same whatever the number of threads. */
static int64_t nn_norm_chunks(int64_t R) { return R < 64 ? R : 64; }

/* One row of the backward. a = dy on entry, dx on exit; xr = x row.
 * xhat = (x - mu)*rstd, g = dy*w:
 *   dx = rstd * (g - mean(g) - xhat*mean(g*xhat))   (rms: no mean(g) term)
 * pw/pb accumulate dy*xhat and dy for dw and db. */
static void nn_norm_bwd_row(double *a, double *xr, const double *wv, int64_t D, double mu,
                            double rs, int rms, double *pw, double *pb) {
  double sg = 0.0, sgx = 0.0;
  for (int64_t j = 0; j < D; j++) {
    double h = (xr[j] - mu) * rs, g = wv ? a[j] * wv[j] : a[j];
    if (pw) pw[j] += a[j] * h;
    if (pb) pb[j] += a[j];
    xr[j] = h;
    sg += g;
    sgx += g * h;
  }
  double mg = rms ? 0.0 : sg / (double)D, mgx = sgx / (double)D;
  for (int64_t j = 0; j < D; j++) {
    double g = wv ? a[j] * wv[j] : a[j];
    a[j] = rs * (g - mg - xr[j] * mgx);
  }
}

/* Sums the per-chunk partials (nch x D) in chunk order into out (D). */
static void nn_combine(const nb_kview *out, const double *part, int64_t nch, int64_t D) {
#pragma omp parallel for schedule(static) if (nch * D >= NB_CPU_PAR_MIN)
  for (int64_t j = 0; j < D; j++) {
    double s = 0.0;
    for (int64_t c = 0; c < nch; c++) s += part[c * D + j];
    nn_put(out, j, s);
  }
}

nb_status nb_cpu_norm_bwd(const nb_kview *dx, const nb_kview *dw, const nb_kview *db,
                          const nb_kview *dy, const nb_kview *x, const nb_kview *mean,
                          const nb_kview *rstd, const nb_kview *w, int rms) {
  const int64_t D = nn_cols(x), R = D ? nn_numel(x) / D : 0;
  const int64_t nch = nn_norm_chunks(R), per = nch ? (R + nch - 1) / nch : 0;
  int oom = 0;
  if (R == 0) { /* no rows: the parameter gradients are zero */
    for (int64_t j = 0; j < (dw || db ? D : 0); j++) {
      if (dw) nn_put(dw, j, 0.0);
      if (db) nn_put(db, j, 0.0);
    }
    return NB_OK;
  }
  double *wv = nn_param(w, D, &oom);
  double *pw = dw ? calloc((size_t)(nch * D), sizeof *pw) : NULL;
  double *pb = db ? calloc((size_t)(nch * D), sizeof *pb) : NULL;
  if ((dw && !pw) || (db && !pb)) oom = 1;
#pragma omp parallel if (R * D >= NB_CPU_PAR_MIN && !oom)
  {
    double *a = oom ? NULL : nb_cpu_scratch(2 * (size_t)D, &oom);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < nch; c++) {
      for (int64_t r = c * per; a && r < R && r < (c + 1) * per; r++) {
        double mu = rms ? 0.0 : nn_get(mean, r), rs = nn_get(rstd, r);
        nn_load_row(dy, r, D, a);
        nn_load_row(x, r, D, a + D);
        nn_norm_bwd_row(a, a + D, wv, D, mu, rs, rms, pw ? pw + c * D : NULL,
                        pb ? pb + c * D : NULL);
        nn_store_row(dx, r, D, a);
      }
    }
    free(a);
  }
  if (!oom && dw) nn_combine(dw, pw, nch, D);
  if (!oom && db) nn_combine(db, pb, nch, D);
  free(wv);
  free(pw);
  free(pb);
  return oom ? nn_oom(rms ? "rms_norm backward" : "layer_norm backward", D) : NB_OK;
}

/* ---- cross-entropy ------------------------------------------------------- */

/* The first row whose target is neither ignore_index nor in [0, C), or -1. */
static int64_t nn_bad_target(const nb_kview *t, int64_t N, int64_t C, int64_t ignore) {
  for (int64_t i = 0; i < N; i++) {
    int64_t v = nb_cpu_get_i64(nn_at(t, i), t->dtype);
    if (v != ignore && (v < 0 || v >= C)) return i;
  }
  return -1;
}

static nb_status nn_target_error(const nb_kview *t, int64_t row, int64_t C) {
  return nb_error_set(NB_ERR_INDEX,
                      "cross_entropy: target %lld at row %lld is out of range for %lld "
                      "classes (expected 0 <= target < %lld, or ignore_index)",
                      (long long)nb_cpu_get_i64(nn_at(t, row), t->dtype), (long long)row,
                      (long long)C, (long long)C);
}

/* A row's maximum *m, ls = log(sum(exp(a - m))) (returned) and
 * *sdx = sum(a - m): the loss is formed from these differences of the
 * logits, never from lse = m + ls or sum(a), which round to an ulp of the
 * logits' size (1e-13 at 1e3). */
static double nn_lse(const double *a, int64_t n, double *m, double *sdx) {
  double s = 0.0, sd = 0.0;
  *m = nn_row_max(a, n);
  for (int64_t j = 0; j < n; j++) {
    s += exp(a[j] - *m);
    sd += a[j] - *m;
  }
  *sdx = sd;
  return log(s);
}

/* lse - (1-eps) a[t] - eps mean(a) = (1-eps) ((m - a[t]) + ls) + eps (ls -
 * sdx / C); the smoothing term is left out when eps = 0 (sdx is -inf for a
 * row with masked logits). */
static double nn_xent_loss(double m, double ls, double sdx, double at, int64_t C, double eps) {
  double l = (1.0 - eps) * ((m - at) + ls);
  return eps != 0.0 ? l + eps * (ls - sdx / (double)C) : l;
}

nb_status nb_cpu_xent_fwd(const nb_kview *loss, const nb_kview *lse, const nb_kview *logits,
                          const nb_kview *targets, int64_t ignore_index, double smoothing) {
  const int64_t N = logits->shape[0], C = logits->shape[1];
  int oom = 0;
  int64_t bad = nn_bad_target(targets, N, C, ignore_index);
  if (bad >= 0) return nn_target_error(targets, bad, C);
  if (N == 0) return NB_OK;
#pragma omp parallel if (N * C >= NB_CPU_PAR_MIN)
  {
    double *a = nb_cpu_scratch((size_t)(C ? C : 1), &oom);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; i++) {
      if (!a) continue;
      int64_t t = nb_cpu_get_i64(nn_at(targets, i), targets->dtype);
      double l = 0.0, z = 0.0, m, sdx;
      if (t != ignore_index) { /* probabilities are never formed: only lse */
        nn_load_row(logits, i, C, a);
        double ls = nn_lse(a, C, &m, &sdx);
        z = m + ls;
        l = nn_xent_loss(m, ls, sdx, a[t], C, smoothing);
      }
      nn_put(loss, i, l);
      nn_put(lse, i, z);
    }
    free(a);
  }
  return oom ? nn_oom("cross_entropy", C) : NB_OK;
}

nb_status nb_cpu_xent_bwd(const nb_kview *dlogits, const nb_kview *dloss,
                          const nb_kview *logits, const nb_kview *targets, const nb_kview *lse,
                          int64_t ignore_index, double smoothing) {
  const int64_t N = logits->shape[0], C = logits->shape[1];
  const double off = smoothing / (double)C;
  int oom = 0;
  int64_t bad = nn_bad_target(targets, N, C, ignore_index);
  if (bad >= 0) return nn_target_error(targets, bad, C);
  if (N == 0 || C == 0) return NB_OK;
#pragma omp parallel if (N * C >= NB_CPU_PAR_MIN)
  {
    double *a = nb_cpu_scratch((size_t)C, &oom);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; i++) {
      if (!a) continue;
      int64_t t = nb_cpu_get_i64(nn_at(targets, i), targets->dtype);
      if (t == ignore_index) {
        for (int64_t j = 0; j < C; j++) a[j] = 0.0;
      } else {
        double d = nn_get(dloss, i), z = nn_get(lse, i);
        nn_load_row(logits, i, C, a);
        for (int64_t j = 0; j < C; j++) a[j] = d * (exp(a[j] - z) - off);
        a[t] -= d * (1.0 - smoothing);
      }
      nn_store_row(dlogits, i, C, a);
    }
    free(a);
  }
  return oom ? nn_oom("cross_entropy backward", C) : NB_OK;
}

/* One row of the fused entry, a[] holding the logits on entry and dlogits
 * on exit: g (softmax - (1-eps) onehot(t) - eps/C) with softmax = exp(a -
 * m) / sum from the row's own statistics (exp(a - lse) would carry lse's
 * rounding, an ulp of the logits' size, into every probability). Returns
 * the loss; *z gets lse. */
static double nn_xent_fused_row(double *a, int64_t C, int64_t t, double g, double eps, double *z) {
  double m = nn_row_max(a, C), s = 0.0, sdx = 0.0, at = a[t];
  for (int64_t j = 0; j < C; j++) {
    double d = a[j] - m;
    sdx += d;
    a[j] = exp(d);
    s += a[j];
  }
  double ls = log(s), off = eps / (double)C;
  *z = m + ls;
  for (int64_t j = 0; j < C; j++) a[j] = g * (a[j] / s - off);
  a[t] -= g * (1.0 - eps);
  return nn_xent_loss(m, ls, sdx, at, C, eps);
}

/* The fused entry on the CPU: each row's loss, lse and dlogits in one pass
 * with the row gradient dloss (or 1), over N_valid for a mean; then the
 * rows' sum in row order in f64. */
nb_status nb_cpu_xent_fused(const nb_kview *loss, const nb_kview *lse, const nb_kview *dlogits,
                            const nb_kview *dloss, const nb_kview *out, int mean,
                            const nb_kview *logits, const nb_kview *targets,
                            int64_t ignore_index, double smoothing) {
  const int64_t N = logits->shape[0], C = logits->shape[1];
  int oom = 0;
  int64_t bad = nn_bad_target(targets, N, C, ignore_index), nvalid = 0;
  if (bad >= 0) return nn_target_error(targets, bad, C);
  for (int64_t i = 0; i < N; i++)
    nvalid += nb_cpu_get_i64(nn_at(targets, i), targets->dtype) != ignore_index;
#pragma omp parallel if (N * C >= NB_CPU_PAR_MIN)
  {
    double *a = nb_cpu_scratch((size_t)(C ? C : 1), &oom);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; i++) {
      if (!a) continue;
      int64_t t = nb_cpu_get_i64(nn_at(targets, i), targets->dtype);
      double l = 0.0, z = 0.0;
      if (t == ignore_index) {
        for (int64_t j = 0; j < C; j++) a[j] = 0.0;
      } else {
        double g = dloss ? nn_get(dloss, i) : 1.0;
        nn_load_row(logits, i, C, a);
        l = nn_xent_fused_row(a, C, t, mean ? g / (double)nvalid : g, smoothing, &z);
      }
      nn_store_row(dlogits, i, C, a);
      nn_put(loss, i, l);
      if (lse) nn_put(lse, i, z);
    }
    free(a);
  }
  if (oom) return nn_oom("cross_entropy", C);
  if (out) {
    double s = 0.0;
    for (int64_t i = 0; i < N; i++) s += nn_get(loss, i);
    nn_put(out, 0, mean ? s / (double)nvalid : s); /* 0/0 = NaN when every row is ignored */
  }
  return NB_OK;
}
