/* dropout, scaled dot-product attention and triu/tril (linear is an entry
 * of its own, op_linear.c).
 * dropout is a kernel op whose mask is a function of (seed, offset), so its
 * backward recomputes the mask instead of storing it. Attention is one op
 * with its own kernels (flash attention: no (Lq, Lk) matrix, forward saves
 * o and the log-sum-exp, backward recomputes the probabilities), the
 * additive or boolean mask, dropout and grouped-query heads included; batch
 * axes that broadcast, a mask that requires grad, or a call a backend's
 * kernels lack run as a composition of differentiable ops (the reference).
 * triu/tril compose. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

static int float_ok(const char *op, const char *what, const nb_tensor *t) {
  if (nb_dtype_is_float(t->dtype)) return 1;
  char b[200];
  nb_error_set(NB_ERR_DTYPE, "%s: %s %s (expected a float tensor)", op, what, nb_describe(t, b, sizeof b));
  return 0;
}

/* ---- dropout --------------------------------------------------------------------- */
typedef struct {
  double p;
  uint64_t seed, offset; /* the mask is a function of these (Philox) */
} dropout_params;

extern const nb_op nb_op_dropout;

static nb_status dropout_infer(const nb_op_call *c, nb_meta *out) {
  const dropout_params *p = c->p;
  if (!float_ok("dropout", "input", c->in[0])) return nb_last_status();
  if (!(p->p >= 0 && p->p <= 1))
    return nb_error_set(NB_ERR_VALUE, "dropout: p = %g (expected a probability in [0, 1])", p->p);
  nb_meta_of(c->in[0], out);
  return NB_OK;
}

static nb_status dropout_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  const dropout_params *p = c->p;
  nb_kview ko, kx;
  nb_kview_of(out, &ko);
  nb_kview_of(c->in[0], &kx);
  return nb_backend_for(nb_device_of(out))->dropout(&ko, &kx, p->p, p->seed, p->offset);
}

/* The same mask (same seed and offset) applied to g: d(x*m/(1-p))/dx. */
static nb_status dropout_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(nb_op_run(&nb_op_dropout, 1, (const nb_tensor *const[]){g}, nb_node_params(n)));
  return gin[0] ? NB_OK : nb_last_status();
}

static const dropout_params dropout_bench = {0.1, 1, 0};
const nb_op nb_op_dropout = {
    .name = "dropout", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"x"},
    .psize = sizeof(dropout_params), .prec = NB_PREC_FOLLOW, .infer = dropout_infer,
    .forward = dropout_forward, .backward = dropout_bw, .bench_in = "r:16777216",
    .bench_p = &dropout_bench};

nb_tensor *nb_dropout(const nb_tensor *x, double p, nb_rng *rng) {
  if (!x) { nb_error_null("dropout", "x"); return NULL; }
  if (!float_ok("dropout", "input", x)) return NULL;
  if (!(p >= 0 && p <= 1)) {
    nb_error_set(NB_ERR_VALUE, "dropout: p = %g (expected a probability in [0, 1])", p);
    return NULL;
  }
  if (p == 0) return nb_autorelease(nb_retain((nb_tensor *)x));
  if (!rng) { nb_error_null("dropout", "rng"); return NULL; }
  dropout_params dp = {p, rng->seed, rng->offset};
  nb_tensor *out = nb_op_run(&nb_op_dropout, 1, (const nb_tensor *const[]){x}, &dp);
  if (out) rng->offset += (uint64_t)nb_numel(x);
  return out;
}

/* ---- triu / tril ---------------------------------------------------------------- */
/* Keeps x[..., i, j] where j - i >= k (upper) or j - i <= k (lower); the
 * mask broadcasts over the leading axes. */
