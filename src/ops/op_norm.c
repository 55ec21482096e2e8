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

typedef struct {
  int n_norm; /* trailing axes normalised */
  int rms;
  double eps;
  int want_w, want_b; /* backward: which parameter gradients to compute */
} norm_params;

/* The saved tensors of a norm node (forward's aux). */
enum { NORM_SAVED_MEAN, NORM_SAVED_RSTD };
/* The backward op's inputs: (dy, x, rstd, mean, w, b), the last three
 * optional; its outputs dx, dw, db. */
enum { NB_IN_DY, NB_IN_X, NB_IN_RSTD, NB_IN_MEAN, NB_IN_W, NB_IN_B };

static nb_status norm_backward_infer(const nb_op_call *c, nb_meta *out) {
  nb_meta_of(c->in[NB_IN_X], out);
  return NB_OK;
}

static nb_status norm_backward_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[NB_IN_DY] = nb_contiguous(nb_cast(c->in[NB_IN_DY], c->in[NB_IN_X]->dtype));
  return in[NB_IN_DY] ? NB_OK : nb_last_status();
}

/* Allocates the parameter gradients the call wants and runs norm_bwd once:
 * dx is out, dw and db go to aux[0] and aux[1]. */
static nb_status norm_backward_forward(const nb_op_call *c, nb_tensor *dx, nb_tensor **aux) {
  const norm_params *p = c->p;
  const nb_tensor *dy = c->in[NB_IN_DY], *x = c->in[NB_IN_X], *w = c->in[NB_IN_W],
                  *b = c->in[NB_IN_B];
  int64_t R, D;
  norm_rows(x, p->n_norm, &R, &D);
  nb_device dev = nb_device_of(x);
  const nb_backend *be = nb_backend_for(dev);
  nb_tensor *dw = NULL, *db = NULL;
  /* The kernel writes every element of dw and db; only an empty batch
   * (R == 0, where no kernel runs) needs them zero-filled here. */
  if (p->want_w && !(dw = aux[0] = nb_tensor_alloc(w->ndim, w->shape, w->dtype, dev)))
    return nb_last_status();
  if (p->want_b && !(db = aux[1] = nb_tensor_alloc(b->ndim, b->shape, b->dtype, dev)))
    return nb_last_status();
  nb_kview kdw, kdb, kdx, kdy, kx, km, kr, kw;
  if (dw) { kview_1d(dw, D, &kdw); if (!R && D && be->fill(&kdw, 0.0)) return nb_last_status(); }
  if (db) { kview_1d(db, D, &kdb); if (!R && D && be->fill(&kdb, 0.0)) return nb_last_status(); }
  if (!R || !D) return NB_OK; /* dx is empty */
  kview_2d(dx, R, D, &kdx);
  kview_2d(dy, R, D, &kdy);
  kview_2d(x, R, D, &kx);
  if (!p->rms) kview_1d(c->in[NB_IN_MEAN], R, &km);
  kview_1d(c->in[NB_IN_RSTD], R, &kr);
  if (w) kview_1d(w, D, &kw);
  return be->norm_bwd(&kdx, dw ? &kdw : NULL, db ? &kdb : NULL, &kdy, &kx, p->rms ? NULL : &km,
                      &kr, w ? &kw : NULL, p->rms);
}

extern const nb_op nb_op_layer_norm_backward, nb_op_rms_norm_backward;

static nb_status norm_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  norm_params p = *(const norm_params *)nb_node_params(n);
  const nb_tensor *w = n->inputs[1], *b = n->n_inputs > 2 ? n->inputs[2] : NULL;
  p.want_w = w && nb_node_needs_grad(n, 1);
  p.want_b = !p.rms && b && nb_node_needs_grad(n, 2);
  const nb_tensor *in[6] = {g, n->inputs[0], n->saved[NORM_SAVED_RSTD], n->saved[NORM_SAVED_MEAN], w, b};
  nb_tensor *outs[3];
  nb_status st = nb_op_run_outs(p.rms ? &nb_op_rms_norm_backward : &nb_op_layer_norm_backward, 6,
                                in, &p, outs);
  if (st) return st;
  for (int i = 0; i < n->n_inputs && i < 3; i++)
    if (nb_node_needs_grad(n, i)) gin[i] = nb_retain(outs[i]);
  return NB_OK;
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
  return norm_param_ok(op, "weight", x, n_norm, w) && norm_param_ok(op, "bias", x, n_norm, b);
}

static nb_status norm_infer(const nb_op_call *c, nb_meta *out) {
  const norm_params *p = c->p;
  const nb_tensor *x = c->in[0], *w = c->in[1], *b = c->n > 2 ? c->in[2] : NULL;
  if (!norm_args_ok(c->op->name, x, p->n_norm, w, b, p->eps)) return nb_last_status();
  nb_meta_of(x, out);
  return NB_OK;
}

