/* linear, dropout, scaled dot-product attention and triu/tril.
 * dropout is a kernel op whose mask is a function of (seed, offset), so its
 * backward recomputes the mask instead of storing it. Attention without a
 * mask or dropout is one op with its own kernels (flash attention: no
 * (Lq, Lk) matrix, forward saves o and the log-sum-exp, backward recomputes
 * the probabilities); with a mask or dropout, or batch axes that broadcast,
 * it is a composition of differentiable ops. linear and triu/tril compose. */
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

/* ---- linear ------------------------------------------------------------------ */
nb_tensor *nb_linear(const nb_tensor *x, const nb_tensor *weight, const nb_tensor *bias) {
  if (!x) { nb_error_null("linear", "x"); return NULL; }
  if (!weight) { nb_error_null("linear", "weight"); return NULL; }
  if (!float_ok("linear", "input", x) || !float_ok("linear", "weight", weight) ||
      (bias && !float_ok("linear", "bias", bias)))
    return NULL;
  if (nb_op_same_device("linear", 3, (const nb_tensor *const[]){x, weight, bias})) return NULL;
  char b1[200], b2[200], b3[200];
  if (x->ndim < 1 || weight->ndim != 2 || x->shape[x->ndim - 1] != weight->shape[1]) {
    nb_error_set(NB_ERR_SHAPE, "linear: input %s and weight %s do not match (expected input "
                 "(..., in) and weight (out, in))", nb_describe(x, b1, sizeof b1),
                 nb_describe(weight, b2, sizeof b2));
    return NULL;
  }
  if (bias && (bias->ndim != 1 || bias->shape[0] != weight->shape[0])) {
    nb_error_set(NB_ERR_SHAPE, "linear: bias %s for weight %s (expected shape [%lld])",
                 nb_describe(bias, b3, sizeof b3), nb_describe(weight, b2, sizeof b2),
                 (long long)weight->shape[0]);
    return NULL;
  }
  nb_scope_begin();
  nb_tensor *y = nb_matmul(x, nb_transpose(weight, 0, 1)); /* reads W transposed in place */
  if (bias) y = nb_add(y, bias);
  y = nb_keep(y);
  nb_scope_end();
  return nb_autorelease(y);
}

/* ---- dropout --------------------------------------------------------------------- */
enum { DROP_IP_SEED, DROP_IP_OFFSET };

static nb_tensor *dropout_apply(const nb_tensor *x, double p, uint64_t seed, uint64_t offset);

/* The same mask (same seed and offset) applied to g: d(x*m/(1-p))/dx. */
static nb_status dropout_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(dropout_apply(g, n->dp[0], (uint64_t)n->ip[DROP_IP_SEED],
                                   (uint64_t)n->ip[DROP_IP_OFFSET]));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_tensor *dropout_apply(const nb_tensor *x, double p, uint64_t seed, uint64_t offset) {
  nb_tensor *out = nb_tensor_alloc(x->ndim, x->shape, x->dtype, nb_device_of(x));
  if (!out) return NULL;
  nb_kview ko, kx;
  nb_kview_of(out, &ko);
  nb_kview_of(x, &kx);
  if (nb_numel(out) && nb_backend_for(nb_device_of(x))->dropout(&ko, &kx, p, seed, offset)) {
    nb_release(out);
    return NULL;
  }
  nb_node *n = nb_record("dropout", dropout_bw, 1, (const nb_tensor *const[]){x}, out);
  if (n) {
    n->ip[DROP_IP_SEED] = (int64_t)seed;
    n->ip[DROP_IP_OFFSET] = (int64_t)offset;
    n->dp[0] = p;
  }
  return nb_autorelease(out);
}

