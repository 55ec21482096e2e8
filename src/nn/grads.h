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

#endif