/* The kernel takes contiguous x, and w, b in x's dtype. */
static nb_status norm_prepare(const nb_op_call *c, const nb_tensor **in) {
  const nb_tensor *x = c->in[0];
  in[0] = nb_contiguous(x);
  for (int i = 1; i < c->n; i++)
    if (c->in[i] && !(in[i] = nb_contiguous(nb_cast(c->in[i], x->dtype)))) return nb_last_status();
  return in[0] ? NB_OK : nb_last_status();
}

/* Runs norm_fwd; the per-row mean (layer_norm) and rstd go to aux as the
 * saved statistics. */
static nb_status norm_forward(const nb_op_call *c, nb_tensor *y, nb_tensor **aux) {
  const norm_params *p = c->p;
  const nb_tensor *x = c->in[0], *w = c->in[1], *b = c->n > 2 ? c->in[2] : NULL;
  int64_t R, D;
  norm_rows(x, p->n_norm, &R, &D);
  nb_device dev = nb_device_of(x);
  /* The saved statistics: f64 for f64 inputs (an f32 rstd put 1e-6 relative
   * error into f64 gradients), f32 for f32, f16 and bf16 (kernel contract). */
  nb_dtype sdt = x->dtype == NB_F64 ? NB_F64 : NB_F32;
  nb_tensor *mean = p->rms ? NULL : (aux[NORM_SAVED_MEAN] = nb_tensor_alloc(1, &R, sdt, dev));
  nb_tensor *rstd = aux[NORM_SAVED_RSTD] = nb_tensor_alloc(1, &R, sdt, dev);
  if ((!p->rms && !mean) || !rstd) return nb_last_status();
  if (!R || !D) return NB_OK;
  nb_kview ky, km, kr, kx, kw, kb;
  kview_2d(y, R, D, &ky);
  kview_2d(x, R, D, &kx);
  kview_1d(rstd, R, &kr);
  if (mean) kview_1d(mean, R, &km);
  if (w) kview_1d(w, D, &kw);
  if (b) kview_1d(b, D, &kb);
  return nb_backend_for(dev)->norm_fwd(&ky, mean ? &km : NULL, &kr, &kx, w ? &kw : NULL,
                                       b ? &kb : NULL, p->eps, p->rms);
}

#define NORM_OPS(NAME, N_IN, RMS, IN, BWD_IN)                                           \
  static const norm_params NAME##_bench = {1, RMS, 1e-5, 1, !RMS};                     \
  const nb_op nb_op_##NAME = {                                                         \
      .name = #NAME, .kind = NB_OPK_ROW, .n_in = N_IN, .n_opt = N_IN - 1,              \
      .in_names = {"x", "weight", "bias"},                                             \
      .psize = sizeof(norm_params), .prec = NB_PREC_F32, .infer = norm_infer,          \
      .prepare = norm_prepare, .forward = norm_forward, .always_forward = 1,           \
      .backward = norm_bw, .bench_in = IN, .bench_p = &NAME##_bench};                  \
  const nb_op nb_op_##NAME##_backward = {                                              \
      .name = #NAME "_backward", .kind = NB_OPK_ROW, .n_in = 6, .n_opt = 3, .n_out = 3,\
      .in_names = {"dy", "x", "rstd", "mean", "weight", "bias"},                       \
      .psize = sizeof(norm_params), .prec = NB_PREC_F32,                               \
      .determinism = "dw, db: fixed-order column sums",                                \
      .infer = norm_backward_infer, .prepare = norm_backward_prepare,                  \
      .forward = norm_backward_forward, .always_forward = 1,                           \
      .backward = nb_no_double_backward, .bench_in = BWD_IN, .bench_p = &NAME##_bench};

NORM_OPS(layer_norm, 3, 0, "r:16384x768,r:768,r:768",
         "r:16384x768,r:16384x768,s:16384,s:16384,r:768,r:768")
NORM_OPS(rms_norm, 2, 1, "r:16384x768,r:768", "r:16384x768,r:16384x768,s:16384,-,r:768,-")

nb_tensor *nb_layer_norm(const nb_tensor *x, int n_norm, const nb_tensor *weight,
                         const nb_tensor *bias, double eps) {
  norm_params p = {n_norm, 0, eps, 0, 0};
  return nb_op_run(&nb_op_layer_norm, 3, (const nb_tensor *const[]){x, weight, bias}, &p);
}

nb_tensor *nb_rms_norm(const nb_tensor *x, int n_norm, const nb_tensor *weight, double eps) {
  norm_params p = {n_norm, 1, eps, 0, 0};
  return nb_op_run(&nb_op_rms_norm, 2, (const nb_tensor *const[]){x, weight}, &p);
}
