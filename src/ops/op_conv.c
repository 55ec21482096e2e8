/* conv2d (im2col + one batched matmul per group) and 2-D pooling.
 *
 * conv2d is one graph node: its forward runs im2col and the products
 * without recording them (the column buffer is not kept alive by the
 * graph; backward recomputes it), and its backward rule is written with
 * nabla ops: dW = g @ cols^T summed over the batch, dX = col2im(W^T @ g).
 * im2col and col2im are ops of their own and each other's adjoint, so the
 * backward rule is itself differentiable (create_graph works). */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

/* The im2col parameters travel in a node's ip array. */
static void params_save(nb_node *n, const nb_im2col_params *p) { memcpy(n->ip, p, sizeof *p); }
static void params_load(const nb_node *n, nb_im2col_params *p) { memcpy(p, n->ip, sizeof *p); }
enum { CONV_IP_GROUPS = 10, CONV_IP_NHWC = 11 };
_Static_assert(sizeof(nb_im2col_params) <= 10 * sizeof(int64_t), "params fit before CONV_IP_*");

/* ---- im2col / col2im as ops --------------------------------------------- */
static nb_tensor *col2im_op(const nb_tensor *cols, const nb_im2col_params *p);

static nb_status im2col_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_im2col_params p;
  params_load(n, &p);
  gin[0] = nb_retain(col2im_op(g, &p));
  return gin[0] ? NB_OK : nb_last_status();
}

/* x (N, C, H, W) -> cols (N, C*kh*kw, oh*ow). */
static nb_tensor *im2col_op(const nb_tensor *x, const nb_im2col_params *p) {
  nb_scope_begin();
  nb_tensor *xc = nb_contiguous(x);
  int64_t shape[3] = {p->n, (int64_t)p->c * p->kh * p->kw, (int64_t)p->oh * p->ow};
  nb_tensor *cols = xc ? nb_tensor_alloc(3, shape, x->dtype, nb_device_of(x)) : NULL;
  if (cols && nb_numel(cols)) {
    nb_kview kc, kx;
    nb_kview_of(cols, &kc);
    nb_kview_of(xc, &kx);
    if (nb_backend_for(nb_device_of(x))->im2col(&kc, &kx, p)) { nb_release(cols); cols = NULL; }
  }
  nb_node *n = cols ? nb_record("im2col", im2col_bw, 1, (const nb_tensor *const[]){xc}, cols) : NULL;
  if (n) params_save(n, p);
  nb_scope_end();
  return nb_autorelease(cols);
}

static nb_status col2im_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_im2col_params p;
  params_load(n, &p);
  gin[0] = nb_retain(im2col_op(g, &p));
  return gin[0] ? NB_OK : nb_last_status();
}

/* cols (N, C*kh*kw, oh*ow) summed back into zeros (N, C, H, W). */
static nb_tensor *col2im_op(const nb_tensor *cols, const nb_im2col_params *p) {
  nb_scope_begin();
  nb_tensor *cc = nb_contiguous(cols);
  int64_t shape[4] = {p->n, p->c, p->h, p->w};
  nb_tensor *x = cc ? nb_tensor_alloc(4, shape, cols->dtype, nb_device_of(cols)) : NULL;
  if (x && nb_numel(x)) {
    nb_kview kc, kx;
    nb_kview_of(cc, &kc);
    nb_kview_of(x, &kx);
    const nb_backend *be = nb_backend_for(nb_device_of(x));
    if (be->fill(&kx, 0.0) || (nb_numel(cc) && be->col2im(&kx, &kc, p))) { nb_release(x); x = NULL; }
  }
  nb_node *n = x ? nb_record("col2im", col2im_bw, 1, (const nb_tensor *const[]){cc}, x) : NULL;
  if (n) params_save(n, p);
  nb_scope_end();
  return nb_autorelease(x);
}

/* ---- conv2d ------------------------------------------------------------- */
/* Group gi of an axis split into groups equal pieces. */
static nb_tensor *group_of(const nb_tensor *t, int axis, int groups, int gi) {
  if (groups == 1) return (nb_tensor *)t;
  int64_t len = nb_size(t, axis) / groups;
  return nb_narrow(t, axis, gi * len, len);
}

static nb_tensor *join_groups(int groups, nb_tensor **ts, int axis) {
  return groups == 1 ? ts[0] : nb_cat(groups, ts, axis);
}

/* y per group = W_g (Og, Kg) @ cols_g (N, Kg, L): (N, O, L), or for NHWC
 * cols_g^T @ W_g^T: (N, L, O), already in the channels-last layout. */
