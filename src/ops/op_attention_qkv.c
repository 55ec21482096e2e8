/* Self-attention on a packed qkv projection (FlashAttention's qkv-packed
 * form): one op whose input is the projection itself.
 *
 * Layout: qkv (..., T, 3 H D), the last axis holding q, k and v as its three
 * thirds, each (H, D) with the head major: q[.., t, h, d] = qkv[.., t,
 * h D + d], k at H D + h D + d, v at 2 H D + h D + d (a linear layer of
 * width 3 C, C = H D, split as PyTorch's and llm.c's GPT-2 split it). The
 * output is (..., T, H D), heads side by side the same way, ready for the
 * output projection.
 *
 * The kernels are scaled_dot_product_attention's (op_attention.c): forward
 * reads q, k and v through strided (..., H, T, D) views of qkv and writes o
 * through a (..., H, T, D) view of the output, so neither side is copied;
 * the backward writes dq, dk and dv through the same views of one
 * (..., T, 3 H D) gradient (no zero fills, adds or re-layout copies, which
 * selecting q, k, v from a permuted view costs in backward). Same
 * determinism (no atomics), the same saved tensors (o and the f32
 * log-sum-exp), the same precision class (low: under autocast the
 * projection runs in bf16/f16). Calls the fused kernels do not take (the
 * policy nb_attention_fused_ok: on CUDA f32 with small scores, a head
 * dimension over the kernels' 256) compose through
 * nb_scaled_dot_product_attention on the views. */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

typedef struct {
  int heads, causal;
  double scale; /* > 0; the public function resolves <= 0 to 1/sqrt(D) */
} qkv_params;

/* The forward entry's saved tensors: its output o, then the log-sum-exp. */
enum { QKV_SAVED_O, QKV_SAVED_LSE };
/* The backward entry's inputs. */
enum { QKV_IN_DY, QKV_IN_QKV, QKV_IN_O, QKV_IN_LSE };

extern const nb_op nb_op_attention_qkv, nb_op_attention_qkv_backward;

/* qkv a float tensor (..., T, 3 H D) with H = heads >= 1 and D >= 1, and one
 * axis to spare for the heads. */
static nb_status qkv_check(const char *op, const nb_tensor *qkv, int heads) {
  char b[200];
  if (!nb_dtype_is_float(qkv->dtype))
    return nb_error_set(NB_ERR_DTYPE, "%s: qkv %s (expected a float tensor)", op,
                        nb_describe(qkv, b, sizeof b));
  int nd = qkv->ndim;
  int64_t c3 = nd >= 2 ? qkv->shape[nd - 1] : 0;
  if (nd < 2 || nd + 1 > NB_MAX_DIMS || heads < 1 || c3 <= 0 || c3 % (3 * (int64_t)heads))
    return nb_error_set(NB_ERR_SHAPE, "%s: qkv %s with %d heads (expected (..., T, 3 H D) with "
                        "H = heads >= 1: the last axis a positive multiple of 3 x %d, at most "
                        "%d axes)", op, nb_describe(qkv, b, sizeof b), heads, heads,
                        NB_MAX_DIMS - 1);
  return NB_OK;
}

static int64_t qkv_head_dim(const nb_tensor *qkv, int heads) {
  return qkv->shape[qkv->ndim - 1] / (3 * (int64_t)heads);
}

/* Part j (0 q, 1 k, 2 v) of a (..., T, n H D) kernel view x as a
 * (..., H, T, D) view: the same batch strides, head stride D, row stride
 * x's, the data moved by j H D elements. n = 1 (the output, o) or 3. */
static void qkv_part(const nb_kview *x, int j, int64_t H, int64_t D, nb_kview *v) {
  int nd = x->ndim;
  int64_t sl = x->strides[nd - 1];
  *v = *x;
  v->ndim = nd + 1;
  v->shape[nd - 2] = H, v->strides[nd - 2] = D * sl;
  v->shape[nd - 1] = x->shape[nd - 2], v->strides[nd - 1] = x->strides[nd - 2];
  v->shape[nd] = D, v->strides[nd] = sl;
  v->data = (char *)x->data + (size_t)(j * H * D * sl) * nb_dtype_size(x->dtype);
}

/* ---- forward ------------------------------------------------------------ */
static nb_status qkv_infer(const nb_op_call *c, nb_meta *out) {
  const qkv_params *p = c->p;
  nb_status st = qkv_check(c->op->name, c->in[0], p->heads);
  if (st) return st;
  if (!(p->scale > 0))
    return nb_error_set(NB_ERR_VALUE, "%s: scale %g (expected > 0)", c->op->name, p->scale);
  nb_meta_of(c->in[0], out);
  out->shape[out->ndim - 1] /= 3;
  return NB_OK;
}

static nb_status qkv_prepare(const nb_op_call *c, const nb_tensor **in) {
  return (in[0] = nb_attention_rows(c->in[0])) ? NB_OK : nb_last_status();
}

