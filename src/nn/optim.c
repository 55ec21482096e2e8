/* Optimizers (SGD with momentum/Nesterov, AdamW) and gradient clipping.
 *
 * The update itself is one backend kernel per parameter (adamw_step,
 * sgd_step in backend.h), run on the parameter's device on contiguous
 * views; AdamW hands its contiguous parameters of one device to the
 * backend's adamw_multi at once (the same bits, fewer launches). This file owns the state: one slot per parameter, allocated on the
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
 * parameters, which is what a checkpoint stores. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"

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
  int64_t steps;
  int n_slots;
  optim_slot *slots;
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

static nb_status optim_kernel(nb_optim *o, optim_slot *s, const nb_kview *kp, const nb_kview *kg,
                              const nb_backend *be) {
  nb_kview ka, kb;
  if (s->state[0]) nb_kview_of(s->state[0], &ka);
  if (o->kind == OPTIM_ADAMW) {
    nb_kview_of(s->state[1], &kb);
    return be->adamw_step(kp, kg, &ka, &kb, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->steps);
  }
  /* torch starts the buffer at the first (decayed) gradient: with a zero
   * buffer and no dampening, the kernel's update gives exactly that. */
  double damp = s->started ? o->dampening : 0.0;
  return be->sgd_step(kp, kg, s->state[0] ? &ka : NULL, o->lr, o->momentum, damp, o->nesterov,
                      o->weight_decay);
}

/* Checks parameter i's gradient and makes its state; *pc and *gc are then
 * contiguous views of the parameter (p itself unless p is strided) and of
 * its gradient in p's dtype, or both NULL when p has no gradient. Call
 * inside a scope and no-grad. */
