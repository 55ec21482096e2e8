/* conv2d (im2col + one batched matmul per group) and 2-D pooling, as
 * op-table entries.
 *
 * conv2d is one graph node: its forward runs im2col and the products
 * without recording them (the column buffer is not kept alive by the
 * graph; backward recomputes it), and its backward rule is written with
 * nabla ops: dW = g @ cols^T summed over the batch, dX = col2im(W^T @ g).
 * im2col and col2im are entries of their own and each other's adjoint, so
 * the backward rule is itself differentiable (create_graph works). The
 * pools' backward ops are entries too (max_pool2d_backward reads the
 * saved argmax as its second input). */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

/* ---- im2col / col2im as ops --------------------------------------------- */
/* Both take the whole nb_im2col_params as their parameters: x (n, c, h, w)
 * <-> cols (n, c*kh*kw, oh*ow). */
extern const nb_op nb_op_im2col, nb_op_col2im;

static nb_tensor *im2col_op(const nb_tensor *x, const nb_im2col_params *p) {
  return nb_op_run(&nb_op_im2col, 1, (const nb_tensor *const[]){x}, p);
}

static nb_tensor *col2im_op(const nb_tensor *cols, const nb_im2col_params *p) {
  return nb_op_run(&nb_op_col2im, 1, (const nb_tensor *const[]){cols}, p);
}

/* The input of im2col (output of col2im) and the columns, as p gives them. */
static void im2col_shapes(const nb_im2col_params *p, int64_t x[4], int64_t cols[3]) {
  x[0] = p->n; x[1] = p->c; x[2] = p->h; x[3] = p->w;
  cols[0] = p->n; cols[1] = (int64_t)p->c * p->kh * p->kw; cols[2] = (int64_t)p->oh * p->ow;
}

/* t must be a float tensor of the shape p gives (nd axes). */
static nb_status im2col_check(const nb_op_call *c, const nb_tensor *t, int nd, const int64_t *shape) {
  char b1[200], b2[200];
  if (!nb_dtype_is_float(t->dtype))
    return nb_error_set(NB_ERR_DTYPE, "%s: input %s (expected a float tensor)", c->op->name,
                        nb_describe(t, b1, sizeof b1));
  if (t->ndim != nd || memcmp(t->shape, shape, (size_t)nd * sizeof *shape))
    return nb_error_set(NB_ERR_SHAPE, "%s: input %s (expected %s from the parameters)", c->op->name,
                        nb_describe(t, b1, sizeof b1), nb_shape_str(nd, shape, b2, sizeof b2));
  return NB_OK;
}

static nb_status im2col_infer(const nb_op_call *c, nb_meta *out) {
  int64_t xs[4], cs[3];
  im2col_shapes(c->p, xs, cs);
  nb_status st = im2col_check(c, c->in[0], 4, xs);
  if (st) return st;
  nb_meta_of(c->in[0], out);
  out->ndim = 3;
  memcpy(out->shape, cs, sizeof cs);
  return NB_OK;
}

static nb_status col2im_infer(const nb_op_call *c, nb_meta *out) {
  int64_t xs[4], cs[3];
  im2col_shapes(c->p, xs, cs);
  nb_status st = im2col_check(c, c->in[0], 3, cs);
  if (st) return st;
  nb_meta_of(c->in[0], out);
  out->ndim = 4;
  memcpy(out->shape, xs, sizeof xs);
  return NB_OK;
}

/* The kernels take contiguous inputs. */
static nb_status contiguous_prepare(const nb_op_call *c, const nb_tensor **in) {
  in[0] = nb_contiguous(c->in[0]);
  return in[0] ? NB_OK : nb_last_status();
}

static nb_status im2col_forward(const nb_op_call *c, nb_tensor *cols, nb_tensor **aux) {
  (void)aux;
  nb_kview kc, kx;
  nb_kview_of(cols, &kc);
  nb_kview_of(c->in[0], &kx);
  return nb_backend_for(nb_device_of(cols))->im2col(&kc, &kx, c->p);
}

/* cols summed back into zeros. */
static nb_status col2im_forward(const nb_op_call *c, nb_tensor *x, nb_tensor **aux) {
  (void)aux;
  nb_kview kc, kx;
  nb_kview_of(c->in[0], &kc);
  nb_kview_of(x, &kx);
  const nb_backend *be = nb_backend_for(nb_device_of(x));
  if (be->fill(&kx, 0.0)) return nb_last_status();
  return nb_numel(c->in[0]) ? be->col2im(&kx, &kc, c->p) : NB_OK;
}

