/* `nabla bench`: the kernel benchmark harness.
 *
 * Every case states its shape, counts the bytes it must move (each input
 * read once, each output written once) and its FLOPs before it runs, then is
 * timed with device events: warm-up runs, then the median of many timed
 * runs. Inputs rotate among several sets whose total exceeds the last-level
 * cache, so the cache does not serve them. Each run sits in its own
 * nb_scope_begin/end, so the times include nabla's per-op host overhead
 * (validation, graph recording, releasing the scope), as a user sees it.
 *
 * The ceilings are measured in the same run: the copy bandwidth (a large
 * nb_copy_, bytes read + written) and the GEMM rate (bf16 8192^3 on CUDA,
 * f32 1024^3 on the CPU). Every case reports its fraction of them.
 *
 * Only the public API is used, plus the device's name for the report. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/autotune.h"
#include "cli.h"
#include "nabla.h"
#include "tool.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_timing.h"
#include "core/core.h"
#endif

#define BENCH_MAX_SETS 64
#define BENCH_MAX_IN 6
#define BENCH_MIB 1048576.0
#define BENCH_GIB 1073741824.0

/* ---- the cases ------------------------------------------------------------ */
typedef enum {
  BK_COPY, BK_ADD, BK_GELU_TANH, BK_SOFTMAX, BK_LN_FWD, BK_LN_FWDBWD, BK_XENT,
  BK_EMBEDDING, BK_ADAMW, BK_MATMUL, BK_MM_BIAS_GELU, BK_MM_BIAS_GELU_UNFUSED, BK_COUNT
} bench_kind;

/* Family names: what --only matches (by prefix) and what compare_torch.py
 * dispatches on. */
static const char *const bench_family[BK_COUNT] = {
  "copy", "add", "gelu_tanh", "softmax_fwd", "layer_norm_fwd", "layer_norm_fwdbwd",
  "cross_entropy_fwdbwd", "embedding_fwdbwd", "adamw", "matmul",
  "matmul_bias_gelu", "matmul_bias_gelu_unfused",
};

/* Which ceiling a case measures. */
enum { BC_NONE, BC_COPY, BC_GEMM_CUDA, BC_GEMM_CPU };

/* dims by kind:
 *   copy, add, gelu_tanh      {n}
 *   softmax, layer_norm       {rows, cols}
 *   cross_entropy             {rows, classes}
 *   embedding                 {vocab, dim, tokens}
 *   adamw                     {vocab, layers, dim, context}: a GPT-2-shaped
 *                             parameter list (124.5M at 50304, 12, 768, 1024)
 *   matmul                    {M, N, K}: (M, K) @ (K, N)
 *   matmul_bias_gelu          {M, N, K}: gelu_tanh((M, K) @ (K, N) + bias (N,)),
 *                             on CUDA one GEMM with the epilogue fused
 *                             (nb_cuda_gemm_ex); _unfused: matmul, add, gelu
 * gpu: the shapes of the issue; cpu: smaller; quick: smaller still (CPU). */
typedef struct {
  bench_kind kind;
  nb_dtype dt;
  const char *layout; /* matmul: NN; NT = x @ W^T (linear forward); TN = dY^T @ X (dW) */
  const char *note;
  int64_t gpu[4], cpu[4], quick[4];
  int ceiling;
} bench_spec;

#define GPT_M 16384 /* GPT-2 rows: batch 16 x sequence 1024 */
#define CPU_M 64
#define QUICK_M 16
/* The three matmuls of a linear layer with in_features K and out_features N. */
#define BENCH_LINEAR(K, N, what)                                                        \
  {BK_MATMUL, NB_BF16, "NT", what " forward x@W^T", {GPT_M, N, K}, {CPU_M, N, K},        \
   {QUICK_M, N, K}, BC_NONE},                                                            \
  {BK_MATMUL, NB_BF16, "NN", what " dX = dY@W", {GPT_M, K, N}, {CPU_M, K, N},            \
   {QUICK_M, K, N}, BC_NONE},                                                            \
  {BK_MATMUL, NB_BF16, "TN", what " dW = dY^T@X", {N, K, GPT_M}, {N, K, CPU_M},          \
   {N, K, QUICK_M}, BC_NONE}

static const bench_spec bench_specs[] = {
  {BK_COPY, NB_F32, NULL, "copy ceiling", {1 << 28}, {1 << 25}, {1 << 22}, BC_COPY},
  {BK_MATMUL, NB_BF16, "NN", "square; the GEMM ceiling on CUDA", {8192, 8192, 8192},
   {512, 512, 512}, {256, 256, 256}, BC_GEMM_CUDA},
  {BK_MATMUL, NB_F32, "NN", "f32 square; the GEMM ceiling on the CPU", {1024, 1024, 1024},
   {1024, 1024, 1024}, {512, 512, 512}, BC_GEMM_CPU},
  {BK_ADD, NB_F32, NULL, "a + b", {1 << 28}, {1 << 24}, {1 << 22}, BC_NONE},
  {BK_GELU_TANH, NB_F32, NULL, "gelu, tanh form", {1 << 28}, {1 << 24}, {1 << 22}, BC_NONE},
  {BK_SOFTMAX, NB_BF16, NULL, "last axis", {16384, 4096}, {1024, 4096}, {128, 4096}, BC_NONE},
  {BK_SOFTMAX, NB_BF16, NULL, "last axis, GPT-2 vocab", {4096, 50304}, {256, 50304},
   {32, 50304}, BC_NONE},
  {BK_LN_FWD, NB_BF16, NULL, "GPT-2 small width", {16384, 768}, {2048, 768}, {256, 768},
   BC_NONE},
  {BK_LN_FWD, NB_BF16, NULL, "wide", {16384, 4096}, {1024, 4096}, {128, 4096}, BC_NONE},
  {BK_LN_FWDBWD, NB_BF16, NULL, "GPT-2 small width", {16384, 768}, {2048, 768}, {256, 768},
   BC_NONE},
  {BK_LN_FWDBWD, NB_BF16, NULL, "wide", {16384, 4096}, {1024, 4096}, {128, 4096}, BC_NONE},
  {BK_XENT, NB_BF16, NULL, "GPT-2 logits, mean loss", {16384, 50304}, {256, 50304},
   {32, 50304}, BC_NONE},
  {BK_EMBEDDING, NB_F32, NULL, "GPT-2 token table, deterministic", {50304, 768, 16384},
   {16384, 768, 2048}, {4096, 256, 256}, BC_NONE},
  {BK_ADAMW, NB_F32, NULL, "GPT-2-shaped parameter list", {50304, 12, 768, 1024},
   {8192, 2, 768, 256}, {2048, 1, 256, 128}, BC_NONE},
  {BK_MATMUL, NB_BF16, "NN", "square", {2048, 2048, 2048}, {256, 256, 256}, {128, 128, 128},
   BC_NONE},
  {BK_MATMUL, NB_BF16, "NN", "square", {4096, 4096, 4096}, {384, 384, 384}, {192, 192, 192},
   BC_NONE},
  BENCH_LINEAR(768, 2304, "GPT-2 attn qkv"),
  BENCH_LINEAR(768, 3072, "GPT-2 mlp fc"),
  BENCH_LINEAR(3072, 768, "GPT-2 mlp proj"),
  BENCH_LINEAR(768, 50304, "GPT-2 lm head"),
  {BK_MM_BIAS_GELU, NB_BF16, "NT", "GPT-2 mlp fc forward, fused epilogue", {GPT_M, 3072, 768},
   {CPU_M, 3072, 768}, {QUICK_M, 3072, 768}, BC_NONE},
  {BK_MM_BIAS_GELU_UNFUSED, NB_BF16, "NT", "the same as matmul, add, gelu_tanh",
   {GPT_M, 3072, 768}, {CPU_M, 3072, 768}, {QUICK_M, 3072, 768}, BC_NONE},
};
#define BENCH_NSPECS ((int)(sizeof bench_specs / sizeof bench_specs[0]))