/* o into out through its (..., H, T, D) view; the log-sum-exp (..., H, T)
 * (f32, f64 for f64) into aux[0], saved for the backward. */
static nb_status qkv_forward(const nb_op_call *c, nb_tensor *o, nb_tensor **aux) {
  const qkv_params *p = c->p;
  const nb_tensor *x = c->in[0];
  int nd = x->ndim;
  int64_t H = p->heads, D = qkv_head_dim(x, p->heads), ls[NB_MAX_DIMS];
  memcpy(ls, x->shape, (size_t)(nd - 2) * sizeof ls[0]);
  ls[nd - 2] = H, ls[nd - 1] = x->shape[nd - 2];
  nb_device dev = nb_device_of(x);
  nb_tensor *lse = aux[0] = nb_tensor_alloc(nd, ls, x->dtype == NB_F64 ? NB_F64 : NB_F32, dev);
  if (!lse) return nb_last_status();
  if (!nb_numel(o)) return NB_OK; /* T = 0: the backward still needs an (empty) lse */
  nb_kview kx, ko, kq, kk, kv, kvo, kl;
  nb_kview_of(x, &kx); nb_kview_of(o, &ko); nb_kview_of(lse, &kl);
  qkv_part(&kx, 0, H, D, &kq); qkv_part(&kx, 1, H, D, &kk); qkv_part(&kx, 2, H, D, &kv);
  qkv_part(&ko, 0, H, D, &kvo);
  return nb_backend_for(dev)->attn_fwd(&kvo, &kl, &kq, &kk, &kv, p->scale, p->causal,
                                      NULL);
}

static nb_status qkv_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const nb_tensor *in[4] = {g, n->inputs[0], n->saved[QKV_SAVED_O], n->saved[QKV_SAVED_LSE]};
  gin[0] = nb_retain(nb_op_run(&nb_op_attention_qkv_backward, 4, in, nb_node_params(n)));
  return gin[0] ? NB_OK : nb_last_status();
}

/* ---- backward ----------------------------------------------------------- */
static nb_status qkv_backward_infer(const nb_op_call *c, nb_meta *out) {
  nb_meta_of(c->in[QKV_IN_QKV], out);
  return NB_OK;
}

static nb_status qkv_backward_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[QKV_IN_DY] = nb_cast(c->in[QKV_IN_DY], c->in[QKV_IN_QKV]->dtype);
  for (int i = QKV_IN_DY; i <= QKV_IN_O; i++)
    if (!in[i] || !(in[i] = nb_attention_rows(in[i]))) return nb_last_status();
  return NB_OK;
}

/* dq, dk, dv straight into the thirds of dqkv (every element written). */
static nb_status qkv_backward_forward(const nb_op_call *c, nb_tensor *dqkv, nb_tensor **aux) {
  (void)aux;
  const qkv_params *p = c->p;
  const nb_tensor *x = c->in[QKV_IN_QKV];
  int64_t H = p->heads, D = qkv_head_dim(x, p->heads);
  nb_kview kd, kx, kg, ko, kl, dq, dk, dv, q, k, v, g, o;
  nb_kview_of(dqkv, &kd); nb_kview_of(x, &kx); nb_kview_of(c->in[QKV_IN_DY], &kg);
  nb_kview_of(c->in[QKV_IN_O], &ko); nb_kview_of(c->in[QKV_IN_LSE], &kl);
  qkv_part(&kd, 0, H, D, &dq); qkv_part(&kd, 1, H, D, &dk); qkv_part(&kd, 2, H, D, &dv);
  qkv_part(&kx, 0, H, D, &q); qkv_part(&kx, 1, H, D, &k); qkv_part(&kx, 2, H, D, &v);
  qkv_part(&kg, 0, H, D, &g); qkv_part(&ko, 0, H, D, &o);
  return nb_backend_for(nb_device_of(dqkv))->attn_bwd(&dq, &dk, &dv, &g, &q, &k, &v, &o, &kl,
                                                      p->scale, p->causal, NULL);
}

/* ---- cost --------------------------------------------------------------- */
/* 4 T^2 H D per batch forward (two products), halved when causal; backward
 * 2.5 times that (five products, the probabilities recomputed). */
static double qkv_flops(const nb_tensor *qkv, int causal) {
  double T = (double)qkv->shape[qkv->ndim - 2];
  double f = 4.0 * (double)nb_numel(qkv) / 3.0 * T;
  return causal ? f / 2 : f;
}
static void qkv_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  *bytes = nb_op_io_bytes(c, out);
  *flops = qkv_flops(c->in[0], ((const qkv_params *)c->p)->causal);
}
static void qkv_backward_cost(const nb_op_call *c, const nb_meta *out, double *bytes,
                              double *flops) {
  *bytes = nb_op_io_bytes(c, out);
  *flops = 2.5 * qkv_flops(c->in[QKV_IN_QKV], ((const qkv_params *)c->p)->causal);
}