/* Each is the other's adjoint. */
static nb_status im2col_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(col2im_op(g, nb_node_params(n)));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status col2im_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  gin[0] = nb_retain(im2col_op(g, nb_node_params(n)));
  return gin[0] ? NB_OK : nb_last_status();
}

static double bytes_of(const nb_tensor *t) { return (double)nb_numel(t) * (double)nb_dtype_size(t->dtype); }
static double meta_bytes(const nb_meta *m) {
  return (double)nb_shape_numel(m->ndim, m->shape) * (double)nb_dtype_size(m->dtype);
}

/* A copy: x read once, cols written once (each cell of x appears kh*kw
 * times in cols, a roofline counts the bytes moved, not the reuse). */
static void im2col_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  *bytes = bytes_of(c->in[0]) + meta_bytes(out);
  *flops = 0;
}

/* cols read once, x written once; one addition per column element. */
static void col2im_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  *bytes = bytes_of(c->in[0]) + meta_bytes(out);
  *flops = (double)nb_numel(c->in[0]);
}

const nb_op nb_op_im2col = {
    .name = "im2col", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"x"},
    .psize = sizeof(nb_im2col_params), .prec = NB_PREC_FOLLOW, .infer = im2col_infer,
    .prepare = contiguous_prepare, .forward = im2col_forward, .backward = im2col_bw,
    .cost = im2col_cost};

const nb_op nb_op_col2im = {
    .name = "col2im", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"cols"},
    .psize = sizeof(nb_im2col_params), .prec = NB_PREC_FOLLOW, .infer = col2im_infer,
    .prepare = contiguous_prepare, .forward = col2im_forward, .backward = col2im_bw,
    .cost = col2im_cost};

/* ---- conv2d ------------------------------------------------------------- */
/* The primitive is conv2d without bias on an NCHW input: nb_conv2d passes
 * a channels-last input as its permuted (NCHW) view and adds the bias
 * after, so the node is recorded on the NCHW-contiguous input as before. */
typedef struct {
  int stride[2], padding[2], dilation[2];
  int groups;
  int out_nhwc; /* the output is (N, oh, ow, O) instead of (N, O, oh, ow) */
} conv_params;

/* The im2col parameters of a call on x (N, C, H, W) and w (O, C/groups,
 * kh, kw), both already checked. */
static void conv_geometry(const nb_tensor *x, const nb_tensor *w, const conv_params *q,
                          nb_im2col_params *p) {
  int64_t H = x->shape[2], W = x->shape[3];
  int64_t ekh = (int64_t)q->dilation[0] * (w->shape[2] - 1) + 1, ekw = (int64_t)q->dilation[1] * (w->shape[3] - 1) + 1;
  *p = (nb_im2col_params){(int)x->shape[0], (int)x->shape[1], (int)H, (int)W, (int)w->shape[2],
                          (int)w->shape[3], q->stride[0], q->stride[1], q->padding[0], q->padding[1],
                          q->dilation[0], q->dilation[1], 0, 0};
  p->oh = (int)((H + 2 * (int64_t)q->padding[0] - ekh) / q->stride[0] + 1);
  p->ow = (int)((W + 2 * (int64_t)q->padding[1] - ekw) / q->stride[1] + 1);
}

/* Group gi of an axis split into groups equal pieces. */
static nb_tensor *group_of(const nb_tensor *t, int axis, int groups, int gi) {
  if (groups == 1) return (nb_tensor *)t;
  int64_t len = nb_size(t, axis) / groups;
  return nb_narrow(t, axis, gi * len, len);
}

static nb_tensor *join_groups(int groups, nb_tensor **ts, int axis) {
  return groups == 1 ? ts[0] : nb_cat(groups, ts, axis);
}

/* dcols (N, K, L) = W_g^T @ g_g per group. */
static nb_tensor *conv_dcols(const nb_tensor *gm, const nb_tensor *w2, int groups, int nhwc) {
  nb_tensor *ds[groups];
  for (int gi = 0; gi < groups; gi++) {
    nb_tensor *g = group_of(gm, nhwc ? 2 : 1, groups, gi), *w = group_of(w2, 0, groups, gi);
    ds[gi] = nb_matmul(nb_transpose(w, 0, 1), nhwc ? nb_transpose(g, 1, 2) : g);
  }
  return join_groups(groups, ds, 1);
}

