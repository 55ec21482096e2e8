/* linear: y (..., out) = x (..., in) @ weight (out, in)^T + bias (out), one
 * entry of the op table and one GEMM with the bias in its epilogue (the
 * backend's gemm_ex).
 *
 * Forward: x's leading axes are read as one axis of M rows (a view when
 * they merge into one stride, else x is copied contiguous first); weight
 * is read transposed in place. Backward, each input's gradient in one
 * kernel over all M rows: dx = g @ weight (a linear of g with weight^T, no
 * bias), dweight = g^T @ x (one product with K = M, no batched products
 * summed over the batch), dbias = the column sum of g over every leading
 * axis. The rule never reads the bias's data. Under autocast all three
 * inputs go to the low dtype (the class of matmul, as PyTorch's linear). */
#include <string.h>

#include "ops/ops.h"

extern const nb_op nb_op_linear;

static nb_status float_ok(const char *what, const nb_tensor *t) {
  if (!t || nb_dtype_is_float(t->dtype)) return NB_OK;
  char b[200];
  return nb_error_set(NB_ERR_DTYPE, "linear: %s %s (expected a float tensor)", what,
                      nb_describe(t, b, sizeof b));
}

/* Whether x's leading axes (all but the last) merge into one axis; its
 * stride in *stride (1 row or none: any stride reads it, x's row length).
 * Not reshape's view check (op_view.c): for more than one row the two agree,
 * but for one row that takes the stride of a size-1 axis, and for no rows it
 * always views where this one copies unless the strides chain. */
static int rows_merge(const nb_tensor *x, int64_t *stride) {
  int nd = x->ndim;
  int64_t in = nd ? x->shape[nd - 1] : 1, want = 0;
  int found = 0;
  *stride = in > 0 ? in : 1;
  for (int d = nd - 2; d >= 0; d--) {
    if (x->shape[d] == 1) continue;
    if (found && x->strides[d] != want) return 0;
    if (!found) *stride = x->strides[d];
    found = 1;
    want = x->strides[d] * x->shape[d];
  }
  return 1;
}

/* Float x (..., in), weight (out, in), bias (out) or none; the output has
 * x's leading axes and the promoted dtype. */
static nb_status linear_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *x = c->in[0], *w = c->in[1], *bias = c->in[2];
  nb_status st = float_ok("input", x);
  if (!st) st = float_ok("weight", w);
  if (!st) st = float_ok("bias", bias);
  if (st) return st;
  char b1[200], b2[200], b3[200];
  if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1])
    return nb_error_set(NB_ERR_SHAPE, "linear: input %s and weight %s do not match (expected input "
                        "(..., in) and weight (out, in))", nb_describe(x, b1, sizeof b1),
                        nb_describe(w, b2, sizeof b2));
  if (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0]))
    return nb_error_set(NB_ERR_SHAPE, "linear: bias %s for weight %s (expected shape [%lld])",
                        nb_describe(bias, b3, sizeof b3), nb_describe(w, b2, sizeof b2),
                        (long long)w->shape[0]);
  nb_meta_of(x, out);
  out->shape[x->ndim - 1] = w->shape[0];
  out->dtype = nb_promote(x->dtype, w->dtype);
  if (bias) out->dtype = nb_promote(out->dtype, bias->dtype);
  return NB_OK;
}

/* The kernel takes one dtype (casts recorded, so gradients flow back
 * through them) and rows that merge into one stride. */
static nb_status linear_prepare(const nb_op_call *c, const nb_tensor **in) {
  nb_dtype dt = nb_promote(c->in[0]->dtype, c->in[1]->dtype);
  if (c->in[2]) dt = nb_promote(dt, c->in[2]->dtype);
  int64_t stride;
  for (int i = 0; i < 3; i++)
    if (c->in[i] && !(in[i] = nb_cast(c->in[i], dt))) return nb_last_status();
  if (!rows_merge(in[0], &stride) && !(in[0] = nb_contiguous(in[0]))) return nb_last_status();
  return NB_OK;
}

