/* layer_norm and rms_norm over the trailing n_norm axes: one kernel forward
 * that saves the per-row mean and reciprocal standard deviation, one kernel
 * backward that gives dx, dweight and dbias together. */
#include <math.h>
#include <string.h>

#include "ops/ops.h"


/* x viewed as (R, D) rows of the normalised trailing axes; x contiguous. */
static void norm_rows(const nb_tensor *x, int n_norm, int64_t *R, int64_t *D) {
  *D = nb_shape_numel(n_norm, x->shape + x->ndim - n_norm);
  *R = nb_shape_numel(x->ndim - n_norm, x->shape);
}

static void kview_2d(const nb_tensor *t, int64_t R, int64_t D, nb_kview *v) {
  nb_kview_of(t, v);
  v->ndim = 2;
  v->shape[0] = R; v->shape[1] = D;
  v->strides[0] = D; v->strides[1] = 1;
}

static void kview_1d(const nb_tensor *t, int64_t n, nb_kview *v) {
  nb_kview_of(t, v);
  v->ndim = 1;
  v->shape[0] = n;
  v->strides[0] = 1;
}

/* The op parameters and saved tensors of a norm node. */
enum { NORM_IP_NNORM, NORM_IP_RMS };
enum { NORM_SAVED_MEAN, NORM_SAVED_RSTD };

/* Allocates the gradient buffers the node needs and runs norm_bwd once.
 * x, w are the node's (contiguous, cast) inputs; dy has x's shape. */
static nb_status norm_backward_run(const nb_node *n, const nb_tensor *dy, nb_tensor **dx,
                                   nb_tensor **dw, nb_tensor **db) {
  const nb_tensor *x = n->inputs[0], *w = n->inputs[1];
  int rms = (int)n->ip[NORM_IP_RMS];
  int64_t R, D;
  norm_rows(x, (int)n->ip[NORM_IP_NNORM], &R, &D);
  nb_device dev = nb_device_of(x);
  const nb_backend *be = nb_backend_for(dev);
  *dx = nb_tensor_alloc(x->ndim, x->shape, x->dtype, dev);
  if (!*dx) return nb_last_status();
  int want_w = w && nb_node_needs_grad(n, 1);
  int want_b = !rms && n->inputs[2] && nb_node_needs_grad(n, 2);
  /* The kernel writes every element of dw and db; only an empty batch
   * (R == 0, where no kernel runs) needs them zero-filled here. */
  if (want_w && !(*dw = nb_tensor_alloc(w->ndim, w->shape, w->dtype, dev))) return nb_last_status();
  const nb_tensor *b = n->inputs[2];
  if (want_b && !(*db = nb_tensor_alloc(b->ndim, b->shape, b->dtype, dev))) return nb_last_status();
  nb_kview kdw, kdb, kdx, kdy, kx, km, kr, kw;
  if (*dw) { kview_1d(*dw, D, &kdw); if (!R && D && be->fill(&kdw, 0.0)) return nb_last_status(); }
  if (*db) { kview_1d(*db, D, &kdb); if (!R && D && be->fill(&kdb, 0.0)) return nb_last_status(); }
  if (!R || !D) return NB_OK; /* dx is empty */
  kview_2d(*dx, R, D, &kdx);
  kview_2d(dy, R, D, &kdy);
  kview_2d(x, R, D, &kx);
  if (!rms) kview_1d(n->saved[NORM_SAVED_MEAN], R, &km);
  kview_1d(n->saved[NORM_SAVED_RSTD], R, &kr);
  if (w) kview_1d(w, D, &kw);
  return be->norm_bwd(&kdx, *dw ? &kdw : NULL, *db ? &kdb : NULL, &kdy, &kx, rms ? NULL : &km,
                      &kr, w ? &kw : NULL, rms);
}

static nb_status norm_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0];
  const char *name = n->ip[NORM_IP_RMS] ? "rms_norm_backward" : "layer_norm_backward";
  nb_tensor *dx = NULL, *dw = NULL, *db = NULL;
  nb_scope_begin();
  nb_tensor *dy = nb_contiguous(nb_cast(g, x->dtype));
  nb_status st = dy ? norm_backward_run(n, dy, &dx, &dw, &db) : nb_last_status();
  nb_tensor *outs[3] = {dx, dw, db};
  for (int i = 0; i < 3; i++) {
    if (st || !outs[i]) continue;
    nb_record(name, nb_no_double_backward, 3, (const nb_tensor *const[]){dy, x, n->inputs[1]}, outs[i]);
    if (nb_node_needs_grad(n, i)) gin[i] = nb_retain(outs[i]);
  }
  nb_scope_end();
  for (int i = 0; i < 3; i++) nb_release(outs[i]);
  return st;
}

