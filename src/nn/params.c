/* nb_params: a named, ordered list of parameter tensors. The list holds one
 * reference to each tensor and a copy of each name. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

struct nb_params {
  int n, cap;
  char **names;
  nb_tensor **tensors;
};

nb_params *nb_params_new(void) {
  nb_params *p = calloc(1, sizeof *p);
  if (!p) nb_error_set(NB_ERR_OOM, "nb_params_new: out of memory");
  return p;
}

static int params_grow(nb_params *p) {
  if (p->n < p->cap) return 0;
  int nc = p->cap ? p->cap * 2 : 16;
  char **nn = realloc(p->names, (size_t)nc * sizeof *nn);
  if (nn) p->names = nn;
  nb_tensor **nt = nn ? realloc(p->tensors, (size_t)nc * sizeof *nt) : NULL;
  if (nt) p->tensors = nt;
  if (!nn || !nt) return nb_error_set(NB_ERR_OOM, "nb_params_add: out of memory");
  p->cap = nc;
  return 0;
}

nb_tensor *nb_params_add(nb_params *p, const char *name, nb_tensor *t) {
  if (!p || !name || !t) {
    nb_error_null("nb_params_add", !p ? "p" : !name ? "name" : "t");
    return NULL;
  }
  if (nb_params_find(p, name)) {
    nb_error_set(NB_ERR_VALUE, "nb_params_add: a parameter named \"%.200s\" already exists", name);
    return NULL;
  }
  if (nb_set_requires_grad(t, 1)) return NULL;
  size_t len = strlen(name);
  char *copy = malloc(len + 1);
  if (!copy || params_grow(p)) {
    if (!copy) nb_error_set(NB_ERR_OOM, "nb_params_add: out of memory");
    free(copy);
    return NULL;
  }
  memcpy(copy, name, len + 1);
  p->names[p->n] = copy;
  p->tensors[p->n] = nb_retain(t);
  p->n++;
  return t;
}

int nb_params_count(const nb_params *p) { return p ? p->n : 0; }

nb_tensor *nb_params_get(const nb_params *p, int i) {
  if (!p || i < 0 || i >= p->n) {
    if (p) nb_error_set(NB_ERR_INDEX, "nb_params_get: index %d out of range [0, %d)", i, p->n);
    else nb_error_null("nb_params_get", "p");
    return NULL;
  }
  return p->tensors[i];
}

const char *nb_params_name(const nb_params *p, int i) {
  return p && i >= 0 && i < p->n ? p->names[i] : NULL;
}

nb_tensor *nb_params_find(const nb_params *p, const char *name) {
  if (!p || !name) return NULL;
  for (int i = 0; i < p->n; i++)
    if (!strcmp(p->names[i], name)) return p->tensors[i];
  return NULL;
}

int64_t nb_params_numel(const nb_params *p) {
  int64_t total = 0;
  for (int i = 0; p && i < p->n; i++) total += nb_numel(p->tensors[i]);
  return total;
}

void nb_params_zero_grad(nb_params *p) {
  for (int i = 0; p && i < p->n; i++) nb_zero_grad(p->tensors[i]);
}

void nb_params_free(nb_params *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) {
    free(p->names[i]);
    nb_release(p->tensors[i]);
  }
  free(p->names);
  free(p->tensors);
  free(p);
}