/* dW (O, Kg) = sum over the batch of g_g @ cols_g^T per group. */
static nb_tensor *conv_dweight(const nb_tensor *gm, const nb_tensor *cols, int groups, int nhwc) {
  nb_tensor *ds[groups];
  int batch = 0;
  for (int gi = 0; gi < groups; gi++) {
    nb_tensor *g = group_of(gm, nhwc ? 2 : 1, groups, gi), *c = group_of(cols, 1, groups, gi);
    ds[gi] = nb_sum(nb_matmul(nhwc ? nb_transpose(g, 1, 2) : g, nb_transpose(c, 1, 2)), 1, &batch, 0);
  }
  return join_groups(groups, ds, 0);
}

static nb_status conv_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const conv_params *q = nb_node_params(n);
  const nb_tensor *x = n->inputs[0], *w = n->inputs[1];
  nb_im2col_params p;
  conv_geometry(x, w, q, &p);
  int groups = q->groups, nhwc = q->out_nhwc;
  int64_t O = w->shape[0], L = (int64_t)p.oh * p.ow;
  nb_scope_begin();
  nb_tensor *gm = nhwc ? nb_reshape(g, 3, (int64_t[]){p.n, L, O}) : nb_reshape(g, 3, (int64_t[]){p.n, O, L});
  nb_tensor *w2 = nb_reshape(w, 2, (int64_t[]){O, nb_numel(w) / (O ? O : 1)});
  if (nb_node_needs_grad(n, 0)) gin[0] = nb_keep(col2im_op(conv_dcols(gm, w2, groups, nhwc), &p));
  if (nb_node_needs_grad(n, 1))
    gin[1] = nb_keep(nb_reshape(conv_dweight(gm, im2col_op(x, &p), groups, nhwc), w->ndim, w->shape));
  nb_scope_end();
  if ((nb_node_needs_grad(n, 0) && !gin[0]) || (nb_node_needs_grad(n, 1) && !gin[1])) return nb_last_status();
  return NB_OK;
}

/* out (B, M, P) = a (.., M, K) @ b (.., K, P), batch axes broadcast: the
 * kernel call nb_matmul makes for these operands. */
static nb_status conv_gemm(const nb_tensor *out, const nb_tensor *a, const nb_tensor *b) {
  int64_t B = out->shape[0], M = out->shape[1], P = out->shape[2], K = a->shape[a->ndim - 1];
  nb_kview ko, ka, kb;
  nb_kview_of(out, &ko);
  nb_kview_broadcast(a, 3, (const int64_t[]){B, M, K}, &ka);
  nb_kview_broadcast(b, 3, (const int64_t[]){B, K, P}, &kb);
  const nb_backend *be = nb_backend_for(nb_device_of(out));
  return K ? be->matmul(&ko, &ka, &kb) : be->fill(&ko, 0.0);
}

/* y3 (N, O, L) = W_g (Og, Kg) @ cols_g (N, Kg, L) per group, or for NHWC
 * y3 (N, L, O) = cols_g^T @ W_g^T, already in the channels-last layout.
 * One group writes y3 directly; several go through one product each and a
 * copy into their slice (the products and copies nb_matmul and nb_cat
 * made before). */
static nb_status conv_products_into(nb_tensor *y3, const nb_tensor *cols, const nb_tensor *w2,
                                    int groups, int nhwc) {
  const nb_backend *be = nb_backend_for(nb_device_of(y3));
  for (int gi = 0; gi < groups; gi++) {
    nb_tensor *c = group_of(cols, 1, groups, gi), *w = group_of(w2, 0, groups, gi);
    const nb_tensor *a = nhwc ? nb_transpose(c, 1, 2) : w, *b = nhwc ? nb_transpose(w, 0, 1) : c;
    nb_tensor *dst = group_of(y3, nhwc ? 2 : 1, groups, gi), *tmp = dst;
    if (!a || !b || !dst) return nb_last_status();
    if (groups > 1 && !(tmp = nb_autorelease(nb_tensor_alloc(3, dst->shape, y3->dtype, nb_device_of(y3)))))
      return nb_last_status();
    if (conv_gemm(tmp, a, b)) return nb_last_status();
    if (tmp != dst) {
      nb_kview kd, kt;
      nb_kview_of(dst, &kd);
      nb_kview_of(tmp, &kt);
      if (be->copy(&kd, &kt)) return nb_last_status();
    }
  }
  return NB_OK;
}

/* im2col and the products, unrecorded (the column buffer is not kept:
 * backward recomputes it). x (N, C, H, W) contiguous; w (O, C/groups, kh,
 * kw) contiguous, of x's dtype. */