static nb_tensor *band_op(const char *op, const nb_tensor *x, int64_t k, int upper) {
  if (!x) { nb_error_null(op, "x"); return NULL; }
  if (x->ndim < 2) {
    char b[200];
    nb_error_set(NB_ERR_SHAPE, "%s: input %s (expected at least 2 dimensions)", op, nb_describe(x, b, sizeof b));
    return NULL;
  }
  int64_t R = x->shape[x->ndim - 2], C = x->shape[x->ndim - 1];
  nb_device dev = nb_device_of(x);
  nb_scope_begin();
  nb_tensor *i = nb_reshape(nb_arange(0, (double)R, 1, NB_I64, dev), 2, (int64_t[]){R, 1});
  nb_tensor *j = nb_reshape(nb_arange(0, (double)C, 1, NB_I64, dev), 2, (int64_t[]){1, C});
  nb_tensor *d = nb_sub(j, i), *kk = nb_scalar((double)k, NB_I64, dev);
  nb_tensor *keep = upper ? nb_ge(d, kk) : nb_le(d, kk);
  nb_tensor *y = nb_keep(nb_where(keep, x, nb_scalar(0.0, x->dtype, dev)));
  nb_scope_end();
  return nb_autorelease(y);
}

nb_tensor *nb_triu(const nb_tensor *x, int64_t k) { return band_op("triu", x, k, 1); }
nb_tensor *nb_tril(const nb_tensor *x, int64_t k) { return band_op("tril", x, k, 0); }

/* ---- scaled dot-product attention --------------------------------------------- */
/* Grouped-query heads: q (.., Hq, Lq, D), k and v (.., Hkv, Lk, D) of one
 * rank with Hkv > 1 and Hq != Hkv on axis -3 (Hkv = 1 broadcasts). Returns
 * G = Hq / Hkv, 1 when the call is not grouped, 0 (error set) when Hq is
 * not a multiple of Hkv. */
static int64_t sdpa_group(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v) {
  int nd = q->ndim;
  if (nd < 3 || k->ndim != nd || v->ndim != nd) return 1;
  int64_t hq = q->shape[nd - 3], hk = k->shape[nd - 3], hv = v->shape[nd - 3];
  if (hk == hq || hk <= 1 || hq == 1) return 1;
  if (hv == hk && hq % hk == 0) return hq / hk;
  char b1[200], b2[200], b3[200];
  nb_error_set(NB_ERR_SHAPE, "scaled_dot_product_attention: q %s, k %s, v %s: %lld query heads "
               "and %lld, %lld kv heads on axis -3 (grouped-query attention needs k and v with "
               "one head count that divides q's)", nb_describe(q, b1, sizeof b1),
               nb_describe(k, b2, sizeof b2), nb_describe(v, b3, sizeof b3), (long long)hq,
               (long long)hk, (long long)hv);
  return 0;
}

/* The shapes' contract; k's and v's head axis counts G times (grouped). */
static int sdpa_shapes_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v,
                          const nb_tensor *mask, int64_t G) {
  char b1[200], b2[200], b3[200], b4[200];
  int64_t batch[NB_MAX_DIMS], scores[NB_MAX_DIMS], tmp[NB_MAX_DIMS];
  int64_t ks[NB_MAX_DIMS], vs[NB_MAX_DIMS];
  int ok = q->ndim >= 2 && k->ndim >= 2 && v->ndim >= 2 &&
           q->shape[q->ndim - 1] == k->shape[k->ndim - 1] &&
           k->shape[k->ndim - 2] == v->shape[v->ndim - 2];
  memcpy(ks, k->shape, (size_t)k->ndim * sizeof ks[0]);
  memcpy(vs, v->shape, (size_t)v->ndim * sizeof vs[0]);
  if (G > 1) ks[k->ndim - 3] *= G, vs[v->ndim - 3] *= G;
  int nb = ok ? nb_broadcast_shapes(q->ndim - 2, q->shape, k->ndim - 2, ks, batch) : -1;
  nb = nb < 0 ? -1 : nb_broadcast_shapes(nb, batch, v->ndim - 2, vs, batch);
  if (nb < 0 || nb + 2 > NB_MAX_DIMS) {
    nb_error_set(NB_ERR_SHAPE, "scaled_dot_product_attention: q %s, k %s, v %s do not match "
                 "(expected q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv) with broadcastable "
                 "batch axes)", nb_describe(q, b1, sizeof b1), nb_describe(k, b2, sizeof b2),
                 nb_describe(v, b3, sizeof b3));
    return 0;
  }
  memcpy(scores, batch, (size_t)nb * sizeof batch[0]);
  scores[nb] = q->shape[q->ndim - 2];
  scores[nb + 1] = k->shape[k->ndim - 2];
  int nm = mask ? nb_broadcast_shapes(mask->ndim, mask->shape, nb + 2, scores, tmp) : 0;
  if (mask && (nm != nb + 2 || memcmp(tmp, scores, (size_t)nm * sizeof tmp[0]))) {
    nb_error_set(NB_ERR_SHAPE, "scaled_dot_product_attention: mask %s does not broadcast to the "
                 "scores' shape %s", nb_describe(mask, b4, sizeof b4),
                 nb_shape_str(nb + 2, scores, b1, sizeof b1));
    return 0;
  }
  return 1;
}