nb_tensor *nb_dropout(const nb_tensor *x, double p, nb_rng *rng) {
  if (!x) { nb_error_null("dropout", "x"); return NULL; }
  if (!float_ok("dropout", "input", x)) return NULL;
  if (!(p >= 0 && p <= 1)) {
    nb_error_set(NB_ERR_VALUE, "dropout: p = %g (expected a probability in [0, 1])", p);
    return NULL;
  }
  if (p == 0) return nb_autorelease(nb_retain((nb_tensor *)x));
  if (!rng) { nb_error_null("dropout", "rng"); return NULL; }
  nb_tensor *out = dropout_apply(x, p, rng->seed, rng->offset);
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
static int sdpa_shapes_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v,
                          const nb_tensor *mask) {
  char b1[200], b2[200], b3[200], b4[200];
  int64_t batch[NB_MAX_DIMS], scores[NB_MAX_DIMS], tmp[NB_MAX_DIMS];
  int ok = q->ndim >= 2 && k->ndim >= 2 && v->ndim >= 2 &&
           q->shape[q->ndim - 1] == k->shape[k->ndim - 1] &&
           k->shape[k->ndim - 2] == v->shape[v->ndim - 2];
  int nb = ok ? nb_broadcast_shapes(q->ndim - 2, q->shape, k->ndim - 2, k->shape, batch) : -1;
  nb = nb < 0 ? -1 : nb_broadcast_shapes(nb, batch, v->ndim - 2, v->shape, batch);
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
  return sdpa_shapes_ok(q, k, v, mask);
}

/* True above the diagonal of (Lq, Lk), aligned top-left (torch's is_causal). */
static nb_tensor *causal_block(int64_t Lq, int64_t Lk, nb_device dev) {
  nb_tensor *i = nb_reshape(nb_arange(0, (double)Lq, 1, NB_I64, dev), 2, (int64_t[]){Lq, 1});
  nb_tensor *j = nb_reshape(nb_arange(0, (double)Lk, 1, NB_I64, dev), 2, (int64_t[]){1, Lk});
  return nb_gt(j, i);
}

/* ---- attention as one op (flash attention) ---------------------------------- */
enum { ATT_SAVED_O, ATT_SAVED_LSE };
enum { ATT_IP_CAUSAL };
enum { ATT_DP_SCALE };

/* t itself when its last axis has stride 1 (what the kernels read), else a
 * contiguous copy (autoreleased). */
static const nb_tensor *att_rows(const nb_tensor *t) {
  return t->strides[t->ndim - 1] == 1 || t->shape[t->ndim - 1] <= 1 ? t : nb_contiguous(t);
}

/* NABLA_ATTENTION: "composed" or "fused" forces a path (for comparisons and
 * tests); unset, the policy below. */
static int att_forced(void) {
  static int forced = -1; /* 0: policy, 1: composed, 2: fused */
  if (forced < 0) {
    const char *e = getenv("NABLA_ATTENTION");
    forced = e && !strcmp(e, "composed") ? 1 : e && !strcmp(e, "fused") ? 2 : 0;
  }
  return forced;
}

/* Whether the fused kernels take this call: no mask or dropout, one dtype,
 * the same batch axes on q, k and v (no broadcasting), a head dimension.
 * On CUDA, bf16 and f16 with head dimension 64, 96 or 128 (D == Dv) always
 * take it: the tensor-core kernel there is far faster than the composition.
 * Other CUDA calls run the portable SIMT kernel, so those whose (.., Lq, Lk)
 * scores would take under 128 MiB compose instead: there the tensor-core
 * products of the composition are faster (train-compare's model in f32,
 * H100: 274k tokens/s fused, 329k composed), and the scores are small;
 * above it the fused kernel keeps memory O(L) (GPT-2 small's shape needs
 * it). */
static int att_fused_ok(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v,
                        const nb_tensor *mask, double p) {
  int forced = att_forced();
  if (forced == 1 || mask || p > 0) return 0;
  if (k->dtype != q->dtype || v->dtype != q->dtype) return 0;
  if (k->ndim != q->ndim || v->ndim != q->ndim) return 0;
  if (memcmp(k->shape, q->shape, (size_t)(q->ndim - 2) * sizeof q->shape[0]) ||
      memcmp(v->shape, q->shape, (size_t)(q->ndim - 2) * sizeof q->shape[0]))
    return 0;
  if (q->shape[q->ndim - 1] <= 0 || k->shape[k->ndim - 2] <= 0) return 0;
  if (forced == 2 || nb_device_of(q).type != NB_CUDA) return 1;
  int64_t D = q->shape[q->ndim - 1];
  if ((q->dtype == NB_BF16 || q->dtype == NB_F16) && v->shape[v->ndim - 1] == D &&
      (D == 64 || D == 96 || D == 128))
    return 1;
  double scores = (double)nb_numel(q) / (double)q->shape[q->ndim - 1] * (double)k->shape[k->ndim - 2];
  return scores * (double)nb_dtype_size(q->dtype) >= (double)(128 << 20);
}

