/* Losses. cross_entropy is one fused kernel each way (probabilities are
 * never materialised); nll_loss and mse_loss are compositions. Class
 * losses take logits (N, C), (C), or (N, C, d1, ...) like torch, with
 * targets (N), () or (N, d1, ...). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

static int reduction_ok(const char *op, nb_reduction red) {
  if (red == NB_REDUCE_MEAN || red == NB_REDUCE_SUM || red == NB_REDUCE_NONE) return 1;
  nb_error_set(NB_ERR_VALUE, "%s: reduction %d (expected NB_REDUCE_MEAN, NB_REDUCE_SUM or "
               "NB_REDUCE_NONE)", op, (int)red);
  return 0;
}

/* Checks logits/log-probabilities against targets (see the file comment). */
static int class_args_ok(const char *op, const nb_tensor *x, const nb_tensor *t, nb_reduction red) {
  char b1[200], b2[200];
  if (!nb_dtype_is_float(x->dtype)) {
    nb_error_set(NB_ERR_DTYPE, "%s: input %s (expected a float tensor)", op, nb_describe(x, b1, sizeof b1));
    return 0;
  }
  if (t->dtype != NB_I64 && t->dtype != NB_I32) {
    nb_error_set(NB_ERR_DTYPE, "%s: targets %s (expected i64 or i32 class indices)", op,
                 nb_describe(t, b1, sizeof b1));
    return 0;
  }
  if (nb_op_same_device(op, 2, (const nb_tensor *const[]){x, t}) || !reduction_ok(op, red)) return 0;
  int ok = x->ndim >= 1 && t->ndim == x->ndim - 1;
  for (int i = 0; ok && i < t->ndim; i++) ok = t->shape[i] == x->shape[i ? i + 1 : 0];
  if (!ok)
    nb_error_set(NB_ERR_SHAPE, "%s: input %s and targets %s do not match (expected input (N, C) "
                 "with targets (N), (C) with (), or (N, C, d1, ...) with (N, d1, ...))", op,
                 nb_describe(x, b1, sizeof b1), nb_describe(t, b2, sizeof b2));
  return ok;
}

/* The input as rows (M, C) with the class axis last, targets as (M) i64. */
static int class_rows(const nb_tensor *x, const nb_tensor *t, nb_tensor **rows, nb_tensor **trow) {
  int64_t C = x->ndim == 1 ? x->shape[0] : x->shape[1];
  int64_t M = nb_numel(t);
  nb_tensor *xl = (nb_tensor *)x;
  if (x->ndim > 2) { /* (N, C, d...) -> (N, d..., C) */
    int perm[NB_MAX_DIMS], k = 0;
    perm[k++] = 0;
    for (int i = 2; i < x->ndim; i++) perm[k++] = i;
    perm[k++] = 1;
    xl = nb_permute(x, perm);
  }
  *rows = nb_reshape(xl, 2, (int64_t[]){M, C});
  *trow = nb_reshape(nb_cast(t, NB_I64), 1, &M);
  return *rows && *trow;
}

/* Reduces per-row losses: mean over the rows whose target is not ignored
 * (0/0 = NaN when all are), sum, or the rows in the targets' shape. */
static nb_tensor *reduce_rows(nb_tensor *rows, const nb_tensor *trow, const nb_tensor *targets,
                              nb_reduction red, int64_t ignore) {
  if (red == NB_REDUCE_NONE) return nb_reshape(rows, targets->ndim, targets->shape);
  nb_tensor *s = nb_sum(rows, 0, NULL, 0);
  if (red == NB_REDUCE_SUM) return s;
  nb_tensor *valid = nb_ne(trow, nb_scalar((double)ignore, NB_I64, nb_device_of(trow)));
  nb_tensor *count = nb_sum(nb_cast(valid, rows->dtype), 0, NULL, 0);
  return nb_div(s, count);
}