typedef struct {
  const bench_spec *spec;
  int64_t d[4];
  char id[128], name[48], shape[64];
  double bytes, flops, set_bytes;
  int n_sets, next_set;
  nb_tensor *t[BENCH_MAX_SETS][BENCH_MAX_IN];
  nb_params *params[BENCH_MAX_SETS];
  nb_optim *optim[BENCH_MAX_SETS];
  int64_t n_params, n_tensors; /* adamw */
  int role;                    /* BC_COPY, BC_GEMM_* when it is this run's ceiling */
  /* results */
  int ran, reps;
  nb_status status;
  char error[512];
  double ms_median, ms_min, ms_mean, gbs, tflops, frac_bw, frac_gemm;
} bench_case;

typedef struct {
  nb_device dev;
  int quick;
  double target_ms, warm_ms, rotate_bytes;
  int min_reps, max_reps;
  const char *json_path, *md_path, *only;
  int list;
  int tuning; /* NABLA_AUTOTUNE=1: a case's first run may time GEMM candidates */
} bench_opts;

/* ---- counting: shapes, bytes, FLOPs ------------------------------------- */
static int64_t bench_gpt_params(const int64_t *d, int64_t *n_tensors) {
  int64_t v = d[0], layers = d[1], c = d[2], ctx = d[3];
  *n_tensors = 2 + 12 * layers + 2;
  return v * c + ctx * c + layers * (12 * c * c + 13 * c) + 2 * c;
}

static void bench_shape_n(char *buf, size_t n, int64_t v) {
  if (v > 0 && (v & (v - 1)) == 0) {
    int e = 0;
    while ((INT64_C(1) << e) < v) e++;
    snprintf(buf, n, "2^%d", e);
  } else {
    snprintf(buf, n, "%lld", (long long)v);
  }
}

static void bench_describe(bench_case *c) {
  const bench_spec *sp = c->spec;
  const int64_t *d = c->d;
  long long a = d[0], b = d[1], k = d[2];
  switch (sp->kind) {
  case BK_COPY: case BK_ADD: case BK_GELU_TANH:
    bench_shape_n(c->shape, sizeof c->shape, d[0]);
    break;
  case BK_EMBEDDING:
    snprintf(c->shape, sizeof c->shape, "%lldx%lld T=%lld", a, b, k);
    break;
  case BK_ADAMW:
    c->n_params = bench_gpt_params(d, &c->n_tensors);
    snprintf(c->shape, sizeof c->shape, "%.1fM in %lld", c->n_params / 1e6,
             (long long)c->n_tensors);
    break;
  case BK_MATMUL: case BK_MM_BIAS_GELU: case BK_MM_BIAS_GELU_UNFUSED:
    snprintf(c->shape, sizeof c->shape, "%lldx%lldx%lld", a, b, k);
    break;
  default:
    snprintf(c->shape, sizeof c->shape, "%lldx%lld", a, b);
  }
  if (sp->layout) snprintf(c->name, sizeof c->name, "%s_%c%c", bench_family[sp->kind],
                           tolower((unsigned char)sp->layout[0]),
                           tolower((unsigned char)sp->layout[1]));
  else snprintf(c->name, sizeof c->name, "%s", bench_family[sp->kind]);
  snprintf(c->id, sizeof c->id, "%s:%s:%s", c->name, c->shape, nb_dtype_name(sp->dt));
}

/* Bytes of the ideal implementation (each input read once, each output
 * written once), FLOPs (matmuls only: elementwise and normalisation cases are
 * bound by memory, so their FLOP counts would not be compared to anything),
 * and the bytes of one input set (what rotation must spread past the cache). */
static void bench_count(bench_case *c) {
  const int64_t *d = c->d;
  double s = (double)nb_dtype_size(c->spec->dt), r = (double)d[0], w = (double)d[1];
  double n = r, e = r * w;
  c->flops = 0;
  switch (c->spec->kind) {
  case BK_COPY: c->bytes = 2 * n * s; c->set_bytes = 2 * n * s; break;
  case BK_ADD: c->bytes = 3 * n * s; c->set_bytes = 2 * n * s; break;
  case BK_GELU_TANH: c->bytes = 2 * n * s; c->set_bytes = n * s; break;
  case BK_SOFTMAX: c->bytes = 2 * e * s; c->set_bytes = e * s; break;
  case BK_LN_FWD: /* x, w, b -> y, mean (f32), rstd (f32) */
    c->bytes = 2 * e * s + 2 * w * s + 8 * r;
    c->set_bytes = e * s + 2 * w * s;
    break;
  case BK_LN_FWDBWD: /* forward, then dy, x, w, mean, rstd -> dx, dw, db */
    c->bytes = (2 * e * s + 2 * w * s + 8 * r) + (3 * e * s + 3 * w * s + 8 * r);
    c->set_bytes = 2 * e * s + 2 * w * s;
    break;
  case BK_XENT: /* logits, targets (i64) -> loss, dlogits: a fused ideal */
    c->bytes = 2 * e * s + 8 * r + 4;
    c->set_bytes = e * s + 8 * r;
    break;
  case BK_EMBEDDING: { /* fwd: idx, T rows of W -> out; bwd: dy, idx -> dense dW */
    double t = (double)d[2], td = t * w;
    c->bytes = (8 * t + 2 * td * s) + (td * s + 8 * t + e * s);
    c->set_bytes = e * s + 8 * t + td * s;
    break;
  }
  case BK_ADAMW: /* read p, g, m, v; write p, m, v: 28 bytes per f32 parameter */
    c->bytes = 7.0 * s * (double)c->n_params;
    c->set_bytes = 4.0 * s * (double)c->n_params;
    break;
  case BK_MATMUL: {
    double m = r, nn = w, k = (double)d[2];
    c->bytes = (m * k + k * nn + m * nn) * s;
    c->flops = 2 * m * nn * k;
    c->set_bytes = (m * k + k * nn) * s;
    break;
  }
  case BK_MM_BIAS_GELU: case BK_MM_BIAS_GELU_UNFUSED: { /* the epilogue's FLOPs not counted */
    double m = r, nn = w, k = (double)d[2];
    c->bytes = (m * k + k * nn + nn + m * nn) * s;
    c->flops = 2 * m * nn * k;
    c->set_bytes = (m * k + k * nn + nn) * s;
    break;
  }
  default: break;
  }
}

