/* `nabla bench`'s cases (see bench.c): the table of specs (shapes on CUDA, on
 * the CPU and quick), and for each family its shape text, the bytes and
 * FLOPs it counts, its input sets and one run. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/bench_api.h"
#include "bench.h"
#include "nabla.h"

/* ---- the cases ------------------------------------------------------------ */
const char *const bench_family[BK_COUNT] = {
  "copy", "add", "gelu_tanh", "softmax_fwd", "layer_norm_fwd", "layer_norm_fwdbwd",
  "cross_entropy_fwdbwd", "embedding_fwdbwd", "adamw", "matmul",
  "matmul_bias_gelu", "matmul_bias_gelu_unfused", "attention_fwd", "attention_fwdbwd", "scaled_mm",
  "op",
};

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

const bench_spec bench_specs[] = {
  {BK_COPY, NB_F32, NULL, "copy ceiling", {1 << 28}, {1 << 25}, {1 << 22}, BC_COPY},
  {BK_MATMUL, NB_BF16, "NN", "square; the GEMM ceiling on CUDA", {8192, 8192, 8192},
   {512, 512, 512}, {256, 256, 256}, BC_GEMM_CUDA},
  /* nb_scaled_mm: e4m3 x e4m3 NT (a row-major, b = w^T), per-tensor scales, bf16 out */
  {BK_SCALED_MM, NB_BF16, "NT", "fp8 e4m3 square, bf16 out", {8192, 8192, 8192}, {512, 512, 512},
   {256, 256, 256}, BC_NONE},
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
  /* flash attention: FLOPs 4 B H N^2 D forward, 2.5x that with the backward, halved causal */
  {BK_ATTN_FWD, NB_BF16, NULL, "flash attention, square", {4, 16, 4096, 128}, {1, 2, 256, 64},
   {1, 2, 64, 64}, BC_NONE},
  {BK_ATTN_FWD, NB_BF16, "causal", "flash attention, square", {4, 16, 4096, 128}, {1, 2, 256, 64},
   {1, 2, 64, 64}, BC_NONE},
  {BK_ATTN_FWDBWD, NB_BF16, NULL, "flash attention, square", {4, 16, 4096, 128}, {1, 2, 256, 64},
   {1, 2, 64, 64}, BC_NONE},
  {BK_ATTN_FWDBWD, NB_BF16, "causal", "flash attention, square", {4, 16, 4096, 128},
   {1, 2, 256, 64}, {1, 2, 64, 64}, BC_NONE},
  /* _nd: under nb_set_deterministic(0) (the fused backward, dQ by bulk reduce-add) */
  {BK_ATTN_FWDBWD, NB_BF16, "causal_nd", "flash attention, square, nondeterministic dQ",
   {4, 16, 4096, 128}, {1, 2, 256, 64}, {1, 2, 64, 64}, BC_NONE},
  {BK_ATTN_FWD, NB_BF16, "causal", "flash attention, GPT-2 small shape", {16, 12, 1024, 64},
   {1, 2, 256, 64}, {1, 2, 64, 64}, BC_NONE},
  {BK_ATTN_FWDBWD, NB_BF16, "causal", "flash attention, GPT-2 small shape", {16, 12, 1024, 64},
   {1, 2, 256, 64}, {1, 2, 64, 64}, BC_NONE},
  {BK_ATTN_FWDBWD, NB_BF16, "causal_nd", "flash attention, GPT-2 small shape, nondeterministic dQ",
   {16, 12, 1024, 64}, {1, 2, 256, 64}, {1, 2, 64, 64}, BC_NONE},
};
const int bench_n_specs = (int)(sizeof bench_specs / sizeof bench_specs[0]);

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