static int sdpa_args_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v,
                        const nb_tensor *mask, double p, const nb_rng *rng) {
  const char *op = "scaled_dot_product_attention";
  if (!float_ok(op, "q", q) || !float_ok(op, "k", k) || !float_ok(op, "v", v)) return 0;
  if (mask && mask->dtype != NB_BOOL && !float_ok(op, "mask (additive float or bool)", mask)) return 0;
  if (nb_op_same_device(op, 4, (const nb_tensor *const[]){q, k, v, mask})) return 0;
  if (!(p >= 0 && p <= 1)) {
    nb_error_set(NB_ERR_VALUE, "%s: dropout_p = %g (expected a probability in [0, 1])", op, p);
    return 0;
  }
  if (p > 0 && !rng) { nb_error_null(op, "rng"); return 0; }
  int64_t G = sdpa_group(q, k, v);
  return G && sdpa_shapes_ok(q, k, v, mask, G);
}

/* True above the diagonal of (Lq, Lk), aligned top-left (torch's is_causal). */
static nb_tensor *causal_block(int64_t Lq, int64_t Lk, nb_device dev) {
  nb_tensor *i = nb_reshape(nb_arange(0, (double)Lq, 1, NB_I64, dev), 2, (int64_t[]){Lq, 1});
  nb_tensor *j = nb_reshape(nb_arange(0, (double)Lk, 1, NB_I64, dev), 2, (int64_t[]){1, Lk});
  return nb_gt(j, i);
}

/* ---- attention as one op (flash attention) ---------------------------------- */
typedef struct {
  int causal;
  double scale;
  double dropout_p; /* 0: none; the mask of elements (seed, offset + index) */
  uint64_t seed, offset;
} att_params;
/* The forward entry's inputs (mask optional) and saved tensors: its output
 * o, then the log-sum-exp. */
enum { ATT_FWD_MASK = 3 };
enum { ATT_SAVED_O, ATT_SAVED_LSE };
/* The backward entry's inputs (mask optional); its outputs are dq, dk, dv. */
enum { ATT_IN_DY, ATT_IN_Q, ATT_IN_K, ATT_IN_V, ATT_IN_O, ATT_IN_LSE, ATT_IN_MASK };

extern const nb_op nb_op_scaled_dot_product_attention, nb_op_scaled_dot_product_attention_backward;

const nb_tensor *nb_attention_rows(const nb_tensor *t) {
  return t->strides[t->ndim - 1] == 1 || t->shape[t->ndim - 1] <= 1 ? t : nb_contiguous(t);
}

/* The kernels' contract: q (.., Lq, D), k (.., Lk, D), v (.., Lk, Dv), one
 * float dtype, the same batch axes but for grouped-query heads (k and v
 * with Hkv heads on axis -3 where q has a multiple of Hkv; Hkv = 1 too:
 * multi-query). nb_scaled_dot_product_attention composes the other cases. */
