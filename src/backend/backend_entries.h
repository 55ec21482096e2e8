/* The backend table's entries, each written once (an X-macro list).
 *
 * The includer defines the macros it needs, then includes this file, which
 * expands them and undefines both (an undefined one expands to nothing):
 *
 *   NB_BACKEND_MEMORY(RET, NAME, PARAMS)
 *     a memory or transfer entry: its return type, member name and
 *     parenthesised parameter list. Each backend fills these by hand (their
 *     functions are named differently per backend); the profiler leaves them
 *     untimed.
 *   NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF)
 *     a kernel entry. It returns nb_status (NB_OK or a backend error set with
 *     nb_error_set). PARAMS is its parenthesised parameter list, ARGS the
 *     same names as a call's argument list, PROF the profiler's name for one
 *     call (a string expression of the parameters).
 *
 * Expanded into: the nb_backend struct (backend.h), the kernel declarations
 * nb_cpu_NAME / nb_cuda_NAME (cpu_kernels.h, cuda_kernels.h), the CPU and
 * CUDA tables (cpu_backend.c, cuda_backend.cu) and the profiler's timed
 * proxies (backend/profile.c). A new kernel is one entry here plus its
 * implementations. The entries' order is the struct's member order.
 *
 * Kernel contracts: a kernel is a plain function of views (nb_kview); the
 * ops layer has validated everything, inferred shapes and broadcast inputs
 * to the output's shape (a broadcast axis has stride 0), so a kernel never
 * checks user input. */

#ifndef NB_BACKEND_MEMORY
#define NB_BACKEND_MEMORY(RET, NAME, PARAMS)
#endif
#ifndef NB_BACKEND_KERNEL
#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF)
#endif

/* ---- memory */
NB_BACKEND_MEMORY(void *, alloc, (nb_device dev, size_t nbytes)) /* NULL + error on failure */
NB_BACKEND_MEMORY(void, free, (nb_device dev, void *p, size_t nbytes))
NB_BACKEND_MEMORY(nb_status, upload, (nb_device dev, void *dst, const void *src, size_t nbytes))
NB_BACKEND_MEMORY(nb_status, download, (nb_device dev, void *dst, const void *src, size_t nbytes))
NB_BACKEND_MEMORY(nb_status, synchronize, (nb_device dev))
/* Page-locked host memory (NULL entries on backends without it), and an
 * upload from it that returns without waiting: the caller keeps src
 * unchanged until the device's queued work has run. */
NB_BACKEND_MEMORY(void *, host_alloc, (size_t nbytes))
NB_BACKEND_MEMORY(void, host_free, (void *p))
NB_BACKEND_MEMORY(nb_status, upload_async, (nb_device dev, void *dst, const void *src, size_t nbytes))

/* ---- elementwise: every view has out's shape (inputs broadcast by strides). */
NB_BACKEND_KERNEL(fill, (const nb_kview *out, double value), (out, value), "fill")
NB_BACKEND_KERNEL(arange, (const nb_kview *out, double start, double step), /* 1-D */
                  (out, start, step), "arange")
NB_BACKEND_KERNEL(copy, (const nb_kview *out, const nb_kview *in), (out, in), "copy") /* converts dtype */
/* in and out share a float dtype (or int for NEG, ABS, SIGN, SQUARE). */
NB_BACKEND_KERNEL(unary, (nb_uop op, const nb_kview *out, const nb_kview *in), (op, out, in),
                  nb_uop_names[op])
/* a and b share a dtype; out has it too, or is bool for comparisons. */
NB_BACKEND_KERNEL(binary, (nb_bop op, const nb_kview *out, const nb_kview *a, const nb_kview *b),
                  (op, out, a, b), nb_bop_names[op])
/* cond is bool; a, b and out share a dtype. */
NB_BACKEND_KERNEL(where, (const nb_kview *out, const nb_kview *cond, const nb_kview *a,
                          const nb_kview *b),
                  (out, cond, a, b), "where")

