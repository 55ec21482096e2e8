/* Fused optimizer entries: the ops that nn/optim.c calls for an update or a
 * gradient-clipping pass instead of composing it from elementwise ops. Each
 * runs one backend kernel (or one per tensor) in place on the tensors'
 * device; none records a node. The tensors are contiguous, of one shape per
 * (p, g, state) group, on one device, and checked by the caller
 * (nn/optim.c); the math of each kernel is in backend/backend_entries.h. */
#ifndef NB_OP_OPTIM_H
#define NB_OP_OPTIM_H

#include "core/core.h"

typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step; /* the optimizer's step count, from 1 */
} nb_adamw_hparams;

/* What the multi-tensor entries can take on dev's backend: a mask of
 * NB_OPTIM_ADAMW_MULTI (nb_op_adamw_multi) and NB_OPTIM_CLIP_MULTI
 * (nb_op_sumsq_multi, nb_op_scale_multi); -1 + error when dev is not
 * available. */
enum { NB_OPTIM_ADAMW_MULTI = 1, NB_OPTIM_CLIP_MULTI = 2 };
int nb_op_optim_caps(nb_device dev);

/* AdamW on one parameter p with gradient g and moments m, v. */
nb_status nb_op_adamw_step(nb_tensor *p, const nb_tensor *g, nb_tensor *m, nb_tensor *v,
                           const nb_adamw_hparams *h);
/* AdamW on n parameters at once (the same bits as n nb_op_adamw_step calls):
 * one backend call, or one per parameter when two of the p[i] share bytes. */
nb_status nb_op_adamw_multi(int n, nb_tensor *const *p, nb_tensor *const *g, nb_tensor *const *m,
                            nb_tensor *const *v, const nb_adamw_hparams *h);
/* SGD on one parameter; buf is the momentum buffer or NULL (momentum 0). */
nb_status nb_op_sgd_step(nb_tensor *p, const nb_tensor *g, nb_tensor *buf, double lr,
                         double momentum, double dampening, int nesterov, double weight_decay);
/* out (0-d f64 on the tensors' device) = sum of x[i]^2 over every element,
 * accumulated in f64 in a fixed order. */
nb_status nb_op_sumsq_multi(int n, nb_tensor *const *x, nb_tensor *out);
/* x[i] *= s in place, for n tensors that do not share bytes. */
nb_status nb_op_scale_multi(int n, nb_tensor *const *x, double s);
/* Whether any two of the n contiguous tensors share bytes (then in-place
 * multi-tensor updates must run one after another). */
int nb_op_tensors_overlap(int n, nb_tensor *const *x);

#endif
