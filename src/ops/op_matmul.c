/* matmul with NumPy semantics: 1-D operands promoted, batch axes broadcast.
 * Operands go to the kernel with their own strides (a transposed view is
 * read in place, never copied). */
#include <string.h>

#include "ops/ops.h"

/* dA = g @ B^T, dB = A^T @ g, each summed over the batch axes it was
 * broadcast along. Both products read transposed views, without copies. */
static nb_status matmul_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *a = n->inputs[0], *b = n->inputs[1];
  if (nb_node_needs_grad(n, 0)) gin[0] = nb_op_grad_to(nb_matmul(g, nb_transpose(b, -1, -2)), a);
  if (nb_node_needs_grad(n, 1)) gin[1] = nb_op_grad_to(nb_matmul(nb_transpose(a, -1, -2), g), b);
  return NB_OK;
}

/* Both operands at least 2-D and of one float dtype. */
static nb_tensor *matmul_2d(const nb_tensor *a, const nb_tensor *b) {
  char b1[200], b2[200];
  int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
  int64_t K2 = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
  int64_t batch[NB_MAX_DIMS];
  int nbd = nb_broadcast_shapes(a->ndim - 2, a->shape, b->ndim - 2, b->shape, batch);
  if (K != K2 || nbd < 0 || nbd + 2 > NB_MAX_DIMS) {
    nb_error_set(NB_ERR_SHAPE, "matmul: shapes %s and %s do not match (expected (..., M, K) @ "
                 "(..., K, N) with broadcastable batch axes)", nb_describe(a, b1, sizeof b1),
                 nb_describe(b, b2, sizeof b2));
    return NULL;
  }
  int64_t oshape[NB_MAX_DIMS], ashape[NB_MAX_DIMS], bshape[NB_MAX_DIMS];
  memcpy(oshape, batch, (size_t)nbd * 8);
  memcpy(ashape, batch, (size_t)nbd * 8);
  memcpy(bshape, batch, (size_t)nbd * 8);
  oshape[nbd] = M; oshape[nbd + 1] = N;
  ashape[nbd] = M; ashape[nbd + 1] = K;
  bshape[nbd] = K; bshape[nbd + 1] = N;
  nb_tensor *out = nb_tensor_alloc(nbd + 2, oshape, a->dtype, nb_device_of(a));
  if (!out || !nb_numel(out)) return out;
  nb_kview ko, ka, kb;
  nb_kview_of(out, &ko);
  nb_kview_broadcast(a, nbd + 2, ashape, &ka);
  nb_kview_broadcast(b, nbd + 2, bshape, &kb);
  const nb_backend *be = nb_backend_for(nb_device_of(a));
  nb_status st = K ? be->matmul(&ko, &ka, &kb) : be->fill(&ko, 0.0);
  if (st) { nb_release(out); return NULL; }
  return out;
}

nb_tensor *nb_matmul(const nb_tensor *a, const nb_tensor *b) {
  if (!a) { nb_error_null("matmul", "a"); return NULL; }
  if (!b) { nb_error_null("matmul", "b"); return NULL; }
  char b1[200], b2[200];
  if (a->ndim == 0 || b->ndim == 0) {
    nb_error_set(NB_ERR_SHAPE, "matmul: operands %s and %s must have at least one dimension",
                 nb_describe(a, b1, sizeof b1), nb_describe(b, b2, sizeof b2));
    return NULL;
  }
  if (nb_op_same_device("matmul", 2, (const nb_tensor *const[]){a, b})) return NULL;
  nb_dtype dt = nb_promote(a->dtype, b->dtype);
  if (!nb_dtype_is_float(dt)) {
    nb_error_set(NB_ERR_DTYPE, "matmul: dtypes %s and %s (expected float tensors)",
                 nb_dtype_name(a->dtype), nb_dtype_name(b->dtype));
    return NULL;
  }
  nb_scope_begin();
  const nb_tensor *ca = nb_cast(a, dt), *cb = nb_cast(b, dt);
  if (ca && a->ndim == 1) ca = nb_unsqueeze(ca, 0);
  if (cb && b->ndim == 1) cb = nb_unsqueeze(cb, 1);
  nb_tensor *out = ca && cb ? matmul_2d(ca, cb) : NULL;
  if (out) nb_record("matmul", matmul_bw, 2, (const nb_tensor *const[]){ca, cb}, out);
  nb_autorelease(out);
  if (out && a->ndim == 1) out = nb_squeeze(out, -2);
  if (out && b->ndim == 1) out = nb_squeeze(out, -1);
  out = nb_keep(out);
  nb_scope_end();
  return nb_autorelease(out);
}
