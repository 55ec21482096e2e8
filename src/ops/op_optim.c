/* Fused optimizer entries (op_optim.h): the optimizers' kernels behind
 * tensor arguments, so that nn/optim.c never sees the backend table. */
#include <stdint.h>
#include <stdlib.h>

#include "backend/amp_rule.h"
#include "ops/op_optim.h"
#include "ops/ops.h"

int nb_op_optim_caps(nb_device dev) {
  const nb_backend *be = nb_backend_for(dev);
  if (!be) return -1;
  return (be->adamw_multi ? NB_OPTIM_ADAMW_MULTI : 0) |
         (be->sumsq_multi && be->scale_multi ? NB_OPTIM_CLIP_MULTI : 0) |
         (be->adamw_multi_ex && be->amp_update ? NB_OPTIM_DEVICE_CTL : 0);
}

nb_status nb_op_adamw_step(nb_tensor *p, const nb_tensor *g, nb_tensor *m, nb_tensor *v,
                           const nb_adamw_hparams *h) {
  const nb_backend *be = nb_backend_for(nb_device_of(p));
  if (!be) return nb_last_status();
  nb_kview kp, kg, km, kv;
  nb_kview_of(p, &kp);
  nb_kview_of(g, &kg);
  nb_kview_of(m, &km);
  nb_kview_of(v, &kv);
  return be->adamw_step(&kp, &kg, &km, &kv, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
                        h->step);
}

nb_status nb_op_sgd_step(nb_tensor *p, const nb_tensor *g, nb_tensor *buf, double lr,
                         double momentum, double dampening, int nesterov, double weight_decay) {
  const nb_backend *be = nb_backend_for(nb_device_of(p));
  if (!be) return nb_last_status();
  nb_kview kp, kg, kb;
  nb_kview_of(p, &kp);
  nb_kview_of(g, &kg);
  if (buf) nb_kview_of(buf, &kb);
  return be->sgd_step(&kp, &kg, buf ? &kb : NULL, lr, momentum, dampening, nesterov, weight_decay);
}

typedef struct {
  uintptr_t lo, hi;
} optim_range;

static int optim_range_cmp(const void *a, const void *b) {
  uintptr_t x = ((const optim_range *)a)->lo, y = ((const optim_range *)b)->lo;
  return (x > y) - (x < y);
}

int nb_op_tensors_overlap(int n, nb_tensor *const *x) {
  optim_range *r = malloc((size_t)(n ? n : 1) * sizeof *r);
  if (!r) return 1; /* the one-by-one path needs no memory */
  for (int i = 0; i < n; i++) {
    size_t es = nb_dtype_size(x[i]->dtype);
    r[i].lo = (uintptr_t)((char *)x[i]->storage->data + x[i]->offset * (int64_t)es);
    r[i].hi = r[i].lo + (uintptr_t)nb_numel(x[i]) * es;
  }
  qsort(r, (size_t)n, sizeof *r, optim_range_cmp);
  int ov = 0;
  for (int i = 1; i < n && !ov; i++) ov = r[i].lo < r[i - 1].hi;
  free(r);
  return ov;
}

/* Views of the n tensors of each of the k arrays, in one allocation:
 * views[j * n + i] is ts[j][i]. NULL + error when out of memory. */
static nb_kview *views_of(const char *op, int n, int k, nb_tensor *const *const *ts) {
  nb_kview *kv = malloc((size_t)(n ? n : 1) * (size_t)k * sizeof *kv);
  if (!kv) {
    nb_error_set(NB_ERR_OOM, "%s: out of memory for %d tensor views", op, n * k);
    return NULL;
  }
  for (int j = 0; j < k; j++)
    for (int i = 0; i < n; i++) nb_kview_of(ts[j][i], &kv[j * n + i]);
  return kv;
}

/* The address of a tensor's first element (device memory for the kernels). */
static const double *optim_f64_ptr(const nb_tensor *t) {
  return t ? (const double *)((const char *)t->storage->data + t->offset * (int64_t)sizeof(double))
           : NULL;
}