/* ---- reductions: in has out->ndim + nred axes; its first out->ndim axes
 * match out, its last nred are reduced. SUM/MAX/MIN keep the dtype (floats
 * accumulate in at least f32; ints in i64); ARG* write i64 (the first index
 * of the extreme, in row-major order of the reduced axes). */
NB_BACKEND_KERNEL(reduce, (nb_rop op, const nb_kview *out, const nb_kview *in, int nred),
                  (op, out, in, nred), nb_rop_names[op])

/* out (B.., M, N) = a (B.., M, K) @ b (B.., K, N); batch axes already
 * broadcast; one float dtype; f32 accumulation (f64 for f64). */
NB_BACKEND_KERNEL(matmul, (const nb_kview *out, const nb_kview *a, const nb_kview *b), (out, a, b),
                  "matmul")
/* out (M, N) = epilogue(a (M, K) @ b (K, N)): 2-D views, any strides; a and
 * b one float dtype; out theirs, or f32 for f16/bf16 operands; the
 * epilogue (NULL: the plain product) as nb_gemm_epilogue (backend.h) says,
 * on the product accumulated in f32 (f64 for f64), rounded once. */
NB_BACKEND_KERNEL(gemm_ex, (const nb_kview *out, const nb_kview *a, const nb_kview *b,
                            const nb_gemm_epilogue *ep),
                  (out, a, b, ep), ep && ep->gelu ? "gemm_gelu" : ep && ep->bias ? "gemm_bias" : "gemm")
/* out (M, N) = s_a s_b (a (M, K) @ b (K, N)) (nb_scaled_mm): 2-D views, any
 * strides; a and b fp8 (either format each); s_a, s_b one-element f32 views
 * read by the kernel; out bf16, f16 or f32. */
NB_BACKEND_KERNEL(scaled_mm, (const nb_kview *out, const nb_kview *a, const nb_kview *b,
                              const nb_kview *scale_a, const nb_kview *scale_b),
                  (out, a, b, scale_a, scale_b), "scaled_mm")

/* ---- random: element i (row-major in out) uses Philox block offset + i. */
NB_BACKEND_KERNEL(rand_uniform, (const nb_kview *out, uint64_t seed, uint64_t offset, double lo,
                                 double hi),
                  (out, seed, offset, lo, hi), "rand_uniform")
NB_BACKEND_KERNEL(rand_normal, (const nb_kview *out, uint64_t seed, uint64_t offset, double mean,
                                double std),
                  (out, seed, offset, mean, std), "rand_normal")
NB_BACKEND_KERNEL(randint, (const nb_kview *out, uint64_t seed, uint64_t offset, int64_t lo,
                            int64_t hi),
                  (out, seed, offset, lo, hi), "randint")

/* ---- NN kernels. Rows are the leading axes, the reduced axis is last. */
/* softmax over the last axis of x (any strides); log selects log_softmax. */
NB_BACKEND_KERNEL(softmax_fwd, (const nb_kview *y, const nb_kview *x, int log), (y, x, log),
                  log ? "log_softmax" : "softmax")
/* dx = y*(dy - sum(dy*y)), or dy - exp(y)*sum(dy) for log. */
NB_BACKEND_KERNEL(softmax_bwd, (const nb_kview *dx, const nb_kview *dy, const nb_kview *y, int log),
                  (dx, dy, y, log), log ? "log_softmax_bwd" : "softmax_bwd")
/* x, y contiguous 2-D (R, D); mean and rstd (R) f64 for f64 x, else f32;
 * w, b (D) or NULL. rms: y = x*rstd*w, mean unused (may be NULL). */
NB_BACKEND_KERNEL(norm_fwd, (const nb_kview *y, const nb_kview *mean, const nb_kview *rstd,
                             const nb_kview *x, const nb_kview *w, const nb_kview *b, double eps,
                             int rms),
                  (y, mean, rstd, x, w, b, eps, rms), rms ? "rms_norm" : "layer_norm")