static int att_contract_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v) {
  int nd = q->ndim;
  if (!(nb_dtype_is_float(q->dtype) && k->dtype == q->dtype && v->dtype == q->dtype && nd >= 2 &&
        k->ndim == nd && v->ndim == nd && q->shape[nd - 1] == k->shape[nd - 1] &&
        k->shape[nd - 2] == v->shape[nd - 2] &&
        !memcmp(k->shape, v->shape, (size_t)(nd - 2) * sizeof q->shape[0])))
    return 0;
  for (int d = 0; d < nd - 2; d++) {
    int64_t a = q->shape[d], b = k->shape[d];
    if (a != b && !(d == nd - 3 && b > 0 && b < a && a % b == 0)) return 0;
  }
  return 1;
}

/* The scores' shape: q's batch axes, Lq, Lk (nd values). */
static void att_scores_shape(const nb_tensor *q, const nb_tensor *k, int64_t *shape) {
  int nd = q->ndim;
  memcpy(shape, q->shape, (size_t)(nd - 1) * sizeof shape[0]);
  shape[nd - 1] = k->shape[nd - 2];
}

/* A mask the kernels take: bool or float, broadcasting to the scores. */
static int att_mask_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *mask) {
  if (!mask) return 1;
  int64_t sh[NB_MAX_DIMS];
  nb_kview km;
  att_scores_shape(q, k, sh);
  return (mask->dtype == NB_BOOL || nb_dtype_is_float(mask->dtype)) &&
         !nb_kview_broadcast(mask, q->ndim, sh, &km);
}

static nb_status att_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2], *mask = c->n > 3 ? c->in[3] : NULL;
  char b1[200], b2[200], b3[200], b4[200];
  int nd = q->ndim;
  if (!att_contract_ok(q, k, v))
    return nb_error_set(NB_ERR_SHAPE, "%s: q %s, k %s, v %s (expected one float dtype, q (..., Lq, D), "
                        "k (..., Lk, D), v (..., Lk, Dv) with the same batch axes, k and v's "
                        "head axis -3 dividing q's)", c->op->name,
                        nb_describe(q, b1, sizeof b1), nb_describe(k, b2, sizeof b2),
                        nb_describe(v, b3, sizeof b3));
  if (!att_mask_ok(q, k, mask))
    return nb_error_set(NB_ERR_SHAPE, "%s: mask %s with q %s, k %s (expected bool or float, "
                        "broadcasting to (..., Lq, Lk))", c->op->name, nb_describe(mask, b4, sizeof b4),
                        nb_describe(q, b1, sizeof b1), nb_describe(k, b2, sizeof b2));
  nb_meta_of(q, out);
  out->shape[nd - 1] = v->shape[nd - 1];
  return NB_OK;
}

static nb_status att_prepare(const nb_op_call *c, const nb_tensor **in) {
  for (int i = 0; i < 3; i++)
    if (!(in[i] = nb_attention_rows(c->in[i]))) return nb_last_status();
  return NB_OK;
}

/* The kernels' extra arguments: the mask broadcast to the scores (into
 * *km) and the dropout; NULL when neither. */
static const nb_attn_extra *att_extra(const att_params *p, const nb_tensor *q, const nb_tensor *k,
                                      const nb_tensor *mask, nb_kview *km, nb_attn_extra *x) {
  if (!mask && !(p->dropout_p > 0)) return NULL;
  x->mask = NULL;
  if (mask) {
    int64_t sh[NB_MAX_DIMS];
    att_scores_shape(q, k, sh);
    nb_kview_broadcast(mask, q->ndim, sh, km);
    x->mask = km;
  }
  x->dropout_p = p->dropout_p;
  x->seed = p->seed;
  x->offset = p->offset;
  return x;
}

/* o from the fused kernel, and the saved log-sum-exp (.., Lq) in aux[0]
 * (f32, f64 for f64). NB_ERR_UNSUPPORTED when the backend lacks the head
 * dimension: the public function then composes. */