/* Enough sets that their total exceeds the rotation target (several times
 * the L2 cache); one set when a single one is so large (>= 1 GiB) that the
 * cache cannot hold any useful part of it between runs. */
static int bench_n_sets(const bench_case *c, double rotate_bytes) {
  if (c->set_bytes >= BENCH_GIB) return 1;
  double k = ceil(rotate_bytes / (c->set_bytes > 0 ? c->set_bytes : 1));
  if (k < 2) k = 2;
  if (k > BENCH_MAX_SETS) k = BENCH_MAX_SETS;
  return (int)k;
}

/* ---- inputs ------------------------------------------------------------- */
static nb_status bench_fail(void) {
  nb_status st = nb_last_status();
  return st != NB_OK ? st : NB_ERR_BACKEND;
}

static nb_status bench_leaf(nb_tensor *t) {
  if (!t) return bench_fail();
  return nb_set_requires_grad(t, 1);
}

/* One GPT-2 parameter with a gradient already in place. */
static nb_status bench_adamw_param(nb_params *ps, const char *name, int nd, int64_t a,
                                   int64_t b, nb_rng *rng, nb_device dev) {
  int64_t shape[2] = {a, b};
  nb_tensor *p = nb_randn(rng, nd, shape, 0.0, 0.02, NB_F32, dev);
  nb_tensor *g = nb_randn(rng, nd, shape, 0.0, 1e-3, NB_F32, dev);
  nb_status st = p && g ? NB_OK : bench_fail();
  if (!st && !nb_params_add(ps, name, p)) st = bench_fail();
  if (!st) st = nb_backward(p, g); /* a leaf: its .grad becomes a copy of g */
  nb_release(p);
  nb_release(g);
  return st;
}

static nb_status bench_adamw_layer(nb_params *ps, int l, int64_t c, nb_rng *rng, nb_device dev) {
  static const char *const names[12] = {"ln_1.w", "ln_1.b", "attn.qkv.w", "attn.qkv.b",
                                        "attn.proj.w", "attn.proj.b", "ln_2.w", "ln_2.b",
                                        "mlp.fc.w", "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"};
  const int64_t rows[12] = {c, c, 3 * c, 3 * c, c, c, c, c, 4 * c, 4 * c, c, c};
  const int64_t cols[12] = {0, 0, c, 0, c, 0, 0, 0, c, 0, 4 * c, 0};
  nb_status st = NB_OK;
  for (int i = 0; i < 12 && !st; i++) {
    char name[64];
    snprintf(name, sizeof name, "h.%d.%s", l, names[i]);
    st = bench_adamw_param(ps, name, cols[i] ? 2 : 1, rows[i], cols[i], rng, dev);
  }
  return st;
}

static nb_status bench_setup_adamw(bench_case *c, int s, nb_rng *rng, nb_device dev) {
  const int64_t *d = c->d;
  nb_params *ps = nb_params_new();
  if (!ps) return bench_fail();
  c->params[s] = ps;
  nb_status st = bench_adamw_param(ps, "wte", 2, d[0], d[2], rng, dev);
  if (!st) st = bench_adamw_param(ps, "wpe", 2, d[3], d[2], rng, dev);
  for (int l = 0; l < d[1] && !st; l++) st = bench_adamw_layer(ps, l, d[2], rng, dev);
  if (!st) st = bench_adamw_param(ps, "ln_f.w", 1, d[2], 0, rng, dev);
  if (!st) st = bench_adamw_param(ps, "ln_f.b", 1, d[2], 0, rng, dev);
  if (st) return st;
  c->optim[s] = nb_adamw_new(ps, 1e-4, 0.9, 0.95, 1e-8, 0.1);
  return c->optim[s] ? NB_OK : bench_fail();
}

/* Matmul operands stored as a linear layer stores them; t[2], t[3] are the
 * (possibly transposed) views the product takes. */
static nb_status bench_setup_matmul(bench_case *c, int s, nb_rng *rng, nb_device dev) {
  nb_tensor **t = c->t[s];
  const char *lay = c->spec->layout;
  int64_t m = c->d[0], n = c->d[1], k = c->d[2];
  int ta = lay[0] == 'T', tb = lay[1] == 'T';
  int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
  t[0] = nb_randn(rng, 2, sa, 0.0, 1.0, c->spec->dt, dev);
  t[1] = nb_randn(rng, 2, sb, 0.0, 1.0, c->spec->dt, dev);
  if (!t[0] || !t[1]) return bench_fail();
  t[2] = ta ? nb_transpose(t[0], 0, 1) : nb_retain(t[0]);
  t[3] = tb ? nb_transpose(t[1], 0, 1) : nb_retain(t[1]);
  if (c->spec->kind != BK_MATMUL) t[4] = nb_randn(rng, 1, &n, 0.0, 1.0, c->spec->dt, dev);
  return t[2] && t[3] && (c->spec->kind == BK_MATMUL || t[4]) ? NB_OK : bench_fail();
}

/* Layer norm: t = {x, w, b, dy}; w near 1, b near 0. */
static nb_status bench_setup_ln(bench_case *c, int s, nb_rng *rng, nb_device dev, int grad) {
  nb_tensor **t = c->t[s];
  nb_dtype dt = c->spec->dt;
  const int64_t *d = c->d;
  t[0] = nb_randn(rng, 2, d, 0.0, 1.0, dt, dev);
  t[1] = nb_rand(rng, 1, d + 1, 0.5, 1.5, dt, dev);
  t[2] = nb_randn(rng, 1, d + 1, 0.0, 0.1, dt, dev);
  if (!t[0] || !t[1] || !t[2]) return bench_fail();
  if (!grad) return NB_OK;
  t[3] = nb_randn(rng, 2, d, 0.0, 1.0, dt, dev);
  nb_status st = t[3] ? NB_OK : bench_fail();
  for (int i = 0; i < 3 && !st; i++) st = bench_leaf(t[i]);
  return st;
}