/* dx (R, D); dw, db (D) or NULL; all contiguous. */
NB_BACKEND_KERNEL(norm_bwd, (const nb_kview *dx, const nb_kview *dw, const nb_kview *db,
                             const nb_kview *dy, const nb_kview *x, const nb_kview *mean,
                             const nb_kview *rstd, const nb_kview *w, int rms),
                  (dx, dw, db, dy, x, mean, rstd, w, rms), rms ? "rms_norm_bwd" : "layer_norm_bwd")
/* logits (N, C) any strides; targets i64 (N); loss f32 (N) per row (f64 for
 * f64 logits; 0 for ignored rows); lse f32 (N) saved for backward. Index out
 * of range: error. */
NB_BACKEND_KERNEL(xent_fwd, (const nb_kview *loss, const nb_kview *lse, const nb_kview *logits,
                             const nb_kview *targets, int64_t ignore_index, double smoothing),
                  (loss, lse, logits, targets, ignore_index, smoothing), "cross_entropy")
/* dlogits = dloss[row] * (softmax - onehot_smoothed); zero on ignored rows. */
NB_BACKEND_KERNEL(xent_bwd, (const nb_kview *dlogits, const nb_kview *dloss,
                             const nb_kview *logits, const nb_kview *targets, const nb_kview *lse,
                             int64_t ignore_index, double smoothing),
                  (dlogits, dloss, logits, targets, lse, ignore_index, smoothing),
                  "cross_entropy_bwd")
/* Forward and backward in one pass (a training step's cross-entropy): loss
 * as xent_fwd, lse as xent_fwd or NULL, and dlogits (N, C, any strides) as
 * xent_bwd with the row gradient dloss (f32/f64 (N), any strides, stride 0
 * for one shared scale; NULL for 1), divided by N_valid (the rows whose
 * target is not ignore_index) when mean. out (0-d, any float dtype) or
 * NULL: the sum of the row losses, over N_valid when mean (0/0 = NaN when
 * every row is ignored), accumulated in f64 in a fixed order and rounded
 * once to out's dtype. Same results as xent_fwd then xent_bwd; index out
 * of range: error. */
NB_BACKEND_KERNEL(xent_fused, (const nb_kview *loss, const nb_kview *lse, const nb_kview *dlogits,
                               const nb_kview *dloss, const nb_kview *out, int mean,
                               const nb_kview *logits, const nb_kview *targets,
                               int64_t ignore_index, double smoothing),
                  (loss, lse, dlogits, dloss, out, mean, logits, targets, ignore_index, smoothing),
                  "cross_entropy_fused")
/* out[.., j, ..] = x[.., idx[j], ..] along axis; idx i64 1-D. */
NB_BACKEND_KERNEL(index_select, (const nb_kview *out, const nb_kview *x, int axis,
                                 const nb_kview *idx),
                  (out, x, axis, idx), "index_select")
/* out[.., idx[j], ..] += src[.., j, ..] along axis (out already holds x).
 * deterministic selects a fixed summation order. */
NB_BACKEND_KERNEL(index_add, (const nb_kview *out, int axis, const nb_kview *idx,
                              const nb_kview *src, int deterministic),
                  (out, axis, idx, src, deterministic), "index_add")
/* out = x gathered along axis by idx (idx has out's shape, i64). */
NB_BACKEND_KERNEL(gather, (const nb_kview *out, const nb_kview *x, int axis, const nb_kview *idx),
                  (out, x, axis, idx), "gather")
/* out[.., idx[i], ..] += src[i] along axis; idx and src share a shape. */
NB_BACKEND_KERNEL(scatter_add, (const nb_kview *out, int axis, const nb_kview *idx,
                                const nb_kview *src, int deterministic),
                  (out, axis, idx, src, deterministic), "scatter_add")