nb_status nb_op_adamw_multi(int n, nb_tensor *const *p, nb_tensor *const *g, nb_tensor *const *m,
                            nb_tensor *const *v, nb_tensor *const *w, const nb_adamw_hparams *h) {
  if (n <= 0) return NB_OK;
  const nb_backend *be = nb_backend_for(nb_device_of(p[0]));
  if (!be) return nb_last_status();
  int ex = w || h->ctl;
  if (ex && !be->adamw_multi_ex)
    return nb_error_set(NB_ERR_UNSUPPORTED, "adamw: the %s backend has no working copies or device "
                        "control (adamw_multi_ex)", be->name);
  nb_kview *kv = views_of("adamw", n, 5, (nb_tensor *const *const[]){p, g, m, v, p});
  if (!kv) return nb_last_status();
  nb_kview *kp = kv, *kg = kv + n, *km = kv + 2 * n, *kw = kv + 3 * n, *kc = kv + 4 * n;
  for (int j = 0; j < n; j++) {
    if (w && w[j]) nb_kview_of(w[j], &kc[j]);
    else kc[j].data = NULL;
  }
  nb_adamw_args a = {h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, h->step,
                     optim_f64_ptr(h->ctl), optim_f64_ptr(h->step_base)};
  int one_call = !nb_op_tensors_overlap(n, p);
  nb_status st = NB_OK;
  if (one_call)
    st = ex ? be->adamw_multi_ex(n, kp, kg, km, kw, kc, &a)
            : be->adamw_multi(n, kp, kg, km, kw, h->lr, h->beta1, h->beta2, h->eps,
                              h->weight_decay, h->step);
  for (int j = 0; j < n && !one_call && !st; j++)
    st = ex ? be->adamw_multi_ex(1, &kp[j], &kg[j], &km[j], &kw[j], &kc[j], &a)
            : be->adamw_step(&kp[j], &kg[j], &km[j], &kw[j], h->lr, h->beta1, h->beta2, h->eps,
                             h->weight_decay, h->step);
  free(kv);
  return st;
}

nb_status nb_op_amp_update(nb_tensor *ctl, nb_tensor *scale32, double max_norm, double growth,
                           double backoff, int64_t interval) {
  const nb_backend *be = nb_backend_for(nb_device_of(ctl));
  if (!be) return nb_last_status();
  nb_kview kc, ks;
  nb_kview_of(ctl, &kc);
  nb_kview_of(scale32, &ks);
  nb_amp_args a = {max_norm, growth, backoff, interval};
  ctl->storage->filled = scale32->storage->filled = 0;
  nb_storage_touch(ctl->storage);
  nb_storage_touch(scale32->storage);
  return be->amp_update(&kc, &ks, &a);
}

nb_status nb_op_sumsq_multi(int n, nb_tensor *const *x, nb_tensor *out) {
  const nb_backend *be = nb_backend_for(nb_device_of(out));
  if (!be) return nb_last_status();
  nb_kview *kv = views_of("nb_clip_grad_norm", n, 1, (nb_tensor *const *const[]){x});
  if (!kv) return nb_last_status();
  nb_kview ko;
  nb_kview_of(out, &ko);
  nb_status st = be->sumsq_multi(n, kv, &ko);
  free(kv);
  return st;
}

nb_status nb_op_scale_multi(int n, nb_tensor *const *x, double s) {
  if (n <= 0) return NB_OK;
  const nb_backend *be = nb_backend_for(nb_device_of(x[0]));
  if (!be) return nb_last_status();
  nb_kview *kv = views_of("nb_clip_grad_norm", n, 1, (nb_tensor *const *const[]){x});
  if (!kv) return nb_last_status();
  nb_status st = be->scale_multi(n, kv, s);
  free(kv);
  return st;
}

double nb_op_amp_rule(double *c, const nb_amp_args *a) { return nb_amp_rule(c, a); }
