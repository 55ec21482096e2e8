/* Internal to nn: the gradient-norm pass that clipping (optim.c) and loss
 * scaling (scaler.c) share. */
#ifndef NB_NN_GRADS_H
#define NB_NN_GRADS_H

#include "nabla.h"

/* *norm = inv_scale * the global L2 norm of the gradients of params (the
 * squares summed in f64 in one multi-tensor pass where the backend has it;
 * the sum comes to the host: one synchronisation). *norm is not finite iff
 * some gradient element is not. Then every gradient is multiplied by
 * inv_scale * min(1, max_norm / (*norm + 1e-6)) (max_norm < 0 or infinite:
 * no clipping; a product of 1 writes nothing), in one pass; with
 * keep_nonfinite a non-finite *norm leaves the gradients untouched, else
 * it propagates into them as torch's clip_grad_norm_ does. */
nb_status nb_nn_grad_unscale_clip(nb_params *params, double inv_scale, double max_norm,
                                  int keep_nonfinite, double *norm);

/* out (a 0-d f64 on the gradients' device) = the gradients' sum of
 * squares, in one multi-tensor pass, with no host wait; *done = 0 (and
 * nothing run) unless every gradient of params is contiguous, of a float
 * dtype, on out's device, whose backend has device control. */
nb_status nb_nn_grad_sumsq_device(nb_params *params, nb_tensor *out, int *done);
/* The optimizer's step under the loss scaler's device control block ctl
 * (nn/scaler.c; ops/op_optim.h): AdamW only (nb_nn_optim_device_ctl). */
nb_status nb_nn_optim_step_ctl(nb_optim *o, nb_tensor *ctl);
int nb_nn_optim_device_ctl(const nb_optim *o);

#endif
