/* Internal core: the tensor and storage structs, errors, scopes.
 * Everything here is private to the library (prefix nb_, not in nabla.h). */
#ifndef NB_CORE_H
#define NB_CORE_H

#include "nabla.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_storage {
  int64_t refcount;
  void *data;
  size_t nbytes;
  nb_device device;
  int borrowed; /* data not owned (never freed by nabla) */
  int pinned;   /* page-locked host memory from a GPU backend's host_alloc */
  /* Host-side knowledge: every element holds fill_value (set by nb_zeros,
   * nb_ones, nb_full; cleared by nb_fill_, nb_copy_ and nb_data_ptr). Lets a
   * backward rule recognise the engine's all-ones seed without a device read. */
  int filled;
  double fill_value;
} nb_storage;

struct nb_node;

struct nb_tensor {
  int64_t refcount;
  int ndim;
  int64_t shape[NB_MAX_DIMS];
  int64_t strides[NB_MAX_DIMS];
  int64_t offset;           /* in elements, into storage */
  nb_dtype dtype;
  nb_storage *storage;
  int requires_grad;        /* leaf flag, or result of a recorded op */
  struct nb_node *grad_fn;  /* op that produced it (owned ref), NULL for leaves */
  nb_tensor *grad;          /* accumulated gradient of a leaf (owned ref) */
};

/* errors: sets the thread's message; returns st. Formats like printf. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
nb_status nb_error_set(nb_status st, const char *fmt, ...);
int nb_error_pending(void);
/* Sets "op: argument NAME is NULL" unless an error is already recorded
 * (so the first message of a chain survives). Returns NB_ERR_NULL. */
nb_status nb_error_null(const char *op, const char *name);

/* Registers a fresh reference with the innermost scope, if any; returns t. */
nb_tensor *nb_autorelease(nb_tensor *t);

/* Allocation of tensors (returned with refcount 1, not autoreleased). */
nb_tensor *nb_tensor_alloc(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev);
/* A new tensor header over t's storage (refcount 1, not autoreleased). */
nb_tensor *nb_tensor_view_of(const nb_tensor *t, int ndim, const int64_t *shape,
                             const int64_t *strides, int64_t offset);
void nb_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
int64_t nb_shape_numel(int ndim, const int64_t *shape);
/* The monotonic host clock in milliseconds (core/clock.c). */
double nb_host_ms(void);
/* "[2, 3]" */
const char *nb_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
int nb_same_device(nb_device a, nb_device b);
const char *nb_device_str(nb_device d, char *buf, size_t n);

/* Backend view of a tensor, optionally broadcast to a shape (ndim, shape). */
struct nb_kview;
void nb_kview_of(const nb_tensor *t, struct nb_kview *v);
int nb_kview_broadcast(const nb_tensor *t, int ndim, const int64_t *shape,
                       struct nb_kview *v);

/* Normalises axis into [0, ndim); returns -1 and sets an error if out of range. */
int nb_norm_axis(const char *op, int axis, int ndim);

/* f16/bf16 helpers usable from C kernels. */
double nb_load_f64(const void *p, nb_dtype dt);
void nb_store_f64(void *p, nb_dtype dt, double v);

#ifdef __cplusplus
}
#endif
#endif /* NB_CORE_H */
