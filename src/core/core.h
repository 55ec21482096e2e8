/* Internal core: the tensor and storage structs, the allocator interface,
 * errors, scopes. Everything here is private to the library (prefix nb_,
 * not in nabla.h). Core is the bottom layer: it includes nothing above it. */
#ifndef NB_CORE_H
#define NB_CORE_H

#include "nabla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage memory goes through an allocator: a small table of functions per
 * device type that a memory planner can replace (nb_set_allocator). By
 * default it is the backend's own memory entries (backend/registry.c
 * provides nb_backend_allocator: the backend layer implements this
 * interface, core only calls it). */
typedef struct nb_allocator {
  void *(*alloc)(nb_device dev, size_t nbytes);  /* NULL + error on failure */
  void (*free)(nb_device dev, void *p, size_t nbytes);
} nb_allocator;

typedef struct nb_storage {
  int64_t refcount;
  void *data;
  size_t nbytes;
  nb_device device;
  int borrowed; /* data not owned (never freed by nabla) */
  int pinned;   /* page-locked host memory from a GPU backend's host_alloc */
  const nb_allocator *allocator; /* the one that allocated data, which frees it */
  /* Host-side knowledge: every element holds fill_value (set by nb_zeros,
   * nb_ones, nb_full; cleared by nb_fill_, nb_copy_ and nb_data_ptr). Lets a
   * backward rule recognise the engine's all-ones seed without a device read. */
  int filled;
  double fill_value;
  /* Write stamp: a value no other storage ever had, renewed
   * (nb_storage_touch) by every in-place write the library makes (nb_copy_,
   * nb_fill_, the optimizers' kernels). 0 for good once nb_data_ptr has
   * handed out a writable host pointer, and for data-less headers: such
   * storage is never known unchanged. */
  uint64_t stamp;
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
  /* A parameter's low-precision working copy (owned ref; bf16 or f16,
   * contiguous, its shape), written by the optimizer's AdamW pass and read
   * by autocast instead of a cast; it holds this tensor's values rounded
   * while work_stamp equals storage->stamp (ops/op_run.c, nn/optim.c). */
  nb_tensor *work;
  uint64_t work_stamp;
};

/* Renews s's write stamp (kept 0 once 0) and returns it. */
uint64_t nb_storage_touch(nb_storage *s);

/* errors: sets the thread's message; returns st. Formats like printf. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
nb_status nb_error_set(nb_status st, const char *fmt, ...);
int nb_error_pending(void);
/* Sets "op: argument NAME is NULL" unless an error is already recorded
 * (so the first message of a chain survives). Returns NB_ERR_NULL. */
nb_status nb_error_null(const char *op, const char *name);

/* The allocator of storage on dev: the one installed for dev's type, else
 * the backend's; NULL + error when dev is not available. */
const nb_allocator *nb_allocator_for(nb_device dev);
/* Installs a for every device of type (NULL: the backend's again). Storage
 * already allocated is freed by the allocator that allocated it. */
void nb_set_allocator(nb_device_type type, const nb_allocator *a);
/* Provided by the backend layer (backend/registry.c): the backend's memory
 * entries for dev as an allocator (NULL + error when dev is not available),
 * and page-locked host memory (NULL where no GPU backend provides it). */
const nb_allocator *nb_backend_allocator(nb_device dev);
const nb_allocator *nb_pinned_allocator(void);

/* Provided by the graph layer (graph/node.c): drops a reference to the node
 * that produced a tensor (nb_release frees a tensor's grad_fn through it). */
void nb_node_release(struct nb_node *n);

/* Registers a fresh reference with the innermost scope, if any; returns t. */
nb_tensor *nb_autorelease(nb_tensor *t);

/* Allocation of tensors (returned with refcount 1, not autoreleased). */
nb_tensor *nb_tensor_alloc(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev);
/* A header with t's shape, strides, dtype, device and requires_grad and no
 * data (a storage of 0 bytes; grad_fn unset): what a graph node keeps of an
 * input whose data its backward rule never reads (refcount 1). */
nb_tensor *nb_tensor_meta_of(const nb_tensor *t);
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

/* Normalises axis into [0, ndim); returns -1 and sets an error if out of range. */
int nb_norm_axis(const char *op, int axis, int ndim);

/* f16/bf16 helpers usable from C kernels. */
double nb_load_f64(const void *p, nb_dtype dt);
void nb_store_f64(void *p, nb_dtype dt, double v);

#ifdef __cplusplus
}
#endif
#endif /* NB_CORE_H */
