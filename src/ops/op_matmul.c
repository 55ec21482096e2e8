/* matmul with NumPy semantics: 1-D operands promoted, batch axes broadcast.
 * The op-table entry is the product of operands of at least two axes,
 * (..., M, K) @ (..., K, N); nb_matmul promotes 1-D operands around it with
 * views (unsqueeze before, squeeze after), so those stay nodes of their own.
 * Operands go to the kernel with their own strides (a transposed view is
 * read in place, never copied). */
#include <string.h>

#include "ops/ops.h"

static int64_t batch_numel(const nb_tensor *t) { return nb_shape_numel(t->ndim - 2, t->shape); }

/* t (..., C) with all its leading axes folded into the rows: (rows, C); a
 * view where they merge, else a copy (recorded). */
static nb_tensor *fold_rows(const nb_tensor *t) {
  int nd = t->ndim;
  return nb_reshape(t, 2, (const int64_t[]){nb_shape_numel(nd - 1, t->shape), t->shape[nd - 1]});
}

nb_tensor *nb_matmul_tn_folded(const nb_tensor *a, const nb_tensor *b) {
  return nb_matmul(nb_transpose(fold_rows(a), 0, 1), fold_rows(b));
}

/* dB of a b broadcast along every batch axis ((B.., M, K) @ (K, N), the
 * common case): sum_i a_i^T g_i = fold(a)^T @ fold(g), one GEMM with the
 * batch folded into K, instead of batched products summed over the batch. */
static nb_tensor *fold_db(const nb_tensor *a, const nb_tensor *g, const nb_tensor *b) {
  nb_tensor *d = nb_matmul_tn_folded(a, g);
  return nb_op_grad_to(nb_reshape(d, b->ndim, b->shape), b);
}

/* dA of an a broadcast along every batch axis (M, K) @ (B.., K, N):
 * sum_i g_i b_i^T = g' @ b'' with g' (M, batch N) and b'' (batch N, K),
 * both copies (the batch axis moves inside), one GEMM. */
static nb_tensor *fold_da(const nb_tensor *a, const nb_tensor *g, const nb_tensor *b) {
  int nd = g->ndim;
  int64_t M = g->shape[nd - 2], N = g->shape[nd - 1], K = b->shape[b->ndim - 2];
  int64_t nb = batch_numel(g);
  nb_tensor *g3 = nb_reshape(g, 3, (const int64_t[]){nb, M, N});
  nb_tensor *gm = nb_reshape(nb_permute(g3, (const int[]){1, 0, 2}), 2, (const int64_t[]){M, nb * N});
  nb_tensor *b3 = nb_reshape(b, 3, (const int64_t[]){nb, K, N});
  nb_tensor *bm = nb_reshape(nb_transpose(b3, 1, 2), 2, (const int64_t[]){nb * N, K});
  nb_tensor *d = nb_matmul(gm, bm);
  return nb_op_grad_to(nb_reshape(d, a->ndim, a->shape), a);
}

/* dA = g @ B^T, dB = A^T @ g, each summed over the batch axes it was
 * broadcast along. Both products read transposed views, without copies.
 * An operand broadcast along every batch axis while the other has them all
 * gets its gradient as one GEMM over the folded batch (fold_db, fold_da:
 * for dA only when its two copies are smaller than the batched products'
 * (batch, M, K) result). */
static nb_status matmul_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *a = n->inputs[0], *b = n->inputs[1];
  int64_t nbo = batch_numel(g), nba = batch_numel(a), nbb = batch_numel(b);
  int fold_b = nbo > 1 && nbb == 1 && nba == nbo, fold_a = nbo > 1 && nba == 1 && nbb == nbo;
  if (fold_a && (double)nb_numel(g) + (double)nb_numel(b) >
                    (double)nbo * (double)nb_numel(a))
    fold_a = 0;
  if (nb_node_needs_grad(n, 0))
    gin[0] = fold_a ? fold_da(a, g, b) : nb_op_grad_to(nb_matmul(g, nb_transpose(b, -1, -2)), a);
  if (nb_node_needs_grad(n, 1))
    gin[1] = fold_b ? fold_db(a, g, b) : nb_op_grad_to(nb_matmul(nb_transpose(a, -1, -2), g), b);
  return NB_OK;
}

/* Float operands of at least two axes; the result has the promoted dtype
 * and the broadcast batch axes. */