static nb_status bench_setup_set(bench_case *c, int s, nb_rng *rng, nb_device dev) {
  nb_tensor **t = c->t[s];
  const int64_t *d = c->d;
  nb_dtype dt = c->spec->dt;
  switch (c->spec->kind) {
  case BK_COPY:
    t[0] = nb_randn(rng, 1, d, 0.0, 1.0, dt, dev);
    t[1] = nb_empty(1, d, dt, dev);
    return t[0] && t[1] ? NB_OK : bench_fail();
  case BK_ADD:
    t[0] = nb_randn(rng, 1, d, 0.0, 1.0, dt, dev);
    t[1] = nb_randn(rng, 1, d, 0.0, 1.0, dt, dev);
    return t[0] && t[1] ? NB_OK : bench_fail();
  case BK_GELU_TANH:
    t[0] = nb_randn(rng, 1, d, 0.0, 2.0, dt, dev);
    return t[0] ? NB_OK : bench_fail();
  case BK_SOFTMAX:
    t[0] = nb_randn(rng, 2, d, 0.0, 2.0, dt, dev);
    return t[0] ? NB_OK : bench_fail();
  case BK_LN_FWD: return bench_setup_ln(c, s, rng, dev, 0);
  case BK_LN_FWDBWD: return bench_setup_ln(c, s, rng, dev, 1);
  case BK_XENT:
    t[0] = nb_randn(rng, 2, d, 0.0, 2.0, dt, dev);
    t[1] = nb_randint(rng, 1, d, 0, d[1], NB_I64, dev);
    return t[1] ? bench_leaf(t[0]) : bench_fail();
  case BK_EMBEDDING: {
    int64_t dy_shape[2] = {d[2], d[1]};
    t[0] = nb_randn(rng, 2, d, 0.0, 0.02, dt, dev);
    t[1] = nb_randint(rng, 1, d + 2, 0, d[0], NB_I64, dev);
    t[2] = nb_randn(rng, 2, dy_shape, 0.0, 1.0, dt, dev);
    return t[1] && t[2] ? bench_leaf(t[0]) : bench_fail();
  }
  case BK_ADAMW: return bench_setup_adamw(c, s, rng, dev);
  case BK_MATMUL: case BK_MM_BIAS_GELU: case BK_MM_BIAS_GELU_UNFUSED:
    return bench_setup_matmul(c, s, rng, dev);
  default: return NB_ERR_UNSUPPORTED;
  }
}

static void bench_teardown(bench_case *c) {
  for (int s = 0; s < BENCH_MAX_SETS; s++) {
    for (int i = 0; i < BENCH_MAX_IN; i++) {
      nb_release(c->t[s][i]);
      c->t[s][i] = NULL;
    }
    nb_optim_free(c->optim[s]);
    nb_params_free(c->params[s]);
    c->optim[s] = NULL;
    c->params[s] = NULL;
  }
}

/* ---- one run of a case -------------------------------------------------- */
static nb_status bench_ok(const nb_tensor *t) { return t ? NB_OK : bench_fail(); }

/* gelu_tanh(t[2] @ t[3] + t[4]): on CUDA one GEMM with the bias and GELU in
 * its epilogue (an internal entry: the public API has no fused op yet). */
static nb_status bench_mm_bias_gelu(nb_tensor **t) {
#ifdef NABLA_HAVE_CUDA
  if (nb_device_of(t[2]).type == NB_CUDA) {
    int64_t shape[2] = {nb_size(t[2], 0), nb_size(t[3], 1)};
    nb_tensor *out = nb_empty(2, shape, nb_dtype_of(t[2]), nb_device_of(t[2]));
    if (!out) return bench_fail();
    nb_kview ko, ka, kb, kbias;
    nb_kview_of(out, &ko);
    nb_kview_of(t[2], &ka);
    nb_kview_of(t[3], &kb);
    nb_kview_of(t[4], &kbias);
    nb_gemm_epilogue ep = {&kbias, NULL, NULL, 1.0f, 0.0f, 1};
    return nb_cuda_gemm_ex(&ko, &ka, &kb, &ep);
  }
#endif
  return bench_ok(nb_gelu_tanh(nb_add(nb_matmul(t[2], t[3]), t[4])));
}

static nb_status bench_step(bench_case *c, int s) {
  nb_tensor **t = c->t[s];
  nb_tensor *g[3], *y;
  switch (c->spec->kind) {
  case BK_COPY: return nb_copy_(t[1], t[0]);
  case BK_ADD: return bench_ok(nb_add(t[0], t[1]));
  case BK_GELU_TANH: return bench_ok(nb_gelu_tanh(t[0]));
  case BK_SOFTMAX: return bench_ok(nb_softmax(t[0], -1));
  case BK_LN_FWD: return bench_ok(nb_layer_norm(t[0], 1, t[1], t[2], 1e-5));
  case BK_LN_FWDBWD:
    y = nb_layer_norm(t[0], 1, t[1], t[2], 1e-5);
    return y ? nb_autograd_grad(y, t[3], 3, t, g, 0) : bench_fail();
  case BK_XENT:
    y = nb_cross_entropy(t[0], t[1], NB_REDUCE_MEAN, -100, 0.0);
    return y ? nb_autograd_grad(y, NULL, 1, t, g, 0) : bench_fail();
  case BK_EMBEDDING:
    y = nb_embedding(t[0], t[1]);
    return y ? nb_autograd_grad(y, t[2], 1, t, g, 0) : bench_fail();
  case BK_ADAMW: return nb_optim_step(c->optim[s]);
  case BK_MATMUL: return bench_ok(nb_matmul(t[2], t[3]));
  case BK_MM_BIAS_GELU: return bench_mm_bias_gelu(t);
  case BK_MM_BIAS_GELU_UNFUSED: return bench_ok(nb_gelu_tanh(nb_add(nb_matmul(t[2], t[3]), t[4])));
  default: return NB_ERR_UNSUPPORTED;
  }
}

/* One iteration on the next input set, inside its own scope so that every
 * result and intermediate is released before the next. */
