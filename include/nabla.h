/* nabla: reverse-mode automatic differentiation over tensors.
 *
 * Ownership, in one rule: every function that returns an nb_tensor* returns
 * a new reference. If a scope is open (nb_scope_begin), the innermost scope
 * owns that reference and drops it at nb_scope_end; otherwise the caller owns
 * it and drops it with nb_release. nb_keep(t) takes one extra reference out of
 * the scope, owned by the caller. A training step is therefore written as
 *     nb_scope_begin(); loss = ...; nb_backward(loss); opt step; nb_scope_end();
 * with no per-intermediate frees. The scope holds every intermediate until
 * its end; a scope per layer (nb_scope_return) lets memory go as it would
 * under reference counting.
 *
 * Errors: a failing call returns NULL (or a status < 0) and records a message
 * naming the op, shapes, dtypes and what was expected; nb_last_error() reads
 * it. A NULL tensor argument propagates: the call returns NULL and keeps the
 * first message, so a chain of calls can be checked once at its end. */
#ifndef NABLA_H
#define NABLA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_MAX_DIMS 8

/* ---- status ---------------------------------------------------------- */
typedef enum {
  NB_OK = 0,
  NB_ERR_NULL = -1,       /* a NULL argument */
  NB_ERR_DTYPE = -2,      /* unsupported or mismatched dtype */
  NB_ERR_SHAPE = -3,      /* incompatible shapes, bad broadcast, impossible view */
  NB_ERR_AXIS = -4,       /* axis out of range */
  NB_ERR_DEVICE = -5,     /* device mismatch or unavailable device */
  NB_ERR_INDEX = -6,      /* an index out of range */
  NB_ERR_VALUE = -7,      /* a bad scalar argument */
  NB_ERR_GRAD = -8,       /* autograd misuse */
  NB_ERR_OOM = -9,        /* out of memory */
  NB_ERR_IO = -10,        /* file errors, corrupt files */
  NB_ERR_BACKEND = -11,   /* a backend (CUDA) error */
  NB_ERR_UNSUPPORTED = -12
} nb_status;

const char *nb_last_error(void);      /* "" when none */
nb_status nb_last_status(void);
void nb_clear_error(void);
const char *nb_status_name(nb_status s);

/* ---- dtypes and devices ---------------------------------------------- */
typedef enum {
  NB_F64, NB_F32, NB_F16, NB_BF16, NB_I64, NB_I32, NB_U8, NB_BOOL,
  /* 8-bit floats, storage only (as PyTorch's float8 types): casts, copies,
   * clones, views, transfers and nb_scaled_mm take them; every other op
   * refuses them. E4M3 is OCP FP8 E4M3FN (bias 7, no infinities, NaN
   * 0x7F/0xFF, largest 448); E5M2 is IEEE-like (bias 15, infinities and
   * NaNs, largest 57344). nb_dtype_is_float is 0 for them. */
  NB_F8E4M3, NB_F8E5M2,
  NB_DTYPE_COUNT
} nb_dtype;

size_t nb_dtype_size(nb_dtype dt);
const char *nb_dtype_name(nb_dtype dt);
int nb_dtype_is_float(nb_dtype dt);
int nb_dtype_is_fp8(nb_dtype dt); /* NB_F8E4M3 or NB_F8E5M2 */
/* Type promotion (docs/ARCHITECTURE.md has the table): bool < u8 < i32 < i64
 * < any float; among floats the wider wins and f16 with bf16 gives f32.
 * The fp8 types rank below f16 (e4m3 with e5m2 gives f16, which holds
 * both exactly), though no op but a cast computes on them. */
nb_dtype nb_promote(nb_dtype a, nb_dtype b);

/* Exact conversions: round-to-nearest-even, NaN and infinities kept. */
uint16_t nb_f32_to_f16(float x);
float nb_f16_to_f32(uint16_t h);
uint16_t nb_f32_to_bf16(float x);
float nb_bf16_to_f32(uint16_t h);
/* FP8, PyTorch's semantics for a cast from f32: round to nearest, ties to
 * even, no saturation. E4M3: a value that rounds past 448 (|x| > 464),
 * an infinity or a NaN gives NaN (0x7F with x's sign); E5M2: past 57344
 * (|x| >= 61440) gives an infinity, a NaN gives 0x7F with x's sign. The
 * decoders are exact (every fp8 value is an f32). */
uint8_t nb_f32_to_f8e4m3(float x);
float nb_f8e4m3_to_f32(uint8_t b);
uint8_t nb_f32_to_f8e5m2(float x);
float nb_f8e5m2_to_f32(uint8_t b);