static nb_status att_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2];
  nb_device dev = nb_device_of(q);
  nb_tensor *d[3] = {NULL, NULL, NULL};
  nb_status st = NB_OK;
  nb_scope_begin();
  const nb_tensor *gr = att_rows(nb_cast(g, q->dtype));
  const nb_tensor *qr = att_rows(q), *kr = att_rows(k), *vr = att_rows(v);
  if (!gr || !qr || !kr || !vr) st = nb_last_status();
  for (int i = 0; i < 3 && !st; i++) {
    const nb_tensor *in = n->inputs[i];
    if (!(d[i] = nb_tensor_alloc(in->ndim, in->shape, in->dtype, dev))) st = nb_last_status();
  }
  if (!st && nb_numel(d[0]) + nb_numel(d[1]) + nb_numel(d[2])) {
    nb_kview kdq, kdk, kdv, kg, kq, kk, kv, ko, kl;
    nb_kview_of(d[0], &kdq); nb_kview_of(d[1], &kdk); nb_kview_of(d[2], &kdv);
    nb_kview_of(gr, &kg); nb_kview_of(qr, &kq); nb_kview_of(kr, &kk); nb_kview_of(vr, &kv);
    nb_kview_of(n->saved[ATT_SAVED_O], &ko); nb_kview_of(n->saved[ATT_SAVED_LSE], &kl);
    st = nb_backend_for(dev)->attn_bwd(&kdq, &kdk, &kdv, &kg, &kq, &kk, &kv, &ko, &kl,
                                       n->dp[ATT_DP_SCALE], (int)n->ip[ATT_IP_CAUSAL]);
  }
  for (int i = 0; i < 3 && !st; i++) {
    nb_record("scaled_dot_product_attention_backward", nb_no_double_backward, 4,
              (const nb_tensor *const[]){gr, q, k, v}, d[i]);
    if (nb_node_needs_grad(n, i)) gin[i] = nb_retain(d[i]);
  }
  nb_scope_end();
  for (int i = 0; i < 3; i++) nb_release(d[i]);
  return st;
}

/* o (.., Lq, Dv, autoreleased) and the saved lse (.., Lq) from the fused
 * kernel; NULL with NB_ERR_UNSUPPORTED when the backend lacks this head
 * dimension. */
static nb_tensor *att_fused(const nb_tensor *q, const nb_tensor *k, const nb_tensor *v,
                            int causal, double scale) {
  nb_device dev = nb_device_of(q);
  int nd = q->ndim;
  int64_t shape[NB_MAX_DIMS];
  memcpy(shape, q->shape, (size_t)nd * sizeof shape[0]);
  shape[nd - 1] = v->shape[nd - 1];
  nb_tensor *o = nb_tensor_alloc(nd, shape, q->dtype, dev);
  nb_tensor *lse = nb_autorelease(nb_tensor_alloc(nd - 1, shape, q->dtype == NB_F64 ? NB_F64 : NB_F32, dev));
  const nb_tensor *qr = att_rows(q), *kr = att_rows(k), *vr = att_rows(v);
  if (!o || !lse || !qr || !kr || !vr) { nb_release(o); return NULL; }
  if (nb_numel(o)) {
    nb_kview ko, kl, kq, kk, kv;
    nb_kview_of(o, &ko); nb_kview_of(lse, &kl);
    nb_kview_of(qr, &kq); nb_kview_of(kr, &kk); nb_kview_of(vr, &kv);
    if (nb_backend_for(dev)->attn_fwd(&ko, &kl, &kq, &kk, &kv, scale, causal)) {
      nb_release(o);
      return NULL;
    }
  }
  nb_node *n = nb_record("scaled_dot_product_attention", att_bw, 3,
                         (const nb_tensor *const[]){q, k, v}, o);
  if (n) {
    n->ip[ATT_IP_CAUSAL] = causal;
    n->dp[ATT_DP_SCALE] = scale;
    nb_node_save(n, ATT_SAVED_O, o);
    nb_node_save(n, ATT_SAVED_LSE, lse);
  }
  return nb_autorelease(o);
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
  if (att_fused_ok(q, k, v, mask, dropout_p)) {
    nb_scope_begin();
    nb_tensor *y = att_fused(q, k, v, causal, scale);
    int composes = !y && nb_last_status() == NB_ERR_UNSUPPORTED;
    y = nb_keep(y);
    nb_scope_end();
    if (!composes) return nb_autorelease(y);
    nb_clear_error();
  }
  nb_scope_begin();
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