void bench_describe(bench_case *c) {
  if (c->spec->kind == BK_OP) return bench_op_describe(c);
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
  case BK_MATMUL: case BK_MM_BIAS_GELU: case BK_MM_BIAS_GELU_UNFUSED: case BK_SCALED_MM:
    snprintf(c->shape, sizeof c->shape, "%lldx%lldx%lld", a, b, k);
    break;
  case BK_ATTN_FWD: case BK_ATTN_FWDBWD:
    snprintf(c->shape, sizeof c->shape, "%lldx%lldx%lldx%lld", a, b, k, (long long)d[3]);
    break;
  default:
    snprintf(c->shape, sizeof c->shape, "%lldx%lld", a, b);
  }
  if (sp->kind == BK_ATTN_FWD || sp->kind == BK_ATTN_FWDBWD)
    snprintf(c->name, sizeof c->name, "%s%s%s", bench_family[sp->kind], sp->layout ? "_" : "",
             sp->layout ? sp->layout : "");
  else if (sp->layout) snprintf(c->name, sizeof c->name, "%s_%c%c", bench_family[sp->kind],
                           tolower((unsigned char)sp->layout[0]),
                           tolower((unsigned char)sp->layout[1]));
  else snprintf(c->name, sizeof c->name, "%s", bench_family[sp->kind]);
  snprintf(c->id, sizeof c->id, "%s:%s:%s", c->name, c->shape, nb_dtype_name(sp->dt));
}

/* Bytes of the ideal implementation (each input read once, each output
 * written once), FLOPs (matmuls only: elementwise and normalisation cases are
 * bound by memory, so their FLOP counts would not be compared to anything),
 * and the bytes of one input set (what rotation must spread past the cache). */
void bench_count(bench_case *c) {
  if (c->spec->kind == BK_OP) return bench_op_count(c);
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
  case BK_SCALED_MM: { /* one-byte operands, the output in spec->dt */
    double m = r, nn = w, k = (double)d[2];
    c->bytes = m * k + k * nn + m * nn * s;
    c->flops = 2 * m * nn * k;
    c->set_bytes = m * k + k * nn;
    break;
  }
  case BK_MM_BIAS_GELU: case BK_MM_BIAS_GELU_UNFUSED: { /* the epilogue's FLOPs not counted */
    double m = r, nn = w, k = (double)d[2];
    c->bytes = (m * k + k * nn + nn + m * nn) * s;
    c->flops = 2 * m * nn * k;
    c->set_bytes = (m * k + k * nn + nn) * s;
    break;
  }
  case BK_ATTN_FWD: case BK_ATTN_FWDBWD: { /* q, k, v -> o, lse; backward: dout -> dq, dk, dv */
    double rows = (double)d[0] * (double)d[1] * (double)d[2], x = rows * (double)d[3] * s;
    int bwd = c->spec->kind == BK_ATTN_FWDBWD;
    c->flops = 4.0 * rows * (double)d[2] * (double)d[3] * (bwd ? 2.5 : 1.0) * (c->spec->layout ? 0.5 : 1.0);
    c->bytes = 4 * x + 4 * rows + (bwd ? 6 * x + 8 * rows : 0);
    c->set_bytes = (bwd ? 4 : 3) * x;
    break;
  }
  default: break;
  }
}

/* Enough sets that their total exceeds the rotation target (several times
 * the L2 cache); one set when a single one is so large (>= 1 GiB) that the
 * cache cannot hold any useful part of it between runs. */
int bench_n_sets(const bench_case *c, double rotate_bytes) {
  if (c->set_bytes >= BENCH_GIB) return 1;
  double k = ceil(rotate_bytes / (c->set_bytes > 0 ? c->set_bytes : 1));
  if (k < 2) k = 2;
  if (k > BENCH_MAX_SETS) k = BENCH_MAX_SETS;
  return (int)k;
}

