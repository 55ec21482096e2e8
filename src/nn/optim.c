/* Optimizers (SGD with momentum/Nesterov, AdamW) and gradient clipping.
 *
 * The update itself is one fused op per parameter (nb_op_adamw_step,
 * nb_op_sgd_step in ops/op_optim.h: one kernel each), run on the
 * parameter's device on contiguous tensors; AdamW hands its contiguous
 * parameters of one device to nb_op_adamw_multi at once (the same bits,
 * fewer launches). This file owns the state: one slot per parameter, allocated on the
 * parameter's device the first time it is needed (the parameter's first
 * step with a gradient, or the first nb_optim_state_* call, so a checkpoint
 * can be restored into it before any step).
 *
 * Semantics follow torch.optim:
 *   SGD:   d = g + wd*p; buf = momentum*buf + (1-dampening)*d (buf = d on
 *          the parameter's first step); d = nesterov ? d + momentum*buf : buf;
 *          p -= lr*d.
 *   AdamW: p -= lr*wd*p; m, v exponential averages of g and g*g (f32);
 *          p -= lr * (m/(1-beta1^t)) / (sqrt(v/(1-beta2^t)) + eps).
 * The step count t is the optimizer's (nb_optim_steps), shared by all
 * parameters, which is what a checkpoint stores.
 *
 * Working copies (master weights): a parameter that autocast has cast to
 * bf16/f16 keeps that cast as its working copy (nb_tensor.work, see
 * ops/op_run.c); AdamW's pass writes the copy with the new values rounded,
 * in the same kernel, and registers it by the parameter's write stamp, so
 * the next step under autocast uses it instead of a cast kernel. A copy
 * that something else still holds (a live graph, a tensor of the user's)
 * is not overwritten: the pass writes a fresh one.
 *
 * Under the loss scaler's device control (nn/scaler.c) the step count
 * lives on the device too: t = the block's good steps - step_base, where
 * step_base is set once when the optimizer first steps under that block;
 * the host's count is brought back (one read) only when asked. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "nn/grads.h"
#include "ops/op_optim.h"

typedef enum { OPTIM_SGD, OPTIM_ADAMW } optim_kind;

typedef struct {
  nb_tensor *state[2];   /* SGD: momentum buffer; AdamW: m, v */
  char *name[2];
  int started;           /* the state holds history (SGD's first-step rule) */
} optim_slot;

struct nb_optim {
  optim_kind kind;
  nb_params *params;     /* borrowed: must outlive the optimizer */
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  int nesterov;
  int64_t steps;         /* unless steps_on_device: then ctl's good steps - step_base */
  int n_slots;
  optim_slot *slots;
  nb_tensor *ctl, *step_base; /* the device control block last stepped under (owned) */
  int steps_on_device;
};

static const char *optim_name(const nb_optim *o) { return o->kind == OPTIM_SGD ? "sgd" : "adamw"; }

/* State tensors per parameter: AdamW has m and v; SGD a buffer only with momentum. */
static int optim_per_param(const nb_optim *o) {
  return o->kind == OPTIM_ADAMW ? 2 : o->momentum != 0 ? 1 : 0;
}

static const char *optim_state_label(const nb_optim *o, int k) {
  if (o->kind == OPTIM_SGD) return "momentum";
  return k ? "v" : "m";
}

static nb_optim *optim_alloc(nb_params *params, optim_kind kind, double lr) {
  nb_optim *o = calloc(1, sizeof *o);
  if (!o) {
    nb_error_set(NB_ERR_OOM, "optimizer: out of memory");
    return NULL;
  }
  o->kind = kind;
  o->params = params;
  o->lr = lr;
  return o;
}