static nb_status att_forward(const nb_op_call *c, nb_tensor *o, nb_tensor **aux) {
  const att_params *p = c->p;
  const nb_tensor *q = c->in[0];
  nb_device dev = nb_device_of(q);
  nb_tensor *lse = aux[0] = nb_tensor_alloc(q->ndim - 1, q->shape, q->dtype == NB_F64 ? NB_F64 : NB_F32, dev);
  if (!lse) return nb_last_status();
  if (!nb_numel(o)) return NB_OK; /* Lq = 0: the backward still needs an (empty) lse */
  nb_kview ko, kl, kq, kk, kv, km;
  nb_attn_extra xs;
  nb_kview_of(o, &ko); nb_kview_of(lse, &kl);
  nb_kview_of(q, &kq); nb_kview_of(c->in[1], &kk); nb_kview_of(c->in[2], &kv);
  const nb_attn_extra *x = att_extra(p, q, c->in[1], c->n > 3 ? c->in[ATT_FWD_MASK] : NULL, &km, &xs);
  return nb_backend_for(dev)->attn_fwd(&ko, &kl, &kq, &kk, &kv, p->scale, p->causal, x);
}

static nb_status att_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *in[7] = {g, n->inputs[0], n->inputs[1], n->inputs[2], n->saved[ATT_SAVED_O],
                            n->saved[ATT_SAVED_LSE], n->n_inputs > 3 ? n->inputs[3] : NULL};
  nb_tensor *d[3];
  nb_status st = nb_op_run_outs(&nb_op_scaled_dot_product_attention_backward, 7, in,
                                nb_node_params(n), d);
  for (int i = 0; i < 3 && !st; i++)
    if (nb_node_needs_grad(n, i)) gin[i] = nb_retain(d[i]);
  return st;
}

static nb_status att_backward_infer(const nb_op_call *c, nb_meta *out) {
  nb_meta_of(c->in[ATT_IN_Q], out);
  return NB_OK;
}

static nb_status att_backward_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[ATT_IN_DY] = nb_cast(c->in[ATT_IN_DY], c->in[ATT_IN_Q]->dtype);
  for (int i = ATT_IN_DY; i <= ATT_IN_V; i++)
    if (!in[i] || !(in[i] = nb_attention_rows(in[i]))) return nb_last_status();
  return NB_OK;
}

/* dq into out, dk and dv into aux[0], aux[1], from one backward call. */
static nb_status att_backward_forward(const nb_op_call *c, nb_tensor *dq, nb_tensor **aux) {
  const att_params *p = c->p;
  const nb_tensor *k = c->in[ATT_IN_K], *v = c->in[ATT_IN_V];
  nb_device dev = nb_device_of(dq);
  nb_tensor *dk = aux[0] = nb_tensor_alloc(k->ndim, k->shape, k->dtype, dev);
  nb_tensor *dv = aux[1] = nb_tensor_alloc(v->ndim, v->shape, v->dtype, dev);
  if (!dk || !dv) return nb_last_status();
  if (!nb_numel(dq) && !nb_numel(dk) && !nb_numel(dv)) return NB_OK;
  nb_kview kdq, kdk, kdv, kg, kq, kk, kv, ko, kl, km;
  nb_attn_extra xs;
  nb_kview_of(dq, &kdq); nb_kview_of(dk, &kdk); nb_kview_of(dv, &kdv);
  nb_kview_of(c->in[ATT_IN_DY], &kg); nb_kview_of(c->in[ATT_IN_Q], &kq);
  nb_kview_of(k, &kk); nb_kview_of(v, &kv);
  nb_kview_of(c->in[ATT_IN_O], &ko); nb_kview_of(c->in[ATT_IN_LSE], &kl);
  const nb_attn_extra *x = att_extra(p, c->in[ATT_IN_Q], k, c->n > ATT_IN_MASK ? c->in[ATT_IN_MASK] : NULL,
                                     &km, &xs);
  return nb_backend_for(dev)->attn_bwd(&kdq, &kdk, &kdv, &kg, &kq, &kk, &kv, &ko, &kl, p->scale,
                                       p->causal, x);
}

/* 4 Lq Lk D FLOPs forward (two products), halved when causal; backward
 * 2.5 times that (five products, the probabilities recomputed). */