/* GPT-2 small's layer: B 16, T 1024, 12 heads of 64 */
static const qkv_params qkv_bench = {12, 1, 0.125};
const nb_op nb_op_attention_qkv = {
    .name = "attention_qkv", .kind = NB_OPK_CONTRACT, .n_in = 1, .in_names = {"qkv"},
    .psize = sizeof(qkv_params), .prec = NB_PREC_LOW,
    .determinism = "fixed-order sums on every path (no atomics)", .infer = qkv_infer,
    .prepare = qkv_prepare, .forward = qkv_forward, .always_forward = 1, .backward = qkv_bw,
    .save_out = 1, .cost = qkv_cost, .bench_in = "r:16x1024x2304", .bench_p = &qkv_bench};
/* Its inputs are the forward's (and its saved o and f32 log-sum-exp): they
 * are taken as they come (class follow), so the statistics stay f32. */
const nb_op nb_op_attention_qkv_backward = {
    .name = "attention_qkv_backward", .kind = NB_OPK_CONTRACT, .n_in = 4,
    .in_names = {"dy", "qkv", "o", "lse"}, .psize = sizeof(qkv_params), .prec = NB_PREC_FOLLOW,
    .determinism = "dq, dk, dv summed in a fixed order (no atomics); after nb_set_deterministic(0) "
                   "the sm_90a kernels add dq by bulk reduce-add, in no fixed order",
    .infer = qkv_backward_infer, .prepare = qkv_backward_prepare,
    .forward = qkv_backward_forward, .backward = nb_no_double_backward,
    .cost = qkv_backward_cost,
    .bench_in = "r:16x1024x768,r:16x1024x2304,r:16x1024x768,s:16x12x1024",
    .bench_p = &qkv_bench};

/* ---- the public function ----------------------------------------------- */
/* q, k, v of x as (..., H, T, D) views. */
static void qkv_views(const nb_tensor *x, int64_t H, int64_t D, nb_tensor **qkv) {
  int nd = x->ndim, perm[NB_MAX_DIMS];
  int64_t s[NB_MAX_DIMS];
  memcpy(s, x->shape, (size_t)(nd - 1) * sizeof s[0]);
  s[nd - 1] = 3, s[nd] = H, s[nd + 1] = D;
  for (int d = 0; d < nd - 2; d++) perm[d] = d;
  perm[nd - 2] = nd - 1, perm[nd - 1] = nd - 2, perm[nd] = nd; /* (.., T, H, D) -> (.., H, T, D) */
  nb_tensor *r = nb_reshape(x, nd + 2, s); /* (.., T, 3, H, D) */
  for (int j = 0; j < 3; j++) qkv[j] = nb_permute(nb_select(r, nd - 1, j), perm);
}

nb_tensor *nb_attention_qkv(const nb_tensor *qkv, int heads, int causal, double scale) {
  const char *op = "attention_qkv";
  if (!qkv) { nb_error_null(op, "qkv"); return NULL; }
  if (qkv_check(op, qkv, heads)) return NULL;
  int nd = qkv->ndim;
  int64_t H = heads, D = qkv_head_dim(qkv, heads);
  if (!(scale > 0)) scale = 1.0 / sqrt((double)D);
  nb_scope_begin();
  const nb_tensor *x = qkv;
  /* under autocast the op runs in the low dtype: the path is chosen for it */
  nb_dtype low = nb_autocast_dtype();
  if (low != NB_F32 && x->dtype != low && x->dtype != NB_F64) x = nb_cast(x, low);
  nb_tensor *v[3] = {NULL, NULL, NULL}, *y = NULL;
  if (x) qkv_views(x, H, D, v);
  if (v[0] && v[1] && v[2] && nb_attention_fused_ok(v[0], v[1], v[2], NULL, 0)) {
    qkv_params p = {heads, causal, scale};
    y = nb_op_run(&nb_op_attention_qkv, 1, &x, &p);
    if (!y && nb_last_status() == NB_ERR_UNSUPPORTED) nb_clear_error();
    else goto done;
  }
  if (v[0] && v[1] && v[2]) { /* composed: (.., H, T, D) -> (.., T, H, D) -> (.., T, H D) */
    int perm[NB_MAX_DIMS];
    int64_t s[NB_MAX_DIMS];
    for (int d = 0; d < nd + 1; d++) perm[d] = d;
    perm[nd - 2] = nd - 1, perm[nd - 1] = nd - 2;
    memcpy(s, qkv->shape, (size_t)nd * sizeof s[0]);
    s[nd - 1] = H * D;
    y = nb_scaled_dot_product_attention(v[0], v[1], v[2], NULL, causal, 0.0, NULL, scale);
    y = nb_reshape(nb_permute(y, perm), nd, s);
  }
done:
  y = nb_keep(y);
  nb_scope_end();
  return nb_autorelease(y);
}