nb_optim *nb_sgd_new(nb_params *params, double lr, double momentum, double dampening, int nesterov,
                     double weight_decay) {
  if (!params) {
    nb_error_null("nb_sgd_new", "params");
    return NULL;
  }
  if (!(lr >= 0) || !isfinite(lr) || !(momentum >= 0) || !isfinite(momentum) ||
      !isfinite(dampening) || !(weight_decay >= 0) || !isfinite(weight_decay)) {
    nb_error_set(NB_ERR_VALUE, "nb_sgd_new: lr %g, momentum %g, dampening %g, weight_decay %g (expected "
                 "finite values, lr, momentum and weight_decay >= 0)", lr, momentum, dampening, weight_decay);
    return NULL;
  }
  if (nesterov && (momentum <= 0 || dampening != 0)) {
    nb_error_set(NB_ERR_VALUE, "nb_sgd_new: Nesterov momentum requires momentum > 0 and dampening 0 (got "
                 "momentum %g, dampening %g)", momentum, dampening);
    return NULL;
  }
  nb_optim *o = optim_alloc(params, OPTIM_SGD, lr);
  if (!o) return NULL;
  o->momentum = momentum;
  o->dampening = dampening;
  o->nesterov = nesterov != 0;
  o->weight_decay = weight_decay;
  return o;
}

nb_optim *nb_adamw_new(nb_params *params, double lr, double beta1, double beta2, double eps,
                       double weight_decay) {
  if (!params) {
    nb_error_null("nb_adamw_new", "params");
    return NULL;
  }
  if (!(lr >= 0) || !isfinite(lr) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) ||
      !(eps >= 0) || !isfinite(eps) || !(weight_decay >= 0) || !isfinite(weight_decay)) {
    nb_error_set(NB_ERR_VALUE, "nb_adamw_new: lr %g, betas (%g, %g), eps %g, weight_decay %g (expected "
                 "lr >= 0, betas in [0, 1), eps >= 0, weight_decay >= 0, all finite)", lr, beta1, beta2,
                 eps, weight_decay);
    return NULL;
  }
  nb_optim *o = optim_alloc(params, OPTIM_ADAMW, lr);
  if (!o) return NULL;
  o->beta1 = beta1;
  o->beta2 = beta2;
  o->eps = eps;
  o->weight_decay = weight_decay;
  return o;
}

/* ---- state --------------------------------------------------------------- */

/* Grows the slot array to cover every parameter (parameters may be added to
 * the list after the optimizer was made). */
static nb_status optim_sync_slots(nb_optim *o) {
  int n = nb_params_count(o->params);
  if (n <= o->n_slots) return NB_OK;
  optim_slot *ns = realloc(o->slots, (size_t)n * sizeof *ns);
  if (!ns) return nb_error_set(NB_ERR_OOM, "%s: out of memory for optimizer state", optim_name(o));
  memset(ns + o->n_slots, 0, (size_t)(n - o->n_slots) * sizeof *ns);
  o->slots = ns;
  o->n_slots = n;
  return NB_OK;
}

/* Optimizer state is f32 (AdamW's m and v always; the SGD buffer for f32
 * and narrower parameters), f64 for f64 parameters' SGD buffer. */
static nb_dtype optim_state_dtype(const nb_optim *o, const nb_tensor *p) {
  if (o->kind == OPTIM_SGD && nb_dtype_of(p) == NB_F64) return NB_F64;
  return NB_F32;
}

/* Allocates slot i's state (zeros on the parameter's device) if absent. */
static nb_status optim_materialise(nb_optim *o, int i) {
  optim_slot *s = &o->slots[i];
  nb_tensor *p = nb_params_get(o->params, i);
  const char *pname = nb_params_name(o->params, i);
  for (int k = 0; k < optim_per_param(o); k++) {
    if (s->state[k]) continue;
    size_t len = strlen(pname) + 32;
    char *name = malloc(len);
    nb_tensor *z = nb_zeros(nb_ndim(p), nb_shape(p), optim_state_dtype(o, p), nb_device_of(p));
    if (!name || !z) { /* z, if any, is owned by the caller's scope */
      free(name);
      return name ? nb_last_status()
                  : nb_error_set(NB_ERR_OOM, "%s: out of memory for state names", optim_name(o));
    }
    snprintf(name, len, "%s.%s.%s", optim_name(o), optim_state_label(o, k), pname);
    s->state[k] = nb_keep(z);
    s->name[k] = name;
  }
  return NB_OK;
}

int nb_optim_state_count(const nb_optim *o) {
  return o ? nb_params_count(o->params) * optim_per_param(o) : 0;
}