/* ---- cross_entropy ------------------------------------------------------
 * One op from logits and targets to the reduced loss; prepare makes them
 * rows (M, C) and (M) i64 (recorded views), and the node is on the rows.
 * The kernels read f64, f32, f16 and bf16 logits directly and compute in
 * f32 (f64 for f64 logits), so the entry's precision class is wide: under
 * autocast the logits are not cast (no f32 copy of them is made).
 *
 * Dtypes. The loss (each row's, and the reduction) is computed in f32 (f64
 * for f64 logits) and rounded once to the loss dtype: the logits' dtype,
 * except that f16/bf16 logits give an f32 loss when the call is made inside
 * an autocast region (what PyTorch's autocast returns for cross_entropy).
 * dlogits always have the logits' dtype, each element computed in f32 and
 * rounded once.
 *
 * With a gradient wanted (grad mode on, logits requiring grad) forward runs
 * the fused kernel, which also writes dlogits for an upstream gradient of
 * exactly 1 (the row gradient is then 1/N_valid for mean, 1 for sum and
 * none); dlogits is the node's saved tensor. The backward returns it as is
 * when the incoming gradient is the engine's all-ones seed (known on the
 * host, no device read); any other gradient (a loss scale, 1/accum, a
 * weighting of the rows) runs cross_entropy_backward, which recomputes
 * dlogits from the logits with that gradient inside the kernel: one read
 * of the logits, one write, one rounding (an f16 unit gradient times the
 * scale would have underflowed first). Without a gradient wanted the
 * forward-only kernel runs and nothing is saved. */
typedef struct {
  nb_reduction red;
  int f32_loss;         /* f16/bf16 logits give an f32 loss (set under autocast) */
  int64_t ignore_index; /* rows with this target count for nothing */
  double smoothing;     /* label smoothing in [0, 1] */
} xent_params;

/* The benchmark's call: GPT-2 small's logits (16384 rows, vocabulary 50304). */
static const xent_params xent_bench = {NB_REDUCE_MEAN, 0, -100, 0.0};

static nb_status xent_infer(const nb_op_call *c, nb_meta *out) {
  const xent_params *p = c->p;
  const nb_tensor *x = c->in[0], *t = c->in[1];
  if (!class_args_ok("cross_entropy", x, t, p->red)) return nb_last_status();
  if (!(p->smoothing >= 0 && p->smoothing <= 1))
    return nb_error_set(NB_ERR_VALUE, "cross_entropy: label_smoothing %g (expected a value in [0, 1])",
                        p->smoothing);
  out->ndim = p->red == NB_REDUCE_NONE ? t->ndim : 0;
  memcpy(out->shape, t->shape, sizeof out->shape);
  out->dtype = p->f32_loss && (x->dtype == NB_F16 || x->dtype == NB_BF16) ? NB_F32 : x->dtype;
  out->device = nb_device_of(x);
  return NB_OK;
}

static nb_status xent_prepare(const nb_op_call *c, const nb_tensor **in) {
  nb_tensor *x, *t;
  if (!class_rows(c->in[0], c->in[1], &x, &t)) return nb_last_status();
  in[0] = x;
  in[1] = t;
  return NB_OK;
}

/* The view of a contiguous tensor as one axis. */
static void kview_flat(const nb_tensor *t, nb_kview *v) {
  nb_kview_of(t, v);
  v->ndim = 1;
  v->shape[0] = nb_numel(t);
  v->strides[0] = 1;
}

/* The dtype the kernels compute and write row losses in: f64 for f64
 * logits, else f32. */
static nb_dtype xent_sdt(const nb_tensor *x) { return x->dtype == NB_F64 ? NB_F64 : NB_F32; }

/* Where the last step writes: out itself when it has the loss dtype sdt,
 * else a temporary in sdt of out's shape that xent_finish casts into out
 * (the losses are rounded once to out's dtype). */
