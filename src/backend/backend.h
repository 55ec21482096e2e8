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
  NB_BOP_DERIVATIVE_LIST(NB_EW_ENUM) /* g * f'(x) of backward rules */
  NB_CMP_LIST(NB_EW_ENUM) /* comparisons: bool results (last: op >= NB_BOP_EQ) */
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

/* What gemm_ex applies to the product P = a @ b before it is stored, per
 * element (r, n) of the output, computed in the accumulator type (f32, f64
 * for f64 operands) and rounded once into out (and aux):
 *   pre = alpha * P + beta * c[r, n] + bias[n]   (added in this order)
 *   aux[r, n] = pre                      (when aux is given)
 *   out[r, n] = gelu ? gelu_tanh(pre) : pre
 * bias (N,), c and aux (M, N) are optional (NULL) and have out's dtype; c is
 * read only when beta != 0, and may be out itself (each element of c is
 * read before the same element of out is written). gelu_tanh is the tanh
 * form of the CPU backend's elementwise kernel. */
typedef struct {
  const nb_kview *bias, *c, *aux;
  float alpha, beta;
  int gelu;
} nb_gemm_epilogue;

/* Attention's optional parts (attn_fwd, attn_bwd; NULL: none of them).
 * mask: NULL, or a view of the scores' shape (q's batch axes, Lq, Lk), any
 * strides (0 on broadcast axes), bool (true keeps: false adds -inf) or a
 * float dtype added to the scaled scores before the softmax. dropout_p > 0:
 * probability (b, i, j) of the (.., Lq, Lk) matrix (b the flat batch index
 * over q's batch axes) is kept, times 1 / (1 - p), when u01(word 0 of
 * Philox block (seed, offset + (b Lq + i) Lk + j)) >= p, exactly as
 * nb_dropout numbers that matrix's elements (0 when p = 1). */
typedef struct {
  const nb_kview *mask;
  double dropout_p;
  uint64_t seed, offset;
} nb_attn_extra;

/* Mixed-precision training's control block (nn/scaler.c): f64 values on
 * the gradients' device, written by the gradient-norm pass (NB_AMP_SUMSQ)
 * and amp_update, read by the optimizer kernels, so that a step decides on
 * the device and never waits for the host. */
enum {
  NB_AMP_SUMSQ,   /* the gradients' sum of squares (f64; not finite iff one is not) */
  NB_AMP_SCALE,   /* the loss scale (an f32 value) */
  NB_AMP_TRACKER, /* good steps since the scale last changed */
  NB_AMP_FOUND,   /* 1: a gradient is not finite, the step is skipped; else 0 */
  NB_AMP_GSCALE,  /* what the gradients are multiplied by: clip coefficient / scale */
  NB_AMP_NORM,    /* the unscaled gradients' global norm before clipping */
  NB_AMP_GOOD,    /* steps taken so far (not skipped) */
  NB_AMP_SKIPS,   /* steps skipped so far */
  NB_AMP_LAST,    /* the scale this step's gradients carried */
  NB_AMP_N
};

/* amp_update's rules (torch.amp.GradScaler's, and clip_grad_norm_'s):
 * max_norm < 0 or infinite: no clipping. */
typedef struct {
  double max_norm, growth, backoff;
  int64_t interval;
} nb_amp_args;

/* adamw_multi_ex's arguments: the hyper-parameters and step count as
 * adamw_step takes them; ctl, when not NULL, the control block above on the
 * tensors' device: when ctl[NB_AMP_FOUND] != 0, every p, m and v keeps its
 * bits; else each gradient is read as g * ctl[NB_AMP_GSCALE] rounded to g's
 * dtype (what scale_multi would have stored), and the step count is
 * ctl[NB_AMP_GOOD] - *step_base (step_base: an f64 on the device) instead
 * of step, with the bias corrections computed from it on the device. */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
  const double *ctl, *step_base;
} nb_adamw_args;

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
