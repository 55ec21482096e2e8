/* CPU optimizer steps: AdamW and SGD, in place on contiguous tensors.
 *
 * Elements are independent, so the tensors are cut into tiles; a tile of
 * every operand is converted to double on the stack, updated and converted
 * back. Parameters may be any float dtype; the moment buffers are whatever
 * dtype they were allocated with (f32 by contract). The update arithmetic is
 * in double on the CPU, the reference backend. */
#include <math.h>
#include <stdlib.h>

#include "backend/amp_rule.h"
#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

static int64_t op_numel(const nb_kview *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

/* Tile t of a contiguous view: its first element's address. */
static char *op_tile(const nb_kview *v, int64_t t) {
  return (char *)v->data + (size_t)(t * NB_CPU_TILE) * nb_dtype_size(v->dtype);
}

static void op_load(const nb_kview *v, int64_t t, int64_t n, double *buf) {
  nb_cpu_load_f64(v->dtype, n, op_tile(v, t), (int64_t)nb_dtype_size(v->dtype), buf);
}

static void op_store(const nb_kview *v, int64_t t, int64_t n, const double *buf) {
  nb_cpu_store_f64(v->dtype, n, buf, op_tile(v, t), (int64_t)nb_dtype_size(v->dtype));
}

/* What one AdamW pass reads besides the tensors: the constants from the
 * step count, and under device control (nb_adamw_args.ctl, here in host
 * memory) the skip flag and the gradient multiplier. */
typedef struct {
  double beta1, beta2, eps, decay, step_size, inv_sqrt_c2, gscale;
  int skip, scaled;
} adamw_run;

static adamw_run adamw_prepare(const nb_adamw_args *a) {
  adamw_run r = {a->beta1, a->beta2, a->eps, 1.0 - a->lr * a->weight_decay, 0, 0, 1.0, 0, 0};
  double t = (double)a->step;
  if (a->ctl) {
    r.skip = a->ctl[NB_AMP_FOUND] != 0;
    r.scaled = 1;
    r.gscale = a->ctl[NB_AMP_GSCALE];
    t = a->ctl[NB_AMP_GOOD] - *a->step_base;
  }
  const double c1 = 1.0 - pow(a->beta1, t), c2 = 1.0 - pow(a->beta2, t);
  r.step_size = a->lr / c1; /* one division per element */
  r.inv_sqrt_c2 = 1.0 / sqrt(c2);
  return r;
}

/* buf[0 .. k) rounded to dtype dt (as a store and a load would). */
static void op_round(nb_dtype dt, int64_t k, double *buf) {
  double tmp[NB_CPU_TILE];
  nb_cpu_store_f64(dt, k, buf, (char *)tmp, (int64_t)nb_dtype_size(dt));
  nb_cpu_load_f64(dt, k, (const char *)tmp, (int64_t)nb_dtype_size(dt), buf);
}

/* m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr*wd*p (decoupled);
 * p -= lr * (m/c1) / (sqrt(v/c2) + eps), c1, c2 the bias corrections; w
 * (may be NULL) = p rounded, from p as stored. */
static void adamw_tensor(const nb_kview *p, const nb_kview *g, const nb_kview *m,
                         const nb_kview *v, const nb_kview *w, const adamw_run *r) {
  const int64_t n = op_numel(p), ntile = (n + NB_CPU_TILE - 1) / NB_CPU_TILE;
  const double beta1 = r->beta1, beta2 = r->beta2, eps = r->eps, decay = r->decay;
  const double step_size = r->step_size, inv_sqrt_c2 = r->inv_sqrt_c2;
#pragma omp parallel for schedule(static) if (n >= NB_CPU_PAR_MIN)
  for (int64_t t = 0; t < ntile; t++) {
    double tp[NB_CPU_TILE], tg[NB_CPU_TILE], tm[NB_CPU_TILE], tv[NB_CPU_TILE];
    const int64_t k = n - t * NB_CPU_TILE < NB_CPU_TILE ? n - t * NB_CPU_TILE : NB_CPU_TILE;
    op_load(p, t, k, tp);
    if (!r->skip) {
      op_load(g, t, k, tg);
      op_load(m, t, k, tm);
      op_load(v, t, k, tv);
      if (r->scaled) {
        for (int64_t j = 0; j < k; j++) tg[j] *= r->gscale;
        op_round(g->dtype, k, tg);
      }
      for (int64_t j = 0; j < k; j++) {
        tm[j] = beta1 * tm[j] + (1.0 - beta1) * tg[j];
        tv[j] = beta2 * tv[j] + (1.0 - beta2) * tg[j] * tg[j];
        tp[j] = tp[j] * decay - step_size * tm[j] / (sqrt(tv[j]) * inv_sqrt_c2 + eps);
      }
      op_store(p, t, k, tp);
      op_store(m, t, k, tm);
      op_store(v, t, k, tv);
    }
    if (w && w->data) {
      op_round(p->dtype, k, tp); /* the master as stored, then rounded once more */
      op_store(w, t, k, tp);
    }
  }
}

nb_status nb_cpu_adamw_step(const nb_kview *p, const nb_kview *g, const nb_kview *m,
                            const nb_kview *v, double lr, double beta1, double beta2,
                            double eps, double weight_decay, int64_t step) {
  nb_adamw_args a = {lr, beta1, beta2, eps, weight_decay, step, NULL, NULL};
  adamw_run r = adamw_prepare(&a);
  adamw_tensor(p, g, m, v, NULL, &r);
  return NB_OK;
}

/* d = g + wd*p; with momentum: buf = momentum*buf + (1-dampening)*d and
 * d = nesterov ? d + momentum*buf : buf; p -= lr*d. buf may be NULL when
 * momentum is 0. (First-step initialisation of buf is the caller's.) */
nb_status nb_cpu_sgd_step(const nb_kview *p, const nb_kview *g, const nb_kview *buf, double lr,
                          double momentum, double dampening, int nesterov,
                          double weight_decay) {
  const int64_t n = op_numel(p), ntile = (n + NB_CPU_TILE - 1) / NB_CPU_TILE;
  const int use_buf = momentum != 0.0 && buf;
#pragma omp parallel for schedule(static) if (n >= NB_CPU_PAR_MIN)
  for (int64_t t = 0; t < ntile; t++) {
    double tp[NB_CPU_TILE], tg[NB_CPU_TILE], tb[NB_CPU_TILE];
    const int64_t k = n - t * NB_CPU_TILE < NB_CPU_TILE ? n - t * NB_CPU_TILE : NB_CPU_TILE;
    op_load(p, t, k, tp);
    op_load(g, t, k, tg);
    if (use_buf) op_load(buf, t, k, tb);
    for (int64_t j = 0; j < k; j++) {
      double d = tg[j] + weight_decay * tp[j];
      if (use_buf) {
        tb[j] = momentum * tb[j] + (1.0 - dampening) * d;
        d = nesterov ? d + momentum * tb[j] : tb[j];
      }
      tp[j] -= lr * d;
    }
    op_store(p, t, k, tp);
    if (use_buf) op_store(buf, t, k, tb);
  }
  return NB_OK;
}

/* AdamW over a list of tensors: the per-tensor kernel in order, so the
 * results are those of n adamw_step calls bit for bit (each call already
 * runs its tiles in parallel). */
static nb_status multi_dtypes_ok(const char *op, int n, const nb_kview *x) {
  for (int i = 0; i < n; i++)
    if (!nb_dtype_is_float(x[i].dtype))
      return nb_error_set(NB_ERR_DTYPE, "cpu %s: tensor %d is %s (expected a float dtype)", op, i,
                          nb_dtype_name(x[i].dtype));
  return NB_OK;
}

/* Gradient clipping's passes (see backend.h). The sum of squares: one
 * partial per tile (tiles in parallel), then the partials added tensor by
 * tensor, tile by tile, in order: the same sum for any thread count. */
static nb_status sumsq_add(const nb_kview *x, double *sum) {
  const int64_t ne = op_numel(x), ntile = (ne + NB_CPU_TILE - 1) / NB_CPU_TILE;
  double *part = malloc((size_t)(ntile ? ntile : 1) * sizeof *part);
  if (!part) return nb_error_set(NB_ERR_OOM, "cpu sumsq_multi: out of memory for %lld partial sums",
                                 (long long)ntile);
#pragma omp parallel for schedule(static) if (ne >= NB_CPU_PAR_MIN)
  for (int64_t t = 0; t < ntile; t++) {
    double b[NB_CPU_TILE], s = 0;
    const int64_t k = ne - t * NB_CPU_TILE < NB_CPU_TILE ? ne - t * NB_CPU_TILE : NB_CPU_TILE;
    op_load(x, t, k, b);
    for (int64_t j = 0; j < k; j++) s += b[j] * b[j];
    part[t] = s;
  }
  for (int64_t t = 0; t < ntile; t++) *sum += part[t];
  free(part);
  return NB_OK;
}

nb_status nb_cpu_sumsq_multi(int n, const nb_kview *x, const nb_kview *out) {
  if (out->dtype != NB_F64 || op_numel(out) != 1)
    return nb_error_set(NB_ERR_DTYPE, "cpu sumsq_multi: out is %s with %lld elements (expected one f64)",
                        nb_dtype_name(out->dtype), (long long)op_numel(out));
  nb_status st = multi_dtypes_ok("sumsq_multi", n, x);
  double s = 0;
  for (int i = 0; i < n && !st; i++) st = sumsq_add(&x[i], &s);
  if (!st) *(double *)out->data = s;
  return st;
}

nb_status nb_cpu_scale_multi(int n, const nb_kview *x, double s) {
  nb_status st = multi_dtypes_ok("scale_multi", n, x);
  if (st) return st;
  for (int i = 0; i < n; i++) {
    const int64_t ne = op_numel(&x[i]), ntile = (ne + NB_CPU_TILE - 1) / NB_CPU_TILE;
#pragma omp parallel for schedule(static) if (ne >= NB_CPU_PAR_MIN)
    for (int64_t t = 0; t < ntile; t++) {
      double b[NB_CPU_TILE];
      const int64_t k = ne - t * NB_CPU_TILE < NB_CPU_TILE ? ne - t * NB_CPU_TILE : NB_CPU_TILE;
      op_load(&x[i], t, k, b);
      for (int64_t j = 0; j < k; j++) b[j] *= s;
      op_store(&x[i], t, k, b);
    }
  }
  return NB_OK;
}

nb_status nb_cpu_adamw_multi(int n, const nb_kview *p, const nb_kview *g, const nb_kview *m,
                             const nb_kview *v, double lr, double beta1, double beta2, double eps,
                             double weight_decay, int64_t step) {
  nb_adamw_args a = {lr, beta1, beta2, eps, weight_decay, step, NULL, NULL};
  return nb_cpu_adamw_multi_ex(n, p, g, m, v, NULL, &a);
}

nb_status nb_cpu_adamw_multi_ex(int n, const nb_kview *p, const nb_kview *g, const nb_kview *m,
                                const nb_kview *v, const nb_kview *w, const nb_adamw_args *a) {
  adamw_run r = adamw_prepare(a);
  for (int i = 0; i < n; i++) adamw_tensor(&p[i], &g[i], &m[i], &v[i], w ? &w[i] : NULL, &r);
  return NB_OK;
}

/* The scaler's decision and update: amp_rule.h. */
nb_status nb_cpu_amp_update(const nb_kview *ctl, const nb_kview *scale32, const nb_amp_args *a) {
  double s = nb_amp_rule((double *)ctl->data, a);
  *(float *)scale32->data = (float)s;
  return NB_OK;
}