static nb_tensor *xent_dst(nb_tensor *out, nb_dtype sdt) {
  if (out->dtype == sdt) return out;
  return nb_autorelease(nb_tensor_alloc(out->ndim, out->shape, sdt, nb_device_of(out)));
}

static nb_status xent_finish(nb_tensor *out, const nb_tensor *dst) {
  if (dst == out || !nb_numel(out)) return NB_OK;
  nb_kview ko, kd;
  nb_kview_of(out, &ko);
  nb_kview_of(dst, &kd);
  return nb_backend_for(nb_device_of(out))->copy(&ko, &kd);
}

/* N_valid as a loss-dtype scalar: the rows whose target is not ignored. */
static nb_tensor *xent_count(const nb_tensor *t, int64_t ignore, nb_dtype sdt) {
  nb_tensor *valid = nb_ne(t, nb_scalar((double)ignore, NB_I64, nb_device_of(t)));
  return nb_sum(nb_cast(valid, sdt), 0, NULL, 0);
}

/* Forward only: per-row losses (f32; f64 for f64 logits) of x (M, C) and
 * targets t (M) i64, reduced in that dtype (by the sum and div kernels),
 * then rounded once to the loss dtype. */
static nb_status xent_forward_only(const nb_op_call *c, nb_tensor *out) {
  const xent_params *p = c->p;
  const nb_tensor *x = c->in[0], *t = c->in[1];
  int64_t M = x->shape[0];
  nb_dtype sdt = xent_sdt(x);
  nb_device dev = nb_device_of(x);
  const nb_backend *be = nb_backend_for(dev);
  nb_tensor *dst = xent_dst(out, sdt);
  nb_tensor *loss = p->red == NB_REDUCE_NONE ? dst : nb_autorelease(nb_tensor_alloc(1, &M, sdt, dev));
  nb_tensor *lse = nb_autorelease(nb_tensor_alloc(1, &M, sdt, dev));
  if (!dst || !loss || !lse) return nb_last_status();
  nb_kview kloss, klse, kx, kt, kdst;
  kview_flat(loss, &kloss);
  nb_kview_of(dst, &kdst);
  if (M) {
    nb_kview_of(lse, &klse);
    nb_kview_of(x, &kx);
    nb_kview_of(t, &kt);
    if (be->xent_fwd(&kloss, &klse, &kx, &kt, p->ignore_index, p->smoothing)) return nb_last_status();
  }
  nb_status st = NB_OK;
  if (p->red == NB_REDUCE_SUM) {
    st = M ? be->reduce(NB_ROP_SUM, &kdst, &kloss, 1) : be->fill(&kdst, 0.0);
  } else if (p->red == NB_REDUCE_MEAN) { /* 0/0 = NaN */
    nb_tensor *s = nb_sum(loss, 0, NULL, 0), *n = xent_count(t, p->ignore_index, sdt);
    if (!s || !n) return nb_last_status();
    nb_kview ks, kn;
    nb_kview_of(s, &ks);
    nb_kview_of(n, &kn);
    st = be->binary(NB_BOP_DIV, &kdst, &ks, &kn);
  }
  return st ? st : xent_finish(out, dst);
}

/* Forward and dlogits (*dx, the logits' dtype) in one backend call: the row
 * gradient is 1 (1/N_valid for a mean, counted by the kernel), and for mean
 * and sum the kernel also writes the reduced loss in the loss dtype into
 * out, so the whole forward is one launch. */
