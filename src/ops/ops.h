/* Internal helpers shared by the op definitions in src/ops/. */
#ifndef NB_OPS_H
#define NB_OPS_H

#include "graph/node.h"
#include "graph/op.h"
#include "backend/backend.h"
#include "core/core.h"

/* Gradient g of a broadcast result, summed back to input x's shape and cast
 * to x's dtype (a new reference). */
nb_tensor *nb_op_grad_to(const nb_tensor *g, const nb_tensor *x);
/* Fails (and names op) unless all given tensors share one device (NULL
 * entries, absent optional inputs, are skipped). */
nb_status nb_op_same_device(const char *op, int n, const nb_tensor *const *ts);
/* Normalises a set of axes into a mask; n_axes 0 means all. */
nb_status nb_op_axes_mask(const char *op, const nb_tensor *x, int n_axes, const int *axes,
                          int mask[NB_MAX_DIMS]);
/* The scalar as a 0-d tensor of the dtype a binary op with t should use. */
nb_tensor *nb_op_scalar_for(const nb_tensor *t, double s);
/* Whether attention on q, k, v (mask, dropout p) takes the fused kernels
 * (op_attention.c's policy; 0: the composition). */
int nb_attention_fused_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v,
                          const nb_tensor *mask, double p);
/* sum_i a_i^T b_i over every leading axis of a (..., Ca) and b (..., Cb)
 * (the same leading axes): (Ca, Cb), one product with both folded to rows
 * (views where their leading axes merge, else recorded copies). */
nb_tensor *nb_matmul_tn_folded(const nb_tensor *a, const nb_tensor *b);
/* t itself when its last axis has stride 1 (what the attention kernels
 * read), else a contiguous copy (autoreleased). */
const nb_tensor *nb_attention_rows(const nb_tensor *t);

#endif
