/* The contract between the ops layer and the kernels.
 *
 * A kernel is a plain function of views: a data pointer (storage offset
 * already applied), a dtype, a shape and strides in elements. The ops layer
 * has already validated everything, inferred shapes, and broadcast inputs
 * to the output's shape (a broadcast axis has stride 0), so a kernel never
 * checks user input; it returns NB_OK or a backend error (e.g. a CUDA
 * failure, an index out of range found on the device) with nb_error_set.
 * Kernels never synchronise except where a value must reach the host.
 * The table's entries and their contracts: backend/backend_entries.h. */
#ifndef NB_BACKEND_H
#define NB_BACKEND_H

#include "nabla.h"
#include "backend/ew_list.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_kview {
  void *data;
  nb_dtype dtype;
  int ndim;
  int64_t shape[NB_MAX_DIMS];
  int64_t strides[NB_MAX_DIMS];
} nb_kview;

/* The unary and binary ops, from backend/ew_list.h. */
#define NB_EW_ENUM(ID, ...) NB_UOP_##ID,
typedef enum {
  NB_UOP_LIST(NB_EW_ENUM)
  NB_UOP_DERIVATIVE_LIST(NB_EW_ENUM) /* derivatives used by backward rules */
  NB_UOP_COUNT
} nb_uop;
#undef NB_EW_ENUM

#define NB_EW_ENUM(ID, ...) NB_BOP_##ID,
typedef enum {
  NB_BOP_LIST(NB_EW_ENUM)
  NB_CMP_LIST(NB_EW_ENUM) /* comparisons: bool results */
  NB_BOP_COUNT
} nb_bop;
#undef NB_EW_ENUM

typedef enum { NB_ROP_SUM, NB_ROP_MAX, NB_ROP_MIN, NB_ROP_ARGMAX, NB_ROP_ARGMIN, NB_ROP_COUNT } nb_rop;

/* The kernels' names (the profiler's rows): "neg", "add", "sum", ... */
extern const char *const nb_uop_names[NB_UOP_COUNT];
extern const char *const nb_bop_names[NB_BOP_COUNT];
/* The forward expressions' text as ew_list.h writes them ("E_EXP(x)",
 * "x + z"), for code generation. */
extern const char *const nb_uop_expr_text[NB_UOP_COUNT];
extern const char *const nb_bop_expr_text[NB_BOP_COUNT];
extern const char *const nb_rop_names[NB_ROP_COUNT];

typedef struct {
  int n, c, h, w;          /* input batch, channels, height, width */
  int kh, kw, sh, sw, ph, pw, dh, dw;
  int oh, ow;              /* output height and width */
} nb_im2col_params;

/* A backend: its name, then one member per entry of backend_entries.h
 * (memory entries, then kernels; each entry's contract is written there). */
typedef struct nb_backend {
  const char *name;
#define NB_BACKEND_MEMORY(RET, NAME, PARAMS) RET(*NAME) PARAMS;
#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF) nb_status(*NAME) PARAMS;
#include "backend/backend_entries.h"
} nb_backend;

/* backend/registry.c */
const nb_backend *nb_backend_for(nb_device dev);   /* NULL + error if absent */
const nb_backend *nb_backend_find(nb_device dev);  /* the same, never the profiler's proxy */
/* backend/profile.c: real itself, or while profiling its timed proxy (dev is
 * the device the entries will run on); nb_profile_backward(1/0) brackets a
 * backward pass so that its kernels count as bwd. */
const nb_backend *nb_profile_wrap(const nb_backend *real, nb_device dev);
void nb_profile_backward(int enter);
extern const nb_backend nb_cpu_backend;
#ifdef NABLA_HAVE_CUDA
const nb_backend *nb_cuda_backend(void);
#endif

/* backend/kview.c: the view of a tensor, optionally broadcast to a shape
 * (ndim, shape; returns 0, or -1 if t cannot broadcast to it), and helpers
 * for kernels. */
void nb_kview_of(const nb_tensor *t, nb_kview *v);
int nb_kview_broadcast(const nb_tensor *t, int ndim, const int64_t *shape, nb_kview *v);
int64_t nb_kview_numel(const nb_kview *v);
int nb_kview_is_contiguous(const nb_kview *v);

#ifdef __cplusplus
}
#endif
#endif /* NB_BACKEND_H */