static double att_flops(const nb_tensor *q, const nb_tensor *k, int causal) {
  int nd = q->ndim;
  double f = 4.0 * (double)nb_numel(q) * (double)k->shape[nd - 2];
  return causal ? f / 2 : f;
}
static void att_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  *bytes = nb_op_io_bytes(c, out);
  *flops = att_flops(c->in[0], c->in[1], ((const att_params *)c->p)->causal);
}
static void att_backward_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  const nb_tensor *k = c->in[ATT_IN_K], *v = c->in[ATT_IN_V];
  *bytes = nb_op_io_bytes(c, out) + (double)(nb_numel(k) * nb_dtype_size(k->dtype)) +
           (double)(nb_numel(v) * nb_dtype_size(v->dtype)); /* + dk, dv */
  *flops = 2.5 * att_flops(c->in[ATT_IN_Q], k, ((const att_params *)c->p)->causal);
}

static const att_params att_bench = {1, 0.08838834764831845, 0, 0, 0};
#define ATT_BENCH "r:4x16x4096x128,r:4x16x4096x128,r:4x16x4096x128"
const nb_op nb_op_scaled_dot_product_attention = {
    .name = "scaled_dot_product_attention", .kind = NB_OPK_CONTRACT, .n_in = 4, .n_opt = 1,
    .in_names = {"q", "k", "v", "mask"}, .psize = sizeof(att_params), .prec = NB_PREC_LOW,
    .determinism = "fixed-order sums on every path (no atomics)", .infer = att_infer,
    .prepare = att_prepare, .forward = att_forward, .always_forward = 1, .backward = att_bw,
    .save_out = 1,
    .cost = att_cost, .bench_in = ATT_BENCH ",-", .bench_p = &att_bench};
const nb_op nb_op_scaled_dot_product_attention_backward = {
    .name = "scaled_dot_product_attention_backward", .kind = NB_OPK_CONTRACT, .n_in = 7,
    .n_opt = 1, .n_out = 3, .in_names = {"dy", "q", "k", "v", "o", "lse", "mask"}, .psize = sizeof(att_params),
    .prec = NB_PREC_LOW, .determinism = "dq, dk, dv summed in a fixed order (no atomics); after nb_set_deterministic(0) "
                   "the sm_90a kernels add dq by bulk reduce-add, in no fixed order",
    .infer = att_backward_infer, .prepare = att_backward_prepare,
    .forward = att_backward_forward, .always_forward = 1, .backward = nb_no_double_backward,
    .cost = att_backward_cost,
    .bench_in = "r:4x16x4096x128," ATT_BENCH ",r:4x16x4096x128,s:4x16x4096,-",
    .bench_p = &att_bench};

/* NABLA_ATTENTION: "composed" or "fused" forces a path (for comparisons and
 * tests; read on every call, so a test can switch); unset, the policy below. */
static int att_forced(void) {
  const char *e = getenv("NABLA_ATTENTION");
  return e && !strcmp(e, "composed") ? 1 : e && !strcmp(e, "fused") ? 2 : 0;
}

/* Whether the fused kernels take this call: one dtype, q, k, v's batch
 * axes equal but for grouped-query heads, a head dimension, a mask that
 * does not require grad (its gradient would be the (Lq, Lk) matrix dS; the
 * composition computes it) and broadcasts to the scores, any dropout. On
 * CUDA the mask, dropout and grouped heads run in both kernel families;
 * bf16 and f16 with head dimension 64, 96 or 128 (D == Dv) always take
 * it: the tensor-core kernel there is far faster than the composition.
 * Other CUDA calls run the portable SIMT kernel, so those whose (.., Lq, Lk)
 * scores would take under 128 MiB compose instead: there the tensor-core
 * products of the composition are faster (train-compare's model in f32,
 * H100: 274k tokens/s fused, 329k composed), and the scores are small;
 * above it the fused kernel keeps memory O(L) (GPT-2 small's shape needs
 * it). attention_qkv (op_attention_qkv.c) asks the same. */