static nb_status conv_forward(const nb_op_call *c, nb_tensor *y, nb_tensor **aux) {
  (void)aux;
  const conv_params *q = c->p;
  const nb_tensor *x = c->in[0], *w = c->in[1];
  nb_im2col_params p;
  conv_geometry(x, w, q, &p);
  int64_t O = w->shape[0], L = (int64_t)p.oh * p.ow;
  nb_no_grad_begin();
  nb_tensor *w2 = nb_reshape(w, 2, (int64_t[]){O, nb_numel(w) / O});
  nb_tensor *y3 = nb_reshape(y, 3, q->out_nhwc ? (int64_t[]){p.n, L, O} : (int64_t[]){p.n, O, L});
  nb_tensor *cols = im2col_op(x, &p);
  nb_status st = w2 && y3 && cols ? conv_products_into(y3, cols, w2, q->groups, q->out_nhwc) : nb_last_status();
  nb_no_grad_end();
  return st;
}

nb_conv2d_params nb_conv2d_defaults(void) {
  return (nb_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 1, 0};
}

static int conv_fail(nb_status st, const char *what, const nb_tensor *x, const nb_tensor *w) {
  char b1[200], b2[200];
  nb_error_set(st, "conv2d: %s (input %s, weight %s)", what, nb_describe(x, b1, sizeof b1),
               nb_describe(w, b2, sizeof b2));
  return 0;
}

static int conv_dtypes_ok(const nb_tensor *x, const nb_tensor *w, const nb_tensor *b) {
  if (!nb_dtype_is_float(x->dtype) || !nb_dtype_is_float(w->dtype) || (b && !nb_dtype_is_float(b->dtype)))
    return conv_fail(NB_ERR_DTYPE, "expected float input, weight and bias", x, w);
  return 1;
}

/* Validates everything and fills the im2col parameters. */
static int conv_args(const nb_tensor *x, const nb_tensor *w, const nb_tensor *b,
                     const nb_conv2d_params *cp, nb_im2col_params *p) {
  char msg[600];
  if (x->ndim != 4 || w->ndim != 4)
    return conv_fail(NB_ERR_SHAPE, cp->channels_last ? "expected a 4-D input (N, H, W, C) and a 4-D "
                     "weight (O, C/groups, kh, kw)" : "expected a 4-D input (N, C, H, W) and a 4-D "
                     "weight (O, C/groups, kh, kw)", x, w);
  if (!conv_dtypes_ok(x, w, b)) return 0;
  if (cp->groups < 1 || cp->stride[0] < 1 || cp->stride[1] < 1 || cp->dilation[0] < 1 ||
      cp->dilation[1] < 1 || cp->padding[0] < 0 || cp->padding[1] < 0) {
    snprintf(msg, sizeof msg, "groups %d, stride (%d, %d), padding (%d, %d), dilation (%d, %d): "
             "expected groups, stride and dilation >= 1 and padding >= 0", cp->groups, cp->stride[0],
             cp->stride[1], cp->padding[0], cp->padding[1], cp->dilation[0], cp->dilation[1]);
    return conv_fail(NB_ERR_VALUE, msg, x, w);
  }
  int cl = cp->channels_last;
  int64_t N = x->shape[0], C = x->shape[cl ? 3 : 1], H = x->shape[cl ? 1 : 2], W = x->shape[cl ? 2 : 3];
  int64_t O = w->shape[0], G = cp->groups;
  if (N > INT_MAX || C > INT_MAX || H > INT_MAX || W > INT_MAX)
    return conv_fail(NB_ERR_SHAPE, "input dimensions exceed the int range of the kernels", x, w);
  if (C % G || O % G || w->shape[1] != C / G) {
    snprintf(msg, sizeof msg, "%lld input channels and %lld output channels with groups %lld "
             "(expected channels divisible by groups and weight axis 1 == C/groups = %lld)",
             (long long)C, (long long)O, (long long)G, (long long)(C / G));
    return conv_fail(NB_ERR_SHAPE, msg, x, w);
  }
  if (b && (b->ndim != 1 || b->shape[0] != O)) {
    char bb[200];
    snprintf(msg, sizeof msg, "bias %s (expected shape [%lld])", nb_describe(b, bb, sizeof bb), (long long)O);
    return conv_fail(NB_ERR_SHAPE, msg, x, w);
  }
  int64_t ekh = (int64_t)cp->dilation[0] * (w->shape[2] - 1) + 1, ekw = (int64_t)cp->dilation[1] * (w->shape[3] - 1) + 1;
  int64_t ph = H + 2 * (int64_t)cp->padding[0], pw = W + 2 * (int64_t)cp->padding[1];
  if (w->shape[2] < 1 || w->shape[3] < 1 || ekh > ph || ekw > pw) {
    snprintf(msg, sizeof msg, "dilated kernel %lldx%lld is larger than the padded input %lldx%lld",
             (long long)ekh, (long long)ekw, (long long)ph, (long long)pw);
    return conv_fail(NB_ERR_SHAPE, msg, x, w);
  }
  *p = (nb_im2col_params){(int)N, (int)C, (int)H, (int)W, (int)w->shape[2], (int)w->shape[3],
                          cp->stride[0], cp->stride[1], cp->padding[0], cp->padding[1],
                          cp->dilation[0], cp->dilation[1], 0, 0};
  p->oh = (int)((ph - ekh) / cp->stride[0] + 1);
  p->ow = (int)((pw - ekw) / cp->stride[1] + 1);
  return 1;
}