/* ---- inputs ------------------------------------------------------------- */
nb_status bench_fail(void) {
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

/* scaled_mm: t = {a (M, K), w (N, K)} in e4m3 (normal values cast from the
 * spec's dtype), t[2] = a, t[3] = w^T, t[4], t[5] the f32 scales. */
static nb_status bench_setup_scaled_mm(bench_case *c, int s, nb_rng *rng, nb_device dev) {
  nb_tensor **t = c->t[s];
  int64_t m = c->d[0], n = c->d[1], k = c->d[2];
  nb_scope_begin();
  nb_tensor *a = nb_cast(nb_randn(rng, 2, (int64_t[]){m, k}, 0.0, 1.0, c->spec->dt, dev), NB_F8E4M3);
  nb_tensor *w = nb_cast(nb_randn(rng, 2, (int64_t[]){n, k}, 0.0, 1.0, c->spec->dt, dev), NB_F8E4M3);
  t[0] = nb_keep(a);
  t[1] = nb_keep(w);
  nb_scope_end();
  if (!t[0] || !t[1]) return bench_fail();
  t[2] = nb_retain(t[0]);
  t[3] = nb_transpose(t[1], 0, 1);
  t[4] = nb_full(0, NULL, 0.5, NB_F32, dev);
  t[5] = nb_full(0, NULL, 0.25, NB_F32, dev);
  return t[3] && t[4] && t[5] ? NB_OK : bench_fail();
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

nb_status bench_setup_set(bench_case *c, int s, nb_rng *rng, nb_device dev) {
  if (c->spec->kind == BK_OP) return bench_op_setup(c, s, rng, dev);
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
  case BK_SCALED_MM: return bench_setup_scaled_mm(c, s, rng, dev);
  case BK_ATTN_FWD: case BK_ATTN_FWDBWD: { /* t = {q, k, v, dout}, each (B, H, N, D) */
    int bwd = c->spec->kind == BK_ATTN_FWDBWD;
    nb_status st = NB_OK;
    for (int i = 0; i < 3 + bwd && !st; i++) {
      t[i] = nb_randn(rng, 4, d, 0.0, 1.0, dt, dev);
      st = !t[i] ? bench_fail() : bwd && i < 3 ? bench_leaf(t[i]) : NB_OK;
    }
    return st;
  }
  default: return NB_ERR_UNSUPPORTED;
  }
}

void bench_teardown(bench_case *c) {
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

/* gelu_tanh(t[2] @ t[3] + t[4]) as one GEMM with the bias and GELU in its
 * epilogue: the backend table's gemm_ex entry (an internal entry: the
 * public API has no fused op yet). */
static nb_status bench_mm_bias_gelu(nb_tensor **t) {
  const nb_backend *be = nb_backend_for(nb_device_of(t[2]));
  if (!be) return bench_fail();
  int64_t shape[2] = {nb_size(t[2], 0), nb_size(t[3], 1)};
  nb_tensor *out = nb_empty(2, shape, nb_dtype_of(t[2]), nb_device_of(t[2]));
  if (!out) return bench_fail();
  nb_kview ko, ka, kb, kbias;
  nb_kview_of(out, &ko);
  nb_kview_of(t[2], &ka);
  nb_kview_of(t[3], &kb);
  nb_kview_of(t[4], &kbias);
  nb_gemm_epilogue ep = {&kbias, NULL, NULL, 1.0f, 0.0f, 1};
  return be->gemm_ex(&ko, &ka, &kb, &ep);
}

nb_status bench_step(bench_case *c, int s) {
  if (c->spec->kind == BK_OP) return bench_op_step(c, s);
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
  case BK_SCALED_MM: return bench_ok(nb_scaled_mm(t[2], t[3], t[4], t[5], c->spec->dt));
  case BK_MM_BIAS_GELU: return bench_mm_bias_gelu(t);
  case BK_MM_BIAS_GELU_UNFUSED: return bench_ok(nb_gelu_tanh(nb_add(nb_matmul(t[2], t[3]), t[4])));
  case BK_ATTN_FWD:
    return bench_ok(nb_scaled_dot_product_attention(t[0], t[1], t[2], NULL, c->spec->layout != NULL,
                                                    0.0, NULL, 0.0));
  case BK_ATTN_FWDBWD: {
    const int nd = c->spec->layout && strstr(c->spec->layout, "_nd"), was = nb_deterministic();
    if (nd) nb_set_deterministic(0);
    y = nb_scaled_dot_product_attention(t[0], t[1], t[2], NULL, c->spec->layout != NULL, 0.0, NULL, 0.0);
    const nb_status st = y ? nb_autograd_grad(y, t[3], 3, t, g, 0) : bench_fail();
    if (nd) nb_set_deterministic(was);
    return st;
  }
  default: return NB_ERR_UNSUPPORTED;
  }
}
