/* The contract between the ops layer and the kernels.
 *
 * A kernel is a plain function of views: a data pointer (storage offset
 * already applied), a dtype, a shape and strides in elements. The ops layer
 * has already validated everything, inferred shapes, and broadcast inputs
 * to the output's shape (a broadcast axis has stride 0), so a kernel never
 * checks user input; it returns NB_OK or a backend error (e.g. a CUDA
 * failure, an index out of range found on the device) with nb_error_set.
 * Kernels never synchronise except where a value must reach the host. */
#ifndef NB_BACKEND_H
#define NB_BACKEND_H

#include "nabla.h"

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

typedef enum {
  NB_UOP_NEG, NB_UOP_ABS, NB_UOP_EXP, NB_UOP_LOG, NB_UOP_LOG1P, NB_UOP_EXPM1,
  NB_UOP_SQRT, NB_UOP_RSQRT, NB_UOP_SQUARE, NB_UOP_RECIPROCAL, NB_UOP_SIN,
  NB_UOP_COS, NB_UOP_TANH, NB_UOP_SIGMOID, NB_UOP_RELU, NB_UOP_GELU_ERF,
  NB_UOP_GELU_TANH, NB_UOP_SILU, NB_UOP_SOFTPLUS, NB_UOP_SIGN, NB_UOP_FLOOR,
  NB_UOP_CEIL, NB_UOP_ROUND,
  /* derivatives used by backward rules */
  NB_UOP_GELU_ERF_D, NB_UOP_GELU_TANH_D, NB_UOP_SILU_D,
  NB_UOP_COUNT
} nb_uop;

typedef enum {
  NB_BOP_ADD, NB_BOP_SUB, NB_BOP_MUL, NB_BOP_DIV, NB_BOP_POW, NB_BOP_MAX, NB_BOP_MIN,
  NB_BOP_EQ, NB_BOP_NE, NB_BOP_LT, NB_BOP_LE, NB_BOP_GT, NB_BOP_GE,
  NB_BOP_COUNT
} nb_bop;

typedef enum { NB_ROP_SUM, NB_ROP_MAX, NB_ROP_MIN, NB_ROP_ARGMAX, NB_ROP_ARGMIN, NB_ROP_COUNT } nb_rop;

typedef struct {
  int n, c, h, w;          /* input batch, channels, height, width */
  int kh, kw, sh, sw, ph, pw, dh, dw;
  int oh, ow;              /* output height and width */
} nb_im2col_params;