/* The primitive's checks: x NCHW (a channels-last input arrives permuted). */
static nb_status conv_infer(const nb_op_call *c, nb_meta *out) {
  const conv_params *q = c->p;
  const nb_tensor *x = c->in[0], *w = c->in[1];
  nb_conv2d_params cp = {{q->stride[0], q->stride[1]}, {q->padding[0], q->padding[1]},
                         {q->dilation[0], q->dilation[1]}, q->groups, 0};
  nb_im2col_params p;
  if (!conv_args(x, w, NULL, &cp, &p)) return nb_last_status();
  int64_t O = w->shape[0];
  out->ndim = 4;
  memcpy(out->shape, q->out_nhwc ? (int64_t[]){p.n, p.oh, p.ow, O} : (int64_t[]){p.n, O, p.oh, p.ow},
         4 * sizeof(int64_t));
  out->dtype = nb_promote(x->dtype, w->dtype);
  out->device = nb_device_of(x);
  return NB_OK;
}

/* x and w contiguous, of one dtype. */
static nb_status conv_prepare(const nb_op_call *c, const nb_tensor **in) {
  nb_dtype dt = nb_promote(c->in[0]->dtype, c->in[1]->dtype);
  in[0] = nb_contiguous(nb_cast(c->in[0], dt));
  in[1] = in[0] ? nb_contiguous(nb_cast(c->in[1], dt)) : NULL;
  return in[1] ? NB_OK : nb_last_status();
}

/* 2 flops per multiply-add: each output element sums C/groups*kh*kw
 * products; x and w read once, y written once (the column buffer's
 * traffic is im2col's, not counted here). */
static void conv_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  const nb_tensor *w = c->in[1];
  double nout = (double)nb_shape_numel(out->ndim, out->shape);
  double kg = w->shape[0] ? (double)nb_numel(w) / (double)w->shape[0] : 0;
  *bytes = bytes_of(c->in[0]) + bytes_of(w) + meta_bytes(out);
  *flops = 2.0 * nout * kg;
}

/* a 3x3 convolution of a ResNet stage */
static const conv_params conv_bench = {{1, 1}, {1, 1}, {1, 1}, 1, 0};

const nb_op nb_op_conv2d = {
    .name = "conv2d", .kind = NB_OPK_CONTRACT, .n_in = 2, .in_names = {"x", "weight"},
    .psize = sizeof(conv_params), .prec = NB_PREC_LOW,
    .determinism = "the products are matmul's kernels (see matmul: on CUDA the GEMM schedule is "
                   "chosen per shape and device or by the autotuner); im2col and col2im are "
                   "deterministic",
    .infer = conv_infer, .prepare = conv_prepare, .forward = conv_forward, .backward = conv_bw,
    .cost = conv_cost, .bench_in = "r:32x128x28x28,r:128x128x3x3", .bench_p = &conv_bench};