typedef enum { NB_CPU = 0, NB_CUDA = 1 } nb_device_type;
typedef struct { nb_device_type type; int index; } nb_device;
#define NB_DEVICE_CPU ((nb_device){NB_CPU, 0})
nb_device nb_device_cuda(int index);
int nb_cuda_available(void);          /* number of CUDA devices, 0 if none */
/* "cpu", "cuda", "cuda:1"; returns NB_OK or NB_ERR_DEVICE. */
nb_status nb_device_parse(const char *s, nb_device *out);
/* CUDA caching-allocator statistics in bytes (all 0 without CUDA). */
typedef struct { int64_t allocated, reserved, peak, n_cuda_malloc, n_cache_hits; } nb_memory_stats;
nb_status nb_cuda_memory_stats(int device, nb_memory_stats *out);
nb_status nb_cuda_empty_cache(int device);
/* What a CUDA device is, and its peak dense throughput for model-FLOPs
 * utilisation: SMs x FLOPs per SM per clock (by compute capability) x the
 * reported peak clock; 0 where the capability is not in nabla's table.
 * peak_flops_low: bf16/f16 products on tensor cores with f32 accumulation;
 * peak_flops_f32: the FMA units (nabla's f32 products are exact f32, not
 * TF32). */
typedef struct {
  char name[96];
  int cc_major, cc_minor, n_sm, clock_mhz;
  int64_t memory_bytes;
  double peak_flops_low, peak_flops_f32;
} nb_cuda_info;
nb_status nb_cuda_device_info(int device, nb_cuda_info *out);
/* Device-side timing: an event is recorded in the device's stream (a host
 * timestamp on the CPU); elapsed waits for the end event. For benchmarks. */
typedef struct nb_event nb_event;
nb_event *nb_event_record(nb_device dev);
double nb_event_elapsed_ms(nb_event *start, nb_event *end); /* < 0 on error */
void nb_event_free(nb_event *e);
/* Waits for all queued work on the device. */
nb_status nb_device_synchronize(nb_device dev);

/* Kernel profiler. Between start and stop, every kernel nabla runs on any
 * device is timed between two events (device events in the CUDA stream;
 * the host clock on the CPU) and counted under its kernel's name
 * ("matmul", "add", "layer_norm_bwd", "adamw_multi", ...) and phase (bwd:
 * inside nb_backward, else fwd: forward, optimizer, anything else). Nothing
 * waits while profiling; stop waits for the devices once and adds up.
 * Events cost host time per kernel, so throughput while profiling is lower
 * than without. One profile at a time, driven from one thread. */
nb_status nb_profile_start(void);   /* NB_ERR_VALUE if one is running */
nb_status nb_profile_stop(void);    /* NB_ERR_VALUE if none is running */
int nb_profile_running(void);
/* pause 1: kernels are not timed and the wall clock stops until
 * nb_profile_pause(0) (e.g. around an evaluation inside profiled training
 * steps); pausing waits for the devices once. NB_ERR_VALUE without a
 * running profile or when already in that state. */
nb_status nb_profile_pause(int pause);
/* The table of the last stopped profile, longest total first: kernel,
 * phase, calls, total ms, mean us, share of kernel time; then wall clock. */
nb_status nb_profile_report(FILE *f);
/* Calls and total ms of one kernel name and phase (backward 0/1) in the
 * last stopped profile: 1 when it ran, else 0 with zeros. */
int nb_profile_stat(const char *name, int backward, int64_t *calls, double *ms);
void nb_profile_reset(void);        /* forgets the profile (and stops one) */

/* ---- tensors --------------------------------------------------------- */
typedef struct nb_tensor nb_tensor;

int nb_ndim(const nb_tensor *t);
int64_t nb_size(const nb_tensor *t, int axis); /* negative axis counts from end */
const int64_t *nb_shape(const nb_tensor *t);
const int64_t *nb_strides(const nb_tensor *t);  /* in elements */
int64_t nb_numel(const nb_tensor *t);
nb_dtype nb_dtype_of(const nb_tensor *t);
nb_device nb_device_of(const nb_tensor *t);
int nb_is_contiguous(const nb_tensor *t);
int nb_shares_storage(const nb_tensor *a, const nb_tensor *b);
/* Writes "f32[2, 3]" into buf. */
const char *nb_describe(const nb_tensor *t, char *buf, size_t n);