static nb_status optim_prepare(nb_optim *o, int i, nb_tensor **pc, nb_tensor **gc,
                               const nb_backend **be) {
  nb_tensor *p = nb_params_get(o->params, i), *g = nb_grad(p);
  *pc = *gc = NULL;
  if (!g) return NB_OK;
  char b1[200], b2[200];
  if (nb_numel(g) != nb_numel(p) || nb_ndim(g) != nb_ndim(p) ||
      memcmp(nb_shape(g), nb_shape(p), (size_t)nb_ndim(p) * sizeof(int64_t)))
    return nb_error_set(NB_ERR_SHAPE, "%s: gradient %s does not match parameter \"%s\" %s", optim_name(o),
                        nb_describe(g, b1, sizeof b1), nb_params_name(o->params, i), nb_describe(p, b2, sizeof b2));
  *be = nb_backend_for(nb_device_of(p));
  if (!*be) return nb_last_status();
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
static nb_status optim_apply(nb_optim *o, int i, nb_tensor *pc, nb_tensor *gc, const nb_backend *be) {
  nb_tensor *p = nb_params_get(o->params, i);
  nb_kview kp, kg;
  nb_kview_of(pc, &kp);
  nb_kview_of(gc, &kg);
  nb_status st;
  if (nb_numel(p) && (st = optim_kernel(o, &o->slots[i], &kp, &kg, be))) return st;
  o->slots[i].started = 1;
  return pc == p ? NB_OK : nb_copy_(p, pc);
}

/* Updates parameter i from its gradient; call inside a scope and no-grad. */
static nb_status optim_update(nb_optim *o, int i) {
  nb_tensor *pc, *gc;
  const nb_backend *be = NULL;
  nb_status st = optim_prepare(o, i, &pc, &gc, &be);
  if (st || !pc) return st;
  return optim_apply(o, i, pc, gc, be);
}

/* ---- AdamW over many parameters at once ------------------------------------- */

typedef struct {
  uintptr_t lo, hi;
} optim_range;

static int optim_range_cmp(const void *a, const void *b) {
  uintptr_t x = ((const optim_range *)a)->lo, y = ((const optim_range *)b)->lo;
  return (x > y) - (x < y);
}

/* Whether any two of the n contiguous parameter views share bytes (a
 * parameter listed twice, or overlapping views): then the updates must run
 * one after another, as the per-tensor path does. */
static int optim_overlap(const nb_kview *kp, int n) {
  optim_range *r = malloc((size_t)n * sizeof *r);
  if (!r) return 1; /* the per-tensor path needs no memory */
  for (int i = 0; i < n; i++) {
    r[i].lo = (uintptr_t)kp[i].data;
    r[i].hi = r[i].lo + (uintptr_t)nb_kview_numel(&kp[i]) * nb_dtype_size(kp[i].dtype);
  }
  qsort(r, (size_t)n, sizeof *r, optim_range_cmp);
  int ov = 0;
  for (int i = 1; i < n && !ov; i++) ov = r[i].lo < r[i - 1].hi;
  free(r);
  return ov;
}

/* The batch of contiguous parameters on one device through the backend's
 * adamw_multi (one or a few launches instead of one per tensor); same bits
 * as per-tensor adamw_step calls, which remain the path for overlapping
 * parameters. kv holds 4 arrays of cap views: p, g, m, v. */
static nb_status optim_adamw_batch(nb_optim *o, const nb_backend *be, nb_kview *kv, int cap,
                                   const int *slot, int k) {
  nb_kview *kp = kv, *kg = kv + cap, *km = kv + 2 * cap, *kw = kv + 3 * cap;
  nb_status st = NB_OK;
  if (!optim_overlap(kp, k))
    st = be->adamw_multi(k, kp, kg, km, kw, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->steps);
  else
    for (int j = 0; j < k && !st; j++)
      st = be->adamw_step(&kp[j], &kg[j], &km[j], &kw[j], o->lr, o->beta1, o->beta2, o->eps,
                          o->weight_decay, o->steps);
  for (int j = 0; j < k && !st; j++) o->slots[slot[j]].started = 1;
  return st;
}

/* AdamW step of every parameter: contiguous, non-empty parameters on the
 * first such parameter's device go to one adamw_multi call; the rest (strided
 * parameters, other devices, backends without adamw_multi) one by one. */
static nb_status optim_adamw_all(nb_optim *o) {
  int n = o->n_slots, k = 0;
  nb_kview *kv = malloc((size_t)(n ? n : 1) * 4 * sizeof *kv);
  int *slot = malloc((size_t)(n ? n : 1) * sizeof *slot);
  if (!kv || !slot) {
    free(kv);
    free(slot);
    return nb_error_set(NB_ERR_OOM, "adamw: out of memory for the parameter table");
  }
  const nb_backend *be0 = NULL;
  nb_device dev0 = NB_DEVICE_CPU;
  nb_status st = NB_OK;
  for (int i = 0; i < n && !st; i++) {
    nb_tensor *pc, *gc, *p = nb_params_get(o->params, i);
    const nb_backend *be = NULL;
    if ((st = optim_prepare(o, i, &pc, &gc, &be)) || !pc) continue;
    int batch = pc == p && nb_numel(p) && be->adamw_multi && (!be0 || nb_same_device(nb_device_of(p), dev0));
    if (!batch) {
      st = optim_apply(o, i, pc, gc, be);
      continue;
    }
    be0 = be;
    dev0 = nb_device_of(p);
    nb_kview_of(pc, &kv[k]);
    nb_kview_of(gc, &kv[n + k]);
    nb_kview_of(o->slots[i].state[0], &kv[2 * n + k]);
    nb_kview_of(o->slots[i].state[1], &kv[3 * n + k]);
    slot[k++] = i;
  }
  if (!st && k) st = optim_adamw_batch(o, be0, kv, n, slot, k);
  free(kv);
  free(slot);
  return st;
}

/* The kernels wrote parameters and state in place: what the core knew of
 * their contents (a constant fill, from nb_zeros or nb_ones) no longer holds. */
static void optim_forget_fills(nb_optim *o) {
  for (int i = 0; i < o->n_slots; i++) {
    nb_params_get(o->params, i)->storage->filled = 0;
    for (int k = 0; k < 2; k++)
      if (o->slots[i].state[k]) o->slots[i].state[k]->storage->filled = 0;
  }
}

nb_status nb_optim_step(nb_optim *o) {
  if (!o) return nb_error_null("nb_optim_step", "o");
  nb_status st = optim_sync_slots(o);
  if (st) return st;
  o->steps++;
  nb_scope_begin();
  nb_no_grad_begin();
  if (o->kind == OPTIM_ADAMW) st = optim_adamw_all(o);
  else
    for (int i = 0; i < o->n_slots && !st; i++) st = optim_update(o, i);
  nb_no_grad_end();
  nb_scope_end();
  optim_forget_fills(o);
  return st;
}

void nb_optim_set_lr(nb_optim *o, double lr) {
  if (o) o->lr = lr;
}
double nb_optim_lr(const nb_optim *o) { return o ? o->lr : NAN; }
int64_t nb_optim_steps(const nb_optim *o) { return o ? o->steps : 0; }

/* Restoring a step count restores a run: state that exists now (restored
 * from a checkpoint through nb_optim_state_get) counts as history. */
void nb_optim_set_steps(nb_optim *o, int64_t steps) {
  if (!o) return;
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

/* The gradients that the backend's multi-tensor passes take: contiguous,
 * non-empty, of a float dtype, on the first such gradient's device, when
 * that backend has sumsq_multi and scale_multi. batched[i] marks them; kv
 * gets their views, in order; returns how many (*be, *dev: their backend
 * and device). */
static int clip_batch(nb_params *params, char *batched, nb_kview *kv, const nb_backend **be,
                      nb_device *dev) {
  int k = 0;
  *be = NULL;
  for (int i = 0; i < nb_params_count(params); i++) {
    nb_tensor *g = nb_grad(nb_params_get(params, i));
    batched[i] = 0;
    if (!g || !nb_numel(g) || !nb_is_contiguous(g) || !nb_dtype_is_float(nb_dtype_of(g))) continue;
    if (!*be) {
      const nb_backend *b = nb_backend_for(nb_device_of(g));
      if (!b || !b->sumsq_multi || !b->scale_multi) {
        nb_clear_error();
        return 0;
      }
      *be = b;
      *dev = nb_device_of(g);
    } else if (!nb_same_device(nb_device_of(g), *dev)) {
      continue;
    }
    batched[i] = 1;
    nb_kview_of(g, &kv[k++]);
  }
  return k;
}

/* Sum of squares over all gradients in f64: the batch in one backend call
 * (its sum stays on the device: one value read back, one synchronisation),
 * the rest one by one as clip_sum_squares, added there when on the batch's
 * device, else read back each. */
static nb_status clip_total(nb_params *params, const char *batched, const nb_kview *kv, int k,
                            const nb_backend *be, nb_device dev, double *total) {
  nb_tensor *dev_total = NULL;
  double host_total = 0;
  if (k) {
    if (!(dev_total = nb_empty(0, NULL, NB_F64, dev))) return nb_last_status();
    nb_kview ko;
    nb_kview_of(dev_total, &ko);
    nb_status st = be->sumsq_multi(k, kv, &ko);
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
static nb_status clip_scale(nb_params *params, const char *batched, const nb_kview *kv, int k,
                            const nb_backend *be, double coef) {
  int one_call = k && !optim_overlap(kv, k);
  nb_status st = one_call ? be->scale_multi(k, kv, coef) : NB_OK;
  for (int i = 0; i < nb_params_count(params) && !st; i++) {
    nb_tensor *g = nb_grad(nb_params_get(params, i));
    if (!g || !nb_numel(g)) continue;
    if (batched[i] && one_call) g->storage->filled = 0; /* written in place by the kernel */
    else st = nb_copy_(g, nb_mul_scalar(g, coef));
  }
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
  int n = nb_params_count(params);
  char *batched = malloc((size_t)(n ? n : 1));
  nb_kview *kv = malloc((size_t)(n ? n : 1) * sizeof *kv);
  if (!batched || !kv) {
    free(batched);
    free(kv);
    nb_error_set(NB_ERR_OOM, "nb_clip_grad_norm: out of memory for the gradient table");
    return -1;
  }
  double total = 0;
  nb_scope_begin();
  nb_no_grad_begin();
  const nb_backend *be = NULL;
  nb_device dev = NB_DEVICE_CPU;
  int k = clip_batch(params, batched, kv, &be, &dev);
  nb_status st = clip_total(params, batched, kv, k, be, dev, &total);
  double norm = sqrt(total);
  /* torch's rule: scale by max_norm/(norm+1e-6) when that is below 1. A
   * non-finite norm propagates into the gradients, as in torch. */
  double coef = max_norm / (norm + 1e-6);
  if (!st && !(coef >= 1.0)) st = clip_scale(params, batched, kv, k, be, coef);
  nb_no_grad_end();
  nb_scope_end();
  free(batched);
  free(kv);
  return st ? -1 : norm;
}