static nb_status xent_forward_grad(const nb_op_call *c, nb_tensor *out, nb_tensor **dx) {
  const xent_params *p = c->p;
  const nb_tensor *x = c->in[0], *t = c->in[1];
  int64_t M = x->shape[0];
  nb_dtype sdt = xent_sdt(x);
  nb_device dev = nb_device_of(x);
  const nb_backend *be = nb_backend_for(dev);
  int none = p->red == NB_REDUCE_NONE;
  nb_tensor *loss = none ? xent_dst(out, sdt) : nb_autorelease(nb_tensor_alloc(1, &M, sdt, dev));
  *dx = nb_tensor_alloc(x->ndim, x->shape, x->dtype, dev);
  if (!loss || !*dx) return nb_last_status();
  nb_kview kloss, kout, kx, kt, kdx;
  kview_flat(loss, &kloss);
  nb_kview_of(out, &kout);
  nb_kview_of(x, &kx);
  nb_kview_of(t, &kt);
  nb_kview_of(*dx, &kdx);
  if (!M) { /* no rows: the sum of nothing, over N_valid = 0 for a mean */
    if (!none && be->fill(&kout, p->red == NB_REDUCE_MEAN ? NAN : 0.0)) return nb_last_status();
  } else if (be->xent_fused(&kloss, NULL, &kdx, NULL, none ? NULL : &kout,
                            p->red == NB_REDUCE_MEAN, &kx, &kt, p->ignore_index, p->smoothing)) {
    return nb_last_status();
  }
  return none ? xent_finish(out, loss) : NB_OK;
}

static nb_status xent_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  int want = nb_grad_enabled() && c->in[0]->requires_grad;
  nb_no_grad_begin();
  nb_status st = want ? xent_forward_grad(c, out, &aux[0]) : xent_forward_only(c, out);
  nb_no_grad_end();
  return st;
}

/* logits and targets read once, the loss written; about five flops per
 * logit (max, exp, sum, the gradient's softmax minus one-hot) */
static void xent_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  const nb_tensor *x = c->in[0], *t = c->in[1];
  *bytes = (double)nb_numel(x) * (double)nb_dtype_size(x->dtype) +
           (double)nb_numel(t) * (double)nb_dtype_size(t->dtype) +
           (double)nb_shape_numel(out->ndim, out->shape) * (double)nb_dtype_size(out->dtype);
  *flops = 5.0 * (double)nb_numel(x);
}

/* cross_entropy_backward(dy, logits, targets): dlogits of the rows (M, C)
 * for the loss's gradient dy (0-d for mean and sum, one per row for none,
 * any float dtype), recomputed by the fused kernel with dy as its row
 * gradient (over N_valid for a mean): one read of the logits, one write of
 * dlogits in the logits' dtype, f32 inside (f64 for f64 logits). */
enum { XB_DY, XB_LOGITS, XB_TGT };

static nb_status xent_backward_infer(const nb_op_call *c, nb_meta *out) {
  const xent_params *p = c->p;
  const nb_tensor *dy = c->in[XB_DY], *x = c->in[XB_LOGITS], *t = c->in[XB_TGT];
  int rows = x->ndim == 2 && t->ndim == 1 && t->shape[0] == x->shape[0];
  int64_t want = p->red == NB_REDUCE_NONE && x->ndim == 2 ? x->shape[0] : 1;
  if (!rows || !nb_dtype_is_float(x->dtype) || !nb_dtype_is_float(dy->dtype) ||
      t->dtype != NB_I64 || nb_numel(dy) != want) {
    char b1[200], b2[200], b3[200];
    return nb_error_set(NB_ERR_SHAPE, "cross_entropy_backward: dy %s, logits %s and targets %s "
                        "(expected float logits (M, C), i64 targets (M) and a float dy of %lld "
                        "elements)", nb_describe(dy, b1, sizeof b1), nb_describe(x, b2, sizeof b2),
                        nb_describe(t, b3, sizeof b3), (long long)want);
  }
  nb_meta_of(x, out);
  return NB_OK;
}

/* dy as (M) for none, else 0-d (the kernel reads row r's gradient at r
 * times its stride). */