static nb_status bench_iter(bench_case *c) {
  int s = c->next_set;
  c->next_set = (s + 1) % c->n_sets;
  nb_clear_error();
  nb_scope_begin();
  nb_status st = bench_step(c, s);
  nb_scope_end();
  return st;
}

/* One iteration between two events, waited for: used to warm up and to
 * estimate how many timed runs fit the time budget. */
static nb_status bench_time_one(bench_case *c, nb_device dev, double *ms) {
  nb_event *a = nb_event_record(dev), *b = NULL;
  nb_status st = a ? bench_iter(c) : bench_fail();
  if (!st) b = nb_event_record(dev);
  if (!st && !b) st = bench_fail();
  if (!st) {
    *ms = nb_event_elapsed_ms(a, b);
    if (*ms < 0) st = bench_fail();
  }
  nb_event_free(a);
  nb_event_free(b);
  return st;
}

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Queues reps iterations, each between its own pair of events, and reads
 * the times only at the end, so the device never waits for the host's
 * reading of a previous result. */
static nb_status bench_timed_runs(bench_case *c, const bench_opts *o, int reps, double *ms) {
  nb_event **ev = calloc((size_t)2 * reps, sizeof *ev);
  if (!ev) return NB_ERR_OOM; /* host memory; reported as an allocation failure */
  nb_status st = NB_OK;
  for (int r = 0; r < reps && !st; r++) {
    ev[2 * r] = nb_event_record(o->dev);
    st = ev[2 * r] ? bench_iter(c) : bench_fail();
    if (!st) ev[2 * r + 1] = nb_event_record(o->dev);
    if (!st && !ev[2 * r + 1]) st = bench_fail();
  }
  if (!st) st = nb_device_synchronize(o->dev);
  for (int r = 0; r < reps && !st; r++) {
    ms[r] = nb_event_elapsed_ms(ev[2 * r], ev[2 * r + 1]);
    if (ms[r] < 0) st = bench_fail();
  }
  for (int i = 0; i < 2 * reps; i++) nb_event_free(ev[i]);
  free(ev);
  return st;
}

static nb_status bench_measure(bench_case *c, const bench_opts *o) {
  double est = 0, spent = 0;
  int runs = 0;
  nb_status st;
  /* Warm-up: at least one run (two unless one is slow), then until warm_ms.
   * With NABLA_AUTOTUNE=1 always two: the first may tune a GEMM (time its
   * candidates), and est, which sizes the timed runs, must not include it. */
  do {
    st = bench_time_one(c, o->dev, &est);
    spent += est;
    runs++;
  } while (!st && runs < 1000 &&
           (spent < o->warm_ms || (runs < 2 && (est < 1000.0 || o->tuning))));
  if (st) return st;
  int reps = (int)ceil(o->target_ms / (est > 1e-4 ? est : 1e-4));
  if (reps < o->min_reps) reps = o->min_reps;
  if (reps > o->max_reps) reps = o->max_reps;
  double *ms = calloc((size_t)reps, sizeof *ms);
  if (!ms) return NB_ERR_OOM;
  st = bench_timed_runs(c, o, reps, ms);
  if (!st) {
    double sum = 0;
    for (int r = 0; r < reps; r++) sum += ms[r];
    qsort(ms, (size_t)reps, sizeof *ms, bench_cmp_double);
    c->ms_median = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
    c->ms_min = ms[0];
    c->ms_mean = sum / reps;
    c->reps = reps;
  }
  free(ms);
  return st;
}

static int bench_is_oom(nb_status st, const char *msg) {
  return st == NB_ERR_OOM || strstr(msg, "out of memory") != NULL;
}

/* Sets up, measures and tears down one case; the result stays in c. */
static void bench_run_case(bench_case *c, const bench_opts *o) {
  nb_rng rng = nb_rng_new(1234);
  nb_status st = NB_OK;
  c->n_sets = bench_n_sets(c, o->rotate_bytes);
  c->next_set = 0;
  nb_clear_error();
  for (int s = 0; s < c->n_sets && !st; s++) st = bench_setup_set(c, s, &rng, o->dev);
  if (!st) st = nb_device_synchronize(o->dev);
  if (!st) st = bench_measure(c, o);
  c->ran = 1;
  c->status = st;
  if (st) {
    const char *msg = nb_last_error();
    snprintf(c->error, sizeof c->error, "%s%s", msg[0] ? msg : nb_status_name(st),
             bench_is_oom(st, msg) ? " (allocation failed; --only can leave this case out)"
                                   : "");
  } else {
    double sec = c->ms_median * 1e-3;
    c->gbs = c->bytes / sec / 1e9;
    c->tflops = c->flops / sec / 1e12;
  }
  bench_teardown(c);
  nb_clear_error();
  if (o->dev.type == NB_CUDA) nb_cuda_empty_cache(o->dev.index);
  nb_clear_error();
}

/* ---- report ------------------------------------------------------------- */
static void bench_frac(bench_case *c, double copy_gbs, double gemm_tflops) {
  c->frac_bw = c->status || !(copy_gbs > 0) ? NAN : c->gbs / copy_gbs;
  c->frac_gemm = c->status || !(gemm_tflops > 0) || c->flops == 0 ? NAN
                                                                 : c->tflops / gemm_tflops;
}

static void bench_cell(char *buf, size_t n, double v, const char *fmt) {
  if (isnan(v)) snprintf(buf, n, "-");
  else snprintf(buf, n, fmt, v);
}

static const char *const bench_hdr[9] = {"case", "shape", "dtype", "ms (median)", "GB/s",
                                         "TFLOP/s", "% copy BW", "% GEMM", "note"};

static void bench_row_cells(const bench_case *c, char cells[9][96]) {
  snprintf(cells[0], 96, "%s", c->name);
  snprintf(cells[1], 96, "%s", c->shape);
  snprintf(cells[2], 96, "%s", nb_dtype_name(c->spec->dt));
  if (c->status || !c->ran) {
    for (int i = 3; i < 8; i++) snprintf(cells[i], 96, "-");
    snprintf(cells[8], 96, "%s", c->ran ? "FAILED (see below)" : "not run");
    return;
  }
  bench_cell(cells[3], 96, c->ms_median, "%.4f");
  bench_cell(cells[4], 96, c->gbs, "%.1f");
  bench_cell(cells[5], 96, c->flops > 0 ? c->tflops : NAN, "%.2f");
  bench_cell(cells[6], 96, 100 * c->frac_bw, "%.1f");
  bench_cell(cells[7], 96, 100 * c->frac_gemm, "%.1f");
  snprintf(cells[8], 96, "%s", c->spec->note);
}

