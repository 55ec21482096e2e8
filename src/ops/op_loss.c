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
 * One node from the logits rows to the reduced loss. With a gradient wanted
 * (grad mode on, logits requiring grad) the forward runs the fused kernel,
 * which also writes dlogits for an upstream gradient of exactly 1 (the row
 * gradient is then 1/N_valid for mean, 1 for sum and none) and saves it; the
 * backward returns it as is when the incoming gradient is the engine's
 * all-ones seed (known on the host, no device read), else scales it by the
 * incoming gradient (one elementwise pass). Without a gradient wanted the
 * forward-only kernel runs and nothing is saved. */
enum { XENT_IP_RED };

static nb_status xent_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_tensor *dx = n->saved[0];
  const nb_storage *gs = g->storage;
  /* the fast path hands out the saved buffer; under create_graph the result
   * must be a fresh tensor carrying a node, so it scales instead */
  if (gs->filled && gs->fill_value == 1.0 && !g->requires_grad && !nb_grad_enabled()) {
    gin[0] = nb_retain(dx);
    return NB_OK;
  }
  nb_scope_begin();
  nb_tensor *gr = n->ip[XENT_IP_RED] == NB_REDUCE_NONE
                      ? nb_reshape(g, 2, (int64_t[]){dx->shape[0], 1}) : g;
  nb_no_grad_begin();
  nb_tensor *out = nb_mul(dx, nb_cast(gr, dx->dtype));
  nb_no_grad_end();
  /* a second derivative would need d(dlogits)/dlogits: refuse it */
  if (out) nb_record("cross_entropy_backward", nb_no_double_backward, 2,
                     (const nb_tensor *const[]){g, n->inputs[0]}, out);
  gin[0] = nb_keep(out);
  nb_scope_end();
  return gin[0] ? NB_OK : nb_last_status();
}

/* N_valid as a loss-dtype scalar: the rows whose target is not ignored. */
static nb_tensor *xent_count(const nb_tensor *t, int64_t ignore, nb_dtype sdt) {
  nb_tensor *valid = nb_ne(t, nb_scalar((double)ignore, NB_I64, nb_device_of(t)));
  return nb_sum(nb_cast(valid, sdt), 0, NULL, 0);
}

/* Forward only: per-row losses (f32; f64 for f64 logits) of x (M, C) and
 * targets t (M) i64, reduced in the loss dtype, then rounded once to the
 * logits' dtype. */
static nb_tensor *xent_forward_only(const nb_tensor *x, const nb_tensor *t, const nb_tensor *targets,
                                    nb_reduction red, int64_t ignore, double smooth) {
  int64_t M = x->shape[0];
  nb_dtype sdt = x->dtype == NB_F64 ? NB_F64 : NB_F32;
  nb_device dev = nb_device_of(x);
  nb_tensor *loss = nb_autorelease(nb_tensor_alloc(1, &M, sdt, dev));
  nb_tensor *lse = nb_autorelease(nb_tensor_alloc(1, &M, sdt, dev));
  if (!loss || !lse) return NULL;
  if (M) {
    nb_kview kloss, klse, kx, kt;
    nb_kview_of(loss, &kloss);
    nb_kview_of(lse, &klse);
    nb_kview_of(x, &kx);
    nb_kview_of(t, &kt);
    if (nb_backend_for(dev)->xent_fwd(&kloss, &klse, &kx, &kt, ignore, smooth)) return NULL;
  }
  if (red == NB_REDUCE_NONE) return nb_cast(nb_reshape(loss, targets->ndim, targets->shape), x->dtype);
  nb_tensor *out = nb_sum(loss, 0, NULL, 0);
  if (red == NB_REDUCE_MEAN) out = nb_div(out, xent_count(t, ignore, sdt)); /* 0/0 = NaN */
  return nb_cast(out, x->dtype);
}

/* Forward and dlogits (*dx) in one backend call: the row gradient is 1
 * (1/N_valid for a mean, counted by the kernel), and for mean and sum the
 * kernel also writes the reduced loss in the logits' dtype, so the whole
 * forward is one launch. */
static nb_tensor *xent_forward_grad(const nb_tensor *x, const nb_tensor *t,
                                    const nb_tensor *targets, nb_reduction red, int64_t ignore,
                                    double smooth, nb_tensor **dx) {
  int64_t M = x->shape[0];
  nb_dtype sdt = x->dtype == NB_F64 ? NB_F64 : NB_F32;
  nb_device dev = nb_device_of(x);
  nb_tensor *loss = nb_autorelease(nb_tensor_alloc(1, &M, sdt, dev));
  nb_tensor *out = red == NB_REDUCE_NONE ? NULL : nb_autorelease(nb_tensor_alloc(0, NULL, x->dtype, dev));
  *dx = nb_autorelease(nb_tensor_alloc(x->ndim, x->shape, x->dtype, dev));
  if (!loss || (red != NB_REDUCE_NONE && !out) || !*dx) return NULL;
  nb_kview kloss, kout, kx, kt, kdx;
  nb_kview_of(loss, &kloss);
  nb_kview_of(x, &kx);
  nb_kview_of(t, &kt);
  nb_kview_of(*dx, &kdx);
  if (out) nb_kview_of(out, &kout);
  if (!M) { /* no rows: the sum of nothing, over N_valid = 0 for a mean */
    if (out && nb_fill_(out, red == NB_REDUCE_MEAN ? NAN : 0.0)) return NULL;
  } else if (nb_backend_for(dev)->xent_fused(&kloss, NULL, &kdx, NULL, out ? &kout : NULL,
                                             red == NB_REDUCE_MEAN, &kx, &kt, ignore, smooth)) {
    return NULL;
  }
  return out ? out : nb_cast(nb_reshape(loss, targets->ndim, targets->shape), x->dtype);
}

nb_tensor *nb_cross_entropy(const nb_tensor *logits, const nb_tensor *targets,
                            nb_reduction red, int64_t ignore_index, double label_smoothing) {
  if (!logits) { nb_error_null("cross_entropy", "logits"); return NULL; }
  if (!targets) { nb_error_null("cross_entropy", "targets"); return NULL; }
  if (!class_args_ok("cross_entropy", logits, targets, red)) return NULL;
  if (!(label_smoothing >= 0 && label_smoothing <= 1)) {
    nb_error_set(NB_ERR_VALUE, "cross_entropy: label_smoothing %g (expected a value in [0, 1])",
                 label_smoothing);
    return NULL;
  }
  nb_scope_begin();
  nb_tensor *x, *t, *out = NULL, *dx = NULL;
  if (class_rows(logits, targets, &x, &t)) {
    int want = nb_grad_enabled() && x->requires_grad;
    nb_no_grad_begin();
    out = want ? xent_forward_grad(x, t, targets, red, ignore_index, label_smoothing, &dx)
               : xent_forward_only(x, t, targets, red, ignore_index, label_smoothing);
    nb_no_grad_end();
  }
  if (out && dx) {
    nb_node *n = nb_record("cross_entropy", xent_bw, 2, (const nb_tensor *const[]){x, t}, out);
    if (n) {
      n->ip[XENT_IP_RED] = red;
      nb_node_save(n, 0, dx);
    }
  }
  out = nb_keep(out);
  nb_scope_end();
  return nb_autorelease(out);
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