nb_tensor *nb_conv2d(const nb_tensor *x, const nb_tensor *weight, const nb_tensor *bias,
                     nb_conv2d_params cp) {
  if (!x) { nb_error_null("conv2d", "x"); return NULL; }
  if (!weight) { nb_error_null("conv2d", "weight"); return NULL; }
  if (nb_op_same_device("conv2d", 3, (const nb_tensor *const[]){x, weight, bias})) return NULL;
  nb_im2col_params p;
  if (!conv_args(x, weight, bias, &cp, &p)) return NULL;
  nb_dtype dt = nb_promote(x->dtype, weight->dtype);
  int nhwc = cp.channels_last != 0;
  conv_params q = {{cp.stride[0], cp.stride[1]}, {cp.padding[0], cp.padding[1]},
                   {cp.dilation[0], cp.dilation[1]}, cp.groups, nhwc};
  nb_scope_begin();
  nb_tensor *xin = nb_cast(x, dt);
  if (nhwc) xin = nb_permute(xin, (const int[]){0, 3, 1, 2}); /* a view, made NCHW-contiguous */
  nb_tensor *y = xin ? nb_op_run(&nb_op_conv2d, 2, (const nb_tensor *const[]){xin, weight}, &q) : NULL;
  if (y && bias) {
    nb_tensor *b = nb_cast(bias, dt);
    y = nb_add(y, nhwc ? b : nb_reshape(b, 3, (int64_t[]){weight->shape[0], 1, 1}));
  }
  y = nb_keep(y);
  nb_scope_end();
  return nb_autorelease(y);
}

/* ---- pooling --------------------------------------------------------------- */
static int pool_args(const char *op, const nb_tensor *x, int kh, int kw, int sh, int sw, int ph,
                     int pw, nb_im2col_params *p) {
  char b[200];
  if (x->ndim != 4 && x->ndim != 3) {
    nb_error_set(NB_ERR_SHAPE, "%s: input %s (expected (N, C, H, W) or (C, H, W))", op,
                 nb_describe(x, b, sizeof b));
    return 0;
  }
  if (!nb_dtype_is_float(x->dtype)) {
    nb_error_set(NB_ERR_DTYPE, "%s: input %s (expected a float tensor)", op, nb_describe(x, b, sizeof b));
    return 0;
  }
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || ph < 0 || pw < 0 || 2 * ph > kh || 2 * pw > kw) {
    nb_error_set(NB_ERR_VALUE, "%s: kernel (%d, %d), stride (%d, %d), padding (%d, %d) (expected "
                 "kernel and stride >= 1 and 0 <= padding <= kernel/2)", op, kh, kw, sh, sw, ph, pw);
    return 0;
  }
  int d = x->ndim - 4;
  int64_t N = d ? 1 : x->shape[0], C = x->shape[1 + d], H = x->shape[2 + d], W = x->shape[3 + d];
  if (H + 2 * ph < kh || W + 2 * pw < kw || N > INT_MAX || C > INT_MAX || H > INT_MAX || W > INT_MAX) {
    nb_error_set(NB_ERR_SHAPE, "%s: kernel (%d, %d) is larger than the padded input %s (padding %d, %d)",
                 op, kh, kw, nb_describe(x, b, sizeof b), ph, pw);
    return 0;
  }
  *p = (nb_im2col_params){(int)N, (int)C, (int)H, (int)W, kh, kw, sh, sw, ph, pw, 1, 1,
                          (int)((H + 2 * ph - kh) / sh + 1), (int)((W + 2 * pw - kw) / sw + 1)};
  return 1;
}

/* The pools' parameters; the backward ops add the input's height and
 * width (dx is (N, C, h, w) for dy (N, C, oh, ow)). The ops take 4-D
 * NCHW inputs; nb_max_pool2d and nb_avg_pool2d run (C, H, W) inputs as a
 * batch of one around them. */
typedef struct {
  int kh, kw, sh, sw, ph, pw;
} pool_params;

typedef struct {
  pool_params pool;
  int h, w;
} pool_bw_params;

extern const nb_op nb_op_max_pool2d, nb_op_avg_pool2d, nb_op_max_pool2d_backward,
    nb_op_avg_pool2d_backward;

static void pool_geometry(int64_t n, int64_t c, int64_t h, int64_t w, const pool_params *q,
                          nb_im2col_params *p) {
  *p = (nb_im2col_params){(int)n, (int)c, (int)h, (int)w, q->kh, q->kw, q->sh, q->sw, q->ph, q->pw, 1, 1,
                          (int)((h + 2 * q->ph - q->kh) / q->sh + 1), (int)((w + 2 * q->pw - q->kw) / q->sw + 1)};
}

static nb_status pool_infer(const nb_op_call *c, nb_meta *out) {
  const pool_params *q = c->p;
  const nb_tensor *x = c->in[0];
  nb_im2col_params p;
  if (!pool_args(c->op->name, x, q->kh, q->kw, q->sh, q->sw, q->ph, q->pw, &p)) return nb_last_status();
  if (x->ndim != 4) {
    char b[200];
    return nb_error_set(NB_ERR_SHAPE, "%s: input %s (expected (N, C, H, W); nb_%s takes (C, H, W))",
                        c->op->name, nb_describe(x, b, sizeof b), c->op->name);
  }
  nb_meta_of(x, out);
  out->shape[2] = p.oh;
  out->shape[3] = p.ow;
  return NB_OK;
}