static void bench_print_header(FILE *f) {
  fprintf(f, "%-22s %-18s %-5s %12s %9s %8s %9s %7s  %s\n", bench_hdr[0], bench_hdr[1],
          bench_hdr[2], bench_hdr[3], bench_hdr[4], bench_hdr[5], bench_hdr[6], bench_hdr[7],
          bench_hdr[8]);
}

static void bench_print_row(FILE *f, const bench_case *c) {
  char cells[9][96];
  bench_row_cells(c, cells);
  fprintf(f, "%-22s %-18s %-5s %12s %9s %8s %9s %7s  %s\n", cells[0], cells[1], cells[2],
          cells[3], cells[4], cells[5], cells[6], cells[7], cells[8]);
  if (c->status) fprintf(f, "  %s: %s\n", c->id, c->error);
  fflush(f);
}

typedef struct {
  char device[32], device_name[256], date[32], commit[64];
  int threads;
  double copy_gbs, gemm_tflops;
  const char *gemm_id;
} bench_meta;

static void bench_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch == '\n') fputs("\\n", f);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

static void bench_json_num(FILE *f, const char *key, double v, const char *sep) {
  fprintf(f, "\"%s\": ", key);
  if (isnan(v) || isinf(v)) fputs("null", f);
  else fprintf(f, "%.9g", v);
  fputs(sep, f);
}

static void bench_json_case(FILE *f, const bench_case *c) {
  const bench_spec *sp = c->spec;
  fputs("    {\"id\": ", f);
  bench_json_str(f, c->id);
  fputs(", \"name\": ", f);
  bench_json_str(f, c->name);
  fputs(", \"family\": ", f);
  bench_json_str(f, bench_family[sp->kind]);
  fputs(", \"layout\": ", f);
  if (sp->layout) bench_json_str(f, sp->layout);
  else fputs("null", f);
  fputs(", \"dtype\": ", f);
  bench_json_str(f, nb_dtype_name(sp->dt));
  fprintf(f, ", \"dims\": [%lld", (long long)c->d[0]);
  for (int i = 1; i < 4 && c->d[i]; i++) fprintf(f, ", %lld", (long long)c->d[i]);
  fputs("], \"shape\": ", f);
  bench_json_str(f, c->shape);
  fputs(", \"note\": ", f);
  bench_json_str(f, sp->note);
  fprintf(f, ",\n     \"ceiling\": %s, \"bound\": \"%s\", ",
          c->role == BC_COPY ? "\"copy\"" : c->role != BC_NONE ? "\"gemm\"" : "null",
          c->flops > 0 ? "compute" : "memory");
  if (sp->kind == BK_ADAMW) fprintf(f, "\"params\": %lld, \"param_tensors\": %lld, ",
                                    (long long)c->n_params, (long long)c->n_tensors);
  bench_json_num(f, "bytes", c->bytes, ", ");
  bench_json_num(f, "flops", c->flops, ", ");
  bench_json_num(f, "set_bytes", c->set_bytes, ", ");
  fprintf(f, "\"sets\": %d, \"reps\": %d,\n     \"status\": \"%s\", \"error\": ", c->n_sets,
          c->reps, !c->ran ? "not_run" : c->status ? "failed" : "ok");
  if (c->status) bench_json_str(f, c->error);
  else fputs("null", f);
  fputs(", ", f);
  int ok = c->ran && !c->status;
  bench_json_num(f, "ms_median", ok ? c->ms_median : NAN, ", ");
  bench_json_num(f, "ms_min", ok ? c->ms_min : NAN, ", ");
  bench_json_num(f, "ms_mean", ok ? c->ms_mean : NAN, ", ");
  bench_json_num(f, "gb_per_s", ok ? c->gbs : NAN, ", ");
  bench_json_num(f, "tflop_per_s", ok && c->flops > 0 ? c->tflops : NAN, ", ");
  bench_json_num(f, "frac_copy_bw", c->frac_bw, ", ");
  bench_json_num(f, "frac_gemm", c->frac_gemm, "}");
}

static int bench_write_json(const char *path, const bench_meta *m, const bench_opts *o,
                            bench_case **run, int n) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs("{\n  \"tool\": \"nabla bench\",\n  \"device\": ", f);
  bench_json_str(f, m->device);
  fputs(",\n  \"device_name\": ", f);
  bench_json_str(f, m->device_name);
  fputs(",\n  \"date\": ", f);
  bench_json_str(f, m->date);
  fputs(",\n  \"git_commit\": ", f);
  if (m->commit[0]) bench_json_str(f, m->commit);
  else fputs("null", f);
  fprintf(f, ",\n  \"quick\": %s, \"deterministic\": %s, \"autotune\": %s, \"cpu_threads\": %d,\n  ",
          o->quick ? "true" : "false", nb_deterministic() ? "true" : "false",
          o->tuning ? "true" : "false", m->threads);
  fputs("\"autotune_force\": ", f);
  if (nb_tune_forced_name()) bench_json_str(f, nb_tune_forced_name());
  else fputs("null", f);
  fputs(", ", f);
  bench_json_num(f, "rotate_bytes", o->rotate_bytes, ", ");
  bench_json_num(f, "target_ms", o->target_ms, ",\n  ");
  fputs("\"timing\": \"device events around each run (CPU: host clock); median of reps after "
        "warm-up; each run in its own scope, nabla's host overhead included\",\n  ", f);
  fputs("\"ceilings\": {", f);
  bench_json_num(f, "copy_gb_per_s", m->copy_gbs, ", ");
  bench_json_num(f, "gemm_tflop_per_s", m->gemm_tflops, ", ");
  fputs("\"gemm_case\": ", f);
  bench_json_str(f, m->gemm_id ? m->gemm_id : "");
  fputs("},\n  \"cases\": [\n", f);
  for (int i = 0; i < n; i++) {
    bench_json_case(f, run[i]);
    fputs(i + 1 < n ? ",\n" : "\n", f);
  }
  fputs("  ]\n}\n", f);
  return fclose(f) == 0 ? 0 : -1;
}

