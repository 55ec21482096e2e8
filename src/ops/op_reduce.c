/* Reductions over any set of axes, with keepdim. sum, max, min, argmax and
 * argmin run a kernel; mean, var, std, logsumexp and norm are compositions,
 * so their gradients come from the primitives' rules. At their singular
 * points std and norm give PyTorch's subgradients (0, never NaN) through
 * the masked compositions below (docs/ARCHITECTURE.md, "Conventions at
 * singular points"). */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

nb_status nb_op_axes_mask(const char *op, const nb_tensor *x, int n_axes, const int *axes,
                          int mask[NB_MAX_DIMS]) {
  memset(mask, 0, NB_MAX_DIMS * sizeof mask[0]);
  if (n_axes < 0 || (n_axes && !axes))
    return nb_error_set(NB_ERR_AXIS, "%s: %d axes given (expected an array, or 0 for all)", op, n_axes);
  if (n_axes == 0) {
    for (int i = 0; i < x->ndim; i++) mask[i] = 1;
    return NB_OK;
  }
  for (int i = 0; i < n_axes; i++) {
    int a = nb_norm_axis(op, axes[i], x->ndim);
    if (a < 0) return NB_ERR_AXIS;
    if (x->ndim == 0) continue;
    if (mask[a]) return nb_error_set(NB_ERR_AXIS, "%s: axis %d is given twice", op, axes[i]);
    mask[a] = 1;
  }
  return NB_OK;
}

/* The result's shape, with reduced axes kept as 1 (keep) or dropped. */
static int reduced_shape(const nb_tensor *x, const int *mask, int keep, int64_t *shape) {
  int k = 0;
  for (int i = 0; i < x->ndim; i++) {
    if (!mask[i]) shape[k++] = x->shape[i];
    else if (keep) shape[k++] = 1;
  }
  return k;
}

/* ---- the primitives: sum, max, min (with gradients), argmax, argmin --------
 * One kernel each. Parameters are the normalised set of axes (the public
 * functions check the axes given and make the mask) and keepdim. */
typedef struct {
  int mask[NB_MAX_DIMS]; /* 1: axis i is reduced */
  int keep;              /* reduced axes kept as size 1 */
} reduce_params;

/* The op's output dtype: i64 for arg* and for integer sums. */
static nb_dtype reduce_dtype(nb_rop op, nb_dtype x) {
  if (op == NB_ROP_ARGMAX || op == NB_ROP_ARGMIN) return NB_I64;
  if (op == NB_ROP_SUM && !nb_dtype_is_float(x)) return NB_I64;
  return x;
}

/* Whether a reduced axis of x is empty. */
static int reduces_empty(const nb_tensor *x, const int *mask) {
  int empty = 0;
  for (int i = 0; i < x->ndim; i++) empty |= mask[i] && x->shape[i] == 0;
  return empty;
}

static nb_status reduce_infer(nb_rop op, const nb_op_call *c, nb_meta *out) {
  const reduce_params *p = c->p;
  const nb_tensor *x = c->in[0];
  char b[200];
  for (int i = 0; i < NB_MAX_DIMS; i++)
    if ((p->mask[i] && i >= x->ndim) || (p->mask[i] != 0 && p->mask[i] != 1))
      return nb_error_set(NB_ERR_AXIS, "%s: axis %d in the mask of input %s (expected axes 0..%d)",
                          c->op->name, i, nb_describe(x, b, sizeof b), x->ndim - 1);
  if (op != NB_ROP_SUM && reduces_empty(x, p->mask))
    return nb_error_set(NB_ERR_SHAPE, "%s: cannot reduce %s over an empty axis", c->op->name,
                        nb_describe(x, b, sizeof b));
  out->ndim = reduced_shape(x, p->mask, p->keep, out->shape);
  out->dtype = reduce_dtype(op, x->dtype);
  out->device = nb_device_of(x);
  return NB_OK;
}

/* sum adds in its output dtype: integers are cast to i64 first (recorded). */
static nb_status sum_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[0] = nb_cast(c->in[0], reduce_dtype(NB_ROP_SUM, c->in[0]->dtype));
  return in[0] ? NB_OK : nb_last_status();
}

/* Runs the reduction kernel: kept axes first, reduced axes last. A sum over
 * an empty axis is zero (no kernel runs). */
