/* Kernel views (nb_kview) of tensors, and the helpers kernels use. */
#include "backend/backend.h"
#include "core/core.h"

void nb_kview_of(const nb_tensor *t, nb_kview *v) {
  v->data = (char *)t->storage->data + t->offset * (int64_t)nb_dtype_size(t->dtype);
  v->dtype = t->dtype;
  v->ndim = t->ndim;
  for (int i = 0; i < t->ndim; i++) {
    v->shape[i] = t->shape[i];
    v->strides[i] = t->strides[i];
  }
}

/* Right-aligned NumPy broadcast of t's view to (ndim, shape): stride 0 on
 * new or size-1 axes. Returns 0, or -1 if t cannot broadcast. */
int nb_kview_broadcast(const nb_tensor *t, int ndim, const int64_t *shape, nb_kview *v) {
  nb_kview_of(t, v);
  if (t->ndim > ndim) return -1;
  int off = ndim - t->ndim;
  for (int i = ndim - 1; i >= 0; i--) {
    int j = i - off;
    int64_t sz = j >= 0 ? t->shape[j] : 1, st = j >= 0 ? t->strides[j] : 0;
    if (sz != shape[i]) {
      if (sz != 1) return -1;
      st = 0;
    }
    v->shape[i] = shape[i];
    v->strides[i] = st;
  }
  v->ndim = ndim;
  return 0;
}

int64_t nb_kview_numel(const nb_kview *v) { return nb_shape_numel(v->ndim, v->shape); }

int nb_kview_is_contiguous(const nb_kview *v) {
  int64_t s = 1;
  for (int i = v->ndim - 1; i >= 0; i--) {
    if (v->shape[i] != 1 && v->strides[i] != s) return 0;
    s *= v->shape[i];
  }
  return 1;
}