/* Checks an affine parameter: the trailing n_norm axes of x, exactly. */
static int norm_param_ok(const char *op, const char *what, const nb_tensor *x, int n_norm,
                         const nb_tensor *p) {
  if (!p) return 1;
  char b1[200], b2[200], b3[200];
  const int64_t *tail = x->shape + x->ndim - n_norm;
  if (p->ndim != n_norm || memcmp(p->shape, tail, (size_t)n_norm * sizeof *tail)) {
    nb_error_set(NB_ERR_SHAPE, "%s: %s %s does not match the normalised shape %s of input %s", op,
                 what, nb_describe(p, b1, sizeof b1), nb_shape_str(n_norm, tail, b2, sizeof b2),
                 nb_describe(x, b3, sizeof b3));
    return 0;
  }
  if (!nb_dtype_is_float(p->dtype)) {
    nb_error_set(NB_ERR_DTYPE, "%s: %s %s (expected a float tensor)", op, what,
                 nb_describe(p, b1, sizeof b1));
    return 0;
  }
  return 1;
}

static int norm_args_ok(const char *op, const nb_tensor *x, int n_norm, const nb_tensor *w,
                        const nb_tensor *b, double eps) {
  char buf[200];
  if (!nb_dtype_is_float(x->dtype)) {
    nb_error_set(NB_ERR_DTYPE, "%s: input %s (expected a float tensor)", op,
                 nb_describe(x, buf, sizeof buf));
    return 0;
  }
  if (n_norm < 1 || n_norm > x->ndim) {
    nb_error_set(NB_ERR_AXIS, "%s: n_norm %d for input %s (expected 1..%d trailing axes)", op,
                 n_norm, nb_describe(x, buf, sizeof buf), x->ndim);
    return 0;
  }
  if (!(eps >= 0) || isinf(eps)) {
    nb_error_set(NB_ERR_VALUE, "%s: eps %g (expected a finite eps >= 0)", op, eps);
    return 0;
  }
  if (nb_op_same_device(op, 3, (const nb_tensor *const[]){x, w, b})) return 0;
  return norm_param_ok(op, "weight", x, n_norm, w) && norm_param_ok(op, "bias", x, n_norm, b);
}

/* Runs norm_fwd on contiguous x, w, b (x's dtype) and records the node. */
static nb_tensor *norm_forward(const char *op, const nb_tensor *x, int n_norm, const nb_tensor *w,
                               const nb_tensor *b, double eps, int rms) {
  int64_t R, D;
  norm_rows(x, n_norm, &R, &D);
  nb_device dev = nb_device_of(x);
  /* The saved statistics: f64 for f64 inputs (an f32 rstd put 1e-6 relative
   * error into f64 gradients), f32 for f32, f16 and bf16 (kernel contract). */
  nb_dtype sdt = x->dtype == NB_F64 ? NB_F64 : NB_F32;
  nb_tensor *y = nb_tensor_alloc(x->ndim, x->shape, x->dtype, dev);
  nb_tensor *mean = rms ? NULL : nb_autorelease(nb_tensor_alloc(1, &R, sdt, dev));
  nb_tensor *rstd = nb_autorelease(nb_tensor_alloc(1, &R, sdt, dev));
  if (!y || (!rms && !mean) || !rstd) { nb_release(y); return NULL; }
  if (R && D) {
    nb_kview ky, km, kr, kx, kw, kb;
    kview_2d(y, R, D, &ky);
    kview_2d(x, R, D, &kx);
    kview_1d(rstd, R, &kr);
    if (mean) kview_1d(mean, R, &km);
    if (w) kview_1d(w, D, &kw);
    if (b) kview_1d(b, D, &kb);
    if (nb_backend_for(dev)->norm_fwd(&ky, mean ? &km : NULL, &kr, &kx, w ? &kw : NULL,
                                      b ? &kb : NULL, eps, rms)) {
      nb_release(y);
      return NULL;
    }
  }
  nb_node *n = nb_record(op, norm_bw, 3, (const nb_tensor *const[]){x, w, b}, y);
  if (n) {
    n->ip[NORM_IP_NNORM] = n_norm;
    n->ip[NORM_IP_RMS] = rms;
    nb_node_save(n, NORM_SAVED_MEAN, mean);
    nb_node_save(n, NORM_SAVED_RSTD, rstd);
  }
  return y;
}

static nb_tensor *norm_op(const char *op, const nb_tensor *x, int n_norm, const nb_tensor *w,
                          const nb_tensor *b, double eps, int rms) {
  if (!norm_args_ok(op, x, n_norm, w, b, eps)) return NULL;
  nb_scope_begin();
  const nb_tensor *xc = nb_contiguous(x);
  const nb_tensor *wc = w ? nb_contiguous(nb_cast(w, x->dtype)) : NULL;
  const nb_tensor *bc = b ? nb_contiguous(nb_cast(b, x->dtype)) : NULL;
  nb_tensor *y = xc && (!w || wc) && (!b || bc) ? norm_forward(op, xc, n_norm, wc, bc, eps, rms) : NULL;
  nb_scope_end();
  return nb_autorelease(y);
}

nb_tensor *nb_layer_norm(const nb_tensor *x, int n_norm, const nb_tensor *weight,
                         const nb_tensor *bias, double eps) {
  if (!x) { nb_error_null("layer_norm", "x"); return NULL; }
  return norm_op("layer_norm", x, n_norm, weight, bias, eps, 0);
}

nb_tensor *nb_rms_norm(const nb_tensor *x, int n_norm, const nb_tensor *weight, double eps) {
  if (!x) { nb_error_null("rms_norm", "x"); return NULL; }
  return norm_op("rms_norm", x, n_norm, weight, NULL, eps, 1);
}