static nb_status reduce_forward(nb_rop op, const nb_op_call *c, nb_tensor *out) {
  const reduce_params *p = c->p;
  const nb_tensor *x = c->in[0];
  const nb_backend *be = nb_backend_for(nb_device_of(x));
  nb_kview ki, ko;
  nb_kview_of(out, &ko);
  if (reduces_empty(x, p->mask)) return be->fill(&ko, 0.0);
  int64_t oshape[NB_MAX_DIMS];
  int knd = reduced_shape(x, p->mask, 0, oshape);
  nb_kview_of(x, &ki);
  int k = 0, nred = 0;
  for (int i = 0; i < x->ndim; i++)
    if (!p->mask[i]) { ki.shape[k] = x->shape[i]; ki.strides[k++] = x->strides[i]; }
  for (int i = 0; i < x->ndim; i++)
    if (p->mask[i]) { ki.shape[k] = x->shape[i]; ki.strides[k++] = x->strides[i]; nred++; }
  ko.ndim = knd;
  nb_contiguous_strides(knd, oshape, ko.strides);
  memcpy(ko.shape, oshape, sizeof oshape);
  return be->reduce(op, &ko, &ki, nred);
}

/* Every input element read once and added or compared once. */
static void reduce_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  double nin = (double)nb_numel(c->in[0]);
  *bytes = nin * (double)nb_dtype_size(c->in[0]->dtype) +
           (double)nb_shape_numel(out->ndim, out->shape) * (double)nb_dtype_size(out->dtype);
  *flops = nin;
}

/* g of the reduced shape, brought back to x's shape by broadcasting. */
static nb_tensor *expand_back(const nb_tensor *g, const nb_node *n, const nb_tensor *x) {
  const reduce_params *p = nb_node_params(n);
  int64_t shape[NB_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = p->mask[i] ? 1 : x->shape[i];
  nb_tensor *gk = nb_reshape(g, x->ndim, shape);
  return nb_expand(gk, x->ndim, x->shape);
}

static nb_status sum_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(expand_back(g, n, n->inputs[0]));
  return gin[0] ? NB_OK : nb_last_status();
}

/* max/min: the gradient is shared evenly among the elements equal to the
 * extreme (as for maximum on ties); the output is saved. */
static nb_status extreme_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const reduce_params *p = nb_node_params(n);
  const nb_tensor *x = n->inputs[0];
  nb_tensor *hit = nb_cast(nb_eq(x, expand_back(n->saved[0], n, x)), g->dtype);
  int axes[NB_MAX_DIMS], na = 0;
  for (int i = 0; i < x->ndim; i++)
    if (p->mask[i]) axes[na++] = i;
  nb_tensor *count = nb_sum(hit, na, axes, 1);
  gin[0] = nb_retain(nb_div(nb_mul(hit, expand_back(g, n, x)), nb_expand(count, x->ndim, x->shape)));
  return gin[0] ? NB_OK : nb_last_status();
}

/* The benchmark's calls (at GPT-2 small's training sizes): sum over the
 * batch axis (a bias gradient), max/min over rows (logsumexp), arg* over
 * the vocabulary (accuracy). */
static const reduce_params bench_axis0 = {.mask = {1}}, bench_rows_keep = {.mask = {0, 1}, .keep = 1},
                           bench_rows = {.mask = {0, 1}};

#define REDUCE_OP(NAME, ROP, PREPARE, BACKWARD, SAVE_OUT, PREC, DETERMINISM, BENCH_IN, BENCH_P) \
  static nb_status NAME##_infer(const nb_op_call *c, nb_meta *out) {                         \
    return reduce_infer(ROP, c, out);                                                        \
  }                                                                                          \
  static nb_status NAME##_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {    \
    (void)aux;                                                                               \
    return reduce_forward(ROP, c, out);                                                      \
  }                                                                                          \
  const nb_op nb_op_##NAME = {                                                               \
      .name = #NAME, .kind = NB_OPK_REDUCE, .n_in = 1, .in_names = {"x"},                    \
      .psize = sizeof(reduce_params), .prec = PREC, .determinism = DETERMINISM,              \
      .infer = NAME##_infer, .prepare = PREPARE, .forward = NAME##_forward,                  \
      .backward = BACKWARD, .save_out = SAVE_OUT, .cost = reduce_cost,                       \
      .meta_only_in = BACKWARD == sum_bw ? 1u : 0u, /* sum's rule reads only x's shape */     \
      .bench_in = BENCH_IN, .bench_p = BENCH_P};

REDUCE_OP(sum, NB_ROP_SUM, sum_prepare, sum_bw, 0, NB_PREC_F32,
          "CUDA f32/f64 sums of few outputs add partial sums with atomics under "
          "nb_set_deterministic(0); fixed order otherwise",
          "r:16384x768", &bench_axis0)
REDUCE_OP(max, NB_ROP_MAX, NULL, extreme_bw, 1, NB_PREC_FOLLOW, NULL, "r:16384x768", &bench_rows_keep)
REDUCE_OP(min, NB_ROP_MIN, NULL, extreme_bw, 1, NB_PREC_FOLLOW, NULL, "r:16384x768", &bench_rows_keep)
REDUCE_OP(argmax, NB_ROP_ARGMAX, NULL, NULL, 0, NB_PREC_FOLLOW, NULL, "r:16384x50304", &bench_rows)
REDUCE_OP(argmin, NB_ROP_ARGMIN, NULL, NULL, 0, NB_PREC_FOLLOW, NULL, "r:16384x50304", &bench_rows)

