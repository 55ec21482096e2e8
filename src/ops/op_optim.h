/* Fused optimizer entries: the ops that nn/optim.c calls for an update or a
 * gradient-clipping pass instead of composing it from elementwise ops. Each
 * runs one backend kernel (or one per tensor) in place on the tensors'
 * device; none records a node. The tensors are contiguous, of one shape per
 * (p, g, state) group, on one device, and checked by the caller
 * (nn/optim.c); the math of each kernel is in backend/backend_entries.h. */
#ifndef NB_OP_OPTIM_H
#define NB_OP_OPTIM_H

#include "backend/backend.h" /* NB_AMP_*: the control block's entries */
#include "core/core.h"

typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step; /* the optimizer's step count, from 1 */
  /* Device control (NULL: none): the loss scaler's f64 control block
   * (NB_AMP_* of backend/backend.h) and a 0-d f64 on the same device; the
   * step is skipped on the device when the block says so, the gradients
   * are multiplied by its factor and the step count is its good steps
   * minus *step_base (nb_adamw_args). */
  const nb_tensor *ctl, *step_base;
} nb_adamw_hparams;

/* What the multi-tensor entries can take on dev's backend: a mask of
 * NB_OPTIM_ADAMW_MULTI (nb_op_adamw_multi) and NB_OPTIM_CLIP_MULTI
 * (nb_op_sumsq_multi, nb_op_scale_multi) and NB_OPTIM_DEVICE_CTL (working
 * copies and device control in nb_op_adamw_multi, nb_op_amp_update); -1 +
 * error when dev is not available. */
enum { NB_OPTIM_ADAMW_MULTI = 1, NB_OPTIM_CLIP_MULTI = 2, NB_OPTIM_DEVICE_CTL = 4 };
int nb_op_optim_caps(nb_device dev);

/* AdamW on one parameter p with gradient g and moments m, v. */
nb_status nb_op_adamw_step(nb_tensor *p, const nb_tensor *g, nb_tensor *m, nb_tensor *v,
                           const nb_adamw_hparams *h);
/* AdamW on n parameters at once (the same bits as n nb_op_adamw_step calls):
 * one backend call, or one per parameter when two of the p[i] share bytes.
 * w (NULL, or n entries that may be NULL): working copies (bf16/f16,
 * contiguous, p[i]'s shape) that get the new values rounded; with w or
 * device control the backend needs NB_OPTIM_DEVICE_CTL. */
nb_status nb_op_adamw_multi(int n, nb_tensor *const *p, nb_tensor *const *g, nb_tensor *const *m,
                            nb_tensor *const *v, nb_tensor *const *w, const nb_adamw_hparams *h);
/* The loss scaler's decision and update on the device (amp_update of
 * backend/backend_entries.h): ctl f64[NB_AMP_N], scale32 a 0-d f32. */
nb_status nb_op_amp_update(nb_tensor *ctl, nb_tensor *scale32, double max_norm, double growth,
                           double backoff, int64_t interval);
/* The same decision and update on a host copy of the block (the scaler's
 * host route): the backend's one rule (backend/amp_rule.h). Returns the
 * next scale. */
double nb_op_amp_rule(double *c, const nb_amp_args *a);
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