nb_tensor *nb_optim_state_get(const nb_optim *o, int i, const char **name) {
  if (name) *name = NULL;
  if (!o) {
    nb_error_null("nb_optim_state_get", "o");
    return NULL;
  }
  int per = optim_per_param(o), count = nb_optim_state_count(o);
  if (i < 0 || i >= count) {
    nb_error_set(NB_ERR_INDEX, "nb_optim_state_get: index %d out of range [0, %d)", i, count);
    return NULL;
  }
  /* State is logically const: materialising it changes no observable value. */
  nb_optim *m = (nb_optim *)o;
  nb_scope_begin();
  nb_status st = optim_sync_slots(m);
  if (!st) st = optim_materialise(m, i / per);
  nb_scope_end();
  if (st) return NULL;
  if (name) *name = m->slots[i / per].name[i % per];
  return m->slots[i / per].state[i % per];
}

/* ---- one step -------------------------------------------------------------- */

static nb_adamw_hparams optim_adamw_hparams(const nb_optim *o, const nb_tensor *ctl) {
  return (nb_adamw_hparams){o->lr,   o->beta1, o->beta2, o->eps, o->weight_decay, o->steps,
                            ctl,     ctl ? o->step_base : NULL};
}

static nb_status optim_kernel(nb_optim *o, optim_slot *s, nb_tensor *pc, nb_tensor *gc,
                              const nb_tensor *ctl) {
  if (o->kind == OPTIM_ADAMW) {
    nb_adamw_hparams h = optim_adamw_hparams(o, ctl);
    if (ctl) return nb_op_adamw_multi(1, &pc, &gc, &s->state[0], &s->state[1], NULL, &h);
    return nb_op_adamw_step(pc, gc, s->state[0], s->state[1], &h);
  }
  /* torch starts the buffer at the first (decayed) gradient: with a zero
   * buffer and no dampening, the kernel's update gives exactly that. */
  double damp = s->started ? o->dampening : 0.0;
  return nb_op_sgd_step(pc, gc, s->state[0], o->lr, o->momentum, damp, o->nesterov,
                        o->weight_decay);
}

/* Checks parameter i's gradient and makes its state; *pc and *gc are then
 * contiguous views of the parameter (p itself unless p is strided) and of
 * its gradient in p's dtype, or both NULL when p has no gradient; *caps is
 * what the fused entries take on p's device (nb_op_optim_caps). Call
 * inside a scope and no-grad. */
static nb_status optim_prepare(nb_optim *o, int i, nb_tensor **pc, nb_tensor **gc, int *caps) {
  nb_tensor *p = nb_params_get(o->params, i), *g = nb_grad(p);
  *pc = *gc = NULL;
  if (!g) return NB_OK;
  char b1[200], b2[200];
  if (nb_numel(g) != nb_numel(p) || nb_ndim(g) != nb_ndim(p) ||
      memcmp(nb_shape(g), nb_shape(p), (size_t)nb_ndim(p) * sizeof(int64_t)))
    return nb_error_set(NB_ERR_SHAPE, "%s: gradient %s does not match parameter \"%s\" %s", optim_name(o),
                        nb_describe(g, b1, sizeof b1), nb_params_name(o->params, i), nb_describe(p, b2, sizeof b2));
  *caps = nb_op_optim_caps(nb_device_of(p));
  if (*caps < 0) return nb_last_status();
  nb_status st = optim_materialise(o, i);
  if (st) return st;
  if (nb_dtype_of(g) != nb_dtype_of(p)) g = nb_cast(g, nb_dtype_of(p));
  *gc = g ? nb_contiguous(g) : NULL;
  *pc = nb_contiguous(p); /* p itself unless it is a strided view */
  if (!*gc || !*pc) {
    *pc = *gc = NULL;
    return nb_last_status();
  }
  return NB_OK;
}

/* The update of one prepared parameter, copied back if p is strided. */
static nb_status optim_apply(nb_optim *o, int i, nb_tensor *pc, nb_tensor *gc, const nb_tensor *ctl) {
  nb_tensor *p = nb_params_get(o->params, i);
  nb_status st;
  if (nb_numel(p) && (st = optim_kernel(o, &o->slots[i], pc, gc, ctl))) return st;
  o->slots[i].started = 1;
  return pc == p ? NB_OK : nb_copy_(p, pc);
}