/* The public reductions: the axes given, checked and made a mask. */
static nb_tensor *reduce_run(const nb_op *op, const nb_tensor *x, int n_axes, const int *axes,
                             int keep) {
  if (!x) { nb_error_null(op->name, "x"); return NULL; }
  reduce_params p = {.keep = keep != 0};
  if (nb_op_axes_mask(op->name, x, n_axes, axes, p.mask)) return NULL;
  return nb_op_run(op, 1, (const nb_tensor *const[]){x}, &p);
}

nb_tensor *nb_sum(const nb_tensor *x, int n_axes, const int *axes, int keepdim) {
  return reduce_run(&nb_op_sum, x, n_axes, axes, keepdim);
}
nb_tensor *nb_max(const nb_tensor *x, int n_axes, const int *axes, int keepdim) {
  return reduce_run(&nb_op_max, x, n_axes, axes, keepdim);
}
nb_tensor *nb_min(const nb_tensor *x, int n_axes, const int *axes, int keepdim) {
  return reduce_run(&nb_op_min, x, n_axes, axes, keepdim);
}
nb_tensor *nb_argmax(const nb_tensor *x, int axis, int keepdim) {
  return reduce_run(&nb_op_argmax, x, 1, &axis, keepdim);
}
nb_tensor *nb_argmin(const nb_tensor *x, int axis, int keepdim) {
  return reduce_run(&nb_op_argmin, x, 1, &axis, keepdim);
}

/* Number of elements reduced over, or -1 after setting an error. */
static int64_t reduced_count(const char *op, const nb_tensor *x, int n_axes, const int *axes) {
  int mask[NB_MAX_DIMS];
  if (nb_op_axes_mask(op, x, n_axes, axes, mask)) return -1;
  int64_t c = 1;
  for (int i = 0; i < x->ndim; i++)
    if (mask[i]) c *= x->shape[i];
  return c;
}

static int require_float(const char *op, const nb_tensor *x) {
  if (nb_dtype_is_float(x->dtype)) return 1;
  nb_error_set(NB_ERR_DTYPE, "%s: dtype %s (expected a float tensor; cast it first)", op,
               nb_dtype_name(x->dtype));
  return 0;
}

/* Runs a composition in its own scope and hands out one kept result. */
#define COMPOSE(result_expr)                      \
  do {                                            \
    nb_scope_begin();                             \
    nb_tensor *r_ = nb_keep(result_expr);         \
    nb_scope_end();                               \
    return nb_autorelease(r_);                    \
  } while (0)

/* v^(1/p) (sqrt for p = 2) with gradient 0 where v == 0, as PyTorch's std
 * and norm backward (masked_fill(result == 0, 0)). The root is taken of
 * where(v == 0, 1, v), so the masked elements never form inf or 0 * inf,
 * in the gradient or in the gradient's own gradient; elsewhere the value
 * and the gradient are the plain root's, bit for bit. */
static nb_tensor *root_masked(const nb_tensor *v, double p) {
  nb_tensor *zero = nb_op_scalar_for(v, 0.0);
  nb_tensor *z = nb_eq(v, zero);
  nb_tensor *safe = nb_where(z, nb_op_scalar_for(v, 1.0), v);
  return nb_where(z, zero, p == 2 ? nb_sqrt(safe) : nb_pow_scalar(safe, 1.0 / p));
}

/* |x|^p with gradient 0 where x == 0 (p < 1 would give inf * sign(0) =
 * NaN there), by the same masking as root_masked. */
static nb_tensor *abs_pow_masked(const nb_tensor *x, double p) {
  nb_tensor *zero = nb_op_scalar_for(x, 0.0);
  nb_tensor *z = nb_eq(x, zero);
  nb_tensor *safe = nb_abs(nb_where(z, nb_op_scalar_for(x, 1.0), x));
  return nb_where(z, zero, nb_pow_scalar(safe, p));
}

nb_tensor *nb_mean(const nb_tensor *x, int n_axes, const int *axes, int keepdim) {
  if (!x) { nb_error_null("mean", "x"); return NULL; }
  if (!require_float("mean", x)) return NULL;
  int64_t c = reduced_count("mean", x, n_axes, axes);
  if (c < 0) return NULL;
  COMPOSE(nb_mul_scalar(nb_sum(x, n_axes, axes, keepdim), c ? 1.0 / (double)c : NAN));
}