static nb_status xent_backward_prepare(const nb_op_call *c, const nb_tensor **in) {
  const xent_params *p = c->p;
  int64_t M = c->in[XB_LOGITS]->shape[0];
  const nb_tensor *dy = c->in[XB_DY];
  in[XB_DY] = p->red == NB_REDUCE_NONE ? nb_reshape(dy, 1, &M) : nb_reshape(dy, 0, NULL);
  return in[XB_DY] ? NB_OK : nb_last_status();
}

static nb_status xent_backward_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const xent_params *p = c->p;
  const nb_tensor *x = c->in[XB_LOGITS];
  int64_t M = x->shape[0];
  nb_device dev = nb_device_of(x);
  nb_tensor *loss = nb_autorelease(nb_tensor_alloc(1, &M, xent_sdt(x), dev)); /* not used */
  if (!loss) return nb_last_status();
  nb_kview kloss, ko, kdy, kx, kt;
  nb_kview_of(loss, &kloss);
  nb_kview_of(out, &ko);
  nb_kview_of(c->in[XB_DY], &kdy);
  nb_kview_of(x, &kx);
  nb_kview_of(c->in[XB_TGT], &kt);
  return nb_backend_for(dev)->xent_fused(&kloss, NULL, &ko, &kdy, NULL, p->red == NB_REDUCE_MEAN,
                                          &kx, &kt, p->ignore_index, p->smoothing);
}

/* logits, targets and dy read, dlogits written; as the forward's flops */
static void xent_backward_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  const nb_tensor *dy = c->in[XB_DY], *t = c->in[XB_TGT];
  double n = (double)nb_shape_numel(out->ndim, out->shape);
  *bytes = 2 * n * (double)nb_dtype_size(out->dtype) +
           (double)nb_numel(t) * (double)nb_dtype_size(t->dtype) +
           (double)nb_numel(dy) * (double)nb_dtype_size(dy->dtype);
  *flops = 5.0 * n;
}

const nb_op nb_op_cross_entropy_backward = {
    .name = "cross_entropy_backward", .kind = NB_OPK_ROW, .n_in = 3,
    .in_names = {"dy", "logits", "targets"}, .psize = sizeof(xent_params), .prec = NB_PREC_WIDE,
    .infer = xent_backward_infer, .prepare = xent_backward_prepare,
    .forward = xent_backward_forward, .backward = nb_no_double_backward,
    .cost = xent_backward_cost, .bench_in = "r:,r:16384x50304,i50304:16384",
    .bench_p = &xent_bench};

static nb_status xent_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_tensor *dx = n->saved[0];
  const nb_storage *gs = g->storage;
  /* the fast path hands out the saved buffer; under create_graph the result
   * must be a fresh tensor carrying a node, so it recomputes instead */
  if (dx && gs->filled && gs->fill_value == 1.0 && !g->requires_grad && !nb_grad_enabled()) {
    gin[0] = nb_retain(dx);
    return NB_OK;
  }
  gin[0] = nb_retain(nb_op_run(&nb_op_cross_entropy_backward, 3,
                               (const nb_tensor *const[]){g, n->inputs[0], n->inputs[1]},
                               nb_node_params(n)));
  return gin[0] ? NB_OK : nb_last_status();
}

const nb_op nb_op_cross_entropy = {
    .name = "cross_entropy", .kind = NB_OPK_ROW, .n_in = 2, .in_names = {"logits", "targets"},
    .psize = sizeof(xent_params), .prec = NB_PREC_WIDE,
    .determinism = "the reduced loss comes from the fused kernel (f64, fixed order) when a "
                   "gradient is wanted, else from the sum kernel (see sum) and a division: the "
                   "two may differ in the last bit",
    .infer = xent_infer, .prepare = xent_prepare, .forward = xent_forward, .always_forward = 1,
    .backward = xent_bw, .cost = xent_cost, .bench_in = "r:16384x50304,i50304:16384",
    .bench_p = &xent_bench};