nb_tensor *nb_retain(nb_tensor *t);   /* +1 reference, caller owns it */
void nb_release(nb_tensor *t);        /* -1 reference; NULL is a no-op */
nb_tensor *nb_keep(nb_tensor *t);     /* same as nb_retain: survives the scope */
void nb_scope_begin(void);
void nb_scope_end(void);              /* drops every reference the scope owns */
int nb_scope_depth(void);
/* Ends the innermost scope but keeps t: it goes to the enclosing scope (or
 * to the caller when none is open). A scope per layer of a model frees each
 * layer's intermediates as soon as the layer is done, keeping only what
 * backward needs (the graph's references), instead of all until the step
 * ends: x = nb_scope_return(layer(x)) after nb_scope_begin(). NULL passes. */
nb_tensor *nb_scope_return(nb_tensor *t);
/* Live tensor and byte counts (for leak checks and memory reports). */
int64_t nb_live_tensors(void);
int64_t nb_live_bytes(nb_device dev);

/* ---- creation (new tensors, contiguous) ------------------------------- */
nb_tensor *nb_empty(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev);
nb_tensor *nb_zeros(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev);
nb_tensor *nb_ones(int ndim, const int64_t *shape, nb_dtype dt, nb_device dev);
nb_tensor *nb_full(int ndim, const int64_t *shape, double value, nb_dtype dt, nb_device dev);
nb_tensor *nb_scalar(double value, nb_dtype dt, nb_device dev); /* 0-d */
/* start, start+step, ... while < end (> end for a negative step). */
nb_tensor *nb_arange(double start, double end, double step, nb_dtype dt, nb_device dev);
/* Copies numel elements of dtype dt from a host buffer. */
nb_tensor *nb_from_buffer(const void *data, int ndim, const int64_t *shape,
                          nb_dtype dt, nb_device dev);
/* A CPU tensor in page-locked (pinned) memory when a CUDA device is present,
 * in ordinary memory otherwise (its contents are uninitialised). A copy from
 * it to a GPU (nb_to_device, nb_copy_) is queued without waiting: write into
 * it again only after nb_device_synchronize of that GPU. */
nb_tensor *nb_empty_pinned(int ndim, const int64_t *shape, nb_dtype dt);
int nb_is_pinned(const nb_tensor *t);
nb_tensor *nb_zeros_like(const nb_tensor *t);
nb_tensor *nb_ones_like(const nb_tensor *t);
/* Copies the tensor, in its dtype, in row-major order into a host buffer of
 * nbytes; fails unless nbytes == numel * dtype size. */
nb_status nb_to_host(const nb_tensor *t, void *dst, size_t nbytes);
/* The value of a one-element tensor, converted to double (NaN on error). */
double nb_item(const nb_tensor *t);
/* Element at a multi-index, as double (for tests and printing). */
double nb_get(const nb_tensor *t, const int64_t *index);
/* Pointer to element [0,..,0] of a CPU tensor (NULL for other devices). */
void *nb_data_ptr(const nb_tensor *t);
nb_tensor *nb_to_device(const nb_tensor *t, nb_device dev);

/* Deterministic kernels (default on): same seed, device and inputs give the
 * same bits. Off selects faster atomic paths where they exist. */
void nb_set_deterministic(int on);
int nb_deterministic(void);

/* ---- random numbers: Philox-4x32-10, defined by (seed, offset) -----------
 * Element i of the (contiguous) result is drawn from the Philox block at
 * counter offset + i with key seed; so any backend reproduces it bit for bit.
 * The generator state is a (seed, offset) pair; draws advance offset. */
typedef struct { uint64_t seed; uint64_t offset; } nb_rng;
nb_rng nb_rng_new(uint64_t seed);
void nb_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4]);
nb_tensor *nb_rand(nb_rng *rng, int ndim, const int64_t *shape, double lo, double hi,
                   nb_dtype dt, nb_device dev);
nb_tensor *nb_randn(nb_rng *rng, int ndim, const int64_t *shape, double mean, double std,
                    nb_dtype dt, nb_device dev);
/* Integers uniform in [lo, hi). */
nb_tensor *nb_randint(nb_rng *rng, int ndim, const int64_t *shape, int64_t lo, int64_t hi,
                      nb_dtype dt, nb_device dev);

/* ---- views (share storage with their base) ----------------------------- */
/* shape may hold one -1. Copies only when no view is possible. */
nb_tensor *nb_reshape(const nb_tensor *t, int ndim, const int64_t *shape);
nb_tensor *nb_view(const nb_tensor *t, int ndim, const int64_t *shape); /* never copies */
nb_tensor *nb_permute(const nb_tensor *t, const int *perm);
nb_tensor *nb_transpose(const nb_tensor *t, int a, int b);
/* Elements start, start+step, ... < end along axis; step > 0. Negative start
 * and end count from the end; they are clamped like Python slices. */