static nb_status linear_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const nb_tensor *x = c->in[0], *w = c->in[1], *bias = c->in[2];
  int64_t N = w->shape[0], K = w->shape[1], M = nb_numel(out) / N, rs;
  rows_merge(x, &rs); /* prepare made them merge */
  nb_kview ko, kx, kw, kb;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &kx);
  nb_kview_of(w, &kw);
  ko.ndim = kx.ndim = kw.ndim = 2;
  ko.shape[0] = M; ko.shape[1] = N; ko.strides[0] = N; ko.strides[1] = 1;
  kx.shape[0] = M; kx.shape[1] = K; kx.strides[0] = rs; kx.strides[1] = x->strides[x->ndim - 1];
  kw.shape[0] = K; kw.shape[1] = N; kw.strides[0] = w->strides[1]; kw.strides[1] = w->strides[0];
  nb_gemm_epilogue ep = {NULL, NULL, NULL, 1.0f, 0.0f, 0};
  if (bias) nb_kview_of(bias, &kb), ep.bias = &kb;
  return nb_backend_for(nb_device_of(out))->gemm_ex(&ko, &kx, &kw, bias ? &ep : NULL);
}

static nb_tensor *linear_run(const nb_tensor *x, const nb_tensor *w, const nb_tensor *bias) {
  return nb_op_run(&nb_op_linear, 3, (const nb_tensor *const[]){x, w, bias}, NULL);
}

/* dx = g @ weight, dweight = g^T @ x over all rows, dbias = g summed over
 * its leading axes; each cast back to its input's dtype. */
static nb_status linear_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *x = n->inputs[0], *w = n->inputs[1], *bias = n->inputs[2];
  int nd = g->ndim;
  if (nb_node_needs_grad(n, 0)) gin[0] = nb_op_grad_to(linear_run(g, nb_transpose(w, 0, 1), NULL), x);
  if (nb_node_needs_grad(n, 1)) gin[1] = nb_op_grad_to(nb_matmul_tn_folded(g, x), w);
  if (bias && nb_node_needs_grad(n, 2)) {
    int axes[NB_MAX_DIMS];
    for (int d = 0; d < nd - 1; d++) axes[d] = d;
    gin[2] = nb_op_grad_to(nd > 1 ? nb_sum(g, nd - 1, axes, 0) : g, bias);
  }
  for (int i = 0; i < 3; i++)
    if (nb_node_needs_grad(n, i) && !gin[i]) return nb_last_status();
  return NB_OK;
}

/* 2·M·N·K flops for the product and M·N for the bias; every tensor read or
 * written once. */
static void linear_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  double nout = (double)nb_shape_numel(out->ndim, out->shape);
  *bytes = nb_op_io_bytes(c, out);
  *flops = 2.0 * nout * (double)c->in[1]->shape[1] + (c->in[2] ? nout : 0.0);
}

const nb_op nb_op_linear = {
    .name = "linear", .kind = NB_OPK_CONTRACT, .n_in = 3, .n_opt = 1,
    .in_names = {"x", "weight", "bias"}, .prec = NB_PREC_LOW,
    .determinism = "CUDA: the GEMM is chosen per shape and device, or by the autotuner "
                   "(NABLA_AUTOTUNE=1), as matmul's; each sums in a fixed order",
    .infer = linear_infer, .prepare = linear_prepare, .forward = linear_forward,
    .backward = linear_bw, .meta_only_in = 1u << 2, .cost = linear_cost,
    .bench_in = "r:16384x768,r:3072x768,r:3072"}; /* GPT-2 small's MLP up-projection */

nb_tensor *nb_linear(const nb_tensor *x, const nb_tensor *weight, const nb_tensor *bias) {
  return linear_run(x, weight, bias);
}