/* Updates parameter i from its gradient; call inside a scope and no-grad. */
static nb_status optim_update(nb_optim *o, int i) {
  nb_tensor *pc, *gc;
  int caps;
  nb_status st = optim_prepare(o, i, &pc, &gc, &caps);
  if (st || !pc) return st;
  return optim_apply(o, i, pc, gc, NULL);
}

/* ---- AdamW over many parameters at once ------------------------------------- */

/* p's working copy for this step (nb_tensor.work: bf16/f16, contiguous,
 * p's shape), or NULL when autocast has made none. A copy whose bytes are
 * held elsewhere too (a graph still alive, a tensor of the user's) is
 * replaced by a fresh one rather than overwritten under its holder. */
static nb_tensor *optim_work(nb_tensor *p) {
  nb_tensor *w = p->work;
  if (!w || (w->dtype != NB_BF16 && w->dtype != NB_F16) || !nb_is_contiguous(w) ||
      w->ndim != p->ndim || memcmp(w->shape, p->shape, (size_t)p->ndim * sizeof *p->shape) ||
      !nb_same_device(nb_device_of(w), nb_device_of(p)))
    return NULL;
  if (w->storage->refcount == 1 && w->refcount == 1) return w;
  nb_tensor *fresh = nb_tensor_alloc(p->ndim, p->shape, w->dtype, nb_device_of(p));
  if (!fresh) {
    nb_clear_error(); /* no copy this step: autocast casts */
    return NULL;
  }
  nb_release(p->work);
  return p->work = fresh;
}

/* After the pass: the parameters' bytes changed (new stamps); the copies
 * written with them stand for them. */
static void optim_stamp(int k, nb_tensor *const *p, nb_tensor *const *w) {
  for (int j = 0; j < k; j++) nb_storage_touch(p[j]->storage);
  for (int j = 0; j < k; j++)
    if (w[j]) p[j]->work_stamp = p[j]->storage->stamp;
}

/* AdamW step of every parameter: contiguous, non-empty parameters on the
 * first such parameter's device go to one nb_op_adamw_multi call (one or a
 * few launches instead of one per tensor, the same bits), with their
 * working copies where the backend writes them; the rest (strided
 * parameters, other devices, backends without the multi-tensor kernel) one
 * by one. ctl: the device control block, or NULL. */
static nb_status optim_adamw_all(nb_optim *o, const nb_tensor *ctl) {
  int n = o->n_slots, k = 0;
  nb_tensor **tv = malloc((size_t)(n ? n : 1) * 5 * sizeof *tv);
  int *slot = malloc((size_t)(n ? n : 1) * sizeof *slot);
  if (!tv || !slot) {
    free(tv);
    free(slot);
    return nb_error_set(NB_ERR_OOM, "adamw: out of memory for the parameter table");
  }
  int have0 = 0, nw = 0;
  nb_device dev0 = NB_DEVICE_CPU;
  nb_status st = NB_OK;
  for (int i = 0; i < n && !st; i++) {
    nb_tensor *pc, *gc, *p = nb_params_get(o->params, i);
    int caps = 0;
    if ((st = optim_prepare(o, i, &pc, &gc, &caps)) || !pc) continue;
    int batch = pc == p && nb_numel(p) && (caps & NB_OPTIM_ADAMW_MULTI) &&
                (!have0 || nb_same_device(nb_device_of(p), dev0));
    if (!batch) {
      st = optim_apply(o, i, pc, gc, ctl);
      continue;
    }
    have0 = 1;
    dev0 = nb_device_of(p);
    tv[k] = pc;
    tv[n + k] = gc;
    tv[2 * n + k] = o->slots[i].state[0];
    tv[3 * n + k] = o->slots[i].state[1];
    tv[4 * n + k] = (caps & NB_OPTIM_DEVICE_CTL) ? optim_work(p) : NULL;
    nw += tv[4 * n + k] != NULL;
    slot[k++] = i;
  }
  if (!st && k) {
    nb_adamw_hparams h = optim_adamw_hparams(o, ctl);
    st = nb_op_adamw_multi(k, tv, tv + n, tv + 2 * n, tv + 3 * n, nw ? tv + 4 * n : NULL, &h);
    for (int j = 0; j < k && !st; j++) o->slots[slot[j]].started = 1;
    if (!st) optim_stamp(k, tv, tv + 4 * n);
  }
  free(tv);
  free(slot);
  return st;
}