int nb_attention_fused_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v,
                          const nb_tensor *mask, double p) {
  int forced = att_forced();
  if (forced == 1 || !att_contract_ok(q, k, v) || !att_mask_ok(q, k, mask)) return 0;
  if (mask && nb_requires_grad(mask)) return 0;
  if (q->shape[q->ndim - 1] <= 0 || k->shape[k->ndim - 2] <= 0) return 0;
  if (forced == 2 || nb_device_of(q).type != NB_CUDA) return 1;
  int64_t D = q->shape[q->ndim - 1];
  if ((q->dtype == NB_BF16 || q->dtype == NB_F16) && v->shape[v->ndim - 1] == D &&
      (D == 64 || D == 96 || D == 128))
    return 1;
  double scores = (double)nb_numel(q) / (double)q->shape[q->ndim - 1] * (double)k->shape[k->ndim - 2];
  (void)p;
  return scores * (double)nb_dtype_size(q->dtype) >= (double)(128 << 20);
}

/* k or v (.., Hkv, L, E) with each head repeated G times in place, (.., Hkv
 * G, L, E): grouped-query heads for the composition. */
static nb_tensor *att_repeat_heads(const nb_tensor *t, int64_t G) {
  int nd = t->ndim;
  int64_t sh[NB_MAX_DIMS + 1];
  memcpy(sh, t->shape, (size_t)(nd - 2) * sizeof sh[0]);
  sh[nd - 2] = G, sh[nd - 1] = t->shape[nd - 2], sh[nd] = t->shape[nd - 1];
  nb_tensor *e = nb_expand(nb_unsqueeze(t, nd - 2), nd + 1, sh);
  memcpy(sh, t->shape, (size_t)nd * sizeof sh[0]);
  sh[nd - 3] *= G;
  return nb_reshape(e, nd, sh);
}

/* softmax(q k^T * scale + mask) @ v; a bool mask keeps where true. */
nb_tensor *nb_scaled_dot_product_attention(const nb_tensor *q, const nb_tensor *k,
                                           const nb_tensor *v, const nb_tensor *mask,
                                           int causal, double dropout_p, nb_rng *rng,
                                           double scale) {
  const char *op = "scaled_dot_product_attention";
  if (!q) { nb_error_null(op, "q"); return NULL; }
  if (!k) { nb_error_null(op, "k"); return NULL; }
  if (!v) { nb_error_null(op, "v"); return NULL; }
  if (!sdpa_args_ok(q, k, v, mask, dropout_p, rng)) return NULL;
  int64_t D = q->shape[q->ndim - 1], Lq = q->shape[q->ndim - 2], Lk = k->shape[k->ndim - 2];
  if (!(scale > 0)) scale = 1.0 / sqrt((double)(D ? D : 1));
  nb_device dev = nb_device_of(q);
  if (nb_attention_fused_ok(q, k, v, mask, dropout_p)) {
    att_params p = {causal, scale, dropout_p > 0 ? dropout_p : 0, rng ? rng->seed : 0,
                    rng ? rng->offset : 0};
    nb_tensor *y = nb_op_run(&nb_op_scaled_dot_product_attention, 4,
                             (const nb_tensor *const[]){q, k, v, mask}, &p);
    if (y && dropout_p > 0) rng->offset += (uint64_t)(nb_numel(q) / D * Lk); /* as nb_dropout */
    if (y || nb_last_status() != NB_ERR_UNSUPPORTED) return y;
    nb_clear_error();
  }
  nb_scope_begin();
  int64_t G = sdpa_group(q, k, v);
  if (G > 1) k = att_repeat_heads(k, G), v = att_repeat_heads(v, G);
  nb_tensor *s = nb_mul_scalar(nb_matmul(q, nb_transpose(k, -1, -2)), scale);
  nb_tensor *ninf = s ? nb_scalar(-INFINITY, s->dtype, dev) : NULL;
  if (causal) s = nb_where(causal_block(Lq, Lk, dev), ninf, s);
  if (mask && mask->dtype == NB_BOOL) s = nb_where(mask, s, ninf);
  else if (mask && s) s = nb_add(s, nb_cast(mask, s->dtype));
  nb_tensor *a = nb_softmax(s, -1);
  if (dropout_p > 0) a = nb_dropout(a, dropout_p, rng);
  nb_tensor *y = nb_keep(nb_matmul(a, v));
  nb_scope_end();
  return nb_autorelease(y);
}