nb_tensor *nb_slice(const nb_tensor *t, int axis, int64_t start, int64_t end, int64_t step);
nb_tensor *nb_narrow(const nb_tensor *t, int axis, int64_t start, int64_t length);
nb_tensor *nb_select(const nb_tensor *t, int axis, int64_t index); /* drops axis */
nb_tensor *nb_expand(const nb_tensor *t, int ndim, const int64_t *shape); /* -1 keeps */
nb_tensor *nb_broadcast_to(const nb_tensor *t, int ndim, const int64_t *shape);
nb_tensor *nb_squeeze(const nb_tensor *t, int axis);   /* axis must have size 1 */
nb_tensor *nb_squeeze_all(const nb_tensor *t);
nb_tensor *nb_unsqueeze(const nb_tensor *t, int axis);
nb_tensor *nb_flatten(const nb_tensor *t, int start_axis, int end_axis);
nb_tensor *nb_contiguous(const nb_tensor *t); /* t itself (+1 ref) if contiguous */
nb_tensor *nb_clone(const nb_tensor *t);      /* always a new contiguous copy */
/* Broadcast shape of two shapes (NumPy rules). Returns ndim or < 0. */
int nb_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int64_t *out);

/* ---- in-place (never recorded by autograd) ------------------------------ */
/* Copies src into dst (broadcasting src, converting dtype). dst may be a view:
 * the write is visible through its base. Fails on a tensor that needs grad. */
nb_status nb_copy_(nb_tensor *dst, const nb_tensor *src);
nb_status nb_fill_(nb_tensor *dst, double value);

/* ---- autograd ---------------------------------------------------------- */
nb_status nb_set_requires_grad(nb_tensor *t, int flag); /* leaves, float dtypes */
int nb_requires_grad(const nb_tensor *t);
int nb_is_leaf(const nb_tensor *t);
/* The accumulated gradient of a leaf (borrowed: owned by t), or NULL. */
nb_tensor *nb_grad(const nb_tensor *t);
nb_status nb_zero_grad(nb_tensor *t);  /* drops t's gradient */
/* Backward from a scalar loss (grad NULL) or from any tensor with a gradient
 * of its shape. Gradients accumulate into leaves' nb_grad. After the call the
 * graph's nodes drop their saved tensors unless retain_graph; create_graph
 * records the backward computation itself so it can be differentiated. */
nb_status nb_backward(nb_tensor *t, const nb_tensor *grad);
nb_status nb_backward_ex(nb_tensor *t, const nb_tensor *grad, int retain_graph, int create_graph);
/* Gradients of outputs wrt inputs, without touching .grad: grads_out[i] is a
 * new reference owned like any returned tensor (by the innermost scope when
 * one is open, else by the caller), or NULL if unreachable. */
nb_status nb_autograd_grad(nb_tensor *output, const nb_tensor *grad_output, int n_inputs,
                           nb_tensor *const *inputs, nb_tensor **grads_out, int create_graph);
nb_tensor *nb_detach(const nb_tensor *t); /* a view with no history */
void nb_no_grad_begin(void);
void nb_no_grad_end(void);
int nb_grad_enabled(void);
/* Name of the op that produced t ("leaf" for leaves). */
const char *nb_grad_fn_name(const nb_tensor *t);
/* Mixed precision. Between nb_autocast_begin(NB_BF16 or NB_F16) and
 * nb_autocast_end() (per thread; regions nest with one dtype), each op runs
 * in the dtype of its precision class (docs/ARCHITECTURE.md, "Mixed
 * precision"): contractions (matmul, linear, conv2d, attention) in the low
 * dtype with f32 accumulation; statistics (norms, softmax, log_softmax,
 * reductions) in f32, returning f32; cross-entropy reads f16/bf16 logits as
 * they are (no cast), computes in f32 and returns an f32 loss; the rest as
 * their inputs come. f64 tensors are never cast. A parameter (a leaf
 * requiring grad) is cast once per region. Gradients flow back through the
 * casts to the f32 tensors. */
nb_status nb_autocast_begin(nb_dtype low);
void nb_autocast_end(void);
nb_dtype nb_autocast_dtype(void); /* the low dtype inside a region, else NB_F32 */

/* The op table, read-only: every primitive op (src/ops/op_list.h) with its
 * kind, precision class under autocast ("low", "f32", "wide", "follow") and
 * determinism note (NULL: the same bits every run). Strings are static. */
typedef struct {
  const char *name, *kind, *precision, *determinism;
  int n_inputs, n_outputs, differentiable, has_benchmark;
} nb_op_info;
int nb_op_table_size(void);
nb_status nb_op_table_info(int i, nb_op_info *out); /* NB_ERR_VALUE out of range */