static int bench_write_md(const char *path, const bench_meta *m, bench_case **run, int n) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "# nabla bench: %s (%s)\n\n", m->device_name, m->device);
  fprintf(f, "Date %s, commit %s. Copy ceiling %.1f GB/s, GEMM ceiling %.2f TFLOP/s (%s), "
          "both measured in this run. Times are medians of device-event timings and include "
          "nabla's per-op host overhead.\n\n",
          m->date, m->commit[0] ? m->commit : "unknown", m->copy_gbs, m->gemm_tflops,
          m->gemm_id ? m->gemm_id : "-");
  fputs("|", f);
  for (int i = 0; i < 9; i++) fprintf(f, " %s |", bench_hdr[i]);
  fputs("\n|---|---|---|--:|--:|--:|--:|--:|---|\n", f);
  for (int i = 0; i < n; i++) {
    char cells[9][96];
    bench_row_cells(run[i], cells);
    fputs("|", f);
    for (int j = 0; j < 9; j++) fprintf(f, " %s |", cells[j]);
    fputs("\n", f);
  }
  for (int i = 0; i < n; i++)
    if (run[i]->status) fprintf(f, "\n- `%s` failed: %s\n", run[i]->id, run[i]->error);
  return fclose(f) == 0 ? 0 : -1;
}

/* ---- environment -------------------------------------------------------- */
static void bench_strip(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = '\0';
}

static void bench_git_commit(char *buf, size_t n) {
  buf[0] = '\0';
  const char *env = getenv("NABLA_GIT_COMMIT");
  if (env && env[0]) {
    snprintf(buf, n, "%s", env);
    return;
  }
  FILE *p = popen("git rev-parse HEAD 2>/dev/null", "r");
  if (!p) return;
  if (!fgets(buf, (int)n, p)) buf[0] = '\0';
  pclose(p);
  bench_strip(buf);
}

static void bench_cpu_name(char *buf, size_t n) {
  snprintf(buf, n, "cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (!strncmp(line, "model name", 10) && colon) {
      bench_strip(colon + 2);
      snprintf(buf, n, "%s", colon + 2);
      break;
    }
  }
  fclose(f);
}

static void bench_meta_init(bench_meta *m, const bench_opts *o) {
  memset(m, 0, sizeof *m);
  m->copy_gbs = m->gemm_tflops = NAN;
  if (o->dev.type == NB_CUDA) snprintf(m->device, sizeof m->device, "cuda:%d", o->dev.index);
  else snprintf(m->device, sizeof m->device, "cpu");
#ifdef NABLA_HAVE_CUDA
  if (o->dev.type == NB_CUDA &&
      nb_cuda_device_name(o->dev.index, m->device_name, sizeof m->device_name) != NB_OK)
    snprintf(m->device_name, sizeof m->device_name, "%s", m->device);
#endif
  if (o->dev.type == NB_CPU) bench_cpu_name(m->device_name, sizeof m->device_name);
  if (!m->device_name[0]) snprintf(m->device_name, sizeof m->device_name, "%s", m->device);
  nb_clear_error();
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(m->date, sizeof m->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  bench_git_commit(m->commit, sizeof m->commit);
#ifdef _OPENMP
  m->threads = omp_get_max_threads();
#else
  m->threads = 1;
#endif
}

/* ---- command line ------------------------------------------------------- */
static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: nabla bench [--device cpu|cuda[:N]] [--json FILE] [--md FILE] [--quick]\n"
          "                   [--only NAME,...] [--list] [--seconds S] [--rotate-mb MB]\n"
          "\n"
          "Times every kernel at stated shapes (the issue's GPU shapes on CUDA, smaller\n"
          "ones on the CPU) and reports GB/s, TFLOP/s and the fraction of the copy\n"
          "bandwidth and GEMM rate measured in the same run.\n"
          "\n"
          "  --device D     cpu (default), cuda or cuda:N\n"
          "  --json FILE    write every field, with device, date and git commit\n"
          "  --md FILE      write the table as markdown\n"
          "  --quick        fewer runs (and on the CPU smaller shapes)\n"
          "  --only LIST    comma-separated case families (prefixes match) or case ids;\n"
          "                 the two ceilings always run\n"
          "  --list         print the case ids and exit\n"
          "  --seconds S    timed runs per case fill about S seconds (default 0.5, quick 0.1)\n"
          "  --rotate-mb MB input sets per case total at least MB (default 256, CPU quick 64)\n"
          "Values go as --opt VALUE or --opt=VALUE; output files are checked first.\n"
          "\n"
          "NABLA_AUTOTUNE=1 times the GEMM candidates (the CPU GEMM's blockings; on CUDA\n"
          "the own sm_90a kernel's schedules: NABLA_GEMM=own for matmul, by default for\n"
          "matmul_bias_gelu) at the first use of each shape class, inside a case's first\n"
          "warm-up run, never in the timed runs; the choices are cached in\n"
          "NABLA_AUTOTUNE_CACHE (default ~/.cache/nabla/autotune.txt), so a second bench\n"
          "runs them without timing. Without it: the heuristic choices, or cached ones.\n"
          "\nfamilies:");
  for (int k = 0; k < BK_COUNT; k++) fprintf(f, " %s", bench_family[k]);
  fprintf(f, "\n");
}

/* Returns 0, or an exit status for a bad command line (or --help: -1). */
static int bench_parse(int argc, char **argv, bench_opts *o) {
  double seconds = -1, rotate_mb = -1;
  const char *device = "cpu";
  int help = 0, rc;
  const cli_opt rows[] = {
      CLI_OPT_STR("device", &device, 0), CLI_OPT_STR("json", &o->json_path, 0),
      CLI_OPT_STR("md", &o->md_path, 0), CLI_OPT_STR("only", &o->only, 0),
      CLI_OPT_FLAG("quick", 0, &o->quick), CLI_OPT_FLAG("list", 0, &o->list),
      CLI_OPT_REAL("seconds", &seconds, 0, 3600, 1, 0),
      CLI_OPT_REAL("rotate-mb", &rotate_mb, 0, 1 << 20, 0, 0), CLI_OPT_FLAG("help", 'h', &help)};
  cli_spec spec = {.prog = "nabla bench", .opts = rows, .n_opts = sizeof rows / sizeof *rows};
  if ((rc = cli_parse(&spec, argc, argv))) return rc;
  if (help) return bench_usage(stdout), -1;
  if (nb_device_parse(device, &o->dev) != NB_OK) {
    fprintf(stderr, "nabla bench: --device expects cpu, cuda or cuda:N, got '%s'\n", device);
    return NB_TOOL_EXIT_USAGE;
  }
  /* the output files, before the cases run */
  if ((o->json_path && (rc = cli_check_output("nabla bench", "--json", o->json_path))) ||
      (o->md_path && (rc = cli_check_output("nabla bench", "--md", o->md_path))))
    return rc;
  int cuda = o->dev.type == NB_CUDA;
  o->target_ms = 1e3 * (seconds > 0 ? seconds : o->quick ? 0.1 : 0.5);
  o->warm_ms = o->quick ? 20 : 100;
  o->min_reps = o->quick ? 3 : cuda ? 10 : 5;
  o->max_reps = o->quick ? 50 : 500;
  o->rotate_bytes = BENCH_MIB * (rotate_mb >= 0 ? rotate_mb : (!cuda && o->quick) ? 64 : 256);
  o->tuning = nb_tune_enabled();
  return 0;
}