/* out = x * keep / (1-p), keep = uniform(seed, offset + i) >= p. */
NB_BACKEND_KERNEL(dropout, (const nb_kview *out, const nb_kview *x, double p, uint64_t seed,
                            uint64_t offset),
                  (out, x, p, seed, offset), "dropout")
/* x NCHW contiguous -> cols (N, C*kh*kw, oh*ow); col2im adds back. */
NB_BACKEND_KERNEL(im2col, (const nb_kview *cols, const nb_kview *x, const nb_im2col_params *p),
                  (cols, x, p), "im2col")
NB_BACKEND_KERNEL(col2im, (const nb_kview *x, const nb_kview *cols, const nb_im2col_params *p),
                  (x, cols, p), "col2im")
/* pooling on NCHW contiguous; max writes the argmax (i64 flat h*w index,
 * -1 for a window entirely in padding). Both backwards ADD into dx, which
 * the caller has zeroed. */
NB_BACKEND_KERNEL(maxpool2d_fwd, (const nb_kview *y, const nb_kview *argmax, const nb_kview *x,
                                  const nb_im2col_params *p),
                  (y, argmax, x, p), "maxpool2d")
NB_BACKEND_KERNEL(maxpool2d_bwd, (const nb_kview *dx, const nb_kview *dy, const nb_kview *argmax,
                                  const nb_im2col_params *p),
                  (dx, dy, argmax, p), "maxpool2d_bwd")
/* average over the window, padding counted (count_include_pad). */
NB_BACKEND_KERNEL(avgpool2d_fwd, (const nb_kview *y, const nb_kview *x, const nb_im2col_params *p),
                  (y, x, p), "avgpool2d")
NB_BACKEND_KERNEL(avgpool2d_bwd, (const nb_kview *dx, const nb_kview *dy,
                                  const nb_im2col_params *p),
                  (dx, dy, p), "avgpool2d_bwd")

/* ---- optimizer kernels, in place on contiguous tensors of one shape. */
NB_BACKEND_KERNEL(adamw_step, (const nb_kview *p, const nb_kview *g, const nb_kview *m,
                               const nb_kview *v, double lr, double beta1, double beta2,
                               double eps, double weight_decay, int64_t step),
                  (p, g, m, v, lr, beta1, beta2, eps, weight_decay, step), "adamw")
/* buf may be NULL when momentum is 0. */
NB_BACKEND_KERNEL(sgd_step, (const nb_kview *p, const nb_kview *g, const nb_kview *buf, double lr,
                             double momentum, double dampening, int nesterov,
                             double weight_decay),
                  (p, g, buf, lr, momentum, dampening, nesterov, weight_decay), "sgd")
/* adamw_step applied to each of n tensors (p[i], g[i], m[i], v[i]), the
 * same math and the same bits as n adamw_step calls, in fewer launches.
 * Every view is contiguous, on this backend's one device; the p[i] do not
 * overlap one another (the caller falls back per tensor otherwise). */
NB_BACKEND_KERNEL(adamw_multi, (int n, const nb_kview *p, const nb_kview *g, const nb_kview *m,
                                const nb_kview *v, double lr, double beta1, double beta2,
                                double eps, double weight_decay, int64_t step),
                  (n, p, g, m, v, lr, beta1, beta2, eps, weight_decay, step), "adamw_multi")
/* adamw_multi, and also: when w is not NULL, each w[i] with data (bf16 or
 * f16, contiguous, p[i]'s shape) gets p[i]'s new values rounded (its values
 * as they are when the step is skipped): the working copy autocast uses;
 * device control as nb_adamw_args (backend.h) says. With w NULL and ctl
 * NULL, the bits of adamw_multi. */
NB_BACKEND_KERNEL(adamw_multi_ex, (int n, const nb_kview *p, const nb_kview *g, const nb_kview *m,
                                   const nb_kview *v, const nb_kview *w, const nb_adamw_args *a),
                  (n, p, g, m, v, w, a), "adamw_multi")