static nb_status matmul_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *a = c->in[0], *b = c->in[1];
  char b1[200], b2[200];
  if (a->ndim < 2 || b->ndim < 2)
    return nb_error_set(NB_ERR_SHAPE, "matmul: operands %s and %s (expected at least two axes "
                        "each; nb_matmul promotes 1-D operands)", nb_describe(a, b1, sizeof b1),
                        nb_describe(b, b2, sizeof b2));
  nb_dtype dt = nb_promote(a->dtype, b->dtype);
  if (!nb_dtype_is_float(dt))
    return nb_error_set(NB_ERR_DTYPE, "matmul: dtypes %s and %s (expected float tensors)",
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype));
  int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
  int64_t K2 = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
  int nbd = nb_broadcast_shapes(a->ndim - 2, a->shape, b->ndim - 2, b->shape, out->shape);
  if (K != K2 || nbd < 0 || nbd + 2 > NB_MAX_DIMS)
    return nb_error_set(NB_ERR_SHAPE, "matmul: shapes %s and %s do not match (expected (..., M, K) @ "
                        "(..., K, N) with broadcastable batch axes)", nb_describe(a, b1, sizeof b1),
                        nb_describe(b, b2, sizeof b2));
  out->ndim = nbd + 2;
  out->shape[nbd] = M;
  out->shape[nbd + 1] = N;
  out->dtype = dt;
  out->device = nb_device_of(a);
  return NB_OK;
}

/* The kernel takes one dtype: both operands cast to the promoted one
 * (recorded, so their gradients flow back through the casts). */
static nb_status matmul_prepare(const nb_op_call *c, const nb_tensor **in) {
  nb_dtype dt = nb_promote(c->in[0]->dtype, c->in[1]->dtype);
  in[0] = nb_cast(c->in[0], dt);
  in[1] = in[0] ? nb_cast(c->in[1], dt) : NULL;
  return in[1] ? NB_OK : nb_last_status();
}

/* The operands broadcast to the output's batch axes; K = 0 gives zeros. */
static nb_status matmul_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const nb_tensor *a = c->in[0], *b = c->in[1];
  int nbd = out->ndim - 2;
  int64_t M = out->shape[nbd], N = out->shape[nbd + 1], K = a->shape[a->ndim - 1];
  int64_t ashape[NB_MAX_DIMS], bshape[NB_MAX_DIMS];
  memcpy(ashape, out->shape, (size_t)nbd * sizeof *ashape);
  memcpy(bshape, out->shape, (size_t)nbd * sizeof *bshape);
  ashape[nbd] = M; ashape[nbd + 1] = K;
  bshape[nbd] = K; bshape[nbd + 1] = N;
  nb_kview ko, ka, kb;
  nb_kview_of(out, &ko);
  nb_kview_broadcast(a, nbd + 2, ashape, &ka);
  nb_kview_broadcast(b, nbd + 2, bshape, &kb);
  const nb_backend *be = nb_backend_for(nb_device_of(out));
  return K ? be->matmul(&ko, &ka, &kb) : be->fill(&ko, 0.0);
}

/* 2·M·N·K flops per batch entry; a and b read, out written once. */
static void matmul_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  const nb_tensor *a = c->in[0], *b = c->in[1];
  double nout = (double)nb_shape_numel(out->ndim, out->shape);
  *bytes = (double)nb_numel(a) * (double)nb_dtype_size(a->dtype) +
           (double)nb_numel(b) * (double)nb_dtype_size(b->dtype) +
           nout * (double)nb_dtype_size(out->dtype);
  *flops = 2.0 * nout * (double)(a->ndim ? a->shape[a->ndim - 1] : 1);
}

const nb_op nb_op_matmul = {
    .name = "matmul", .kind = NB_OPK_CONTRACT, .n_in = 2, .in_names = {"a", "b"},
    .prec = NB_PREC_LOW,
    .determinism = "CUDA: the GEMM (tile, split-K or stream-K) is chosen per shape and device, "
                   "or by the autotuner (NABLA_AUTOTUNE=1); each sums in a fixed order, but "
                   "different choices may round differently",
    .infer = matmul_infer, .prepare = matmul_prepare, .forward = matmul_forward,
    .backward = matmul_bw, .cost = matmul_cost,
    .bench_in = "r:16384x768,r:768x3072"}; /* GPT-2 small's MLP up-projection */

nb_tensor *nb_matmul(const nb_tensor *a, const nb_tensor *b) {
  if (!a) { nb_error_null("matmul", "a"); return NULL; }
  if (!b) { nb_error_null("matmul", "b"); return NULL; }
  char b1[200], b2[200];
  if (a->ndim == 0 || b->ndim == 0) {
    nb_error_set(NB_ERR_SHAPE, "matmul: operands %s and %s must have at least one dimension",
                 nb_describe(a, b1, sizeof b1), nb_describe(b, b2, sizeof b2));
    return NULL;
  }
  nb_scope_begin();
  const nb_tensor *ua = a->ndim == 1 ? nb_unsqueeze(a, 0) : a;
  const nb_tensor *ub = b->ndim == 1 ? nb_unsqueeze(b, 1) : b;
  nb_tensor *out = ua && ub ? nb_op_run(&nb_op_matmul, 2, (const nb_tensor *const[]){ua, ub}, NULL)
                            : NULL;
  if (out && a->ndim == 1) out = nb_squeeze(out, -2);
  if (out && b->ndim == 1) out = nb_squeeze(out, -1);
  out = nb_keep(out);
  nb_scope_end();
  return nb_autorelease(out);
}