/* The kernels wrote parameters and state in place: what the core knew of
 * their contents (a constant fill, from nb_zeros or nb_ones) no longer holds. */
static void optim_forget_fills(nb_optim *o) {
  for (int i = 0; i < o->n_slots; i++) {
    nb_params_get(o->params, i)->storage->filled = 0; /* (stamps: optim_stamp, nb_copy_) */
    for (int k = 0; k < 2; k++)
      if (o->slots[i].state[k]) o->slots[i].state[k]->storage->filled = 0;
  }
}

/* The host's step count again (one read of the device's). */
static void optim_steps_to_host(nb_optim *o) {
  if (!o->steps_on_device) return;
  nb_scope_begin();
  double t = nb_item(nb_sub(nb_select(o->ctl, 0, NB_AMP_GOOD), o->step_base));
  nb_scope_end();
  if (isfinite(t)) o->steps = (int64_t)t;
  o->steps_on_device = 0;
}

/* Under the control block ctl (after its amp_update of this step): the
 * step count moves to the device, step_base = good + found - 1 - steps, so
 * that good - step_base counts this step when it is taken. */
static nb_status optim_attach(nb_optim *o, nb_tensor *ctl) {
  if (o->ctl == ctl && o->steps_on_device) return NB_OK;
  optim_steps_to_host(o);
  nb_scope_begin();
  nb_tensor *b = nb_add_scalar(nb_add(nb_select(ctl, 0, NB_AMP_GOOD), nb_select(ctl, 0, NB_AMP_FOUND)),
                               -1.0 - (double)o->steps);
  b = b ? nb_contiguous(b) : NULL;
  if (b) {
    nb_release(o->step_base);
    o->step_base = nb_keep(b);
    nb_release(o->ctl);
    o->ctl = nb_keep(ctl);
    o->steps_on_device = 1;
  }
  nb_scope_end();
  return b ? NB_OK : nb_last_status();
}

static nb_status optim_step_with(nb_optim *o, nb_tensor *ctl) {
  nb_status st = optim_sync_slots(o);
  if (st) return st;
  if (ctl) st = optim_attach(o, ctl);
  else optim_steps_to_host(o);
  if (st) return st;
  o->steps++; /* the host's count (stale under device control) */
  nb_scope_begin();
  nb_no_grad_begin();
  if (o->kind == OPTIM_ADAMW) st = optim_adamw_all(o, ctl);
  else
    for (int i = 0; i < o->n_slots && !st; i++) st = optim_update(o, i);
  nb_no_grad_end();
  nb_scope_end();
  optim_forget_fills(o);
  return st;
}

nb_status nb_optim_step(nb_optim *o) {
  if (!o) return nb_error_null("nb_optim_step", "o");
  return optim_step_with(o, NULL);
}

nb_status nb_nn_optim_step_ctl(nb_optim *o, nb_tensor *ctl) {
  if (o->kind != OPTIM_ADAMW)
    return nb_error_set(NB_ERR_UNSUPPORTED, "%s: no device control (AdamW only)", optim_name(o));
  return optim_step_with(o, ctl);
}

int nb_nn_optim_device_ctl(const nb_optim *o) { return o && o->kind == OPTIM_ADAMW; }

void nb_optim_set_lr(nb_optim *o, double lr) {
  if (o) o->lr = lr;
}
double nb_optim_lr(const nb_optim *o) { return o ? o->lr : NAN; }
int64_t nb_optim_steps(const nb_optim *o) {
  if (!o) return 0;
  optim_steps_to_host((nb_optim *)o); /* the count is logically const */
  return o->steps;
}