/* One thread: from ctl[NB_AMP_SUMSQ] and the scale, the step's decision
 * (FOUND, GSCALE, NORM: norm = sqrt(sumsq) / scale; GSCALE = min(1,
 * max_norm / (norm + 1e-6)) / scale) and the scale's update (FOUND: scale
 * *= backoff, tracker 0, SKIPS + 1; else GOOD + 1, and after interval good
 * steps scale *= growth if finite in f32, tracker 0; LAST the old scale);
 * scale32 (a 0-d f32, what the loss is multiplied by) gets the new scale. */
NB_BACKEND_KERNEL(amp_update, (const nb_kview *ctl, const nb_kview *scale32, const nb_amp_args *a),
                  (ctl, scale32, a), "amp_update")
/* Gradient clipping's two passes over n tensors in one or a few launches.
 * Every view is contiguous, of a float dtype, on this backend's one
 * device. sumsq_multi: out (a 0-d f64 view there) = the sum of x^2 over
 * every element, accumulated in f64 in a fixed order (the same bits every
 * run). scale_multi: x *= s in place (on CUDA in f32 for f32/f16/bf16
 * tensors, as mul_scalar; the CPU in double); the x[i] do not overlap
 * one another. */
NB_BACKEND_KERNEL(sumsq_multi, (int n, const nb_kview *x, const nb_kview *out), (n, x, out),
                  "sumsq_multi")
NB_BACKEND_KERNEL(scale_multi, (int n, const nb_kview *x, double s), (n, x, s), "scale_multi")

/* ---- attention without a (Lq, Lk) matrix (flash attention).
 * Views of rank nb + 2 sharing the batch shape (nb axes, any strides;
 * no broadcasting), the last axis of stride 1: q (.., Lq, D), k (.., Lk, D),
 * v (.., Lk, Dv), o (.., Lq, Dv); lse (.., Lq) contiguous, f64 for f64
 * inputs, else f32: the natural log of the sum over allowed keys of
 * exp(scale * q.k + mask). causal keeps key j for query i when j <= i
 * (aligned top-left, as torch's is_causal). Grouped-query attention: k and
 * v (and dk, dv) may have Hkv heads on axis nb - 1 where q has Hq = G Hkv
 * (nb >= 1, the other batch axes equal); query head h reads kv head h / G.
 * x: mask and dropout (nb_attn_extra), or NULL. A row with no allowed key
 * (Lk = 0, or a mask of -inf / false on the whole row) gets o = 0 and
 * lse = -inf, and zero gradients. One dtype for q, k, v, o. attn_fwd may
 * return NB_ERR_UNSUPPORTED for a head dimension it lacks (the op then
 * composes). */
NB_BACKEND_KERNEL(attn_fwd, (const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                             const nb_kview *k, const nb_kview *v, double scale, int causal,
                             const nb_attn_extra *x),
                  (o, lse, q, k, v, scale, causal, x), "attention")
/* The gradients from dout (o's shape, any batch strides, last stride 1),
 * recomputing the probabilities (the same mask and dropout) from lse: dq,
 * dk, dv (strided like o), each written whole (no accumulation; dk and dv
 * summed over a group's query heads in head order), the same bits every
 * run. */
NB_BACKEND_KERNEL(attn_bwd, (const nb_kview *dq, const nb_kview *dk, const nb_kview *dv,
                             const nb_kview *dout, const nb_kview *q, const nb_kview *k,
                             const nb_kview *v, const nb_kview *o, const nb_kview *lse,
                             double scale, int causal, const nb_attn_extra *x),
                  (dq, dk, dv, dout, q, k, v, o, lse, scale, causal, x), "attention_bwd")

#undef NB_BACKEND_MEMORY
#undef NB_BACKEND_KERNEL