nb_tensor *nb_var(const nb_tensor *x, int n_axes, const int *axes, double correction, int keepdim) {
  if (!x) { nb_error_null("var", "x"); return NULL; }
  if (!require_float("var", x)) return NULL;
  int64_t c = reduced_count("var", x, n_axes, axes);
  if (c < 0) return NULL;
  double denom = (double)c - correction;
  nb_scope_begin();
  nb_tensor *d = nb_sub(x, nb_mean(x, n_axes, axes, 1));
  nb_tensor *r = nb_keep(nb_mul_scalar(nb_sum(nb_square(d), n_axes, axes, keepdim),
                                       denom > 0 ? 1.0 / denom : NAN));
  nb_scope_end();
  return nb_autorelease(r);
}

nb_tensor *nb_std(const nb_tensor *x, int n_axes, const int *axes, double correction, int keepdim) {
  if (!x) { nb_error_null("std", "x"); return NULL; }
  if (!require_float("std", x)) return NULL;
  COMPOSE(root_masked(nb_var(x, n_axes, axes, correction, keepdim), 2.0));
}

/* log(sum(exp(x))) = m + log(sum(exp(x - m))) with m the (detached) max;
 * rows whose max is infinite use m = 0 so that -inf rows give -inf. */
nb_tensor *nb_logsumexp(const nb_tensor *x, int n_axes, const int *axes, int keepdim) {
  if (!x) { nb_error_null("logsumexp", "x"); return NULL; }
  if (!require_float("logsumexp", x)) return NULL;
  nb_scope_begin();
  nb_no_grad_begin();
  nb_tensor *m = nb_max(x, n_axes, axes, 1);
  nb_tensor *zero = m ? nb_scalar(0.0, x->dtype, nb_device_of(x)) : NULL;
  nb_tensor *finite = m ? nb_lt(nb_abs(m), nb_scalar(INFINITY, x->dtype, nb_device_of(x))) : NULL;
  m = finite ? nb_where(finite, m, zero) : NULL;
  nb_no_grad_end();
  nb_tensor *s = nb_log(nb_sum(nb_exp(nb_sub(x, m)), n_axes, axes, 1));
  nb_tensor *r = nb_add(s, m);
  if (r && !keepdim) {
    int64_t shape[NB_MAX_DIMS];
    int mask[NB_MAX_DIMS];
    nb_op_axes_mask("logsumexp", x, n_axes, axes, mask);
    r = nb_reshape(r, reduced_shape(x, mask, 0, shape), shape);
  }
  r = nb_keep(r);
  nb_scope_end();
  return nb_autorelease(r);
}

nb_tensor *nb_norm(const nb_tensor *x, double p, int n_axes, const int *axes, int keepdim) {
  if (!x) { nb_error_null("norm", "x"); return NULL; }
  if (!require_float("norm", x)) return NULL;
  if (!(p > 0)) {
    nb_error_set(NB_ERR_VALUE, "norm: p = %g (expected p > 0 or infinity)", p);
    return NULL;
  }
  /* inf: sign(x) g split evenly among the |x| equal to the max (0 in an
   * all-zero row); 1: sign(x) g; others: 0 where x == 0 or the norm is 0 */
  if (isinf(p)) COMPOSE(nb_max(nb_abs(x), n_axes, axes, keepdim));
  if (p == 1) COMPOSE(nb_sum(nb_abs(x), n_axes, axes, keepdim));
  if (p == 2) COMPOSE(root_masked(nb_sum(nb_square(x), n_axes, axes, keepdim), 2.0));
  COMPOSE(root_masked(nb_sum(abs_pow_masked(x, p), n_axes, axes, keepdim), p));
}

/* Sums the axes that broadcasting added or stretched from size 1. */
nb_tensor *nb_sum_to_shape(const nb_tensor *t, int ndim, const int64_t *shape) {
  if (!t) { nb_error_null("sum_to_shape", "t"); return NULL; }
  char b1[200], b2[200];
  int lead = t->ndim - ndim, axes[NB_MAX_DIMS], na = 0;
  if (lead < 0) goto bad;
  for (int i = 0; i < t->ndim; i++) {
    if (i < lead) axes[na++] = i;
    else if (shape[i - lead] == 1 && t->shape[i] != 1) axes[na++] = i;
    else if (shape[i - lead] != t->shape[i]) goto bad;
  }
  if (!na) return nb_autorelease(nb_retain((nb_tensor *)t));
  COMPOSE(nb_reshape(nb_sum(t, na, axes, 1), ndim, shape));
bad:
  nb_error_set(NB_ERR_SHAPE, "sum_to_shape: %s cannot be summed to %s", nb_describe(t, b1, sizeof b1),
               nb_shape_str(ndim, shape, b2, sizeof b2));
  return NULL;
}