/* ---- elementwise ------------------------------------------------------- */
nb_tensor *nb_neg(const nb_tensor *x);
nb_tensor *nb_abs(const nb_tensor *x);
nb_tensor *nb_exp(const nb_tensor *x);
nb_tensor *nb_log(const nb_tensor *x);
nb_tensor *nb_log1p(const nb_tensor *x);
nb_tensor *nb_expm1(const nb_tensor *x);
nb_tensor *nb_sqrt(const nb_tensor *x);
nb_tensor *nb_rsqrt(const nb_tensor *x);
nb_tensor *nb_square(const nb_tensor *x);
nb_tensor *nb_reciprocal(const nb_tensor *x);
nb_tensor *nb_sin(const nb_tensor *x);
nb_tensor *nb_cos(const nb_tensor *x);
nb_tensor *nb_tanh(const nb_tensor *x);
nb_tensor *nb_sigmoid(const nb_tensor *x);
nb_tensor *nb_relu(const nb_tensor *x);
nb_tensor *nb_gelu(const nb_tensor *x);       /* erf form */
nb_tensor *nb_gelu_tanh(const nb_tensor *x);  /* tanh approximation */
nb_tensor *nb_silu(const nb_tensor *x);
nb_tensor *nb_softplus(const nb_tensor *x);
nb_tensor *nb_sign(const nb_tensor *x);   /* no gradient (zero) */
nb_tensor *nb_floor(const nb_tensor *x);  /* no gradient (zero) */
nb_tensor *nb_ceil(const nb_tensor *x);   /* no gradient (zero) */
nb_tensor *nb_round(const nb_tensor *x);  /* half to even; no gradient (zero) */