/* The cases for the device: dims chosen, ceilings first. */
static int bench_build(const bench_opts *o, bench_case *all) {
  int n = 0, cuda = o->dev.type == NB_CUDA;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < BENCH_NSPECS; i++) {
      const bench_spec *sp = &bench_specs[i];
      int ceil_here = sp->ceiling == BC_COPY || sp->ceiling == (cuda ? BC_GEMM_CUDA : BC_GEMM_CPU);
      if ((pass == 0) != ceil_here) continue;
      bench_case *c = &all[n++];
      memset(c, 0, sizeof *c);
      c->spec = sp;
      c->role = ceil_here ? sp->ceiling : BC_NONE;
      memcpy(c->d, cuda ? sp->gpu : o->quick ? sp->quick : sp->cpu, sizeof c->d);
      bench_describe(c);
      bench_count(c);
      c->frac_bw = c->frac_gemm = NAN;
    }
  }
  return n;
}

/* --only: a token selects the cases whose family starts with it or whose
 * id or name equals it. Every token must select something. */
static int bench_select(const char *only, bench_case *all, int n, int *sel) {
  for (int i = 0; i < n; i++) sel[i] = !only || all[i].role != BC_NONE;
  if (!only) return 0;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", only);
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int hit = 0;
    for (int i = 0; i < n; i++) {
      const char *fam = bench_family[all[i].spec->kind];
      if (!strncmp(fam, tok, strlen(tok)) || !strcmp(all[i].id, tok) ||
          !strcmp(all[i].name, tok))
        sel[i] = hit = 1;
    }
    if (!hit) {
      fprintf(stderr, "nabla bench: --only: no case matches '%s' (nabla bench --list)\n", tok);
      return NB_TOOL_EXIT_USAGE;
    }
  }
  return 0;
}

static int bench_check_device(nb_device dev) {
  if (dev.type != NB_CUDA) return 0;
  int n = nb_cuda_available();
  if (dev.index < n) return 0;
  fprintf(stderr, "nabla bench: no CUDA device cuda:%d (%d found%s)\n", dev.index, n,
#ifdef NABLA_HAVE_CUDA
          ""
#else
          "; nabla was built without CUDA"
#endif
  );
  return NB_TOOL_EXIT_USAGE;
}

static void bench_report_files(const bench_opts *o, const bench_meta *m, bench_case **run,
                               int n, int *rc) {
  if (o->json_path && bench_write_json(o->json_path, m, o, run, n) != 0) {
    fprintf(stderr, "nabla bench: cannot write %s\n", o->json_path);
    *rc = NB_TOOL_EXIT_RUNTIME;
  }
  if (o->md_path && bench_write_md(o->md_path, m, run, n) != 0) {
    fprintf(stderr, "nabla bench: cannot write %s\n", o->md_path);
    *rc = NB_TOOL_EXIT_RUNTIME;
  }
}

/* Runs the selected cases in order (ceilings first) and prints each row. */
static int bench_run_all(const bench_opts *o, bench_meta *m, bench_case **run, int n) {
  int rc = 0;
  printf("nabla bench on %s (%s), %d CPU thread%s%s\n", m->device, m->device_name, m->threads,
         m->threads == 1 ? "" : "s", o->quick ? ", quick" : "");
  printf("times: median of device-event timings after warm-up, inputs rotated over >= %.0f MiB;"
         " nabla's per-op host overhead included\n", o->rotate_bytes / BENCH_MIB);
  if (o->tuning) printf("NABLA_AUTOTUNE=1: GEMM candidates are timed in each case's first warm-up run\n");
  if (nb_tune_forced_name())
    printf("NABLA_AUTOTUNE_FORCE=%s: kernels with a candidate of that name run it\n", nb_tune_forced_name());
  printf("\n");
  bench_print_header(stdout);
  for (int i = 0; i < n; i++) {
    bench_case *c = run[i];
    bench_run_case(c, o);
    if (!c->status && c->role == BC_COPY) m->copy_gbs = c->gbs;
    if (!c->status && c->role > BC_COPY) {
      m->gemm_tflops = c->tflops;
      m->gemm_id = c->id;
    }
    bench_frac(c, m->copy_gbs, m->gemm_tflops);
    bench_print_row(stdout, c);
    if (c->status && bench_is_oom(c->status, c->error)) rc = NB_TOOL_EXIT_USAGE;
    else if (c->status && rc == 0) rc = NB_TOOL_EXIT_RUNTIME;
  }
  printf("\nceilings (this run): copy %.1f GB/s, GEMM %.2f TFLOP/s (%s)\n", m->copy_gbs,
         m->gemm_tflops, m->gemm_id ? m->gemm_id : "not measured");
  bench_report_files(o, m, run, n, &rc);
  return rc;
}

int nb_tool_bench(int argc, char **argv) {
  bench_opts o;
  memset(&o, 0, sizeof o);
  int rc = bench_parse(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  bench_case *all = calloc(BENCH_NSPECS, sizeof *all);
  bench_case **run = calloc(BENCH_NSPECS, sizeof *run);
  int *sel = calloc(BENCH_NSPECS, sizeof *sel);
  if (!all || !run || !sel) {
    fprintf(stderr, "nabla bench: out of host memory\n");
    free(all), free(run), free(sel);
    return NB_TOOL_EXIT_USAGE;
  }
  int n = bench_build(&o, all), n_run = 0;
  rc = bench_select(o.only, all, n, sel);
  for (int i = 0; i < n; i++)
    if (sel[i]) run[n_run++] = &all[i];
  if (!rc && o.list) {
    /* With --json, the planned cases (status "not_run"): compare_torch.py
     * can time PyTorch alone on them. */
    for (int i = 0; i < n_run; i++) {
      run[i]->n_sets = bench_n_sets(run[i], o.rotate_bytes);
      printf("%-48s %s\n", run[i]->id, run[i]->spec->note);
    }
    bench_meta m;
    bench_meta_init(&m, &o);
    bench_report_files(&o, &m, run, n_run, &rc);
  } else if (!rc && !(rc = bench_check_device(o.dev))) {
    nb_set_deterministic(1); /* the embedding case asks for the deterministic path */
    bench_meta m;
    bench_meta_init(&m, &o);
    rc = bench_run_all(&o, &m, run, n_run);
  }
  free(all);
  free(run);
  free(sel);
  return rc;
}