nb_tensor *nb_cross_entropy(const nb_tensor *logits, const nb_tensor *targets,
                            nb_reduction red, int64_t ignore_index, double label_smoothing) {
  xent_params p = {red, nb_autocast_dtype() != NB_F32, ignore_index, label_smoothing};
  return nb_op_run(&nb_op_cross_entropy, 2, (const nb_tensor *const[]){logits, targets}, &p);
}

/* ---- nll_loss: -logp[target] per row ------------------------------------- */
/* Rewrites a gather index error so that it names nll_loss. */
static void nll_index_error(void) {
  if (nb_last_status() != NB_ERR_INDEX) return;
  char msg[900];
  snprintf(msg, sizeof msg, "%s", nb_last_error());
  nb_error_set(NB_ERR_INDEX, "nll_loss: a target is out of range (%s)", msg);
}

static nb_tensor *nll_rows(const nb_tensor *x, const nb_tensor *t, int64_t ignore) {
  nb_device dev = nb_device_of(x);
  nb_tensor *valid = nb_ne(t, nb_scalar((double)ignore, NB_I64, dev));
  nb_tensor *safe = nb_where(valid, t, nb_scalar(0.0, NB_I64, dev)); /* ignored rows read class 0 */
  nb_tensor *picked = nb_gather(x, 1, nb_unsqueeze(safe, 1));
  if (!picked && safe) { nll_index_error(); return NULL; }
  return nb_where(valid, nb_neg(nb_squeeze(picked, 1)), nb_scalar(0.0, x->dtype, dev));
}

nb_tensor *nb_nll_loss(const nb_tensor *logp, const nb_tensor *targets, nb_reduction red,
                       int64_t ignore_index) {
  if (!logp) { nb_error_null("nll_loss", "logp"); return NULL; }
  if (!targets) { nb_error_null("nll_loss", "targets"); return NULL; }
  if (!class_args_ok("nll_loss", logp, targets, red)) return NULL;
  nb_scope_begin();
  nb_tensor *x, *t, *out = NULL;
  if (class_rows(logp, targets, &x, &t)) {
    nb_tensor *rows = nll_rows(x, t, ignore_index);
    out = rows ? nb_keep(reduce_rows(rows, t, targets, red, ignore_index)) : NULL;
  }
  nb_scope_end();
  return nb_autorelease(out);
}

/* ---- mse_loss ---------------------------------------------------------------- */
nb_tensor *nb_mse_loss(const nb_tensor *a, const nb_tensor *b, nb_reduction red) {
  if (!a) { nb_error_null("mse_loss", "a"); return NULL; }
  if (!b) { nb_error_null("mse_loss", "b"); return NULL; }
  char b1[200], b2[200];
  if (!nb_dtype_is_float(a->dtype) || !nb_dtype_is_float(b->dtype)) {
    nb_error_set(NB_ERR_DTYPE, "mse_loss: inputs %s and %s (expected float tensors)",
                 nb_describe(a, b1, sizeof b1), nb_describe(b, b2, sizeof b2));
    return NULL;
  }
  int64_t shape[NB_MAX_DIMS];
  if (nb_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, shape) < 0) {
    nb_error_set(NB_ERR_SHAPE, "mse_loss: shapes %s and %s do not broadcast",
                 nb_describe(a, b1, sizeof b1), nb_describe(b, b2, sizeof b2));
    return NULL;
  }
  if (nb_op_same_device("mse_loss", 2, (const nb_tensor *const[]){a, b}) || !reduction_ok("mse_loss", red))
    return NULL;
  nb_scope_begin();
  nb_tensor *d = nb_square(nb_sub(a, b));
  nb_tensor *out = red == NB_REDUCE_NONE ? d : red == NB_REDUCE_SUM ? nb_sum(d, 0, NULL, 0)
                                                                    : nb_mean(d, 0, NULL, 0);
  out = nb_keep(out);
  nb_scope_end();
  return nb_autorelease(out);
}