/* Pools x (N, C, H, W) contiguous into y; max pooling also makes the
 * argmax (i64, y's shape), saved for the backward, even when y is empty. */
static nb_status pool_forward(const nb_op_call *c, nb_tensor *y, nb_tensor **aux) {
  const nb_tensor *x = c->in[0];
  int max = c->op == &nb_op_max_pool2d;
  nb_device dev = nb_device_of(x);
  if (max && !(aux[0] = nb_tensor_alloc(4, y->shape, NB_I64, dev))) return nb_last_status();
  if (!nb_numel(y)) return NB_OK;
  nb_im2col_params p;
  pool_geometry(x->shape[0], x->shape[1], x->shape[2], x->shape[3], c->p, &p);
  nb_kview ky, kx, ka;
  nb_kview_of(y, &ky);
  nb_kview_of(x, &kx);
  const nb_backend *be = nb_backend_for(dev);
  if (!max) return be->avgpool2d_fwd(&ky, &kx, &p);
  nb_kview_of(aux[0], &ka);
  return be->maxpool2d_fwd(&ky, &ka, &kx, &p);
}

/* dx (N, C, h, w) of dy (N, C, oh, ow), in dy's dtype. */
static nb_status pool_backward_infer(const nb_op_call *c, nb_meta *out) {
  const pool_bw_params *q = c->p;
  nb_meta_of(c->in[0], out);
  out->shape[2] = q->h;
  out->shape[3] = q->w;
  return NB_OK;
}

/* dx zeroed, then dy added through the windows: at each window's argmax
 * (inputs dy, argmax) or spread evenly (input dy). Runs even when dx is
 * empty, as the kernels did before. */
static nb_status pool_backward_forward(const nb_op_call *c, nb_tensor *dx, nb_tensor **aux) {
  (void)aux;
  const pool_bw_params *q = c->p;
  const nb_tensor *dy = c->in[0];
  const nb_backend *be = nb_backend_for(nb_device_of(dx));
  nb_kview kdx, kdy, ka;
  nb_kview_of(dx, &kdx);
  if (nb_numel(dx) && be->fill(&kdx, 0.0)) return nb_last_status();
  if (!nb_numel(dy)) return NB_OK;
  nb_im2col_params p;
  pool_geometry(dy->shape[0], dy->shape[1], q->h, q->w, &q->pool, &p);
  nb_kview_of(dy, &kdy);
  if (c->op == &nb_op_avg_pool2d_backward) return be->avgpool2d_bwd(&kdx, &kdy, &p);
  nb_kview_of(c->in[1], &ka);
  return be->maxpool2d_bwd(&kdx, &kdy, &ka, &p);
}

static pool_bw_params pool_bw_params_of(const nb_node *n) {
  const nb_tensor *x = n->inputs[0];
  return (pool_bw_params){*(const pool_params *)nb_node_params(n), (int)x->shape[2], (int)x->shape[3]};
}

static nb_status maxpool_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  pool_bw_params q = pool_bw_params_of(n);
  gin[0] = nb_retain(nb_op_run(&nb_op_max_pool2d_backward, 2, (const nb_tensor *const[]){g, n->saved[0]}, &q));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status avgpool_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  pool_bw_params q = pool_bw_params_of(n);
  gin[0] = nb_retain(nb_op_run(&nb_op_avg_pool2d_backward, 1, (const nb_tensor *const[]){g}, &q));
  return gin[0] ? NB_OK : nb_last_status();
}

/* max_pool2d's backward's own gradient gathers at the same positions. */
static nb_status maxpool_backward_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const pool_bw_params *q = nb_node_params(n);
  const nb_tensor *dy = n->inputs[0];
  int64_t N = dy->shape[0], C = dy->shape[1], oh = dy->shape[2], ow = dy->shape[3];
  nb_tensor *flat = nb_reshape(g, 3, (int64_t[]){N, C, (int64_t)q->h * q->w});
  nb_tensor *arg = nb_reshape(n->inputs[1], 3, (int64_t[]){N, C, oh * ow});
  gin[0] = nb_retain(nb_reshape(nb_gather(flat, 2, arg), 4, (int64_t[]){N, C, oh, ow}));
  return gin[0] ? NB_OK : nb_last_status();
}