/* Restoring a step count restores a run: state that exists now (restored
 * from a checkpoint through nb_optim_state_get) counts as history. */
void nb_optim_set_steps(nb_optim *o, int64_t steps) {
  if (!o) return;
  o->steps_on_device = 0; /* the count set here is the host's */
  o->steps = steps < 0 ? 0 : steps;
  for (int i = 0; i < o->n_slots; i++)
    o->slots[i].started = o->steps > 0 && o->slots[i].state[0] != NULL;
}

void nb_optim_free(nb_optim *o) {
  if (!o) return;
  for (int i = 0; i < o->n_slots; i++)
    for (int k = 0; k < 2; k++) {
      nb_release(o->slots[i].state[k]);
      free(o->slots[i].name[k]);
    }
  free(o->slots);
  nb_release(o->ctl);
  nb_release(o->step_base);
  free(o);
}

/* ---- gradient clipping ------------------------------------------------------- */

/* sum(g*g) of one gradient as an f64 scalar on its device (accumulated
 * there in f64 for f64 gradients, f32 for the rest). */
static nb_tensor *clip_sum_squares(const nb_tensor *g) {
  nb_dtype acc = nb_dtype_of(g) == NB_F64 ? NB_F64 : NB_F32;
  const nb_tensor *c = nb_dtype_of(g) == acc ? g : nb_cast(g, acc);
  return nb_cast(nb_sum(nb_square(c), 0, NULL, 0), NB_F64);
}

/* The gradients that the multi-tensor passes (nb_op_sumsq_multi,
 * nb_op_scale_multi) take: contiguous, non-empty, of a float dtype, on the
 * first such gradient's device, when its backend has them. batched[i]
 * marks them; gs gets them, in order; returns how many (*dev: their
 * device). */
static int clip_batch(nb_params *params, char *batched, nb_tensor **gs, nb_device *dev) {
  int k = 0, have = 0;
  for (int i = 0; i < nb_params_count(params); i++) {
    nb_tensor *g = nb_grad(nb_params_get(params, i));
    batched[i] = 0;
    if (!g || !nb_numel(g) || !nb_is_contiguous(g) || !nb_dtype_is_float(nb_dtype_of(g))) continue;
    if (!have) {
      int caps = nb_op_optim_caps(nb_device_of(g));
      if (caps < 0 || !(caps & NB_OPTIM_CLIP_MULTI)) {
        nb_clear_error();
        return 0;
      }
      have = 1;
      *dev = nb_device_of(g);
    } else if (!nb_same_device(nb_device_of(g), *dev)) {
      continue;
    }
    batched[i] = 1;
    gs[k++] = g;
  }
  return k;
}

nb_status nb_nn_grad_sumsq_device(nb_params *params, nb_tensor *out, int *done) {
  int n = nb_params_count(params), grads = 0;
  *done = 0;
  char *batched = malloc((size_t)(n ? n : 1));
  nb_tensor **gs = malloc((size_t)(n ? n : 1) * sizeof *gs);
  if (!batched || !gs) {
    free(batched);
    free(gs);
    return nb_error_set(NB_ERR_OOM, "nb_scaler_step: out of memory for the gradient table");
  }
  for (int i = 0; i < n; i++) grads += nb_grad(nb_params_get(params, i)) != NULL;
  nb_device dev = NB_DEVICE_CPU;
  int k = clip_batch(params, batched, gs, &dev);
  int caps = k ? nb_op_optim_caps(dev) : -1;
  if (caps < 0) nb_clear_error(); /* the caller goes the host's way */
  nb_status st = NB_OK;
  if (k && k == grads && caps >= 0 && (caps & NB_OPTIM_DEVICE_CTL) &&
      nb_same_device(dev, nb_device_of(out))) {
    st = nb_op_sumsq_multi(k, gs, out);
    *done = !st;
    out->storage->filled = 0;
    nb_storage_touch(out->storage);
  }
  free(batched);
  free(gs);
  return st;
}

/* Sum of squares over all gradients in f64: the batch in one backend call
 * (its sum stays on the device: one value read back, one synchronisation),
 * the rest one by one as clip_sum_squares, added there when on the batch's
 * device, else read back each. */