static nb_tensor *conv_products(const nb_tensor *cols, const nb_tensor *w2, int groups, int nhwc) {
  nb_tensor *ys[groups];
  for (int gi = 0; gi < groups; gi++) {
    nb_tensor *c = group_of(cols, 1, groups, gi), *w = group_of(w2, 0, groups, gi);
    ys[gi] = nhwc ? nb_matmul(nb_transpose(c, 1, 2), nb_transpose(w, 0, 1)) : nb_matmul(w, c);
  }
  return join_groups(groups, ys, nhwc ? 2 : 1);
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
  const nb_tensor *x = n->inputs[0], *w = n->inputs[1];
  nb_im2col_params p;
  params_load(n, &p);
  int groups = (int)n->ip[CONV_IP_GROUPS], nhwc = (int)n->ip[CONV_IP_NHWC];
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

/* The forward products, unrecorded, then one conv2d node on the result.
 * x (N, C, H, W) contiguous; w (O, C/groups, kh, kw) of x's dtype. */
static nb_tensor *conv_node(const nb_tensor *x, const nb_tensor *w, const nb_im2col_params *p,
                            int groups, int nhwc) {
  int64_t O = w->shape[0];
  nb_no_grad_begin();
  nb_scope_begin();
  nb_tensor *w2 = nb_reshape(w, 2, (int64_t[]){O, nb_numel(w) / (O ? O : 1)});
  nb_tensor *y = conv_products(im2col_op(x, p), w2, groups, nhwc);
  y = nhwc ? nb_reshape(y, 4, (int64_t[]){p->n, p->oh, p->ow, O})
           : nb_reshape(y, 4, (int64_t[]){p->n, O, p->oh, p->ow});
  y = nb_keep(y);
  nb_scope_end();
  nb_no_grad_end();
  nb_node *n = y ? nb_record("conv2d", conv_bw, 2, (const nb_tensor *const[]){x, w}, y) : NULL;
  if (n) {
    params_save(n, p);
    n->ip[CONV_IP_GROUPS] = groups;
    n->ip[CONV_IP_NHWC] = nhwc;
  }
  return nb_autorelease(y);
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

nb_tensor *nb_conv2d(const nb_tensor *x, const nb_tensor *weight, const nb_tensor *bias,
                     nb_conv2d_params cp) {
  if (!x) { nb_error_null("conv2d", "x"); return NULL; }
  if (!weight) { nb_error_null("conv2d", "weight"); return NULL; }
  if (nb_op_same_device("conv2d", 3, (const nb_tensor *const[]){x, weight, bias})) return NULL;
  nb_im2col_params p;
  if (!conv_args(x, weight, bias, &cp, &p)) return NULL;
  nb_dtype dt = nb_promote(x->dtype, weight->dtype);
  int nhwc = cp.channels_last != 0;
  nb_scope_begin();
  nb_tensor *xin = nb_cast(x, dt);
  if (nhwc) xin = nb_permute(xin, (const int[]){0, 3, 1, 2}); /* a view, made NCHW-contiguous */
  xin = nb_contiguous(xin);
  nb_tensor *w = nb_contiguous(nb_cast(weight, dt));
  nb_tensor *y = xin && w ? conv_node(xin, w, &p, cp.groups, nhwc) : NULL;
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

/* A zeroed (N, C, H, W) gradient and the contiguous dy (N, C, oh, ow). */
static nb_tensor *pool_grad_buffer(const nb_tensor *g, const nb_im2col_params *p, nb_kview *kdx) {
  int64_t shape[4] = {p->n, p->c, p->h, p->w};
  nb_tensor *dx = nb_tensor_alloc(4, shape, g->dtype, nb_device_of(g));
  if (!dx) return NULL;
  nb_kview_of(dx, kdx);
  if (nb_numel(dx) && nb_backend_for(nb_device_of(g))->fill(kdx, 0.0)) { nb_release(dx); return NULL; }
  return dx;
}

/* max_pool2d's backward: dy added at each window's argmax. Its own
 * gradient gathers at the same positions. */
static nb_status maxpool_backward_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_im2col_params p;
  params_load(n, &p);
  int64_t hw = (int64_t)p.h * p.w, ohw = (int64_t)p.oh * p.ow;
  nb_tensor *flat = nb_reshape(g, 3, (int64_t[]){p.n, p.c, hw});
  nb_tensor *arg = nb_reshape(n->saved[0], 3, (int64_t[]){p.n, p.c, ohw});
  gin[0] = nb_retain(nb_reshape(nb_gather(flat, 2, arg), 4, (int64_t[]){p.n, p.c, p.oh, p.ow}));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status maxpool_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_im2col_params p;
  params_load(n, &p);
  const nb_tensor *arg = n->saved[0];
  nb_scope_begin();
  nb_tensor *dy = nb_contiguous(g);
  nb_kview kdx, kdy, ka;
  nb_tensor *dx = dy ? pool_grad_buffer(dy, &p, &kdx) : NULL;
  if (dx && nb_numel(dy)) {
    nb_kview_of(dy, &kdy);
    nb_kview_of(arg, &ka);
    if (nb_backend_for(nb_device_of(dy))->maxpool2d_bwd(&kdx, &kdy, &ka, &p)) { nb_release(dx); dx = NULL; }
  }
  nb_node *m = dx ? nb_record("max_pool2d_backward", maxpool_backward_bw, 1, (const nb_tensor *const[]){dy}, dx) : NULL;
  if (m) { params_save(m, &p); nb_node_save(m, 0, arg); }
  nb_scope_end();
  gin[0] = dx;
  return dx ? NB_OK : nb_last_status();
}

/* Pools x (N, C, H, W) contiguous into a new y; argmax only for max. */
static nb_tensor *pool_run(const nb_tensor *x, const nb_im2col_params *p, nb_tensor **argmax) {
  int64_t shape[4] = {p->n, p->c, p->oh, p->ow};
  nb_device dev = nb_device_of(x);
  nb_tensor *y = nb_tensor_alloc(4, shape, x->dtype, dev);
  if (argmax) *argmax = nb_autorelease(nb_tensor_alloc(4, shape, NB_I64, dev));
  if (!y || (argmax && !*argmax)) { nb_release(y); return NULL; }
  if (!nb_numel(y)) return y;
  nb_kview ky, kx, ka;
  nb_kview_of(y, &ky);
  nb_kview_of(x, &kx);
  const nb_backend *be = nb_backend_for(dev);
  nb_status st = argmax ? (nb_kview_of(*argmax, &ka), be->maxpool2d_fwd(&ky, &ka, &kx, p))
                        : be->avgpool2d_fwd(&ky, &kx, p);
  if (st) { nb_release(y); return NULL; }
  return y;
}

static nb_tensor *avgpool_forward(const nb_tensor *x, const nb_im2col_params *p);

/* avg_pool2d's backward spreads dy evenly over each window; being linear,
 * its own gradient is avg_pool2d again. */
static nb_status avgpool_backward_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_im2col_params p;
  params_load(n, &p);
  gin[0] = nb_retain(avgpool_forward(g, &p));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status avgpool_bw(nb_node *n, nb_tensor *g, nb_tensor **gin) {
  nb_im2col_params p;
  params_load(n, &p);
  nb_scope_begin();
  nb_tensor *dy = nb_contiguous(g);
  nb_kview kdx, kdy;
  nb_tensor *dx = dy ? pool_grad_buffer(dy, &p, &kdx) : NULL;
  if (dx && nb_numel(dy)) {
    nb_kview_of(dy, &kdy);
    if (nb_backend_for(nb_device_of(dy))->avgpool2d_bwd(&kdx, &kdy, &p)) { nb_release(dx); dx = NULL; }
  }
  nb_node *m = dx ? nb_record("avg_pool2d_backward", avgpool_backward_bw, 1, (const nb_tensor *const[]){dy}, dx) : NULL;
  if (m) params_save(m, &p);
  nb_scope_end();
  gin[0] = dx;
  return dx ? NB_OK : nb_last_status();
}

static nb_tensor *avgpool_forward(const nb_tensor *x, const nb_im2col_params *p) {
  nb_scope_begin();
  nb_tensor *xc = nb_contiguous(x);
  nb_tensor *y = xc ? pool_run(xc, p, NULL) : NULL;
  nb_node *n = y ? nb_record("avg_pool2d", avgpool_bw, 1, (const nb_tensor *const[]){xc}, y) : NULL;
  if (n) params_save(n, p);
  nb_scope_end();
  return nb_autorelease(y);
}

static nb_tensor *maxpool_forward(const nb_tensor *x, const nb_im2col_params *p) {
  nb_scope_begin();
  nb_tensor *xc = nb_contiguous(x), *arg = NULL;
  nb_tensor *y = xc ? pool_run(xc, p, &arg) : NULL;
  nb_node *n = y ? nb_record("max_pool2d", maxpool_bw, 1, (const nb_tensor *const[]){xc}, y) : NULL;
  if (n) { params_save(n, p); nb_node_save(n, 0, arg); }
  nb_scope_end();
  return nb_autorelease(y);
}

/* (C, H, W) inputs run as a batch of one. */
static nb_tensor *pool_op(const char *op, const nb_tensor *x, int kh, int kw, int sh, int sw,
                          int ph, int pw, int max) {
  if (!x) { nb_error_null(op, "x"); return NULL; }
  nb_im2col_params p;
  if (!pool_args(op, x, kh, kw, sh, sw, ph, pw, &p)) return NULL;
  nb_scope_begin();
  nb_tensor *x4 = x->ndim == 3 ? nb_unsqueeze(x, 0) : (nb_tensor *)x;
  nb_tensor *y = x4 ? (max ? maxpool_forward(x4, &p) : avgpool_forward(x4, &p)) : NULL;
  if (y && x->ndim == 3) y = nb_squeeze(y, 0);
  y = nb_keep(y);
  nb_scope_end();
  return nb_autorelease(y);
}

nb_tensor *nb_max_pool2d(const nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw) {
  return pool_op("max_pool2d", x, kh, kw, sh, sw, ph, pw, 1);
}

nb_tensor *nb_avg_pool2d(const nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw) {
  return pool_op("avg_pool2d", x, kh, kw, sh, sw, ph, pw, 0);
}