/* avg_pool2d's backward is linear: its own gradient is avg_pool2d again. */
static nb_status avgpool_backward_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  const pool_bw_params *q = nb_node_params(n);
  gin[0] = nb_retain(nb_op_run(&nb_op_avg_pool2d, 1, (const nb_tensor *const[]){g}, &q->pool));
  return gin[0] ? NB_OK : nb_last_status();
}

/* x read once, y (and max's i64 argmax) written once; kh*kw comparisons or
 * additions per output element. */
static void pool_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  const pool_params *q = c->p;
  double nout = (double)nb_shape_numel(out->ndim, out->shape);
  *bytes = bytes_of(c->in[0]) + meta_bytes(out) + (c->op == &nb_op_max_pool2d ? 8 * nout : 0);
  *flops = nout * q->kh * q->kw;
}

/* dy (and the argmax) read once, dx written once; max adds each dy element
 * once, avg kh*kw times. */
static void pool_backward_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  const pool_bw_params *q = c->p;
  double b = meta_bytes(out);
  for (int i = 0; i < c->n; i++) b += bytes_of(c->in[i]);
  *bytes = b;
  *flops = (double)nb_numel(c->in[0]) * (c->op == &nb_op_avg_pool2d_backward ? q->pool.kh * q->pool.kw : 1);
}

/* ResNet's stem max pool (3x3, stride 2, padding 1); a 2x2 average */
static const pool_params maxpool_bench = {3, 3, 2, 2, 1, 1}, avgpool_bench = {2, 2, 2, 2, 0, 0};

const nb_op nb_op_max_pool2d = {
    .name = "max_pool2d", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"x"},
    .psize = sizeof(pool_params), .prec = NB_PREC_FOLLOW, .infer = pool_infer,
    .prepare = contiguous_prepare, .forward = pool_forward, .always_forward = 1,
    .backward = maxpool_bw, .cost = pool_cost, .bench_in = "r:32x128x112x112",
    .bench_p = &maxpool_bench};

const nb_op nb_op_avg_pool2d = {
    .name = "avg_pool2d", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"x"},
    .psize = sizeof(pool_params), .prec = NB_PREC_FOLLOW, .infer = pool_infer,
    .prepare = contiguous_prepare, .forward = pool_forward, .backward = avgpool_bw,
    .cost = pool_cost, .bench_in = "r:32x128x112x112", .bench_p = &avgpool_bench};

const nb_op nb_op_max_pool2d_backward = {
    .name = "max_pool2d_backward", .kind = NB_OPK_OPAQUE, .n_in = 2, .in_names = {"dy", "argmax"},
    .psize = sizeof(pool_bw_params), .prec = NB_PREC_FOLLOW, .infer = pool_backward_infer,
    .prepare = contiguous_prepare, .forward = pool_backward_forward, .always_forward = 1,
    .backward = maxpool_backward_bw, .cost = pool_backward_cost};

const nb_op nb_op_avg_pool2d_backward = {
    .name = "avg_pool2d_backward", .kind = NB_OPK_OPAQUE, .n_in = 1, .in_names = {"dy"},
    .psize = sizeof(pool_bw_params), .prec = NB_PREC_FOLLOW, .infer = pool_backward_infer,
    .prepare = contiguous_prepare, .forward = pool_backward_forward, .always_forward = 1,
    .backward = avgpool_backward_bw, .cost = pool_backward_cost};

/* (C, H, W) inputs run as a batch of one. */
static nb_tensor *pool_op(const nb_op *op, const nb_tensor *x, int kh, int kw, int sh, int sw,
                          int ph, int pw) {
  if (!x) { nb_error_null(op->name, "x"); return NULL; }
  nb_im2col_params p;
  if (!pool_args(op->name, x, kh, kw, sh, sw, ph, pw, &p)) return NULL;
  pool_params q = {kh, kw, sh, sw, ph, pw};
  nb_scope_begin();
  nb_tensor *x4 = x->ndim == 3 ? nb_unsqueeze(x, 0) : (nb_tensor *)x;
  nb_tensor *y = x4 ? nb_op_run(op, 1, (const nb_tensor *const[]){x4}, &q) : NULL;
  if (y && x->ndim == 3) y = nb_squeeze(y, 0);
  y = nb_keep(y);
  nb_scope_end();
  return nb_autorelease(y);
}

nb_tensor *nb_max_pool2d(const nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw) {
  return pool_op(&nb_op_max_pool2d, x, kh, kw, sh, sw, ph, pw);
}

nb_tensor *nb_avg_pool2d(const nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw) {
  return pool_op(&nb_op_avg_pool2d, x, kh, kw, sh, sw, ph, pw);
}
