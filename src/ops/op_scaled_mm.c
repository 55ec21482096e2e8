/* scaled_mm: the FP8 matrix product with per-tensor scales (torch._scaled_mm).
 *
 * out (M, N) = scale_a * scale_b * (a (M, K) @ b (K, N)), a and b fp8
 * (e4m3 or e5m2, any mix), the scales one-element f32 tensors, out bf16,
 * f16 or f32. The backend's scaled_mm takes the views as they are (the
 * CUDA one picks its kernel by layout); the scales stay on the device and
 * are applied once, to the accumulated sum. No backward: the inputs are
 * fp8 (no gradient) and, as in PyTorch, no gradient reaches the scales. */
#include "ops/ops.h"

extern const nb_op nb_op_scaled_mm;

typedef struct {
  nb_dtype out_dtype;
} scaled_mm_params;

static nb_status smm_operand(const char *what, const nb_tensor *t) {
  char b[200];
  if (nb_dtype_is_fp8(t->dtype) && t->ndim == 2) return NB_OK;
  return nb_error_set(NB_ERR_DTYPE, "scaled_mm: %s %s (expected a 2-D f8e4m3 or f8e5m2 tensor)",
                      what, nb_describe(t, b, sizeof b));
}

static nb_status smm_scale(const char *what, const nb_tensor *t) {
  char b[200];
  if (t->dtype == NB_F32 && nb_numel(t) == 1) return NB_OK;
  return nb_error_set(NB_ERR_DTYPE, "scaled_mm: %s %s (expected a one-element f32 tensor)", what,
                      nb_describe(t, b, sizeof b));
}

static nb_status smm_infer(const nb_op_call *c, nb_meta *out) {
  const nb_tensor *a = c->in[0], *b = c->in[1];
  const scaled_mm_params *p = c->p;
  nb_status st = smm_operand("a", a);
  if (!st) st = smm_operand("b", b);
  if (!st) st = smm_scale("scale_a", c->in[2]);
  if (!st) st = smm_scale("scale_b", c->in[3]);
  if (st) return st;
  char b1[200], b2[200];
  if (a->shape[1] != b->shape[0])
    return nb_error_set(NB_ERR_SHAPE, "scaled_mm: a %s and b %s do not match (expected a (M, K) and "
                        "b (K, N))", nb_describe(a, b1, sizeof b1), nb_describe(b, b2, sizeof b2));
  if (p->out_dtype != NB_BF16 && p->out_dtype != NB_F16 && p->out_dtype != NB_F32)
    return nb_error_set(NB_ERR_DTYPE, "scaled_mm: out_dtype %s (expected bf16, f16 or f32)",
                        nb_dtype_name(p->out_dtype));
  nb_meta_of(a, out);
  out->shape[1] = b->shape[1];
  out->dtype = p->out_dtype;
  return NB_OK;
}

static nb_status smm_forward(const nb_op_call *c, nb_tensor *out, nb_tensor **aux) {
  (void)aux;
  nb_kview ko, ka, kb, ksa, ksb;
  nb_kview_of(out, &ko);
  nb_kview_of(c->in[0], &ka);
  nb_kview_of(c->in[1], &kb);
  nb_kview_of(c->in[2], &ksa);
  nb_kview_of(c->in[3], &ksb);
  if (ka.shape[1] == 0) return nb_backend_for(nb_device_of(out))->fill(&ko, 0.0);
  return nb_backend_for(nb_device_of(out))->scaled_mm(&ko, &ka, &kb, &ksa, &ksb);
}

/* 2 M N K flops; each operand read once, the output written once. */
static void smm_cost(const nb_op_call *c, const nb_meta *out, double *bytes, double *flops) {
  *bytes = nb_op_io_bytes(c, out);
  *flops = 2.0 * (double)out->shape[0] * (double)out->shape[1] * (double)c->in[0]->shape[1];
}

const nb_op nb_op_scaled_mm = {
    .name = "scaled_mm", .kind = NB_OPK_CONTRACT, .n_in = 4,
    .in_names = {"a", "b", "scale_a", "scale_b"}, .psize = sizeof(scaled_mm_params),
    .prec = NB_PREC_WIDE, .fp8 = 1,
    .determinism = "CUDA: the tensor-core kernel (compute capability 9.0, NT layout) and the "
                   "portable one sum in different orders; each the same bits every run",
    .infer = smm_infer, .forward = smm_forward, .cost = smm_cost};

nb_tensor *nb_scaled_mm(const nb_tensor *a, const nb_tensor *b, const nb_tensor *scale_a,
                        const nb_tensor *scale_b, nb_dtype out_dtype) {
  scaled_mm_params p = {out_dtype};
  return nb_op_run(&nb_op_scaled_mm, 4, (const nb_tensor *const[]){a, b, scale_a, scale_b}, &p);
}