nb_tensor *nb_add(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_sub(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_mul(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_div(const nb_tensor *a, const nb_tensor *b);  /* true division */
nb_tensor *nb_pow(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_maximum(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_minimum(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_add_scalar(const nb_tensor *a, double s);
nb_tensor *nb_sub_scalar(const nb_tensor *a, double s);
nb_tensor *nb_rsub_scalar(const nb_tensor *a, double s);   /* s - a */
nb_tensor *nb_mul_scalar(const nb_tensor *a, double s);
nb_tensor *nb_div_scalar(const nb_tensor *a, double s);
nb_tensor *nb_pow_scalar(const nb_tensor *a, double s);
nb_tensor *nb_maximum_scalar(const nb_tensor *a, double s);
nb_tensor *nb_minimum_scalar(const nb_tensor *a, double s);
/* Comparisons give bool tensors and no gradient. */
nb_tensor *nb_eq(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_ne(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_lt(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_le(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_gt(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_ge(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_where(const nb_tensor *cond, const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_clamp(const nb_tensor *x, double lo, double hi);
nb_tensor *nb_cast(const nb_tensor *x, nb_dtype dt);

/* ---- reductions: axes NULL (with n_axes 0) reduces every axis ----------- */
nb_tensor *nb_sum(const nb_tensor *x, int n_axes, const int *axes, int keepdim);
nb_tensor *nb_mean(const nb_tensor *x, int n_axes, const int *axes, int keepdim);
nb_tensor *nb_max(const nb_tensor *x, int n_axes, const int *axes, int keepdim);
nb_tensor *nb_min(const nb_tensor *x, int n_axes, const int *axes, int keepdim);
nb_tensor *nb_argmax(const nb_tensor *x, int axis, int keepdim); /* i64 */
nb_tensor *nb_argmin(const nb_tensor *x, int axis, int keepdim); /* i64 */
nb_tensor *nb_var(const nb_tensor *x, int n_axes, const int *axes, double correction, int keepdim);
nb_tensor *nb_std(const nb_tensor *x, int n_axes, const int *axes, double correction, int keepdim);
nb_tensor *nb_logsumexp(const nb_tensor *x, int n_axes, const int *axes, int keepdim);
nb_tensor *nb_norm(const nb_tensor *x, double p, int n_axes, const int *axes, int keepdim);
/* Sums t down to a shape it was broadcast from (used by backward rules). */
nb_tensor *nb_sum_to_shape(const nb_tensor *t, int ndim, const int64_t *shape);

/* ---- linear algebra and joining ---------------------------------------- */
/* NumPy matmul semantics: 1-D operands are promoted, batch dims broadcast.
 * Operand strides are used as they are: a transposed view costs no copy. */
nb_tensor *nb_matmul(const nb_tensor *a, const nb_tensor *b);
/* FP8 product with per-tensor scales, as torch._scaled_mm:
 * out (M, N) = scale_a * scale_b * (a (M, K) @ b (K, N)), a and b NB_F8E4M3
 * or NB_F8E5M2 (any mix), scale_a and scale_b one-element f32 tensors (read
 * on the device: no host wait), out_dtype NB_BF16, NB_F16 or NB_F32. The
 * product is accumulated in f32 (the CPU: f64) and the scales are applied
 * once, to the accumulated sum. On a compute capability 9.0 GPU the
 * tensor-core kernel takes a row-major a and a b whose K axis is
 * contiguous (b = w^T for a row-major w (N, K): the NT layout), rows
 * 16-byte aligned (K a multiple of 16); other layouts and devices take a
 * slower portable kernel. No gradient flows through it. */
nb_tensor *nb_scaled_mm(const nb_tensor *a, const nb_tensor *b, const nb_tensor *scale_a,
                        const nb_tensor *scale_b, nb_dtype out_dtype);
nb_tensor *nb_cat(int n, nb_tensor *const *ts, int axis);
nb_tensor *nb_stack(int n, nb_tensor *const *ts, int axis);
/* Fills out[0..] with views; returns the number of pieces or < 0. */
int nb_split(const nb_tensor *t, int64_t piece, int axis, nb_tensor **out, int max_out);
int nb_chunk(const nb_tensor *t, int chunks, int axis, nb_tensor **out, int max_out);

/* ---- neural-network ops (issue: NN ops) --------------------------------- */
nb_tensor *nb_softmax(const nb_tensor *x, int axis);
nb_tensor *nb_log_softmax(const nb_tensor *x, int axis);
/* Normalises over the trailing n_norm axes; weight and bias may be NULL. */
nb_tensor *nb_layer_norm(const nb_tensor *x, int n_norm, const nb_tensor *weight,
                         const nb_tensor *bias, double eps);
nb_tensor *nb_rms_norm(const nb_tensor *x, int n_norm, const nb_tensor *weight, double eps);
typedef enum { NB_REDUCE_MEAN, NB_REDUCE_SUM, NB_REDUCE_NONE } nb_reduction;
/* logits (N, C) or (C); targets i64 (N) or (). Computed in f32 (f64 for
 * f64 logits) from logits of any float dtype; the loss has the logits'
 * dtype, except that f16/bf16 logits give an f32 loss inside an autocast
 * region; the logits' gradient has their dtype, rounded once. */
nb_tensor *nb_cross_entropy(const nb_tensor *logits, const nb_tensor *targets,
                            nb_reduction red, int64_t ignore_index, double label_smoothing);
nb_tensor *nb_nll_loss(const nb_tensor *logp, const nb_tensor *targets, nb_reduction red,
                       int64_t ignore_index);
nb_tensor *nb_mse_loss(const nb_tensor *a, const nb_tensor *b, nb_reduction red);
nb_tensor *nb_embedding(const nb_tensor *weight, const nb_tensor *indices);
nb_tensor *nb_index_select(const nb_tensor *x, int axis, const nb_tensor *indices);
nb_tensor *nb_gather(const nb_tensor *x, int axis, const nb_tensor *indices);
/* Returns x with src added at indices along axis (out of place). */
nb_tensor *nb_scatter_add(const nb_tensor *x, int axis, const nb_tensor *indices,
                          const nb_tensor *src);
/* Zeroes each element with probability p and scales the rest by 1/(1-p).
 * The mask is a function of (rng seed, offset); rng advances. */
nb_tensor *nb_dropout(const nb_tensor *x, double p, nb_rng *rng);
/* x (.., in); weight (out, in); bias (out) or NULL. */
nb_tensor *nb_linear(const nb_tensor *x, const nb_tensor *weight, const nb_tensor *bias);
typedef struct {
  int stride[2], padding[2], dilation[2];
  int groups;
  int channels_last; /* input and output NHWC instead of NCHW */
} nb_conv2d_params;
nb_conv2d_params nb_conv2d_defaults(void);
/* x (N,C,H,W) [or NHWC]; weight (O, C/groups, kh, kw); bias (O) or NULL. */
nb_tensor *nb_conv2d(const nb_tensor *x, const nb_tensor *weight, const nb_tensor *bias,
                     nb_conv2d_params p);
nb_tensor *nb_max_pool2d(const nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw);
nb_tensor *nb_avg_pool2d(const nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw);
/* q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv); mask additive, broadcast to
 * (..., Lq, Lk), or NULL; scale <= 0 means 1/sqrt(D). */
nb_tensor *nb_scaled_dot_product_attention(const nb_tensor *q, const nb_tensor *k,
                                           const nb_tensor *v, const nb_tensor *mask,
                                           int causal, double dropout_p, nb_rng *rng,
                                           double scale);
/* Self-attention on a packed projection (FlashAttention's qkv-packed form):
 * qkv (..., T, 3 H D) holds q, k and v as the three thirds of its last axis,
 * each (H, D), head major (q[.., t, h, d] = qkv[.., t, h D + d], k and v
 * H D and 2 H D further); returns (..., T, H D), the heads side by side the
 * same way. heads = H; scale <= 0 means 1/sqrt(D). The same kernels as
 * nb_scaled_dot_product_attention on (..., H, T, D) views, with no copy of
 * q, k, v or the output, and one (..., T, 3 H D) gradient. */
nb_tensor *nb_attention_qkv(const nb_tensor *qkv, int heads, int causal, double scale);
nb_tensor *nb_one_hot(const nb_tensor *indices, int64_t num_classes); /* i64 */
nb_tensor *nb_triu(const nb_tensor *x, int64_t k);
nb_tensor *nb_tril(const nb_tensor *x, int64_t k);

/* ---- parameters, initialisers, optimizers (nn) -------------------------- */
/* A named list of parameters; nb_params_add takes a reference to t and marks
 * it requires_grad. Freed with nb_params_free (drops its references). */
typedef struct nb_params nb_params;
nb_params *nb_params_new(void);
nb_tensor *nb_params_add(nb_params *p, const char *name, nb_tensor *t); /* borrowed */
int nb_params_count(const nb_params *p);
nb_tensor *nb_params_get(const nb_params *p, int i);                   /* borrowed */
const char *nb_params_name(const nb_params *p, int i);
nb_tensor *nb_params_find(const nb_params *p, const char *name);      /* borrowed */
int64_t nb_params_numel(const nb_params *p);
void nb_params_zero_grad(nb_params *p);
void nb_params_free(nb_params *p);

/* In-place initialisers (float tensors, no grad recorded). */
nb_status nb_init_normal_(nb_tensor *t, nb_rng *rng, double mean, double std);
nb_status nb_init_uniform_(nb_tensor *t, nb_rng *rng, double lo, double hi);
/* fan_in/fan_out from a weight (out, in, ...): Kaiming for ReLU gain sqrt(2). */
nb_status nb_init_kaiming_uniform_(nb_tensor *t, nb_rng *rng, double gain);
nb_status nb_init_kaiming_normal_(nb_tensor *t, nb_rng *rng, double gain);
nb_status nb_init_xavier_uniform_(nb_tensor *t, nb_rng *rng, double gain);
nb_status nb_init_xavier_normal_(nb_tensor *t, nb_rng *rng, double gain);

typedef struct nb_optim nb_optim;
nb_optim *nb_sgd_new(nb_params *params, double lr, double momentum, double dampening,
                     int nesterov, double weight_decay);
/* AdamW: decoupled decay, bias correction, f32 state. */
nb_optim *nb_adamw_new(nb_params *params, double lr, double beta1, double beta2, double eps,
                       double weight_decay);
nb_status nb_optim_step(nb_optim *o);       /* skips params without a gradient */
void nb_optim_set_lr(nb_optim *o, double lr);
double nb_optim_lr(const nb_optim *o);
int64_t nb_optim_steps(const nb_optim *o);
/* The optimizer's state as named tensors ("adamw.m.<param>", "adamw.v.<param>",
 * "sgd.momentum.<param>"),
 * borrowed, for checkpoints; nb_optim_set_steps restores the step count. */
int nb_optim_state_count(const nb_optim *o);
nb_tensor *nb_optim_state_get(const nb_optim *o, int i, const char **name);
void nb_optim_set_steps(nb_optim *o, int64_t steps);
void nb_optim_free(nb_optim *o);
/* Scales all gradients so that their global L2 norm is at most max_norm;
 * returns the norm before clipping (negative on error). */
double nb_clip_grad_norm(nb_params *params, double max_norm);
/* Dynamic loss scaling for f16 training, with the rules of PyTorch's
 * GradScaler: the loss is multiplied by the scale before backward
 * (nb_scaler_scale); nb_scaler_step then takes the global norm of the
 * scaled gradients (the non-finite check is the same pass), and when every
 * gradient is finite runs each optimizer's step on the gradients times
 * 1/scale (and the clip coefficient for max_norm >= 0, as
 * nb_clip_grad_norm; max_norm < 0: no clipping); when one is not finite, it
 * leaves parameters and optimizer state (step counts included) as they
 * were, and the scale backs off. Scale: times backoff_factor and the growth
 * counter reset on a skipped step; times growth_factor after
 * growth_interval consecutive steps that were not skipped (the scale an f32
 * value, as in torch). Defaults NB_SCALER_DEFAULTS (2^16, x2 after 2000
 * steps, x0.5); growth and backoff 1 keep the scale fixed (e.g. 1 for bf16:
 * the check and the skip only). With AdamW optimizers and the gradients on
 * one device, all of it is decided on that device and nothing waits for
 * the host (the scale and counters live there; the gradients keep the
 * scale, the AdamW pass applies the factor as it reads them); the getters,
 * nb_optim_steps and a non-NULL res read the state back (a
 * synchronisation). Otherwise (SGD, no optimizers) the norm is read on the
 * host and the gradients are multiplied in place (docs/ARCHITECTURE.md,
 * "Mixed precision"). */
typedef struct nb_scaler nb_scaler;
#define NB_SCALER_DEFAULTS 65536.0, 2.0, 0.5, 2000
nb_scaler *nb_scaler_new(double init_scale, double growth_factor, double backoff_factor,
                         int64_t growth_interval);
void nb_scaler_free(nb_scaler *s);
/* loss * scale: a new tensor (owned by the current scope). */
nb_tensor *nb_scaler_scale(const nb_scaler *s, nb_tensor *loss);
typedef struct {
  int stepped;      /* 1: the optimizers stepped; 0: skipped (a gradient not finite) */
  double norm;      /* the unscaled gradients' global norm before clipping (inf/NaN if skipped) */
  double scale;     /* the scale this step's gradients carried */
  double new_scale; /* the scale for the next step */
} nb_scaler_result;
nb_status nb_scaler_step(nb_scaler *s, nb_params *params, double max_norm, int n_optims,
                         nb_optim *const *optims, nb_scaler_result *res);
/* State for checkpoints: the scale and the count of good steps since the
 * last change; set_state checks scale > 0 and tracker in [0, interval). */
double nb_scaler_get_scale(const nb_scaler *s);
int64_t nb_scaler_growth_tracker(const nb_scaler *s);
nb_status nb_scaler_set_state(nb_scaler *s, double scale, int64_t growth_tracker);
int64_t nb_scaler_skipped(const nb_scaler *s); /* steps skipped so far (-1 on error) */
/* Learning-rate schedules. */
double nb_lr_constant(int64_t step, double lr);
double nb_lr_warmup_linear(int64_t step, int64_t warmup, double lr);
/* Linear warm-up to lr, then cosine decay to lr_min at total steps. */
double nb_lr_cosine(int64_t step, int64_t warmup, int64_t total, double lr, double lr_min);

/* ---- safetensors checkpoints (io) --------------------------------------- */
/* Writes atomically (temporary file, fsync, rename). meta may be NULL. */
nb_status nb_safetensors_save(const char *path, int n, const char *const *names,
                              nb_tensor *const *tensors, int n_meta,
                              const char *const *meta_keys, const char *const *meta_values);
typedef struct nb_st_file nb_st_file;
/* Reads and strictly validates the whole file; NULL + message if corrupt. */
nb_st_file *nb_safetensors_load(const char *path);
/* Same from memory (the fuzz target uses this). */
nb_st_file *nb_safetensors_parse(const void *data, size_t nbytes);
int nb_st_count(const nb_st_file *f);
const char *nb_st_name(const nb_st_file *f, int i);
/* A new CPU tensor with the named entry, or NULL if absent. */
nb_tensor *nb_st_tensor(const nb_st_file *f, const char *name);
const char *nb_st_metadata(const nb_st_file *f, const char *key); /* NULL if absent */
void nb_st_close(nb_st_file *f);

/* ---- token files (io) -------------------------------------------------------
 * The format of llm.c's data scripts: a header of 256 little-endian int32
 * (magic 20240520, version 1, the token count, the rest zero), then the
 * tokens as little-endian uint16. */
#define NB_TOKENS_MAGIC 20240520
#define NB_TOKENS_VERSION 1
#define NB_TOKENS_HEADER_BYTES 1024
typedef struct nb_tokens nb_tokens;
/* Checks the header and that the file's size is the header plus 2 bytes for
 * each token it counts, then reads all tokens into host memory (2 bytes a
 * token). vocab > 0: every token must be below it; 0: not checked. Returns
 * a new nb_tokens owned by the caller (free with nb_tokens_close), or NULL
 * with NB_ERR_IO naming the file and what was expected (a wrong magic or
 * version, a file shorter or longer than its count, a token beyond vocab,
 * an empty file, a directory), NB_ERR_OOM, or NB_ERR_NULL. */
nb_tokens *nb_tokens_open(const char *path, int64_t vocab);
int64_t nb_tokens_count(const nb_tokens *t);
/* The tokens, borrowed from t: valid until nb_tokens_close(t). */
const uint16_t *nb_tokens_data(const nb_tokens *t);
void nb_tokens_close(nb_tokens *t); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif
#endif /* NABLA_H */