typedef struct nb_backend {
  const char *name;
  /* memory */
  void *(*alloc)(nb_device dev, size_t nbytes);          /* NULL + error on failure */
  void (*free)(nb_device dev, void *p, size_t nbytes);
  nb_status (*upload)(nb_device dev, void *dst, const void *src, size_t nbytes);
  nb_status (*download)(nb_device dev, void *dst, const void *src, size_t nbytes);
  nb_status (*synchronize)(nb_device dev);
  /* Page-locked host memory (NULL entries on backends without it), and an
   * upload from it that returns without waiting: the caller keeps src
   * unchanged until the device's queued work has run. */
  void *(*host_alloc)(size_t nbytes);
  void (*host_free)(void *p);
  nb_status (*upload_async)(nb_device dev, void *dst, const void *src, size_t nbytes);

  /* elementwise: every view has out's shape (inputs broadcast by strides). */
  nb_status (*fill)(const nb_kview *out, double value);
  nb_status (*arange)(const nb_kview *out, double start, double step); /* 1-D */
  nb_status (*copy)(const nb_kview *out, const nb_kview *in); /* converts dtype */
  /* in and out share a float dtype (or int for NEG, ABS, SIGN, SQUARE). */
  nb_status (*unary)(nb_uop op, const nb_kview *out, const nb_kview *in);
  /* a and b share a dtype; out has it too, or is bool for comparisons. */
  nb_status (*binary)(nb_bop op, const nb_kview *out, const nb_kview *a, const nb_kview *b);
  /* cond is bool; a, b and out share a dtype. */
  nb_status (*where)(const nb_kview *out, const nb_kview *cond, const nb_kview *a,
                     const nb_kview *b);

  /* reductions: in has out->ndim + nred axes; its first out->ndim axes match
   * out, its last nred are reduced. SUM/MAX/MIN keep the dtype (floats
   * accumulate in at least f32; ints in i64); ARG* write i64 (the first
   * index of the extreme, in row-major order of the reduced axes). */
  nb_status (*reduce)(nb_rop op, const nb_kview *out, const nb_kview *in, int nred);

  /* out (B.., M, N) = a (B.., M, K) @ b (B.., K, N); batch axes already
   * broadcast; one float dtype; f32 accumulation (f64 for f64). */
  nb_status (*matmul)(const nb_kview *out, const nb_kview *a, const nb_kview *b);

  /* random: element i (row-major in out) uses Philox block offset + i. */
  nb_status (*rand_uniform)(const nb_kview *out, uint64_t seed, uint64_t offset, double lo,
                            double hi);
  nb_status (*rand_normal)(const nb_kview *out, uint64_t seed, uint64_t offset, double mean,
                           double std);
  nb_status (*randint)(const nb_kview *out, uint64_t seed, uint64_t offset, int64_t lo,
                       int64_t hi);

  /* ---- NN kernels. Rows are the leading axes, the reduced axis is last. */
  /* softmax over the last axis of x (any strides); log selects log_softmax. */
  nb_status (*softmax_fwd)(const nb_kview *y, const nb_kview *x, int log);
  /* dx = y*(dy - sum(dy*y)), or dy - exp(y)*sum(dy) for log. */
  nb_status (*softmax_bwd)(const nb_kview *dx, const nb_kview *dy, const nb_kview *y, int log);
  /* x, y contiguous 2-D (R, D); mean and rstd (R) f64 for f64 x, else f32;
   * w, b (D) or NULL.
   * rms: y = x*rstd*w, mean unused (may be NULL). */
  nb_status (*norm_fwd)(const nb_kview *y, const nb_kview *mean, const nb_kview *rstd,
                        const nb_kview *x, const nb_kview *w, const nb_kview *b, double eps,
                        int rms);
  /* dx (R, D); dw, db (D) or NULL; all contiguous. */
  nb_status (*norm_bwd)(const nb_kview *dx, const nb_kview *dw, const nb_kview *db,
                        const nb_kview *dy, const nb_kview *x, const nb_kview *mean,
                        const nb_kview *rstd, const nb_kview *w, int rms);
  /* logits (N, C) any strides; targets i64 (N); loss f32 (N) per row (f64 for
   * f64 logits; 0 for
   * ignored rows); lse f32 (N) saved for backward. Index out of range: error. */
  nb_status (*xent_fwd)(const nb_kview *loss, const nb_kview *lse, const nb_kview *logits,
                        const nb_kview *targets, int64_t ignore_index, double smoothing);
  /* dlogits = dloss[row] * (softmax - onehot_smoothed); zero on ignored rows. */
  nb_status (*xent_bwd)(const nb_kview *dlogits, const nb_kview *dloss,
                        const nb_kview *logits, const nb_kview *targets, const nb_kview *lse,
                        int64_t ignore_index, double smoothing);
  /* Forward and backward in one pass (a training step's cross-entropy): loss
   * as xent_fwd, lse as xent_fwd or NULL, and dlogits (N, C, any strides) as
   * xent_bwd with the row gradient dloss (f32/f64 (N), any strides, stride 0
   * for one shared scale; NULL for 1), divided by N_valid (the rows whose
   * target is not ignore_index) when mean. out (0-d, any float dtype) or
   * NULL: the sum of the row losses, over N_valid when mean (0/0 = NaN when
   * every row is ignored), accumulated in f64 in a fixed order and rounded
   * once to out's dtype. Same results as xent_fwd then xent_bwd; index out
   * of range: error. */
  nb_status (*xent_fused)(const nb_kview *loss, const nb_kview *lse, const nb_kview *dlogits,
                          const nb_kview *dloss, const nb_kview *out, int mean,
                          const nb_kview *logits, const nb_kview *targets, int64_t ignore_index,
                          double smoothing);
  /* out[.., j, ..] = x[.., idx[j], ..] along axis; idx i64 1-D. */
  nb_status (*index_select)(const nb_kview *out, const nb_kview *x, int axis,
                            const nb_kview *idx);
  /* out[.., idx[j], ..] += src[.., j, ..] along axis (out already holds x).
   * deterministic selects a fixed summation order. */
  nb_status (*index_add)(const nb_kview *out, int axis, const nb_kview *idx,
                         const nb_kview *src, int deterministic);
  /* out = x gathered along axis by idx (idx has out's shape, i64). */
  nb_status (*gather)(const nb_kview *out, const nb_kview *x, int axis, const nb_kview *idx);
  /* out[.., idx[i], ..] += src[i] along axis; idx and src share a shape. */
  nb_status (*scatter_add)(const nb_kview *out, int axis, const nb_kview *idx,
                           const nb_kview *src, int deterministic);
  /* out = x * keep / (1-p), keep = uniform(seed, offset + i) >= p. */
  nb_status (*dropout)(const nb_kview *out, const nb_kview *x, double p, uint64_t seed,
                       uint64_t offset);
  /* x NCHW contiguous -> cols (N, C*kh*kw, oh*ow); col2im adds back. */
  nb_status (*im2col)(const nb_kview *cols, const nb_kview *x, const nb_im2col_params *p);
  nb_status (*col2im)(const nb_kview *x, const nb_kview *cols, const nb_im2col_params *p);
  /* pooling on NCHW contiguous; max writes the argmax (i64 flat h*w index,
   * -1 for a window entirely in padding). Both backwards ADD into dx, which
   * the caller has zeroed. */
  nb_status (*maxpool2d_fwd)(const nb_kview *y, const nb_kview *argmax, const nb_kview *x,
                             const nb_im2col_params *p);
  nb_status (*maxpool2d_bwd)(const nb_kview *dx, const nb_kview *dy, const nb_kview *argmax,
                             const nb_im2col_params *p);
  /* average over the window, padding counted (count_include_pad). */
  nb_status (*avgpool2d_fwd)(const nb_kview *y, const nb_kview *x, const nb_im2col_params *p);
  nb_status (*avgpool2d_bwd)(const nb_kview *dx, const nb_kview *dy, const nb_im2col_params *p);

  /* ---- optimizer kernels, in place on contiguous tensors of one shape. */
  nb_status (*adamw_step)(const nb_kview *p, const nb_kview *g, const nb_kview *m,
                          const nb_kview *v, double lr, double beta1, double beta2, double eps,
                          double weight_decay, int64_t step);
  /* buf may be NULL when momentum is 0. */
  nb_status (*sgd_step)(const nb_kview *p, const nb_kview *g, const nb_kview *buf, double lr,
                        double momentum, double dampening, int nesterov, double weight_decay);
  /* adamw_step applied to each of n tensors (p[i], g[i], m[i], v[i]), the
   * same math and the same bits as n adamw_step calls, in fewer launches.
   * Every view is contiguous, on this backend's one device; the p[i] do not
   * overlap one another (the caller falls back per tensor otherwise). */
  nb_status (*adamw_multi)(int n, const nb_kview *p, const nb_kview *g, const nb_kview *m,
                           const nb_kview *v, double lr, double beta1, double beta2, double eps,
                           double weight_decay, int64_t step);
  /* Gradient clipping's two passes over n tensors in one or a few launches.
   * Every view is contiguous, of a float dtype, on this backend's one
   * device. sumsq_multi: out (a 0-d f64 view there) = the sum of x^2 over
   * every element, accumulated in f64 in a fixed order (the same bits every
   * run). scale_multi: x *= s in place (on CUDA in f32 for f32/f16/bf16
   * tensors, as mul_scalar; the CPU in double); the x[i] do not overlap
   * one another. */
  nb_status (*sumsq_multi)(int n, const nb_kview *x, const nb_kview *out);
  nb_status (*scale_multi)(int n, const nb_kview *x, double s);

  /* ---- attention without a (Lq, Lk) matrix (flash attention).
   * Views of rank nb + 2 sharing the batch shape (nb axes, any strides;
   * no broadcasting), the last axis of stride 1: q (.., Lq, D), k (.., Lk, D),
   * v (.., Lk, Dv), o (.., Lq, Dv); lse (.., Lq) contiguous, f64 for f64
   * inputs, else f32: the natural log of the sum over allowed keys of
   * exp(scale * q.k). causal keeps key j for query i when j <= i (aligned
   * top-left, as torch's is_causal). A row with no key (Lk = 0) gets o = 0
   * and lse = -inf. One dtype for q, k, v, o. attn_fwd may return
   * NB_ERR_UNSUPPORTED for a head dimension it lacks (the op then composes). */
  nb_status (*attn_fwd)(const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                        const nb_kview *k, const nb_kview *v, double scale, int causal);
  /* The gradients from dout (o's shape, any batch strides, last stride 1),
   * recomputing the probabilities from lse: dq, dk, dv contiguous, each
   * written whole (no accumulation), the same bits every run. */
  nb_status (*attn_bwd)(const nb_kview *dq, const nb_kview *dk, const nb_kview *dv,
                        const nb_kview *dout, const nb_kview *q, const nb_kview *k,
                        const nb_kview *v, const nb_kview *o, const nb_kview *lse, double scale,
                        int causal);
} nb_backend;

const nb_backend *nb_backend_for(nb_device dev);   /* NULL + error if absent */
const nb_backend *nb_backend_find(nb_device dev);  /* the same, never the profiler's proxy */
/* core/profile.c: real itself, or while profiling its timed proxy (dev is
 * the device the entries will run on); nb_profile_backward(1/0) brackets a
 * backward pass so that its kernels count as bwd. */
const nb_backend *nb_profile_wrap(const nb_backend *real, nb_device dev);
void nb_profile_backward(int enter);
extern const nb_backend nb_cpu_backend;
#ifdef NABLA_HAVE_CUDA
const nb_backend *nb_cuda_backend(void);
#endif

/* helpers for kernels */
int64_t nb_kview_numel(const nb_kview *v);
int nb_kview_is_contiguous(const nb_kview *v);

#ifdef __cplusplus
}
#endif
#endif /* NB_BACKEND_H */