static nb_status clip_total(nb_params *params, const char *batched, nb_tensor *const *gs, int k,
                            nb_device dev, double *total) {
  nb_tensor *dev_total = NULL;
  double host_total = 0;
  if (k) {
    if (!(dev_total = nb_empty(0, NULL, NB_F64, dev))) return nb_last_status();
    nb_status st = nb_op_sumsq_multi(k, gs, dev_total);
    if (st) return st;
  }
  for (int i = 0; i < nb_params_count(params); i++) {
    nb_tensor *g = nb_grad(nb_params_get(params, i));
    if (batched[i] || !g || !nb_numel(g)) continue;
    nb_tensor *s = clip_sum_squares(g);
    if (!s) return nb_last_status();
    if (!dev_total) dev_total = s;
    else if (nb_same_device(nb_device_of(s), nb_device_of(dev_total))) dev_total = nb_add(dev_total, s);
    else host_total += nb_item(s);
    if (!dev_total) return nb_last_status();
  }
  *total = host_total + (dev_total ? nb_item(dev_total) : 0.0);
  return NB_OK;
}

/* g *= coef for every gradient: the batch in one backend call (unless two
 * of its views share bytes), the rest through mul_scalar and a copy. */
static nb_status clip_scale(nb_params *params, const char *batched, nb_tensor *const *gs, int k,
                            double coef) {
  int one_call = k && !nb_op_tensors_overlap(k, gs);
  nb_status st = one_call ? nb_op_scale_multi(k, gs, coef) : NB_OK;
  for (int i = 0; i < nb_params_count(params) && !st; i++) {
    nb_tensor *g = nb_grad(nb_params_get(params, i));
    if (!g || !nb_numel(g)) continue;
    if (batched[i] && one_call) g->storage->filled = 0; /* written in place by the kernel */
    else st = nb_copy_(g, nb_mul_scalar(g, coef));
  }
  return st;
}

nb_status nb_nn_grad_unscale_clip(nb_params *params, double inv_scale, double max_norm,
                                  int keep_nonfinite, double *norm) {
  int n = nb_params_count(params);
  char *batched = malloc((size_t)(n ? n : 1));
  nb_tensor **gs = malloc((size_t)(n ? n : 1) * sizeof *gs);
  if (!batched || !gs) {
    free(batched);
    free(gs);
    return nb_error_set(NB_ERR_OOM, "nb_clip_grad_norm: out of memory for the gradient table");
  }
  double total = 0;
  nb_scope_begin();
  nb_no_grad_begin();
  nb_device dev = NB_DEVICE_CPU;
  int k = clip_batch(params, batched, gs, &dev);
  nb_status st = clip_total(params, batched, gs, k, dev, &total);
  /* the squares summed in f64: total is finite iff every element is */
  *norm = sqrt(total) * inv_scale;
  /* torch's rule: scale by max_norm/(norm+1e-6) when that is below 1. A
   * non-finite norm propagates into the gradients, as in torch, unless
   * keep_nonfinite (the step will be skipped; the gradients stay as they
   * were). The unscale and the clip are one multiplication. */
  double coef = max_norm >= 0 && isfinite(max_norm) ? max_norm / (*norm + 1e-6) : 1.0;
  if (!(coef < 1.0) && !isnan(coef)) coef = 1.0;
  coef *= inv_scale;
  if (!st && !(coef == 1.0) && !(keep_nonfinite && !isfinite(*norm)))
    st = clip_scale(params, batched, gs, k, coef);
  nb_no_grad_end();
  nb_scope_end();
  free(batched);
  free(gs);
  return st;
}

double nb_clip_grad_norm(nb_params *params, double max_norm) {
  if (!params) {
    nb_error_null("nb_clip_grad_norm", "params");
    return -1;
  }
  if (!(max_norm >= 0) || isnan(max_norm)) {
    nb_error_set(NB_ERR_VALUE, "nb_clip_grad_norm: max_norm %g (expected >= 0)", max_norm);
    return -1;
  }
  double norm = 0;
  return nb_nn_grad_unscale_clip(params, 1.0, max_norm, 0, &norm) ? -1 : norm;
}
